//! osu_latency over gpulmt: ping-pong between ranks 0 and 1; half round trip in us.
//! Run: `gpulmt-run -n 2 target/release/osu_latency [-m 0:4M] [-c] D D`.
//!
//! `OSU_ANATOMY=1` also takes host timestamps (CLOCK_MONOTONIC, one clock for both
//! processes) around each post and completion of the timed iterations, and rank 0 prints
//! the median of each segment of a round trip per size: where a small message's latency
//! goes between the two ranks (the posting calls, the time from the later of the two
//! posts to the completion, the sender's completion after the receiver's).
//!
//! `OSU_THINK_US=T` makes rank 0 compute (spin, with no gpulmt call) for T us before each
//! round trip, while rank 1 waits in its receive: the latency of a message that arrives
//! after a compute phase, when nothing has kept the transport busy (the think time is
//! taken out of the reported latency).

use std::mem::size_of;
use std::time::{Duration, Instant};

use gpulmt::Context;
use gpulmt_bench::pair::Pair;
use gpulmt_bench::*;

/// One ping-pong step: rank 0 sends then receives, rank 1 receives then sends
/// (`from` is what rank 1 sends back, so validation can return the received data).
///
/// # Safety
/// The buffers must hold `size` bytes and outlive the call.
/// Returns the round trip's stamps (see [`Anatomy`]) when `STAMP`, zeros otherwise: a
/// clock read costs 25-50 ns on 2x H200's host, and three of the five sit between one
/// operation's completion and the next post, in the latency being measured.
unsafe fn round_trip<const STAMP: bool>(
    ctx: &mut Context,
    me: u32,
    sbuf: &Buffer,
    rbuf: &Buffer,
    back: &Buffer,
    size: usize,
    tag: i32,
) -> Stamps {
    let peer = 1 - me;
    let mut t = [0u64; 5];
    let now = || if STAMP { now_ns() } else { 0 };
    t[0] = now();
    let send = |ctx: &mut Context, b: &Buffer, posted: &mut u64, done: &mut u64| {
        // SAFETY: the caller's buffers hold `size` bytes and outlive the call; we wait here.
        let s = or_die(unsafe { ctx.isend(b.ptr as *const u8, size, peer, tag) }, "isend");
        *posted = now();
        or_die(ctx.wait(s), "send");
        *done = now();
    };
    let recv = |ctx: &mut Context, posted: &mut u64, done: &mut u64| {
        // SAFETY: as for the send.
        let r = or_die(unsafe { ctx.irecv(rbuf.ptr as *mut u8, size, Some(peer), Some(tag)) }, "irecv");
        *posted = now();
        or_die(ctx.wait(r), "recv");
        *done = now();
    };
    let [_, a, b, c, d] = &mut t;
    if me == 0 {
        send(ctx, sbuf, a, b);
        recv(ctx, c, d);
    } else {
        recv(ctx, a, b);
        send(ctx, back, c, d);
    }
    t
}

/// One rank's stamps of a round trip, ns: before its first post, first post returned,
/// first operation complete, second post returned, second complete. Rank 0's first
/// operation is its send, rank 1's its receive.
type Stamps = [u64; 5];

fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec out-pointer; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Segments of the round trips of one size, from both ranks' stamps.
struct Anatomy;

impl Anatomy {
    /// Rank 0: prints the median of each segment, in us.
    fn report(size: usize, r0: &[Stamps], r1: &[Stamps]) {
        let us = |ns: i64| ns as f64 / 1e3;
        let seg = |f: &dyn Fn(&Stamps, &Stamps) -> i64| {
            let mut v: Vec<f64> = r0.iter().zip(r1).map(|(a, b)| us(f(a, b))).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let d = |x: u64, y: u64| x as i64 - y as i64;
        let rows: [(&str, f64); 11] = [
            ("half round trip", seg(&|a, _| d(a[4], a[0]) / 2)),
            ("0: isend call", seg(&|a, _| d(a[1], a[0]))),
            ("1: irecv posted, after 0's isend began", seg(&|a, b| d(b[1], a[0]))),
            ("1: receive done, after the later post", seg(&|a, b| d(b[2], a[1].max(b[1])))),
            ("one way 0->1 (0's isend began to 1's receive done)", seg(&|a, b| d(b[2], a[0]))),
            ("0: send done, after 1's receive done", seg(&|a, b| d(a[2], b[2]))),
            ("1: isend call", seg(&|_, b| d(b[3], b[2]))),
            ("0: irecv call", seg(&|a, _| d(a[3], a[2]))),
            ("0: irecv posted, after 1's isend returned", seg(&|a, b| d(a[3], b[3]))),
            ("0: receive done, after the later post", seg(&|a, b| d(a[4], a[3].max(b[3])))),
            ("1: send done, after 0's receive done", seg(&|a, b| d(b[4], a[4]))),
        ];
        for (name, v) in rows {
            println!("anatomy,{size},{name},{v:.3}");
        }
    }
}

fn main() {
    gpulmt::logging::init("warn");
    let o = Options::from_args();
    let mut pair = Pair::setup(&o, "osu_latency");
    let Pair { ref mut ctx, me, ref sbuf, ref rbuf, .. } = pair;
    if me == 0 {
        header(ctx, "Latency Test", &o, "Latency (us)");
    }
    let mut failed = false;
    let anatomy = std::env::var_os("OSU_ANATOMY").is_some_and(|v| v != "0");
    let think = match std::env::var("OSU_THINK_US").map(|v| v.parse::<u64>().map_err(|e| (v, e))) {
        Ok(Ok(us)) => Duration::from_micros(us),
        Ok(Err((v, e))) => {
            eprintln!("error: OSU_THINK_US={v}: {e} (a whole number of microseconds)");
            std::process::exit(2);
        }
        Err(_) => Duration::ZERO,
    };
    for size in o.sizes() {
        let (iters, warm) = o.iterations_for(size, 1);
        or_die(ctx.barrier(), "barrier");
        let mut t0 = Instant::now();
        let mut stamps: Vec<Stamps> = Vec::with_capacity(if anatomy { iters } else { 0 });
        if me <= 1 {
            for i in 0..iters + warm {
                if i == warm {
                    t0 = Instant::now();
                }
                if me == 0 && !think.is_zero() {
                    // Compute, as an application does between messages: no gpulmt call.
                    let until = Instant::now() + think;
                    while Instant::now() < until {
                        std::hint::spin_loop();
                    }
                }
                if anatomy {
                    // SAFETY: the buffers hold the largest size and live until the end.
                    let t = unsafe { round_trip::<true>(ctx, me, sbuf, rbuf, sbuf, size, 1) };
                    if i >= warm {
                        stamps.push(t);
                    }
                } else {
                    // SAFETY: as above.
                    unsafe { round_trip::<false>(ctx, me, sbuf, rbuf, sbuf, size, 1) };
                }
            }
        }
        let lat = t0.elapsed().saturating_sub(think * iters as u32).as_secs_f64() * 1e6 / (2.0 * iters as f64);
        if anatomy && me <= 1 && iters > 0 {
            // Rank 1's stamps travel to rank 0 as host bytes, outside the timing.
            let bytes = iters * size_of::<Stamps>();
            if me == 1 {
                // SAFETY: plain integers viewed as bytes.
                let raw = unsafe { std::slice::from_raw_parts(stamps.as_ptr().cast::<u8>(), bytes) };
                or_die(ctx.send(raw, 0, 3), "sending the anatomy stamps");
            } else {
                let mut theirs: Vec<Stamps> = vec![[0; 5]; iters];
                // SAFETY: as above; every bit pattern is a valid u64.
                let raw = unsafe { std::slice::from_raw_parts_mut(theirs.as_mut_ptr().cast::<u8>(), bytes) };
                or_die(ctx.recv(raw, Some(1), Some(3)), "receiving the anatomy stamps");
                Anatomy::report(size, &stamps, &theirs);
            }
        }
        let mut passed = true;
        if o.validate && me <= 1 && size > 0 {
            // One more round trip outside the timing, with known data both ways.
            let seed = size as u64 * 31 + 7;
            if me == 0 {
                or_die(sbuf.fill(ctx, size, seed), "fill");
            }
            // SAFETY: as above; rank 1 sends back what it received.
            unsafe { round_trip::<false>(ctx, me, sbuf, rbuf, rbuf, size, 2) };
            if let Err(e) = rbuf.check(ctx, size, seed) {
                eprintln!("rank {me}: size {size}: {e}");
                passed = false;
            }
        }
        if o.validate {
            passed = or_die(pair_verdict(ctx, me, passed), "validation verdict");
            failed |= !passed;
        }
        if me == 0 {
            println!("{}", result_line(&o, size, lat, passed));
            csv_row(&o, "osu_latency", size, "us", lat);
        }
    }
    std::process::exit(pair.finish(&o, failed));
}
