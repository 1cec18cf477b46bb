//! A GET whose sender buffer the receiver cannot map falls back to SHM: every byte
//! arrives, in any order of packets and copies, whether none or some of the GET's copies
//! mapped it first; the buffer's later messages take SHM without trying again; a PUT whose
//! sender cannot map the receiver's buffer is staged by the sender; a COOPERATE either of
//! whose buffers cannot be mapped is staged whole, with no two copies writing at once.

use gpulmt_protocols::policy::{Protocol, ProtocolOverride};
use gpulmt_protocols::ReqId;

use super::transfer_and_check;
use super::world::{pattern, Schedule, World};

/// A world of two ranks on two devices with peer access, whose rank 1 cannot map rank
/// 0's buffer of request 1.
fn refusing_world(seed: u64, mode: ProtocolOverride) -> World {
    let mut w = World::new(2, Schedule::seeded(seed), mode, u64::MAX, 2, true);
    w.unmappable.insert((1, 0, ReqId(1)));
    w
}

#[test]
fn an_unmappable_sender_buffer_moves_by_shm() {
    for seed in 0..24 {
        for len in [4097usize, 65537, 200_000] {
            for mode in [ProtocolOverride::Auto, ProtocolOverride::Get] {
                for recv_first in [true, false] {
                    let w = transfer_and_check(refusing_world(seed, mode), seed, len, 0, recv_first);
                    assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Shm, "seed {seed}, {len} bytes");
                    assert_eq!(w.fell_back, vec![(1, 0, 1)], "reported once");
                }
            }
        }
    }
}

#[test]
fn a_get_some_of_whose_copies_mapped_the_buffer_still_falls_back_whole() {
    for seed in 0..24 {
        let len = 200_000;
        let mut w = World::new(2, Schedule::seeded(seed), ProtocolOverride::Get, u64::MAX, 2, true);
        let data = pattern(seed, len);
        w.recv(1, ReqId(1), Some(0), Some(7), len, Some(1));
        w.send(0, ReqId(1), 1, 7, data.clone(), Some(0));
        while w.copies[1].is_empty() {
            assert!(w.step());
        }
        assert!(w.copies[1].len() > 1, "the GET is split");
        // The first copy maps the buffer and moves its bytes; then the mapping is lost.
        let first = w.copies[1].remove(0);
        w.execute(1, first);
        w.unmappable.insert((1, 0, ReqId(1)));
        w.run();
        w.assert_quiet();
        assert!(w.done[&(1, ReqId(1))].is_ok() && w.done[&(0, ReqId(1))].is_ok(), "seed {seed}");
        assert!(w.user(1, ReqId(1))[..len] == data[..], "seed {seed}: data mismatch");
        assert_eq!(w.fell_back, vec![(1, 0, 1)]);
    }
}

#[test]
fn a_buffer_that_failed_to_map_is_not_mapped_again() {
    for seed in 0..8 {
        let w = transfer_and_check(refusing_world(seed, ProtocolOverride::Auto), seed, 65537, 0, true);
        let mut w = w;
        // The same send buffer (buffer id 1) again: chosen for as staged memory at once.
        w.done.clear();
        w.chosen.clear();
        let w = transfer_and_check(w, seed + 100, 65537, 0, true);
        assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Shm);
        assert_eq!(w.fell_back.len(), 1, "not tried, so not reported, again");
    }
}

#[test]
fn a_cooperate_that_cannot_map_either_buffer_is_staged() {
    // (mapper, owner): the receiver cannot map the sender's buffer, the sender the
    // receiver's, or neither the other's.
    let cases: [&[(u32, u32)]; 3] = [&[(1, 0)], &[(0, 1)], &[(1, 0), (0, 1)]];
    for seed in 0..24 {
        for refused in cases {
            for recv_first in [true, false] {
                let mut w = World::new(2, Schedule::seeded(seed), ProtocolOverride::Coop, u64::MAX, 2, true);
                for &(mapper, owner) in refused {
                    w.unmappable.insert((mapper, owner, ReqId(1)));
                }
                let w = transfer_and_check(w, seed, 200_000, 0, recv_first);
                assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Shm, "seed {seed}, {refused:?}");
                assert_eq!(w.fell_back.len(), refused.len(), "seed {seed}, {refused:?}: reported once each");
            }
        }
    }
}

#[test]
fn a_put_whose_sender_cannot_map_the_receive_buffer_is_staged() {
    for seed in 0..24 {
        for len in [4097usize, 65537, 200_000] {
            for recv_first in [true, false] {
                let mut w = World::new(2, Schedule::seeded(seed), ProtocolOverride::Put, u64::MAX, 2, true);
                w.unmappable.insert((0, 1, ReqId(1)));
                let w = transfer_and_check(w, seed, len, 0, recv_first);
                assert_eq!(w.chosen[&(1, ReqId(1))], Protocol::Shm, "seed {seed}, {len} bytes");
                assert_eq!(w.fell_back, vec![(0, 1, 1)], "reported once");
            }
        }
    }
}
