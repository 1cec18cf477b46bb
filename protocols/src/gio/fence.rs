//! fence: ordering the operations of one queue to one target (OpenSHMEM / NVSHMEM
//! `fence`, seed 001).
//!
//! A producer's fence says: the ops posted to a target before it complete before any op
//! posted to that target after it starts. The producer marks the first op to each target
//! after a fence with the `FENCE` flag ([`FenceMarks`]); the proxy's [`FenceGate`] holds
//! a `FENCE` op to target `t` until every earlier op of the queue to `t` has completed.
//! MPI's per-(source, tag) order alone does not give this: a later op may travel under
//! another tag, and a staged copy may land late.
//!
//! Ops to other targets are never held back: a held op leaves its slot for the gate's own
//! memory ([`FenceGate::hold`], bounded by `max_held`), so the proxy keeps draining the
//! queue. Once a target has a held op, every later op to it queues behind (it comes after
//! the fence too, and must not overtake the fenced op). A non-fenced op at the front of a
//! target's queue may start at once: everything before it to that target has started, and
//! the fence before it, if any, was already satisfied when its fenced op started.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::Flags;

/// The producer's side of fence: which ops carry `FENCE`.
#[derive(Clone, Debug, Default)]
pub struct FenceMarks {
    /// Fences called so far.
    epoch: u64,
    /// Per target, the epoch its last op was posted in.
    posted_in: FxHashMap<u32, u64>,
}

impl FenceMarks {
    /// The producer called fence: the next op to each target carries `FENCE`.
    pub fn fence(&mut self) {
        self.epoch += 1;
    }

    /// The flags for an op to `target` posted now: `FENCE` if it is the first op to
    /// `target` since a fence and an op to `target` came before that fence (an op with
    /// nothing before it has nothing to wait for).
    #[must_use]
    pub fn flags_for(&mut self, target: u32) -> Flags {
        match self.posted_in.insert(target, self.epoch) {
            Some(epoch) if epoch < self.epoch => Flags::FENCE,
            _ => Flags::NONE,
        }
    }
}

/// One target's gate: ops in flight, and ops held in arrival order.
#[derive(Debug)]
struct Gate<T> {
    in_flight: u64,
    /// (arrival stamp, fenced, op).
    held: VecDeque<(u64, bool, T)>,
}

/// The proxy's side of fence for one queue: per target, ops started and not completed,
/// and the ops held back. `T` is what the proxy keeps of a held op (its checked packet
/// and sequence).
#[derive(Debug)]
pub struct FenceGate<T> {
    gates: FxHashMap<u32, Gate<T>>,
    held: usize,
    max_held: usize,
    /// Arrivals so far; orders held ops across targets.
    stamp: u64,
}

impl<T> FenceGate<T> {
    /// A gate that holds at most `max_held` ops; when full, the proxy leaves the next
    /// blocked packet in its slot (backpressure) instead of holding it.
    pub fn new(max_held: usize) -> Self {
        FenceGate { gates: FxHashMap::default(), held: 0, max_held, stamp: 0 }
    }

    /// Whether an op to `target`, fenced or not, may start now, with nothing held before
    /// it: no op to `target` is held, and if it is fenced, none is in flight.
    #[must_use]
    pub fn may_issue(&self, target: u32, fenced: bool) -> bool {
        match self.gates.get(&target) {
            Some(g) => g.held.is_empty() && (!fenced || g.in_flight == 0),
            None => true,
        }
    }

    /// An op that [`may_issue`](Self::may_issue) allowed was started (MPI accepted it).
    pub fn on_issue(&mut self, target: u32) {
        let g = self.gates.entry(target).or_insert_with(|| Gate { in_flight: 0, held: VecDeque::new() });
        debug_assert!(g.held.is_empty(), "GIO op to target {target} started past held ops");
        g.in_flight += 1;
    }

    /// An op to `target` that was started has completed (successfully or not: a failed
    /// op no longer touches the target either).
    ///
    /// # Panics
    /// If no op to `target` is in flight: the proxy completed an op it never started.
    pub fn on_complete(&mut self, target: u32) {
        let g = self.gates.get_mut(&target).filter(|g| g.in_flight > 0);
        let g = g.unwrap_or_else(|| panic!("GIO completion to target {target} with no op in flight"));
        g.in_flight -= 1;
        if g.in_flight == 0 && g.held.is_empty() {
            // Forget idle targets: memory stays bounded by the targets in use.
            self.gates.remove(&target);
        }
    }

    /// Holds an op that may not start yet; the proxy takes its slot. `Err(op)` when the
    /// gate is full: leave the packet in its slot and retry later.
    pub fn hold(&mut self, target: u32, fenced: bool, op: T) -> Result<(), T> {
        if self.held == self.max_held {
            return Err(op);
        }
        self.stamp += 1;
        self.held += 1;
        let g = self.gates.entry(target).or_insert_with(|| Gate { in_flight: 0, held: VecDeque::new() });
        g.held.push_back((self.stamp, fenced, op));
        Ok(())
    }

    /// The oldest held op that may start now, and its target. Start it, then call
    /// [`issue_held`](Self::issue_held); if MPI refuses it, it stays held.
    #[must_use]
    pub fn poll_op(&self) -> Option<(u32, &T)> {
        // The proxy asks every queue's gate every round; most hold nothing.
        if self.held == 0 {
            return None;
        }
        let startable = self.gates.iter().filter_map(|(&t, g)| match g.held.front() {
            Some((stamp, fenced, op)) if !fenced || g.in_flight == 0 => Some((*stamp, t, op)),
            _ => None,
        });
        startable.min_by_key(|&(stamp, ..)| stamp).map(|(_, t, op)| (t, op))
    }

    /// The held op [`poll_op`](Self::poll_op) gave for `target` was started: it leaves
    /// the gate and counts as in flight.
    ///
    /// # Panics
    /// If `target` has no held op.
    pub fn issue_held(&mut self, target: u32) -> T {
        let g = self.gates.get_mut(&target).expect("GIO issue_held on a target with no held op");
        let (_, _, op) = g.held.pop_front().expect("GIO issue_held on a target with no held op");
        g.in_flight += 1;
        self.held -= 1;
        op
    }

    /// Ops held now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Ops to `target` started and not completed.
    pub fn in_flight(&self, target: u32) -> u64 {
        self.gates.get(&target).map_or(0, |g| g.in_flight)
    }

    /// Takes every held op, oldest first (teardown or a failed queue: the proxy fails
    /// them). In-flight counts stay until their completions arrive.
    pub fn take_held(&mut self) -> Vec<(u32, T)> {
        let mut all: Vec<(u64, u32, T)> = Vec::with_capacity(self.held);
        for (&t, g) in self.gates.iter_mut() {
            all.extend(g.held.drain(..).map(|(stamp, _, op)| (stamp, t, op)));
        }
        self.gates.retain(|_, g| g.in_flight > 0);
        self.held = 0;
        all.sort_by_key(|&(stamp, ..)| stamp);
        all.into_iter().map(|(_, t, op)| (t, op)).collect()
    }
}
