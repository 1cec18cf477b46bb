//! Persistent requests (`MPI_Send_init`, `MPI_Bsend_init`, `MPI_Ssend_init`,
//! `MPI_Rsend_init`, `MPI_Recv_init`, `MPI_Start`, `MPI_Startall`) whose operation the
//! shim must run: every persistent receive (the message may be an envelope, whatever the
//! buffer), every persistent send of a device buffer, and every persistent buffered send
//! (see `send_init`). Other persistent sends of host buffers are the library's own (a
//! ready send as a standard one: see `send`).
//!
//! The program holds a *placeholder*: a real persistent request of the library, a receive
//! from `MPI_PROC_NULL` that is never started, so the handle is valid and unique in any
//! MPI call. The shim keeps what the request describes; `MPI_Start` runs it as the shim's
//! non-blocking call (`MPI_Isend` in the request's mode, `MPI_Irecv`), whose request
//! (the library's or a generalized one) is the placeholder's *inner* request until it
//! completes. The completion calls (`MPI_Wait`, `MPI_Test` and their families,
//! `MPI_Request_get_status`) see the inner requests in place of placeholders
//! (`translated`): an inactive placeholder counts as `MPI_REQUEST_NULL` (as the standard
//! treats an inactive persistent request), and the program's array keeps its
//! placeholders. `MPI_Request_free` frees a placeholder (and lets an active inner request
//! finish on its own), `MPI_Cancel` cancels its inner request.
//!
//! MPI-4's persistent collectives use the same placeholders (`coll::persistent`): a
//! start runs the shim's non-blocking collective; freeing one while active is refused.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use mpi_sys::*;

use super::recv::MPI_Irecv;
use super::send::{send_nonblocking, Mode};
use super::{active, progress_idle, raise, with};
use crate::hostmem;
use crate::raw::*;

/// What a persistent request of the shim's describes.
#[derive(Clone)]
struct Persistent {
    op: Op,
    /// The request's communicator (its errors go to its handler).
    comm: MPI_Comm,
    /// The running operation's request; `MPI_REQUEST_NULL` while inactive.
    inner: MPI_Request,
}

/// The operation a persistent request starts.
#[derive(Clone)]
enum Op {
    /// A point-to-point one: a send in mode `send`, or (`None`) a receive.
    P2p {
        send: Option<Mode>,
        buf: usize,
        count: c_int,
        dt: MPI_Datatype,
        /// Destination or source.
        peer: c_int,
        tag: c_int,
    },
    /// A persistent collective (MPI-4): the shim's non-blocking form of the call with the
    /// init call's arguments, writing its request (`coll::persistent`; only where the
    /// library declares them).
    #[cfg_attr(not(mpi_persistent_coll), allow(dead_code))]
    Coll(Arc<StartColl>),
}

/// Starts a persistent collective's operation: the request to write.
pub(super) type StartColl = dyn Fn(*mut MPI_Request) -> c_int + Send + Sync;

// SAFETY: plain MPI handles and addresses (see `Shim`).
unsafe impl Send for Persistent {}

/// The shim's persistent requests, by their placeholder's handle.
static TABLE: Mutex<Option<HashMap<u64, Persistent>>> = Mutex::new(None);
/// How many there are: the completion calls look at their arrays only when some exist.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn table() -> MutexGuard<'static, Option<HashMap<u64, Persistent>>> {
    TABLE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The shim's persistent request behind `handle`, if it is one.
fn lookup(handle: MPI_Request) -> Option<Persistent> {
    if LIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    table().as_ref()?.get(&handle_key(handle)).cloned()
}

/// Runs a completion call on `reqs[..n]` with each placeholder replaced by its inner
/// request (`MPI_REQUEST_NULL` when inactive); afterwards the placeholders are back in
/// the array, and those whose inner request completed are inactive.
///
/// # Safety
/// `reqs` is NULL or holds `n` request handles, valid for reads and writes.
pub(super) unsafe fn translated<R>(reqs: *mut MPI_Request, n: c_int, call: impl FnOnce(*mut MPI_Request) -> R) -> R {
    if LIVE.load(Ordering::Acquire) == 0 || reqs.is_null() || n <= 0 {
        return call(reqs);
    }
    // SAFETY: the caller's array of n requests.
    let user = unsafe { std::slice::from_raw_parts_mut(reqs, n as usize) };
    let mut inner = user.to_vec();
    let mut swapped = Vec::new();
    if let Some(t) = table().as_ref() {
        for (i, h) in user.iter().enumerate() {
            if let Some(p) = t.get(&handle_key(*h)) {
                swapped.push((i, *h));
                inner[i] = p.inner;
            }
        }
    }
    if swapped.is_empty() {
        return call(reqs);
    }
    let r = call(inner.as_mut_ptr());
    if let Some(t) = table().as_mut() {
        for &(i, placeholder) in &swapped {
            if let Some(p) = t.get_mut(&handle_key(placeholder)) {
                // MPI_REQUEST_NULL once the call completed (and freed) it.
                p.inner = inner[i];
            }
            inner[i] = placeholder;
        }
    }
    user.copy_from_slice(&inner);
    r
}

/// Makes a placeholder for `p` and records it in `*request`.
///
/// # Safety
/// `request` is valid for writes.
unsafe fn create(p: Persistent, request: *mut MPI_Request) -> c_int {
    let mut handle = request_null();
    // SAFETY: an inactive persistent receive of nothing from MPI_PROC_NULL: never started.
    let rc = unsafe { PMPI_Recv_init(std::ptr::null_mut(), 0, byte(), proc_null(), 0, comm_self(), &mut handle) };
    if rc != SUCCESS {
        // SAFETY: the user's communicator.
        return unsafe { raise(p.comm, rc) };
    }
    table().get_or_insert_with(HashMap::new).insert(handle_key(handle), p);
    LIVE.fetch_add(1, Ordering::AcqRel);
    // SAFETY: the caller's out-pointer.
    unsafe { *request = handle };
    SUCCESS
}

/// Whether a persistent send of `count` elements of `dt` at `buf` is the shim's: a device
/// buffer (an invalid count or datatype is the library's to report).
fn device_send(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> bool {
    match hostmem::geometry(dt, count) {
        Ok((bytes, _)) if bytes > 0 => with(|s| s.is_device(buf as usize, bytes)).unwrap_or(false),
        _ => false,
    }
}

type PmpiSendInit =
    unsafe extern "C" fn(*const c_void, c_int, MPI_Datatype, c_int, c_int, MPI_Comm, *mut MPI_Request) -> c_int;

/// A persistent send in `mode`: the shim's for a device buffer or a buffered send, else
/// the library's (`pmpi`; a ready send as a standard one).
///
/// # Safety
/// The caller's `MPI_Send_init` arguments.
#[allow(clippy::too_many_arguments)]
unsafe fn send_init(
    mode: Mode,
    pmpi: PmpiSendInit,
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // Buffered ones are always the shim's (an `MPI_Ibsend` per start): Open MPI 4.1.4's own
    // restarted persistent buffered sends send stale data or hang above the eager limit
    // (open-mpi/ompi#12797, on the 4.1 branch only since open-mpi/ompi#14366, 2026).
    let shims = mode == Mode::Buffered || device_send(buf, count, dt);
    if !active() || dest == proc_null() || !shims {
        let pmpi = if active() && mode == Mode::Ready { PMPI_Send_init } else { pmpi };
        // SAFETY: the caller's arguments, passed on.
        return unsafe { pmpi(buf, count, dt, dest, tag, comm, request) };
    }
    let op = Op::P2p { send: Some(mode), buf: buf as usize, count, dt, peer: dest, tag };
    let p = Persistent { op, comm, inner: request_null() };
    // SAFETY: the caller's out-pointer.
    unsafe { create(p, request) }
}

/// `MPI_Send_init`: the shim's for a device buffer, else the library's.
///
/// # Safety
/// As `MPI_Send_init`: `buf` holds `count` elements of `dt` whenever the request is
/// started, the handles are valid, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Send_init(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { send_init(Mode::Standard, PMPI_Send_init, buf, count, dt, dest, tag, comm, request) }
}

/// `MPI_Ssend_init`: as [`MPI_Send_init`], synchronous.
///
/// # Safety
/// As [`MPI_Send_init`].
#[no_mangle]
pub unsafe extern "C" fn MPI_Ssend_init(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { send_init(Mode::Sync, PMPI_Ssend_init, buf, count, dt, dest, tag, comm, request) }
}

/// `MPI_Bsend_init`: as [`MPI_Send_init`], buffered (a device buffer is staged at each start).
///
/// # Safety
/// As [`MPI_Send_init`].
#[no_mangle]
pub unsafe extern "C" fn MPI_Bsend_init(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { send_init(Mode::Buffered, PMPI_Bsend_init, buf, count, dt, dest, tag, comm, request) }
}

/// `MPI_Rsend_init`: as [`MPI_Send_init`] (a ready send runs as a standard one).
///
/// # Safety
/// As [`MPI_Send_init`].
#[no_mangle]
pub unsafe extern "C" fn MPI_Rsend_init(
    buf: *const c_void,
    count: c_int,
    dt: MPI_Datatype,
    dest: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { send_init(Mode::Ready, PMPI_Rsend_init, buf, count, dt, dest, tag, comm, request) }
}

/// `MPI_Recv_init`: with the shim active, always the shim's (whatever the buffer, the
/// message may be an envelope).
///
/// # Safety
/// As `MPI_Recv_init`: `buf` has room for `count` elements of `dt` whenever the request
/// is started, the handles are valid, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Recv_init(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    if !active() || source == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Recv_init(buf, count, dt, source, tag, comm, request) };
    }
    let op = Op::P2p { send: None, buf: buf as usize, count, dt, peer: source, tag };
    let p = Persistent { op, comm, inner: request_null() };
    // SAFETY: the caller's out-pointer.
    unsafe { create(p, request) }
}

/// Makes the placeholder of a persistent collective on `comm` whose every start runs
/// `start` (the shim's non-blocking form of the call), and records it in `*request`.
///
/// # Safety
/// `comm` is a valid communicator; `request` is valid for writes; `start` may run
/// whenever the program starts the request (the init call's arguments, which MPI keeps
/// valid until the request is freed).
#[cfg_attr(not(mpi_persistent_coll), allow(dead_code))]
pub(super) unsafe fn create_collective(comm: MPI_Comm, start: Arc<StartColl>, request: *mut MPI_Request) -> c_int {
    let p = Persistent { op: Op::Coll(start), comm, inner: request_null() };
    // SAFETY: the caller's out-pointer.
    unsafe { create(p, request) }
}

/// Starts the shim's persistent request `handle` (`p`).
fn start(handle: MPI_Request, p: Persistent) -> c_int {
    if p.inner != request_null() {
        let code = crate::mpierr::for_call(
            MPI_ERR_REQUEST as c_int,
            "MPI_Start",
            "the persistent request is still active (wait for it, or test it until it completes, first)",
        );
        // SAFETY: the request's communicator.
        return unsafe { raise(p.comm, code) };
    }
    let mut inner = request_null();
    // SAFETY: the arguments the program gave the request's init call, which MPI's rules
    // keep valid whenever the request is started; `inner` is ours.
    let rc = unsafe {
        match p.op {
            Op::P2p { send: Some(mode), buf, count, dt, peer, tag } => {
                send_nonblocking(buf as *const c_void, count, dt, peer, tag, p.comm, &mut inner, mode)
            }
            Op::P2p { send: None, buf, count, dt, peer, tag } => {
                MPI_Irecv(buf as *mut c_void, count, dt, peer, tag, p.comm, &mut inner)
            }
            Op::Coll(start) => start(&mut inner),
        }
    };
    if rc == SUCCESS {
        if let Some(e) = table().as_mut().and_then(|t| t.get_mut(&handle_key(handle))) {
            e.inner = inner;
        }
    }
    rc
}

/// `MPI_Start`: the shim's persistent request runs as its non-blocking call; the
/// library's own are started by the library.
///
/// # Safety
/// As `MPI_Start`: `request` points to a persistent request handle.
#[no_mangle]
pub unsafe extern "C" fn MPI_Start(request: *mut MPI_Request) -> c_int {
    // SAFETY: the caller's pointer to a handle.
    let handle = unsafe { *request };
    match lookup(handle) {
        Some(p) => start(handle, p),
        // SAFETY: the caller's argument, passed on.
        None => unsafe { PMPI_Start(request) },
    }
}

/// `MPI_Startall`: [`MPI_Start`] on each request, in order.
///
/// # Safety
/// As `MPI_Startall`: `requests` holds `count` persistent request handles.
#[no_mangle]
pub unsafe extern "C" fn MPI_Startall(count: c_int, requests: *mut MPI_Request) -> c_int {
    if LIVE.load(Ordering::Acquire) == 0 {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Startall(count, requests) };
    }
    for i in 0..count.max(0) as usize {
        // SAFETY: the caller's array of `count` handles.
        let rc = unsafe { MPI_Start(requests.add(i)) };
        if rc != SUCCESS {
            return rc;
        }
    }
    SUCCESS
}

/// `MPI_Request_free`: a placeholder is freed with the shim's record (an active inner
/// request finishes on its own, as MPI says); any other request goes to the library.
///
/// # Safety
/// As `MPI_Request_free`: `request` points to a request handle.
#[no_mangle]
pub unsafe extern "C" fn MPI_Request_free(request: *mut MPI_Request) -> c_int {
    // SAFETY: the caller's pointer to a handle.
    let mut handle = unsafe { *request };
    let removed = if LIVE.load(Ordering::Acquire) == 0 {
        None
    } else {
        let mut t = table();
        match t.as_ref().and_then(|t| t.get(&handle_key(handle))) {
            // MPI-4 makes freeing an active persistent collective erroneous (its peers
            // still take part in it): refused, the request stays as it was.
            Some(p) if matches!(p.op, Op::Coll(_)) && p.inner != request_null() => {
                let comm = p.comm;
                drop(t);
                let code = crate::mpierr::for_call(
                    MPI_ERR_REQUEST as c_int,
                    "MPI_Request_free",
                    "the persistent collective is still active (complete it with MPI_Wait or MPI_Test first)",
                );
                // SAFETY: the request's communicator.
                return unsafe { raise(comm, code) };
            }
            _ => t.as_mut().and_then(|t| t.remove(&handle_key(handle))),
        }
    };
    let Some(mut p) = removed else {
        // SAFETY: the caller's argument, passed on.
        return unsafe { PMPI_Request_free(request) };
    };
    LIVE.fetch_sub(1, Ordering::AcqRel);
    // SAFETY: our placeholder and the inner request of its operation.
    unsafe {
        if p.inner != request_null() {
            PMPI_Request_free(&mut p.inner);
        }
        PMPI_Request_free(&mut handle);
        *request = request_null();
    }
    SUCCESS
}

/// `MPI_Cancel`: of a placeholder, its inner request (nothing while inactive).
///
/// # Safety
/// As `MPI_Cancel`: `request` points to a request handle.
#[no_mangle]
pub unsafe extern "C" fn MPI_Cancel(request: *mut MPI_Request) -> c_int {
    // SAFETY: the caller's pointer to a handle.
    match lookup(unsafe { *request }) {
        Some(mut p) if p.inner != request_null() => {
            // SAFETY: the inner request of a running operation.
            unsafe { PMPI_Cancel(&mut p.inner) }
        }
        Some(_) => SUCCESS,
        // SAFETY: the caller's argument, passed on.
        None => unsafe { PMPI_Cancel(request) },
    }
}

/// `MPI_Request_get_status`: after a round of the shim's progress, on the inner request
/// of a placeholder.
///
/// # Safety
/// As `MPI_Request_get_status`: `flag` is valid for writes, `status` is
/// `MPI_STATUS_IGNORE` or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Request_get_status(
    request: MPI_Request,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if active() {
        progress_idle();
    }
    let inner = lookup(request).map_or(request, |p| p.inner);
    // SAFETY: the caller's out-pointers; a request handle (MPI_REQUEST_NULL for an
    // inactive placeholder: flag set, empty status, as for an inactive request).
    unsafe { PMPI_Request_get_status(inner, flag, status) }
}
