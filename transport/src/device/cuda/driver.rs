//! The driver underneath the CUDA backend: loading libcuda and checking its symbols, calling
//! it ([`cu!`] and [`CuFailure`]), and the handles of contexts, streams and events with the
//! guard that makes a context current.

use std::ffi::{c_char, c_int, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::driver::sys::{self, CUresult};

use crate::device::DeviceError;

/// Calls `sys::$f(..)` and checks its result, naming the call by its own identifier so that an
/// error can never name the wrong function.
macro_rules! cu {
    ($f:ident($($arg:expr),* $(,)?)) => {
        check(
            stringify!($f),
            // SAFETY: the driver and every symbol called through this macro were checked
            // present before the first call (`driver`, `REQUIRED_SYMBOLS`). Every use passes
            // values, pointers to locals that outlive the call, or addresses of memory that
            // the enclosing `unsafe fn`'s contract keeps valid for the driver's access
            // (copies, host registration, the copy server's descriptors).
            unsafe { sys::$f($($arg),*) },
        )
    };
}
pub(super) use cu;

/// Driver symbols this file calls (through [`cu!`] or `sys::` directly). cudarc resolves each
/// lazily and panics if it is missing, so all are checked when the driver is loaded; a unit test
/// keeps this list and the calls in step.
pub(super) const REQUIRED_SYMBOLS: &[&str] = &[
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
    "cuMemcpy",
    "cuMemcpy2DAsync_v2",
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
    // Memory of every kind (kinds.rs).
    "cuPointerGetAttribute",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuMemAllocManaged",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAccess",
    "cuMemPoolExportToShareableHandle",
    "cuMemPoolExportPointer",
    "cuMemPoolImportFromShareableHandle",
    "cuMemPoolImportPointer",
    "cuMemGetAllocationGranularity",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemCreate",
    "cuMemRelease",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
    "cuMemRetainAllocationHandle",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
];

/// Where container runtimes mount the driver library. Loading it by path makes cudarc's later
/// `dlopen("libcuda.so.1")` find it by soname even when that directory is not on the loader's
/// search path.
pub(super) const FALLBACK_LIBCUDA: &[&CStr] = &[c"/usr/local/nvidia/lib64/libcuda.so.1", c"/usr/lib64/libcuda.so.1"];

/// Set once libcuda and all [`REQUIRED_SYMBOLS`] are known present: only then may an error be
/// described through `cuGetErrorName`/`cuGetErrorString`.
pub(super) static DRIVER_LOADED: AtomicBool = AtomicBool::new(false);

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

pub(super) trait Benign {
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
pub(super) fn describe(code: CUresult) -> String {
    let name = format!("{code:?}");
    if !DRIVER_LOADED.load(Ordering::Acquire) {
        return name;
    }
    let text = |get: unsafe fn(CUresult, *mut *const c_char) -> CUresult| {
        let mut s: *const c_char = ptr::null();
        // SAFETY: on success the driver points `s` at a static NUL-terminated string.
        let ok = unsafe { get(code, &mut s) } == CUresult::CUDA_SUCCESS && !s.is_null();
        // SAFETY: `s` is that static string (checked non-null just above).
        ok.then(|| unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
    };
    match (text(sys::cuGetErrorName), text(sys::cuGetErrorString)) {
        (Some(n), Some(s)) => format!("{n}: {s}"),
        (Some(n), None) => n,
        _ => name,
    }
}

/// Loads libcuda and checks its symbols; returns why not when it cannot.
pub(super) fn load_driver() -> Result<(), String> {
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
pub(super) fn driver() -> Result<u32, DeviceError> {
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

// Raw driver handles. The driver API is thread-safe and a context, stream or event handle is
// valid on every thread of the process (a call only needs the right context current, which
// `CtxGuard` provides), so moving and sharing these between threads is sound.

/// A context handle.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Ctx(pub(super) sys::CUcontext);
// SAFETY: a context handle is valid on every thread of the process (see above).
unsafe impl Send for Ctx {}
// SAFETY: as for Send; the handle is only read.
unsafe impl Sync for Ctx {}

/// A stream handle.
#[derive(Clone, Copy)]
pub(super) struct Stream(pub(super) sys::CUstream);
// SAFETY: a stream handle is valid on every thread of the process (see above).
unsafe impl Send for Stream {}
// SAFETY: as for Send; the handle is only read.
unsafe impl Sync for Stream {}

/// An event handle.
#[derive(Clone, Copy)]
pub(super) struct Event(pub(super) sys::CUevent);
// SAFETY: an event handle is valid on every thread of the process (see above).
unsafe impl Send for Event {}
// SAFETY: as for Send; the handle is only read.
unsafe impl Sync for Event {}

/// Makes a context current on this thread while it lives. A context the thread had before (the
/// application's) is put back on drop; a thread that had none keeps ours, so the progress thread
/// pays a single `cuCtxGetCurrent` per call once it has made its first.
pub(super) struct CtxGuard {
    /// Context to put back; null when there is none.
    pub(super) restore: sys::CUcontext,
}

impl CtxGuard {
    pub(super) fn enter(ctx: Ctx) -> Result<Self, CuFailure> {
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
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reports a failure during teardown, where there is no caller to return it to.
pub(super) fn warn_teardown<E: Into<DeviceError>>(r: Result<(), E>) {
    if let Err(e) = r {
        tracing::warn!("CUDA backend teardown: {}", e.into());
    }
}
