//! `MPI_Iprobe` and `MPI_Probe`: the shim answers for the message a receive would get,
//! with the payload's size when it is an envelope (which it may have to take from the
//! MPI library to look at, keeping it for that receive).

use std::ffi::c_int;

use mpi_sys::{MPI_Comm, MPI_Status, PMPI_Iprobe, PMPI_Probe};

use super::{active, with};
use crate::raw::*;

/// `MPI_Iprobe`: whether a receive of (`source`, `tag`, `comm`) would get a message now, and its
/// status, with the payload's size for an envelope.
///
/// # Safety
/// As `MPI_Iprobe`: `comm` is a valid communicator, `flag` is valid for writes, and `status`
/// is `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iprobe(
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if !active() || source == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Iprobe(source, tag, comm, flag, status) };
    }
    match with(|s| s.iprobe(source, tag, comm)) {
        // SAFETY: as above.
        None => unsafe { PMPI_Iprobe(source, tag, comm, flag, status) },
        Some(found) => {
            // SAFETY: the caller's out-pointers.
            unsafe {
                *flag = c_int::from(found.is_some());
                if let Some((src, t, bytes)) = found {
                    fill_status(status, src, t, SUCCESS, bytes, false);
                }
            }
            SUCCESS
        }
    }
}

/// `MPI_Probe`: [`MPI_Iprobe`] until a message is there (the shim's progress runs meanwhile).
///
/// # Safety
/// As `MPI_Probe`: `comm` is a valid communicator, and `status` is `MPI_STATUS_IGNORE` or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Probe(source: c_int, tag: c_int, comm: MPI_Comm, status: *mut MPI_Status) -> c_int {
    if !active() || source == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Probe(source, tag, comm, status) };
    }
    loop {
        match with(|s| s.iprobe(source, tag, comm)) {
            // SAFETY: as above.
            None => return unsafe { PMPI_Probe(source, tag, comm, status) },
            Some(Some((src, t, bytes))) => {
                // SAFETY: the caller's status.
                unsafe { fill_status(status, src, t, SUCCESS, bytes, false) };
                return SUCCESS;
            }
            Some(None) => std::hint::spin_loop(),
        }
    }
}
