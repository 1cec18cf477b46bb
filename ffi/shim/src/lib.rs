//! `libgpulmt_mpi.so`: a PMPI shim that makes an unmodified MPI program GPU-aware
//! between the ranks of a node, with gpulmt moving device buffers over CUDA IPC (or
//! the sim backend's shared memory):
//!
//! ```text
//! mpirun -x LD_PRELOAD=/path/to/libgpulmt_mpi.so ./app
//! ```
//!
//! The shim defines the MPI functions below; each calls the MPI library's `PMPI_*`
//! entry point for what it does not handle itself:
//!
//! - `MPI_Init`, `MPI_Init_thread`: after `PMPI_Init*`, the ranks of each node
//!   (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`) join a gpulmt job in plugin mode;
//!   gpulmt's control packets after the RTS take its own shared-memory rings.
//!   `MPI_Finalize` drains the shim's traffic and releases gpulmt first.
//! - Sends (`MPI_Send`, `MPI_Ssend`, `MPI_Isend`, `MPI_Issend`): host buffers go
//!   straight to the MPI library. A contiguous device buffer to a rank of the same
//!   node sends an *envelope* (see [`envelope`]) with gpulmt's RTS on the user's
//!   communicator and tag, so the MPI library's matching orders it among the user's
//!   messages; gpulmt then moves the payload. Device buffers to other nodes (and
//!   below `GPULMT_MPI_LMT_MIN` bytes) are staged through host memory.
//! - Receives (`MPI_Recv`, `MPI_Irecv`, and `MPI_Sendrecv`): matched by the shim with
//!   `MPI_Iprobe`/`MPI_Improbe` in post order; an envelope starts gpulmt's receive into
//!   the user's buffer, other messages are received by `MPI_Imrecv` (into host
//!   staging for device buffers).
//! - Completion (`MPI_Wait`, `MPI_Waitall`, `MPI_Waitany`, `MPI_Waitsome`, `MPI_Test`,
//!   `MPI_Testall`, `MPI_Testany`, `MPI_Testsome`), `MPI_Probe`, `MPI_Iprobe` and
//!   `MPI_Barrier` drive the shim's progress. The shim's non-blocking operations are
//!   generalized requests, so `MPI_Cancel` (of unmatched receives), `MPI_Request_free`
//!   and `MPI_Get_count` work on them unmodified, and every status carries the user's
//!   source, tag and byte count. Their errors go to their communicator's handler.
//!
//! Extra C functions (`include/gpulmt_mpi.h`): `gpulmt_mpi_alloc` / `gpulmt_mpi_free`
//! (device memory of the shim's gpulmt context: what makes the same program run on
//! sim devices and on CUDA), `gpulmt_mpi_memcpy`, `gpulmt_mpi_active`,
//! `gpulmt_mpi_get_counters`.
//!
//! Progress of device transfers happens inside the intercepted calls (as with most
//! MPI libraries' rendezvous). See README.md for what is not covered.

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod envelope;
mod hostmem;
mod raw;
mod scratch;
mod state;

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mpi_sys::{
    MPI_Comm, MPI_Datatype, MPI_Request, MPI_Status, PMPI_Barrier, PMPI_Comm_call_errhandler, PMPI_Comm_get_errhandler,
    PMPI_Comm_set_errhandler, PMPI_Errhandler_free, PMPI_Finalize, PMPI_Ibarrier, PMPI_Init, PMPI_Init_thread,
    PMPI_Iprobe, PMPI_Irecv, PMPI_Isend, PMPI_Issend, PMPI_Mprobe, PMPI_Mrecv, PMPI_Probe, PMPI_Query_thread,
    PMPI_Recv, PMPI_Send, PMPI_Sendrecv, PMPI_Ssend, PMPI_Test, PMPI_Testall, PMPI_Testany, PMPI_Testsome, PMPI_Wait,
    PMPI_Waitall, PMPI_Waitany, PMPI_Waitsome, RSMPI_ERRORS_RETURN,
};

use envelope::ENVELOPE_BYTES;
use raw::*;
pub use state::gpulmt_mpi_counters;
use state::{errored, lock, Done, Shim};

/// Set while the shim is active (between MPI_Init and MPI_Finalize): the fast test
/// that lets every call pass straight through when it is not.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Host receives the MPI library took straight into the user's buffer (`recv_direct`),
/// counted outside the shim's lock; `gpulmt_mpi_get_counters` adds them in.
static DIRECT_HOST_RECVS: AtomicU64 = AtomicU64::new(0);

#[inline(always)]
fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Runs `f` on the active shim.
fn with<R>(f: impl FnOnce(&mut Shim) -> R) -> Option<R> {
    lock().as_mut().map(f)
}

/// One round of progress; true when the shim has nothing running (or is gone), so
/// that blocking in the MPI library cannot starve one of its transfers.
fn progress_idle() -> bool {
    with(|s| {
        s.progress();
        s.is_idle()
    })
    .unwrap_or(true)
}

/// Waits for one of the shim's blocking operations, with progress.
fn wait_op(id: u64) -> Done {
    loop {
        let r = with(|s| {
            if let Some(d) = s.take_finished(id) {
                return Some(d);
            }
            s.progress();
            s.take_finished(id)
        });
        match r {
            Some(Some(d)) => return d,
            Some(None) => std::hint::spin_loop(),
            None => return Done { source: 0, tag: 0, bytes: 0, error: ERR_INTERN, cancelled: false },
        }
    }
}

/// Reports an error the shim found itself to the communicator's error handler (which
/// aborts under MPI_ERRORS_ARE_FATAL), and returns it.
unsafe fn raise(comm: MPI_Comm, code: c_int) -> c_int {
    if code != SUCCESS {
        // SAFETY: the user's communicator.
        unsafe { PMPI_Comm_call_errhandler(comm, code) };
    }
    code
}

/// Installs the log subscriber (the library installs none), with one difference to gpulmt's
/// default (`GPULMT_LOG`, default `warn`): the sim backend's warning that a device
/// buffer was freed while a peer still maps it is expected here (peers keep mappings
/// cached, and gpulmt_mpi_free is not collective; CUDA behaves the same, silently),
/// so without `GPULMT_LOG` only its errors show.
fn init_logging() {
    gpulmt::logging::init("warn,gpulmt::device::sim=error");
}

/// Runs a completion call of the MPI library on `reqs[..n]`. When one of them is a
/// shim request that failed, MPI would hand the error to MPI_COMM_WORLD's handler
/// (a generalized request has no communicator): that handler is set aside for the
/// call, and the failed request's communicator's handler gets the error instead.
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
    let world = comm_world();
    let mut old = std::mem::MaybeUninit::uninit();
    // SAFETY: MPI_COMM_WORLD's handler is swapped and restored around the call.
    unsafe {
        PMPI_Comm_get_errhandler(world, old.as_mut_ptr());
        let mut old = old.assume_init();
        PMPI_Comm_set_errhandler(world, RSMPI_ERRORS_RETURN);
        let rc = call();
        PMPI_Comm_set_errhandler(world, old);
        PMPI_Errhandler_free(&mut old);
        raise(comm, rc)
    }
}

fn start() {
    init_logging();
    let off = std::env::var("GPULMT_MPI_DISABLE").is_ok_and(|v| !matches!(v.trim(), "" | "0"));
    if off {
        return;
    }
    raw::find_count_word();
    let mut level = 0;
    // SAFETY: a local out-pointer; MPI is initialized.
    let known = unsafe { PMPI_Query_thread(&mut level) } == SUCCESS;
    hostmem::set_serialized(known && level < mpi_sys::MPI_THREAD_MULTIPLE as c_int);
    match Shim::init() {
        Ok(s) => {
            *lock() = Some(s);
            ACTIVE.store(true, Ordering::Release);
        }
        Err(why) => eprintln!("gpulmt-mpi: shim disabled, device buffers go to the MPI library as they are: {why}"),
    }
}

// -------------------------------------------------------------------------------
// Set-up and tear-down
// -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    let rc = unsafe { PMPI_Init(argc, argv) };
    if rc == SUCCESS {
        start();
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    let rc = unsafe { PMPI_Init_thread(argc, argv, required, provided) };
    if rc == SUCCESS {
        start();
    }
    rc
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    if ACTIVE.swap(false, Ordering::AcqRel) {
        let shim = lock().take();
        if let Some(s) = shim {
            s.finalize();
        }
    }
    // SAFETY: no arguments.
    unsafe { PMPI_Finalize() }
}

// -------------------------------------------------------------------------------
// Sends
// -------------------------------------------------------------------------------

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

/// As `host_ready`, for a receive: with the landing buffer when it is smaller than an
/// envelope (`hostmem::recv_ready`).
#[inline(always)]
fn host_recv_ready(buf: *const c_void, count: c_int, dt: MPI_Datatype) -> Option<(usize, Option<*mut u8>)> {
    if !state::host_fast_path() {
        return None;
    }
    hostmem::recv_ready(buf as usize, count, dt)
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

// -------------------------------------------------------------------------------
// Receives
// -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn MPI_Recv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
) -> c_int {
    if !active() || source == proc_null() {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Recv(buf, count, dt, source, tag, comm, status) };
    }
    // As in `send_passes`: the remembered buffer, below MPI_THREAD_MULTIPLE.
    if state::host_fast_path() {
        if let Some((cap, landing)) = hostmem::memo_recv_ready(buf as usize, count, dt) {
            // SAFETY: the caller's arguments; the landing buffer of this thread.
            return unsafe { recv_landing(buf, count, dt, source, tag, comm, status, cap, landing) };
        }
    }
    // The whole check, here too: unlike a send, the receive needs a stack frame anyway
    // (its status is looked at), and a second function would set up another.
    let ready = host_recv_ready(buf, count, dt);
    if let Some((cap, Some(landing))) = ready {
        // SAFETY: the caller's arguments; the landing buffer of this thread.
        return unsafe { recv_landing(buf, count, dt, source, tag, comm, status, cap, landing) };
    }
    // SAFETY: the caller's arguments.
    unsafe { recv_blocking(buf, count, dt, source, tag, comm, status, ready) }
}

/// A blocking receive that is not a small host receive the fast path takes itself:
/// `ready` is what `host_recv_ready` found. Out of line, like `send_blocking`.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
unsafe fn recv_blocking(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    ready: Option<(usize, Option<*mut u8>)>,
) -> c_int {
    let pass = || {
        // SAFETY: the caller's arguments, passed on.
        unsafe { PMPI_Recv(buf, count, dt, source, tag, comm, status) }
    };
    if let Some((cap, landing)) = ready {
        // SAFETY: the caller's arguments.
        return unsafe { recv_direct(buf, count, dt, source, tag, comm, status, cap, landing) };
    }
    match with(|s| s.direct_recv_bytes(buf as usize, count, dt)) {
        None => return pass(),
        Some(Some(cap)) => {
            let landing = if cap < ENVELOPE_BYTES { hostmem::landing() } else { None };
            // SAFETY: the caller's arguments.
            return unsafe { recv_direct(buf, count, dt, source, tag, comm, status, cap, landing) };
        }
        Some(None) => {}
    }
    let posted = with(|s| s.post_recv(buf as usize, count, dt, source, tag, comm, false));
    let id = match posted {
        // Inactive, or arguments the MPI library rejects (and reports) itself.
        None | Some(Err(_)) => return pass(),
        Some(Ok((id, _))) => id,
    };
    let d = wait_op(id);
    // SAFETY: the caller's status pointer; the user's communicator.
    unsafe {
        fill_status(status, d.source, d.tag, d.error, d.bytes, d.cancelled);
        raise(comm, d.error)
    }
}

/// The ENVELOPE_BYTES bytes at `p` when they are an envelope of this job (apart from the
/// fast path: messages of an envelope's size are rare).
///
/// # Safety
/// `p` is valid for reading ENVELOPE_BYTES bytes.
#[cold]
unsafe fn envelope_at(p: *const u8) -> Option<[u8; ENVELOPE_BYTES]> {
    // SAFETY: the caller's contract; a byte array has no alignment.
    let bytes = unsafe { p.cast::<[u8; ENVELOPE_BYTES]>().read() };
    with(|s| s.is_envelope(&bytes)).unwrap_or(false).then_some(bytes)
}

/// Counts a receive `recv_direct` left to the MPI library.
#[inline]
fn count_direct_recv() {
    // Relaxed: a statistic, read after the receives it counts have returned. Below
    // MPI_THREAD_MULTIPLE no other MPI call runs meanwhile, so a load and a store count
    // as well as the locked add, which costs far more than the rest of the count.
    if hostmem::serialized() {
        DIRECT_HOST_RECVS.store(DIRECT_HOST_RECVS.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    } else {
        DIRECT_HOST_RECVS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Ends a direct receive the MPI library completed for the user: counts it, hands its
/// status over.
///
/// # Safety
/// `status` is MPI_STATUS_IGNORE or valid for writes.
#[inline]
unsafe fn direct_done(status: *mut MPI_Status, st: &MPI_Status, rc: c_int) -> c_int {
    count_direct_recv();
    if !status.is_null() && status != status_ignore() {
        // SAFETY: the caller's contract.
        unsafe { *status = *st };
    }
    rc
}

/// A blocking receive into a contiguous host buffer of `cap` bytes while the shim has
/// nothing in flight (`Shim::direct_recv_bytes`): the MPI library receives it itself,
/// and only a message of an envelope's size is looked at, so host traffic keeps the
/// library's own latency. A buffer that holds an envelope receives straight into it,
/// its first bytes kept aside to be put back should one arrive; a smaller one receives
/// into the `landing` buffer (`recv_landing`), or where there is none, takes a matched
/// probe and a receive.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
unsafe fn recv_direct(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    cap: usize,
    landing: Option<*mut u8>,
) -> c_int {
    if cap < ENVELOPE_BYTES {
        if let Some(landing) = landing {
            // SAFETY: the caller's arguments and landing buffer.
            return unsafe { recv_landing(buf, count, dt, source, tag, comm, status, cap, landing) };
        }
    }
    let mut st = empty_status();
    let rc;
    // A message of an envelope's size for the shim to deliver: an envelope of this job
    // arrived, or in the probed path, may have.
    let mut envelope = None;
    if cap >= ENVELOPE_BYTES {
        let mut saved = [0u8; ENVELOPE_BYTES];
        // SAFETY: the user's host buffer holds cap >= ENVELOPE_BYTES bytes, and the
        // receive is theirs to write until we return.
        unsafe {
            std::ptr::copy_nonoverlapping(buf as *const u8, saved.as_mut_ptr(), ENVELOPE_BYTES);
            rc = PMPI_Recv(buf, count, dt, source, tag, comm, &mut st);
        }
        if rc == SUCCESS && status_bytes(&st) == ENVELOPE_BYTES {
            // SAFETY: as above; the library wrote these bytes.
            envelope = unsafe { envelope_at(buf as *const u8) };
        }
        if envelope.is_some() {
            // The payload goes into the buffer; what it does not cover stays as it was.
            // SAFETY: as above.
            unsafe { std::ptr::copy_nonoverlapping(saved.as_ptr(), buf as *mut u8, ENVELOPE_BYTES) };
        }
    } else {
        let mut msg = message_null();
        // SAFETY: the caller's arguments; locals as out-pointers.
        let probed = unsafe { PMPI_Mprobe(source, tag, comm, &mut msg, &mut st) };
        if probed != SUCCESS {
            return probed;
        }
        if status_bytes(&st) == ENVELOPE_BYTES {
            // An envelope, or the user's host message of an envelope's size:
            // `deliver_direct` tells them apart.
            let mut bytes = [0u8; ENVELOPE_BYTES];
            // SAFETY: the matched message goes to our buffer of exactly its size.
            rc = unsafe { PMPI_Mrecv(bytes.as_mut_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), &mut msg, &mut st) };
            envelope = Some(bytes);
        } else {
            // SAFETY: the user's buffer with their count and datatype.
            rc = unsafe { PMPI_Mrecv(buf, count, dt, &mut msg, &mut st) };
        }
    }
    match envelope {
        // SAFETY: the caller's arguments.
        Some(bytes) if rc == SUCCESS => unsafe { deliver(buf, count, dt, source, tag, comm, status, &st, &bytes) },
        // SAFETY: the caller's status.
        _ => unsafe { direct_done(status, &st, rc) },
    }
}

/// `recv_direct` into a receive smaller than an envelope, through the landing buffer
/// (`scratch`): one receive, not a matched probe and a receive, which cost Open MPI
/// about 0.2 us more; the data is copied out. Inline: the fast path of small host
/// receives.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn recv_landing(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    cap: usize,
    landing: *mut u8,
) -> c_int {
    let mut st = empty_status();
    // SAFETY: ENVELOPE_BYTES bytes at the start of this thread's landing buffer,
    // which also absorbs Open MPI writing a longer message past that count; the
    // caller's source, tag and communicator.
    let mut rc = unsafe { PMPI_Recv(landing.cast(), ENVELOPE_BYTES as c_int, byte(), source, tag, comm, &mut st) };
    let bytes = status_bytes(&st);
    scratch::release_overrun(landing, bytes);
    if rc == SUCCESS && bytes == ENVELOPE_BYTES {
        // SAFETY: the library wrote ENVELOPE_BYTES bytes there.
        if let Some(envelope) = unsafe { envelope_at(landing) } {
            // SAFETY: the caller's arguments.
            return unsafe { deliver(buf, count, dt, source, tag, comm, status, &st, &envelope) };
        }
    }
    // SAFETY: the library wrote at least min(bytes, ENVELOPE_BYTES) >= min(bytes, cap)
    // bytes there (cap < ENVELOPE_BYTES), and the user's contiguous host buffer holds
    // `cap` bytes.
    unsafe { copy_small(landing, buf as *mut u8, bytes.min(cap)) };
    if rc == SUCCESS && bytes > cap {
        // As the library reports a message longer than the receive (its count stays the
        // message's): the buffer holds the first `cap` bytes.
        // SAFETY: the user's communicator.
        rc = unsafe { truncated(comm, &mut st) };
    }
    // SAFETY: the caller's status.
    unsafe { direct_done(status, &st, rc) }
}

/// Copies `n` bytes between buffers that do not overlap: 8 to 16 bytes (one or two
/// numbers, the common small message) inline as two overlapping words, where memcpy's
/// call cost more than the copy; other sizes through memcpy.
///
/// # Safety
/// As `std::ptr::copy_nonoverlapping(src, dst, n)`.
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: the caller's contract; with 8 <= n <= 16, [0, 8) and [n - 8, n) lie in both
    // buffers.
    unsafe {
        if (8..=16).contains(&n) {
            let head = src.cast::<u64>().read_unaligned();
            let tail = src.add(n - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(head);
            dst.add(n - 8).cast::<u64>().write_unaligned(tail);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, n);
        }
    }
}

/// Marks a direct receive truncated and reports it to the communicator's handler.
#[cold]
unsafe fn truncated(comm: MPI_Comm, st: &mut MPI_Status) -> c_int {
    st.MPI_ERROR = ERR_TRUNCATE;
    // SAFETY: the user's communicator.
    unsafe { raise(comm, ERR_TRUNCATE) }
}

/// Hands a message of an envelope's size that a direct receive took (`st`, `bytes`) to
/// the shim (`Shim::deliver_direct`), and waits for the receive it completes.
#[allow(clippy::too_many_arguments)]
#[cold]
unsafe fn deliver(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    status: *mut MPI_Status,
    st: &MPI_Status,
    bytes: &[u8; ENVELOPE_BYTES],
) -> c_int {
    let id = with(|s| s.deliver_direct((buf as usize, count, dt, source, tag, comm), st.MPI_SOURCE, st.MPI_TAG, bytes));
    let d = match id {
        Some(id) => wait_op(id),
        None => Done { source: st.MPI_SOURCE, tag: st.MPI_TAG, bytes: 0, error: ERR_INTERN, cancelled: false },
    };
    // SAFETY: the caller's status pointer; the user's communicator.
    unsafe {
        fill_status(status, d.source, d.tag, d.error, d.bytes, d.cancelled);
        raise(comm, d.error)
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Irecv(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let pass = || {
        // SAFETY: the caller's arguments, passed on.
        unsafe { PMPI_Irecv(buf, count, dt, source, tag, comm, request) }
    };
    if !active() || source == proc_null() {
        return pass();
    }
    match with(|s| s.post_recv(buf as usize, count, dt, source, tag, comm, true)) {
        // Inactive, or arguments the MPI library rejects (and reports) itself.
        None | Some(Err(_)) => pass(),
        Some(Ok((_, handle))) => {
            // SAFETY: the caller's out-pointer.
            unsafe { *request = handle };
            SUCCESS
        }
    }
}

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

// -------------------------------------------------------------------------------
// Completion
// -------------------------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn MPI_Wait(request: *mut MPI_Request, status: *mut MPI_Status) -> c_int {
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
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Test(request: *mut MPI_Request, flag: *mut c_int, status: *mut MPI_Status) -> c_int {
    if active() {
        progress_idle();
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { complete(request, 1, || PMPI_Test(request, flag, status)) }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitall(count: c_int, requests: *mut MPI_Request, statuses: *mut MPI_Status) -> c_int {
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
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testall(
    count: c_int,
    requests: *mut MPI_Request,
    flag: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    if active() {
        progress_idle();
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { complete(requests, count, || PMPI_Testall(count, requests, flag, statuses)) }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitany(
    count: c_int,
    requests: *mut MPI_Request,
    index: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
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
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testany(
    count: c_int,
    requests: *mut MPI_Request,
    index: *mut c_int,
    flag: *mut c_int,
    status: *mut MPI_Status,
) -> c_int {
    if active() {
        progress_idle();
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { complete(requests, count, || PMPI_Testany(count, requests, index, flag, status)) }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Waitsome(
    incount: c_int,
    requests: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    loop {
        if !active() || progress_idle() {
            // SAFETY: the caller's arguments, passed on.
            return unsafe {
                complete(requests, incount, || PMPI_Waitsome(incount, requests, outcount, indices, statuses))
            };
        }
        // SAFETY: as above.
        let rc =
            unsafe { complete(requests, incount, || PMPI_Testsome(incount, requests, outcount, indices, statuses)) };
        // SAFETY: the caller's out-pointer, written by PMPI_Testsome.
        if rc != SUCCESS || unsafe { *outcount } != 0 {
            return rc;
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn MPI_Testsome(
    incount: c_int,
    requests: *mut MPI_Request,
    outcount: *mut c_int,
    indices: *mut c_int,
    statuses: *mut MPI_Status,
) -> c_int {
    if active() {
        progress_idle();
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { complete(requests, incount, || PMPI_Testsome(incount, requests, outcount, indices, statuses)) }
}

// -------------------------------------------------------------------------------
// Probe
// -------------------------------------------------------------------------------

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

// -------------------------------------------------------------------------------
// Collectives
// -------------------------------------------------------------------------------

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

// -------------------------------------------------------------------------------
// The shim's own C functions
// -------------------------------------------------------------------------------

/// 1 while the shim is active (after MPI_Init, before MPI_Finalize), else 0.
#[no_mangle]
pub extern "C" fn gpulmt_mpi_active() -> c_int {
    c_int::from(active())
}

/// Allocates `bytes` of device memory on this rank's device through the shim's gpulmt
/// context (a sim device under `GPULMT_DEVICE=sim`, else CUDA). NULL when the shim is
/// not active or the allocation fails. Device memory from cudaMalloc works as well.
#[no_mangle]
pub extern "C" fn gpulmt_mpi_alloc(bytes: usize) -> *mut c_void {
    with(|s| {
        let dev = s.ctx.device();
        match s.ctx.backend().alloc(dev, bytes.max(1)) {
            Ok(p) => {
                s.allocations.push(p);
                // New device memory may sit where host memory was remembered.
                hostmem::forget_all();
                p as *mut c_void
            }
            Err(e) => {
                tracing::warn!(bytes, error = %e, "gpulmt_mpi_alloc");
                std::ptr::null_mut()
            }
        }
    })
    .unwrap_or(std::ptr::null_mut())
}

/// Frees memory from `gpulmt_mpi_alloc`: 0 on success, -1 if `ptr` is not such memory.
/// Peers that mapped it keep their pages until they let go (as with CUDA IPC).
#[no_mangle]
pub extern "C" fn gpulmt_mpi_free(ptr: *mut c_void) -> c_int {
    with(|s| {
        let Some(i) = s.allocations.iter().position(|&p| p == ptr as usize) else { return -1 };
        s.allocations.swap_remove(i);
        // SAFETY: memory of gpulmt_mpi_alloc (checked above) that the application gives up
        // here, as with cudaFree: MPI's rules forbid freeing a buffer an operation still
        // uses, so no copy of ours runs on it.
        match unsafe { s.ctx.backend().free(ptr as usize) } {
            Ok(()) | Err(gpulmt::device::DeviceError::FreedWhileMapped { .. }) => 0,
            Err(e) => {
                tracing::warn!(error = %e, "gpulmt_mpi_free");
                -1
            }
        }
    })
    .unwrap_or(-1)
}

/// Copies `bytes` between any two buffers, host or device, and waits: 0 on success.
/// Without an active shim, a plain memcpy of host memory.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mpi_memcpy(dst: *mut c_void, src: *const c_void, bytes: usize) -> c_int {
    match with(|s| s.ctx.copy_sync(dst as usize, src as usize, bytes)) {
        Some(Ok(())) => 0,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "gpulmt_mpi_memcpy");
            -1
        }
        None => {
            if bytes > 0 {
                // SAFETY: the caller's buffers of `bytes` bytes (host memory).
                unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.cast::<u8>(), bytes) };
            }
            0
        }
    }
}

/// Copies the shim's counters to `*out`: 0 on success, -1 when not active.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mpi_get_counters(out: *mut gpulmt_mpi_counters) -> c_int {
    match with(|s| {
        let mut c = s.counters;
        c.host_recvs += DIRECT_HOST_RECVS.load(Ordering::Relaxed);
        c
    }) {
        Some(c) if !out.is_null() => {
            // SAFETY: the caller's out-pointer.
            unsafe { *out = c };
            0
        }
        _ => -1,
    }
}
