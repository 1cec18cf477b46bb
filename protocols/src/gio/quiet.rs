//! quiet: waiting until every operation a producer posted has completed (OpenSHMEM /
//! NVSHMEM `quiet`, seed 001), with a deadline so that no wait hangs.
//!
//! A quiet started when the producer's tail was `until` completes once the CQ's `done`
//! reaches `until`: every op posted before it has completed (a one-sided op "completed"
//! means acknowledged by the target, so visible there). It reports a failure if an op
//! below `until` failed: exactly when the first error's sequence is below `until`, since
//! the CQ's first error is the lowest failed sequence below `done` ([`super::completion`]).
//! A queue's first error therefore stays with it: every later quiet over that op reports
//! it, as a failed op leaves an OpenSHMEM context in error.

use std::time::Instant;

use super::{CqSnapshot, ErrorRecord};

/// Where a quiet stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum QuietStatus {
    /// Ops below `until` are still in flight.
    Pending,
    /// Every op below `until` completed successfully.
    Done,
    /// Every op below `until` completed, and this one (the lowest) failed.
    Failed(ErrorRecord),
    /// The deadline passed with `done` still below `until`.
    TimedOut { done: u64, until: u64 },
}

/// One quiet of one producer.
#[derive(Clone, Copy, Debug)]
pub struct Quiet {
    until: u64,
    deadline: Option<Instant>,
    expired: bool,
}

impl Quiet {
    /// A quiet over every op below `tail` (the producer's [`super::Producer::tail`] now),
    /// giving up at `deadline` if one is given.
    pub fn new(tail: u64, deadline: Option<Instant>) -> Self {
        Quiet { until: tail, deadline, expired: false }
    }

    /// The sequence `done` must reach.
    pub fn until(&self) -> u64 {
        self.until
    }

    /// Time passed: the quiet times out at its deadline. Extra calls do nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.expired |= self.deadline.is_some_and(|d| now >= d);
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline.filter(|_| !self.expired)
    }

    /// The quiet's status given the producer's latest CQ read. Completion wins over an
    /// expired deadline: the ops did finish.
    pub fn poll(&self, cq: &CqSnapshot) -> QuietStatus {
        if cq.done >= self.until {
            return match cq.first_error {
                Some(e) if e.seq < self.until => QuietStatus::Failed(e),
                _ => QuietStatus::Done,
            };
        }
        match self.expired {
            true => QuietStatus::TimedOut { done: cq.done, until: self.until },
            false => QuietStatus::Pending,
        }
    }
}
