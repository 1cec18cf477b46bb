//! Two contexts of one process, job ranks 0 and 1 on two nodes (pseudo-nodes of this
//! host, each alone in its own LMT job), joined by an in-process loopback path: control
//! packets are queued for the other rank, and a data send meets its receive by (sender,
//! transfer) and is copied. Messages between them run the whole context side of the
//! internode path: eager and NET rendezvous, host and device buffers, wildcard matching,
//! and (on two threads) the job-wide barrier and finalize.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpulmt_protocols::{NetId, Rank};

use super::two_nodes;
use crate::context::{Context, Request};
use crate::device::MemoryKind;
use crate::offnode::{NetError, OffNodePath, PostError};
use crate::{Protocol, Status};

/// One side of a data transfer waiting for its other side.
struct Half {
    id: NetId,
    /// The rank that posted it.
    at: Rank,
    sender: Rank,
    xfer: u64,
    buf: usize,
    len: usize,
    /// A receive that drops the data (`buf` is unused).
    drain: bool,
}

#[derive(Default)]
struct Wire {
    /// Per rank: control packets on their way to it.
    ctrl: [VecDeque<Vec<u8>>; 2],
    sends: Vec<Half>,
    recvs: Vec<Half>,
    /// Per rank: its transfers that finished.
    done: [Vec<(NetId, Result<(), NetError>)>; 2],
    shutdowns: usize,
}

impl Wire {
    /// Moves the data of every send whose receive is posted.
    fn match_halves(&mut self) {
        while let Some((s, r)) = self.sends.iter().enumerate().find_map(|(s, send)| {
            self.recvs.iter().position(|r| (r.sender, r.xfer) == (send.sender, send.xfer)).map(|r| (s, r))
        }) {
            let (send, recv) = (self.sends.swap_remove(s), self.recvs.swap_remove(r));
            assert!(send.len <= recv.len, "the engine posts receives that fit");
            if !recv.drain {
                // SAFETY: both buffers are valid until their transfers are reported done (the
                // post_* contracts), which is below; they belong to different requests. Sim
                // device memory is shared memory mapped into this process, so host copies
                // reach it.
                unsafe { std::ptr::copy_nonoverlapping(send.buf as *const u8, recv.buf as *mut u8, send.len) };
            }
            self.done[send.at as usize].push((send.id, Ok(())));
            self.done[recv.at as usize].push((recv.id, Ok(())));
        }
    }
}

struct LoopbackPath {
    me: Rank,
    wire: Arc<Mutex<Wire>>,
}

impl LoopbackPath {
    /// The paths of ranks 0 and 1, and the wire between them.
    fn pair() -> ([Box<dyn OffNodePath>; 2], Arc<Mutex<Wire>>) {
        let wire = Arc::new(Mutex::new(Wire::default()));
        let path = |me| Box::new(LoopbackPath { me, wire: wire.clone() }) as Box<dyn OffNodePath>;
        ([path(0), path(1)], wire.clone())
    }

    fn wire(&self) -> std::sync::MutexGuard<'_, Wire> {
        self.wire.lock().unwrap()
    }
}

impl OffNodePath for LoopbackPath {
    fn post_ctrl_with(&mut self, to: Rank, len: usize, encode: &mut dyn FnMut(&mut [u8])) -> Result<(), PostError> {
        assert_eq!(to, 1 - self.me, "only the other rank is on another node");
        let mut packet = vec![0; len];
        encode(&mut packet);
        self.wire().ctrl[to as usize].push_back(packet);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn post_send(
        &mut self,
        id: NetId,
        to: Rank,
        xfer: u64,
        buf: usize,
        len: usize,
        _mem: MemoryKind,
        _pushed: bool,
    ) -> Result<(), PostError> {
        assert_eq!(to, 1 - self.me);
        let mut w = self.wire();
        w.sends.push(Half { id, at: self.me, sender: self.me, xfer, buf, len, drain: false });
        w.match_halves();
        Ok(())
    }

    unsafe fn post_recv(
        &mut self,
        id: NetId,
        from: Rank,
        xfer: u64,
        buf: usize,
        len: usize,
        _mem: MemoryKind,
    ) -> Result<(), PostError> {
        let mut w = self.wire();
        w.recvs.push(Half { id, at: self.me, sender: from, xfer, buf, len, drain: false });
        w.match_halves();
        Ok(())
    }

    fn post_drain(&mut self, id: NetId, from: Rank, xfer: u64, len: usize) -> Result<(), PostError> {
        let mut w = self.wire();
        w.recvs.push(Half { id, at: self.me, sender: from, xfer, buf: 0, len, drain: true });
        w.match_halves();
        Ok(())
    }

    fn cancel(&mut self, id: NetId) {
        let mut w = self.wire();
        let me = self.me;
        let before = w.sends.len() + w.recvs.len();
        w.sends.retain(|h| !(h.at == me && h.id == id));
        w.recvs.retain(|h| !(h.at == me && h.id == id));
        if w.sends.len() + w.recvs.len() < before {
            w.done[me as usize].push((id, Err(NetError::Cancelled("asked to".into()))));
        }
    }

    fn poll_inbound(&mut self, deliver: &mut dyn FnMut(Rank, Vec<u8>)) -> usize {
        let got: Vec<Vec<u8>> = self.wire().ctrl[self.me as usize].drain(..).collect();
        let (n, from) = (got.len(), 1 - self.me);
        got.into_iter().for_each(|p| deliver(from, p));
        n
    }

    fn poll_done(&mut self, done: &mut dyn FnMut(NetId, Result<(), NetError>)) -> usize {
        let got: Vec<_> = self.wire().done[self.me as usize].drain(..).collect();
        let n = got.len();
        got.into_iter().for_each(|(id, r)| done(id, r));
        n
    }

    fn poll_failed(&mut self, _failed: &mut dyn FnMut(Rank)) {}

    fn shutdown(&mut self, _deadline: Instant) -> Result<(), NetError> {
        self.wire().shutdowns += 1;
        Ok(())
    }
}

/// Progresses both contexts until every request of each is complete.
fn drive(ctxs: &mut [Context; 2], reqs: [Vec<Request>; 2]) -> [Vec<Status>; 2] {
    let mut left = reqs.map(|v| v.into_iter().map(Some).collect::<Vec<_>>());
    let mut out: [Vec<Option<Status>>; 2] = [vec![None; left[0].len()], vec![None; left[1].len()]];
    let t0 = Instant::now();
    while left.iter().flatten().any(Option::is_some) {
        assert!(t0.elapsed().as_secs() < 60, "transfers did not finish");
        for side in 0..2 {
            for (i, slot) in left[side].iter_mut().enumerate() {
                if let Some(r) = slot {
                    if let Some(st) = ctxs[side].test(r).unwrap() {
                        out[side][i] = Some(st);
                        *slot = None;
                    }
                }
            }
        }
    }
    out.map(|v| v.into_iter().map(Option::unwrap).collect())
}

/// Finalizes both contexts, each on its own thread: they meet in the job-wide barrier.
fn finalize_both(ctxs: [Context; 2]) {
    let [a, b] = ctxs;
    let other = std::thread::spawn(move || b.finalize());
    a.finalize().unwrap();
    other.join().unwrap().unwrap();
}

/// A buffer of `len` bytes (at least 1) in host or device memory of `ctx`.
fn buffer(ctx: &mut Context, device: bool, len: usize) -> (usize, Option<Vec<u8>>) {
    if device {
        (ctx.mem_alloc(len.max(1)).unwrap(), None)
    } else {
        let mut v = vec![0u8; len.max(1)];
        (v.as_mut_ptr() as usize, Some(v))
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn every_placement_and_size_crosses_the_loopback_path_byte_for_byte() {
    let ([p0, p1], wire) = LoopbackPath::pair();
    let mut ctxs = [two_nodes(0, Some(p0)), two_nodes(1, Some(p1))];
    // Pseudo-nodes of one host: separate LMT jobs, and node ids that no region matches.
    assert_ne!(ctxs[0].node_job().job, ctxs[1].node_job().job);
    assert_ne!(ctxs[0].node, ctxs[1].node);
    // Around GPULMT_NET_EAGER_LIMIT's default (4 KiB): the last eager size and the first rendezvous one.
    let sizes = [0usize, 1, 4095, 4096, 4097, 65537, 1 << 20];
    for (send_dev, recv_dev) in [(false, false), (true, false), (false, true), (true, true)] {
        for (k, &len) in sizes.iter().enumerate() {
            let data = pattern(len, k as u8);
            let (src, _keep_src) = buffer(&mut ctxs[0], send_dev, len);
            // SAFETY: `src` holds at least `len` bytes; `data` is ours.
            unsafe { ctxs[0].copy_sync(src, data.as_ptr() as usize, len) }.unwrap();
            // One byte more than sent, at an offset, to see that nothing lands outside.
            let (dst, _keep_dst) = buffer(&mut ctxs[1], recv_dev, len + 2);
            let fence = vec![0xeeu8; len + 2];
            // SAFETY: both ranges lie in this test's live allocations of at least that length.
            unsafe { ctxs[1].copy_sync(dst, fence.as_ptr() as usize, len + 2) }.unwrap();
            let tag = k as i32;
            // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
            let r = unsafe { ctxs[1].irecv((dst + 1) as *mut u8, len + 1, None, Some(tag)) }.unwrap();
            // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
            let s = unsafe { ctxs[0].isend(src as *const u8, len, 1, tag) }.unwrap();
            let [_, got] = drive(&mut ctxs, [vec![s], vec![r]]);
            assert_eq!((got[0].source, got[0].tag, got[0].len), (0, tag, len as u64));
            let mut back = vec![0u8; len + 2];
            // SAFETY: both ranges lie in this test's live allocations of at least that length.
            unsafe { ctxs[1].copy_sync(back.as_mut_ptr() as usize, dst, len + 2) }.unwrap();
            let where_ =
                format!("{} -> {}, {len} bytes", if send_dev { "D" } else { "H" }, if recv_dev { "D" } else { "H" });
            assert_eq!(back[1..=len], data[..], "{where_}");
            assert_eq!((back[0], back[len + 1]), (0xee, 0xee), "{where_}: bytes outside the message were written");
        }
    }
    // 4097 bytes and up took the NET rendezvous, four placements each; nothing was exported.
    assert_eq!(ctxs[1].stats().protocol_count(Protocol::Net), 4 * 3);
    assert!(ctxs.iter().all(|c| c.exports.is_empty()), "an IPC region was exported for another node");
    {
        let w = wire.lock().unwrap();
        assert!(w.sends.is_empty() && w.recvs.is_empty());
    }
    finalize_both(ctxs);
}

#[test]
fn wildcard_receives_keep_each_senders_order_across_eager_and_rendezvous() {
    let ([p0, p1], _wire) = LoopbackPath::pair();
    let mut ctxs = [two_nodes(0, Some(p0)), two_nodes(1, Some(p1))];
    // A rendezvous, then an eager message, with one tag: the first receive gets the first.
    let (big, small) = (pattern(100_000, 1), pattern(100, 2));
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s1 = unsafe { ctxs[0].isend(big.as_ptr(), big.len(), 1, 3) }.unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s2 = unsafe { ctxs[0].isend(small.as_ptr(), small.len(), 1, 3) }.unwrap();
    let (mut a, mut b) = (vec![0u8; 100_000], vec![0u8; 100_000]);
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r1 = unsafe { ctxs[1].irecv(a.as_mut_ptr(), a.len(), None, None) }.unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r2 = unsafe { ctxs[1].irecv(b.as_mut_ptr(), b.len(), None, Some(3)) }.unwrap();
    let [_, got] = drive(&mut ctxs, [vec![s1, s2], vec![r1, r2]]);
    assert_eq!((got[0].source, got[0].len, got[1].len), (0, 100_000, 100));
    assert_eq!(a, big);
    assert_eq!(b[..100], small[..]);
    // Truncation: the receive is too small for the rendezvous.
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s = unsafe { ctxs[0].isend(big.as_ptr(), big.len(), 1, 4) }.unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctxs[1].irecv(b.as_mut_ptr(), 10, Some(0), Some(4)) }.unwrap();
    let recvd = loop {
        ctxs[0].progress().unwrap();
        if let Err(e) = ctxs[1].test(&r) {
            break e;
        }
    };
    assert!(recvd.to_string().contains("truncated"), "{recvd}");
    // MPI's rule: the sender of a truncated message completes successfully.
    let [sent, _] = drive(&mut ctxs, [vec![s], vec![]]);
    assert_eq!(sent[0].len, 100_000);
    finalize_both(ctxs);
}

#[test]
fn two_threads_meet_in_job_wide_barriers_and_finalize() {
    let (paths, wire) = LoopbackPath::pair();
    let ranks: Vec<_> = paths
        .into_iter()
        .enumerate()
        .map(|(me, path)| {
            std::thread::spawn(move || {
                let mut ctx = two_nodes(me as Rank, Some(path));
                for round in 0..5u8 {
                    ctx.barrier().unwrap();
                    // A message each way between barriers, through the path.
                    let peer = 1 - me as Rank;
                    let mut got = [0u8; 1];
                    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
                    let r = unsafe { ctx.irecv(got.as_mut_ptr(), 1, Some(peer), Some(1)) }.unwrap();
                    ctx.send(&[round], peer, 1).unwrap();
                    ctx.wait(r).unwrap();
                    assert_eq!(got, [round]);
                }
                ctx.finalize().unwrap();
            })
        })
        .collect();
    for r in ranks {
        r.join().unwrap();
    }
    assert_eq!(wire.lock().unwrap().shutdowns, 2, "each rank shut its path down at finalize");
}
