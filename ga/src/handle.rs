//! Non-blocking operations: the [`Handle`] a `put_nb`, `get_nb` or `acc_nb` returns, and
//! the state an array shares with its handles (`NbState`): which sections have
//! operations in flight, how many times they were completed, and whether the array is
//! destroyed.
//!
//! A non-blocking put or get returns once its copies are issued (the heap's `_nbi` 2-D
//! copies: an asynchronous copy on the engine for a mapped heap, queue packets for a PE
//! of another node) and completes at the heap's quiet, which a handle's
//! [`wait`](Handle::wait), a [`fence`](crate::GlobalArray::fence) or a
//! [`sync`](crate::GlobalArray::sync) makes. The quiet completes every operation of the
//! rank, so a wait completes the operations issued before it too.
//!
//! CoGA's ordering rule (operations on the same or overlapping sections from one process
//! complete in order): the heap's copies to mapped heaps run on one in-order lane, and a
//! blocking copy first waits for them; operations through the queue to one PE are ordered
//! only by a heap fence. So before each operation, the array checks the sections of the
//! non-blocking operations in flight since the last fence or quiet, and puts a heap fence
//! in front of it when one overlaps (`NbState::order_before`). Operations on disjoint
//! sections are not held up.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, MutexGuard};

use gpulmt::Context;

use crate::error::{GaError, Result};
use crate::section::Section;

/// What an array shares with its non-blocking handles.
#[derive(Debug, Default)]
pub(crate) struct NbState {
    /// The array's number (for errors).
    pub(crate) array: u64,
    /// Set by destroy: a later wait is an error.
    pub(crate) destroyed: bool,
    /// Quiets made through the array or its handles: a handle issued before the current
    /// count is complete.
    pub(crate) quiets: u64,
    /// Sections of the non-blocking operations issued since the last fence or quiet.
    pub(crate) pending: Vec<Section>,
}

/// The shared state, locked.
pub(crate) fn lock(nb: &Mutex<NbState>) -> MutexGuard<'_, NbState> {
    // Each update is a field store or a push: a panic leaves the state consistent.
    nb.lock().unwrap_or_else(|e| e.into_inner())
}

impl NbState {
    /// Orders an operation on `s` after the in-flight ones it overlaps: a heap fence when
    /// one does (the fence orders everything before it, so the list starts again).
    pub(crate) fn order_before(&mut self, ctx: &Context, s: &Section) {
        if self.pending.iter().any(|p| p.overlaps(s)) {
            ctx.sym_fence();
            self.pending.clear();
        }
    }

    /// Completes every operation of this rank (the heap's quiet).
    pub(crate) fn quiet(&mut self, ctx: &Context) -> Result<()> {
        ctx.sym_quiet()?;
        self.quiets += 1;
        self.pending.clear();
        Ok(())
    }
}

/// A non-blocking operation: [`wait`](Self::wait) on it before the buffer it borrows is
/// used again. Dropping a handle without waiting waits (and logs a failure), so the
/// buffer is never released while a copy may still use it.
#[must_use = "wait on the handle (or fence) before relying on the operation"]
pub struct Handle<'a> {
    ctx: &'a Context,
    pending: Option<Pending>,
    _buffer: PhantomData<&'a mut ()>,
}

/// A non-blocking operation detached from its buffer's lifetime
/// ([`Handle::into_pending`]), for callers that keep buffers alive by contract (the C API).
#[derive(Debug)]
pub struct Pending {
    nb: Arc<Mutex<NbState>>,
    /// The quiet count when it was issued; None: complete at issue.
    issued_at: Option<u64>,
}

impl<'a> Handle<'a> {
    /// A handle of an operation issued on the array of `nb` (None: complete at issue).
    pub(crate) fn new(ctx: &'a Context, nb: &Arc<Mutex<NbState>>, issued_at: Option<u64>) -> Handle<'a> {
        Handle { ctx, pending: Some(Pending { nb: nb.clone(), issued_at }), _buffer: PhantomData }
    }

    /// Whether the operation is known complete at its target: it was complete at issue,
    /// or a wait, fence or sync on its array completed it since. (False does not mean it
    /// is still running: nothing asks the copies.)
    pub fn test(&self) -> bool {
        self.pending.as_ref().is_none_or(Pending::test)
    }

    /// Waits until the operation is complete at its target (the heap's quiet: every
    /// other operation of this rank too). A handle of an array destroyed since is
    /// [`GaError::Destroyed`] (destroy completed the operation).
    pub fn wait(mut self) -> Result<()> {
        let pending = self.pending.take().expect("a handle is waited on once (wait takes it)");
        pending.wait(self.ctx)
    }

    /// The operation without its borrow of the buffer and the context.
    ///
    /// # Safety
    /// The operation's buffer must stay valid (readable and unchanged for a put or an
    /// accumulate, writable and otherwise unused for a get) until the returned
    /// [`Pending`] is waited on, or a fence or sync of its array returned.
    pub unsafe fn into_pending(mut self) -> Pending {
        self.pending.take().expect("a handle gives up its operation once")
    }
}

impl std::fmt::Debug for Handle<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle").field("pending", &self.pending).finish_non_exhaustive()
    }
}

impl Drop for Handle<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.pending.take() {
            if let Err(e) = p.wait(self.ctx) {
                if !matches!(e, GaError::Destroyed { .. }) {
                    tracing::warn!(error = %e, "a non-blocking Global Arrays operation dropped without wait failed");
                }
            }
        }
    }
}

impl Pending {
    /// See [`Handle::test`].
    pub fn test(&self) -> bool {
        self.issued_at.is_none_or(|at| lock(&self.nb).quiets > at)
    }

    /// See [`Handle::wait`].
    pub fn wait(self, ctx: &Context) -> Result<()> {
        let mut nb = lock(&self.nb);
        if nb.destroyed {
            return Err(GaError::Destroyed { array: nb.array });
        }
        match self.issued_at {
            Some(at) if nb.quiets <= at => nb.quiet(ctx),
            _ => Ok(()),
        }
    }
}
