//! The shim's own C functions (`include/gpulmt_mpi.h`): device memory of the shim's
//! gpulmt context (what lets one program run on sim devices and on CUDA), copies between
//! host and device, whether the shim is active, and its counters of the paths messages
//! took.

use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use crate::hostmem;
use crate::intercept::{active, with, DIRECT_HOST_RECVS};
use crate::staging::gpulmt_mpi_staging_counters;
use crate::state::gpulmt_mpi_counters;

/// 1 while the shim is active (after MPI_Init, before MPI_Finalize), else 0.
#[no_mangle]
pub extern "C" fn gpulmt_mpi_active() -> c_int {
    c_int::from(active())
}

/// Allocates `bytes` of device memory on this rank's device through the shim's gpulmt
/// context (a sim device under `GPULMT_DEVICE=sim`, else CUDA). NULL when the shim is
/// not active or the allocation fails. Device memory from cudaMalloc works as well.
#[no_mangle]
pub extern "C" fn gpulmt_mpi_alloc(bytes: usize) -> *mut c_void {
    with(|s| {
        let dev = s.ctx.device();
        match s.ctx.backend().alloc(dev, bytes.max(1)) {
            Ok(p) => {
                s.allocations.push(p);
                // New device memory may sit where host memory was remembered.
                hostmem::forget_all();
                p as *mut c_void
            }
            Err(e) => {
                tracing::warn!(bytes, error = %e, "gpulmt_mpi_alloc");
                std::ptr::null_mut()
            }
        }
    })
    .unwrap_or(std::ptr::null_mut())
}

/// Frees memory from `gpulmt_mpi_alloc`: 0 on success, -1 if `ptr` is not such memory.
/// Peers that mapped it keep their pages until they let go (as with CUDA IPC).
#[no_mangle]
pub extern "C" fn gpulmt_mpi_free(ptr: *mut c_void) -> c_int {
    with(|s| {
        let Some(i) = s.allocations.iter().position(|&p| p == ptr as usize) else { return -1 };
        s.allocations.swap_remove(i);
        // SAFETY: memory of gpulmt_mpi_alloc (checked above) that the application gives up
        // here, as with cudaFree: MPI's rules forbid freeing a buffer an operation still
        // uses, so no copy of ours runs on it.
        match unsafe { s.ctx.backend().free(ptr as usize) } {
            Ok(()) | Err(gpulmt::device::DeviceError::FreedWhileMapped { .. }) => 0,
            Err(e) => {
                tracing::warn!(error = %e, "gpulmt_mpi_free");
                -1
            }
        }
    })
    .unwrap_or(-1)
}

/// Copies `bytes` between any two buffers, host or device, and waits: 0 on success.
/// Without an active shim, a plain memcpy of host memory.
///
/// # Safety
/// `dst` and `src` are each valid for `bytes` bytes (host memory, or device memory of this
/// process: from `gpulmt_mpi_alloc` or CUDA), and the two ranges do not overlap.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mpi_memcpy(dst: *mut c_void, src: *const c_void, bytes: usize) -> c_int {
    // SAFETY: the caller's guarantee above: both ranges valid for `bytes`, not overlapping.
    match with(|s| unsafe { s.ctx.copy_sync(dst as usize, src as usize, bytes) }) {
        Some(Ok(())) => 0,
        Some(Err(e)) => {
            tracing::warn!(error = %e, "gpulmt_mpi_memcpy");
            -1
        }
        None => {
            if bytes > 0 {
                // SAFETY: the caller's buffers of `bytes` bytes (host memory).
                unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), dst.cast::<u8>(), bytes) };
            }
            0
        }
    }
}

/// Copies the shim's counters to `*out`: 0 on success, -1 when not active.
///
/// # Safety
/// `out` is NULL or valid for writes of a `gpulmt_mpi_counters`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mpi_get_counters(out: *mut gpulmt_mpi_counters) -> c_int {
    match with(|s| {
        let mut c = s.counters;
        c.host_recvs += DIRECT_HOST_RECVS.load(Ordering::Relaxed);
        c
    }) {
        Some(c) if !out.is_null() => {
            // SAFETY: the caller's out-pointer.
            unsafe { *out = c };
            0
        }
        _ => -1,
    }
}

/// Copies what staging did so far (calls that staged device buffers, bytes copied, calls
/// split into pieces) to `*out`: 0 on success, -1 for a NULL `out`. Counted also while
/// the shim is inactive (collectives are then split, never staged).
///
/// # Safety
/// `out` is NULL or valid for writes of a `gpulmt_mpi_staging_counters`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_mpi_get_staging_counters(out: *mut gpulmt_mpi_staging_counters) -> c_int {
    if out.is_null() {
        return -1;
    }
    // SAFETY: the caller's out-pointer.
    unsafe { *out = crate::staging::counters() };
    0
}

/// How many blocking collectives took the device path so far (`MPI_Bcast`,
/// `MPI_Allgather`, `MPI_Allreduce`, `MPI_Reduce_scatter_block` moved over gpulmt with
/// the reduction on the GPU;
/// see the shim's README).
#[no_mangle]
pub extern "C" fn gpulmt_mpi_device_collectives() -> u64 {
    crate::intercept::coll::device::calls()
}
