//! osu_latency over gpulmt: ping-pong between ranks 0 and 1; half round trip in us.
//! Run: `gpulmt-run -n 2 target/release/osu_latency [-m 0:4M] [-c] D D`.

use std::time::Instant;

use gpulmt::Context;
use gpulmt_bench::pair::Pair;
use gpulmt_bench::*;

/// One ping-pong step: rank 0 sends then receives, rank 1 receives then sends
/// (`from` is what rank 1 sends back, so validation can return the received data).
///
/// # Safety
/// The buffers must hold `size` bytes and outlive the call.
unsafe fn round_trip(ctx: &mut Context, me: u32, sbuf: &Buffer, rbuf: &Buffer, back: &Buffer, size: usize, tag: i32) {
    let peer = 1 - me;
    let send = |ctx: &mut Context, b: &Buffer| {
        let s = or_die(ctx.isend(b.ptr as *const u8, size, peer, tag), "isend");
        or_die(ctx.wait(s), "send");
    };
    let recv = |ctx: &mut Context| {
        let r = or_die(ctx.irecv(rbuf.ptr as *mut u8, size, Some(peer), Some(tag)), "irecv");
        or_die(ctx.wait(r), "recv");
    };
    if me == 0 {
        send(ctx, sbuf);
        recv(ctx);
    } else {
        recv(ctx);
        send(ctx, back);
    }
}

fn main() {
    let o = Options::from_args();
    let mut pair = Pair::setup(&o, "osu_latency");
    let Pair { ref mut ctx, me, ref sbuf, ref rbuf, .. } = pair;
    if me == 0 {
        header(ctx, "Latency Test", &o, "Latency (us)");
    }
    let mut failed = false;
    for size in o.sizes() {
        let (iters, warm) = o.iterations_for(size, 1);
        or_die(ctx.barrier(), "barrier");
        let mut t0 = Instant::now();
        if me <= 1 {
            for i in 0..iters + warm {
                if i == warm {
                    t0 = Instant::now();
                }
                // SAFETY: the buffers hold the largest size and live until the end.
                unsafe { round_trip(ctx, me, sbuf, rbuf, sbuf, size, 1) };
            }
        }
        let lat = t0.elapsed().as_secs_f64() * 1e6 / (2.0 * iters as f64);
        if o.validate && me <= 1 && size > 0 {
            // One more round trip outside the timing, with known data both ways.
            let seed = size as u64 * 31 + 7;
            if me == 0 {
                or_die(sbuf.fill(ctx, size, seed), "fill");
            }
            // SAFETY: as above; rank 1 sends back what it received.
            unsafe { round_trip(ctx, me, sbuf, rbuf, rbuf, size, 2) };
            if let Err(e) = rbuf.check(ctx, size, seed) {
                eprintln!("rank {me}: size {size}: {e}");
                failed = true;
            }
        }
        if me == 0 {
            println!("{size:<10}{lat:>20.2}");
            csv_row(&o, "osu_latency", size, "us", lat);
        }
    }
    std::process::exit(pair.finish(&o, failed));
}
