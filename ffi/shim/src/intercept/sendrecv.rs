//! `MPI_Sendrecv`, made of the shim's own `MPI_Irecv`, `MPI_Isend` and `MPI_Waitall`, so
//! that either buffer may be device memory; `MPI_Sendrecv_replace`, the same from a copy
//! of the buffer.

use std::ffi::{c_int, c_void};

use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Status, PMPI_Sendrecv, PMPI_Sendrecv_replace};

use super::completion::{MPI_Wait, MPI_Waitall};
use super::recv::MPI_Irecv;
use super::send::MPI_Isend;
use super::{active, raise, with};
use crate::raw::*;
use crate::staging::{Region, Role, Shape};

/// `MPI_Sendrecv`: the shim's [`MPI_Irecv`] and [`MPI_Isend`], then [`MPI_Waitall`].
///
/// # Safety
/// As `MPI_Sendrecv`: the send arguments as for `MPI_Send`, the receive arguments and
/// `status` as for `MPI_Recv`, and the two buffers do not overlap.
#[no_mangle]
pub unsafe extern "C" fn MPI_Sendrecv(
    sendbuf: *const c_void,
    sendcount: c_int,
    sendtype: MPI_Datatype,
    dest: c_int,
    sendtag: c_int,
    recvbuf: *mut c_void,
    recvcount: c_int,
    recvtype: MPI_Datatype,
    source: c_int,
    recvtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    if !active() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe {
            PMPI_Sendrecv(
                sendbuf, sendcount, sendtype, dest, sendtag, recvbuf, recvcount, recvtype, source, recvtag, comm,
                status,
            )
        };
    }
    let mut reqs = [request_null(), request_null()];
    // SAFETY: the caller's buffers stay valid: both requests finish before we return.
    unsafe {
        let rc = MPI_Irecv(recvbuf, recvcount, recvtype, source, recvtag, comm, &mut reqs[0]);
        if rc != SUCCESS {
            return rc;
        }
        let rc = MPI_Isend(sendbuf, sendcount, sendtype, dest, sendtag, comm, &mut reqs[1]);
        if rc != SUCCESS {
            let _ = MPI_Wait(&mut reqs[0], status_ignore());
            return rc;
        }
        let mut sts = [empty_status(), empty_status()];
        let rc = MPI_Waitall(2, reqs.as_mut_ptr(), sts.as_mut_ptr());
        if !status.is_null() && status != status_ignore() {
            *status = sts[0];
        }
        if rc == mpi_sys::MPI_ERR_IN_STATUS as c_int {
            return [sts[0].MPI_ERROR, sts[1].MPI_ERROR].into_iter().find(|&e| e != SUCCESS).unwrap_or(rc);
        }
        rc
    }
}

/// `MPI_Sendrecv_replace`: the buffer's data is copied first (a device buffer staged to
/// host memory, a host one copied: the span its elements cover), then [`MPI_Sendrecv`]
/// sends the copy and receives into the buffer, so the message received may be an
/// envelope and the buffer device memory.
///
/// # Safety
/// As `MPI_Sendrecv_replace`: `buf` holds `count` elements of `dt`, the handles are valid,
/// and `status` is `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Sendrecv_replace(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    sendtag: c_int,
    source: c_int,
    recvtag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    let pass = || {
        // SAFETY: the caller's arguments, passed on.
        unsafe { PMPI_Sendrecv_replace(buf, count, dt, dest, sendtag, source, recvtag, comm, status) }
    };
    if !active() {
        return pass();
    }
    // An invalid count or datatype is the library's to report; nothing to copy, nothing
    // the shim must do differently from a plain exchange.
    let Ok(Some(region)) = Region::of(buf as usize, Shape::Count { count: count.into(), dt }, Role::In) else {
        return pass();
    };
    let staged = match with(|s| s.stage_buffer(buf as usize, count, dt, Role::In, "MPI_Sendrecv_replace")) {
        None => return pass(),
        // SAFETY: the caller's communicator.
        Some(Err(code)) => return unsafe { raise(comm, code) },
        Some(Ok(staged)) => staged,
    };
    // The data to send: the staged copy, or a copy of the host span; either laid out as the
    // buffer (the span starts `lo` bytes from the pointer).
    let mut host_copy = Vec::new();
    let send = match &staged {
        Some(st) => st.pointer(0, buf).cast_const(),
        None => {
            host_copy.resize(region.bytes(), 0u8);
            // SAFETY: the span of the caller's host buffer that its elements cover.
            unsafe {
                std::ptr::copy_nonoverlapping(region.start() as *const u8, host_copy.as_mut_ptr(), host_copy.len())
            };
            host_copy.as_ptr().wrapping_offset(-region.lo).cast()
        }
    };
    // SAFETY: the copy, laid out as the caller's buffer, lives until the exchange returns;
    // the caller's buffer receives.
    unsafe { MPI_Sendrecv(send, count, dt, dest, sendtag, buf, count, dt, source, recvtag, comm, status) }
}
