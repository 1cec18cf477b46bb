//! Tests of the sim backend: allocation, IPC rules between instances and processes,
//! copies, configuration.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::*;
use crate::device::IPC_HANDLE_BYTES;
use crate::shm::object::SIM_PREFIX;

fn backend(devices: u32, peer: PeerMatrix, ipc_open_us: u64) -> SimBackend {
    SimBackend::new(SimConfig {
        devices,
        peer,
        ipc_open_us,
        copy_inline: false,
        copy_done_ns: 0,
        driver: None,
        refuse_opens: false,
    })
    .expect("valid config")
}

fn two() -> SimBackend {
    backend(2, PeerMatrix::All, 0)
}

fn shm_path(b: &SimBackend, buffer_id: u64) -> std::path::PathBuf {
    format!("/dev/shm/{SIM_PREFIX}{}-{:016x}-{buffer_id}", b.pid, b.nonce).into()
}

/// Writes `bytes` at `ptr` through the backend.
///
/// # Safety
/// `ptr..ptr+bytes.len()` is memory of `b` (an allocation or an open mapping) that
/// nothing else accesses meanwhile.
unsafe fn fill(b: &SimBackend, ptr: usize, bytes: &[u8]) {
    // SAFETY: the destination by this function's contract; the source is the slice.
    unsafe { b.copy_sync(ptr, bytes.as_ptr() as usize, bytes.len()) }.unwrap();
}

/// Reads `len` bytes at `ptr` through the backend.
///
/// # Safety
/// `ptr..ptr+len` is memory of `b` (an allocation or an open mapping) that nothing
/// writes meanwhile.
unsafe fn read(b: &SimBackend, ptr: usize, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: the source by this function's contract; the destination is `v`.
    unsafe { b.copy_sync(v.as_mut_ptr() as usize, ptr, len) }.unwrap();
    v
}

fn wait(b: &SimBackend, t: CopyTicket) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !b.copy_poll(t).unwrap() {
        assert!(Instant::now() < deadline, "copy {t:?} did not complete");
        std::thread::yield_now();
    }
}

fn mappers_of(b: &SimBackend, ptr: usize) -> u32 {
    let st = lock(&b.state);
    let Some(Region::Local(l)) = st.regions.get(&ptr) else { panic!("not local") };
    header(&l.map).mappers.load(Ordering::SeqCst)
}

#[test]
fn alloc_free_pointer_info() {
    let b = two();
    let p = b.alloc(1, 10_000).unwrap();
    assert_eq!(p % 4096, 0);
    let info = b.pointer_info(p + 9_999).unwrap();
    assert_eq!(info.kind, MemoryKind::Device(1));
    assert_eq!((info.base, info.size), (p, 10_000));
    assert!(info.buffer_id > 0);
    // One past the end, and the header page, are not device memory.
    assert_eq!(b.pointer_info(p + 10_000).unwrap().kind, MemoryKind::Host);
    assert_eq!(b.pointer_info(p - 1).unwrap().kind, MemoryKind::Host);
    let host = 0x1234usize;
    assert_eq!(b.pointer_info(host).unwrap(), PointerInfo::host(host));
    // The object exists with mode 0600 and the rounded size.
    let path = shm_path(&b, info.buffer_id);
    let md = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(md.permissions().mode() & 0o777, 0o600);
    assert_eq!(md.len(), 4096 + 12_288);

    // Only an allocation's base can be freed, and only once.
    // SAFETY: no copy runs on `p` and nothing touches it after it is freed; the refused
    // calls release nothing.
    unsafe {
        assert!(matches!(b.free(p + 1), Err(DeviceError::InvalidPointer { .. })));
        b.free(p).unwrap();
        assert!(!path.exists(), "free must unlink the object");
        assert!(matches!(b.free(p), Err(DeviceError::InvalidPointer { .. })));
    }
    assert_eq!(b.pointer_info(p).unwrap().kind, MemoryKind::Host);
    assert!(matches!(b.alloc(2, 1), Err(DeviceError::NoSuchDevice { dev: 2, count: 2 })));

    // Zero-size allocations get a byte.
    let z = b.alloc(0, 0).unwrap();
    assert_eq!(b.pointer_info(z).unwrap().size, 1);
    // SAFETY: an allocation of this test that nothing uses.
    unsafe { b.free(z) }.unwrap();
}

#[test]
fn recycled_address_gets_new_buffer_id() {
    let b = two();
    let mut seen = HashSet::new();
    let mut reused = false;
    let mut last: Option<(usize, u64)> = None;
    for _ in 0..64 {
        let p = b.alloc(0, 8192).unwrap();
        let id = b.pointer_info(p).unwrap().buffer_id;
        assert!(seen.insert(id), "buffer id {id} reused");
        if let Some((lp, lid)) = last {
            if lp == p {
                reused = true;
                assert_ne!(lid, id);
            }
        }
        last = Some((p, id));
        // SAFETY: an allocation of this test that nothing uses.
        unsafe { b.free(p) }.unwrap();
    }
    // mmap normally hands the hole straight back; if it never did, the id check
    // above still covered every allocation.
    if !reused {
        eprintln!("note: the kernel never recycled an address in this run");
    }
}

#[test]
fn export_open_close_between_instances() {
    let owner = two();
    let peer = two();
    let p = owner.alloc(1, 5000).unwrap();
    let id = owner.pointer_info(p).unwrap().buffer_id;
    // SAFETY: an allocation of 5000 bytes of `owner`.
    unsafe { fill(&owner, p, &[7u8; 5000]) };

    assert!(matches!(owner.export_handle(p + 8), Err(DeviceError::InvalidPointer { .. })));
    let h = owner.export_handle(p).unwrap();
    // A process cannot open its own handle.
    assert!(matches!(owner.open_handle(&h, 0), Err(DeviceError::BadHandle { .. })));

    let m = peer.open_handle(&h, 0).unwrap();
    assert_eq!(m.size, 5000);
    assert_eq!(mappers_of(&owner, p), 1);
    let info = peer.pointer_info(m.ptr + 4999).unwrap();
    assert_eq!(info, PointerInfo::device(1, m.ptr, 5000, id, crate::device::AllocKind::Legacy));
    // Shared pages: writes on either side are seen by the other.
    // SAFETY: `m` maps `p`'s 5000 bytes; each access is made and finished by one call.
    unsafe {
        assert_eq!(read(&peer, m.ptr, 5000), vec![7u8; 5000]);
        fill(&peer, m.ptr + 100, b"peer");
        assert_eq!(read(&owner, p + 100, 4), b"peer");
    }

    // The second open of one handle is rejected, as by the CUDA driver.
    assert_eq!(peer.open_handle(&h, 1), Err(DeviceError::DoubleOpen { owner: std::process::id(), buffer_id: id }));
    // SAFETY: no copy runs on the mappings or on `p`, and nothing touches them once
    // closed or freed; the refused close releases nothing.
    unsafe {
        peer.close_handle(m).unwrap();
        assert_eq!(mappers_of(&owner, p), 0);
        assert_eq!(peer.pointer_info(m.ptr).unwrap().kind, MemoryKind::Host);
        assert!(matches!(peer.close_handle(m), Err(DeviceError::InvalidPointer { .. })));
        // Closed, it can be opened again.
        let m2 = peer.open_handle(&h, 1).unwrap();
        peer.close_handle(m2).unwrap();
        owner.free(p).unwrap();
    }
    // Freed: the handle is dead.
    assert!(matches!(peer.open_handle(&h, 0), Err(DeviceError::BadHandle { .. })));
}

#[test]
fn concurrent_opens_of_one_handle_only_one_wins() {
    let owner = two();
    let peer = Arc::new(backend(2, PeerMatrix::All, 2_000));
    let p = owner.alloc(0, 64).unwrap();
    let h = owner.export_handle(p).unwrap();
    let results: Vec<_> = (0..4)
        .map(|_| {
            let peer = peer.clone();
            std::thread::spawn(move || peer.open_handle(&h, 0))
        })
        .map(|t| t.join().unwrap())
        .collect();
    let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(ok.len(), 1, "{results:?}");
    assert!(results.iter().filter(|r| r.is_err()).all(|r| matches!(r, Err(DeviceError::DoubleOpen { .. }))));
    // SAFETY: no copy runs on the mapping or on `p`, and nothing touches them afterwards.
    unsafe {
        peer.close_handle(*ok[0]).unwrap();
        owner.free(p).unwrap();
    }
}

#[test]
fn forged_handles_are_rejected() {
    let owner = two();
    let peer = two();
    let p = owner.alloc(0, 100).unwrap();
    let h = owner.export_handle(p).unwrap();
    let f = HandleFields::decode(&h).unwrap();
    let is_bad = |r: Result<Mapping, DeviceError>| matches!(r, Err(DeviceError::BadHandle { .. }));

    let mut magic = h;
    magic.0[0] ^= 0xff;
    assert!(is_bad(peer.open_handle(&magic, 0)));
    let mut version = h;
    version.0[8] = 9;
    assert!(is_bad(peer.open_handle(&version, 0)));
    // Same page count, different size: caught by the header.
    assert!(is_bad(peer.open_handle(&HandleFields { size: 200, ..f }.encode(), 0)));
    // Larger size: caught by the object's length before mapping.
    assert!(is_bad(peer.open_handle(&HandleFields { size: 1 << 20, ..f }.encode(), 0)));
    // Wrong device: caught by the header.
    assert!(is_bad(peer.open_handle(&HandleFields { device: 1, ..f }.encode(), 0)));
    // No such object.
    assert!(is_bad(peer.open_handle(&HandleFields { buffer_id: u64::MAX, ..f }.encode(), 0)));
    assert!(is_bad(peer.open_handle(&HandleFields { nonce: f.nonce ^ 1, ..f }.encode(), 0)));
    assert!(is_bad(peer.open_handle(&IpcHandle([0; IPC_HANDLE_BYTES]), 0)));
    // Failed opens leave nothing behind: the genuine handle still opens.
    assert_eq!(mappers_of(&owner, p), 0);
    let m = peer.open_handle(&h, 0).unwrap();
    // SAFETY: no copy runs on the mapping or on `p`, and nothing touches them afterwards.
    unsafe {
        peer.close_handle(m).unwrap();
        owner.free(p).unwrap();
    }
}

#[test]
fn free_while_mapped_is_reported_and_pages_survive() {
    let owner = two();
    let peer = two();
    let p = owner.alloc(0, 4096).unwrap();
    let id = owner.pointer_info(p).unwrap().buffer_id;
    let h = owner.export_handle(p).unwrap();
    let m = peer.open_handle(&h, 1).unwrap();
    // SAFETY: no copy runs on `p`, and the owner does not touch it after freeing it; the
    // peer's mapping keeps its own pages, used by one call at a time until it is closed.
    unsafe {
        assert_eq!(owner.free(p), Err(DeviceError::FreedWhileMapped { ptr: p, buffer_id: id, mappers: 1 }));
        // Released locally all the same.
        assert_eq!(owner.pointer_info(p).unwrap().kind, MemoryKind::Host);
        assert!(!shm_path(&owner, id).exists());
        // The peer's pages are still there.
        fill(&peer, m.ptr, b"alive");
        assert_eq!(read(&peer, m.ptr, 5), b"alive");
        peer.close_handle(m).unwrap();
    }
    // A fresh open of the freed allocation fails.
    assert!(matches!(peer.open_handle(&h, 1), Err(DeviceError::BadHandle { .. })));
}

#[test]
fn peer_access_is_enforced_on_open() {
    let owner = backend(3, PeerMatrix::parse("0-2").unwrap(), 0);
    let peer = backend(3, PeerMatrix::parse("0-2").unwrap(), 0);
    assert!(peer.can_access_peer(2, 0) && peer.can_access_peer(1, 1));
    assert!(!peer.can_access_peer(0, 1) && !peer.can_access_peer(0, 3));
    let p = owner.alloc(0, 64).unwrap();
    let h = owner.export_handle(p).unwrap();
    match peer.open_handle(&h, 1) {
        Err(DeviceError::Driver { call: "cuIpcOpenMemHandle", message, .. }) => {
            assert!(message.contains("peer access unavailable"), "{message}")
        }
        other => panic!("expected a peer-access error, got {other:?}"),
    }
    assert!(matches!(peer.open_handle(&h, 7), Err(DeviceError::NoSuchDevice { dev: 7, count: 3 })));
    // The failed opens released their reservation and left no mapper behind.
    assert_eq!(mappers_of(&owner, p), 0);
    let m = peer.open_handle(&h, 2).unwrap();
    // SAFETY: no copy runs on the mapping or on `p`, and nothing touches them afterwards.
    unsafe {
        peer.close_handle(m).unwrap();
        owner.free(p).unwrap();
    }

    let isolated = backend(2, PeerMatrix::NoPeers, 0);
    let owner2 = backend(2, PeerMatrix::NoPeers, 0);
    let q = owner2.alloc(1, 64).unwrap();
    let h2 = owner2.export_handle(q).unwrap();
    assert!(matches!(isolated.open_handle(&h2, 0), Err(DeviceError::Driver { .. })));
    let m = isolated.open_handle(&h2, 1).unwrap();
    // SAFETY: no copy runs on the mapping or on `q`, and nothing touches them afterwards.
    unsafe {
        isolated.close_handle(m).unwrap();
        owner2.free(q).unwrap();
    }
}

#[test]
fn open_cost_is_honoured() {
    let owner = two();
    let peer = backend(2, PeerMatrix::All, 20_000);
    let p = owner.alloc(0, 64).unwrap();
    let h = owner.export_handle(p).unwrap();
    let t = Instant::now();
    let m = peer.open_handle(&h, 0).unwrap();
    let took = t.elapsed();
    assert!(took >= Duration::from_micros(20_000), "open took {took:?}");
    // SAFETY: no copy runs on the mapping or on `p`, and nothing touches them afterwards.
    unsafe {
        peer.close_handle(m).unwrap();
        owner.free(p).unwrap();
    }
}

#[test]
fn engine_copies_complete_with_right_data() {
    let b = two();
    let len = 3 << 20;
    let d0 = b.alloc(0, len).unwrap();
    let d1 = b.alloc(1, len).unwrap();
    let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
    let mut dst = vec![0u8; len];

    // SAFETY: every address is in `d0` or `d1` (`len` bytes each, allocations of `b`) or in
    // a vector or array of this test, all live until the end of the test. Each copy is
    // waited for before its destination is read; the 32 copies into `d0` run one after
    // another on one engine and are all waited for before it is read. Nothing touches `d0`
    // or `d1` once freed, and refused calls access nothing.
    unsafe {
        let t = b.copy_async(0, 0, d0, src.as_ptr() as usize, len).unwrap();
        wait(&b, t);
        let t = b.copy_async(1, 3, d1, d0, len).unwrap();
        wait(&b, t);
        let t = b.copy_async(1, 0, dst.as_mut_ptr() as usize, d1, len).unwrap();
        wait(&b, t);
        assert!(dst == src);
        // A done ticket is consumed.
        assert!(matches!(b.copy_poll(t), Err(DeviceError::Driver { call: "copy_poll", .. })));
        assert!(b.copy_poll(CopyTicket(u64::MAX)).is_err());

        // Copies on one engine run in submission order: the last write wins.
        let a = [1u8; 4096];
        let c = [2u8; 4096];
        let tickets: Vec<_> = (0..32)
            .map(|i| {
                let s = if i % 2 == 0 { &a } else { &c };
                b.copy_async(0, i, d0, s.as_ptr() as usize, 4096).unwrap()
            })
            .collect();
        for t in tickets {
            wait(&b, t);
        }
        assert_eq!(read(&b, d0, 4096), vec![2u8; 4096]);

        // Zero-length copies are done at once; bad engines and overruns are refused.
        let t = b.copy_async(1, 0, 0, 0, 0).unwrap();
        assert!(b.copy_poll(t).unwrap());
        assert!(matches!(b.copy_async(2, 0, d0, d1, 1), Err(DeviceError::NoSuchDevice { .. })));
        assert!(matches!(b.copy_async(0, 0, d0 + 1, d1, len), Err(DeviceError::InvalidPointer { .. })));
        assert!(matches!(b.copy_sync(d0, 0, 1), Err(DeviceError::InvalidPointer { .. })));

        // Overlapping copy_sync behaves like memmove.
        fill(&b, d1, &[1, 2, 3, 4, 5]);
        b.copy_sync(d1 + 1, d1, 4).unwrap();
        assert_eq!(read(&b, d1, 5), [1, 1, 2, 3, 4]);
        b.free(d0).unwrap();
        b.free(d1).unwrap();
    }
}

/// What a 2-D copy of `shape` from `src` makes of `dst`: each row's bytes at its pitch,
/// every other byte unchanged.
fn copied_2d(mut dst: Vec<u8>, src: &[u8], shape: Copy2d) -> Vec<u8> {
    for i in 0..shape.height {
        let (d, s) = (i * shape.dst_pitch, i * shape.src_pitch);
        dst[d..d + shape.width].copy_from_slice(&src[s..s + shape.width]);
    }
    dst
}

#[test]
fn copies_2d_move_strided_blocks_and_check_them_whole() {
    let b = two();
    let len = 1 << 12;
    let (d0, d1) = (b.alloc(0, len).unwrap(), b.alloc(1, len).unwrap());
    let src: Vec<u8> = (0..len).map(|i| (i * 13 % 241) as u8 + 1).collect();
    let shapes = [
        // A column of 8-byte elements, rows of a 256-byte matrix, into a packed buffer.
        Copy2d { width: 8, height: 12, dst_pitch: 8, src_pitch: 256 },
        // Packed into strided, wider pitches at both ends, one byte wide.
        Copy2d { width: 24, height: 5, dst_pitch: 100, src_pitch: 24 },
        Copy2d { width: 1, height: 40, dst_pitch: 3, src_pitch: 97 },
        // Contiguous (one run), and one row whose pitches do not matter.
        Copy2d { width: 64, height: 4, dst_pitch: 64, src_pitch: 64 },
        Copy2d { width: 10, height: 1, dst_pitch: 0, src_pitch: 0 },
    ];
    // SAFETY: every address is in `d0` or `d1` (`len` bytes each, allocations of `b`) or in a
    // vector of this test, live until its end; every span below fits in `len` bytes. Each copy
    // is finished (waited, or synchronous) before its destination is read, and refused calls
    // access nothing.
    unsafe {
        for shape in shapes {
            let (dst_span, src_span) = shape.check("test").unwrap();
            assert!(dst_span <= len && src_span <= len, "{shape:?}");
            // Host to device on engine 0, then device to device on engine 1 (a peer
            // mapping's place), then back to the host synchronously.
            fill(&b, d0, &vec![0u8; len]);
            let t = b.copy_2d_async(0, 2, d0, src.as_ptr() as usize, shape).unwrap();
            wait(&b, t);
            let want = copied_2d(vec![0u8; len], &src, shape);
            assert_eq!(read(&b, d0, len), want, "{shape:?} host to device");
            let same = Copy2d { src_pitch: shape.dst_pitch, ..shape };
            fill(&b, d1, &vec![0xEEu8; len]);
            let t = b.copy_2d_async(1, 0, d1, d0, same).unwrap();
            wait(&b, t);
            let want_d1 = copied_2d(vec![0xEEu8; len], &want, same);
            assert_eq!(read(&b, d1, len), want_d1, "{shape:?} device to device");
            let mut back = vec![0x55u8; len];
            b.copy_2d_sync(back.as_mut_ptr() as usize, d1, same).unwrap();
            assert_eq!(back, copied_2d(vec![0x55u8; len], &want_d1, same), "{shape:?} device to host");
        }

        // Nothing moves for an empty shape, whatever the addresses: done at once.
        for empty in [Copy2d { width: 0, height: 9, dst_pitch: 1, src_pitch: 1 }, Copy2d { height: 0, ..shapes[0] }] {
            let t = b.copy_2d_async(0, 0, 0, 0, empty).unwrap();
            assert!(b.copy_poll(t).unwrap());
            b.copy_2d_sync(0, 0, empty).unwrap();
        }

        // Rows that overlap at either end, a span past the allocation at either end, and a
        // span past the address space are refused whole: nothing is written.
        let before = read(&b, d0, len);
        let overlap = Copy2d { width: 8, height: 2, dst_pitch: 4, src_pitch: 8 };
        let e = b.copy_2d_async(0, 0, d0, src.as_ptr() as usize, overlap).unwrap_err();
        assert!(matches!(&e, DeviceError::BadShape { op: "copy_2d_async", .. }), "{e}");
        assert!(e.to_string().contains("destination overlap"), "{e}");
        let overlap = Copy2d { dst_pitch: 8, src_pitch: 7, ..overlap };
        let e = b.copy_2d_sync(d0, src.as_ptr() as usize, overlap).unwrap_err();
        assert!(e.to_string().contains("source overlap"), "{e}");
        // 8 rows of 16 bytes 32 apart span 240 bytes: placed to end one byte past `d0`.
        let past = Copy2d { width: 16, height: 8, dst_pitch: 32, src_pitch: 16 };
        assert_eq!(past.check("test").unwrap(), (240, 128));
        let at = d0 + len - 240 + 1;
        let e = b.copy_2d_async(0, 0, at, src.as_ptr() as usize, past).unwrap_err();
        assert!(matches!(e, DeviceError::InvalidPointer { op: "copy_2d_async", .. }), "{e}");
        let past_src = Copy2d { dst_pitch: 16, src_pitch: 32, ..past };
        let e = b.copy_2d_sync(src.as_ptr() as usize, at, past_src).unwrap_err();
        assert!(matches!(e, DeviceError::InvalidPointer { op: "copy_2d_sync", .. }), "{e}");
        let huge = Copy2d { width: 1, height: 3, dst_pitch: usize::MAX / 2 + 1, src_pitch: 1 };
        let e = b.copy_2d_sync(d0, src.as_ptr() as usize, huge).unwrap_err();
        assert!(e.to_string().contains("overflow the address space"), "{e}");
        assert!(matches!(b.copy_2d_async(2, 0, d0, d1, shapes[0]), Err(DeviceError::NoSuchDevice { .. })));
        assert_eq!(read(&b, d0, len), before, "a refused 2-D copy wrote");

        // 2-D and 1-D copies on one engine run in submission order: the last write wins.
        let (ones, twos) = ([1u8; 64], [2u8; 64]);
        let column = Copy2d { width: 4, height: 16, dst_pitch: 4, src_pitch: 4 };
        let mut tickets = vec![b.copy_async(0, 0, d0, ones.as_ptr() as usize, 64).unwrap()];
        tickets.push(b.copy_2d_async(0, 1, d0, twos.as_ptr() as usize, Copy2d { dst_pitch: 8, ..column }).unwrap());
        tickets.push(b.copy_2d_async(0, 0, d0, ones.as_ptr() as usize, column).unwrap());
        for t in tickets {
            wait(&b, t);
        }
        let got = read(&b, d0, 128);
        assert_eq!(&got[..64], &[1u8; 64][..]);
        for row in 8..16 {
            assert_eq!(&got[row * 8..row * 8 + 4], &[2u8; 4], "row {row} of the strided copy");
        }
        b.free(d0).unwrap();
        b.free(d1).unwrap();
    }
}

#[test]
fn driver_cost_model_leaves_the_answers_alone() {
    // Copies seen done 1 ms after issue, polled newest first: with the cost model the
    // answers are each copy's own state, and an older copy polled after a newer one
    // was seen done is done (as the CUDA backend answers it without a query).
    let driver = Some(DriverCost { issue_ns: 1000, done_ns: 500, not_ready_ns: 100 });
    let b = SimBackend::new(SimConfig { copy_inline: true, copy_done_ns: 1_000_000, driver, ..Default::default() })
        .unwrap();
    let len = 4096;
    let (d0, d1) = (b.alloc(0, len).unwrap(), b.alloc(1, len).unwrap());
    // SAFETY: `d0` and `d1` are allocations of `len` bytes of `b`, freed only below once
    // every copy was reported finished; the copies are made inline, one after another.
    let t: Vec<CopyTicket> = (0..4).map(|_| unsafe { b.copy_async(1, 0, d1, d0, len) }.unwrap()).collect();
    assert!(!b.copy_poll(t[3]).unwrap(), "not seen done before its time");
    while !b.copy_poll(t[3]).unwrap() {}
    for &old in &t[..3] {
        assert!(b.copy_poll(old).unwrap());
        assert!(b.copy_poll(old).is_err(), "a ticket is reported done once");
    }
    // SAFETY: every copy on them was reported finished above; nothing touches them afterwards.
    unsafe {
        b.free(d0).unwrap();
        b.free(d1).unwrap();
    }
}

#[test]
fn inline_copies_are_done_when_started() {
    let b = SimBackend::new(SimConfig { copy_inline: true, ..Default::default() }).unwrap();
    let len = 1 << 16;
    let (d0, d1) = (b.alloc(0, len).unwrap(), b.alloc(1, len).unwrap());
    let src: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
    let mut dst = vec![0u8; len];
    for (to, from) in [(d0, src.as_ptr() as usize), (d1, d0), (dst.as_mut_ptr() as usize, d1)] {
        // SAFETY: `len` bytes of allocations of `b` or of this test's vectors, live until the
        // end of the test; the copy is finished when copy_async returns.
        let t = unsafe { b.copy_async(1, 0, to, from, len) }.unwrap();
        assert!(b.copy_poll(t).unwrap(), "an inline copy is finished when copy_async returns");
        assert!(b.copy_poll(t).is_err(), "and its ticket consumed by that poll");
    }
    assert!(dst == src);
    // The driver's rules still hold, and no engine thread was started.
    // SAFETY: the overrun is refused before anything is accessed; no copy runs on `d0` or
    // `d1` when they are freed, and nothing touches them afterwards.
    unsafe {
        assert!(matches!(b.copy_async(0, 0, d0 + 1, d1, len), Err(DeviceError::InvalidPointer { .. })));
        assert!(b.engines.iter().all(|e| lock(e).is_none()));
        b.free(d0).unwrap();
        b.free(d1).unwrap();
    }
}

/// Host-mapped memory is zeroed host memory (not a device allocation), a copy engine
/// moves data between it and device memory, and it is freed exactly once.
#[test]
fn host_mapped_memory_is_zeroed_host_memory_copies_reach() {
    let b = two();
    let m = b.alloc_host_mapped(10_000).unwrap();
    assert_eq!((m.device, m.len), (m.host, 10_000));
    assert_eq!(m.host % 4096, 0, "page-aligned");
    // SAFETY: the 10_000 bytes just allocated, untouched by anything else.
    let bytes = unsafe { std::slice::from_raw_parts_mut(m.host as *mut u8, m.len) };
    assert!(bytes.iter().all(|&x| x == 0), "alloc_host_mapped memory must start zeroed");
    assert_eq!(b.pointer_info(m.host + 5).unwrap().kind, MemoryKind::Host);
    let dev = b.alloc(1, 4096).unwrap();
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    // SAFETY: `dev` is a live allocation of b, `m` live host-mapped memory; nothing else
    // touches either while the copies run (each is waited for).
    unsafe {
        fill(&b, dev, &pattern);
        wait(&b, b.copy_async(1, 0, m.host + 100, dev, 4096).unwrap());
    }
    assert_eq!(&bytes[100..4196], &pattern[..]);
    // SAFETY: no copy is in flight and `bytes` is not used after this.
    unsafe {
        b.free_host_mapped(m.host).unwrap();
        assert!(matches!(b.free_host_mapped(m.host), Err(DeviceError::InvalidPointer { .. })));
        b.free(dev).unwrap();
    }
}

#[test]
fn register_host_ranges() {
    let b = two();
    let buf = vec![0u8; 8192];
    let p = buf.as_ptr() as usize;
    let d = b.alloc(0, 64).unwrap();
    // SAFETY: `buf` is host memory that outlives its registration, and no copy runs on it
    // or on `d`; registering `d` is refused, and nothing touches `d` once freed.
    unsafe {
        b.register_host(p, 8192).unwrap();
        b.register_host(p, 8192).unwrap();
        assert_eq!(b.pointer_info(p).unwrap().kind, MemoryKind::Host);
        b.unregister_host(p).unwrap();
        assert!(b.unregister_host(p).is_err());
        assert!(b.register_host(d, 64).is_err());
        b.free(d).unwrap();
    }
}

#[test]
fn drop_releases_everything() {
    let owner = two();
    let peer = two();
    let p = owner.alloc(0, 64).unwrap();
    let id = owner.pointer_info(p).unwrap().buffer_id;
    let _q = peer.alloc(1, 64).unwrap();
    let qid = peer.pointer_info(_q).unwrap().buffer_id;
    let m = peer.open_handle(&owner.export_handle(p).unwrap(), 0).unwrap();
    // SAFETY: both ends are memory of `peer` (64 bytes each), which it releases only when
    // dropped, after its engines have finished their copies; the copy is never polled.
    let t = unsafe { peer.copy_async(0, 0, m.ptr, _q, 64) }.unwrap();
    let _ = t;
    let qpath = shm_path(&peer, qid);
    assert!(qpath.exists());
    drop(peer);
    assert!(!qpath.exists(), "drop must unlink own allocations");
    assert_eq!(mappers_of(&owner, p), 0, "drop must close peer mappings");
    let path = shm_path(&owner, id);
    drop(owner);
    assert!(!path.exists());
}

#[test]
fn config_parsing() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    };
    assert_eq!(SimConfig::from_lookup(env(&[])).unwrap(), SimConfig::default());
    let c = SimConfig::from_lookup(env(&[
        (ENV_DEVICES, "4"),
        (ENV_PEER, "none"),
        (ENV_IPC_OPEN_US, "930"),
        (ENV_COPY, "inline"),
    ]))
    .unwrap();
    assert_eq!(
        c,
        SimConfig {
            devices: 4,
            peer: PeerMatrix::NoPeers,
            ipc_open_us: 930,
            copy_inline: true,
            copy_done_ns: 0,
            refuse_opens: false,
            driver: None,
        }
    );
    assert!(!SimConfig::from_lookup(env(&[(ENV_COPY, "thread")])).unwrap().copy_inline);
    let c = SimConfig::from_lookup(env(&[(ENV_COPY, "inline:6500")])).unwrap();
    assert!(c.copy_inline && c.copy_done_ns == 6500);
    let c = SimConfig::from_lookup(env(&[(ENV_DRIVER_NS, "1600, 1400,150")])).unwrap();
    assert_eq!(c.driver, Some(DriverCost { issue_ns: 1600, done_ns: 1400, not_ready_ns: 150 }));
    let c = SimConfig::from_lookup(env(&[(ENV_DEVICES, "4"), (ENV_PEER, " 1-0, 2-3 ")])).unwrap();
    assert_eq!(c.peer, PeerMatrix::Pairs(vec![(0, 1), (2, 3)]));
    assert!(c.peer.allows(0, 1) && c.peer.allows(1, 0) && c.peer.allows(3, 2) && c.peer.allows(2, 2));
    assert!(!c.peer.allows(0, 2) && !c.peer.allows(1, 3));
    assert_eq!(PeerMatrix::parse("ALL").unwrap(), PeerMatrix::All);
    assert_eq!(c.peer.to_string(), "0-1,2-3");
    assert_eq!(PeerMatrix::NoPeers.to_string(), "none");
    assert!(!PeerMatrix::NoPeers.allows(0, 1) && PeerMatrix::NoPeers.allows(1, 1));
    assert_eq!(SimConfig::from_lookup(env(&[(ENV_PEER, "")])).unwrap().peer, PeerMatrix::All);

    let rejected = |vars: &'static [(&'static str, &'static str)], var: &str| match SimConfig::from_lookup(env(vars)) {
        Err(DeviceError::Unavailable { reason }) => {
            assert!(reason.contains(var), "{reason}");
        }
        other => panic!("{vars:?} should be rejected, got {other:?}"),
    };
    rejected(&[(ENV_PEER, "garbage")], ENV_PEER);
    rejected(&[(ENV_PEER, "0-1,")], ENV_PEER);
    rejected(&[(ENV_PEER, "0-x")], ENV_PEER);
    rejected(&[(ENV_PEER, "0-5")], ENV_PEER); // device 5 does not exist
    rejected(&[(ENV_DEVICES, "two")], ENV_DEVICES);
    rejected(&[(ENV_DEVICES, "0")], ENV_DEVICES);
    rejected(&[(ENV_DEVICES, "-1")], ENV_DEVICES);
    rejected(&[(ENV_IPC_OPEN_US, "1ms")], ENV_IPC_OPEN_US);
    rejected(&[(ENV_COPY, "sync")], ENV_COPY);
    rejected(&[(ENV_COPY, "inline:soon")], ENV_COPY);
    rejected(&[(ENV_DRIVER_NS, "1600,1400")], ENV_DRIVER_NS);
    rejected(&[(ENV_DRIVER_NS, "1600,1400,fast")], ENV_DRIVER_NS);
    assert!(SimBackend::new(SimConfig { devices: 0, ..Default::default() }).is_err());
}

#[test]
fn handle_round_trip() {
    let f = HandleFields { owner_pid: 42, nonce: 0xdead_beef, buffer_id: 9, size: 123, device: 3 };
    assert_eq!(HandleFields::decode(&f.encode()).unwrap(), f);
    let mut h = f.encode();
    h.0[63] = 1;
    assert!(HandleFields::decode(&h).is_err());
}

/// Environment variable carrying a hex handle to [`cross_process_child`].
const CHILD_HANDLE_VAR: &str = "GPULMT_SIM_TEST_CHILD_HANDLE";

/// Child half of [`cross_process_open`]: does nothing unless started by it (the
/// test binary re-runs itself, filtered to this test, with the handle in the
/// environment). Re-running the binary rather than fork() keeps the child free
/// of the harness's threads and locks.
#[test]
fn cross_process_child() {
    let Ok(hex) = std::env::var(CHILD_HANDLE_VAR) else {
        return;
    };
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    let h = IpcHandle(bytes.try_into().unwrap());
    let b = two();
    let m = b.open_handle(&h, 1).unwrap();
    assert!(matches!(b.open_handle(&h, 0), Err(DeviceError::DoubleOpen { .. })));
    // SAFETY: `m` maps the parent's allocation of 4096 bytes, which the parent does not
    // touch until this process exits; the copy is waited for before the mapping is closed,
    // and nothing touches it afterwards.
    unsafe {
        assert_eq!(read(&b, m.ptr, 4), b"ping");
        // Write back through this process's copy engine.
        let t = b.copy_async(1, 0, m.ptr, b"pong".as_ptr() as usize, 4).unwrap();
        wait(&b, t);
        b.close_handle(m).unwrap();
    }
}

#[test]
fn cross_process_open() {
    let owner = two();
    let p = owner.alloc(0, 4096).unwrap();
    // SAFETY: an allocation of 4096 bytes of `owner`, no child running yet.
    unsafe { fill(&owner, p, b"ping") };
    let h = owner.export_handle(p).unwrap();
    child_opens(&h);
    // SAFETY: the child has exited; nothing touches `p` once freed.
    unsafe {
        assert_eq!(read(&owner, p, 4), b"pong");
        assert_eq!(mappers_of(&owner, p), 0);
        owner.free(p).unwrap();
    }
}

/// Runs [`cross_process_child`] in a child process on handle `h`: it reads "ping" at the
/// start of the memory and writes "pong" there.
fn child_opens(h: &IpcHandle) {
    let hex: String = h.0.iter().map(|b| format!("{b:02x}")).collect();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "device::sim::tests::cross_process_child", "--test-threads=1", "--nocapture"])
        .env(CHILD_HANDLE_VAR, hex)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Make sure the child really ran the test rather than filtering it out.
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "{}", String::from_utf8_lossy(&out.stdout));
}

// Kinds of memory (`kinds.rs`): what CUDA 13 does with each, on two instances standing for
// two processes.

use crate::device::fd_share::socket_path;
use crate::device::shareable::{fd_dir, SharedHandle, SharedKind};

const PAGE: usize = 4096;

/// Bytes that differ from those of every other `seed` below 251 at each position.
fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| ((i * 7 + seed * 13 + 1) % 251) as u8).collect()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn every_kind_is_shared_or_refused_as_cuda_shares_it() {
    let owner = two();
    let peer = two();
    for (seed, (name, kind)) in AllocKind::NAMES.into_iter().enumerate() {
        for size in [1, 8, 65_537, (4 << 20) + 3] {
            let what = format!("{name} of {size} bytes");
            let p = owner.alloc_as(1, size, kind, 1).unwrap();
            let info = owner.pointer_info(p + size - 1).unwrap();
            // A VMM chunk is a granularity multiple, as cuMemCreate's.
            let unit = if matches!(kind, AllocKind::Vmm { .. }) { size.div_ceil(PAGE) * PAGE } else { size };
            assert_eq!(info, PointerInfo::device(1, p, unit, info.buffer_id, kind), "{what}");
            assert!(info.buffer_id > 0);
            let bytes = pattern(size, seed);
            // SAFETY: `p` holds `size` bytes of `owner`; each copy is made and finished by one call.
            unsafe {
                fill(&owner, p, &bytes);
                assert!(read(&owner, p, size) == bytes, "{what}");
            }
            match kind.unmappable_reason() {
                Some(reason) => {
                    assert_eq!(
                        owner.export_handle(p),
                        Err(DeviceError::NotShareable { base: p, reason: reason.to_owned() }),
                        "{what}"
                    );
                    // A legacy handle forged to name its object does not open it either.
                    let size = match lock(&owner.state).regions.get(&p) {
                        Some(Region::Local(l)) => header(&l.map).size,
                        _ => unreachable!("just allocated"),
                    };
                    let forged = HandleFields {
                        owner_pid: owner.pid,
                        nonce: owner.nonce,
                        buffer_id: info.buffer_id,
                        size,
                        device: 1,
                    };
                    match peer.open_handle(&forged.encode(), 0) {
                        Err(DeviceError::BadHandle { reason }) => {
                            assert!(reason.contains("not legacy memory"), "{reason}")
                        }
                        other => panic!("{what}: {other:?}"),
                    }
                }
                None => {
                    let h = owner.export_handle(p).unwrap();
                    let shared = SharedHandle::decode(&h).unwrap();
                    match kind {
                        AllocKind::Legacy => assert_eq!(shared, None),
                        _ => {
                            let s = shared.unwrap();
                            let k = if kind == (AllocKind::Pool { shareable: true }) {
                                SharedKind::Pool
                            } else {
                                SharedKind::Vmm
                            };
                            assert_eq!(
                                (s.kind, s.device, s.pid, s.nonce, s.key),
                                (k, 1, owner.pid, owner.nonce, info.buffer_id)
                            );
                        }
                    }
                    assert!(matches!(owner.open_handle(&h, 0), Err(DeviceError::BadHandle { .. })), "{what}");
                    let m = peer.open_handle(&h, 0).unwrap();
                    assert_eq!(m.size, unit, "{what}");
                    assert_eq!(
                        peer.pointer_info(m.ptr + unit - 1).unwrap(),
                        PointerInfo::device(1, m.ptr, unit, info.buffer_id, kind)
                    );
                    assert_eq!(mappers_of(&owner, p), 1);
                    assert_eq!(
                        peer.open_handle(&h, 1),
                        Err(DeviceError::DoubleOpen { owner: owner.pid, buffer_id: info.buffer_id }),
                        "{what}"
                    );
                    // SAFETY: `m` maps `p`'s memory, at least `size` bytes; each access is made
                    // and finished by one call; nothing touches the mapping once closed.
                    unsafe {
                        assert!(read(&peer, m.ptr, size) == bytes, "{what}: the peer reads other bytes");
                        fill(&peer, m.ptr, b"p");
                        assert_eq!(read(&owner, p, 1), b"p", "{what}: the owner does not see the peer's write");
                        // The mapping ends where the allocation does.
                        let mut over = vec![0u8; unit + 1];
                        assert!(matches!(
                            peer.copy_sync(over.as_mut_ptr() as usize, m.ptr, unit + 1),
                            Err(DeviceError::InvalidPointer { .. })
                        ));
                        peer.close_handle(m).unwrap();
                    }
                    assert_eq!(mappers_of(&owner, p), 0, "{what}");
                }
            }
            // SAFETY: no copy runs on `p` and nothing touches it afterwards.
            unsafe { owner.free(p) }.unwrap();
        }
    }
}

/// A pool allocation freed while a peer maps it: the free says so, the pool keeps it and
/// hands its address out again, and the peer's stale import sees the new bytes (as on
/// CUDA). CUDA answers an import of the new allocation with the held one, its old size
/// (`lab/gpu/memory_kinds.cu`, reuse_hold): the backends refuse that as a double open, and
/// once the old import is closed the new allocation opens with its own bytes.
#[test]
fn a_pool_import_where_an_earlier_one_is_held_is_refused_until_it_closes() {
    let owner = two();
    let peer = two();
    let size = 65_537;
    let kind = AllocKind::Pool { shareable: true };
    let p = owner.alloc_as(0, size, kind, 1).unwrap();
    // SAFETY: `p` holds `size` bytes of `owner`; one call each.
    unsafe { fill(&owner, p, &pattern(size, 0)) };
    let id = owner.pointer_info(p).unwrap().buffer_id;
    let held = peer.open_handle(&owner.export_handle(p).unwrap(), 0).unwrap();
    // SAFETY: nothing of the owner's uses `p` any more (the peer's import is what is tested).
    let freed = unsafe { owner.free(p) };
    assert_eq!(freed, Err(DeviceError::FreedWhileMapped { ptr: p, buffer_id: id, mappers: 1 }));
    let q = owner.alloc_as(0, size, kind, 1).unwrap();
    assert_eq!(q, p, "the pool hands the address back, as CUDA's does");
    // SAFETY: `q` holds `size` bytes of the owner; `held` maps the same pool memory.
    unsafe {
        fill(&owner, q, &pattern(size, 1));
        assert!(read(&peer, held.ptr, size) == pattern(size, 1), "the stale import sees the new bytes, as on CUDA");
    }
    let h = owner.export_handle(q).unwrap();
    let new_id = owner.pointer_info(q).unwrap().buffer_id;
    assert_eq!(peer.open_handle(&h, 0), Err(DeviceError::DoubleOpen { owner: owner.pid, buffer_id: new_id }));
    // SAFETY: `held` is the peer's mapping, closed once; `m` maps `q`'s `size` bytes.
    unsafe {
        peer.close_handle(held).unwrap();
        let m = peer.open_handle(&h, 0).unwrap();
        assert!(read(&peer, m.ptr, size) == pattern(size, 1), "the new allocation's bytes");
        peer.close_handle(m).unwrap();
        owner.free(q).unwrap();
    }
}

#[test]
fn pools_reuse_addresses_under_new_buffer_ids() {
    let owner = two();
    let peer = two();
    let size = 65_537;
    let kind = AllocKind::Pool { shareable: true };
    let mut first = None;
    let mut ids: Vec<u64> = Vec::new();
    let mut handles: Vec<IpcHandle> = Vec::new();
    for round in 0..3 {
        let p = owner.alloc_as(0, size, kind, 1).unwrap();
        assert_eq!(*first.get_or_insert(p), p, "round {round}: a pool hands a freed allocation back at its address");
        let id = owner.pointer_info(p).unwrap().buffer_id;
        assert!(!ids.contains(&id), "round {round}: buffer id {id} again");
        // SAFETY: `p` holds `size` bytes of `owner`; each access is made and finished by one call.
        unsafe {
            if round > 0 {
                // Not zeroed, as a real pool's is not: the last round's bytes (the peer's
                // write over its first byte included).
                let mut last = pattern(size, round - 1);
                last[0] = b'x';
                assert!(read(&owner, p, size) == last, "round {round}");
            }
            fill(&owner, p, &pattern(size, round));
        }
        let h = owner.export_handle(p).unwrap();
        for (old, old_id) in handles.iter().zip(&ids) {
            match peer.open_handle(old, 0) {
                Err(DeviceError::BadHandle { reason }) => {
                    assert!(reason.contains("freed"), "{reason}");
                    assert!(reason.contains(&old_id.to_string()), "{reason}");
                }
                other => panic!("round {round}: a handle of buffer {old_id} opened {other:?}"),
            }
        }
        let m = peer.open_handle(&h, 0).unwrap();
        // SAFETY: `m` maps `p`'s `size` bytes, `p` is `owner`'s; each access is made and
        // finished by one call; nothing touches them once closed or freed.
        unsafe {
            assert!(read(&peer, m.ptr, size) == pattern(size, round), "round {round}: the peer sees other bytes");
            fill(&peer, m.ptr, b"x");
            peer.close_handle(m).unwrap();
            owner.free(p).unwrap();
        }
        ids.push(id);
        handles.push(h);
    }
    // The last handle dies with its allocation too, although the pool keeps the memory.
    assert!(matches!(peer.open_handle(&handles[2], 0), Err(DeviceError::BadHandle { .. })));

    // Another size, device or pool is another allocation; the default pool reuses as well.
    let q = owner.alloc_as(0, size + 1, kind, 1).unwrap();
    assert_ne!(Some(q), first);
    let d = owner.alloc_as(1, size, kind, 1).unwrap();
    assert_ne!(Some(d), first);
    let plain = AllocKind::Pool { shareable: false };
    let r = owner.alloc_as(0, size, plain, 1).unwrap();
    assert_ne!(Some(r), first);
    // SAFETY: allocations of this test that nothing uses.
    unsafe {
        owner.free(r).unwrap();
        assert_eq!(owner.alloc_as(0, size, plain, 1).unwrap(), r);
        for x in [q, d, r] {
            owner.free(x).unwrap();
        }
    }
}

#[test]
fn a_vmm_range_is_chunks_each_its_own_allocation() {
    let owner = two();
    let peer = two();
    let kind = AllocKind::Vmm { shareable: true };
    // ceil(20_000 / 3) = 6667 bytes a chunk, rounded up to two pages.
    let chunk = 2 * PAGE;
    let total = 3 * chunk;
    let p = owner.alloc_as(1, 20_000, kind, 3).unwrap();
    let mut ids = Vec::new();
    for k in 0..3 {
        let info = owner.pointer_info(p + k * chunk + 17).unwrap();
        let expected = PointerInfo::device(1, p + k * chunk, chunk, info.buffer_id, kind);
        assert_eq!(info, PointerInfo { span: total - k * chunk, ..expected }, "chunk {k}");
        assert!(!ids.contains(&info.buffer_id));
        ids.push(info.buffer_id);
    }
    assert_eq!(owner.pointer_info(p + total).unwrap().kind, MemoryKind::Host);
    let bytes = pattern(total, 5);
    // SAFETY: `p` holds `total` bytes of `owner`; every copy is made and finished by one
    // call; the refused one accesses nothing.
    unsafe {
        // One copy through all three chunks: they are one range.
        fill(&owner, p, &bytes);
        assert!(read(&owner, p + chunk - 100, 200) == bytes[chunk - 100..chunk + 100]);
        // Device to device, across the boundary of chunks 0 and 1, into chunk 2.
        owner.copy_sync(p + 2 * chunk, p + chunk - 50, 100).unwrap();
        assert!(read(&owner, p + 2 * chunk, 100) == bytes[chunk - 50..chunk + 50]);
        // But not past the range's end.
        let mut over = vec![0u8; chunk];
        let past = owner.copy_sync(over.as_mut_ptr() as usize, p + 2 * chunk + 1, chunk);
        assert!(matches!(past, Err(DeviceError::InvalidPointer { .. })), "{past:?}");
        fill(&owner, p + 2 * chunk, &bytes[chunk - 50..chunk + 50]);
    }
    assert!(matches!(owner.export_handle(p + 100), Err(DeviceError::InvalidPointer { .. })));
    let mut maps = Vec::new();
    let mut handles = Vec::new();
    for (k, &id) in ids.iter().enumerate() {
        let h = owner.export_handle(p + k * chunk).unwrap();
        let s = SharedHandle::decode(&h).unwrap().unwrap();
        assert_eq!((s.kind, s.key), (SharedKind::Vmm, id));
        let m = peer.open_handle(&h, 0).unwrap();
        assert_eq!(m.size, chunk);
        assert_eq!(peer.pointer_info(m.ptr + chunk - 1).unwrap(), PointerInfo::device(1, m.ptr, chunk, id, kind));
        let mut expected = bytes[k * chunk..(k + 1) * chunk].to_vec();
        if k == 2 {
            expected[..100].copy_from_slice(&bytes[chunk - 50..chunk + 50]);
        }
        // SAFETY: `m` maps chunk `k`'s `chunk` bytes; each copy is made and finished by one
        // call; the refused one accesses nothing.
        unsafe {
            assert!(read(&peer, m.ptr, chunk) == expected, "chunk {k}");
            // A peer maps one chunk: a copy cannot run into the next.
            let mut over = vec![0u8; chunk + 1];
            let past = peer.copy_sync(over.as_mut_ptr() as usize, m.ptr, chunk + 1);
            assert!(matches!(past, Err(DeviceError::InvalidPointer { .. })), "{past:?}");
        }
        maps.push(m);
        handles.push(h);
    }
    assert_eq!(mappers_of(&owner, p), 3);
    // SAFETY: no copy runs on the mappings or on `p`, and nothing touches them once closed
    // or freed; the refused free releases nothing.
    unsafe {
        assert!(matches!(owner.free(p + chunk), Err(DeviceError::InvalidPointer { .. })));
        for m in maps {
            peer.close_handle(m).unwrap();
        }
        owner.free(p).unwrap();
    }
    assert!(!shm_path(&owner, ids[0]).exists(), "the whole range goes at once");
    assert_eq!(owner.pointer_info(p + chunk).unwrap().kind, MemoryKind::Host);
    for h in &handles {
        assert!(matches!(peer.open_handle(h, 0), Err(DeviceError::BadHandle { .. })));
    }

    // Without a shareable handle type no chunk can be exported.
    let plain = AllocKind::Vmm { shareable: false };
    let q = owner.alloc_as(0, 3 * PAGE, plain, 3).unwrap();
    let reason = plain.unmappable_reason().unwrap().to_owned();
    assert_eq!(owner.export_handle(q + PAGE), Err(DeviceError::NotShareable { base: q + PAGE, reason }));
    // SAFETY: an allocation of this test that nothing uses.
    unsafe { owner.free(q) }.unwrap();
}

#[test]
fn opens_by_fd_follow_the_legacy_rules() {
    let owner = backend(3, PeerMatrix::parse("0-2").unwrap(), 0);
    let peer = backend(3, PeerMatrix::parse("0-2").unwrap(), 0);
    let p = owner.alloc_as(0, 64, AllocKind::Pool { shareable: true }, 1).unwrap();
    let h = owner.export_handle(p).unwrap();
    match peer.open_handle(&h, 1) {
        Err(DeviceError::Driver { call: "cuIpcOpenMemHandle", message, .. }) => {
            assert!(message.contains("peer access unavailable"), "{message}")
        }
        other => panic!("expected a peer-access error, got {other:?}"),
    }
    assert!(matches!(peer.open_handle(&h, 7), Err(DeviceError::NoSuchDevice { dev: 7, count: 3 })));
    // Forged: the payload disagrees with the fd fields, an unknown key, an exporter gone.
    let s = SharedHandle::decode(&h).unwrap().unwrap();
    let is_bad = |r: Result<Mapping, DeviceError>| matches!(r, Err(DeviceError::BadHandle { .. }));
    assert!(is_bad(peer.open_handle(&SharedHandle { key: s.key + 1, ..s }.encode(), 0)));
    let mut payload = s.payload;
    payload[24..32].copy_from_slice(&(s.key + 1).to_le_bytes());
    assert!(is_bad(peer.open_handle(&SharedHandle { key: s.key + 1, payload, ..s }.encode(), 0)));
    let gone = SharedHandle { nonce: s.nonce ^ 1, ..s };
    let mut payload = s.payload;
    payload[16..24].copy_from_slice(&gone.nonce.to_le_bytes());
    match peer.open_handle(&SharedHandle { payload, ..gone }.encode(), 0) {
        Err(DeviceError::BadHandle { reason }) => assert!(reason.contains("no fd-share server"), "{reason}"),
        other => panic!("{other:?}"),
    }
    // Failed opens left no reservation and no mapper behind.
    assert_eq!(mappers_of(&owner, p), 0);
    let m = peer.open_handle(&h, 2).unwrap();
    // SAFETY: no copy runs on the mapping or on `p`, and nothing touches them afterwards.
    unsafe {
        peer.close_handle(m).unwrap();
        owner.free(p).unwrap();
    }
}

#[test]
fn fd_sharing_leaks_no_fds() {
    let owner = two();
    let peer = two();
    let p = owner.alloc_as(0, 4096, AllocKind::Pool { shareable: true }, 1).unwrap();
    let cycle = || {
        let m = peer.open_handle(&owner.export_handle(p).unwrap(), 1).unwrap();
        // SAFETY: no copy runs on the mapping, and nothing touches it once closed.
        unsafe { peer.close_handle(m) }.unwrap();
    };
    // Warm-up: the fd server's socket is opened for good by the first export.
    cycle();
    // Other tests open and close fds meanwhile: a real leak (one per cycle) fails every
    // attempt, a neighbour's fd rarely all three. The server closes its end of a connection
    // just after the answer, so the count may take a moment to settle.
    let mut counts = Vec::new();
    for _ in 0..3 {
        let before = open_fds();
        for _ in 0..500 {
            cycle();
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut after = open_fds();
        while after != before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
            after = open_fds();
        }
        if after == before {
            // SAFETY: no copy runs on `p` and nothing touches it afterwards.
            unsafe { owner.free(p) }.unwrap();
            return;
        }
        counts.push((before, after));
    }
    panic!("open fds before and after 500 export/open/close cycles: {counts:?}");
}

#[test]
fn drop_releases_the_pools_and_the_fd_server() {
    let owner = two();
    let kind = AllocKind::Pool { shareable: true };
    let p = owner.alloc_as(0, 100, kind, 1).unwrap();
    let id = owner.pointer_info(p).unwrap().buffer_id;
    let _ = owner.export_handle(p).unwrap();
    let sock = socket_path(&fd_dir(), owner.pid, owner.nonce).unwrap();
    assert!(sock.exists());
    // SAFETY: no copy runs on `p` and nothing touches it afterwards.
    unsafe { owner.free(p) }.unwrap();
    // The pool keeps the object, and with it the owner object that claims it.
    assert!(shm_path(&owner, id).exists());
    assert!(lock(&owner.state).owner.is_some());
    drop(owner);
    assert!(!shm_path_of(id).exists() && !sock.exists());
}

/// [`shm_path`] of an instance already dropped: any of this process's objects of `id`.
fn shm_path_of(id: u64) -> std::path::PathBuf {
    let suffix = format!("-{id}");
    let prefix = format!("{SIM_PREFIX}{}-", std::process::id());
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.file_name().unwrap().to_str().is_some_and(|n| n.starts_with(&prefix) && n.ends_with(&suffix)))
        .unwrap_or_else(|| "/dev/shm/none".into())
}

#[test]
fn cross_process_open_by_fd() {
    let owner = two();
    let pool = owner.alloc_as(0, 4096, AllocKind::Pool { shareable: true }, 1).unwrap();
    let vmm = owner.alloc_as(1, 2 * PAGE, AllocKind::Vmm { shareable: true }, 2).unwrap();
    for p in [pool, vmm + PAGE] {
        // SAFETY: at least 4 bytes of `owner`'s, no child running yet.
        unsafe { fill(&owner, p, b"ping") };
        child_opens(&owner.export_handle(p).unwrap());
        // SAFETY: the child has exited.
        unsafe { assert_eq!(read(&owner, p, 4), b"pong") };
    }
    assert_eq!(mappers_of(&owner, pool), 0);
    assert_eq!(mappers_of(&owner, vmm), 0);
    // SAFETY: nothing touches them once freed.
    unsafe {
        owner.free(pool).unwrap();
        owner.free(vmm).unwrap();
    }
}
