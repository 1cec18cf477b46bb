//! CUDA backend: the [`DeviceBackend`] table over the NVIDIA driver API (`cudarc::driver::sys`).
//!
//! libcuda is loaded at run time (cudarc's `dynamic-loading`), so this crate builds and runs on
//! machines without a GPU: [`CudaBackend::try_new`] answers [`DeviceError::Unavailable`] there.
//! cudarc panics when a library or symbol it needs is missing, so [`driver`] checks for the
//! library and for every symbol this file calls before the first driver call.
//!
//! Choices that matter for correctness or speed:
//! - Each device's *primary* context is retained on first use, the one the CUDA runtime of the
//!   application also uses, so pointers from `cudaMalloc` and ours live in the same context.
//!   Peer access is enabled between every pair of retained devices that supports it, so peer
//!   copies go over NVLink instead of being staged through the host.
//! - Every call that needs a context goes through [`CtxGuard`], which puts back a context the
//!   calling thread already had: the application's own CUDA calls must not land on our device.
//! - Copies run on non-blocking streams, one per (device, lane), and complete through events
//!   from a per-device pool, so a copy costs a memcpy, an event record and a map insert.
//! - With a copy server enabled on a device (`copy_server.rs`), small copies between device
//!   memory that device reaches are made by a kernel resident on it instead, without a
//!   driver call; while no server runs, the engine takes them.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use rustc_hash::FxHashMap;

use super::copy_server::CopyServer;
use super::{
    BackendKind, CopyTicket, DevId, DeviceBackend, DeviceError, FinishedThrough, IpcHandle, Mapping, MemoryKind,
    PointerInfo, IPC_HANDLE_BYTES,
};

/// Calls `sys::$f(..)` and checks its result, naming the call by its own identifier so that an
/// error can never name the wrong function. Every use passes only values and pointers to locals
/// that outlive the call, which is what makes the `unsafe` sound.
macro_rules! cu {
    ($f:ident($($arg:expr),* $(,)?)) => {
        check(stringify!($f), unsafe { sys::$f($($arg),*) })
    };
}
pub(super) use cu;

/// Driver symbols this file calls (through [`cu!`] or `sys::` directly). cudarc resolves each
/// lazily and panics if it is missing, so all are checked when the driver is loaded; a unit test
/// keeps this list and the calls in step.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuGetErrorName",
    "cuGetErrorString",
    "cuInit",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceCanAccessPeer",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxEnablePeerAccess",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuPointerSetAttribute",
    "cuPointerGetAttributes",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemGetAddressRange_v2",
    "cuStreamCreateWithPriority",
    "cuCtxGetStreamPriorityRange",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuStreamWaitEvent",
    "cuMemcpyAsync",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    // The copy server (copy_server.rs).
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuMemHostAlloc",
    "cuMemHostGetDevicePointer_v2",
    "cuMemFreeHost",
];

/// Where container runtimes mount the driver library. Loading it by path makes cudarc's later
/// `dlopen("libcuda.so.1")` find it by soname even when that directory is not on the loader's
/// search path.
const FALLBACK_LIBCUDA: &[&CStr] = &[c"/usr/local/nvidia/lib64/libcuda.so.1", c"/usr/lib64/libcuda.so.1"];

/// Set once libcuda and all [`REQUIRED_SYMBOLS`] are known present: only then may an error be
/// described through `cuGetErrorName`/`cuGetErrorString`.
static DRIVER_LOADED: AtomicBool = AtomicBool::new(false);

/// Stream slot of [`DeviceBackend::copy_sync`]; lanes of `copy_async` follow it.
const SYNC_SLOT: usize = 0;

fn lane_slot(lane: u32) -> usize {
    lane as usize + 1
}

/// The application's legacy default stream (`CU_STREAM_LEGACY`).
const LEGACY_STREAM: sys::CUstream = 1usize as sys::CUstream;

// ---------------------------------------------------------------------------------------------
// Driver results

/// A failed driver call, kept cheap (no string) until it becomes a [`DeviceError`], so that
/// expected codes such as `CUDA_ERROR_NOT_READY` cost nothing on the polling path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CuFailure {
    pub(super) call: &'static str,
    pub(super) code: CUresult,
}

pub(super) fn check(call: &'static str, code: CUresult) -> Result<(), CuFailure> {
    if code == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CuFailure { call, code })
    }
}

trait Benign {
    /// Treats `code` as success: for codes that mean "already in the state asked for".
    fn benign(self, code: CUresult) -> Self;
}

impl Benign for Result<(), CuFailure> {
    fn benign(self, code: CUresult) -> Self {
        match self {
            Err(f) if f.code == code => Ok(()),
            other => other,
        }
    }
}

impl From<CuFailure> for DeviceError {
    fn from(f: CuFailure) -> Self {
        DeviceError::Driver { call: f.call, code: f.code as i64, message: describe(f.code) }
    }
}

/// `NAME: description` from the driver, or the code's name alone when libcuda is not loaded.
fn describe(code: CUresult) -> String {
    let name = format!("{code:?}");
    if !DRIVER_LOADED.load(Ordering::Acquire) {
        return name;
    }
    let text = |get: unsafe fn(CUresult, *mut *const c_char) -> CUresult| {
        let mut s: *const c_char = ptr::null();
        // SAFETY: on success the driver points `s` at a static NUL-terminated string.
        let ok = unsafe { get(code, &mut s) } == CUresult::CUDA_SUCCESS && !s.is_null();
        ok.then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
    };
    match (text(sys::cuGetErrorName), text(sys::cuGetErrorString)) {
        (Some(n), Some(s)) => format!("{n}: {s}"),
        (Some(n), None) => n,
        _ => name,
    }
}

// ---------------------------------------------------------------------------------------------
// Loading the driver

/// Loads libcuda and checks its symbols; returns why not when it cannot.
fn load_driver() -> Result<(), String> {
    // SAFETY: loading libcuda runs only its initialisers; no symbol is called here.
    unsafe {
        if !sys::is_culib_present() {
            for path in FALLBACK_LIBCUDA {
                // The handle is leaked on purpose: the library must stay loaded for the
                // process so that cudarc's dlopen by soname finds it.
                if !libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL).is_null() {
                    break;
                }
            }
            if !sys::is_culib_present() {
                return Err("libcuda cannot be loaded: no NVIDIA driver on this machine, or its \
                            library directory is not on LD_LIBRARY_PATH"
                    .into());
            }
        }
        let lib = sys::culib();
        let missing: Vec<&str> =
            REQUIRED_SYMBOLS.iter().copied().filter(|name| lib.get::<unsafe extern "C" fn()>(*name).is_err()).collect();
        if !missing.is_empty() {
            return Err(format!(
                "libcuda lacks {}: the driver is older than this build (CUDA 13) needs",
                missing.join(", ")
            ));
        }
    }
    DRIVER_LOADED.store(true, Ordering::Release);
    Ok(())
}

/// Loads and initialises the driver once per process; the number of devices, or why none.
fn driver() -> Result<u32, DeviceError> {
    static PROBE: OnceLock<Result<u32, String>> = OnceLock::new();
    PROBE
        .get_or_init(|| {
            load_driver()?;
            let as_reason = |f: CuFailure| DeviceError::from(f).to_string();
            cu!(cuInit(0)).map_err(as_reason)?;
            let mut count: c_int = 0;
            cu!(cuDeviceGetCount(&mut count)).map_err(as_reason)?;
            match u32::try_from(count) {
                Ok(n) if n > 0 => Ok(n),
                _ => Err("the driver sees no CUDA device (check CUDA_VISIBLE_DEVICES)".into()),
            }
        })
        .clone()
        .map_err(|reason| DeviceError::Unavailable { reason })
}

/// Whether the CUDA backend can run here: libcuda loads, `cuInit` succeeds and at least one
/// device is visible. The answer is computed once per process, later calls are a load.
pub fn cuda_available() -> bool {
    driver().is_ok()
}

// ---------------------------------------------------------------------------------------------
// Handles and contexts

// Raw driver handles. The driver API is thread-safe and a context, stream or event handle is
// valid on every thread of the process (a call only needs the right context current, which
// `CtxGuard` provides), so moving and sharing these between threads is sound.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Ctx(sys::CUcontext);
unsafe impl Send for Ctx {}
unsafe impl Sync for Ctx {}

#[derive(Clone, Copy)]
struct Stream(sys::CUstream);
unsafe impl Send for Stream {}
unsafe impl Sync for Stream {}

#[derive(Clone, Copy)]
struct Event(sys::CUevent);
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

/// Makes a context current on this thread while it lives. A context the thread had before (the
/// application's) is put back on drop; a thread that had none keeps ours, so the progress thread
/// pays a single `cuCtxGetCurrent` per call once it has made its first.
struct CtxGuard {
    /// Context to put back; null when there is none.
    restore: sys::CUcontext,
}

impl CtxGuard {
    fn enter(ctx: Ctx) -> Result<Self, CuFailure> {
        let mut current: sys::CUcontext = ptr::null_mut();
        cu!(cuCtxGetCurrent(&mut current))?;
        if current == ctx.0 {
            return Ok(Self { restore: ptr::null_mut() });
        }
        cu!(cuCtxSetCurrent(ctx.0))?;
        Ok(Self { restore: current })
    }
}

impl Drop for CtxGuard {
    fn drop(&mut self) {
        if !self.restore.is_null() {
            // The work under the guard is done and has nowhere to report to; should this fail,
            // the thread keeps our context, which the application's next cudaSetDevice fixes.
            let _ = cu!(cuCtxSetCurrent(self.restore));
        }
    }
}

/// Locks, ignoring poisoning: no critical section here can leave its data half-updated.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

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
    /// Streams made from now on get the context's greatest priority
    /// ([`DeviceBackend::set_copy_priority`]).
    high_priority: AtomicBool,
}

/// A copy in flight. The newest copy on a stream has no event: it is finished when its
/// stream is idle (`cuStreamQuery`), so a lone copy, the latency case, costs one driver
/// call to issue rather than two. Issuing the next copy on that stream first records an
/// event behind it (see `copy_async`).
#[derive(Clone, Copy)]
struct Pending {
    dev: DevId,
    /// The stream it runs on and its slot; None for a zero-length copy (nothing to wait
    /// for) or one the copy server makes.
    stream: Option<(Stream, usize)>,
    event: Option<Event>,
    /// The copy server's sequence number for a copy it makes.
    served: Option<u64>,
}

/// The copies in flight, and per stream the one copy that has no event yet.
#[derive(Default)]
struct Tickets {
    /// Tickets are our own counter, not an adversary's input: a fast hasher is safe
    /// (every poll of a copy looks its ticket up).
    pending: FxHashMap<u64, Pending>,
    /// (device, stream slot) -> the newest copy issued there, which has no event.
    bare: FxHashMap<(DevId, usize), u64>,
    /// Per (device, stream slot): how far the stream has been seen finished. Its
    /// tickets increase in queue order because they are drawn under this lock.
    finished: FinishedThrough<(DevId, usize)>,
}

struct OpenMapping {
    handle: [u8; IPC_HANDLE_BYTES],
    /// Device whose context opened it: the one to close it in.
    on: DevId,
}

#[derive(Default)]
struct OpenHandles {
    /// Handle bytes to the local address of their mapping: the double-open check.
    by_handle: HashMap<[u8; IPC_HANDLE_BYTES], usize>,
    by_ptr: HashMap<usize, OpenMapping>,
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
}

fn to_raw_handle(h: &IpcHandle) -> sys::CUipcMemHandle {
    sys::CUipcMemHandle { reserved: h.0.map(|b| b as c_char) }
}

fn from_raw_handle(h: &sys::CUipcMemHandle) -> IpcHandle {
    IpcHandle(h.reserved.map(|c| c as u8))
}

/// Maps a failed `cuIpcOpenMemHandle` to what it means for the caller.
fn open_error(f: CuFailure) -> DeviceError {
    match f.code {
        // The driver's own double-open check, when the same allocation came with other bytes.
        CUresult::CUDA_ERROR_ALREADY_MAPPED => DeviceError::DoubleOpen { owner: 0, buffer_id: 0 },
        CUresult::CUDA_ERROR_INVALID_VALUE | CUresult::CUDA_ERROR_INVALID_HANDLE | CUresult::CUDA_ERROR_MAP_FAILED => {
            DeviceError::BadHandle { reason: DeviceError::from(f).to_string() }
        }
        _ => f.into(),
    }
}

/// Reports a failure during teardown, where there is no caller to return it to.
pub(super) fn warn_teardown<E: Into<DeviceError>>(r: Result<(), E>) {
    if let Err(e) = r {
        tracing::warn!("CUDA backend teardown: {}", e.into());
    }
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
        })
    }

    /// Whether the copy server, not the copy engine, makes the copy of `ticket` (false
    /// once the ticket has completed): for diagnostics and tests.
    pub fn copy_served(&self, ticket: CopyTicket) -> bool {
        lock(&self.tickets).pending.get(&ticket.0).is_some_and(|p| p.served.is_some())
    }

    /// Copies `len` bytes from `src` to `dst` on `engine` again and again, each waited
    /// for, until the copy server takes one (the first copy after the server was enabled
    /// or went idle goes to the engine and starts one; a backoff may delay that start):
    /// for diagnostics and tests. How many copies that took, or None after `limit`.
    pub fn copy_until_served(
        &self,
        engine: DevId,
        (dst, src, len): (usize, usize, usize),
        limit: std::time::Duration,
    ) -> Result<Option<u32>, DeviceError> {
        let start = std::time::Instant::now();
        for copies in 1.. {
            let t = self.copy_async(engine, 0, dst, src, len)?;
            let served = self.copy_served(t);
            while !self.copy_poll(t)? {
                std::hint::spin_loop();
            }
            if served {
                return Ok(Some(copies));
            }
            if start.elapsed() >= limit {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Ok(None)
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

    /// The priority of `d`'s new streams: the context's greatest, or the default (0);
    /// `d`'s context must be current.
    fn stream_priority(d: &Device) -> Result<c_int, DeviceError> {
        if !d.high_priority.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        cu!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest))?;
        Ok(greatest)
    }

    /// The stream in `slot` of `d`, created on first use; `d`'s context must be current.
    fn stream(d: &Device, slot: usize) -> Result<sys::CUstream, DeviceError> {
        let mut streams = lock(&d.streams);
        if let Some(Some(s)) = streams.get(slot) {
            return Ok(s.0);
        }
        let mut s: sys::CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        cu!(cuStreamCreateWithPriority(&mut s, flags, Self::stream_priority(d)?))?;
        if streams.len() <= slot {
            streams.resize_with(slot + 1, || None);
        }
        streams[slot] = Some(Stream(s));
        Ok(s)
    }

    /// An event from `d`'s pool, or a new one; `d`'s context must be current.
    fn take_event(d: &Device) -> Result<Event, DeviceError> {
        if let Some(ev) = lock(&d.events).pop() {
            return Ok(ev);
        }
        let mut ev: sys::CUevent = ptr::null_mut();
        cu!(cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint))?;
        Ok(Event(ev))
    }

    /// Queues a copy on stream `slot` of `dev`, then runs `then` with that stream while the
    /// context is still current. Unified addressing lets the driver work out the direction.
    /// With `after_app`, the copy also waits for the work the application queued so far
    /// on its legacy default stream (see [`DeviceBackend::copy_sync`]).
    fn enqueue<T>(
        &self,
        dev: DevId,
        slot: usize,
        (dst, src, len): (usize, usize, usize),
        after_app: bool,
        then: impl FnOnce(&Device, sys::CUstream) -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let d = self.device(dev)?;
        let _current = self.enter(dev)?;
        let stream = Self::stream(d, slot)?;
        if after_app {
            let ev = Self::take_event(d)?;
            // The wait takes the event's state now, so it can go back to the pool at once.
            let ordered =
                cu!(cuEventRecord(ev.0, LEGACY_STREAM)).and_then(|()| cu!(cuStreamWaitEvent(stream, ev.0, 0)));
            lock(&d.events).push(ev);
            ordered?;
        }
        cu!(cuMemcpyAsync(dst as CUdeviceptr, src as CUdeviceptr, len, stream))?;
        then(d, stream)
    }

    /// Queues a copy on stream `slot` of `engine`'s device (its context current).
    fn engine_copy(
        &self,
        engine: DevId,
        d: &Device,
        slot: usize,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<CopyTicket, DeviceError> {
        let stream = Self::stream(d, slot)?;
        // Held across the driver calls, so that the copy that gets an event below is still
        // the newest on the stream when the next one is queued behind it, and so that the
        // tickets of one stream increase in the order its copies are queued.
        let mut tickets = lock(&self.tickets);
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let t = &mut *tickets;
        if let Some(prev) = t.bare.remove(&(engine, slot)) {
            if let Some(p) = t.pending.get_mut(&prev) {
                // The event completes when every copy queued so far on the stream has, which
                // is when `prev`, the newest of them, has.
                let ev = Self::take_event(d)?;
                if let Err(f) = cu!(cuEventRecord(ev.0, stream)) {
                    lock(&d.events).push(ev);
                    t.bare.insert((engine, slot), prev);
                    return Err(f.into());
                }
                p.event = Some(ev);
            }
        }
        cu!(cuMemcpyAsync(dst as CUdeviceptr, src as CUdeviceptr, len, stream))?;
        t.pending.insert(id, Pending { dev: engine, stream: Some((Stream(stream), slot)), event: None, served: None });
        t.bare.insert((engine, slot), id);
        Ok(CopyTicket(id))
    }

    /// Posts a copy to `dev`'s copy server if it takes it: both ends in device memory `dev`
    /// reaches (the kernel cannot touch pageable host memory) and room in its ring. Its
    /// sequence number.
    fn serve(&self, dev: DevId, d: &Device, dst: usize, src: usize, len: usize) -> Result<Option<u64>, DeviceError> {
        // Device memory this device's kernels reach: its own, or a peer's with access
        // enabled. (A kernel's bad access would end the context; the engine's is an error.)
        // Both ends looked up under one lock of `known` (allocations and IPC mappings are
        // there); anything else is asked of the driver.
        let [dst_info, src_info] = {
            let known = lock(&self.known);
            [dst, src].map(|p| known_info(&known, p))
        };
        let reachable = |p, info: Option<PointerInfo>| match info.map_or_else(|| self.query_pointer(p), Ok) {
            Ok(PointerInfo { kind: MemoryKind::Device(on), .. }) => self.can_access_peer(dev, on),
            _ => false,
        };
        if !(reachable(dst, dst_info) && reachable(src, src_info)) {
            return Ok(None);
        }
        let mut server = lock(&d.server);
        let Some(server) = server.as_mut() else { return Ok(None) };
        server.post((dst, src, len), || self.enter(dev), std::time::Instant::now)
    }

    /// The device of the allocation that starts at `ptr`, for operations that need one.
    fn allocation_device(&self, op: &'static str, ptr: usize) -> Result<DevId, DeviceError> {
        match self.pointer_info(ptr)? {
            PointerInfo { kind: MemoryKind::Device(dev), base, .. } if base == ptr => Ok(dev),
            _ => Err(DeviceError::InvalidPointer { op, ptr, expected: "the start of a device allocation" }),
        }
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

    fn free(&self, ptr: usize) -> Result<(), DeviceError> {
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
        let dev = self.allocation_device("export_handle", base)?;
        let _current = self.enter(dev)?;
        let mut raw = sys::CUipcMemHandle { reserved: [0; IPC_HANDLE_BYTES] };
        cu!(cuIpcGetMemHandle(&mut raw, base as CUdeviceptr))?;
        Ok(from_raw_handle(&raw))
    }

    fn open_handle(&self, handle: &IpcHandle, on: DevId) -> Result<Mapping, DeviceError> {
        let ctx = self.ctx(on)?;
        // Held across the driver call so that two threads cannot both pass the check.
        let mut open = lock(&self.open);
        if open.by_handle.contains_key(&handle.0) {
            return Err(DeviceError::DoubleOpen { owner: 0, buffer_id: 0 });
        }
        let _current = CtxGuard::enter(ctx)?;
        let mut ptr: CUdeviceptr = 0;
        let lazy_peer = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as c_uint;
        cu!(cuIpcOpenMemHandle_v2(&mut ptr, to_raw_handle(handle), lazy_peer)).map_err(open_error)?;
        let mut base: CUdeviceptr = 0;
        let mut size: usize = 0;
        if let Err(f) = cu!(cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) {
            warn_teardown(cu!(cuIpcCloseMemHandle(ptr)));
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
                warn_teardown(cu!(cuIpcCloseMemHandle(ptr as CUdeviceptr)));
                return Err(e);
            }
        }
        open.by_handle.insert(handle.0, ptr);
        open.by_ptr.insert(ptr, OpenMapping { handle: handle.0, on });
        Ok(Mapping { ptr, size })
    }

    fn close_handle(&self, mapping: Mapping) -> Result<(), DeviceError> {
        let mut open = lock(&self.open);
        let Some(m) = open.by_ptr.get(&mapping.ptr) else {
            return Err(DeviceError::InvalidPointer {
                op: "close_handle",
                ptr: mapping.ptr,
                expected: "a mapping returned by open_handle",
            });
        };
        let (handle, on) = (m.handle, m.on);
        {
            let _current = self.enter(on)?;
            cu!(cuIpcCloseMemHandle(mapping.ptr as CUdeviceptr))?;
        }
        lock(&self.known).remove(&mapping.ptr);
        open.by_ptr.remove(&mapping.ptr);
        open.by_handle.remove(&handle);
        Ok(())
    }

    fn copy_async(
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
            if let Some(seq) = self.serve(engine, d, dst, src, len)? {
                let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
                let p = Pending { dev: engine, stream: None, event: None, served: Some(seq) };
                lock(&self.tickets).pending.insert(id, p);
                return Ok(CopyTicket(id));
            }
        }
        let slot = lane_slot(lane);
        let _current = self.enter(engine)?;
        let ticket = self.engine_copy(engine, d, slot, dst, src, len)?;
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

    /// Runs on a stream of its own and waits for it, rather than `cuMemcpy`: `cuMemcpy` on the
    /// legacy default stream returns before a device-to-device copy has landed, and waits
    /// for every blocking stream of the application in that context. The copy is ordered
    /// after what the application queued on its legacy default stream: a `cudaMemcpy` from
    /// pageable memory returns before its DMA has landed, and a copy of ours into the same
    /// buffer must not be overwritten by it afterwards (seen on 2x H200 with two ranks per
    /// GPU under the PMPI shim).
    fn copy_sync(&self, dst: usize, src: usize, len: usize) -> Result<(), DeviceError> {
        if len == 0 {
            return Ok(());
        }
        let mut dev = None;
        for p in [dst, src] {
            if let MemoryKind::Device(d) = self.pointer_info(p)?.kind {
                dev = Some(d);
                break;
            }
        }
        let dev = dev.unwrap_or_else(|| self.fallback_device());
        self.enqueue(dev, SYNC_SLOT, (dst, src, len), true, |_, stream| Ok(cu!(cuStreamSynchronize(stream))?))
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
        let mut server = lock(&d.server);
        if server.is_none() {
            let _current = self.enter(dev)?;
            *server = Some(CopyServer::new(idle, Self::stream_priority(d)?)?);
        }
        d.server_max.store(max_len, Ordering::Relaxed);
        Ok(())
    }

    fn set_copy_priority(&self, high: bool) -> Result<(), DeviceError> {
        for d in &self.devices {
            d.high_priority.store(high, Ordering::Relaxed);
        }
        Ok(())
    }

    fn register_host(&self, ptr: usize, len: usize) -> Result<(), DeviceError> {
        // PORTABLE: pinned for every context, so any device's engine may DMA it, whichever
        // context registered it.
        let _current = self.enter(self.fallback_device())?;
        Ok(cu!(cuMemHostRegister_v2(ptr as *mut c_void, len, sys::CU_MEMHOSTREGISTER_PORTABLE))
            .benign(CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)?)
    }

    fn unregister_host(&self, ptr: usize) -> Result<(), DeviceError> {
        let _current = self.enter(self.fallback_device())?;
        Ok(cu!(cuMemHostUnregister(ptr as *mut c_void)).benign(CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)?)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        let open = std::mem::take(self.open.get_mut().unwrap_or_else(PoisonError::into_inner));
        for (ptr, m) in open.by_ptr {
            warn_teardown(self.enter(m.on).and_then(|_current| Ok(cu!(cuIpcCloseMemHandle(ptr as CUdeviceptr))?)));
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

/// The attributes of the known allocation or mapping that holds `ptr`, if any.
fn known_info(known: &std::collections::BTreeMap<usize, PointerInfo>, ptr: usize) -> Option<PointerInfo> {
    let (_, info) = known.range(..=ptr).next_back()?;
    (ptr < info.base + info.size).then_some(*info)
}

impl CudaBackend {
    /// Asks the driver what `ptr` is.
    fn query_pointer(&self, ptr: usize) -> Result<PointerInfo, DeviceError> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_new_reports_unavailable_instead_of_panicking() {
        // On a machine without the driver (CI, this crate's build host) this takes the
        // Unavailable branch; on a GPU host both must agree that CUDA is there.
        match (cuda_available(), CudaBackend::try_new()) {
            (false, Err(DeviceError::Unavailable { reason })) => assert!(!reason.is_empty()),
            (true, Ok(b)) => assert!(b.device_count() > 0),
            (available, other) => {
                panic!("cuda_available() = {available} but try_new() = {:?}", other.err())
            }
        }
    }

    #[test]
    fn driver_errors_name_the_call_and_code() {
        let failure = CuFailure { call: "cuMemAlloc_v2", code: CUresult::CUDA_ERROR_OUT_OF_MEMORY };
        let err = DeviceError::from(failure);
        match &err {
            DeviceError::Driver { call, code, message } => {
                assert_eq!(*call, "cuMemAlloc_v2");
                assert_eq!(*code, 2);
                assert!(message.starts_with("CUDA_ERROR_OUT_OF_MEMORY"), "{message}");
            }
            other => panic!("not a driver error: {other:?}"),
        }
        assert!(err.to_string().starts_with("cuMemAlloc_v2 failed with 2: CUDA_ERROR_OUT_OF_MEMORY"));
    }

    #[test]
    fn benign_codes_count_as_success_and_others_do_not() {
        let code = CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
        let benign = check("cuCtxEnablePeerAccess", code).benign(code);
        assert_eq!(benign, Ok(()));
        let other = check("cuCtxEnablePeerAccess", CUresult::CUDA_ERROR_TOO_MANY_PEERS).benign(code);
        assert_eq!(other.unwrap_err().code, CUresult::CUDA_ERROR_TOO_MANY_PEERS);
    }

    #[test]
    fn ipc_handle_bytes_survive_the_driver_representation() {
        let mut bytes = [0u8; IPC_HANDLE_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = (i * 37 + 200) as u8;
        }
        let h = IpcHandle(bytes);
        assert_eq!(from_raw_handle(&to_raw_handle(&h)), h);
    }

    #[test]
    fn open_errors_keep_their_meaning() {
        let fail = |code| open_error(CuFailure { call: "cuIpcOpenMemHandle_v2", code });
        assert!(matches!(fail(CUresult::CUDA_ERROR_INVALID_VALUE), DeviceError::BadHandle { .. }));
        assert!(matches!(fail(CUresult::CUDA_ERROR_ALREADY_MAPPED), DeviceError::DoubleOpen { .. }));
        assert!(matches!(fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY), DeviceError::Driver { .. }));
    }

    /// Identifiers of driver functions called in the code (not the tests) of this file and
    /// of the copy server's.
    fn called_symbols() -> std::collections::BTreeSet<String> {
        let mut found = std::collections::BTreeSet::new();
        for (src, marker) in [include_str!("cuda.rs"), include_str!("copy_server.rs")]
            .into_iter()
            .flat_map(|src| [(src, "cu!("), (src, "sys::")])
        {
            let code = &src[..src.find("#[cfg(test)]").expect("test module")];
            for rest in code.split(marker).skip(1) {
                let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                let is_call = rest[name.len()..].starts_with('(');
                if name.starts_with("cu") && name != "culib" && (is_call || marker == "cu!(") {
                    found.insert(name);
                }
            }
        }
        // Passed as function values rather than called.
        found.extend(["cuGetErrorName", "cuGetErrorString"].map(String::from));
        found
    }

    #[test]
    fn every_called_symbol_is_checked_at_load() {
        let required: std::collections::BTreeSet<String> = REQUIRED_SYMBOLS.iter().map(|s| s.to_string()).collect();
        assert_eq!(called_symbols(), required);
    }

    // ---- Tests that need a GPU. Ignored here; run them on a GPU host with
    // `cargo test -p gpulmt --lib device::cuda -- --ignored --test-threads=1`.

    fn backend() -> CudaBackend {
        CudaBackend::try_new().expect("these tests need a CUDA GPU")
    }

    fn poll_until_done(b: &CudaBackend, t: CopyTicket) {
        while !b.copy_poll(t).expect("copy_poll") {
            std::hint::spin_loop();
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    /// Copies until the copy server of `engine` takes one; fails after 2 s.
    fn copy_by_server(b: &CudaBackend, engine: DevId, dst: usize, src: usize, len: usize) {
        let copies = b.copy_until_served(engine, (dst, src, len), std::time::Duration::from_secs(2)).unwrap();
        assert!(copies.is_some(), "the copy server never took a copy");
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_copy_server_makes_small_device_copies() {
        let b = backend();
        let idle = std::time::Duration::from_millis(2);
        b.enable_copy_server(0, 64 << 10, idle).unwrap();
        let len = 1 << 20;
        let (p, q) = (b.alloc(0, len).unwrap(), b.alloc(0, len).unwrap());
        let src = pattern(len, 3);
        b.copy_sync(p, src.as_ptr() as usize, len).unwrap();
        let mut back = vec![0u8; len];
        // Odd sizes and offsets take the byte loop, aligned ones the 16-byte loop.
        for (n, off) in [(1usize, 0usize), (8, 0), (13, 5), (4096, 0), (4099, 17), (65536, 64), (65536, 3)] {
            b.copy_sync(q, vec![0u8; len].as_ptr() as usize, len).unwrap();
            copy_by_server(&b, 0, q + off, p + off, n);
            b.copy_sync(back.as_mut_ptr() as usize, q, len).unwrap();
            assert!(back[off..off + n] == src[off..off + n], "{n} B at +{off}");
            assert!(
                back[..off].iter().chain(&back[off + n..]).all(|&x| x == 0),
                "{n} B at +{off}: nothing else written"
            );
        }
        // Above the limit, or from host memory: the copy engine.
        let t = b.copy_async(0, 0, q, p, (64 << 10) + 1).unwrap();
        assert!(!b.copy_served(t));
        poll_until_done(&b, t);
        let t = b.copy_async(0, 0, q, src.as_ptr() as usize, 64).unwrap();
        assert!(!b.copy_served(t));
        poll_until_done(&b, t);
        // A window larger than the ring: the overflow goes to the engine; every byte lands.
        copy_by_server(&b, 0, q, p, 8);
        b.copy_sync(q, vec![0u8; len].as_ptr() as usize, len).unwrap();
        let tickets: Vec<CopyTicket> =
            (0..256).map(|i| b.copy_async(0, 0, q + i * 4096, p + i * 4096, 4096).unwrap()).collect();
        let by_server = tickets.iter().filter(|&&t| b.copy_served(t)).count();
        // How many find room in the ring depends on how fast the server drains it.
        assert!(by_server >= 1, "{by_server} of 256 served");
        for t in tickets {
            poll_until_done(&b, t);
        }
        b.copy_sync(back.as_mut_ptr() as usize, q, len).unwrap();
        assert!(back == src, "window of 256");
        // After the server timed out, the next copy goes to the engine, which is not kept
        // waiting for a server to start, and starts one; a later copy finds it running.
        // (These servers make one copy each, so from the second round on the launch waits
        // for a backoff of 1, then 2 ms, which copy_by_server waits out.)
        for round in 0..3 {
            std::thread::sleep(idle * 3);
            let t = b.copy_async(0, 0, q, p + 8 * round, 8).unwrap();
            assert!(!b.copy_served(t), "after idle {round}: the engine takes the first copy");
            poll_until_done(&b, t);
            b.copy_sync(back.as_mut_ptr() as usize, q, 8).unwrap();
            assert_eq!(back[..8], src[8 * round..8 * round + 8], "after idle {round}");
            copy_by_server(&b, 0, q + 64, p + 64 + 8 * round, 8);
            b.copy_sync(back.as_mut_ptr() as usize, q + 64, 8).unwrap();
            assert_eq!(back[..8], src[64 + 8 * round..72 + 8 * round], "after idle {round}, by the server");
        }
        // Between devices: device 0's server writes device 1's memory (peer access).
        if b.device_count() > 1 && b.can_access_peer(0, 1) {
            let r = b.alloc(1, len).unwrap();
            copy_by_server(&b, 0, r + 8, p + 8, 4096);
            b.copy_sync(back.as_mut_ptr() as usize, r + 8, 4096).unwrap();
            assert!(back[..4096] == src[8..4104], "peer write");
            b.free(r).unwrap();
        }
        b.free(q).unwrap();
        b.free(p).unwrap();
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_copies_at_high_priority_land() {
        let b = backend();
        b.set_copy_priority(true).unwrap();
        let len = 1 << 16;
        let (p, q) = (b.alloc(0, len).unwrap(), b.alloc(0, len).unwrap());
        let src = pattern(len, 9);
        b.copy_sync(p, src.as_ptr() as usize, len).unwrap();
        let t = b.copy_async(0, 1, q, p, len).unwrap();
        poll_until_done(&b, t);
        let mut back = vec![0u8; len];
        b.copy_sync(back.as_mut_ptr() as usize, q, len).unwrap();
        assert!(back == src, "engine copy on a high-priority stream");
        // The server's stream is made at enable time, with the priority set above.
        b.enable_copy_server(0, len, std::time::Duration::from_millis(5)).unwrap();
        b.copy_sync(q, vec![0u8; len].as_ptr() as usize, len).unwrap();
        copy_by_server(&b, 0, q, p, len);
        b.copy_sync(back.as_mut_ptr() as usize, q, len).unwrap();
        assert!(back == src, "server copy launched on a high-priority stream");
        b.free(q).unwrap();
        b.free(p).unwrap();
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_backend_with_a_running_copy_server_drops() {
        let b = backend();
        b.enable_copy_server(0, 4096, std::time::Duration::from_secs(3600)).unwrap();
        let (p, q) = (b.alloc(0, 64).unwrap(), b.alloc(0, 64).unwrap());
        copy_by_server(&b, 0, q, p, 64);
        // The server would idle for an hour: dropping the backend must stop it, not wait.
        let started = std::time::Instant::now();
        drop(b);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_alloc_classify_copy_free() {
        let b = backend();
        let len = 1 << 20;
        let src = pattern(len, 7);
        let mut back = vec![0u8; len];
        b.register_host(src.as_ptr() as usize, len).unwrap();
        b.register_host(src.as_ptr() as usize, len).unwrap();
        for dev in 0..b.device_count() {
            let p = b.alloc(dev, len).unwrap();
            let info = b.pointer_info(p).unwrap();
            assert_eq!(info.kind, MemoryKind::Device(dev));
            assert_eq!((info.base, info.size), (p, len));
            assert_ne!(info.buffer_id, 0);
            assert_eq!(b.pointer_info(p + 4096).unwrap().base, p);
            // A fresh thread has no current context.
            let seen = std::thread::scope(|s| s.spawn(|| b.pointer_info(p)).join().unwrap());
            assert_eq!(seen.unwrap(), info);
            assert!(matches!(b.export_handle(p + 4096), Err(DeviceError::InvalidPointer { .. })));

            let q = b.alloc(dev, len).unwrap();
            b.copy_sync(p, src.as_ptr() as usize, len).unwrap();
            b.copy_sync(q, p, len).unwrap();
            back.fill(0);
            b.copy_sync(back.as_mut_ptr() as usize, q, len).unwrap();
            assert!(back == src, "sync round trip on device {dev}");

            // Two lanes, then the reverse direction issued from another thread.
            let t0 = b.copy_async(dev, 0, q, p, len / 2).unwrap();
            let t1 = b.copy_async(dev, 1, q + len / 2, p + len / 2, len / 2).unwrap();
            poll_until_done(&b, t0);
            poll_until_done(&b, t1);
            assert!(matches!(b.copy_poll(t0), Err(DeviceError::InvalidPointer { .. })));
            back.fill(0);
            let dst = back.as_mut_ptr() as usize;
            let t = std::thread::scope(|s| s.spawn(|| b.copy_async(dev, 0, dst, q, len).unwrap()).join().unwrap());
            poll_until_done(&b, t);
            assert!(back == src, "async round trip on device {dev}");

            let zero = b.copy_async(dev, 3, q, p, 0).unwrap();
            assert!(b.copy_poll(zero).unwrap());
            b.free(q).unwrap();
            b.free(p).unwrap();
            assert!(b.free(p).is_err());
        }
        let host = b.pointer_info(back.as_ptr() as usize).unwrap();
        assert_eq!(host, PointerInfo { kind: MemoryKind::Host, base: back.as_ptr() as usize, size: 0, buffer_id: 0 });
        assert_eq!(b.pointer_info(src.as_ptr() as usize).unwrap().kind, MemoryKind::Host);
        b.unregister_host(src.as_ptr() as usize).unwrap();
        b.unregister_host(src.as_ptr() as usize).unwrap();
        assert!(matches!(b.alloc(b.device_count(), 1), Err(DeviceError::NoSuchDevice { .. })));
    }

    #[test]
    #[ignore = "needs two CUDA GPUs"]
    fn gpu_peer_copies() {
        let b = backend();
        if b.device_count() < 2 {
            eprintln!("skipped: one device");
            return;
        }
        println!("peer 0->1: {}, 1->0: {}", b.can_access_peer(0, 1), b.can_access_peer(1, 0));
        let len = 64 << 20;
        let src = pattern(len, 3);
        let (a, c) = (b.alloc(0, len).unwrap(), b.alloc(1, len).unwrap());
        b.copy_sync(a, src.as_ptr() as usize, len).unwrap();
        for engine in [0, 1] {
            let mut back = vec![0u8; len];
            b.copy_sync(c, back.as_ptr() as usize, len).unwrap();
            let t = b.copy_async(engine, 0, c, a, len).unwrap();
            poll_until_done(&b, t);
            b.copy_sync(back.as_mut_ptr() as usize, c, len).unwrap();
            assert!(back == src, "peer copy driven by device {engine}");
        }
        let start = std::time::Instant::now();
        let reps = 20;
        for _ in 0..reps {
            let t = b.copy_async(0, 0, c, a, len).unwrap();
            poll_until_done(&b, t);
        }
        let gbps = (reps * len) as f64 / start.elapsed().as_secs_f64() / 1e9;
        println!("peer copy 0->1, {} MiB: {gbps:.1} GB/s", len >> 20);
        b.free(a).unwrap();
        b.free(c).unwrap();
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_window_of_copies_reports_each_only_once_landed() {
        // Only the newest copy of a stream goes without an event; the ones before it get
        // theirs when the next is queued. Whatever order they are polled in, a copy that
        // reports done must have landed, and a zero-length copy is done at once.
        let b = backend();
        let engine = (b.device_count() - 1).min(1);
        let (n, len) = (4, 32 << 20);
        let srcs: Vec<usize> = (0..n).map(|_| b.alloc(0, len).unwrap()).collect();
        let dsts: Vec<usize> = (0..n).map(|_| b.alloc(engine, len).unwrap()).collect();
        for (k, &s) in srcs.iter().enumerate() {
            b.copy_sync(s, pattern(len, k as u8 + 11).as_ptr() as usize, len).unwrap();
        }
        let zeros = vec![0u8; len];
        for (order, name) in [([3, 0, 2, 1], "newest first"), ([0, 1, 2, 3], "oldest first")] {
            for &d in &dsts {
                b.copy_sync(d, zeros.as_ptr() as usize, len).unwrap();
            }
            let tickets: Vec<CopyTicket> =
                (0..n).map(|k| b.copy_async(engine, 0, dsts[k], srcs[k], len).unwrap()).collect();
            let empty = b.copy_async(engine, 0, dsts[0], srcs[0], 0).unwrap();
            assert!(b.copy_poll(empty).unwrap(), "a zero-length copy is done at once");
            let mut left = order.to_vec();
            // The newest copy of the stream seen done so far: every older one is done too.
            let mut newest_done = None;
            while !left.is_empty() {
                left.retain(|&k| {
                    if !b.copy_poll(tickets[k]).unwrap() {
                        assert!(
                            newest_done.is_none_or(|n| n < k),
                            "{name}: copy {k} not done after copy {newest_done:?}"
                        );
                        return true;
                    }
                    newest_done = newest_done.max(Some(k));
                    let mut back = vec![0u8; len];
                    b.copy_sync(back.as_mut_ptr() as usize, dsts[k], len).unwrap();
                    assert!(back == pattern(len, k as u8 + 11), "{name}: copy {k} reported done before it landed");
                    false
                });
            }
            assert!(b.copy_poll(tickets[0]).is_err(), "a ticket is reported done once");
        }
        for p in srcs.into_iter().chain(dsts) {
            b.free(p).unwrap();
        }
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_copy_overhead() {
        let b = backend();
        let (p, q) = (b.alloc(0, 64).unwrap(), b.alloc(0, 64).unwrap());
        let reps = 20_000;
        let start = std::time::Instant::now();
        for _ in 0..reps {
            let t = b.copy_async(0, 0, q, p, 8).unwrap();
            poll_until_done(&b, t);
        }
        println!("8-byte copy_async + copy_poll: {:.2} us each", start.elapsed().as_secs_f64() * 1e6 / reps as f64);
        let t = b.copy_async(0, 0, q, p, 8).unwrap();
        let start = std::time::Instant::now();
        let polls = 20_000;
        for _ in 0..polls {
            let _ = b.copy_poll(t);
        }
        println!("copy_poll: {:.3} us each", start.elapsed().as_secs_f64() * 1e6 / polls as f64);
        b.free(p).unwrap();
        b.free(q).unwrap();
    }

    const IPC_ENV: &str = "GPULMT_TEST_CUDA_IPC";

    /// Parent half of the IPC test: exports an allocation and runs [`gpu_ipc_child`] in a child
    /// process (the driver refuses to open a handle in the process that exported it).
    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn gpu_ipc_across_processes() {
        let b = backend();
        let len = 3 << 20;
        let src = pattern(len, 11);
        let p = b.alloc(0, len).unwrap();
        b.copy_sync(p, src.as_ptr() as usize, len).unwrap();
        let handle = b.export_handle(p).unwrap();
        assert_eq!(b.export_handle(p).unwrap(), handle, "exporting twice gives the same bytes");
        let freed = b.alloc(0, len).unwrap();
        let stale = b.export_handle(freed).unwrap();
        b.free(freed).unwrap();
        let hex = |h: IpcHandle| h.0.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "device::cuda::tests::gpu_ipc_child", "--ignored", "--nocapture"])
            .env(IPC_ENV, format!("{}:{len}:{}:{}", hex(handle), b.device_count() - 1, hex(stale)))
            .status()
            .unwrap();
        assert!(status.success(), "child failed");
        b.free(p).unwrap();
    }

    #[test]
    #[ignore = "runs as the child of gpu_ipc_across_processes"]
    fn gpu_ipc_child() {
        let Ok(arg) = std::env::var(IPC_ENV) else {
            return;
        };
        let mut parts = arg.split(':');
        let parse = |hex: &str| {
            let mut bytes = [0u8; IPC_HANDLE_BYTES];
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
            }
            IpcHandle(bytes)
        };
        let handle = parse(parts.next().unwrap());
        let len: usize = parts.next().unwrap().parse().unwrap();
        let on: DevId = parts.next().unwrap().parse().unwrap();
        let stale = parse(parts.next().unwrap());
        let b = backend();
        let m = b.open_handle(&handle, on).unwrap();
        assert!(m.size >= len, "mapping {} bytes for an allocation of {len}", m.size);
        assert!(matches!(b.open_handle(&handle, on), Err(DeviceError::DoubleOpen { .. })));
        let info = b.pointer_info(m.ptr).unwrap();
        println!("mapped on device {on}: {info:?}");
        // The answer kept for the mapping's lifetime is the driver's.
        assert_eq!(info, b.query_pointer(m.ptr + 1).unwrap());
        assert_eq!(info.base, m.ptr);
        let mut back = vec![0u8; len];
        let t = b.copy_async(on, 0, back.as_mut_ptr() as usize, m.ptr, len).unwrap();
        poll_until_done(&b, t);
        assert!(back == pattern(len, 11), "data through the IPC mapping");
        b.close_handle(m).unwrap();
        // Forgotten with the mapping: the address is nobody's now.
        assert_eq!(b.pointer_info(m.ptr).unwrap().kind, MemoryKind::Host);
        assert!(matches!(b.close_handle(m), Err(DeviceError::InvalidPointer { .. })));
        let again = b.open_handle(&handle, on).unwrap();
        b.close_handle(again).unwrap();
        let mut forged = handle;
        forged.0[8..40].fill(0xa5);
        let forged = b.open_handle(&forged, on);
        println!("forged handle: {forged:?}");
        assert!(forged.is_err());
        let stale = b.open_handle(&stale, on);
        println!("handle of a freed allocation: {stale:?}");
        assert!(stale.is_err());
    }
}
