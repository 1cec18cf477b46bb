//! Completion (`MPI_Wait`, `MPI_Test` and their `all`, `any` and `some` forms): the MPI
//! library completes every request, the shim's generalized requests included, while
//! the shim's progress runs between its tests; a failed shim request's error goes to
//! its own communicator's handler. The shim's persistent requests take part through the
//! inner requests of their placeholders (`persistent::translated`).

use std::ffi::c_int;

use mpi_sys::{
    MPI_Request, MPI_Status, PMPI_Comm_get_errhandler, PMPI_Comm_set_errhandler, PMPI_Errhandler_free, PMPI_Test,
    PMPI_Testall, PMPI_Testany, PMPI_Testsome, PMPI_Wait, PMPI_Waitall, PMPI_Waitany, PMPI_Waitsome,
    RSMPI_ERRORS_RETURN,
};

use super::persistent::translated;
use super::{active, progress_idle, raise};
use crate::raw::*;
use crate::state::errored;

/// Runs a completion call of the MPI library on `reqs[..n]`. When one of them is a
/// shim request that failed, MPI would hand the error to MPI_COMM_WORLD's or
/// MPI_COMM_SELF's handler (a generalized request has no communicator): those are set
/// aside for the call, and the failed request's communicator's handler gets the error
/// instead.
///
/// # Safety
/// `reqs` is NULL or holds `n` request handles, and `call` is a completion call of the MPI
/// library on them (safe to run with the arguments it captured).
unsafe fn complete(reqs: *const MPI_Request, n: c_int, call: impl FnOnce() -> c_int) -> c_int {
    let comm = {
        let e = errored();
        if e.is_empty() || reqs.is_null() || n <= 0 {
            None
        } else {
            // SAFETY: the caller's array of n requests.
            let reqs = unsafe { std::slice::from_raw_parts(reqs, n as usize) };
            e.iter().find(|x| reqs.contains(&x.handle)).map(|x| x.comm)
        }
    };
    let Some(comm) = comm else { return call() };
    // MPI-3 libraries (Open MPI 4.1) raise an error of a request without a communicator
    // on MPI_COMM_WORLD, MPI-4 ones (MPICH 4) on MPI_COMM_SELF: both are set aside.
    let sides = [comm_world(), comm_self()];
    let mut old = [std::mem::MaybeUninit::uninit(), std::mem::MaybeUninit::uninit()];
    // SAFETY: the two handlers are swapped and restored around the call.
    unsafe {
        for (c, o) in sides.iter().zip(old.iter_mut()) {
            PMPI_Comm_get_errhandler(*c, o.as_mut_ptr());
            PMPI_Comm_set_errhandler(*c, RSMPI_ERRORS_RETURN);
        }
        let rc = call();
        for (c, o) in sides.iter().zip(old.iter_mut()) {
            let mut o = o.assume_init();
            PMPI_Comm_set_errhandler(*c, o);
            PMPI_Errhandler_free(&mut o);
        }
        raise(comm, rc)
    }
}

/// `MPI_Wait`: while the shim has transfers running, tests with its progress in between.
///
/// # Safety
/// As `MPI_Wait`: `request` points to a request handle, and `status` is `MPI_STATUS_IGNORE` or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Wait(request: *mut MPI_Request, status: *mut MPI_Status) -> c_int {
    let body = |request: *mut MPI_Request| {
        loop {
            if !active() || progress_idle() {
                // SAFETY: the caller's arguments, passed on.
                return unsafe { complete(request, 1, || PMPI_Wait(request, status)) };
            }
            let mut flag = 0;
            // SAFETY: as above.
            let rc = unsafe { complete(request, 1, || PMPI_Test(request, &mut flag, status)) };
            if rc != SUCCESS || flag != 0 {
                return rc;
            }
        }
    };
    // SAFETY: the caller's request handle.
    unsafe { translated(request, 1, body) }
}

/// `MPI_Test`, after a round of the shim's progress.
///
/// # Safety
/// As `MPI_Test`: `request` points to a request handle, `flag` is valid for writes, and
/// `status` is `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Test(request: *mut MPI_Request, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
    let body = |request: *mut MPI_Request| {
        if active() {
            progress_idle();
        }
        // SAFETY: the caller's arguments, passed on.
        unsafe { complete(request, 1, || PMPI_Test(request, flag, status)) }
    };
    // SAFETY: the caller's request handle.
    unsafe { translated(request, 1, body) }
}

/// `MPI_Waitall`: while the shim has transfers running, tests with its progress in between.
///
/// # Safety
/// As `MPI_Waitall`: `requests` holds `count` request handles, and `statuses` is
/// `MPI_STATUSES_IGNORE` or has room for `count` statuses.
#[no_mangle]
pub unsafe extern "C" fn MPI_Waitall(count: c_int, requests: *mut MPI_Request, statuses: *mut MPI_Status) -> c_int {
    let body = |requests: *mut MPI_Request| {
        loop {
            if !active() || progress_idle() {
                // SAFETY: the caller's arguments, passed on.
                return unsafe { complete(requests, count, || PMPI_Waitall(count, requests, statuses)) };
            }
            let mut flag = 0;
            // SAFETY: as above.
            let rc = unsafe { complete(requests, count, || PMPI_Testall(count, requests, &mut flag, statuses)) };
            if rc != SUCCESS || flag != 0 {
                return rc;
            }
        }
    };
    // SAFETY: the caller's array of count request handles.
    unsafe { translated(requests, count, body) }
}

/// `MPI_Testall`, after a round of the shim's progress.
///
/// # Safety
/// As `MPI_Testall`: `requests` holds `count` request handles, `flag` is valid for writes,
/// and `statuses` is `MPI_STATUSES_IGNORE` or has room for `count` statuses.
#[no_mangle]
pub unsafe extern "C" fn MPI_Testall(
    count: c_int,
    requests: *mut MPI_Request,
    flag: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    let body = |requests: *mut MPI_Request| {
        if active() {
            progress_idle();
        }
        // SAFETY: the caller's arguments, passed on.
        unsafe { complete(requests, count, || PMPI_Testall(count, requests, flag, statuses)) }
    };
    // SAFETY: the caller's array of count request handles.
    unsafe { translated(requests, count, body) }
}

/// `MPI_Waitany`: while the shim has transfers running, tests with its progress in between.
///
/// # Safety
/// As `MPI_Waitany`: `requests` holds `count` request handles, `index` is valid for writes,
/// and `status` is `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Waitany(
    count: c_int,
    requests: *mut MPI_Request,
    index: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    let body = |requests: *mut MPI_Request| {
        loop {
            if !active() || progress_idle() {
                // SAFETY: the caller's arguments, passed on.
                return unsafe { complete(requests, count, || PMPI_Waitany(count, requests, index, status)) };
            }
            let mut flag = 0;
            // SAFETY: as above.
            let rc = unsafe { complete(requests, count, || PMPI_Testany(count, requests, index, &mut flag, status)) };
            if rc != SUCCESS || flag != 0 {
                return rc;
            }
        }
    };
    // SAFETY: the caller's array of count request handles.
    unsafe { translated(requests, count, body) }
}

/// `MPI_Testany`, after a round of the shim's progress.
///
/// # Safety
/// As `MPI_Testany`: `requests` holds `count` request handles, `index` and `flag` are valid
/// for writes, and `status` is `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Testany(
    count: c_int,
    requests: *mut MPI_Request,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    let body = |requests: *mut MPI_Request| {
        if active() {
            progress_idle();
        }
        // SAFETY: the caller's arguments, passed on.
        unsafe { complete(requests, count, || PMPI_Testany(count, requests, index, flag, status)) }
    };
    // SAFETY: the caller's array of count request handles.
    unsafe { translated(requests, count, body) }
}

/// `MPI_Waitsome`: while the shim has transfers running, tests with its progress in between.
///
/// # Safety
/// As `MPI_Waitsome`: `requests` holds `incount` request handles, `outcount` is valid for
/// writes, `indices` has room for `incount` ints, and `statuses` is `MPI_STATUSES_IGNORE`
/// or has room for `incount` statuses.
#[no_mangle]
pub unsafe extern "C" fn MPI_Waitsome(
    incount: c_int,
    requests: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    let body = |requests: *mut MPI_Request| {
        loop {
            if !active() || progress_idle() {
                // SAFETY: the caller's arguments, passed on.
                return unsafe {
                    complete(requests, incount, || PMPI_Waitsome(incount, requests, outcount, indices, statuses))
                };
            }
            // SAFETY: as above.
            let rc = unsafe {
                complete(requests, incount, || PMPI_Testsome(incount, requests, outcount, indices, statuses))
            };
            // SAFETY: the caller's out-pointer, written by PMPI_Testsome.
            if rc != SUCCESS || unsafe { *outcount } != 0 {
                return rc;
            }
        }
    };
    // SAFETY: the caller's array of incount request handles.
    unsafe { translated(requests, incount, body) }
}

/// `MPI_Testsome`, after a round of the shim's progress.
///
/// # Safety
/// As `MPI_Testsome`: `requests` holds `incount` request handles, `outcount` is valid for
/// writes, `indices` has room for `incount` ints, and `statuses` is `MPI_STATUSES_IGNORE`
/// or has room for `incount` statuses.
#[no_mangle]
pub unsafe extern "C" fn MPI_Testsome(
    incount: c_int,
    requests: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    let body = |requests: *mut MPI_Request| {
        if active() {
            progress_idle();
        }
        // SAFETY: the caller's arguments, passed on.
        unsafe { complete(requests, incount, || PMPI_Testsome(incount, requests, outcount, indices, statuses)) }
    };
    // SAFETY: the caller's array of incount request handles.
    unsafe { translated(requests, incount, body) }
}
