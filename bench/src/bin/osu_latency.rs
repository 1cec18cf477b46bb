//! osu_latency over gpulmt: ping-pong between ranks 0 and 1; half round trip in us.
//! Run: `gpulmt-run -n 2 target/release/osu_latency [-m 0:4M] [-c] D D`.

use std::time::Instant;

use gpulmt::Context;
use gpulmt_bench::*;

fn main() {
    let o = Options::from_args();
    let mut ctx = or_die(Context::init(), "init");
    if ctx.size() < 2 {
        eprintln!("osu_latency needs 2 ranks: gpulmt-run -n 2 {}", std::env::args().next().unwrap_or_default());
        std::process::exit(2);
    }
    let me = ctx.rank();
    let place = if me == 0 { o.send } else { o.recv };
    let max = o.range.1;
    let sbuf = or_die(Buffer::new(&mut ctx, place, max), "allocating the send buffer");
    let rbuf = or_die(Buffer::new(&mut ctx, place, max), "allocating the receive buffer");
    if me == 0 {
        header(&ctx, "Latency Test", &o, "Latency (us)");
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
                // SAFETY: the buffers live until the end of main and each request is
                // waited for before the buffer is used again.
                unsafe {
                    if me == 0 {
                        let s = or_die(ctx.isend(sbuf.ptr as *const u8, size, 1, 1), "isend");
                        or_die(ctx.wait(s), "send");
                        let r = or_die(ctx.irecv(rbuf.ptr as *mut u8, size, Some(1), Some(1)), "irecv");
                        or_die(ctx.wait(r), "recv");
                    } else {
                        let r = or_die(ctx.irecv(rbuf.ptr as *mut u8, size, Some(0), Some(1)), "irecv");
                        or_die(ctx.wait(r), "recv");
                        let s = or_die(ctx.isend(sbuf.ptr as *const u8, size, 0, 1), "isend");
                        or_die(ctx.wait(s), "send");
                    }
                }
            }
        }
        let lat = t0.elapsed().as_secs_f64() * 1e6 / (2.0 * iters as f64);
        if o.validate && me <= 1 && size > 0 {
            // One more round trip outside the timing, with known data both ways.
            let seed = size as u64 * 31 + 7;
            unsafe {
                if me == 0 {
                    or_die(sbuf.fill(&ctx, size, seed), "fill");
                    let s = or_die(ctx.isend(sbuf.ptr as *const u8, size, 1, 2), "isend");
                    or_die(ctx.wait(s), "send");
                    let r = or_die(ctx.irecv(rbuf.ptr as *mut u8, size, Some(1), Some(2)), "irecv");
                    or_die(ctx.wait(r), "recv");
                } else {
                    let r = or_die(ctx.irecv(rbuf.ptr as *mut u8, size, Some(0), Some(2)), "irecv");
                    or_die(ctx.wait(r), "recv");
                    let s = or_die(ctx.isend(rbuf.ptr as *const u8, size, 0, 2), "isend");
                    or_die(ctx.wait(s), "send");
                }
            }
            if let Err(e) = rbuf.check(&ctx, size, seed) {
                eprintln!("rank {me}: size {size}: {e}");
                failed = true;
            }
        }
        if me == 0 {
            println!("{size:<10}{lat:>20.2}");
            csv_row(&o, "osu_latency", size, "us", lat);
        }
    }
    print_stats(&ctx, &o);
    or_die(sbuf.free(&mut ctx), "free");
    or_die(rbuf.free(&mut ctx), "free");
    or_die(ctx.mem_free_commit(), "free commit");
    or_die(ctx.finalize(), "finalize");
    if failed {
        std::process::exit(1);
    }
}
