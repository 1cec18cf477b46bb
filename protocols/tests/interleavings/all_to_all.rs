//! The random all-to-all properties: a few ranks each send a few messages of random
//! size, placement and tag to random peers, in a random interleaving, and every receive
//! must get the bytes MPI's matching rules give it; also with the ranks spread over
//! nodes, so that some pairs use the LMT protocols and others eager and NET.

use gpulmt_protocols::policy::{Protocol, ProtocolOverride};
use gpulmt_protocols::{Rank, ReqId, Status, Tag};
use proptest::prelude::*;

use crate::world::{config, pattern, schedule, Schedule, World, NET_EAGER_LIMIT};
use crate::MODES;

/// Ranks of the all-to-all properties, and messages each sends.
const A2A_RANKS: u32 = 4;
const A2A_PER_SENDER: usize = 3;

/// One message of an all-to-all: its sender's `k`-th (sender and `k` come from its
/// place in the plan), where it goes, how big, where both buffers live, and how its
/// posting interleaves with progress.
#[derive(Clone, Debug)]
struct A2aMsg {
    to: Rank,
    len: usize,
    send_device: bool,
    recv_device: bool,
    /// The receive (exact source and tag) is posted before the send, so that an RTR
    /// offer may reach the sender in time, and `steps_after_recv` steps run between.
    recv_first: bool,
    steps_after_recv: usize,
    /// Steps run after the message is posted, before the next one.
    steps_after_send: usize,
}

/// The messages of an all-to-all, `A2A_PER_SENDER` per rank in rank order; each
/// receive is posted first with probability `recv_first`.
fn a2a_plan(recv_first: f64) -> impl Strategy<Value = Vec<A2aMsg>> {
    let msg =
        (
            0..A2A_RANKS,
            prop::sample::select(vec![0usize, 1, 48, 49, 64, 65, 5000, 30_000, 70_000]),
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(recv_first),
            0..12usize,
            0..20usize,
        )
            .prop_map(|(to, len, send_device, recv_device, recv_first, steps_after_recv, steps_after_send)| {
                A2aMsg { to, len, send_device, recv_device, recv_first, steps_after_recv, steps_after_send }
            });
    prop::collection::vec(msg, A2A_RANKS as usize * A2A_PER_SENDER)
}

/// A partition of the all-to-all's ranks into up to three nodes (rank r on node `[r]`).
fn nodes() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, A2A_RANKS as usize)
}

/// Body of the random all-to-all properties, with rank r on node `nodes[r]`.
fn all_to_all(
    plan: Vec<A2aMsg>,
    nodes: Vec<u32>,
    schedule: Schedule,
    mode: ProtocolOverride,
    peer: bool,
) -> Result<(), TestCaseError> {
    let n = A2A_RANKS;
    let mut w = World::with_nodes(nodes.clone(), schedule, mode, 50_000, 2, peer);
    let mut next_req = vec![1u64; n as usize];
    let mut recvs = Vec::new();
    for (i, m) in plan.iter().enumerate() {
        let (from, k) = ((i / A2A_PER_SENDER) as Rank, i % A2A_PER_SENDER);
        let (to, tag) = (m.to, (k % 2) as Tag);
        let data = pattern(i as u64, m.len);
        let dev = m.send_device.then_some(from % 2);
        let ddev = m.recv_device.then_some(to % 2);
        let s = ReqId(next_req[from as usize]);
        next_req[from as usize] += 1;
        let r = ReqId(next_req[to as usize]);
        next_req[to as usize] += 1;
        if m.recv_first {
            w.recv(to, r, Some(from), Some(tag), 70_000, ddev);
            for _ in 0..m.steps_after_recv {
                w.step();
            }
        }
        w.send(from, s, to, tag, data.clone(), dev);
        if !m.recv_first {
            w.recv(to, r, Some(from), Some(tag), 70_000, ddev);
        }
        recvs.push((to, r, data, from, tag));
        for _ in 0..m.steps_after_send {
            w.step();
        }
    }
    w.run();
    w.assert_quiet();
    for (to, r, data, from, tag) in recvs {
        let st = w.done[&(to, r)].clone().expect("receive succeeded");
        prop_assert_eq!(st, Status { source: from, tag, len: data.len() as u64 });
        prop_assert!(w.user(to, r)[..data.len()] == data[..]);
        // Between nodes: eager up to the network's limit, whatever the memory, else NET;
        // within a node never NET.
        let chosen = w.chosen.get(&(to, r)).copied();
        if nodes[from as usize] != nodes[to as usize] {
            let want = (data.len() as u64 > NET_EAGER_LIMIT).then_some(Protocol::Net);
            prop_assert_eq!(chosen, want, "{} bytes from {} to {}, nodes {:?}", data.len(), from, to, &nodes);
        } else {
            prop_assert_ne!(chosen, Some(Protocol::Net));
        }
    }
    for from in 0..n {
        for k in 1..next_req[from as usize] {
            prop_assert!(w.done.contains_key(&(from, ReqId(k))));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(64))]

    /// Four ranks, each sending a few messages of random size, placement and tag to
    /// random peers, received with exact receives posted before or after the send,
    /// delivered in a random interleaving, under every mode, with and without peer
    /// access: everything completes, no deadlock, and each receive gets the bytes of
    /// the message MPI's rules say it matches (per sender, in order).
    #[test]
    fn random_all_to_all(
        plan in a2a_plan(0.5),
        schedule in schedule(),
        mode in prop::sample::select(MODES.to_vec()),
        peer in any::<bool>(),
    ) {
        all_to_all(plan, vec![0; A2A_RANKS as usize], schedule, mode, peer)?;
    }

    /// The same under `auto` with every receive posted first and given time to reach
    /// its sender, so that RTR offers are taken, go stale and cross RTSs.
    #[test]
    fn random_all_to_all_with_offers(plan in a2a_plan(1.0), schedule in schedule()) {
        all_to_all(plan, vec![0; A2A_RANKS as usize], schedule, ProtocolOverride::Auto, true)?;
    }

    /// The same with the ranks spread over up to three nodes, under every mode (which
    /// forces nothing between nodes), with receives posted before or after the sends:
    /// between nodes eager and NET, whose network transfers complete in any order
    /// relative to each other and to the packets, within nodes the LMT protocols as
    /// ever, and every receive gets its message's bytes in per-sender order. The model
    /// checks on the way that nothing but eager, RTS(net), CTS(net) and ABORT crosses
    /// nodes (no region, no offer, no copy, no staging) and that no request completes
    /// while its network transfer is outstanding.
    #[test]
    fn random_all_to_all_across_nodes(
        plan in a2a_plan(0.5),
        nodes in nodes(),
        schedule in schedule(),
        mode in prop::sample::select(MODES.to_vec()),
        peer in any::<bool>(),
    ) {
        all_to_all(plan, nodes, schedule, mode, peer)?;
    }

}
