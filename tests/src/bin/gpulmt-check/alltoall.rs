//! `alltoall`: every rank sends every other rank (and itself, when asked) a message of a
//! size and memory drawn per pair and iteration, into ANY_SOURCE receives of mixed
//! memories; each message is checked against its sender's pattern.

use std::collections::BTreeSet;

use gpulmt::{Context, Tag};

use crate::api::{expect_status, irecv, isend};
use crate::buffers::{msg_seed, pattern, Buf, Kind, GUARD_RECV, GUARD_SEND};
use crate::report::OrFail;

pub const A2A_SIZES: [usize; 7] = [0, 1, 100, 8192, 8193, 65539, 1 << 20];
pub const A2A_MAX: usize = 1 << 20;
pub const A2A_OFF: usize = 64;

pub fn a2a_hash(src: u32, dst: u32, iter: u32) -> u64 {
    let mut z = msg_seed(src, dst, iter, 7).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z ^ (z >> 27)
}

pub fn a2a_size(src: u32, dst: u32, iter: u32) -> usize {
    A2A_SIZES[(a2a_hash(src, dst, iter) % A2A_SIZES.len() as u64) as usize]
}

pub fn a2a_sender_kind(src: u32, dst: u32, iter: u32) -> Kind {
    if (a2a_hash(src, dst, iter) >> 20) & 1 == 1 {
        Kind::Dev
    } else {
        Kind::Host
    }
}

pub fn run(ctx: &mut Context, iters: u32, include_self: bool) {
    let (me, n) = (ctx.rank(), ctx.size());
    let peers: Vec<u32> = (1..n).map(|k| (me + k) % n).chain(include_self.then_some(me)).collect();
    let slots = peers.len();
    // Receive buffers per slot (host and device), send buffers per destination.
    let mut rh: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Host, A2A_MAX, A2A_OFF, GUARD_RECV)).collect();
    let mut rd: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Dev, A2A_MAX, A2A_OFF, GUARD_RECV)).collect();
    let mut sh: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Host, A2A_MAX, A2A_OFF, GUARD_SEND)).collect();
    let mut sd: Vec<Buf> = (0..slots).map(|_| Buf::new(ctx, Kind::Dev, A2A_MAX, A2A_OFF, GUARD_SEND)).collect();
    let mut received = 0u64;
    for iter in 0..iters {
        let tag = 100 + iter as Tag;
        let recv_kind = |j: usize| {
            if (me as usize + iter as usize + j) & 1 == 0 {
                Kind::Dev
            } else {
                Kind::Host
            }
        };
        let mut rreqs = Vec::new();
        for j in 0..slots {
            let b = if recv_kind(j) == Kind::Dev { &mut rd[j] } else { &mut rh[j] };
            if iter > 0 {
                b.fill(ctx, GUARD_RECV);
            }
            rreqs.push(irecv(ctx, b, None, Some(tag)));
        }
        let mut sreqs = Vec::new();
        for (j, &dst) in peers.iter().enumerate() {
            let len = a2a_size(me, dst, iter);
            let data = pattern(msg_seed(me, dst, iter, 1), len);
            let b = if a2a_sender_kind(me, dst, iter) == Kind::Dev { &mut sd[j] } else { &mut sh[j] };
            b.write(ctx, &data);
            sreqs.push(isend(ctx, b, len, dst, tag));
        }
        let statuses = ctx.wait_all(rreqs).or_fail(format!("alltoall iteration {iter}: receives"));
        let mut seen = BTreeSet::new();
        for (j, st) in statuses.iter().enumerate() {
            let src = st.source;
            ensure!(
                peers.contains(&src),
                "alltoall iteration {iter}: receive {j} completed with source {src}, not a peer ({st:?})"
            );
            ensure!(seen.insert(src), "alltoall iteration {iter}: two messages from rank {src}");
            let len = a2a_size(src, me, iter);
            expect_status(st, src, tag, len, &format!("alltoall iteration {iter} from {src}"));
            let data = pattern(msg_seed(src, me, iter, 1), len);
            let b = if recv_kind(j) == Kind::Dev { &rd[j] } else { &rh[j] };
            b.verify(
                ctx,
                &data,
                GUARD_RECV,
                &format!(
                    "alltoall iteration {iter}: {len} bytes from rank {src} ({} memory) into slot {j}",
                    a2a_sender_kind(src, me, iter)
                ),
            );
            received += 1;
        }
        ensure!(seen.len() == slots, "alltoall iteration {iter}: got messages from {seen:?}, expected {peers:?}");
        let sst = ctx.wait_all(sreqs).or_fail(format!("alltoall iteration {iter}: sends"));
        for (j, st) in sst.iter().enumerate() {
            expect_status(st, peers[j], tag, a2a_size(me, peers[j], iter), &format!("alltoall send status {iter}"));
        }
    }
    println!("rank={me} alltoall received={received}");
    for b in rd.into_iter().chain(sd) {
        b.release(ctx);
    }
    drop((rh, sh));
    ctx.mem_free_commit().or_fail("alltoall: final mem_free_commit");
}
