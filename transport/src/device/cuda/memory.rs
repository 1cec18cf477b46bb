//! Memory on the CUDA backend: what a pointer is (the driver's attributes, remembered for
//! the allocations and IPC mappings this backend made), and the IPC handles it exported
//! and opened.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};

use super::driver::{check, cu, CuFailure};
use super::CudaBackend;
use crate::device::{DevId, DeviceBackend, DeviceError, IpcHandle, MemoryKind, PointerInfo, IPC_HANDLE_BYTES};

pub(super) struct OpenMapping {
    pub(super) handle: [u8; IPC_HANDLE_BYTES],
    /// Device whose context opened it: the one to close it in.
    pub(super) on: DevId,
}

#[derive(Default)]
pub(super) struct OpenHandles {
    /// Handle bytes to the local address of their mapping: the double-open check.
    pub(super) by_handle: HashMap<[u8; IPC_HANDLE_BYTES], usize>,
    pub(super) by_ptr: HashMap<usize, OpenMapping>,
}

pub(super) fn to_raw_handle(h: &IpcHandle) -> sys::CUipcMemHandle {
    sys::CUipcMemHandle { reserved: h.0.map(|b| b as c_char) }
}

pub(super) fn from_raw_handle(h: &sys::CUipcMemHandle) -> IpcHandle {
    IpcHandle(h.reserved.map(|c| c as u8))
}

/// Maps a failed `cuIpcOpenMemHandle` to what it means for the caller.
pub(super) fn open_error(f: CuFailure) -> DeviceError {
    match f.code {
        // The driver's own double-open check, when the same allocation came with other bytes.
        CUresult::CUDA_ERROR_ALREADY_MAPPED => DeviceError::DoubleOpen { owner: 0, buffer_id: 0 },
        CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_INVALID_HANDLE | CUresult::CUDA_ERROR_MAP_FAILED => {
            DeviceError::BadHandle { reason: DeviceError::from(f).to_string() }
        }
        _ => f.into(),
    }
}

/// The attributes of the known allocation or mapping that holds `ptr`, if any.
pub(super) fn known_info(known: &std::collections::BTreeMap<usize, PointerInfo>, ptr: usize) -> Option<PointerInfo> {
    let (_, info) = known.range(..=ptr).next_back()?;
    (ptr < info.base + info.size).then_some(*info)
}

impl CudaBackend {
    /// Asks the driver what `ptr` is.
    pub(super) fn query_pointer(&self, ptr: usize) -> Result<PointerInfo, DeviceError> {
        use sys::CUpointer_attribute::*;
        // Plain integers, not cudarc's enums: the driver writes 0 for memory it does not know,
        // which no enum variant holds.
        let mut mem_type: c_uint = 0;
        let mut ordinal: c_int = -1;
        let mut start: CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut buffer_id: u64 = 0;
        let mut attrs = [
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            CU_POINTER_ATTRIBUTE_BUFFER_ID,
        ];
        let mut data: [*mut c_void; 5] = [
            (&mut mem_type as *mut c_uint).cast(),
            (&mut ordinal as *mut c_int).cast(),
            (&mut start as *mut CUdeviceptr).cast(),
            (&mut size as *mut usize).cast(),
            (&mut buffer_id as *mut u64).cast(),
        ];
        let host = PointerInfo { kind: MemoryKind::Host, base: ptr, size: 0, buffer_id: 0 };
        // No context needed: the driver resolves unified addresses process-wide.
        match cu!(cuPointerGetAttributes(
            attrs.len() as c_uint,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr as CUdeviceptr,
        )) {
            Ok(()) => {}
            // Some drivers refuse memory they have never seen instead of reporting type 0.
            Err(f) if f.code == CUresult::CUDA_ERROR_INVALID_VALUE => return Ok(host),
            Err(f) => return Err(f.into()),
        }
        let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as c_uint;
        Ok(match u32::try_from(ordinal) {
            Ok(dev) if mem_type == device => {
                PointerInfo { kind: MemoryKind::Device(dev), base: start as usize, size, buffer_id }
            }
            // Unknown to CUDA (0), registered or pinned host memory (HOST).
            _ => host,
        })
    }

    /// The device of the allocation that starts at `ptr`, for operations that need one.
    pub(super) fn allocation_device(&self, op: &'static str, ptr: usize) -> Result<DevId, DeviceError> {
        match self.pointer_info(ptr)? {
            PointerInfo { kind: MemoryKind::Device(dev), base, .. } if base == ptr => Ok(dev),
            _ => Err(DeviceError::InvalidPointer { op, ptr, expected: "the start of a device allocation" }),
        }
    }
}
