//! ANY_SOURCE / ANY_TAG receives of one rank over senders of its own node and of other
//! nodes at once, eager and rendezvous sizes, host and device buffers: every message
//! arrives whole, and each sender's messages match the receives in the order sent
//! (MPI's non-overtaking rule across both paths).

use gpulmt::mpi::rsmpi::traits::{Communicator, CommunicatorCollectives};
use gpulmt::{Context, Rank, Request};

use crate::buffer::{fail, message, Buffer, OrFail};

/// Messages each sender sends.
const PER_SENDER: usize = 24;
/// Sizes by sequence number: eager within the node and across, rendezvous past the
/// eager limits (LMT within the node, NET across), 8 bytes at least (the header).
const SIZES: [usize; 5] = [8, 20000, 3000, 70001, 100];
/// The tags, by sequence number.
fn tag_of(seq: usize) -> i32 {
    40 + (seq % 3) as i32
}

/// The seed of message `seq` of `from`.
fn seed(from: Rank, seq: usize) -> u64 {
    0x5eed_0000 ^ (u64::from(from) << 20) ^ seq as u64
}

/// Message `seq` of `from`: its sender and number in the first 8 bytes, then a pattern.
fn body(from: Rank, seq: usize) -> Vec<u8> {
    let mut m = message(seed(from, seq), SIZES[seq % SIZES.len()]);
    m[..4].copy_from_slice(&from.to_le_bytes());
    m[4..8].copy_from_slice(&(seq as u32).to_le_bytes());
    m
}

/// Rank `root` receives every other rank's messages through wildcard receives, half
/// posted before the senders start (matched as they arrive), half after (matched from
/// the unexpected queue). Returns the checks made.
pub fn run(ctx: &mut Context, world: &impl Communicator, root: Rank) -> usize {
    let me = ctx.rank();
    let size = ctx.size();
    let largest = SIZES.iter().copied().max().unwrap_or(0);
    if me != root {
        world.barrier();
        let msgs: Vec<Vec<u8>> = (0..PER_SENDER).map(|seq| body(me, seq)).collect();
        // Odd senders send from device memory, even ones from the host.
        let device = me % 2 == 1;
        let bufs: Vec<Buffer> = msgs
            .iter()
            .map(|m| {
                let b = Buffer::new(ctx, device, m.len()).or_fail(me, || "wildcard: send buffer".into());
                b.fill(ctx, m).or_fail(me, || "wildcard: fill".into());
                b
            })
            .collect();
        let reqs: Vec<Request> = (0..PER_SENDER)
            .map(|seq| {
                let what = || format!("wildcard: send {seq} to {root}");
                // SAFETY: the buffer holds the message and outlives the request (waited below).
                unsafe { ctx.isend(bufs[seq].at() as *const u8, msgs[seq].len(), root, tag_of(seq)) }.or_fail(me, what)
            })
            .collect();
        ctx.wait_all(reqs).or_fail(me, || "wildcard: sends".into());
        bufs.into_iter().for_each(Buffer::release);
        return PER_SENDER;
    }
    let total = PER_SENDER * (size as usize - 1);
    // Receives into host and device buffers, alternating.
    let bufs: Vec<Buffer> = (0..total)
        .map(|i| Buffer::new(ctx, i % 2 == 1, largest).or_fail(me, || "wildcard: receive buffer".into()))
        .collect();
    for b in &bufs {
        b.guard(ctx, largest).or_fail(me, || "wildcard: guards".into());
    }
    let post = |ctx: &mut Context, i: usize| -> Request {
        // SAFETY: the buffer holds `largest` bytes past `at` and outlives the request.
        unsafe { ctx.irecv(bufs[i].at() as *mut u8, largest, None, None) }.or_fail(me, || format!("wildcard irecv {i}"))
    };
    let mut reqs: Vec<Request> = (0..total / 2).map(|i| post(ctx, i)).collect();
    world.barrier();
    // Let messages queue up unexpected before the rest of the receives.
    for _ in 0..200 {
        ctx.progress().or_fail(me, || "wildcard: progress".into());
    }
    reqs.extend((total / 2..total).map(|i| post(ctx, i)));
    let statuses = ctx.wait_all(reqs).or_fail(me, || "wildcard: receives".into());
    let mut next = vec![0usize; size as usize];
    for (i, st) in statuses.iter().enumerate() {
        let from = st.source;
        if from == me || from >= size {
            fail(me, format!("wildcard receive {i}: source {from}"));
        }
        let seq = next[from as usize];
        next[from as usize] += 1;
        let want = body(from, seq);
        if (st.tag, st.len) != (tag_of(seq), want.len() as u64) {
            fail(me, format!("wildcard receive {i}: {st:?}, but message {seq} of rank {from} (overtaken?)"));
        }
        if let Err(e) = bufs[i].check(ctx, &want, want.len()).or_fail(me, || "wildcard: read".into()) {
            fail(me, format!("wildcard receive {i} (message {seq} of rank {from}): {e}"));
        }
    }
    if let Some(r) = (0..size).find(|&r| r != me && next[r as usize] != PER_SENDER) {
        fail(me, format!("wildcard: {} messages of rank {r}, not {PER_SENDER}", next[r as usize]));
    }
    bufs.into_iter().for_each(Buffer::release);
    total
}
