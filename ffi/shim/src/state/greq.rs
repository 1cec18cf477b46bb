//! The generalized requests handed to the user for the shim's non-blocking operations
//! (`MPI_Grequest_start`): the state behind each, the failed ones whose error goes to
//! their communicator's handler, and the callbacks MPI calls on them.

use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use mpi_sys::*;

use super::lock::SHIM;
use super::ops::Done;
use crate::raw::*;

/// The extra state of a generalized request: the status `query_fn` reports, written
/// by the shim before it completes the request. Owned by MPI once completed (freed
/// in `free_fn`).
pub struct GreqState {
    pub done: Done,
    /// The operation, while it runs (for `cancel_fn`).
    pub op: u64,
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

/// MPI's `free_fn`: frees the request's `GreqState` and forgets it among the failed
/// requests.
///
/// # Safety
/// `extra` is the `GreqState` given to `MPI_Grequest_start`, freed by no one else; MPI
/// calls it once per request.
pub(super) unsafe extern "C" fn free_fn(extra: *mut c_void) -> c_int {
    errored().retain(|e| e.state != extra as usize);
    // SAFETY: the Box made in new_op; MPI calls free_fn once.
    drop(unsafe { Box::from_raw(extra as *mut GreqState) });
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
