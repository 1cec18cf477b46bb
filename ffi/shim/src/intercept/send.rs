//! Sends in every mode (`MPI_Send`, `MPI_Ssend`, `MPI_Bsend`, `MPI_Rsend` and their
//! `MPI_I...` forms): host buffers go straight to the MPI library, without the shim's lock
//! while the shim is idle; a contiguous device buffer is the shim's (an envelope and
//! gpulmt within the node, host staging beyond it); a device buffer of a non-contiguous
//! datatype, or of a buffered send, is staged whole and sent by the library from host
//! memory.
//!
//! Two modes change on the way: a ready send (`MPI_Rsend`) is sent as a standard send,
//! which the standard allows ("a ready send can be replaced by a standard send with no
//! effect on the behaviour of the program other than performance"): the receives a
//! ready send relies on are posted to the shim, which matches them with probes, so the
//! library itself never has them posted. A buffered send of a device buffer
//! (`MPI_Bsend`) is the library's buffered send of a host copy: the data goes into the
//! buffer the program attached, as MPI says, and the program may reuse its device
//! buffer at once.

use std::ffi::{c_int, c_void};

use mpi_sys::{
    MPI_Comm, MPI_Datatype, MPI_Request, PMPI_Bsend, PMPI_Ibsend, PMPI_Irsend, PMPI_Isend, PMPI_Issend, PMPI_Rsend,
    PMPI_Send, PMPI_Ssend,
};

use super::{active, raise, wait_op};
use crate::hostmem;
use crate::raw::*;
use crate::staging::{Role, Staged};
use crate::state::{self, lock, Shim};

/// A send's mode.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    Standard,
    /// Completes once the receive has matched (`MPI_Ssend`).
    Sync,
    /// Through the buffer the program attached (`MPI_Bsend`).
    Buffered,
    /// The receive is posted already (`MPI_Rsend`): sent as a standard send (see the
    /// module's doc).
    Ready,
}

impl Mode {
    /// The library's blocking send the shim uses for this mode.
    fn pmpi(self) -> PmpiSend {
        match self {
            Mode::Standard | Mode::Ready => PMPI_Send,
            Mode::Sync => PMPI_Ssend,
            Mode::Buffered => PMPI_Bsend,
        }
    }

    /// The library's non-blocking send the shim uses for this mode.
    fn ipmpi(self) -> PmpiIsend {
        match self {
            Mode::Standard | Mode::Ready => PMPI_Isend,
            Mode::Sync => PMPI_Issend,
            Mode::Buffered => PMPI_Ibsend,
        }
    }

    /// The MPI function of this mode (in messages).
    pub fn name(self, nonblocking: bool) -> &'static str {
        match (self, nonblocking) {
            (Mode::Standard, false) => "MPI_Send",
            (Mode::Sync, false) => "MPI_Ssend",
            (Mode::Buffered, false) => "MPI_Bsend",
            (Mode::Ready, false) => "MPI_Rsend",
            (Mode::Standard, true) => "MPI_Isend",
            (Mode::Sync, true) => "MPI_Issend",
            (Mode::Buffered, true) => "MPI_Ibsend",
            (Mode::Ready, true) => "MPI_Irsend",
        }
    }
}

/// How a send's buffer travels.
enum SendPath {
    /// Straight to the MPI library (host memory, empty).
    Mpi,
    /// A contiguous device buffer of this many bytes: the shim's.
    Device(usize),
    /// A device buffer the library sends from a host copy: a non-contiguous datatype, or
    /// a buffered send.
    Staged(Staged),
}

fn send_path(
    s: &mut Shim,
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    mode: Mode,
    nonblocking: bool,
) -> Result<SendPath, c_int> {
    // An invalid datatype or count goes to the MPI library, which reports it.
    let Ok((bytes, contiguous)) = hostmem::geometry(dt, count) else {
        return Ok(SendPath::Mpi);
    };
    if bytes == 0 || !s.is_device(buf as usize, bytes) {
        return Ok(SendPath::Mpi);
    }
    if contiguous && mode != Mode::Buffered {
        return Ok(SendPath::Device(bytes));
    }
    match s.stage_buffer(buf as usize, count, dt, Role::In, mode.name(nonblocking))? {
        Some(staged) => Ok(SendPath::Staged(staged)),
        None => Ok(SendPath::Mpi),
    }
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
    let mode = if SYNC { Mode::Sync } else { Mode::Standard };
    // SAFETY: the caller's arguments.
    unsafe { send_blocking(buf, count, dt, dest, tag, comm, mode) }
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
pub(super) unsafe fn send_blocking(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    mode: Mode,
) -> c_int {
    let mut g = lock();
    let Some(s) = g.as_mut() else {
        drop(g);
        // SAFETY: the caller's arguments, passed on.
        return unsafe { mode.pmpi()(buf, count, dt, dest, tag, comm) };
    };
    let path = match send_path(s, buf, count, dt, mode, false) {
        Ok(p) => p,
        Err(rc) => {
            drop(g);
            // SAFETY: the user's communicator.
            return unsafe { raise(comm, rc) };
        }
    };
    let id = match path {
        SendPath::Mpi if s.is_idle() => {
            drop(g);
            // SAFETY: as above.
            return unsafe { mode.pmpi()(buf, count, dt, dest, tag, comm) };
        }
        SendPath::Staged(staged) if s.is_idle() => {
            drop(g);
            // SAFETY: the staged copy of the caller's buffer, laid out as the device buffer
            // (`Staged::pointer`), with the caller's count and datatype; it lives until the
            // send returns.
            return unsafe { mode.pmpi()(staged.pointer(0, buf.cast_mut()), count, dt, dest, tag, comm) };
        }
        SendPath::Mpi => {
            // The shim has transfers running: send without blocking, progress them.
            let mut inner = request_null();
            // SAFETY: the user's buffer stays valid: we wait before returning.
            let rc = unsafe { mode.ipmpi()(buf, count, dt, dest, tag, comm, &mut inner) };
            if rc != SUCCESS {
                return rc;
            }
            s.track_host_send(inner, comm)
        }
        SendPath::Staged(staged) => {
            let mut inner = request_null();
            // SAFETY: as above; the staged copy lives in the operation until it completes.
            let rc = unsafe { mode.ipmpi()(staged.pointer(0, buf.cast_mut()), count, dt, dest, tag, comm, &mut inner) };
            if rc != SUCCESS {
                return rc;
            }
            s.track_staged_op(inner, staged, comm, mode.name(false), false).0
        }
        SendPath::Device(bytes) => {
            match s.start_device_send(buf as usize, bytes, dest, tag, comm, mode == Mode::Sync, false) {
                Ok((id, _)) => id,
                Err(rc) => {
                    drop(g);
                    // SAFETY: the user's communicator.
                    return unsafe { raise(comm, rc) };
                }
            }
        }
    };
    drop(g);
    let d = wait_op(id);
    // SAFETY: the user's communicator.
    unsafe { raise(comm, d.error) }
}

/// A non-blocking send in `mode`: a contiguous device buffer is the shim's (a generalized
/// request in `*request`), a staged one the library's on a host copy (a generalized
/// request too, which holds the copy), anything else goes to the MPI library.
///
/// # Safety
/// The caller's `MPI_Isend` arguments (see [`MPI_Isend`]).
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn send_nonblocking(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
    mode: Mode,
) -> c_int {
    let pass = || {
        // SAFETY: the caller's arguments, passed on.
        unsafe { mode.ipmpi()(buf, count, dt, dest, tag, comm, request) }
    };
    if !active() || dest == proc_null() {
        return pass();
    }
    let mut g = lock();
    let Some(s) = g.as_mut() else {
        drop(g);
        return pass();
    };
    let rc = match send_path(s, buf, count, dt, mode, true) {
        Err(rc) => rc,
        Ok(SendPath::Mpi) => {
            drop(g);
            return pass();
        }
        Ok(SendPath::Staged(staged)) => {
            let mut inner = request_null();
            // SAFETY: the staged copy, laid out as the caller's buffer, lives in the operation
            // until the send completes.
            let rc = unsafe { mode.ipmpi()(staged.pointer(0, buf.cast_mut()), count, dt, dest, tag, comm, &mut inner) };
            if rc != SUCCESS {
                return rc;
            }
            let handle = s.track_staged(inner, staged, comm, mode.name(true));
            // SAFETY: the caller's out-pointer.
            unsafe { *request = handle };
            return SUCCESS;
        }
        Ok(SendPath::Device(bytes)) => {
            match s.start_device_send(buf as usize, bytes, dest, tag, comm, mode == Mode::Sync, true) {
                Ok((_, handle)) => {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *request = handle };
                    return SUCCESS;
                }
                Err(rc) => rc,
            }
        }
    };
    drop(g);
    // SAFETY: the user's communicator.
    unsafe { raise(comm, rc) }
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
    unsafe { send_nonblocking(buf, count, dt, dest, tag, comm, request, Mode::Standard) }
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
    unsafe { send_nonblocking(buf, count, dt, dest, tag, comm, request, Mode::Sync) }
}

/// `MPI_Bsend`: a host buffer goes to `PMPI_Bsend`; a device buffer is staged and the
/// library's buffered send copies the host copy into the attached buffer.
///
/// # Safety
/// As `MPI_Bsend`: `buf` holds `count` elements of `dt`, and `dt` and `comm` are valid handles.
#[no_mangle]
pub unsafe extern "C" fn MPI_Bsend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    if !active() || dest == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Bsend(buf, count, dt, dest, tag, comm) };
    }
    // SAFETY: the caller's arguments.
    unsafe { send_blocking(buf, count, dt, dest, tag, comm, Mode::Buffered) }
}

/// `MPI_Ibsend`: as [`MPI_Bsend`], without blocking.
///
/// # Safety
/// As `MPI_Ibsend`: as [`MPI_Isend`].
#[no_mangle]
pub unsafe extern "C" fn MPI_Ibsend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { send_nonblocking(buf, count, dt, dest, tag, comm, request, Mode::Buffered) }
}

/// `MPI_Rsend`: with the shim active, a standard send ([`MPI_Send`]; see the module's doc).
///
/// # Safety
/// As `MPI_Rsend`: `buf` holds `count` elements of `dt`, and `dt` and `comm` are valid handles.
#[no_mangle]
pub unsafe extern "C" fn MPI_Rsend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
) -> c_int {
    if !active() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Rsend(buf, count, dt, dest, tag, comm) };
    }
    // SAFETY: the caller's arguments.
    unsafe { MPI_Send(buf, count, dt, dest, tag, comm) }
}

/// `MPI_Irsend`: with the shim active, a standard send ([`MPI_Isend`]).
///
/// # Safety
/// As `MPI_Irsend`: as [`MPI_Isend`].
#[no_mangle]
pub unsafe extern "C" fn MPI_Irsend(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    if !active() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Irsend(buf, count, dt, dest, tag, comm, request) };
    }
    // SAFETY: the caller's arguments.
    unsafe { send_nonblocking(buf, count, dt, dest, tag, comm, request, Mode::Ready) }
}
