//! GIO device queues (seed 000, section 4): the packet format and the sans-IO state
//! machines of a send queue, its completions, fence and quiet (`docs/internode.md`).
//!
//! A producer (a host thread, or a GPU thread block) posts operations for other nodes
//! into its **send queue** (SQ), a ring of 64-byte packets in pinned host memory mapped
//! into the device; this process's proxy thread turns them into MPI operations and
//! reports their completion in the producer's **completion queue** (CQ), monotonic
//! counters. Here is everything about them that is not a memory access: the transport
//! does the loads and stores (with the orderings named below) and feeds the results in.
//!
//! | piece | side | module |
//! |-------|------|--------|
//! | packet layout, commit word, lap parity | both | [`packet`] |
//! | templates, bad-packet validation | proxy | [`template`] |
//! | reserving slots under credits | producer | [`producer`] |
//! | taking packets, stall detection | proxy | [`consumer`] |
//! | out-of-order completions -> counters | proxy | [`completion`] |
//! | fence marks / per-target gate | both | [`fence`] |
//! | quiet | producer | [`quiet`] |
//!
//! # The protocol of one queue, and why each rule
//! 1. The producer reserves position `p` ([`Producer::try_reserve`]). Positions are
//!    monotonic `u64` counts; the slot is `p % slots` and the lap `p / slots`.
//! 2. It writes words 1-7 of the slot, then the **commit word** (word 0) with one release
//!    store (`st.release.sys` on a GPU, `Release` on the host). The commit word carries
//!    the op, flags and target index and the commit bit, lap parity XOR 1: the proxy's
//!    acquire load of word 0 either sees the old lap's bit (not yet) or the whole packet.
//!    Lap 0 commits with 1, so a zeroed ring reads as empty and a slot is never cleared
//!    after use (MSCCL++'s rule): clearing would be another store racing the next lap.
//! 3. It publishes its tail (the doorbell) with release. The proxy polls tails to find
//!    busy queues and to notice a producer that reserved a slot and never committed it
//!    ([`Poll::Stalled`]); readiness itself is decided by the commit word alone.
//! 4. The proxy loads the commit word at its head with acquire, reads words 1-7, checks
//!    the packet against the queue's [`TemplateTable`] (a bad one is taken and completed
//!    with an error: never an out-of-bounds access), and starts the op. It advances the
//!    head ([`Consumer::accept`]) only after MPI accepted the op: under backpressure the
//!    packet stays in its slot, never dropped (NCCL's proxy once lost puts by taking them
//!    first). It publishes the head with release: the producer's **credit**.
//! 5. **Credit rule**: the producer re-reads the head only when the ring looks full by
//!    its cached copy ([`Full`]); a stale copy only makes the ring look fuller.
//! 6. Ops complete out of order; the [`CompletionTracker`] publishes `done` (the
//!    contiguous prefix), `failed` and the first error's record with release.
//! 7. **fence** ([`FenceMarks`], [`FenceGate`]) orders ops to one target; **quiet**
//!    ([`Quiet`]) waits for `done` to reach the producer's tail at the time of the quiet.
//!
//! # Decisions beyond `docs/internode.md`
//! - Readiness comes from the commit word, not the doorbell: a committed packet is taken
//!   even if the tail was not yet published (it is complete: the commit is the last
//!   store), so the doorbell's job is waking the proxy and stall detection.
//! - Op code 0 is NOP, so an all-zero committed packet is valid (it completes at once),
//!   and a thread block that reserved more slots than it used pads with NOPs instead of
//!   leaving holes that would read as a stalled producer.
//! - Words 1-7 keep one meaning per position across ops (local address, remote offset,
//!   size, two arguments, cookie), and a decoder ignores the words an op does not use:
//!   slots are never cleared, so those may hold an earlier lap's values. PUT_SIGNAL's
//!   signal op and AMO's atomic ride in the commit word's variant byte, not in a word
//!   of their own, so a GPU producer writes no extra word for them.
//! - The first error is the failed op with the lowest sequence, counted when `done`
//!   passes it (not the first to fail in time): quiet then knows exactly whether an op
//!   in its range failed, and the multi-word record never changes once published.
//! - A bad packet's slot is taken (it will never become valid) and the op completes
//!   with [`FailureKind::BadPacket`]; the proxy logs the [`BadPacket`] text.
//! - Ops in flight after their slot was reused are bounded by the tracker's window:
//!   the proxy takes a packet only if [`CompletionTracker::admits`] its sequence, else
//!   it is backpressure like MPI's.
//! - A fenced op the gate holds is taken from its slot into the gate's bounded memory
//!   (an exception to "take only what MPI accepted": nothing is dropped, and it keeps ops
//!   to other targets flowing); a full gate is backpressure.
//! - A stalled slot's clock starts when the proxy first sees it uncommitted behind a
//!   published tail; a doorbell more than a ring ahead of the head is a [`QueueError`].

pub mod completion;
pub mod consumer;
pub mod fence;
pub mod packet;
pub mod producer;
pub mod quiet;
pub mod template;

pub use completion::{CompletionError, CompletionTracker, CqSnapshot, ErrorRecord, FailureKind, OpFailure};
pub use consumer::{Consumer, Drained, Poll, ReadySlot, Stop, Take};
pub use fence::{FenceGate, FenceMarks};
pub use packet::{
    commit_bit, commit_word, is_committed, lap_parity, slot_index, word, AmoOp, Flags, Op, OpCode, Packet, RawPacket,
    SignalOp, MAX_TARGET, PACKET_WORDS,
};
pub use producer::{Full, Producer};
pub use quiet::{Quiet, QuietStatus};
pub use template::{BadPacket, Checked, Limits, Template, TemplateError, TemplateTable, Window};

/// A queue's shared counters hold values no correct peer writes: the queue's memory is
/// corrupt, or two queues share it by mistake. Fail the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    #[error("a GIO ring of {slots} slots: the size must be a power of two of at most 2^31")]
    BadSlots { slots: u64 },
    #[error("GIO consumer head went back from {cached} to {head}: the head's memory is corrupt")]
    HeadWentBack { head: u64, cached: u64 },
    #[error("GIO consumer head {head} is ahead of the producer's tail {tail}: the head's memory is corrupt or shared")]
    HeadAheadOfTail { head: u64, tail: u64 },
    #[error("GIO doorbell {tail} is more than {slots} slots ahead of head {head}: the producer ignored credits or the doorbell is corrupt")]
    TailTooFar { tail: u64, head: u64, slots: u64 },
}
