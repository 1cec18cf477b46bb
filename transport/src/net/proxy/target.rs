//! Other ranks' one-sided ops on this rank's windows: the target's half of PUT,
//! PUT_SIGNAL, GET and AMO.
//!
//! A request is checked against the window table before anything is touched (a window
//! that does not exist, a range outside it, a misaligned signal are answered with the
//! [`BadPacket`] code and nothing is read or written; a refused PUT's data, already on its
//! way, is received and dropped). Then the data is written (or read), a PUT_SIGNAL's
//! signal is updated once the data is in place, and only then the reply goes back: the
//! initiator's completion means "visible here".
//!
//! A signal is updated once the data's copies finished: in host memory atomically with
//! release ordering; in device memory a `Set` by the copy engine, an `Add` by the device
//! itself (below).
//!
//! # How an AMO stays atomic
//! Every AMO (and signal `Add`) that reaches this rank from another node is one
//! [`WordAtomic`]:
//! - **host memory**: one atomic instruction of the host on the word (`AtomicU64`,
//!   acquire-release), atomic against every other atomic access to it: other ranks' AMOs
//!   through this proxy, this rank's host `sym_atomic_*`, the on-node peers' host atomics
//!   (the same shared memory);
//! - **device memory**: the device makes it (`DeviceBackend::word_atomic_start`): on CUDA
//!   a thread of the rank's copy server with one system-scope atomic instruction, so it is
//!   atomic against the GPU's own atomics on the word too (a kernel's `atomicAdd`, an
//!   on-node peer's direct AMO over NVLink); the host has no atomic instruction on device
//!   memory, and a read and write by the copy engine lost adds that fell between them
//!   (21 of 24576 in issue 28's first run). On the sim, device memory is host memory and
//!   the atomic is the host's.

use std::sync::atomic::{AtomicU64, Ordering};

use gpulmt_protocols::gio::{AmoOp, BadPacket, OpCode, SignalOp, Window};
use gpulmt_protocols::Rank;

use super::net::Owner;
use super::Proxy;
use crate::device::{AtomicTicket, Backend, CopyTicket, MemoryKind, WordAtomic};
use crate::net::stream::{Dir, Place, Stream, StreamError, NET_LANE};
use crate::net::wire::{AmKind, AmReply, AmRequest, AM_INLINE, REPLY_TAG};

/// Reply status: the target's proxy failed to move the data (network or copy error).
pub(super) const REPLY_TARGET_FAILED: u32 = 1000;

/// Where a PUT_SIGNAL's signal update stands.
enum Signal {
    /// No signal (a PUT, a GET, or a refused request).
    None,
    /// To do once the data is in place (device memory, `Add`: until the device takes it).
    Pending { addr: usize, value: u64, op: SignalOp, kind: MemoryKind },
    /// Device memory, `Set`: the copy engine writing the new value.
    Writing { ticket: CopyTicket, _word: Box<u64> },
    /// Device memory, `Add`: the device's atomic.
    Adding(AtomicTicket),
}

/// Where an AMO stands.
enum Amo {
    /// None (not an AMO, a refused one, or applied).
    None,
    /// To apply once the request is handled: the word's address and memory.
    Ready { addr: usize, kind: MemoryKind, op: WordAtomic },
    /// Device memory: the device's atomic in flight.
    Running(AtomicTicket),
}

/// The word atomic an AMO request asks for.
fn word_atomic(amo: AmoOp, operand: u64, compare: u64) -> WordAtomic {
    match amo {
        AmoOp::FetchAdd => WordAtomic::FetchAdd(operand),
        AmoOp::CompareSwap => WordAtomic::CompareSwap { expected: compare, desired: operand },
        AmoOp::Set => WordAtomic::Swap(operand),
        AmoOp::Fetch => WordAtomic::Fetch,
    }
}

/// One request of another rank on this rank's windows.
pub(super) struct TargetOp {
    from: Rank,
    am: AmRequest,
    /// 0 while all is well; else the reply's status.
    status: u32,
    /// The data transfer (a large PUT's in, a large GET's out).
    pub data: Option<Stream>,
    /// A copy of inline bytes between the message and device memory, and the bytes.
    copy: Option<(CopyTicket, Vec<u8>)>,
    signal: Signal,
    amo: Amo,
    /// A small GET's bytes (an AMO's old value), for the reply.
    reply_inline: Option<Vec<u8>>,
}

impl Proxy {
    /// Checks `am` against the window table: the status, and the address and memory of
    /// its range when the status is 0.
    fn check_request(&self, am: &AmRequest) -> (u32, usize, MemoryKind) {
        let op = match am.kind {
            AmKind::Put => OpCode::Put,
            AmKind::PutSignal { .. } => OpCode::PutSignal,
            AmKind::Get => OpCode::Get,
            AmKind::Amo { .. } => OpCode::Amo,
        };
        let refuse = |bad: BadPacket| (bad.code(), 0, MemoryKind::Host);
        let Some(w) = self.windows.get(am.window as usize).copied().flatten() else {
            return refuse(BadPacket::NoWindow { op, target: am.window });
        };
        let window = Window { id: am.window, base: w.base as u64, size: w.size };
        let outside = |offset, size| BadPacket::OutOfWindow { op, target: am.window, offset, size, window: w.size };
        let Some(addr) = window.address_of(am.offset, am.size) else {
            return refuse(outside(am.offset, am.size));
        };
        let word = match am.kind {
            AmKind::PutSignal { signal_offset, .. } => Some(signal_offset),
            AmKind::Amo { .. } => Some(am.offset),
            _ => None,
        };
        if let Some(signal_offset) = word {
            match window.address_of(signal_offset, 8) {
                None => return refuse(outside(signal_offset, 8)),
                Some(a) if a % 8 != 0 => return refuse(BadPacket::Misaligned { op, offset: signal_offset }),
                Some(_) => {}
            }
        }
        (0, addr as usize, w.mem)
    }

    /// A one-sided request from `source` arrived.
    pub(super) fn on_request(&mut self, source: Rank, msg: &[u8]) {
        let Some((am, inline)) = AmRequest::decode(msg) else {
            return tracing::error!(source, len = msg.len(), "GIO proxy: malformed one-sided request dropped");
        };
        let (status, addr, kind) = self.check_request(&am);
        if status != 0 {
            tracing::error!(
                source,
                window = am.window,
                offset = am.offset,
                size = am.size,
                status,
                "GIO proxy refused a one-sided request from another rank: outside this rank's windows"
            );
        }
        if matches!(am.kind, AmKind::Amo { .. }) && am.size != 8 {
            return tracing::error!(source, size = am.size, "GIO proxy: an AMO request not of 8 bytes dropped");
        }
        let mut t = TargetOp {
            from: source,
            am,
            status,
            data: None,
            copy: None,
            signal: Signal::None,
            amo: Amo::None,
            reply_inline: None,
        };
        let pipe = self.net.pipe;
        let place = self.net.place_of(kind);
        let stream = |dir, addr, place| {
            // SAFETY: a window's range (checked inside it just above), valid while the
            // window is exposed (expose_window's contract), or nothing for Discard.
            Some(unsafe { Stream::new(dir, source, am.data_tag, addr, am.size, place, pipe) })
        };
        match (am.kind, status, am.inline) {
            (AmKind::Amo { amo, operand, compare }, 0, _) => {
                t.amo = Amo::Ready { addr, kind, op: word_atomic(amo, operand, compare) }
            }
            (AmKind::Amo { .. }, _, _) => {}
            (AmKind::Get, 0, false) => t.data = stream(Dir::Send, addr, place),
            (AmKind::Get, 0, true) => match kind {
                MemoryKind::Device(dev) if am.size > 0 => {
                    let buf = vec![0u8; am.size as usize];
                    // SAFETY: the source is inside the device window (checked); the
                    // destination is `buf`, held with the ticket until the copy finishes.
                    let copy =
                        unsafe { self.net.backend.copy_async(dev, NET_LANE, buf.as_ptr() as usize, addr, buf.len()) };
                    match copy {
                        Ok(ticket) => t.copy = Some((ticket, buf)),
                        Err(e) => t.fail(format!("copying a GET's data from the device: {e}")),
                    }
                }
                MemoryKind::Device(_) => t.reply_inline = Some(Vec::new()),
                MemoryKind::Host => {
                    let n = (am.size as usize).min(AM_INLINE);
                    t.reply_inline = Some(match n {
                        0 => Vec::new(),
                        // SAFETY: addr..addr+size lies inside the host window (checked),
                        // valid while exposed; n <= size.
                        _ => unsafe { std::slice::from_raw_parts(addr as *const u8, n) }.to_vec(),
                    });
                }
            },
            (AmKind::Get, _, _) => {}
            (_, 0, false) => t.data = stream(Dir::Recv, addr, place),
            (_, _, false) => t.data = stream(Dir::Recv, 0, Place::Discard),
            (_, 0, true) => match kind {
                MemoryKind::Device(dev) if !inline.is_empty() => {
                    let buf = inline.to_vec();
                    // SAFETY: the destination is inside the device window (checked); the
                    // source is `buf`, held with the ticket until the copy finishes.
                    let copy =
                        unsafe { self.net.backend.copy_async(dev, NET_LANE, addr, buf.as_ptr() as usize, buf.len()) };
                    match copy {
                        Ok(ticket) => t.copy = Some((ticket, buf)),
                        Err(e) => t.fail(format!("copying a PUT's data to the device: {e}")),
                    }
                }
                MemoryKind::Device(_) => {}
                MemoryKind::Host if inline.is_empty() => {}
                MemoryKind::Host => {
                    // SAFETY: addr..addr+size lies inside the host window (checked), valid
                    // while exposed; `inline` holds exactly size bytes (decode checks it).
                    unsafe { std::ptr::copy_nonoverlapping(inline.as_ptr(), addr as *mut u8, inline.len()) };
                }
            },
            (_, _, true) => {}
        }
        if let (AmKind::PutSignal { signal_offset, signal_value, signal_op }, 0) = (am.kind, t.status) {
            let addr = addr - am.offset as usize + signal_offset as usize;
            t.signal = Signal::Pending { addr, value: signal_value, op: signal_op, kind };
        }
        let key = self.new_key();
        self.targets.insert(key, t);
        self.advance_target(key);
    }

    /// Advances one request; sends its reply and forgets it once done. True if anything
    /// changed.
    fn advance_target(&mut self, key: u64) -> bool {
        let Some(t) = self.targets.get_mut(&key) else { return false };
        let mut work = false;
        if let Some(s) = t.data.as_mut() {
            work |= self.net.with_io(key, |io| s.advance(io));
            if let Some(result) = s.finished() {
                if let Err(e) = result {
                    t.fail(format!("the data transfer with rank {}: {e}", t.from));
                }
                t.data = None;
                work = true;
            }
        }
        if let Some((ticket, _)) = &t.copy {
            match self.net.backend.copy_poll(*ticket) {
                Ok(false) => {}
                Ok(done) => {
                    debug_assert!(done);
                    let (_, bytes) = t.copy.take().expect("checked above");
                    if t.am.kind == AmKind::Get {
                        t.reply_inline = Some(bytes);
                    }
                    work = true;
                }
                Err(e) => {
                    t.copy = None;
                    t.fail(format!("a staging copy of one-sided data: {e}"));
                }
            }
        }
        if t.data.is_some() || t.copy.is_some() {
            return work;
        }
        if !t.signal_step(&self.net.backend) || !t.amo_step(&self.net.backend) {
            return work;
        }
        let reply = AmReply { op: t.am.op, status: t.status };
        let mut buf = Vec::new();
        reply.encode(t.reply_inline.as_deref().unwrap_or(&[]), &mut buf);
        let from = t.from;
        match self.net.send(Owner::Reply, from, REPLY_TAG, &buf) {
            Ok(Some(req)) => {
                self.net.replies.insert(req, buf);
                self.targets.remove(&key);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::error!(rank = from, error = %e, "GIO proxy: a one-sided reply could not be sent; the initiator's op ends at its shutdown");
                self.targets.remove(&key);
            }
        }
        true
    }

    /// Advances this rank's ops and other ranks' requests.
    pub(super) fn advance(&mut self) -> bool {
        let mut work = self.advance_ops();
        let keys: Vec<u64> = self.targets.keys().copied().collect();
        for key in keys {
            work |= self.advance_target(key);
        }
        work
    }

    /// Shutdown past its deadline: ends every request's transfer; their replies report
    /// the failure.
    pub(super) fn cancel_targets(&mut self) {
        for t in self.targets.values_mut() {
            if let Some(s) = t.data.as_mut() {
                s.fail(StreamError::Cancelled, &mut *self.net.iface);
            }
            t.fail("cancelled at shutdown".into());
        }
    }
}

impl TargetOp {
    fn fail(&mut self, why: String) {
        if self.status == 0 {
            tracing::error!(
                rank = self.from,
                op = self.am.op,
                "GIO proxy: a one-sided op of another rank failed here: {why}"
            );
            self.status = REPLY_TARGET_FAILED;
            self.signal = Signal::None;
        }
    }

    /// Moves the signal update on; true once there is nothing (more) to do.
    fn signal_step(&mut self, backend: &Backend) -> bool {
        loop {
            match std::mem::replace(&mut self.signal, Signal::None) {
                Signal::None => return true,
                Signal::Pending { addr, value, op, kind: MemoryKind::Host } => {
                    // SAFETY: 8-aligned and inside the host window (checked when the
                    // request arrived), valid while exposed; the word is shared with the
                    // application, so it is touched atomically only.
                    let word = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
                    // Release, pairs with the application's acquire load of the signal:
                    // the data this proxy saw land (MPI or a copy engine finished it) is
                    // visible to whoever sees the new signal. Scope: the host.
                    match op {
                        SignalOp::Set => word.store(value, Ordering::Release),
                        SignalOp::Add => {
                            word.fetch_add(value, Ordering::Release);
                        }
                    }
                    return true;
                }
                Signal::Pending { addr, value, op: SignalOp::Set, kind: MemoryKind::Device(dev) } => {
                    let word = Box::new(value);
                    let at = &*word as *const u64 as usize;
                    // SAFETY: the device word is inside the window (checked, 8 bytes); the
                    // host word is boxed and held with the ticket until the copy finishes.
                    // The data's copies finished before (this runs once they did).
                    match unsafe { backend.copy_async(dev, NET_LANE, addr, at, 8) } {
                        Ok(ticket) => self.signal = Signal::Writing { ticket, _word: word },
                        Err(e) => self.fail(format!("writing the signal: {e}")),
                    }
                }
                Signal::Pending { addr, value, op: SignalOp::Add, kind: MemoryKind::Device(dev) } => {
                    // SAFETY: an aligned word inside the device window (checked when the
                    // request arrived), valid while the window is exposed; the host
                    // touches it through word atomics only.
                    match unsafe { backend.word_atomic_start(dev, addr, WordAtomic::FetchAdd(value)) } {
                        Ok(Some(ticket)) => self.signal = Signal::Adding(ticket),
                        Ok(None) => {
                            self.signal =
                                Signal::Pending { addr, value, op: SignalOp::Add, kind: MemoryKind::Device(dev) };
                            return false;
                        }
                        Err(e) => self.fail(format!("adding to the signal: {e}")),
                    }
                }
                Signal::Writing { ticket, _word } => match backend.copy_poll(ticket) {
                    Ok(false) => {
                        self.signal = Signal::Writing { ticket, _word };
                        return false;
                    }
                    Ok(true) => return true,
                    Err(e) => self.fail(format!("writing the signal: {e}")),
                },
                Signal::Adding(ticket) => match backend.word_atomic_poll(ticket) {
                    Ok(None) => {
                        self.signal = Signal::Adding(ticket);
                        return false;
                    }
                    Ok(Some(_)) => return true,
                    Err(e) => self.fail(format!("adding to the signal: {e}")),
                },
            }
        }
    }

    /// Moves the AMO on (see the module docs); true once there is nothing (more) to do,
    /// its old value then in `reply_inline`.
    fn amo_step(&mut self, backend: &Backend) -> bool {
        // A polled atomic stays Running until the device reports its old value.
        let polled = |ticket| match backend.word_atomic_poll(ticket) {
            Ok(None) => (Amo::Running(ticket), Ok(None)),
            done => (Amo::None, done),
        };
        let (next, outcome) = match std::mem::replace(&mut self.amo, Amo::None) {
            Amo::None => return true,
            Amo::Ready { addr, kind: MemoryKind::Host, op } => {
                // SAFETY: an aligned word inside this rank's host window (checked when the
                // request arrived), valid while exposed, shared with the application and
                // touched atomically only.
                let word = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
                (Amo::None, Ok(Some(op.apply(word))))
            }
            Amo::Ready { addr, kind: MemoryKind::Device(dev), op } => {
                // SAFETY: an aligned word inside this rank's device window (checked when
                // the request arrived), valid while the window is exposed; the host touches
                // it through word atomics only.
                match unsafe { backend.word_atomic_start(dev, addr, op) } {
                    Ok(Some(ticket)) => polled(ticket),
                    Ok(None) => (Amo::Ready { addr, kind: MemoryKind::Device(dev), op }, Ok(None)),
                    Err(e) => (Amo::None, Err(e)),
                }
            }
            Amo::Running(ticket) => polled(ticket),
        };
        self.amo = next;
        match outcome {
            Ok(None) => false,
            Ok(Some(old)) => {
                self.reply_inline = Some(old.to_le_bytes().to_vec());
                true
            }
            Err(e) => {
                self.fail(format!("applying an atomic: {e}"));
                true
            }
        }
    }
}
