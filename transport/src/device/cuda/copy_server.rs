//! The copy server: one block of a kernel that stays resident on a device between copies
//! and makes the small device-to-device copies the CUDA backend routes to it.
//!
//! Through the copy engine a small copy costs a driver call to issue it (1.5-2 us of CPU),
//! the engine's start, and a driver query that reports it finished (1.3-1.5 us): 6.6-6.9 us
//! for 8 B on 2x H200, most of an 8 B ping-pong leg. A kernel launched per copy is slower
//! still (`cuLaunchKernel` alone costs 3 us). The server needs no driver call per copy: the
//! host writes a descriptor into pinned memory that the resident block polls, and polls a
//! completion word the block stores after the copy (`lab/src/bin/server_probe.rs`: 3.1 us
//! for 8 B within one H200 where the engine took 11.4).
//!
//! Protocol, all in one pinned host allocation:
//! - a ring of [`SLOTS`] descriptors `[dst, src, len, tag]`; `tag` is a hash of the
//!   sequence number and the three fields and is written last, so the block, which reads
//!   the next 8 slots in one coalesced load (a read of host memory from the GPU costs about
//!   a microsecond: one per descriptor would bound a window), takes the leading run of
//!   slots whose words belong together (a slot torn against the host's writes, or not yet
//!   written, fails the hash and is read again);
//! - the completion word: the sequence number of the last copy made, stored with
//!   system-scope release after the block's barrier, so every thread's stores (to local or
//!   peer memory over NVLink) are visible before it.
//!
//! Lifetime: a server exits after `idle` without a descriptor, so that an application's
//! `cudaDeviceSynchronize` (which waits for every stream of the context) returns at most
//! that long after gpulmt's last small copy. A server starts at the completion word + 1, read
//! when it starts; servers are launched on one stream, so one launched while another still
//! runs starts only once that one has exited, and picks up where it stopped. Two servers
//! never run at once, so no copy is made twice (which could overwrite a buffer the
//! application reused after its copy completed).
//!
//! The host posts a copy only to a server that runs: the latest launch stored its
//! generation in the *started* word when it started, and stores it with [`EXITED`] when it
//! leaves. A server that times out first announces its exit, fences, and reads the ring
//! once more; the host, after posting, fences and reads the started word: of two such
//! sequentially consistent fences at least one side sees the other's store, so either the
//! server takes the copy, or the host sees the announcement and launches the next server,
//! which the copy then waits for (it starts at the completion word + 1, so nothing is
//! served twice). Otherwise, with no server running or one still starting, the copy engine
//! takes the copy and, if the last server has left, the next is launched once that copy is
//! issued ([`CopyServer::launch_if_wanted`]). So a copy waits for a server's start only in
//! that race, not whenever the host was idle: a start may wait as long as the application's
//! kernels fill the GPU. `finished` remains a safety net: a copy that stalls while the
//! server's stream is idle gets a new server. A server that left after fewer than
//! [`USEFUL_COPIES`] copies shows that the application's small copies come further apart
//! than the idle timeout; then declined copies launch no server until a backoff has run,
//! so such a pattern costs what the engine alone would, not a launch per copy.

use std::ffi::{c_int, c_uint, c_void, CString};
use std::ptr;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUdeviceptr, CUresult};

use super::driver::{check, cu, warn_teardown};
use crate::device::{DeviceError, WordAtomic};

/// Descriptors in the ring: copies the server may have queued at once. A copy that finds
/// the ring full goes to the copy engine instead.
pub const SLOTS: u64 = 64;

/// Threads of the server's block: enough to move 64 KiB in 1-2 us, one SM's share.
const THREADS: c_uint = 512;

/// The started word's mark of a server that has left (or is leaving: see the kernel).
const EXITED: u64 = 1 << 63;

/// A descriptor's length with this mark (bits 63-62 = 01) is a word atomic, its low two
/// bits the operation (see [`atomic_code`]); the stop descriptor's `~0` has both bits set.
const ATOMIC_MARK: u64 = 1 << 62;

/// Polls of an unfinished copy between two checks that a server is running.
const POLLS_PER_LIVENESS_CHECK: u32 = 1024;

/// Copies a server must have made before it left for the next to be launched when a copy
/// asks: fewer mean the application's small copies come further apart than the idle
/// timeout, so each server would cost a launch (3 us of CPU) and an SM while the copies it
/// serves are few (Stencil2D with a step longer than the timeout: relaunched every step,
/// nearly every copy declined to the engine, steps 6-10 % longer than with no server).
const USEFUL_COPIES: u64 = 8;

/// After a server that was not useful, copies use the engine for this long before a
/// launch is tried again; doubled after each such server, up to [`MAX_BACKOFF`], and
/// forgotten after a useful one.
const FIRST_BACKOFF: Duration = Duration::from_millis(1);
const MAX_BACKOFF: Duration = Duration::from_millis(128);

const SOURCE: &str = r#"
__device__ __forceinline__ unsigned long long mix(unsigned long long x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

#define EXITED (1ull << 63)

__device__ __forceinline__ unsigned long long now_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

extern "C" __global__ void gpulmt_copy_server(const volatile unsigned long long* ring,
                                              unsigned long long* done,
                                              unsigned long long* started,
                                              unsigned long long generation,
                                              unsigned long long idle_ns) {
    const unsigned int full = 0xffffffffu;
    // Up to 8 descriptors taken per read of the ring: one PCIe read brings 8 slots.
    __shared__ unsigned long long s_dst[8], s_src[8], s_len[8];
    __shared__ int s_n;
    unsigned long long seq;  // the next sequence number to serve
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(seq) : "l"(done) : "memory");
    seq += 1;
    // Tells the host that this launch runs: from now on it may post copies to it.
    if (threadIdx.x == 0) {
        asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(started), "l"(generation) : "memory");
    }
    for (;;) {
        if (threadIdx.x < 32) {
            // Lane l reads word l % 4 of slot seq + l / 4: the warp's load covers 8 slots.
            const unsigned int lane = threadIdx.x, g = lane / 4;
            unsigned long long since = now_ns();
            int announced = 0;
            for (;;) {
                unsigned long long v = ring[4 * ((seq + g) % 64) + lane % 4];  // 64: SLOTS
                unsigned long long dst = __shfl_sync(full, v, 4 * g);
                unsigned long long src = __shfl_sync(full, v, 4 * g + 1);
                unsigned long long len = __shfl_sync(full, v, 4 * g + 2);
                unsigned long long tag = __shfl_sync(full, v, 4 * g + 3);
                unsigned int ok = __ballot_sync(full, tag == mix((seq + g) ^ mix(dst ^ mix(src ^ mix(len)))));
                unsigned int groups = 0;
                for (int k = 0; k < 8; k++) groups |= ((ok >> (4 * k)) & 1u) << k;
                // The leading run of valid slots: later ones wait for the next read.
                int n = __ffs(~groups) - 1;
                if (n > 0) {
                    // Acquire, pairing with the host's release of each slot's tag: the bytes
                    // the host (or an engine the host saw finish) wrote before posting are
                    // what the block reads next, not lines this SM's L1 kept from an earlier
                    // copy of the same buffer (the ring's loads are volatile, not acquire;
                    // the barrier below carries the order to the other warps).
                    asm volatile("fence.acq_rel.sys;" ::: "memory");
                    if (announced && lane == 0) {
                        // A copy came after all: withdraw the exit.
                        asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(started), "l"(generation) : "memory");
                    }
                    if (lane % 4 == 0 && (int)g < n) {
                        s_dst[g] = dst;
                        s_src[g] = src;
                        s_len[g] = len;
                    }
                    if (lane == 0) s_n = n;
                    break;
                }
                int quit = 0;
                if (lane == 0) quit = now_ns() - since > idle_ns;
                if (__shfl_sync(full, quit, 0)) {
                    if (announced) {
                        if (lane == 0) s_n = -1;
                        break;
                    }
                    // Announce the exit, then read the ring once more: a host that posted
                    // before the announcement is seen by that read, one that posts after it
                    // sees the announcement (both sides fence sequentially consistently).
                    if (lane == 0) {
                        asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(started), "l"(generation | EXITED) : "memory");
                    }
                    __syncwarp();
                    // Every lane that reads the ring again orders that read after the store.
                    asm volatile("fence.sc.sys;" ::: "memory");
                    announced = 1;
                }
            }
        }
        __syncthreads();
        int n = s_n;
        if (n < 0) return;
        for (int k = 0; k < n; k++) {
            unsigned long long len = s_len[k];
            if (len == ~0ull) return;  // the host's stop; those before it are served
            if ((len >> 62) == 1) {
                // A word atomic (ATOMIC_MARK): dst is the word, src the record of its
                // operand, compare value and old value, in the host's pinned memory.
                // Thread 0 makes it with one system-scope atomic, atomic against kernels'
                // atomics on the word and peers' over NVLink; acq_rel orders it after the
                // data the host saw land before posting, and before whatever reads the
                // record's old value once the completion word is seen.
                if (threadIdx.x == 0) {
                    unsigned long long* w = (unsigned long long*)s_dst[k];
                    volatile unsigned long long* rec = (volatile unsigned long long*)s_src[k];
                    unsigned long long a = rec[0], c = rec[1], old;
                    switch (len & 3) {
                        case 0: asm volatile("atom.acq_rel.sys.global.add.u64 %0, [%1], %2;" : "=l"(old) : "l"(w), "l"(a) : "memory"); break;
                        case 1: asm volatile("atom.acq_rel.sys.global.cas.b64 %0, [%1], %2, %3;" : "=l"(old) : "l"(w), "l"(c), "l"(a) : "memory"); break;
                        case 2: asm volatile("atom.acq_rel.sys.global.exch.b64 %0, [%1], %2;" : "=l"(old) : "l"(w), "l"(a) : "memory"); break;
                        default: asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(old) : "l"(w) : "memory"); break;
                    }
                    rec[2] = old;  // published by the completion word's release below
                }
            } else if (((s_dst[k] | s_src[k] | len) & 15) == 0) {
                uint4* d = (uint4*)s_dst[k];
                const uint4* x = (const uint4*)s_src[k];
                for (unsigned long long i = threadIdx.x; i < len / 16; i += blockDim.x) d[i] = x[i];
            } else {
                unsigned char* d = (unsigned char*)s_dst[k];
                const unsigned char* x = (const unsigned char*)s_src[k];
                for (unsigned long long i = threadIdx.x; i < len; i += blockDim.x) d[i] = x[i];
            }
            // The barrier orders every thread's stores before thread 0's system-scope
            // release (cumulativity), which publishes them with the completion word.
            __syncthreads();
            if (threadIdx.x == 0) {
                asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(done), "l"(seq + k) : "memory");
            }
        }
        seq += n;
        __syncthreads();
    }
}
"#;

/// The descriptor hash, as the kernel's `mix` chain computes it.
fn tag(seq: u64, dst: u64, src: u64, len: u64) -> u64 {
    fn mix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }
    mix(seq ^ mix(dst ^ mix(src ^ mix(len))))
}

/// The server's PTX, compiled once per process by NVRTC for the oldest architecture whose
/// system-scope acquire/release it uses (the driver JIT-compiles it for the device).
fn ptx() -> Result<&'static CString, DeviceError> {
    static PTX: OnceLock<Result<CString, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        let opts = cudarc::nvrtc::CompileOptions { arch: Some("compute_75"), ..Default::default() };
        // NVRTC is loaded at run time too; a missing library panics inside cudarc.
        std::panic::catch_unwind(|| cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts))
            .map_err(|_| "NVRTC (libnvrtc) could not be loaded".to_string())
            .and_then(|r| r.map_err(|e| format!("{e:?}")))
            .and_then(|p| CString::new(p.to_src()).map_err(|e| e.to_string()))
    })
    .as_ref()
    .map_err(|why| DeviceError::Unavailable { reason: format!("the copy server's kernel did not compile: {why}") })
}

/// One device's copy server. Every method runs with the device's context current.
pub struct CopyServer {
    module: sys::CUmodule,
    func: sys::CUfunction,
    stream: sys::CUstream,
    /// Pinned: the ring (`SLOTS` x 4 words), then the completion word on a line of its own.
    host: *mut u64,
    /// The same memory as the device sees it.
    device: CUdeviceptr,
    /// The next sequence number to post (the first is 1).
    next: u64,
    /// The latest launch's number (0: none yet); the kernel stores it in the started word
    /// when it starts, with [`EXITED`] when it leaves.
    generation: u64,
    /// A copy found the server possibly gone: launch one once that copy is issued.
    launch_wanted: bool,
    idle: Duration,
    stalled_polls: u32,
    /// Kernels launched, and copies sent to the copy engine because no server ran or
    /// the ring was full, for the log at teardown.
    launches: u64,
    declined: u64,
    /// Copies posted to the latest launch, judged when it is seen to have left.
    posted: u64,
    /// The launch last judged (so each is judged once).
    judged: u64,
    /// While a backoff runs, a declined copy launches nothing before this instant.
    launch_not_before: Option<Instant>,
    backoff: Duration,
    /// Bit `seq % SLOTS` set: the record of atomic `seq` holds an old value not yet
    /// collected ([`atomic_result`](Self::atomic_result)), so that slot takes no
    /// descriptor (a later atomic there would overwrite the record).
    uncollected: u64,
}

// SAFETY: the raw pointers are a pinned allocation and driver handles owned by this
// server; the backend keeps it behind a mutex.
unsafe impl Send for CopyServer {}

/// Word offsets of the completion and started words, each on a cache line of its own
/// after the ring, then of the atomics' records: per slot [operand, compare, old, -].
const DONE_WORD: usize = (SLOTS as usize) * 4 + 8;
const STARTED_WORD: usize = DONE_WORD + 8;
const RECORD_WORD: usize = STARTED_WORD + 8;
const HOST_BYTES: usize = (RECORD_WORD + 4 * SLOTS as usize) * 8;

/// The kernel's code of an atomic (its `switch`), and its operand and compare value.
fn atomic_code(op: WordAtomic) -> (u64, u64, u64) {
    match op {
        WordAtomic::FetchAdd(v) => (0, v, 0),
        WordAtomic::CompareSwap { expected, desired } => (1, desired, expected),
        WordAtomic::Swap(v) => (2, v, 0),
        WordAtomic::Fetch => (3, 0, 0),
    }
}

/// The bit of descriptor `seq`'s slot in [`CopyServer::uncollected`].
fn slot_bit(seq: u64) -> u64 {
    1 << (seq % SLOTS)
}

impl CopyServer {
    /// Loads the kernel into the current context and allocates the ring; the server's
    /// stream gets `priority` (a high one lets a launch start ahead of blocks that the
    /// application's kernels have still to run). Launches nothing: the first copy does.
    pub fn new(idle: Duration, priority: c_int) -> Result<Self, DeviceError> {
        let image = ptx()?;
        let mut module = ptr::null_mut();
        cu!(cuModuleLoadData(&mut module, image.as_ptr().cast()))?;
        let mut s = Self::unstarted(module, idle);
        // From here `s`'s Drop releases whatever was made.
        cu!(cuModuleGetFunction(&mut s.func, module, c"gpulmt_copy_server".as_ptr()))?;
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        cu!(cuStreamCreateWithPriority(&mut s.stream, flags, priority))?;
        let mut host: *mut c_void = ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        cu!(cuMemHostAlloc(&mut host, HOST_BYTES, flags))?;
        // SAFETY: just allocated, HOST_BYTES long.
        unsafe { ptr::write_bytes(host.cast::<u8>(), 0, HOST_BYTES) };
        s.host = host.cast();
        cu!(cuMemHostGetDevicePointer_v2(&mut s.device, host, 0))?;
        Ok(s)
    }

    /// A server of `module` with nothing else made yet: no function, stream or ring, no
    /// launch, no copy.
    fn unstarted(module: sys::CUmodule, idle: Duration) -> Self {
        CopyServer {
            module,
            func: ptr::null_mut(),
            stream: ptr::null_mut(),
            host: ptr::null_mut(),
            device: 0,
            next: 1,
            generation: 0,
            launch_wanted: false,
            idle,
            stalled_polls: 0,
            launches: 0,
            declined: 0,
            posted: 0,
            judged: 0,
            launch_not_before: None,
            backoff: Duration::ZERO,
            uncollected: 0,
        }
    }

    fn done_word(&self) -> &AtomicU64 {
        // SAFETY: an aligned word of the pinned allocation, alive as long as `self`; the
        // kernel stores to it with system-scope release, the host only loads.
        unsafe { AtomicU64::from_ptr(self.host.add(DONE_WORD)) }
    }

    /// The last sequence number served.
    fn done(&self) -> u64 {
        // Acquire: the copy's bytes, published by the kernel's release, are in place for
        // whoever the caller tells that the copy finished.
        self.done_word().load(Ordering::Acquire)
    }

    fn started_word(&self) -> &AtomicU64 {
        // SAFETY: an aligned word of the pinned allocation, as `done_word`; the kernel
        // stores to it with system-scope release.
        unsafe { AtomicU64::from_ptr(self.host.add(STARTED_WORD)) }
    }

    /// Writes descriptor `seq`: the fields, then the tag that makes them valid. The caller
    /// has seen the slot's previous copy (seq - SLOTS) served, so the server no longer
    /// reads it.
    fn write_slot(&self, seq: u64, dst: u64, src: u64, len: u64) {
        // SAFETY: slot `seq % SLOTS` lies in the ring of the pinned allocation.
        unsafe {
            let slot = self.host.add(4 * (seq % SLOTS) as usize);
            slot.write_volatile(dst);
            slot.add(1).write_volatile(src);
            slot.add(2).write_volatile(len);
            // Release: the fields are visible before the tag.
            AtomicU64::from_ptr(slot.add(3)).store(tag(seq, dst, src, len), Ordering::Release);
        }
    }

    fn launch(&mut self) -> Result<(), DeviceError> {
        let words = |w: usize| self.device + (w * 8) as u64;
        let (mut ring, mut done, mut started) = (self.device, words(DONE_WORD), words(STARTED_WORD));
        let (mut generation, mut idle) = (self.generation + 1, self.idle.as_nanos() as u64);
        let mut args: [*mut c_void; 5] = [
            (&mut ring as *mut CUdeviceptr).cast(),
            (&mut done as *mut CUdeviceptr).cast(),
            (&mut started as *mut CUdeviceptr).cast(),
            (&mut generation as *mut u64).cast(),
            (&mut idle as *mut u64).cast(),
        ];
        cu!(cuLaunchKernel(self.func, 1, 1, 1, THREADS, 1, 1, 0, self.stream, args.as_mut_ptr(), ptr::null_mut()))?;
        self.generation = generation;
        self.launches += 1;
        self.posted = 0;
        Ok(())
    }

    /// Whether a declined copy or atomic asked for a launch
    /// ([`launch_if_wanted`](Self::launch_if_wanted) would launch).
    pub fn launch_wanted(&self) -> bool {
        self.launch_wanted
    }

    /// Launches a server if a declined copy asked for one; call once that copy is issued
    /// (with the device's context current), so the launch's 3 us of CPU overlap it.
    pub fn launch_if_wanted(&mut self) -> Result<(), DeviceError> {
        if std::mem::take(&mut self.launch_wanted) {
            self.launch()?;
        }
        Ok(())
    }

    /// Posts a copy to a server that runs; returns its sequence number, or None when the
    /// caller must use the copy engine: the ring is full, no server has been launched, the
    /// latest has not started yet, or it has left (then
    /// [`launch_if_wanted`](Self::launch_if_wanted) starts the next, unless the servers
    /// before made too few copies to pay: see [`USEFUL_COPIES`]). `enter` makes the
    /// device's context current, which only the rare launch below needs; `now` is the
    /// clock, read only when a copy is declined.
    ///
    /// # Safety
    /// `src..src+len` and `dst..dst+len` must be device memory the server's device reaches,
    /// readable and writable respectively until [`finished`](Self::finished) reports the
    /// copy done, as [`DeviceBackend::copy_async`](crate::device::DeviceBackend::copy_async)
    /// requires.
    pub unsafe fn post<G>(
        &mut self,
        (dst, src, len): (usize, usize, usize),
        enter: impl FnOnce() -> Result<G, DeviceError>,
        now: impl FnOnce() -> Instant,
    ) -> Result<Option<u64>, DeviceError> {
        if !self.may_post(false, now) {
            self.declined += 1;
            return Ok(None);
        }
        self.publish((dst as u64, src as u64, len as u64), enter).map(Some)
    }

    /// Posts a word atomic to a server that runs; returns its sequence number, or None
    /// when the caller must post it again later: the ring is full, or no server runs yet
    /// (then [`launch_if_wanted`](Self::launch_if_wanted) launches one, whatever the
    /// backoff: only the device can make the atomic). Collect its old value with
    /// [`atomic_result`](Self::atomic_result).
    ///
    /// # Safety
    /// `word` is an 8-byte aligned word of device memory the server's device reaches,
    /// valid until `atomic_result` returns its old value.
    pub unsafe fn post_atomic<G>(
        &mut self,
        word: usize,
        op: WordAtomic,
        enter: impl FnOnce() -> Result<G, DeviceError>,
    ) -> Result<Option<u64>, DeviceError> {
        if !self.may_post(true, Instant::now) {
            return Ok(None);
        }
        let seq = self.next;
        let (code, operand, compare) = atomic_code(op);
        let record = self.record(seq);
        // SAFETY: the record of `seq`'s slot, in the pinned allocation; the server no
        // longer reads it (descriptor seq - SLOTS was served, may_post checked) and its
        // last old value was collected (may_post checked the slot's bit).
        unsafe {
            record.write_volatile(operand);
            record.add(1).write_volatile(compare);
            record.add(2).write_volatile(0);
        }
        self.uncollected |= slot_bit(seq);
        let src = self.device + (RECORD_WORD as u64 + 4 * (seq % SLOTS)) * 8;
        // The tag's release (write_slot) publishes the record's words with the descriptor.
        self.publish((word as u64, src, ATOMIC_MARK | code), enter).map(Some)
    }

    /// The old value of atomic `seq` once the server made it, None before; never blocks
    /// (as [`finished`](Self::finished), which it polls).
    pub fn atomic_result<G>(
        &mut self,
        seq: u64,
        enter: impl FnOnce() -> Result<G, DeviceError>,
    ) -> Result<Option<u64>, DeviceError> {
        if !self.finished(seq, enter)? {
            return Ok(None);
        }
        debug_assert!(self.uncollected & slot_bit(seq) != 0, "atomic {seq} collected twice");
        // SAFETY: the record of `seq`'s slot, in the pinned allocation; the kernel stored
        // the old value before its release of the completion word, which `finished` read
        // with acquire, and the slot takes no new descriptor until its bit is cleared.
        let old = unsafe { self.record(seq).add(2).read_volatile() };
        self.uncollected &= !slot_bit(seq);
        Ok(Some(old))
    }

    /// The first word of descriptor `seq`'s atomic record.
    fn record(&self, seq: u64) -> *mut u64 {
        // SAFETY: RECORD_WORD + 4 * (seq % SLOTS) + 3 < HOST_BYTES / 8: inside the pinned
        // allocation (or the host-only tests' vector of the same size).
        unsafe { self.host.add(RECORD_WORD + 4 * (seq % SLOTS) as usize) }
    }

    /// Whether descriptor `self.next` may be posted now: room in the ring, its slot's
    /// atomic record collected, and a server that started and has not left. When none
    /// runs, a launch is wanted: for an atomic at once, for a copy (which the engine makes
    /// meanwhile) once the backoff allows.
    fn may_post(&mut self, atomic: bool, now: impl FnOnce() -> Instant) -> bool {
        if self.next - 1 - self.done() >= SLOTS || self.uncollected & slot_bit(self.next) != 0 {
            return false;
        }
        let word = self.started_word().load(Ordering::Acquire);
        if self.generation == 0 || word == self.generation | EXITED {
            // Judged either way (may_launch keeps the backoff's books).
            if self.may_launch(now()) || atomic {
                self.launch_wanted = true;
            }
            return false;
        }
        // Otherwise launched, not started (its start may wait for the application's
        // kernels), or running.
        word == self.generation
    }

    /// Writes descriptor `self.next` and makes sure a server will serve it; its sequence
    /// number. The caller checked [`may_post`](Self::may_post).
    fn publish<G>(
        &mut self,
        (dst, src, len): (u64, u64, u64),
        enter: impl FnOnce() -> Result<G, DeviceError>,
    ) -> Result<u64, DeviceError> {
        let seq = self.next;
        // Its slot's last descriptor (seq - SLOTS) was served, as may_post checked.
        self.write_slot(seq, dst, src, len);
        self.next += 1;
        // SeqCst, against the kernel's announcement of its exit and its fence.sc.sys: either
        // its last read of the ring saw this descriptor, or this load sees the announcement.
        fence(Ordering::SeqCst);
        if self.started_word().load(Ordering::Relaxed) != self.generation {
            // It may have left without this descriptor, which now waits for the next server.
            let _current = enter()?;
            self.launch()?;
        }
        // Counted for the server that serves it (the one just launched, in the race above).
        self.posted += 1;
        Ok(seq)
    }

    /// Whether a declined copy may launch a server at `now`: judges the server that left
    /// (once), and says no while the backoff its predecessors earned runs.
    fn may_launch(&mut self, now: Instant) -> bool {
        if self.generation != 0 && self.judged != self.generation {
            self.judged = self.generation;
            if self.posted < USEFUL_COPIES {
                self.backoff = (self.backoff * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF);
                self.launch_not_before = Some(now + self.backoff);
                tracing::debug!(
                    copies = self.posted,
                    backoff_us = self.backoff.as_micros() as u64,
                    "copy server left after few copies: small copies use the engine meanwhile"
                );
            } else {
                self.backoff = Duration::ZERO;
                self.launch_not_before = None;
            }
        }
        self.launch_not_before.is_none_or(|t| now >= t)
    }

    /// Whether copy `seq` has finished. Never blocks; a copy that waits long while no
    /// server runs gets one launched. `enter` makes the device's context current, which
    /// only that check needs.
    pub fn finished<G>(
        &mut self,
        seq: u64,
        enter: impl FnOnce() -> Result<G, DeviceError>,
    ) -> Result<bool, DeviceError> {
        if self.done() >= seq {
            self.stalled_polls = 0;
            return Ok(true);
        }
        self.stalled_polls += 1;
        if self.stalled_polls >= POLLS_PER_LIVENESS_CHECK {
            self.stalled_polls = 0;
            let _current = enter()?;
            match cu!(cuStreamQuery(self.stream)) {
                // Idle: the last server exited before it saw this copy.
                Ok(()) if self.done() < seq => self.launch()?,
                Ok(()) => return Ok(true),
                Err(f) if f.code == CUresult::CUDA_ERROR_NOT_READY => {}
                // A fault in the kernel (it only touches what the protocols validated).
                Err(f) => return Err(f.into()),
            }
        }
        Ok(false)
    }
}

impl Drop for CopyServer {
    /// Stops a running server (a descriptor of length `~0`) and waits for its stream.
    fn drop(&mut self) {
        tracing::info!(
            copies = self.next - 1,
            declined = self.declined,
            launches = self.launches,
            "copy server stopped"
        );
        if !self.stream.is_null() && !self.host.is_null() && self.generation > 0 {
            let seq = self.next;
            // If the ring is full of unserved copies, waiting for the stream below still
            // ends: the server serves them, then times out.
            if self.next - 1 - self.done() < SLOTS {
                self.write_slot(seq, 0, 0, u64::MAX);
            }
            warn_teardown(cu!(cuStreamSynchronize(self.stream)));
        }
        if !self.stream.is_null() {
            warn_teardown(cu!(cuStreamDestroy_v2(self.stream)));
        }
        if !self.host.is_null() {
            warn_teardown(cu!(cuMemFreeHost(self.host.cast())));
        }
        warn_teardown(cu!(cuModuleUnload(self.module)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `test` on a server over plain host memory and no driver objects, for the
    /// host's side of the protocol; the test plays the kernel by writing the completion
    /// and started words. The server is forgotten, not dropped (its Drop frees through
    /// the driver).
    fn with_host_only(test: impl FnOnce(&mut CopyServer)) {
        let mut mem = vec![0u64; HOST_BYTES / 8];
        let mut s = CopyServer::unstarted(ptr::null_mut(), Duration::from_micros(100));
        s.host = mem.as_mut_ptr();
        test(&mut s);
        std::mem::forget(s);
    }

    /// No driver here: a call that needs the context fails, which shows it was made.
    fn no_context() -> Result<(), DeviceError> {
        Err(DeviceError::Unsupported { op: "entering a context", backend: crate::device::BackendKind::Sim })
    }

    /// Posts a copy the way the backend does. No kernel runs in these tests, so the
    /// descriptor's addresses are never read or written.
    fn post(
        s: &mut CopyServer,
        copy: (usize, usize, usize),
        now: impl FnOnce() -> Instant,
    ) -> Result<Option<u64>, DeviceError> {
        // SAFETY: nothing serves the ring of a host-only server, so no copy is ever made.
        unsafe { s.post(copy, no_context, now) }
    }

    /// The host-only server's ring and words, as the kernel would read them.
    fn ring(s: &CopyServer) -> &[u64] {
        // SAFETY: `s.host` is the start of with_host_only's vector of HOST_BYTES / 8 words,
        // which outlives the test closure that holds `s`; nothing writes it while the
        // slice is read.
        unsafe { std::slice::from_raw_parts(s.host, HOST_BYTES / 8) }
    }

    /// What the kernel would take from slot `seq`: its fields if the tag matches.
    fn kernel_reads(mem: &[u64], seq: u64) -> Option<(u64, u64, u64)> {
        let w = &mem[4 * (seq % SLOTS) as usize..][..4];
        (w[3] == tag(seq, w[0], w[1], w[2])).then_some((w[0], w[1], w[2]))
    }

    #[test]
    fn copies_go_to_a_server_only_once_it_has_started() {
        with_host_only(|s| {
            // None launched yet: the engine takes the copy and one is wanted.
            assert_eq!(post(s, (0x1000, 0x2000, 8), Instant::now).unwrap(), None);
            assert!(std::mem::take(&mut s.launch_wanted));
            // Launched (generation 1), not started: the engine again, and no second launch.
            s.generation = 1;
            assert_eq!(post(s, (0x1000, 0x2000, 8), Instant::now).unwrap(), None);
            assert!(!s.launch_wanted);
            // Started: the copy goes to the ring, where the kernel finds it whole.
            s.started_word().store(1, Ordering::Release);
            assert_eq!(post(s, (0x1000, 0x2000, 8), Instant::now).unwrap(), Some(1));
            let ring = ring(s);
            assert_eq!(kernel_reads(ring, 1), Some((0x1000, 0x2000, 8)));
            assert_eq!(kernel_reads(ring, 2), None, "the next slot is not valid yet");
            assert_eq!(kernel_reads(ring, 1 + SLOTS), None, "nor is slot 1 for a later lap");
            // It left after one copy: the engine takes the next, and (see the backoff test) a
            // new server is wanted only once the backoff that earned has run.
            s.started_word().store(1 | EXITED, Ordering::Release);
            let t0 = Instant::now();
            assert_eq!(post(s, (0x1000, 0x2000, 8), || t0).unwrap(), None);
            assert!(!s.launch_wanted);
            assert_eq!(post(s, (0x1000, 0x2000, 8), || t0 + FIRST_BACKOFF).unwrap(), None);
            assert!(s.launch_wanted);
            assert_eq!(s.next, 2, "declined copies take no sequence number");
            assert_eq!(s.declined, 4, "none launched, one not started, two after it left");
        });
    }

    /// Plays the launch of generation `g` and its start.
    fn running(s: &mut CopyServer, g: u64) {
        s.generation = g;
        s.posted = 0;
        s.started_word().store(g, Ordering::Release);
    }

    /// Plays a server of generation `g` that starts, is posted `copies` copies, serves
    /// them and leaves.
    fn serve_and_leave(s: &mut CopyServer, g: u64, copies: u64) {
        running(s, g);
        for _ in 0..copies {
            assert!(post(s, (0x1000, 0x2000, 8), || unreachable!("no copy is declined")).unwrap().is_some());
            s.done_word().store(s.next - 1, Ordering::Release);
        }
        s.started_word().store(g | EXITED, Ordering::Release);
    }

    #[test]
    fn servers_that_make_few_copies_are_relaunched_after_a_growing_backoff() {
        with_host_only(|s| {
            let t0 = Instant::now();
            let declined_at = |s: &mut CopyServer, t: Duration| {
                assert_eq!(post(s, (0x1000, 0x2000, 8), || t0 + t).unwrap(), None);
                std::mem::take(&mut s.launch_wanted)
            };
            // A useful server: its successor is launched at the first copy that finds it gone.
            serve_and_leave(s, 1, USEFUL_COPIES);
            assert!(declined_at(s, Duration::ZERO));
            // Servers that made too few copies: 1 ms, then 2, 4, ... up to the cap, each
            // counted from the copy that found the server gone.
            let mut expected = FIRST_BACKOFF;
            let mut t = Duration::ZERO;
            for g in 2..12 {
                serve_and_leave(s, g, USEFUL_COPIES - 1);
                assert!(!declined_at(s, t), "generation {g}: launched with no backoff");
                assert!(
                    !declined_at(s, t + expected - Duration::from_micros(1)),
                    "generation {g}: backoff shorter than {expected:?}"
                );
                assert!(declined_at(s, t + expected), "generation {g}: backoff longer than {expected:?}");
                t += expected;
                expected = (expected * 2).min(MAX_BACKOFF);
            }
            assert_eq!(s.backoff, MAX_BACKOFF);
            // A useful server again: no backoff after it, and the next useless one starts over.
            serve_and_leave(s, 12, USEFUL_COPIES);
            assert!(declined_at(s, t));
            serve_and_leave(s, 13, 0);
            assert!(!declined_at(s, t));
            assert!(declined_at(s, t + FIRST_BACKOFF));
        });
    }

    #[test]
    fn a_full_ring_sends_copies_to_the_engine_until_the_server_catches_up() {
        with_host_only(|s| {
            running(s, 3);
            for i in 1..=SLOTS {
                assert_eq!(post(s, (0x1000 + i as usize, 0x9000, 8), Instant::now).unwrap(), Some(i));
            }
            assert_eq!(post(s, (0x1000, 0x9000, 8), Instant::now).unwrap(), None, "ring full");
            assert!(!s.launch_wanted, "a full ring is no reason to launch");
            assert_eq!(s.declined, 1);
            // The kernel served copy 1: its slot takes copy SLOTS + 1.
            s.done_word().store(1, Ordering::Release);
            assert_eq!(post(s, (0x7777, 0x9000, 16), Instant::now).unwrap(), Some(SLOTS + 1));
            let ring = ring(s);
            assert_eq!(kernel_reads(ring, SLOTS + 1), Some((0x7777, 0x9000, 16)));
            assert_eq!(kernel_reads(ring, 2), Some((0x1002, 0x9000, 8)), "unserved copies stay intact");
        });
    }

    #[test]
    fn a_stalled_copy_makes_the_host_check_that_a_server_runs() {
        with_host_only(|s| {
            running(s, 1);
            let seq = post(s, (0x1000, 0x2000, 8), Instant::now).unwrap().unwrap();
            for _ in 1..POLLS_PER_LIVENESS_CHECK {
                assert!(!s.finished(seq, no_context).unwrap(), "polls before the check need no driver");
            }
            assert!(s.finished(seq, no_context).is_err(), "the check asks the driver about the server's stream");
            s.done_word().store(seq, Ordering::Release);
            assert!(s.finished(seq, no_context).unwrap());
        });
    }

    /// Posts a word atomic the way the backend does; the word is never touched (no kernel).
    fn post_atomic(s: &mut CopyServer, op: WordAtomic) -> Option<u64> {
        // SAFETY: nothing serves the ring of a host-only server, so the word is never read.
        unsafe { s.post_atomic(0x4000, op, no_context) }.unwrap()
    }

    #[test]
    fn atomics_launch_a_server_whatever_the_backoff_and_wait_for_it() {
        with_host_only(|s| {
            // A server that made too few copies left: copies wait out a backoff...
            serve_and_leave(s, 1, 0);
            let t0 = Instant::now();
            assert_eq!(post(s, (0x1000, 0x2000, 8), || t0).unwrap(), None);
            assert!(!std::mem::take(&mut s.launch_wanted), "a copy launches nothing during the backoff");
            // ...an atomic does not (only the device can make it), and is not taken until
            // a server runs.
            assert_eq!(post_atomic(s, WordAtomic::FetchAdd(1)), None);
            assert!(std::mem::take(&mut s.launch_wanted), "an atomic launches a server at once");
            s.generation = 2;
            assert_eq!(post_atomic(s, WordAtomic::FetchAdd(1)), None, "launched, not started");
            assert_eq!(s.declined, 1, "atomics are not copies declined to the engine");
        });
    }

    #[test]
    fn an_atomic_descriptor_carries_its_record_and_returns_the_old_value() {
        with_host_only(|s| {
            running(s, 1);
            let seq = post_atomic(s, WordAtomic::CompareSwap { expected: 7, desired: 9 }).unwrap();
            let ring = ring(s);
            let (dst, src, len) = kernel_reads(ring, seq).expect("a whole descriptor");
            assert_eq!((dst, len), (0x4000, ATOMIC_MARK | 1), "the word, and the mark with cas's code");
            assert_eq!((len >> 62, len == u64::MAX), (1, false), "the kernel tells it from a copy and the stop");
            let rec = RECORD_WORD + 4 * (seq % SLOTS) as usize;
            assert_eq!(src, s.device + rec as u64 * 8, "the record as the device addresses it");
            assert_eq!(&ring[rec..rec + 3], &[9, 7, 0], "operand (desired), compare (expected), old");
            // Not made yet; then the kernel stores the old value and completes it.
            assert_eq!(s.atomic_result(seq, no_context).unwrap(), None);
            // SAFETY: the record's old-value word in the host-only server's vector.
            unsafe { s.record(seq).add(2).write_volatile(7) };
            s.done_word().store(seq, Ordering::Release);
            assert_eq!(s.atomic_result(seq, no_context).unwrap(), Some(7));
        });
    }

    #[test]
    fn a_slot_whose_old_value_is_uncollected_takes_no_descriptor() {
        with_host_only(|s| {
            running(s, 1);
            let first = post_atomic(s, WordAtomic::FetchAdd(5)).unwrap();
            for _ in 1..SLOTS {
                assert!(post(s, (0x1000, 0x2000, 8), Instant::now).unwrap().is_some());
            }
            // Everything is served, but the atomic's old value was not collected: its
            // slot (the next descriptor's) must not be overwritten.
            s.done_word().store(s.next - 1, Ordering::Release);
            assert_eq!(post(s, (0x1000, 0x2000, 8), Instant::now).unwrap(), None);
            assert_eq!(post_atomic(s, WordAtomic::Fetch), None);
            // SAFETY: as above.
            unsafe { s.record(first).add(2).write_volatile(41) };
            assert_eq!(s.atomic_result(first, no_context).unwrap(), Some(41));
            assert_eq!(post_atomic(s, WordAtomic::Swap(3)), Some(first + SLOTS));
            assert_eq!(&ring(s)[RECORD_WORD + 4 * (first % SLOTS) as usize..][..3], &[3, 0, 0]);
        });
    }

    #[test]
    fn tag_changes_with_every_field_and_the_sequence() {
        let t = tag(7, 0x1000, 0x2000, 8);
        assert_ne!(t, tag(8, 0x1000, 0x2000, 8));
        assert_ne!(t, tag(7, 0x1040, 0x2000, 8));
        assert_ne!(t, tag(7, 0x1000, 0x2040, 8));
        assert_ne!(t, tag(7, 0x1000, 0x2000, 16));
        // A read torn between a slot's old and new descriptor: with a plain XOR tag, old
        // fields differing from the new ones by seq ^ (seq - SLOTS) would pass.
        let (seq, d0) = (200u64, 0x7000u64);
        let d1 = d0 ^ seq ^ (seq - SLOTS);
        let old = tag(seq - SLOTS, d0, 0x2000, 8);
        assert_ne!(old, tag(seq, d1, 0x2000, 8));
    }

    #[test]
    fn kernel_ring_size_is_slots() {
        assert!(SOURCE.contains(&format!("% {SLOTS}) + lane % 4];  // {SLOTS}: SLOTS")));
    }

    #[test]
    fn done_word_has_a_cache_line_of_its_own() {
        assert!(DONE_WORD * 8 >= SLOTS as usize * 32 + 64);
        assert_eq!(DONE_WORD * 8 % 64, 0);
        assert_eq!((STARTED_WORD - DONE_WORD) * 8, 64);
    }
}
