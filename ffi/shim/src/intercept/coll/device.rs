//! The device path of blocking `MPI_Bcast`, `MPI_Allgather`, `MPI_Allreduce` and
//! `MPI_Reduce_scatter_block`: when
//! every rank's buffers are contiguous device memory, the data moves between the GPUs
//! over gpulmt's point-to-point path (peer copies on the copy engines within a node)
//! instead of being staged through host memory around the library's collective, and
//! `MPI_Allreduce` reduces on the GPU (`crate::device_reduce`: an NVRTC kernel on
//! CUDA, the same loop on the host on sim, whose device memory the process addresses).
//!
//! - `MPI_Bcast`: a binomial tree from the root.
//! - `MPI_Allgather`: every rank sends its block to every other rank at once.
//! - `MPI_Allreduce`: a reduce-scatter (rank r gathers every rank's chunk r into a
//!   device scratch buffer and reduces it into its receive buffer) followed by an
//!   allgather of the reduced chunks. Each chunk is reduced by one rank in a fixed
//!   order (its own elements, then the other ranks' in rank order), so every rank gets
//!   the same bits; they may differ in the last place from the library's floating-point
//!   sums, whose order MPI leaves open as well.
//! - `MPI_Reduce_scatter_block`: that reduce-scatter alone, each rank's chunk its block.
//!
//! Whether a call takes the device path is agreed among the ranks: every rank of an
//! intracommunicator, for a call of at least `GPULMT_MPI_COLL_DEVICE_MIN` bytes (256K by
//! default, the largest of all ranks' settings, agreed at `MPI_Init`; `off` disables
//! the path), adds one small `MPI_Allreduce` saying whether its buffers qualify (shim
//! active, device memory, contiguous datatypes, a reduction `device_reduce` has). MPI lets
//! placements differ between ranks, and a rank cannot see its peers' buffers, so the
//! agreement is what keeps every rank on the same path; when any rank says no, all take
//! the staged path ([`super::blocking`]). Host-only programs pay that small call on
//! collectives of that size. The point-to-point traffic runs on a duplicate of the
//! communicator kept as its attribute (freed with it), so it never meets the program's
//! messages. `gpulmt_mpi_device_collectives()` counts the calls that took the path.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicU64, AtomicUsize, Ordering};

use mpi_sys::*;

use super::super::completion::MPI_Waitall;
use super::super::recv::MPI_Irecv;
use super::super::send::MPI_Isend;
use super::super::{active, raise, with};
use crate::device_reduce::{Others, Reducer, Reduction};
use crate::raw::*;
use crate::staging::{Region, Role, Shape};
use crate::state::while_blocked;

/// The smallest call (bytes) that may take the device path; `usize::MAX`: never.
static MIN_BYTES: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Calls that took the device path.
static CALLS: AtomicU64 = AtomicU64::new(0);
/// The keyval of the duplicate communicators (`MPI_KEYVAL_INVALID` until the first).
static KEYVAL: AtomicI32 = AtomicI32::new(KEYVAL_NONE);
const KEYVAL_NONE: c_int = c_int::MIN;

/// Default of `GPULMT_MPI_COLL_DEVICE_MIN`.
pub const DEFAULT_MIN: usize = 256 << 10;

/// This rank's `GPULMT_MPI_COLL_DEVICE_MIN` (`u64::MAX` for `off`; an invalid value
/// counts as the default, and is logged).
pub fn min_from_env() -> u64 {
    match std::env::var("GPULMT_MPI_COLL_DEVICE_MIN") {
        Ok(v) if v.trim() == "off" => u64::MAX,
        Ok(v) if !v.trim().is_empty() => gpulmt::config::parse_size(v.trim()).unwrap_or_else(|| {
            tracing::warn!(value = %v, "GPULMT_MPI_COLL_DEVICE_MIN is not a size (e.g. 256K) or off; using 256K");
            DEFAULT_MIN as u64
        }),
        _ => DEFAULT_MIN as u64,
    }
}

/// Sets the agreed threshold (the largest of the ranks' [`min_from_env`]).
pub fn set_min(bytes: u64) {
    MIN_BYTES.store(usize::try_from(bytes).unwrap_or(usize::MAX), Ordering::Relaxed);
}

/// Calls that took the device path so far.
pub fn calls() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// Tags of the phases on the duplicate communicator.
const TAG_BCAST: c_int = 1;
const TAG_ALLGATHER: c_int = 2;
const TAG_SCATTER: c_int = 3;
const TAG_GATHER: c_int = 4;

/// The copy callback of the keyval: a duplicate of the program's communicator gets a
/// duplicate of its own on first use, not a copy.
unsafe extern "C" fn no_copy(
    _: MPI_Comm,
    _: c_int,
    _: *mut c_void,
    _: *mut c_void,
    _: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    // SAFETY: MPI passes a valid flag pointer.
    unsafe { *flag = 0 };
    SUCCESS
}

/// The delete callback: frees the duplicate with the program's communicator.
unsafe extern "C" fn free_dup(_: MPI_Comm, _: c_int, value: *mut c_void, _: *mut c_void) -> c_int {
    // SAFETY: the attribute's value is a Box<MPI_Comm> of `shadow`, given up once here.
    let mut dup = unsafe { Box::from_raw(value.cast::<MPI_Comm>()) };
    // SAFETY: the shim's own communicator, used by no operation after its owner's free.
    unsafe { PMPI_Comm_free(&mut *dup) }
}

/// The duplicate of `comm` for the device path's traffic (collective on first use: every
/// rank gets here in the same call, after agreeing).
///
/// # Safety
/// `comm` is a valid intracommunicator.
unsafe fn shadow(comm: MPI_Comm) -> Result<MPI_Comm, c_int> {
    let mut key = KEYVAL.load(Ordering::Acquire);
    if key == KEYVAL_NONE {
        let mut made = KEYVAL_NONE;
        // SAFETY: the callbacks above match MPI's signatures; out-pointer to a local.
        let rc = unsafe { PMPI_Comm_create_keyval(Some(no_copy), Some(free_dup), &mut made, std::ptr::null_mut()) };
        if rc != SUCCESS {
            return Err(rc);
        }
        // Another thread (MPI_THREAD_MULTIPLE) may have made one meanwhile: one is kept.
        key = match KEYVAL.compare_exchange(KEYVAL_NONE, made, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => made,
            Err(theirs) => {
                // SAFETY: the keyval made above, on no communicator yet.
                unsafe { PMPI_Comm_free_keyval(&mut made) };
                theirs
            }
        };
    }
    let mut value: *mut c_void = std::ptr::null_mut();
    let mut found = 0;
    // SAFETY: the caller's communicator, the shim's keyval; out-pointers to locals.
    let rc = unsafe { PMPI_Comm_get_attr(comm, key, (&mut value as *mut *mut c_void).cast(), &mut found) };
    if rc != SUCCESS {
        return Err(rc);
    }
    if found != 0 {
        // SAFETY: the attribute is a Box<MPI_Comm> this function stored.
        return Ok(unsafe { *value.cast::<MPI_Comm>() });
    }
    let mut dup = comm_null();
    // SAFETY: collective over `comm`, whose ranks all reach this call (see above).
    let rc = unsafe { PMPI_Comm_dup(comm, &mut dup) };
    if rc != SUCCESS {
        return Err(rc);
    }
    // SAFETY: the new communicator; errors come back to the shim, which raises them on `comm`.
    unsafe { PMPI_Comm_set_errhandler(dup, RSMPI_ERRORS_RETURN) };
    let boxed = Box::into_raw(Box::new(dup));
    // SAFETY: the caller's communicator and the shim's keyval; free_dup takes the box back.
    let rc = unsafe { PMPI_Comm_set_attr(comm, key, boxed.cast()) };
    if rc == SUCCESS {
        Ok(dup)
    } else {
        Err(rc)
    }
}

/// Frees the duplicate of `MPI_COMM_WORLD` before the library finalizes (MPI frees the
/// attributes of `MPI_COMM_WORLD` late in `MPI_Finalize`, when freeing another
/// communicator from a callback is not safe on every library).
///
/// Only an attribute that is there is deleted: Open MPI raises an error for an absent one
/// (the device path may have run only on other communicators), which the program's
/// default error handler turns into an abort in `MPI_Finalize`.
pub fn finalize() {
    let key = KEYVAL.swap(KEYVAL_NONE, Ordering::AcqRel);
    if key == KEYVAL_NONE {
        return;
    }
    let mut value: *mut c_void = std::ptr::null_mut();
    let mut found = 0;
    // SAFETY: MPI is initialized; the shim's keyval; out-pointers to locals.
    let rc = unsafe { PMPI_Comm_get_attr(comm_world(), key, (&mut value as *mut *mut c_void).cast(), &mut found) };
    if rc == SUCCESS && found != 0 {
        // SAFETY: the attribute the shim set on MPI_COMM_WORLD; free_dup frees its duplicate.
        let rc = unsafe { PMPI_Comm_delete_attr(comm_world(), key) };
        if rc != SUCCESS {
            tracing::warn!(rc, "freeing the device path's duplicate of MPI_COMM_WORLD failed");
        }
    }
    let mut k = key;
    // SAFETY: the shim's keyval; MPI frees it once no communicator holds it (other
    // communicators' duplicates go with them, or with the library).
    let rc = unsafe { PMPI_Comm_free_keyval(&mut k) };
    if rc != SUCCESS {
        tracing::warn!(rc, "freeing the device path's keyval failed");
    }
}

/// Whether `buf` holds `count` elements of `dt` contiguously in device memory (the
/// program's pending default-stream writes to it landed when this says yes).
fn contiguous_device(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> Option<usize> {
    let (bytes, contiguous) = type_geometry(dt, count).ok()?;
    if !contiguous || bytes == 0 || buf.is_null() || buf == in_place().cast_const() || bytes > c_int::MAX as usize {
        return None;
    }
    let region = Region::of(buf as usize, Shape::Count { count: count.into(), dt }, Role::InOut).ok()??;
    with(|s| s.region_on_device(&region)).unwrap_or(false).then_some(bytes)
}

/// Whether every rank of `comm` takes the device path for a call of `bytes` (the same
/// on every rank), this rank saying `mine`. `None`: the call is not a candidate (small,
/// an intercommunicator, the path off), decided without asking the peers.
///
/// # Safety
/// `comm` is a valid communicator.
unsafe fn agreed(comm: MPI_Comm, bytes: usize, mine: impl FnOnce() -> bool) -> Option<bool> {
    if bytes < MIN_BYTES.load(Ordering::Relaxed) {
        return None;
    }
    let mut inter = 0;
    // SAFETY: the caller's communicator; an out-pointer to a local.
    unsafe { PMPI_Comm_test_inter(comm, &mut inter) };
    if inter != 0 {
        return None;
    }
    let me = c_int::from(active() && mine());
    let mut all = 0;
    // SAFETY: one int each way; collective over `comm`, which every rank reaches with the
    // same byte count (MPI's rule that type signatures match).
    let rc = while_blocked(|| unsafe {
        PMPI_Allreduce((&me as *const c_int).cast(), (&mut all as *mut c_int).cast(), 1, int32(), op_min(), comm)
    });
    Some(rc == SUCCESS && all == 1)
}

/// The point-to-point operations of one phase, waited for together.
struct Phase {
    comm: MPI_Comm,
    tag: c_int,
    reqs: Vec<MPI_Request>,
    rc: c_int,
}

impl Phase {
    fn new(comm: MPI_Comm, tag: c_int) -> Phase {
        Phase { comm, tag, reqs: Vec::new(), rc: SUCCESS }
    }

    /// Sends `bytes` at `buf` to `peer` (nothing for 0 bytes).
    ///
    /// # Safety
    /// `buf` holds `bytes` readable bytes until [`Phase::wait`] returns.
    unsafe fn send(&mut self, buf: usize, bytes: usize, peer: c_int) {
        if bytes == 0 || self.rc != SUCCESS {
            return;
        }
        let mut req = request_null();
        // SAFETY: the caller's buffer; the shim's communicator; a local out-pointer.
        self.rc =
            unsafe { MPI_Isend(buf as *const c_void, bytes as c_int, byte(), peer, self.tag, self.comm, &mut req) };
        self.reqs.push(req);
    }

    /// Receives `bytes` into `buf` from `peer` (nothing for 0 bytes).
    ///
    /// # Safety
    /// `buf` has room for `bytes` bytes, unused by anything else until [`Phase::wait`]
    /// returns.
    unsafe fn recv(&mut self, buf: usize, bytes: usize, peer: c_int) {
        if bytes == 0 || self.rc != SUCCESS {
            return;
        }
        let mut req = request_null();
        // SAFETY: the caller's buffer; the shim's communicator; a local out-pointer.
        self.rc = unsafe { MPI_Irecv(buf as *mut c_void, bytes as c_int, byte(), peer, self.tag, self.comm, &mut req) };
        self.reqs.push(req);
    }

    /// Waits for every operation (also after a failed start: those started must end).
    fn wait(mut self) -> c_int {
        self.reqs.retain(|r| *r != request_null());
        if self.reqs.is_empty() {
            return self.rc;
        }
        // SAFETY: requests of the shim's own operations; statuses ignored.
        let rc = unsafe { MPI_Waitall(self.reqs.len() as c_int, self.reqs.as_mut_ptr(), RSMPI_STATUSES_IGNORE) };
        if self.rc != SUCCESS {
            self.rc
        } else {
            rc
        }
    }
}

/// Rank and size of `comm`.
///
/// # Safety
/// `comm` is a valid communicator.
unsafe fn site(comm: MPI_Comm) -> (c_int, c_int) {
    let (mut rank, mut size) = (0, 0);
    // SAFETY: the caller's communicator; out-pointers to locals.
    unsafe {
        PMPI_Comm_rank(comm, &mut rank);
        PMPI_Comm_size(comm, &mut size);
    }
    (rank, size)
}

/// A device-to-device copy of `bytes`, finished when this returns.
///
/// # Safety
/// `dst` and `src` are device buffers of this process with room for and holding
/// `bytes`, not overlapping.
unsafe fn device_copy(dst: usize, src: usize, bytes: usize) -> c_int {
    if bytes == 0 || dst == src {
        return SUCCESS;
    }
    // SAFETY: the caller's contract.
    match with(|s| unsafe { s.ctx.backend().copy_sync(dst, src, bytes) }) {
        Some(Ok(())) => SUCCESS,
        _ => ERR_OTHER,
    }
}

/// Counts a call on the device path and reports its result on `comm`.
///
/// # Safety
/// `comm` is a valid communicator.
unsafe fn done(call: &str, comm: MPI_Comm, rc: c_int) -> c_int {
    CALLS.fetch_add(1, Ordering::Relaxed);
    if rc == SUCCESS {
        return rc;
    }
    let mut class = rc;
    // SAFETY: an out-pointer to a local.
    unsafe { PMPI_Error_class(rc, &mut class) };
    // A code of the shim's own carries its message already; a class gets one.
    let code = if class != rc {
        rc
    } else {
        crate::mpierr::for_call(rc, call, "the device path's point-to-point transfers failed")
    };
    // SAFETY: the caller's communicator.
    unsafe { raise(comm, code) }
}

/// `MPI_Bcast` on the device path, or `None`: take the staged path.
///
/// # Safety
/// As `MPI_Bcast`.
pub unsafe fn bcast(buf: *mut c_void, count: c_int, dt: MPI_Datatype, root: c_int, comm: MPI_Comm) -> Option<c_int> {
    let bytes = type_geometry(dt, count).ok()?.0;
    // SAFETY: the caller's communicator.
    if !unsafe { agreed(comm, bytes, || contiguous_device(buf, count, dt).is_some()) }? {
        return None;
    }
    // SAFETY: every rank agreed, so every rank gets here.
    let shadow = match unsafe { shadow(comm) } {
        Ok(c) => c,
        // SAFETY: the caller's communicator.
        Err(rc) => return Some(unsafe { done("MPI_Bcast", comm, rc) }),
    };
    // SAFETY: the caller's communicator.
    let (rank, size) = unsafe { site(comm) };
    let rel = (rank - root).rem_euclid(size);
    let mut phase = Phase::new(shadow, TAG_BCAST);
    // Binomial tree: receive from the parent (rel with its lowest set bit cleared) ...
    let mut mask = 1;
    while mask < size {
        if rel & mask != 0 {
            let mut from = Phase::new(shadow, TAG_BCAST);
            // SAFETY: the caller's buffer of `bytes`.
            unsafe { from.recv(buf as usize, bytes, (rank - mask).rem_euclid(size)) };
            phase.rc = from.wait();
            break;
        }
        mask <<= 1;
    }
    // ... then send to the children below that bit.
    mask >>= 1;
    while mask > 0 {
        if rel + mask < size {
            // SAFETY: the caller's buffer, received in full above.
            unsafe { phase.send(buf as usize, bytes, (rank + mask) % size) };
        }
        mask >>= 1;
    }
    let rc = phase.wait();
    // SAFETY: the caller's communicator.
    Some(unsafe { done("MPI_Bcast", comm, rc) })
}

/// `MPI_Allgather` on the device path, or `None`.
///
/// # Safety
/// As `MPI_Allgather`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn allgather(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> Option<c_int> {
    let block = type_geometry(rtype, rcount).ok()?.0;
    // SAFETY: the caller's communicator.
    let (rank, size) = unsafe { site(comm) };
    let in_place = sendbuf == in_place().cast_const();
    let mine = || {
        let send_ok = in_place || contiguous_device(sendbuf, scount, stype) == Some(block);
        send_ok && rcount.checked_mul(size).is_some_and(|n| contiguous_device(recvbuf, n, rtype).is_some())
    };
    // A total past usize cannot be a buffer: this rank says no (MPI's own path reports
    // it), and still takes part in the agreement, which is collective.
    let total = block.checked_mul(size as usize);
    // SAFETY: the caller's communicator.
    if !unsafe { agreed(comm, total.unwrap_or(usize::MAX), || total.is_some() && mine()) }? {
        return None;
    }
    // SAFETY: every rank agreed.
    let shadow = match unsafe { shadow(comm) } {
        Ok(c) => c,
        // SAFETY: the caller's communicator.
        Err(rc) => return Some(unsafe { done("MPI_Allgather", comm, rc) }),
    };
    let at = |r: c_int| recvbuf as usize + r as usize * block;
    let own = if in_place { at(rank) } else { sendbuf as usize };
    let mut phase = Phase::new(shadow, TAG_ALLGATHER);
    for peer in (0..size).filter(|&p| p != rank) {
        // SAFETY: block `peer` of the caller's receive buffer, and this rank's block.
        unsafe {
            phase.recv(at(peer), block, peer);
            phase.send(own, block, peer);
        }
    }
    // SAFETY: the caller's buffers (distinct: MPI forbids aliasing them without IN_PLACE).
    let copied = if in_place { SUCCESS } else { unsafe { device_copy(at(rank), own, block) } };
    let rc = phase.wait();
    // SAFETY: the caller's communicator.
    Some(unsafe { done("MPI_Allgather", comm, if rc == SUCCESS { copied } else { rc }) })
}

thread_local! {
    /// The device scratch buffer of the reductions (grown as needed, freed at finalize as
    /// memory of `gpulmt_mpi_alloc`): its address and size. One per thread: under
    /// MPI_THREAD_MULTIPLE threads may run reductions on different communicators at once.
    static SCRATCH: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// The calling thread's scratch buffer with room for `bytes`; `None` when device memory
/// for it cannot be had.
fn scratch(bytes: usize) -> Option<usize> {
    let (ptr, len) = SCRATCH.get();
    if len >= bytes {
        return Some(ptr);
    }
    if ptr != 0 {
        crate::api::gpulmt_mpi_free(ptr as *mut c_void);
        SCRATCH.set((0, 0));
    }
    let len = bytes.next_power_of_two();
    let p = crate::api::gpulmt_mpi_alloc(len);
    if p.is_null() {
        return None;
    }
    SCRATCH.set((p as usize, len));
    Some(p as usize)
}

/// How a reduction's elements fall into the ranks' chunks: `count` elements of `elem`
/// bytes in `size` chunks, chunk r reduced by rank r.
#[derive(Clone, Copy)]
struct Chunks {
    count: usize,
    size: usize,
    elem: usize,
}

impl Chunks {
    /// Byte offset and length of chunk `r` (sizes differ by at most one element).
    fn of(&self, r: c_int) -> (usize, usize) {
        let r = r as usize;
        let (lo, hi) = (self.count * r / self.size, self.count * (r + 1) / self.size);
        (lo * self.elem, (hi - lo) * self.elem)
    }

    /// Bytes of the largest chunk.
    fn most(&self) -> usize {
        (0..self.size as c_int).map(|r| self.of(r).1).max().unwrap_or(0)
    }

    /// Scratch bytes a rank needs: a chunk from every other rank.
    fn scratch(&self) -> usize {
        self.most() * (self.size - 1)
    }
}

/// Whether this rank can reduce `reduction` on its device, with the scratch `chunks` need
/// (allocated here, before the ranks agree, so that nothing can fail after).
fn can_reduce(reduction: Option<Reduction>, chunks: Chunks) -> bool {
    reduction.is_some()
        && with(|s| Reducer::ready(s.ctx.backend().kind(), s.ctx.device())).unwrap_or(false)
        && scratch(chunks.scratch()).is_some()
}

/// The reduce-scatter both reductions start with: chunk `rank` of every rank's `src`
/// reduced into `acc` (this rank's own chunk first: copied there unless it is there
/// already), the other chunks sent to the ranks that reduce them.
///
/// # Safety
/// `src` holds every chunk of device memory; `acc` has room for chunk `rank`, and may be
/// that chunk of `src` but overlap no other; `shadow` is the duplicate communicator.
unsafe fn reduce_scatter_into(
    shadow: MPI_Comm,
    (rank, size): (c_int, c_int),
    chunks: Chunks,
    reduction: Reduction,
    src: usize,
    acc: usize,
) -> c_int {
    let Some(tmp) = scratch(chunks.scratch()) else { return ERR_OTHER };
    let most = chunks.most();
    let slot = |peer: c_int| tmp + (if peer < rank { peer } else { peer - 1 }) as usize * most;
    let (mine, len) = chunks.of(rank);
    let mut phase = Phase::new(shadow, TAG_SCATTER);
    for peer in (0..size).filter(|&p| p != rank) {
        let (at, n) = chunks.of(peer);
        // SAFETY: a slot of the scratch buffer; chunk `peer` of the caller's input.
        unsafe {
            phase.recv(slot(peer), len, peer);
            phase.send(src + at, n, peer);
        }
    }
    // SAFETY: chunk `rank` of the input, and `acc` (the same range, or distinct).
    let mut rc = unsafe { device_copy(acc, src + mine, len) };
    let sent = phase.wait();
    if rc == SUCCESS {
        rc = sent;
    }
    // The peers' chunks in rank order, the slots' order: one reduction folds them all in.
    let others = Others { first: tmp, stride: most / chunks.elem, count: size as usize - 1 };
    if rc == SUCCESS {
        // SAFETY: `acc` and the peers' slots hold len bytes each of this rank's device
        // memory (the slots `most` bytes apart in the scratch buffer, which `acc` is not
        // part of), and no transfer runs on them any more.
        if let Err(e) = unsafe { Reducer::reduce(reduction, acc, others, len / chunks.elem) } {
            rc = crate::mpierr::for_call(ERR_OTHER, "the device reduction", e);
        }
    }
    rc
}

/// `MPI_Allreduce` on the device path, or `None`.
///
/// # Safety
/// As `MPI_Allreduce`.
pub unsafe fn allreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Option<c_int> {
    let bytes = type_geometry(dt, count).ok()?.0;
    let reduction = Reduction::of(dt, op);
    // SAFETY: the caller's communicator.
    let (rank, size) = unsafe { site(comm) };
    let in_place = sendbuf == in_place().cast_const();
    let elem = reduction.map_or(1, |r| r.elem.size());
    let chunks = Chunks { count: count.max(0) as usize, size: size as usize, elem };
    let mine = || {
        can_reduce(reduction, chunks)
            && (in_place || contiguous_device(sendbuf, count, dt).is_some())
            && contiguous_device(recvbuf, count, dt).is_some()
    };
    // SAFETY: the caller's communicator.
    if !unsafe { agreed(comm, bytes, mine) }? {
        return None;
    }
    let reduction = reduction?;
    // SAFETY: every rank agreed.
    let shadow = match unsafe { shadow(comm) } {
        Ok(c) => c,
        // SAFETY: the caller's communicator.
        Err(rc) => return Some(unsafe { done("MPI_Allreduce", comm, rc) }),
    };
    let src = if in_place { recvbuf as usize } else { sendbuf as usize };
    let out = recvbuf as usize;
    // SAFETY: the caller's buffers of `count` elements; chunk `rank` of the receive
    // buffer is the input's own range when in place, else a distinct buffer.
    let rc = unsafe { reduce_scatter_into(shadow, (rank, size), chunks, reduction, src, out + chunks.of(rank).0) };
    // Allgather of the reduced chunks (after a failure too: the peers wait for them).
    let mut phase = Phase::new(shadow, TAG_GATHER);
    for peer in (0..size).filter(|&p| p != rank) {
        let ((at, n), (mine, len)) = (chunks.of(peer), chunks.of(rank));
        // SAFETY: chunk `peer` and chunk `rank` of the caller's receive buffer.
        unsafe {
            phase.recv(out + at, n, peer);
            phase.send(out + mine, len, peer);
        }
    }
    let gathered = phase.wait();
    // SAFETY: the caller's communicator.
    Some(unsafe { done("MPI_Allreduce", comm, if rc == SUCCESS { gathered } else { rc }) })
}

/// `MPI_Reduce_scatter_block` on the device path, or `None`.
///
/// # Safety
/// As `MPI_Reduce_scatter_block`.
pub unsafe fn reduce_scatter_block(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> Option<c_int> {
    // SAFETY: the caller's communicator.
    let (rank, size) = unsafe { site(comm) };
    let total = recvcount.checked_mul(size)?;
    let bytes = type_geometry(dt, total).ok()?.0;
    let reduction = Reduction::of(dt, op);
    let in_place = sendbuf == in_place().cast_const();
    let elem = reduction.map_or(1, |r| r.elem.size());
    let chunks = Chunks { count: total.max(0) as usize, size: size as usize, elem };
    let mine = || {
        can_reduce(reduction, chunks)
            && if in_place {
                contiguous_device(recvbuf, total, dt).is_some()
            } else {
                contiguous_device(sendbuf, total, dt).is_some() && contiguous_device(recvbuf, recvcount, dt).is_some()
            }
    };
    // SAFETY: the caller's communicator.
    if !unsafe { agreed(comm, bytes, mine) }? {
        return None;
    }
    let reduction = reduction?;
    // SAFETY: every rank agreed.
    let shadow = match unsafe { shadow(comm) } {
        Ok(c) => c,
        // SAFETY: the caller's communicator.
        Err(rc) => return Some(unsafe { done("MPI_Reduce_scatter_block", comm, rc) }),
    };
    let (src, out) = (if in_place { recvbuf as usize } else { sendbuf as usize }, recvbuf as usize);
    // In place the chunk is reduced where it lies, then moved to the buffer's start (equal
    // chunks: chunk `rank` overlaps the start only when it is the start).
    let (mine, len) = chunks.of(rank);
    let acc = if in_place { src + mine } else { out };
    // SAFETY: the caller's buffers: the input of every chunk, room for chunk `rank` at `acc`.
    let mut rc = unsafe { reduce_scatter_into(shadow, (rank, size), chunks, reduction, src, acc) };
    if rc == SUCCESS && acc != out {
        // SAFETY: distinct ranges of the caller's receive buffer (see above).
        rc = unsafe { device_copy(out, acc, len) };
    }
    // SAFETY: the caller's communicator.
    Some(unsafe { done("MPI_Reduce_scatter_block", comm, rc) })
}
