//! 2-D copies on the CUDA backend (`cuMemcpy2DAsync`): a strided block, Global Arrays'
//! patch, in one driver call instead of one copy per row (a column of 8-byte elements
//! moved row by row ran at ~10 us a row on one H200).
//!
//! The memory type of each end comes from the pointer (host memory, pageable or pinned,
//! as `CU_MEMORYTYPE_HOST`; device memory and peer mappings as `CU_MEMORYTYPE_DEVICE`).
//! A contiguous block is a 1-D copy (`cuMemcpyAsync`) on the same stream. The asynchronous copy runs on the
//! engine's lane stream and gets a ticket like [`DeviceBackend::copy_async`]'s, but never
//! goes to the copy server: a lane's 2-D copies stay in order with its other engine copies.
//! The synchronous one runs as [`DeviceBackend::copy_sync`] does, after the application's
//! legacy default stream.

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUdeviceptr};

use super::copies::{lane_slot, SYNC_SLOT};
use super::driver::{check, cu, CuFailure};
use super::CudaBackend;
use crate::device::{Copy2d, CopyTicket, DevId, DeviceBackend, DeviceError, MemoryKind};

impl CudaBackend {
    /// [`DeviceBackend::copy_2d_async`].
    ///
    /// # Safety
    /// As [`DeviceBackend::copy_2d_async`]'s.
    pub(super) unsafe fn start_copy_2d(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        shape: Copy2d,
    ) -> Result<CopyTicket, DeviceError> {
        shape.check("copy_2d_async")?;
        let d = self.device(engine)?;
        if shape.is_empty() {
            // SAFETY: a copy of no bytes accesses nothing.
            return unsafe { self.copy_async(engine, lane, dst, src, 0) };
        }
        let _current = self.enter(engine)?;
        if shape.is_contiguous() {
            // SAFETY: the caller keeps the block, one run of `bytes()` at each end, valid
            // until the ticket's copy is reported finished.
            return unsafe { self.engine_copy(engine, d, lane_slot(lane), dst, src, shape.bytes()) };
        }
        let params = self.memcpy_2d_params(dst, src, shape)?;
        // SAFETY: the caller keeps every row of both ends valid until the ticket's copy is
        // reported finished; `params` describes exactly those rows and lives for the call.
        unsafe { self.engine_issue(engine, d, lane_slot(lane), |stream| Self::issue_2d(&params, stream)) }
    }

    /// [`DeviceBackend::copy_2d_sync`].
    ///
    /// # Safety
    /// As [`DeviceBackend::copy_2d_sync`]'s.
    pub(super) unsafe fn copy_2d_now(&self, dst: usize, src: usize, shape: Copy2d) -> Result<(), DeviceError> {
        shape.check("copy_2d_sync")?;
        if shape.is_empty() {
            return Ok(());
        }
        if shape.is_contiguous() {
            // SAFETY: the caller keeps the block, one run at each end, valid for the call.
            return unsafe { self.copy_sync(dst, src, shape.bytes()) };
        }
        let params = self.memcpy_2d_params(dst, src, shape)?;
        let dev = self.device_of(dst, src)?;
        let wait = |_: &_, stream| Ok(cu!(cuStreamSynchronize(stream))?);
        // SAFETY: the caller keeps every row of both ends valid for the whole call, and the
        // stream is synchronized (`wait`) before it returns.
        unsafe { self.enqueue_with(dev, SYNC_SLOT, true, |stream| Self::issue_2d(&params, stream), wait) }
    }

    /// Queues the copy `params` describes on `stream`.
    ///
    /// # Safety
    /// `params` names memory that stays valid until the copy has finished on the stream.
    unsafe fn issue_2d(params: &sys::CUDA_MEMCPY2D, stream: sys::CUstream) -> Result<(), CuFailure> {
        cu!(cuMemcpy2DAsync_v2(params, stream))
    }

    /// The device whose stream makes a synchronous copy: the first end in device memory,
    /// else the backend's fallback.
    fn device_of(&self, dst: usize, src: usize) -> Result<DevId, DeviceError> {
        for p in [dst, src] {
            if let MemoryKind::Device(d) = self.pointer_info(p)?.kind {
                return Ok(d);
            }
        }
        Ok(self.fallback_device())
    }

    /// The driver's description of a 2-D copy, each end's memory type from its pointer.
    fn memcpy_2d_params(&self, dst: usize, src: usize, shape: Copy2d) -> Result<sys::CUDA_MEMCPY2D, DeviceError> {
        use sys::CUmemorytype::{CU_MEMORYTYPE_DEVICE, CU_MEMORYTYPE_HOST};
        let kind = |p: usize| Ok::<_, DeviceError>(self.pointer_info(p)?.kind);
        let (dst_kind, src_kind) = (kind(dst)?, kind(src)?);
        let host = |k: MemoryKind| k == MemoryKind::Host;
        Ok(sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: if host(src_kind) { CU_MEMORYTYPE_HOST } else { CU_MEMORYTYPE_DEVICE },
            srcHost: if host(src_kind) { src as *const c_void } else { std::ptr::null() },
            srcDevice: if host(src_kind) { 0 } else { src as CUdeviceptr },
            srcArray: std::ptr::null_mut(),
            srcPitch: shape.src_pitch,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: if host(dst_kind) { CU_MEMORYTYPE_HOST } else { CU_MEMORYTYPE_DEVICE },
            dstHost: if host(dst_kind) { dst as *mut c_void } else { std::ptr::null_mut() },
            dstDevice: if host(dst_kind) { 0 } else { dst as CUdeviceptr },
            dstArray: std::ptr::null_mut(),
            dstPitch: shape.dst_pitch,
            WidthInBytes: shape.width,
            Height: shape.height,
        })
    }
}
