//! CUDA backend: the [`DeviceBackend`] table over the NVIDIA driver API (`cudarc::driver::sys`).
//!
//! libcuda is loaded at run time (cudarc's `dynamic-loading`), so this crate builds and runs on
//! machines without a GPU: [`CudaBackend::try_new`] answers [`DeviceError::Unavailable`] there.
//! cudarc panics when a library or symbol it needs is missing, so the driver is checked for the
//! library and for every symbol the backend calls before the first driver call.
//!
//! Choices that matter for correctness or speed:
//! - Each device's *primary* context is retained on first use, the one the CUDA runtime of the
//!   application also uses, so pointers from `cudaMalloc` and ours live in the same context.
//!   Peer access is enabled between every pair of retained devices that supports it, so peer
//!   copies go over NVLink instead of being staged through the host.
//! - Every call that needs a context goes through a context guard (`CtxGuard`), which puts back a context the
//!   calling thread already had: the application's own CUDA calls must not land on our device.
//! - Copies run on non-blocking streams, one per (device, lane), and complete through events
//!   from a per-device pool, so a copy costs a memcpy, an event record and a map insert.
//! - With a copy server enabled on a device (`copy_server.rs`), small copies between device
//!   memory that device reaches are made by a kernel resident on it instead, without a
//!   driver call; while no server runs, the engine takes them.
//!
//! Files: this one (the devices, their contexts and the [`DeviceBackend`] table),
//! `driver.rs` (loading libcuda, calling it, context guards), `memory.rs` (what a pointer is,
//! IPC handles), `copies.rs` (streams, events, tickets, routing to the copy server),
//! `copy_2d.rs` (2-D copies),
//! `copy_server.rs` (the resident copy kernel) and `tests.rs`.

mod copies;
mod copy_2d;
mod copy_server;
mod driver;
mod kinds;
mod memory;
#[cfg(test)]
mod tests;

pub use driver::cuda_available;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};

use super::{
    AllocKind, AtomicState, AtomicTicket, BackendKind, CopyTicket, DevId, DeviceBackend, DeviceError, HostMapped,
    IpcHandle, Mapping, MemoryKind, PointerInfo, WordAtomic,
};
use copies::{lane_slot, Pending, Tickets, LEGACY_STREAM, SYNC_SLOT};
use copy_server::CopyServer;
use driver::{check, cu, driver, lock, warn_teardown, Benign, Ctx, CtxGuard, Event, Stream};
use kinds::{close_opened, Opened};
use memory::{known_info, open_error, to_raw_handle, OpenHandles, OpenMapping};

use super::shareable::SharedHandle;

/// A copy server's idle timeout until `enable_copy_server` sets one: the default of
/// `GPULMT_COPY_SERVER_IDLE_US`.
const DEFAULT_SERVER_IDLE: std::time::Duration = std::time::Duration::from_micros(100);

struct Device {
    cu: sys::CUdevice,
    /// Primary context, set once retained (and its peer access enabled).
    ctx: OnceLock<Ctx>,
    /// Streams by slot ([`SYNC_SLOT`], then one per lane), created on first use.
    streams: Mutex<Vec<Option<Stream>>>,
    /// Events whose copies have completed, ready to be recorded again.
    events: Mutex<Vec<Event>>,
    /// The copy server, once enabled ([`DeviceBackend::enable_copy_server`]).
    server: Mutex<Option<CopyServer>>,
    /// Largest copy the server takes (0 while it is off): read without the lock.
    server_max: AtomicUsize,
    /// The server's idle timeout, in nanoseconds: `enable_copy_server`'s, or the default
    /// for a server that word atomics started while copies do not use one.
    server_idle_ns: AtomicU64,
    /// Streams made from now on get the context's greatest priority
    /// ([`DeviceBackend::set_copy_priority`]).
    high_priority: AtomicBool,
}

/// The CUDA driver backend. Construct with [`CudaBackend::try_new`].
pub struct CudaBackend {
    devices: Vec<Device>,
    /// `peer[from * n + to]`: `cuDeviceCanAccessPeer`, read once at construction.
    peer: Vec<bool>,
    /// Serialises context retention, so that peer access is enabled once per pair.
    retain_lock: Mutex<()>,
    next_ticket: AtomicU64,
    /// Copies in flight by ticket.
    tickets: Mutex<Tickets>,
    open: Mutex<OpenHandles>,
    /// Allocations made by [`alloc`](DeviceBackend::alloc) and mappings made by
    /// [`open_handle`](DeviceBackend::open_handle), by base address: their attributes
    /// hold until [`free`](DeviceBackend::free) or
    /// [`close_handle`](DeviceBackend::close_handle), which alone can recycle the
    /// address, so `pointer_info` answers them without a driver query (one
    /// `cuPointerGetAttributes` per message is a large share of the CPU time of a busy
    /// bi-directional stream, and of a copy the copy server makes).
    known: Mutex<std::collections::BTreeMap<usize, PointerInfo>>,
    /// Pinned host memory from [`alloc_host_mapped`](DeviceBackend::alloc_host_mapped):
    /// host address -> (bytes, device address). `copy_sync` between it and device memory
    /// is one driver call, or a copy server's copy, which addresses it by the device address.
    pinned: Mutex<std::collections::BTreeMap<usize, (usize, usize)>>,
    /// Memory of other kinds than legacy: what `alloc_as` made, the fd server, imported pools.
    sharing: kinds::Sharing,
    /// Tells this instance's fd server from another of the same pid (`shareable.rs`).
    nonce: u64,
}

impl CudaBackend {
    /// Loads the driver and enumerates devices; [`DeviceError::Unavailable`] when libcuda
    /// cannot be loaded, `cuInit` fails or no device is visible. Contexts are retained later,
    /// on each device's first use, so a process touches only the GPUs it uses.
    pub fn try_new() -> Result<Self, DeviceError> {
        let count = driver()?;
        let devices = (0..count)
            .map(|ordinal| {
                let mut cu: sys::CUdevice = 0;
                cu!(cuDeviceGet(&mut cu, ordinal as c_int))?;
                Ok(Device {
                    cu,
                    ctx: OnceLock::new(),
                    streams: Mutex::new(Vec::new()),
                    events: Mutex::new(Vec::new()),
                    server: Mutex::new(None),
                    server_max: AtomicUsize::new(0),
                    server_idle_ns: AtomicU64::new(DEFAULT_SERVER_IDLE.as_nanos() as u64),
                    high_priority: AtomicBool::new(false),
                })
            })
            .collect::<Result<Vec<_>, DeviceError>>()?;
        let mut peer = Vec::with_capacity(devices.len() * devices.len());
        for (a, from) in devices.iter().enumerate() {
            for (b, to) in devices.iter().enumerate() {
                let mut can: c_int = 0;
                if a != b {
                    cu!(cuDeviceCanAccessPeer(&mut can, from.cu, to.cu))?;
                }
                peer.push(a == b || can != 0);
            }
        }
        Ok(Self {
            devices,
            peer,
            retain_lock: Mutex::new(()),
            next_ticket: AtomicU64::new(1),
            tickets: Mutex::new(Tickets::default()),
            open: Mutex::new(OpenHandles::default()),
            known: Mutex::new(std::collections::BTreeMap::new()),
            pinned: Mutex::new(std::collections::BTreeMap::new()),
            sharing: kinds::Sharing::default(),
            nonce: {
                use std::hash::BuildHasher;
                std::collections::hash_map::RandomState::new().hash_one(std::process::id())
            },
        })
    }

    fn device(&self, dev: DevId) -> Result<&Device, DeviceError> {
        self.devices.get(dev as usize).ok_or(DeviceError::NoSuchDevice { dev, count: self.devices.len() as u32 })
    }

    /// The primary context of `dev`, retained on first use.
    fn ctx(&self, dev: DevId) -> Result<Ctx, DeviceError> {
        match self.device(dev)?.ctx.get() {
            Some(&ctx) => Ok(ctx),
            None => self.retain(dev),
        }
    }

    #[cold]
    fn retain(&self, dev: DevId) -> Result<Ctx, DeviceError> {
        let _retaining = lock(&self.retain_lock);
        let d = self.device(dev)?;
        if let Some(&ctx) = d.ctx.get() {
            return Ok(ctx);
        }
        let mut raw: sys::CUcontext = ptr::null_mut();
        cu!(cuDevicePrimaryCtxRetain(&mut raw, d.cu))?;
        let ctx = Ctx(raw);
        // Enabled before the context is published, so no copy on this device can start
        // before its peer mappings exist and fall back to staging through the host.
        self.enable_peers(dev, ctx);
        let _ = d.ctx.set(ctx);
        Ok(ctx)
    }

    /// Enables peer access both ways between `dev` and every device already retained (pairs
    /// involving a device not yet retained are enabled when that one is).
    fn enable_peers(&self, dev: DevId, ctx: Ctx) {
        for (p, other) in self.devices.iter().enumerate() {
            let p = p as DevId;
            let Some(&pctx) = other.ctx.get() else {
                continue;
            };
            for (from, from_ctx, to, to_ctx) in [(dev, ctx, p, pctx), (p, pctx, dev, ctx)] {
                if from == to || !self.can_access_peer(from, to) {
                    continue;
                }
                let enabled = CtxGuard::enter(from_ctx).and_then(|_current| {
                    cu!(cuCtxEnablePeerAccess(to_ctx.0, 0)).benign(CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED)
                });
                // Not fatal: copies between the pair still work, staged through host memory.
                if let Err(f) = enabled {
                    tracing::warn!(from, to, "peer access not enabled: {}", DeviceError::from(f));
                }
            }
        }
    }

    /// Makes `dev`'s context current for the guard's lifetime.
    fn enter(&self, dev: DevId) -> Result<CtxGuard, DeviceError> {
        Ok(CtxGuard::enter(self.ctx(dev)?)?)
    }

    /// A device for work that involves no device memory (host registration, host-to-host
    /// copies): one already in use, so that no other GPU gets a context for it.
    fn fallback_device(&self) -> DevId {
        self.devices.iter().position(|d| d.ctx.get().is_some()).unwrap_or(0) as DevId
    }
}

impl DeviceBackend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device_count(&self) -> u32 {
        self.devices.len() as u32
    }

    fn can_access_peer(&self, from: DevId, to: DevId) -> bool {
        let n = self.devices.len();
        let (from, to) = (from as usize, to as usize);
        from < n && to < n && self.peer[from * n + to]
    }

    fn mps_enabled(&self, dev: DevId) -> Option<bool> {
        let d = self.devices.get(dev as usize)?;
        let mut v: c_int = 0;
        // A driver too old to know the attribute refuses it: then it is unknown.
        let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MPS_ENABLED;
        cu!(cuDeviceGetAttribute(&mut v, attr, d.cu)).ok().map(|()| v != 0)
    }

    fn alloc(&self, dev: DevId, bytes: usize) -> Result<usize, DeviceError> {
        let _current = self.enter(dev)?;
        let mut ptr: CUdeviceptr = 0;
        cu!(cuMemAlloc_v2(&mut ptr, bytes))?;
        // As MPI libraries do for buffers they share: makes synchronous copies touching this
        // memory fully synchronous, so a peer never reads it while a cuMemcpy is still landing.
        let sync_memops: c_uint = 1;
        let set = cu!(cuPointerSetAttribute(
            (&sync_memops as *const c_uint).cast::<c_void>(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
            ptr,
        ));
        if let Err(f) = set {
            warn_teardown(cu!(cuMemFree_v2(ptr)));
            return Err(f.into());
        }
        match self.query_pointer(ptr as usize) {
            Ok(info) => {
                lock(&self.known).insert(ptr as usize, info);
            }
            Err(e) => {
                warn_teardown(cu!(cuMemFree_v2(ptr)));
                return Err(e);
            }
        }
        Ok(ptr as usize)
    }

    fn alloc_as(&self, dev: DevId, bytes: usize, kind: AllocKind, chunks: u32) -> Result<usize, DeviceError> {
        match kind {
            AllocKind::Legacy => self.alloc(dev, bytes),
            _ => self.alloc_kind(dev, bytes, kind, chunks),
        }
    }

    unsafe fn free(&self, ptr: usize) -> Result<(), DeviceError> {
        // SAFETY: free's contract is free_kind's.
        if unsafe { self.free_kind(ptr)? } {
            return Ok(());
        }
        let dev = self.allocation_device("free", ptr)?;
        let _current = self.enter(dev)?;
        cu!(cuMemFree_v2(ptr as CUdeviceptr))?;
        lock(&self.known).remove(&ptr);
        Ok(())
    }

    fn pointer_info(&self, ptr: usize) -> Result<PointerInfo, DeviceError> {
        let known = known_info(&lock(&self.known), ptr);
        known.map_or_else(|| self.query_pointer(ptr), Ok)
    }

    fn export_handle(&self, base: usize) -> Result<IpcHandle, DeviceError> {
        let info = self.pointer_info(base)?;
        let MemoryKind::Device(dev) = info.kind else {
            return Err(DeviceError::InvalidPointer { op: "export_handle", ptr: base, expected: "device memory" });
        };
        if info.base != base {
            let expected = "the start of a device allocation";
            return Err(DeviceError::InvalidPointer { op: "export_handle", ptr: base, expected });
        }
        self.export_kind(info, dev)
    }

    fn open_handle(&self, handle: &IpcHandle, on: DevId) -> Result<Mapping, DeviceError> {
        let ctx = self.ctx(on)?;
        // Held across the driver call so that two threads cannot both pass the check.
        let mut open = lock(&self.open);
        if open.by_handle.contains_key(&handle.0) {
            return Err(DeviceError::DoubleOpen { owner: 0, buffer_id: 0 });
        }
        let _current = CtxGuard::enter(ctx)?;
        let (ptr, how) = match SharedHandle::decode(handle)? {
            Some(shared) => self.open_shared(&shared, on)?,
            None => {
                let mut ptr: CUdeviceptr = 0;
                let lazy_peer = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
                cu!(cuIpcOpenMemHandle_v2(&mut ptr, to_raw_handle(handle), lazy_peer)).map_err(open_error)?;
                (ptr, Opened::Legacy)
            }
        };
        if open.by_ptr.contains_key(&(ptr as usize)) {
            // The driver handed back a mapping this process still holds: a pool import of
            // an allocation the exporter made where it freed one this process imported,
            // answered with the old import, its size and bytes (`lab/gpu/memory_kinds.cu`,
            // reuse_hold). Not closed here (it is the holder's); the handle cache closes
            // its idle mappings and opens again (`acquire_evicting_on`).
            return Err(DeviceError::DoubleOpen { owner: 0, buffer_id: 0 });
        }
        let mut base: CUdeviceptr = 0;
        let mut size: usize = 0;
        if let Err(f) = cu!(cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) {
            close_opened(ptr, how);
            return Err(f.into());
        }
        let ptr = ptr as usize;
        // The mapping's own attributes (the exporter's device, its buffer id), asked once:
        // the copy server's reachability check asks for them at every copy.
        match self.query_pointer(ptr) {
            Ok(info @ PointerInfo { kind: MemoryKind::Device(_), .. }) if info.base == ptr => {
                lock(&self.known).insert(ptr, info);
            }
            // Answered by the driver at each lookup, as before.
            Ok(_) => {}
            Err(e) => {
                close_opened(ptr as CUdeviceptr, how);
                return Err(e);
            }
        }
        open.by_handle.insert(handle.0, ptr);
        open.by_ptr.insert(ptr, OpenMapping { handle: handle.0, on, how });
        Ok(Mapping { ptr, size })
    }

    unsafe fn close_handle(&self, mapping: Mapping) -> Result<(), DeviceError> {
        let mut open = lock(&self.open);
        let Some(m) = open.by_ptr.get(&mapping.ptr) else {
            return Err(DeviceError::InvalidPointer {
                op: "close_handle",
                ptr: mapping.ptr,
                expected: "a mapping returned by open_handle",
            });
        };
        let (handle, on, how) = (m.handle, m.on, m.how);
        {
            let _current = self.enter(on)?;
            match how {
                // The one close whose failure the caller hears of, as before.
                Opened::Legacy => cu!(cuIpcCloseMemHandle(mapping.ptr as CUdeviceptr))?,
                how => close_opened(mapping.ptr as CUdeviceptr, how),
            }
        }
        lock(&self.known).remove(&mapping.ptr);
        open.by_ptr.remove(&mapping.ptr);
        open.by_handle.remove(&handle);
        Ok(())
    }

    unsafe fn copy_async(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<CopyTicket, DeviceError> {
        let d = self.device(engine)?;
        if len == 0 {
            let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
            let done = Pending { dev: engine, stream: None, event: None, served: None };
            lock(&self.tickets).pending.insert(id, done);
            return Ok(CopyTicket(id));
        }
        let server_may_take = len <= d.server_max.load(Ordering::Relaxed);
        if server_may_take {
            // SAFETY: copy_async's contract is serve's.
            if let Some(seq) = unsafe { self.serve(engine, d, dst, src, len)? } {
                let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
                let p = Pending { dev: engine, stream: None, event: None, served: Some(seq) };
                lock(&self.tickets).pending.insert(id, p);
                return Ok(CopyTicket(id));
            }
        }
        let slot = lane_slot(lane);
        let _current = self.enter(engine)?;
        // SAFETY: copy_async's contract is engine_copy's.
        let ticket = unsafe { self.engine_copy(engine, d, slot, dst, src, len)? };
        if server_may_take {
            // The copy runs; starting a server (if the declined copy asked for one) now
            // overlaps its launch with it.
            if let Some(server) = lock(&d.server).as_mut() {
                // Not the copy's failure: it runs, and later ones use the engine.
                if let Err(e) = server.launch_if_wanted() {
                    tracing::warn!(device = engine, error = %e, "copy server launch failed; small copies use the copy engine");
                }
            }
        }
        Ok(ticket)
    }

    fn copy_poll(&self, ticket: CopyTicket) -> Result<bool, DeviceError> {
        let (pending, known) = {
            let t = lock(&self.tickets);
            let p = t.pending.get(&ticket.0).copied().ok_or(DeviceError::InvalidPointer {
                op: "copy_poll",
                ptr: ticket.0 as usize,
                expected: "a copy ticket in flight (already completed, or never issued)",
            })?;
            let known = p.stream.is_some_and(|(_, slot)| t.finished.covers(&(p.dev, slot), ticket.0));
            (p, known)
        };
        if let Some(seq) = pending.served {
            let dev = pending.dev;
            let mut server = lock(&self.devices[dev as usize].server);
            let server = server.as_mut().expect("a served copy's device has a server until the backend drops");
            if !server.finished(seq, || self.enter(dev))? {
                return Ok(false);
            }
            lock(&self.tickets).pending.remove(&ticket.0);
            return Ok(true);
        }
        // A zero-length copy has no stream: nothing to wait for.
        if let (Some((stream, _)), false) = (pending.stream, known) {
            let _current = self.enter(pending.dev)?;
            // An idle stream means the copy is done even if a newer copy gave it an event
            // meanwhile; a busy one may only mean that newer copy runs: ask again later.
            let finished = match pending.event {
                Some(ev) => cu!(cuEventQuery(ev.0)),
                None => cu!(cuStreamQuery(stream.0)),
            };
            match finished {
                Ok(()) => {}
                Err(f) if f.code == CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                Err(f) => return Err(f.into()),
            }
        }
        // Only the poller that removes the ticket recycles its event (the one it holds now:
        // a newer copy may have given it one since it was read): two threads polling the
        // same ticket must not put one event in the pool twice.
        let removed = {
            let mut t = lock(&self.tickets);
            if let (Some((_, slot)), false) = (pending.stream, known) {
                t.finished.saw((pending.dev, slot), ticket.0);
            }
            t.pending.remove(&ticket.0)
        };
        if let Some(Pending { dev, event: Some(ev), .. }) = removed {
            lock(&self.devices[dev as usize].events).push(ev);
        }
        Ok(true)
    }

    unsafe fn copy_2d_async(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        shape: super::Copy2d,
    ) -> Result<CopyTicket, DeviceError> {
        // SAFETY: copy_2d_async's contract is start_copy_2d's (copy_2d.rs).
        unsafe { self.start_copy_2d(engine, lane, dst, src, shape) }
    }

    unsafe fn copy_2d_sync(&self, dst: usize, src: usize, shape: super::Copy2d) -> Result<(), DeviceError> {
        // SAFETY: copy_2d_sync's contract is copy_2d_now's (copy_2d.rs).
        unsafe { self.copy_2d_now(dst, src, shape) }
    }

    /// Runs on a stream of its own and waits for it, rather than `cuMemcpy`: `cuMemcpy` on the
    /// legacy default stream returns before a device-to-device copy has landed, and waits
    /// for every blocking stream of the application in that context. The copy is ordered
    /// after what the application queued on its legacy default stream: a `cudaMemcpy` from
    /// pageable memory returns before its DMA has landed, and a copy of ours into the same
    /// buffer must not be overwritten by it afterwards (seen on 2x H200 with two ranks per
    /// GPU under the PMPI shim).
    ///
    /// Except between device memory and pinned memory of [`alloc_host_mapped`]: there one
    /// `cuMemcpy` (synchronous both ways for pinned memory, and ordered after the legacy
    /// default stream as the event above orders ours) replaces the four calls of the
    /// stream's way (record, wait, copy, synchronize), each of which costs a microsecond or
    /// more under MPS: an 8 B eager payload across nodes pays two such copies. With a copy
    /// server enabled for the length, the server makes it instead (no driver call).
    ///
    /// [`alloc_host_mapped`]: DeviceBackend::alloc_host_mapped
    unsafe fn copy_sync(&self, dst: usize, src: usize, len: usize) -> Result<(), DeviceError> {
        if len == 0 {
            return Ok(());
        }
        if let Some(dev) = self.device_and_pinned(dst, src, len)? {
            if len <= self.device(dev)?.server_max.load(Ordering::Relaxed) {
                // The copy server's way: ordered after the application's legacy stream as
                // the engine's, then a descriptor and a completion word, no driver call
                // (when the server declines, copy_async queues it on the engine).
                self.wait_app_default_stream(dev)?;
                // SAFETY: copy_sync's contract keeps both ranges valid for the whole call,
                // and copy_wait waits for the copy.
                return unsafe { self.copy_wait(dev, 0, dst, src, len) };
            }
            let _current = self.enter(dev)?;
            return Ok(cu!(cuMemcpy(dst as CUdeviceptr, src as CUdeviceptr, len))?);
        }
        let mut dev = None;
        for p in [dst, src] {
            if let MemoryKind::Device(d) = self.pointer_info(p)?.kind {
                dev = Some(d);
                break;
            }
        }
        let dev = dev.unwrap_or_else(|| self.fallback_device());
        let wait = |_: &Device, stream| Ok(cu!(cuStreamSynchronize(stream))?);
        // SAFETY: copy_sync's contract keeps both ranges valid for the whole call, and the
        // copy's stream is synchronized (`wait`) before it returns.
        unsafe { self.enqueue(dev, SYNC_SLOT, (dst, src, len), true, wait) }
    }

    fn wait_app_default_stream(&self, dev: DevId) -> Result<(), DeviceError> {
        let _current = self.enter(dev)?;
        // Querying first keeps the common case (nothing pending) to one cheap call.
        match cu!(cuStreamQuery(LEGACY_STREAM)) {
            Ok(()) => Ok(()),
            Err(f) if f.code == CUresult::CUDA_ERROR_NOT_READY => Ok(cu!(cuStreamSynchronize(LEGACY_STREAM))?),
            Err(f) => Err(f.into()),
        }
    }

    fn enable_copy_server(&self, dev: DevId, max_len: usize, idle: std::time::Duration) -> Result<(), DeviceError> {
        let d = self.device(dev)?;
        d.server_idle_ns.store(idle.as_nanos() as u64, Ordering::Relaxed);
        // Made now even for word atomics alone (max_len 0): loading its module and
        // allocating its ring while a kernel of this process runs waited for that kernel
        // (device_check --offnode hung: the kernel waited for an AMO the proxy could only
        // make once the server existed). Launched by its first copy or atomic.
        let mut server = lock(&d.server);
        if server.is_none() {
            let _current = self.enter(dev)?;
            *server = Some(CopyServer::new(idle, Self::stream_priority(d)?)?);
        }
        d.server_max.store(max_len, Ordering::Relaxed);
        Ok(())
    }

    /// Posted to `dev`'s copy server (started for it if copies do not use one), whose
    /// thread makes it with a system-scope atomic instruction.
    unsafe fn word_atomic_start(
        &self,
        dev: DevId,
        addr: usize,
        op: WordAtomic,
    ) -> Result<Option<AtomicTicket>, DeviceError> {
        if !addr.is_multiple_of(8) {
            return Err(DeviceError::InvalidPointer {
                op: "word_atomic_start",
                ptr: addr,
                expected: "an 8-byte aligned word of device memory",
            });
        }
        let d = self.device(dev)?;
        let mut server = lock(&d.server);
        if server.is_none() {
            let _current = self.enter(dev)?;
            let idle = std::time::Duration::from_nanos(d.server_idle_ns.load(Ordering::Relaxed));
            *server = Some(CopyServer::new(idle, Self::stream_priority(d)?)?);
        }
        let server = server.as_mut().expect("made above");
        // SAFETY: word_atomic_start's contract is post_atomic's.
        match unsafe { server.post_atomic(addr, op, || self.enter(dev))? } {
            Some(seq) => Ok(Some(AtomicTicket(AtomicState::Served { dev, seq }))),
            None => {
                // The context only for a launch: the caller retries every proxy round
                // while a launched server starts.
                if server.launch_wanted() {
                    let _current = self.enter(dev)?;
                    server.launch_if_wanted()?;
                }
                Ok(None)
            }
        }
    }

    fn word_atomic_poll(&self, ticket: AtomicTicket) -> Result<Option<u64>, DeviceError> {
        match ticket.0 {
            AtomicState::Done(old) => Ok(Some(old)),
            AtomicState::Served { dev, seq } => {
                let mut server = lock(&self.device(dev)?.server);
                let server = server.as_mut().expect("a served atomic's device has a server until the backend drops");
                server.atomic_result(seq, || self.enter(dev))
            }
        }
    }

    fn set_copy_priority(&self, high: bool) -> Result<(), DeviceError> {
        for d in &self.devices {
            d.high_priority.store(high, Ordering::Relaxed);
        }
        Ok(())
    }

    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped, DeviceError> {
        // PORTABLE: pinned for every context; DEVICEMAP: mapped into the device's address
        // space, so a kernel can poll and write it (the GIO queues).
        let _current = self.enter(self.fallback_device())?;
        let mut host: *mut c_void = ptr::null_mut();
        let len = bytes.max(1);
        cu!(cuMemHostAlloc(&mut host, len, sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP))?;
        // SAFETY: just allocated, `len` bytes long, and nobody else knows the address yet.
        unsafe { ptr::write_bytes(host.cast::<u8>(), 0, len) };
        let mut device: CUdeviceptr = 0;
        if let Err(f) = cu!(cuMemHostGetDevicePointer_v2(&mut device, host, 0)) {
            warn_teardown(cu!(cuMemFreeHost(host)));
            return Err(f.into());
        }
        lock(&self.pinned).insert(host as usize, (len, device as usize));
        Ok(HostMapped { host: host as usize, device: device as usize, len: bytes })
    }

    unsafe fn free_host_mapped(&self, host: usize) -> Result<(), DeviceError> {
        if lock(&self.pinned).remove(&host).is_none() {
            return Err(DeviceError::InvalidPointer {
                op: "free_host_mapped",
                ptr: host,
                expected: "the start of memory from alloc_host_mapped",
            });
        }
        let _current = self.enter(self.fallback_device())?;
        Ok(cu!(cuMemFreeHost(host as *mut c_void))?)
    }

    unsafe fn register_host(&self, ptr: usize, len: usize) -> Result<(), DeviceError> {
        // PORTABLE: pinned for every context, so any device's engine may DMA it, whichever
        // context registered it.
        let _current = self.enter(self.fallback_device())?;
        Ok(cu!(cuMemHostRegister_v2(ptr as *mut c_void, len, sys::CU_MEMHOSTREGISTER_PORTABLE))
            .benign(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)?)
    }

    unsafe fn unregister_host(&self, ptr: usize) -> Result<(), DeviceError> {
        let _current = self.enter(self.fallback_device())?;
        Ok(cu!(cuMemHostUnregister(ptr as *mut c_void)).benign(CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)?)
    }
}

impl CudaBackend {
    /// For a copy of `len` bytes between device memory and pinned memory of
    /// `alloc_host_mapped` (either way), the device; None for any other pair.
    fn device_and_pinned(&self, dst: usize, src: usize, len: usize) -> Result<Option<DevId>, DeviceError> {
        let [dst_pinned, src_pinned] = self.pinned_device_addresses([dst, src], len).map(|a| a.is_some());
        // The end that is not pinned must be device memory.
        let other = match (dst_pinned, src_pinned) {
            (true, false) => src,
            (false, true) => dst,
            _ => return Ok(None),
        };
        Ok(match self.pointer_info(other)?.kind {
            MemoryKind::Device(dev) => Some(dev),
            MemoryKind::Host => None,
        })
    }
}

impl CudaBackend {
    /// For each address, the device address of `p..p+len` when that whole range is pinned
    /// memory of `alloc_host_mapped`; looked up under one lock.
    pub(super) fn pinned_device_addresses<const N: usize>(&self, ps: [usize; N], len: usize) -> [Option<usize>; N] {
        let map = lock(&self.pinned);
        ps.map(|p| {
            let (&base, &(bytes, device)) = map.range(..=p).next_back()?;
            (p.checked_add(len)? <= base + bytes).then(|| device + (p - base))
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let open = std::mem::take(self.open.get_mut().unwrap_or_else(PoisonError::into_inner));
        for (ptr, m) in open.by_ptr {
            warn_teardown(self.enter(m.on).map(|_current| close_opened(ptr as CUdeviceptr, m.how)));
        }
        // After every pointer imported from them was freed just above.
        for pool in self.sharing.take_imported_pools() {
            let dev = self.fallback_device();
            warn_teardown(self.enter(dev).and_then(|_current| Ok(cu!(cuMemPoolDestroy(pool as sys::CUmemoryPool))?)));
        }
        // Events of copies never polled to completion are destroyed with the pool; the driver
        // defers the release of an event still pending.
        let tickets = self.tickets.get_mut().unwrap_or_else(PoisonError::into_inner);
        tickets.bare.clear();
        for (_, p) in tickets.pending.drain() {
            if let (Some(ev), Some(d)) = (p.event, self.devices.get_mut(p.dev as usize)) {
                d.events.get_mut().unwrap_or_else(PoisonError::into_inner).push(ev);
            }
        }
        for d in &mut self.devices {
            let Some(&ctx) = d.ctx.get() else { continue };
            match CtxGuard::enter(ctx) {
                Ok(_current) => {
                    // Stops a running server before its context goes.
                    drop(d.server.get_mut().unwrap_or_else(PoisonError::into_inner).take());
                    let streams = d.streams.get_mut().unwrap_or_else(PoisonError::into_inner);
                    for s in streams.drain(..).flatten() {
                        warn_teardown(cu!(cuStreamDestroy_v2(s.0)));
                    }
                    let events = d.events.get_mut().unwrap_or_else(PoisonError::into_inner);
                    for ev in events.drain(..) {
                        warn_teardown(cu!(cuEventDestroy_v2(ev.0)));
                    }
                }
                Err(f) => warn_teardown(Err(f)),
            }
            warn_teardown(cu!(cuDevicePrimaryCtxRelease_v2(d.cu)));
        }
        // CtxGuard leaves our context current on threads that had none; this thread at least
        // must not keep a context whose last reference may just have been released.
        let mut current: sys::CUcontext = ptr::null_mut();
        if cu!(cuCtxGetCurrent(&mut current)).is_ok()
            && self.devices.iter().any(|d| d.ctx.get().is_some_and(|c| c.0 == current))
        {
            warn_teardown(cu!(cuCtxSetCurrent(ptr::null_mut())));
        }
    }
}
