//! The windowed bandwidth benchmarks (osu_bw, osu_bibw): `window` messages in
//! flight per iteration, then a small acknowledgement (osu_bw) or a wait for the
//! peer's window (osu_bibw).

use std::time::Instant;

use crate::pair::Pair;
use crate::{csv_row, header, or_die, pair_verdict, result_line, Options};

const DATA_TAG: i32 = 100;
const ACK_TAG: i32 = 101;

/// Runs osu_bw (`bidirectional` false) or osu_bibw; returns the exit code.
pub fn run(bidirectional: bool) -> i32 {
    let o = Options::from_args();
    let name = if bidirectional { "osu_bibw" } else { "osu_bw" };
    let mut pair = Pair::setup(&o, name);
    let Pair { ref mut ctx, me, peer, ref sbuf, ref rbuf } = pair;
    let title = if bidirectional { "Bi-Directional Bandwidth Test" } else { "Bandwidth Test" };
    if me == 0 {
        header(ctx, title, &o, "Bandwidth (MB/s)");
    }
    let mut ack = [0u8; 4];
    let mut failed = false;
    let sizes: Vec<usize> = o.sizes().into_iter().filter(|&s| s > 0).collect();
    for size in sizes {
        let msgs = o.window * if bidirectional { 2 } else { 1 };
        let (iters, warm) = o.iterations_for(size, msgs);
        let seed = size as u64 * 131 + me as u64;
        if o.validate {
            or_die(sbuf.fill(ctx, size, seed), "fill");
        }
        or_die(ctx.barrier(), "barrier");
        let mut t0 = Instant::now();
        if me <= 1 {
            for i in 0..iters + warm {
                if i == warm {
                    t0 = Instant::now();
                }
                let mut reqs = Vec::with_capacity(2 * o.window);
                // SAFETY: buffers outlive the requests, which are all waited for below.
                // Every receive of a window lands in the same buffer, as in OSU.
                unsafe {
                    let sending = me == 0 || bidirectional;
                    let receiving = me == 1 || bidirectional;
                    if receiving {
                        for _ in 0..o.window {
                            reqs.push(or_die(
                                ctx.irecv(rbuf.ptr as *mut u8, size, Some(peer), Some(DATA_TAG)),
                                "irecv",
                            ));
                        }
                    }
                    if sending {
                        for _ in 0..o.window {
                            reqs.push(or_die(ctx.isend(sbuf.ptr as *const u8, size, peer, DATA_TAG), "isend"));
                        }
                    }
                    or_die(ctx.wait_all(reqs), "wait_all");
                    if !bidirectional {
                        if me == 0 {
                            let r = or_die(ctx.irecv(ack.as_mut_ptr(), 4, Some(1), Some(ACK_TAG)), "irecv ack");
                            or_die(ctx.wait(r), "ack");
                        } else {
                            let s = or_die(ctx.isend(ack.as_ptr(), 4, 0, ACK_TAG), "isend ack");
                            or_die(ctx.wait(s), "ack");
                        }
                    }
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let bytes = (size * msgs * iters) as f64;
        let mbps = bytes / secs / 1e6;
        let mut passed = true;
        if o.validate && me <= 1 && (me == 1 || bidirectional) {
            let peer_seed = size as u64 * 131 + peer as u64;
            if let Err(e) = rbuf.check(ctx, size, peer_seed) {
                eprintln!("rank {me}: size {size}: {e}");
                passed = false;
            }
        }
        if o.validate {
            passed = or_die(pair_verdict(ctx, me, passed), "validation verdict");
            failed |= !passed;
        }
        if me == 0 {
            println!("{}", result_line(&o, size, mbps, passed));
            csv_row(&o, name, size, "MBps", mbps);
        }
    }
    pair.finish(&o, failed)
}
