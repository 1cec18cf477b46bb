//! The plain endpoint API: a rank of a job started by `gpulmt-run`, with MPI-style
//! non-blocking point-to-point operations and device memory management (for C
//! programs and benchmarks).

use std::ffi::{c_int, c_void};

use gpulmt::config::Config;
use gpulmt::progress::Stats;
use gpulmt::{Context, Error, JobInfo, Protocol, Request};

use crate::error::guard;
use crate::handle::{
    check_buf, finish, gpulmt_ctx, gpulmt_request, gpulmt_status, out, rank_arg, set_opt, test_request, with_ctx,
    GPULMT_ANY_SOURCE, GPULMT_ANY_TAG, GPULMT_REQUEST_NULL,
};

/// Index of GET in `gpulmt_stats.protocols` (the receiver's GPU pulls).
pub const GPULMT_PROTOCOL_GET: usize = 0;
/// Index of PUT in `gpulmt_stats.protocols` (the sender's GPU pushes).
pub const GPULMT_PROTOCOL_PUT: usize = 1;
/// Index of COOPERATE in `gpulmt_stats.protocols` (both GPUs copy a part).
pub const GPULMT_PROTOCOL_COOP: usize = 2;
/// Index of SHM in `gpulmt_stats.protocols` (pipelined through shared memory).
pub const GPULMT_PROTOCOL_SHM: usize = 3;
/// Index of self-copies in `gpulmt_stats.protocols` (a rank sending to itself).
pub const GPULMT_PROTOCOL_SELF: usize = 4;
/// Number of entries of `gpulmt_stats.protocols`.
pub const GPULMT_PROTOCOL_COUNT: usize = 5;

/// Counters of one rank (`gpulmt_get_stats`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct gpulmt_stats {
    /// Rendezvous receives per protocol, indexed by `GPULMT_PROTOCOL_*`.
    pub protocols: [u64; GPULMT_PROTOCOL_COUNT],
    /// Control packets sent and received.
    pub packets_sent: u64,
    pub packets_received: u64,
    /// Packets that found their ring full and waited.
    pub backpressure: u64,
    /// Packets dropped as malformed or out of protocol.
    pub violations: u64,
    /// Copies started.
    pub copies: u64,
    /// IPC handle cache: acquires served from the cache, acquires that opened, opens,
    /// closes, and idle mappings evicted.
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub cache_opens: u64,
    pub cache_closes: u64,
    pub cache_evictions: u64,
}

impl From<&Stats> for gpulmt_stats {
    fn from(s: &Stats) -> Self {
        let mut protocols = [0; GPULMT_PROTOCOL_COUNT];
        for (i, p) in [
            (GPULMT_PROTOCOL_GET, Protocol::Get),
            (GPULMT_PROTOCOL_PUT, Protocol::Put),
            (GPULMT_PROTOCOL_COOP, Protocol::Coop),
            (GPULMT_PROTOCOL_SHM, Protocol::Shm),
            (GPULMT_PROTOCOL_SELF, Protocol::SelfCopy),
        ] {
            protocols[i] = s.protocol_count(p);
        }
        Self {
            protocols,
            packets_sent: s.packets_sent,
            packets_received: s.packets_received,
            backpressure: s.backpressure,
            violations: s.violations,
            copies: s.copies,
            cache_hits: s.cache.hits,
            cache_misses: s.cache.misses,
            cache_opens: s.cache.opens,
            cache_closes: s.cache.closes,
            cache_evictions: s.cache.evictions,
        }
    }
}

/// Hands a new context to C: its handle (see [`crate::registry`]).
///
/// # Safety
/// `out` is valid for writes.
pub(crate) unsafe fn hand_out(out: *mut *mut gpulmt_ctx, h: gpulmt_ctx) {
    // SAFETY: the caller's contract.
    unsafe { *out = crate::registry::register(h) };
}

/// Joins the job that `gpulmt-run` describes in the environment (`GPULMT_JOB`,
/// `GPULMT_RANK`, `GPULMT_SIZE`; without them, a one-rank job of its own), configured
/// by the `GPULMT_*` variables.
///
/// Blocks until every rank of the job joined (`GPULMT_INIT_TIMEOUT_MS`). On success
/// `*out` is the new context; on failure it is NULL.
///
/// # Safety
/// `out` is NULL (the call then fails) or valid for writes of a pointer.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_init(out: *mut *mut gpulmt_ctx) -> c_int {
    gpulmt::logging::init("warn");
    guard(|| {
        // SAFETY: the caller's contract.
        let slot = unsafe { crate::handle::out(out, "out")? };
        *slot = std::ptr::null_mut();
        let ctx = Context::init_with(Config::from_env().map_err(Error::from)?, JobInfo::from_env()?)?;
        // SAFETY: checked non-null above.
        unsafe { hand_out(out, gpulmt_ctx::new(ctx, None)) };
        Ok(())
    })
}

/// Leaves the job and releases the context, which is invalid afterwards whatever the
/// result.
///
/// For a context of `gpulmt_init` this is collective: it finishes pending traffic and
/// synchronises with every other rank, then releases the device memory of
/// `gpulmt_mem_alloc`. For a plugin context it is local (see `gpulmt_plugin_init`).
/// A context that hit `GPULMT_ERR_INTERNAL` is only released, and the call returns
/// `GPULMT_ERR_INTERNAL` again.
///
/// A context that is not live (NULL, finalized already, never handed out) is refused
/// with `GPULMT_ERR_INVALID_ARGUMENT`, as by every other call.
///
/// # Safety
/// None beyond the function's: `ctx` is only looked up, never dereferenced.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_finalize(ctx: *mut gpulmt_ctx) -> c_int {
    guard(|| crate::registry::unregister(ctx)?.finalize())
}

/// Gives this context's rank in its job.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `rank` is
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_rank(ctx: *mut gpulmt_ctx, rank: *mut c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            *out(rank, "rank")? = h.ctx.rank() as c_int;
            Ok(())
        })
    }
}

/// Gives the number of ranks of this context's job.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `size` is
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_size(ctx: *mut gpulmt_ctx, size: *mut c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            *out(size, "size")? = h.ctx.size() as c_int;
            Ok(())
        })
    }
}

/// Starts sending `len` bytes at `buf` (host memory, or device memory of any device
/// of this node) to rank `dst` with `tag` (`0 <= tag < GPULMT_TAG_UB`).
///
/// On success `*req` is the request, to complete with `gpulmt_test` or `gpulmt_wait`;
/// on failure it is `GPULMT_REQUEST_NULL`.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `req` is valid
/// for writes; unless `len` is 0, `buf` is valid for reads of `len` bytes, and those
/// bytes stay valid and unmodified until the request completes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_isend(
    ctx: *mut gpulmt_ctx,
    buf: *const c_void,
    len: usize,
    dst: c_int,
    tag: c_int,
    req: *mut gpulmt_request,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let req = out(req, "req")?;
            *req = GPULMT_REQUEST_NULL;
            check_buf(buf, len, "buf")?;
            let r = h.ctx.isend(buf.cast(), len, rank_arg(dst, "dst")?, tag)?;
            *req = r.id();
            Ok(())
        })
    }
}

/// Starts receiving at most `len` bytes into `buf` (host or device memory) from rank
/// `src` (or `GPULMT_ANY_SOURCE`) with `tag` (or `GPULMT_ANY_TAG`).
///
/// On success `*req` is the request; on failure `GPULMT_REQUEST_NULL`. A longer
/// message completes the request with `GPULMT_ERR_TRUNCATED`.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `req` is valid
/// for writes; unless `len` is 0, `buf` is valid for writes of `len` bytes, and stays
/// valid and otherwise unused until the request completes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_irecv(
    ctx: *mut gpulmt_ctx,
    buf: *mut c_void,
    len: usize,
    src: c_int,
    tag: c_int,
    req: *mut gpulmt_request,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let req = out(req, "req")?;
            *req = GPULMT_REQUEST_NULL;
            check_buf(buf, len, "buf")?;
            let src = if src == GPULMT_ANY_SOURCE { None } else { Some(rank_arg(src, "src")?) };
            let tag = if tag == GPULMT_ANY_TAG { None } else { Some(tag) };
            let r = h.ctx.irecv(buf.cast(), len, src, tag)?;
            *req = r.id();
            Ok(())
        })
    }
}

/// Makes progress and tells whether request `*req` completed.
///
/// Not complete: `*flag` = 0, `GPULMT_SUCCESS`. Complete: `*flag` = 1, `*req` =
/// `GPULMT_REQUEST_NULL`, `*status` filled, and the request's result is returned (a
/// failed request returns its `GPULMT_ERR_*` code, also in `status->error`). A
/// `GPULMT_REQUEST_NULL` request completes at once with an empty status. Any other
/// error (an unknown request) leaves `*req` and sets `*flag` to 0.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `req` and
/// `flag` are valid for reads and writes; `status` is NULL (ignored) or valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_test(
    ctx: *mut gpulmt_ctx,
    req: *mut gpulmt_request,
    flag: *mut c_int,
    status: *mut gpulmt_status,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| test_request(h, req, flag, status)) }
}

/// Waits until request `*req` completes; then `*req` is `GPULMT_REQUEST_NULL`,
/// `*status` is filled and the request's result is returned (as `gpulmt_test`). Never
/// hangs on a dead peer: its requests fail with `GPULMT_ERR_PEER_FAILED`.
///
/// Not available on plugin contexts (`GPULMT_ERR_UNSUPPORTED`): their control blobs
/// arrive only through the host, so poll `gpulmt_lmt_done` from its progress loop.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `req` is valid
/// for reads and writes; `status` is NULL (ignored) or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_wait(
    ctx: *mut gpulmt_ctx,
    req: *mut gpulmt_request,
    status: *mut gpulmt_status,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            h.forbid_blocking_in_plugin("gpulmt_wait")?;
            let (req, status) = (out(req, "req")?, status.as_mut());
            if *req == GPULMT_REQUEST_NULL {
                if let Some(s) = status {
                    *s = gpulmt_status::empty(crate::GPULMT_SUCCESS);
                }
                return Ok(());
            }
            let outcome = h.ctx.wait(Request::from_id(*req)).map(Some);
            finish(outcome, req, None, status)
        })
    }
}

/// Makes progress on everything in flight without blocking; `*made_progress` (if not
/// NULL) tells whether anything happened.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call;
/// `made_progress` is NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_progress(ctx: *mut gpulmt_ctx, made_progress: *mut c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let did = h.ctx.progress()?;
            set_opt(made_progress, did as c_int);
            Ok(())
        })
    }
}

/// Synchronises all ranks of the job (collective). Not available on plugin contexts.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_barrier(ctx: *mut gpulmt_ctx) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            h.forbid_blocking_in_plugin("gpulmt_barrier")?;
            Ok(h.ctx.barrier()?)
        })
    }
}

/// Allocates `bytes` of device memory on this rank's device; `*ptr` is its address
/// (NULL on failure). Release it with `gpulmt_mem_free` + `gpulmt_mem_free_commit`;
/// `gpulmt_finalize` releases what is left.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `ptr` is valid
/// for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mem_alloc(ctx: *mut gpulmt_ctx, bytes: usize, ptr: *mut *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let ptr = out(ptr, "ptr")?;
            *ptr = std::ptr::null_mut();
            *ptr = h.ctx.mem_alloc(bytes)? as *mut c_void;
            Ok(())
        })
    }
}

/// Marks device memory from `gpulmt_mem_alloc` to be released at the next
/// `gpulmt_mem_free_commit`; it stays valid until then. Freeing anything else, or
/// twice, fails with `GPULMT_ERR_FREE`.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call. `ptr` is any
/// value (it is checked, never dereferenced).
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mem_free(ctx: *mut gpulmt_ctx, ptr: *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| Ok(h.ctx.mem_free(ptr as usize)?)) }
}

/// Collective (every rank calls it): releases the memory every rank marked with
/// `gpulmt_mem_free`, once every rank closed its mappings of it. Not available on
/// plugin contexts (their memory is released by `gpulmt_finalize`).
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; no request may
/// still use memory marked for release.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mem_free_commit(ctx: *mut gpulmt_ctx) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            h.forbid_blocking_in_plugin("gpulmt_mem_free_commit")?;
            Ok(h.ctx.mem_free_commit()?)
        })
    }
}

/// Copies `len` bytes from `src` to `dst` (each host or device memory) and waits for
/// the copy: how a program fills and checks device buffers.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; unless `len`
/// is 0, `src` is valid for reads and `dst` for writes of `len` bytes, and they do
/// not overlap.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_copy(ctx: *mut gpulmt_ctx, dst: *mut c_void, src: *const c_void, len: usize) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            check_buf(dst, len, "dst")?;
            check_buf(src, len, "src")?;
            if len == 0 {
                return Ok(());
            }
            Ok(h.ctx.copy_sync(dst as usize, src as usize, len)?)
        })
    }
}

/// Gives this rank's counters (protocols used, packets, IPC handle cache).
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `stats` is
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_get_stats(ctx: *mut gpulmt_ctx, stats: *mut gpulmt_stats) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            *out(stats, "stats")? = gpulmt_stats::from(&h.ctx.stats());
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_follow_the_protocol_indices() {
        let s = Stats { protocols: [1, 2, 3, 4, 5, 6], ..Default::default() };
        let c = gpulmt_stats::from(&s);
        assert_eq!(c.protocols[GPULMT_PROTOCOL_GET], s.protocol_count(Protocol::Get));
        assert_eq!(c.protocols[GPULMT_PROTOCOL_PUT], s.protocol_count(Protocol::Put));
        assert_eq!(c.protocols[GPULMT_PROTOCOL_COOP], s.protocol_count(Protocol::Coop));
        assert_eq!(c.protocols[GPULMT_PROTOCOL_SHM], s.protocol_count(Protocol::Shm));
        assert_eq!(c.protocols[GPULMT_PROTOCOL_SELF], s.protocol_count(Protocol::SelfCopy));
    }
}
