//! `MPI_Barrier`: while the shim is active, always a non-blocking barrier waited for
//! with the shim's progress, so that a peer's transfer that needs this rank can finish
//! meanwhile. Always, not only while this rank has transfers running: MPI matches a
//! blocking barrier only with blocking ones, and whether the shim has work in flight
//! differs between ranks (a rank with an `MPI_Irecv` posted would issue
//! `PMPI_Ibarrier` while its idle peer issued `PMPI_Barrier`, and neither would leave:
//! issue 31). Every collective the shim wraps issues the same MPI call on every rank,
//! whatever each rank's own state.

use std::ffi::c_int;

use mpi_sys::{MPI_Comm, PMPI_Barrier, PMPI_Ibarrier};

use super::active;
use super::completion::MPI_Wait;
use crate::raw::*;

/// `MPI_Barrier`: with the shim active, `PMPI_Ibarrier` waited for by the shim's
/// [`MPI_Wait`] (progress while the shim has work, the library's blocking wait once it
/// has none); without it, `PMPI_Barrier`.
///
/// # Safety
/// As `MPI_Barrier`: `comm` is a valid communicator.
#[no_mangle]
pub unsafe extern "C" fn MPI_Barrier(comm: MPI_Comm) -> c_int {
    if !active() {
        // SAFETY: the caller's communicator.
        return unsafe { PMPI_Barrier(comm) };
    }
    let mut req = request_null();
    // SAFETY: the caller's communicator; the request is ours, waited for below.
    unsafe {
        let rc = PMPI_Ibarrier(comm, &mut req);
        if rc != SUCCESS {
            return rc;
        }
        MPI_Wait(&mut req, status_ignore())
    }
}
