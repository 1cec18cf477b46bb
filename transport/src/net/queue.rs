//! The memory of one GIO send queue (`docs/internode.md`, "GIO queues"): its SQ ring,
//! doorbell, credit, completion counters and control slab, in one allocation of pinned
//! host memory mapped into the devices ([`crate::device::DeviceBackend::alloc_host_mapped`]), so that a
//! GPU thread block can be a producer as well as a host thread.
//!
//! # Layout
//! Offsets from the allocation's start. Each group written by one side has lines of its
//! own (128 bytes apart: a CPU's adjacent-line prefetch pulls lines in pairs), so the
//! producer's and the proxy's stores never share a line.
//!
//! | offset | field | written by | read by |
//! |--------|-------|------------|---------|
//! | [`TAIL_AT`] | `tail`: the doorbell, slots reserved so far | producer (release) | proxy (acquire) |
//! | [`HEAD_AT`] | `head`: the credit, slots the proxy has taken | proxy (release) | producer (acquire, only when the ring looks full) |
//! | [`CQ_AT`] | `done`, `failed`, first error `[seq, kind << 32 \| detail]` | proxy | producer |
//! | [`STATE_AT`] | `state`: 0 open, else why the proxy stopped taking packets ([`QueueState`]) | proxy (release) | producer (acquire) |
//! | [`RING_AT`] | `slots` packets of 64 bytes ([`RawPacket`]) | producer (commit word last, release) | proxy (commit word acquire) |
//! | ring end | `slots` control slots of [`CTRL_MAX`] bytes: slot `i` holds the bytes of the CTRL packet in ring slot `i` | producer | proxy (copies them out when it takes the packet) |
//!
//! The control bytes are copied out by the proxy when it takes the packet, so a slot's
//! credit frees its control slot too: no second credit rule for the slab.
//!
//! Every word is accessed through atomics (relaxed unless an ordering is named), so a
//! stale read of a slot the other side is writing is a benign race on values, never a
//! data race: the commit word decides which values count.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use crossbeam_queue::SegQueue;
use gpulmt_protocols::gio::{CqSnapshot, ErrorRecord, OpFailure, RawPacket, PACKET_WORDS};

use super::wire::CTRL_MAX;
use crate::device::{Backend, DeviceError, HostMapped};

/// Offset of the doorbell (`tail`).
pub const TAIL_AT: usize = 0;
/// Offset of the credit (`head`).
pub const HEAD_AT: usize = 128;
/// Offset of the completion counters: `done`, `failed`, error `seq`, error word.
pub const CQ_AT: usize = 256;
/// Offset of the queue's state word.
pub const STATE_AT: usize = 384;
/// Offset of the first ring slot.
pub const RING_AT: usize = 512;

/// Why a queue takes no more packets (its state word; 0 while open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum QueueState {
    Open = 0,
    /// A producer reserved a slot and never committed it.
    Stalled = 1,
    /// The queue's indices were impossible (corrupt memory).
    Corrupt = 2,
    /// The path shut down.
    Closed = 3,
}

impl QueueState {
    fn from_word(w: u64) -> QueueState {
        match w {
            0 => QueueState::Open,
            1 => QueueState::Stalled,
            2 => QueueState::Corrupt,
            _ => QueueState::Closed,
        }
    }
}

/// A failed op's full story, for host producers (a CQ record has room for a code only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailureDetail {
    pub failure: OpFailure,
    /// What the proxy logged.
    pub text: String,
}

/// What a device producer needs of a queue: device addresses of its fields (issue 28
/// hands this to kernels). Plain data, `Copy`, `#[repr(C)]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceQueue {
    /// Device address of the allocation; the fields are at the offsets of the layout.
    pub base: u64,
    pub slots: u64,
}

/// One send queue's memory. Shared (`Arc`) by its producer handle and the proxy.
pub struct QueueMem {
    backend: Backend,
    mem: HostMapped,
    slots: u64,
    /// The queue's number in its set, for logs.
    index: u32,
    /// Failures by sequence, written by the proxy before it publishes `done` past them
    /// and taken by the host producer: the text an error record has no room for.
    details: Mutex<BTreeMap<u64, FailureDetail>>,
    /// Set by a host producer before its first post: it reads each op's end from
    /// `ended`, not only the CQ's `done` prefix, and the proxy admits its ops by count
    /// (`CompletionTracker::by_count`), so one op that waits holds no later one back.
    each_op: AtomicBool,
    /// Ops of an `each_op` queue that ended, in the order they ended (their failures'
    /// stories are in `details` before they appear here).
    ended: SegQueue<u64>,
}

// SAFETY: the raw memory is reached only through atomics at fixed offsets inside the
// allocation, which lives as long as the QueueMem; the rest is Send + Sync.
unsafe impl Send for QueueMem {}
// SAFETY: as above: every shared access is atomic.
unsafe impl Sync for QueueMem {}

impl QueueMem {
    /// Bytes a queue of `slots` slots occupies.
    pub fn bytes(slots: u64) -> usize {
        RING_AT + slots as usize * (std::mem::size_of::<RawPacket>() + CTRL_MAX)
    }

    /// A zeroed (empty) queue of `slots` slots (a power of two) from `backend`.
    pub fn new(backend: Backend, index: u32, slots: u64) -> Result<QueueMem, DeviceError> {
        assert!(slots.is_power_of_two(), "GIO queue slots must be a power of two, not {slots}");
        let mem = backend.alloc_host_mapped(Self::bytes(slots))?;
        let (details, each_op, ended) = (Mutex::new(BTreeMap::new()), AtomicBool::new(false), SegQueue::new());
        Ok(QueueMem { backend, mem, slots, index, details, each_op, ended })
    }

    /// Slots of the ring.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The queue's number in its set.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The device's view of the queue.
    pub fn device_queue(&self) -> DeviceQueue {
        DeviceQueue { base: self.mem.device as u64, slots: self.slots }
    }

    fn word(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.mem.len);
        // SAFETY: in bounds and 8-aligned (page-aligned base, offsets multiples of 8);
        // the allocation lives as long as self; every access to it is atomic.
        unsafe { &*((self.mem.host + offset) as *const AtomicU64) }
    }

    fn slot_word(&self, index: usize, w: usize) -> &AtomicU64 {
        assert!(index < self.slots as usize && w < PACKET_WORDS, "GIO slot {index} word {w}");
        self.word(RING_AT + index * std::mem::size_of::<RawPacket>() + w * 8)
    }

    /// Host address of control slot `index`.
    pub fn ctrl_slot(&self, index: usize) -> usize {
        assert!(index < self.slots as usize);
        self.mem.host + RING_AT + self.slots as usize * std::mem::size_of::<RawPacket>() + index * CTRL_MAX
    }

    /// The host address of `addr` if it lies in this queue's control slab by its host
    /// or device address, with room for `len` bytes; the proxy reads CTRL bytes there.
    pub fn ctrl_host_addr(&self, addr: u64, len: u64) -> Option<usize> {
        let slab = (self.ctrl_slot(0) - self.mem.host) as u64;
        let slab_len = self.slots * CTRL_MAX as u64;
        [self.mem.host as u64, self.mem.device as u64].into_iter().find_map(|base| {
            let off = addr.checked_sub(base + slab)?;
            (off.checked_add(len)? <= slab_len).then(|| self.mem.host + (slab + off) as usize)
        })
    }

    // ---- producer side ----

    /// Writes words 1-7 of slot `index`. Relaxed: the commit store after them publishes
    /// them ([`commit`](Self::commit)).
    pub fn write_body(&self, index: usize, body: &[u64; PACKET_WORDS - 1]) {
        for (w, &v) in body.iter().enumerate() {
            // Relaxed: published by commit's release store after them (pairs with
            // load_commit). Scope: system.
            self.slot_word(index, w + 1).store(v, Ordering::Relaxed);
        }
    }

    /// Stores the commit word of slot `index`, making the packet the proxy's.
    pub fn commit(&self, index: usize, commit_word: u64) {
        // Release, pairs with load_commit: words 1-7 (write_body) and the control slot's
        // bytes become visible to the proxy with the commit bit. Scope: system (a GPU
        // producer uses st.release.sys).
        self.slot_word(index, 0).store(commit_word, Ordering::Release);
    }

    /// Rings the doorbell: the producer has reserved `tail` slots.
    pub fn ring_doorbell(&self, tail: u64) {
        // Release, pairs with load_tail: the packets committed before it are visible when
        // the proxy sees the tail (readiness itself is decided by commit words). Scope: system.
        self.word(TAIL_AT).store(tail, Ordering::Release);
    }

    /// The consumer's head (the credit), for [`Producer::observe_head`](gpulmt_protocols::gio::Producer::observe_head).
    pub fn load_head(&self) -> u64 {
        // Acquire, pairs with publish_head: the proxy read (took) every slot below it
        // before it published the head, so the producer may overwrite them. Scope: system
        // (a GPU producer uses ld.acquire.sys).
        self.word(HEAD_AT).load(Ordering::Acquire)
    }

    /// The completion counters.
    pub fn load_cq(&self) -> CqSnapshot {
        // Acquire, pairs with publish_cq's release store of done: the ops below done are
        // complete (their data landed, the proxy saw MPI finish them) and their failure
        // details are written. Scope: system.
        let done = self.word(CQ_AT).load(Ordering::Acquire);
        // Relaxed, pairs with publish_cq's store before its release of done: it may count
        // failures past this `done` already (a benign race: a newer value, never older).
        let failed = self.word(CQ_AT + 8).load(Ordering::Relaxed);
        // Acquire, pairs with publish_cq's release store of the error word: its seq.
        let err_word = self.word(CQ_AT + 24).load(Ordering::Acquire);
        let first_error = match err_word {
            0 => None,
            // Relaxed, pairs with publish_cq: ordered by the acquire of the error word.
            w => ErrorRecord::from_words([self.word(CQ_AT + 16).load(Ordering::Relaxed), w]),
        };
        CqSnapshot { done, failed, first_error }
    }

    /// Why the queue takes no more packets, if it does not.
    pub fn state(&self) -> QueueState {
        // Acquire, pairs with set_state: the error completions published with the state.
        // Scope: system.
        QueueState::from_word(self.word(STATE_AT).load(Ordering::Acquire))
    }

    /// Takes the failure details of ops below `done`.
    pub fn take_details(&self, done: u64) -> Vec<(u64, FailureDetail)> {
        let mut d = self.details();
        let later = d.split_off(&done);
        std::mem::replace(&mut *d, later).into_iter().collect()
    }

    /// Makes this a queue whose ops are reported one by one as they end (before the
    /// proxy starts: it reads this when it sets the queue up).
    pub fn report_each_op(&self) {
        // Relaxed: written before the proxy thread is spawned, which orders it.
        self.each_op.store(true, Ordering::Relaxed);
    }

    /// Whether ops are reported one by one ([`report_each_op`](Self::report_each_op)).
    pub fn reports_each_op(&self) -> bool {
        // Relaxed: see report_each_op.
        self.each_op.load(Ordering::Relaxed)
    }

    /// The ops that ended since the last call, and each failure's story. The queue's
    /// push and pop order the proxy's view of the op (its data landed) before ours.
    pub fn take_ended(&self) -> Vec<(u64, Option<FailureDetail>)> {
        let mut out = Vec::new();
        while let Some(seq) = self.ended.pop() {
            out.push(seq);
        }
        if out.is_empty() {
            return Vec::new();
        }
        let mut d = self.details();
        out.into_iter().map(|seq| (seq, d.remove(&seq))).collect()
    }

    fn details(&self) -> MutexGuard<'_, BTreeMap<u64, FailureDetail>> {
        self.details.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---- proxy side ----

    /// The doorbell.
    pub fn load_tail(&self) -> u64 {
        // Acquire, pairs with ring_doorbell: the packets committed before the tail.
        // Scope: system (a GPU producer rings it with st.release.sys).
        self.word(TAIL_AT).load(Ordering::Acquire)
    }

    /// The commit word of slot `index`.
    pub fn load_commit(&self, index: usize) -> u64 {
        // Acquire, pairs with commit: once the commit bit is the expected lap's, words 1-7
        // and the control bytes read after this are the packet's.
        self.slot_word(index, 0).load(Ordering::Acquire)
    }

    /// Reads the whole packet of slot `index` (commit word again, then the body).
    pub fn read_slot(&self, index: usize) -> RawPacket {
        let mut raw = RawPacket::default();
        raw.words[0] = self.load_commit(index);
        for w in 1..PACKET_WORDS {
            // Relaxed, pairs with write_body: ordered after load_commit's acquire of the
            // commit word; a word of an older lap is read only if the commit bit is old
            // too, and then the packet is not taken (a benign race).
            raw.words[w] = self.slot_word(index, w).load(Ordering::Relaxed);
        }
        raw
    }

    /// Publishes the head: every slot below it was taken and may be reused.
    pub fn publish_head(&self, head: u64) {
        // Release, pairs with load_head: the proxy's reads of the taken slots (and their
        // control bytes) happen before the producer overwrites them. Scope: system.
        self.word(HEAD_AT).store(head, Ordering::Release);
    }

    /// Records the full story of a failed op, before `done` passes it.
    pub fn record_detail(&self, seq: u64, detail: FailureDetail) {
        self.details().insert(seq, detail);
    }

    /// Op `seq` of a queue that reports each op ended (after its failure's story, if any,
    /// was recorded).
    pub fn record_ended(&self, seq: u64) {
        self.ended.push(seq);
    }

    /// Publishes the counters.
    pub fn publish_cq(&self, cq: &CqSnapshot) {
        if let Some(e) = cq.first_error {
            let [seq, word] = e.to_words();
            // Relaxed, pairs with load_cq: published by the error word's release below.
            self.word(CQ_AT + 16).store(seq, Ordering::Relaxed);
            // Release, pairs with load_cq's acquire of the error word: its seq. Written
            // once: the first error never changes. Scope: system.
            self.word(CQ_AT + 24).store(word, Ordering::Release);
        }
        // Relaxed, pairs with load_cq: published by done's release below.
        self.word(CQ_AT + 8).store(cq.failed, Ordering::Relaxed);
        // Release, pairs with load_cq: everything the proxy saw of the completed ops
        // (data MPI or a copy engine wrote, failure details, the counters above) is
        // visible to whoever sees the new done. Scope: system (GPU producers poll it).
        self.word(CQ_AT).store(cq.done, Ordering::Release);
    }

    /// Stops the queue for good (stall, corruption, shutdown).
    pub fn set_state(&self, state: QueueState) {
        // Release, pairs with state(): the error completions published before it are
        // visible with the state. Scope: system.
        self.word(STATE_AT).store(state as u64, Ordering::Release);
    }
}

impl Drop for QueueMem {
    fn drop(&mut self) {
        // SAFETY: the last owner is gone: neither the proxy nor a producer can touch the
        // queue, and no copy ever reads or writes it.
        if let Err(e) = unsafe { self.backend.free_host_mapped(self.mem.host) } {
            tracing::warn!(queue = self.index, error = %e, "freeing a GIO queue's memory");
        }
    }
}

impl std::fmt::Debug for QueueMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueMem").field("index", &self.index).field("slots", &self.slots).finish_non_exhaustive()
    }
}
