//! Control packets and rendezvous data over the loopback: order per sender, every
//! placement and size checked byte for byte, and a 4-slot queue under backpressure.

use std::time::Duration;

use gpulmt_protocols::NetId;

use super::*;
use crate::net::wire::CTRL_MAX;

/// Control packets of several senders arrive at one rank in each sender's order, whatever
/// the network's delays, from 1 byte to the largest.
#[test]
fn control_packets_keep_each_senders_order() {
    let fabric = LoopbackFabric::with_delays(3, 64, Duration::from_micros(300), 7);
    let backend = sim();
    let mut paths = world(&fabric, 3, &small_cfg(8), &backend);
    const EACH: u32 = 150;
    for i in 0..EACH {
        for (sender, path) in paths.iter_mut().enumerate().skip(1) {
            let len = match i % 5 {
                0 => 1,
                1 => CTRL_MAX,
                _ => 8 + (i as usize * 37) % 3000,
            };
            let mut pkt = pattern(len, i as u8);
            pkt[0] = sender as u8;
            if len >= 5 {
                pkt[1..5].copy_from_slice(&i.to_le_bytes());
            }
            retry(|| path.post_ctrl(0, &pkt));
        }
    }
    let got = wait_inbound(&mut paths[0], 2 * EACH as usize);
    for sender in 1..3u32 {
        let mine: Vec<&Vec<u8>> = got.iter().filter(|(from, _)| *from == sender).map(|(_, b)| b).collect();
        assert_eq!(mine.len(), EACH as usize);
        for (i, pkt) in mine.iter().enumerate() {
            let expect_len = match i % 5 {
                0 => 1,
                1 => CTRL_MAX,
                _ => 8 + (i * 37) % 3000,
            };
            assert_eq!(pkt.len(), expect_len, "packet {i} of rank {sender}");
            assert_eq!(pkt[0], sender as u8);
            if pkt.len() >= 5 {
                assert_eq!(u32::from_le_bytes(pkt[1..5].try_into().unwrap()), i as u32, "order of rank {sender}");
                assert_eq!(&pkt[5..], &pattern(expect_len, i as u8)[5..]);
            }
        }
    }
    // Nothing else was delivered, and nothing completed as data.
    assert_eq!(paths[0].poll_done(&mut |_, _| panic!("no data op was posted")), 0);
    shutdown_all(&mut paths);
}

/// One rendezvous transfer each way of every placement at awkward sizes and odd offsets,
/// in pieces of 4 KiB with random network delays: every byte arrives, none around.
#[test]
fn rendezvous_data_every_placement_and_size() {
    let fabric = LoopbackFabric::with_delays(2, 32, Duration::from_micros(200), 11);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(8), &backend);
    let mut xfer = 0u64;
    for len in [0usize, 1, 4095, 4096, 65537, 300_001] {
        for (src_dev, dst_dev) in [(None, None), (Some(0), None), (None, Some(1)), (Some(1), Some(0))] {
            xfer += 1;
            let src = Buf::new(&backend, src_dev, len);
            let dst = Buf::new(&backend, dst_dev, len);
            src.fill(xfer as u8);
            let (send_id, recv_id) = (NetId(xfer * 2), NetId(xfer * 2 + 1));
            // SAFETY: both buffers live until their ops are reported done below.
            unsafe {
                retry(|| paths[1].post_recv(recv_id, 0, xfer, dst.addr, len, dst.mem()));
                retry(|| paths[0].post_send(send_id, 1, xfer, src.addr, len, src.mem(), xfer.is_multiple_of(2)));
            }
            let done = wait_done(&mut paths, 0, 1);
            assert_eq!(done, vec![(send_id, Ok(()))], "send of {len} bytes {src_dev:?} -> {dst_dev:?}");
            let done = wait_done(&mut paths, 1, 1);
            assert_eq!(done, vec![(recv_id, Ok(()))], "receive of {len} bytes {src_dev:?} -> {dst_dev:?}");
            assert!(dst.read() == pattern(len, xfer as u8), "{len} bytes {src_dev:?} -> {dst_dev:?} differ");
            assert_eq!(dst.guards(), (vec![0; OFFSET], vec![0; 5]), "bytes around the receive buffer were touched");
        }
    }
    shutdown_all(&mut paths);
}

/// A 4-slot queue and a network that takes 2 operations at a time besides the 3 pool
/// receives: far more ops than slots, many transfers interleaved, and every one arrives,
/// in order, nothing lost.
#[test]
fn four_slot_queue_under_backpressure_loses_nothing() {
    let fabric = LoopbackFabric::with_delays(2, 3 + 2, Duration::from_micros(100), 3);
    let backend = sim();
    let mut cfg = small_cfg(4);
    cfg.ctrl_pool = 1;
    let mut paths = world(&fabric, 2, &cfg, &backend);
    const N: u64 = 40;
    let len = 10_000;
    let srcs: Vec<Buf> = (0..N).map(|i| Buf::new(&backend, (i % 2 == 0).then_some(0), len)).collect();
    let dsts: Vec<Buf> = (0..N).map(|i| Buf::new(&backend, (i % 3 == 0).then_some(1), len)).collect();
    for (i, s) in srcs.iter().enumerate() {
        s.fill(i as u8);
    }
    let (mut sent, mut received) = (Vec::new(), Vec::new());
    for i in 0..N {
        // A control packet and a data op per round, receives posted before sends.
        retry(|| paths[0].post_ctrl(1, &i.to_le_bytes()));
        let (d, s) = (&dsts[i as usize], &srcs[i as usize]);
        // SAFETY: the buffers live until every op is reported done below.
        unsafe {
            retry(|| {
                paths[1].poll_done(&mut |id, r| received.push((id, r)));
                paths[1].post_recv(NetId(i), 0, 1000 + i, d.addr, len, d.mem())
            });
            retry(|| {
                paths[0].poll_done(&mut |id, r| sent.push((id, r)));
                paths[0].post_send(NetId(i), 1, 1000 + i, s.addr, len, s.mem(), false)
            });
        }
    }
    sent.extend(wait_done(&mut paths, 0, N as usize - sent.len()));
    received.extend(wait_done(&mut paths, 1, N as usize - received.len()));
    // Each op is reported as it ends (a data op may end before an older one of its queue).
    let ids = |v: &[(NetId, Result<(), NetError>)]| {
        let mut ids = v.iter().map(|(id, r)| (id.0, r.is_ok())).collect::<Vec<_>>();
        ids.sort_unstable();
        ids
    };
    let want: Vec<(u64, bool)> = (0..N).map(|i| (i, true)).collect();
    assert_eq!(ids(&sent), want, "sends complete once each");
    assert_eq!(ids(&received), want, "receives complete once each");
    for (i, d) in dsts.iter().enumerate() {
        assert!(d.read() == pattern(len, i as u8), "transfer {i} differs");
    }
    let ctrl = wait_inbound(&mut paths[1], N as usize);
    let order: Vec<u64> = ctrl.iter().map(|(_, b)| u64::from_le_bytes(b[..8].try_into().unwrap())).collect();
    assert_eq!(order, (0..N).collect::<Vec<_>>());
    shutdown_all(&mut paths);
    assert_eq!(fabric.pending(), (0, 0), "nothing left on the network");
}

/// A pushed send whose receive comes late holds back nothing else of its rank: with
/// 4-slot queues (16 ops in flight a queue), 40 control packets and 40 transfers (each
/// receive posted first, as after a CTS) posted after it all complete while it waits;
/// then its receive comes and it completes too. On the same queue as the rest, the
/// pushed send would keep the 17th op behind it out until that receive.
#[test]
fn a_pushed_send_waiting_for_its_receive_holds_back_nothing_else() {
    let fabric = LoopbackFabric::with_delays(2, 64, Duration::from_micros(50), 5);
    // Its pieces wait for their receive, as MPI's rendezvous does; the rest is eager.
    fabric.rendezvous_above(1024);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(4), &backend);
    let len = 100_000;
    let (src, dst) = (Buf::new(&backend, Some(0), len), Buf::new(&backend, None, len));
    src.fill(9);
    // SAFETY: the buffers live until their ops are reported done below.
    unsafe { retry(|| paths[0].post_send(NetId(1000), 1, 77, src.addr, len, src.mem(), true)) };
    const N: u64 = 40;
    let small: Vec<(Buf, Buf)> =
        (0..N).map(|_| (Buf::new(&backend, None, 300), Buf::new(&backend, None, 300))).collect();
    let (mut sent, mut received) = (Vec::new(), Vec::new());
    for (i, (s, d)) in small.iter().enumerate() {
        let i = i as u64;
        s.fill(i as u8);
        retry(|| paths[0].post_ctrl(1, &i.to_le_bytes()));
        // SAFETY: as above.
        unsafe {
            retry(|| {
                paths[1].poll_done(&mut |id, r| received.push((id, r)));
                paths[1].post_recv(NetId(i), 0, i, d.addr, 300, d.mem())
            });
            retry(|| {
                paths[0].poll_done(&mut |id, r| sent.push((id, r)));
                paths[0].post_send(NetId(i), 1, i, s.addr, 300, s.mem(), false)
            });
        }
    }
    sent.extend(wait_done(&mut paths, 0, N as usize - sent.len()));
    received.extend(wait_done(&mut paths, 1, N as usize - received.len()));
    assert!(sent.iter().all(|(id, r)| id.0 < N && r.is_ok()), "{sent:?}");
    assert!(received.iter().all(|(id, r)| id.0 < N && r.is_ok()), "{received:?}");
    assert_eq!(wait_inbound(&mut paths[1], N as usize).len(), N as usize);
    // The late receive: the pushed data was waiting for it.
    // SAFETY: as above.
    unsafe { retry(|| paths[1].post_recv(NetId(1000), 0, 77, dst.addr, len, dst.mem())) };
    assert_eq!(wait_done(&mut paths, 1, 1), vec![(NetId(1000), Ok(()))]);
    assert_eq!(wait_done(&mut paths, 0, 1), vec![(NetId(1000), Ok(()))]);
    assert!(dst.read() == pattern(len, 9), "the pushed data differs");
    for (i, (_, d)) in small.iter().enumerate() {
        assert!(d.read() == pattern(300, i as u8), "transfer {i} differs");
    }
    shutdown_all(&mut paths);
}

/// A drain takes a pushed transfer's pieces and drops them: the send completes, the
/// drain too, and a transfer behind it lands whole.
#[test]
fn a_drain_takes_a_pushed_transfer_and_writes_nothing() {
    let fabric = LoopbackFabric::with_delays(2, 32, Duration::from_micros(100), 9);
    let backend = sim();
    let mut paths = world(&fabric, 2, &small_cfg(8), &backend);
    let len = 50_001;
    let (src, next, dst) =
        (Buf::new(&backend, Some(0), len), Buf::new(&backend, None, 10), Buf::new(&backend, None, 10));
    src.fill(4);
    next.fill(5);
    // SAFETY: the buffers live until their ops are reported done below.
    unsafe {
        retry(|| paths[0].post_send(NetId(1), 1, 1, src.addr, len, src.mem(), true));
        retry(|| paths[1].post_drain(NetId(1), 0, 1, len));
        retry(|| paths[0].post_send(NetId(2), 1, 2, next.addr, 10, next.mem(), true));
        retry(|| paths[1].post_recv(NetId(2), 0, 2, dst.addr, 10, dst.mem()));
    }
    let mut sent = wait_done(&mut paths, 0, 2);
    sent.sort_by_key(|(id, _)| id.0);
    assert_eq!(sent, vec![(NetId(1), Ok(())), (NetId(2), Ok(()))]);
    let mut got = wait_done(&mut paths, 1, 2);
    got.sort_by_key(|(id, _)| id.0);
    assert_eq!(got, vec![(NetId(1), Ok(())), (NetId(2), Ok(()))]);
    assert!(dst.read() == pattern(10, 5));
    assert_eq!(dst.guards(), (vec![0; OFFSET], vec![0; 5]), "bytes around the receive buffer were touched");
    shutdown_all(&mut paths);
    assert_eq!(fabric.pending(), (0, 0), "nothing left on the network");
}

/// More control packets than the inbound queue holds arrive before the context polls: the
/// proxy keeps the rest, still backs off to sleep while the context does not poll, and
/// hands them over as the queue drains, none lost and each sender's order kept.
#[test]
fn control_packets_beyond_the_inbound_queue_wait_in_order() {
    let fabric = LoopbackFabric::new(2, 64);
    let backend = sim();
    let cfg = small_cfg(8);
    let mut paths = world(&fabric, 2, &cfg, &backend);
    let n = crate::net::shared::INBOUND_SLOTS + 100;
    for i in 0..n {
        retry(|| paths[0].post_ctrl(1, &(i as u32).to_le_bytes()));
    }
    // Nothing polls rank 1 until its queue is full: the rest must wait in its proxy.
    wait_until("the inbound queue never filled", || paths[1].inbound_waiting() >= crate::net::shared::INBOUND_SLOTS);
    // Packets held back for a context that does not poll keep no proxy from backing off.
    wait_until("the proxy holding packets back never slept", || paths[1].proxy_asleep());
    let got = wait_inbound(&mut paths[1], n);
    let want: Vec<(Rank, Vec<u8>)> = (0..n).map(|i| (0, (i as u32).to_le_bytes().to_vec())).collect();
    assert!(
        got == want,
        "{} packets arrived, first out of order at {:?}",
        got.len(),
        got.iter().zip(&want).position(|(a, b)| a != b)
    );
    shutdown_all(&mut paths);
}

/// Control packets posted while the proxy sleeps: each gets through, and a post found the
/// proxy asleep and woke it (`net::idle`) instead of leaving its packet to wait out the
/// sleep. Each post waits until the proxy is asleep, which on a loaded host can take long
/// (its back-off yields 64 times first, each yield a time slice): a fixed pause did not
/// always reach it beside a build. Fails if posts never wake the proxy.
#[test]
fn a_post_wakes_an_idle_proxy() {
    let (fabric, backend) = (LoopbackFabric::new(2, 64), sim());
    let mut paths = sleepy_world(&fabric, &backend);
    let mut posts = 0u8;
    until_woken(&mut paths, 0, "no post found its proxy asleep", |paths| {
        retry(|| paths[0].post_ctrl(1, &[posts; 16]));
        assert_eq!(wait_inbound(&mut paths[1], 1), vec![(0, vec![posts; 16])]);
        posts = posts.wrapping_add(1);
    });
    shutdown_all(&mut paths);
}

/// Two ranks whose proxies back off to sleeps of 50 ms, long enough to be found asleep.
fn sleepy_world(fabric: &LoopbackFabric, backend: &Backend) -> Vec<NetPath> {
    let mut cfg = small_cfg(8);
    cfg.idle_sleep = Duration::from_millis(50);
    world(fabric, 2, &cfg, backend)
}

/// Waits for the proxy of `paths[which]` to sleep, then runs `act`, until an act of that
/// process unparked it; panics saying `none` after [`PATIENCE`]. The proxy may wake on its
/// own between the look and the act: a few acts may miss.
fn until_woken(paths: &mut [NetPath], which: usize, none: &str, mut act: impl FnMut(&mut [NetPath])) {
    let deadline = Instant::now() + PATIENCE;
    while paths[which].proxy_wakes() == 0 {
        assert!(Instant::now() < deadline, "{none} within {PATIENCE:?}");
        wait_until("the idle proxy never went to sleep", || paths[which].proxy_asleep());
        act(paths);
    }
}

/// A thread of the rank waiting on the network (`OffNodePath::waiting`, which each poll of
/// a `test`/`wait` with requests outstanding calls) unparks its sleeping proxy, where no
/// post of its own would, and a packet from another node then reaches it while it polls.
#[test]
fn a_waiting_thread_wakes_its_idle_proxy() {
    let (fabric, backend) = (LoopbackFabric::new(2, 64), sim());
    let mut paths = sleepy_world(&fabric, &backend);
    until_woken(&mut paths, 1, "no poll of a waiter found its proxy asleep", |paths| paths[1].waiting());
    retry(|| paths[0].post_ctrl(1, &[7; 16]));
    let deadline = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    while got.is_empty() {
        assert!(Instant::now() < deadline, "the packet to the waiting rank never arrived");
        paths[1].waiting();
        paths[1].poll_inbound(&mut |from, bytes| got.push((from, bytes)));
        std::thread::yield_now();
    }
    assert_eq!(got, vec![(0, vec![7; 16])]);
    shutdown_all(&mut paths);
}

/// A pushed send whose receive is not posted holds back no later op of its queue
/// (issue 46): later pushed sends to other ranks and to the same rank are admitted and
/// reported done each as it ends, far more of them than the queue's window (4 x 4
/// slots, 64 in the tracker) past the one that waits; the one that waits ends once its
/// receive comes. Reported in queue order, an MPI program whose receive of the first
/// message waits for a message sent after the second send completed hangs.
#[test]
fn a_waiting_pushed_send_holds_no_later_send_back() {
    let fabric = LoopbackFabric::with_delays(3, 32, Duration::from_micros(50), 11);
    let backend = sim();
    // The first message's pieces (4 KiB) wait for their receive, as MPI's rendezvous
    // does; the later ones (at most 249 bytes) finish when sent.
    fabric.rendezvous_above(1000);
    let mut paths = world(&fabric, 3, &small_cfg(4), &backend);
    let len = 9000;
    let first = Buf::new(&backend, Some(0), len);
    first.fill(1);
    // SAFETY: every buffer lives until its op is reported done below.
    unsafe { retry(|| paths[0].post_send(NetId(1), 1, 1, first.addr, len, first.mem(), true)) };
    const LATER: u64 = 150;
    let srcs: Vec<Buf> = (0..LATER).map(|i| Buf::new(&backend, None, 100 + i as usize)).collect();
    let dsts: Vec<Buf> = (0..LATER).map(|i| Buf::new(&backend, None, 100 + i as usize)).collect();
    let mut sent = Vec::new();
    for i in 0..LATER {
        let (to, (s, d)) = (1 + (i % 2) as u32, (&srcs[i as usize], &dsts[i as usize]));
        let n = 100 + i as usize;
        s.fill(i as u8);
        // SAFETY: as above.
        unsafe {
            retry(|| paths[to as usize].post_recv(NetId(10 + i), 0, 10 + i, d.addr, n, d.mem()));
            retry(|| {
                paths[0].poll_done(&mut |id, r| sent.push((id, r)));
                paths[0].post_send(NetId(10 + i), to, 10 + i, s.addr, n, s.mem(), true)
            });
        }
        // One pushed send in flight at a time past the one that waits, as an engine with
        // a small GPULMT_NET_PUSH_SENDS keeps them.
        while !sent.iter().any(|(id, _)| *id == NetId(10 + i)) {
            sent.extend(wait_done(&mut paths, 0, 1));
        }
        assert!(sent.iter().all(|(id, r)| id.0 >= 10 && r.is_ok()), "the first send ended unmatched: {sent:?}");
    }
    assert_eq!(sent.len() as u64, LATER);
    // A send that ended need not have landed yet: the receives say when it did.
    for rank in [1, 2] {
        let got = wait_done(&mut paths, rank, LATER as usize / 2);
        assert!(got.iter().all(|(_, r)| r.is_ok()), "a receive at rank {rank} failed: {got:?}");
    }
    for (i, d) in dsts.iter().enumerate() {
        assert!(d.read() == pattern(100 + i, i as u8), "transfer {i} differs");
    }
    let dst = Buf::new(&backend, Some(1), len);
    // SAFETY: as above.
    unsafe { retry(|| paths[1].post_recv(NetId(1), 0, 1, dst.addr, len, dst.mem())) };
    assert_eq!(wait_done(&mut paths, 0, 1), vec![(NetId(1), Ok(()))]);
    assert_eq!(wait_done(&mut paths, 1, 1), vec![(NetId(1), Ok(()))]);
    assert!(dst.read() == pattern(len, 1));
    shutdown_all(&mut paths);
}
