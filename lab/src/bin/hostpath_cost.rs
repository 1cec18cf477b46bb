//! hostpath_cost: the CPU cost of gpulmt's host path per ping-pong leg, without the
//! machine's cross-core latencies or anyone spinning.
//!
//! Both ranks of a two-rank job live in this one process and are driven by one thread, in
//! the order a blocking ping-pong's calls take place: the receiver posts its receive (and
//! sends its RTR offer), the sender posts its send (which finds the offer and pushes), the
//! sender's and then the receiver's request complete; then the roles swap. Copies are the
//! sim backend's inline ones (`GPULMT_SIM_COPY=inline`, forced here), so a leg costs
//! exactly the instructions both ranks execute for one message: matching, offers, packets
//! through the shared-memory rings, the handle cache, requests. That is the part of
//! `osu_latency`'s small-message time that gpulmt's code decides, measured with a few
//! percent of spread on a busy two-core host where the two-process ping-pong spreads by
//! +-20 %; every change to the hot path can be compared with it before a GPU run.
//!
//! Prints `hostpath_cost,ns_per_leg,<bytes>,<ns>` for each size and placement asked for,
//! with the best of `--reps` repetitions (the least disturbed). The data each receive got
//! is checked; a mismatch exits non-zero.
//! Run: `hostpath_cost [-m 8:8] [-i 200000] [--reps 5] [D D]`.

use std::time::Instant;

use clap::Parser;
use gpulmt::config::Config;
use gpulmt::{Context, JobInfo, Request};
use gpulmt_bench::{parse_placement, Buffer, Placement};

#[derive(Parser, Debug)]
#[command(about = "CPU cost of gpulmt's host path per ping-pong leg (both ranks in one thread, sim inline copies)")]
struct Args {
    /// Sizes as MIN:MAX (OSU -m), powers of two between them (K and M suffixes accepted).
    #[arg(short = 'm', long, value_parser = gpulmt_bench::parse_range, default_value = "8:8")]
    sizes: (usize, usize),
    /// Timed legs per repetition (two legs make a round trip).
    #[arg(short = 'i', long, default_value_t = 200_000)]
    iters: u64,
    /// Repetitions; the fastest is printed.
    #[arg(long, default_value_t = 5)]
    reps: u32,
    /// Send buffer placement: D (device) or H (host), as osu_latency's.
    #[arg(value_parser = parse_placement, default_value = "D")]
    send: Placement,
    /// Receive buffer placement.
    #[arg(value_parser = parse_placement, default_value = "D")]
    recv: Placement,
}

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("hostpath_cost: {msg}");
    std::process::exit(1)
}

/// One rank's context and its send and receive buffers.
struct Rank {
    ctx: Context,
    send: Buffer,
    recv: Buffer,
}

/// Drives a request to completion without blocking on the other rank: both are polled,
/// since what completes one may be a packet only the other's progress sends.
fn finish(req: Request, me: &mut Context, other: &mut Context) {
    loop {
        match me.test(&req) {
            Ok(Some(_)) => return,
            Ok(None) => {
                other.progress().unwrap_or_else(|e| die(format!("progress: {e}")));
            }
            Err(e) => die(format!("request failed: {e}")),
        }
    }
}

/// One message from `from` to `to` of `len` bytes, in a blocking ping-pong's order.
// Out of line: `callgrind --toggle-collect=hostpath_cost::leg` counts the legs alone.
#[inline(never)]
fn leg(from: &mut Rank, to: &mut Rank, len: usize, tag: i32) {
    let src = from.ctx.rank();
    // SAFETY: the buffers live as long as the ranks and each is used by one request at a time.
    let r = unsafe { to.ctx.irecv(to.recv.ptr as *mut u8, len, Some(src), Some(tag)) }
        .unwrap_or_else(|e| die(format!("irecv: {e}")));
    // SAFETY: as above.
    let s = unsafe { from.ctx.isend(from.send.ptr as *const u8, len, to.ctx.rank(), tag) }
        .unwrap_or_else(|e| die(format!("isend: {e}")));
    finish(s, &mut from.ctx, &mut to.ctx);
    finish(r, &mut to.ctx, &mut from.ctx);
}

fn main() {
    gpulmt::logging::init("warn");
    let args = Args::parse();
    // SAFETY: set before any thread of ours exists (the contexts start none).
    unsafe {
        std::env::set_var("GPULMT_DEVICE", "sim");
        std::env::set_var("GPULMT_SIM_COPY", "inline");
    }
    let cfg = Config::from_env().unwrap_or_else(|e| die(e));
    let job = format!("hostpath{}", std::process::id());
    let (lo, hi) = args.sizes;
    // Rank 0 creates the job's segment and waits in a barrier for rank 1: start it aside.
    let cfg1 = cfg.clone();
    let job1 = job.clone();
    let one = std::thread::spawn(move || Context::init_with(cfg1, JobInfo { job: job1, rank: 1, size: 2 }));
    let ctx0 =
        Context::init_with(cfg, JobInfo { job, rank: 0, size: 2 }).unwrap_or_else(|e| die(format!("rank 0: {e}")));
    let ctx1 = one.join().expect("rank 1's start").unwrap_or_else(|e| die(format!("rank 1: {e}")));
    let buffer =
        |ctx: &mut Context, p| Buffer::new(ctx, p, hi).unwrap_or_else(|e| die(format!("allocating a buffer: {e}")));
    let mut ranks = [ctx0, ctx1].map(|mut ctx| {
        let (send, recv) = (buffer(&mut ctx, args.send), buffer(&mut ctx, args.recv));
        Rank { ctx, send, recv }
    });
    let placement = format!("{} {}", args.send.letter(), args.recv.letter());
    eprintln!("# gpulmt host path cost per leg (both ranks in one thread, sim inline copies), {placement}");
    println!("anchor,metric,bytes,value");
    for len in gpulmt_bench::sizes_in((lo, hi)) {
        let [a, b] = &mut ranks;
        for (r, seed) in [(&*a, 1), (&*b, 2)] {
            r.send.fill(&r.ctx, len, seed).unwrap_or_else(|e| die(format!("filling a send buffer: {e}")));
        }
        let mut best = f64::INFINITY;
        for rep in 0..=args.reps {
            let legs = if rep == 0 { args.iters / 10 + 1 } else { args.iters };
            let t = Instant::now();
            for i in 0..legs.div_ceil(2) {
                let tag = (i & 0xffff) as i32;
                leg(a, b, len, tag);
                leg(b, a, len, tag);
            }
            let ns = t.elapsed().as_nanos() as f64 / (legs.div_ceil(2) * 2) as f64;
            // The first pass warms caches and mappings up.
            if rep > 0 {
                best = best.min(ns);
            }
        }
        // Each receive holds the other rank's pattern.
        for (r, seed) in [(&*b, 1), (&*a, 2)] {
            if let Err(e) = r.recv.check(&r.ctx, len, seed) {
                die(format!("rank {}'s receive of {len} bytes: {e}", r.ctx.rank()));
            }
        }
        println!("hostpath_cost,ns_per_leg,{len},{best:.1}");
    }
    // Finalize's barrier needs both ranks at once.
    let [r0, r1] = ranks;
    let one = std::thread::spawn(move || r1.ctx.finalize());
    r0.ctx.finalize().unwrap_or_else(|e| die(format!("rank 0's finalize: {e}")));
    one.join().expect("rank 1's finalize").unwrap_or_else(|e| die(format!("rank 1's finalize: {e}")));
}
