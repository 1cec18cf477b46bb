//! Sends that end out of their posting order (issue 46): rank 0 pushes a rendezvous
//! message to rank 1, which receives it only after a later message, and one to rank 2,
//! which receives it at once. MPI lets the send to rank 2 complete first, and rank 0
//! sends rank 1 that later message only once it did: a send whose completion waited
//! behind an earlier send to another rank would hang the job. The same again for two
//! sends to one rank on different tags. Run on 3 ranks of 3 nodes.

use std::time::{Duration, Instant};

use gpulmt::{Context, Rank, Request};

use crate::buffer::{fail, message, OrFail};

/// A rendezvous size (pushed by default).
const LEN: usize = 65537;
/// How long a send whose receive is posted may take.
const LIMIT: Duration = Duration::from_secs(30);

/// Waits for `req` at most [`LIMIT`], failing the job with `what` past it.
fn wait_bounded(ctx: &mut Context, req: &Request, what: &str) {
    let start = Instant::now();
    loop {
        match ctx.test(req) {
            Ok(Some(_)) => return,
            Ok(None) if start.elapsed() > LIMIT => {
                fail(ctx.rank(), format!("{what}: not done after {LIMIT:?}, though its receive is posted"))
            }
            Ok(None) => std::thread::yield_now(),
            Err(e) => fail(ctx.rank(), format!("{what}: {e}")),
        }
    }
}

/// Receives `len` bytes from `from` on `tag` and checks them against message `seed`.
fn recv_check(ctx: &mut Context, from: Rank, tag: i32, seed: u64, len: usize) {
    let me = ctx.rank();
    let mut got = vec![0u8; len];
    let st = ctx.recv(&mut got, Some(from), Some(tag)).or_fail(me, || format!("order: recv tag {tag}"));
    if st.len != len as u64 || got != message(seed, len) {
        fail(me, format!("order: message on tag {tag} from {from} arrived wrong ({st:?})"));
    }
}

/// Runs the checks; returns how many.
pub fn run(ctx: &mut Context) -> usize {
    let me = ctx.rank();
    if ctx.size() != 3 {
        fail(me, "order: run on 3 ranks".into());
    }
    let (a, b, c) = (message(1, LEN), message(2, LEN), message(3, LEN));
    match me {
        0 => {
            // Two ranks: the send to 2 ends while the one to 1 waits for its receive.
            // SAFETY: the buffers outlive the requests (waited for below).
            let s1 = unsafe { ctx.isend(a.as_ptr(), LEN, 1, 1) }.or_fail(me, || "order: isend to 1".into());
            // SAFETY: as above.
            let s2 = unsafe { ctx.isend(b.as_ptr(), LEN, 2, 1) }.or_fail(me, || "order: isend to 2".into());
            wait_bounded(ctx, &s2, "order: the send to rank 2 (after one to rank 1 that waits)");
            ctx.send(&[7u8; 8], 1, 2).or_fail(me, || "order: send tag 2".into());
            wait_bounded(ctx, &s1, "order: the send to rank 1");
            // One rank, two tags: the later send ends first.
            // SAFETY: as above.
            let s3 = unsafe { ctx.isend(a.as_ptr(), LEN, 1, 3) }.or_fail(me, || "order: isend tag 3".into());
            // SAFETY: as above.
            let s4 = unsafe { ctx.isend(c.as_ptr(), LEN, 1, 4) }.or_fail(me, || "order: isend tag 4".into());
            wait_bounded(ctx, &s4, "order: the send on tag 4 (after one on tag 3 that waits)");
            ctx.send(&[8u8; 8], 1, 5).or_fail(me, || "order: send tag 5".into());
            wait_bounded(ctx, &s3, "order: the send on tag 3");
        }
        1 => {
            let mut small = [0u8; 8];
            ctx.recv(&mut small, Some(0), Some(2)).or_fail(me, || "order: recv tag 2".into());
            recv_check(ctx, 0, 1, 1, LEN);
            recv_check(ctx, 0, 4, 3, LEN);
            ctx.recv(&mut small, Some(0), Some(5)).or_fail(me, || "order: recv tag 5".into());
            recv_check(ctx, 0, 3, 1, LEN);
        }
        _ => recv_check(ctx, 0, 1, 2, LEN),
    }
    println!("rank {me} order: sends completed out of posting order");
    1
}
