//! Sends (`MPI_Send`, `MPI_Ssend`, `MPI_Isend`, `MPI_Issend`): host buffers go straight
//! to the MPI library, without the shim's lock while the shim is idle; a contiguous
//! device buffer is the shim's (an envelope and gpulmt within the node, host staging
//! beyond it).

use std::ffi::{c_int, c_void};

use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request, PMPI_Isend, PMPI_Issend, PMPI_Send, PMPI_Ssend};

use super::{active, raise, wait_op};
use crate::hostmem;
use crate::raw::*;
use crate::state::{self, lock, Shim};

/// How a send's buffer travels.
enum SendPath {
    /// Straight to the MPI library (host memory, empty, or a non-contiguous datatype).
    Mpi,
    /// A contiguous device buffer of this many bytes: the shim's.
    Device(usize),
}

fn send_path(s: &mut Shim, buf: *const c_void, count: c_int, dt: MPI_Datatype) -> Result<SendPath, c_int> {
    // An invalid datatype or count goes to the MPI library, which reports it.
    let Ok((bytes, contiguous)) = hostmem::geometry(dt, count) else {
        return Ok(SendPath::Mpi);
    };
    if bytes == 0 || !s.is_device(buf as usize, bytes) {
        return Ok(SendPath::Mpi);
    }
    Ok(if contiguous { SendPath::Device(bytes) } else { SendPath::Mpi })
}

/// The bytes of a contiguous buffer this thread already knows to be host memory, while
/// the shim is idle: a blocking send or receive of it goes to the MPI library without
/// the shim's lock (on an 8-byte host ping-pong the lock and the checks under it were
/// most of the shim's cost). Anything else (`None`) takes the locked path.
#[inline(always)]
fn host_ready(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> Option<usize> {
    if !state::host_fast_path() {
        return None;
    }
    hostmem::ready(buf as usize, count, dt)
}

/// Whether a blocking send goes straight to the MPI library on what can be decided
/// without a call: the shim is off, the destination is MPI_PROC_NULL, or the buffer is
/// the one `hostmem::memo_ready` remembers (below MPI_THREAD_MULTIPLE). With no call,
/// the MPI function needs no stack frame and jumps to the library's.
#[inline(always)]
fn send_passes(buf: *const c_void, count: c_int, dt: MPI_Datatype, dest: c_int) -> bool {
    !active()
        || dest == proc_null()
        || (state::host_fast_path() && hostmem::memo_ready(buf as usize, count, dt).is_some())
}

/// A blocking send of an active shim that `send_passes` did not let through: a host
/// buffer (`host_ready`) still goes to the library, anything else to `send_blocking`.
///
/// # Safety
/// The caller's `MPI_Send` arguments (see [`MPI_Send`]), with the shim active.
#[inline(never)]
unsafe fn send_checked<const SYNC: bool>(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    if host_ready(buf, count, dt).is_some() {
        let pmpi: PmpiSend = if SYNC { PMPI_Ssend } else { PMPI_Send };
        // SAFETY: the caller's arguments, passed on.
        return unsafe { pmpi(buf, count, dt, dest, tag, comm) };
    }
    // SAFETY: the caller's arguments.
    unsafe { send_blocking(buf, count, dt, dest, tag, comm, SYNC) }
}

type PmpiSend = unsafe extern "C" fn(*const c_void, c_int, MPI_Datatype, c_int, c_int, MPI_Comm) -> c_int;
type PmpiIsend =
    unsafe extern "C" fn(*const c_void, c_int, MPI_Datatype, c_int, c_int, MPI_Comm, *mut MPI_Request) -> c_int;

/// A blocking send of an active shim that is not a host send the shim may leave to
/// the library without its lock: decided under the lock.
///
/// # Safety
/// The caller's `MPI_Send` arguments (see [`MPI_Send`]), with the shim active.
#[inline(never)]
unsafe fn send_blocking(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    sync: bool,
) -> c_int {
    let (pmpi, ipmpi): (PmpiSend, PmpiIsend) = if sync { (PMPI_Ssend, PMPI_Issend) } else { (PMPI_Send, PMPI_Isend) };
    let mut g = lock();
    let Some(s) = g.as_mut() else {
        drop(g);
        // SAFETY: the caller's arguments, passed on.
        return unsafe { pmpi(buf, count, dt, dest, tag, comm) };
    };
    let id = match send_path(s, buf, count, dt) {
        Err(rc) => {
            drop(g);
            // SAFETY: the user's communicator.
            return unsafe { raise(comm, rc) };
        }
        Ok(SendPath::Mpi) if s.is_idle() => {
            drop(g);
            // SAFETY: as above.
            return unsafe { pmpi(buf, count, dt, dest, tag, comm) };
        }
        Ok(SendPath::Mpi) => {
            // The shim has transfers running: send without blocking, progress them.
            let mut inner = request_null();
            // SAFETY: the user's buffer stays valid: we wait before returning.
            let rc = unsafe { ipmpi(buf, count, dt, dest, tag, comm, &mut inner) };
            if rc != SUCCESS {
                return rc;
            }
            s.track_host_send(inner, comm)
        }
        Ok(SendPath::Device(bytes)) => match s.start_device_send(buf as usize, bytes, dest, tag, comm, sync, false) {
            Ok((id, _)) => id,
            Err(rc) => {
                drop(g);
                // SAFETY: the user's communicator.
                return unsafe { raise(comm, rc) };
            }
        },
    };
    drop(g);
    let d = wait_op(id);
    // SAFETY: the user's communicator.
    unsafe { raise(comm, d.error) }
}

/// The non-blocking sends, `MPI_Isend` and (with `sync`) `MPI_Issend`: a contiguous device
/// buffer is the shim's (a generalized request in `*request`), anything else goes to the
/// MPI library.
///
/// # Safety
/// The caller's `MPI_Isend` arguments (see [`MPI_Isend`]).
#[allow(clippy::too_many_arguments)]
unsafe fn send_nonblocking(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
    sync: bool,
) -> c_int {
    let ipmpi: PmpiIsend = if sync { PMPI_Issend } else { PMPI_Isend };
    let pass = || {
        // SAFETY: the caller's arguments, passed on.
        unsafe { ipmpi(buf, count, dt, dest, tag, comm, request) }
    };
    if !active() || dest == proc_null() {
        return pass();
    }
    let mut g = lock();
    let Some(s) = g.as_mut() else {
        drop(g);
        return pass();
    };
    match send_path(s, buf, count, dt) {
        Err(rc) => {
            drop(g);
            // SAFETY: the user's communicator.
            unsafe { raise(comm, rc) }
        }
        Ok(SendPath::Mpi) => {
            drop(g);
            pass()
        }
        Ok(SendPath::Device(bytes)) => match s.start_device_send(buf as usize, bytes, dest, tag, comm, sync, true) {
            Ok((_, handle)) => {
                // SAFETY: the caller's out-pointer.
                unsafe { *request = handle };
                SUCCESS
            }
            Err(rc) => {
                drop(g);
                // SAFETY: the user's communicator.
                unsafe { raise(comm, rc) }
            }
        },
    }
}

/// `MPI_Send`: a contiguous device buffer to a rank of this node moves through gpulmt (an
/// envelope, then the transfer); anything else goes to `PMPI_Send`.
///
/// # Safety
/// As `MPI_Send`: `buf` holds `count` elements of `dt`, and `dt` and `comm` are valid handles.
#[no_mangle]
pub unsafe extern "C" fn MPI_Send(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    if send_passes(buf, count, dt, dest) {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Send(buf, count, dt, dest, tag, comm) };
    }
    // SAFETY: the caller's arguments.
    unsafe { send_checked::<false>(buf, count, dt, dest, tag, comm) }
}

/// `MPI_Ssend`: as [`MPI_Send`], completing once the receive has matched.
///
/// # Safety
/// As `MPI_Ssend`: `buf` holds `count` elements of `dt`, and `dt` and `comm` are valid handles.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ssend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    if send_passes(buf, count, dt, dest) {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Ssend(buf, count, dt, dest, tag, comm) };
    }
    // SAFETY: the caller's arguments. A device send completes once gpulmt moved the
    // data into the receiver's buffer, which implies the receive was matched.
    unsafe { send_checked::<true>(buf, count, dt, dest, tag, comm) }
}

/// `MPI_Isend`: as [`MPI_Send`], without blocking; a device send's request is a generalized
/// request the shim completes.
///
/// # Safety
/// As `MPI_Isend`: `buf` holds `count` elements of `dt` and stays valid and unchanged until the
/// request completes, `dt` and `comm` are valid handles, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Isend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { send_nonblocking(buf, count, dt, dest, tag, comm, request, false) }
}

/// `MPI_Issend`: as [`MPI_Isend`], completing once the receive has matched.
///
/// # Safety
/// As `MPI_Issend`: `buf` holds `count` elements of `dt` and stays valid and unchanged until the
/// request completes, `dt` and `comm` are valid handles, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Issend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { send_nonblocking(buf, count, dt, dest, tag, comm, request, true) }
}
