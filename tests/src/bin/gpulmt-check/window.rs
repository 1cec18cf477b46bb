//! `window`: a window of concurrent messages from rank 0 to rank 1; with one tag they
//! must match in send order (non-overtaking, eager and rendezvous mixed), with distinct
//! tags the receives are posted in reverse order.

use gpulmt::{Context, Tag};

use crate::api::{expect_status, irecv, isend, need_ranks};
use crate::buffers::{msg_seed, parse_placement, parse_sizes, pattern, Buf, GUARD_RECV, GUARD_SEND};
use crate::report::OrFail;

pub fn run(ctx: &mut Context, placement: &str, count: u32, sizes: &str, same_tag: bool) {
    need_ranks(ctx, 2, "window");
    let (k0, k1) = parse_placement(placement);
    let sizes = parse_sizes(sizes);
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    let k = count as usize;
    let size = |i: usize| sizes[i % sizes.len()];
    let max = sizes.iter().copied().max().unwrap_or(0);
    let tag = |i: usize| if same_tag { 5 } else { 5 + i as Tag };
    let data = |i: usize| pattern(msg_seed(0, 1, i as u32, 13), size(i));
    if me == 0 {
        let mut bufs: Vec<Buf> = (0..k).map(|i| Buf::new(ctx, k0, size(i), 64, GUARD_SEND)).collect();
        let mut reqs = Vec::new();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.write(ctx, &data(i));
            reqs.push(isend(ctx, b, size(i), 1, tag(i)));
        }
        let st = ctx.wait_all(reqs).or_fail("window: sends");
        for (i, st) in st.iter().enumerate() {
            expect_status(st, 1, tag(i), size(i), &format!("window: send {i}"));
        }
        for b in bufs {
            b.release(ctx);
        }
    } else {
        // Every receive buffer holds the largest message: with one tag, only the order
        // of matching decides which message lands where.
        let mut bufs: Vec<Buf> = (0..k).map(|_| Buf::new(ctx, k1, max, 64, GUARD_RECV)).collect();
        let order: Vec<usize> = if same_tag { (0..k).collect() } else { (0..k).rev().collect() };
        let mut reqs = Vec::new();
        for &i in &order {
            reqs.push(irecv(ctx, &mut bufs[i], Some(0), Some(tag(i))));
        }
        let st = ctx.wait_all(reqs).or_fail("window: receives");
        for (j, &i) in order.iter().enumerate() {
            expect_status(
                &st[j],
                0,
                tag(i),
                size(i),
                &format!("window: receive of message {i} (non-overtaking order)"),
            );
            bufs[i].verify(ctx, &data(i), GUARD_RECV, &format!("window: message {i} of {} bytes", size(i)));
        }
        for b in bufs {
            b.release(ctx);
        }
    }
    ctx.mem_free_commit().or_fail("window: mem_free_commit");
}
