//! Tests of the CUDA backend: the driver wrapper here, and (ignored without a GPU) the
//! backend's operations on real devices.

use super::driver::{CuFailure, REQUIRED_SYMBOLS};
use super::*;
use crate::device::{Copy2d, IPC_HANDLE_BYTES};

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
    let mut bytes = [0u8; 64];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (i * 37 + 200) as u8;
    }
    let h = crate::device::shareable::legacy_handle(&bytes);
    assert_eq!(to_raw_handle(&h).reserved.map(|c| c as u8), bytes);
}

#[test]
fn open_errors_keep_their_meaning() {
    let fail = |code| open_error(CuFailure { call: "cuIpcOpenMemHandle_v2", code });
    assert!(matches!(fail(CUresult::CUDA_ERROR_INVALID_VALUE), DeviceError::BadHandle { .. }));
    assert!(matches!(fail(CUresult::CUDA_ERROR_ALREADY_MAPPED), DeviceError::DoubleOpen { .. }));
    assert!(matches!(fail(CUresult::CUDA_ERROR_OUT_OF_MEMORY), DeviceError::Driver { .. }));
}

/// Identifiers of driver functions called in the code (not the tests) of the backend's
/// files, the copy server's included.
fn called_symbols() -> std::collections::BTreeSet<String> {
    let sources = [
        include_str!("mod.rs"),
        include_str!("driver.rs"),
        include_str!("memory.rs"),
        include_str!("kinds.rs"),
        include_str!("copies.rs"),
        include_str!("copy_2d.rs"),
        include_str!("copy_server.rs"),
    ];
    let mut found = std::collections::BTreeSet::new();
    for (src, marker) in sources.into_iter().flat_map(|src| [(src, "cu!("), (src, "sys::")]) {
        // An inline test module ends the code; `mod tests;` (this file) does not.
        let code = src.find("#[cfg(test)]\nmod tests {").map_or(src, |end| &src[..end]);
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

/// Polls until the copy is reported done; fails if that takes 10 s (a copy of these tests
/// takes milliseconds at most).
fn poll_until_done(b: &CudaBackend, t: CopyTicket) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !b.copy_poll(t).expect("copy_poll") {
        assert!(std::time::Instant::now() < deadline, "copy {t:?} never reported done");
        std::hint::spin_loop();
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Copies until the copy server of `engine` takes one; fails after 2 s.
///
/// # Safety
/// As [`CudaBackend::copy_until_served`]'s.
unsafe fn copy_by_server(b: &CudaBackend, engine: DevId, dst: usize, src: usize, len: usize) {
    // SAFETY: this function's contract.
    let copies = unsafe { b.copy_until_served(engine, (dst, src, len), std::time::Duration::from_secs(2)) }.unwrap();
    assert!(copies.is_some(), "the copy server never took a copy");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_copy_server_makes_small_device_copies() {
    let b = backend();
    // SAFETY: every address lies in `p`, `q` or `r` (allocations of `b` of `len` bytes) or in
    // this test's vectors, all live until freed at the end. Every copy is waited for before
    // its memory is read, written again or freed; the window's 256 copies write distinct
    // 4 KiB pieces of `q` and are all waited for before it is read.
    unsafe {
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
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_copy_server_reads_a_rewritten_source_afresh() {
    let b = backend();
    // SAFETY: `p` and `q` are allocations of 4 KiB of `b`, `h` 4 KiB of its pinned memory,
    // the other ends this test's vectors; every copy is waited for before its memory is
    // read, written again or freed.
    unsafe {
        b.enable_copy_server(0, 4096, std::time::Duration::from_secs(1)).unwrap();
        let (p, q) = (b.alloc(0, 4096).unwrap(), b.alloc(0, 4096).unwrap());
        let mut back = vec![0u8; 4096];
        // The same source again and again, rewritten by the engine between the server's
        // copies: the server must not serve lines its SM cached from the last round.
        for round in 0..64u8 {
            let src = pattern(4096, round);
            b.copy_sync(p, src.as_ptr() as usize, 4096).unwrap();
            copy_by_server(&b, 0, q, p, 4096);
            b.copy_sync(back.as_mut_ptr() as usize, q, 4096).unwrap();
            assert!(back == src, "round {round}: stale bytes from the server");
        }
        // The same from pinned memory the host rewrites (a recycled staging buffer), both
        // ways through copy_sync, which the server makes for pinned memory.
        let h = b.alloc_host_mapped(4096).unwrap();
        for round in 0..64u8 {
            let src = pattern(4096, round ^ 0x5a);
            std::ptr::copy_nonoverlapping(src.as_ptr(), h.host as *mut u8, 4096);
            copy_by_server(&b, 0, q, h.host, 4096);
            b.copy_sync(back.as_mut_ptr() as usize, q, 4096).unwrap();
            assert!(back == src, "round {round}: stale bytes from pinned memory");
            b.copy_sync(h.host, p, 4096).unwrap();
            let pinned = std::slice::from_raw_parts(h.host as *const u8, 4096);
            assert!(pinned == pattern(4096, 63), "round {round}: the server's copy into pinned memory");
        }
        b.free_host_mapped(h.host).unwrap();
        b.free(q).unwrap();
        b.free(p).unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_word_atomics_are_made_by_the_device() {
    use crate::device::{wait_word_atomic, WordAtomic};
    let b = backend();
    let w = b.alloc(0, 64).unwrap();
    let zero = [0u64; 8];
    // SAFETY: `w` is an allocation of 64 bytes of `b`, live until freed at the end; every
    // atomic and copy on it is waited for before the next reads it.
    unsafe {
        b.copy_sync(w, zero.as_ptr() as usize, 64).unwrap();
        // No copy server enabled: the first atomic starts one.
        assert_eq!(wait_word_atomic(&b, 0, w, WordAtomic::FetchAdd(5)).unwrap(), 0);
        assert_eq!(wait_word_atomic(&b, 0, w, WordAtomic::FetchAdd(2)).unwrap(), 5);
        assert_eq!(wait_word_atomic(&b, 0, w, WordAtomic::CompareSwap { expected: 6, desired: 1 }).unwrap(), 7);
        assert_eq!(wait_word_atomic(&b, 0, w, WordAtomic::CompareSwap { expected: 7, desired: 1 }).unwrap(), 7);
        assert_eq!(wait_word_atomic(&b, 0, w, WordAtomic::Swap(40)).unwrap(), 1);
        assert_eq!(wait_word_atomic(&b, 0, w, WordAtomic::Fetch).unwrap(), 40);
        // Misaligned: refused before anything is posted.
        assert!(b.word_atomic_start(0, w + 4, WordAtomic::Fetch).is_err());
        // Four threads, 500 adds each to the next word, many in flight at once through
        // the ring: every add counts and each old value is seen once.
        let olds: Vec<u64> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    sc.spawn(|| {
                        (0..500)
                            .map(|_| wait_word_atomic(&b, 0, w + 8, WordAtomic::FetchAdd(1)).unwrap())
                            .collect::<Vec<u64>>()
                    })
                })
                .collect();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect::<Vec<u64>>()
        });
        let mut sorted = olds;
        sorted.sort_unstable();
        assert_eq!(sorted, (0..2000).collect::<Vec<u64>>());
        let mut back = [0u64; 2];
        b.copy_sync(back.as_mut_ptr() as usize, w, 16).unwrap();
        assert_eq!(back, [40, 2000]);
        b.free(w).unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_copies_at_high_priority_land() {
    let b = backend();
    // SAFETY: `p` and `q` are allocations of `len` bytes of `b`, the other ends this test's
    // vectors; every copy is waited for before its memory is read, written again or freed.
    unsafe {
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
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_backend_with_a_running_copy_server_drops() {
    let b = backend();
    // SAFETY: `p` and `q` are allocations of 64 bytes of `b`, and the copy is waited for;
    // they are released with the backend.
    unsafe {
        b.enable_copy_server(0, 4096, std::time::Duration::from_secs(3600)).unwrap();
        let (p, q) = (b.alloc(0, 64).unwrap(), b.alloc(0, 64).unwrap());
        copy_by_server(&b, 0, q, p, 64);
        // The server would idle for an hour: dropping the backend must stop it, not wait.
        let started = std::time::Instant::now();
        drop(b);
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_alloc_classify_copy_free() {
    let b = backend();
    // SAFETY: `src` is registered while it lives (unregistered before the end), `back` and
    // `src` outlive every copy on them, and `p` and `q` are allocations of `len` bytes of
    // `b` that nothing touches once freed. Every copy is waited for before its memory is
    // read, written again or freed; the two lanes' copies write distinct halves of `q`.
    unsafe {
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
        assert_eq!(host, PointerInfo::host(back.as_ptr() as usize));
        assert_eq!(b.pointer_info(src.as_ptr() as usize).unwrap().kind, MemoryKind::Host);
        b.unregister_host(src.as_ptr() as usize).unwrap();
        b.unregister_host(src.as_ptr() as usize).unwrap();
        assert!(matches!(b.alloc(b.device_count(), 1), Err(DeviceError::NoSuchDevice { .. })));
    }
}

/// Host-mapped memory: zeroed, host memory to pointer_info, reachable by the copy engine
/// both ways, and at a device address the driver maps (what a GIO queue needs).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_host_mapped_memory() {
    let b = backend();
    let len = 3 << 20;
    let m = b.alloc_host_mapped(len).unwrap();
    assert_ne!(m.device, 0);
    assert_eq!(m.len, len);
    // SAFETY: `m` is ours, `len` bytes, and nothing else touches it until it is freed;
    // `p` is an allocation of `len` bytes; every copy is waited for before its memory is
    // read or freed.
    unsafe {
        let bytes = std::slice::from_raw_parts_mut(m.host as *mut u8, len);
        assert!(bytes.iter().all(|&x| x == 0), "host-mapped memory starts zeroed");
        assert_eq!(b.pointer_info(m.host).unwrap().kind, MemoryKind::Host);
        let p = b.alloc(0, len).unwrap();
        bytes.copy_from_slice(&pattern(len, 9));
        poll_until_done(&b, b.copy_async(0, 16, p, m.host, len).unwrap());
        bytes.fill(0);
        poll_until_done(&b, b.copy_async(0, 16, m.host, p, len).unwrap());
        assert!(bytes == pattern(len, 9), "round trip through the copy engine");
        b.free(p).unwrap();
        b.free_host_mapped(m.host).unwrap();
    }
}

#[test]
#[ignore = "needs two CUDA GPUs"]
fn gpu_peer_copies() {
    let b = backend();
    // SAFETY: `a` and `c` are allocations of `len` bytes of `b`, the other ends this test's
    // vectors; every copy is waited for before its memory is read, written again or freed,
    // and the timed copies into `c` run one after another.
    unsafe {
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
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_window_of_copies_reports_each_only_once_landed() {
    // Only the newest copy of a stream goes without an event; the ones before it get
    // theirs when the next is queued. Whatever order they are polled in, a copy that
    // reports done must have landed, and a zero-length copy is done at once.
    let b = backend();
    // SAFETY: every address is in `srcs` or `dsts` (allocations of `len` bytes of `b`) or in
    // this test's vectors; each window's copies write distinct buffers and are all waited
    // for before the next window rewrites them, and nothing touches a buffer once freed.
    unsafe {
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
}

/// Small copies one after another, each polled to completion: every one is reported done
/// once its own bytes have landed (each copy moves a distinct pattern to a slot of its own,
/// so a copy reported done early, or one that landed another's bytes, shows), and a ticket
/// reported done is consumed: polling it again is an error every time. Timing such copies
/// is `copy_probe`'s job, not a test's.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_small_copies_report_done_once_landed() {
    let b = backend();
    // SAFETY: `p` and `q` are allocations of `reps * len` bytes of `b`, the other ends this
    // test's vectors; every copy is waited for before its slot is read, and nothing touches
    // `p` or `q` once freed.
    unsafe {
        let (reps, len) = (2_000usize, 8usize);
        let want = pattern(reps * len, 5);
        let (p, q) = (b.alloc(0, reps * len).unwrap(), b.alloc(0, reps * len).unwrap());
        b.copy_sync(p, want.as_ptr() as usize, reps * len).unwrap();
        b.copy_sync(q, vec![0u8; reps * len].as_ptr() as usize, reps * len).unwrap();
        let mut slot = [0u8; 8];
        for i in 0..reps {
            let at = i * len;
            let t = b.copy_async(0, 0, q + at, p + at, len).unwrap();
            poll_until_done(&b, t);
            b.copy_sync(slot.as_mut_ptr() as usize, q + at, len).unwrap();
            assert_eq!(slot[..], want[at..at + len], "copy {i} reported done before its bytes landed");
            assert!(matches!(b.copy_poll(t), Err(DeviceError::InvalidPointer { .. })), "copy {i} reported done twice");
        }
        let mut back = vec![0u8; reps * len];
        b.copy_sync(back.as_mut_ptr() as usize, q, reps * len).unwrap();
        assert!(back == want, "a later copy overwrote an earlier one's slot");
        // A consumed ticket stays consumed, however often it is polled.
        let t = b.copy_async(0, 0, q, p, len).unwrap();
        poll_until_done(&b, t);
        for _ in 0..10_000 {
            assert!(
                matches!(b.copy_poll(t), Err(DeviceError::InvalidPointer { .. })),
                "a consumed ticket reported again"
            );
        }
        b.free(p).unwrap();
        b.free(q).unwrap();
    }
}

const IPC_ENV: &str = "GPULMT_TEST_CUDA_IPC";

/// Parent half of the IPC test: exports an allocation and runs [`gpu_ipc_child`] in a child
/// process (the driver refuses to open a handle in the process that exported it).
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_ipc_across_processes() {
    let b = backend();
    // SAFETY: `p` and `freed` are allocations of `len` bytes of `b`, filled from `src`; the
    // child has exited before `p` is freed, and nothing touches `freed` once freed.
    unsafe {
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
    // SAFETY: `m` maps the parent's allocation of at least `len` bytes, which the parent keeps
    // until this process exits; the copy into `back` is waited for before the mapping is
    // closed, and nothing touches a closed mapping.
    unsafe {
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

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_copies_2d_move_strided_blocks_between_host_and_device() {
    let b = backend();
    let len = 1 << 16;
    let shapes = [
        // A column of 8-byte elements out of 1 KiB rows; strided at both ends; contiguous.
        Copy2d { width: 8, height: 64, dst_pitch: 8, src_pitch: 1024 },
        Copy2d { width: 24, height: 50, dst_pitch: 100, src_pitch: 40 },
        Copy2d { width: 256, height: 8, dst_pitch: 256, src_pitch: 256 },
    ];
    let expect = |mut dst: Vec<u8>, src: &[u8], s: Copy2d| {
        for i in 0..s.height {
            dst[i * s.dst_pitch..][..s.width].copy_from_slice(&src[i * s.src_pitch..][..s.width]);
        }
        dst
    };
    // SAFETY: every address lies in `p` or `q` (allocations of `b` of `len` bytes) or in this
    // test's vectors of `len` bytes, live until the end; every shape's spans fit in `len`.
    // Each copy is waited for before its destination is read or written again.
    unsafe {
        let (p, q) = (b.alloc(0, len).unwrap(), b.alloc(0, len).unwrap());
        let src = pattern(len, 7);
        for s in shapes {
            let zeros = vec![0u8; len];
            b.copy_sync(p, zeros.as_ptr() as usize, len).unwrap();
            b.copy_sync(q, zeros.as_ptr() as usize, len).unwrap();
            // Host to device asynchronously, device to device, device to host synchronously.
            let t = b.copy_2d_async(0, 1, p, src.as_ptr() as usize, s).unwrap();
            poll_until_done(&b, t);
            let same = Copy2d { src_pitch: s.dst_pitch, ..s };
            let t = b.copy_2d_async(0, 1, q, p, same).unwrap();
            poll_until_done(&b, t);
            let mut back = vec![0u8; len];
            b.copy_2d_sync(back.as_mut_ptr() as usize, q, same).unwrap();
            let on_p = expect(zeros.clone(), &src, s);
            assert!(back == expect(zeros, &on_p, same), "{s:?}");
        }
        let overlap = Copy2d { width: 8, height: 2, dst_pitch: 4, src_pitch: 8 };
        assert!(matches!(b.copy_2d_sync(p, q, overlap), Err(DeviceError::BadShape { .. })));
        b.free(p).unwrap();
        b.free(q).unwrap();
    }
}
