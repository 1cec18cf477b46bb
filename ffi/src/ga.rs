//! The C ABI of global arrays (`gpulmt_ga_*`; the Rust API is the `gpulmt-ga` crate,
//! `ga/`, and `docs/global-arrays.md` describes both).
//!
//! C names an array by a `gpulmt_ga` number (Global Arrays' `g_a`), kept in a table of
//! this process: a destroyed array stays in it, so that later calls on it fail with
//! `GPULMT_ERR_GA_DESTROYED` instead of touching freed memory. Every call that moves
//! data names the element type of its buffer (`GPULMT_GA_F32`...), which C cannot carry
//! in the pointer: a type other than the array's fails with `GPULMT_ERR_GA_TYPE`. All
//! checks run before any byte moves.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ::gpulmt_ga::{Dst, ElemType, GaError, GlobalArray, Layout, Pending, Registered, Section, Src};

use crate::error::{
    FfiError, GPULMT_ERR_GA_BOUNDS, GPULMT_ERR_GA_BUFFER, GPULMT_ERR_GA_DESTROYED, GPULMT_ERR_GA_TYPE,
    GPULMT_ERR_INVALID_ARGUMENT,
};
use crate::handle::{check_buf, gpulmt_ctx, out, rank_arg, set_opt, with_ctx};

/// A global array: a number from `gpulmt_ga_create` (never 0).
#[allow(non_camel_case_types)]
pub type gpulmt_ga = u64;

/// A non-blocking operation (`gpulmt_ga_put_nb`...): wait on it with `gpulmt_ga_wait`.
#[allow(non_camel_case_types)]
pub type gpulmt_ga_handle = u64;

/// Element type float.
pub const GPULMT_GA_F32: c_int = 0;
/// Element type double.
pub const GPULMT_GA_F64: c_int = 1;
/// Element type int32_t.
pub const GPULMT_GA_I32: c_int = 2;
/// Element type int64_t.
pub const GPULMT_GA_I64: c_int = 3;

const _: () = assert!(GPULMT_GA_F32 == ElemType::F32 as c_int && GPULMT_GA_I64 == ElemType::I64 as c_int);

/// A rectangular section: rows `lo[0]..hi[0]`, columns `lo[1]..hi[1]` (half-open,
/// zero-based).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct gpulmt_ga_section {
    pub lo: [usize; 2],
    pub hi: [usize; 2],
}

impl From<gpulmt_ga_section> for Section {
    fn from(s: gpulmt_ga_section) -> Section {
        Section::new(s.lo, s.hi)
    }
}

impl From<Section> for gpulmt_ga_section {
    fn from(s: Section) -> gpulmt_ga_section {
        gpulmt_ga_section { lo: s.lo, hi: s.hi }
    }
}

/// The arrays of this process, by number (destroyed ones too).
static ARRAYS: Mutex<BTreeMap<gpulmt_ga, GlobalArray>> = Mutex::new(BTreeMap::new());
/// Registered buffers by address (8-byte elements: the widest type's alignment).
static REGISTERED: Mutex<Option<HashMap<usize, Registered<i64>>>> = Mutex::new(None);
/// The last non-blocking handle given out, and the operations not yet waited on.
static HANDLES: Mutex<(gpulmt_ga_handle, BTreeMap<gpulmt_ga_handle, Pending>)> = Mutex::new((0, BTreeMap::new()));

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl From<GaError> for FfiError {
    fn from(e: GaError) -> Self {
        let code = match &e {
            GaError::OutOfBounds { .. } => GPULMT_ERR_GA_BOUNDS,
            GaError::TypeMismatch { .. } => GPULMT_ERR_GA_TYPE,
            GaError::Destroyed { .. } => GPULMT_ERR_GA_DESTROYED,
            GaError::BufferTooSmall { .. } => GPULMT_ERR_GA_BUFFER,
            GaError::InvalidArgument(_) => GPULMT_ERR_INVALID_ARGUMENT,
            GaError::Transport(t) => crate::error::error_code(t),
        };
        FfiError::new(code, e.to_string())
    }
}

fn elem_type(t: c_int) -> Result<ElemType, FfiError> {
    ElemType::from_code(t)
        .ok_or_else(|| FfiError::invalid(format!("element type {t} is none of GPULMT_GA_F32, _F64, _I32, _I64")))
}

/// Runs `f` on array `ga` of the table.
fn with_array<R>(ga: gpulmt_ga, f: impl FnOnce(&mut GlobalArray) -> Result<R, FfiError>) -> Result<R, FfiError> {
    let mut arrays = lock(&ARRAYS);
    let a = arrays.get_mut(&ga).ok_or_else(|| {
        FfiError::new(GPULMT_ERR_GA_DESTROYED, format!("{ga} is not a global array of this process (never created)"))
    })?;
    f(a)
}

/// Reads a section argument.
///
/// # Safety
/// `s` is NULL or valid for reads.
unsafe fn section_arg(s: *const gpulmt_ga_section) -> Result<Section, FfiError> {
    // SAFETY: the caller's contract.
    unsafe { s.as_ref() }.map(|s| Section::from(*s)).ok_or_else(|| FfiError::invalid("section is NULL"))
}

/// Runs `$body` with `$T` the Rust type of element type `$ty`.
macro_rules! typed {
    ($ty:expr, $T:ident => $body:expr) => {
        match $ty {
            ElemType::F32 => {
                type $T = f32;
                $body
            }
            ElemType::F64 => {
                type $T = f64;
                $body
            }
            ElemType::I32 => {
                type $T = i32;
                $body
            }
            ElemType::I64 => {
                type $T = i64;
                $body
            }
        }
    };
}

/// Collective (every rank, same arguments, same order as its other collective calls):
/// creates a `rows x cols` array of element type `type`, zeroed, in the symmetric heaps.
/// `block_rows` and `block_cols` both 0: block distribution (one block per rank);
/// otherwise tiles of that size dealt round-robin over the ranks (block-cyclic). `*ga`
/// is its number (0 on failure). Fails on every rank alike when the ranks' arguments
/// differ.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `ga` is valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_create(
    ctx: *mut gpulmt_ctx,
    r#type: c_int,
    rows: usize,
    cols: usize,
    block_rows: usize,
    block_cols: usize,
    ga: *mut gpulmt_ga,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let ga = out(ga, "ga")?;
            *ga = 0;
            let ty = elem_type(r#type)?;
            let layout = match (block_rows, block_cols) {
                (0, 0) => Layout::Block,
                (r, c) => Layout::BlockCyclic { block: [r, c] },
            };
            let a = GlobalArray::create(&mut h.ctx, ty, [rows, cols], layout)?;
            *ga = a.id();
            lock(&ARRAYS).insert(a.id(), a);
            Ok(())
        })
    }
}

/// Collective: completes every rank's operations on `ga` and frees it. Later calls on
/// it fail with `GPULMT_ERR_GA_DESTROYED`.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_destroy(ctx: *mut gpulmt_ctx, ga: gpulmt_ga) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| with_array(ga, |a| Ok(a.destroy(&mut h.ctx)?))) }
}

/// The arguments every data call shares.
struct Transfer {
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    ty: c_int,
    buf: *mut c_void,
    count: usize,
    ld: usize,
}

/// What a data call does.
enum Op {
    Put,
    Get,
    /// With its scale factor (one element of the type).
    Acc(*const c_void),
}

/// Checks a data call's arguments and runs it on its array: blocking, or (`nb`) issued,
/// returning the operation to wait on.
///
/// # Safety
/// `t.section` is NULL or valid for reads; `t.buf` holds `t.count` elements of `t.ty`,
/// readable (put, acc) or writable (get) with nothing else using them for the call, and
/// with `nb` until the operation is waited on (or a fence or sync of its array); an
/// accumulate's scale is NULL or readable for one element.
unsafe fn transfer(h: &mut gpulmt_ctx, t: Transfer, op: Op, nb: bool) -> Result<Option<Pending>, FfiError> {
    // SAFETY: the caller's contract.
    let s = unsafe { section_arg(t.section)? };
    let ty = elem_type(t.ty)?;
    check_buf(t.buf, t.count, "buf")?;
    if matches!(op, Op::Acc(k) if k.is_null()) {
        return Err(FfiError::invalid("scale is NULL"));
    }
    let (buf, count, ld, ctx) = (t.buf, t.count, t.ld, &h.ctx);
    with_array(t.ga, |a| {
        typed!(ty, T => {
            let handle = match op {
                Op::Put => {
                    // SAFETY: the caller's contract: `buf` holds `count` readable elements.
                    let src = unsafe { Src::raw(buf as *const T, count) };
                    if nb { a.put_nb(ctx, s, src, ld).map(Some) } else { a.put(ctx, s, src, ld).map(|()| None) }
                }
                Op::Get => {
                    // SAFETY: the caller's contract: `buf` holds `count` writable elements.
                    let dst = unsafe { Dst::raw(buf as *mut T, count) };
                    if nb { a.get_nb(ctx, s, dst, ld).map(Some) } else { a.get(ctx, s, dst, ld).map(|()| None) }
                }
                Op::Acc(k) => {
                    // SAFETY: the caller's contract: `k` holds one element of `type`.
                    let k = unsafe { (k as *const T).read_unaligned() };
                    // SAFETY: the caller's contract: `buf` holds `count` readable elements.
                    let src = unsafe { Src::raw(buf as *const T, count) };
                    if nb { a.acc_nb(ctx, s, src, ld, k).map(Some) } else { a.acc(ctx, s, src, ld, k).map(|()| None) }
                }
            }?;
            // SAFETY: the caller's contract keeps the buffer valid until the wait, a
            // fence or a sync.
            Ok(handle.map(|h| unsafe { h.into_pending() }))
        })
    })
}

/// A data call, non-blocking: `*handle` is what to wait on.
///
/// # Safety
/// As [`transfer`]'s with `nb`; `ctx` is a live context that no other thread uses during
/// the call; `handle` is valid for writes.
unsafe fn transfer_nb(ctx: *mut gpulmt_ctx, t: Transfer, op: Op, handle: *mut gpulmt_ga_handle) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let handle = out(handle, "handle")?;
            *handle = 0;
            let pending = transfer(h, t, op, true)?.expect("a non-blocking call gives an operation");
            let mut table = lock(&HANDLES);
            table.0 += 1;
            let id = table.0;
            table.1.insert(id, pending);
            *handle = id;
            Ok(())
        })
    }
}

/// Writes `section` of `ga` from `buf` (host or device memory of this rank): `count`
/// elements of `type`, row `i` of the section at `buf + i * ld`. Complete at the
/// owners on return.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `section` is
/// valid for reads; `buf` is readable for `count` elements, with nothing writing it.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_put(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    r#type: c_int,
    buf: *const c_void,
    count: usize,
    ld: usize,
) -> c_int {
    let t = Transfer { ga, section, ty: r#type, buf: buf as *mut c_void, count, ld };
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| transfer(h, t, Op::Put, false).map(drop)) }
}

/// Reads `section` of `ga` into `buf` (host or device memory of this rank): `count`
/// elements of `type`, row `i` at `buf + i * ld`. Complete on return.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `section` is
/// valid for reads; `buf` is writable for `count` elements, with nothing else using it.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_get(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    r#type: c_int,
    buf: *mut c_void,
    count: usize,
    ld: usize,
) -> c_int {
    let t = Transfer { ga, section, ty: r#type, buf, count, ld };
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| transfer(h, t, Op::Get, false).map(drop)) }
}

/// Adds `*scale * buf` to `section` of `ga`, element by element, atomically per element
/// against other accumulates; `scale` points to one element of `type`. Complete at the
/// owners on return.
///
/// # Safety
/// As gpulmt_ga_put's; `scale` is readable for one element of `type`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_acc(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    r#type: c_int,
    buf: *const c_void,
    count: usize,
    ld: usize,
    scale: *const c_void,
) -> c_int {
    let t = Transfer { ga, section, ty: r#type, buf: buf as *mut c_void, count, ld };
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| transfer(h, t, Op::Acc(scale), false).map(drop)) }
}

/// `gpulmt_ga_put`, non-blocking: `*handle` is the operation to wait on
/// (`gpulmt_ga_wait`) before `buf` is written again.
///
/// # Safety
/// As gpulmt_ga_put's, with `buf` unchanged until the wait; `handle` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_put_nb(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    r#type: c_int,
    buf: *const c_void,
    count: usize,
    ld: usize,
    handle: *mut gpulmt_ga_handle,
) -> c_int {
    let t = Transfer { ga, section, ty: r#type, buf: buf as *mut c_void, count, ld };
    // SAFETY: the caller's contract.
    unsafe { transfer_nb(ctx, t, Op::Put, handle) }
}

/// `gpulmt_ga_get`, non-blocking: `buf` holds the section once `gpulmt_ga_wait` on
/// `*handle` returned.
///
/// # Safety
/// As gpulmt_ga_get's, with `buf` untouched until the wait; `handle` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_get_nb(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    r#type: c_int,
    buf: *mut c_void,
    count: usize,
    ld: usize,
    handle: *mut gpulmt_ga_handle,
) -> c_int {
    let t = Transfer { ga, section, ty: r#type, buf, count, ld };
    // SAFETY: the caller's contract.
    unsafe { transfer_nb(ctx, t, Op::Get, handle) }
}

/// `gpulmt_ga_acc`, non-blocking: `*handle` is the operation to wait on
/// (`gpulmt_ga_wait`) before `buf` is written again.
///
/// # Safety
/// As gpulmt_ga_acc's, with `buf` unchanged until the wait; `handle` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_acc_nb(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    r#type: c_int,
    buf: *const c_void,
    count: usize,
    ld: usize,
    scale: *const c_void,
    handle: *mut gpulmt_ga_handle,
) -> c_int {
    let t = Transfer { ga, section, ty: r#type, buf: buf as *mut c_void, count, ld };
    // SAFETY: the caller's contract.
    unsafe { transfer_nb(ctx, t, Op::Acc(scale), handle) }
}

/// Waits until the non-blocking operation `*handle` is complete at its target, then
/// sets `*handle` to 0 (waiting on 0 returns at once). A handle waited on already (a copy
/// of one that was) is `GPULMT_ERR_INVALID_ARGUMENT`; one whose array was destroyed since
/// is `GPULMT_ERR_GA_DESTROYED` (the destroy completed it). Either way it is forgotten.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `handle` is valid
/// for reads and writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_wait(ctx: *mut gpulmt_ctx, handle: *mut gpulmt_ga_handle) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let handle = out(handle, "handle")?;
            if *handle == 0 {
                return Ok(());
            }
            let pending = lock(&HANDLES).1.remove(&*handle).ok_or_else(|| {
                FfiError::invalid(format!(
                    "GA handle {} is not pending: it was waited on already (through a copy?) or never issued",
                    *handle
                ))
            })?;
            *handle = 0;
            Ok(pending.wait(&h.ctx)?)
        })
    }
}

/// Local: waits until every operation this rank issued on `ga` is complete at its target.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_fence(ctx: *mut gpulmt_ctx, ga: gpulmt_ga) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| with_array(ga, |a| Ok(a.fence(&h.ctx)?))) }
}

/// Collective: every rank's operations on `ga` are complete everywhere, then a barrier.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_sync(ctx: *mut gpulmt_ctx, ga: gpulmt_ga) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| with_array(ga, |a| Ok(a.sync(&mut h.ctx)?))) }
}

/// Writes `sections` as the array's sections `out[0..min(*count, cap)]` and sets `*count`.
///
/// # Safety
/// `out` is valid for `cap` writes (or NULL with `cap` 0); `count` for one.
unsafe fn write_sections(
    sections: &[(Option<c_int>, Section)],
    owners: *mut c_int,
    out_sections: *mut gpulmt_ga_section,
    cap: usize,
    count: *mut usize,
) -> Result<(), FfiError> {
    check_buf(out_sections as *const c_void, cap, "sections")?;
    // SAFETY: the caller's contract.
    let count = unsafe { out(count, "count")? };
    *count = sections.len();
    for (k, (owner, s)) in sections.iter().take(cap).enumerate() {
        // SAFETY: k < cap, and `out_sections` holds `cap` (the caller's contract).
        unsafe { out_sections.add(k).write((*s).into()) };
        if let Some(o) = owner {
            // SAFETY: as for the sections: `owners` holds `cap` when not NULL.
            unsafe { set_opt(owners.wrapping_add(k), *o) };
        }
    }
    Ok(())
}

/// The sections `rank` owns (one per tile; one with the block distribution):
/// `sections[0..min(*count, cap)]`, `*count` = how many there are.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `sections` valid
/// for `cap` writes (NULL with `cap` 0 asks for the count); `count` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_distribution(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    rank: c_int,
    sections: *mut gpulmt_ga_section,
    cap: usize,
    count: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |_| {
            let rank = rank_arg(rank, "rank")?;
            let owned = with_array(ga, |a| Ok(a.distribution(rank)?))?;
            let owned: Vec<_> = owned.into_iter().map(|s| (None, s)).collect();
            write_sections(&owned, std::ptr::null_mut(), sections, cap, count)
        })
    }
}

/// The owners of `section`'s elements: `owners[k]` owns `parts[k]`, for
/// `k < min(*count, cap)`; `*count` = how many parts there are.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `section` valid
/// for reads; `owners` and `parts` valid for `cap` writes (NULL with `cap` 0);
/// `count` valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_locate(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    section: *const gpulmt_ga_section,
    owners: *mut c_int,
    parts: *mut gpulmt_ga_section,
    cap: usize,
    count: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |_| {
            let s = section_arg(section)?;
            check_buf(owners as *const c_void, cap, "owners")?;
            let found = with_array(ga, |a| Ok(a.locate(s)?))?;
            let found: Vec<_> = found.into_iter().map(|(r, s)| (Some(r as c_int), s)).collect();
            write_sections(&found, owners, parts, cap, count)
        })
    }
}

/// This rank's local matrix of `ga` (CoGA's `coGA_GetLocalBuffer`): its address (device
/// memory on CUDA) and its rows and columns, row-major. Each out-pointer may be NULL.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; each pointer is
/// NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_local(
    ctx: *mut gpulmt_ctx,
    ga: gpulmt_ga,
    addr: *mut *mut c_void,
    rows: *mut usize,
    cols: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |_| {
            let (at, [r, c]) = with_array(ga, |a| Ok(a.local()?))?;
            set_opt(addr, at as *mut c_void);
            set_opt(rows, r);
            set_opt(cols, c);
            Ok(())
        })
    }
}

/// A registered buffer (CoGA's `coGA_Reg`): `bytes` of zeroed host memory pinned and
/// mapped for the devices once, so that puts and gets from it skip staging and
/// registration. `*buf` is its address (8-byte aligned); free it with
/// `gpulmt_ga_unregister`.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `buf` is valid
/// for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_register(ctx: *mut gpulmt_ctx, bytes: usize, buf: *mut *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let buf = out(buf, "buf")?;
            *buf = std::ptr::null_mut();
            let r = Registered::<i64>::new(&h.ctx, bytes.div_ceil(8))?;
            let at = r.as_ptr() as usize;
            lock(&REGISTERED).get_or_insert_with(HashMap::new).insert(at, r);
            *buf = at as *mut c_void;
            Ok(())
        })
    }
}

/// Frees a buffer of `gpulmt_ga_register`. No operation may still use it.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `buf` is any
/// value (checked, never dereferenced).
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_unregister(ctx: *mut gpulmt_ctx, buf: *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |_| {
            let mut reg = lock(&REGISTERED);
            match reg.as_mut().and_then(|m| m.remove(&(buf as usize))) {
                Some(_) => Ok(()),
                None => Err(FfiError::invalid(format!("{buf:?} is not a buffer of gpulmt_ga_register"))),
            }
        })
    }
}

/// A short message (CoGA's `coGA_sendMsg`): `len` bytes of host memory to `dst`;
/// returns once `data` may be reused.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `data` readable
/// for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_send_msg(
    ctx: *mut gpulmt_ctx,
    dst: c_int,
    data: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            check_buf(data, len, "data")?;
            let dst = rank_arg(dst, "dst")?;
            let bytes = if len == 0 { &[][..] } else { std::slice::from_raw_parts(data as *const u8, len) };
            Ok(::gpulmt_ga::send_msg(&mut h.ctx, dst, bytes)?)
        })
    }
}

/// Receives the next short message (CoGA's `coGA_recvMsg`) from `src`
/// (`GPULMT_ANY_SOURCE`: any rank) into `buf` of `cap` bytes; `*from` and `*len` (each
/// may be NULL) are its sender and length. A longer message fails with
/// `GPULMT_ERR_TRUNCATED`.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `buf` writable
/// for `cap` bytes; `from` and `len` NULL or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_ga_recv_msg(
    ctx: *mut gpulmt_ctx,
    src: c_int,
    buf: *mut c_void,
    cap: usize,
    from: *mut c_int,
    len: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            check_buf(buf, cap, "buf")?;
            let src = if src == crate::GPULMT_ANY_SOURCE { None } else { Some(rank_arg(src, "src")?) };
            let bytes = if cap == 0 { &mut [][..] } else { std::slice::from_raw_parts_mut(buf as *mut u8, cap) };
            let (who, n) = ::gpulmt_ga::recv_msg(&mut h.ctx, src, bytes)?;
            set_opt(from, who as c_int);
            set_opt(len, n);
            Ok(())
        })
    }
}
