//! Progress while the application's thread waits in a blocking call of the MPI library
//! (a collective, a communicator constructor, an RMA synchronization): a helper thread
//! drives the shim's transfers meanwhile, so that a peer's receive that needs this rank's
//! part of a transfer completes, as MPI's progress rule requires (issue 30).
//!
//! Why a helper thread, not the call's non-blocking form waited for with progress (as
//! `MPI_Barrier` does): a collective must be the same MPI call on every rank, whatever
//! each rank has in flight, so the non-blocking form would be needed on every rank
//! always, and on Open MPI 4.1 an 8-byte `MPI_Iallreduce` waited for costs several
//! times an `MPI_Allreduce` (README.md, "Progress", has the measurement). Here a
//! program without device transfers in flight pays one atomic load per call; the helper
//! thread starts at the first call that needs it and sleeps between such calls.
//!
//! What the helper may do depends on the thread level the library provides. gpulmt's
//! own progress (its shared-memory rings, its copies) makes no MPI call, so the helper
//! always runs it: a transfer the peer already matched finishes (the sender's copies of
//! PUT, COOPERATE and SHM, the packets that answer the peer). Matching a receive of this
//! rank to a message (`MPI_Iprobe`, `MPI_Improbe`) and polling the library's requests
//! are MPI calls, which only `MPI_THREAD_MULTIPLE` lets a second thread make while the
//! first is inside the library: there the helper runs the shim's whole progress; below
//! it, a receive posted before the blocking call is matched only after the call returns.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use super::lock::{host_fast_path, lock};
use super::ops::State;
use super::Shim;

/// Threads of the application inside a blocking library call that asked for the helper.
static ENGAGED: AtomicUsize = AtomicUsize::new(0);

/// The helper thread and what wakes it.
struct Helper {
    thread: Option<JoinHandle<()>>,
    /// Counts engagements, so that the helper, once it found nothing to do, sleeps until
    /// the next call engages it (not merely while some call is engaged).
    generation: u64,
    stop: bool,
}

static HELPER: Mutex<Helper> = Mutex::new(Helper { thread: None, generation: 0, stop: false });
static WAKE: Condvar = Condvar::new();

fn helper() -> MutexGuard<'static, Helper> {
    HELPER.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shim {
    /// Whether a thread blocked in the MPI library leaves work of the shim's without
    /// progress that the helper could give it: a gpulmt transfer in flight or a packet
    /// waiting for ring room, or under `MPI_THREAD_MULTIPLE`, anything not quiet
    /// (receives to match, library requests to poll).
    fn wants_background_progress(&self) -> bool {
        if self.thread_multiple {
            return !self.quiet();
        }
        self.ctx.control_pending()
            || self
                .ops
                .values()
                .any(|op| matches!(op.state, State::LmtRecv { .. } | State::LmtSend { lmt: Some(_), .. }))
    }

    /// One round of the helper's progress (see the module's doc); whether it is still
    /// wanted and whether it did something.
    fn progress_in_background(&mut self) -> (bool, bool) {
        let did = if self.thread_multiple {
            self.progress();
            true
        } else {
            match self.ctx.progress() {
                Ok(did) => did,
                Err(e) => {
                    tracing::warn!(error = %e, "gpulmt progress (helper thread)");
                    false
                }
            }
        };
        (self.wants_background_progress(), did)
    }
}

/// Runs `call`, a blocking call of the MPI library, with the helper thread driving the
/// shim's progress meanwhile if the shim has work that needs it.
pub fn while_blocked<R>(call: impl FnOnce() -> R) -> R {
    // The common case, without the shim's lock: nothing in flight at all.
    if host_fast_path() {
        return call();
    }
    let wanted = lock().as_ref().is_some_and(|s| s.wants_background_progress());
    if !wanted {
        return call();
    }
    engage();
    let r = call();
    ENGAGED.fetch_sub(1, Ordering::AcqRel);
    r
}

/// Counts this thread in and wakes the helper, starting it the first time.
fn engage() {
    ENGAGED.fetch_add(1, Ordering::AcqRel);
    let mut h = helper();
    h.generation += 1;
    if h.thread.is_none() && !h.stop {
        match std::thread::Builder::new().name("gpulmt-mpi-progress".into()).spawn(run) {
            Ok(t) => h.thread = Some(t),
            // The call still runs; only what the module's doc describes is not helped.
            Err(e) => tracing::warn!(error = %e, "could not start the shim's progress thread"),
        }
    }
    drop(h);
    WAKE.notify_all();
}

/// The helper thread: progress while engaged and wanted, sleep otherwise.
fn run() {
    let mut served = 0;
    loop {
        {
            let mut h = helper();
            while !h.stop && (ENGAGED.load(Ordering::Acquire) == 0 || h.generation == served) {
                h = WAKE.wait(h).unwrap_or_else(PoisonError::into_inner);
            }
            if h.stop {
                return;
            }
            served = h.generation;
        }
        while ENGAGED.load(Ordering::Acquire) > 0 {
            let Some((wanted, did)) = lock().as_mut().map(Shim::progress_in_background) else { break };
            if !wanted {
                break;
            }
            if !did {
                // Nothing moved: let the ranks' own threads (often more than the cores) run.
                std::thread::yield_now();
            }
        }
    }
}

/// Stops the helper thread (at `MPI_Finalize`, before the shim goes).
pub fn stop() {
    let thread = {
        let mut h = helper();
        h.stop = true;
        h.thread.take()
    };
    WAKE.notify_all();
    if let Some(t) = thread {
        let _ = t.join();
    }
}
