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
//! A signal in host memory is updated atomically with release ordering; one in device
//! memory is written by the copy engine after the data's copies finished (an `Add` there
//! reads, adds and writes back, one device signal update at a time in this proxy, so two
//! ranks' adds to one word both count; a kernel writing the same word meanwhile is not
//! ordered with it).
//!
//! # How an AMO stays atomic
//! Every AMO that reaches this rank from another node is applied by this one thread, one
//! at a time, when its request is handled:
//! - **host memory, and sim's device memory** (host memory of this process): one atomic
//!   instruction of the host on the word (`AtomicU64`, acquire-release), so it is atomic
//!   against every other access to the word that is atomic itself: other ranks' AMOs
//!   through this proxy, this rank's host `sym_atomic_*`, the on-node peers' host atomics
//!   (the same shared memory), and the proxy's signal adds;
//! - **CUDA device memory**: the host has no atomic instruction on device memory
//!   (PCIe atomics are not exposed to it), so the proxy reads the word with the copy
//!   engine, computes, and writes it back, waiting for each copy, and never while a
//!   device signal update of its own runs. It is therefore atomic against the other
//!   off-node AMOs and signal updates to this PE (all serialised here), and **not**
//!   against the target GPU's own atomics on the same word (a kernel's `atomicAdd`, or an
//!   on-node peer's direct AMO, may fall between the read and the write).
//!   docs/memory-model.md ("Atomicity") states this limit: a word that off-node PEs update
//!   atomically must not be updated atomically by the device path at the same time.

use std::sync::atomic::{AtomicU64, Ordering};

use gpulmt_protocols::gio::{AmoOp, BadPacket, OpCode, SignalOp, Window};
use gpulmt_protocols::Rank;

use super::net::Owner;
use super::Proxy;
use crate::device::{Backend, BackendKind, CopyTicket, MemoryKind};
use crate::net::stream::{Dir, Place, Stream, StreamError, NET_LANE};
use crate::net::wire::{AmKind, AmReply, AmRequest, AM_INLINE, REPLY_TAG};

/// Reply status: the target's proxy failed to move the data (network or copy error).
pub(super) const REPLY_TARGET_FAILED: u32 = 1000;

/// Where a PUT_SIGNAL's signal update stands.
enum Signal {
    /// No signal (a PUT, a GET, or a refused request).
    None,
    /// To do once the data is in place.
    Pending { addr: usize, value: u64, op: SignalOp, kind: MemoryKind },
    /// Device memory, `Add`: reading the old value.
    Reading { ticket: CopyTicket, word: Box<u64>, addr: usize, value: u64, dev: u32 },
    /// Device memory: writing the new value.
    Writing { ticket: CopyTicket, _word: Box<u64> },
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
    /// An AMO to apply: the word's address and memory.
    amo: Option<(usize, MemoryKind)>,
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
            amo: None,
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
            (AmKind::Amo { .. }, 0, _) => t.amo = Some((addr, kind)),
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
        if !t.signal_step(&self.net.backend, &mut self.device_signal_busy) {
            return work;
        }
        if let Some((addr, kind)) = t.amo {
            if self.device_signal_busy {
                // A device signal update reads and writes a word with the copy engine;
                // the AMO's own read-modify-write waits for it (see the module docs).
                return work;
            }
            let AmKind::Amo { amo, operand, compare } = t.am.kind else { unreachable!("set for AMOs only") };
            t.amo = None;
            // SAFETY: `addr` is an aligned word inside this rank's window (checked when
            // the request arrived), valid while the window is exposed.
            match unsafe { apply_amo(&self.net.backend, addr, kind, amo, operand, compare) } {
                Ok(old) => t.reply_inline = Some(old.to_le_bytes().to_vec()),
                Err(e) => t.fail(format!("applying an atomic: {e}")),
            }
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

/// The new value of a word that held `old` after `amo` (None: not written).
pub(super) fn amo_result(amo: AmoOp, old: u64, operand: u64, compare: u64) -> Option<u64> {
    match amo {
        AmoOp::FetchAdd => Some(old.wrapping_add(operand)),
        AmoOp::CompareSwap => (old == compare).then_some(operand),
        AmoOp::Set => Some(operand),
        AmoOp::Fetch => None,
    }
}

/// Applies `amo` to the word at `addr` of memory `kind`; returns its old value. The
/// module docs say how it is atomic on each memory.
///
/// # Safety
/// `addr` is an 8-byte aligned word valid for reads and writes in memory of `kind`, and
/// every host access to it is atomic.
unsafe fn apply_amo(
    backend: &Backend,
    addr: usize,
    kind: MemoryKind,
    amo: AmoOp,
    operand: u64,
    compare: u64,
) -> Result<u64, String> {
    match (kind, backend.kind()) {
        (MemoryKind::Host, _) | (MemoryKind::Device(_), BackendKind::Sim) => {
            // SAFETY: the caller's contract: an aligned word of this process's memory
            // (sim's device memory is host memory), touched atomically only.
            let word = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
            // AcqRel: the AMO is ordered after what the initiator's earlier fenced ops
            // wrote here, and before what a reader that sees its value reads. Scope: host.
            Ok(match amo {
                AmoOp::FetchAdd => word.fetch_add(operand, Ordering::AcqRel),
                AmoOp::CompareSwap => {
                    word.compare_exchange(compare, operand, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|v| v)
                }
                AmoOp::Set => word.swap(operand, Ordering::AcqRel),
                AmoOp::Fetch => word.load(Ordering::Acquire),
            })
        }
        (MemoryKind::Device(dev), BackendKind::Cuda) => {
            let mut old = 0u64;
            // SAFETY: the device word is the caller's; `old` is a local held until the
            // copy finished (device_copy waits for it).
            unsafe { device_copy(backend, dev, &mut old as *mut u64 as usize, addr)? };
            if let Some(new) = amo_result(amo, old, operand, compare) {
                // SAFETY: as for the read, in the other direction.
                unsafe { device_copy(backend, dev, addr, &new as *const u64 as usize)? };
            }
            Ok(old)
        }
    }
}

/// Copies one 8-byte word between the host and device memory of `dev` and waits for it.
///
/// # Safety
/// Both addresses are valid 8-byte words for the copy's direction until it returns.
unsafe fn device_copy(backend: &Backend, dev: u32, dst: usize, src: usize) -> Result<(), String> {
    // SAFETY: the caller's contract; the wait below keeps both words in use until done.
    let ticket = unsafe { backend.copy_async(dev, NET_LANE, dst, src, 8) }.map_err(|e| e.to_string())?;
    loop {
        match backend.copy_poll(ticket) {
            Ok(true) => return Ok(()),
            Ok(false) => std::hint::spin_loop(),
            Err(e) => return Err(e.to_string()),
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

    /// Moves the signal update on; true once there is nothing (more) to do. `busy` is
    /// the proxy's one device signal update in flight: a device update waits for it, so
    /// read-add-write updates of one word never interleave.
    fn signal_step(&mut self, backend: &crate::device::Backend, busy: &mut bool) -> bool {
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
                Signal::Pending { addr, value, op, kind: MemoryKind::Device(dev) } if *busy => {
                    self.signal = Signal::Pending { addr, value, op, kind: MemoryKind::Device(dev) };
                    return false;
                }
                Signal::Pending { addr, value, op, kind: MemoryKind::Device(dev) } => {
                    *busy = true;
                    let word = Box::new(value);
                    let at = &*word as *const u64 as usize;
                    // SAFETY: the device word is inside the window (checked, 8 bytes); the
                    // host word is boxed and held with the ticket until the copy finishes.
                    // The data's copies finished before (this runs once they did).
                    let copy = unsafe {
                        match op {
                            SignalOp::Set => backend.copy_async(dev, NET_LANE, addr, at, 8),
                            SignalOp::Add => backend.copy_async(dev, NET_LANE, at, addr, 8),
                        }
                    };
                    match (copy, op) {
                        (Ok(ticket), SignalOp::Set) => self.signal = Signal::Writing { ticket, _word: word },
                        (Ok(ticket), SignalOp::Add) => self.signal = Signal::Reading { ticket, word, addr, value, dev },
                        (Err(e), _) => {
                            *busy = false;
                            self.fail(format!("writing the signal: {e}"));
                        }
                    }
                }
                Signal::Reading { ticket, mut word, addr, value, dev } => match backend.copy_poll(ticket) {
                    Ok(false) => {
                        self.signal = Signal::Reading { ticket, word, addr, value, dev };
                        return false;
                    }
                    Err(e) => {
                        *busy = false;
                        self.fail(format!("reading the signal: {e}"));
                    }
                    Ok(true) => {
                        *word = word.wrapping_add(value);
                        let at = &*word as *const u64 as usize;
                        // SAFETY: as for the read: the device word inside the window, the
                        // boxed host word held with the ticket.
                        match unsafe { backend.copy_async(dev, NET_LANE, addr, at, 8) } {
                            Ok(ticket) => self.signal = Signal::Writing { ticket, _word: word },
                            Err(e) => {
                                *busy = false;
                                self.fail(format!("writing the signal: {e}"));
                            }
                        }
                    }
                },
                Signal::Writing { ticket, _word } => match backend.copy_poll(ticket) {
                    Ok(false) => {
                        self.signal = Signal::Writing { ticket, _word };
                        return false;
                    }
                    Ok(true) => {
                        *busy = false;
                        return true;
                    }
                    Err(e) => {
                        *busy = false;
                        self.fail(format!("writing the signal: {e}"));
                    }
                },
            }
        }
    }
}
