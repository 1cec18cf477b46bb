//! Kinds of memory on the CUDA backend (`docs/memory-kinds.md`): allocating each kind the
//! way applications do (for tests and benchmarks), exporting it by the route its kind
//! allows, and opening and closing what peers exported.
//!
//! Routes, as measured on one H200 with CUDA 13 under MPS and without
//! (`lab/gpu/memory_kinds.cu`):
//! - legacy (`cuMemAlloc`): `cuIpcGetMemHandle` / `cuIpcOpenMemHandle`;
//! - a pool with a POSIX-fd handle type: the pool crosses as an fd
//!   (`cuMemPoolExportToShareableHandle`, imported once per exporter and pool), each
//!   allocation as `cuMemPoolExportPointer`'s 64 bytes in the handle
//!   (`cuMemPoolImportPointer`; about 100-130 us); the importer frees its pointer to close;
//! - a VMM chunk with a POSIX-fd handle type: `cuMemRetainAllocationHandle` +
//!   `cuMemExportToShareableHandle` at the exporter, and import, reserve, map and set
//!   access at the importer (about 100 us a chunk);
//! - fabric handles: refused on this host (no IMEX), so not used.
//!
//! The fds cross through the exporter's fd server (`fd_share`), which makes each one when
//! asked and closes it once sent: an fd held open would keep the memory alive after the
//! application freed it.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUdeviceptr, CUmemAllocationHandleType};

use super::driver::{check, cu, lock, warn_teardown, Ctx, CtxGuard};
use super::CudaBackend;
use crate::device::fd_share::{self, FdServer};
use crate::device::shareable::{self, SharedHandle, SharedKind, PAYLOAD_BYTES};
use crate::device::{AllocKind, DevId, DeviceError, IpcHandle, PointerInfo};

const POSIX_FD: CUmemAllocationHandleType = CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Offers an fd server keeps at most: a VMM chunk is offered when exported and stays
/// until evicted (the server checks at each request that the chunk is still the one
/// offered, so an evicted or stale offer costs a refused request, never wrong memory).
const MAX_OFFERS: usize = 4096;

/// An allocation [`alloc_as`](crate::device::DeviceBackend::alloc_as) made, other than a
/// legacy one, and how to free it.
pub(super) enum Owned {
    Pool,
    Managed,
    /// The reserved range, its length, and each chunk's allocation handle.
    Vmm {
        total: usize,
        chunks: Vec<sys::CUmemGenericAllocationHandle>,
    },
}

/// How a peer allocation was opened, which says how to close it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Opened {
    Legacy,
    /// `cuMemPoolImportPointer`: closed by freeing the pointer.
    PoolPointer,
    /// Imported, reserved and mapped: closed by unmapping, releasing and freeing the range.
    Vmm {
        handle: sys::CUmemGenericAllocationHandle,
        size: usize,
    },
}

/// What the fd server hands out under a key: the context to make it in, as an address
/// (the server thread keeps no borrowed handle).
#[derive(Clone, Copy)]
enum Offer {
    Pool { pool: usize, ctx: usize },
    Vmm { base: usize, buffer_id: u64, size: usize, ctx: usize },
}

#[derive(Default)]
struct Offers {
    by_key: HashMap<u64, Offer>,
    order: VecDeque<u64>,
}

/// The backend's side of sharing by file descriptor.
#[derive(Default)]
pub(super) struct Sharing {
    offers: Arc<Mutex<Offers>>,
    server: Mutex<Option<FdServer>>,
    /// This backend's own pool with a POSIX-fd handle type, per device (`alloc_as`).
    own_pools: Mutex<HashMap<DevId, usize>>,
    /// Pools whose allocations this backend exported: each pool was exported as an fd once
    /// first (`cuMemPoolExportPointer` refuses the allocations of a pool never exported:
    /// `lab/gpu/memory_kinds.cu`, pointer_export_order).
    exported_pools: Mutex<std::collections::HashSet<usize>>,
    /// Pools imported from peers: (pid, nonce, pool key) -> the imported pool.
    imported_pools: Mutex<HashMap<(u32, u64, u64), usize>>,
    /// Allocations `alloc_as` made that are not legacy: base -> how to free it.
    pub(super) owned: Mutex<HashMap<usize, Owned>>,
}

impl Sharing {
    /// Imported pools, for the backend's drop (after every pointer from them was freed).
    pub(super) fn take_imported_pools(&mut self) -> Vec<usize> {
        let pools = self.imported_pools.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner);
        pools.drain().map(|(_, p)| p).collect()
    }
}

/// Makes the fd for `offer`, in the server's thread.
fn produce(offer: Offer) -> Result<(OwnedFd, Vec<u8>), String> {
    let ctx = match offer {
        Offer::Pool { ctx, .. } | Offer::Vmm { ctx, .. } => Ctx(ctx as sys::CUcontext),
    };
    let _current = CtxGuard::enter(ctx).map_err(|f| DeviceError::from(f).to_string())?;
    let mut fd: c_int = -1;
    let made = match offer {
        Offer::Pool { pool, .. } => {
            cu!(cuMemPoolExportToShareableHandle(
                (&mut fd as *mut c_int).cast(),
                pool as sys::CUmemoryPool,
                POSIX_FD,
                0
            ))
        }
        Offer::Vmm { base, buffer_id, .. } => {
            // The chunk must still be the one offered: an application that unmapped it and
            // mapped another at the address would otherwise hand out other memory.
            let mut now: u64 = 0;
            let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID;
            let asked = cu!(cuPointerGetAttribute((&mut now as *mut u64).cast(), attr, base as CUdeviceptr));
            if asked.is_err() || now != buffer_id {
                return Err(format!(
                    "VMM chunk {buffer_id} at {base:#x} is no longer mapped there (freed or remapped)"
                ));
            }
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            cu!(cuMemRetainAllocationHandle(&mut h, base as *mut c_void))
                .map_err(|f| DeviceError::from(f).to_string())?;
            let r = cu!(cuMemExportToShareableHandle((&mut fd as *mut c_int).cast(), h, POSIX_FD, 0));
            // The fd holds its own reference to the chunk; the retained handle goes.
            warn_teardown(cu!(cuMemRelease(h)));
            r
        }
    };
    made.map_err(|f| DeviceError::from(f).to_string())?;
    if fd < 0 {
        return Err("the driver returned no file descriptor".into());
    }
    // SAFETY: the driver just made this descriptor for us and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let meta = match offer {
        Offer::Vmm { size, .. } => (size as u64).to_le_bytes().to_vec(),
        Offer::Pool { .. } => Vec::new(),
    };
    Ok((fd, meta))
}

impl CudaBackend {
    /// Allocations of every kind but legacy (`DeviceBackend::alloc_as`).
    pub(super) fn alloc_kind(
        &self,
        dev: DevId,
        bytes: usize,
        kind: AllocKind,
        chunks: u32,
    ) -> Result<usize, DeviceError> {
        let _current = self.enter(dev)?;
        let bytes = bytes.max(1);
        let mut ptr: CUdeviceptr = 0;
        let owned = match kind {
            AllocKind::Legacy => unreachable!("alloc_as takes legacy memory through alloc"),
            AllocKind::Pool { shareable } => {
                // On the legacy default stream, then waited for: the memory is usable by
                // any stream once this returns, as a cudaMalloc's is.
                let null: sys::CUstream = ptr::null_mut();
                if shareable {
                    let pool = self.own_pool(dev)?;
                    cu!(cuMemAllocFromPoolAsync(&mut ptr, bytes, pool as sys::CUmemoryPool, null))?;
                } else {
                    cu!(cuMemAllocAsync(&mut ptr, bytes, null))?;
                }
                cu!(cuStreamSynchronize(null))?;
                Owned::Pool
            }
            AllocKind::Managed => {
                cu!(cuMemAllocManaged(&mut ptr, bytes, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32))?;
                Owned::Managed
            }
            AllocKind::Vmm { shareable } => {
                let (base, total, handles) = self.vmm_range(dev, bytes, chunks.max(1), shareable)?;
                ptr = base;
                Owned::Vmm { total, chunks: handles }
            }
        };
        // Chunk by chunk for VMM memory: each is its own allocation to the driver.
        let mut at = ptr as usize;
        let end = at + bytes;
        let mut known = Vec::new();
        while at < end {
            match self.query_pointer(at) {
                Ok(info) if info.size > 0 => {
                    known.push(info);
                    at = info.base + info.size;
                }
                other => {
                    // SAFETY: nothing else knows the allocation yet.
                    unsafe { self.free_owned(ptr as usize, owned) };
                    return Err(other.err().unwrap_or(DeviceError::InvalidPointer {
                        op: "alloc_as",
                        ptr: at,
                        expected: "device memory the driver knows, just allocated",
                    }));
                }
            }
        }
        let mut k = lock(&self.known);
        for info in known {
            k.insert(info.base, info);
        }
        lock(&self.sharing.owned).insert(ptr as usize, owned);
        Ok(ptr as usize)
    }

    /// This backend's shareable pool on `dev`, created on first use.
    fn own_pool(&self, dev: DevId) -> Result<usize, DeviceError> {
        let mut pools = lock(&self.sharing.own_pools);
        if let Some(&p) = pools.get(&dev) {
            return Ok(p);
        }
        // SAFETY: plain-data struct of the driver's API; zero is its "unset" value.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.handleTypes = POSIX_FD;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev as c_int;
        let mut pool: sys::CUmemoryPool = ptr::null_mut();
        cu!(cuMemPoolCreate(&mut pool, &props))?;
        pools.insert(dev, pool as usize);
        Ok(pool as usize)
    }

    /// Reserves a range of `chunks` chunks on `dev` covering `bytes`, each chunk its own
    /// physical allocation (as PyTorch's expandable segments map theirs), readable and
    /// writable by `dev`.
    fn vmm_range(
        &self,
        dev: DevId,
        bytes: usize,
        chunks: u32,
        shareable: bool,
    ) -> Result<(CUdeviceptr, usize, Vec<sys::CUmemGenericAllocationHandle>), DeviceError> {
        // SAFETY: plain-data struct of the driver's API; zero is its "unset" value.
        let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
        prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = dev as c_int;
        if shareable {
            prop.requestedHandleTypes = POSIX_FD;
        }
        let mut gran: usize = 0;
        let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
        cu!(cuMemGetAllocationGranularity(&mut gran, &prop, minimum))?;
        let per = bytes.div_ceil(chunks as usize).div_ceil(gran) * gran;
        let total = per * chunks as usize;
        let mut va: CUdeviceptr = 0;
        cu!(cuMemAddressReserve(&mut va, total, 0, 0, 0))?;
        let mut handles = Vec::new();
        let undo = |handles: &[sys::CUmemGenericAllocationHandle], mapped: usize| {
            if mapped > 0 {
                warn_teardown(cu!(cuMemUnmap(va, mapped * per)));
            }
            for &h in handles {
                warn_teardown(cu!(cuMemRelease(h)));
            }
            warn_teardown(cu!(cuMemAddressFree(va, total)));
        };
        for c in 0..chunks as usize {
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            if let Err(f) = cu!(cuMemCreate(&mut h, per, &prop, 0)) {
                undo(&handles, c);
                return Err(f.into());
            }
            handles.push(h);
            if let Err(f) = cu!(cuMemMap(va + (c * per) as CUdeviceptr, per, 0, h, 0)) {
                undo(&handles, c);
                return Err(f.into());
            }
        }
        let access = access_desc(dev);
        if let Err(f) = cu!(cuMemSetAccess(va, total, &access, 1)) {
            undo(&handles, chunks as usize);
            return Err(f.into());
        }
        Ok((va, total, handles))
    }

    /// Frees an allocation of [`alloc_kind`](Self::alloc_kind); false if `ptr` is not one.
    ///
    /// # Safety
    /// As `DeviceBackend::free`'s.
    pub(super) unsafe fn free_kind(&self, ptr: usize) -> Result<bool, DeviceError> {
        if !lock(&self.sharing.owned).contains_key(&ptr) {
            return Ok(false);
        }
        // Before the entry goes: a failed lookup must leave the allocation freeable.
        let dev = self.allocation_device("free", ptr)?;
        let _current = self.enter(dev)?;
        let Some(owned) = lock(&self.sharing.owned).remove(&ptr) else { return Ok(false) };
        // SAFETY: this function's contract.
        unsafe { self.free_owned(ptr, owned) };
        let mut known = lock(&self.known);
        // Every chunk of the range: from ptr to the end of its span.
        let span = known.get(&ptr).map_or(0, |i| i.span);
        let chunks: Vec<usize> = known.range(ptr..ptr + span.max(1)).map(|(&b, _)| b).collect();
        for b in chunks {
            known.remove(&b);
        }
        Ok(true)
    }

    /// # Safety
    /// As `DeviceBackend::free`'s; the right context is current.
    unsafe fn free_owned(&self, ptr: usize, owned: Owned) {
        match owned {
            Owned::Pool => {
                let null: sys::CUstream = ptr::null_mut();
                warn_teardown(
                    cu!(cuMemFreeAsync(ptr as CUdeviceptr, null)).and_then(|()| cu!(cuStreamSynchronize(null))),
                );
            }
            Owned::Managed => warn_teardown(cu!(cuMemFree_v2(ptr as CUdeviceptr))),
            Owned::Vmm { total, chunks } => {
                warn_teardown(cu!(cuMemUnmap(ptr as CUdeviceptr, total)));
                for h in chunks {
                    warn_teardown(cu!(cuMemRelease(h)));
                }
                warn_teardown(cu!(cuMemAddressFree(ptr as CUdeviceptr, total)));
            }
        }
    }

    /// Exports the allocation `info` describes (its base) by the route of its kind.
    pub(super) fn export_kind(&self, info: PointerInfo, dev: DevId) -> Result<IpcHandle, DeviceError> {
        let base = info.base;
        let not_shareable = |reason: String| DeviceError::NotShareable { base, reason };
        if let Some(reason) = info.alloc.unmappable_reason() {
            return Err(not_shareable(reason.to_owned()));
        }
        let ctx = self.ctx(dev)?;
        let _current = CtxGuard::enter(ctx)?;
        let (kind, payload, key, offer) = match info.alloc {
            AllocKind::Legacy => {
                let mut raw = sys::CUipcMemHandle { reserved: [0; PAYLOAD_BYTES] };
                cu!(cuIpcGetMemHandle(&mut raw, base as CUdeviceptr))
                    .map_err(|f| not_shareable(DeviceError::from(f).to_string()))?;
                return Ok(shareable::legacy_handle(&raw.reserved.map(|c| c as u8)));
            }
            AllocKind::Pool { .. } => {
                let mut pool: sys::CUmemoryPool = ptr::null_mut();
                let attr = sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE;
                cu!(cuPointerGetAttribute((&mut pool as *mut sys::CUmemoryPool).cast(), attr, base as CUdeviceptr))
                    .map_err(|f| not_shareable(DeviceError::from(f).to_string()))?;
                if !lock(&self.sharing.exported_pools).contains(&(pool as usize)) {
                    let mut fd: c_int = -1;
                    cu!(cuMemPoolExportToShareableHandle((&mut fd as *mut c_int).cast(), pool, POSIX_FD, 0))
                        .map_err(|f| not_shareable(DeviceError::from(f).to_string()))?;
                    if fd >= 0 {
                        // SAFETY: the driver just made this descriptor for us; it only had to exist.
                        drop(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                    lock(&self.sharing.exported_pools).insert(pool as usize);
                }
                let mut data = sys::CUmemPoolPtrExportData { reserved: [0; PAYLOAD_BYTES] };
                cu!(cuMemPoolExportPointer(&mut data, base as CUdeviceptr))
                    .map_err(|f| not_shareable(DeviceError::from(f).to_string()))?;
                let key = pool as u64;
                (SharedKind::Pool, data.reserved, key, Offer::Pool { pool: pool as usize, ctx: ctx.0 as usize })
            }
            AllocKind::Vmm { .. } => {
                let offer = Offer::Vmm { base, buffer_id: info.buffer_id, size: info.size, ctx: ctx.0 as usize };
                (SharedKind::Vmm, [0; PAYLOAD_BYTES], info.buffer_id, offer)
            }
            AllocKind::Managed => unreachable!("refused above"),
        };
        self.offer(key, offer).map_err(|e| not_shareable(format!("the fd server did not start: {e}")))?;
        Ok(SharedHandle { kind, payload, device: dev, pid: std::process::id(), nonce: self.nonce, key }.encode())
    }

    /// Puts `offer` in the fd server's table under `key`, starting the server first.
    fn offer(&self, key: u64, offer: Offer) -> std::io::Result<()> {
        let mut server = lock(&self.sharing.server);
        if server.is_none() {
            let offers = Arc::clone(&self.sharing.offers);
            let produce_for = move |key: u64| {
                let offer = lock(&offers).by_key.get(&key).copied();
                offer.map_or_else(|| Err(format!("nothing is offered under key {key:#x}")), produce)
            };
            *server =
                Some(FdServer::start(&shareable::fd_dir(), std::process::id(), self.nonce, Box::new(produce_for))?);
        }
        let mut offers = lock(&self.sharing.offers);
        if offers.by_key.insert(key, offer).is_none() {
            offers.order.push_back(key);
            while offers.order.len() > MAX_OFFERS {
                let old = offers.order.pop_front().expect("longer than the bound");
                offers.by_key.remove(&old);
            }
        }
        Ok(())
    }

    /// Opens a peer's pool allocation or VMM chunk on device `on` (context current).
    pub(super) fn open_shared(&self, h: &SharedHandle, on: DevId) -> Result<(CUdeviceptr, Opened), DeviceError> {
        let path = fd_share::socket_path(&shareable::fd_dir(), h.pid, h.nonce)
            .map_err(|e| DeviceError::BadHandle { reason: format!("fd server path: {e}") })?;
        let fetch = |key: u64| {
            fd_share::fetch(&path, key, shareable::FETCH_TIMEOUT).map_err(|e| DeviceError::BadHandle {
                reason: format!("the file descriptor of pid {}'s memory: {e}", h.pid),
            })
        };
        match h.kind {
            SharedKind::Pool => {
                let id = (h.pid, h.nonce, h.key);
                let cached = lock(&self.sharing.imported_pools).get(&id).copied();
                let mut data = sys::CUmemPoolPtrExportData { reserved: h.payload };
                let mut ptr: CUdeviceptr = 0;
                if let Some(pool) = cached {
                    if cu!(cuMemPoolImportPointer(&mut ptr, pool as sys::CUmemoryPool, &mut data)).is_ok() {
                        return Ok((ptr, Opened::PoolPointer));
                    }
                    // A pool the exporter destroyed, its key reused by a new one: import anew.
                    lock(&self.sharing.imported_pools).remove(&id);
                }
                let (fd, _) = fetch(h.key)?;
                let mut pool: sys::CUmemoryPool = ptr::null_mut();
                let raw = fd.as_raw_fd() as isize as *mut c_void;
                cu!(cuMemPoolImportFromShareableHandle(&mut pool, raw, POSIX_FD, 0))?;
                drop(fd);
                if on != h.device {
                    let access = access_desc(on);
                    cu!(cuMemPoolSetAccess(pool, &access, 1))?;
                }
                lock(&self.sharing.imported_pools).insert(id, pool as usize);
                cu!(cuMemPoolImportPointer(&mut ptr, pool, &mut data)).map_err(super::memory::open_error)?;
                Ok((ptr, Opened::PoolPointer))
            }
            SharedKind::Vmm => {
                let (fd, meta) = fetch(h.key)?;
                let size = meta
                    .get(..8)
                    .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
                    .filter(|&s| s > 0)
                    .ok_or_else(|| DeviceError::BadHandle { reason: "the fd server sent no chunk size".into() })?;
                let mut handle: sys::CUmemGenericAllocationHandle = 0;
                let raw = fd.as_raw_fd() as isize as *mut c_void;
                cu!(cuMemImportFromShareableHandle(&mut handle, raw, POSIX_FD))?;
                drop(fd);
                let mut va: CUdeviceptr = 0;
                let mapped = cu!(cuMemAddressReserve(&mut va, size, 0, 0, 0)).and_then(|()| {
                    cu!(cuMemMap(va, size, 0, handle, 0))
                        .inspect_err(|_| warn_teardown(cu!(cuMemAddressFree(va, size))))
                });
                if let Err(f) = mapped {
                    warn_teardown(cu!(cuMemRelease(handle)));
                    return Err(f.into());
                }
                let opened = Opened::Vmm { handle, size };
                let access = access_desc(on);
                if let Err(f) = cu!(cuMemSetAccess(va, size, &access, 1)) {
                    close_opened(va, opened);
                    return Err(f.into());
                }
                Ok((va, opened))
            }
        }
    }
}

/// Closes what [`open_shared`](CudaBackend::open_shared) or a legacy open made at `ptr`
/// (the right context current).
pub(super) fn close_opened(ptr: CUdeviceptr, how: Opened) {
    match how {
        Opened::Legacy => warn_teardown(cu!(cuIpcCloseMemHandle(ptr))),
        Opened::PoolPointer => warn_teardown(cu!(cuMemFree_v2(ptr))),
        Opened::Vmm { handle, size } => {
            warn_teardown(cu!(cuMemUnmap(ptr, size)));
            warn_teardown(cu!(cuMemRelease(handle)));
            warn_teardown(cu!(cuMemAddressFree(ptr, size)));
        }
    }
}

/// Read and write access for device `dev`.
fn access_desc(dev: DevId) -> sys::CUmemAccessDesc {
    // SAFETY: plain-data struct of the driver's API; zero is its "unset" value.
    let mut a: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    a.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev as c_int;
    a.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    a
}
