//! `pingpong`: rank 0 sends each size to rank 1, which checks it and sends it back; every
//! other size lets the message arrive before its receive (the unexpected path).

use std::time::{Duration, Instant};

use gpulmt::{Context, Tag};

use crate::api::{expect_status, irecv, isend, need_ranks};
use crate::buffers::{parse_mem, parse_placement, parse_sizes, pattern, Buf, GUARD_RECV, GUARD_SEND};
use crate::report::OrFail;

pub fn run(ctx: &mut Context, placement: &str, sizes: &str, off: usize, seed: u64, mem: [&str; 2]) {
    let mem = mem.map(parse_mem);
    need_ranks(ctx, 2, "pingpong");
    let (k0, k1) = parse_placement(placement);
    let sizes = parse_sizes(sizes);
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    for (i, &size) in sizes.iter().enumerate() {
        let tag = 1 + i as Tag;
        // A new pattern each round, so that a size repeated (a pool's freed and reallocated
        // buffer at the same address) must show this round's bytes, not an old one's.
        let data = pattern(seed ^ (size as u64).wrapping_mul(0x9e37) ^ (i as u64) << 40, size);
        let what = |dir: &str| format!("pingpong {k0}->{k1} size {size} ({dir})");
        let t0 = Instant::now();
        if me == 0 {
            let mut s = Buf::new_as(ctx, k0, mem[0], size, off, GUARD_SEND);
            s.write(ctx, &data);
            let mut r = Buf::new_as(ctx, k0, mem[0], size, off, GUARD_RECV);
            let rr = irecv(ctx, &mut r, Some(1), Some(tag));
            let sr = isend(ctx, &mut s, size, 1, tag);
            let st = ctx.wait(sr).or_fail(what("send 0->1"));
            expect_status(&st, 1, tag, size, &what("send status"));
            let st = ctx.wait(rr).or_fail(what("receive 1->0"));
            expect_status(&st, 1, tag, size, &what("receive status 1->0"));
            r.verify(ctx, &data, GUARD_RECV, &what("data back at rank 0"));
            s.verify(ctx, &data, GUARD_SEND, &what("rank 0's send buffer after the send"));
            s.release(ctx);
            r.release(ctx);
        } else {
            let mut r = Buf::new_as(ctx, k1, mem[1], size, off, GUARD_RECV);
            if i % 2 == 0 {
                // Let the message arrive first: the unexpected-message path.
                let deadline = Instant::now() + Duration::from_secs(20);
                while ctx.iprobe(Some(0), Some(tag)).or_fail("iprobe").is_none() {
                    ensure!(Instant::now() < deadline, "{}: message never arrived (iprobe)", what("probe"));
                }
            }
            let rr = irecv(ctx, &mut r, Some(0), Some(tag));
            let st = ctx.wait(rr).or_fail(what("receive 0->1"));
            expect_status(&st, 0, tag, size, &what("receive status 0->1"));
            r.verify(ctx, &data, GUARD_RECV, &what("data at rank 1"));
            let sr = isend(ctx, &mut r, size, 0, tag);
            let st = ctx.wait(sr).or_fail(what("send 1->0"));
            expect_status(&st, 0, tag, size, &what("send status 1->0"));
            r.verify(ctx, &data, GUARD_RECV, &what("rank 1's buffer after sending it back"));
            r.release(ctx);
        }
        // Collective on both ranks: releases this size's device buffers.
        ctx.mem_free_commit().or_fail(what("mem_free_commit"));
        println!("rank={me} size={size} placement={k0}{k1} ms={:.1}", t0.elapsed().as_secs_f64() * 1e3);
    }
}
