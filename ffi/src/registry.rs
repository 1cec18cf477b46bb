//! The contexts C holds, behind handles that are checked on every call.
//!
//! A `gpulmt_ctx*` is not an address: it encodes a slot of this registry and the slot's
//! generation, which changes when the context is released. So a handle used after
//! `gpulmt_finalize` (stale), one that was never handed out (garbage), or NULL is
//! refused with `GPULMT_ERR_INVALID_ARGUMENT` instead of being dereferenced, and a new
//! context that reuses a slot is not reached through an old handle.
//!
//! Calls on different contexts run in parallel; a call on a context that another call
//! is using (two threads at once, or a `send_blob` callback calling back into its own
//! context) is refused rather than let the two share it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use crate::error::{FfiError, GPULMT_ERR_INTERNAL};
use crate::handle::gpulmt_ctx;

// Handles pack a 32-bit slot number and a 32-bit generation into a pointer.
const _: () = assert!(usize::BITS == 64, "the C ABI's handles need 64-bit pointers");

/// One context, shared between the registry and the call that uses it.
type Shared = Arc<Mutex<Option<gpulmt_ctx>>>;

#[derive(Default)]
struct Slot {
    /// Starts at 1 and grows with every release, so that no handle is ever 0 (NULL)
    /// and a released slot's handles no longer match.
    generation: u32,
    ctx: Option<Shared>,
}

static SLOTS: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

fn slots() -> MutexGuard<'static, Vec<Slot>> {
    // Every update leaves the table consistent: a panic elsewhere does not spoil it.
    SLOTS.lock().unwrap_or_else(PoisonError::into_inner)
}

fn encode(index: usize, generation: u32) -> *mut gpulmt_ctx {
    (((generation as u64) << 32) | index as u64) as usize as *mut gpulmt_ctx
}

/// The slot a handle names, if it names a live context (`None`: stale or garbage).
fn decode(handle: *mut gpulmt_ctx) -> Option<(usize, Shared)> {
    let raw = handle as usize as u64;
    let (index, generation) = ((raw & 0xffff_ffff) as usize, (raw >> 32) as u32);
    let slots = slots();
    let slot = slots.get(index)?;
    match &slot.ctx {
        Some(c) if slot.generation == generation => Some((index, Arc::clone(c))),
        _ => None,
    }
}

fn stale(handle: *mut gpulmt_ctx) -> FfiError {
    if handle.is_null() {
        FfiError::invalid("the context is NULL")
    } else {
        FfiError::invalid(format!(
            "the context {handle:p} is not a live context: it was released by gpulmt_finalize, or never returned by gpulmt_init / gpulmt_plugin_init"
        ))
    }
}

/// Hands a new context to C: its handle.
pub(crate) fn register(h: gpulmt_ctx) -> *mut gpulmt_ctx {
    let mut slots = slots();
    let index = match slots.iter().position(|s| s.ctx.is_none()) {
        Some(i) => i,
        None => {
            slots.push(Slot::default());
            slots.len() - 1
        }
    };
    let slot = &mut slots[index];
    slot.generation = slot.generation.wrapping_add(1).max(1);
    slot.ctx = Some(Arc::new(Mutex::new(Some(h))));
    encode(index, slot.generation)
}

/// Takes the context of `handle` back from C (for `gpulmt_finalize`): the handle and
/// every copy of it are stale from now on.
pub(crate) fn unregister(handle: *mut gpulmt_ctx) -> Result<gpulmt_ctx, FfiError> {
    let (index, shared) = decode(handle).ok_or_else(|| stale(handle))?;
    {
        let mut slots = slots();
        let slot = &mut slots[index];
        // Another thread may have released it between the lookup and here.
        if !slot.ctx.as_ref().is_some_and(|c| Arc::ptr_eq(c, &shared)) {
            return Err(stale(handle));
        }
        slot.ctx = None;
    }
    // A call still running on it (another thread, against the contract) finishes first.
    let taken = shared.lock().unwrap_or_else(PoisonError::into_inner).take();
    taken.ok_or_else(|| stale(handle))
}

/// Runs `f` on the context of `handle`, or fails without touching anything when the
/// handle is NULL, stale or garbage, or when another call is using the context.
pub(crate) fn with_live<T>(
    handle: *mut gpulmt_ctx,
    f: impl FnOnce(&mut gpulmt_ctx) -> Result<T, FfiError>,
) -> Result<T, FfiError> {
    let (_, shared) = decode(handle).ok_or_else(|| stale(handle))?;
    let mut guard = match shared.try_lock() {
        Ok(g) => g,
        Err(TryLockError::WouldBlock) => {
            return Err(FfiError::invalid(format!(
                "the context {handle:p} is in use by another call (a context is used by one thread at a time, and \
                 send_blob must not call back into its own context)"
            )))
        }
        // A panic inside gpulmt is caught before it can poison this lock; should one
        // get through, the context's state is unknown.
        Err(TryLockError::Poisoned(_)) => {
            return Err(FfiError::new(GPULMT_ERR_INTERNAL, "the context was left unusable by an earlier panic"))
        }
    };
    let h = guard.as_mut().ok_or_else(|| stale(handle))?;
    f(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::GPULMT_ERR_INVALID_ARGUMENT;
    use gpulmt::{Context, JobInfo};

    fn solo() -> gpulmt_ctx {
        let cfg = gpulmt::config::Config::from_env().unwrap();
        let info = JobInfo { job: format!("ffireg{}x{}", std::process::id(), rand_tag()), rank: 0, size: 1 };
        gpulmt_ctx::new(Context::init_with(cfg, info).unwrap(), None)
    }

    fn rand_tag() -> u64 {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn stale_garbage_and_null_handles_are_refused() {
        let h = register(solo());
        assert!(!h.is_null());
        assert_eq!(with_live(h, |c| Ok(c.ctx.rank())).unwrap(), 0);
        let ctx = unregister(h).unwrap();
        for bad in [h, std::ptr::null_mut(), 0x1234 as *mut gpulmt_ctx, usize::MAX as *mut gpulmt_ctx] {
            let e = with_live(bad, |_| Ok(())).unwrap_err();
            assert_eq!(e.code, GPULMT_ERR_INVALID_ARGUMENT, "{bad:p}");
            assert!(unregister(bad).is_err(), "{bad:p}");
        }
        // A new context may reuse the slot; the old handle still does not reach it.
        let h2 = register(gpulmt_ctx::new(ctx.ctx, None));
        assert_ne!(h2, h);
        assert!(with_live(h, |_| Ok(())).is_err());
        assert!(with_live(h2, |_| Ok(())).is_ok());
        // A call on a context another call is using is refused, not let in.
        let nested = with_live(h2, |_| Ok(with_live(h2, |_| Ok(())).unwrap_err().message)).unwrap();
        assert!(nested.contains("in use"), "{nested}");
        unregister(h2).unwrap().ctx.finalize().unwrap();
    }
}
