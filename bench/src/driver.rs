//! Helpers shared by the probes (`copy_probe`, `window_probe`, `server_probe`), which
//! time single driver calls and so call the driver directly rather than through gpulmt's
//! backend: raw driver calls, each exiting the program on failure with the call's name (a
//! probe has nothing to recover), and the timing of an operation into a CSV row.

use std::ffi::c_uint;
use std::ptr;

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};

/// Exits with `what` and the driver's code unless `r` is success.
pub fn ck(what: &str, r: CUresult) {
    if r != CUresult::CUDA_SUCCESS {
        let me = std::env::args().next().unwrap_or_default();
        let me = std::path::Path::new(&me).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        eprintln!("{me}: {what} failed: {r:?}");
        std::process::exit(1);
    }
}

/// Retains the primary context of device `ordinal` (the one gpulmt's backend and the
/// CUDA runtime use) and makes it current; returns it with a non-blocking stream of its own.
pub fn primary_context(ordinal: i32) -> (sys::CUcontext, sys::CUstream) {
    // SAFETY: out-pointers are locals; every result is checked.
    unsafe {
        let mut cu = 0;
        ck("cuDeviceGet", sys::cuDeviceGet(&mut cu, ordinal));
        let mut ctx = ptr::null_mut();
        ck("cuDevicePrimaryCtxRetain", sys::cuDevicePrimaryCtxRetain(&mut ctx, cu));
        ck("cuCtxSetCurrent", sys::cuCtxSetCurrent(ctx));
        (ctx, nonblocking_stream())
    }
}

/// A new non-blocking stream in the current context.
pub fn nonblocking_stream() -> sys::CUstream {
    let mut stream = ptr::null_mut();
    // SAFETY: out-pointer is a local.
    ck("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut stream, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint)
    });
    stream
}

/// A new non-blocking stream in the current context at its greatest priority: the block
/// scheduler dispatches its work ahead of pending blocks of normal-priority kernels.
pub fn high_priority_stream() -> sys::CUstream {
    let (mut least, mut greatest) = (0, 0);
    let mut stream = ptr::null_mut();
    // SAFETY: out-pointers are locals.
    unsafe {
        ck("cuCtxGetStreamPriorityRange", sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest));
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        ck("cuStreamCreateWithPriority", sys::cuStreamCreateWithPriority(&mut stream, flags, greatest));
    }
    stream
}

/// A timing-free event in the current context.
pub fn event() -> sys::CUevent {
    let mut event = ptr::null_mut();
    // SAFETY: out-pointer is a local.
    ck("cuEventCreate", unsafe {
        sys::cuEventCreate(&mut event, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint)
    });
    event
}

/// Zeroed pinned host memory every context can use, mapped for the device: its host and
/// device addresses.
pub fn pinned(bytes: usize) -> (*mut u8, CUdeviceptr) {
    // SAFETY: out-pointers are locals; the allocation is `bytes` long.
    unsafe {
        let mut host = ptr::null_mut();
        ck(
            "cuMemHostAlloc",
            sys::cuMemHostAlloc(&mut host, bytes, sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP),
        );
        ptr::write_bytes(host.cast::<u8>(), 0, bytes);
        let mut dev = 0;
        ck("cuMemHostGetDevicePointer", sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0));
        (host.cast(), dev)
    }
}

/// Polls `s` until it is idle.
// The handle is the driver's, created by the probe and only passed back to it; Rust never
// dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn spin_stream(s: sys::CUstream) {
    loop {
        // SAFETY: a stream the caller created.
        match unsafe { sys::cuStreamQuery(s) } {
            CUresult::CUDA_SUCCESS => return,
            CUresult::CUDA_ERROR_NOT_READY => std::hint::spin_loop(),
            r => ck("cuStreamQuery", r),
        }
    }
}

/// Runs `op` `warm + reps` times; the host-timed microseconds of the last `reps`.
pub fn timed(warm: usize, reps: usize, mut op: impl FnMut()) -> Vec<f64> {
    let mut t = Vec::with_capacity(reps);
    for i in 0..warm + reps {
        let x = std::time::Instant::now();
        op();
        if i >= warm {
            t.push(x.elapsed().as_secs_f64() * 1e6);
        }
    }
    t
}

/// Prints `probe,variant,median,mean,p90` of the samples (microseconds).
pub fn print_row(probe: &str, variant: &str, mut t: Vec<f64>) {
    let mean = t.iter().sum::<f64>() / t.len() as f64;
    t.sort_by(f64::total_cmp);
    println!("{probe},{variant},{:.3},{mean:.3},{:.3}", t[t.len() / 2], t[t.len() * 9 / 10]);
}
