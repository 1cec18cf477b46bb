//! Host-side operations on the symmetric heap: the host's equivalents of the device
//! API's put, get, put_signal, signal wait and atomics (`docs/device-api.md`), and what
//! the host reads of the device side (its context, its rejected accesses).
//!
//! Every operation checks its target before touching it: a PE of the job, a range
//! inside one live symmetric allocation, an aligned word for signals and atomics, a
//! PE whose heap this rank maps or reaches through the internode path. Then, to a
//! mapped heap:
//! - put and get are one copy through the backend (the copy engine on CUDA, over the
//!   IPC mapping of the peer's heap), complete when they return;
//! - put_2d and get_2d move strided blocks (Global Arrays' patches, `ga/`): the block is
//!   checked whole, then moved by one 2-D copy of the backend (`cuMemcpy2D` on CUDA); the
//!   `_nbi` ones are asynchronous copies on one in-order lane of this rank's engine
//!   (`HEAP_LANE`), completed by the quiet, and a blocking one first completes them;
//! - put_signal is the data's copy, completed, then the signal's update: the signal is
//!   never seen before the data;
//! - atomics are the host's own atomic instructions on sim, whose heaps are host memory.
//!   On CUDA the host cannot reach device memory atomically: set and fetch are single
//!   8-byte copies (never torn); fetch-add, compare-swap and a signal add are made by the
//!   rank's GPU for the host (`device/word_atomic.rs`: a thread of the copy server), so
//!   they are atomic against kernels' atomics on the word too.
//!
//! To a PE of another node each is a packet of the heap's host queue (`super::offnode`):
//! PUT, GET, PUT_SIGNAL (the target's proxy writes the signal after the data), AMO (the
//! target's proxy applies it, CUDA included), a 2-D copy a PUT or GET per row (one for a
//! contiguous block); the blocking calls wait for the queue's completions, the `_nbi` puts
//! and gets until [`Context::sym_quiet`].
//!
//! Ordering: each blocking call is complete when it returns, so a thread's blocking
//! calls take effect in program order; [`Context::sym_fence`] orders `_nbi` ones per PE
//! and [`Context::sym_quiet`] completes them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{AmoOp, SignalOp};
use gpulmt_protocols::{ProtoError, Rank};

use super::layout::{self, DeviceCtx, DeviceOp};
use super::offnode::Route;
use crate::context::Context;
use crate::device::{wait_word_atomic, BackendKind, Copy2d, WordAtomic};
use crate::error::{Error, Result};

/// How [`Context::sym_signal_wait_until`] compares the signal with its value
/// (`GPULMT_CMP_*` in the device header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Cmp {
    Eq = 0,
    Ne = 1,
    Gt = 2,
    Ge = 3,
    Lt = 4,
    Le = 5,
}

impl Cmp {
    /// The comparison of a `GPULMT_CMP_*` code.
    pub fn from_code(code: u32) -> Option<Cmp> {
        [Cmp::Eq, Cmp::Ne, Cmp::Gt, Cmp::Ge, Cmp::Lt, Cmp::Le].into_iter().find(|c| *c as u32 == code)
    }

    /// Whether `seen` satisfies the comparison with `value`.
    pub fn holds(self, seen: u64, value: u64) -> bool {
        match self {
            Cmp::Eq => seen == value,
            Cmp::Ne => seen != value,
            Cmp::Gt => seen > value,
            Cmp::Ge => seen >= value,
            Cmp::Lt => seen < value,
            Cmp::Le => seen <= value,
        }
    }
}

/// The first access that device code's checks rejected (`GPULMT_CTRL_ERRORS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceAccessError {
    /// Rejected accesses so far.
    pub count: u64,
    /// The first one's operation (None for a code this build does not know).
    pub op: Option<DeviceOp>,
    /// The PE it named.
    pub pe: i32,
    /// The symmetric address it named.
    pub addr: u64,
    /// Its size in bytes.
    pub bytes: u64,
}

impl std::fmt::Display for DeviceAccessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} device access(es) rejected; the first: {} of {} bytes at symmetric address {:#x} on PE {} \
             (outside the symmetric heap's allocations, or a PE that is not reachable)",
            self.count,
            self.op.map_or("unknown op", DeviceOp::name),
            self.bytes,
            self.addr,
            self.pe
        )
    }
}

/// The signal update of a put_signal: `op` with `value` on the word at the symmetric
/// address `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signal {
    pub addr: usize,
    pub value: u64,
    pub op: SignalOp,
}

/// What an operation does with its target word or range (for messages).
struct Access {
    what: &'static str,
    addr: usize,
    len: usize,
    pe: Rank,
    word: bool,
}

/// The lane of this rank's copy engine that carries the heap's asynchronous 2-D copies
/// ([`Context::sym_put_2d_nbi`]): one in-order queue, after the internode path's
/// ([`crate::net::stream::NET_LANE`]) and the progress engine's lanes.
pub(crate) const HEAP_LANE: u32 = crate::net::stream::NET_LANE + 1;

/// The direction of a 2-D heap copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// Local rows into the heap.
    Put,
    /// Heap rows into local memory.
    Get,
}

impl Context {
    /// The address, in this process, of `pe`'s copy of the symmetric address `addr`;
    /// None when `addr` is not in a live symmetric allocation or this rank cannot map
    /// `pe`'s heap (OpenSHMEM's `shmem_ptr`).
    pub fn sym_ptr(&self, addr: usize, pe: Rank) -> Option<usize> {
        self.sym_target(&Access { what: "sym_ptr", addr, len: 0, pe, word: false }).ok()
    }

    /// Checks an access and returns the local address of its target on `a.pe`, which
    /// must be mapped here.
    fn sym_target(&self, a: &Access) -> Result<usize> {
        match self.sym_route(a)? {
            Route::Mapped(at) => Ok(at),
            Route::Queue { .. } => Err(Error::InvalidArgument(format!(
                "{}: PE {}'s heap is on another node, not mapped by this rank: only the queue operations \
                 (put, get, put_signal, atomics) reach it",
                a.what, a.pe
            ))),
        }
    }

    /// Checks an access and says where its target lies: mapped here, or through the
    /// internode path's queue.
    fn sym_route(&self, a: &Access) -> Result<Route> {
        let heap = self.sym.as_ref().ok_or_else(|| {
            Error::InvalidArgument(format!("{}: no symmetric heap yet: allocate with sym_alloc first", a.what))
        })?;
        if a.pe >= self.size() {
            return Err(Error::InvalidArgument(format!(
                "{}: PE {} is not in this job of {} ranks",
                a.what,
                a.pe,
                self.size()
            )));
        }
        if heap.allocation_of(a.addr, a.len).is_none() {
            return Err(Error::InvalidArgument(format!(
                "{}: [{:#x}, +{}) is not inside one live symmetric allocation (heap at {:#x}, {} bytes): \
                 pass addresses from sym_alloc that were not freed, and stay inside the allocation",
                a.what,
                a.addr,
                a.len,
                heap.base,
                heap.alloc.size()
            )));
        }
        if a.word && a.addr & 7 != 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: {:#x} is not 8-byte aligned; signals and atomics are aligned 64-bit words",
                a.what, a.addr
            )));
        }
        let peer = &heap.peers[a.pe as usize];
        match (peer.mapped, peer.window, &heap.net) {
            (Some(b), _, _) => Ok(Route::Mapped(b + (a.addr - heap.base))),
            (None, Some(window), Some(_)) => Ok(Route::Queue { pe: a.pe, window, offset: (a.addr - heap.base) as u64 }),
            _ => Err(Error::InvalidArgument(format!(
                "{}: PE {}'s heap is not mapped by this rank, nor reached through the internode path (a \
                 device without peer access on this node, a job without the path, or a path that could not \
                 carry the heap: the log of the first sym_alloc says why)",
                a.what, a.pe
            ))),
        }
    }

    /// Copies `len` bytes at `src` (host memory, or device memory of this backend) into
    /// `pe`'s copy of the symmetric range at `dst`; complete (visible at `pe`) on return.
    ///
    /// # Safety
    /// `src..src+len` must be readable for the whole call, with nothing writing it.
    pub unsafe fn sym_put(&self, dst: usize, src: *const u8, len: usize, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until this call returns complete.
        unsafe { self.sym_put_at(dst, src, len, pe, true) }
    }

    /// [`sym_put`](Self::sym_put) that may return before the data moved: the put is
    /// complete (visible at `pe`) after the next [`sym_quiet`](Self::sym_quiet). To a PE
    /// whose heap is mapped here it completes at once; to one of another node it is a
    /// packet of the heap's queue, which the proxy carries while the caller goes on.
    ///
    /// # Safety
    /// `src..src+len` must stay readable and unchanged until the next `sym_quiet` returns.
    pub unsafe fn sym_put_nbi(&self, dst: usize, src: *const u8, len: usize, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until the quiet.
        unsafe { self.sym_put_at(dst, src, len, pe, false) }
    }

    /// # Safety
    /// `src..src+len` readable and unchanged until the put completes (on return with
    /// `wait`, else at the next quiet).
    unsafe fn sym_put_at(&self, dst: usize, src: *const u8, len: usize, pe: Rank, wait: bool) -> Result<()> {
        self.check_not_released(src as usize, len)?;
        match self.sym_route(&Access { what: "sym_put", addr: dst, len, pe, word: false })? {
            // SAFETY: `to..to+len` lies in a live allocation of a heap mapped here
            // (checked by the route); the source is the caller's contract.
            Route::Mapped(to) => Ok(unsafe { self.backend.copy_sync(to, src as usize, len) }?),
            // SAFETY: the caller's contract.
            Route::Queue { pe, window, offset } => unsafe {
                self.net_put((pe, window, offset), src as usize, len, wait)
            },
        }
    }

    /// Copies `len` bytes of `pe`'s copy of the symmetric range at `src` into `dst` (host
    /// memory, or device memory of this backend); complete on return.
    ///
    /// # Safety
    /// `dst..dst+len` must be writable for the whole call, with nothing else accessing it.
    pub unsafe fn sym_get(&self, dst: *mut u8, src: usize, len: usize, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until this call returns complete.
        unsafe { self.sym_get_at(dst, src, len, pe, true) }
    }

    /// [`sym_get`](Self::sym_get) that may return before the data arrived: it is in
    /// `dst` after the next [`sym_quiet`](Self::sym_quiet) (at once from a mapped heap).
    ///
    /// # Safety
    /// `dst..dst+len` must stay writable and otherwise unused until the next `sym_quiet`
    /// returns.
    pub unsafe fn sym_get_nbi(&self, dst: *mut u8, src: usize, len: usize, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until the quiet.
        unsafe { self.sym_get_at(dst, src, len, pe, false) }
    }

    /// # Safety
    /// `dst..dst+len` writable and unused until the get completes.
    unsafe fn sym_get_at(&self, dst: *mut u8, src: usize, len: usize, pe: Rank, wait: bool) -> Result<()> {
        self.check_not_released(dst as usize, len)?;
        match self.sym_route(&Access { what: "sym_get", addr: src, len, pe, word: false })? {
            // SAFETY: `from..from+len` lies in a live allocation of a heap mapped here;
            // the destination is the caller's contract.
            Route::Mapped(from) => Ok(unsafe { self.backend.copy_sync(dst as usize, from, len) }?),
            // SAFETY: the caller's contract.
            Route::Queue { pe, window, offset } => unsafe {
                self.net_get((pe, window, offset), dst as usize, len, wait)
            },
        }
    }

    /// The 2-D [`sym_put`](Self::sym_put) (a strided block, as Global Arrays' patches
    /// need): `shape.height` rows of `shape.width` bytes from `src` (rows
    /// `shape.src_pitch` bytes apart) into `pe`'s copy of the symmetric range at `dst`
    /// (rows `shape.dst_pitch` bytes apart). The whole block is checked before anything
    /// is written; complete on return. To a mapped heap it is one 2-D copy of the backend
    /// (`cuMemcpy2D` on CUDA), after this rank's `_nbi` 2-D copies completed (so it lands
    /// after them); to a PE of another node, a PUT packet per row (one for a contiguous
    /// block).
    ///
    /// # Safety
    /// Every row `src + i * src_pitch .. + width` (`i < height`) must be readable for the
    /// whole call, with nothing writing it.
    pub unsafe fn sym_put_2d(&self, dst: usize, src: *const u8, shape: Copy2d, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until this call returns complete.
        unsafe { self.sym_2d("sym_put_2d", Dir::Put, src as usize, dst, shape, pe, true) }
    }

    /// [`sym_put_2d`](Self::sym_put_2d) that returns once issued: complete (visible at
    /// `pe`) after the next [`sym_quiet`](Self::sym_quiet). To a mapped heap it is an
    /// asynchronous 2-D copy on one in-order lane of this rank's copy engine, so this
    /// rank's `_nbi` 2-D copies to mapped heaps land in the order issued; to a PE of
    /// another node, queue packets (ordered per PE by [`sym_fence`](Self::sym_fence)).
    ///
    /// # Safety
    /// Every source row must stay readable and unchanged until the next `sym_quiet`
    /// returns.
    pub unsafe fn sym_put_2d_nbi(&self, dst: usize, src: *const u8, shape: Copy2d, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until the quiet.
        unsafe { self.sym_2d("sym_put_2d_nbi", Dir::Put, src as usize, dst, shape, pe, false) }
    }

    /// The 2-D [`sym_get`](Self::sym_get): `shape.height` rows of `shape.width` bytes of
    /// `pe`'s copy of the symmetric range at `src` (rows `shape.src_pitch` apart) into
    /// `dst` (rows `shape.dst_pitch` apart); checked whole first, complete on return, made
    /// as [`sym_put_2d`](Self::sym_put_2d)'s is.
    ///
    /// # Safety
    /// Every row `dst + i * dst_pitch .. + width` must be writable for the whole call,
    /// with nothing else accessing it.
    pub unsafe fn sym_get_2d(&self, dst: *mut u8, src: usize, shape: Copy2d, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until this call returns complete.
        unsafe { self.sym_2d("sym_get_2d", Dir::Get, dst as usize, src, shape, pe, true) }
    }

    /// [`sym_get_2d`](Self::sym_get_2d) that returns once issued: the data is in `dst`
    /// after the next [`sym_quiet`](Self::sym_quiet), issued as
    /// [`sym_put_2d_nbi`](Self::sym_put_2d_nbi)'s copies are.
    ///
    /// # Safety
    /// Every destination row must stay writable and otherwise unused until the next
    /// `sym_quiet` returns.
    pub unsafe fn sym_get_2d_nbi(&self, dst: *mut u8, src: usize, shape: Copy2d, pe: Rank) -> Result<()> {
        // SAFETY: the caller's contract, kept until the quiet.
        unsafe { self.sym_2d("sym_get_2d_nbi", Dir::Get, dst as usize, src, shape, pe, false) }
    }

    /// A 2-D copy between `local` and the heap block at the symmetric address `remote` of
    /// `pe`, checked whole first; with `wait` complete on return, else at the next quiet.
    ///
    /// # Safety
    /// The local rows valid for the copy (readable for a put, writable and unused for a
    /// get) until it completes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn sym_2d(
        &self,
        what: &'static str,
        dir: Dir,
        local: usize,
        remote: usize,
        shape: Copy2d,
        pe: Rank,
        wait: bool,
    ) -> Result<()> {
        let (dst_span, src_span) = shape.check(what)?;
        let span = if dir == Dir::Put { dst_span } else { src_span };
        self.check_not_released(local, if dir == Dir::Put { src_span } else { dst_span })?;
        let route = self.sym_route(&Access { what, addr: remote, len: span, pe, word: false })?;
        if shape.is_empty() {
            return Ok(());
        }
        match route {
            Route::Mapped(at) => {
                let (dst, src) = if dir == Dir::Put { (at, local) } else { (local, at) };
                if wait {
                    self.sym_copies_complete()?;
                    // SAFETY: every heap row lies in the checked block of a live allocation
                    // mapped here; the local rows are the caller's contract.
                    return Ok(unsafe { self.backend.copy_2d_sync(dst, src, shape) }?);
                }
                let heap = self.sym.as_ref().expect("routed through it");
                let mut copies = heap.copies.lock().unwrap_or_else(|e| e.into_inner());
                // SAFETY: as above; the caller keeps the local rows valid until the quiet,
                // which polls this ticket to completion, and the heap's memory stays mapped
                // until finalize, which quiets first.
                let ticket = unsafe { self.backend.copy_2d_async(self.device, HEAP_LANE, dst, src, shape) }?;
                copies.push(ticket);
                Ok(())
            }
            // SAFETY: the caller's contract.
            Route::Queue { pe, window, offset } => unsafe {
                self.net_2d(what, dir == Dir::Put, (pe, window, offset), local, shape, wait)
            },
        }
    }

    /// Waits until the heap's asynchronous 2-D copies to mapped heaps finished; fails with
    /// the first copy that failed (the others are still waited for).
    pub(crate) fn sym_copies_complete(&self) -> Result<()> {
        let Some(heap) = self.sym.as_ref() else { return Ok(()) };
        let mut copies = heap.copies.lock().unwrap_or_else(|e| e.into_inner());
        let mut first_error = None;
        // One lane, in order: the newest finished means all did, but each ticket is
        // polled to completion so the backend forgets it.
        for ticket in std::mem::take(&mut *copies) {
            for polls in 0u64.. {
                match self.backend.copy_poll(ticket) {
                    Ok(true) => break,
                    // Spin first, then yield to ranks sharing the cores (the sim's engine).
                    Ok(false) if polls < 1000 => std::hint::spin_loop(),
                    Ok(false) => std::thread::yield_now(),
                    Err(e) => {
                        first_error.get_or_insert(e);
                        break;
                    }
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(e) => Err(Error::Transfer(ProtoError::CopyFailed {
                what: format!("a symmetric heap 2-D copy issued without waiting (sym_put_2d_nbi, sym_get_2d_nbi): {e}"),
            })),
        }
    }

    /// [`sym_put`](Self::sym_put), then `signal`'s update of the 64-bit signal word on
    /// `pe`: the data is complete before the signal changes.
    ///
    /// # Safety
    /// As `sym_put`'s.
    pub unsafe fn sym_put_signal(
        &self,
        dst: usize,
        src: *const u8,
        len: usize,
        signal: Signal,
        pe: Rank,
    ) -> Result<()> {
        let Signal { addr: sig, value, op } = signal;
        // Both targets are checked before anything is written.
        let to = self.sym_route(&Access { what: "sym_put_signal", addr: dst, len, pe, word: false })?;
        let word = self.sym_route(&Access { what: "sym_put_signal's signal", addr: sig, len: 8, pe, word: true })?;
        let (to, word) = match (to, word) {
            (Route::Mapped(to), Route::Mapped(word)) => (to, word),
            (Route::Queue { pe, window, offset }, Route::Queue { offset: signal_offset, .. }) => {
                // SAFETY: the caller's contract, kept until the call returns complete. The
                // target's proxy writes the signal once the data is in place.
                return unsafe {
                    self.net_put_signal((pe, window, offset), src as usize, len, (signal_offset, value, op))
                };
            }
            _ => unreachable!("one PE's routes are alike"),
        };
        // SAFETY: as in sym_put. copy_sync returns once the copy has completed, so the
        // data is in place before the signal is written below.
        unsafe { self.backend.copy_sync(to, src as usize, len)? };
        match op {
            SignalOp::Set => self.word_store(word, value),
            SignalOp::Add => self.word_rmw(word, WordAtomic::FetchAdd(value)).map(|_| ()),
        }
    }

    /// Waits until the signal at the symmetric address `sig` in this rank's heap
    /// satisfies `cmp` against `value`; returns the value seen, or None when `timeout`
    /// passed first (no timeout: waits as long as it takes).
    pub fn sym_signal_wait_until(
        &self,
        sig: usize,
        cmp: Cmp,
        value: u64,
        timeout: Option<Duration>,
    ) -> Result<Option<u64>> {
        let me = self.rank();
        let word = self.sym_target(&Access { what: "sym_signal_wait_until", addr: sig, len: 8, pe: me, word: true })?;
        let deadline = timeout.map(|t| Instant::now() + t);
        for polls in 0u64.. {
            let seen = self.word_load(word)?;
            if cmp.holds(seen, value) {
                return Ok(Some(seen));
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
            // Spin first (a signal is usually close); then yield, so that ranks sharing
            // the cores with this one (the one that will signal, often) can run.
            if polls < 1000 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        unreachable!("the poll count does not run out")
    }

    /// Adds `value` to the 64-bit word at the symmetric address `dst` on `pe`; returns
    /// the old value.
    pub fn sym_atomic_fetch_add(&self, dst: usize, value: u64, pe: Rank) -> Result<u64> {
        let what = "sym_atomic_fetch_add";
        match self.sym_route(&Access { what, addr: dst, len: 8, pe, word: true })? {
            Route::Mapped(word) => self.word_rmw(word, WordAtomic::FetchAdd(value)),
            Route::Queue { pe, window, offset } => self.net_amo(what, (pe, window, offset), AmoOp::FetchAdd, value, 0),
        }
    }

    /// Stores `desired` in the word at `dst` on `pe` if it holds `expected`; returns the
    /// old value (the swap happened when it equals `expected`).
    pub fn sym_atomic_compare_swap(&self, dst: usize, expected: u64, desired: u64, pe: Rank) -> Result<u64> {
        let what = "sym_atomic_compare_swap";
        match self.sym_route(&Access { what, addr: dst, len: 8, pe, word: true })? {
            Route::Mapped(word) => self.word_rmw(word, WordAtomic::CompareSwap { expected, desired }),
            Route::Queue { pe, window, offset } => {
                self.net_amo(what, (pe, window, offset), AmoOp::CompareSwap, desired, expected)
            }
        }
    }

    /// Stores `value` in the word at `dst` on `pe`, atomically.
    pub fn sym_atomic_set(&self, dst: usize, value: u64, pe: Rank) -> Result<()> {
        let what = "sym_atomic_set";
        match self.sym_route(&Access { what, addr: dst, len: 8, pe, word: true })? {
            Route::Mapped(word) => self.word_store(word, value),
            Route::Queue { pe, window, offset } => {
                self.net_amo(what, (pe, window, offset), AmoOp::Set, value, 0).map(|_| ())
            }
        }
    }

    /// Reads the word at `dst` on `pe`, atomically.
    pub fn sym_atomic_fetch(&self, dst: usize, pe: Rank) -> Result<u64> {
        let what = "sym_atomic_fetch";
        match self.sym_route(&Access { what, addr: dst, len: 8, pe, word: true })? {
            Route::Mapped(word) => self.word_load(word),
            Route::Queue { pe, window, offset } => self.net_amo(what, (pe, window, offset), AmoOp::Fetch, 0, 0),
        }
    }

    /// Orders the host's earlier puts, put_signals and atomics to each PE before its
    /// later ones to the same PE (OpenSHMEM's `shmem_fence`). Blocking calls are complete
    /// when they return and mapped heaps' `_nbi` ones too, so only `_nbi` operations to
    /// PEs of other nodes have anything to order: the queue's next packet to each such PE
    /// waits at the proxy for the earlier ones.
    pub fn sym_fence(&self) {
        self.net_fence();
    }

    /// Completes every symmetric heap operation the host made so far: the `_nbi` ones to
    /// PEs of other nodes are visible at their targets (acknowledged by the target's
    /// proxy), their gets' data in place; the rest were complete when they returned.
    /// Fails with the first failed operation's story since the last quiet.
    pub fn sym_quiet(&self) -> Result<()> {
        let copies = self.sym_copies_complete();
        let queued = self.net_quiet_all();
        copies.and(queued)
    }

    /// What device code needs to know of the heaps ([`DeviceCtx`]), for this rank's
    /// kernels; fails before the first `sym_alloc`.
    pub fn sym_device_ctx(&self) -> Result<DeviceCtx> {
        let heap = self.sym.as_ref().ok_or_else(|| {
            Error::InvalidArgument("sym_device_ctx: no symmetric heap yet: allocate with sym_alloc first".into())
        })?;
        Ok(DeviceCtx {
            version: layout::DEVICE_CTX_VERSION,
            my_pe: self.rank() as i32,
            n_pes: self.size() as i32,
            reserved: heap.alloc.start() as u32,
            heap_size: heap.alloc.size(),
            heap_base: heap.base as u64,
            bases: (heap.base as u64) + layout::CTRL_BASES,
            queues: heap.net.as_ref().and_then(|n| n.device.as_ref()).map_or(0, |d| d.mem as u64),
        })
    }

    /// The accesses device code's checks rejected in this rank's kernels so far (None:
    /// none). Read it after the kernels finished.
    pub fn sym_device_errors(&self) -> Result<Option<DeviceAccessError>> {
        let heap = self.sym.as_ref().ok_or_else(|| {
            Error::InvalidArgument("sym_device_errors: no symmetric heap yet: allocate with sym_alloc first".into())
        })?;
        let mut w = [0u64; 4];
        // SAFETY: the record is the first 32 bytes of our heap's control area; `w` is a
        // host buffer of 32 bytes.
        unsafe { self.backend.copy_sync(w.as_mut_ptr() as usize, heap.base + layout::CTRL_ERRORS as usize, 32)? };
        Ok((w[0] > 0).then(|| DeviceAccessError {
            count: w[0],
            op: DeviceOp::from_code((w[1] >> 32) as u32),
            pe: w[1] as u32 as i32,
            addr: w[2],
            bytes: w[3],
        }))
    }

    /// Clears the record of rejected device accesses (no kernel may be running).
    pub fn sym_device_errors_clear(&self) -> Result<()> {
        let Some(heap) = self.sym.as_ref() else { return Ok(()) };
        let zeros = [0u64; 4];
        // SAFETY: as in sym_device_errors, in the other direction.
        Ok(unsafe { self.backend.copy_sync(heap.base + layout::CTRL_ERRORS as usize, zeros.as_ptr() as usize, 32) }?)
    }

    /// Applies `op` to the checked word at `word` and returns its old value: one atomic
    /// instruction of the host on sim; on CUDA the rank's GPU makes it (see the module
    /// documentation), within `WORD_ATOMIC_TIMEOUT`.
    fn word_rmw(&self, word: usize, op: WordAtomic) -> Result<u64> {
        match self.backend.kind() {
            BackendKind::Sim => {
                // SAFETY: `word` is an 8-byte aligned word inside a live allocation of a
                // heap mapped into this process as host memory (sim), mapped as long as
                // the context lives; every access to it from gpulmt is atomic.
                Ok(op.apply(unsafe { AtomicU64::from_ptr(word as *mut u64) }))
            }
            // SAFETY: `word` is an aligned word of this rank's heap or of an on-node peer's
            // mapped here (checked), which this rank's device reaches, mapped as long as the
            // context lives; the host touches it atomically only.
            BackendKind::Cuda => Ok(unsafe { wait_word_atomic(&*self.backend, self.device, word, op) }?),
        }
    }

    /// Stores the checked word at `word` atomically: a release store on sim, one 8-byte
    /// copy on CUDA.
    fn word_store(&self, word: usize, value: u64) -> Result<()> {
        match self.backend.kind() {
            BackendKind::Sim => {
                // SAFETY: as in word_rmw.
                unsafe { AtomicU64::from_ptr(word as *mut u64) }.store(value, Ordering::Release);
                Ok(())
            }
            // SAFETY: `word` is an aligned word of a heap mapped here; `value` is 8 host bytes.
            BackendKind::Cuda => Ok(unsafe { self.backend.copy_sync(word, &value as *const u64 as usize, 8) }?),
        }
    }

    /// Loads the checked word at `word` atomically: an acquire load on sim, one 8-byte
    /// copy on CUDA.
    fn word_load(&self, word: usize) -> Result<u64> {
        match self.backend.kind() {
            // SAFETY: as in word_rmw.
            BackendKind::Sim => Ok(unsafe { AtomicU64::from_ptr(word as *mut u64) }.load(Ordering::Acquire)),
            BackendKind::Cuda => {
                let mut v = 0u64;
                // SAFETY: as in word_store, in the other direction.
                unsafe { self.backend.copy_sync(&mut v as *mut u64 as usize, word, 8)? };
                Ok(v)
            }
        }
    }
}
