//! The proxy thread: one per process, it owns the network endpoint and turns the packets
//! of every GIO send queue into network operations, and reports their completions
//! (`docs/internode.md`, "The proxy").
//!
//! # One round, in order (MSCCL++ / NVSHMEM proxy order)
//! 1. commands from the process (templates, windows, cancels), if any;
//! 2. **drain** each queue: at most `GPULMT_NET_BATCH` packets, each checked against the
//!    templates and *taken only once the network accepted its op* (or it was rejected as
//!    a bad packet with an error completion, or parked by the fence gate); a refused op
//!    stays in its slot and is retried next round;
//! 3. **start** the ops the fence gates release;
//! 4. **test** the network (`iface_progress`): finished sends and receives, arrivals in the
//!    receive pools (control packets, one-sided requests and replies);
//! 5. each control packet that arrived goes to the context's inbound queue as it is
//!    found, in its sender's order: the context may be spinning on one (an eager message's
//!    receive), and handing them over after the rest of the round cost an 8 B D D leg up
//!    to 1.6 us (`bench/gpu/anatomy_net.py` on one H200); packets a full queue held back
//!    are retried here;
//! 6. **advance** staging pipelines and one-sided work at this rank (as target);
//! 7. **publish** completions: each changed CQ's counters, `done` last with release;
//! 8. check the stop flag.
//!
//! Nothing in a round blocks. Idle rounds back off: spin, then yield, then sleep longer
//! and longer up to `GPULMT_NET_IDLE_SLEEP`, a sleep a host post cuts short, and none while
//! a thread of the rank waits on the network: it yields then (`super::idle`).
//! `GPULMT_NET_PROXY_CPU` pins the thread.
//!
//! # Teardown
//! Once stop is asked for, rounds go on until nothing is in flight (every queue taken up
//! to its tail, no op, no one-sided work for other ranks) or the deadline passes. Then
//! everything left is cancelled: ops in flight are asked to end, held and untaken ones
//! complete with `Cancelled`, queues close. Ops whose network operations end within a
//! grace period complete (failed); the rest are never reported done, so their buffers are
//! never reused while the library may still touch them, and the exit status says so.
//!
//! Files: this one (the thread and its round), `net.rs` (network resources and receive
//! pools), `take.rs` (draining queues, starting ops), `initiator.rs` (this rank's ops in
//! flight), `target.rs` (other ranks' one-sided ops on this rank's windows).

mod initiator;
mod net;
mod take;
mod target;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{CompletionTracker, Consumer, FenceGate, TemplateTable};
use gpulmt_protocols::Rank;
use rustc_hash::FxHashMap;

use super::iface::NetIface;
use super::profile::{Phase, ProxyProfile};
use super::queue::{QueueMem, QueueState};
use super::shared::{lock, Command, LocalWindow, Shared};
use crate::device::Backend;
use initiator::Op;
use net::{Net, Owner, Pool, POOL_AM, POOL_CTRL, POOL_REPLY};
use take::Held;
use target::TargetOp;

pub(crate) use take::limits;

/// How long cancelled operations may take to end before the proxy gives up on them.
const CANCEL_GRACE: Duration = Duration::from_secs(1);

/// The proxy's settings.
#[derive(Clone, Debug)]
pub(crate) struct ProxyConfig {
    pub batch: usize,
    pub chunk: u64,
    pub depth: u32,
    pub stall: Duration,
    pub idle_sleep: Duration,
    pub pool: usize,
    pub cpu: Option<u32>,
}

/// The proxy's state of one queue.
struct QueueRun {
    mem: Arc<QueueMem>,
    consumer: Consumer,
    tracker: CompletionTracker,
    gate: FenceGate<Held>,
    /// No more packets are taken (stalled, corrupt, closed).
    dead: bool,
    /// The doorbell as last read: a different one means a producer posted since.
    seen_tail: u64,
    /// The counters changed since they were last published.
    dirty: bool,
}

/// Where a stopping proxy stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopping {
    Running,
    Draining,
    /// Everything was cancelled; waiting for the network to let go until then.
    Cancelling(Instant),
}

/// Per source rank: control packets that arrived ahead of their turn.
#[derive(Default)]
struct Reorder {
    next: u64,
    early: BTreeMap<u64, Vec<u8>>,
}

/// The proxy thread's state.
pub(crate) struct Proxy {
    cfg: ProxyConfig,
    shared: Arc<Shared>,
    net: Net,
    queues: Vec<QueueRun>,
    templates: Arc<TemplateTable>,
    /// This rank's ops in flight, by key.
    ops: FxHashMap<u64, Op>,
    /// Other ranks' one-sided ops on this rank's windows, by key (the same key space).
    targets: FxHashMap<u64, TargetOp>,
    next_key: u64,
    /// Per destination: control messages sent so far (the next one's sequence number).
    ctrl_out: FxHashMap<Rank, u64>,
    ctrl_in: FxHashMap<Rank, Reorder>,
    /// Control packets for the context that found its inbound queue full, oldest first:
    /// later ones wait behind them, to keep each sender's order.
    inbound: VecDeque<(Rank, Vec<u8>)>,
    windows: Vec<Option<LocalWindow>>,
    /// One-sided data transfers started (their tags).
    one_sided_next: u64,
    /// Ops the context cancelled before the proxy took (or started) them: (queue, seq).
    cancels: rustc_hash::FxHashSet<(usize, u64)>,
    pools: [Pool; 3],
    /// A pool may have receives to post (one arrived, or a post was refused).
    pools_short: bool,
    stopping: Stopping,
}

impl Proxy {
    /// A proxy over `iface` for the queues of `shared`, with `templates` for every queue.
    pub fn new(
        cfg: ProxyConfig,
        iface: Box<dyn NetIface>,
        backend: Backend,
        shared: Arc<Shared>,
        templates: Arc<TemplateTable>,
    ) -> Proxy {
        let queues = shared
            .set
            .queues
            .iter()
            .map(|mem| QueueRun {
                mem: mem.clone(),
                consumer: Consumer::new(mem.slots(), cfg.stall).expect("queue slots are a power of two"),
                tracker: match mem.reports_each_op() {
                    true => CompletionTracker::by_count(ops_in_flight(mem.slots())),
                    false => CompletionTracker::new(ops_in_flight(mem.slots())),
                },
                gate: FenceGate::new(mem.slots() as usize),
                dead: false,
                dirty: false,
                seen_tail: 0,
            })
            .collect();
        // The one-sided pools grow when the rank takes part in one-sided traffic
        // (Command::OneSided); two-sided jobs test a third of the receives each round.
        let pools = [
            Pool::new(super::wire::CTRL_TAG, cfg.pool),
            Pool::small(super::wire::AM_TAG, cfg.pool),
            Pool::small(super::wire::REPLY_TAG, cfg.pool),
        ];
        let net = Net::new(iface, backend, cfg.chunk, cfg.depth);
        Proxy {
            cfg,
            shared,
            net,
            queues,
            templates,
            ops: FxHashMap::default(),
            targets: FxHashMap::default(),
            next_key: 1,
            ctrl_out: FxHashMap::default(),
            ctrl_in: FxHashMap::default(),
            inbound: VecDeque::new(),
            windows: Vec::new(),
            one_sided_next: 0,
            cancels: Default::default(),
            pools,
            pools_short: true,
            stopping: Stopping::Running,
        }
    }

    /// Starts the proxy thread.
    pub fn spawn(self) -> std::io::Result<JoinHandle<()>> {
        let shared = self.shared.clone();
        std::thread::Builder::new().name(format!("gpulmt-proxy{}", self.net.iface.rank())).spawn(move || {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.run()));
            let result = result.unwrap_or_else(|p| {
                let what =
                    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
                let what = what.unwrap_or_else(|| "a panic".into());
                tracing::error!(panic = %what, "GIO proxy thread died; the internode path is down");
                for q in &shared.set.queues {
                    q.set_state(QueueState::Closed);
                }
                Err(format!("the proxy thread panicked: {what}"))
            });
            *lock(&shared.exit) = Some(result);
            // Release, pairs with NetPath::check_up and Shared::command's acquire: the exit
            // status and the closed queues are written. Scope: host.
            shared.running.store(false, Ordering::Release);
        })
    }

    fn new_key(&mut self) -> u64 {
        let key = self.next_key;
        self.next_key += 1;
        key
    }

    /// The thread's body: rounds until stopped; the exit status.
    fn run(mut self) -> Result<(), String> {
        if let Some(cpu) = self.cfg.cpu {
            pin_to(cpu);
        }
        tight_timer_slack();
        self.shared.idle.register();
        let mut idle = 0u32;
        let mut waits_seen = 0u64;
        let mut profile = ProxyProfile::default();
        loop {
            let now = Instant::now();
            profile.begin_round(now);
            let mut work = self.apply_commands();
            work |= self.drain_queues(now);
            work |= self.start_held();
            profile.enter(Phase::Network);
            work |= self.test_network();
            if !self.inbound.is_empty() {
                // Held back by a full queue. Work only if some went in: a context that does
                // not poll (a long compute phase) must not keep its proxy from backing off,
                // and it has a queue full to take before it needs these.
                work |= self.retry_hand_over();
            }
            // The queues again, after the network's test (a round's longest step): a packet
            // committed meanwhile waits half a round less to be taken. An idle queue costs
            // one load.
            profile.enter(Phase::Take);
            work |= self.drain_queues(now);
            profile.enter(Phase::Advance);
            work |= self.advance();
            profile.enter(Phase::Publish);
            // Peers are served until the end: a peer may still send while this rank drains.
            // Only after an arrival (or a refused repost) is a pool short of receives.
            if self.pools_short && !matches!(self.stopping, Stopping::Cancelling(_)) {
                self.refill_pools();
            }
            self.publish();
            if let Some(deadline) = self.shared.stop_deadline() {
                if self.stop_step(deadline, now) {
                    break;
                }
            }
            idle = if work { 0 } else { idle.saturating_add(1) };
            // A thread of this rank waits on the network: yield rather than sleep, so what
            // it waits for is taken as it arrives (`net::idle`). Asked only before a sleep.
            if idle > YIELD_UNTIL && self.shared.idle.waited_on(&mut waits_seen) {
                idle = SPIN_UNTIL + 1;
            }
            profile.rounds += 1;
            profile.idle_rounds += u64::from(!work);
            profile.enter(Phase::Idle);
            if let Some(sleep) = back_off(idle, self.cfg.idle_sleep) {
                self.shared.idle.sleep(sleep, || self.work_came());
            }
        }
        profile.enter(Phase::Publish);
        tracing::info!(
            target: "gpulmt_net_profile",
            rank = self.net.iface.rank(),
            "GIO proxy: {}",
            profile.summary(&self.net.profile, self.net.bounce.allocated())
        );
        self.exit()
    }

    fn apply_commands(&mut self) -> bool {
        if !self.shared.has_commands() {
            return false;
        }
        let (cmds, upto) = self.shared.take_commands();
        for cmd in cmds {
            match cmd {
                Command::Templates(t) => self.templates = t,
                Command::Expose { id, window } => {
                    let i = id as usize;
                    if self.windows.len() <= i {
                        self.windows.resize(i + 1, None);
                    }
                    self.windows[i] = Some(window);
                }
                Command::Cancel { queue, seq } => self.cancel_op(queue as usize, seq),
                Command::OneSided => {
                    for pool in [POOL_AM, POOL_REPLY] {
                        self.pools_short |= self.pools[pool].grow();
                    }
                }
            }
        }
        self.shared.applied(upto);
        true
    }

    fn refill_pools(&mut self) {
        self.pools_short = false;
        for (i, pool) in self.pools.iter_mut().enumerate() {
            match pool.refill(i, &mut self.net) {
                Ok(full) => self.pools_short |= !full,
                Err(e) => {
                    self.pools_short = true;
                    tracing::error!(error = %e, tag = pool.tag, "GIO proxy: posting a receive of its pool failed; retrying next round");
                }
            }
        }
    }

    /// Publishes the counters of every queue whose completions changed.
    fn publish(&mut self) {
        for q in self.queues.iter_mut().filter(|q| q.dirty) {
            q.mem.publish_cq(&q.tracker.snapshot());
            crate::anatomy::mark(crate::anatomy::Point::NetPublished, 0);
            q.dirty = false;
        }
    }

    /// One step of stopping; true once the proxy may exit.
    fn stop_step(&mut self, deadline: Instant, now: Instant) -> bool {
        match self.stopping {
            Stopping::Running | Stopping::Draining => {
                self.stopping = Stopping::Draining;
                if self.quiescent() {
                    return true;
                }
                if now >= deadline {
                    tracing::warn!(
                        ops = self.ops.len(),
                        remote = self.targets.len(),
                        "GIO proxy: operations still in flight at the drain deadline are cancelled"
                    );
                    self.cancel_all();
                    self.stopping = Stopping::Cancelling(now + CANCEL_GRACE);
                }
                false
            }
            Stopping::Cancelling(until) => (self.ops.is_empty() && self.targets.is_empty()) || now >= until,
        }
    }

    /// Whether a host producer rang a doorbell or posted a command since the round read
    /// them: the proxy's last look before it sleeps (`net::idle`).
    fn work_came(&self) -> bool {
        self.shared.has_commands() || self.queues.iter().any(|q| !q.dead && q.mem.load_tail() != q.seen_tail)
    }

    /// Nothing left to do: every queue taken to its tail, nothing in flight.
    fn quiescent(&self) -> bool {
        self.ops.is_empty()
            && self.targets.is_empty()
            && self.net.replies.is_empty()
            && self.queues.iter().all(|q| q.dead || (q.gate.held() == 0 && q.consumer.head() >= q.mem.load_tail()))
    }

    /// Ends the proxy: closes the queues, lets go of the pools, frees the network.
    fn exit(mut self) -> Result<(), String> {
        let stranded = self.ops.len() + self.targets.len();
        for (key, op) in &self.ops {
            tracing::error!(key, queue = op.queue, seq = op.seq, "GIO proxy: op not released by the network at exit; it is never reported done and its buffers stay in use");
        }
        for q in &mut self.queues {
            q.mem.set_state(QueueState::Closed);
        }
        for pool in &self.pools {
            pool.cancel(&mut self.net);
        }
        let until = Instant::now() + CANCEL_GRACE;
        while self.pools.iter().any(|p| p.outstanding() > 0) && Instant::now() < until {
            if !self.test_network() {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        self.publish();
        let pools_left: usize = self.pools.iter().map(|p| p.outstanding()).sum();
        self.net.iface.close();
        let [a, b, c] = std::mem::replace(&mut self.pools, [Pool::new(0, 0), Pool::new(0, 0), Pool::new(0, 0)]);
        for p in [a, b, c] {
            p.leak_if_outstanding();
        }
        match (stranded, pools_left) {
            (0, 0) => Ok(()),
            _ => Err(format!(
                "{stranded} operations and {pools_left} pool receives were not released by the network at exit; their buffers are leaked"
            )),
        }
    }
}

/// How many ops of a queue of `slots` slots the proxy keeps in flight, counted from its
/// oldest unfinished one: room for ops still in flight after their slots were reused.
pub const fn ops_in_flight(slots: u64) -> u64 {
    4 * slots
}

/// Idle rounds the proxy spins through before it yields.
const SPIN_UNTIL: u32 = 64;
/// Idle rounds the proxy yields through before it sleeps.
const YIELD_UNTIL: u32 = 128;

/// Spins or yields after `idle` rounds without work, or says how long to sleep.
fn back_off(idle: u32, max_sleep: Duration) -> Option<Duration> {
    match idle {
        0 => None,
        1..=SPIN_UNTIL => {
            std::hint::spin_loop();
            None
        }
        n if n <= YIELD_UNTIL => {
            std::thread::yield_now();
            None
        }
        n => Some(Duration::from_micros(1u64 << ((n - YIELD_UNTIL) / 16).min(20)).min(max_sleep)),
    }
}

/// Makes the calling thread's sleeps as short as asked: Linux lets a sleep of a normal
/// thread overrun by its timer slack, 50 us by default, so the idle back-off's first
/// sleeps of 1-2 us could each last 50 us and more (a 1 us sleep took 49-94 us on the CI
/// host, 16-22 us with a slack of 1 us: `lab/gpu/sleep_cost.c`), and a message that
/// arrived meanwhile waited for the proxy that long. A failure is logged, not fatal.
fn tight_timer_slack() {
    const SLACK_NS: libc::c_ulong = 1_000;
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and changes only this thread's
    // timer slack.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, SLACK_NS, 0, 0, 0) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(error = %e, "the proxy thread's timer slack could not be set: its idle sleeps may overrun");
    }
}

/// Pins the calling thread to `cpu`; a failure is logged, not fatal.
fn pin_to(cpu: u32) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes inside it; the call reads
    // the set only.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if (cpu as usize) < libc::CPU_SETSIZE as usize {
            libc::CPU_SET(cpu as usize, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        tracing::warn!(cpu, error = %e, "GPULMT_NET_PROXY_CPU: the proxy thread could not be pinned");
    } else {
        tracing::info!(cpu, "GPULMT_NET_PROXY_CPU: proxy thread pinned");
    }
}

impl Proxy {
    /// A pool slot's arrival (or failure): dispatches it and frees the slot.
    fn on_pool(&mut self, pool: usize, slot: usize, result: Result<super::iface::Arrival, super::iface::NetFail>) {
        self.pools_short = true;
        let arrival = match result {
            Ok(a) => a,
            Err(super::iface::NetFail::Cancelled) => {
                self.pools[pool].arrived(slot, 0);
                return;
            }
            Err(e) => {
                self.pools[pool].arrived(slot, 0);
                tracing::error!(error = %e, pool, "GIO proxy: a receive of its pool failed");
                return;
            }
        };
        let msg = self.pools[pool].arrived(slot, arrival.len).to_vec();
        match pool {
            POOL_CTRL => self.on_ctrl(arrival.source, &msg),
            POOL_AM => self.on_request(arrival.source, &msg),
            POOL_REPLY => self.on_reply(arrival.source, &msg),
            _ => unreachable!("three pools"),
        }
    }

    /// A control message from `source`: in its sender's order to the inbound queue.
    fn on_ctrl(&mut self, source: Rank, msg: &[u8]) {
        crate::anatomy::mark(crate::anatomy::Point::NetArrived, 0);
        let Some((seq, packet)) = super::wire::ctrl_open(msg) else {
            return tracing::error!(source, len = msg.len(), "GIO proxy: control message without its envelope dropped");
        };
        let r = self.ctrl_in.entry(source).or_default();
        if seq < r.next {
            return tracing::error!(source, seq, next = r.next, "GIO proxy: control message repeated; dropped");
        }
        if seq > r.next {
            r.early.insert(seq, packet.to_vec());
            return;
        }
        // In turn (the usual case: one sender's messages complete in order): straight to
        // the context, then whatever waited behind it.
        r.next += 1;
        self.hand_over(source, packet.to_vec());
        loop {
            let r = self.ctrl_in.get_mut(&source).expect("entered above");
            let Some(p) = r.early.remove(&r.next) else { break };
            r.next += 1;
            self.hand_over(source, p);
        }
    }

    /// Hands a control packet to the context at once (the context may be spinning on it:
    /// handing arrivals over at the end of the round cost an 8 B leg 0.45-0.48 us,
    /// `net_anatomy3`), or keeps it, behind any kept before, while the queue is full.
    fn hand_over(&mut self, source: Rank, packet: Vec<u8>) {
        if !self.inbound.is_empty() {
            return self.inbound.push_back((source, packet));
        }
        match self.shared.inbound.push((source, packet)) {
            Ok(()) => crate::anatomy::mark(crate::anatomy::Point::Probe, crate::anatomy::probe::NET_HANDED_OVER),
            Err(back) => self.inbound.push_back(back),
        }
    }

    /// Hands over the packets a full queue held back, oldest first, while it has room;
    /// whether any went.
    fn retry_hand_over(&mut self) -> bool {
        let mut moved = false;
        while let Some(p) = self.inbound.pop_front() {
            if let Err(back) = self.shared.inbound.push(p) {
                self.inbound.push_front(back);
                break;
            }
            moved = true;
        }
        moved
    }

    /// Tests the network and dispatches what finished; true if anything did.
    fn test_network(&mut self) -> bool {
        let mut finished = std::mem::take(&mut self.net.done_now);
        self.net.iface.iface_progress(&mut |req, result| finished.push((req, result)));
        let any = !finished.is_empty();
        for (req, result) in finished {
            let Some(owner) = self.net.owners.remove(&req) else {
                tracing::error!(req, "GIO proxy: completion of an unknown network operation");
                continue;
            };
            match owner {
                Owner::Pool { pool, slot } => self.on_pool(pool, slot, result),
                Owner::Reply => {
                    self.net.replies.remove(&req);
                    if let Err(e) = result {
                        tracing::error!(error = %e, "GIO proxy: a one-sided reply failed to send");
                    }
                }
                Owner::Piece { key, piece } => self.on_piece(key, piece, result),
                Owner::Message { key } => self.on_message(key, result),
            }
        }
        any
    }
}
