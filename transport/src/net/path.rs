//! [`NetPath`]: the internode path as a context drives it ([`OffNodePath`]), and the
//! host's one-sided API (windows, producer handles) over the same proxy.
//!
//! The context's thread holds the set's first three queues ([`Lane`]s): a control packet
//! becomes a CTRL packet (its bytes in the slot's control slab), a rendezvous side a SEND
//! or RECV packet whose tag word is the transfer's `xfer`. The lanes report each op as it
//! ends (`QueueMem::report_each_op`), with the text the proxy recorded for a failure, and
//! the proxy admits their ops by how many are in flight, not by how far they lie past the
//! oldest unfinished one (`CompletionTracker::by_count`).
//!
//! **Why three lanes, and why nothing waits in a circle** (`docs/internode.md`). The ops
//! of one queue are taken in order, so an op that cannot be taken holds back every later
//! one of its queue. Each lane holds ops whose end depends on nothing that waits behind
//! them:
//! - **MAIN**: CTRL packets (they end once MPI took them; the peer's proxy keeps receives
//!   posted for them) and SENDs answering a CTS. A CTS leaves only once the proxy took
//!   its RECV (`OffNodePath::taken`, which the context's routing waits for), so such a
//!   SEND always finds its MPI receive posted and ends on the network alone.
//! - **RECVS**: the receiving sides (and drains). One ends once its sender's SEND is
//!   taken: a SEND answering a CTS on the sender's MAIN lane, or a pushed one on its
//!   PUSHED lane, neither of which waits for this rank's receives. On one queue with the
//!   sends, a RECV waiting for a peer's SEND held back this rank's SENDs, which that peer's
//!   RECVs waited for: with 4-slot queues 3 ranks on 3 nodes stalled for good (issue 46).
//! - **PUSHED**: sends that left with their RTS; each ends only when the peer's
//!   application posted the matching receive, which may wait for a message this rank
//!   posts later. They hold back only each other, and only their number in flight
//!   (`GPULMT_NET_PUSH_SENDS`, at most the queue's window) counts for admission, so one
//!   that waits for its receive holds back no later one; and each is reported as it ends,
//!   so a later send's request completes while an earlier one waits (MPI allows the
//!   program to depend on that: `gpulmt-mpi-nodes order`).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{FailureKind, Flags, Op, Template, TemplateTable, Window};
use gpulmt_protocols::{NetId, Rank};
use rustc_hash::FxHashMap;

use super::iface::NetIface;
use super::producer::{Body, CtrlBytes, HostQueue, Targets, WindowId};
use super::proxy::{limits, Proxy, ProxyConfig};
use super::queue::{FailureDetail, QueueMem};
use super::shared::{lock, Command, LocalWindow, QueueSet, Shared};
use crate::config::NetConfig;
use crate::device::{Backend, MemoryKind};
use crate::offnode::{NetError, OffNodePath, PostError};

/// How long the path waits for the proxy to apply a command (a window, templates).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a blocking one-sided post waits for credit: a queue full for this long has a
/// proxy that takes nothing.
const POST_TIMEOUT: Duration = Duration::from_secs(60);

/// What an op of the context's queues was, to report it.
#[derive(Clone, Copy, Debug)]
enum Posted {
    Ctrl { to: Rank },
    Data(NetId),
}

/// One of the context thread's queues and its ops not yet reported, by sequence.
struct Lane {
    queue: HostQueue,
    posted: BTreeMap<u64, Posted>,
}

/// The context's lanes: control packets and sends answering a CTS; receives; pushed sends.
const MAIN: usize = 0;
const PUSHED: usize = 1;
const RECVS: usize = 2;

/// The internode path: the proxy thread, the queues, and the context's producer handles.
pub struct NetPath {
    shared: Arc<Shared>,
    targets: Arc<Targets>,
    /// The context thread's queues ([`MAIN`], [`PUSHED`]).
    lanes: [Lane; 3],
    /// Where each data op was posted: (lane, sequence number).
    ids: FxHashMap<NetId, (usize, u64)>,
    thread: Option<JoinHandle<()>>,
    post_timeout: Duration,
    drain: Duration,
    /// The templates every queue uses (rebuilt when a window is added).
    templates: Vec<Template>,
    next_window: WindowId,
    /// Why the path is down, once it is.
    down: Option<String>,
    /// The hand-over count of the shared failed-rank mailbox taken so far.
    failed_seen: u64,
    /// The proxy was told that one-sided traffic comes ([`Command::OneSided`]).
    one_sided_told: bool,
}

fn failure_error(d: &FailureDetail) -> NetError {
    let text = d.text.clone();
    match d.failure.kind {
        FailureKind::Net => NetError::Mpi { call: "MPI", message: text },
        FailureKind::PeerFailed => NetError::PeerFailed { rank: d.failure.detail },
        FailureKind::Cancelled => NetError::Cancelled(text),
        FailureKind::BadPacket | FailureKind::Stalled => NetError::Rejected(text),
    }
}

impl NetPath {
    /// Starts the path over `iface` for the job ranks `peers` (those on other nodes):
    /// sets up the queues (`cfg.queues` of `cfg.queue_slots` slots, in memory from
    /// `backend`), starts the proxy thread (pinned to `cfg.proxy_cpu(host_local)`, where
    /// `host_local` is this rank's index among the ranks of its host), and claims the
    /// first queue for the caller's thread. `net::start` (feature `mpi`) is the MPI
    /// flavour.
    pub fn start_with(
        iface: Box<dyn NetIface>,
        peers: &[Rank],
        cfg: &NetConfig,
        backend: Backend,
        host_local: u32,
    ) -> Result<NetPath, NetError> {
        let (me, size) = (iface.rank(), iface.size());
        if let Some(&bad) = peers.iter().find(|&&r| r == me || r >= size) {
            return Err(NetError::Down(format!(
                "rank {bad} cannot be an off-node peer of rank {me} in a job of {size} ranks"
            )));
        }
        let mut queues = Vec::with_capacity(cfg.queues as usize);
        for i in 0..cfg.queues {
            let mem = QueueMem::new(backend.clone(), i, cfg.queue_slots as u64)
                .map_err(|e| NetError::Down(format!("allocating GIO queue {i}: {e}")))?;
            queues.push(Arc::new(mem));
        }
        let shared = Arc::new(Shared::new(QueueSet::new(queues)));
        let targets = Arc::new(Targets::new(peers));
        let templates: Vec<Template> = peers.iter().map(|&rank| Template { rank, comm: 0, window: None }).collect();
        let table = TemplateTable::new(templates.clone(), limits()).map_err(|e| NetError::Down(e.to_string()))?;
        let pcfg = ProxyConfig {
            batch: cfg.batch as usize,
            chunk: cfg.chunk,
            depth: cfg.depth,
            stall: cfg.stall,
            idle_sleep: cfg.idle_sleep,
            pool: cfg.ctrl_pool as usize,
            cpu: cfg.proxy_cpu(host_local),
        };
        // The lanes report each op as it ends, which the proxy reads when it sets their
        // queues up: claimed before it starts.
        let lane = || {
            let queue = HostQueue::claim(&shared, &targets, POST_TIMEOUT);
            let queue = queue.expect("a fresh set has its first three queues free (GPULMT_NET_QUEUES >= 3)");
            queue.mem().report_each_op();
            Lane { queue, posted: BTreeMap::new() }
        };
        let lanes = [lane(), lane(), lane()];
        let thread = Proxy::new(pcfg, iface, backend, shared.clone(), Arc::new(table))
            .spawn()
            .map_err(|e| NetError::Down(format!("starting the proxy thread: {e}")))?;
        tracing::info!(
            rank = me,
            peers = peers.len(),
            queues = cfg.queues,
            slots = cfg.queue_slots,
            "internode path up"
        );
        Ok(NetPath {
            shared,
            targets,
            lanes,
            ids: FxHashMap::default(),
            thread: Some(thread),
            post_timeout: POST_TIMEOUT,
            drain: cfg.drain,
            templates,
            next_window: 0,
            down: None,
            failed_seen: 0,
            one_sided_told: false,
        })
    }

    /// A producer handle of a free queue for another thread (the one-sided API), or
    /// `None` when every queue of the set is held (`GPULMT_NET_QUEUES`).
    pub fn queue(&self) -> Option<HostQueue> {
        HostQueue::claim(&self.shared, &self.targets, self.post_timeout)
    }

    /// The template index of `rank`'s window `id` in every queue's table (what a device
    /// producer writes in a packet's target field), if the path reaches `rank`.
    pub fn window_target(&self, rank: Rank, id: WindowId) -> Option<u32> {
        self.targets.window(rank, id)
    }

    /// The job ranks this path reaches.
    pub fn peers(&self) -> &[Rank] {
        self.targets.ranks()
    }

    /// Exposes `base..base + size` to other ranks' one-sided ops as the next window;
    /// returns its id. Every rank must expose its windows in the same order (as a
    /// collective allocation would), so that one id names one window at every rank.
    ///
    /// # Safety
    /// The range is valid memory of the kind `mem` names, for reads and writes by the
    /// proxy at any time (other ranks' ops land whenever they come), until the path is
    /// shut down; the application synchronises its own accesses with those ops (quiet on
    /// the initiators, signals).
    pub unsafe fn expose_window(&mut self, base: usize, size: u64, mem: MemoryKind) -> Result<WindowId, NetError> {
        self.check_up()?;
        self.one_sided();
        let id = self.next_window;
        let cmd = Command::Expose { id, window: LocalWindow { base, size, mem } };
        self.shared.command(cmd, COMMAND_TIMEOUT).map_err(NetError::Down)?;
        self.next_window += 1;
        Ok(id)
    }

    /// How many times a post of this process unparked its sleeping proxy (`net::idle`).
    #[cfg(test)]
    pub(crate) fn proxy_wakes(&self) -> u64 {
        self.shared.idle.wakes()
    }

    /// Control packets waiting in the inbound queue for the context.
    #[cfg(test)]
    pub(crate) fn inbound_waiting(&self) -> usize {
        self.shared.inbound.len()
    }

    /// Whether this process's proxy is asleep now (`net::idle`).
    #[cfg(test)]
    pub(crate) fn proxy_asleep(&self) -> bool {
        self.shared.idle.asleep()
    }

    /// Tells the proxy, once, that one-sided requests and replies will come (its pools for
    /// them start small: `proxy::net::Pool`). Posted ahead of the window's own command,
    /// which waits for the proxy, so both are in place when that returns.
    fn one_sided(&mut self) {
        if !self.one_sided_told {
            self.one_sided_told = true;
            self.shared.post_command(Command::OneSided);
        }
    }

    /// Lets this rank's ops reach `rank`'s window `id`, of `size` bytes at `base` there
    /// (what that rank's [`expose_window`](Self::expose_window) named). The initiator's
    /// proxy checks each op against it, and the target checks again.
    pub fn add_peer_window(&mut self, rank: Rank, id: WindowId, base: u64, size: u64) -> Result<(), NetError> {
        self.check_up()?;
        self.one_sided();
        let t = self.targets.window(rank, id).ok_or_else(|| {
            NetError::Rejected(format!("rank {rank} is not reached by the internode path, or window {id} is too many"))
        })? as usize;
        if self.templates.len() <= t {
            let n = self.targets.ranks().len();
            let blocks = t / n + 1;
            for i in self.templates.len()..blocks * n {
                self.templates.push(Template { rank: self.targets.ranks()[i % n], comm: 0, window: None });
            }
        }
        self.templates[t].window = Some(Window { id, base, size });
        let table =
            TemplateTable::new(self.templates.clone(), limits()).map_err(|e| NetError::Rejected(e.to_string()))?;
        self.shared.command(Command::Templates(Arc::new(table)), COMMAND_TIMEOUT).map_err(NetError::Down)
    }

    fn check_up(&mut self) -> Result<(), NetError> {
        if let Some(why) = &self.down {
            return Err(NetError::Down(why.clone()));
        }
        // Acquire, pairs with Proxy::spawn's release at the thread's exit: its status.
        // Scope: host.
        if !self.shared.running.load(Ordering::Acquire) {
            let why = match lock(&self.shared.exit).clone() {
                Some(Err(e)) => e,
                _ => "the proxy thread exited".into(),
            };
            self.down = Some(why.clone());
            return Err(NetError::Down(why));
        }
        Ok(())
    }

    fn post(&mut self, lane: usize, body: Body<'_>, flags: Flags, to: Rank, what: Posted) -> Result<(), PostError> {
        self.check_up()?;
        let t = self.targets.two_sided(to).ok_or_else(|| {
            PostError::Failed(NetError::Rejected(format!(
                "rank {to} is not on another node: the internode path does not reach it"
            )))
        })?;
        let l = &mut self.lanes[lane];
        let seq = l.queue.try_post(body, flags, t)?;
        l.posted.insert(seq, what);
        if let Posted::Data(id) = what {
            self.ids.insert(id, (lane, seq));
        }
        Ok(())
    }

    /// Reports the ops of the context's queues that ended, each as it ended: a send that
    /// ended is reported though an older one of its queue still waits for its receiver.
    fn report_completed(&mut self, done: &mut dyn FnMut(NetId, Result<(), NetError>)) -> usize {
        (0..self.lanes.len()).map(|lane| self.report_lane(lane, done)).sum()
    }

    fn report_lane(&mut self, lane: usize, done: &mut dyn FnMut(NetId, Result<(), NetError>)) -> usize {
        let l = &mut self.lanes[lane];
        if l.posted.is_empty() {
            return 0;
        }
        let mut n = 0;
        for (seq, detail) in l.queue.mem().take_ended() {
            let Some(what) = l.posted.remove(&seq) else {
                tracing::error!(queue = l.queue.index(), seq, "the proxy reported an op this path never posted");
                continue;
            };
            let result = detail.as_ref().map_or(Ok(()), |d| Err(failure_error(d)));
            match what {
                Posted::Data(id) => {
                    self.ids.remove(&id);
                    done(id, result);
                    n += 1;
                }
                Posted::Ctrl { to } => {
                    if let Err(e) = result {
                        tracing::error!(rank = to, error = %e, "a control packet to another node failed; the rank counts as failed");
                        self.shared.failed_ranks.put_unique(to);
                    }
                }
            }
        }
        n
    }

    /// The proxy thread died on its own (a panic): nothing will complete the ops posted,
    /// so they are reported failed, to end their requests instead of hanging them. The
    /// network may still hold their buffers; the error says so.
    fn fail_all(&mut self, done: &mut dyn FnMut(NetId, Result<(), NetError>)) -> usize {
        let why = self.down.clone().unwrap_or_default();
        let mut n = 0;
        for what in self.lanes.iter_mut().flat_map(|l| std::mem::take(&mut l.posted).into_values()) {
            if let Posted::Data(id) = what {
                let text = format!("{why}; MPI may still hold this transfer's buffer: do not reuse it");
                done(id, Err(NetError::Down(text)));
                n += 1;
            }
        }
        self.ids.clear();
        n
    }

    fn device_flag(mem: MemoryKind, flag: Flags) -> Flags {
        match mem {
            MemoryKind::Host => Flags::NONE,
            MemoryKind::Device(_) => flag,
        }
    }
}

impl OffNodePath for NetPath {
    fn post_ctrl_with(&mut self, to: Rank, len: usize, encode: &mut dyn FnMut(&mut [u8])) -> Result<(), PostError> {
        let ctrl = CtrlBytes { len, encode };
        self.post(MAIN, Body::Ctrl(ctrl), Flags::NONE, to, Posted::Ctrl { to })
    }

    // The trait's signature (`offnode`): every field of the transfer, as its packet has.
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
        let op = Op::Send { src: buf as u64, size: len as u64, tag: xfer };
        let lane = if pushed { PUSHED } else { MAIN };
        self.post(lane, Body::Op(op), Self::device_flag(mem, Flags::SRC_DEVICE), to, Posted::Data(id))
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
        let op = Op::Recv { dst: buf as u64, size: len as u64, tag: xfer };
        self.post(RECVS, Body::Op(op), Self::device_flag(mem, Flags::DST_DEVICE), from, Posted::Data(id))
    }

    fn post_drain(&mut self, id: NetId, from: Rank, xfer: u64, len: usize) -> Result<(), PostError> {
        let op = Op::Recv { dst: 0, size: len as u64, tag: xfer };
        self.post(RECVS, Body::Op(op), Flags::DISCARD, from, Posted::Data(id))
    }

    fn taken(&self, id: NetId) -> bool {
        // An op the path reported is gone from `ids`: taken long ago.
        self.ids.get(&id).is_none_or(|&(lane, seq)| self.lanes[lane].queue.mem().load_head() > seq)
    }

    fn cancel(&mut self, id: NetId) {
        if let Some(&(lane, seq)) = self.ids.get(&id) {
            let queue = self.lanes[lane].queue.index() as u32;
            self.shared.post_command(Command::Cancel { queue, seq });
        }
    }

    fn poll_inbound(&mut self, deliver: &mut dyn FnMut(Rank, Vec<u8>)) -> usize {
        let mut n = 0;
        while let Some((from, packet)) = self.shared.inbound.pop() {
            deliver(from, packet);
            n += 1;
        }
        n
    }

    fn poll_done(&mut self, done: &mut dyn FnMut(NetId, Result<(), NetError>)) -> usize {
        let n = self.report_completed(done);
        let posted = self.lanes.iter().any(|l| !l.posted.is_empty());
        if self.thread.is_some() && posted && self.check_up().is_err() {
            return n + self.fail_all(done);
        }
        n
    }

    fn poll_failed(&mut self, failed: &mut dyn FnMut(Rank)) {
        let ranks = self.shared.failed_ranks.take_new(&mut self.failed_seen);
        for r in ranks {
            failed(r);
        }
    }

    fn net_path(&mut self) -> Option<&mut NetPath> {
        Some(self)
    }

    fn waiting(&self) {
        self.shared.idle.waiting();
    }

    fn shutdown(&mut self, deadline: Instant) -> Result<(), NetError> {
        let Some(thread) = self.thread.take() else { return Ok(()) };
        self.shared.request_stop(deadline);
        if thread.join().is_err() {
            tracing::error!("the proxy thread could not be joined");
        }
        self.down = Some("the internode path was shut down".into());
        let exit = lock(&self.shared.exit).take().unwrap_or(Ok(()));
        exit.map_err(|e| NetError::Down(format!("shutdown: {e}")))
    }
}

impl Drop for NetPath {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if let Err(e) = self.shutdown(Instant::now() + self.drain) {
                tracing::error!(error = %e, "internode path dropped without shutdown");
            }
        }
    }
}
