//! Failure and bad input over the loopback: bad packets rejected with error completions
//! and no access, a producer stopped mid-queue, network errors, a dead rank, cancel, and
//! teardown with ops in flight.

use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{commit_bit, FailureKind, Flags, Op, Packet, PACKET_WORDS};
use gpulmt_protocols::NetId;

use super::*;
use crate::net::queue::QueueState;
use crate::net::QuietError;

/// Rank 1 exposes a 4 KiB host window at an 8-aligned base; rank 0 learns it as `claimed`
/// bytes (larger than it is, to get past the initiator's own check).
fn one_window(paths: &mut [NetPath], backend: &Backend, claimed: u64) -> Buf {
    let w = Buf::new(backend, None, 4096);
    // SAFETY: the buffer outlives the proxies (shut down at the end of each test).
    let id = unsafe { paths[1].expose_window(w.addr, 4096, w.mem()) }.expect("expose");
    paths[0].add_peer_window(1, id, w.addr as u64, claimed).expect("peer window");
    w
}

fn quiet_err(q: &mut crate::net::HostQueue) -> QuietError {
    q.quiet(Instant::now() + PATIENCE).expect_err("the op must fail")
}

/// Bad packets are refused with an error completion and touch nothing: outside the
/// window (refused by the initiator's proxy, and, with a window the initiator believes
/// larger, by the target's), an unknown op, a target out of range; a zeroed NOP is fine.
#[test]
fn bad_packets_complete_with_errors_and_touch_nothing() {
    let fabric = LoopbackFabric::new(2, 64);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(8), &backend);
    let w = one_window(&mut paths, &backend, 8192);
    w.fill(1);
    let src = Buf::new(&backend, None, 5000);
    src.fill(2);
    let mut q = paths[0].queue().expect("a free queue");
    // Past the real window, inside the claimed one: the target refuses, nothing written,
    // the streamed data drained and dropped.
    for (offset, len) in [(4000u64, 200usize), (100, 5000), (4096, 1)] {
        // SAFETY: src lives until the quiet below.
        unsafe { q.put_nbi(1, 0, offset, src.addr, len, src.mem()) }.expect("post");
        let e = quiet_err(&mut q);
        assert!(matches!(&e, QuietError::Failed { text, .. } if text.contains("refused")), "{e}");
        // SAFETY: src lives until the quiet below.
        unsafe { q.get_nbi(1, 0, offset, src.addr, len, src.mem()) }.expect("post");
        assert!(matches!(quiet_err(&mut q), QuietError::Failed { .. }));
    }
    assert!(w.read() == pattern(4096, 1), "a refused put wrote into the window");
    assert_eq!(w.guards(), (vec![0; OFFSET], vec![0; 5]), "a refused put wrote around the window");
    assert!(src.read() == pattern(5000, 2), "a refused get wrote its destination");
    // Past the claimed window: the initiator's proxy refuses it before the network.
    // SAFETY: src lives until the quiet below.
    unsafe { q.put_nbi(1, 0, 8190, src.addr, 8, src.mem()) }.expect("post");
    assert!(matches!(&quiet_err(&mut q), QuietError::Failed { text, .. } if text.contains("outside")));
    // An unknown op code, reserved bits, a target out of range; then a zeroed NOP and a
    // good put, which still work.
    let before = q.cq();
    let bad_op = q.post_raw(|pos, slots| {
        let mut w = [0u64; PACKET_WORDS];
        w[0] = 9 | commit_bit(pos, slots) << 63;
        w
    });
    let reserved = q.post_raw(|pos, slots| {
        let mut w = [0u64; PACKET_WORDS];
        w[0] = 1 << 24 | commit_bit(pos, slots) << 63;
        w
    });
    let far = Packet {
        op: Op::Put { src: src.addr as u64, dst_offset: 0, size: 8 },
        flags: Flags::NONE,
        target: 999,
        cookie: 5,
    };
    let far = q.post_raw(|pos, slots| far.encode(pos, slots).words);
    let nop = q.post_raw(|pos, slots| {
        let mut w = [0u64; PACKET_WORDS];
        w[0] = commit_bit(pos, slots) << 63;
        w
    });
    // SAFETY: src lives until the quiet below.
    unsafe { q.put_nbi(1, 0, 8, src.addr, 8, src.mem()) }.expect("post");
    let deadline = Instant::now() + PATIENCE;
    while q.cq().done < nop + 2 {
        assert!(Instant::now() < deadline, "the packets never completed: {:?}", q.cq());
        std::thread::sleep(Duration::from_millis(1));
    }
    let cq = q.cq();
    assert_eq!(cq.failed - before.failed, 3, "three bad packets, a good NOP and a good put: {cq:?}");
    let failures: Vec<u64> = q
        .take_failures(cq.done)
        .into_iter()
        .map(|(seq, d)| {
            assert_eq!(d.failure.kind, FailureKind::BadPacket, "{}", d.text);
            seq
        })
        .collect();
    assert!(failures.ends_with(&[bad_op, reserved, far]), "{failures:?}");
    assert_eq!(&w.read()[8..16], &pattern(5000, 2)[..8], "the good put after the bad packets landed");
    drop(q);
    shutdown_all(&mut paths);
}

/// A rank that exposes no window keeps one receive posted for one-sided requests, not a
/// pool (`proxy::net::Pool::small`): a burst of requests to it still gets an answer each,
/// an error completion at the initiator, none lost or left hanging.
#[test]
fn requests_to_a_rank_without_windows_are_refused_not_lost() {
    let fabric = LoopbackFabric::with_delays(2, 64, Duration::from_micros(100), 3);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(8), &backend);
    // Rank 0 believes in a window 0 of rank 1 that rank 1 never exposed.
    paths[0].add_peer_window(1, 0, 4096, 4096).expect("peer window");
    let src = Buf::new(&backend, None, 64);
    src.fill(3);
    let mut q = paths[0].queue().expect("a free queue");
    let before = q.cq();
    const BURST: u64 = 20;
    for i in 0..BURST {
        let posted = match i % 2 {
            // SAFETY: src lives until the quiet below.
            0 => unsafe { q.put_nbi(1, 0, 8 * i, src.addr, 8, src.mem()) },
            // SAFETY: as above.
            _ => unsafe { q.get_nbi(1, 0, 8 * i, src.addr, 8, src.mem()) },
        };
        posted.expect("post");
    }
    let e = quiet_err(&mut q);
    assert!(matches!(&e, QuietError::Failed { text, .. } if text.contains("refused")), "{e}");
    let cq = q.cq();
    assert_eq!(cq.failed - before.failed, BURST, "every request answered with an error: {cq:?}");
    assert!(src.read() == pattern(64, 3), "a refused get wrote its destination");
    drop(q);
    shutdown_all(&mut paths);
}

/// A producer that reserved a slot and never committed it: after the stall timeout its
/// queue fails with an error completion (the ops before it completed normally), and the
/// queue takes no more posts; other queues go on.
#[test]
fn a_producer_stopped_mid_queue_fails_its_queue() {
    let fabric = LoopbackFabric::new(2, 64);
    let backend = sim();
    let mut cfg = small_cfg(8);
    cfg.stall = Duration::from_millis(200);
    let mut paths = world(&fabric, 2, &cfg, &backend);
    let w = one_window(&mut paths, &backend, 4096);
    let src = Buf::new(&backend, None, 8);
    let mut q = paths[0].queue().expect("a free queue");
    // SAFETY: src lives until the test ends, after every op completed.
    unsafe { q.put_nbi(1, 0, 0, src.addr, 8, src.mem()) }.expect("post");
    let stuck = q.reserve_without_commit();
    let started = Instant::now();
    let e = quiet_err(&mut q);
    assert!(started.elapsed() >= Duration::from_millis(190), "failed before the stall timeout");
    assert!(matches!(&e, QuietError::Failed { seq, text } if *seq == stuck && text.contains("stopped")), "{e}");
    let cq = q.cq();
    assert_eq!((cq.done, cq.failed), (stuck + 1, 1));
    assert_eq!(cq.first_error.map(|r| r.failure.kind), Some(FailureKind::Stalled));
    assert_eq!(q.mem().state(), QueueState::Stalled);
    // SAFETY: as above.
    let refused = unsafe { q.put_nbi(1, 0, 0, src.addr, 8, src.mem()) };
    assert!(matches!(refused, Err(PostError::Failed(NetError::Down(_)))), "{refused:?}");
    // The context's queue still works.
    paths[0].post_ctrl(1, b"still here").expect("post");
    assert_eq!(wait_inbound(&mut paths[1], 1), vec![(0, b"still here".to_vec())]);
    drop((q, w));
    shutdown_all(&mut paths);
}

/// A network error becomes an error completion of the op; a failed control packet marks
/// its rank failed; a dead rank's ops fail instead of hanging.
#[test]
fn network_errors_and_a_dead_rank_end_in_error_completions() {
    let fabric = LoopbackFabric::new(3, 64);
    let backend = sim();
    let mut paths = world(&fabric, 3, &small_cfg(8), &backend);
    let src = Buf::new(&backend, Some(0), 10_000);
    fabric.fail_sends(1);
    // SAFETY: src lives until the op is reported done.
    unsafe { paths[0].post_send(NetId(1), 1, 77, src.addr, 10_000, src.mem(), false) }.expect("post");
    let done = wait_done(&mut paths, 0, 1);
    assert!(matches!(&done[..], [(NetId(1), Err(NetError::Mpi { .. }))]), "{done:?}");
    fabric.kill(2);
    paths[0].post_ctrl(2, b"hello?").expect("post");
    let dst = Buf::new(&backend, None, 100);
    // SAFETY: dst lives until the op is reported done.
    unsafe { paths[0].post_recv(NetId(2), 2, 78, dst.addr, 100, dst.mem()) }.expect("post");
    let done = wait_done(&mut paths, 0, 1);
    assert!(matches!(&done[..], [(NetId(2), Err(NetError::Mpi { .. }))]), "{done:?}");
    let mut failed = Vec::new();
    let deadline = Instant::now() + PATIENCE;
    while failed.is_empty() {
        paths[0].poll_failed(&mut |r| failed.push(r));
        assert!(Instant::now() < deadline, "the dead rank was never reported");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(failed, vec![2]);
    shutdown_all(&mut paths[..2]);
    paths[2].shutdown(Instant::now()).ok();
}

/// cancel ends a receive nobody sends to, reported once with an error; shutdown with ops
/// in flight (a receive and a send nobody matches) cancels them after the drain deadline,
/// reports them failed, and returns; ops that can finish before it finish.
#[test]
fn cancel_and_teardown_with_ops_in_flight() {
    let fabric = LoopbackFabric::with_delays(2, 64, Duration::from_micros(100), 21);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(8), &backend);
    let (a, b, c) =
        (Buf::new(&backend, None, 50_000), Buf::new(&backend, Some(1), 50_000), Buf::new(&backend, None, 10));
    // SAFETY: the buffers live until their ops are reported done.
    unsafe { paths[0].post_recv(NetId(1), 1, 5, a.addr, 50_000, a.mem()) }.expect("post");
    paths[0].cancel(NetId(1));
    let done = wait_done(&mut paths, 0, 1);
    assert!(matches!(&done[..], [(NetId(1), Err(NetError::Cancelled(_)))]), "{done:?}");
    // A pair that completes, posted just before shutdown: drained, not cancelled.
    c.fill(3);
    let d = Buf::new(&backend, None, 10);
    // SAFETY: the buffers live until their ops are reported done.
    unsafe {
        paths[1].post_recv(NetId(7), 0, 9, d.addr, 10, d.mem()).expect("post");
        paths[0].post_send(NetId(8), 1, 9, c.addr, 10, c.mem(), false).expect("post");
        // Nobody matches these.
        paths[0].post_recv(NetId(2), 1, 6, a.addr, 50_000, a.mem()).expect("post");
        paths[0].post_send(NetId(3), 1, 7, b.addr, 50_000, b.mem(), true).expect("post");
    }
    let started = Instant::now();
    paths[0].shutdown(Instant::now() + Duration::from_millis(300)).expect("every op released");
    assert!(started.elapsed() < Duration::from_secs(20), "shutdown hung: {:?}", started.elapsed());
    let mut done = Vec::new();
    paths[0].poll_done(&mut |id, r| done.push((id, r)));
    done.sort_by_key(|(id, _)| id.0);
    // The unmatched send may also have completed: the loopback, like MPI's eager
    // protocol, lets a send finish before a receive matches it.
    assert!(
        matches!(
            &done[..],
            [
                (NetId(2), Err(NetError::Cancelled(_))),
                (NetId(3), Err(NetError::Cancelled(_)) | Ok(())),
                (NetId(8), Ok(()))
            ]
        ),
        "{done:?}"
    );
    assert_eq!(wait_done(&mut paths, 1, 1), vec![(NetId(7), Ok(()))]);
    assert!(d.read() == pattern(10, 3));
    // The path is down: posts fail, they do not hang.
    assert!(matches!(paths[0].post_ctrl(1, b"x"), Err(PostError::Failed(NetError::Down(_)))));
    paths[1].shutdown(Instant::now() + Duration::from_secs(5)).expect("clean");
}
