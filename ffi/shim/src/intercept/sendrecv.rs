//! `MPI_Sendrecv`, made of the shim's own `MPI_Irecv`, `MPI_Isend` and `MPI_Waitall`, so
//! that either buffer may be device memory.

use std::ffi::{c_int, c_void};

use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Status, PMPI_Sendrecv};

use super::active;
use super::completion::{MPI_Wait, MPI_Waitall};
use super::recv::MPI_Irecv;
use super::send::MPI_Isend;
use crate::raw::*;

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
