//! One-sided communication (see `crate::rma`): `MPI_Win_create` over device memory gives
//! the library a host shadow; the synchronizations keep shadow and device buffer
//! coherent as MPI's separate memory model says, and complete the operations whose device
//! origin buffers were staged (`MPI_Put`, `MPI_Get`, `MPI_Accumulate`,
//! `MPI_Get_accumulate`, `MPI_Fetch_and_op`, `MPI_Compare_and_swap`, and the request-based
//! `MPI_Rput`, `MPI_Rget`, `MPI_Raccumulate`, `MPI_Rget_accumulate`, whose requests
//! complete after the copy back).
//!
//! Where the owner's private copy (the device buffer) becomes public (the shadow): before
//! `MPI_Win_fence`, `MPI_Win_post`, `MPI_Win_sync`, `MPI_Win_unlock_all` and the owner's
//! `MPI_Win_unlock` of its own rank. Where the public copy becomes private: after
//! `MPI_Win_fence`, `MPI_Win_wait` (and a `MPI_Win_test` that completes),
//! `MPI_Win_sync`, `MPI_Win_lock_all`, the owner's `MPI_Win_lock` of its own rank, and
//! `MPI_Win_free`. Every blocking synchronization keeps the shim's transfers moving
//! (`while_blocked`).
//!
//! Refused with an error naming the call: device memory attached to a dynamic window
//! (`MPI_Win_attach`: `MPI_ERR_RMA_ATTACH`). `MPI_Win_allocate` and
//! `MPI_Win_allocate_shared` give host memory: only device origin buffers need the shim.

use std::ffi::{c_int, c_void};

use mpi_sys::*;

use super::{active, with};
use crate::raw::*;
use crate::rma::{self, shadow::Shadow};
use crate::staging::{Region, Role, Shape};
use crate::state::while_blocked;

/// Reports an error of a window operation to the window's handler, and returns it.
///
/// # Safety
/// `win` is a valid window.
unsafe fn raise_win(win: MPI_Win, code: c_int) -> c_int {
    if code != SUCCESS {
        // SAFETY: the caller's window.
        unsafe { PMPI_Win_call_errhandler(win, code) };
    }
    code
}

/// What a synchronization does around the library's call.
#[derive(Clone, Copy, Default)]
struct Sync {
    /// Make the owner's stores public first (this rank's device window).
    publish: bool,
    /// Make the window's updates private afterwards.
    absorb: bool,
    /// Complete the pending origin operations afterwards: to one target, or (`Some(None)`)
    /// to all.
    complete: Option<Option<c_int>>,
    /// Only when the call names this rank of the window (`MPI_Win_lock`/`unlock`): the
    /// owner's publish and absorb apply then.
    own_rank_only: Option<c_int>,
}

/// Runs the library's synchronization `pmpi` of `win` with what `sync` asks around it.
///
/// # Safety
/// `win` is a valid window; `pmpi` is the library's call with the caller's arguments.
unsafe fn synchronize(call: &'static str, win: MPI_Win, sync: Sync, pmpi: impl FnOnce() -> c_int) -> c_int {
    let owner_applies = |w: &rma::Window| sync.own_rank_only.is_none_or(|r| r == w.rank);
    if sync.publish {
        let published = rma::with_window(win, |w| match (owner_applies(w), w.shadow.as_mut()) {
            (true, Some(s)) => s.publish().map(crate::staging::count_bytes).map_err(|e| e.to_string()),
            _ => Ok(()),
        });
        if let Some(Err(why)) = published {
            let code =
                crate::mpierr::for_call(MPI_ERR_OTHER as c_int, call, format_args!("publishing the window: {why}"));
            // SAFETY: the caller's window.
            return unsafe { raise_win(win, code) };
        }
    }
    let rc = while_blocked(pmpi);
    if rc != SUCCESS {
        return rc;
    }
    let after = rma::with_window(win, |w| {
        if let Some(target) = sync.complete {
            w.complete(target)?;
        }
        if sync.absorb && owner_applies(w) {
            if let Some(s) = w.shadow.as_mut() {
                crate::staging::count_bytes(s.absorb().map_err(|e| e.to_string())?);
            }
        }
        Ok::<(), String>(())
    });
    match after {
        Some(Err(why)) => {
            let code = crate::mpierr::for_call(MPI_ERR_OTHER as c_int, call, why);
            // SAFETY: the caller's window.
            unsafe { raise_win(win, code) }
        }
        _ => SUCCESS,
    }
}

/// `MPI_Win_create`: over device memory, the library gets a host shadow of it.
///
/// # Safety
/// As `MPI_Win_create`: `base` holds `size` bytes for the window's life, the handles are
/// valid and `win` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_create(
    base: *mut c_void,
    size: MPI_Aint,
    disp_unit: c_int,
    info: MPI_Info,
    comm: MPI_Comm,
    win: *mut MPI_Win,
) -> c_int {
    let pass = |base: *mut c_void, size: MPI_Aint| {
        // SAFETY: the caller's arguments (or a shadow standing for the base), passed on.
        while_blocked(|| unsafe { PMPI_Win_create(base, size, disp_unit, info, comm, win) })
    };
    if !active() || size <= 0 || base.is_null() {
        return pass(base, size);
    }
    let device = with(|s| {
        // MPI_Aint is `isize` in Open MPI's bindings and already `i64` in MPICH's.
        #[allow(clippy::unnecessary_cast)]
        let region = Region::of(base as usize, Shape::Count { count: size as i64, dt: byte() }, Role::InOut);
        match region {
            Ok(Some(r)) if s.region_on_device(&r) => Some(s.ctx.backend().clone()),
            _ => None,
        }
    })
    .flatten();
    let Some(backend) = device else { return pass(base, size) };
    // SAFETY: the window's device memory, valid for its life (the caller's contract), which
    // MPI's rules leave alone while the window synchronizes.
    let shadow = match unsafe { Shadow::new(backend.clone(), base as usize, size as usize) } {
        Ok(s) => s,
        Err(why) => {
            // The other ranks are in the collective: take part with nothing exposed, then fail.
            let rc = pass(std::ptr::null_mut(), 0);
            let code = crate::mpierr::for_call(MPI_ERR_NO_MEM as c_int, "MPI_Win_create", why);
            if rc != SUCCESS {
                return rc;
            }
            // SAFETY: the caller's communicator.
            unsafe { PMPI_Comm_call_errhandler(comm, code) };
            return code;
        }
    };
    let rc = pass(shadow.host(), size);
    if rc != SUCCESS {
        return rc;
    }
    let mut rank = 0;
    // SAFETY: the caller's communicator, a local out-pointer; `win` was just written.
    unsafe {
        PMPI_Comm_rank(comm, &mut rank);
        rma::register(*win, rank, Some(shadow), backend);
    }
    SUCCESS
}

/// `MPI_Win_free`: the window's last updates reach the device buffer, and its shadow goes.
///
/// # Safety
/// As `MPI_Win_free`: `win` points to a window handle.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_free(win: *mut MPI_Win) -> c_int {
    // SAFETY: the caller's pointer to a handle.
    let handle = unsafe { *win };
    // SAFETY: the caller's argument, passed on.
    let rc = while_blocked(|| unsafe { PMPI_Win_free(win) });
    if rc != SUCCESS {
        return rc;
    }
    if let Some(mut w) = rma::forget(handle) {
        let last = w.complete(None).and_then(|()| match w.shadow.as_mut() {
            Some(s) => s.absorb().map(|_| ()).map_err(|e| e.to_string()),
            None => Ok(()),
        });
        if let Err(why) = last {
            let code = crate::mpierr::for_call(MPI_ERR_OTHER as c_int, "MPI_Win_free", why);
            // The window is gone: its handler with it. MPI_COMM_WORLD's gets the error.
            // SAFETY: MPI_COMM_WORLD is valid while MPI is.
            unsafe { PMPI_Comm_call_errhandler(comm_world(), code) };
            return code;
        }
    }
    SUCCESS
}

/// `MPI_Win_fence`: publish, fence, complete every pending operation, absorb.
///
/// # Safety
/// As `MPI_Win_fence`: `win` is a valid window.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_fence(assert: c_int, win: MPI_Win) -> c_int {
    let sync = Sync { publish: true, absorb: true, complete: Some(None), own_rank_only: None };
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_fence", win, sync, || PMPI_Win_fence(assert, win)) }
}

/// `MPI_Win_post`: the owner's stores are made public, then the exposure epoch starts.
///
/// # Safety
/// As `MPI_Win_post`: `group` and `win` are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_post(group: MPI_Group, assert: c_int, win: MPI_Win) -> c_int {
    let sync = Sync { publish: true, ..Sync::default() };
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_post", win, sync, || PMPI_Win_post(group, assert, win)) }
}

/// `MPI_Win_start`, with the shim's progress while it blocks.
///
/// # Safety
/// As `MPI_Win_start`: `group` and `win` are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_start(group: MPI_Group, assert: c_int, win: MPI_Win) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_start", win, Sync::default(), || PMPI_Win_start(group, assert, win)) }
}

/// `MPI_Win_complete`: the access epoch ends; its pending operations complete.
///
/// # Safety
/// As `MPI_Win_complete`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_complete(win: MPI_Win) -> c_int {
    let sync = Sync { complete: Some(None), ..Sync::default() };
    // SAFETY: the caller's argument, passed on.
    unsafe { synchronize("MPI_Win_complete", win, sync, || PMPI_Win_complete(win)) }
}

/// `MPI_Win_wait`: the exposure epoch ends; its updates are made private.
///
/// # Safety
/// As `MPI_Win_wait`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_wait(win: MPI_Win) -> c_int {
    let sync = Sync { absorb: true, ..Sync::default() };
    // SAFETY: the caller's argument, passed on.
    unsafe { synchronize("MPI_Win_wait", win, sync, || PMPI_Win_wait(win)) }
}

/// `MPI_Win_test`: as [`MPI_Win_wait`] once the epoch has ended.
///
/// # Safety
/// As `MPI_Win_test`: `win` is valid and `flag` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_test(win: MPI_Win, flag: *mut c_int) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    let rc = unsafe { PMPI_Win_test(win, flag) };
    // SAFETY: the caller's flag, just written.
    if rc != SUCCESS || unsafe { *flag } == 0 {
        return rc;
    }
    let sync = Sync { absorb: true, ..Sync::default() };
    // SAFETY: the caller's window; the epoch ended, so there is nothing more to call.
    unsafe { synchronize("MPI_Win_test", win, sync, || SUCCESS) }
}

/// `MPI_Win_lock`: of the owner's own rank, the window's updates are made private after.
///
/// # Safety
/// As `MPI_Win_lock`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_lock(lock_type: c_int, rank: c_int, assert: c_int, win: MPI_Win) -> c_int {
    let sync = Sync { absorb: true, own_rank_only: Some(rank), ..Sync::default() };
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_lock", win, sync, || PMPI_Win_lock(lock_type, rank, assert, win)) }
}

/// `MPI_Win_unlock`: of the owner's own rank, its stores are made public before; the
/// pending operations to `rank` complete after.
///
/// # Safety
/// As `MPI_Win_unlock`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_unlock(rank: c_int, win: MPI_Win) -> c_int {
    let sync = Sync { publish: true, complete: Some(Some(rank)), own_rank_only: Some(rank), ..Sync::default() };
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_unlock", win, sync, || PMPI_Win_unlock(rank, win)) }
}

/// `MPI_Win_lock_all`: the window's updates are made private after.
///
/// # Safety
/// As `MPI_Win_lock_all`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_lock_all(assert: c_int, win: MPI_Win) -> c_int {
    let sync = Sync { absorb: true, ..Sync::default() };
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_lock_all", win, sync, || PMPI_Win_lock_all(assert, win)) }
}

/// `MPI_Win_unlock_all`: the owner's stores are made public before; every pending
/// operation completes after.
///
/// # Safety
/// As `MPI_Win_unlock_all`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_unlock_all(win: MPI_Win) -> c_int {
    let sync = Sync { publish: true, complete: Some(None), ..Sync::default() };
    // SAFETY: the caller's argument, passed on.
    unsafe { synchronize("MPI_Win_unlock_all", win, sync, || PMPI_Win_unlock_all(win)) }
}

/// `MPI_Win_flush`: the pending operations to `rank` complete after.
///
/// # Safety
/// As `MPI_Win_flush`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_flush(rank: c_int, win: MPI_Win) -> c_int {
    let sync = Sync { complete: Some(Some(rank)), ..Sync::default() };
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_flush", win, sync, || PMPI_Win_flush(rank, win)) }
}

/// `MPI_Win_flush_local`: as [`MPI_Win_flush`] (the origin buffers are complete).
///
/// # Safety
/// As `MPI_Win_flush_local`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_flush_local(rank: c_int, win: MPI_Win) -> c_int {
    let sync = Sync { complete: Some(Some(rank)), ..Sync::default() };
    // SAFETY: the caller's arguments, passed on.
    unsafe { synchronize("MPI_Win_flush_local", win, sync, || PMPI_Win_flush_local(rank, win)) }
}

/// `MPI_Win_flush_all`: every pending operation completes after.
///
/// # Safety
/// As `MPI_Win_flush_all`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_flush_all(win: MPI_Win) -> c_int {
    let sync = Sync { complete: Some(None), ..Sync::default() };
    // SAFETY: the caller's argument, passed on.
    unsafe { synchronize("MPI_Win_flush_all", win, sync, || PMPI_Win_flush_all(win)) }
}

/// `MPI_Win_flush_local_all`: as [`MPI_Win_flush_all`].
///
/// # Safety
/// As `MPI_Win_flush_local_all`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_flush_local_all(win: MPI_Win) -> c_int {
    let sync = Sync { complete: Some(None), ..Sync::default() };
    // SAFETY: the caller's argument, passed on.
    unsafe { synchronize("MPI_Win_flush_local_all", win, sync, || PMPI_Win_flush_local_all(win)) }
}

/// `MPI_Win_sync`: the owner's stores are made public, and the window's updates private.
///
/// # Safety
/// As `MPI_Win_sync`: `win` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_sync(win: MPI_Win) -> c_int {
    let sync = Sync { publish: true, absorb: true, ..Sync::default() };
    // SAFETY: the caller's argument, passed on.
    unsafe { synchronize("MPI_Win_sync", win, sync, || PMPI_Win_sync(win)) }
}

/// `MPI_Win_get_attr`: of a window over device memory, `MPI_WIN_BASE` is the device
/// buffer and `MPI_WIN_MODEL` is `MPI_WIN_SEPARATE` (see `crate::rma::shadow`).
///
/// # Safety
/// As `MPI_Win_get_attr`: `win` is valid, `attribute_val` points to room for a pointer and
/// `flag` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_get_attr(
    win: MPI_Win,
    keyval: c_int,
    attribute_val: *mut c_void,
    flag: *mut c_int,
) -> c_int {
    // SAFETY: the caller's arguments, passed on.
    let rc = unsafe { PMPI_Win_get_attr(win, keyval, attribute_val, flag) };
    // SAFETY: the caller's flag, written by the library.
    if rc != SUCCESS || unsafe { *flag } == 0 {
        return rc;
    }
    let Some(Some(device)) = rma::with_window(win, |w| w.shadow.as_ref().map(|s| s.device())) else { return rc };
    // SAFETY: the caller's room for a pointer (predefined attributes are pointers to their
    // values, the base itself for MPI_WIN_BASE); `gpulmt_mpi_win_separate` is a constant
    // that lives as long as the process.
    unsafe {
        if keyval == win_base() {
            *attribute_val.cast::<*mut c_void>() = device as *mut c_void;
        } else if keyval == win_model() {
            *attribute_val.cast::<*const c_int>() = std::ptr::addr_of!(gpulmt_mpi_win_separate);
        }
    }
    rc
}

/// `MPI_Win_attach`: device memory is refused (`MPI_ERR_RMA_ATTACH`): a dynamic window's
/// memory is the library's to read and write at any time, with no synchronization that
/// would let a shadow follow it.
///
/// # Safety
/// As `MPI_Win_attach`: `win` is valid and `base` holds `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Win_attach(win: MPI_Win, base: *mut c_void, size: MPI_Aint) -> c_int {
    let device = active() && size > 0 && with(|s| s.is_device(base as usize, size as usize)).unwrap_or(false);
    if !device {
        // SAFETY: the caller's arguments, passed on.
        return unsafe { PMPI_Win_attach(win, base, size) };
    }
    let code = crate::mpierr::for_call(
        MPI_ERR_RMA_ATTACH as c_int,
        "MPI_Win_attach",
        "device memory cannot be attached to a dynamic window (the shim keeps a host shadow of device memory \
         only for windows of MPI_Win_create); create the window with MPI_Win_create over the device buffer",
    );
    // SAFETY: the caller's window.
    unsafe { raise_win(win, code) }
}

/// The origin buffers of one RMA call: address, count, datatype, and what the call does
/// with it.
type OriginBufs<const N: usize> = [(*mut c_void, c_int, MPI_Datatype, Role); N];

/// An RMA operation of `win` to `target` whose origin buffers (`bufs`) may be device
/// memory: `op` runs with the given pointers, or with staged copies kept until the
/// operation completes (the synchronization of the window that completes it).
///
/// # Safety
/// `win` is valid; `bufs` are the call's buffers, valid until the operation completes;
/// `op` is the library's call with the caller's other arguments.
unsafe fn origin_op<const N: usize>(
    call: &'static str,
    win: MPI_Win,
    target: c_int,
    bufs: OriginBufs<N>,
    op: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    let given = bufs.map(|b| b.0);
    if !active() || target == proc_null() || given.iter().all(|p| crate::hostmem::is_host(*p as usize, 1)) {
        return op(given);
    }
    let spec = bufs.map(|(p, count, dt, role)| (p as usize, count, dt, role));
    let staged = with(|s| s.stage_buffers(&spec, call).map(|st| st.map(|st| (st, s.ctx.backend().clone()))));
    match staged {
        // SAFETY: the caller's window.
        Some(Err(code)) => unsafe { raise_win(win, code) },
        Some(Ok(Some((staged, backend)))) => {
            let rc = op(std::array::from_fn(|i| staged.pointer(i, given[i])));
            if rc == SUCCESS {
                // The window's own rank matters only for device windows, recorded at creation.
                rma::keep_pending(win, -1, target, staged, &backend);
            }
            rc
        }
        None | Some(Ok(None)) => op(given),
    }
}

/// As [`origin_op`] for a request-based operation: the staged copies go with a request of
/// the shim's, which completes once the library's has and the results are copied back.
///
/// # Safety
/// As [`origin_op`]; `request` is valid for writes.
unsafe fn origin_request<const N: usize>(
    call: &'static str,
    win: MPI_Win,
    target: c_int,
    bufs: OriginBufs<N>,
    op: impl FnOnce([*mut c_void; N], *mut MPI_Request) -> c_int,
    request: *mut MPI_Request,
) -> c_int {
    let given = bufs.map(|b| b.0);
    if !active() || target == proc_null() || given.iter().all(|p| crate::hostmem::is_host(*p as usize, 1)) {
        return op(given, request);
    }
    let spec = bufs.map(|(p, count, dt, role)| (p as usize, count, dt, role));
    match with(|s| s.stage_buffers(&spec, call)) {
        // SAFETY: the caller's window.
        Some(Err(code)) => unsafe { raise_win(win, code) },
        Some(Ok(Some(staged))) => {
            let mut inner = request_null();
            let rc = op(std::array::from_fn(|i| staged.pointer(i, given[i])), &mut inner);
            if rc != SUCCESS {
                return rc;
            }
            // A window operation's request belongs to no communicator: a failure to copy
            // back goes to MPI_COMM_SELF's handler.
            match with(|s| s.track_staged(inner, staged, comm_self(), call)) {
                Some(handle) => {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *request = handle };
                    SUCCESS
                }
                // SAFETY: the caller's window.
                None => unsafe { raise_win(win, ERR_INTERN) },
            }
        }
        None | Some(Ok(None)) => op(given, request),
    }
}

/// `MPI_Put`: a device origin buffer is staged until the operation completes.
///
/// # Safety
/// As `MPI_Put`: the origin buffer holds `origin_count` elements of `origin_dt` until the
/// operation completes, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Put(
    origin: *const c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    win: MPI_Win,
) -> c_int {
    let bufs = [(origin.cast_mut(), origin_count, origin_dt, Role::In)];
    // SAFETY: the caller's arguments, the origin buffer possibly staged.
    unsafe {
        origin_op("MPI_Put", win, target, bufs, |p| {
            PMPI_Put(p[0], origin_count, origin_dt, target, disp, target_count, target_dt, win)
        })
    }
}

/// `MPI_Get`: a device origin buffer gets the data when the operation completes.
///
/// # Safety
/// As `MPI_Get`: the origin buffer has room for `origin_count` elements of `origin_dt`
/// until the operation completes, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Get(
    origin: *mut c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    win: MPI_Win,
) -> c_int {
    let bufs = [(origin, origin_count, origin_dt, Role::Out)];
    // SAFETY: the caller's arguments, the origin buffer possibly staged.
    unsafe {
        origin_op("MPI_Get", win, target, bufs, |p| {
            PMPI_Get(p[0], origin_count, origin_dt, target, disp, target_count, target_dt, win)
        })
    }
}

/// `MPI_Accumulate`: a device origin buffer is staged until the operation completes.
///
/// # Safety
/// As `MPI_Accumulate`: as [`MPI_Put`], and `op` is valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Accumulate(
    origin: *const c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
) -> c_int {
    let bufs = [(origin.cast_mut(), origin_count, origin_dt, Role::In)];
    // SAFETY: the caller's arguments, the origin buffer possibly staged.
    unsafe {
        origin_op("MPI_Accumulate", win, target, bufs, |p| {
            PMPI_Accumulate(p[0], origin_count, origin_dt, target, disp, target_count, target_dt, op, win)
        })
    }
}

/// `MPI_Get_accumulate`: device origin and result buffers staged; the result copied back
/// when the operation completes.
///
/// # Safety
/// As `MPI_Get_accumulate`: the buffers hold (or have room for) their elements until the
/// operation completes, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Get_accumulate(
    origin: *const c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    result: *mut c_void,
    result_count: c_int,
    result_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
) -> c_int {
    let bufs = [(origin.cast_mut(), origin_count, origin_dt, Role::In), (result, result_count, result_dt, Role::Out)];
    // SAFETY: the caller's arguments, the buffers possibly staged.
    unsafe {
        origin_op("MPI_Get_accumulate", win, target, bufs, |p| {
            PMPI_Get_accumulate(
                p[0],
                origin_count,
                origin_dt,
                p[1],
                result_count,
                result_dt,
                target,
                disp,
                target_count,
                target_dt,
                op,
                win,
            )
        })
    }
}

/// `MPI_Fetch_and_op`: as [`MPI_Get_accumulate`] for one element.
///
/// # Safety
/// As `MPI_Fetch_and_op`: the buffers hold one element of `dt` until the operation
/// completes, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Fetch_and_op(
    origin: *const c_void,
    result: *mut c_void,
    dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    op: MPI_Op,
    win: MPI_Win,
) -> c_int {
    let bufs = [(origin.cast_mut(), 1, dt, Role::In), (result, 1, dt, Role::Out)];
    // SAFETY: the caller's arguments, the buffers possibly staged.
    unsafe {
        origin_op("MPI_Fetch_and_op", win, target, bufs, |p| PMPI_Fetch_and_op(p[0], p[1], dt, target, disp, op, win))
    }
}

/// `MPI_Compare_and_swap`: the origin, compare and result buffers staged as for
/// [`MPI_Fetch_and_op`].
///
/// # Safety
/// As `MPI_Compare_and_swap`: the buffers hold one element of `dt` until the operation
/// completes, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Compare_and_swap(
    origin: *const c_void,
    compare: *const c_void,
    result: *mut c_void,
    dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    win: MPI_Win,
) -> c_int {
    let bufs =
        [(origin.cast_mut(), 1, dt, Role::In), (compare.cast_mut(), 1, dt, Role::In), (result, 1, dt, Role::Out)];
    // SAFETY: the caller's arguments, the buffers possibly staged.
    unsafe {
        origin_op("MPI_Compare_and_swap", win, target, bufs, |p| {
            PMPI_Compare_and_swap(p[0], p[1], p[2], dt, target, disp, win)
        })
    }
}

/// `MPI_Rput`: as [`MPI_Put`]; the request completes once the origin buffer is free.
///
/// # Safety
/// As `MPI_Rput`: as [`MPI_Put`], and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Rput(
    origin: *const c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    win: MPI_Win,
    request: *mut MPI_Request,
) -> c_int {
    let bufs = [(origin.cast_mut(), origin_count, origin_dt, Role::In)];
    let op = |p: [*mut c_void; 1], req| {
        // SAFETY: the caller's arguments, the origin buffer possibly staged; a request out-pointer.
        unsafe { PMPI_Rput(p[0], origin_count, origin_dt, target, disp, target_count, target_dt, win, req) }
    };
    // SAFETY: the caller's arguments.
    unsafe { origin_request("MPI_Rput", win, target, bufs, op, request) }
}

/// `MPI_Rget`: as [`MPI_Get`]; the request completes once the data is in the origin buffer.
///
/// # Safety
/// As `MPI_Rget`: as [`MPI_Get`], and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Rget(
    origin: *mut c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    win: MPI_Win,
    request: *mut MPI_Request,
) -> c_int {
    let bufs = [(origin, origin_count, origin_dt, Role::Out)];
    let op = |p: [*mut c_void; 1], req| {
        // SAFETY: the caller's arguments, the origin buffer possibly staged; a request out-pointer.
        unsafe { PMPI_Rget(p[0], origin_count, origin_dt, target, disp, target_count, target_dt, win, req) }
    };
    // SAFETY: the caller's arguments.
    unsafe { origin_request("MPI_Rget", win, target, bufs, op, request) }
}

/// `MPI_Raccumulate`: as [`MPI_Accumulate`], with a request.
///
/// # Safety
/// As `MPI_Raccumulate`: as [`MPI_Accumulate`], and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Raccumulate(
    origin: *const c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
    request: *mut MPI_Request,
) -> c_int {
    let bufs = [(origin.cast_mut(), origin_count, origin_dt, Role::In)];
    let call = |p: [*mut c_void; 1], req| {
        // SAFETY: the caller's arguments, the origin buffer possibly staged; a request out-pointer.
        unsafe { PMPI_Raccumulate(p[0], origin_count, origin_dt, target, disp, target_count, target_dt, op, win, req) }
    };
    // SAFETY: the caller's arguments.
    unsafe { origin_request("MPI_Raccumulate", win, target, bufs, call, request) }
}

/// `MPI_Rget_accumulate`: as [`MPI_Get_accumulate`], with a request.
///
/// # Safety
/// As `MPI_Rget_accumulate`: as [`MPI_Get_accumulate`], and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Rget_accumulate(
    origin: *const c_void,
    origin_count: c_int,
    origin_dt: MPI_Datatype,
    result: *mut c_void,
    result_count: c_int,
    result_dt: MPI_Datatype,
    target: c_int,
    disp: MPI_Aint,
    target_count: c_int,
    target_dt: MPI_Datatype,
    op: MPI_Op,
    win: MPI_Win,
    request: *mut MPI_Request,
) -> c_int {
    let bufs = [(origin.cast_mut(), origin_count, origin_dt, Role::In), (result, result_count, result_dt, Role::Out)];
    let call = |p: [*mut c_void; 2], req| {
        // SAFETY: the caller's arguments, the buffers possibly staged; a request out-pointer.
        unsafe {
            PMPI_Rget_accumulate(
                p[0],
                origin_count,
                origin_dt,
                p[1],
                result_count,
                result_dt,
                target,
                disp,
                target_count,
                target_dt,
                op,
                win,
                req,
            )
        }
    };
    // SAFETY: the caller's arguments.
    unsafe { origin_request("MPI_Rget_accumulate", win, target, bufs, call, request) }
}
