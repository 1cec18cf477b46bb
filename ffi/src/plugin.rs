//! The LMT plugin ABI, mirroring MPICH Nemesis' LMT hooks: the host owns matching
//! and its own control channel, and gpulmt moves the payload of large messages.
//!
//! ```text
//!   sender (host)                              receiver (host)
//!   gpulmt_lmt_initiate -> RTS cookie  ==RTS==>  match; gpulmt_lmt_start_recv
//!                                               -> CTS cookie (none for GET)
//!   gpulmt_lmt_handle_cts(CTS cookie) <==CTS==
//!   gpulmt_lmt_done ... (poll)                  gpulmt_lmt_done ... (poll)
//! ```
//!
//! Every other control blob gpulmt needs to exchange travels through the host's
//! `send_blob` callback and comes back through `gpulmt_plugin_deliver`. A host that
//! gives no `send_blob` carries only the RTS cookie: gpulmt's own shared-memory rings
//! between the node's processes carry the rest (no CTS cookie, no blobs), read by
//! `gpulmt_lmt_done` / `gpulmt_progress` from the host's progress loop.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, Mutex, PoisonError};

use gpulmt::config::Config;
use gpulmt::{Context, JobInfo, Rank};
use gpulmt_protocols::wire::{eager_overhead, REGION_BYTES};

use crate::endpoint::hand_out;
use crate::error::{guard, FfiError, GPULMT_ERR_INTERNAL};
use crate::handle::{
    bytes, check_buf, gpulmt_ctx, gpulmt_request, gpulmt_status, out, rank_arg, test_request, with_ctx, PluginState,
    GPULMT_REQUEST_NULL,
};

/// Bytes of the largest RTS or CTS cookie: an RTS that carries a device region. A
/// cookie buffer of this size always suffices.
pub const GPULMT_COOKIE_MAX: usize = 155;

/// The wire size of an RTS with a device region: packet header, message id and tag
/// (laid out as an eager packet's header), message length, memory kind, region.
const RTS_WITH_REGION: usize = eager_overhead() + 8 + 1 + REGION_BYTES;
/// The wire size of a CTS with a region: packet header, message id, mode, split,
/// region flag, region (the header is the eager header less the id and tag).
const CTS_WITH_REGION: usize = eager_overhead() - 8 - 4 + 8 + 1 + 8 + 1 + REGION_BYTES;
const _: () = assert!(GPULMT_COOKIE_MAX == RTS_WITH_REGION, "GPULMT_COOKIE_MAX must follow the wire format");
const _: () = assert!(CTS_WITH_REGION <= GPULMT_COOKIE_MAX, "a CTS cookie must fit GPULMT_COOKIE_MAX");

/// The host's side of a plugin context.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct gpulmt_plugin_ops {
    /// Passed back to every callback as is.
    pub user: *mut c_void,
    /// Sends the control blob `bytes[0..len)` to local rank `to_local_rank` over the
    /// host's channel; the host hands it to that rank's `gpulmt_plugin_deliver`.
    /// Blobs to one rank must be delivered in the order sent. gpulmt calls it from
    /// within its calls on the context, on the calling thread; it must not call gpulmt
    /// on the same context. `bytes` is valid only during the call: copy it. Returns 0
    /// on success; anything else means the channel to that rank is broken, and gpulmt
    /// then treats the rank as terminated (its transfers fail with
    /// `GPULMT_ERR_PEER_FAILED`).
    ///
    /// NULL: gpulmt's own shared-memory rings carry every control packet but the RTS
    /// cookie (the host's matching still orders the messages). `gpulmt_lmt_start_recv`
    /// then returns no CTS cookie, `gpulmt_plugin_deliver` and `gpulmt_lmt_handle_cts`
    /// are not used, and the host calls `gpulmt_progress` (or `gpulmt_lmt_done`) from its
    /// progress loop for as long as it runs, its shutdown handshake included: a packet
    /// this rank still owes a peer leaves only then.
    pub send_blob: Option<
        unsafe extern "C" fn(user: *mut c_void, to_local_rank: c_int, bytes: *const c_void, len: usize) -> c_int,
    >,
}

/// The host's channel as the context sees it: `send_blob` with its `user` pointer,
/// and where failed sends are noted for the ABI to settle after the call.
struct HostChannel {
    user: *mut c_void,
    send_blob: unsafe extern "C" fn(*mut c_void, c_int, *const c_void, usize) -> c_int,
    failures: Arc<Mutex<Vec<(Rank, c_int)>>>,
}

// SAFETY: the context calls its channel only from the thread that is calling gpulmt
// on it; gpulmt_plugin_init's contract makes `user` usable on any such thread.
unsafe impl Send for HostChannel {}

impl HostChannel {
    fn send(&mut self, to: Rank, blob: &[u8]) {
        // SAFETY: the host's callback with its own user pointer and a blob valid for
        // the duration of the call (gpulmt_plugin_init's contract).
        let rc = unsafe { (self.send_blob)(self.user, to as c_int, blob.as_ptr().cast(), blob.len()) };
        if rc != 0 {
            self.failures.lock().unwrap_or_else(PoisonError::into_inner).push((to, rc));
        }
    }
}

/// Copies a cookie into the caller's buffer; `*cap_len` is its capacity on entry,
/// the cookie's length on return.
fn put_cookie(cookie: Option<&[u8]>, dst: *mut c_void, cap_len: &mut usize) {
    let c = cookie.unwrap_or_default();
    if !c.is_empty() {
        // SAFETY: dst holds GPULMT_COOKIE_MAX >= c.len() bytes (checked by the callers
        // before starting the transfer; cookies are bounded by the static assertions).
        unsafe { std::ptr::copy_nonoverlapping(c.as_ptr(), dst.cast::<u8>(), c.len()) };
    }
    *cap_len = c.len();
}

/// Checks a cookie out-buffer before a transfer starts, so a too-small buffer never
/// leaves a transfer started with its cookie lost.
fn check_cookie_buf(dst: *mut c_void, cap: usize, name: &str) -> Result<(), FfiError> {
    check_buf(dst, cap, name)?;
    if dst.is_null() || cap < GPULMT_COOKIE_MAX {
        return Err(FfiError::invalid(format!(
            "{name} holds {cap} bytes: cookie buffers must hold GPULMT_COOKIE_MAX ({GPULMT_COOKIE_MAX}) bytes"
        )));
    }
    Ok(())
}

/// Checks that a cookie the context produced fits the ABI's bound (the static
/// assertions make this a bug check: failing it poisons the context).
fn check_cookie_len(c: &[u8]) -> Result<(), FfiError> {
    if c.len() > GPULMT_COOKIE_MAX {
        return Err(FfiError::new(
            GPULMT_ERR_INTERNAL,
            format!("a cookie of {} bytes exceeds GPULMT_COOKIE_MAX ({GPULMT_COOKIE_MAX})", c.len()),
        ));
    }
    Ok(())
}

/// Joins a job as an LMT plugin of a host (an MPI library) that owns matching and
/// its own control channel between the node's processes.
///
/// Every local rank `0 <= local_rank < local_size` of job `job_id` (a string shared by
/// the job's processes, of ASCII letters, digits, `-`, `_` and `.`; unique per job on
/// the node) calls it; it blocks until all have joined (`GPULMT_INIT_TIMEOUT_MS`). The
/// configuration comes from the `GPULMT_*` environment variables; the device is
/// `GPULMT_GPU`, else `GPULMT_LOCAL_RANK`, else `local_rank`, modulo the devices.
/// On success `*out` is the context; on failure NULL.
///
/// Drive transfers with `gpulmt_lmt_initiate`, `gpulmt_lmt_start_recv`,
/// `gpulmt_lmt_handle_cts` and `gpulmt_lmt_done` from the host's progress loop, and
/// pass every blob the channel brings to `gpulmt_plugin_deliver`. The calls that block
/// on peers (`gpulmt_wait`, `gpulmt_barrier`, `gpulmt_mem_free_commit`) are not
/// available on a plugin context. `gpulmt_finalize` is local: call it once the host
/// knows that no transfer with this rank is in flight on any rank (for instance after
/// its own shutdown handshake); peers then see this rank as gone, and rank 0 removes
/// the job's shared memory.
///
/// # Safety
/// `ops` is valid for reads (it is copied) and `ops->send_blob` must be usable with
/// `ops->user` on whichever thread calls gpulmt on the context, until
/// `gpulmt_finalize`; `job_id` is a NUL-terminated string; `out` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_plugin_init(
    ops: *const gpulmt_plugin_ops,
    job_id: *const c_char,
    local_rank: c_int,
    local_size: c_int,
    out: *mut *mut gpulmt_ctx,
) -> c_int {
    gpulmt::logging::init("warn");
    guard(|| {
        // SAFETY: the caller's contract.
        let slot = unsafe { crate::handle::out(out, "out")? };
        *slot = std::ptr::null_mut();
        // SAFETY: the caller's contract.
        let ops = *unsafe { ops.as_ref() }.ok_or_else(|| FfiError::invalid("ops is NULL"))?;
        if job_id.is_null() {
            return Err(FfiError::invalid("job_id is NULL"));
        }
        // SAFETY: a NUL-terminated string (the caller's contract).
        let job = unsafe { CStr::from_ptr(job_id) }
            .to_str()
            .map_err(|_| FfiError::invalid("job_id is not UTF-8"))?
            .to_owned();
        let size = u32::try_from(local_size)
            .ok()
            .filter(|&s| s > 0)
            .ok_or_else(|| FfiError::invalid(format!("local_size {local_size} must be positive")))?;
        let rank = rank_arg(local_rank, "local_rank")?;
        if rank >= size {
            return Err(FfiError::invalid(format!("local_rank {rank} is not below local_size {size}")));
        }

        let send_failures = Arc::new(Mutex::new(Vec::new()));
        let info = JobInfo { job: job.clone(), rank, size };
        let cfg = Config::from_env().map_err(gpulmt::Error::from)?;
        let ctx = match ops.send_blob {
            Some(send_blob) => {
                let mut host = HostChannel { user: ops.user, send_blob, failures: Arc::clone(&send_failures) };
                Context::init_plugin(cfg, info, Box::new(move |to, blob| host.send(to, blob)))?
            }
            None => Context::init_plugin_rings(cfg, info)?,
        };
        let rings = ops.send_blob.is_none();
        let h = gpulmt_ctx::new(ctx, Some(PluginState { send_failures, rings }));
        // SAFETY: checked non-null above.
        unsafe { hand_out(out, h) };
        Ok(())
    })
}

/// Hands gpulmt a control blob that the host's channel brought from local rank `from`
/// (sent by that rank's `send_blob`), and makes progress.
///
/// # Safety
/// `ctx` is a live plugin context that no other thread uses during the call; unless
/// `len` is 0, `blob` is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_plugin_deliver(
    ctx: *mut gpulmt_ctx,
    from: c_int,
    blob: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            h.require_host_channel("gpulmt_plugin_deliver")?;
            let blob = bytes(blob, len, "blob")?;
            Ok(h.ctx.deliver(rank_arg(from, "from")?, blob)?)
        })
    }
}

/// Sender: starts moving the `len` bytes (at least 1) at `buf` to local rank `dst`.
///
/// `*req` is the request (poll it with `gpulmt_lmt_done`), and the RTS cookie for the
/// host's RTS is written to `cookie_out`: `*cookie_len` is its capacity on entry (at
/// least `GPULMT_COOKIE_MAX`) and the cookie's length on return. On failure `*req` is
/// `GPULMT_REQUEST_NULL` and nothing was started.
///
/// # Safety
/// `ctx` is a live plugin context that no other thread uses during the call; `buf` is
/// valid for reads of `len` bytes (host or device memory) and stays valid and
/// unmodified until the request completes; `req` is valid for writes; `cookie_len`
/// is valid for reads and writes and `cookie_out` for writes of `*cookie_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_lmt_initiate(
    ctx: *mut gpulmt_ctx,
    buf: *const c_void,
    len: usize,
    dst: c_int,
    req: *mut gpulmt_request,
    cookie_out: *mut c_void,
    cookie_len: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            h.require_plugin("gpulmt_lmt_initiate")?;
            let req = out(req, "req")?;
            *req = GPULMT_REQUEST_NULL;
            let cookie_len = out(cookie_len, "cookie_len")?;
            check_cookie_buf(cookie_out, *cookie_len, "cookie_out")?;
            check_buf(buf, len, "buf")?;
            let (r, cookie) = h.ctx.lmt_initiate(buf.cast(), len, rank_arg(dst, "dst")?)?;
            check_cookie_len(&cookie)?;
            put_cookie(Some(&cookie), cookie_out, cookie_len);
            *req = r.id();
            Ok(())
        })
    }
}

/// Receiver: starts receiving into `buf` (`len` bytes, host or device memory) the
/// message from local rank `from` whose RTS cookie (`rts_cookie[0..rts_len)`) the host
/// matched to this receive.
///
/// `*req` is the request (poll it with `gpulmt_lmt_done`). The CTS cookie for the
/// host's CTS is written to `cts_out`: `*cts_len` is its capacity on entry (at least
/// `GPULMT_COOKIE_MAX`) and the cookie's length on return; 0 means the protocol (GET)
/// needs no CTS, and the host sends none (always 0 without `send_blob`: the CTS then
/// takes gpulmt's ring). A message longer than `len` completes the
/// request with `GPULMT_ERR_TRUNCATED`. On failure `*req` is `GPULMT_REQUEST_NULL`.
///
/// # Safety
/// `ctx` is a live plugin context that no other thread uses during the call;
/// `rts_cookie` is valid for reads of `rts_len` bytes; `buf` is valid for writes of
/// `len` bytes and stays valid and otherwise unused until the request completes;
/// `req` is valid for writes; `cts_len` is valid for reads and writes and `cts_out`
/// for writes of `*cts_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_lmt_start_recv(
    ctx: *mut gpulmt_ctx,
    from: c_int,
    rts_cookie: *const c_void,
    rts_len: usize,
    buf: *mut c_void,
    len: usize,
    req: *mut gpulmt_request,
    cts_out: *mut c_void,
    cts_len: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            h.require_plugin("gpulmt_lmt_start_recv")?;
            let req = out(req, "req")?;
            *req = GPULMT_REQUEST_NULL;
            let cts_len = out(cts_len, "cts_len")?;
            check_cookie_buf(cts_out, *cts_len, "cts_out")?;
            check_buf(buf, len, "buf")?;
            let rts = bytes(rts_cookie, rts_len, "rts_cookie")?;
            let (r, cts) = h.ctx.lmt_start_recv(rank_arg(from, "from")?, rts, buf.cast(), len)?;
            if let Some(c) = &cts {
                check_cookie_len(c)?;
            }
            put_cookie(cts.as_deref(), cts_out, cts_len);
            *req = r.id();
            Ok(())
        })
    }
}

/// Sender: hands gpulmt the CTS cookie (`cts[0..len)`) that the host's CTS from local
/// rank `from` carried, and makes progress.
///
/// # Safety
/// `ctx` is a live plugin context that no other thread uses during the call; `cts`
/// is valid for reads of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_lmt_handle_cts(
    ctx: *mut gpulmt_ctx,
    from: c_int,
    cts: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            h.require_host_channel("gpulmt_lmt_handle_cts")?;
            let cts = bytes(cts, len, "cts")?;
            Ok(h.ctx.lmt_handle_cts(rank_arg(from, "from")?, cts)?)
        })
    }
}

/// Makes progress and tells whether LMT request `*req` completed: `gpulmt_test` for
/// the host's progress loop (same flags, status and results).
///
/// # Safety
/// As `gpulmt_test`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_lmt_done(
    ctx: *mut gpulmt_ctx,
    req: *mut gpulmt_request,
    flag: *mut c_int,
    status: *mut gpulmt_status,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| test_request(h, req, flag, status)) }
}

/// The host learned that local rank `rank` terminated: transfers with it fail with
/// `GPULMT_ERR_PEER_FAILED` (once copies on its memory stop) and its mappings are
/// released. `rank` must be another rank of the job.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_peer_terminated(ctx: *mut gpulmt_ctx, rank: c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| Ok(h.ctx.peer_terminated(rank_arg(rank, "rank")?)?)) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::*;
    use crate::handle::gpulmt_status;
    use gpulmt_protocols::wire::{CtsMode, MemDesc, Packet, Region, HANDLE_BYTES};
    use std::ptr::{null, null_mut};

    /// A `send_blob` that reports a broken channel.
    ///
    /// # Safety
    /// None: it reads no argument (`unsafe` only to match the callback's type).
    unsafe extern "C" fn broken(_: *mut c_void, _: c_int, _: *const c_void, _: usize) -> c_int {
        -1
    }

    fn ops() -> gpulmt_plugin_ops {
        gpulmt_plugin_ops { user: null_mut(), send_blob: Some(broken) }
    }

    #[test]
    fn failed_sends_are_noted_for_the_call_to_settle() {
        let failures = Arc::new(Mutex::new(Vec::new()));
        let mut ch = HostChannel { user: null_mut(), send_blob: broken, failures: Arc::clone(&failures) };
        ch.send(1, &[1, 2, 3]);
        assert_eq!(*failures.lock().unwrap(), vec![(1, -1)]);
    }

    #[test]
    fn plugin_init_checks_its_arguments() {
        let job = c"ffibadargs";
        let cases: [(gpulmt_plugin_ops, *const c_char, c_int, c_int, c_int); 4] = [
            (ops(), null(), 0, 1, GPULMT_ERR_INVALID_ARGUMENT),
            (ops(), job.as_ptr(), 0, 0, GPULMT_ERR_INVALID_ARGUMENT),
            (ops(), job.as_ptr(), 2, 2, GPULMT_ERR_INVALID_ARGUMENT),
            (ops(), job.as_ptr(), -1, 2, GPULMT_ERR_BAD_RANK),
        ];
        for (i, (ops, job, rank, size, code)) in cases.into_iter().enumerate() {
            let mut out = std::ptr::NonNull::<gpulmt_ctx>::dangling().as_ptr();
            // SAFETY: valid pointers or NULLs, which the function checks.
            assert_eq!(unsafe { gpulmt_plugin_init(&ops, job, rank, size, &mut out) }, code, "case {i}");
            assert!(out.is_null(), "case {i}");
        }
        // A job id the job's shared memory cannot be named after.
        let mut out = null_mut();
        // SAFETY: as above.
        let rc = unsafe { gpulmt_plugin_init(&ops(), c"bad/job".as_ptr(), 0, 1, &mut out) };
        assert_eq!(rc, GPULMT_ERR_SHM);
        assert!(out.is_null());
    }

    #[test]
    fn plugin_context_on_gpulmts_rings_takes_no_blobs_or_cts_cookies() {
        let job = std::ffi::CString::new(format!("ffirings{}", std::process::id())).unwrap();
        let rings = gpulmt_plugin_ops { user: null_mut(), send_blob: None };
        let mut ctx = null_mut();
        // SAFETY: valid pointers for every call; the context is finalized last.
        unsafe {
            assert_eq!(gpulmt_plugin_init(&rings, job.as_ptr(), 0, 1, &mut ctx), GPULMT_SUCCESS);
            assert_eq!(gpulmt_plugin_deliver(ctx, 0, b"junk".as_ptr().cast(), 4), GPULMT_ERR_INVALID_ARGUMENT);
            let msg = std::ffi::CStr::from_ptr(gpulmt_last_error()).to_string_lossy().into_owned();
            assert!(msg.contains("without send_blob"), "{msg}");
            assert_eq!(gpulmt_lmt_handle_cts(ctx, 0, b"junk".as_ptr().cast(), 4), GPULMT_ERR_INVALID_ARGUMENT);
            let mut req: gpulmt_request = 5;
            let mut st = gpulmt_status::empty(0);
            assert_eq!(crate::gpulmt_wait(ctx, &mut req, &mut st), GPULMT_ERR_UNSUPPORTED);
            assert_eq!(crate::gpulmt_finalize(ctx), GPULMT_SUCCESS);
        }
    }

    #[test]
    fn one_rank_plugin_context_refuses_blocking_calls_and_bad_cookies() {
        let job = format!("ffiplugin{}", std::process::id());
        let cjob = std::ffi::CString::new(job.clone()).unwrap();
        let mut ctx = null_mut();
        let data = [7u8; 64];
        // SAFETY: valid pointers for every call; the context is finalized last.
        unsafe {
            assert_eq!(gpulmt_plugin_init(&ops(), cjob.as_ptr(), 0, 1, &mut ctx), GPULMT_SUCCESS);
            let mut req: gpulmt_request = 5;
            let mut st = gpulmt_status::empty(0);
            assert_eq!(crate::gpulmt_wait(ctx, &mut req, &mut st), GPULMT_ERR_UNSUPPORTED);
            assert_eq!(crate::gpulmt_barrier(ctx), GPULMT_ERR_UNSUPPORTED);
            assert_eq!(crate::gpulmt_mem_free_commit(ctx), GPULMT_ERR_UNSUPPORTED);

            let mut cookie = [0u8; GPULMT_COOKIE_MAX];
            let mut n = GPULMT_COOKIE_MAX - 1;
            let buf = data.as_ptr().cast();
            let rc = gpulmt_lmt_initiate(ctx, buf, 64, 0, &mut req, cookie.as_mut_ptr().cast(), &mut n);
            assert_eq!((rc, req), (GPULMT_ERR_INVALID_ARGUMENT, GPULMT_REQUEST_NULL));
            n = GPULMT_COOKIE_MAX;
            let rc = gpulmt_lmt_initiate(ctx, buf, 0, 0, &mut req, cookie.as_mut_ptr().cast(), &mut n);
            assert_eq!(rc, GPULMT_ERR_INVALID_ARGUMENT);
            let rc = gpulmt_lmt_initiate(ctx, buf, 64, 1, &mut req, cookie.as_mut_ptr().cast(), &mut n);
            assert_eq!(rc, GPULMT_ERR_BAD_RANK);
            let mut got = [0u8; 64];
            let rc = gpulmt_lmt_start_recv(
                ctx,
                0,
                b"junk".as_ptr().cast(),
                4,
                got.as_mut_ptr().cast(),
                64,
                &mut req,
                cookie.as_mut_ptr().cast(),
                &mut n,
            );
            assert_eq!(rc, GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_plugin_deliver(ctx, 0, b"junk".as_ptr().cast(), 4), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_plugin_deliver(ctx, 0, null(), 0), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_peer_terminated(ctx, 0), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_peer_terminated(ctx, -1), GPULMT_ERR_BAD_RANK);

            assert_eq!(crate::gpulmt_finalize(ctx), GPULMT_SUCCESS);
        }
        // Rank 0 removed the job's segment.
        let left: Vec<_> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n == &format!("gpulmt-{job}"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    fn region() -> Region {
        Region { handle: [7; HANDLE_BYTES], alloc_size: 1 << 20, offset: 0, device: 1, node: 2, buffer_id: 3 }
    }

    #[test]
    fn cookie_max_is_the_largest_rts_or_cts() {
        let rts = Packet::Rts { msg: 1, tag: 0, len: 1 << 30, src: MemDesc::Device(region()) };
        let cts = Packet::Cts { msg: 1, mode: CtsMode::Coop, dst: Some(region()), split: 4096 };
        assert_eq!(rts.encoded_len(), RTS_WITH_REGION);
        assert_eq!(cts.encoded_len(), CTS_WITH_REGION);
        assert_eq!(rts.encoded_len().max(cts.encoded_len()), GPULMT_COOKIE_MAX);
        let host_rts = Packet::Rts { msg: 1, tag: 0, len: 1, src: MemDesc::Host };
        assert!(host_rts.encoded_len() < GPULMT_COOKIE_MAX);
    }

    #[test]
    fn cookie_buffers_are_checked_before_anything_starts() {
        let mut buf = [0u8; GPULMT_COOKIE_MAX];
        let p = buf.as_mut_ptr().cast::<c_void>();
        assert!(check_cookie_buf(p, GPULMT_COOKIE_MAX, "c").is_ok());
        assert!(check_cookie_buf(p, GPULMT_COOKIE_MAX - 1, "c").is_err());
        assert!(check_cookie_buf(std::ptr::null_mut(), 0, "c").is_err());
        let mut n = GPULMT_COOKIE_MAX;
        put_cookie(None, p, &mut n);
        assert_eq!(n, 0);
        put_cookie(Some(&[1, 2, 3]), p, &mut n);
        assert_eq!((n, &buf[..3]), (3, &[1u8, 2, 3][..]));
    }
}
