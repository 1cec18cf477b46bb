//! GIO send queues: lap parity at lap boundaries, a zeroed ring, all-zero packets, a
//! full ring and credits, a producer and a consumer over a simulated shared ring with
//! random interleavings (more packets than slots, reads between field writes and the
//! commit), stall detection, and bad packets rejected.
// The machines take time as input; a test needs one real Instant as the origin of its
// virtual clock, and only offsets from it matter.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{
    commit_bit, commit_word, is_committed, lap_parity, slot_index, word, AmoOp, BadPacket, Consumer, Flags, Limits, Op,
    OpCode, Packet, Poll, Producer, QueueError, RawPacket, SignalOp, Stop, Take, Template, TemplateError,
    TemplateTable, Window, MAX_TARGET, PACKET_WORDS,
};
use proptest::prelude::*;

/// Ring sizes: powers of two from 1 to 2^12.
fn slots() -> impl Strategy<Value = u64> {
    (0u32..=12).prop_map(|e| 1u64 << e)
}

/// Any packet the format can carry, with only the flags its op takes.
fn packet() -> impl Strategy<Value = Packet> {
    let a = any::<u64>;
    let op = prop_oneof![
        Just(Op::Nop),
        (a(), a()).prop_map(|(src, size)| Op::Ctrl { src, size }),
        (a(), a(), a()).prop_map(|(src, size, tag)| Op::Send { src, size, tag }),
        (a(), a(), a()).prop_map(|(dst, size, tag)| Op::Recv { dst, size, tag }),
        (a(), a(), a()).prop_map(|(src, dst_offset, size)| Op::Put { src, dst_offset, size }),
        (a(), a(), a(), a(), a(), any::<bool>()).prop_map(|(src, dst_offset, size, so, sv, add)| Op::PutSignal {
            src,
            dst_offset,
            size,
            signal_offset: so,
            signal_value: sv,
            signal_op: if add { SignalOp::Add } else { SignalOp::Set },
        }),
        (a(), a(), a()).prop_map(|(dst, src_offset, size)| Op::Get { dst, src_offset, size }),
        (0..4usize, a(), a(), a(), a()).prop_map(|(k, offset, operand, compare, result)| Op::Amo {
            amo: [AmoOp::FetchAdd, AmoOp::CompareSwap, AmoOp::Set, AmoOp::Fetch][k],
            offset,
            operand,
            compare,
            result,
        }),
    ];
    (op, any::<u8>(), 0..=MAX_TARGET, a()).prop_map(|(op, flags, target, cookie)| Packet {
        flags: Flags(flags & op.code().allowed_flags().0),
        op,
        target,
        cookie,
    })
}

proptest! {
    /// Around every lap boundary k * slots (for small and huge k): a packet's commit word
    /// is committed at its own position, reads as not committed one lap earlier or
    /// later (a stale slot, or the next lap's wait), and a zero word is committed only
    /// on odd laps. Decoding ignores the commit bit.
    #[test]
    fn parity_at_lap_boundaries(slots in slots(), k in prop_oneof![0u64..6, (1u64 << 40)..(1u64 << 40) + 4], p in packet()) {
        let boundary = k * slots;
        for pos in boundary.saturating_sub(2)..boundary + 2 {
            let w = p.commit_word(pos, slots);
            prop_assert!(is_committed(pos, slots, w));
            prop_assert!(!is_committed(pos + slots, slots, w), "stale at next lap, pos {}", pos);
            if pos >= slots {
                prop_assert!(!is_committed(pos - slots, slots, w));
            }
            prop_assert_eq!(lap_parity(pos, slots), (pos / slots) % 2);
            prop_assert_eq!(is_committed(pos, slots, 0), lap_parity(pos, slots) == 1);
            prop_assert_eq!(w >> 63, commit_bit(pos, slots));
            prop_assert_eq!(slot_index(pos, slots) as u64, pos % slots);
            prop_assert_eq!(Packet::decode(&p.encode(pos, slots)), Ok(p));
        }
    }

    /// A full ring: the producer stops at exactly `slots` outstanding, stays stopped
    /// after the consumer takes some until it re-reads the head (credit rule), then
    /// resumes for exactly the credits returned; a batch is all or nothing.
    #[test]
    fn full_ring_and_credits(slots in slots(), takes in prop::collection::vec(0u64..=4096, 1..6)) {
        let mut p = Producer::new(slots).unwrap();
        let mut head = 0;
        for take in takes {
            // Fill: positions in order until the ring is full.
            let mut next = p.tail();
            while let Ok(pos) = p.try_reserve() {
                prop_assert_eq!(pos, next);
                next += 1;
            }
            prop_assert_eq!(p.tail() - head, slots);
            // The consumer takes some; the producer does not know until it re-reads.
            let take = take % (slots + 1);
            head += take;
            prop_assert!(p.try_reserve().is_err());
            p.observe_head(head).unwrap();
            if take < slots {
                prop_assert!(p.try_reserve_n(take + 1).is_err());
            }
            let r = p.try_reserve_n(take).unwrap();
            prop_assert_eq!((r.start, r.end), (next, next + take));
            prop_assert!(p.try_reserve().is_err());
        }
    }
}

#[test]
fn head_and_tail_errors() {
    assert_eq!(Producer::new(6).unwrap_err(), QueueError::BadSlots { slots: 6 });
    assert_eq!(Producer::new(0).unwrap_err(), QueueError::BadSlots { slots: 0 });
    assert!(Consumer::new(1 << 32, Duration::from_secs(1)).is_err());
    let mut p = Producer::new(4).unwrap();
    let _ = p.try_reserve_n(3).unwrap();
    assert_eq!(p.observe_head(4), Err(QueueError::HeadAheadOfTail { head: 4, tail: 3 }));
    p.observe_head(2).unwrap();
    assert_eq!(p.observe_head(1), Err(QueueError::HeadWentBack { head: 1, cached: 2 }));
    let mut c = Consumer::new(4, Duration::from_secs(1)).unwrap();
    let now = Instant::now();
    assert_eq!(c.poll(5, 0, now), Err(QueueError::TailTooFar { tail: 5, head: 0, slots: 4 }));
    assert_eq!(c.poll(4, 0, now).unwrap(), Poll::Pending { pos: 0, deadline: now + Duration::from_secs(1) });
}

/// A zeroed ring is empty at every lap-0 position; an all-zero packet (a NOP to target
/// 0 with cookie 0) committed on lap 1 is all zero in memory, and is delivered as such.
#[test]
fn zeroed_ring_and_all_zero_packets() {
    let slots = 4;
    let now = Instant::now();
    let zero = Packet { op: Op::Nop, flags: Flags::NONE, target: 0, cookie: 0 };
    let mut ring = [RawPacket::default(); 4];
    let mut c = Consumer::new(slots, Duration::from_secs(1)).unwrap();
    for pos in 0..slots {
        assert!(!is_committed(pos, slots, 0));
    }
    assert_eq!(c.poll(0, ring[0].words[0], now).unwrap(), Poll::Empty);
    let mut p = Producer::new(slots).unwrap();
    for lap in 0..3 {
        for _ in 0..slots {
            let pos = p.try_reserve().unwrap();
            let i = slot_index(pos, slots);
            // Before the commit: the slot holds the previous lap (or zeros) and reads empty.
            assert_eq!(c.poll(pos, ring[i].words[0], now).unwrap(), Poll::Empty);
            ring[i] = zero.encode(pos, slots);
            if lap % 2 == 1 {
                assert_eq!(ring[i], RawPacket::default(), "lap 1 commits all-zero packets as zeros");
            }
            let Poll::Ready(ready) = c.poll(p.tail(), ring[i].words[0], now).unwrap() else {
                panic!("committed packet not ready at {pos}")
            };
            assert_eq!(ready.pos(), pos);
            let got = Packet::decode(&ring[ready.index()]).unwrap();
            assert_eq!(got, zero);
            p.observe_head(c.accept(ready)).unwrap();
        }
    }
    // The table accepts a NOP whatever it names: it touches nothing.
    let empty = TemplateTable::new(vec![], Limits::default()).unwrap();
    assert_eq!(empty.check(&RawPacket::default()).unwrap().packet, zero);
}

/// The shared memory of one queue, as the simulation sees it.
struct Shared {
    ring: Vec<RawPacket>,
    tail: u64,
    head: u64,
}

enum ProducerStep {
    Idle,
    NeedHead,
    /// Writing the words of `image` at `pos`; `next` is the next word (1..=7, then 0).
    Writing {
        pos: u64,
        image: RawPacket,
        next: usize,
    },
    Publish,
}

enum ConsumerStep {
    Idle,
    /// Reading the words of a ready slot one by one.
    Reading {
        ready: gpulmt_protocols::gio::ReadySlot,
        words: [u64; PACKET_WORDS],
        next: usize,
    },
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// A producer and a consumer over a simulated ring, in a random interleaving of
    /// single-word memory steps: the producer writes words 1-7, then the commit word,
    /// then the doorbell; the consumer loads the doorbell and commit word, then the other
    /// words one by one (so it may read between the producer's field writes and its
    /// commit; an early doorbell shows it reserved slots not yet committed), and sometimes refuses a packet (backpressure) and retries it. More
    /// packets than slots: every packet arrives exactly once, in order, with its fields.
    #[test]
    fn producer_and_consumer_over_shared_ring(
        slots in (0u32..=3).prop_map(|e| 1u64 << e),
        packets in prop::collection::vec(packet(), 1..40),
        schedule in prop::collection::vec(0u8..8, 0..600),
    ) {
        let now = Instant::now();
        let mut mem = Shared { ring: vec![RawPacket::default(); slots as usize], tail: 0, head: 0 };
        let mut prod = Producer::new(slots).unwrap();
        let mut cons = Consumer::new(slots, Duration::from_secs(3600)).unwrap();
        let (mut ps, mut cs) = (ProducerStep::Idle, ConsumerStep::Idle);
        let mut sent = 0;
        let mut got = Vec::new();
        // The schedule first, then a fair alternation until done (bounded).
        let choices = schedule.into_iter().chain((0..20_000).map(|i| (i % 8) as u8));
        for c in choices {
            if got.len() == packets.len() {
                break;
            }
            if c < 4 {
                ps = match ps {
                    ProducerStep::Idle if sent < packets.len() => match prod.try_reserve() {
                        Ok(pos) => {
                            if c == 3 {
                                // An early doorbell (a block leader publishing a batch
                                // its threads still write): the consumer sees Pending.
                                mem.tail = prod.tail();
                            }
                            let image = packets[sent].encode(pos, slots);
                            sent += 1;
                            ProducerStep::Writing { pos, image, next: 1 }
                        }
                        Err(_) => ProducerStep::NeedHead,
                    },
                    ProducerStep::Idle => ProducerStep::Idle,
                    ProducerStep::NeedHead => {
                        prod.observe_head(mem.head).unwrap();
                        ProducerStep::Idle
                    }
                    ProducerStep::Writing { pos, image, next } => {
                        let slot = &mut mem.ring[slot_index(pos, slots)];
                        slot.words[next] = image.words[next];
                        match next {
                            0 => ProducerStep::Publish,
                            7 => ProducerStep::Writing { pos, image, next: 0 },
                            n => ProducerStep::Writing { pos, image, next: n + 1 },
                        }
                    }
                    ProducerStep::Publish => {
                        mem.tail = prod.tail();
                        ProducerStep::Idle
                    }
                };
            } else {
                cs = match cs {
                    ConsumerStep::Idle => {
                        let commit = mem.ring[cons.head_index()].words[word::COMMIT];
                        match cons.poll(mem.tail, commit, now).unwrap() {
                            Poll::Ready(ready) => {
                                ConsumerStep::Reading { ready, words: [commit, 0, 0, 0, 0, 0, 0, 0], next: 1 }
                            }
                            Poll::Empty | Poll::Pending { .. } => ConsumerStep::Idle,
                            Poll::Stalled { pos, .. } => panic!("stall at {pos} with a one-hour timeout"),
                        }
                    }
                    ConsumerStep::Reading { ready, mut words, next } if next < PACKET_WORDS => {
                        words[next] = mem.ring[ready.index()].words[next];
                        ConsumerStep::Reading { ready, words, next: next + 1 }
                    }
                    ConsumerStep::Reading { ready, words, .. } => {
                        // c == 7: MPI refused; the packet stays and is read again.
                        if c != 7 {
                            got.push(Packet::decode(&RawPacket { words }).unwrap());
                            mem.head = cons.accept(ready);
                        }
                        ConsumerStep::Idle
                    }
                };
            }
        }
        prop_assert_eq!(&got, &packets);
        prop_assert_eq!(cons.head(), packets.len() as u64);
    }

    /// A producer reserved a slot and never committed it: pending before the timeout,
    /// stalled at and after it, with the deadline poll_timeout announced; a commit at
    /// any point makes it ready instead.
    #[test]
    fn stall_detected_after_timeout_not_before(
        timeout_ms in 1u64..10_000,
        probes in prop::collection::vec(0u64..20_000_000, 1..20),
        committed_at in prop::option::of(0usize..20),
    ) {
        let t0 = Instant::now();
        let timeout = Duration::from_millis(timeout_ms);
        let mut c = Consumer::new(8, timeout).unwrap();
        prop_assert_eq!(c.poll_timeout(), None);
        prop_assert_eq!(c.poll(1, 0, t0).unwrap(), Poll::Pending { pos: 0, deadline: t0 + timeout });
        prop_assert_eq!(c.poll_timeout(), Some(t0 + timeout));
        let mut probes = probes;
        probes.sort_unstable();
        for (i, us) in probes.into_iter().enumerate() {
            let now = t0 + Duration::from_micros(us);
            let commit = if committed_at.is_some_and(|k| i >= k) { commit_word(0, 8, OpCode::Nop, Flags::NONE, 0, 0) } else { 0 };
            let poll = c.poll(1, commit, now).unwrap();
            if commit != 0 {
                prop_assert!(matches!(poll, Poll::Ready(_)));
                prop_assert_eq!(c.poll_timeout(), None);
            } else if now >= t0 + timeout {
                prop_assert_eq!(poll, Poll::Stalled { pos: 0, since: t0 });
            } else {
                prop_assert_eq!(poll, Poll::Pending { pos: 0, deadline: t0 + timeout });
            }
        }
    }
}

/// The exact boundary of a stall, and its clock restarting for the next slot.
#[test]
fn stall_boundary_and_restart() {
    let t0 = Instant::now();
    let timeout = Duration::from_millis(50);
    let mut c = Consumer::new(2, timeout).unwrap();
    let ns = Duration::from_nanos(1);
    assert!(matches!(c.poll(1, 0, t0).unwrap(), Poll::Pending { .. }));
    assert!(matches!(c.poll(1, 0, t0 + timeout - ns).unwrap(), Poll::Pending { .. }));
    assert_eq!(c.poll(1, 0, t0 + timeout).unwrap(), Poll::Stalled { pos: 0, since: t0 });
    // The packet arrives late after all: taken, and the next slot's clock starts anew.
    let w = commit_word(0, 2, OpCode::Nop, Flags::NONE, 0, 0);
    let Poll::Ready(r) = c.poll(2, w, t0 + timeout * 2).unwrap() else { panic!("not ready") };
    assert_eq!(c.accept(r), 1);
    let t1 = t0 + timeout * 3;
    assert_eq!(c.poll(2, 0, t1).unwrap(), Poll::Pending { pos: 1, deadline: t1 + timeout });
    // The doorbell not past the head: empty, no stall clock.
    let mut c = Consumer::new(2, timeout).unwrap();
    assert_eq!(c.poll(0, 0, t0).unwrap(), Poll::Empty);
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(c.poll(0, 0, t0 + timeout * 10).unwrap(), Poll::Empty);
}

/// drain: bounded by its budget, stops at a refused packet (leaving it), and at an
/// uncommitted slot, returning the credit only when something was taken.
#[test]
fn drain_is_bounded_and_keeps_refused_packets() {
    let slots = 8;
    let now = Instant::now();
    let mut ring = [RawPacket::default(); 8];
    let nop = |cookie| Packet { op: Op::Nop, flags: Flags::NONE, target: 0, cookie };
    for pos in 0..5 {
        ring[pos as usize] = nop(pos).encode(pos, slots);
    }
    let mut c = Consumer::new(slots, Duration::from_secs(1)).unwrap();
    let mut seen = Vec::new();
    let load = |i: usize| ring[i].words[0];
    let d = c.drain(5, now, 2, load, |pos, i| {
        seen.push((pos, Packet::decode(&ring[i]).unwrap().cookie));
        Take::Taken
    });
    assert_eq!((d.unwrap().taken, d.unwrap().stop, d.unwrap().credit), (2, Stop::Budget, Some(2)));
    let d = c.drain(5, now, 10, load, |pos, _| if pos == 3 { Take::Refused } else { Take::Taken }).unwrap();
    assert_eq!((d.taken, d.stop, d.credit), (1, Stop::Refused, Some(3)));
    let d = c.drain(5, now, 10, load, |_, _| Take::Refused).unwrap();
    assert_eq!((d.taken, d.stop, d.credit), (0, Stop::Refused, None));
    let d = c.drain(6, now, 10, load, |_, _| Take::Taken).unwrap();
    assert_eq!((d.taken, d.stop, d.credit), (2, Stop::Pending, Some(5)));
    let d = c.drain(5, now, 10, load, |_, _| Take::Taken).unwrap();
    assert_eq!((d.taken, d.stop), (0, Stop::Empty));
    assert_eq!(seen, vec![(0, 0), (1, 1)]);
}

fn table() -> TemplateTable {
    let two_sided = Template { rank: 1, comm: 0, window: None };
    let windowed = Template { rank: 2, comm: 0, window: Some(Window { id: 3, base: 0x10_0000, size: 4096 }) };
    let limits = Limits { max_ctrl: 256, max_size: 1 << 20, max_tag: 1000 };
    TemplateTable::new(vec![two_sided, windowed], limits).unwrap()
}

fn raw(op: Op, flags: Flags, target: u32) -> RawPacket {
    Packet { op, flags, target, cookie: 9 }.encode(0, 4)
}

/// Bad packets are rejected with what is wrong: unknown op, reserved bits, flags or
/// variants an op does not take, target out of range, no window, offset or size outside
/// the window (overflowing arithmetic included), limits, null or overflowing local
/// ranges, misaligned words, a fetch without a result.
#[test]
fn bad_packets_rejected() {
    let t = table();
    let put = |dst_offset, size| Op::Put { src: 0x1000, dst_offset, size };
    let check = |r: RawPacket| t.check(&r).map(|c| c.packet);
    let mut unknown = raw(Op::Nop, Flags::NONE, 0);
    for code in 8..=255u8 {
        unknown.words[0] = commit_word(0, 4, OpCode::Nop, Flags::NONE, 0, 0) | code as u64;
        assert_eq!(check(unknown), Err(BadPacket::UnknownOp { code }));
    }
    let mut reserved = raw(put(0, 8), Flags::NONE, 1);
    reserved.words[0] |= 1 << 24;
    assert!(matches!(check(reserved), Err(BadPacket::ReservedBits { .. })));
    let flags = raw(Op::Ctrl { src: 1, size: 1 }, Flags::SRC_DEVICE, 0);
    assert_eq!(check(flags), Err(BadPacket::FlagsNotAllowed { op: OpCode::Ctrl, flags: 1 }));
    let mut variant = raw(put(0, 8), Flags::NONE, 1);
    variant.words[0] |= 1 << 16;
    assert_eq!(check(variant), Err(BadPacket::UnknownVariant { op: OpCode::Put, variant: 1 }));
    let mut amo = raw(Op::Amo { amo: AmoOp::Set, offset: 0, operand: 1, compare: 0, result: 0 }, Flags::NONE, 1);
    amo.words[0] |= 7 << 16;
    assert!(matches!(check(amo), Err(BadPacket::UnknownVariant { op: OpCode::Amo, .. })));
    assert_eq!(check(raw(put(0, 8), Flags::NONE, 2)), Err(BadPacket::TargetOutOfRange { target: 2, templates: 2 }));
    assert_eq!(
        check(raw(put(0, 8), Flags::NONE, MAX_TARGET)),
        Err(BadPacket::TargetOutOfRange { target: MAX_TARGET, templates: 2 })
    );
    assert_eq!(check(raw(put(0, 8), Flags::NONE, 0)), Err(BadPacket::NoWindow { op: OpCode::Put, target: 0 }));
    let out = |offset, size| BadPacket::OutOfWindow { op: OpCode::Put, target: 1, offset, size, window: 4096 };
    assert_eq!(check(raw(put(4090, 7), Flags::NONE, 1)), Err(out(4090, 7)));
    assert_eq!(check(raw(put(4097, 0), Flags::NONE, 1)), Err(out(4097, 0)));
    assert_eq!(check(raw(put(u64::MAX - 3, 8), Flags::NONE, 1)), Err(out(u64::MAX - 3, 8)));
    assert_eq!(
        check(raw(put(8, u64::MAX), Flags::NONE, 1)),
        Err(BadPacket::TooLarge { op: OpCode::Put, size: u64::MAX, limit: 1 << 20 })
    );
    assert!(check(raw(put(4088, 8), Flags::NONE, 1)).is_ok());
    assert!(check(raw(put(4096, 0), Flags::NONE, 1)).is_ok());
    let get = Op::Get { dst: u64::MAX - 1, src_offset: 0, size: 4 };
    assert_eq!(
        check(raw(get, Flags::DST_DEVICE, 1)),
        Err(BadPacket::BadAddress { op: OpCode::Get, addr: u64::MAX - 1, size: 4 })
    );
    let null = Op::Send { src: 0, size: 1, tag: 1 };
    assert_eq!(check(raw(null, Flags::NONE, 0)), Err(BadPacket::BadAddress { op: OpCode::Send, addr: 0, size: 1 }));
    assert!(check(raw(Op::Send { src: 0, size: 0, tag: 1 }, Flags::NONE, 0)).is_ok());
    // A drain (RECV with DISCARD) names no local range, and only a RECV may drain.
    let drain = Op::Recv { dst: 0, size: 1 << 20, tag: 1 };
    assert_eq!(
        check(raw(drain, Flags::NONE, 0)),
        Err(BadPacket::BadAddress { op: OpCode::Recv, addr: 0, size: 1 << 20 })
    );
    assert!(check(raw(drain, Flags::DISCARD, 0)).is_ok());
    assert_eq!(
        check(raw(Op::Recv { dst: 0, size: (1 << 20) + 1, tag: 1 }, Flags::DISCARD, 0)),
        Err(BadPacket::TooLarge { op: OpCode::Recv, size: (1 << 20) + 1, limit: 1 << 20 })
    );
    let send = Op::Send { src: 64, size: 1, tag: 1 };
    assert_eq!(check(raw(send, Flags::DISCARD, 0)), Err(BadPacket::FlagsNotAllowed { op: OpCode::Send, flags: 8 }));
    let tag = Op::Recv { dst: 64, size: 1, tag: 1001 };
    assert_eq!(check(raw(tag, Flags::NONE, 0)), Err(BadPacket::TagTooLarge { tag: 1001, limit: 1000 }));
    assert_eq!(check(raw(Op::Ctrl { src: 64, size: 0 }, Flags::NONE, 0)), Err(BadPacket::EmptyControl));
    let ctrl = Op::Ctrl { src: 64, size: 257 };
    assert_eq!(check(raw(ctrl, Flags::NONE, 0)), Err(BadPacket::TooLarge { op: OpCode::Ctrl, size: 257, limit: 256 }));
    let signal = |signal_offset| Op::PutSignal {
        src: 64,
        dst_offset: 0,
        size: 8,
        signal_offset,
        signal_value: 1,
        signal_op: SignalOp::Add,
    };
    assert_eq!(
        check(raw(signal(12), Flags::NONE, 1)),
        Err(BadPacket::Misaligned { op: OpCode::PutSignal, offset: 12 })
    );
    assert!(matches!(check(raw(signal(4096), Flags::NONE, 1)), Err(BadPacket::OutOfWindow { .. })));
    assert!(check(raw(signal(4088), Flags::FENCE, 1)).is_ok());
    let fetch = Op::Amo { amo: AmoOp::Fetch, offset: 8, operand: 0, compare: 0, result: 0 };
    assert_eq!(check(raw(fetch, Flags::NONE, 1)), Err(BadPacket::NoResultAddress));
    let add = Op::Amo { amo: AmoOp::FetchAdd, offset: u64::MAX - 7, operand: 1, compare: 0, result: 0 };
    assert!(matches!(check(raw(add, Flags::NONE, 1)), Err(BadPacket::OutOfWindow { .. })));
    // Distinct codes for the CQ record, and a message that says what to do.
    assert_ne!(BadPacket::EmptyControl.code(), BadPacket::NoResultAddress.code());
    assert!(BadPacket::TargetOutOfRange { target: 5, templates: 2 }.to_string().contains("5"));
}

#[test]
fn template_table_errors() {
    let t = Template { rank: 0, comm: 0, window: Some(Window { id: 0, base: u64::MAX - 10, size: 11 }) };
    assert_eq!(
        TemplateTable::new(vec![t], Limits::default()).unwrap_err(),
        TemplateError::WindowOverflow { target: 0, base: u64::MAX - 10, size: 11 }
    );
    let w = Window { id: 0, base: 100, size: 10 };
    assert_eq!(w.address_of(2, 8), Some(102));
    assert_eq!(w.address_of(2, 9), None);
    assert_eq!(w.address_of(u64::MAX, 2), None);
}

proptest! {
    /// Any slot content: checking never panics, and a packet that passes names an
    /// existing template and, if one-sided, stays inside its window.
    #[test]
    fn arbitrary_words_never_escape_the_window(words in prop::array::uniform8(prop_oneof![
        any::<u64>(), 0u64..5000, Just(u64::MAX), (0u64..8).prop_map(|op| op | (1 << 32)),
    ])) {
        let t = table();
        if let Ok(c) = t.check(&RawPacket { words }) {
            match c.packet.op {
                Op::Put { dst_offset: o, size: s, .. } | Op::Get { src_offset: o, size: s, .. } | Op::PutSignal { dst_offset: o, size: s, .. } => {
                    prop_assert!(o.checked_add(s).is_some_and(|e| e <= 4096));
                    prop_assert_eq!(c.template.unwrap().rank, 2);
                }
                Op::Amo { offset, .. } => prop_assert!(offset % 8 == 0 && offset.checked_add(8).is_some_and(|e| e <= 4096)),
                Op::Nop => prop_assert!(c.template.is_none()),
                _ => prop_assert!(c.template.is_some()),
            }
        }
    }
}
