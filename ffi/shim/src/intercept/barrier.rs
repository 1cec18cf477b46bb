//! `MPI_Barrier`: while the shim has transfers running, a non-blocking barrier waited
//! for with progress, so that a peer's transfer that needs this rank can finish.

use std::ffi::c_int;

use mpi_sys::{MPI_Comm, PMPI_Barrier, PMPI_Ibarrier};

use super::completion::MPI_Wait;
use super::{active, progress_idle};
use crate::raw::*;

/// `MPI_Barrier`: while the shim has transfers running, a non-blocking barrier waited for with
/// progress.
///
/// # Safety
/// As `MPI_Barrier`: `comm` is a valid communicator.
#[no_mangle]
pub unsafe extern "C" fn MPI_Barrier(comm: MPI_Comm) -> c_int {
    if !active() || progress_idle() {
        // SAFETY: the caller's communicator.
        return unsafe { PMPI_Barrier(comm) };
    }
    // Transfers are running: a non-blocking barrier lets them progress meanwhile.
    let mut req = request_null();
    // SAFETY: as above; the request is ours, waited for below.
    unsafe {
        let rc = PMPI_Ibarrier(comm, &mut req);
        if rc != SUCCESS {
            return rc;
        }
        MPI_Wait(&mut req, status_ignore())
    }
}
