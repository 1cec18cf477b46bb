//! A host thread's producer handle of one GIO send queue: it reserves a slot under the
//! credit rule, writes the packet, commits it and rings the doorbell (the protocols'
//! [`Producer`](gpulmt_protocols::gio::Producer) decides; [`QueueMem`] does the stores),
//! reads completions, and offers the one-sided API (put, put-with-signal, get, atomics,
//! fence, quiet) over it.
//!
//! One handle per posting thread: the context's thread holds the first queue (two-sided
//! traffic); any other thread claims one from the path ([`NetPath::queue`]). Dropping the
//! handle gives the queue back; a later claimer continues at its positions.
//!
//! [`NetPath::queue`]: super::NetPath::queue

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{
    slot_index, AmoOp, CqSnapshot, Flags, Op, Packet, Quiet, QuietStatus, SignalOp, MAX_TARGET, PACKET_WORDS,
};
use gpulmt_protocols::Rank;
use rustc_hash::FxHashMap;

use super::queue::{FailureDetail, QueueMem, QueueState};
use super::shared::{ProducerState, Shared};
use super::wire::CTRL_MAX;
use crate::device::MemoryKind;
use crate::offnode::{NetError, PostError};

/// A window's number: the same at every rank (windows are registered collectively, in
/// one order).
pub type WindowId = u32;

/// The ranks a path reaches, and how a packet names them: a target index per rank, and
/// per window a block of them (`docs/internode.md`, "Templates").
///
/// Template `t` is rank `ranks[t]` for two-sided ops; template `t + n * (w + 1)` is the
/// same rank's window `w` (n = number of ranks).
#[derive(Debug)]
pub struct Targets {
    ranks: Vec<Rank>,
    index: FxHashMap<Rank, u32>,
}

impl Targets {
    pub fn new(ranks: &[Rank]) -> Targets {
        let index = ranks.iter().enumerate().map(|(i, &r)| (r, i as u32)).collect();
        Targets { ranks: ranks.to_vec(), index }
    }

    /// The ranks, by target index.
    pub fn ranks(&self) -> &[Rank] {
        &self.ranks
    }

    /// The two-sided template of `rank`.
    pub fn two_sided(&self, rank: Rank) -> Option<u32> {
        self.index.get(&rank).copied()
    }

    /// The template of `rank`'s window `window`, if it can be named.
    pub fn window(&self, rank: Rank, window: WindowId) -> Option<u32> {
        let t = self.two_sided(rank)? as u64;
        let i = t + self.ranks.len() as u64 * (window as u64 + 1);
        (i <= MAX_TARGET as u64).then_some(i as u32)
    }
}

/// Why a quiet did not end well.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuietError {
    #[error("op {seq} of this queue failed: {text}")]
    Failed { seq: u64, text: String },
    #[error("quiet timed out: {done} of {until} ops of this queue completed")]
    TimedOut { done: u64, until: u64 },
}

/// A host producer of one queue. Not `Sync`: one thread posts at a time.
pub struct HostQueue {
    shared: Arc<Shared>,
    targets: Arc<Targets>,
    index: usize,
    mem: Arc<QueueMem>,
    state: Option<ProducerState>,
    /// How long a blocking post waits for credit.
    post_timeout: Duration,
    /// The queue's tail when this handle claimed it: failures below belong to an
    /// earlier owner.
    since: u64,
    /// The CQ's failure count last reported by a quiet (or at claim).
    failed_seen: u64,
}

/// A CTRL packet to post: its length, and the encoder that writes exactly that many
/// bytes into the slot's control slab entry.
pub struct CtrlBytes<'a> {
    pub len: usize,
    pub encode: &'a mut dyn FnMut(&mut [u8]),
}

/// What a posted packet carries.
pub enum Body<'a> {
    /// A data or one-sided op, as the caller built it.
    Op(Op),
    /// Control bytes, encoded into the slot's control slab entry once the slot is
    /// reserved; the packet's `CTRL` op then points there.
    Ctrl(CtrlBytes<'a>),
}

impl HostQueue {
    pub(crate) fn claim(shared: &Arc<Shared>, targets: &Arc<Targets>, post_timeout: Duration) -> Option<HostQueue> {
        let (index, state) = shared.set.claim()?;
        let mem = shared.set.queues[index].clone();
        let (since, failed_seen) = (state.producer.tail(), mem.load_cq().failed);
        Some(HostQueue {
            shared: shared.clone(),
            targets: targets.clone(),
            index,
            mem,
            state: Some(state),
            post_timeout,
            since,
            failed_seen,
        })
    }

    fn st(&mut self) -> &mut ProducerState {
        self.state.as_mut().expect("a live handle holds its producer state")
    }

    /// The queue's number in the set.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The queue's memory (for the device view, and tests).
    pub fn mem(&self) -> &Arc<QueueMem> {
        &self.mem
    }

    /// Ops posted so far: the next op's sequence number.
    pub fn tail(&self) -> u64 {
        self.state.as_ref().map_or(0, |s| s.producer.tail())
    }

    /// The completion counters.
    pub fn cq(&self) -> CqSnapshot {
        self.mem.load_cq()
    }

    /// Takes the failure details of completed ops (below the `done` of a [`cq`](Self::cq)).
    pub fn take_failures(&self, done: u64) -> Vec<(u64, FailureDetail)> {
        self.mem.take_details(done)
    }

    /// Posts one packet, or says the ring is full. A [`Body::Ctrl`] is encoded straight
    /// into the slot's control slab entry (only once the slot is reserved), and the packet
    /// points there. Returns the op's sequence number.
    pub fn try_post(&mut self, body: Body<'_>, flags: Flags, target: u32) -> Result<u64, PostError> {
        match self.mem.state() {
            QueueState::Open => {}
            state => {
                return Err(PostError::Failed(NetError::Down(format!(
                    "GIO queue {} takes no more packets ({state:?})",
                    self.index
                ))))
            }
        }
        if let Body::Ctrl(CtrlBytes { len, .. }) = body {
            if len == 0 || len > CTRL_MAX {
                return Err(PostError::Failed(NetError::Rejected(format!(
                    "a control packet of {len} bytes: the internode path carries 1 to {CTRL_MAX}"
                ))));
            }
        }
        let pos = self.reserve()?;
        let mem = self.mem.clone();
        let st = self.st();
        let slots = st.producer.slots();
        let idx = slot_index(pos, slots);
        let op = match body {
            Body::Ctrl(CtrlBytes { len, encode }) => {
                let at = mem.ctrl_slot(idx);
                // SAFETY: the slot's control entry (CTRL_MAX >= len bytes) is this
                // producer's: the credit covers position `pos`, so the proxy copied out the
                // previous lap's bytes before it published the head this producer acquired
                // (load_head); nothing else writes or reads it until the commit below.
                encode(unsafe { std::slice::from_raw_parts_mut(at as *mut u8, len) });
                Op::Ctrl { src: at as u64, size: len as u64 }
            }
            Body::Op(op) => op,
        };
        let raw = Packet { op, flags, target, cookie: pos }.encode(pos, slots);
        let mut body = [0u64; PACKET_WORDS - 1];
        body.copy_from_slice(&raw.words[1..]);
        mem.write_body(idx, &body);
        mem.commit(idx, raw.words[0]);
        mem.ring_doorbell(st.producer.tail());
        self.shared.idle.wake();
        Ok(pos)
    }

    /// Reserves the next position, reading the consumer's head only when the ring looks
    /// full (the credit rule).
    fn reserve(&mut self) -> Result<u64, PostError> {
        let mem = self.mem.clone();
        let st = self.st();
        match st.producer.try_reserve() {
            Ok(pos) => Ok(pos),
            Err(_full) => {
                st.producer
                    .observe_head(mem.load_head())
                    .map_err(|e| PostError::Failed(NetError::Rejected(e.to_string())))?;
                st.producer.try_reserve().map_err(|_| PostError::NoResource)
            }
        }
    }

    /// [`try_post`](Self::try_post), waiting for credit up to the post timeout.
    pub fn post(&mut self, op: Op, flags: Flags, target: u32) -> Result<u64, PostError> {
        let deadline = Instant::now() + self.post_timeout;
        let mut backoff = Backoff::default();
        loop {
            match self.try_post(Body::Op(op), flags, target) {
                Err(PostError::NoResource) if Instant::now() < deadline => backoff.wait(),
                Err(PostError::NoResource) => {
                    return Err(PostError::Failed(NetError::Down(format!(
                        "GIO queue {} stayed full for {:?}: the proxy takes nothing",
                        self.index, self.post_timeout
                    ))))
                }
                other => return other,
            }
        }
    }

    fn window_target(&mut self, rank: Rank, window: WindowId) -> Result<(u32, Flags), PostError> {
        let t = self.targets.window(rank, window).ok_or_else(|| {
            PostError::Failed(NetError::Rejected(format!("rank {rank} is not reached by the internode path")))
        })?;
        Ok((t, self.st().fence.flags_for(rank)))
    }

    fn device_flag(mem: MemoryKind, flag: Flags) -> Flags {
        match mem {
            MemoryKind::Host => Flags::NONE,
            MemoryKind::Device(_) => flag,
        }
    }

    /// Writes `len` bytes at `src` into `rank`'s window `window` at `offset`; complete
    /// (visible at the target) once a later [`quiet`](Self::quiet) returns.
    ///
    /// # Safety
    /// `src..src + len` is readable memory of the kind `mem` names, unmodified until
    /// the op completes.
    pub unsafe fn put_nbi(
        &mut self,
        rank: Rank,
        window: WindowId,
        offset: u64,
        src: usize,
        len: usize,
        mem: MemoryKind,
    ) -> Result<u64, PostError> {
        let (t, fence) = self.window_target(rank, window)?;
        let op = Op::Put { src: src as u64, dst_offset: offset, size: len as u64 };
        self.post(op, fence.union(Self::device_flag(mem, Flags::SRC_DEVICE)), t)
    }

    /// [`put_nbi`](Self::put_nbi), then updates the 8-byte signal word at
    /// `signal_offset` of the same window by `signal_op` with `value`, after the data.
    ///
    /// # Safety
    /// As [`put_nbi`](Self::put_nbi).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn put_signal_nbi(
        &mut self,
        rank: Rank,
        window: WindowId,
        offset: u64,
        src: usize,
        len: usize,
        mem: MemoryKind,
        signal_offset: u64,
        value: u64,
        signal_op: SignalOp,
    ) -> Result<u64, PostError> {
        let (t, fence) = self.window_target(rank, window)?;
        let op = Op::PutSignal {
            src: src as u64,
            dst_offset: offset,
            size: len as u64,
            signal_offset,
            signal_value: value,
            signal_op,
        };
        self.post(op, fence.union(Self::device_flag(mem, Flags::SRC_DEVICE)), t)
    }

    /// Reads `len` bytes at `offset` of `rank`'s window `window` into `dst`; complete
    /// once a later [`quiet`](Self::quiet) returns.
    ///
    /// # Safety
    /// `dst..dst + len` is writable memory of the kind `mem` names, unused until the op
    /// completes.
    pub unsafe fn get_nbi(
        &mut self,
        rank: Rank,
        window: WindowId,
        offset: u64,
        dst: usize,
        len: usize,
        mem: MemoryKind,
    ) -> Result<u64, PostError> {
        let (t, fence) = self.window_target(rank, window)?;
        let op = Op::Get { dst: dst as u64, src_offset: offset, size: len as u64 };
        self.post(op, fence.union(Self::device_flag(mem, Flags::DST_DEVICE)), t)
    }

    /// A 64-bit atomic on the aligned word at `offset` of `rank`'s window `window`: the
    /// target's proxy applies `amo` (with `operand`, and `compare` for a compare-swap) and
    /// its old value is written to `result` (0: not wanted; required for a fetch) before
    /// the op completes (a later [`quiet`](Self::quiet)).
    ///
    /// # Safety
    /// A non-zero `result` is a writable 8-byte word of the kind `mem` names, unused until
    /// the op completes.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn amo_nbi(
        &mut self,
        rank: Rank,
        window: WindowId,
        offset: u64,
        amo: AmoOp,
        operand: u64,
        compare: u64,
        result: usize,
        mem: MemoryKind,
    ) -> Result<u64, PostError> {
        let (t, fence) = self.window_target(rank, window)?;
        let op = Op::Amo { amo, offset, operand, compare, result: result as u64 };
        let flags = match result {
            0 => fence,
            _ => fence.union(Self::device_flag(mem, Flags::DST_DEVICE)),
        };
        self.post(op, flags, t)
    }

    /// Orders this queue's later ops to each rank after its earlier ones to that rank.
    pub fn fence(&mut self) {
        self.st().fence.fence();
    }

    /// Waits until every op posted so far has completed (one-sided ones: visible at
    /// their target), up to `deadline`. Reports the first of the ops that failed since
    /// the last quiet (or the claim), with the proxy's text; the next quiet starts clean.
    ///
    /// This differs from the CQ's sticky first error ([`Quiet`]'s rule, for device
    /// producers that read one record): a host handle knows the failure count at its last
    /// quiet, and the queue holds every failure's text, so a queue stays usable after a
    /// failed op (and a queue claimed again does not inherit its last owner's error).
    pub fn quiet(&mut self, deadline: Instant) -> Result<(), QuietError> {
        let mut q = Quiet::new(self.tail(), Some(deadline));
        let mut backoff = Backoff::default();
        loop {
            q.handle_timeout(Instant::now());
            let cq = self.cq();
            match q.poll(&cq) {
                QuietStatus::Pending => {
                    // The proxy takes the completions: it must not sleep while we wait.
                    self.shared.idle.waiting();
                    backoff.wait()
                }
                QuietStatus::TimedOut { done, until } => return Err(QuietError::TimedOut { done, until }),
                QuietStatus::Done | QuietStatus::Failed(_) => {
                    // done reached the tail, and nothing else posts on this queue: the
                    // count covers exactly the ops below the tail.
                    if cq.failed == self.failed_seen {
                        return Ok(());
                    }
                    self.failed_seen = cq.failed;
                    let since = self.since;
                    let first = self.mem.take_details(cq.done).into_iter().find(|&(seq, _)| seq >= since);
                    let (seq, text) = first.map_or_else(
                        || (cq.done, "an op failed (its text was taken already)".into()),
                        |(seq, d)| (seq, d.text),
                    );
                    return Err(QuietError::Failed { seq, text });
                }
            }
        }
    }
}

#[cfg(test)]
impl HostQueue {
    /// Commits the words `make(pos, slots)` gives at the next position (any bits: tests
    /// of bad packets), rings the doorbell; returns the position.
    pub(crate) fn post_raw(&mut self, make: impl FnOnce(u64, u64) -> [u64; PACKET_WORDS]) -> u64 {
        let pos = retry_reserve(self);
        let mem = self.mem.clone();
        let st = self.st();
        let words = make(pos, st.producer.slots());
        let idx = slot_index(pos, st.producer.slots());
        let mut body = [0u64; PACKET_WORDS - 1];
        body.copy_from_slice(&words[1..]);
        mem.write_body(idx, &body);
        mem.commit(idx, words[0]);
        mem.ring_doorbell(st.producer.tail());
        self.shared.idle.wake();
        pos
    }

    /// Reserves the next position and rings the doorbell without committing it: a
    /// producer that stops mid-queue. Returns the position.
    pub(crate) fn reserve_without_commit(&mut self) -> u64 {
        let pos = retry_reserve(self);
        let mem = self.mem.clone();
        mem.ring_doorbell(self.st().producer.tail());
        self.shared.idle.wake();
        pos
    }
}

#[cfg(test)]
fn retry_reserve(q: &mut HostQueue) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match q.reserve() {
            Ok(pos) => return pos,
            Err(PostError::NoResource) if Instant::now() < deadline => std::thread::yield_now(),
            Err(e) => panic!("no room in the ring: {e}"),
        }
    }
}

impl Drop for HostQueue {
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            self.shared.set.release(self.index, state);
        }
    }
}

/// Waiting without burning a shared CPU: spin a little, then yield, then sleep up to
/// 50 us.
#[derive(Default)]
pub(crate) struct Backoff {
    rounds: u32,
}

impl Backoff {
    pub fn wait(&mut self) {
        self.rounds += 1;
        match self.rounds {
            0..=32 => std::hint::spin_loop(),
            33..=64 => std::thread::yield_now(),
            n => std::thread::sleep(Duration::from_micros(1 << ((n - 64) / 8).min(6)).min(Duration::from_micros(50))),
        }
    }
}
