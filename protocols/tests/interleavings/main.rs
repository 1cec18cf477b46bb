//! Drives several protocol engines against each other with packet deliveries and
//! copy completions in random order, over a model of their memories, and checks
//! that every request completes with the right status and bytes, for every
//! protocol and placement, and that nothing is left behind.
//!
//! The order is a [`Schedule`]: in the property tests, proptest draws the choices
//! themselves (which packet or copy goes next, and each message's peer, size and
//! placement), so a failing case shrinks to a short schedule of small choices; the
//! fixed tests take a repeatable pseudo-random order per seed.
//!
//! Modules: `world` (the model and its checks), `all_to_all` (random all-to-all
//! properties, within a node and across nodes), `internode` (jobs that span nodes: the
//! NET rendezvous and what may cross nodes), `fallback` (a GET whose sender buffer cannot
//! be mapped); the rest of this file tests single
//! protocols and flows within a node.

mod all_to_all;
mod fallback;
mod internode;
mod world;

use gpulmt_protocols::engine::{Action, BufDesc, CopyCmd, CopyEngine, Engine, Loc};
use gpulmt_protocols::policy::{Protocol, ProtocolOverride};
use gpulmt_protocols::wire::Packet;
use gpulmt_protocols::{CopyId, ProtoError, Rank, ReqId, Status, Tag};
use proptest::prelude::*;

use world::{config, pattern, placement, region, schedule, Schedule, World};

/// Expected protocol for a rendezvous of this placement and mode.
fn expected(mode: ProtocolOverride, s: Option<u32>, d: Option<u32>, peer: bool, len: usize) -> Protocol {
    match (s, d) {
        (Some(a), Some(b)) if peer || a == b => match mode {
            ProtocolOverride::Auto | ProtocolOverride::Get => Protocol::Get,
            ProtocolOverride::Put => Protocol::Put,
            // Too small to split at a 4 KiB boundary: the receiver pulls it all.
            ProtocolOverride::Coop if len / 2 < 4096 => Protocol::Get,
            ProtocolOverride::Coop => Protocol::Coop,
            ProtocolOverride::Shm => Protocol::Shm,
        },
        _ => Protocol::Shm,
    }
}

fn one_transfer(seed: u64, len: usize, mode: ProtocolOverride, place: u8, peer: bool, recv_first: bool) {
    let w = World::new(2, Schedule::seeded(seed), mode, u64::MAX, 2, peer);
    let w = transfer_and_check(w, seed, len, place, recv_first);
    let (s, d) = placement(place);
    if len > 64 {
        assert_eq!(w.chosen[&(1, ReqId(1))], expected(mode, s, d, peer, len));
    }
}

/// Moves a message of `len` bytes with placement `place` from rank 0 to rank 1 of `w`,
/// its receive posted first or once the message went as far as it can alone; checks
/// both statuses and the bytes (none past the buffer), and hands `w` back for checks of
/// the path it took.
pub(crate) fn transfer_and_check(mut w: World, seed: u64, len: usize, place: u8, recv_first: bool) -> World {
    let (s, d) = placement(place);
    let data = pattern(seed, len);
    if recv_first {
        w.recv(1, ReqId(1), Some(0), Some(7), len, d);
        w.send(0, ReqId(1), 1, 7, data.clone(), s);
    } else {
        w.send(0, ReqId(1), 1, 7, data.clone(), s);
        w.run();
        w.recv(1, ReqId(1), Some(0), Some(7), len, d);
    }
    w.run();
    w.assert_quiet();
    let st = Status { source: 0, tag: 7, len: len as u64 };
    assert_eq!(w.done[&(1, ReqId(1))], Ok(st));
    assert_eq!(w.done[&(0, ReqId(1))], Ok(Status { source: 1, ..st }));
    assert!(w.user(1, ReqId(1))[..len] == data[..], "data mismatch");
    // Nothing written past the buffer.
    assert_eq!(&w.user(1, ReqId(1))[len..], &[0xEE; 3]);
    w
}

pub(crate) const MODES: [ProtocolOverride; 5] = [
    ProtocolOverride::Auto,
    ProtocolOverride::Get,
    ProtocolOverride::Put,
    ProtocolOverride::Coop,
    ProtocolOverride::Shm,
];

#[test]
fn every_protocol_placement_and_size() {
    for (mi, mode) in MODES.iter().enumerate() {
        for place in 0..4 {
            for len in [0usize, 1, 7, 64, 65, 4095, 4096, 12289, 65537, 200_000] {
                for peer in [true, false] {
                    for recv_first in [true, false] {
                        one_transfer(len as u64 + mi as u64 * 7 + place as u64, len, *mode, place, peer, recv_first);
                    }
                }
            }
        }
    }
}

#[test]
fn coop_auto_threshold_and_same_device() {
    let mut w = World::new(2, Schedule::seeded(3), ProtocolOverride::Auto, 100_000, 1, true);
    let data = pattern(1, 300_000);
    w.send(0, ReqId(1), 1, 0, data.clone(), Some(0));
    w.recv(1, ReqId(1), None, None, 300_000, Some(0));
    w.run();
    // One device for both: GET, even above the COOPERATE threshold.
    assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Get);
    assert_eq!(&w.user(1, ReqId(1))[..300_000], &data[..]);

    let mut w = World::new(2, Schedule::seeded(4), ProtocolOverride::Auto, 100_000, 2, true);
    w.send(0, ReqId(1), 1, 0, data.clone(), Some(0));
    w.recv(1, ReqId(1), None, None, 300_000, Some(1));
    w.run();
    assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Coop);
    assert_eq!(&w.user(1, ReqId(1))[..300_000], &data[..]);
}

#[test]
fn balance_spreads_a_window_over_both_engines_and_leaves_lone_messages() {
    for balance in [false, true] {
        let mut w = World::new(2, Schedule::seeded(9), ProtocolOverride::Auto, u64::MAX, 2, true);
        if !balance {
            let mut c = w.engines[1].config().clone();
            c.policy.balance_max = 0;
            w.engines[1] = Engine::new(c);
        }
        // Six RTSs wait at rank 1 before its receives match them: a window.
        let msgs: Vec<Vec<u8>> = (0..6).map(|k| pattern(k, 20_000)).collect();
        for (k, data) in msgs.iter().enumerate() {
            w.send(0, ReqId(k as u64 + 1), 1, 7, data.clone(), Some(0));
        }
        w.deliver(0, 1);
        for k in 0..6 {
            w.recv(1, ReqId(k + 1), Some(0), Some(7), 20_000, Some(1));
        }
        w.run();
        w.assert_quiet();
        let chosen: Vec<Protocol> = (1..=6).map(|k| w.chosen[&(1, ReqId(k))]).collect();
        let want = if balance {
            vec![Protocol::Get, Protocol::Put, Protocol::Get, Protocol::Put, Protocol::Get, Protocol::Put]
        } else {
            vec![Protocol::Get; 6]
        };
        assert_eq!(chosen, want, "balance {balance}");
        for (k, data) in msgs.iter().enumerate() {
            assert!(w.user(1, ReqId(k as u64 + 1))[..20_000] == data[..], "message {k}");
            assert!(w.done[&(0, ReqId(k as u64 + 1))].is_ok());
        }
        // With nothing in flight, a lone message keeps the receiver's engine.
        w.send(0, ReqId(7), 1, 7, pattern(7, 20_000), Some(0));
        w.run();
        w.recv(1, ReqId(7), Some(0), Some(7), 20_000, Some(1));
        w.run();
        assert_eq!(w.chosen[&(1, ReqId(7))], Protocol::Get);
        assert!(w.user(1, ReqId(7))[..20_000] == pattern(7, 20_000)[..]);
    }
}

/// A rank-1 receive of `len` device bytes from rank 0 with tag 7, offered by RTR, and the
/// offer delivered to rank 0.
fn offered_world(seed: u64, len: usize) -> World {
    let mut w = World::new(2, Schedule::seeded(seed), ProtocolOverride::Auto, u64::MAX, 2, true);
    w.recv(1, ReqId(1), Some(0), Some(7), len, Some(1));
    assert!(matches!(w.wires[&(1, 0)].front(), Some(Packet::Rtr { expect: 0, tag: 7, .. })), "receive offered");
    w.deliver(1, 0);
    w
}

#[test]
fn an_offered_receive_is_pushed_into_at_once() {
    let mut w = offered_world(11, 1000);
    let data = pattern(4, 1000);
    w.send(0, ReqId(1), 1, 7, data.clone(), Some(0));
    // The sender's engine copies into the offered buffer before anything else is said.
    assert_eq!(w.copies[0].len(), 1);
    assert!(matches!(w.copies[0][0], CopyCmd { engine: CopyEngine::Device(0), dst: Loc::Peer { peer: 1, .. }, .. }));
    assert!(matches!(w.wires[&(0, 1)].front(), Some(Packet::RtrPut { recv: 1, len: 1000, .. })));
    w.run();
    w.assert_quiet();
    assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Put);
    assert_eq!(w.done[&(1, ReqId(1))], Ok(Status { source: 0, tag: 7, len: 1000 }));
    assert!(w.done[&(0, ReqId(1))].is_ok());
    assert!(w.user(1, ReqId(1))[..1000] == data[..]);
}

#[test]
fn offers_are_not_used_for_other_tags_sizes_or_messages() {
    // Another tag, or more than GPULMT_RTR_PUT_MAX: an RTS as usual.
    for (tag, len) in [(8, 1000usize), (7, 40_001)] {
        let mut w = offered_world(12, 50_000);
        if tag == 8 {
            w.recv(1, ReqId(2), Some(0), Some(8), len, Some(1));
        }
        w.send(0, ReqId(1), 1, tag, pattern(5, len), Some(0));
        assert!(w.copies[0].is_empty(), "tag {tag}, {len} bytes: no push");
        w.run();
        w.assert_quiet();
        let r = if tag == 8 { ReqId(2) } else { ReqId(1) };
        assert_eq!(w.chosen[&(1, r)], Protocol::Get);
        assert!(w.user(1, r)[..len] == pattern(5, len)[..]);
    }
    // The offer names the sender's first message; a host message goes first, so the
    // device message is the second and the offer is stale.
    let mut w = offered_world(13, 1000);
    w.recv(1, ReqId(2), Some(0), Some(5), 100, None);
    w.send(0, ReqId(1), 1, 5, pattern(6, 30), None);
    w.send(0, ReqId(2), 1, 7, pattern(7, 1000), Some(0));
    assert!(w.copies[0].is_empty(), "stale offer: no push");
    w.run();
    w.assert_quiet();
    assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Get);
    assert!(w.user(1, ReqId(1))[..1000] == pattern(7, 1000)[..]);
    assert!(w.user(1, ReqId(2))[..30] == pattern(6, 30)[..]);
}

#[test]
fn a_late_offer_makes_the_next_send_wait_for_one() {
    let mut w = World::new(2, Schedule::seeded(16), ProtocolOverride::Auto, u64::MAX, 2, true);
    let b = BufDesc { len: 1000, device: Some(0), region: None };
    // The receive is posted, but its offer reaches the sender only after the send went
    // out as an RTS: late.
    w.recv(1, ReqId(1), Some(0), Some(7), 1000, Some(1));
    assert!(!w.engines[0].rtr_wait_begin(1, 7, &b), "no offer was late yet");
    w.send(0, ReqId(1), 1, 7, pattern(12, 1000), Some(0));
    w.deliver(1, 0);
    assert!(w.engines[0].rtr_wait_begin(1, 7, &b), "the offer for the message just sent was late");
    assert!(!w.engines[0].rtr_wait_begin(1, 7, &BufDesc::host(1000)), "host buffers never use offers");
    assert!(!w.engines[0].rtr_wait_begin(1, 7, &BufDesc { len: 40_001, ..b }), "nor messages over the limit");
    w.run();
    // The next receive's offer arrives: nothing to wait for, it is used.
    w.recv(1, ReqId(2), Some(0), Some(7), 1000, Some(1));
    w.deliver(1, 0);
    assert!(w.engines[0].rtr_ready(1, 7, &b));
    assert!(!w.engines[0].rtr_wait_begin(1, 7, &b), "the offer is there");
    w.send(0, ReqId(2), 1, 7, pattern(13, 1000), Some(0));
    assert_eq!(w.copies[0].len(), 1, "pushed into the offer");
    w.run();
    assert!(w.user(1, ReqId(2))[..1000] == pattern(13, 1000)[..]);
    assert!(w.engines[0].rtr_wait_begin(1, 7, &b), "still expecting offers from this peer");
}

#[test]
fn offers_are_mapped_by_ranks_that_send_device_memory() {
    let mut w = World::new(2, Schedule::seeded(18), ProtocolOverride::Auto, u64::MAX, 2, true);
    // Rank 0 sends rank 1 host memory only: its offers are not worth a mapping.
    w.recv(1, ReqId(1), Some(0), Some(7), 1000, Some(1));
    w.send(0, ReqId(1), 1, 7, pattern(20, 1000), None);
    w.run();
    w.recv(1, ReqId(2), Some(0), Some(7), 1000, Some(1));
    w.run();
    assert_eq!(w.mapped[0], 0);
    // Once it sent device memory, the next offer is mapped, and only once per allocation.
    w.send(0, ReqId(2), 1, 7, pattern(21, 1000), Some(0));
    w.run();
    for k in 3..6 {
        w.recv(1, ReqId(k), Some(0), Some(7), 1000, Some(1));
        w.run();
        w.send(0, ReqId(k), 1, 7, pattern(k + 20, 1000), Some(0));
        w.run();
        assert!(w.user(1, ReqId(k))[..1000] == pattern(k + 20, 1000)[..]);
    }
    assert_eq!(w.mapped[0], 3, "three receive buffers, each its own allocation");
}

#[test]
fn waits_in_vain_use_up_the_credit_then_only_probe() {
    let mut w = World::new(2, Schedule::seeded(17), ProtocolOverride::Auto, u64::MAX, 2, true);
    let b = BufDesc { len: 1000, device: Some(0), region: None };
    // Every offer is late: each send waits in vain, until the credit (4) is gone.
    let mut waits = Vec::new();
    for k in 0..80u64 {
        w.recv(1, ReqId(k + 1), Some(0), Some(7), 1000, Some(1));
        waits.push(w.engines[0].rtr_wait_begin(1, 7, &b));
        if *waits.last().unwrap() {
            w.engines[0].rtr_wait_failed(1);
        }
        w.send(0, ReqId(k + 1), 1, 7, pattern(k, 1000), Some(0));
        w.run();
        assert!(w.user(1, ReqId(k + 1))[..1000] == pattern(k, 1000)[..]);
    }
    let waited: Vec<usize> = waits.iter().enumerate().filter(|(_, w)| **w).map(|(k, _)| k).collect();
    // The first send had no late offer before it; sends 1-4 wait; then one probe per 64.
    assert_eq!(waited, vec![1, 2, 3, 4, 68], "{waits:?}");
}

#[test]
fn cancelling_an_offered_receive_waits_for_the_sender() {
    // The sender had not used the offer: the receive is cancelled, and a later send
    // does not push into its buffer.
    let mut w = offered_world(14, 1000);
    assert!(w.engines[1].cancel_recv(ReqId(1)));
    w.drain(1);
    assert!(!w.done.contains_key(&(1, ReqId(1))), "cancelled only once the sender confirms");
    w.run();
    assert_eq!(w.done[&(1, ReqId(1))], Err(ProtoError::Cancelled));
    w.send(0, ReqId(1), 1, 7, pattern(8, 1000), Some(0));
    assert!(w.copies[0].is_empty(), "a revoked offer is not used");
    w.recv(1, ReqId(2), Some(0), Some(7), 1000, Some(1));
    w.run();
    w.assert_quiet();
    assert!(w.user(1, ReqId(2))[..1000] == pattern(8, 1000)[..]);
    // The sender had pushed already: the cancel loses, the receive completes with the data.
    let mut w = offered_world(15, 1000);
    w.send(0, ReqId(1), 1, 7, pattern(9, 1000), Some(0));
    assert!(w.engines[1].cancel_recv(ReqId(1)));
    w.drain(1);
    w.run();
    w.assert_quiet();
    assert_eq!(w.done[&(1, ReqId(1))], Ok(Status { source: 0, tag: 7, len: 1000 }));
    assert!(w.user(1, ReqId(1))[..1000] == pattern(9, 1000)[..]);
}

#[test]
fn truncation_is_reported_and_nothing_overflows() {
    for len in [100usize, 50_000] {
        for place in 0..4 {
            let mut w = World::new(2, Schedule::seeded(9), ProtocolOverride::Auto, u64::MAX, 2, true);
            let (s, d) = placement(place);
            w.send(0, ReqId(1), 1, 1, pattern(2, len), s);
            w.recv(1, ReqId(1), Some(0), Some(1), len / 2, d);
            w.run();
            w.assert_quiet();
            assert_eq!(
                w.done[&(1, ReqId(1))],
                Err(ProtoError::Truncated { msg_len: len as u64, buf_len: len as u64 / 2 })
            );
            assert!(w.done[&(0, ReqId(1))].is_ok(), "MPI: the sender of a truncated message succeeds");
            assert_eq!(&w.user(1, ReqId(1))[len / 2..], &[0xEE; 3]);
        }
    }
}

#[test]
fn self_messages() {
    for len in [10usize, 100_000] {
        for place in 0..4 {
            let (s, d) = placement(place);
            let mut w = World::new(1, Schedule::seeded(5), ProtocolOverride::Auto, u64::MAX, 2, true);
            let data = pattern(3, len);
            w.send(0, ReqId(1), 0, 3, data.clone(), s);
            w.recv(0, ReqId(2), Some(0), Some(3), len, d);
            w.run();
            w.assert_quiet();
            assert!(w.done[&(0, ReqId(1))].is_ok());
            assert_eq!(w.done[&(0, ReqId(2))].as_ref().unwrap().len, len as u64);
            assert_eq!(&w.user(0, ReqId(2))[..len], &data[..]);
        }
    }
}

#[test]
fn forged_rts_outside_allocation_is_rejected() {
    let mut w = World::new(2, Schedule::seeded(1), ProtocolOverride::Auto, u64::MAX, 2, true);
    w.recv(1, ReqId(1), Some(0), None, 1 << 20, Some(1));
    let mut r = region(0, ReqId(9), 1000, 0, 0);
    r.offset = 10;
    w.engines[1].on_packet(0, Packet::Rts { msg: 1, tag: 0, len: 995, src: gpulmt_protocols::MemDesc::Device(r) });
    let mut violations = 0;
    let mut aborts = 0;
    while let Some(a) = w.engines[1].poll_action() {
        match a {
            Action::Violation { .. } => violations += 1,
            Action::Send { packet: Packet::Abort { .. }, .. } => aborts += 1,
            Action::Copy(_) => panic!("a forged RTS must never start a copy"),
            _ => {}
        }
    }
    assert_eq!((violations, aborts), (1, 1));
}

#[test]
fn forged_offers_and_pushes_are_refused() {
    // A push into a receive that was never offered (posted with ANY_TAG: no RTR) is a
    // violation, answered by ABORT; the receive stays posted for a real message.
    let mut w = World::new(2, Schedule::seeded(2), ProtocolOverride::Auto, u64::MAX, 2, true);
    w.recv(1, ReqId(1), Some(0), None, 100, Some(1));
    assert!(w.wires.get(&(1, 0)).is_none_or(|q| q.is_empty()), "ANY_TAG receives are not offered");
    w.engines[1].on_packet(0, Packet::RtrPut { msg: 1, tag: 0, len: 10, recv: 1 });
    let mut seen = (0, 0);
    while let Some(a) = w.engines[1].poll_action() {
        match a {
            Action::Violation { .. } => seen.0 += 1,
            Action::Send { packet: Packet::Abort { .. }, .. } => seen.1 += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, (1, 1));
    w.send(0, ReqId(1), 1, 3, pattern(10, 100), Some(0));
    w.run();
    assert!(w.user(1, ReqId(1))[..100] == pattern(10, 100)[..]);
    // An offer whose region runs past its allocation is dropped as a violation.
    let mut w = World::new(2, Schedule::seeded(3), ProtocolOverride::Auto, u64::MAX, 2, true);
    let mut r = region(1, ReqId(9), 1000, 0, 1);
    r.offset = 990;
    w.engines[0].on_packet(1, Packet::Rtr { recv: 9, expect: 0, tag: 7, len: 100, dst: r });
    assert!(matches!(w.engines[0].poll_action(), Some(Action::Violation { .. })));
    w.drain(0);
    w.recv(1, ReqId(1), Some(0), Some(8), 100, Some(1));
    w.wires.clear();
    w.send(0, ReqId(1), 1, 7, pattern(11, 100), Some(0));
    assert!(w.copies[0].is_empty(), "the forged offer was not kept");
}

#[test]
fn peer_death_fails_requests_after_copies_stop() {
    for place in 0..4 {
        for mode in MODES {
            let mut w = World::new(2, Schedule::seeded(11), mode, u64::MAX, 2, true);
            let (s, d) = placement(place);
            w.send(0, ReqId(1), 1, 0, pattern(1, 100_000), s);
            w.recv(1, ReqId(1), Some(0), None, 100_000, d);
            w.recv(1, ReqId(2), Some(0), None, 10, d);
            // A few steps in, rank 0 dies.
            for _ in 0..3 {
                w.step();
            }
            w.dead[0] = true;
            w.wires.retain(|(f, _), _| *f != 0);
            w.copies[0].clear();
            w.engines[1].on_peer_failed(0);
            w.drain(1);
            w.run();
            w.assert_quiet();
            assert!(matches!(w.done[&(1, ReqId(2))], Err(ProtoError::PeerFailed { rank: 0 })));
            match &w.done.get(&(1, ReqId(1))) {
                Some(Ok(_)) | Some(Err(ProtoError::PeerFailed { .. })) => {}
                other => panic!("{mode:?} place {place}: {other:?}"),
            }
            // New work with the dead peer fails at once.
            w.send(1, ReqId(3), 0, 0, vec![1], None);
            assert!(matches!(w.done[&(1, ReqId(3))], Err(ProtoError::PeerFailed { rank: 0 })));
        }
    }
}

#[test]
fn copy_failure_aborts_both_sides() {
    let mut w = World::new(2, Schedule::seeded(2), ProtocolOverride::Get, u64::MAX, 2, true);
    w.send(0, ReqId(1), 1, 0, pattern(1, 10_000), Some(0));
    w.recv(1, ReqId(1), Some(0), None, 10_000, Some(1));
    // Deliver the RTS; the receiver starts GET copies.
    while w.copies[1].is_empty() {
        assert!(w.step());
    }
    let ids: Vec<CopyId> = w.copies[1].drain(..).map(|c| c.id).collect();
    w.engines[1].on_copy_done(ids[0], Err("mapping lost".into()));
    w.drain(1);
    for id in &ids[1..] {
        w.finish_copy(1, *id);
    }
    w.run();
    w.assert_quiet();
    assert!(matches!(w.done[&(1, ReqId(1))], Err(ProtoError::CopyFailed { .. })));
    assert!(matches!(w.done[&(0, ReqId(1))], Err(ProtoError::Aborted { rank: 1, .. })));
}
/// A failed PUT or COOPERATE ends on each side only once no copy writes into the
/// receiver's buffer any more (the model asserts that no copy writes into a completed
/// receive), whichever side's copies fail, in any order.
#[test]
fn a_failed_put_or_cooperate_ends_once_the_writing_stopped() {
    for seed in 0..32 {
        for mode in [ProtocolOverride::Put, ProtocolOverride::Coop] {
            for failing in [0, 1] {
                let mut w = World::new(2, Schedule::seeded(seed), mode, u64::MAX, 2, true);
                w.copy_faults.insert(failing);
                w.recv(1, ReqId(1), Some(0), Some(7), 200_000, Some(1));
                w.send(0, ReqId(1), 1, 7, pattern(seed, 200_000), Some(0));
                w.run();
                w.assert_quiet();
                let what = format!("seed {seed}, {mode:?}, rank {failing}'s copies fail");
                // A PUT's receiver copies nothing: its faults do not touch the message.
                let fails = !(mode == ProtocolOverride::Put && failing == 1);
                assert_eq!(w.done[&(0, ReqId(1))].is_err(), fails, "{what}");
                assert_eq!(w.done[&(1, ReqId(1))].is_err(), fails, "{what}");
            }
        }
    }
}

proptest! {
    #![proptest_config(config(64))]
    #[test]
    fn any_source_receives_get_each_message_once(schedule in schedule()) {
        let n = 4u32;
        let mut w = World::new(n, schedule, ProtocolOverride::Auto, u64::MAX, 2, true);
        let mut expected = Vec::new();
        for from in 1..n {
            for k in 0..2u64 {
                let len = if k == 0 { 40 } else { 20_000 };
                let data = pattern(from as u64 * 10 + k, len);
                w.send(from, ReqId(k + 1), 0, from as Tag, data.clone(), Some(from % 2));
                expected.push((from, data));
            }
        }
        for i in 0..expected.len() as u64 {
            w.recv(0, ReqId(100 + i), None, None, 20_000, Some(0));
        }
        w.run();
        w.assert_quiet();
        let mut got: Vec<(Rank, Vec<u8>)> = (0..expected.len() as u64)
            .map(|i| {
                let st = w.done[&(0, ReqId(100 + i))].clone().unwrap();
                (st.source, w.user(0, ReqId(100 + i))[..st.len as usize].to_vec())
            })
            .collect();
        // Per sender, messages arrive in the order sent (non-overtaking).
        for from in 1..n {
            let mine: Vec<&Vec<u8>> = got.iter().filter(|(s, _)| *s == from).map(|(_, d)| d).collect();
            let want: Vec<&Vec<u8>> = expected.iter().filter(|(s, _)| *s == from).map(|(_, d)| d).collect();
            prop_assert_eq!(mine, want);
        }
        got.sort();
        prop_assert_eq!(got.len(), expected.len());
    }
}

#[test]
fn cts_for_an_unknown_message_aborts_the_receiver() {
    let mut w = World::new(2, Schedule::seeded(5), ProtocolOverride::Put, u64::MAX, 2, true);
    w.engines[1].on_packet(0, Packet::Cts { msg: 77, mode: gpulmt_protocols::wire::CtsMode::Shm, dst: None, split: 0 });
    let mut aborted = false;
    while let Some(a) = w.engines[1].poll_action() {
        if let Action::Send {
            to: 0,
            packet: Packet::Abort { msg: 77, dir: gpulmt_protocols::wire::Dir::ToReceiver, .. },
        } = a
        {
            aborted = true;
        }
    }
    assert!(aborted, "the receiver of a stray CTS must be told to give up");
}

/// Two SHM messages to one peer: the second starts filling the ring as soon as the
/// first frees a slot, before the first one's receive has drained the rest.
#[test]
fn shm_sends_to_one_peer_stream_through_the_ring() {
    let mut w = World::new(2, Schedule::seeded(5), ProtocolOverride::Shm, u64::MAX, 2, true);
    let (a, b) = (pattern(1, 3 * 4096), pattern(2, 3 * 4096 - 7));
    w.recv(1, ReqId(1), Some(0), Some(0), a.len(), None);
    w.recv(1, ReqId(2), Some(0), Some(0), b.len(), None);
    w.send(0, ReqId(1), 1, 0, a.clone(), None);
    w.send(0, ReqId(2), 1, 0, b.clone(), None);
    w.deliver(0, 1); // both RTS
    w.deliver(1, 0); // both CTS: A fills the three slots, B waits
    let fills: Vec<CopyCmd> = std::mem::take(&mut w.copies[0]);
    assert_eq!(fills.len(), 3);
    assert!(fills.iter().all(|c| matches!(c.src, Loc::User { req: ReqId(1), .. })));
    for c in fills {
        w.execute(0, c);
    }
    w.deliver(0, 1); // three CHUNKs
    assert_eq!(w.copies[1].len(), 3);
    let first = w.copies[1].remove(0);
    w.execute(1, first);
    w.deliver(1, 0); // one CHUNK_ACK
    assert_eq!(w.copies[0].len(), 1, "the freed slot is refilled at once");
    let c = w.copies[0][0];
    assert!(matches!(c.src, Loc::User { req: ReqId(2), offset: 0 }), "{c:?}");
    assert!(matches!(c.dst, Loc::Staging { from: 0, to: 1, .. }));
    assert!(!w.done.contains_key(&(1, ReqId(1))), "A is still draining");
    w.run();
    w.assert_quiet();
    assert_eq!(&w.user(1, ReqId(1))[..a.len()], &a[..]);
    assert_eq!(&w.user(1, ReqId(2))[..b.len()], &b[..]);
    assert!(w.done[&(0, ReqId(2))].is_ok() && w.done[&(1, ReqId(2))].is_ok());
}

proptest! {
    #![proptest_config(config(32))]

    /// A receiver's staging copy fails halfway through an SHM message: both sides fail
    /// that message, every slot it held comes back (late CHUNKs are acknowledged), and
    /// the next message to the same peer goes through the ring intact, whatever the
    /// order of the rest.
    #[test]
    fn shm_copy_failure_leaves_the_ring_usable(schedule in schedule()) {
        let mut w = World::new(2, schedule, ProtocolOverride::Shm, u64::MAX, 2, true);
        let (a, b) = (pattern(3, 7 * 4096 + 11), pattern(4, 5 * 4096));
        w.recv(1, ReqId(1), Some(0), Some(0), a.len(), Some(1));
        w.recv(1, ReqId(2), Some(0), Some(0), b.len(), None);
        w.send(0, ReqId(1), 1, 0, a.clone(), Some(0));
        w.send(0, ReqId(2), 1, 0, b.clone(), None);
        while w.copies[1].is_empty() {
            prop_assert!(w.step());
        }
        let failed = w.copies[1].remove(0);
        w.engines[1].on_copy_done(failed.id, Err("staging unreadable".into()));
        w.drain(1);
        w.run();
        w.assert_quiet();
        let (recv, send) = (&w.done[&(1, ReqId(1))], &w.done[&(0, ReqId(1))]);
        prop_assert!(matches!(recv, Err(ProtoError::CopyFailed { .. })), "receive: {:?}", recv);
        prop_assert!(matches!(send, Err(ProtoError::Aborted { rank: 1, .. })), "send: {:?}", send);
        prop_assert!(w.done[&(0, ReqId(2))].is_ok() && w.done[&(1, ReqId(2))].is_ok());
        prop_assert_eq!(&w.user(1, ReqId(2))[..b.len()], &b[..]);
    }
}
