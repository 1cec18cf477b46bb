//! server_probe: what a small copy costs when a kernel already running on the GPU makes it,
//! against the copy engine, in the same process and run.
//!
//! A small device message through the copy engine costs a driver call to issue (1.5-2 us of
//! CPU), the engine's start, and a driver query that reports it finished (1.3-1.5 us):
//! 6.6-6.9 us on 2x H200 (copy_probe), which is most of osu_latency's 8 B D D. A kernel
//! launched per copy was slower (copy_probe's `kernel_*`: `cuLaunchKernel` alone 3 us).
//! Here one block of a *persistent* kernel (a copy server) polls a descriptor in pinned
//! host memory; the host writes source, destination and length, then a sequence number
//! (release); the block copies, fences system-wide and stores the sequence number into a
//! pinned completion word that the host polls with plain loads. No driver call is on the
//! path. Rows (median, mean, p90 of 2000 after 200 warm-ups, host-timed, CSV
//! `probe,variant,median_us,mean_us,p90_us`):
//!
//! - `engine_<where>`: `cuMemcpyAsync` + `cuStreamQuery` until done (the baseline);
//! - `engine_hi_<where>`: the same on a stream of the context's greatest priority;
//! - `server_<where>`: the server's copy, descriptor written to completion word seen;
//! - `gpulmt_<where>`: gpulmt's own copy server (`GPULMT_COPY_SERVER_MAX`) through the
//!   backend, `copy_async` + `copy_poll` until done: the path the transport takes;
//! - `<where>`: `local` (within device 0), and with two peer-accessible devices `push`
//!   (device 0's server writes device 1's memory) and `pull` (device 1's server reads
//!   device 0's).
//!
//! The data of every server copy is checked at the end of each variant. Run:
//! `server_probe [bytes...]` (default 8 4096 65536).
//!
//! `SERVER_READS_IN_FLIGHT=1|2|4` replaces the probe server by one that keeps that many
//! reads of the descriptor in flight (see the kernel), for the `server_` rows.
//!
//! `SERVER_HOLD_MS=N server_probe` instead keeps gpulmt's copy server resident (polling,
//! idle) on device 0 for N ms and exits: run beside another program, it shows what a
//! resident server costs that program's kernels.

use std::sync::atomic::{compiler_fence, Ordering};
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{result, CudaContext, CudaStream, PinnedHostSlice};
use gpulmt::device::cuda::CudaBackend;
use gpulmt::device::DeviceBackend;
use gpulmt_lab::{mapped_pinned, print_row, spin_until_ready};

const WARM: usize = 200;
const REPS: usize = 2000;

const SERVER_SOURCE: &str = r#"
__device__ __forceinline__ unsigned long long probe_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The block copies len bytes, then thread 0 stamps the time and stores seq into the
// completion word. Without fence_all, the barrier orders every thread's stores before
// thread 0's system-scope release (cumulativity), which publishes them with the word.
__device__ __forceinline__ void copy_and_publish(unsigned long long dst, unsigned long long src, unsigned long long len,
                                                 int fence_all, unsigned long long* gpu_ns, unsigned int* done,
                                                 unsigned long long seq) {
    if (((dst | src | len) & 15) == 0) {
        uint4* d = (uint4*)dst;
        const uint4* x = (const uint4*)src;
        for (unsigned long long i = threadIdx.x; i < len / 16; i += blockDim.x) d[i] = x[i];
    } else {
        unsigned char* d = (unsigned char*)dst;
        const unsigned char* x = (const unsigned char*)src;
        for (unsigned long long i = threadIdx.x; i < len; i += blockDim.x) d[i] = x[i];
    }
    if (fence_all) __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) {
        gpu_ns[1] = probe_now();
        asm volatile("st.release.sys.global.u32 [%0], %1;" :: "l"(done), "r"((unsigned int)seq) : "memory");
    }
    __syncthreads();
}

// desc: [dst, src, len, tag] in pinned host memory, tag = seq ^ dst ^ src ^ len, written
// last. Lanes 0-3 of warp 0 read the four words in one coalesced load (one PCIe read, not
// four); the tag proves the words belong together, so a read torn against the host's
// writes is simply repeated. len = ~0 stops the server.
extern "C" __global__ void copy_server(const volatile unsigned long long* desc, unsigned int* done,
                                       int fence_all, unsigned long long* gpu_ns) {
    __shared__ unsigned long long s_dst, s_src, s_len;
    unsigned long long seq = 0;
    for (;;) {
        seq += 1;
        if (threadIdx.x < 32) {
            for (;;) {
                unsigned long long v = threadIdx.x < 4 ? desc[threadIdx.x] : 0;
                unsigned long long dst = __shfl_sync(0xffffffffu, v, 0);
                unsigned long long src = __shfl_sync(0xffffffffu, v, 1);
                unsigned long long len = __shfl_sync(0xffffffffu, v, 2);
                unsigned long long tag = __shfl_sync(0xffffffffu, v, 3);
                if ((tag ^ dst ^ src ^ len) == seq) {
                    if (threadIdx.x == 0) {
                        gpu_ns[0] = probe_now();
                        s_dst = dst;
                        s_src = src;
                        s_len = len;
                    }
                    break;
                }
            }
        }
        __syncthreads();
        unsigned long long len = s_len;
        if (len == ~0ull) return;
        copy_and_publish(s_dst, s_src, len, fence_all, gpu_ns, done, seq);
    }
}

// The same server with `D` reads of the descriptor in flight (SERVER_READS_IN_FLIGHT=D):
// warp 0 issues them `spacing_ns / D` apart and re-issues each as soon as it has been
// checked, also the one that found a copy, so D reads stay in flight through the copy
// too, hoping to see a descriptor about one read's latency after it is written, not up to
// two. Measured slower for every D (docs/performance.md, "Tried and dropped"): each read left
// in flight delays the copy's completion (D = 1 against the server above, which has none
// in flight while it copies, shows it).
template <int D>
__device__ void serve_pipelined(const volatile unsigned long long* desc, unsigned int* done, int fence_all,
                                unsigned long long* gpu_ns, unsigned long long spacing_ns) {
    __shared__ unsigned long long s_dst, s_src, s_len;
    const unsigned int lane = threadIdx.x;
    unsigned long long v[D];
    if (lane < 32) {
#pragma unroll
        for (int k = 0; k < D; k++) {
            if (k > 0) {
                unsigned long long t0 = probe_now();
                while (probe_now() - t0 < spacing_ns / D) {}
            }
            v[k] = lane < 4 ? desc[lane] : 0;
        }
    }
    unsigned long long seq = 0;
    for (;;) {
        seq += 1;
        if (lane < 32) {
            bool found = false;
            while (!found) {
#pragma unroll
                for (int k = 0; k < D; k++) {
                    if (!found) {
                        unsigned long long x = v[k];
                        unsigned long long dst = __shfl_sync(0xffffffffu, x, 0);
                        unsigned long long src = __shfl_sync(0xffffffffu, x, 1);
                        unsigned long long len = __shfl_sync(0xffffffffu, x, 2);
                        unsigned long long tag = __shfl_sync(0xffffffffu, x, 3);
                        if ((tag ^ dst ^ src ^ len) == seq) {
                            found = true;
                            if (lane == 0) {
                                gpu_ns[0] = probe_now();
                                s_dst = dst;
                                s_src = src;
                                s_len = len;
                            }
                        }
                        v[k] = lane < 4 ? desc[lane] : 0;
                    }
                }
            }
        }
        __syncthreads();
        unsigned long long len = s_len;
        if (len == ~0ull) return;
        copy_and_publish(s_dst, s_src, len, fence_all, gpu_ns, done, seq);
    }
}

#define PIPELINED(D) \
    extern "C" __global__ void copy_server_pipelined##D(const volatile unsigned long long* desc, unsigned int* done, \
            int fence_all, unsigned long long* gpu_ns, unsigned long long spacing_ns) { \
        serve_pipelined<D>(desc, done, fence_all, gpu_ns, spacing_ns); \
    }
PIPELINED(1)
PIPELINED(2)
PIPELINED(4)
"#;

fn row(variant: &str, t: Vec<f64>) {
    print_row("server_probe", variant, t);
}

fn timed(op: impl FnMut()) -> Vec<f64> {
    gpulmt_lab::timed(WARM, REPS, op)
}

/// A device's primary context (retained by the backend, peer access enabled) with a
/// non-blocking stream, and the copy server running on another.
struct Server {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// A stream of the greatest priority, for the `engine_hi` rows.
    hi_stream: Arc<CudaStream>,
    server_stream: Arc<CudaStream>,
    /// Pinned descriptor `[dst, src, len, tag]`: the allocation, host and device addresses.
    desc: (PinnedHostSlice<u64>, *mut u64, CUdeviceptr),
    /// Pinned completion word.
    done: (PinnedHostSlice<u32>, *mut u32, CUdeviceptr),
    /// Pinned GPU timestamps (ns): descriptor seen, copy done (before the word's store).
    gpu_ns: (PinnedHostSlice<u64>, *mut u64, CUdeviceptr),
    seq: u64,
}

impl Server {
    /// Starts the server kernel `kernel` of the compiled `ptx` (its `spacing_ns` only for
    /// the pipelined ones).
    fn start(ordinal: usize, ptx: &cudarc::nvrtc::Ptx, kernel: &str, fence_all: bool, spacing_ns: u64) -> Server {
        let ctx = CudaContext::new(ordinal).expect("retaining the primary context");
        let stream = ctx.new_stream().expect("cuStreamCreate");
        let server_stream = ctx.new_stream().expect("cuStreamCreate");
        let (_, greatest) = result::stream::get_priority_range().expect("cuCtxGetStreamPriorityRange");
        let hi_stream = ctx.new_stream_with_priority(greatest).expect("cuStreamCreateWithPriority");
        let f = ctx.load_module(ptx.clone()).expect("cuModuleLoadData").load_function(kernel).expect(kernel);
        let desc = mapped_pinned::<u64>(&ctx, 8);
        let done = mapped_pinned::<u32>(&ctx, 16);
        let gpu_ns = mapped_pinned::<u64>(&ctx, 8);
        let (mut a0, mut a1, mut a2, mut a3, mut a4) = (desc.2, done.2, i32::from(fence_all), gpu_ns.2, spacing_ns);
        // The first kernel takes four arguments; the driver reads as many as it takes.
        let mut args: [*mut std::ffi::c_void; 5] = [
            (&mut a0 as *mut CUdeviceptr).cast(),
            (&mut a1 as *mut CUdeviceptr).cast(),
            (&mut a2 as *mut i32).cast(),
            (&mut a3 as *mut CUdeviceptr).cast(),
            (&mut a4 as *mut u64).cast(),
        ];
        // SAFETY: every argument points at a live local of the kernel's parameter type (the
        // four-parameter kernel reads the first four); the buffers they name are pinned
        // allocations the returned `Server` keeps alive while the kernel runs.
        unsafe {
            result::launch_kernel(f.cu_function(), (1, 1, 1), (128, 1, 1), 0, server_stream.cu_stream(), &mut args)
        }
        .expect("cuLaunchKernel");
        Server { ctx, stream, hi_stream, server_stream, desc, done, gpu_ns, seq: 0 }
    }

    /// Has the server copy `len` bytes and waits until it reports them landed.
    fn copy(&mut self, dst: usize, src: usize, len: usize) {
        self.post(dst as u64, src as u64, len as u64);
        // SAFETY: the completion word is a live pinned allocation of this server.
        while unsafe { self.done.1.read_volatile() } != self.seq as u32 {
            std::hint::spin_loop();
        }
        compiler_fence(Ordering::Acquire);
    }

    /// Writes the next descriptor: the fields, then the tag that makes them valid.
    fn post(&mut self, dst: u64, src: u64, len: u64) {
        self.seq += 1;
        let d = self.desc.1;
        // SAFETY: the descriptor is a live pinned allocation of 8 u64s of this server.
        unsafe {
            d.write_volatile(dst);
            d.add(1).write_volatile(src);
            d.add(2).write_volatile(len);
            // The fields before the tag (x86 keeps stores in order).
            compiler_fence(Ordering::Release);
            d.add(3).write_volatile(self.seq ^ dst ^ src ^ len);
        }
    }

    /// The GPU time from descriptor seen to completion word stored of the last copy, us.
    fn gpu_us(&self) -> f64 {
        let t = self.gpu_ns.1;
        // SAFETY: the stamps are a live pinned allocation of 8 u64s of this server, both
        // written by the server before the completion word the caller has seen.
        unsafe { t.add(1).read_volatile().wrapping_sub(t.read_volatile()) as f64 / 1e3 }
    }

    fn stop(mut self) {
        self.post(0, 0, u64::MAX);
        self.ctx.bind_to_thread().expect("cuCtxSetCurrent");
        self.server_stream.synchronize().expect("cuStreamSynchronize");
    }
}

/// Fills `src` with a pattern for `len`, clears `dst`; after the copies, checks `dst`.
fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// The engine's copy, the probe server's and gpulmt's own copy server's (through the
/// backend: `copy_async` on device `engine` + `copy_poll`), each checked.
#[allow(clippy::too_many_arguments)]
fn variant(b: &CudaBackend, name: &str, s: &mut Server, engine: u32, dst: usize, src: usize, len: usize, seed: u8) {
    let want = pattern(seed, len);
    let zero = vec![0u8; len];
    // SAFETY: (every backend copy of this function) main passes `src` and `dst` as device
    // allocations of `b` of at least `len` bytes, alive for the whole run, and every copy is
    // waited for before the next touches them.
    unsafe {
        b.copy_sync(src, want.as_ptr() as usize, len).expect("fill");
        b.copy_sync(dst, zero.as_ptr() as usize, len).expect("clear");
    }
    s.ctx.bind_to_thread().expect("cuCtxSetCurrent");
    // Copy and wait on the engine through `stream`: `dst` and `src` hold `len` bytes.
    let engine_copy = |stream: sys::CUstream| {
        // SAFETY: `dst` and `src` are the caller's device buffers of at least `len` bytes;
        // `stream` is one of this server's streams, its context current.
        unsafe { sys::cuMemcpyAsync(dst as CUdeviceptr, src as CUdeviceptr, len, stream) }
            .result()
            .expect("cuMemcpyAsync");
        // SAFETY: as above.
        spin_until_ready("cuStreamQuery", || unsafe { sys::cuStreamQuery(stream) });
    };
    let (stream, hi) = (s.stream.cu_stream(), s.hi_stream.cu_stream());
    row(&format!("engine_{name}_{len}"), timed(|| engine_copy(stream)));
    row(&format!("engine_hi_{name}_{len}"), timed(|| engine_copy(hi)));
    // SAFETY: as above.
    unsafe { b.copy_sync(dst, zero.as_ptr() as usize, len) }.expect("clear");
    let mut on_gpu = Vec::with_capacity(REPS);
    row(
        &format!("server_{name}_{len}"),
        timed(|| {
            s.copy(dst, src, len);
            on_gpu.push(s.gpu_us());
        }),
    );
    row(&format!("server_{name}_{len}_gpu_seen_to_store"), on_gpu.split_off(WARM));
    let check = |what: &str| {
        let mut got = vec![0u8; len];
        // SAFETY: as above.
        unsafe { b.copy_sync(got.as_mut_ptr() as usize, dst, len) }.expect("read back");
        println!("server_probe,check_{what}_{name}_{len},{},,", if got == want { "ok" } else { "FAILED" });
        // SAFETY: as above.
        unsafe { b.copy_sync(dst, zero.as_ptr() as usize, len) }.expect("clear");
    };
    check("probe");
    row(
        &format!("gpulmt_{name}_{len}"),
        timed(|| {
            // SAFETY: as above; the copy is waited for just below.
            let t = unsafe { b.copy_async(engine, 0, dst, src, len) }.expect("copy_async");
            while !b.copy_poll(t).expect("copy_poll") {
                std::hint::spin_loop();
            }
        }),
    );
    check("gpulmt");
}

/// Launches gpulmt's copy server on device 0 (copies until it takes one: the first starts
/// it) and keeps it resident, idle, for `time`; dropping the backend then stops it.
fn hold(b: &CudaBackend, time: std::time::Duration) {
    b.enable_copy_server(0, 64, time * 2).expect("enable_copy_server");
    let (p, q) = (b.alloc(0, 64).unwrap(), b.alloc(0, 64).unwrap());
    let limit = std::time::Duration::from_secs(10);
    // SAFETY: `p` and `q` are allocations of 64 bytes of `b`, released with it.
    let copies = unsafe { b.copy_until_served(0, (q, p, 64), limit) }
        .expect("copy")
        .expect("server_probe: the copy server never started");
    eprintln!("server_probe: holding the copy server on device 0 for {time:?} (it took copy {copies})");
    std::thread::sleep(time);
}

fn main() {
    gpulmt::logging::init("warn");
    let sizes: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("bytes")).collect();
    let sizes = if sizes.is_empty() { vec![8, 4096, 65536] } else { sizes };
    let b = CudaBackend::try_new().unwrap_or_else(|e| {
        eprintln!("server_probe: needs the CUDA backend: {e}");
        std::process::exit(1);
    });
    if let Ok(ms) = std::env::var("SERVER_HOLD_MS") {
        hold(&b, std::time::Duration::from_millis(ms.parse().expect("SERVER_HOLD_MS: milliseconds")));
        return;
    }
    let opts = cudarc::nvrtc::CompileOptions { arch: Some("compute_80"), ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SERVER_SOURCE, opts).unwrap_or_else(|e| {
        eprintln!("server_probe: NVRTC: {e:?}");
        std::process::exit(1);
    });
    let max = *sizes.iter().max().unwrap();
    let two = b.device_count() >= 2 && b.can_access_peer(0, 1) && b.can_access_peer(1, 0);
    let a0 = b.alloc(0, max).unwrap();
    let a0b = b.alloc(0, max).unwrap();
    let a1 = if two { b.alloc(1, max).unwrap() } else { 0 };
    println!("probe,variant,median_us,mean_us,p90_us");
    // SERVER_FENCE_ALL=1: every thread fences system-wide before the word (the stricter
    // pattern) instead of relying on the barrier and thread 0's release.
    let fence_all = std::env::var("SERVER_FENCE_ALL").is_ok_and(|v| v == "1");
    println!("server_probe,fence_all,{fence_all},,");
    // gpulmt's copy servers, idle long enough not to exit between the rows.
    let idle = std::time::Duration::from_secs(1);
    for dev in 0..if two { 2 } else { 1 } {
        b.enable_copy_server(dev, max, idle).expect("enable_copy_server");
    }
    // SERVER_READS_IN_FLIGHT=1|2|4: the pipelined server with that many reads in flight,
    // SERVER_READ_SPACING_NS (default 1000, about one read of host memory) apart in all.
    let in_flight = std::env::var("SERVER_READS_IN_FLIGHT").ok().filter(|v| !v.is_empty());
    let kernel = match in_flight.as_deref() {
        None | Some("0") => "copy_server".to_owned(),
        Some(d @ ("1" | "2" | "4")) => format!("copy_server_pipelined{d}"),
        Some(other) => {
            eprintln!("server_probe: SERVER_READS_IN_FLIGHT={other}: expected 1, 2 or 4");
            std::process::exit(2);
        }
    };
    let spacing: u64 =
        std::env::var("SERVER_READ_SPACING_NS").ok().map_or(1000, |v| v.parse().expect("SERVER_READ_SPACING_NS: ns"));
    println!("server_probe,reads_in_flight,{},,", in_flight.as_deref().unwrap_or("0 (none while copying)"));
    let mut s0 = Server::start(0, &ptx, &kernel, fence_all, spacing);
    let mut s1 = two.then(|| Server::start(1, &ptx, &kernel, fence_all, spacing));
    for (i, &len) in sizes.iter().enumerate() {
        let seed = i as u8 * 3;
        variant(&b, "local", &mut s0, 0, a0b, a0, len, seed);
        if let Some(s1) = s1.as_mut() {
            variant(&b, "push", &mut s0, 0, a1, a0, len, seed + 1);
            variant(&b, "pull", s1, 1, a1, a0, len, seed + 2);
        }
    }
    s0.stop();
    if let Some(s1) = s1 {
        s1.stop();
    }
}
