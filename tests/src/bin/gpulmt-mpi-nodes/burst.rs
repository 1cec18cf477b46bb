//! A burst to a rank of another node: many sends and receives posted at once, more than
//! a GIO queue has slots (run with `GPULMT_NET_QUEUE_SLOTS=4` for a queue under
//! backpressure): every message arrives whole, in order per tag, nothing lost.

use gpulmt::{Context, Rank, Request};

use crate::buffer::{fail, message, Buffer, OrFail};

/// Messages each way: eager ones and NET rendezvous ones mixed.
const COUNT: usize = 64;

fn len_of(i: usize) -> usize {
    if i % 4 == 3 {
        65537 + i
    } else {
        1 + 61 * i
    }
}

/// Sends the burst to `to` and receives `from`'s. Returns the checks made.
pub fn run(ctx: &mut Context, to: Rank, from: Rank) -> usize {
    let me = ctx.rank();
    let before = ctx.stats().backpressure;
    let sends: Vec<Buffer> = (0..COUNT)
        .map(|i| {
            let b = Buffer::new(ctx, i % 2 == 0, len_of(i)).or_fail(me, || "burst: send buffer".into());
            b.fill(ctx, &message((u64::from(me) << 32) | i as u64, len_of(i))).or_fail(me, || "burst: fill".into());
            b
        })
        .collect();
    let recvs: Vec<Buffer> = (0..COUNT)
        .map(|i| {
            let b = Buffer::new(ctx, i % 3 == 0, len_of(i)).or_fail(me, || "burst: receive buffer".into());
            b.guard(ctx, len_of(i)).or_fail(me, || "burst: guards".into());
            b
        })
        .collect();
    // Every receive of one tag, then every send: the queue fills at once.
    let mut reqs: Vec<Request> = Vec::with_capacity(2 * COUNT);
    for (i, b) in recvs.iter().enumerate() {
        // SAFETY: the buffer holds len_of(i) bytes past `at` and outlives the request.
        let r = unsafe { ctx.irecv(b.at() as *mut u8, len_of(i), Some(from), Some(300)) };
        reqs.push(r.or_fail(me, || format!("burst: irecv {i}")));
    }
    for (i, b) in sends.iter().enumerate() {
        // SAFETY: as above, for reads.
        let s = unsafe { ctx.isend(b.at() as *const u8, len_of(i), to, 300) };
        reqs.push(s.or_fail(me, || format!("burst: isend {i}")));
    }
    let st = ctx.wait_all(reqs).or_fail(me, || "burst".into());
    for (i, b) in recvs.iter().enumerate() {
        if (st[i].source, st[i].len) != (from, len_of(i) as u64) {
            fail(me, format!("burst: receive {i} got {:?} (out of order?)", st[i]));
        }
        let want = message((u64::from(from) << 32) | i as u64, len_of(i));
        if let Err(e) = b.check(ctx, &want, want.len()).or_fail(me, || "burst: read".into()) {
            fail(me, format!("burst: message {i} from {from}: {e}"));
        }
    }
    // A 4-slot queue cannot take 64 posts at once: the context must have held some back.
    let pressed = ctx.stats().backpressure - before;
    if ctx.config().net.queue_slots == 4 && pressed == 0 {
        fail(me, "burst: 128 posts into 4-slot queues never met backpressure".into());
    }
    println!("rank {me} burst: {COUNT} each way, {pressed} posts held back for queue room");
    sends.into_iter().chain(recvs).for_each(Buffer::release);
    COUNT
}
