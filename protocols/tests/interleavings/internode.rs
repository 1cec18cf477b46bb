//! Jobs that span nodes: ranks of one node keep the LMT protocols, and a message to a rank
//! on another node goes eager or by the NET rendezvous, matched by the same engine. The
//! model (`world`) checks on every run that nothing but eager, RTS(net), CTS(net) and
//! ABORT crosses nodes and that no request completes while its network transfer is
//! outstanding; these tests add the flows: every placement and size, ANY_SOURCE over
//! on-node and off-node senders, truncation, probe and cancel, a failed transfer, a peer
//! dying with a transfer outstanding, and packets a rank on another node may not send.

use gpulmt_protocols::engine::{Action, BufDesc};
use gpulmt_protocols::policy::{Protocol, ProtocolOverride};
use gpulmt_protocols::wire::{AbortReason, CtsMode, Dir, MemDesc, Packet};
use gpulmt_protocols::{ProtoError, Rank, ReqId, Status, Tag};
use proptest::prelude::*;

use crate::world::{config, pattern, placement, region, schedule, Schedule, World, DRAIN_REQ, NET_EAGER_LIMIT};
use crate::{transfer_and_check, MODES};

/// Two ranks on different nodes, under `mode`.
fn two_nodes(seed: u64, mode: ProtocolOverride) -> World {
    World::with_nodes(vec![0, 1], Schedule::seeded(seed), mode, u64::MAX, 2, true)
}

/// The actions an engine has queued, taken without executing them.
fn take_actions(w: &mut World, rank: Rank) -> Vec<Action> {
    std::iter::from_fn(|| w.engines[rank as usize].poll_action()).collect()
}

/// The two forms of the network rendezvous: (`net_push_max`, pushed) — every message
/// pushed, and none (the receiver's CTS asks for each).
const PUSH_FORMS: [(u64, bool); 2] = [(u64::MAX, true), (0, false)];

#[test]
fn every_placement_and_size_across_nodes() {
    for (mi, mode) in MODES.iter().enumerate() {
        for place in 0..4 {
            for len in [0usize, 1, 16, 17, 48, 49, 64, 65, 4097, 65537] {
                for recv_first in [true, false] {
                    for (push_max, pushed) in PUSH_FORMS {
                        let seed = len as u64 + mi as u64 * 7 + place as u64;
                        let w = two_nodes(seed, *mode).net_push(push_max, 16);
                        let w = transfer_and_check(w, seed, len, place, recv_first);
                        // Eager up to the network's limit whatever the memory (GPULMT_PROTOCOL
                        // forces nothing between nodes), NET above it, with a CTS unless pushed.
                        let net = len as u64 > NET_EAGER_LIMIT;
                        assert_eq!(w.chosen.get(&(1, ReqId(1))).copied(), net.then_some(Protocol::Net));
                        assert_eq!(w.net_recvs_posted.len(), usize::from(net));
                        assert_eq!(w.net_cts, usize::from(net && !pushed));
                        assert_eq!(w.pushed.len(), usize::from(net && pushed));
                    }
                }
            }
        }
    }
}

#[test]
fn sends_are_pushed_up_to_the_size_and_count_limits() {
    // Pushed up to 10_000 bytes, two at a time: of three small sends the third waits for
    // its CTS, as does the large one; once the first two end, the next small one pushes.
    let mut w = two_nodes(11, ProtocolOverride::Auto).net_push(10_000, 2);
    let lens = [5000usize, 6000, 7000, 20_000];
    for (i, len) in lens.iter().enumerate() {
        w.send(0, ReqId(i as u64 + 1), 1, 0, pattern(i as u64, *len), Some(0));
    }
    let sent: Vec<_> = take_sent(&mut w, 0, 1);
    let forms: Vec<_> =
        sent.iter().map(|p| matches!(p, Packet::Rts { src: MemDesc::Net { pushed: true }, .. })).collect();
    assert_eq!(forms, [true, true, false, false], "{sent:?}");
    let sends = w.nets.iter().filter(|o| o.rank == 0 && o.send).count();
    assert_eq!(sends, 2, "the pushed sends' data left with their RTS");
    for (i, len) in lens.iter().enumerate() {
        w.recv(1, ReqId(i as u64 + 1), Some(0), Some(0), *len, None);
    }
    w.run();
    w.assert_quiet();
    assert_eq!(w.net_cts, 2, "one CTS for each send not pushed");
    w.send(0, ReqId(9), 1, 0, pattern(9, 9000), None);
    assert!(matches!(&take_sent(&mut w, 0, 1)[..], [Packet::Rts { src: MemDesc::Net { pushed: true }, .. }]));
    w.recv(1, ReqId(9), Some(0), Some(0), 9000, Some(1));
    w.run();
    w.assert_quiet();
    for (i, len) in lens.iter().chain([&9000]).enumerate() {
        let req = ReqId(if i < 4 { i as u64 + 1 } else { 9 });
        let id = if i < 4 { i as u64 } else { 9 };
        assert!(w.done[&(0, req)].is_ok() && w.done[&(1, req)].is_ok(), "{req:?}");
        assert!(w.user(1, req)[..*len] == pattern(id, *len)[..], "{req:?}");
    }
}

#[test]
fn a_pushed_send_posts_device_data_before_its_rts_and_host_data_after() {
    // Device data's staging copy is the transfer's longest step: its network send goes
    // first, so the transport starts the copy while the RTS travels. Host data's first
    // piece leaves at once: behind the RTS, it does not delay the match.
    for device in [Some(0), None] {
        let mut w = two_nodes(15, ProtocolOverride::Auto);
        w.engines[0].post_send(ReqId(1), 1, 0, BufDesc { len: 20_000, device, region: None }, None);
        let order: Vec<&str> = take_actions(&mut w, 0)
            .iter()
            .filter_map(|a| match a {
                Action::NetSend { pushed: true, .. } => Some("data"),
                Action::Send { packet: Packet::Rts { src: MemDesc::Net { pushed: true }, .. }, .. } => Some("rts"),
                _ => None,
            })
            .collect();
        let want = if device.is_some() { ["data", "rts"] } else { ["rts", "data"] };
        assert_eq!(order, want, "device {device:?}");
    }
}

/// Packets rank `from` queued for `to` and not delivered, taken off the wire (the model
/// has seen them already: they count as sent).
fn take_sent(w: &mut World, from: Rank, to: Rank) -> Vec<Packet> {
    let q = w.wires.get_mut(&(from, to)).map(std::mem::take).unwrap_or_default();
    let sent: Vec<Packet> = q.iter().cloned().collect();
    w.wires.insert((from, to), q);
    sent
}

#[test]
fn a_failed_drain_tells_the_sender_to_give_up() {
    // A pushed message too long for its receive is drained; the drain fails (the data
    // stays in the network): the sender is told, and its send fails instead of waiting.
    let mut w = two_nodes(13, ProtocolOverride::Auto);
    w.net_faults.insert((1, DRAIN_REQ));
    w.recv(1, ReqId(1), Some(0), Some(0), 100, None);
    w.send(0, ReqId(1), 1, 0, pattern(1, 20_000), Some(0));
    w.run();
    w.assert_quiet();
    assert_eq!(w.done[&(1, ReqId(1))], Err(ProtoError::Truncated { msg_len: 20_000, buf_len: 100 }));
    // Unless MPI had handed the data over before the drain failed, the send was aborted.
    let send = &w.done[&(0, ReqId(1))];
    assert!(matches!(send, Ok(_) | Err(ProtoError::Aborted { rank: 1, .. })), "{send:?}");
}

#[test]
fn a_drain_whose_sender_dies_is_asked_to_end() {
    let mut w = two_nodes(14, ProtocolOverride::Auto);
    w.recv(1, ReqId(1), Some(0), Some(0), 100, None);
    w.send(0, ReqId(1), 1, 0, pattern(1, 20_000), None);
    w.deliver(0, 1);
    let drain = w.nets.iter().find(|o| o.rank == 1 && o.drain).map(|o| o.id);
    assert!(drain.is_some(), "the truncated pushed message is being drained: {:?}", w.nets);
    w.kill(0);
    let op = w.nets.iter().find(|o| o.rank == 1 && Some(o.id) == drain).expect("still outstanding");
    assert!(op.cancelled, "the drain of a dead sender's data is asked to end");
    w.run();
    w.assert_quiet();
    assert_eq!(w.done[&(1, ReqId(1))], Err(ProtoError::Truncated { msg_len: 20_000, buf_len: 100 }));
}

#[test]
fn a_cts_for_a_pushed_send_is_refused_and_changes_nothing() {
    let mut w = two_nodes(12, ProtocolOverride::Auto);
    w.send(0, ReqId(1), 1, 0, pattern(1, 20_000), Some(0));
    w.engines[0].on_packet(1, Packet::Cts { msg: 1, mode: CtsMode::Net, dst: None, split: 0 });
    let acts = take_actions(&mut w, 0);
    assert!(matches!(&acts[..], [Action::Violation { peer: 1, .. }]), "{acts:?}");
    w.recv(1, ReqId(1), Some(0), Some(0), 20_000, None);
    w.run();
    w.assert_quiet();
    assert!(w.done[&(0, ReqId(1))].is_ok() && w.done[&(1, ReqId(1))].is_ok());
    assert!(w.user(1, ReqId(1))[..20_000] == pattern(1, 20_000)[..]);
}

#[test]
fn eager_limits_follow_the_destination_node() {
    let w = World::with_nodes(vec![0, 0, 1], Schedule::seeded(1), ProtocolOverride::Auto, u64::MAX, 2, true);
    let e = &w.engines[0];
    for device in [false, true] {
        // On the node: 64 host bytes, 16 device bytes; to another node 48 of either.
        let node_limit = if device { 16 } else { 64 };
        assert!(e.is_eager_to(1, node_limit, device) && !e.is_eager_to(1, node_limit + 1, device));
        assert_eq!(e.is_eager_to(1, 40, device), e.is_eager(40, device));
        assert!(e.is_eager_to(2, NET_EAGER_LIMIT, device) && !e.is_eager_to(2, NET_EAGER_LIMIT + 1, device));
        assert!(e.is_eager_to(2, 0, device), "empty messages are always eager");
    }
}

#[test]
fn a_device_buffer_to_another_node_needs_no_region_and_none_is_sent() {
    for exported in [false, true] {
        let mut w = two_nodes(3, ProtocolOverride::Auto);
        let data = pattern(3, 20_000);
        let mut b = w.buf(0, ReqId(1), data.clone(), 5, Some(0));
        if !exported {
            b.region = None;
        }
        w.engines[0].post_send(ReqId(1), 1, 7, b, None);
        w.drain(0);
        let rts = w.wires[&(0, 1)].front().cloned();
        assert!(matches!(rts, Some(Packet::Rts { src: MemDesc::Net { .. }, len: 20_000, .. })), "{rts:?}");
        w.recv(1, ReqId(1), Some(0), Some(7), 20_000, Some(1));
        w.run();
        w.assert_quiet();
        assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Net);
        assert!(w.user(1, ReqId(1))[..20_000] == data[..]);
        assert!(w.done[&(0, ReqId(1))].is_ok());
    }
}

#[test]
fn receives_from_another_node_are_never_offered() {
    let mut w = World::with_nodes(vec![0, 0, 1], Schedule::seeded(4), ProtocolOverride::Auto, u64::MAX, 2, true);
    // An exact device receive from a rank of the node is offered (RTR) ...
    w.recv(0, ReqId(1), Some(1), Some(7), 1000, Some(0));
    assert!(matches!(w.wires[&(0, 1)].front(), Some(Packet::Rtr { .. })));
    // ... one from a rank of another node is not: its region must not leave the node.
    w.recv(0, ReqId(2), Some(2), Some(7), 1000, Some(0));
    assert!(w.wires.get(&(0, 2)).is_none_or(|q| q.is_empty()));
    // Nor does a sender use offers for a rank of another node.
    let b = BufDesc { len: 1000, device: Some(0), region: None };
    assert!(!w.engines[2].rtr_eligible(2, &b) && !w.engines[2].rtr_eligible(0, &b));
    assert!(w.engines[1].rtr_eligible(0, &b));
    w.deliver(0, 1);
    w.send(1, ReqId(1), 0, 7, pattern(1, 1000), Some(1));
    w.send(2, ReqId(1), 0, 7, pattern(2, 1000), Some(0));
    w.run();
    w.assert_quiet();
    assert_eq!(w.chosen[&(0, ReqId(1))], Protocol::Put, "pushed into the offer");
    assert_eq!(w.chosen[&(0, ReqId(2))], Protocol::Net);
    assert!(w.user(0, ReqId(1))[..1000] == pattern(1, 1000)[..]);
    assert!(w.user(0, ReqId(2))[..1000] == pattern(2, 1000)[..]);
}

#[test]
fn probe_and_cancel_see_messages_from_another_node_as_from_this_one() {
    let mut w = World::with_nodes(vec![0, 0, 1], Schedule::seeded(5), ProtocolOverride::Auto, u64::MAX, 2, true);
    // A receive for the off-node rank, cancelled before anything came: at once, no offer.
    w.recv(0, ReqId(9), Some(2), Some(3), 100, Some(0));
    assert!(w.engines[0].cancel_recv(ReqId(9)));
    w.drain(0);
    assert_eq!(w.done[&(0, ReqId(9))], Err(ProtoError::Cancelled));
    // Rank 2 (another node) sends an RTS, rank 1 (this node) an eager message.
    w.send(2, ReqId(1), 0, 3, pattern(1, 5000), None);
    w.send(1, ReqId(1), 0, 4, pattern(2, 10), None);
    w.deliver(2, 0);
    w.deliver(1, 0);
    let e = &w.engines[0];
    assert_eq!(e.probe(None, None), Some(Status { source: 2, tag: 3, len: 5000 }));
    assert_eq!(e.probe(Some(2), Some(3)), Some(Status { source: 2, tag: 3, len: 5000 }));
    assert_eq!(e.probe(None, Some(4)), Some(Status { source: 1, tag: 4, len: 10 }));
    assert_eq!(e.probe(Some(2), Some(4)), None);
    // Probing takes nothing: the receives still get both, the RTS by NET.
    w.recv(0, ReqId(1), None, None, 5000, Some(0));
    w.recv(0, ReqId(2), None, None, 5000, None);
    w.run();
    w.assert_quiet();
    assert_eq!(w.done[&(0, ReqId(1))], Ok(Status { source: 2, tag: 3, len: 5000 }));
    assert_eq!(w.done[&(0, ReqId(2))], Ok(Status { source: 1, tag: 4, len: 10 }));
    assert!(w.user(0, ReqId(1))[..5000] == pattern(1, 5000)[..]);
}

#[test]
fn truncation_from_another_node_is_reported_and_nothing_overflows() {
    for len in [30usize, 100, 50_000] {
        for place in 0..4 {
            for (recv_first, (push_max, pushed)) in [true, false].into_iter().flat_map(|r| PUSH_FORMS.map(|f| (r, f))) {
                let mut w = two_nodes(9, ProtocolOverride::Auto).net_push(push_max, 16);
                let (s, d) = placement(place);
                if recv_first {
                    w.recv(1, ReqId(1), Some(0), Some(1), len / 2, d);
                }
                w.send(0, ReqId(1), 1, 1, pattern(2, len), s);
                if !recv_first {
                    w.run();
                    w.recv(1, ReqId(1), Some(0), Some(1), len / 2, d);
                }
                w.run();
                w.assert_quiet();
                let (msg_len, buf_len) = (len as u64, len as u64 / 2);
                assert_eq!(w.done[&(1, ReqId(1))], Err(ProtoError::Truncated { msg_len, buf_len }));
                assert!(w.done[&(0, ReqId(1))].is_ok(), "MPI: the sender of a truncated message succeeds");
                if pushed && len as u64 > NET_EAGER_LIMIT {
                    // Its data left with the RTS: the receiver drained it (assert_quiet: the
                    // sender's transfer ended), writing nothing.
                    assert_eq!(w.net_recvs_posted.len(), 1, "the pushed data is drained");
                    assert!(w.user(1, ReqId(1))[..len / 2].iter().all(|b| *b == 0), "nothing written");
                } else {
                    assert!(w.net_recvs_posted.is_empty(), "a truncated message moves nothing through the network");
                }
                assert_eq!(&w.user(1, ReqId(1))[len / 2..], &[0xEE; 3]);
                if len as u64 <= NET_EAGER_LIMIT {
                    // Eager: the part that fits is delivered, as within a node.
                    assert!(w.user(1, ReqId(1))[..len / 2] == pattern(2, len)[..len / 2]);
                }
            }
        }
    }
}

#[test]
fn a_rank_on_another_node_may_send_only_the_rendezvous_packets() {
    let r = region(0, ReqId(9), 1 << 20, 0, 0);
    let refused = [
        Packet::Done { msg: 1, dir: Dir::ToSender },
        Packet::Done { msg: 1, dir: Dir::ToReceiver },
        Packet::Cookie { msg: 1 },
        Packet::Chunk { msg: 1, index: 0, len: 10, slot: 0 },
        Packet::ChunkAck { msg: 1, index: 0 },
        Packet::Rtr { recv: 1, expect: 0, tag: 7, len: 100, dst: r },
        Packet::RtrPut { msg: 1, tag: 7, len: 10, recv: 1 },
        Packet::RtrRevoke { recv: 1 },
        Packet::RtrRevoked { recv: 1 },
        Packet::FreeMarks { epoch: 1, buffer_ids: vec![9] },
        Packet::FreeAck { epoch: 1 },
    ];
    for p in refused {
        let mut w = two_nodes(6, ProtocolOverride::Auto);
        // A send from rank 1 awaits its CTS, and a receive is posted (offered on-node).
        w.send(1, ReqId(1), 0, 7, pattern(1, 5000), Some(1));
        w.recv(1, ReqId(2), Some(0), Some(7), 100, Some(1));
        w.engines[1].on_packet(0, p.clone());
        let acts = take_actions(&mut w, 1);
        assert!(matches!(acts[..], [Action::Violation { peer: 0, .. }]), "{p:?}: {acts:?}");
        // Nothing changed: the real flow still completes both.
        w.send(0, ReqId(1), 1, 7, pattern(2, 100), Some(0));
        w.recv(0, ReqId(2), Some(1), Some(7), 5000, None);
        w.run();
        w.assert_quiet();
        assert!(w.done[&(1, ReqId(1))].is_ok() && w.done[&(0, ReqId(2))].is_ok(), "{p:?}");
        assert!(w.user(1, ReqId(2))[..100] == pattern(2, 100)[..], "{p:?}");
    }
}

#[test]
fn rts_naming_the_wrong_path_is_refused() {
    let dev = MemDesc::Device(region(0, ReqId(9), 1 << 20, 0, 0));
    // From another node, a buffer of its own (mappable or host) is refused: only NET
    // may move it. From this node, NET is refused: the LMT protocols move it.
    for (nodes, src, reason) in [
        (vec![0, 1], dev, AbortReason::BadRequest),
        (vec![0, 1], MemDesc::Host, AbortReason::BadRequest),
        (vec![0, 0], MemDesc::Net { pushed: false }, AbortReason::Unsupported),
        (vec![0, 0], MemDesc::Net { pushed: true }, AbortReason::Unsupported),
    ] {
        let mut w = World::with_nodes(nodes, Schedule::seeded(7), ProtocolOverride::Auto, u64::MAX, 2, true);
        w.recv(1, ReqId(1), Some(0), None, 1 << 20, Some(1));
        w.wires.clear();
        w.engines[1].on_packet(0, Packet::Rts { msg: 1, tag: 0, len: 1000, src });
        let acts = take_actions(&mut w, 1);
        let abort = Action::Send { to: 0, packet: Packet::Abort { msg: 1, reason, dir: Dir::ToSender } };
        assert!(matches!(&acts[..], [Action::Violation { peer: 0, .. }, a] if *a == abort), "{src:?}: {acts:?}");
    }
}

#[test]
fn cts_naming_the_wrong_path_fails_the_send() {
    let r = region(1, ReqId(9), 1 << 20, 0, 1);
    for (nodes, mode, dst) in [
        (vec![0, 1], CtsMode::Put, Some(r)),
        (vec![0, 1], CtsMode::Coop, Some(r)),
        (vec![0, 1], CtsMode::Shm, None),
        (vec![0, 1], CtsMode::Net, Some(r)),
        (vec![0, 0], CtsMode::Net, None),
    ] {
        // A send that waits for its CTS (a pushed one wants none: the test above).
        let w = World::with_nodes(nodes, Schedule::seeded(8), ProtocolOverride::Auto, u64::MAX, 2, true);
        let mut w = w.net_push(0, 16);
        w.send(0, ReqId(1), 1, 0, pattern(1, 20_000), Some(0));
        w.wires.clear();
        w.engines[0].on_packet(1, Packet::Cts { msg: 1, mode, dst, split: 8192 });
        let acts = take_actions(&mut w, 0);
        assert!(
            matches!(
                &acts[..],
                [
                    Action::Violation { peer: 1, .. },
                    Action::Send { to: 1, packet: Packet::Abort { msg: 1, dir: Dir::ToReceiver, .. } },
                    Action::Complete { req: ReqId(1), result: Err(ProtoError::Protocol { rank: 1, .. }) },
                ]
            ),
            "{mode:?} {dst:?}: {acts:?}"
        );
    }
}

proptest! {
    #![proptest_config(config(48))]

    /// Rank 0 takes every message with ANY_SOURCE / ANY_TAG receives, some posted before
    /// the sends and some after (each of those first probed), while rank 1 (its node)
    /// and ranks 2 and 3 (another node, or rank 3 on a third or on rank 0's) send it
    /// messages of random size, placement and tag, eager and rendezvous, the network
    /// transfers completing in any order relative to packets and copies: each message
    /// is received exactly once, in per-sender order, with its status and bytes, and
    /// each probe names the message the next receive gets. Senders push 0-2 messages at
    /// a time (the rest wait for their CTS).
    #[test]
    fn any_source_races_senders_on_and_off_the_node(
        schedule in schedule(),
        node3 in 0u32..3,
        msgs in prop::collection::vec(
            (1u32..4, prop::sample::select(vec![0usize, 30, 49, 5000, 20_000]), 0..3 as Tag, any::<bool>(), 0..6usize),
            6..10,
        ),
        early in 0usize..10,
        recv_device in any::<bool>(),
        push_sends in 0u32..3,
    ) {
        let w = World::with_nodes(vec![0, 0, 1, node3], schedule, ProtocolOverride::Auto, u64::MAX, 2, true);
        let mut w = w.net_push(u64::MAX, push_sends);
        let n = msgs.len();
        let early = early.min(n);
        let dev = recv_device.then_some(0);
        for k in 0..early {
            w.recv(0, ReqId(100 + k as u64), None, None, 20_000, dev);
        }
        let mut sent: Vec<Vec<(Tag, Vec<u8>)>> = vec![Vec::new(); 4];
        for (i, (from, len, tag, device, steps)) in msgs.iter().enumerate() {
            let data = pattern(i as u64 + 1, *len);
            w.send(*from, ReqId(i as u64 + 1), 0, *tag, data.clone(), device.then_some(from % 2));
            sent[*from as usize].push((*tag, data));
            for _ in 0..*steps {
                w.step();
            }
        }
        let mut probed = Vec::new();
        for k in early..n {
            probed.push((k, w.engines[0].probe(None, None)));
            w.recv(0, ReqId(100 + k as u64), None, None, 20_000, dev);
            w.step();
        }
        w.run();
        w.assert_quiet();
        // Receives in posting order, per sender: exactly the messages sent, in order.
        let mut got: Vec<Vec<(Tag, Vec<u8>)>> = vec![Vec::new(); 4];
        for k in 0..n as u64 {
            let st = w.done[&(0, ReqId(100 + k))].clone().expect("receive succeeded");
            got[st.source as usize].push((st.tag, w.user(0, ReqId(100 + k))[..st.len as usize].to_vec()));
        }
        prop_assert_eq!(&got, &sent);
        for (k, p) in probed {
            if let Some(p) = p {
                prop_assert_eq!(Ok(p), w.done[&(0, ReqId(100 + k as u64))].clone(), "probe before receive {}", k);
            }
        }
        for i in 0..n as u64 {
            prop_assert!(w.done[&(msgs[i as usize].0, ReqId(i + 1))].is_ok());
        }
    }

    /// Rank 0 sends rank 1, on another node, a message; after a random number of steps
    /// one of them dies. A survivor whose network transfer is outstanding at that moment
    /// completes only once the transport reported it done (it is asked to end), with
    /// PeerFailed; one with none outstanding fails at once (or had completed). New work
    /// with the dead rank fails at once.
    #[test]
    fn a_peer_dying_with_a_network_transfer_outstanding(
        schedule in schedule(),
        victim in 0u32..2,
        steps in 0usize..30,
        len in prop::sample::select(vec![30usize, 100, 50_000]),
        send_device in any::<bool>(),
        recv_device in any::<bool>(),
        recv_first in any::<bool>(),
        push in any::<bool>(),
    ) {
        let w = World::with_nodes(vec![0, 1], schedule, ProtocolOverride::Auto, u64::MAX, 2, true);
        let mut w = w.net_push(if push { u64::MAX } else { 0 }, 16);
        if recv_first {
            w.recv(1, ReqId(1), Some(0), Some(0), len, recv_device.then_some(1));
        }
        w.send(0, ReqId(1), 1, 0, pattern(1, len), send_device.then_some(0));
        if !recv_first {
            w.recv(1, ReqId(1), Some(0), Some(0), len, recv_device.then_some(1));
        }
        for _ in 0..steps {
            if !w.step() {
                break;
            }
        }
        let survivor = 1 - victim;
        let key = (survivor, ReqId(1));
        let outstanding = w.nets.iter().any(|o| o.rank == survivor);
        let before = w.done.get(&key).cloned();
        w.kill(victim);
        if outstanding {
            prop_assert!(!w.done.contains_key(&key), "completed while its network transfer is outstanding");
            prop_assert!(w.nets.iter().filter(|o| o.rank == survivor).all(|o| o.cancelled), "asked to end");
        } else if before.is_none() {
            prop_assert_eq!(w.done.get(&key), Some(&Err(ProtoError::PeerFailed { rank: victim })), "at once");
        }
        w.run();
        w.assert_quiet();
        match before {
            Some(b) => prop_assert_eq!(&w.done[&key], &b),
            None => prop_assert_eq!(&w.done[&key], &Err(ProtoError::PeerFailed { rank: victim })),
        }
        w.send(survivor, ReqId(2), victim, 0, vec![1], None);
        prop_assert_eq!(&w.done[&(survivor, ReqId(2))], &Err(ProtoError::PeerFailed { rank: victim }));
    }

    /// One side's network transfer fails, at any moment (pushed or not): that side fails with the
    /// transport's error, and the other is told (ABORT) and has its transfer cancelled,
    /// so it fails too, unless MPI had completed it first (a send then succeeded, and the
    /// receiver's late ABORT is no violation). A second message behind it goes through.
    #[test]
    fn a_failed_network_transfer_fails_both_sides(
        schedule in schedule(),
        failing in 0u32..2,
        recv_first in any::<bool>(),
        push in any::<bool>(),
    ) {
        let w = World::with_nodes(vec![0, 1], schedule, ProtocolOverride::Auto, u64::MAX, 2, true);
        let mut w = w.net_push(if push { u64::MAX } else { 0 }, 16);
        w.net_faults.insert((failing, ReqId(1)));
        let (a, b) = (pattern(1, 30_000), pattern(2, 10_000));
        if recv_first {
            w.recv(1, ReqId(1), Some(0), Some(0), a.len(), Some(1));
            w.recv(1, ReqId(2), Some(0), Some(0), b.len(), None);
        }
        w.send(0, ReqId(1), 1, 0, a, Some(0));
        w.send(0, ReqId(2), 1, 0, b.clone(), None);
        if !recv_first {
            w.recv(1, ReqId(1), Some(0), Some(0), 30_000, Some(1));
            w.recv(1, ReqId(2), Some(0), Some(0), b.len(), None);
        }
        w.run();
        w.assert_quiet();
        let (send, recv) = (&w.done[&(0, ReqId(1))], &w.done[&(1, ReqId(1))]);
        if failing == 1 {
            prop_assert!(matches!(recv, Err(ProtoError::CopyFailed { what }) if what.contains("injected")), "{:?}", recv);
            prop_assert!(matches!(send, Ok(_) | Err(ProtoError::Aborted { rank: 1, .. })), "{:?}", send);
        } else {
            prop_assert!(matches!(send, Err(ProtoError::CopyFailed { what }) if what.contains("injected")), "{:?}", send);
            prop_assert!(matches!(recv, Err(ProtoError::Aborted { rank: 0, .. })), "{:?}", recv);
        }
        prop_assert!(w.done[&(0, ReqId(2))].is_ok() && w.done[&(1, ReqId(2))].is_ok());
        prop_assert!(w.user(1, ReqId(2))[..b.len()] == b[..]);
    }
}
