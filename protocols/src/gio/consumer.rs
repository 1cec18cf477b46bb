//! The proxy's side of one send queue: reading packets in order, taking them only once
//! MPI accepted them, and detecting a producer that stopped mid-queue.
//!
//! The consumer owns `head`, the count of slots taken. Each round the proxy loads the
//! producer's doorbell (`tail`) and the commit word of the slot at `head` (both with
//! acquire) and asks [`Consumer::poll`]:
//! - the commit word decides readiness ([`super::is_committed`]): a committed packet is
//!   [`Poll::Ready`] even if the doorbell has not caught up yet, since the commit store
//!   is the producer's last write to the slot;
//! - the doorbell says how far the producer has reserved: `tail > head` over a slot that
//!   is not committed means a producer is between reserving and committing
//!   ([`Poll::Pending`]); if that lasts `stall_timeout`, the producer stopped mid-queue
//!   ([`Poll::Stalled`]) and the proxy fails the queue instead of waiting forever.
//!
//! **Take only what MPI accepted**: [`Consumer::accept`] advances the head, and the
//! proxy calls it only once the packet's op was accepted by MPI (or was rejected as a
//! bad packet and completed with an error, or parked by the fence gate in the proxy's
//! own memory). Under backpressure the packet stays in its slot and is retried next
//! round; it is never dropped. The head `accept` returns is the credit to publish
//! (release) so the producer may reuse the slot.

use std::time::{Duration, Instant};

use super::producer::check_slots;
use super::{is_committed, slot_index, QueueError};

/// A committed packet at the head, ready to be read and started. Hand it back to
/// [`Consumer::accept`] once the op is accepted; drop it to leave the packet in place.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub struct ReadySlot {
    pos: u64,
    index: usize,
}

impl ReadySlot {
    /// The packet's position: its sequence number in the queue's completions.
    pub fn pos(&self) -> u64 {
        self.pos
    }

    /// The index of its slot in the ring.
    pub fn index(&self) -> usize {
        self.index
    }
}

/// What the slot at the head holds.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum Poll {
    /// Nothing reserved past the head.
    Empty,
    /// A committed packet.
    Ready(ReadySlot),
    /// The producer reserved `pos` but has not committed it yet; it counts as stalled
    /// from `deadline` on.
    Pending { pos: u64, deadline: Instant },
    /// The producer reserved `pos` and has not committed it since `since`, for at least
    /// the stall timeout: fail the queue.
    Stalled { pos: u64, since: Instant },
}

/// Why [`Consumer::drain`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Nothing more reserved.
    Empty,
    /// The next slot is reserved but not committed yet.
    Pending,
    /// The next slot stayed uncommitted past the stall timeout.
    Stalled { pos: u64 },
    /// The caller could not start the next op (MPI backpressure); it stays in its slot.
    Refused,
    /// The batch bound was reached.
    Budget,
}

/// What the caller of [`Consumer::drain`] did with a ready packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// Taken: started (MPI accepted it), rejected with an error completion, or parked.
    Taken,
    /// Not now (backpressure): leave it in its slot and stop the batch.
    Refused,
}

/// The outcome of one [`Consumer::drain`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Drained {
    /// Packets taken.
    pub taken: usize,
    /// Why it stopped.
    pub stop: Stop,
    /// The new head to publish as credit, if any packet was taken.
    pub credit: Option<u64>,
}

/// The consumer's state of one send queue.
#[derive(Clone, Debug)]
pub struct Consumer {
    slots: u64,
    /// Slots taken so far: every position below it was accepted.
    head: u64,
    stall_timeout: Duration,
    /// The reserved but uncommitted position at the head, and when it was first seen so.
    waiting: Option<(u64, Instant)>,
}

impl Consumer {
    /// A consumer of an empty ring of `slots` (a power of two); a reserved slot left
    /// uncommitted for `stall_timeout` counts as a stopped producer.
    pub fn new(slots: u64, stall_timeout: Duration) -> Result<Self, QueueError> {
        Ok(Consumer { slots: check_slots(slots)?, head: 0, stall_timeout, waiting: None })
    }

    /// Slots of the ring.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Slots taken so far: the credit last returned.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Index of the slot whose commit word to load next.
    pub fn head_index(&self) -> usize {
        slot_index(self.head, self.slots)
    }

    /// Says what the head slot holds, given the doorbell `tail` and the `commit_word`
    /// loaded from [`Consumer::head_index`] (both with acquire), at time `now`.
    ///
    /// A doorbell more than a ring ahead of the head is an error: a correct producer
    /// never reserves a slot the proxy has not taken.
    pub fn poll(&mut self, tail: u64, commit_word: u64, now: Instant) -> Result<Poll, QueueError> {
        let head = self.head;
        if tail > head && tail - head > self.slots {
            return Err(QueueError::TailTooFar { tail, head, slots: self.slots });
        }
        if is_committed(head, self.slots, commit_word) {
            self.waiting = None;
            return Ok(Poll::Ready(ReadySlot { pos: head, index: self.head_index() }));
        }
        if tail <= head {
            self.waiting = None;
            return Ok(Poll::Empty);
        }
        let since = match self.waiting {
            Some((pos, since)) if pos == head => since,
            _ => {
                self.waiting = Some((head, now));
                now
            }
        };
        let deadline = since + self.stall_timeout;
        Ok(match now >= deadline {
            true => Poll::Stalled { pos: head, since },
            false => Poll::Pending { pos: head, deadline },
        })
    }

    /// When the slot being waited on counts as stalled, if one is: the proxy need not
    /// poll this queue for stall detection before then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.waiting.map(|(_, since)| since + self.stall_timeout)
    }

    /// Takes the ready packet: MPI accepted its op (or it was rejected or parked).
    /// Returns the new head, the credit to publish with release.
    ///
    /// # Panics
    /// If `ready` is not the packet at the head (a token of an earlier poll whose packet
    /// was already taken): taking it would skip a packet.
    pub fn accept(&mut self, ready: ReadySlot) -> u64 {
        assert_eq!(ready.pos, self.head, "GIO accept of position {} at head {}", ready.pos, self.head);
        self.head += 1;
        self.head
    }

    /// One bounded batch: polls and takes up to `max` packets in order. `load_commit`
    /// loads a slot's commit word (acquire) by index; `take` is called with each ready
    /// packet's position and slot index, reads words 1-7, tries to start the op, and
    /// says whether it was taken. Stops at the first slot that is not ready or not
    /// taken, so order is kept and nothing is skipped.
    pub fn drain(
        &mut self,
        tail: u64,
        now: Instant,
        max: usize,
        load_commit: impl Fn(usize) -> u64,
        mut take: impl FnMut(u64, usize) -> Take,
    ) -> Result<Drained, QueueError> {
        let mut taken = 0;
        let mut credit = None;
        let stop = loop {
            if taken == max {
                break Stop::Budget;
            }
            let ready = match self.poll(tail, load_commit(self.head_index()), now)? {
                Poll::Ready(ready) => ready,
                Poll::Empty => break Stop::Empty,
                Poll::Pending { .. } => break Stop::Pending,
                Poll::Stalled { pos, .. } => break Stop::Stalled { pos },
            };
            match take(ready.pos, ready.index) {
                Take::Taken => {
                    credit = Some(self.accept(ready));
                    taken += 1;
                }
                Take::Refused => break Stop::Refused,
            }
        };
        Ok(Drained { taken, stop, credit })
    }
}
