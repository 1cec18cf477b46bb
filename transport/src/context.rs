//! The public Rust API: a [`Context`] per rank, with MPI-style non-blocking
//! point-to-point operations, device memory management with two-phase free, and
//! the job's bootstrap.
//!
//! A context spans every rank of its job ([`Topology`]): ranks in the API are job ranks.
//! The ranks of its node share its LMT job (shared-memory segment, rings, staging, IPC),
//! addressed by local index; ranks of other nodes are reached through an
//! [`OffNodePath`] (`routing.rs`).
//!
//! A context is driven by its owner's thread: progress happens inside `test`,
//! `wait`, `progress` and the other calls (like MPI_THREAD_FUNNELED). The I/O that
//! executes the protocol engine's actions lives in [`crate::progress`].

mod live;
mod pause;
mod released;

use std::borrow::Cow;
use std::collections::VecDeque;

// Request ids and buffer ids are ours: a fast hasher is safe on this hot path.
use rustc_hash::FxHashMap as HashMap;
use std::time::Instant;

use gpulmt_handles::{CacheLimits, ExportCache, FreeCommit, FreeMarks, HandleCache};
use gpulmt_protocols::engine::{BufDesc, Engine};
use gpulmt_protocols::policy::Protocol;
use gpulmt_protocols::wire::{Packet, Region, RegionMemo};
use gpulmt_protocols::{ProtoError, Rank, ReqId, Status, Tag};

use crate::anatomy::{self, probe, Point};
use crate::config::{Config, CopyPriority};
use crate::device::{self, Backend, BackendKind, DevId, DeviceError, IpcHandle, MemoryKind, PointerInfo};
use crate::error::{Error, Result};
use crate::mapping::DeviceOpener;
use crate::memtype::HostRangeCache;
use crate::offnode::OffNodePath;
use crate::progress::{CopyQueue, Stats};
use crate::requests::RequestTable;
use crate::routing::OffNode;
use crate::shm::job::{node_id, JobLayout, JobSegment, RankState};
use crate::shm::object::ShmError;
use crate::shm::ring::PacketRing;
use crate::shm::sweep::{self, Evidence};
pub use crate::topology::JobInfo;
use crate::topology::Topology;
pub(crate) use pause::WaitPause;

/// Tags at or above this value are reserved for gpulmt's own collectives.
pub const TAG_UB: Tag = gpulmt_protocols::matching::RESERVED_TAG_BASE;

/// A pending operation. Complete it with [`Context::wait`] or [`Context::test`].
#[must_use = "a request must be waited for or tested to completion"]
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Request(pub(crate) u64);

impl Request {
    /// The request's number (for logs and C handles).
    pub fn id(&self) -> u64 {
        self.0
    }
    /// Rebuilds a request from [`id`](Self::id) (for the C ABI).
    pub fn from_id(id: u64) -> Self {
        Request(id)
    }
}

/// A user buffer of a live request.
pub(crate) struct ReqState {
    pub ptr: usize,
    pub len: usize,
    pub kind: MemoryKind,
    pub result: Option<std::result::Result<Status, ProtoError>>,
    pub protocol: Option<Protocol>,
    pub span: tracing::Span,
}

/// Starts the copy server of this rank's device for copies of at most `max` bytes
/// (`GPULMT_COPY_SERVER_MAX`, or 0 where it is refused); where it cannot run, small copies
/// keep using the copy engine. With 0 it is made for word atomics only (see
/// `device/word_atomic.rs`), here at start-up, before the application's kernels run.
fn enable_copy_server(backend: &dyn device::DeviceBackend, cfg: &Config, device: DevId, max: u64) {
    match backend.enable_copy_server(device, max as usize, cfg.copy_server_idle) {
        Ok(()) if max == 0 => {}
        Ok(()) => tracing::info!(device, max, idle = ?cfg.copy_server_idle, "copy server enabled"),
        Err(device::DeviceError::Unsupported { .. }) if max == 0 => {}
        Err(device::DeviceError::Unsupported { backend, .. }) => {
            tracing::info!(?backend, "GPULMT_COPY_SERVER_MAX ignored: this backend has no copy server")
        }
        Err(e) if max == 0 => tracing::warn!(
            device,
            error = %e,
            "copy server not made: 64-bit atomics on this rank's device memory from the host or from other nodes \
             will try to make it when they come, which may wait for running kernels"
        ),
        Err(e) => tracing::warn!(device, error = %e, "copy server not started; small copies use the copy engine"),
    }
}

/// One rank's endpoint of a gpulmt job.
pub struct Context {
    pub(crate) cfg: Config,
    /// The LMT job of this rank's node: its segment's name, local index and size.
    pub(crate) info: JobInfo,
    /// Every rank of the job: job rank <-> (node, local index).
    pub(crate) topo: Topology,
    /// The node id of the engine and of exported regions: the host's, and with
    /// pseudo-nodes distinct per pseudo-node, so that no region crosses them.
    pub(crate) node: u64,
    pub(crate) backend: Backend,
    pub(crate) device: DevId,
    pub(crate) seg: JobSegment,
    pub(crate) engine: Engine,
    pub(crate) cache: HandleCache<DeviceOpener>,
    pub(crate) exports: ExportCache<u64, IpcHandle>,
    pub(crate) reqs: RequestTable<ReqState>,
    host_ranges: HostRangeCache,
    /// Per job rank: encoded packets waiting for space in its ring (FIFO); empty for
    /// ranks of other nodes, whose waiting posts `offnode` keeps.
    pub(crate) outbox: Vec<VecDeque<Vec<u8>>>,
    pub(crate) outbox_len: usize,
    pub(crate) loopback: VecDeque<Packet>,
    /// Device copies in flight, one FIFO per (engine, lane): copies of one lane
    /// finish in order, so only each queue's oldest needs polling.
    pub(crate) inflight: Vec<CopyQueue>,
    /// Per directed pair of local indices: whether its staging area is registered for DMA.
    pub(crate) staging_registered: Vec<bool>,
    /// Pinned memory through which eager device payloads are copied out and in.
    pub(crate) eager_bounce: crate::eager_bounce::EagerBounce,
    pub(crate) last_liveness: Instant,
    /// Progress calls since the last liveness check (reading the clock on every
    /// call would cost a tenth of the eager latency).
    pub(crate) polls_since_liveness: u32,
    /// What dead local peers left in `/dev/shm`, removed by this survivor.
    pub(crate) dead_peers: crate::shm::sweep::DeadPeerSweep,
    /// Views of the rings from each rank of the node to us and from us to each, by
    /// local index.
    pub(crate) rx: Vec<PacketRing>,
    pub(crate) tx: Vec<PacketRing>,
    /// Per local index, each ring end's memory of the allocations whose regions it carried in
    /// full, so that a later region of one crosses in one cache line (see `RegionMemo`).
    pub(crate) rx_memo: Vec<RegionMemo>,
    pub(crate) tx_memo: Vec<RegionMemo>,
    pub(crate) stats: Stats,
    pub(crate) free_marks: FreeMarks<u64>,
    /// Buffer id -> address of allocations made through `mem_alloc`.
    pub(crate) allocations: HashMap<u64, usize>,
    pub(crate) free_commit: FreeCommit<u64>,
    pub(crate) finalized: bool,
    /// Plugin mode: the host's control channel replaces the rings.
    pub(crate) channel: Option<crate::plugin::HostChannel>,
    /// Plugin mode: set while an LMT call wants its RTS/CTS handed back as a cookie
    /// for the host to carry, instead of sent.
    pub(crate) capture: Option<Option<Vec<u8>>>,
    /// The path to ranks of other nodes, and its posts waiting for room.
    pub(crate) offnode: OffNode,
    /// Every range `mem_alloc` returned, to refuse buffers in released device memory.
    past_allocations: released::PastAllocations,
    /// This process's claim of the rank (one live context per rank), released on drop.
    _live: live::LiveClaim,
    /// The symmetric heap, from the first `sym_alloc` on (`crate::sym`).
    pub(crate) sym: Option<crate::sym::SymHeap>,
    /// Device memory moved through staging because no peer can map it.
    pub(crate) memory_kinds: crate::memory_kinds::MemoryKinds,
}

impl Context {
    /// Joins the job described by the environment (see [`JobInfo::from_env`]) with
    /// the configuration of the `GPULMT_*` variables.
    ///
    /// Installs no log subscriber: gpulmt's events go to the application's own, if it
    /// has one (see [`crate::logging`]).
    pub fn init() -> Result<Context> {
        Self::init_with(Config::from_env()?, JobInfo::from_env()?)
    }

    /// Joins a job of one node with an explicit configuration.
    pub fn init_with(cfg: Config, info: JobInfo) -> Result<Context> {
        Self::init_inner(cfg, info, None, None, None)
    }

    /// Joins a job that may span nodes: `topology` places every job rank, `info` is the
    /// LMT job of this rank's node (its id, and this rank's local index and the node's
    /// size, as `topology` says), and `offnode` reaches the ranks of other nodes. Without
    /// it, transfers with ranks of other nodes fail with an error that says so.
    pub fn init_world(
        cfg: Config,
        info: JobInfo,
        topology: Topology,
        offnode: Option<Box<dyn OffNodePath>>,
    ) -> Result<Context> {
        Self::init_inner(cfg, info, Some(topology), offnode, None)
    }

    /// `topology` None: one node, whose job ranks are `info`'s.
    pub(crate) fn init_inner(
        cfg: Config,
        info: JobInfo,
        topology: Option<Topology>,
        offnode: Option<Box<dyn OffNodePath>>,
        channel: Option<crate::plugin::HostChannel>,
    ) -> Result<Context> {
        if info.rank >= info.size {
            return Err(Error::Bootstrap(format!(
                "local rank {} is not below the node's {} ranks",
                info.rank, info.size
            )));
        }
        let topo = match topology {
            Some(t) => t,
            None if cfg.pseudo_nodes > 1 => {
                return Err(Error::Bootstrap(format!(
                    "GPULMT_PSEUDO_NODES={} splits jobs started by mpirun (gpulmt::mpi::init_from_mpi); this job \
                     has one node (gpulmt-run, or an LMT plugin's): unset it",
                    cfg.pseudo_nodes
                )))
            }
            None => Topology::single_node(info.rank, info.size),
        };
        let place = topo.place();
        if (place.local, topo.local_size()) != (info.rank, info.size) {
            return Err(Error::Bootstrap(format!(
                "job rank {} is local rank {} of {} on its node, but its node's job says {} of {}",
                topo.rank(),
                place.local,
                topo.local_size(),
                info.rank,
                info.size
            )));
        }
        let live = live::LiveClaim::take(&info)?;
        let backend = device::select(cfg.device)?;
        let ndev = backend.device_count();
        if ndev == 0 {
            return Err(Error::Bootstrap("the device backend reports no devices".into()));
        }
        let device = match cfg.gpu {
            Some(g) if g >= ndev => {
                return Err(device::DeviceError::NoSuchDevice { dev: g, count: ndev }.into());
            }
            Some(g) => g,
            None => {
                let local = std::env::var("GPULMT_LOCAL_RANK").ok().and_then(|v| v.parse::<u32>().ok());
                local.unwrap_or(topo.host_local()) % ndev
            }
        };
        let layout = JobLayout {
            nranks: info.size,
            ring_slots: cfg.ring_slots,
            slot_size: cfg.slot_size,
            chunk_size: cfg.chunk_size,
            depth: cfg.depth,
        };
        let seg = if info.rank == 0 {
            create_segment(&info.job, layout)?
        } else {
            JobSegment::open(&info.job, cfg.init_timeout)?
        };
        // Until every rank has mapped the segment, a failure of rank 0 must remove its
        // name (nobody else would); afterwards the name is removed at once (below).
        let named = NameGuard(if info.rank == 0 { Some(info.job.as_str()) } else { None });
        if seg.layout() != layout {
            return Err(Error::Bootstrap(format!(
                "rank {} was configured with {:?} but the job uses {:?}: give every rank the same GPULMT_* settings",
                info.rank,
                layout,
                seg.layout()
            )));
        }
        // The segment's rank table holds the host's id (pids are checked on it); the engine
        // and regions get the node's, which differs between the pseudo-nodes of a host.
        let host = node_id();
        let node = host ^ u64::from(place.node).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let me = info.rank as usize;
        if let Err(e) = seg.claim_rank(me, std::process::id(), host, device) {
            if let ShmError::RankTaken { .. } = e {
                // Another process holds our rank: two jobs with one id. Stop them both.
                seg.mark_contested(std::process::id());
            }
            return Err(e.into());
        }
        if let Err(e) = seg.barrier(me, cfg.init_timeout, || false) {
            seg.mark_state(me, RankState::Failed);
            return Err(e.into());
        }
        // Every rank has mapped the segment: its name is not needed any more, and without
        // it a job that dies from here on leaves nothing named behind, and nothing started
        // later with this job's id can reach the segment.
        drop(named);
        for r in 0..info.size as usize {
            if seg.rank_node(r) != host {
                return Err(Error::Bootstrap(format!(
                    "local rank {r} of job {} runs on another host: a node's ranks must share one machine",
                    info.job
                )));
            }
        }
        let rank_devices: Vec<u32> = (0..info.size as usize).map(|r| seg.rank_device(r)).collect();
        let mps = backend.mps_enabled(device);
        if let Some(w) = device::time_slicing_warning(me, device, &rank_devices, mps) {
            tracing::warn!("{w}");
        }
        let high = match cfg.copy_priority {
            CopyPriority::High => true,
            CopyPriority::Normal => false,
            CopyPriority::Auto => device::shared_device(device, &rank_devices),
        };
        match backend.set_copy_priority(high) {
            Ok(()) => tracing::debug!(high, "copy stream priority"),
            Err(device::DeviceError::Unsupported { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "copy stream priority not set; copies use the default"),
        }
        let mut server_max = cfg.copy_server_max;
        if server_max > 0 {
            if let Some(why) = device::copy_server_refusal(device, &rank_devices, mps) {
                tracing::warn!("GPULMT_COPY_SERVER_MAX ignored: {why}");
                server_max = 0;
            }
        }
        enable_copy_server(&*backend, &cfg, device, server_max);

        let peer_access = (0..ndev * ndev).map(|i| backend.can_access_peer(i / ndev, i % ndev)).collect();
        let mut ecfg = cfg.engine_config(topo.rank(), topo.size(), node, ndev, peer_access);
        ecfg.on_node = topo.on_node_mask();

        let limits = if cfg.handle_cache {
            CacheLimits { max_entries: cfg.cache_entries, max_bytes: cfg.cache_bytes, enabled: true }
        } else {
            CacheLimits::disabled()
        };
        let cache = HandleCache::new(DeviceOpener { backend: backend.clone(), device }, limits);
        let free_commit =
            FreeCommit::new(info.size as usize, me).map_err(|e| Error::Bootstrap(format!("two-phase free: {e}")))?;
        tracing::info!(
            rank = topo.rank(),
            size = topo.size(),
            node = place.node,
            nodes = topo.node_count(),
            local_rank = info.rank,
            local_size = info.size,
            job = %info.job,
            backend = %backend.kind(),
            device,
            devices = ndev,
            "gpulmt rank ready"
        );
        let n = info.size as usize;
        let rx = (0..n).map(|r| seg.ring(r, me)).collect();
        let tx = (0..n).map(|r| seg.ring(me, r)).collect();
        let offnode = OffNode::new(&topo, offnode);
        // Each ring's two ends key their region memos alike, from what both read in the
        // job segment: bytes that did not come from the sender's encoder cannot teach the
        // receiver's memo (see `RegionMemo`).
        let ring_key = |from: usize, to: usize| seg.instance() ^ ((from as u64) << 32 | to as u64);
        let rx_memo = (0..n).map(|r| RegionMemo::keyed(ring_key(r, me))).collect();
        let tx_memo = (0..n).map(|r| RegionMemo::keyed(ring_key(me, r))).collect();
        let eager_bounce = crate::eager_bounce::EagerBounce::new(
            backend.clone(),
            cfg.device_eager_limit.max(cfg.net.eager_limit) as usize,
        );
        Ok(Context {
            engine: Engine::new(ecfg),
            cfg,
            node,
            backend,
            device,
            seg,
            cache,
            exports: ExportCache::new(),
            reqs: RequestTable::default(),
            host_ranges: HostRangeCache::default(),
            outbox: (0..topo.size()).map(|_| VecDeque::new()).collect(),
            outbox_len: 0,
            loopback: VecDeque::new(),
            inflight: Vec::new(),
            staging_registered: vec![false; n * n],
            eager_bounce,
            last_liveness: Instant::now(),
            polls_since_liveness: 0,
            dead_peers: Default::default(),
            rx,
            tx,
            rx_memo,
            tx_memo,
            stats: Stats::default(),
            free_marks: FreeMarks::new(),
            allocations: HashMap::default(),
            free_commit,
            finalized: false,
            channel,
            capture: None,
            past_allocations: Default::default(),
            _live: live,
            sym: None,
            memory_kinds: Default::default(),
            info,
            topo,
            offnode,
        })
    }

    /// The job's shared-memory segment (its rings and staging), for tools and tests that
    /// inject faults into it. Writing into it behind the context's back breaks the job.
    #[doc(hidden)]
    pub fn job_segment(&self) -> &JobSegment {
        &self.seg
    }

    /// Writes `bytes` into the ring to local peer `to` as this rank's next packet there,
    /// sealed as the context seals its own (see `RegionMemo`): how tests model a peer
    /// whose engine sends lying packets, which the receiver must refuse by what they say
    /// (bytes written into the ring unsealed are refused at the seal). `Ok(false)` when
    /// the ring is full; call it only while [`control_pending`](Self::control_pending)
    /// is false (the ring keeps its order).
    #[doc(hidden)]
    pub fn push_sealed(&mut self, to: u32, bytes: &[u8]) -> Result<bool, crate::shm::ring::RingError> {
        let Some(local) = self.topo.local_of(to) else { return Ok(false) };
        let (ring, memo) = (self.tx[local], &mut self.tx_memo[local]);
        let n = bytes.len();
        ring.try_push_with(n + gpulmt_protocols::wire::SEAL_BYTES, |slot| {
            slot[..n].copy_from_slice(bytes);
            memo.seal(&mut slot[n..]);
        })
    }

    /// This rank's job rank.
    pub fn rank(&self) -> u32 {
        self.topo.rank()
    }

    /// Ranks of the job (every node).
    pub fn size(&self) -> u32 {
        self.topo.size()
    }

    /// Where every rank of the job runs.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The LMT job of this rank's node: the id that names its shared-memory segment,
    /// this rank's local index and the node's number of ranks.
    pub fn node_job(&self) -> &JobInfo {
        &self.info
    }

    /// The device this rank is bound to.
    pub fn device(&self) -> DevId {
        self.device
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The backend, for direct device operations (copies, queries).
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters: protocols used, packets, handle cache.
    pub fn stats(&self) -> Stats {
        let mut s = self.stats.clone();
        s.cache = self.cache.stats();
        s.staged_kinds = self.memory_kinds.staged_count();
        s
    }

    fn check_tag(tag: Tag) -> Result<()> {
        if !(0..TAG_UB).contains(&tag) {
            return Err(Error::InvalidArgument(format!("tag {tag} outside 0..{TAG_UB}")));
        }
        Ok(())
    }

    /// Describes a user buffer for the engine, exporting device buffers that may
    /// take part in a rendezvous.
    pub(crate) fn describe(&mut self, info: PointerInfo, ptr: usize, len: usize, export: bool) -> Result<BufDesc> {
        let mut desc = BufDesc::host(len as u64);
        if let MemoryKind::Device(dev) = info.kind {
            desc.device = Some(dev);
            let end = ptr + len;
            if end > info.base + info.span {
                return Err(self.past_allocation_error(info, ptr, len));
            }
            // A VMM buffer over several chunks: each is its own allocation to a peer, and one
            // region names one, so staging moves it whole rather than a peer its first chunk.
            let one_allocation = end <= info.base + info.size;
            if export && !one_allocation {
                self.memory_kinds.staged(info.alloc, "the buffer spans several VMM chunks (physical allocations)");
            }
            let pool_ipc_off = info.alloc == device::AllocKind::Pool { shareable: true } && !self.cfg.pool_ipc;
            if export && one_allocation && pool_ipc_off {
                self.memory_kinds.staged(info.alloc, "GPULMT_POOL_IPC=0 (the default) stages shareable pool memory");
                return Ok(desc);
            }
            if export && one_allocation {
                let backend = &self.backend;
                let handle = match self.exports.get_or_export(info.buffer_id, || backend.export_handle(info.base)) {
                    Ok(h) => *h,
                    // Memory of a kind no peer maps: the sender describes it so (MemDesc::Staged),
                    // a receiver does not offer it, and SHM staging moves it.
                    Err(DeviceError::NotShareable { reason, .. }) => {
                        self.memory_kinds.staged(info.alloc, &reason);
                        return Ok(desc);
                    }
                    Err(e) => return Err(e.into()),
                };
                desc.region = Some(Region {
                    handle: handle.0,
                    alloc_size: info.size as u64,
                    offset: (ptr - info.base) as u64,
                    device: dev,
                    node: self.node,
                    buffer_id: info.buffer_id,
                });
            }
        }
        Ok(desc)
    }

    /// Classifies a user buffer, from the host-range cache when possible. Refuses a
    /// range no buffer can have (NULL with bytes, past the highest user address of any
    /// Linux machine or `isize::MAX` bytes), one that runs past the end of its device
    /// allocation, and one in device memory this context released.
    pub(crate) fn classify(&mut self, ptr: usize, len: usize) -> Result<PointerInfo> {
        let end = ptr.checked_add(len);
        if len > isize::MAX as usize || end.is_none_or(|e| e as u64 > USER_ADDRESS_END) || (ptr == 0 && len > 0) {
            return Err(Error::InvalidArgument(format!(
                "buffer {ptr:#x} of {len} bytes cannot exist (NULL, or ending past the highest user address, 2^57, \
                 or longer than isize::MAX bytes)"
            )));
        }
        if self.cfg.memtype_cache && self.host_ranges.contains(ptr, len.max(1)) {
            return Ok(PointerInfo::host(ptr));
        }
        let info = self.backend.pointer_info(ptr)?;
        if matches!(info.kind, MemoryKind::Device(_)) && ptr + len > info.base + info.span {
            return Err(Error::InvalidArgument(format!(
                "buffer {ptr:#x} of {len} bytes runs {} bytes past the end of its device allocation ({:#x}, {} bytes)",
                ptr + len - (info.base + info.span),
                info.base,
                info.span
            )));
        }
        if info.kind == MemoryKind::Host {
            self.past_allocations.check_host(ptr, len)?;
            if self.cfg.memtype_cache {
                self.host_ranges.insert(ptr, len);
            }
        }
        Ok(info)
    }

    pub(crate) fn new_request(&mut self, ptr: usize, len: usize, kind: MemoryKind, span: tracing::Span) -> ReqId {
        ReqId(self.reqs.insert(ReqState { ptr, len, kind, result: None, protocol: None, span }))
    }

    /// Starts sending `len` bytes at `buf` (host or device memory) to `dst` with `tag`.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid and unmodified until the request completes.
    pub unsafe fn isend(&mut self, buf: *const u8, len: usize, dst: Rank, tag: Tag) -> Result<Request> {
        Self::check_tag(tag)?;
        // SAFETY: isend's contract is isend_tagged's.
        unsafe { self.isend_tagged(buf, len, dst, tag) }
    }

    /// [`isend`](Self::isend) without the check that keeps users off the reserved tags.
    ///
    /// # Safety
    /// As `isend`'s.
    pub(crate) unsafe fn isend_tagged(&mut self, buf: *const u8, len: usize, dst: Rank, tag: Tag) -> Result<Request> {
        anatomy::mark(Point::SendPost, 0);
        if dst >= self.size() {
            return Err(ProtoError::BadRank { rank: dst, size: self.size() }.into());
        }
        self.check_reachable(dst)?;
        let ptr = buf as usize;
        let info = self.classify(ptr, len)?;
        let kind = info.kind;
        let eager = self.engine.is_eager_to(dst, len as u64, matches!(kind, MemoryKind::Device(_)));
        anatomy::mark(Point::Probe, probe::SEND_CLASSIFIED);
        if eager && dst != self.rank() {
            // Fast path: the payload goes from the user's buffer (a device one's through
            // the eager bounce buffer) straight into the ring slot or the internode
            // path's queue, and the send is complete (the bytes are on their way).
            // SAFETY: this function's contract; the request completes here, after the
            // bytes were copied on. A device payload is copied out before a message id is
            // taken: a failed copy sends nothing and leaves no gap in the ids.
            let payload = unsafe { self.eager_payload(buf, len, kind)? };
            let msg = self.engine.send_eager(dst)?;
            self.send_eager_in_place(dst, msg, tag, &payload);
            let span = tracing::Span::none();
            let req = self.new_request(ptr, len, kind, span);
            let st = self.reqs.get_mut(req.0).expect("just inserted");
            st.result = Some(Ok(Status { source: dst, tag, len: len as u64 }));
            return Ok(Request(req.0));
        }
        // No IPC region ever goes to another node.
        let desc = self.describe(info, ptr, len, !eager && self.topo.on_node(dst))?;
        // Eager here only to this rank itself.
        let payload = if eager {
            // SAFETY: this function's contract; the bytes are copied out here.
            Some(unsafe { self.eager_payload(buf, len, kind)? }.into_owned())
        } else {
            None
        };
        // The request exists before any wait for an offer below: once the offer is in, all
        // that is left before the copy's issue is the engine's decision.
        let span = tracing::debug_span!(
            "send",
            to = dst,
            tag,
            len,
            protocol = tracing::field::Empty,
            ipc_cache = tracing::field::Empty,
            ipc_open_us = tracing::field::Empty
        );
        let req = self.new_request(ptr, len, kind, span);
        if !eager && self.engine.rtr_eligible(dst, &desc) {
            // An RTR the peer sent for this message may be waiting in its ring, or be
            // about to arrive (see `Engine::rtr_wait_begin`): pushing into it as soon as it
            // does beats an RTS, whose copy starts a ring hop and a match later.
            self.take_packets();
            if !self.cfg.rtr_wait.is_zero() && self.engine.rtr_wait_begin(dst, tag, &desc) {
                // The clock (25-50 ns a read on 2x H200's host, about a poll's own cost) is
                // read every 16th poll only: the deadline is a heuristic's, not a promise.
                let deadline = Instant::now() + self.cfg.rtr_wait;
                let mut polls = 0u32;
                while !self.engine.rtr_ready(dst, tag, &desc) {
                    polls = polls.wrapping_add(1);
                    if polls.is_multiple_of(16) && Instant::now() >= deadline {
                        self.engine.rtr_wait_failed(dst);
                        break;
                    }
                    std::hint::spin_loop();
                    self.take_packets();
                }
            }
            anatomy::mark(Point::Probe, probe::SEND_OFFER_WAITED);
        }
        self.engine.post_send(req, dst, tag, desc, payload);
        anatomy::mark(Point::Probe, probe::SEND_POSTED);
        self.run_actions();
        self.progress_on_post();
        Ok(Request(req.0))
    }

    /// An eager send's payload: a host buffer's bytes in place, a device buffer's copied
    /// out through the eager bounce buffer (and waited for).
    ///
    /// # Safety
    /// `buf..buf+len` is valid memory of the kind `kind` names, unmodified while the
    /// returned bytes are in use (a host buffer's are borrowed for as long as the caller
    /// says).
    unsafe fn eager_payload<'a>(&mut self, buf: *const u8, len: usize, kind: MemoryKind) -> Result<Cow<'a, [u8]>> {
        Ok(match kind {
            // A zero-length buffer may be null, which from_raw_parts forbids.
            MemoryKind::Host if len == 0 => Cow::Borrowed(&[]),
            // SAFETY: the caller's contract.
            MemoryKind::Host => Cow::Borrowed(unsafe { std::slice::from_raw_parts(buf, len) }),
            MemoryKind::Device(dev) => {
                // SAFETY: the caller's contract, in device memory of this backend.
                let v = unsafe { self.eager_bounce.read_device(dev, buf as usize, len)? };
                anatomy::mark(Point::Probe, probe::SEND_PAYLOAD_STAGED);
                Cow::Owned(v)
            }
        })
    }

    /// Starts receiving up to `len` bytes into `buf` from `src` (None = any) with
    /// `tag` (None = any).
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid and unused until the request completes.
    pub unsafe fn irecv(&mut self, buf: *mut u8, len: usize, src: Option<Rank>, tag: Option<Tag>) -> Result<Request> {
        if let Some(t) = tag {
            Self::check_tag(t)?;
        }
        // SAFETY: irecv's contract is irecv_tagged's.
        unsafe { self.irecv_tagged(buf, len, src, tag) }
    }

    /// [`irecv`](Self::irecv) without the check that keeps users off the reserved tags.
    ///
    /// # Safety
    /// As `irecv`'s.
    pub(crate) unsafe fn irecv_tagged(
        &mut self,
        buf: *mut u8,
        len: usize,
        src: Option<Rank>,
        tag: Option<Tag>,
    ) -> Result<Request> {
        anatomy::mark(Point::RecvPost, 0);
        if let Some(s) = src {
            if s >= self.size() {
                return Err(ProtoError::BadRank { rank: s, size: self.size() }.into());
            }
            self.check_reachable(s)?;
        }
        let ptr = buf as usize;
        // Export only buffers that PUT/COOPERATE could write: rendezvous sized, from a
        // sender that may be another rank of this node (no IPC region ever goes to another
        // node, and a self copy needs none).
        let export = len as u64 > self.engine.config().device_eager_limit.min(self.cfg.eager_limit)
            && src.map_or(self.topo.local_size() > 1, |s| self.topo.on_node(s));
        let info = self.classify(ptr, len)?;
        anatomy::mark(Point::Probe, probe::RECV_CLASSIFIED);
        let kind = info.kind;
        let desc = self.describe(info, ptr, len, export)?;
        anatomy::mark(Point::Probe, probe::RECV_DESCRIBED);
        let span = tracing::debug_span!("recv", from = ?src, tag = ?tag, len, protocol = tracing::field::Empty, ipc_cache = tracing::field::Empty, ipc_open_us = tracing::field::Empty);
        let req = self.new_request(ptr, len, kind, span);
        self.engine.post_recv(req, src, tag, desc);
        anatomy::mark(Point::Probe, probe::RECV_POSTED);
        self.run_actions();
        Ok(Request(req.0))
    }

    /// One progress pass after posting a rendezvous send. A benchmark or halo exchange posts
    /// a whole window before it waits; without this the peer's CTS/COOKIE packets (and so the
    /// copies of PUT and COOPERATE) wait for the last post. Receives do not run it: the
    /// protocol of an incoming message is decided once this rank's own sends are posted,
    /// so traffic both ways is seen as such (deciding during the receives of a window mixed
    /// COOPERATE into osu_bibw's PUT/GET traffic on 2x H200, half the bandwidth). What goes
    /// wrong in the pass surfaces again at the next test/wait, which runs the same pass; the
    /// request itself is already posted.
    fn progress_on_post(&mut self) {
        if self.cfg.progress_on_post {
            let _ = self.progress();
        }
    }

    /// Completes the request if it is done: `Ok(Some(status))` (the request is then
    /// consumed), `Ok(None)` if not yet; a failed request returns its error.
    pub fn test(&mut self, req: &Request) -> Result<Option<Status>> {
        self.progress()?;
        self.take_result(req)
    }

    fn take_result(&mut self, req: &Request) -> Result<Option<Status>> {
        let Some(st) = self.reqs.get(req.0) else {
            return Err(Error::InvalidArgument(format!("request {} is unknown or already completed", req.0)));
        };
        if st.result.is_none() {
            return Ok(None);
        }
        let st = self.reqs.remove(req.0).expect("present");
        anatomy::mark(Point::Completed, 0);
        st.result.expect("checked").map(Some).map_err(Error::from)
    }

    /// Waits for a request; returns its status or its error. Never hangs on a dead
    /// peer: liveness checks fail requests whose peer exited.
    pub fn wait(&mut self, req: Request) -> Result<Status> {
        let mut idle = WaitPause::default();
        loop {
            if let Some(s) = self.test(&req)? {
                return Ok(s);
            }
            idle.pause();
        }
    }

    /// Waits for every request; returns all statuses, or the first error once all
    /// requests have finished.
    pub fn wait_all(&mut self, reqs: Vec<Request>) -> Result<Vec<Status>> {
        let mut out: Vec<Option<Status>> = vec![None; reqs.len()];
        let mut first_err = None;
        let mut left = reqs.len();
        let mut done = vec![false; reqs.len()];
        let mut idle = WaitPause::default();
        while left > 0 {
            if !self.progress()? {
                idle.pause();
            }
            for (i, r) in reqs.iter().enumerate() {
                if done[i] {
                    continue;
                }
                match self.take_result(r) {
                    Ok(None) => {}
                    Ok(Some(s)) => {
                        out[i] = Some(s);
                        done[i] = true;
                        left -= 1;
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                        done[i] = true;
                        left -= 1;
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out.into_iter().map(|s| s.expect("all done")).collect()),
        }
    }

    /// MPI_Iprobe: the envelope of the next message `src`/`tag` would receive.
    pub fn iprobe(&mut self, src: Option<Rank>, tag: Option<Tag>) -> Result<Option<Status>> {
        self.progress()?;
        Ok(self.engine.probe(src, tag))
    }

    /// Cancels a receive that has not matched a message yet; true if cancelled (the
    /// request then completes with `ProtoError::Cancelled`).
    pub fn cancel(&mut self, req: &Request) -> bool {
        let ok = self.engine.cancel_recv(ReqId(req.0));
        self.run_actions();
        ok
    }

    /// Blocking send of a host slice.
    pub fn send(&mut self, data: &[u8], dst: Rank, tag: Tag) -> Result<Status> {
        // SAFETY: the slice outlives the request: we wait for it before returning.
        let r = unsafe { self.isend(data.as_ptr(), data.len(), dst, tag)? };
        self.wait(r)
    }

    /// Blocking receive into a host slice.
    pub fn recv(&mut self, data: &mut [u8], src: Option<Rank>, tag: Option<Tag>) -> Result<Status> {
        // SAFETY: as in `send`.
        let r = unsafe { self.irecv(data.as_mut_ptr(), data.len(), src, tag)? };
        self.wait(r)
    }

    /// Allocates `bytes` of device memory on this rank's device. It stays valid until it is
    /// freed through [`mem_free`](Self::mem_free) and [`mem_free_commit`](Self::mem_free_commit),
    /// or until [`finalize`](Self::finalize).
    pub fn mem_alloc(&mut self, bytes: usize) -> Result<usize> {
        self.mem_alloc_as(bytes, device::AllocKind::Legacy, 1)
    }

    /// [`mem_alloc`](Self::mem_alloc) by another route, as applications allocate: from a
    /// memory pool, through the virtual memory API (`chunks` physical chunks behind one
    /// range), or managed memory (`docs/memory-kinds.md`). For tests and benchmarks of
    /// every kind; freed like any other, through [`mem_free`](Self::mem_free).
    pub fn mem_alloc_as(&mut self, bytes: usize, kind: device::AllocKind, chunks: u32) -> Result<usize> {
        let ptr = self.backend.alloc_as(self.device, bytes, kind, chunks)?;
        let info = self.backend.pointer_info(ptr)?;
        self.allocations.insert(info.buffer_id, ptr);
        self.past_allocations.note(ptr, info.size);
        Ok(ptr)
    }

    /// Refuses a local range that lies in device memory this context released (the
    /// backend calls such addresses host memory, and a copy from them would fault).
    pub(crate) fn check_not_released(&self, ptr: usize, len: usize) -> Result<()> {
        if len > 0 && self.backend.pointer_info(ptr)?.kind == MemoryKind::Host {
            self.past_allocations.check_host(ptr, len)?;
        }
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` and waits; either end may be host memory or
    /// device memory of this rank's backend (from [`mem_alloc`](Self::mem_alloc), or the
    /// application's own on a device the backend drives).
    ///
    /// # Safety
    /// `src..src+len` must be readable and `dst..dst+len` writable for the whole call, with
    /// nothing else writing `src` or accessing `dst` meanwhile. The backend refuses a device
    /// range it knows to run past its allocation, and a range in device memory this context
    /// released; other host memory it cannot check.
    pub unsafe fn copy_sync(&self, dst: usize, src: usize, len: usize) -> Result<()> {
        for end in [dst, src] {
            self.check_not_released(end, len)?;
        }
        // SAFETY: this function's contract is the backend's.
        Ok(unsafe { self.backend.copy_sync(dst, src, len) }?)
    }

    /// Ends this rank's part of the job: finishes pending traffic, synchronises with
    /// the other ranks, closes peer mappings.
    pub fn finalize(mut self) -> Result<()> {
        let r = self.shutdown();
        self.finalized = true;
        r
    }

    fn shutdown(&mut self) -> Result<()> {
        anatomy::dump(self.rank());
        let (s, p) = (&self.stats, self.stats.protocols);
        tracing::info!(
            get = p[0],
            put = p[1],
            coop = p[2],
            shm = p[3],
            self_copies = p[4],
            staged_kinds = self.memory_kinds.staged_count(),
            open_fallbacks = s.open_fallbacks,
            copies = s.copies,
            probed = s.probed,
            packets_sent = s.packets_sent,
            packets_received = s.packets_received,
            backpressure = s.backpressure,
            violations = s.violations,
            "traffic of this rank"
        );
        if !self.reqs.is_empty() {
            tracing::warn!(pending = self.reqs.len(), "finalize with requests not waited for");
        }
        // Every rank stops sending before any tears down. Without a path to the other
        // nodes nothing crosses them, and the node's ranks are all there is to wait for.
        // Each wait has its bound, so finalize ends whatever state the job is in: the
        // barriers GPULMT_INIT_TIMEOUT_MS each, the drains GPULMT_NET_DRAIN_MS each.
        let deadline = Instant::now() + self.cfg.init_timeout;
        let synced = if self.offnode.is_up() {
            self.barrier_until(None, Some(deadline))
        } else {
            let node = self.topo.node_members().to_vec();
            self.barrier_until(Some(&node), Some(deadline))
        };
        let mut first_err = synced.err();
        // Outgoing packets must reach the rings (and the internode path) before peers
        // stop reading them.
        let flushed = self.flush_for_finalize(Instant::now() + self.cfg.net.drain);
        first_err = first_err.or(flushed.err());
        // Device code and host calls are done with the peers' symmetric heaps (every rank
        // passed the barrier above): give back their leases, so close_all closes them.
        self.sym_release_mappings();
        self.cache.close_all().map_err(|e| Error::Free(format!("closing peer mappings at finalize: {e}")))?;
        // The node's segment, and the mappings it guards, are the node's ranks' only.
        let me = self.info.rank as usize;
        let seg = &self.seg;
        let failed = || (0..seg.nranks()).any(|r| r != me && seg.rank_state(r) == RankState::Failed);
        let node_synced = self.seg.barrier(me, self.cfg.init_timeout, failed);
        // Transfers of requests never waited for may still run on our memory: the
        // internode path's first (it drains or cancels them, and says how many), then
        // the copies.
        let offnode = self.shutdown_offnode(Instant::now() + self.cfg.net.drain);
        if let Err(e) = node_synced {
            // A rank of the node may still map our memory: it stays until the process
            // exits rather than go while a peer could read it.
            tracing::error!(error = %e, "finalize: the node's ranks did not all finish; device memory is kept");
            return Err(first_err.unwrap_or(e.into()));
        }
        self.seg.mark_state(me, RankState::Finalized);
        self.wait_copies_in_flight();
        // Every rank closed its mappings of our symmetric heap before the barrier above.
        self.sym_free_heap();
        for (_, ptr) in self.allocations.drain() {
            // SAFETY: no copy of ours is in flight (above), every peer closed its mappings
            // of it before the barrier above, and mem_alloc's memory is the application's
            // only until finalize.
            if let Err(e) = unsafe { self.backend.free(ptr) } {
                tracing::warn!(error = %e, "freeing device memory at finalize");
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => offnode,
        }
    }

    /// Finalize's flush: progress until no packet waits for a ring or the internode path,
    /// or until `deadline`, past which what still waits is abandoned (logged, and an
    /// error: a peer that stopped reading, or a path that takes nothing).
    fn flush_for_finalize(&mut self, deadline: Instant) -> Result<()> {
        let mut polls = 0u32;
        while self.outbox_len > 0 || self.offnode.queued() > 0 {
            self.progress()?;
            polls += 1;
            if polls.is_multiple_of(64) && Instant::now() >= deadline {
                let (outbox, queued) = (self.outbox_len, self.offnode.queued());
                tracing::error!(
                    outbox,
                    internode = queued,
                    "finalize abandoned packets that found no room within GPULMT_NET_DRAIN_MS"
                );
                return Err(Error::Bootstrap(format!(
                    "finalize: {outbox} packets for ranks of this node and {queued} posts for the internode path \
                     found no room within GPULMT_NET_DRAIN_MS ({:?}) and were abandoned",
                    self.cfg.net.drain
                )));
            }
        }
        Ok(())
    }
}

/// One past the highest user-space address of any Linux machine gpulmt runs on (x86-64
/// with 5-level paging: 57 bits; arm64's largest is 52): a longer buffer cannot exist.
const USER_ADDRESS_END: u64 = 1 << 57;

/// Creates the job's segment (rank 0). First removes what dead jobs left in /dev/shm
/// (their owners' locks prove them gone), including a leftover of this very job id.
fn create_segment(job: &str, layout: JobLayout) -> Result<JobSegment> {
    let removed = sweep::sweep(Evidence::Locks);
    if removed > 0 {
        tracing::info!(removed, "removed shared-memory objects that dead jobs left behind");
    }
    JobSegment::create(job, layout).map_err(|e| match e {
        ShmError::Os { call: "shm_open", source, .. } if source.raw_os_error() == Some(libc::EEXIST) => {
            Error::Bootstrap(format!(
                "the job segment of job {job} already exists and a live process holds it: another job runs with this \
                 GPULMT_JOB (start every job with its own id: gpulmt-run makes one; a job starting now is stopped \
                 too, since its ranks may be this one's), or a second rank 0 ({source})"
            ))
        }
        e => e.into(),
    })
}

/// Removes the job segment's name when dropped (rank 0 during init): on success once
/// every rank has mapped it, on failure so that nothing is left behind.
struct NameGuard<'a>(Option<&'a str>);

impl Drop for NameGuard<'_> {
    fn drop(&mut self) {
        if let Some(job) = self.0 {
            if let Err(e) = JobSegment::unlink(job) {
                tracing::warn!(error = %e, "removing the name of the job segment");
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // Before the job segment (staging chunks) and peer mappings go.
        self.wait_copies_in_flight();
        self.dead_peers.last_chance();
        if !self.finalized {
            // Dropped without finalize (panic, early return): tell peers at once so
            // they fail their transfers with us instead of waiting.
            self.seg.mark_state(self.info.rank as usize, RankState::Failed);
            let _ = self.cache.close_all();
        }
        // Internode transfers on buffers that may go with us end now (if a finalize that
        // failed early has not stopped the path already).
        let _ = self.shutdown_offnode(Instant::now());
    }
}
