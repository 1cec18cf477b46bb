//! The direct path of blocking host receives: while the shim has nothing in flight, the
//! MPI library receives into the user's buffer (or this thread's landing buffer) itself,
//! and only a message of an envelope's size is looked at and, if it is an envelope,
//! handed to the shim.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Status, PMPI_Mprobe, PMPI_Mrecv, PMPI_Recv};

use super::{raise, wait_op, with};
use crate::envelope::ENVELOPE_BYTES;
use crate::raw::*;
use crate::state::Done;
use crate::{hostmem, scratch};

/// Host receives the MPI library took straight into the user's buffer (`recv_direct`),
/// counted outside the shim's lock; `gpulmt_mpi_get_counters` adds them in.
pub(crate) static DIRECT_HOST_RECVS: AtomicU64 = AtomicU64::new(0);

/// The ENVELOPE_BYTES bytes at `p` when they are an envelope of this job (apart from the
/// fast path: messages of an envelope's size are rare).
///
/// # Safety
/// `p` is valid for reading ENVELOPE_BYTES bytes.
#[cold]
unsafe fn envelope_at(p: *const u8) -> Option<[u8; ENVELOPE_BYTES]> {
    // SAFETY: the caller's contract; a byte array has no alignment.
    let bytes = unsafe { p.cast::<[u8; ENVELOPE_BYTES]>().read() };
    with(|s| s.is_envelope(&bytes)).unwrap_or(false).then_some(bytes)
}

/// Counts a receive `recv_direct` left to the MPI library.
#[inline]
fn count_direct_recv() {
    // Relaxed: a statistic, read after the receives it counts have returned. Below
    // MPI_THREAD_MULTIPLE no other MPI call runs meanwhile, so a load and a store count
    // as well as the locked add, which costs far more than the rest of the count.
    if hostmem::serialized() {
        DIRECT_HOST_RECVS.store(DIRECT_HOST_RECVS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    } else {
        DIRECT_HOST_RECVS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Ends a direct receive the MPI library completed for the user: counts it, hands its
/// status over.
///
/// # Safety
/// `status` is MPI_STATUS_IGNORE or valid for writes.
#[inline]
unsafe fn direct_done(status: *mut MPI_Status, st: &MPI_Status, rc: c_int) -> c_int {
    count_direct_recv();
    if !status.is_null() && status != status_ignore() {
        // SAFETY: the caller's contract.
        unsafe { *status = *st };
    }
    rc
}

/// A blocking receive into a contiguous host buffer of `cap` bytes while the shim has
/// nothing in flight (`Shim::direct_recv_bytes`): the MPI library receives it itself,
/// and only a message of an envelope's size is looked at, so host traffic keeps the
/// library's own latency. A buffer that holds an envelope receives straight into it,
/// its first bytes kept aside to be put back should one arrive; a smaller one receives
/// into the `landing` buffer (`recv_landing`), or where there is none, takes a matched
/// probe and a receive.
///
/// # Safety
/// The caller's `MPI_Recv` arguments (see `MPI_Recv`), into a contiguous host buffer of
/// `cap` bytes; `landing` is this thread's landing buffer (`hostmem::landing`).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(super) unsafe fn recv_direct(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    cap: usize,
    landing: Option<*mut u8>,
) -> c_int {
    if cap < ENVELOPE_BYTES {
        if let Some(landing) = landing {
            // SAFETY: the caller's arguments and landing buffer.
            return unsafe { recv_landing(buf, count, dt, source, tag, comm, status, cap, landing) };
        }
    }
    let mut st = empty_status();
    let rc;
    // A message of an envelope's size for the shim to deliver: an envelope of this job
    // arrived, or in the probed path, may have.
    let mut envelope = None;
    if cap >= ENVELOPE_BYTES {
        let mut saved = [0u8; ENVELOPE_BYTES];
        // SAFETY: the user's host buffer holds cap >= ENVELOPE_BYTES bytes, and the
        // receive is theirs to write until we return.
        unsafe {
            std::ptr::copy_nonoverlapping(buf as *const u8, saved.as_mut_ptr(), ENVELOPE_BYTES);
            rc = PMPI_Recv(buf, count, dt, source, tag, comm, &mut st);
        }
        if rc == SUCCESS && status_bytes(&st) == ENVELOPE_BYTES {
            // SAFETY: as above; the library wrote these bytes.
            envelope = unsafe { envelope_at(buf as *const u8) };
        }
        if envelope.is_some() {
            // The payload goes into the buffer; what it does not cover stays as it was.
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(saved.as_ptr(), buf as *mut u8, ENVELOPE_BYTES) };
        }
    } else {
        let mut msg = message_null();
        // SAFETY: the caller's arguments; locals as out-pointers.
        let probed = unsafe { PMPI_Mprobe(source, tag, comm, &mut msg, &mut st) };
        if probed != SUCCESS {
            return probed;
        }
        if status_bytes(&st) == ENVELOPE_BYTES {
            // An envelope, or the user's host message of an envelope's size:
            // `deliver_direct` tells them apart.
            let mut bytes = [0u8; ENVELOPE_BYTES];
            // SAFETY: the matched message goes to our buffer of exactly its size.
            rc = unsafe { PMPI_Mrecv(bytes.as_mut_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), &mut msg, &mut st) };
            envelope = Some(bytes);
        } else {
            // SAFETY: the user's buffer with their count and datatype.
            rc = unsafe { PMPI_Mrecv(buf, count, dt, &mut msg, &mut st) };
        }
    }
    match envelope {
        // SAFETY: the caller's arguments.
        Some(bytes) if rc == SUCCESS => unsafe { deliver(buf, count, dt, source, tag, comm, status, &st, &bytes) },
        // SAFETY: the caller's status.
        _ => unsafe { direct_done(status, &st, rc) },
    }
}

/// `recv_direct` into a receive smaller than an envelope, through the landing buffer
/// (`scratch`): one receive, not a matched probe and a receive, which cost Open MPI
/// about 0.2 us more; the data is copied out. Inline: the fast path of small host
/// receives.
///
/// # Safety
/// As [`recv_direct`], with `cap` below `ENVELOPE_BYTES` and a landing buffer.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn recv_landing(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    cap: usize,
    landing: *mut u8,
) -> c_int {
    let mut st = empty_status();
    // SAFETY: ENVELOPE_BYTES bytes at the start of this thread's landing buffer,
    // which also absorbs Open MPI writing a longer message past that count; the
    // caller's source, tag and communicator.
    let mut rc = unsafe { PMPI_Recv(landing.cast(), ENVELOPE_BYTES as c_int, byte(), source, tag, comm, &mut st) };
    let bytes = status_bytes(&st);
    scratch::release_overrun(landing, bytes);
    if rc == SUCCESS && bytes == ENVELOPE_BYTES {
        // SAFETY: the library wrote ENVELOPE_BYTES bytes there.
        if let Some(envelope) = unsafe { envelope_at(landing) } {
            // SAFETY: the caller's arguments.
            return unsafe { deliver(buf, count, dt, source, tag, comm, status, &st, &envelope) };
        }
    }
    // SAFETY: the library wrote at least min(bytes, ENVELOPE_BYTES) >= min(bytes, cap)
    // bytes there (cap < ENVELOPE_BYTES), and the user's contiguous host buffer holds
    // `cap` bytes.
    unsafe { copy_small(landing, buf as *mut u8, bytes.min(cap)) };
    if rc == SUCCESS && bytes > cap {
        // As the library reports a message longer than the receive (its count stays the
        // message's): the buffer holds the first `cap` bytes.
        // SAFETY: the user's communicator.
        rc = unsafe { truncated(comm, &mut st) };
    }
    // SAFETY: the caller's status.
    unsafe { direct_done(status, &st, rc) }
}

/// Copies `n` bytes between buffers that do not overlap: 8 to 16 bytes (one or two
/// numbers, the common small message) inline as two overlapping words, where memcpy's
/// call cost more than the copy; other sizes through memcpy.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping(src, dst, n)`.
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: the caller's contract; with 8 <= n <= 16, [0, 8) and [n - 8, n) lie in both
    // buffers.
    unsafe {
        if (8..=16).contains(&n) {
            let head = src.cast::<u64>().read_unaligned();
            let tail = src.add(n - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(head);
            dst.add(n - 8).cast::<u64>().write_unaligned(tail);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, n);
        }
    }
}

/// Marks a direct receive truncated and reports it to the communicator's handler.
///
/// # Safety
/// `comm` is a valid communicator.
#[cold]
unsafe fn truncated(comm: MPI_Comm, st: &mut MPI_Status) -> c_int {
    st.MPI_ERROR = ERR_TRUNCATE;
    // SAFETY: the user's communicator.
    unsafe { raise(comm, ERR_TRUNCATE) }
}

/// Hands a message of an envelope's size that a direct receive took (`st`, `bytes`) to
/// the shim (`Shim::deliver_direct`), and waits for the receive it completes.
///
/// # Safety
/// The caller's `MPI_Recv` arguments (see `MPI_Recv`); `st` and `bytes` are the message the
/// direct receive took.
#[allow(clippy::too_many_arguments)]
#[cold]
unsafe fn deliver(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    st: &MPI_Status,
    bytes: &[u8; ENVELOPE_BYTES],
) -> c_int {
    let id = with(|s| s.deliver_direct((buf as usize, count, dt, source, tag, comm), st.MPI_SOURCE, st.MPI_TAG, bytes));
    let d = match id {
        Some(id) => wait_op(id),
        None => Done { source: st.MPI_SOURCE, tag: st.MPI_TAG, bytes: 0, error: ERR_INTERN, cancelled: false },
    };
    // SAFETY: the caller's status pointer; the user's communicator.
    unsafe {
        fill_status(status, d.source, d.tag, d.error, d.bytes, d.cancelled);
        raise(comm, d.error)
    }
}
