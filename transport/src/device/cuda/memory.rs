//! Memory on the CUDA backend: what a pointer is (the driver's attributes, remembered for
//! the allocations and IPC mappings this backend made), and the IPC handles it exported
//! and opened.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};

use super::driver::{check, cu, CuFailure};
use super::CudaBackend;
use crate::device::{AllocKind, DevId, DeviceBackend, DeviceError, IpcHandle, MemoryKind, PointerInfo};

pub(super) struct OpenMapping {
    pub(super) handle: [u8; crate::device::IPC_HANDLE_BYTES],
    /// Device whose context opened it: the one to close it in.
    pub(super) on: DevId,
    /// How it was opened: how to close it.
    pub(super) how: super::kinds::Opened,
}

#[derive(Default)]
pub(super) struct OpenHandles {
    /// Handle bytes to the local address of their mapping: the double-open check.
    pub(super) by_handle: HashMap<[u8; crate::device::IPC_HANDLE_BYTES], usize>,
    pub(super) by_ptr: HashMap<usize, OpenMapping>,
}

/// The driver's handle in a legacy [`IpcHandle`] (its first 64 bytes, `shareable.rs`).
pub(super) fn to_raw_handle(h: &IpcHandle) -> sys::CUipcMemHandle {
    let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
    for (r, b) in raw.reserved.iter_mut().zip(h.0) {
        *r = b as c_char;
    }
    raw
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
    /// Asks the driver what `ptr` is, and how its allocation was made (`AllocKind`): one
    /// `cuPointerGetAttributes` of eleven attributes (87 ns on one H200 against 64 for the
    /// five it asked before, `lab/gpu/memory_kinds.cu`).
    pub(super) fn query_pointer(&self, ptr: usize) -> Result<PointerInfo, DeviceError> {
        use sys::CUpointer_attribute::*;
        // Plain integers, not cudarc's enums: the driver writes 0 for memory it does not know,
        // which no enum variant holds.
        let mut mem_type: c_uint = 0;
        let mut ordinal: c_int = -1;
        let mut start: CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut buffer_id: u64 = 0;
        let mut managed: c_uint = 0;
        let mut pool: usize = 0;
        let mut handle_types: u64 = 0;
        let mut legacy_ipc: c_uint = 0;
        let mut mapping_base: CUdeviceptr = 0;
        let mut mapping_size: usize = 0;
        let mut attrs = [
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            CU_POINTER_ATTRIBUTE_RANGE_SIZE,
            CU_POINTER_ATTRIBUTE_BUFFER_ID,
            CU_POINTER_ATTRIBUTE_IS_MANAGED,
            CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
            CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
            CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
        ];
        let mut data: [*mut c_void; 11] = [
            (&mut mem_type as *mut c_uint).cast(),
            (&mut ordinal as *mut c_int).cast(),
            (&mut start as *mut CUdeviceptr).cast(),
            (&mut size as *mut usize).cast(),
            (&mut buffer_id as *mut u64).cast(),
            (&mut managed as *mut c_uint).cast(),
            (&mut pool as *mut usize).cast(),
            (&mut handle_types as *mut u64).cast(),
            (&mut legacy_ipc as *mut c_uint).cast(),
            (&mut mapping_base as *mut CUdeviceptr).cast(),
            (&mut mapping_size as *mut usize).cast(),
        ];
        let host = PointerInfo::host(ptr);
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
        let Ok(dev) = u32::try_from(ordinal) else { return Ok(host) };
        if mem_type != device {
            // Unknown to CUDA (0), registered or pinned host memory (HOST).
            return Ok(host);
        }
        // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: bit 0 of the allowed handle types.
        let fd_type = 0x1_u64;
        let shareable = handle_types & fd_type != 0;
        let alloc = if managed != 0 {
            AllocKind::Managed
        } else if pool != 0 {
            AllocKind::Pool { shareable }
        } else if legacy_ipc != 0 {
            AllocKind::Legacy
        } else {
            // Neither a pool's nor legacy: the virtual memory API's.
            AllocKind::Vmm { shareable }
        };
        let (start, range_end) = (start as usize, start as usize + size);
        Ok(match alloc {
            // A VMM range is one mapping per physical chunk: the chunk is what a peer maps,
            // the range what the buffer may span.
            AllocKind::Vmm { .. } if mapping_size > 0 => {
                let base = mapping_base as usize;
                let span = range_end.saturating_sub(base).max(mapping_size);
                PointerInfo { span, ..PointerInfo::device(dev, base, mapping_size, buffer_id, alloc) }
            }
            _ => PointerInfo::device(dev, start, size, buffer_id, alloc),
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
