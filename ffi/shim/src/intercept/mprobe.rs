//! The program's matched probes and receives (`MPI_Mprobe`, `MPI_Improbe`, `MPI_Mrecv`,
//! `MPI_Imrecv`): the shim matches them with its own receives in MPI's order, and
//! receives what they matched into any buffer, an envelope's payload through gpulmt
//! (see `state/mprobe.rs`).

use std::ffi::{c_int, c_void};

use mpi_sys::{
    MPI_Comm, MPI_Datatype, MPI_Message, MPI_Request, MPI_Status, PMPI_Improbe, PMPI_Imrecv, PMPI_Mprobe, PMPI_Mrecv,
};

use super::{active, raise, wait_op, with};
use crate::raw::*;

/// `MPI_Improbe`: the message a receive of (`source`, `tag`, `comm`) would get now, taken
/// out of matching, with its status (an envelope's payload size).
///
/// # Safety
/// As `MPI_Improbe`: `comm` is valid, `flag` and `message` are valid for writes, and
/// `status` is `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Improbe(
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    flag: *mut c_int,
    message: *mut MPI_Message,
    status: *mut MPI_Status,
) -> c_int {
    if !active() || source == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Improbe(source, tag, comm, flag, message, status) };
    }
    match with(|s| s.improbe(source, tag, comm)) {
        // SAFETY: as above.
        None => unsafe { PMPI_Improbe(source, tag, comm, flag, message, status) },
        // SAFETY: the caller's communicator.
        Some(Err(rc)) => unsafe { raise(comm, rc) },
        Some(Ok(found)) => {
            // SAFETY: the caller's out-pointers.
            unsafe {
                *flag = c_int::from(found.is_some());
                if let Some((msg, src, t, bytes)) = found {
                    *message = msg;
                    fill_status(status, src, t, SUCCESS, bytes, false);
                }
            }
            SUCCESS
        }
    }
}

/// `MPI_Mprobe`: [`MPI_Improbe`] until a message is there (the shim's progress runs
/// meanwhile).
///
/// # Safety
/// As `MPI_Mprobe`: `comm` is valid, `message` is valid for writes, and `status` is
/// `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Mprobe(
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    message: *mut MPI_Message,
    status: *mut MPI_Status,
) -> c_int {
    if !active() || source == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Mprobe(source, tag, comm, message, status) };
    }
    loop {
        let mut flag = 0;
        // SAFETY: the caller's arguments; a local flag.
        let rc = unsafe { MPI_Improbe(source, tag, comm, &mut flag, message, status) };
        if rc != SUCCESS || flag != 0 {
            return rc;
        }
        std::hint::spin_loop();
    }
}

/// `MPI_Mrecv`: a message the shim's probe handed out is received by the shim (into any
/// buffer, an envelope's payload through gpulmt); others by the library.
///
/// # Safety
/// As `MPI_Mrecv`: `buf` has room for `count` elements of `dt`, `message` points to a
/// message handle from a matched probe, and `status` is `MPI_STATUS_IGNORE` or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Mrecv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    message: *mut MPI_Message,
    status: *mut MPI_Status,
) -> c_int {
    // SAFETY: the caller's pointer to a message handle.
    let msg = unsafe { *message };
    let started = if active() && msg != message_no_proc() {
        with(|s| s.mrecv(buf as usize, count, dt, msg, false)).flatten()
    } else {
        None
    };
    let Some((comm, started)) = started else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Mrecv(buf, count, dt, message, status) };
    };
    // SAFETY: the caller's out-pointer: the message is received.
    unsafe { *message = message_null() };
    let d = match started {
        Ok((id, _)) => wait_op(id),
        // SAFETY: the message's communicator.
        Err(rc) => return unsafe { raise(comm, rc) },
    };
    // SAFETY: the caller's status; the message's communicator.
    unsafe {
        fill_status(status, d.source, d.tag, d.error, d.bytes, d.cancelled);
        raise(comm, d.error)
    }
}

/// `MPI_Imrecv`: as [`MPI_Mrecv`], without blocking; the shim's receive is a generalized
/// request.
///
/// # Safety
/// As `MPI_Imrecv`: as [`MPI_Mrecv`], the buffer stays valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Imrecv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    message: *mut MPI_Message,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's pointer to a message handle.
    let msg = unsafe { *message };
    let started = if active() && msg != message_no_proc() {
        with(|s| s.mrecv(buf as usize, count, dt, msg, true)).flatten()
    } else {
        None
    };
    let Some((comm, started)) = started else {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Imrecv(buf, count, dt, message, request) };
    };
    // SAFETY: the caller's out-pointers.
    unsafe {
        *message = message_null();
        match started {
            Ok((_, handle)) => {
                *request = handle;
                SUCCESS
            }
            Err(rc) => raise(comm, rc),
        }
    }
}
