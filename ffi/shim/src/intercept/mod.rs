//! The MPI functions the shim defines (`#[no_mangle]`, so that a preloaded shim comes
//! before the MPI library), one module per family of calls, and what they share: whether
//! the shim is active, running the shim under its lock, waiting for one of its
//! operations with progress, and reporting an error to a communicator's handler.
//!
//! Every function passes its call to the MPI library's `PMPI_*` entry point when the
//! shim is not active, and for whatever the shim does not handle itself.

pub mod barrier;
pub mod coll;
pub mod comm;
pub mod completion;
mod direct_recv;
pub mod init;
pub mod io;
pub mod mprobe;
pub mod persistent;
pub mod probe;
pub mod recv;
pub mod rma;
pub mod send;
pub mod sendrecv;

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

use mpi_sys::{MPI_Comm, PMPI_Comm_call_errhandler};

use crate::raw::*;
use crate::state::{lock, Done, Shim};
pub(crate) use direct_recv::DIRECT_HOST_RECVS;

/// Set while the shim is active (between MPI_Init and MPI_Finalize): the fast test
/// that lets every call pass straight through when it is not.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Whether the shim is active ([`ACTIVE`]).
#[inline(always)]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Acquire)
}

/// Runs `f` on the active shim.
pub(crate) fn with<R>(f: impl FnOnce(&mut Shim) -> R) -> Option<R> {
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
///
/// # Safety
/// `comm` is a valid communicator.
unsafe fn raise(comm: MPI_Comm, code: c_int) -> c_int {
    if code != SUCCESS {
        // SAFETY: the user's communicator.
        unsafe { PMPI_Comm_call_errhandler(comm, code) };
    }
    code
}
