//! The symmetric heap's C ABI: collective allocation (`gpulmt_sym_malloc`,
//! `gpulmt_sym_free`), the host's operations on the heaps (put, get, put_signal, signal
//! waits, 64-bit atomics), and what device code needs (`gpulmt_sym_device_ctx`) and
//! reports (`gpulmt_sym_device_errors`). The device API itself is
//! `include/gpulmt_device.cuh`; `docs/device-api.md` describes both.
//!
//! A symmetric address is an address in this rank's heap (from `gpulmt_sym_malloc`);
//! it names the same object on every PE. Every host operation is complete when it
//! returns.

use std::ffi::{c_int, c_void};
use std::time::Duration;

use gpulmt::sym::{Cmp, Signal, SignalOp};

use crate::error::FfiError;
use crate::handle::{check_buf, gpulmt_ctx, out, rank_arg, with_ctx};

/// put_signal: store the value in the signal word (`GPULMT_SIGNAL_SET` of
/// gpulmt_device.cuh).
pub const GPULMT_SIGNAL_SET: c_int = 0;
/// put_signal: add the value to the signal word.
pub const GPULMT_SIGNAL_ADD: c_int = 1;
/// signal_wait_until: equal (the `GPULMT_CMP_*` codes of gpulmt_device.cuh).
pub const GPULMT_CMP_EQ: c_int = 0;
/// signal_wait_until: not equal.
pub const GPULMT_CMP_NE: c_int = 1;
/// signal_wait_until: greater.
pub const GPULMT_CMP_GT: c_int = 2;
/// signal_wait_until: greater or equal.
pub const GPULMT_CMP_GE: c_int = 3;
/// signal_wait_until: less.
pub const GPULMT_CMP_LT: c_int = 4;
/// signal_wait_until: less or equal.
pub const GPULMT_CMP_LE: c_int = 5;
/// Bytes of `gpulmt_device_ctx` (gpulmt_device.cuh) that `gpulmt_sym_device_ctx` writes.
pub const GPULMT_DEVICE_CTX_BYTES: usize = 48;

const _: () = assert!(GPULMT_DEVICE_CTX_BYTES == std::mem::size_of::<gpulmt::sym::DeviceCtx>());
const _: () = assert!(GPULMT_SIGNAL_ADD == SignalOp::Add as c_int && GPULMT_CMP_LE == Cmp::Le as c_int);

fn signal_op(op: c_int) -> Result<SignalOp, FfiError> {
    match op {
        GPULMT_SIGNAL_SET => Ok(SignalOp::Set),
        GPULMT_SIGNAL_ADD => Ok(SignalOp::Add),
        _ => Err(FfiError::invalid(format!("signal op {op} is neither GPULMT_SIGNAL_SET nor GPULMT_SIGNAL_ADD"))),
    }
}

/// Collective (every rank calls it with the same `bytes`, in the same order as its other
/// `gpulmt_sym_malloc` / `gpulmt_sym_free` calls): allocates `bytes` at the same offset of
/// every rank's symmetric heap (`GPULMT_SYM_HEAP` bytes on the rank's device, reserved
/// at the first call). `*ptr` is this rank's symmetric address (NULL on failure). Fails
/// on every rank alike when the ranks asked for different sizes or the heap is full.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `ptr` is valid
/// for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_malloc(ctx: *mut gpulmt_ctx, bytes: usize, ptr: *mut *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let ptr = out(ptr, "ptr")?;
            *ptr = std::ptr::null_mut();
            *ptr = h.ctx.sym_alloc(bytes)?.addr() as *mut c_void;
            Ok(())
        })
    }
}

/// Collective (as `gpulmt_sym_malloc`): frees the symmetric allocation that starts at
/// `ptr` on every rank. No operation or kernel may still use it.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call. `ptr` is any
/// value (it is checked, never dereferenced).
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_free(ctx: *mut gpulmt_ctx, ptr: *mut c_void) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| Ok(h.ctx.sym_free_at(ptr as usize)?)) }
}

/// `*ptr` is the address in this process of `pe`'s copy of the symmetric address `sym`,
/// for direct loads and stores (host: sim heaps are host memory; CUDA heaps are device
/// memory, for kernels), or NULL where this rank does not map `pe`'s heap.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `ptr` is valid for
/// writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_ptr(
    ctx: *mut gpulmt_ctx,
    sym: *const c_void,
    pe: c_int,
    ptr: *mut *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let ptr = out(ptr, "ptr")?;
            let pe = rank_arg(pe, "pe")?;
            *ptr = h.ctx.sym_ptr(sym as usize, pe).map_or(std::ptr::null_mut(), |a| a as *mut c_void);
            Ok(())
        })
    }
}

/// Copies `bytes` at `src` (host memory, or device memory of this rank) into `pe`'s copy
/// of the symmetric range at `dst`; complete (visible at `pe`) on return.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `src` is readable
/// for `bytes` bytes, with nothing writing it during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_put(
    ctx: *mut gpulmt_ctx,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    pe: c_int,
) -> c_int {
    // SAFETY: the caller's contract; the library checks `dst`.
    unsafe {
        with_ctx(ctx, |h| {
            check_buf(src, bytes, "src")?;
            Ok(h.ctx.sym_put(dst as usize, src.cast(), bytes, rank_arg(pe, "pe")?)?)
        })
    }
}

/// Copies `bytes` of `pe`'s copy of the symmetric range at `src` into `dst` (host memory,
/// or device memory of this rank); complete on return.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `dst` is writable
/// for `bytes` bytes, with nothing else accessing it during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_get(
    ctx: *mut gpulmt_ctx,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    pe: c_int,
) -> c_int {
    // SAFETY: the caller's contract; the library checks `src`.
    unsafe {
        with_ctx(ctx, |h| {
            check_buf(dst, bytes, "dst")?;
            Ok(h.ctx.sym_get(dst.cast(), src as usize, bytes, rank_arg(pe, "pe")?)?)
        })
    }
}

/// `gpulmt_sym_put`, then `op` (`GPULMT_SIGNAL_SET` / `_ADD`) with `value` on `pe`'s copy
/// of the symmetric 64-bit word `sig`: the data is complete before the signal changes.
/// On CUDA an `_ADD` is made by the GPU for the host, as `gpulmt_sym_atomic_fetch_add`.
///
/// # Safety
/// As `gpulmt_sym_put`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_put_signal(
    ctx: *mut gpulmt_ctx,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    sig: *mut u64,
    value: u64,
    op: c_int,
    pe: c_int,
) -> c_int {
    // SAFETY: the caller's contract; the library checks `dst` and `sig`.
    unsafe {
        with_ctx(ctx, |h| {
            check_buf(src, bytes, "src")?;
            let signal = Signal { addr: sig as usize, value, op: signal_op(op)? };
            Ok(h.ctx.sym_put_signal(dst as usize, src.cast(), bytes, signal, rank_arg(pe, "pe")?)?)
        })
    }
}

/// Waits until this rank's signal word `sig` compares (`GPULMT_CMP_*`) true against
/// `value`; `*seen` (if not NULL) is the value seen. With `timeout_us` >= 0, gives up
/// after that many microseconds with `GPULMT_ERR_CANCELLED`; negative: no limit.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `seen` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_signal_wait_until(
    ctx: *mut gpulmt_ctx,
    sig: *const u64,
    cmp: c_int,
    value: u64,
    timeout_us: i64,
    seen: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let c = u32::try_from(cmp).ok().and_then(Cmp::from_code);
            let c = c.ok_or_else(|| FfiError::invalid(format!("comparison {cmp} is not a GPULMT_CMP_* code")))?;
            let timeout = u64::try_from(timeout_us).ok().map(Duration::from_micros);
            match h.ctx.sym_signal_wait_until(sig as usize, c, value, timeout)? {
                Some(v) => {
                    crate::handle::set_opt(seen, v);
                    Ok(())
                }
                None => Err(FfiError::new(
                    crate::error::GPULMT_ERR_CANCELLED,
                    format!("the wait for signal {sig:p} ended at its timeout of {timeout_us} us"),
                )),
            }
        })
    }
}

/// Runs an atomic of the Rust API on `ctx` for PE `pe`, storing its result in `*old`
/// if not NULL.
///
/// # Safety
/// `ctx` as in every call; `old` is NULL or valid for writes.
unsafe fn atomic(
    ctx: *mut gpulmt_ctx,
    pe: c_int,
    old: *mut u64,
    f: impl FnOnce(&gpulmt::Context, gpulmt::Rank) -> gpulmt::Result<u64>,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let v = f(&h.ctx, rank_arg(pe, "pe")?)?;
            crate::handle::set_opt(old, v);
            Ok(())
        })
    }
}

/// Adds `value` to `pe`'s copy of the symmetric 64-bit word `dst`; `*old` (if not NULL)
/// is the value before. On CUDA the GPU that reaches the word makes the atomic for the
/// host (a thread of gpulmt's copy server, or of the target's when `pe` is on another
/// node), so it is atomic against kernels' atomics on the word too.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `old` is NULL or
/// valid for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_atomic_fetch_add(
    ctx: *mut gpulmt_ctx,
    dst: *mut u64,
    value: u64,
    pe: c_int,
    old: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { atomic(ctx, pe, old, |c, pe| c.sym_atomic_fetch_add(dst as usize, value, pe)) }
}

/// Stores `value` in `pe`'s copy of the word `dst` if it equals `cond`; `*old` (if not
/// NULL) is the value before (the swap happened when it equals `cond`). Made as
/// `gpulmt_sym_atomic_fetch_add`'s.
///
/// # Safety
/// As `gpulmt_sym_atomic_fetch_add`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_atomic_compare_swap(
    ctx: *mut gpulmt_ctx,
    dst: *mut u64,
    cond: u64,
    value: u64,
    pe: c_int,
    old: *mut u64,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { atomic(ctx, pe, old, |c, pe| c.sym_atomic_compare_swap(dst as usize, cond, value, pe)) }
}

/// Stores `value` in `pe`'s copy of the word `dst`, atomically (CUDA too).
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_atomic_set(ctx: *mut gpulmt_ctx, dst: *mut u64, value: u64, pe: c_int) -> c_int {
    // SAFETY: the caller's contract; NULL `old` is allowed.
    unsafe { atomic(ctx, pe, std::ptr::null_mut(), |c, pe| c.sym_atomic_set(dst as usize, value, pe).map(|_| 0)) }
}

/// `*value` is `pe`'s copy of the word `dst`, read atomically (CUDA too).
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `value` is valid
/// for writes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_atomic_fetch(
    ctx: *mut gpulmt_ctx,
    dst: *const u64,
    pe: c_int,
    value: *mut u64,
) -> c_int {
    if value.is_null() {
        return crate::error::record(FfiError::invalid("value is NULL"));
    }
    // SAFETY: the caller's contract.
    unsafe { atomic(ctx, pe, value, |c, pe| c.sym_atomic_fetch(dst as usize, pe)) }
}

/// Completes this rank's symmetric heap operations (host operations are complete when
/// they return; the off-node path's will be waited for here).
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_quiet(ctx: *mut gpulmt_ctx) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { with_ctx(ctx, |h| Ok(h.ctx.sym_quiet()?)) }
}

/// Writes this rank's `gpulmt_device_ctx` (gpulmt_device.cuh) to `ptr`, which holds
/// `bytes` = `GPULMT_DEVICE_CTX_BYTES`: copy it into a module's `gpulmt_dctx` symbol
/// before launching kernels that use the device API. Fails before the first
/// `gpulmt_sym_malloc`.
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `ptr` is valid for
/// writes of `bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_device_ctx(ctx: *mut gpulmt_ctx, ptr: *mut c_void, bytes: usize) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            check_buf(ptr, bytes, "ptr")?;
            if ptr.is_null() || bytes != GPULMT_DEVICE_CTX_BYTES {
                return Err(FfiError::invalid(format!(
                    "a gpulmt_device_ctx is {GPULMT_DEVICE_CTX_BYTES} bytes, not {bytes}: build against this \
                     gpulmt's gpulmt_device.cuh"
                )));
            }
            let d = h.ctx.sym_device_ctx()?;
            // SAFETY: `ptr` holds `bytes` = size_of::<DeviceCtx>() writable bytes (checked
            // above, the caller's contract); DeviceCtx is plain old data, so any alignment
            // works with an unaligned write.
            std::ptr::write_unaligned(ptr.cast::<gpulmt::sym::DeviceCtx>(), d);
            Ok(())
        })
    }
}

/// `record` (4 words) is this rank's record of device accesses its kernels' checks
/// rejected: the count (0: none), the first one's `op << 32 | pe` (`GPULMT_OP_*` of
/// gpulmt_device.cuh), its symmetric address and its size. With `clear` non-zero the
/// record is then cleared (no kernel may be running).
///
/// # Safety
/// `ctx` is a live context that no other thread uses during the call; `record` is valid
/// for writes of 4 `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_sym_device_errors(ctx: *mut gpulmt_ctx, record: *mut u64, clear: c_int) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        with_ctx(ctx, |h| {
            let rec = out(record.cast::<[u64; 4]>(), "record")?;
            *rec = match h.ctx.sym_device_errors()? {
                Some(e) => [e.count, (e.op.map_or(0, |o| o as u64)) << 32 | e.pe as u32 as u64, e.addr, e.bytes],
                None => [0; 4],
            };
            if clear != 0 {
                h.ctx.sym_device_errors_clear()?;
            }
            Ok(())
        })
    }
}

/// The calls in a one-rank job: what C sees for NULLs, bad codes and bad sizes (the
/// multi-rank paths run in `examples/sym.c`).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{GPULMT_ERR_INVALID_ARGUMENT, GPULMT_SUCCESS};
    use crate::{gpulmt_finalize, gpulmt_init};
    use std::ptr::{null, null_mut};

    #[test]
    fn nulls_codes_and_sizes_are_checked_before_use() {
        let mut ctx = null_mut();
        // SAFETY: a live context from gpulmt_init, released by gpulmt_finalize last; every
        // pointer handed over is valid for the call or NULL where the call checks it.
        unsafe {
            assert_eq!(gpulmt_sym_malloc(null_mut(), 8, null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_init(&mut ctx), GPULMT_SUCCESS);
            assert_eq!(gpulmt_sym_malloc(ctx, 8, null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            let mut d = [0u8; GPULMT_DEVICE_CTX_BYTES];
            assert_eq!(gpulmt_sym_device_ctx(ctx, d.as_mut_ptr().cast(), d.len()), GPULMT_ERR_INVALID_ARGUMENT);
            let mut p: *mut c_void = null_mut();
            assert_eq!(gpulmt_sym_malloc(ctx, 64, &mut p), GPULMT_SUCCESS);
            assert!(!p.is_null());
            assert_eq!(gpulmt_sym_device_ctx(ctx, d.as_mut_ptr().cast(), d.len()), GPULMT_SUCCESS);
            assert_eq!(u32::from_ne_bytes(d[..4].try_into().unwrap()), gpulmt::sym::DEVICE_CTX_VERSION);
            assert_eq!(gpulmt_sym_device_ctx(ctx, d.as_mut_ptr().cast(), 40), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_sym_put(ctx, p, null(), 8, 0), GPULMT_ERR_INVALID_ARGUMENT, "NULL source");
            let v = 5u64;
            let sig = p.cast::<u64>();
            assert_eq!(
                gpulmt_sym_put_signal(ctx, p, (&v as *const u64).cast(), 8, sig, 1, 7, 0),
                GPULMT_ERR_INVALID_ARGUMENT
            );
            assert_eq!(gpulmt_sym_atomic_fetch(ctx, sig, 0, null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_sym_atomic_set(ctx, sig, 9, -1), crate::error::GPULMT_ERR_BAD_RANK);
            let mut got = 0u64;
            assert_eq!(gpulmt_sym_atomic_set(ctx, sig, 9, 0), GPULMT_SUCCESS);
            assert_eq!(gpulmt_sym_atomic_fetch(ctx, sig, 0, &mut got), GPULMT_SUCCESS);
            assert_eq!(got, 9);
            let mut rec = [1u64; 4];
            assert_eq!(gpulmt_sym_device_errors(ctx, rec.as_mut_ptr(), 1), GPULMT_SUCCESS);
            assert_eq!(rec, [0; 4]);
            assert_eq!(gpulmt_sym_quiet(ctx), GPULMT_SUCCESS);
            assert_eq!(gpulmt_sym_free(ctx, p), GPULMT_SUCCESS);
            assert_eq!(gpulmt_finalize(ctx), GPULMT_SUCCESS);
        }
    }
}
