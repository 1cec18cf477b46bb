//! The opaque context handle, requests and statuses, and the argument checks shared
//! by every extern function.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex, PoisonError};

use gpulmt::{Context, Error, Rank, Request, Status};

use crate::error::{guard, panic_message, FfiError, GPULMT_ERR_BAD_RANK, GPULMT_ERR_INTERNAL, GPULMT_SUCCESS};

/// A pending operation: a request id, or `GPULMT_REQUEST_NULL`.
#[allow(non_camel_case_types)]
pub type gpulmt_request = u64;

/// No request: what a completed request is set to. Testing or waiting for it
/// completes at once with an empty status.
pub const GPULMT_REQUEST_NULL: gpulmt_request = 0;

/// Receive from any rank (`src` of `gpulmt_irecv`); also the `source` of a status that
/// names no rank.
pub const GPULMT_ANY_SOURCE: c_int = -1;
/// Receive with any tag (`tag` of `gpulmt_irecv`); also the `tag` of a status that
/// names no tag.
pub const GPULMT_ANY_TAG: c_int = -1;

/// The outcome of a completed request.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct gpulmt_status {
    /// For a receive, the sender; for a send, the destination. `GPULMT_ANY_SOURCE`
    /// when the request failed or was `GPULMT_REQUEST_NULL`.
    pub source: c_int,
    /// The message's tag; `GPULMT_ANY_TAG` when the request failed or was null.
    pub tag: c_int,
    /// Bytes moved (0 when the request failed).
    pub count: usize,
    /// `GPULMT_SUCCESS`, or the `GPULMT_ERR_*` code the request failed with (the
    /// same code the completing call returns).
    pub error: c_int,
}

impl gpulmt_status {
    /// The status of a null request or of a failed one (`error`).
    pub(crate) const fn empty(error: c_int) -> Self {
        Self { source: GPULMT_ANY_SOURCE, tag: GPULMT_ANY_TAG, count: 0, error }
    }

    fn from_status(s: &Status) -> Self {
        Self { source: s.source as c_int, tag: s.tag, count: s.len as usize, error: GPULMT_SUCCESS }
    }
}

/// The host's side of a plugin context (see `gpulmt_plugin_init`).
pub(crate) struct PluginState {
    /// Ranks whose `send_blob` failed during the current call, with the code.
    pub send_failures: Arc<Mutex<Vec<(Rank, c_int)>>>,
    /// No `send_blob`: gpulmt's rings carry every control packet but the RTS cookie.
    pub rings: bool,
}

/// An endpoint of a gpulmt job: the context and what the ABI keeps beside it.
///
/// C sees it only as `gpulmt_ctx*`, from `gpulmt_init` or `gpulmt_plugin_init` until
/// `gpulmt_finalize`: a handle of the [`crate::registry`], never its address.
#[allow(non_camel_case_types)]
pub struct gpulmt_ctx {
    pub(crate) ctx: Context,
    /// Set for contexts made by `gpulmt_plugin_init`.
    pub(crate) plugin: Option<PluginState>,
    /// Set when a call panicked: the context's state is unknown, so it only accepts
    /// `gpulmt_finalize`, which then releases it without talking to peers.
    pub(crate) poisoned: bool,
}

impl gpulmt_ctx {
    pub(crate) fn new(ctx: Context, plugin: Option<PluginState>) -> Self {
        Self { ctx, plugin, poisoned: false }
    }

    /// Leaves the job: collectively for a context of `gpulmt_init`, locally for a
    /// plugin context, and only releasing a poisoned one (`GPULMT_ERR_INTERNAL`).
    pub(crate) fn finalize(self) -> Result<(), FfiError> {
        let gpulmt_ctx { ctx, plugin, poisoned } = self;
        if poisoned {
            release_locally(ctx)?;
            return Err(FfiError::new(
                GPULMT_ERR_INTERNAL,
                "the context was released without finalizing: it hit an internal error earlier",
            ));
        }
        match plugin {
            None => Ok(ctx.finalize()?),
            Some(_) => release_locally(ctx),
        }
    }
    /// Declares failed every rank whose `send_blob` failed: the host's channel to it is
    /// broken, so its transfers cannot finish (they complete with
    /// `GPULMT_ERR_PEER_FAILED`).
    fn settle_send_failures(&mut self) {
        let Some(p) = &self.plugin else { return };
        let failed = std::mem::take(&mut *p.send_failures.lock().unwrap_or_else(PoisonError::into_inner));
        for (rank, code) in failed {
            tracing::warn!(peer = rank, code, "send_blob failed: treating the peer as terminated");
            if let Err(e) = self.ctx.peer_terminated(rank) {
                tracing::warn!(peer = rank, error = %e, "declaring the peer of a failed send_blob terminated");
            }
        }
    }

    /// Fails unless this is a plugin context whose control packets travel through the
    /// host's channel (`send_blob`), for the calls that take them from the host.
    pub(crate) fn require_host_channel(&self, call: &str) -> Result<(), FfiError> {
        self.require_plugin(call)?;
        match self.plugin {
            Some(PluginState { rings: true, .. }) => Err(FfiError::invalid(format!(
                "{call}: this plugin context was made without send_blob, so gpulmt's own rings carry its \
                 control packets and no blob or CTS cookie comes from the host"
            ))),
            _ => Ok(()),
        }
    }

    /// Fails unless this is a plugin context.
    pub(crate) fn require_plugin(&self, call: &str) -> Result<(), FfiError> {
        match self.plugin {
            Some(_) => Ok(()),
            None => Err(FfiError::unsupported(format!("{call} needs a context made by gpulmt_plugin_init"))),
        }
    }

    /// Fails for plugin contexts: `call` blocks until peers answer, but a plugin context
    /// is driven from the host's progress loop (with a `send_blob`, peers' blobs reach it
    /// only through `gpulmt_plugin_deliver`, which the host cannot call while gpulmt
    /// blocks its thread; without one, the host's own traffic would stall meanwhile).
    pub(crate) fn forbid_blocking_in_plugin(&self, call: &str) -> Result<(), FfiError> {
        match self.plugin {
            None => Ok(()),
            Some(_) => Err(FfiError::unsupported(format!(
                "{call} blocks on peers, but a plugin context is driven from the host's progress loop \
                 (peers' blobs arrive through gpulmt_plugin_deliver): poll with gpulmt_lmt_done / gpulmt_test instead"
            ))),
        }
    }
}

/// Releases a context without talking to peers: peers see this rank as gone, its
/// mappings close and its device memory is released. The job segment has no name left
/// to remove (rank 0 removed it once every rank had joined).
fn release_locally(ctx: Context) -> Result<(), FfiError> {
    drop(ctx);
    Ok(())
}

/// Runs the body of an extern function on a context: a NULL, stale (finalized),
/// garbage, busy or poisoned context is rejected (see [`crate::registry`]), errors and
/// panics become the returned code (a panic poisons the context), and failed
/// `send_blob` calls are settled afterwards.
///
/// # Safety
/// The pointers the body dereferences are the body's to check; `ctx` itself is only
/// looked up, never dereferenced, so it may be anything.
pub(crate) unsafe fn with_ctx(ctx: *mut gpulmt_ctx, f: impl FnOnce(&mut gpulmt_ctx) -> Result<(), FfiError>) -> c_int {
    guard(|| {
        crate::registry::with_live(ctx, |h| {
            if h.poisoned {
                return Err(FfiError::new(
                    GPULMT_ERR_INTERNAL,
                    "this context hit an internal error earlier and is unusable; release it with gpulmt_finalize",
                ));
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let r = f(h);
                h.settle_send_failures();
                r
            }))
            .unwrap_or_else(|payload| Err(FfiError::new(GPULMT_ERR_INTERNAL, panic_message(&*payload))));
            if r.as_ref().is_err_and(|e| e.code == GPULMT_ERR_INTERNAL) {
                h.poisoned = true;
            }
            r
        })
    })
}

/// An out-parameter that must not be NULL.
///
/// # Safety
/// `p` is NULL or valid for writes of a `T`.
pub(crate) unsafe fn out<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T, FfiError> {
    // SAFETY: the caller's contract.
    unsafe { p.as_mut() }.ok_or_else(|| FfiError::invalid(format!("{name} is NULL")))
}

/// Writes `v` to an optional out-parameter (NULL: ignored).
///
/// # Safety
/// `p` is NULL or valid for writes of a `T`.
pub(crate) unsafe fn set_opt<T>(p: *mut T, v: T) {
    // SAFETY: the caller's contract.
    if let Some(p) = unsafe { p.as_mut() } {
        *p = v;
    }
}

/// Checks a buffer argument: NULL is allowed only with length 0.
pub(crate) fn check_buf(p: *const c_void, len: usize, name: &str) -> Result<(), FfiError> {
    if p.is_null() && len > 0 {
        return Err(FfiError::invalid(format!("{name} is NULL but its length is {len}")));
    }
    Ok(())
}

/// Views a C byte buffer (NULL with length 0 is the empty slice).
///
/// # Safety
/// Unless `len` is 0, `p` is valid for reads of `len` bytes for `'a`.
pub(crate) unsafe fn bytes<'a>(p: *const c_void, len: usize, name: &str) -> Result<&'a [u8], FfiError> {
    check_buf(p, len, name)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: non-null (checked) and readable for len bytes (the caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// A rank argument: a non-negative `int`.
pub(crate) fn rank_arg(r: c_int, name: &str) -> Result<Rank, FfiError> {
    Rank::try_from(r).map_err(|_| FfiError::new(GPULMT_ERR_BAD_RANK, format!("{name} {r} is negative")))
}

/// Finishes `gpulmt_test` / `gpulmt_wait` / `gpulmt_lmt_done` from what the context
/// said about a request: a completed request (successful or failed) sets `*req` to
/// `GPULMT_REQUEST_NULL`, `*flag` to 1 and `*status`; a pending one sets `*flag` to 0.
///
/// A `Transfer` error from [`Context::test`] / [`Context::wait`] is the request's own
/// failure (the request is consumed); any other error is about the call (an unknown
/// request...) and leaves the request as it was.
pub(crate) fn finish(
    outcome: Result<Option<Status>, Error>,
    req: &mut gpulmt_request,
    flag: Option<&mut c_int>,
    status: Option<&mut gpulmt_status>,
) -> Result<(), FfiError> {
    let (done, st, result) = match outcome {
        Ok(None) => (false, None, Ok(())),
        Ok(Some(s)) => (true, Some(gpulmt_status::from_status(&s)), Ok(())),
        Err(e @ Error::Transfer(_)) => {
            let e = FfiError::from(e);
            (true, Some(gpulmt_status::empty(e.code)), Err(e))
        }
        Err(e) => (false, None, Err(FfiError::from(e))),
    };
    if done {
        *req = GPULMT_REQUEST_NULL;
    }
    if let Some(f) = flag {
        *f = done as c_int;
    }
    if let (Some(out), Some(st)) = (status, st) {
        *out = st;
    }
    result
}

/// Tests a request (the body of `gpulmt_test` and `gpulmt_lmt_done`).
///
/// # Safety
/// `req` and `flag` are valid for reads and writes, `status` is NULL or valid for writes.
pub(crate) unsafe fn test_request(
    h: &mut gpulmt_ctx,
    req: *mut gpulmt_request,
    flag: *mut c_int,
    status: *mut gpulmt_status,
) -> Result<(), FfiError> {
    // SAFETY: the caller's contract.
    let (req, flag, status) = unsafe { (out(req, "req")?, out(flag, "flag")?, status.as_mut()) };
    if *req == GPULMT_REQUEST_NULL {
        *flag = 1;
        if let Some(s) = status {
            *s = gpulmt_status::empty(GPULMT_SUCCESS);
        }
        return Ok(());
    }
    let outcome = h.ctx.test(&Request::from_id(*req));
    finish(outcome, req, Some(flag), status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{GPULMT_ERR_INVALID_ARGUMENT, GPULMT_ERR_PEER_FAILED};
    use gpulmt::ProtoError;

    #[test]
    fn finish_consumes_completed_and_failed_requests_only() {
        let (mut req, mut flag, mut st) = (7, -1, gpulmt_status::empty(99));
        finish(Ok(None), &mut req, Some(&mut flag), Some(&mut st)).unwrap();
        assert_eq!((req, flag, st.error), (7, 0, 99));

        let s = Status { source: 1, tag: 5, len: 42 };
        finish(Ok(Some(s)), &mut req, Some(&mut flag), Some(&mut st)).unwrap();
        assert_eq!((req, flag), (GPULMT_REQUEST_NULL, 1));
        assert_eq!(st, gpulmt_status { source: 1, tag: 5, count: 42, error: 0 });

        let mut req = 8;
        let e = finish(Err(ProtoError::PeerFailed { rank: 1 }.into()), &mut req, Some(&mut flag), Some(&mut st))
            .unwrap_err();
        assert_eq!((e.code, req, flag, st.error), (GPULMT_ERR_PEER_FAILED, GPULMT_REQUEST_NULL, 1, e.code));
        assert_eq!(st.source, GPULMT_ANY_SOURCE);

        let mut req = 9;
        let e = finish(Err(Error::InvalidArgument("unknown".into())), &mut req, Some(&mut flag), None).unwrap_err();
        assert_eq!((e.code, req, flag), (GPULMT_ERR_INVALID_ARGUMENT, 9, 0));
    }

    #[test]
    fn argument_checks() {
        assert!(check_buf(std::ptr::null(), 0, "buf").is_ok());
        assert_eq!(check_buf(std::ptr::null(), 1, "buf").unwrap_err().code, GPULMT_ERR_INVALID_ARGUMENT);
        assert_eq!(rank_arg(-2, "dst").unwrap_err().code, GPULMT_ERR_BAD_RANK);
        assert_eq!(rank_arg(3, "dst").unwrap(), 3);
        // SAFETY: NULL with length 0 is the empty slice.
        assert_eq!(unsafe { bytes(std::ptr::null(), 0, "blob") }.unwrap(), &[] as &[u8]);
    }
}
