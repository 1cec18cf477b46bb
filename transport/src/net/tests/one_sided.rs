//! One-sided ops over the loopback: put, put-with-signal, get and atomics into host and
//! device windows, at sizes inline and streamed, with quiet meaning "visible at the target",
//! and fence ordering puts to one target under random network delays.

use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{AmoOp, SignalOp};

use crate::device::MemoryKind;

use super::*;
use crate::net::{HostQueue, WindowId};

/// Bytes of each test window.
const WIN: usize = 200_000;

/// Every rank exposes a host window (id 0) and a device window (id 1), and learns the
/// others'; returns each rank's windows. A window starts at its buffer (an odd address),
/// or with `aligned` at the buffer's allocation, 8-aligned as signals need, `OFFSET`
/// bytes before it.
fn windows(paths: &mut [NetPath], backend: &Backend, aligned: bool) -> Vec<[Buf; 2]> {
    let bufs: Vec<[Buf; 2]> =
        paths.iter().map(|_| [Buf::new(backend, None, WIN), Buf::new(backend, Some(1), WIN)]).collect();
    let start = |b: &Buf| if aligned { b.base() } else { b.addr };
    for (p, w) in paths.iter_mut().zip(&bufs) {
        for (id, b) in w.iter().enumerate() {
            // SAFETY: the buffers outlive the paths' proxies (shut down before the
            // buffers drop, at the end of each test).
            let got = unsafe { p.expose_window(start(b), WIN as u64, b.mem()) }.expect("expose");
            assert_eq!(got, id as WindowId);
        }
    }
    let n = paths.len();
    for (r, p) in paths.iter_mut().enumerate() {
        for (peer, w) in bufs.iter().enumerate().take(n) {
            if peer != r {
                for (id, b) in w.iter().enumerate() {
                    p.add_peer_window(peer as Rank, id as WindowId, start(b) as u64, WIN as u64).expect("peer window");
                }
            }
        }
    }
    bufs
}

fn quiet(q: &mut HostQueue) {
    q.quiet(Instant::now() + PATIENCE).expect("quiet");
}

/// Puts of every size class from host and device memory into both kinds of window, then
/// gets of the same ranges back into both kinds of memory: after each quiet the target's
/// bytes are there, and nothing around the ranges moved.
#[test]
fn put_and_get_land_by_quiet_in_host_and_device_windows() {
    let fabric = LoopbackFabric::with_delays(2, 64, Duration::from_micros(200), 5);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(8), &backend);
    let wins = windows(&mut paths, &backend, false);
    let mut q = paths[0].queue().expect("a free queue");
    let mut seed = 0u8;
    for len in [0usize, 1, 4096, 4097, 65537] {
        for window in [0u32, 1] {
            for src_dev in [None, Some(0)] {
                seed = seed.wrapping_add(1);
                let offset = 1 + 7 * seed as u64;
                let src = Buf::new(&backend, src_dev, len);
                src.fill(seed);
                // SAFETY: src lives until the quiet below completed the op.
                unsafe { q.put_nbi(1, window, offset, src.addr, len, src.mem()) }.expect("put");
                quiet(&mut q);
                let target = wins[1][window as usize].read();
                let what = format!("put of {len} bytes from {src_dev:?} into window {window} at {offset}");
                assert!(target[offset as usize..offset as usize + len] == pattern(len, seed), "{what}");
                for dst_dev in [None, Some(1)] {
                    let dst = Buf::new(&backend, dst_dev, len);
                    // SAFETY: dst lives until the quiet below completed the op.
                    unsafe { q.get_nbi(1, window, offset, dst.addr, len, dst.mem()) }.expect("get");
                    quiet(&mut q);
                    assert!(dst.read() == pattern(len, seed), "get back after the {what} into {dst_dev:?}");
                    assert_eq!(dst.guards(), (vec![0; OFFSET], vec![0; 5]), "a get wrote around its buffer");
                }
            }
        }
    }
    for w in &wins[1] {
        assert_eq!(w.guards(), (vec![0; OFFSET], vec![0; 5]), "a put wrote outside its window");
    }
    drop(q);
    shutdown_all(&mut paths);
}

/// PUT_SIGNAL: the signal word changes only with the data in place (the target sees the
/// data once it sees the signal), `Set` and `Add`, in host and device windows.
#[test]
fn put_signal_writes_the_signal_after_the_data() {
    let fabric = LoopbackFabric::with_delays(2, 64, Duration::from_micros(300), 9);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(8), &backend);
    let wins = windows(&mut paths, &backend, true);
    let mut q = paths[0].queue().expect("a free queue");
    for window in [0u32, 1] {
        let w = &wins[1][window as usize];
        // Offsets into the window, which starts OFFSET bytes before `w`'s buffer: the
        // signal at window offset 8 is w's bytes 5..13.
        let (sig, data_at) = (8u64, 64u64);
        let at = |off: u64| off as usize - OFFSET;
        for (round, len) in [10usize, 50_000].into_iter().enumerate() {
            let src = Buf::new(&backend, None, len);
            src.fill(round as u8 + 40);
            // SAFETY: src lives until the quiet below.
            unsafe { q.put_signal_nbi(1, window, data_at, src.addr, len, src.mem(), sig, 7, SignalOp::Add) }
                .expect("put with signal");
            if window == 0 {
                // The host window can be watched while the op runs: once the signal
                // moved, the data must be there.
                let word = w.base() + sig as usize;
                let deadline = Instant::now() + PATIENCE;
                // SAFETY: 8-aligned inside the live window; the proxy writes it atomically.
                let signal = unsafe { std::sync::atomic::AtomicU64::from_ptr(word as *mut u64) };
                while signal.load(std::sync::atomic::Ordering::Acquire) != 7 * (round as u64 + 1) {
                    assert!(Instant::now() < deadline, "the signal never came");
                    assert_eq!(q.cq().failed, 0, "the put with signal failed");
                    std::hint::spin_loop();
                }
                let data = w.read();
                assert!(data[at(data_at)..at(data_at) + len] == pattern(len, round as u8 + 40), "signal before data");
            }
            quiet(&mut q);
            let data = w.read();
            assert_eq!(u64::from_le_bytes(data[at(sig)..at(sig) + 8].try_into().unwrap()), 7 * (round as u64 + 1));
            assert!(data[at(data_at)..at(data_at) + len] == pattern(len, round as u8 + 40));
        }
        let src = Buf::new(&backend, Some(0), 100);
        // SAFETY: src lives until the quiet below.
        unsafe { q.put_signal_nbi(1, window, 4096, src.addr, 100, src.mem(), sig, 99, SignalOp::Set) }.expect("set");
        quiet(&mut q);
        let data = w.read();
        assert_eq!(u64::from_le_bytes(data[at(sig)..at(sig) + 8].try_into().unwrap()), 99);
    }
    drop(q);
    shutdown_all(&mut paths);
}

/// fence: a put after a fence lands after every put before it to that rank, whatever
/// the delays; quiet then sees the last value. Puts to another rank are not held back
/// by the fence (they are another target's).
#[test]
fn fence_orders_puts_to_one_target() {
    let fabric = LoopbackFabric::with_delays(3, 64, Duration::from_micros(400), 13);
    let backend = sim();
    let mut paths = world(&fabric, 3, &small_cfg(16), &backend);
    let wins = windows(&mut paths, &backend, false);
    let mut q = paths[0].queue().expect("a free queue");
    for round in 0..20u8 {
        // A large first put (many pieces, slow) and a small second one (inline, fast):
        // without the fence the second could land first.
        let (first, second) = (Buf::new(&backend, None, 20_000), Buf::new(&backend, None, 8));
        first.fill(round);
        second.fill(round.wrapping_add(100));
        let window = (round % 2) as u32;
        // SAFETY: the buffers live until the quiet below.
        unsafe {
            q.put_nbi(1, window, 0, first.addr, 20_000, first.mem()).expect("put");
            q.put_nbi(2, window, 0, second.addr, 8, second.mem()).expect("put");
            q.fence();
            q.put_nbi(1, window, 0, second.addr, 8, second.mem()).expect("put");
        }
        quiet(&mut q);
        let got = wins[1][window as usize].read();
        assert_eq!(&got[..8], &pattern(8, round.wrapping_add(100))[..], "round {round}: the fenced put landed first");
        assert!(got[8..20_000] == pattern(20_000, round)[8..], "round {round}: the first put's tail");
    }
    drop(q);
    shutdown_all(&mut paths);
}

/// AMOs: fetch-adds from two ranks, two queues (threads) each, on one word of a host and
/// of a device window give the exact total, and every old value is distinct (each add saw
/// the others' complete); compare-swap swaps only on a match, set and fetch round-trip;
/// an AMO outside the window or misaligned completes with an error, nothing written.
#[test]
fn atomics_from_many_producers_give_exact_totals() {
    let fabric = LoopbackFabric::with_delays(3, 64, Duration::from_micros(100), 21);
    let backend = sim();
    let mut paths = world(&fabric, 3, &small_cfg(8), &backend);
    let wins = windows(&mut paths, &backend, true);
    const ADDS: u64 = 150;
    let word_at = |w: &Buf, off: u64| {
        let data = w.read();
        let at = off as usize - OFFSET;
        u64::from_le_bytes(data[at..at + 8].try_into().unwrap())
    };
    let olds: Vec<Vec<u64>> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for from in [0usize, 2] {
            for _ in 0..2 {
                let mut q = paths[from].queue().expect("a free queue");
                handles.push(s.spawn(move || {
                    let mut olds = Vec::new();
                    for i in 0..ADDS {
                        let window = (i % 2) as u32;
                        let mut old = Box::new(u64::MAX);
                        let at = &mut *old as *mut u64 as usize;
                        // SAFETY: `old` lives until the quiet below completed the op.
                        unsafe { q.amo_nbi(1, window, 64, AmoOp::FetchAdd, 1, 0, at, MemoryKind::Host) }
                            .expect("fetch-add");
                        quiet(&mut q);
                        olds.push(*old + ((window as u64) << 32));
                    }
                    olds
                }));
            }
        }
        handles.into_iter().map(|h| h.join().expect("a producer thread")).collect()
    });
    for (window, w) in wins[1].iter().enumerate() {
        assert_eq!(word_at(w, 64), 4 * ADDS / 2, "window {window}: the fetch-adds' total");
        let mut seen: Vec<u64> = olds.iter().flatten().filter(|&&o| o >> 32 == window as u64).copied().collect();
        seen.sort_unstable();
        let want: Vec<u64> = (0..4 * ADDS / 2).map(|v| v + ((window as u64) << 32)).collect();
        assert_eq!(seen, want, "window {window}: each fetch-add saw a distinct old value");
    }
    let mut q = paths[0].queue().expect("a free queue");
    let mut old = Box::new(0u64);
    let at = &mut *old as *mut u64 as usize;
    // One AMO on rank 1's window, completed (or failed) by the quiet.
    let amo = |q: &mut HostQueue, window: u32, offset: u64, op: AmoOp, operand: u64, compare: u64, result| {
        // SAFETY: `result` is 0 or `old`'s word, which outlives the quiet below.
        unsafe { q.amo_nbi(1, window, offset, op, operand, compare, result, MemoryKind::Host) }.expect("posted");
        q.quiet(Instant::now() + PATIENCE)
    };
    for window in [0u32, 1] {
        let w = &wins[1][window as usize];
        amo(&mut q, window, 128, AmoOp::Set, 41, 0, 0).expect("set");
        assert_eq!(word_at(w, 128), 41);
        amo(&mut q, window, 128, AmoOp::CompareSwap, 7, 40, at).expect("cswap");
        assert_eq!((*old, word_at(w, 128)), (41, 41), "no swap: the word was not 40");
        amo(&mut q, window, 128, AmoOp::CompareSwap, 7, 41, at).expect("cswap");
        assert_eq!((*old, word_at(w, 128)), (41, 7), "swapped");
        *old = 0;
        amo(&mut q, window, 128, AmoOp::Fetch, 0, 0, at).expect("fetch");
        assert_eq!(*old, 7);
        // Outside the window (the initiator's template check refuses it), and misaligned.
        for offset in [WIN as u64, WIN as u64 - 4, 129] {
            let e =
                amo(&mut q, window, offset, AmoOp::Set, 5, 0, 0).expect_err("an AMO outside the window or misaligned");
            assert!(matches!(e, crate::net::QuietError::Failed { .. }), "{e}");
        }
        assert_eq!(word_at(w, 128), 7, "a refused AMO wrote nothing");
    }
    drop(q);
    shutdown_all(&mut paths);
}
