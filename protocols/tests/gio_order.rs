//! GIO completions, quiet and fence: network completions in random order advance `done`
//! over the contiguous prefix only, count failures and keep the lowest failed op; quiet
//! completes exactly when every earlier op has; fence holds an op until the earlier ops
//! to its target completed, and holds nothing else back.
// The machines take time as input; a test needs one real Instant as the origin of its
// virtual clock, and only offsets from it matter.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{
    CompletionError, CompletionTracker, CqSnapshot, ErrorRecord, FailureKind, FenceGate, FenceMarks, Flags, OpFailure,
    Quiet, QuietStatus,
};
use proptest::prelude::*;

/// `n` sequences in a random order, each failing or not.
fn completions(max: usize) -> impl Strategy<Value = Vec<(u64, bool)>> {
    (1..max).prop_flat_map(|n| {
        let order = Just((0..n as u64).collect::<Vec<_>>()).prop_shuffle();
        (order, prop::collection::vec(prop::bool::weighted(0.2), n))
            .prop_map(|(order, fail)| order.into_iter().map(|s| (s, fail[s as usize])).collect())
    })
}

proptest! {
    /// Completions in a random permutation: after each, `done` is the first sequence not
    /// completed, `failed` counts the failed ops below it, the first error is the lowest
    /// failed op below it, and `complete` says whether `done` moved. A quiet over every
    /// prefix completes exactly when all its ops have, failing iff one of them failed.
    #[test]
    fn out_of_order_completions(order in completions(300), capacity in 1u64..400) {
        let n = order.len() as u64;
        let mut t = CompletionTracker::new(capacity.max(n));
        let quiets: Vec<Quiet> = (0..=n).map(|until| Quiet::new(until, None)).collect();
        let mut completed = BTreeSet::new();
        let mut failed = BTreeSet::new();
        for (seq, fails) in order {
            let before = t.done();
            let result = if fails { Err(OpFailure::net(seq as i32)) } else { Ok(()) };
            let advanced = t.complete(seq, result).unwrap();
            completed.insert(seq);
            if fails {
                failed.insert(seq);
            }
            let done = (0..=n).find(|s| !completed.contains(s)).unwrap();
            prop_assert_eq!(t.done(), done);
            prop_assert_eq!(advanced, done != before);
            prop_assert_eq!(t.failed(), failed.range(..done).count() as u64);
            let first = failed.range(..done).next().map(|&s| ErrorRecord { seq: s, failure: OpFailure::net(s as i32) });
            prop_assert_eq!(t.first_error(), first);
            let cq = t.snapshot();
            for q in &quiets {
                let all_done = done >= q.until();
                let expect = match failed.range(..q.until()).next() {
                    _ if !all_done => QuietStatus::Pending,
                    Some(&s) => QuietStatus::Failed(ErrorRecord { seq: s, failure: OpFailure::net(s as i32) }),
                    None => QuietStatus::Done,
                };
                prop_assert_eq!(q.poll(&cq), expect, "quiet until {}", q.until());
            }
            // A repeat is refused, never counted twice.
            let again = t.complete(seq, Ok(()));
            let refused = matches!(again, Err(CompletionError::Duplicate { .. } | CompletionError::AlreadyDone { .. }));
            prop_assert!(refused, "repeat of {} gave {:?}", seq, again);
        }
        prop_assert_eq!(t.done(), n);
    }

    /// A small window: the proxy takes an op only when the tracker admits it, ops
    /// complete in a random order among those in flight, and `done` still ends at the
    /// total with every op counted once; an op outside the window is refused.
    #[test]
    fn bounded_window(capacity in 1u64..130, n in 1u64..400, picks in prop::collection::vec(any::<prop::sample::Index>(), 0..2000)) {
        let mut t = CompletionTracker::new(capacity);
        let cap = t.capacity();
        prop_assert!(cap >= capacity && cap.is_multiple_of(64));
        let mut in_flight: Vec<u64> = Vec::new();
        let mut next = 0;
        let mut picks = picks.into_iter();
        while t.done() < n {
            while next < n && t.admits(next) {
                in_flight.push(next);
                next += 1;
            }
            if next < n {
                prop_assert_eq!(
                    t.complete(next, Ok(())),
                    Err(CompletionError::OutsideWindow { seq: next, done: t.done(), capacity: cap })
                );
            }
            let i = picks.next().map_or(0, |p| p.index(in_flight.len()));
            let seq = in_flight.swap_remove(i);
            let _ = t.complete(seq, Ok(())).unwrap();
            prop_assert!(next - t.done() <= cap);
        }
        prop_assert_eq!((t.done(), t.failed()), (n, 0));
    }

    /// Admission by count: one op that waits (`stuck`) does not hold the later ones back
    /// (with room for one more than it: a limit of 1 is the waiting op alone).
    /// The proxy keeps taking while fewer than `limit` are in flight, far past the
    /// bitmap's first size (it grows), and failures taken across the growth still count
    /// once `done` passes them, the lowest first.
    #[test]
    fn by_count_admits_past_a_waiting_op(limit in 2u64..130, n in 1u64..1500, stuck_at in 0u64..100,
                                         picks in prop::collection::vec(any::<prop::sample::Index>(), 0..3000)) {
        let stuck = stuck_at.min(n - 1);
        let mut t = CompletionTracker::by_count(limit);
        let mut in_flight: Vec<u64> = Vec::new();
        let mut next = 0;
        let mut picks = picks.into_iter();
        let fails = |s: u64| s % 7 == 3;
        loop {
            while next < n && t.admits(next) {
                in_flight.push(next);
                next += 1;
            }
            prop_assert!(in_flight.len() as u64 <= limit.max(1), "{} in flight, limit {}", in_flight.len(), limit);
            let others: Vec<usize> = (0..in_flight.len()).filter(|&i| in_flight[i] != stuck).collect();
            if others.is_empty() {
                break;
            }
            let i = others[picks.next().map_or(0, |p| p.index(others.len()))];
            let seq = in_flight.swap_remove(i);
            let r = if fails(seq) { Err(OpFailure::net(seq as i32)) } else { Ok(()) };
            let _ = t.complete(seq, r).unwrap();
            prop_assert!(t.done() <= stuck, "done passed the op that waits");
        }
        // Every op but the one that waits was taken: one waiting op holds nothing back.
        prop_assert_eq!(next, n, "admission stopped behind the waiting op");
        prop_assert!(t.pending(stuck));
        let r = if fails(stuck) { Err(OpFailure::net(stuck as i32)) } else { Ok(()) };
        prop_assert!(t.complete(stuck, r).unwrap());
        prop_assert_eq!(t.done(), n);
        prop_assert_eq!(t.failed(), (0..n).filter(|&s| fails(s)).count() as u64);
        let first = (0..n).find(|&s| fails(s)).map(|s| ErrorRecord { seq: s, failure: OpFailure::net(s as i32) });
        prop_assert_eq!(t.first_error(), first);
    }
}

/// Teardown and a stalled queue fail what is left, once each; a late completion of a
/// failed op is refused.
#[test]
fn fail_range_fails_the_rest_once() {
    let mut t = CompletionTracker::new(64);
    assert!(!t.complete(1, Ok(())).unwrap());
    assert!(!t.complete(3, Err(OpFailure::peer_failed(7))).unwrap());
    assert!(t.fail_range(0..5, OpFailure::cancelled()).unwrap());
    assert_eq!((t.done(), t.failed()), (5, 4));
    assert_eq!(t.first_error(), Some(ErrorRecord { seq: 0, failure: OpFailure::cancelled() }));
    assert_eq!(t.complete(2, Ok(())), Err(CompletionError::AlreadyDone { seq: 2, done: 5 }));
    // The rest of a stalled queue, reserved but never taken: all fail, done moves on.
    assert!(t.fail_range(0..100, OpFailure::stalled()).unwrap());
    assert_eq!((t.done(), t.failed()), (100, 99));
    assert!(!t.fail_range(0..100, OpFailure::stalled()).unwrap(), "nothing left to fail");
    assert_eq!(
        t.fail_range(200..201, OpFailure::stalled()).unwrap_err(),
        CompletionError::OutsideWindow { seq: 200, done: 100, capacity: 64 }
    );
}

/// CQ records round-trip through their words, and say what happened.
#[test]
fn error_records_encode() {
    for failure in [
        OpFailure::net(-3),
        OpFailure::peer_failed(12),
        OpFailure::stalled(),
        OpFailure::cancelled(),
        OpFailure { kind: FailureKind::BadPacket, detail: 7 },
    ] {
        let r = ErrorRecord { seq: u64::MAX - 1, failure };
        assert_eq!(ErrorRecord::from_words(r.to_words()), Some(r));
    }
    assert_eq!(ErrorRecord::from_words([0, 9 << 32]), None);
    assert!(OpFailure::net(-3).to_string().contains("-3"));
    assert!(OpFailure::peer_failed(12).to_string().contains("rank 12"));
}

/// A quiet times out at its deadline and not before; a completion wins over it.
#[test]
fn quiet_deadline() {
    let t0 = Instant::now();
    let mut q = Quiet::new(3, Some(t0 + Duration::from_millis(10)));
    let cq = CqSnapshot { done: 2, failed: 0, first_error: None };
    q.handle_timeout(t0 + Duration::from_millis(9));
    assert_eq!(q.poll(&cq), QuietStatus::Pending);
    assert_eq!(q.poll_timeout(), Some(t0 + Duration::from_millis(10)));
    q.handle_timeout(t0 + Duration::from_millis(10));
    assert_eq!(q.poll(&cq), QuietStatus::TimedOut { done: 2, until: 3 });
    assert_eq!(q.poll_timeout(), None);
    assert_eq!(q.poll(&CqSnapshot { done: 3, ..cq }), QuietStatus::Done);
    // A failure above the quiet's range is not its failure.
    let later = ErrorRecord { seq: 3, failure: OpFailure::cancelled() };
    assert_eq!(q.poll(&CqSnapshot { done: 4, failed: 1, first_error: Some(later) }), QuietStatus::Done);
    assert_eq!(Quiet::new(0, None).poll(&CqSnapshot::default()), QuietStatus::Done);
}

/// The producer marks the first op to each target after a fence, if an op to that
/// target came before it.
#[test]
fn fence_marks() {
    let mut m = FenceMarks::default();
    assert_eq!(m.flags_for(0), Flags::NONE);
    m.fence();
    assert_eq!(m.flags_for(1), Flags::NONE, "nothing to target 1 before the fence");
    assert_eq!(m.flags_for(0), Flags::FENCE);
    assert_eq!(m.flags_for(0), Flags::NONE, "already behind the fenced op");
    m.fence();
    m.fence();
    assert_eq!(m.flags_for(1), Flags::FENCE);
    assert_eq!(m.flags_for(0), Flags::FENCE);
}

/// One op of a fence schedule: its target and whether it carries FENCE.
#[derive(Clone, Copy, Debug)]
struct FOp {
    target: u32,
    fenced: bool,
}

/// The proxy's model of a fence schedule, with the checks.
struct FenceModel {
    ops: Vec<FOp>,
    issued: Vec<bool>,
    completed: Vec<bool>,
}

impl FenceModel {
    /// Op `s` may start: every earlier op to its target has started, and those before
    /// its target's latest fence at or before `s` have completed.
    fn allowed(&self, s: usize) -> bool {
        let t = self.ops[s].target;
        let fence = (0..=s).rev().find(|&f| self.ops[f].target == t && self.ops[f].fenced);
        (0..s)
            .filter(|&e| self.ops[e].target == t)
            .all(|e| self.issued[e] && !matches!(fence, Some(f) if e < f && !self.completed[e]))
    }

    fn issue(&mut self, s: usize) -> Result<(), TestCaseError> {
        prop_assert!(self.allowed(s), "op {} ({:?}) started too early", s, self.ops[s]);
        self.issued[s] = true;
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Random op streams with FENCE flags to a few targets, random completion orders and
    /// a bounded gate: no op starts before the ops ahead of its fence completed; an op
    /// that may start is never held (ops to other targets are not held back); a full
    /// gate is backpressure; everything starts and completes in the end.
    #[test]
    fn fence_orders_ops_per_target(
        ops in prop::collection::vec((0u32..4, prop::bool::weighted(0.3)), 1..60),
        max_held in 1usize..8,
        steps in prop::collection::vec((0u8..3, any::<usize>()), 0..400),
    ) {
        let ops: Vec<FOp> = ops.into_iter().map(|(target, fenced)| FOp { target, fenced }).collect();
        let n = ops.len();
        let mut m = FenceModel { ops: ops.clone(), issued: vec![false; n], completed: vec![false; n] };
        let mut gate: FenceGate<usize> = FenceGate::new(max_held);
        let mut next = 0;
        let mut in_flight: Vec<usize> = Vec::new();
        // The schedule, then a fair round robin until everything completed (bounded).
        let tail = (0..10_000).map(|i| ((i % 3) as u8, 0usize));
        for (kind, pick) in steps.into_iter().chain(tail) {
            if m.completed.iter().all(|&c| c) {
                break;
            }
            match kind {
                // The next packet of the queue arrives.
                0 if next < n => {
                    let FOp { target, fenced } = ops[next];
                    let blocked = !m.allowed(next);
                    prop_assert_eq!(gate.may_issue(target, fenced), !blocked, "op {} misjudged", next);
                    if !blocked {
                        m.issue(next)?;
                        gate.on_issue(target);
                        in_flight.push(next);
                        next += 1;
                    } else if gate.hold(target, fenced, next).is_ok() {
                        next += 1;
                    } else {
                        prop_assert_eq!(gate.held(), max_held, "refused with room left");
                    }
                }
                // A held op starts.
                1 => {
                    if let Some((target, &s)) = gate.poll_op() {
                        prop_assert_eq!(target, ops[s].target);
                        m.issue(s)?;
                        prop_assert_eq!(gate.issue_held(target), s);
                        in_flight.push(s);
                    } else {
                        // Nothing held may start: every held op is really blocked.
                        for s in 0..next {
                            prop_assert!(m.issued[s] || !m.allowed(s), "held op {} could start", s);
                        }
                    }
                }
                // An op in flight completes.
                _ if !in_flight.is_empty() => {
                    let s = in_flight.swap_remove(pick % in_flight.len());
                    m.completed[s] = true;
                    gate.on_complete(ops[s].target);
                }
                _ => {}
            }
            for t in 0..4 {
                let flying = in_flight.iter().filter(|&&s| ops[s].target == t).count() as u64;
                prop_assert_eq!(gate.in_flight(t), flying);
            }
        }
        prop_assert!(m.completed.iter().all(|&c| c), "not everything completed");
        prop_assert_eq!(gate.held(), 0);
    }
}

/// Teardown takes every held op, oldest first.
#[test]
fn take_held_oldest_first() {
    let mut gate: FenceGate<&str> = FenceGate::new(4);
    gate.on_issue(0);
    gate.on_issue(1);
    assert!(!gate.may_issue(0, true));
    assert!(gate.may_issue(0, false));
    gate.hold(1, true, "a").unwrap();
    gate.hold(0, true, "b").unwrap();
    gate.hold(1, false, "c").unwrap();
    assert!(!gate.may_issue(1, false), "behind a held op");
    assert!(gate.may_issue(2, true), "another target is not held back");
    assert_eq!(gate.poll_op(), None);
    gate.on_complete(0);
    assert_eq!(gate.poll_op(), Some((0, &"b")));
    assert_eq!(gate.take_held(), vec![(1, "a"), (0, "b"), (1, "c")]);
    assert_eq!((gate.held(), gate.in_flight(1)), (0, 1));
    assert_eq!(gate.hold(3, false, "d"), Ok(()));
}
