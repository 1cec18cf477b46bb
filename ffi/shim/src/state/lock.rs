//! The one shim of the process behind its lock, and what the lock leaves behind when it
//! is released: whether the shim is busy, read without the lock by the host fast paths.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Shim;

/// The shim, while active (between MPI_Init and MPI_Finalize).
pub static SHIM: Mutex<Option<Shim>> = Mutex::new(None);

pub fn lock() -> ShimGuard {
    ShimGuard(SHIM.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Set while the shim has work a host message passed straight to the MPI library could
/// starve or overtake: operations running, control packets waiting for ring room, messages a
/// probe took out of the library. Written each time the shim's lock is released, read
/// without it by the host fast paths (`host_fast_path`).
static BUSY: AtomicBool = AtomicBool::new(false);

/// The shim's lock; releasing it records whether the shim is busy.
pub struct ShimGuard(MutexGuard<'static, Option<Shim>>);

impl std::ops::Deref for ShimGuard {
    type Target = Option<Shim>;
    fn deref(&self) -> &Option<Shim> {
        &self.0
    }
}

impl std::ops::DerefMut for ShimGuard {
    fn deref_mut(&mut self) -> &mut Option<Shim> {
        &mut self.0
    }
}

impl Drop for ShimGuard {
    fn drop(&mut self) {
        let busy = self.0.as_ref().is_some_and(|s| !s.quiet());
        // Release, still under the lock: a thread that reads "idle" without the lock
        // sees the state the holder left. A thread posting concurrently may make the
        // shim busy right after; MPI orders nothing between two threads' calls.
        BUSY.store(busy, Ordering::Release);
    }
}

/// Whether a blocking host send or receive may go to the MPI library without the shim's
/// lock: the shim has nothing running that it could starve or overtake.
pub fn host_fast_path() -> bool {
    !BUSY.load(Ordering::Acquire)
}
