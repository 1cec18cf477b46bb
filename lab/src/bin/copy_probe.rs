//! copy_probe: where the time of one small device copy goes, call by call.
//!
//! The 8 B `osu_latency` target sits a microsecond above one copy-engine copy and wait, so
//! this measures the pieces of that copy on the real driver, each the same way (median, mean
//! and 90th percentile of 2000 repetitions after 200 warm-ups, host-timed): the anchor's
//! `cuMemcpyPeerAsync` + `cuStreamSynchronize`, the UVA `cuMemcpyAsync` gpulmt issues, on the
//! source's engine (push) and the destination's (pull), completed by stream synchronize,
//! stream query, event query, event synchronize and a completion word the stream writes into
//! pinned host memory (`cuStreamWriteValue32`; on 2x H200 it cost 0.4-7 us more than an event
//! query, so gpulmt polls events); the cost of each call alone, and of each query of a
//! poll loop (the one that finds the copy done apart); gpulmt's own `copy_async` + `copy_poll`;
//! and a pull from an IPC mapping opened in a second process, which is what a GET does;
//! and the same GET driven by the *source's* engine from the receiving process (the mapping
//! opened in the source device's context, the copy on a stream of that device: a push
//! issued by the receiver), which is what a small GET would do to get the push's latency.
//! Then the same copies made by a one-block kernel instead of the copy engine
//! (`kernel_*`): the kernel loads and stores through the peer mapping, fences system-wide
//! and writes a sequence number into pinned host memory that the host polls with plain
//! loads, so no driver query reports the completion; and the cost of `cuLaunchKernel` alone.
//! Needs two CUDA devices with peer access. Prints CSV `probe,variant,median_us,mean_us,p90_us`.
//! Run: `copy_probe [bytes]` (default 8).

use std::io::{BufRead, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::result::stream::StreamKind;
use cudarc::driver::sys::{self, CUdeviceptr, CUresult};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaFunction, CudaStream, PinnedHostSlice};
use gpulmt::device::cuda::CudaBackend;
use gpulmt::device::{DeviceBackend, IpcHandle, IPC_HANDLE_BYTES};
use gpulmt_lab::{mapped_pinned, print_row, spin_until_ready, timed};

const WARM: usize = 200;
const REPS: usize = 2000;
const CHILD_ENV: &str = "GPULMT_COPY_PROBE_HANDLE";
const PATTERN: u8 = 0x5a;
/// The application's legacy default stream (`CU_STREAM_LEGACY`).
const LEGACY: sys::CUstream = 1usize as sys::CUstream;

/// Times `op` (which must finish its copy before returning) and prints its row.
fn measure(variant: &str, op: impl FnMut()) {
    print_row("copy_probe", variant, timed(WARM, REPS, op));
}

/// Polls stream `s` until it is idle.
fn spin_stream(s: sys::CUstream) {
    // SAFETY: every stream passed here is one this probe created (or the legacy stream).
    spin_until_ready("cuStreamQuery", || unsafe { sys::cuStreamQuery(s) });
}

/// Polls event `e` until it has completed.
fn spin_event(e: sys::CUevent) {
    // SAFETY: every event passed here is one this probe created and still owns.
    spin_until_ready("cuEventQuery", || unsafe { sys::cuEventQuery(e) });
}

/// A device's primary context (gpulmt's backend has retained it and enabled peer access)
/// with a non-blocking stream, a timing-free event and a pinned completion word of its own.
struct Dev {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    event: CudaEvent,
    /// The completion word stream writes land in: the allocation, its host and device
    /// addresses.
    word: (PinnedHostSlice<u32>, *mut u32, CUdeviceptr),
}

impl Dev {
    fn new(ordinal: usize) -> Dev {
        let ctx = CudaContext::new(ordinal).expect("retaining the primary context");
        let stream = ctx.new_stream().expect("cuStreamCreate");
        let event = ctx.new_event(None).expect("cuEventCreate");
        let word = mapped_pinned::<u32>(&ctx, 16);
        Dev { ctx, stream, event, word }
    }

    /// Makes this device's context current on the calling thread.
    fn bind(&self) {
        self.ctx.bind_to_thread().expect("cuCtxSetCurrent");
    }

    fn stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    fn event(&self) -> sys::CUevent {
        self.event.cu_event()
    }

    /// The completion word's value, read as the GPU may have written it.
    fn word(&self) -> u32 {
        // SAFETY: the word is a live pinned allocation of this `Dev`, aligned for u32.
        unsafe { self.word.1.read_volatile() }
    }
}

/// Calls `query` until it answers success, timing each call: the successful one's time
/// goes to `ready`, the others' to `not_ready`. Returns when the successful one began.
fn timed_poll(
    what: &str,
    mut query: impl FnMut() -> CUresult,
    ready: &mut Vec<f64>,
    not_ready: &mut Vec<f64>,
) -> Instant {
    loop {
        let x = Instant::now();
        let r = query();
        let took = x.elapsed().as_secs_f64() * 1e6;
        match r {
            CUresult::CUDA_SUCCESS => {
                ready.push(took);
                return x;
            }
            CUresult::CUDA_ERROR_NOT_READY => not_ready.push(took),
            r => panic!("{what} failed: {r:?}"),
        }
    }
}

/// What the PMPI shim pays per device buffer before gpulmt touches it, on device 0 with
/// nothing queued anywhere: asking whether the application's legacy default stream has
/// work pending (gpulmt's `wait_app_default_stream`, one `cuStreamQuery`), the same of an
/// idle non-blocking stream, ordering a stream after the legacy one on the GPU instead
/// (`cuEventRecord` + `cuStreamWaitEvent`, no host wait), and the pointer query that
/// classifies a buffer (`pointer_info`).
fn settle_probes(b: &CudaBackend) {
    let a = b.alloc(0, 64).expect("alloc");
    let a2 = b.alloc(0, 64).expect("alloc");
    let d = Dev::new(0);
    d.bind();
    let (stream, event) = (d.stream(), d.event());
    // SAFETY: (every unsafe block of this function) the streams and events are this probe's own (or the legacy
    // stream), `a` and `a2` are 64-byte device allocations on device 0, whose context is
    // current, and every copy moves at most 64 bytes.
    let query = |s: sys::CUstream| unsafe { sys::cuStreamQuery(s) }.result().expect("cuStreamQuery");
    // SAFETY: as at the top of this function.
    let sync = |s: sys::CUstream| unsafe { sys::cuStreamSynchronize(s) }.result().expect("cuStreamSynchronize");
    // SAFETY: as at the top of this function.
    let order_after_legacy = || unsafe {
        sys::cuEventRecord(event, LEGACY).result().expect("cuEventRecord");
        sys::cuStreamWaitEvent(stream, event, 0).result().expect("cuStreamWaitEvent");
    };
    let copy8 = |s: sys::CUstream| {
        // SAFETY: as at the top of this function.
        unsafe { sys::cuMemcpyAsync(a2 as CUdeviceptr, a as CUdeviceptr, 8, s) }.result().expect("cuMemcpyAsync")
    };
    measure("settle_legacy_query_unused", || query(LEGACY));
    // SAFETY: as at the top of this function.
    unsafe { sys::cuMemsetD8Async(a as CUdeviceptr, 0, 64, LEGACY) }.result().expect("cuMemsetD8Async");
    sync(LEGACY);
    measure("settle_legacy_query_idle", || query(LEGACY));
    measure("settle_nonblocking_query_idle", || query(stream));
    measure("settle_event_record_legacy_wait", order_after_legacy);
    sync(stream);
    // As in a ping-pong: a copy of gpulmt's has just been seen finished, then the next
    // message's settle asks about the legacy stream (timed alone). `prep` runs untimed
    // between the copy's end and the settle.
    let after_prep = |what: &str, s: sys::CUstream, prep: &dyn Fn(), settle: &dyn Fn()| {
        let mut t = Vec::with_capacity(REPS);
        for i in 0..WARM + REPS {
            copy8(s);
            spin_stream(s);
            prep();
            let x = Instant::now();
            settle();
            if i >= WARM {
                t.push(x.elapsed().as_secs_f64() * 1e6);
            }
        }
        print_row("copy_probe", what, t);
    };
    let after = |what: &str, s: sys::CUstream, settle: &dyn Fn()| after_prep(what, s, &|| {}, settle);
    after("settle_legacy_query_after_copy", stream, &|| query(LEGACY));
    after("settle_nonblocking_query_after_copy", stream, &|| query(stream));
    after("settle_event_record_legacy_wait_after_copy", stream, &order_after_legacy);
    // How long a query stays slow after a copy was seen finished: queries 1-4 of the
    // legacy stream, timed one by one, `delay` us after the copy's stream answered done.
    for delay in [0.0, 2.0, 5.0, 10.0, 20.0, 50.0, 200.0] {
        let mut t: Vec<Vec<f64>> = (0..4).map(|_| Vec::with_capacity(REPS)).collect();
        for i in 0..WARM + REPS {
            copy8(stream);
            spin_stream(stream);
            let x = Instant::now();
            while x.elapsed().as_secs_f64() * 1e6 < delay {
                std::hint::spin_loop();
            }
            for q in t.iter_mut() {
                let x = Instant::now();
                query(LEGACY);
                if i >= WARM {
                    q.push(x.elapsed().as_secs_f64() * 1e6);
                }
            }
        }
        for (k, q) in t.into_iter().enumerate() {
            print_row("copy_probe", &format!("settle_legacy_query{}_after_copy_{delay}us", k + 1), q);
        }
    }
    // Whether a synchronize answers an idle stream faster than a query does, and whether
    // it leaves later queries fast.
    after("settle_legacy_sync_after_copy", stream, &|| sync(LEGACY));
    after("settle_nonblocking_sync_after_copy", stream, &|| sync(stream));
    after_prep("settle_legacy_query_after_copy_and_legacy_sync", stream, &|| sync(LEGACY), &|| query(LEGACY));
    measure("settle_legacy_sync_idle", || sync(LEGACY));
    // A blocking stream (ordered after the legacy stream by the driver, no call at all):
    // what its copy and wait cost beside the non-blocking stream's.
    let blocking = result::stream::create(StreamKind::Default).expect("cuStreamCreate");
    after("settle_legacy_query_after_blocking_copy", blocking, &|| query(LEGACY));
    for (what, s) in [("local_copy_streamquery_nonblocking", stream), ("local_copy_streamquery_blocking", blocking)] {
        measure(what, || {
            copy8(s);
            spin_stream(s);
        });
    }
    // SAFETY: created above, idle (its last copy was waited for), destroyed once.
    unsafe { result::stream::destroy(blocking) }.expect("cuStreamDestroy");
    // SAFETY: every copy on `a2` was waited for (spin_stream), and nothing touches it
    // afterwards.
    unsafe { b.free(a2) }.expect("free");
    measure("settle_backend_wait_app_default_stream", || {
        b.wait_app_default_stream(0).expect("wait_app_default_stream")
    });
    measure("settle_backend_pointer_info", || {
        b.pointer_info(a).expect("pointer_info");
    });
    // SAFETY: every copy on `a` was waited for, and nothing touches it afterwards.
    unsafe { b.free(a) }.expect("free");
}

/// Copy-then-complete variants on `d`'s stream, `d`'s context current.
fn variants(tag: &str, d: &Dev, dst: usize, src: usize, len: usize) {
    let (dst, src) = (dst as CUdeviceptr, src as CUdeviceptr);
    let (stream, event) = (d.stream(), d.event());
    d.bind();
    // SAFETY: (every unsafe block of this function) `stream` and `event` are `d`'s own, `dst` and `src` hold
    // `len` bytes each (the caller's allocations or mappings) and `d`'s context is current.
    let copy = || unsafe { sys::cuMemcpyAsync(dst, src, len, stream) }.result().expect("cuMemcpyAsync");
    // SAFETY: as at the top of this function.
    let record = || unsafe { sys::cuEventRecord(event, stream) }.result().expect("cuEventRecord");
    // SAFETY: as at the top of this function.
    let sync = || unsafe { sys::cuStreamSynchronize(stream) }.result().expect("cuStreamSynchronize");
    measure(&format!("{tag}_memcpy_streamsync"), || {
        copy();
        sync();
    });
    measure(&format!("{tag}_memcpy_streamquery"), || {
        copy();
        spin_stream(stream);
    });
    measure(&format!("{tag}_memcpy_eventquery"), || {
        copy();
        record();
        spin_event(event);
    });
    measure(&format!("{tag}_memcpy_eventsync"), || {
        copy();
        record();
        // SAFETY: as at the top of this function.
        unsafe { sys::cuEventSynchronize(event) }.result().expect("cuEventSynchronize");
    });
    let mut seq = 0u32;
    let word_dev = d.word.2;
    measure(&format!("{tag}_memcpy_word"), || {
        seq += 1;
        copy();
        // SAFETY: as at the top of this function.
        unsafe { sys::cuStreamWriteValue32_v2(stream, word_dev, seq, 0) }.result().expect("cuStreamWriteValue32");
        while d.word() != seq {
            std::hint::spin_loop();
        }
    });
    measure(&format!("{tag}_memcpydtod_streamsync"), || {
        // SAFETY: as at the top of this function.
        unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream) }.result().expect("cuMemcpyDtoDAsync");
        sync();
    });
    // Host-side cost of each call alone (the copy is waited for outside the timing).
    let mut issue = Vec::with_capacity(REPS);
    let mut record_alone = Vec::with_capacity(REPS);
    let mut query_done = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let x = Instant::now();
        copy();
        issue.push(x.elapsed().as_secs_f64() * 1e6);
        let x = Instant::now();
        record();
        record_alone.push(x.elapsed().as_secs_f64() * 1e6);
        sync();
        let x = Instant::now();
        // SAFETY: as at the top of this function.
        unsafe { sys::cuEventQuery(event) }.result().expect("cuEventQuery");
        query_done.push(x.elapsed().as_secs_f64() * 1e6);
    }
    // A poll loop's queries, each timed: the one that finds the copy done (what a
    // completion waits for after the copy has landed), the ones before it, and when,
    // after the copy's issue returned, the successful one began.
    let mut ready = Vec::with_capacity(REPS);
    let mut not_ready = Vec::with_capacity(REPS * 32);
    let mut ready_begins = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        copy();
        let issued = Instant::now();
        // SAFETY: as at the top of this function.
        let query = || unsafe { sys::cuStreamQuery(stream) };
        let began = timed_poll("cuStreamQuery", query, &mut ready, &mut not_ready);
        ready_begins.push((began - issued).as_secs_f64() * 1e6);
    }
    let mut ev_ready = Vec::with_capacity(REPS);
    let mut ev_not_ready = Vec::with_capacity(REPS * 32);
    for _ in 0..REPS {
        copy();
        record();
        // SAFETY: as at the top of this function.
        timed_poll("cuEventQuery", || unsafe { sys::cuEventQuery(event) }, &mut ev_ready, &mut ev_not_ready);
    }
    // Completion seen through cuEventElapsedTime between a timed event long complete
    // and a timed event recorded behind the copy: NOT_READY until the copy is done.
    let t0 = d.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).expect("cuEventCreate");
    let t1 = d.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT)).expect("cuEventCreate");
    let (t0, t1) = (t0.cu_event(), t1.cu_event());
    // SAFETY: as at the top of this function.
    unsafe { sys::cuEventRecord(t0, stream) }.result().expect("cuEventRecord");
    sync();
    let mut el_ready = Vec::with_capacity(REPS);
    let mut el_not_ready = Vec::with_capacity(REPS * 32);
    let mut el_record = Vec::with_capacity(REPS);
    let mut el_total = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let start = Instant::now();
        copy();
        let x = Instant::now();
        // SAFETY: as at the top of this function.
        unsafe { sys::cuEventRecord(t1, stream) }.result().expect("cuEventRecord");
        el_record.push(x.elapsed().as_secs_f64() * 1e6);
        let mut ms = 0f32;
        timed_poll(
            "cuEventElapsedTime",
            // SAFETY: as at the top of this function.
            || unsafe { sys::cuEventElapsedTime_v2(&mut ms, t0, t1) },
            &mut el_ready,
            &mut el_not_ready,
        );
        el_total.push(start.elapsed().as_secs_f64() * 1e6);
    }
    for (name, v) in [
        ("memcpy_elapsedtime_total", el_total),
        ("call_eventrecord_timed", el_record),
        ("call_elapsedtime_ready", el_ready),
        ("call_elapsedtime_not_ready", el_not_ready),
        ("call_eventquery_ready", ev_ready),
        ("call_eventquery_not_ready", ev_not_ready),
        ("call_memcpyasync", issue),
        ("call_eventrecord", record_alone),
        ("call_eventquery_done", query_done),
        ("call_streamquery_ready", ready),
        ("call_streamquery_not_ready", not_ready),
        ("streamquery_ready_begins_after_issue", ready_begins),
    ] {
        print_row("copy_probe", &format!("{tag}_{name}"), v);
    }
}

/// A one-block copy kernel: each thread moves its bytes, fences at system scope, and after
/// the block barrier thread 0 stores `seq` into the host-mapped word.
const KERNEL_SOURCE: &str = r#"
extern "C" __global__ void small_copy(unsigned char* dst, const unsigned char* src,
                                      unsigned long long len, volatile unsigned int* flag,
                                      unsigned int seq) {
    for (unsigned long long i = threadIdx.x; i < len; i += blockDim.x) dst[i] = src[i];
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) *flag = seq;
}
"#;

/// The copy kernel loaded in `d`'s context.
fn kernel(d: &Dev) -> CudaFunction {
    let ptx = cudarc::nvrtc::compile_ptx(KERNEL_SOURCE).unwrap_or_else(|e| panic!("copy_probe: NVRTC: {e:?}"));
    let module = d.ctx.load_module(ptx).expect("cuModuleLoadData");
    module.load_function("small_copy").expect("cuModuleGetFunction")
}

/// Copies made by the kernel on `d`'s stream, completed by the host-mapped word (and, for
/// comparison, by a stream query).
fn kernel_variants(tag: &str, d: &Dev, k: &CudaFunction, dst: usize, src: usize, len: usize) {
    let (mut dst, mut src, mut n) = (dst as CUdeviceptr, src as CUdeviceptr, len as u64);
    let mut flag = d.word.2;
    let mut seq = d.word();
    let threads = (len as u32).clamp(1, 256);
    let (f, stream) = (k.cu_function(), d.stream());
    let launch = |seq: &mut u32, dst: &mut CUdeviceptr, src: &mut CUdeviceptr, n: &mut u64, flag: &mut CUdeviceptr| {
        *seq += 1;
        let mut args: [*mut std::ffi::c_void; 5] = [
            (dst as *mut CUdeviceptr).cast(),
            (src as *mut CUdeviceptr).cast(),
            (n as *mut u64).cast(),
            (flag as *mut CUdeviceptr).cast(),
            (seq as *mut u32).cast(),
        ];
        // SAFETY: `small_copy` takes exactly these five arguments, each pointing at a live
        // local of the right type; `dst` and `src` hold `len` bytes and `flag` is `d`'s
        // pinned word.
        unsafe { result::launch_kernel(f, (1, 1, 1), (threads, 1, 1), 0, stream, &mut args) }.expect("cuLaunchKernel");
    };
    d.bind();
    measure(&format!("{tag}_kernel_word"), || {
        launch(&mut seq, &mut dst, &mut src, &mut n, &mut flag);
        while d.word() != seq {
            std::hint::spin_loop();
        }
    });
    measure(&format!("{tag}_kernel_streamquery"), || {
        launch(&mut seq, &mut dst, &mut src, &mut n, &mut flag);
        spin_stream(stream);
    });
    let mut issue = Vec::with_capacity(REPS);
    let mut seen = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let x = Instant::now();
        launch(&mut seq, &mut dst, &mut src, &mut n, &mut flag);
        issue.push(x.elapsed().as_secs_f64() * 1e6);
        let y = Instant::now();
        while d.word() != seq {
            std::hint::spin_loop();
        }
        seen.push(y.elapsed().as_secs_f64() * 1e6);
    }
    print_row("copy_probe", &format!("{tag}_call_launchkernel"), issue);
    print_row("copy_probe", &format!("{tag}_kernel_word_seen_after_issue"), seen);
    d.stream.synchronize().expect("cuStreamSynchronize");
}

fn backend_variant(tag: &str, b: &CudaBackend, engine: u32, dst: usize, src: usize, len: usize) {
    measure(&format!("{tag}_gpulmt_copy_async_poll"), || {
        // SAFETY: every caller passes `len` bytes of allocations of `b` or of mappings open
        // in it, which outlive the measurement; each copy is waited for.
        let t = unsafe { b.copy_async(engine, 0, dst, src, len) }.expect("copy_async");
        while !b.copy_poll(t).expect("copy_poll") {
            std::hint::spin_loop();
        }
    });
}

/// Sets `len` bytes at device address `dst` to `value` (synchronously, in `d`'s context).
fn memset(d: &Dev, dst: usize, value: u8, len: usize) {
    d.bind();
    // SAFETY: `dst` is a device allocation of at least `len` bytes in a context `d` reaches.
    unsafe { result::memset_d8_sync(dst as CUdeviceptr, value, len) }.expect("cuMemsetD8");
}

fn main() {
    let len: usize = std::env::args().nth(1).map(|s| s.parse().expect("bytes")).unwrap_or(8);
    let b = CudaBackend::try_new().unwrap_or_else(|e| {
        eprintln!("copy_probe: needs the CUDA backend: {e}");
        std::process::exit(1);
    });
    // COPY_PROBE_SCHED=spin|yield|blocking|auto: the primary contexts' scheduling flag
    // (before the probe's own contexts use them), to see whether it changes what a query
    // costs.
    if let Ok(sched) = std::env::var("COPY_PROBE_SCHED") {
        let flag = match sched.as_str() {
            "spin" => sys::CUctx_flags::CU_CTX_SCHED_SPIN,
            "yield" => sys::CUctx_flags::CU_CTX_SCHED_YIELD,
            "blocking" => sys::CUctx_flags::CU_CTX_SCHED_BLOCKING_SYNC,
            _ => sys::CUctx_flags::CU_CTX_SCHED_AUTO,
        };
        for ordinal in 0..b.device_count() as i32 {
            let cu = result::device::get(ordinal).expect("cuDeviceGet");
            // SAFETY: a device handle the driver just returned; the flag is a valid one.
            unsafe { sys::cuDevicePrimaryCtxSetFlags_v2(cu, flag as u32) }
                .result()
                .expect("cuDevicePrimaryCtxSetFlags");
        }
        println!("copy_probe,sched,{sched},,");
    }
    if let Ok(hex) = std::env::var(CHILD_ENV) {
        return child(&b, &hex, len);
    }
    println!("probe,variant,median_us,mean_us,p90_us");
    settle_probes(&b);
    if b.device_count() < 2 || !b.can_access_peer(0, 1) {
        eprintln!("copy_probe: the copy probes need two devices with peer access");
        std::process::exit(1);
    }
    let bytes = len.max(64);
    let (a0, a0b, a1) = (b.alloc(0, bytes).unwrap(), b.alloc(0, bytes).unwrap(), b.alloc(1, bytes).unwrap());
    let (d0, d1) = (Dev::new(0), Dev::new(1));
    // The IPC half checks that what it moved is this pattern.
    memset(&d0, a0, PATTERN, bytes);
    d0.bind();
    let (ctx0, ctx1, s0) = (d0.ctx.cu_ctx(), d1.ctx.cu_ctx(), d0.stream());
    measure("push_memcpypeer_streamsync", || {
        // SAFETY: `a1` and `a0` hold `bytes` >= `len` bytes in the two devices' contexts;
        // `s0` is device 0's stream, its context current.
        unsafe {
            sys::cuMemcpyPeerAsync(a1 as CUdeviceptr, ctx1, a0 as CUdeviceptr, ctx0, len, s0)
                .result()
                .expect("cuMemcpyPeerAsync");
            sys::cuStreamSynchronize(s0).result().expect("cuStreamSynchronize");
        }
    });
    variants("push", &d0, a1, a0, len);
    variants("pull", &d1, a1, a0, len);
    variants("local", &d0, a0b, a0, len);
    backend_variant("push", &b, 0, a1, a0, len);
    backend_variant("pull", &b, 1, a1, a0, len);
    backend_variant("local", &b, 0, a0b, a0, len);
    let (k0, k1) = (kernel(&d0), kernel(&d1));
    memset(&d1, a1, 0, bytes);
    memset(&d0, a0b, 0, bytes);
    kernel_variants("push", &d0, &k0, a1, a0, len);
    check_landed("kernel_push", &d1, a1, len);
    kernel_variants("pull", &d1, &k1, a1, a0, len);
    kernel_variants("local", &d0, &k0, a0b, a0, len);
    check_landed("kernel_local", &d0, a0b, len);

    // A GET: the receiving process pulls from the sender's allocation through an IPC mapping.
    let handle = b.export_handle(a0).expect("export");
    let hex: String = handle.0.iter().map(|x| format!("{x:02x}")).collect();
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .arg(len.to_string())
        .env(CHILD_ENV, hex)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the IPC half");
    let out = child.stdout.take().unwrap();
    for line in std::io::BufReader::new(out).lines() {
        let line = line.unwrap();
        println!("{line}");
        std::io::stdout().flush().ok();
    }
    let status = child.wait().expect("wait for the IPC half");
    if !status.success() {
        eprintln!("copy_probe: the IPC half failed: {status}");
        std::process::exit(1);
    }
}

/// The receiving half of the IPC variants: maps the parent's allocation on device 1 and pulls;
/// then maps it on device 0 (the source's) and pushes from there into its own device-1 buffer.
fn child(b: &CudaBackend, hex: &str, len: usize) {
    let mut raw = [0u8; IPC_HANDLE_BYTES];
    for (i, x) in raw.iter_mut().enumerate() {
        *x = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("handle hex");
    }
    let local = b.alloc(1, len.max(64)).unwrap();
    let m = b.open_handle(&IpcHandle(raw), 1).expect("open_handle");
    let (d0, d1) = (Dev::new(0), Dev::new(1));
    variants("ipc_pull", &d1, local, m.ptr, len);
    backend_variant("ipc_pull", b, 1, local, m.ptr, len);
    check_landed("ipc_pull", &d1, local, len);
    memset(&d1, local, 0, len);
    let k1 = kernel(&d1);
    kernel_variants("ipc_pull", &d1, &k1, local, m.ptr, len);
    check_landed("ipc_kernel_pull", &d1, local, len);
    // Can device 0's engine use the mapping device 1's context opened? (One try, not fatal.)
    memset(&d1, local, 0, len);
    d0.bind();
    let s0 = d0.stream();
    // SAFETY: `local` holds `len` bytes; `m.ptr` maps the parent's allocation of `len` or
    // more; the question is only whether device 0's engine may use that mapping.
    let r = unsafe {
        match sys::cuMemcpyAsync(local as CUdeviceptr, m.ptr as CUdeviceptr, len, s0) {
            CUresult::CUDA_SUCCESS => sys::cuStreamSynchronize(s0),
            r => r,
        }
    };
    println!("copy_probe,ipc_cross_map_on_src_engine,{r:?},,");
    if r == CUresult::CUDA_SUCCESS {
        check_landed("ipc_cross_map", &d1, local, len);
    }
    // SAFETY: every copy through `m` was waited for, and nothing touches it afterwards.
    unsafe { b.close_handle(m) }.expect("close_handle");
    let m0 = b.open_handle(&IpcHandle(raw), 0).expect("open_handle on the source device");
    memset(&d1, local, 0, len);
    variants("ipc_push", &d0, local, m0.ptr, len);
    backend_variant("ipc_push", b, 0, local, m0.ptr, len);
    check_landed("ipc_push", &d1, local, len);
    memset(&d1, local, 0, len);
    let k0 = kernel(&d0);
    kernel_variants("ipc_push", &d0, &k0, local, m0.ptr, len);
    check_landed("ipc_kernel_push", &d1, local, len);
    // SAFETY: every copy through `m0` and into `local` was waited for, and nothing touches
    // them afterwards.
    unsafe {
        b.close_handle(m0).expect("close_handle");
        b.free(local).unwrap();
    }
}

/// Prints whether `len` bytes at `dst` hold the parent's pattern.
fn check_landed(tag: &str, d: &Dev, dst: usize, len: usize) {
    let mut host = vec![0u8; len];
    d.bind();
    // SAFETY: `dst` holds `len` bytes of device memory `d`'s context reaches; `host` is `len`.
    unsafe { result::memcpy_dtoh_sync(&mut host, dst as CUdeviceptr) }.expect("cuMemcpyDtoH");
    let ok = host.iter().all(|&x| x == PATTERN);
    println!("copy_probe,{tag}_data,{},,", if ok { "ok" } else { "WRONG" });
}
