//! The producer's side of a send queue: reserving slots under the credit rule.
//!
//! The producer (a host thread, or a GPU thread block's leader) owns `tail`, the count of
//! slots it has reserved, and keeps a cached copy of the consumer's `head`, the count of
//! slots the proxy has taken. Position `p` may be written once `p < head + slots`: the
//! proxy has taken the packet that last used the slot.
//!
//! **Credit rule**: the real head lives in memory the proxy writes, and reading it costs
//! a load across PCIe from a GPU (or a cache miss from a host thread). So the producer
//! reads it only when the ring looks full by its cached value: [`Producer::try_reserve`]
//! answers [`Full`], the caller loads the head (acquire) and hands it to
//! [`Producer::observe_head`], then retries. A stale cached head is benign: it is never
//! ahead of the real one, so it can only make the ring look fuller than it is.
//!
//! After reserving, the producer writes words 1-7, then the commit word with release
//! ([`super::commit_word`]), then publishes `tail` as the doorbell with release.

use std::ops::Range;

use super::QueueError;

/// The ring looks full by the cached head: load the consumer's head, pass it to
/// [`Producer::observe_head`], and retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[must_use]
#[error("GIO send queue looks full (tail {tail}, cached head {cached_head}, {wanted} slots wanted): re-read the consumer's head and retry")]
pub struct Full {
    pub tail: u64,
    pub cached_head: u64,
    pub wanted: u64,
}

/// Checks a ring size: a power of two (a slot is `pos % slots`, and the lap `pos / slots`
/// keeps its parity sequence when positions wrap at 2^64) and at most 2^31 slots.
pub(crate) fn check_slots(slots: u64) -> Result<u64, QueueError> {
    match slots.is_power_of_two() && slots <= 1 << 31 {
        true => Ok(slots),
        false => Err(QueueError::BadSlots { slots }),
    }
}

/// The producer's state of one send queue.
#[derive(Clone, Debug)]
pub struct Producer {
    slots: u64,
    /// Slots reserved so far (the next position to hand out). Published as the doorbell.
    tail: u64,
    /// The consumer's head as last observed: every position below it has been taken.
    cached_head: u64,
}

impl Producer {
    /// A producer of an empty ring of `slots` (a power of two).
    pub fn new(slots: u64) -> Result<Self, QueueError> {
        Ok(Producer { slots: check_slots(slots)?, tail: 0, cached_head: 0 })
    }

    /// Slots of the ring.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Slots reserved so far: the value to publish as the doorbell, and the position a
    /// quiet waits for ([`super::Quiet::new`]).
    pub fn tail(&self) -> u64 {
        self.tail
    }

    /// The consumer's head as last observed.
    pub fn cached_head(&self) -> u64 {
        self.cached_head
    }

    /// Reserves the next position, or says the ring looks full.
    pub fn try_reserve(&mut self) -> Result<u64, Full> {
        self.try_reserve_n(1).map(|r| r.start)
    }

    /// Reserves `n` consecutive positions at once (one per thread of a block: thread `i`
    /// writes `start + i`), or none. All or nothing, so a block never holds half a batch
    /// while waiting for credits another block's batch needs.
    ///
    /// # Panics
    /// If `n` exceeds the ring: such a batch never fits, whatever the proxy does.
    pub fn try_reserve_n(&mut self, n: u64) -> Result<Range<u64>, Full> {
        assert!(n <= self.slots, "a batch of {n} GIO slots never fits a ring of {} slots", self.slots);
        if self.tail + n - self.cached_head > self.slots {
            return Err(Full { tail: self.tail, cached_head: self.cached_head, wanted: n });
        }
        let start = self.tail;
        self.tail += n;
        Ok(start..self.tail)
    }

    /// Takes a fresh load of the consumer's head. It must not be behind the cached one
    /// (the head only grows) nor ahead of the tail (the proxy cannot take a slot never
    /// reserved); either means the head's memory is corrupt or shared by mistake.
    pub fn observe_head(&mut self, head: u64) -> Result<(), QueueError> {
        if head < self.cached_head {
            return Err(QueueError::HeadWentBack { head, cached: self.cached_head });
        }
        if head > self.tail {
            return Err(QueueError::HeadAheadOfTail { head, tail: self.tail });
        }
        self.cached_head = head;
        Ok(())
    }
}
