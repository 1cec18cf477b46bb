//! Receives (`MPI_Recv`, `MPI_Irecv`): a small contiguous host receive while the shim is
//! idle goes to the MPI library directly (`direct_recv`); others are posted to the shim,
//! which matches them in post order and tells envelopes from data.

use std::ffi::{c_int, c_void};

use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request, MPI_Status, PMPI_Irecv, PMPI_Recv};

use super::direct_recv::{recv_direct, recv_landing};
use super::{active, raise, wait_op, with};
use crate::envelope::ENVELOPE_BYTES;
use crate::hostmem;
use crate::raw::*;
use crate::state;

/// As `host_ready`, for a receive: with the landing buffer when it is smaller than an
/// envelope (`hostmem::recv_ready`).
#[inline(always)]
fn host_recv_ready(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> Option<(usize, Option<*mut u8>)> {
    if !state::host_fast_path() {
        return None;
    }
    hostmem::recv_ready(buf as usize, count, dt)
}

/// `MPI_Recv`: a contiguous host buffer while the shim is idle receives through the MPI
/// library directly; otherwise the shim matches the receive (an envelope's payload comes
/// through gpulmt, other data from the MPI library).
///
/// # Safety
/// As `MPI_Recv`: `buf` has room for `count` elements of `dt`, `dt` and `comm` are valid
/// handles, and `status` is `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Recv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    if !active() || source == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Recv(buf, count, dt, source, tag, comm, status) };
    }
    // As in `send_passes`: the remembered buffer, below MPI_THREAD_MULTIPLE.
    if state::host_fast_path() {
        if let Some((cap, landing)) = hostmem::memo_recv_ready(buf as usize, count, dt) {
            // SAFETY: the caller's arguments; the landing buffer of this thread.
            return unsafe { recv_landing(buf, count, dt, source, tag, comm, status, cap, landing) };
        }
    }
    // The whole check, here too: unlike a send, the receive needs a stack frame anyway
    // (its status is looked at), and a second function would set up another.
    let ready = host_recv_ready(buf, count, dt);
    if let Some((cap, Some(landing))) = ready {
        // SAFETY: the caller's arguments; the landing buffer of this thread.
        return unsafe { recv_landing(buf, count, dt, source, tag, comm, status, cap, landing) };
    }
    // SAFETY: the caller's arguments.
    unsafe { recv_blocking(buf, count, dt, source, tag, comm, status, ready) }
}

/// A blocking receive that is not a small host receive the fast path takes itself:
/// `ready` is what `host_recv_ready` found. Out of line, like `send_blocking`.
///
/// # Safety
/// The caller's `MPI_Recv` arguments (see [`MPI_Recv`]); `ready` is what `host_recv_ready`
/// found for them.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
unsafe fn recv_blocking(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    ready: Option<(usize, Option<*mut u8>)>,
) -> c_int {
    let pass = || {
        // SAFETY: the caller's arguments, passed on.
        unsafe { PMPI_Recv(buf, count, dt, source, tag, comm, status) }
    };
    if let Some((cap, landing)) = ready {
        // SAFETY: the caller's arguments.
        return unsafe { recv_direct(buf, count, dt, source, tag, comm, status, cap, landing) };
    }
    match with(|s| s.direct_recv_bytes(buf as usize, count, dt)) {
        None => return pass(),
        Some(Some(cap)) => {
            let landing = if cap < ENVELOPE_BYTES { hostmem::landing() } else { None };
            // SAFETY: the caller's arguments.
            return unsafe { recv_direct(buf, count, dt, source, tag, comm, status, cap, landing) };
        }
        Some(None) => {}
    }
    let posted = with(|s| s.post_recv(buf as usize, count, dt, source, tag, comm, false));
    let id = match posted {
        // Inactive, or arguments the MPI library rejects (and reports) itself.
        None | Some(Err(_)) => return pass(),
        Some(Ok((id, _))) => id,
    };
    let d = wait_op(id);
    // SAFETY: the caller's status pointer; the user's communicator.
    unsafe {
        fill_status(status, d.source, d.tag, d.error, d.bytes, d.cancelled);
        raise(comm, d.error)
    }
}

/// `MPI_Irecv`: posted to the shim, which matches it in post order; the request is a
/// generalized request the shim completes.
///
/// # Safety
/// As `MPI_Irecv`: `buf` has room for `count` elements of `dt` and stays valid (and unused by
/// the program) until the request completes, `dt` and `comm` are valid handles, and
/// `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Irecv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let pass = || {
        // SAFETY: the caller's arguments, passed on.
        unsafe { PMPI_Irecv(buf, count, dt, source, tag, comm, request) }
    };
    if !active() || source == proc_null() {
        return pass();
    }
    match with(|s| s.post_recv(buf as usize, count, dt, source, tag, comm, true)) {
        // Inactive, or arguments the MPI library rejects (and reports) itself.
        None | Some(Err(_)) => pass(),
        Some(Ok((_, handle))) => {
            // SAFETY: the caller's out-pointer.
            unsafe { *request = handle };
            SUCCESS
        }
    }
}
