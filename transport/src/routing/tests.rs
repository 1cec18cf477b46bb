//! Routing with a scripted internode path: a context of job rank 0, alone on its node,
//! whose peer (job rank 1, on another node) exists only as the packets the test feeds
//! and the posts it reads back. It checks what the context hands the path (control
//! packets in order, NoResource kept back, the request's buffer for data) and what it
//! makes of the path's reports (packets to the engine, completions, failures).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gpulmt_protocols::wire::{CtsMode, MemDesc, Packet};
use gpulmt_protocols::{NetId, ProtoError, Rank};

use crate::config::{Config, DeviceChoice};
use crate::context::{Context, JobInfo};
use crate::device::MemoryKind;
use crate::error::Error;
use crate::offnode::{NetError, OffNodePath, PostError};
use crate::topology::{HostSlot, Topology};
use crate::Protocol;

mod loopback;

/// A data post the path took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Posted {
    id: NetId,
    peer: Rank,
    xfer: u64,
    buf: usize,
    len: usize,
    mem: MemoryKind,
    /// A send that went with its RTS (false for every receive).
    pushed: bool,
}

/// What the path took, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Took {
    Ctrl(Rank, Packet),
    Send(Posted),
    Recv(Posted),
    Drain(Posted),
    Cancel(NetId),
}

/// The script both sides share: what was posted, and what the path reports next.
#[derive(Default)]
struct Script {
    took: Vec<Took>,
    /// Answer NoResource to every post.
    full: bool,
    /// Answer every post with this failure.
    refuse: Option<NetError>,
    inbound: VecDeque<(Rank, Vec<u8>)>,
    done: VecDeque<(NetId, Result<(), NetError>)>,
    failed: Vec<Rank>,
    shutdown: Option<Instant>,
    /// The message ids of rank 1's scripted packets.
    next_msg: u64,
    /// Data ops posted that the "proxy" has not taken yet ([`OffNodePath::taken`]).
    untaken: Vec<NetId>,
}

impl Script {
    fn answer(&self) -> Result<(), PostError> {
        match (&self.refuse, self.full) {
            (Some(e), _) => Err(PostError::Failed(e.clone())),
            (None, true) => Err(PostError::NoResource),
            (None, false) => Ok(()),
        }
    }

    /// Rank 1 sends an eager message.
    fn eager_from_peer(&mut self, tag: i32, payload: &[u8]) {
        let msg = self.next_msg;
        self.next_msg += 1;
        self.inbound.push_back((1, Packet::Eager { msg, tag, payload: payload.to_vec() }.to_vec()));
    }

    /// Rank 1 announces a rendezvous that waits for a CTS; returns its message id.
    fn rts_from_peer(&mut self, tag: i32, len: u64) -> u64 {
        self.rts_from_peer_as(tag, len, false)
    }

    /// The same, its data `pushed` (sent with the RTS) or not.
    fn rts_from_peer_as(&mut self, tag: i32, len: u64, pushed: bool) -> u64 {
        let msg = self.next_msg;
        self.next_msg += 1;
        self.inbound.push_back((1, Packet::Rts { msg, tag, len, src: MemDesc::Net { pushed } }.to_vec()));
        msg
    }

    fn ctrl(&self) -> Vec<Packet> {
        self.took.iter().filter_map(|t| if let Took::Ctrl(_, p) = t { Some(p.clone()) } else { None }).collect()
    }
}

#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Script>>);

impl Shared {
    fn with<T>(&self, f: impl FnOnce(&mut Script) -> T) -> T {
        f(&mut self.0.lock().unwrap())
    }
}

struct ScriptedPath(Shared);

impl OffNodePath for ScriptedPath {
    fn post_ctrl_with(&mut self, to: Rank, len: usize, encode: &mut dyn FnMut(&mut [u8])) -> Result<(), PostError> {
        self.0.with(|s| {
            s.answer()?;
            let mut packet = vec![0; len];
            encode(&mut packet);
            s.took.push(Took::Ctrl(to, Packet::decode(&packet).expect("the context posts whole packets")));
            Ok(())
        })
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn post_send(
        &mut self,
        id: NetId,
        to: Rank,
        xfer: u64,
        buf: usize,
        len: usize,
        mem: MemoryKind,
        pushed: bool,
    ) -> Result<(), PostError> {
        self.0.with(|s| {
            s.answer()?;
            s.took.push(Took::Send(Posted { id, peer: to, xfer, buf, len, mem, pushed }));
            Ok(())
        })
    }

    unsafe fn post_recv(
        &mut self,
        id: NetId,
        from: Rank,
        xfer: u64,
        buf: usize,
        len: usize,
        mem: MemoryKind,
    ) -> Result<(), PostError> {
        self.0.with(|s| {
            s.answer()?;
            s.took.push(Took::Recv(Posted { id, peer: from, xfer, buf, len, mem, pushed: false }));
            Ok(())
        })
    }

    fn post_drain(&mut self, id: NetId, from: Rank, xfer: u64, len: usize) -> Result<(), PostError> {
        self.0.with(|s| {
            s.answer()?;
            let mem = MemoryKind::Host;
            s.took.push(Took::Drain(Posted { id, peer: from, xfer, buf: 0, len, mem, pushed: false }));
            Ok(())
        })
    }

    fn taken(&self, id: NetId) -> bool {
        self.0.with(|s| !s.untaken.contains(&id))
    }

    fn cancel(&mut self, id: NetId) {
        self.0.with(|s| s.took.push(Took::Cancel(id)));
    }

    fn poll_inbound(&mut self, deliver: &mut dyn FnMut(Rank, Vec<u8>)) -> usize {
        let got: Vec<_> = self.0.with(|s| s.inbound.drain(..).collect());
        let n = got.len();
        got.into_iter().for_each(|(from, bytes)| deliver(from, bytes));
        n
    }

    fn poll_done(&mut self, done: &mut dyn FnMut(NetId, Result<(), NetError>)) -> usize {
        let got: Vec<_> = self.0.with(|s| s.done.drain(..).collect());
        let n = got.len();
        got.into_iter().for_each(|(id, r)| done(id, r));
        n
    }

    fn poll_failed(&mut self, failed: &mut dyn FnMut(Rank)) {
        let got: Vec<_> = self.0.with(|s| s.failed.drain(..).collect());
        got.into_iter().for_each(failed);
    }

    fn shutdown(&mut self, deadline: Instant) -> Result<(), NetError> {
        self.0.with(|s| s.shutdown = Some(deadline));
        Ok(())
    }
}

pub(super) fn sim_config() -> Config {
    let mut cfg = Config::from_lookup(|_| None).expect("the defaults are valid");
    cfg.device = DeviceChoice::Sim;
    cfg
}

pub(super) fn unique_job(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("routing{}x{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Job rank `me` of a job of two ranks on two nodes (one host split in two pseudo-nodes),
/// alone in its node's LMT job.
pub(super) fn two_nodes(me: Rank, path: Option<Box<dyn OffNodePath>>) -> Context {
    let hosts = [HostSlot { host: 0, local: 0 }, HostSlot { host: 0, local: 1 }];
    let topo = Topology::from_hosts(me, &hosts, 2).unwrap();
    Context::init_world(sim_config(), JobInfo { job: unique_job("ctx"), rank: 0, size: 1 }, topo, path).unwrap()
}

/// Rank 0 with a scripted rank 1 on another node.
fn scripted() -> (Context, Shared) {
    scripted_with(sim_config())
}

/// The same under `cfg`.
fn scripted_with(cfg: Config) -> (Context, Shared) {
    let script = Shared::default();
    let hosts = [HostSlot { host: 0, local: 0 }, HostSlot { host: 0, local: 1 }];
    let topo = Topology::from_hosts(0, &hosts, 2).unwrap();
    let job = JobInfo { job: unique_job("ctx"), rank: 0, size: 1 };
    let ctx = Context::init_world(cfg, job, topo, Some(Box::new(ScriptedPath(script.clone())))).unwrap();
    (ctx, script)
}

/// Finalizes rank 0 without a rank 1 to meet in the job-wide barrier: the path is marked
/// down first, so finalize waits for the node's ranks only (rank 0 alone).
fn finish(mut ctx: Context) {
    ctx.offnode.down = Some("the test is over".into());
    ctx.finalize().unwrap();
}

#[test]
fn eager_messages_to_another_node_take_the_path_in_order() {
    let (mut ctx, script) = scripted();
    let a = b"first message".to_vec();
    let b = vec![7u8; 3000];
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s1 = unsafe { ctx.isend(a.as_ptr(), a.len(), 1, 5) }.unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s2 = unsafe { ctx.isend(b.as_ptr(), b.len(), 1, 6) }.unwrap();
    assert_eq!(ctx.wait(s1).unwrap().source, 1);
    ctx.wait(s2).unwrap();
    let ctrl = script.with(|s| s.ctrl());
    assert!(
        matches!(&ctrl[..], [Packet::Eager { tag: 5, payload: p1, .. }, Packet::Eager { tag: 6, payload: p2, .. }]
        if *p1 == a && *p2 == b),
        "{ctrl:?}"
    );
    assert!(script.with(|s| s.took.iter().all(|t| matches!(t, Took::Ctrl(1, _)))));

    // A device payload is staged to the host and travels in the packet as well.
    let dev = ctx.mem_alloc(100).unwrap();
    let data: Vec<u8> = (0..100).collect();
    // SAFETY: both ranges lie in this test's live allocations of at least that length.
    unsafe { ctx.copy_sync(dev, data.as_ptr() as usize, 100) }.unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s = unsafe { ctx.isend(dev as *const u8, 100, 1, 7) }.unwrap();
    ctx.wait(s).unwrap();
    assert!(
        matches!(script.with(|s| s.ctrl()).last(), Some(Packet::Eager { tag: 7, payload, .. }) if *payload == data)
    );
    assert!(ctx.exports.is_empty(), "no IPC region was exported for another node");
    finish(ctx);
}

#[test]
fn backpressure_keeps_posts_in_order_until_the_path_has_room() {
    let (mut ctx, script) = scripted();
    script.with(|s| s.full = true);
    let msgs: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 10 + i as usize]).collect();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let reqs: Vec<_> = msgs.iter().map(|m| unsafe { ctx.isend(m.as_ptr(), m.len(), 1, 9) }.unwrap()).collect();
    ctx.progress().unwrap();
    assert!(script.with(|s| s.took.is_empty()));
    assert_eq!(ctx.stats().backpressure, 3);
    assert!(ctx.control_pending());
    script.with(|s| s.full = false);
    ctx.progress().unwrap();
    assert!(!ctx.control_pending());
    let sent: Vec<Vec<u8>> = script
        .with(|s| s.ctrl())
        .into_iter()
        .map(|p| match p {
            Packet::Eager { payload, .. } => payload,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(sent, msgs);
    ctx.wait_all(reqs).unwrap();
    finish(ctx);
}

#[test]
fn inbound_packets_reach_the_engine_as_the_peer_rank() {
    let (mut ctx, script) = scripted();
    script.with(|s| {
        s.eager_from_peer(3, b"to host");
        s.eager_from_peer(3, &[9u8; 64]);
    });
    let mut host = [0u8; 16];
    let st = ctx.recv(&mut host, Some(1), Some(3)).unwrap();
    assert_eq!((st.source, st.tag, st.len), (1, 3, 7));
    assert_eq!(&host[..7], b"to host");
    // An eager payload for a device buffer is copied into it.
    let dev = ctx.mem_alloc(64).unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctx.irecv(dev as *mut u8, 64, None, None) }.unwrap();
    let st = ctx.wait(r).unwrap();
    assert_eq!((st.source, st.len), (1, 64));
    let mut back = [0u8; 64];
    // SAFETY: both ranges lie in this test's live allocations of at least that length.
    unsafe { ctx.copy_sync(back.as_mut_ptr() as usize, dev, 64) }.unwrap();
    assert_eq!(back, [9u8; 64]);

    // Garbage, a packet "from" this node's rank, and a free-commit packet from another
    // node are dropped and counted.
    script.with(|s| {
        s.inbound.push_back((1, vec![0xff; 3]));
        s.inbound.push_back((0, Packet::Eager { msg: 0, tag: 1, payload: vec![] }.to_vec()));
        s.inbound.push_back((1, Packet::FreeAck { epoch: 1 }.to_vec()));
        s.inbound.push_back((5, Packet::Eager { msg: 0, tag: 1, payload: vec![] }.to_vec()));
    });
    let before = ctx.stats().violations;
    ctx.progress().unwrap();
    assert_eq!(ctx.stats().violations, before + 4);
    assert_eq!(ctx.iprobe(None, None).unwrap(), None, "none of them became a message");
    finish(ctx);
}

/// Eager messages from another node that receives wait for go straight into their buffers
/// (device or host; truncated where too long), and one that no receive waits for stays
/// unexpected for a later receive, in its sender's order.
#[test]
fn eager_messages_from_another_node_fill_the_receives_that_wait_for_them() {
    let (mut ctx, script) = scripted();
    let dev = ctx.mem_alloc(64).unwrap();
    let mut short = [0u8; 4];
    // SAFETY: both buffers are this test's and outlive their requests, which are waited for.
    let on_dev = unsafe { ctx.irecv(dev as *mut u8, 64, Some(1), Some(5)) }.unwrap();
    // SAFETY: as above.
    let truncated = unsafe { ctx.irecv(short.as_mut_ptr(), short.len(), Some(1), Some(6)) }.unwrap();
    ctx.progress().unwrap();
    let before = ctx.stats().packets_received;
    script.with(|s| {
        s.eager_from_peer(7, b"nobody waits yet");
        s.eager_from_peer(6, b"longer than four");
        s.eager_from_peer(5, &[3u8; 64]);
        s.eager_from_peer(7, b"second");
    });
    let st = ctx.wait(on_dev).unwrap();
    assert_eq!((st.source, st.tag, st.len), (1, 5, 64));
    let mut back = [0u8; 64];
    // SAFETY: both ranges lie in this test's live allocations of at least that length.
    unsafe { ctx.copy_sync(back.as_mut_ptr() as usize, dev, 64) }.unwrap();
    assert_eq!(back, [3u8; 64]);
    let e = ctx.wait(truncated).unwrap_err();
    assert!(matches!(e.as_transfer(), Some(ProtoError::Truncated { .. })), "{e}");
    assert_eq!(&short, b"long", "a truncated receive gets what fits");
    // The two that found no receive wait, in their order, for the receives posted now.
    let mut first = [0u8; 32];
    let st = ctx.recv(&mut first, Some(1), Some(7)).unwrap();
    assert_eq!(&first[..st.len as usize], b"nobody waits yet");
    let st = ctx.recv(&mut first, Some(1), Some(7)).unwrap();
    assert_eq!(&first[..st.len as usize], b"second");
    assert_eq!(ctx.stats().packets_received, before + 4);
    finish(ctx);
}

/// The CTS of a receive from another node leaves only once the path took the receive
/// (its MPI receive is posted), and so does every control packet to that rank after it:
/// a send answering a CTS then never waits for the receiving rank's queue (issue 46).
#[test]
fn a_cts_waits_until_the_path_took_its_receive() {
    let (mut ctx, script) = scripted();
    let len = 100_000;
    // The receive of the first message the path posts is not taken at first.
    let msg = script.with(|s| {
        s.untaken.push(NetId(1));
        s.rts_from_peer(4, len as u64)
    });
    let mut buf = vec![0u8; len];
    // SAFETY: the buffer is this test's and outlives the request (waited for below).
    let r = unsafe { ctx.irecv(buf.as_mut_ptr(), len, Some(1), Some(4)) }.unwrap();
    ctx.progress().unwrap();
    let took = script.with(|s| s.took.clone());
    let [Took::Recv(recv)] = &took[..] else { panic!("expected the receive alone: {took:?}") };
    assert_eq!(recv.id, NetId(1), "the script holds back the path's first data op");
    // An eager message to the same rank waits behind the CTS, in order.
    ctx.send(&[1, 2, 3], 1, 9).unwrap_or_else(|e| panic!("send: {e}"));
    for _ in 0..10 {
        ctx.progress().unwrap();
    }
    assert_eq!(script.with(|s| s.took.len()), 1, "a control packet left before the receive was taken");
    // Taken: the CTS goes, then the eager message.
    script.with(|s| s.untaken.clear());
    ctx.progress().unwrap();
    let ctrl = script.with(|s| s.ctrl());
    let [Packet::Cts { msg: m, mode: CtsMode::Net, .. }, Packet::Eager { tag: 9, .. }] = &ctrl[..] else {
        panic!("expected the CTS, then the eager message: {ctrl:?}")
    };
    assert_eq!(*m, msg);
    script.with(|s| s.done.push_back((recv.id, Ok(()))));
    ctx.wait(r).unwrap();
    finish(ctx);
}

#[test]
fn a_rendezvous_from_another_node_posts_the_receive_before_the_cts() {
    let (mut ctx, script) = scripted();
    let len = 1 << 20;
    let msg = script.with(|s| s.rts_from_peer(4, len as u64));
    let mut buf = vec![0u8; len + 10];
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctx.irecv(buf.as_mut_ptr(), buf.len(), Some(1), Some(4)) }.unwrap();
    ctx.progress().unwrap();
    let took = script.with(|s| s.took.clone());
    let [Took::Recv(recv), Took::Ctrl(1, Packet::Cts { msg: cts_msg, mode: CtsMode::Net, dst: None, .. })] = &took[..]
    else {
        panic!("expected the receive, then a NET CTS: {took:?}")
    };
    assert_eq!(*cts_msg, msg);
    assert_eq!(
        (recv.peer, recv.xfer, recv.buf, recv.len, recv.mem),
        (1, msg, buf.as_ptr() as usize, len, MemoryKind::Host)
    );
    assert_eq!(ctx.test(&r).unwrap(), None, "not complete before the path reports the transfer");
    // The "network" writes the data, then reports the transfer done.
    // SAFETY: both ranges lie in this test's live allocations of at least that length.
    unsafe { std::ptr::write_bytes(recv.buf as *mut u8, 0x5a, len) };
    script.with(|s| s.done.push_back((recv.id, Ok(()))));
    let st = ctx.wait(r).unwrap();
    assert_eq!((st.source, st.tag, st.len), (1, 4, len as u64));
    assert!(buf[..len].iter().all(|&b| b == 0x5a) && buf[len..].iter().all(|&b| b == 0));
    assert_eq!(ctx.stats().protocol_count(Protocol::Net), 1);
    finish(ctx);
}

#[test]
fn a_pushed_rendezvous_to_another_node_sends_its_data_with_the_rts() {
    let (mut ctx, script) = scripted();
    let len = 256 << 10;
    let dev = ctx.mem_alloc(len).unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for below).
    let s = unsafe { ctx.isend(dev as *const u8, len, 1, 8) }.unwrap();
    ctx.progress().unwrap();
    let took = script.with(|s| s.took.clone());
    // Device data's send first: its staging copy starts while the RTS travels.
    let [Took::Send(send), Took::Ctrl(1, Packet::Rts { msg, tag: 8, src: MemDesc::Net { pushed: true }, .. })] =
        &took[..]
    else {
        panic!("expected the send of its device data, then a pushed RTS: {took:?}")
    };
    assert_eq!((send.peer, send.xfer, send.buf, send.len, send.pushed), (1, *msg, dev, len, true));
    assert!(ctx.exports.is_empty(), "no IPC region was exported for another node");
    assert_eq!(ctx.test(&s).unwrap(), None, "not complete before the path reports the transfer");
    script.with(|s| s.done.push_back((send.id, Ok(()))));
    assert_eq!(ctx.wait(s).unwrap().len, len as u64);
    finish(ctx);
}

#[test]
fn a_pushed_rendezvous_from_another_node_is_received_without_a_cts_or_drained_when_truncated() {
    let (mut ctx, script) = scripted();
    let len = 100_000;
    let mut buf = vec![0u8; len];
    let msg = script.with(|s| s.rts_from_peer_as(3, len as u64, true));
    // SAFETY: the buffer is this test's and outlives the request (waited for below).
    let r = unsafe { ctx.irecv(buf.as_mut_ptr(), len, Some(1), Some(3)) }.unwrap();
    ctx.progress().unwrap();
    let took = script.with(|s| std::mem::take(&mut s.took));
    let [Took::Recv(recv)] = &took[..] else { panic!("expected the data receive alone, no CTS: {took:?}") };
    assert_eq!((recv.peer, recv.xfer, recv.buf, recv.len), (1, msg, buf.as_ptr() as usize, len));
    script.with(|s| s.done.push_back((recv.id, Ok(()))));
    assert_eq!(ctx.wait(r).unwrap().len, len as u64);

    // Too long for the receive: its data is drained, the receive truncated, nothing sent back.
    let msg = script.with(|s| s.rts_from_peer_as(3, len as u64 + 1, true));
    // SAFETY: as above.
    let r = unsafe { ctx.irecv(buf.as_mut_ptr(), len, Some(1), Some(3)) }.unwrap();
    let e = ctx.wait(r).unwrap_err();
    assert!(matches!(e.as_transfer(), Some(ProtoError::Truncated { .. })), "{e}");
    let took = script.with(|s| s.took.clone());
    let [Took::Drain(drain)] = &took[..] else { panic!("expected a drain alone: {took:?}") };
    assert_eq!((drain.peer, drain.xfer, drain.len), (1, msg, len + 1));
    script.with(|s| s.done.push_back((drain.id, Ok(()))));
    ctx.progress().unwrap();
    assert!(ctx.engine.is_idle(), "the drain ended");
    finish(ctx);
}

#[test]
fn a_rendezvous_to_another_node_sends_the_request_buffer_without_a_region() {
    // Not pushed: the data waits for the receiver's CTS.
    let mut cfg = sim_config();
    cfg.net.push_max = 0;
    let (mut ctx, script) = scripted_with(cfg);
    let len = 256 << 10;
    let dev = ctx.mem_alloc(len).unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s = unsafe { ctx.isend(dev as *const u8, len, 1, 8) }.unwrap();
    ctx.progress().unwrap();
    let took = script.with(|s| s.took.clone());
    let [Took::Ctrl(1, Packet::Rts { msg, tag: 8, len: l, src: MemDesc::Net { pushed: false } })] = took[..] else {
        panic!("expected an RTS without a region, and nothing else: {took:?}")
    };
    assert_eq!(l, len as u64);
    assert!(ctx.exports.is_empty(), "no IPC region was exported for another node");
    script.with(|s| s.inbound.push_back((1, Packet::Cts { msg, mode: CtsMode::Net, dst: None, split: 0 }.to_vec())));
    ctx.progress().unwrap();
    let Some(Took::Send(send)) = script.with(|s| s.took.last().cloned()) else { panic!("no send posted") };
    assert_eq!((send.peer, send.xfer, send.buf, send.len, send.pushed), (1, msg, dev, len, false));
    assert!(matches!(send.mem, MemoryKind::Device(_)), "{:?}", send.mem);
    assert_eq!(ctx.test(&s).unwrap(), None);
    script.with(|s| s.done.push_back((send.id, Ok(()))));
    assert_eq!(ctx.wait(s).unwrap().len, len as u64);

    // A transfer that fails on the network fails its request.
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s = unsafe { ctx.isend(dev as *const u8, len, 1, 8) }.unwrap();
    ctx.progress().unwrap();
    let Some(Packet::Rts { msg, .. }) = script.with(|s| s.ctrl()).pop() else { panic!("no RTS") };
    script.with(|s| s.inbound.push_back((1, Packet::Cts { msg, mode: CtsMode::Net, dst: None, split: 0 }.to_vec())));
    ctx.progress().unwrap();
    let Some(Took::Send(send)) = script.with(|s| s.took.last().cloned()) else { panic!("no send posted") };
    let mpi = NetError::Mpi { call: "MPI_Isend", message: "scripted failure".into() };
    script.with(|s| s.done.push_back((send.id, Err(mpi))));
    let e = ctx.wait(s).unwrap_err();
    assert!(
        matches!(e.as_transfer(), Some(ProtoError::CopyFailed { what }) if what.contains("scripted failure")),
        "{e}"
    );
    finish(ctx);
}

#[test]
fn a_waiting_receive_and_its_cts_stay_behind_backpressure_and_a_cancel_ends_them() {
    let (mut ctx, script) = scripted();
    script.with(|s| s.full = true);
    let msg = script.with(|s| s.rts_from_peer(2, 100_000));
    let mut buf = vec![0u8; 100_000];
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctx.irecv(buf.as_mut_ptr(), buf.len(), Some(1), Some(2)) }.unwrap();
    ctx.progress().unwrap();
    assert!(script.with(|s| s.took.is_empty()));
    // Room again: the receive goes first, then the CTS.
    script.with(|s| s.full = false);
    ctx.progress().unwrap();
    let took = script.with(|s| s.took.clone());
    assert!(
        matches!(&took[..], [Took::Recv(p), Took::Ctrl(1, Packet::Cts { msg: m, .. })] if p.xfer == msg && *m == msg)
    );
    let Took::Recv(recv) = took[0] else { unreachable!() };
    script.with(|s| s.done.push_back((recv.id, Ok(()))));
    ctx.wait(r).unwrap();

    // A receive still waiting for room when its sender fails never reaches the path.
    script.with(|s| {
        s.took.clear();
        s.full = true;
        s.rts_from_peer(2, 100_000);
    });
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctx.irecv(buf.as_mut_ptr(), buf.len(), Some(1), Some(2)) }.unwrap();
    ctx.progress().unwrap();
    script.with(|s| s.failed.push(1));
    let e = ctx.wait(r).unwrap_err();
    assert!(matches!(e.as_transfer(), Some(ProtoError::PeerFailed { rank: 1 })), "{e}");
    script.with(|s| s.full = false);
    ctx.progress().unwrap();
    assert!(script.with(|s| s.took.is_empty()), "nothing of the failed rank was posted");
    assert_eq!(ctx.offnode.queued(), 0);
    finish(ctx);
}

#[test]
fn a_transfer_the_path_took_is_cancelled_when_its_peer_fails() {
    let (mut ctx, script) = scripted();
    script.with(|s| s.rts_from_peer(2, 100_000));
    let mut buf = vec![0u8; 100_000];
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctx.irecv(buf.as_mut_ptr(), buf.len(), Some(1), Some(2)) }.unwrap();
    ctx.progress().unwrap();
    let Some(Took::Recv(recv)) = script.with(|s| s.took.first().cloned()) else { panic!("no receive posted") };
    // A receive from the failed rank that has not matched fails at once.
    let mut other = [0u8; 4];
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let pending = unsafe { ctx.irecv(other.as_mut_ptr(), 4, Some(1), Some(3)) }.unwrap();
    script.with(|s| s.failed.push(1));
    assert!(matches!(ctx.wait(pending).unwrap_err().as_transfer(), Some(ProtoError::PeerFailed { rank: 1 })));
    assert!(script.with(|s| s.took.contains(&Took::Cancel(recv.id))), "the path was asked to end the transfer");
    // The buffer stays in use, and the request open, until the path reports the end.
    assert_eq!(ctx.test(&r).unwrap(), None);
    script.with(|s| s.done.push_back((recv.id, Err(NetError::Cancelled("peer failed".into())))));
    assert!(matches!(ctx.wait(r).unwrap_err().as_transfer(), Some(ProtoError::PeerFailed { rank: 1 })));
    finish(ctx);
}

#[test]
fn a_path_that_goes_down_makes_other_nodes_unreachable_with_its_reason() {
    let (mut ctx, script) = scripted();
    script.with(|s| s.refuse = Some(NetError::Down("the proxy thread exited".into())));
    let mut byte = [0u8; 1];
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctx.irecv(byte.as_mut_ptr(), 1, Some(1), Some(1)) }.unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let s = unsafe { ctx.isend(byte.as_ptr(), 1, 1, 1) }.unwrap();
    ctx.wait(s).unwrap();
    assert!(matches!(ctx.wait(r).unwrap_err().as_transfer(), Some(ProtoError::PeerFailed { rank: 1 })));
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let e = unsafe { ctx.isend(byte.as_ptr(), 1, 1, 1) }.unwrap_err();
    assert!(e.to_string().contains("the proxy thread exited"), "{e}");
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    assert!(unsafe { ctx.irecv(byte.as_mut_ptr(), 1, Some(1), None) }.is_err());
    finish(ctx);
}

#[test]
fn without_a_path_other_nodes_fail_at_once_and_finalize_needs_only_the_node() {
    let mut ctx = two_nodes(0, None);
    assert!(ctx.topology().on_node(0) && !ctx.topology().on_node(1));
    let mut byte = [0u8; 1];
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let e = unsafe { ctx.isend(byte.as_ptr(), 1, 1, 0) }.unwrap_err();
    assert!(
        matches!(&e, Error::Transfer(ProtoError::Unsupported { what }) if what.contains("rank 1 runs on another node")
        && what.contains("without an internode path")),
        "{e}"
    );
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    assert!(unsafe { ctx.irecv(byte.as_mut_ptr(), 1, Some(1), None) }.is_err());
    assert!(ctx.barrier().is_err(), "a job-wide barrier needs the other node");
    // This node's traffic is unaffected.
    // SAFETY: the buffer is this test's and outlives the request (waited for, or failed at post).
    let r = unsafe { ctx.irecv(byte.as_mut_ptr(), 1, None, None) }.unwrap();
    ctx.send(&[42], 0, 3).unwrap();
    assert_eq!(ctx.wait(r).unwrap().source, 0);
    assert_eq!(byte, [42]);
    ctx.finalize().unwrap();
}

#[test]
fn a_path_attached_after_init_makes_other_nodes_reachable_and_only_once() {
    let mut ctx = two_nodes(0, None);
    let script = Shared::default();
    ctx.attach_offnode_path(Box::new(ScriptedPath(script.clone()))).unwrap();
    // SAFETY: the buffer is this test's and outlives the request (waited for below).
    let s = unsafe { ctx.isend(b"hello".as_ptr(), 5, 1, 4) }.unwrap();
    ctx.wait(s).unwrap();
    let ctrl = script.with(|s| s.ctrl());
    assert!(matches!(&ctrl[..], [Packet::Eager { tag: 4, payload, .. }] if payload == b"hello"), "{ctrl:?}");
    let e = ctx.attach_offnode_path(Box::new(ScriptedPath(Shared::default()))).unwrap_err();
    assert!(e.to_string().contains("has an internode path already"), "{e}");
    finish(ctx);

    // A job of one node has no rank to reach.
    let one = Topology::from_hosts(0, &[HostSlot { host: 0, local: 0 }], 1).unwrap();
    let info = JobInfo { job: unique_job("one"), rank: 0, size: 1 };
    let mut ctx = Context::init_world(sim_config(), info, one, None).unwrap();
    let e = ctx.attach_offnode_path(Box::new(ScriptedPath(Shared::default()))).unwrap_err();
    assert!(e.to_string().contains("one node"), "{e}");
    ctx.finalize().unwrap();
}

#[test]
fn finalize_meets_the_other_node_in_the_barrier_then_shuts_the_path_down() {
    let (ctx, script) = scripted();
    // Rank 1's half of the two-rank barrier, already on its way.
    script.with(|s| s.eager_from_peer(i32::MAX - 1, &[]));
    let t0 = Instant::now();
    ctx.finalize().unwrap();
    let (ctrl, deadline) = script.with(|s| (s.ctrl(), s.shutdown));
    assert!(matches!(&ctrl[..], [Packet::Eager { tag, .. }] if *tag == i32::MAX - 1), "{ctrl:?}");
    assert!(deadline.is_some_and(|d| d > t0), "shutdown ran with a deadline ahead: {deadline:?}");
}
