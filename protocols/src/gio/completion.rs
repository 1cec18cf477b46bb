//! Completions of one send queue: the proxy's tracker, and the records it publishes.
//!
//! A packet's position in its queue is its **sequence number**. Ops complete out of order
//! (the network, staging pipelines, an early bad-packet rejection), but the queue's
//! completion queue (CQ) publishes monotonic counters only, which a GPU thread can poll
//! with one load:
//! - `done`: every op with sequence `< done` has completed (the contiguous prefix);
//! - `failed`: how many of those completed with an error;
//! - the **first error** record: the failed op with the lowest sequence below `done`.
//!
//! Counting failures as `done` passes them, rather than as they arrive, is what makes a
//! quiet exact ([`super::Quiet`]): with `done >= until`, an op below `until` failed if
//! and only if the first error's sequence is below `until`. It also makes the record
//! immutable once published: a later failure passed by `done` has a higher sequence.
//!
//! Publication order (transport): the record's words, then `failed`, then `done` with
//! release; a reader loads `done` with acquire first, then `failed` and the record.
//!
//! Memory is bounded: the tracker holds a bitmap of `capacity` sequences past `done`.
//! The proxy must not take a packet whose sequence the tracker does not
//! [`admit`](CompletionTracker::admits) (treat it as backpressure), so a producer cannot
//! run the proxy out of memory however many ops it keeps in flight.
//!
//! That bound counts sequences past the oldest unfinished op, so one op that waits long
//! holds every later one back once `capacity` more were posted. A producer whose ops may
//! wait on each other's peers (the context's host queues: a pushed send waits for its
//! receiver's application, which may wait for a later op of the same queue) takes a
//! tracker [`by_count`](CompletionTracker::by_count) instead: it admits while fewer than
//! `limit` ops are in flight, whatever their sequences, and its bitmap grows past an op
//! that waits (one bit per later op, given back as `done` passes them).

use std::fmt;

use super::BadPacket;
use crate::Rank;

/// What kind of failure an error completion reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum FailureKind {
    /// The proxy rejected the packet; detail: [`BadPacket::code`].
    BadPacket = 1,
    /// MPI returned an error; detail: the MPI error code.
    Net = 2,
    /// The peer's process failed; detail: its job rank.
    PeerFailed = 3,
    /// The producer stopped mid-queue (a reserved slot never committed); the queue fails.
    Stalled = 4,
    /// Cancelled at teardown, before it could complete.
    Cancelled = 5,
}

/// Why one op failed, in a form that fits a CQ record (the full text goes to the log).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpFailure {
    pub kind: FailureKind,
    pub detail: u32,
}

impl OpFailure {
    /// A packet the proxy rejected.
    pub const fn bad_packet(bad: &BadPacket) -> Self {
        OpFailure { kind: FailureKind::BadPacket, detail: bad.code() }
    }

    /// An MPI error code.
    pub const fn net(code: i32) -> Self {
        OpFailure { kind: FailureKind::Net, detail: code as u32 }
    }

    /// The peer's process failed.
    pub const fn peer_failed(rank: Rank) -> Self {
        OpFailure { kind: FailureKind::PeerFailed, detail: rank }
    }

    /// The producer stopped mid-queue.
    pub const fn stalled() -> Self {
        OpFailure { kind: FailureKind::Stalled, detail: 0 }
    }

    /// Cancelled at teardown.
    pub const fn cancelled() -> Self {
        OpFailure { kind: FailureKind::Cancelled, detail: 0 }
    }
}

impl fmt::Display for OpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.detail;
        match self.kind {
            FailureKind::BadPacket => {
                write!(f, "the proxy rejected the packet (bad packet kind {d}; its log says why)")
            }
            FailureKind::Net => write!(f, "MPI failed the operation with error code {}", d as i32),
            FailureKind::PeerFailed => write!(f, "rank {d} failed; its operations cannot complete"),
            FailureKind::Stalled => write!(f, "the producer stopped mid-queue; the queue was failed"),
            FailureKind::Cancelled => write!(f, "cancelled at teardown before it completed"),
        }
    }
}

/// The record of one failed op, as a CQ holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorRecord {
    /// The op's sequence number (its position in the queue).
    pub seq: u64,
    pub failure: OpFailure,
}

impl ErrorRecord {
    /// Words of an encoded record.
    pub const WORDS: usize = 2;

    /// The record as CQ words: `[seq, kind << 32 | detail]`.
    pub const fn to_words(&self) -> [u64; Self::WORDS] {
        [self.seq, (self.failure.kind as u64) << 32 | self.failure.detail as u64]
    }

    /// Decodes CQ words; `None` if the kind is unknown.
    pub const fn from_words(words: [u64; Self::WORDS]) -> Option<Self> {
        let kind = match words[1] >> 32 {
            1 => FailureKind::BadPacket,
            2 => FailureKind::Net,
            3 => FailureKind::PeerFailed,
            4 => FailureKind::Stalled,
            5 => FailureKind::Cancelled,
            _ => return None,
        };
        Some(ErrorRecord { seq: words[0], failure: OpFailure { kind, detail: words[1] as u32 } })
    }
}

/// What a producer reads from its CQ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqSnapshot {
    /// Every op with a lower sequence has completed.
    pub done: u64,
    /// Ops below `done` that failed.
    pub failed: u64,
    /// The failed op with the lowest sequence, once `failed > 0`.
    pub first_error: Option<ErrorRecord>,
}

/// A completion the tracker refused: a proxy bug, never a producer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CompletionError {
    #[error("GIO op {seq} completed twice")]
    Duplicate { seq: u64 },
    #[error("GIO op {seq} completed again after done reached {done}")]
    AlreadyDone { seq: u64, done: u64 },
    #[error("GIO op {seq} is outside the tracker's window [{done}, {done} + {capacity}): the proxy took it without checking admits()")]
    OutsideWindow { seq: u64, done: u64, capacity: u64 },
}

/// The proxy's completion state of one send queue.
#[derive(Clone, Debug)]
pub struct CompletionTracker {
    done: u64,
    failed: u64,
    first_error: Option<ErrorRecord>,
    /// The lowest-sequence failure not yet passed by `done` (only while `first_error` is
    /// unset: after that, later failures are only counted).
    pending_first: Option<ErrorRecord>,
    /// Bit `seq % capacity`: completed, not yet passed by `done`.
    completed: Vec<u64>,
    /// Bit `seq % capacity`: that completion was a failure.
    failures: Vec<u64>,
    /// `Some(limit)`: admission by ops in flight ([`by_count`](Self::by_count)).
    count_limit: Option<u64>,
    /// Ops completed past `done` (bits set in `completed`).
    ahead: u64,
}

impl CompletionTracker {
    /// A tracker of an empty queue that tracks up to `capacity` ops past `done` (rounded
    /// up to a multiple of 64; a few times the ring's slots leaves room for ops in flight
    /// on the network after their slots were reused).
    pub fn new(capacity: u64) -> Self {
        let words = capacity.div_ceil(64).max(1) as usize;
        CompletionTracker {
            done: 0,
            failed: 0,
            first_error: None,
            pending_first: None,
            completed: vec![0; words],
            failures: vec![0; words],
            count_limit: None,
            ahead: 0,
        }
    }

    /// A tracker that admits an op while fewer than `limit` ops taken before it are still
    /// in flight, however far past `done` it lies; its bitmap grows to hold them.
    pub fn by_count(limit: u64) -> Self {
        CompletionTracker { count_limit: Some(limit.max(1)), ..Self::new(limit) }
    }

    /// Sequences the tracker can hold past `done`.
    pub fn capacity(&self) -> u64 {
        self.completed.len() as u64 * 64
    }

    /// Every op with a lower sequence has completed.
    pub fn done(&self) -> u64 {
        self.done
    }

    /// Ops below `done` that failed.
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// The failed op with the lowest sequence below `done`.
    pub fn first_error(&self) -> Option<ErrorRecord> {
        self.first_error
    }

    /// The counters to publish.
    pub fn snapshot(&self) -> CqSnapshot {
        CqSnapshot { done: self.done, failed: self.failed, first_error: self.first_error }
    }

    /// Whether op `seq` may be taken now: it fits the window. If not, leave its packet
    /// in the slot until `done` moves (backpressure).
    ///
    /// By count, the proxy takes packets in order, so every op from `done` up to `seq`
    /// was taken, and those in flight are the ones not completed ahead of `done`.
    pub fn admits(&self, seq: u64) -> bool {
        match self.count_limit {
            None => self.fits(seq),
            Some(limit) => seq >= self.done && seq - self.done - self.ahead.min(seq - self.done) < limit,
        }
    }

    /// Whether op `seq` has not completed yet (taken or not).
    pub fn pending(&self, seq: u64) -> bool {
        if seq < self.done {
            return false;
        }
        if !self.fits(seq) {
            return true;
        }
        let (w, b) = self.bit(seq);
        self.completed[w] & b == 0
    }

    /// Whether the bitmap holds a bit for `seq`.
    fn fits(&self, seq: u64) -> bool {
        seq >= self.done && seq - self.done < self.capacity()
    }

    /// Doubles the bitmap until it holds `seq` (trackers by count only), keeping the bits
    /// of the sequences it held.
    fn grow_to(&mut self, seq: u64) {
        while !self.fits(seq) {
            let old = self.capacity();
            let words = self.completed.len() * 2;
            let (completed, failures) = (std::mem::take(&mut self.completed), std::mem::take(&mut self.failures));
            self.completed = vec![0; words];
            self.failures = vec![0; words];
            for s in self.done..self.done + old {
                let i = s % old;
                let (ow, ob) = ((i / 64) as usize, 1u64 << (i % 64));
                let (w, b) = self.bit(s);
                if completed[ow] & ob != 0 {
                    self.completed[w] |= b;
                }
                if failures[ow] & ob != 0 {
                    self.failures[w] |= b;
                }
            }
        }
    }

    fn bit(&self, seq: u64) -> (usize, u64) {
        let i = seq % self.capacity();
        ((i / 64) as usize, 1 << (i % 64))
    }

    /// Op `seq` completed, successfully or not. Returns whether `done` advanced, so the
    /// caller publishes the counters (release) only when they changed.
    #[must_use = "publish the counters when done advanced"]
    pub fn complete(&mut self, seq: u64, result: Result<(), OpFailure>) -> Result<bool, CompletionError> {
        if seq < self.done {
            return Err(CompletionError::AlreadyDone { seq, done: self.done });
        }
        if self.count_limit.is_some() {
            self.grow_to(seq);
        } else if !self.fits(seq) {
            return Err(CompletionError::OutsideWindow { seq, done: self.done, capacity: self.capacity() });
        }
        let (w, b) = self.bit(seq);
        if self.completed[w] & b != 0 {
            return Err(CompletionError::Duplicate { seq });
        }
        self.completed[w] |= b;
        self.ahead += 1;
        if let Err(failure) = result {
            self.failures[w] |= b;
            let lowest = match self.pending_first {
                Some(p) => seq < p.seq,
                None => true,
            };
            if self.first_error.is_none() && lowest {
                self.pending_first = Some(ErrorRecord { seq, failure });
            }
        }
        let before = self.done;
        loop {
            let (w, b) = self.bit(self.done);
            if self.completed[w] & b == 0 {
                break;
            }
            self.completed[w] &= !b;
            self.ahead -= 1;
            if self.failures[w] & b != 0 {
                self.failures[w] &= !b;
                self.failed += 1;
                if self.first_error.is_none() {
                    debug_assert_eq!(self.pending_first.map(|p| p.seq), Some(self.done));
                    self.first_error = self.pending_first.take();
                }
            }
            self.done += 1;
        }
        Ok(self.done != before)
    }

    /// Fails every op in `seqs` not completed yet (teardown: cancelled; a stalled queue:
    /// stalled). Returns whether `done` advanced. An op failed here that MPI completes
    /// later is a [`CompletionError::Duplicate`] the caller ignores.
    #[must_use = "publish the counters when done advanced"]
    pub fn fail_range(&mut self, seqs: std::ops::Range<u64>, failure: OpFailure) -> Result<bool, CompletionError> {
        let mut advanced = false;
        for seq in seqs.start.max(self.done)..seqs.end {
            if seq < self.done {
                continue;
            }
            if !self.pending(seq) {
                continue;
            }
            advanced |= self.complete(seq, Err(failure))?;
        }
        Ok(advanced)
    }
}
