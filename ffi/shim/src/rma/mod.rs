//! One-sided communication with device memory: what the shim keeps per window.
//!
//! Two things need the shim, both staging through host memory, as the MPI library cannot
//! touch device memory:
//! - a window whose memory is device memory on this rank (`MPI_Win_create` over a device
//!   buffer): the library gets a host [`shadow`] of it, kept coherent with the device
//!   buffer at the synchronizations of MPI's separate memory model, which the window
//!   reports (`MPI_WIN_MODEL` is `MPI_WIN_SEPARATE`; `MPI_WIN_BASE` the device buffer);
//! - an origin buffer in device memory (`MPI_Put`, `MPI_Get`, the accumulates): staged
//!   for the library, and kept until the operation completes at the origin (the
//!   synchronization that ends it, or its request), when what the library wrote there
//!   (`MPI_Get`'s data, a fetched result) is copied back.
//!
//! [`Window`] holds both for one window, in a registry by window handle; windows without
//! either are not in it, and cost the synchronization calls one look at an empty map.

pub mod shadow;

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use gpulmt::device::Backend;
use mpi_sys::MPI_Win;

use crate::raw::handle_key;
use crate::staging::Staged;
use shadow::Shadow;

/// What the shim keeps for one window.
pub struct Window {
    /// This rank's window memory is device memory: its shadow.
    pub shadow: Option<Shadow>,
    /// This rank in the window's group (for the owner's own lock and unlock).
    pub rank: c_int,
    /// Staged device origin buffers of operations not completed yet, by target rank.
    pending: Vec<(c_int, Staged)>,
    backend: Backend,
}

static WINDOWS: Mutex<Option<HashMap<u64, Window>>> = Mutex::new(None);
/// Windows in the registry: the synchronization calls look only when there are any.
static LIVE: AtomicUsize = AtomicUsize::new(0);

fn windows() -> MutexGuard<'static, Option<HashMap<u64, Window>>> {
    WINDOWS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on the shim's record of `win`, if it has one.
pub fn with_window<R>(win: MPI_Win, f: impl FnOnce(&mut Window) -> R) -> Option<R> {
    if LIVE.load(Ordering::Acquire) == 0 {
        return None;
    }
    windows().as_mut()?.get_mut(&handle_key(win)).map(f)
}

/// Records `win` (this rank `rank` in it), with the shadow of its device memory if any.
pub fn register(win: MPI_Win, rank: c_int, shadow: Option<Shadow>, backend: Backend) {
    let w = Window { shadow, rank, pending: Vec::new(), backend };
    if windows().get_or_insert_with(HashMap::new).insert(handle_key(win), w).is_none() {
        LIVE.fetch_add(1, Ordering::AcqRel);
    }
}

/// Forgets `win` (freed), handing back what the shim kept.
pub fn forget(win: MPI_Win) -> Option<Window> {
    let w = windows().as_mut()?.remove(&handle_key(win));
    if w.is_some() {
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
    w
}

/// Keeps the staged origin buffers of an operation on `win` to `target` until it
/// completes; records the window first if it was not (`rank`: this rank in it).
pub fn keep_pending(win: MPI_Win, rank: c_int, target: c_int, staged: Staged, backend: &Backend) {
    let mut g = windows();
    let map = g.get_or_insert_with(HashMap::new);
    let w = map.entry(handle_key(win)).or_insert_with(|| {
        LIVE.fetch_add(1, Ordering::AcqRel);
        Window { shadow: None, rank, pending: Vec::new(), backend: backend.clone() }
    });
    w.pending.push((target, staged));
}

impl Window {
    /// Completes the pending operations to `target` (all with `None`): what the library
    /// wrote into their staged buffers goes back to the device, and the staging is let
    /// go. Returns the first failure's message.
    pub fn complete(&mut self, target: Option<c_int>) -> Result<(), String> {
        let mut first = Ok(());
        let backend = &self.backend;
        self.pending.retain(|(t, staged)| {
            if target.is_some_and(|want| want != *t) {
                return true;
            }
            crate::staging::count_bytes(staged.bytes(false));
            if let Err(e) = staged.copy_out(backend) {
                if first.is_ok() {
                    first = Err(e.to_string());
                }
            }
            false
        });
        first
    }
}
