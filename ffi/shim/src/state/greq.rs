//! The generalized requests handed to the user for the shim's non-blocking operations
//! (`MPI_Grequest_start`): the state behind each, the failed ones whose error goes to
//! their communicator's handler, and the callbacks MPI calls on them.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use mpi_sys::*;

use super::lock::SHIM;
use super::ops::Done;
use crate::raw::*;

/// The extra state of a generalized request: the status `query_fn` reports, written
/// by the shim before it completes the request. Held by two: the shim's operation,
/// until it completed the request, and MPI, until it calls `free_fn`; the second to
/// let go frees it ([`release`]). The MPI standard calls `free_fn` only once the
/// request is complete, but MPICH 4.0 calls it inside `MPI_Request_free` of a request
/// still running, and the shim then wrote the result into freed memory (a heap string
/// of the sim backend overwritten, across pseudo-nodes, where a freed send completes
/// after its receiver's ack).
pub struct GreqState {
    pub done: Done,
    /// The operation, while it runs (for `cancel_fn`).
    pub op: u64,
    /// Holders left: 2 at the start, the operation and MPI.
    holders: AtomicU8,
}

impl GreqState {
    /// A fresh state of operation `op`, held by the operation and by MPI.
    pub fn new(op: u64) -> GreqState {
        GreqState { done: Done::ok(0, 0, 0), op, holders: AtomicU8::new(2) }
    }
}

/// One holder lets `state` go; the last one frees it.
///
/// # Safety
/// `state` is a `Box<GreqState>` made into a raw pointer (`Shim::new_op`), and each of
/// its two holders calls this once.
pub(super) unsafe fn release(state: *mut GreqState) {
    // AcqRel: the last holder sees every write the other made before letting go (the
    // operation's result, MPI's reads of it) before it frees the memory.
    // SAFETY: alive until both holders let go (this function's contract).
    if unsafe { (*state).holders.fetch_sub(1, Ordering::AcqRel) } == 1 {
        // SAFETY: the last holder; the Box made in new_op.
        drop(unsafe { Box::from_raw(state) });
    }
}

/// A generalized request the shim completed with an error: MPI would report it to
/// MPI_COMM_WORLD's or MPI_COMM_SELF's error handler (the request has no communicator), so the
/// completion calls report it to the operation's communicator instead.
pub struct Errored {
    pub handle: MPI_Request,
    pub comm: MPI_Comm,
    /// The GreqState's address (free_fn forgets the entry).
    pub(super) state: usize,
}

// SAFETY: plain MPI handle values (see `Shim`).
unsafe impl Send for Errored {}

static ERRORED: Mutex<Vec<Errored>> = Mutex::new(Vec::new());

/// The failed generalized requests not yet freed. Its own lock, never held across an
/// MPI call: free_fn takes it from within the MPI library.
pub fn errored() -> MutexGuard<'static, Vec<Errored>> {
    ERRORED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// MPI's `query_fn` of the shim's generalized requests: the status the shim wrote before
/// it completed the request.
///
/// # Safety
/// `extra` is the `GreqState` given to `MPI_Grequest_start` (`Shim::new_op`), not yet freed,
/// and `status` is valid for writes; MPI calls it so.
pub(super) unsafe extern "C" fn query_fn(extra: *mut c_void, status: *mut MPI_Status) -> c_int {
    // SAFETY: our GreqState, alive until free_fn.
    let d = unsafe { (*(extra as *const GreqState)).done };
    // SAFETY: MPI passes a status to fill.
    unsafe { fill_status(status, d.source, d.tag, d.error, d.bytes, d.cancelled) };
    d.error
}

/// MPI's `free_fn`: MPI lets the request's `GreqState` go (freed here if the operation
/// has completed the request already) and it is forgotten among the failed requests.
///
/// # Safety
/// `extra` is the `GreqState` given to `MPI_Grequest_start`; MPI calls it once per
/// request.
pub(super) unsafe extern "C" fn free_fn(extra: *mut c_void) -> c_int {
    errored().retain(|e| e.state != extra as usize);
    // SAFETY: MPI's hold of the state made in new_op; MPI calls free_fn once.
    unsafe { release(extra as *mut GreqState) };
    SUCCESS
}

/// MPI's `cancel_fn`: cancels the operation of a request that has not completed (a
/// receive no message was matched to; other operations go on).
///
/// # Safety
/// `extra` is the `GreqState` given to `MPI_Grequest_start`, not yet freed; MPI calls it
/// so (before `free_fn`).
pub(super) unsafe extern "C" fn cancel_fn(extra: *mut c_void, complete: c_int) -> c_int {
    if complete != 0 {
        return SUCCESS;
    }
    // SAFETY: our GreqState, alive until free_fn (which comes after completion).
    let op = unsafe { (*(extra as *const GreqState)).op };
    // MPI_Cancel is not intercepted, so the lock is free unless another thread holds it.
    if let Ok(mut g) = SHIM.lock() {
        if let Some(s) = g.as_mut() {
            s.cancel(op);
        }
    }
    SUCCESS
}
