//! `cache`: a window of concurrent sends from one device allocation, from one range and
//! from different offsets: the receiver maps the allocation once (the handle cache).

use std::time::Instant;

use gpulmt::{Context, Request, Tag};

use crate::api::{expect_status, need_ranks};
use crate::buffers::{msg_seed, parse_size, pattern, Buf, Kind, GUARD_RECV, GUARD_SEND};
use crate::report::OrFail;

pub fn run(ctx: &mut Context, iters: u32, size: &str, expect_recv: Option<u64>, expect_send: Option<u64>) {
    need_ranks(ctx, 2, "cache");
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    let msg = parse_size(size);
    let w = iters as usize;
    // One allocation on each side; rank 1 receives every message at its own offset.
    let mut buf = Buf::new(ctx, Kind::Dev, w * msg, 4096, if me == 0 { GUARD_SEND } else { GUARD_RECV });
    let piece = |i: usize| pattern(msg_seed(0, 1, i as u32, 5), msg);
    let t0 = Instant::now();
    for phase in 0..2 {
        let tag = 1 + phase as Tag;
        if me == 0 {
            // Phase 0: every send from the same range; phase 1: from different offsets.
            let mut all = Vec::with_capacity(w * msg);
            for i in 0..w {
                all.extend_from_slice(&piece(if phase == 0 { 0 } else { i }));
            }
            buf.write(ctx, &all);
            let base = buf.ptr();
            let reqs: Vec<Request> = (0..w)
                .map(|i| {
                    let off = if phase == 0 { 0 } else { i * msg };
                    // SAFETY: inside `buf`, which outlives the requests (wait_all below).
                    unsafe { ctx.isend(base.wrapping_add(off), msg, 1, tag) }.or_fail(format!("cache: isend {i}"))
                })
                .collect();
            for st in ctx.wait_all(reqs).or_fail("cache: window of sends") {
                expect_status(&st, 1, tag, msg, "cache: send status");
            }
        } else {
            buf.fill(ctx, GUARD_RECV);
            let base = buf.ptr();
            let reqs: Vec<Request> = (0..w)
                .map(|i| {
                    // SAFETY: as above.
                    unsafe { ctx.irecv(base.wrapping_add(i * msg), msg, Some(0), Some(tag)) }
                        .or_fail(format!("cache: irecv {i}"))
                })
                .collect();
            for st in ctx.wait_all(reqs).or_fail("cache: window of receives") {
                expect_status(&st, 0, tag, msg, "cache: receive status");
            }
            let mut all = Vec::with_capacity(w * msg);
            for i in 0..w {
                all.extend_from_slice(&piece(if phase == 0 { 0 } else { i }));
            }
            buf.verify(ctx, &all, GUARD_RECV, &format!("cache phase {phase}: {w} messages of {msg} bytes"));
        }
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let c = ctx.stats().cache;
    println!("rank={me} window size={w} msg={msg} ms={ms:.1} opens={} hits={} misses={}", c.opens, c.hits, c.misses);
    let expect = if me == 1 { expect_recv } else { expect_send };
    if let Some(e) = expect {
        ensure!(
            c.opens == e,
            "cache: {} opened {} mappings of its peer's single allocation, expected {e}",
            if me == 1 { "receiver" } else { "sender" },
            c.opens
        );
    }
    buf.release(ctx);
    ctx.mem_free_commit().or_fail("cache: mem_free_commit");
}
