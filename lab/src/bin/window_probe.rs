//! window_probe: what one CPU pays to issue a window of copies, and how fast the window
//! lands, copy by copy or as one batch.
//!
//! osu_bw D D reads 0.69-0.78 of the copy engine from 64 to 256 KiB on 2x H200: copy_probe
//! prices one `cuMemcpyAsync` on an idle stream at 2-4 us of CPU, so a window of 64 KiB
//! copies is issued slower than the engine moves it. This measures the issue cost inside a
//! window (the stream already busy) and the alternative CUDA 12.8 added,
//! `cuMemcpyBatchAsync`, which queues many copies in one call. For each size and window:
//! `memcpy` (one `cuMemcpyAsync` per copy), `batch` (one `cuMemcpyBatchAsync` for the window),
//! `batch8` (batches of 8, what a progress pass that found 8 requests would issue), each
//! followed by one event and its wait. Per window it reports the CPU time of the issue per
//! copy and the GB/s from the first issue to the event seen done. Local copies on device 0,
//! and GPU0 -> GPU1 peer copies (engine of device 0) when two devices with peer access exist.
//! Prints CSV `probe,route,variant,bytes,window,issue_us_per_copy,gbps` (medians of the reps).
//! Run: `window_probe [--reps 50]`.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use gpulmt::device::cuda::CudaBackend;
use gpulmt::device::DeviceBackend;
use gpulmt_lab::spin_until_ready;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// How a window's copies are queued.
#[derive(Clone, Copy)]
enum Issue {
    PerCopy,
    Batch(usize),
}

/// A device's primary context with a non-blocking stream and a timing-free event.
struct Setup {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    event: CudaEvent,
}

fn setup(ordinal: usize) -> Setup {
    let ctx = CudaContext::new(ordinal).expect("retaining the primary context");
    let stream = ctx.new_stream().expect("cuStreamCreate");
    let event = ctx.new_event(None).expect("cuEventCreate");
    Setup { ctx, stream, event }
}

/// Queues `n` copies of `len` bytes (copy i from `src + i*len` to `dst + i*len`) the way
/// `how` says; returns the CPU time of the queueing in us.
fn issue(s: &Setup, how: Issue, dst: CUdeviceptr, src: CUdeviceptr, len: usize, n: usize) -> f64 {
    let stream = s.stream.cu_stream();
    let x = Instant::now();
    match how {
        Issue::PerCopy => {
            for i in 0..n {
                let off = (i * len) as CUdeviceptr;
                // SAFETY: the caller's buffers hold `n * len` bytes; `stream` is `s`'s own.
                unsafe { sys::cuMemcpyAsync(dst + off, src + off, len, stream) }.result().expect("cuMemcpyAsync");
            }
        }
        Issue::Batch(b) => {
            let mut i = 0;
            while i < n {
                let k = b.min(n - i);
                let mut dsts: Vec<CUdeviceptr> = (i..i + k).map(|j| dst + (j * len) as CUdeviceptr).collect();
                let mut srcs: Vec<CUdeviceptr> = (i..i + k).map(|j| src + (j * len) as CUdeviceptr).collect();
                let mut sizes = vec![len; k];
                let mut attrs = [batch_attrs()];
                let mut idx = [0usize];
                // SAFETY: `k` entries in each array, one attribute applying from copy 0; the
                // caller's buffers hold `n * len` bytes; `stream` is `s`'s own.
                unsafe {
                    sys::cuMemcpyBatchAsync_v2(
                        dsts.as_mut_ptr(),
                        srcs.as_mut_ptr(),
                        sizes.as_mut_ptr(),
                        k,
                        attrs.as_mut_ptr(),
                        idx.as_mut_ptr(),
                        1,
                        stream,
                    )
                }
                .result()
                .expect("cuMemcpyBatchAsync");
                i += k;
            }
        }
    }
    x.elapsed().as_secs_f64() * 1e6
}

/// One attribute for every copy of a batch: stream order for the sources, no hints.
fn batch_attrs() -> sys::CUmemcpyAttributes {
    // SAFETY: a plain C struct of enums and integers; all-zero is a valid value of each
    // field before the ones that matter are set.
    let mut a: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
    a.srcAccessOrder = sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    a
}

fn run(route: &str, s: &Setup, dst: CUdeviceptr, src: CUdeviceptr, reps: usize) {
    s.ctx.bind_to_thread().expect("cuCtxSetCurrent");
    let (stream, event) = (s.stream.cu_stream(), s.event.cu_event());
    for &len in &[65536usize, 262144, 1 << 20] {
        for &window in &[8usize, 64] {
            for (name, how) in
                [("memcpy", Issue::PerCopy), ("batch", Issue::Batch(window)), ("batch8", Issue::Batch(8))]
            {
                let mut per_copy = Vec::with_capacity(reps);
                let mut gbps = Vec::with_capacity(reps);
                for r in 0..reps + 5 {
                    let start = Instant::now();
                    let us = issue(s, how, dst, src, len, window);
                    // SAFETY: `event` and `stream` are `s`'s own, its context current.
                    unsafe { sys::cuEventRecord(event, stream) }.result().expect("cuEventRecord");
                    // SAFETY: as above.
                    spin_until_ready("cuEventQuery", || unsafe { sys::cuEventQuery(event) });
                    let secs = start.elapsed().as_secs_f64();
                    if r >= 5 {
                        per_copy.push(us / window as f64);
                        gbps.push((len * window) as f64 / secs / 1e9);
                    }
                }
                println!("window_probe,{route},{name},{len},{window},{:.3},{:.2}", median(per_copy), median(gbps));
            }
        }
    }
}

fn main() {
    gpulmt::logging::init("warn");
    let reps: usize = match std::env::args().nth(1).as_deref() {
        Some("--reps") => std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(50),
        _ => 50,
    };
    let b = match CudaBackend::try_new() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("window_probe: needs the CUDA backend: {e}");
            std::process::exit(1);
        }
    };
    let bytes = 64 << 20;
    let a0 = b.alloc(0, bytes).expect("alloc on device 0") as CUdeviceptr;
    let a0b = b.alloc(0, bytes).expect("alloc on device 0") as CUdeviceptr;
    println!("probe,route,variant,bytes,window,issue_us_per_copy,gbps");
    let d0 = setup(0);
    run("local", &d0, a0b, a0, reps);
    if b.device_count() >= 2 && b.can_access_peer(0, 1) {
        let a1 = b.alloc(1, bytes).expect("alloc on device 1") as CUdeviceptr;
        d0.ctx.bind_to_thread().expect("cuCtxSetCurrent");
        run("peer_push", &d0, a1, a0, reps);
        let d1 = setup(1);
        run("peer_pull", &d1, a1, a0, reps);
    }
}
