//! The shim's state: the node's gpulmt context in plugin mode (RTS cookies ride the
//! envelopes the MPI library matches; gpulmt's other control packets take its own
//! shared-memory rings), the operations the shim manages itself, and the progress
//! that drives them.
//!
//! Operations the shim manages (all others go straight to the MPI library):
//! - every receive (`Posted` until a message is matched to it: the receiver cannot
//!   know whether the sender used a host or a device buffer);
//! - sends of device buffers (`LmtSend` to a rank of this node: an envelope on the
//!   user's communicator and tag, then gpulmt moves the payload; `StagedSend` to a
//!   rank of another node, or below `GPULMT_MPI_LMT_MIN` bytes: copied to host memory
//!   and sent by the MPI library);
//! - host sends issued while other shim operations are in flight, when they block.
//!
//! Non-blocking operations are handed to the user as generalized requests
//! (`MPI_Grequest_start`), so their handles are real MPI requests that every MPI
//! function accepts; the shim completes them (`MPI_Grequest_complete`) from its
//! progress, and MPI asks the shim for their status through `query_fn`.
//!
//! Matching keeps MPI's rules: posted receives are matched in the order they were
//! posted (a message found for a later receive that an earlier one also matches
//! restarts the scan, so the earlier receive gets its first message), and messages
//! from one sender come in MPI's order because the MPI library itself matches them
//! (`MPI_Iprobe` to look, `MPI_Improbe` on the concrete source and tag to take).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use gpulmt::config::Config;
use gpulmt::device::MemoryKind;
use gpulmt::{Context, JobInfo, ProtoError, Request};
use mpi_sys::*;

use crate::envelope::{job_hash, Envelope, ENVELOPE_BYTES, KIND_LMT};
use crate::raw::*;

/// The shim, while active (between MPI_Init and MPI_Finalize).
pub static SHIM: Mutex<Option<Shim>> = Mutex::new(None);

pub fn lock() -> ShimGuard {
    ShimGuard(SHIM.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Set while the shim has work a host message passed straight to the MPI library could
/// starve or overtake: operations running, control packets waiting for ring room, messages a
/// probe took out of the library. Written each time the shim's lock is released, read
/// without it by the host fast paths (`host_fast_path`).
static BUSY: AtomicBool = AtomicBool::new(false);

/// The shim's lock; releasing it records whether the shim is busy.
pub struct ShimGuard(MutexGuard<'static, Option<Shim>>);

impl std::ops::Deref for ShimGuard {
    type Target = Option<Shim>;
    fn deref(&self) -> &Option<Shim> {
        &self.0
    }
}

impl std::ops::DerefMut for ShimGuard {
    fn deref_mut(&mut self) -> &mut Option<Shim> {
        &mut self.0
    }
}

impl Drop for ShimGuard {
    fn drop(&mut self) {
        let busy = self.0.as_ref().is_some_and(|s| !s.quiet());
        // Release, still under the lock: a thread that reads "idle" without the lock
        // sees the state the holder left. A thread posting concurrently may make the
        // shim busy right after; MPI orders nothing between two threads' calls.
        BUSY.store(busy, Ordering::Release);
    }
}

/// Whether a blocking host send or receive may go to the MPI library without the shim's
/// lock: the shim has nothing running that it could starve or overtake.
pub fn host_fast_path() -> bool {
    !BUSY.load(Ordering::Acquire)
}

/// What a finished operation reports.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    pub source: c_int,
    pub tag: c_int,
    pub bytes: usize,
    pub error: c_int,
    pub cancelled: bool,
}

impl Done {
    fn ok(source: c_int, tag: c_int, bytes: usize) -> Done {
        Done { source, tag, bytes, error: SUCCESS, cancelled: false }
    }
    fn err(source: c_int, tag: c_int, error: c_int) -> Done {
        Done { source, tag, bytes: 0, error, cancelled: false }
    }
}

/// The extra state of a generalized request: the status `query_fn` reports, written
/// by the shim before it completes the request. Owned by MPI once completed (freed
/// in `free_fn`).
pub struct GreqState {
    pub done: Done,
    /// The operation, while it runs (for `cancel_fn`).
    pub op: u64,
}

/// A generalized request the shim completed with an error: MPI would report it to
/// MPI_COMM_WORLD's error handler (the request has no communicator), so the
/// completion calls report it to the operation's communicator instead.
pub struct Errored {
    pub handle: MPI_Request,
    pub comm: MPI_Comm,
    /// The GreqState's address (free_fn forgets the entry).
    state: usize,
}

// SAFETY: plain MPI handle values (see `Shim`).
unsafe impl Send for Errored {}

static ERRORED: Mutex<Vec<Errored>> = Mutex::new(Vec::new());

/// The failed generalized requests not yet freed. Its own lock, never held across an
/// MPI call: free_fn takes it from within the MPI library.
pub fn errored() -> MutexGuard<'static, Vec<Errored>> {
    ERRORED.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A receive as the user posted it.
#[derive(Clone, Copy)]
struct RecvSpec {
    buf: usize,
    count: c_int,
    dtype: MPI_Datatype,
    source: c_int,
    tag: c_int,
    comm: MPI_Comm,
    device: bool,
    contiguous: bool,
    /// Bytes the buffer holds (count x type size).
    cap: usize,
}

enum State {
    /// A receive no message was matched to yet.
    Posted,
    /// A receive of data the MPI library moves (`MPI_Imrecv`), into the user's buffer
    /// or, for a device buffer, into host staging copied over at completion.
    RawRecv { inner: MPI_Request, staging: Option<Vec<u8>> },
    /// A receive of an envelope's payload through gpulmt (into staging for
    /// non-contiguous datatypes, unpacked at completion).
    LmtRecv { req: Request, source: c_int, tag: c_int, staging: Option<Vec<u8>> },
    /// A device send through gpulmt: the envelope's MPI send, then the transfer.
    LmtSend { _env: Box<[u8; ENVELOPE_BYTES]>, env_req: MPI_Request, lmt: Option<Request>, error: c_int },
    /// A send the MPI library moves from host memory (device data staged, or a host
    /// buffer of a blocking send while the shim is busy).
    MpiSend { inner: MPI_Request, _staging: Option<Vec<u8>> },
    /// Finished; completed at the next progress (cancelled receives).
    Finished(Done),
}

struct Op {
    recv: Option<RecvSpec>,
    /// The user's communicator (whose error handler reports the operation's error).
    comm: MPI_Comm,
    state: State,
    /// The user's generalized request: its extra state and handle.
    greq: Option<(*mut GreqState, MPI_Request)>,
}

/// A message `MPI_Probe` had to take from the MPI library to look at it (it has the
/// size of an envelope), kept for the receive that matches it.
struct Stashed {
    comm: MPI_Comm,
    source: c_int,
    tag: c_int,
    bytes: Box<[u8; ENVELOPE_BYTES]>,
    env: Option<Envelope>,
}

/// Counters for tests and users (`gpulmt_mpi_get_counters`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types)]
pub struct gpulmt_mpi_counters {
    /// Device sends moved by gpulmt (envelope + LMT).
    pub lmt_sends: u64,
    /// Receives whose message was an envelope: payload moved by gpulmt.
    pub lmt_recvs: u64,
    /// Device sends staged through host memory and sent by the MPI library.
    pub staged_sends: u64,
    /// Receives into device buffers of data the MPI library moved (host staging).
    pub staged_recvs: u64,
    /// Receives into host buffers of data the MPI library moved.
    pub host_recvs: u64,
}

pub struct Shim {
    pub ctx: Context,
    job: String,
    job_hash: u64,
    world_rank: c_int,
    world_group: MPI_Group,
    /// A private duplicate of the node's communicator, for the finalize barriers.
    node_comm: MPI_Comm,
    /// World rank -> local rank of this node (-1: another node).
    world_to_local: Vec<i32>,
    ops: HashMap<u64, Op>,
    next_op: u64,
    /// Receives without a message, in post order.
    posted: Vec<u64>,
    stash: Vec<Stashed>,
    /// Results of blocking operations, picked up by their waiters.
    finished: HashMap<u64, Done>,
    /// Device allocations made through gpulmt_mpi_alloc (released at finalize).
    pub allocations: Vec<usize>,
    /// The last device buffer `is_device` found, and its device.
    last_device: Option<(usize, u32)>,
    /// Device messages below this many bytes are staged (`GPULMT_MPI_LMT_MIN`).
    lmt_min: usize,
    /// Whether device buffers wait for the application's legacy default stream first
    /// (`GPULMT_MPI_SETTLE`).
    settle: bool,
    pub counters: gpulmt_mpi_counters,
}

// SAFETY: the MPI handles are plain values the MPI library accepts from any thread
// (the user's MPI thread level governs concurrent calls); raw pointers to generalized
// request states are only dereferenced under the shim's lock or by MPI's callbacks.
unsafe impl Send for Shim {}

/// Why the shim is not active.
pub type InitError = String;

impl Shim {
    /// Sets up the shim after PMPI_Init (collective over MPI_COMM_WORLD).
    pub fn init() -> Result<Shim, InitError> {
        let world = comm_world();
        let (mut wrank, mut wsize) = (0, 0);
        let mut node = comm_null();
        let (mut lrank, mut lsize) = (0, 0);
        // SAFETY: MPI is initialized; every out-pointer is a local.
        unsafe {
            PMPI_Comm_rank(world, &mut wrank);
            PMPI_Comm_size(world, &mut wsize);
            PMPI_Comm_split_type(world, comm_type_shared(), wrank, info_null(), &mut node);
            PMPI_Comm_rank(node, &mut lrank);
            PMPI_Comm_size(node, &mut lsize);
        }
        // Which world ranks share the node, in local-rank order.
        let mut members = vec![0i32; lsize as usize];
        let mut id = [0u8; 64];
        if lrank == 0 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let job = format!("mpi{}x{nanos:x}", std::process::id());
            id[..job.len()].copy_from_slice(job.as_bytes());
        }
        let mut node_comm = comm_null();
        let mut world_group = group_null();
        // SAFETY: buffers of the sizes given; collective over the node communicator.
        unsafe {
            PMPI_Allgather((&wrank as *const c_int).cast(), 1, int32(), members.as_mut_ptr().cast(), 1, int32(), node);
            PMPI_Bcast(id.as_mut_ptr().cast(), id.len() as c_int, byte(), 0, node);
            PMPI_Comm_dup(node, &mut node_comm);
            PMPI_Comm_group(world, &mut world_group);
        }
        let mut world_to_local = vec![-1i32; wsize as usize];
        for (l, &w) in members.iter().enumerate() {
            world_to_local[w as usize] = l as i32;
        }
        let len = id.iter().position(|&b| b == 0).unwrap_or(id.len());
        let job = String::from_utf8_lossy(&id[..len]).into_owned();

        let made = (|| -> Result<(Context, usize, bool), String> {
            let lmt_min = match std::env::var("GPULMT_MPI_LMT_MIN") {
                Ok(v) if !v.trim().is_empty() => gpulmt::config::parse_size(v.trim())
                    .ok_or_else(|| format!("GPULMT_MPI_LMT_MIN={v:?} is not a size (like 1, 64K, 1M)"))?
                    as usize,
                _ => 1,
            };
            let settle = match std::env::var("GPULMT_MPI_SETTLE").as_deref().map(str::trim) {
                Err(_) | Ok("") | Ok("default-stream") => true,
                Ok("none") => false,
                Ok(v) => return Err(format!("GPULMT_MPI_SETTLE={v:?} is neither `default-stream` nor `none`")),
            };
            let cfg = Config::from_env().map_err(|e| e.to_string())?;
            let info = JobInfo { job: job.clone(), rank: lrank as u32, size: lsize as u32 };
            // Rings, not blobs over MPI: a packet crosses in a ring slot the peer's
            // progress reads, where an MPI message cost both ranks an Isend, an Iprobe
            // and a Recv, and every progress round an Iprobe on one more communicator.
            let ctx = Context::init_plugin_rings(cfg, info).map_err(|e| e.to_string())?;
            Ok((ctx, lmt_min.max(1), settle))
        })();
        // Every local rank must have joined, or none uses gpulmt.
        let mine = c_int::from(made.is_ok());
        let mut all = 0;
        // SAFETY: one int each way; collective over the node communicator.
        unsafe {
            PMPI_Allreduce((&mine as *const c_int).cast(), (&mut all as *mut c_int).cast(), 1, int32(), op_min(), node)
        };
        let mut fail = |why: String, ctx: Option<Context>| {
            if let Some(ctx) = ctx {
                release(ctx, &job, lrank == 0);
            }
            // SAFETY: communicators and group made above; nothing uses them any more.
            unsafe {
                PMPI_Comm_free(&mut node_comm);
                PMPI_Comm_free(&mut node);
                PMPI_Group_free(&mut world_group);
            }
            Err(why)
        };
        let (ctx, lmt_min, settle) = match made {
            Err(why) => return fail(why, None),
            Ok(v) if all == 0 => return fail("another rank of this node could not start gpulmt".into(), Some(v.0)),
            Ok(v) => v,
        };
        // The node communicator's work is done (the finalize barriers use node_comm,
        // a duplicate of it): in Open MPI 4.1 each communicator a program
        // holds adds to the cost of every host message (libnbc's progress polling).
        // SAFETY: made above; nothing uses it any more.
        unsafe { PMPI_Comm_free(&mut node) };
        // Sim devices too: device memory a program can pass comes from gpulmt_mpi_alloc,
        // which makes every thread forget its host ranges.
        crate::hostmem::enable(ctx.config().memtype_cache);
        tracing::info!(job = %job, local_rank = lrank, local_size = lsize, world_rank = wrank, "gpulmt-mpi shim active");
        Ok(Shim {
            ctx,
            job_hash: job_hash(&job),
            job,
            world_rank: wrank,
            world_group,
            node_comm,
            world_to_local,
            ops: HashMap::new(),
            next_op: 1,
            posted: Vec::new(),
            stash: Vec::new(),
            finished: HashMap::new(),
            allocations: Vec::new(),
            last_device: None,
            lmt_min,
            settle,
            counters: gpulmt_mpi_counters::default(),
        })
    }

    /// Leaves: finishes this rank's traffic, then (collectively over the node) waits
    /// until every rank has, and releases gpulmt. Called before PMPI_Finalize.
    pub fn finalize(mut self) {
        // Transfers already matched (peers may depend on them) get time to finish;
        // receives nothing matched are the program's leaks and are abandoned.
        let t0 = std::time::Instant::now();
        while self.busy() {
            self.progress();
            if t0.elapsed() > std::time::Duration::from_secs(30) {
                tracing::warn!(
                    ops = self.ops.len(),
                    "MPI_Finalize: shim transfers still running after 30 s; abandoning them"
                );
                break;
            }
        }
        // Peers may still need our packets to finish theirs: progress until all arrive.
        let mut req = request_null();
        // SAFETY: collective over the node's ranks, request out-pointer.
        unsafe { PMPI_Ibarrier(self.node_comm, &mut req) };
        loop {
            self.progress();
            let mut flag = 0;
            // SAFETY: the barrier's request.
            unsafe { PMPI_Test(&mut req, &mut flag, status_ignore()) };
            if flag != 0 {
                break;
            }
        }
        // Nobody drives gpulmt after this barrier: releasing cannot alarm a peer.
        // SAFETY: collective over the node's ranks.
        unsafe { PMPI_Barrier(self.node_comm) };
        for ptr in std::mem::take(&mut self.allocations) {
            // SAFETY: memory of gpulmt_mpi_alloc, which the application may not use after
            // MPI_Finalize; after the barrier no rank drives a copy on it.
            let _ = unsafe { self.ctx.backend().free(ptr) };
        }
        let Shim { ctx, job, mut node_comm, mut world_group, .. } = self;
        let rank0 = ctx.rank() == 0;
        release(ctx, &job, rank0);
        // SAFETY: the shim's own communicators and group, unused from now on.
        unsafe {
            PMPI_Comm_free(&mut node_comm);
            PMPI_Group_free(&mut world_group);
        }
    }

    /// No operation of the shim is running and no control packet waits to be sent:
    /// MPI calls may block without starving a transfer.
    pub fn is_idle(&self) -> bool {
        self.ops.is_empty() && !self.ctx.control_pending()
    }

    /// Idle, and no message a probe took out of the MPI library is waiting: the next
    /// message on any communicator may go straight to the MPI library.
    fn quiet(&self) -> bool {
        self.is_idle() && self.stash.is_empty()
    }

    /// Some matched transfer is in flight (unmatched receives aside) or a control
    /// packet waits for room in a peer's ring.
    fn busy(&self) -> bool {
        self.ctx.control_pending() || self.ops.values().any(|op| !matches!(op.state, State::Posted))
    }

    /// Whether `ptr` (with `len` bytes) is device memory. Host ranges are remembered
    /// (`hostmem`), device buffers always asked (their buffer id matters).
    pub fn is_device(&mut self, ptr: usize, len: usize) -> bool {
        if crate::hostmem::is_host(ptr, len.max(1)) {
            return false;
        }
        match self.ctx.backend().pointer_info(ptr) {
            Ok(i) => match i.kind {
                MemoryKind::Device(dev) => {
                    self.last_device = Some((ptr, dev));
                    true
                }
                MemoryKind::Host => {
                    crate::hostmem::remember(ptr, len);
                    false
                }
            },
            Err(e) => {
                tracing::warn!(ptr = format_args!("{ptr:#x}"), error = %e, "pointer query failed; treating as host memory");
                false
            }
        }
    }

    /// Lets the application's default-stream work on the device of `ptr` land before
    /// gpulmt reads or writes that device buffer: an application may fill or clear it
    /// with a `cudaMemcpy` from pageable memory, which returns before its DMA lands.
    fn settle_app_writes(&self, ptr: usize) {
        if !self.settle {
            return;
        }
        let backend = self.ctx.backend();
        // The caller has just asked is_device about this buffer: no second query.
        let dev = match self.last_device {
            Some((p, dev)) if p == ptr => Some(dev),
            _ => match backend.pointer_info(ptr) {
                Ok(gpulmt::device::PointerInfo { kind: MemoryKind::Device(dev), .. }) => Some(dev),
                _ => None,
            },
        };
        if let Some(dev) = dev {
            if let Err(e) = backend.wait_app_default_stream(dev) {
                tracing::warn!(error = %e, "waiting for the application's default stream");
            }
        }
    }

    /// The node-local rank of rank `rank` of `comm`, if it is on this node.
    fn local_rank_of(&self, comm: MPI_Comm, rank: c_int) -> Option<u32> {
        let world_rank = if comm == comm_world() {
            rank
        } else {
            let (mut inter, mut group, mut out) = (0, group_null(), undefined());
            // SAFETY: a communicator the user passed; locals as out-pointers.
            unsafe {
                PMPI_Comm_test_inter(comm, &mut inter);
                if inter != 0 {
                    PMPI_Comm_remote_group(comm, &mut group);
                } else {
                    PMPI_Comm_group(comm, &mut group);
                }
                PMPI_Group_translate_ranks(group, 1, &rank, self.world_group, &mut out);
                PMPI_Group_free(&mut group);
            }
            out
        };
        let l = *self.world_to_local.get(usize::try_from(world_rank).ok()?)?;
        (l >= 0).then_some(l as u32)
    }

    fn new_op(&mut self, recv: Option<RecvSpec>, comm: MPI_Comm, state: State, greq: bool) -> (u64, MPI_Request) {
        let id = self.next_op;
        self.next_op += 1;
        let mut handle = request_null();
        let g = if greq {
            let gs = Box::into_raw(Box::new(GreqState { done: Done::ok(0, 0, 0), op: id }));
            // SAFETY: valid callbacks and out-pointer; `gs` is owned by MPI from here
            // and freed in free_fn.
            unsafe { PMPI_Grequest_start(Some(query_fn), Some(free_fn), Some(cancel_fn), gs.cast(), &mut handle) };
            Some((gs, handle))
        } else {
            None
        };
        self.ops.insert(id, Op { recv, comm, state, greq: g });
        (id, handle)
    }

    /// Finishes an operation: its generalized request completes, or its blocking
    /// waiter finds the result.
    fn finish(&mut self, id: u64, done: Done) {
        let Some(op) = self.ops.remove(&id) else { return };
        match op.greq {
            Some((gs, handle)) => {
                if done.error != SUCCESS {
                    errored().push(Errored { handle, comm: op.comm, state: gs as usize });
                }
                // SAFETY: the state lives until free_fn, which MPI calls only after
                // this completion; the handle is the one MPI gave us.
                unsafe {
                    (*gs).done = done;
                    PMPI_Grequest_complete(handle);
                }
            }
            None => {
                self.finished.insert(id, done);
            }
        }
    }

    /// Takes the result of a blocking operation, if it finished.
    pub fn take_finished(&mut self, id: u64) -> Option<Done> {
        self.finished.remove(&id)
    }

    // ---------------------------------------------------------------------------
    // Sends
    // ---------------------------------------------------------------------------

    /// Starts a send of a device buffer of `bytes` contiguous bytes. Returns the
    /// operation and, with `greq`, the user's request.
    #[allow(clippy::too_many_arguments)]
    pub fn start_device_send(
        &mut self,
        buf: usize,
        bytes: usize,
        dest: c_int,
        tag: c_int,
        comm: MPI_Comm,
        sync: bool,
        greq: bool,
    ) -> Result<(u64, MPI_Request), c_int> {
        self.settle_app_writes(buf);
        let local = if bytes >= self.lmt_min { self.local_rank_of(comm, dest) } else { None };
        let Some(to) = local else {
            // Another node, or a small message: stage through host memory.
            let mut staging = vec![0u8; bytes];
            // SAFETY: `buf` is the application's device buffer of `bytes` bytes for this send,
            // which MPI's rules keep valid and unmodified until the send completes.
            if let Err(e) = unsafe { self.ctx.copy_sync(staging.as_mut_ptr() as usize, buf, bytes) } {
                tracing::error!(error = %e, "staging a device send");
                return Err(ERR_OTHER);
            }
            let mut inner = request_null();
            // SAFETY: the staging buffer lives in the operation until the send completes.
            let rc = unsafe {
                let f = if sync { PMPI_Issend } else { PMPI_Isend };
                f(staging.as_ptr().cast(), bytes as c_int, byte(), dest, tag, comm, &mut inner)
            };
            if rc != SUCCESS {
                return Err(rc);
            }
            self.counters.staged_sends += 1;
            return Ok(self.new_op(None, comm, State::MpiSend { inner, _staging: Some(staging) }, greq));
        };
        // SAFETY: the caller (MPI semantics) keeps the buffer valid until completion.
        let (lmt, cookie) = match unsafe { self.ctx.lmt_initiate(buf as *const u8, bytes, to) } {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, dest, bytes, "gpulmt could not start a device send");
                return Err(ERR_OTHER);
            }
        };
        let env = Envelope {
            kind: KIND_LMT,
            total: bytes as u64,
            job_hash: self.job_hash,
            world_rank: self.world_rank,
            local_rank: self.ctx.rank(),
            cookie,
        };
        let Some(env) = env.encode().map(Box::new) else {
            tracing::error!("gpulmt's RTS cookie does not fit the envelope");
            return Err(ERR_INTERN);
        };
        let mut env_req = request_null();
        // SAFETY: the envelope lives in the operation until its send completes.
        let rc =
            unsafe { PMPI_Isend(env.as_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), dest, tag, comm, &mut env_req) };
        if rc != SUCCESS {
            // The receiver will never see it; gpulmt's request stays orphaned.
            tracing::error!(rc, "sending an envelope failed");
            return Err(rc);
        }
        self.counters.lmt_sends += 1;
        let r = self.new_op(None, comm, State::LmtSend { _env: env, env_req, lmt: Some(lmt), error: SUCCESS }, greq);
        // As gpulmt's own isend does (GPULMT_PROGRESS_ON_POST): the peer's answers to the
        // sends posted so far start their copies while the application posts the rest.
        if self.ctx.config().progress_on_post {
            self.progress_transfers();
        }
        Ok(r)
    }

    /// Tracks a send the MPI library moves from a host buffer (blocking sends while the
    /// shim is busy: the caller waits for it with progress).
    pub fn track_host_send(&mut self, inner: MPI_Request, comm: MPI_Comm) -> u64 {
        self.new_op(None, comm, State::MpiSend { inner, _staging: None }, false).0
    }

    // ---------------------------------------------------------------------------
    // Receives
    // ---------------------------------------------------------------------------

    /// Posts a receive; returns the operation and, with `greq`, the user's request.
    #[allow(clippy::too_many_arguments)]
    pub fn post_recv(
        &mut self,
        buf: usize,
        count: c_int,
        dtype: MPI_Datatype,
        source: c_int,
        tag: c_int,
        comm: MPI_Comm,
        greq: bool,
    ) -> Result<(u64, MPI_Request), c_int> {
        let (cap, contiguous) = crate::hostmem::geometry(dtype, count)?;
        let device = cap > 0 && self.is_device(buf, cap);
        if device {
            self.settle_app_writes(buf);
        }
        let spec = RecvSpec { buf, count, dtype, source, tag, comm, device, contiguous, cap };
        let r = self.new_op(Some(spec), comm, State::Posted, greq);
        self.posted.push(r.0);
        self.progress();
        Ok(r)
    }

    /// Whether a blocking receive into `buf` may go straight to the MPI library (see
    /// `recv_direct` in lib.rs): a contiguous host buffer while no shim operation or
    /// stashed message could claim the next message first. Returns its bytes then.
    pub fn direct_recv_bytes(&mut self, buf: usize, count: c_int, dtype: MPI_Datatype) -> Option<usize> {
        if !self.quiet() {
            return None;
        }
        let (cap, contiguous) = crate::hostmem::geometry(dtype, count).ok()?;
        (contiguous && !(cap > 0 && self.is_device(buf, cap))).then_some(cap)
    }

    /// Delivers a message of envelope size that a direct receive took from the MPI
    /// library (`bytes`, from `source` with `tag`) to the receive the user posted:
    /// data is copied in, an envelope starts gpulmt's receive. Returns the operation.
    #[allow(clippy::too_many_arguments)]
    pub fn deliver_direct(
        &mut self,
        recv: (usize, c_int, MPI_Datatype, c_int, c_int, MPI_Comm),
        source: c_int,
        tag: c_int,
        bytes: &[u8; ENVELOPE_BYTES],
    ) -> u64 {
        let (buf, count, dtype, want_source, want_tag, comm) = recv;
        let cap = crate::hostmem::geometry(dtype, count).map_or(0, |g| g.0);
        let spec = RecvSpec {
            buf,
            count,
            dtype,
            source: want_source,
            tag: want_tag,
            comm,
            device: false,
            contiguous: true,
            cap,
        };
        let (id, _) = self.new_op(Some(spec), comm, State::Posted, false);
        let env = Envelope::decode(&bytes[..], self.job_hash);
        self.deliver_small(id, &spec, source, tag, bytes, env);
        id
    }

    /// Whether `bytes` are an envelope of this node's job.
    pub fn is_envelope(&self, bytes: &[u8]) -> bool {
        Envelope::decode(bytes, self.job_hash).is_some()
    }

    /// Matches posted receives with messages, in post order.
    fn match_posted(&mut self) {
        let mut i = 0;
        while i < self.posted.len() {
            let id = self.posted[i];
            let spec = self.ops[&id].recv.expect("posted receives have a spec");
            // A message Probe took out of the MPI library comes first.
            if let Some(k) =
                self.stash.iter().position(|s| s.comm == spec.comm && matches(spec.source, spec.tag, s.source, s.tag))
            {
                let s = self.stash.remove(k);
                self.posted.remove(i);
                self.deliver_small(id, &spec, s.source, s.tag, &s.bytes, s.env);
                continue;
            }
            let mut flag = 0;
            let mut st = empty_status();
            // SAFETY: the user's communicator; locals as out-pointers.
            unsafe { PMPI_Iprobe(spec.source, spec.tag, spec.comm, &mut flag, &mut st) };
            if flag == 0 {
                i += 1;
                continue;
            }
            let earlier = self.posted[..i].iter().any(|e| {
                let s = self.ops[e].recv.expect("posted");
                s.comm == spec.comm && matches(s.source, s.tag, st.MPI_SOURCE, st.MPI_TAG)
            });
            if earlier {
                // It arrived after the earlier receive looked: that receive gets first
                // pick among the messages it matches. Scan again from the start.
                i = 0;
                continue;
            }
            // Take exactly the probed message: the first from its source with its tag.
            let mut msg = message_null();
            // SAFETY: as above.
            unsafe { PMPI_Improbe(st.MPI_SOURCE, st.MPI_TAG, spec.comm, &mut flag, &mut msg, &mut st) };
            if flag == 0 {
                // Another thread took it; look again later.
                i += 1;
                continue;
            }
            self.posted.remove(i);
            self.deliver(id, &spec, msg, &st);
        }
    }

    /// Receives the matched message `msg` for operation `id`.
    fn deliver(&mut self, id: u64, spec: &RecvSpec, mut msg: MPI_Message, st: &MPI_Status) {
        let (source, tag) = (st.MPI_SOURCE, st.MPI_TAG);
        let bytes = status_bytes(st);
        if bytes == ENVELOPE_BYTES {
            let mut b = Box::new([0u8; ENVELOPE_BYTES]);
            // SAFETY: a matched message of exactly this many bytes.
            unsafe { PMPI_Mrecv(b.as_mut_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), &mut msg, status_ignore()) };
            let env = Envelope::decode(&b[..], self.job_hash);
            return self.deliver_small(id, spec, source, tag, &b, env);
        }
        let mut inner = request_null();
        let (rc, staging) = if spec.device && spec.contiguous {
            // The MPI library writes host memory: stage, copy to the device at the end.
            let mut staging = vec![0u8; bytes];
            self.counters.staged_recvs += 1;
            // SAFETY: staging holds the whole message and lives in the operation.
            let rc = unsafe { PMPI_Imrecv(staging.as_mut_ptr().cast(), bytes as c_int, byte(), &mut msg, &mut inner) };
            (rc, Some(staging))
        } else {
            // Host memory (any datatype), or a non-contiguous device buffer that only a
            // device-aware MPI library can fill.
            self.counters.host_recvs += 1;
            // SAFETY: the user's buffer and datatype, valid until the receive completes.
            let rc = unsafe { PMPI_Imrecv(spec.buf as *mut c_void, spec.count, spec.dtype, &mut msg, &mut inner) };
            (rc, None)
        };
        if rc != SUCCESS {
            return self.finish(id, Done::err(source, tag, rc));
        }
        self.set_state(id, State::RawRecv { inner, staging });
    }

    /// Delivers a message of envelope size already taken from the MPI library: an
    /// envelope starts gpulmt's receive; anything else is data.
    fn deliver_small(
        &mut self,
        id: u64,
        spec: &RecvSpec,
        source: c_int,
        tag: c_int,
        b: &[u8; ENVELOPE_BYTES],
        env: Option<Envelope>,
    ) {
        match env {
            Some(env) => self.start_lmt_recv(id, spec, source, tag, env),
            None => {
                let done = self.write_data(spec, source, tag, &b[..]);
                if spec.device {
                    self.counters.staged_recvs += 1;
                } else {
                    self.counters.host_recvs += 1;
                }
                self.finish(id, done);
            }
        }
    }

    /// Writes `data` (a whole message, already in host memory) into a receive's buffer.
    fn write_data(&mut self, spec: &RecvSpec, source: c_int, tag: c_int, data: &[u8]) -> Done {
        let n = data.len().min(spec.cap);
        let err = if data.len() > spec.cap { ERR_TRUNCATE } else { SUCCESS };
        let rc = if n == 0 {
            SUCCESS
        } else if spec.contiguous && spec.device {
            // SAFETY: `spec.buf` is the receive's contiguous device buffer of `spec.cap >= n`
            // bytes, which MPI's rules keep valid and unused until the receive completes.
            match unsafe { self.ctx.copy_sync(spec.buf, data.as_ptr() as usize, n) } {
                Ok(()) => SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "copying received data to device memory");
                    ERR_OTHER
                }
            }
        } else if spec.contiguous {
            // SAFETY: the user's buffer holds `cap` >= n bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), spec.buf as *mut u8, n) };
            SUCCESS
        } else if spec.device {
            ERR_TYPE
        } else {
            unpack(spec, &data[..n])
        };
        let mut d = Done::ok(source, tag, n);
        d.error = if rc != SUCCESS { rc } else { err };
        d
    }

    fn start_lmt_recv(&mut self, id: u64, spec: &RecvSpec, source: c_int, tag: c_int, env: Envelope) {
        let from = env.local_rank;
        let mut staging = (!spec.contiguous).then(|| vec![0u8; spec.cap]);
        let (ptr, len) = match &mut staging {
            Some(s) => (s.as_mut_ptr() as usize, s.len()),
            None => (spec.buf, spec.cap),
        };
        self.counters.lmt_recvs += 1;
        // SAFETY: the user's buffer (or our staging) stays valid until completion.
        match unsafe { self.ctx.lmt_start_recv(from, &env.cookie, ptr as *mut u8, len) } {
            Ok((req, cts)) => {
                // The CTS, where the protocol has one, went on gpulmt's ring (init_plugin_rings).
                debug_assert!(cts.is_none(), "a rings plugin context hands back no CTS cookie");
                self.set_state(id, State::LmtRecv { req, source, tag, staging })
            }
            Err(e) => {
                // The sender's transfer cannot finish either; it learns nothing from us.
                tracing::error!(error = %e, from_world = env.world_rank, "gpulmt could not start receiving an envelope's payload");
                self.finish(id, Done::err(source, tag, ERR_OTHER));
            }
        }
    }

    fn set_state(&mut self, id: u64, state: State) {
        if let Some(op) = self.ops.get_mut(&id) {
            op.state = state;
        }
    }

    // ---------------------------------------------------------------------------
    // Probe
    // ---------------------------------------------------------------------------

    /// MPI_Iprobe: the status of the message a receive of (source, tag, comm) would
    /// get now, with the payload's size for envelopes.
    pub fn iprobe(&mut self, source: c_int, tag: c_int, comm: MPI_Comm) -> Option<(c_int, c_int, usize)> {
        self.progress();
        loop {
            if let Some(s) = self.stash.iter().find(|s| s.comm == comm && matches(source, tag, s.source, s.tag)) {
                let bytes = s.env.as_ref().map_or(ENVELOPE_BYTES, |e| e.total as usize);
                return Some((s.source, s.tag, bytes));
            }
            let mut flag = 0;
            let mut st = empty_status();
            // SAFETY: the user's communicator; locals as out-pointers.
            unsafe { PMPI_Iprobe(source, tag, comm, &mut flag, &mut st) };
            if flag == 0 {
                return None;
            }
            let taken = self.posted.iter().any(|e| {
                let s = self.ops[e].recv.expect("posted");
                s.comm == comm && matches(s.source, s.tag, st.MPI_SOURCE, st.MPI_TAG)
            });
            if taken {
                // A posted receive gets it first; match, then look again.
                self.match_posted();
                continue;
            }
            let bytes = status_bytes(&st);
            if bytes != ENVELOPE_BYTES {
                return Some((st.MPI_SOURCE, st.MPI_TAG, bytes));
            }
            // Envelope-sized: take it to look inside, and keep it for its receive.
            let (mut msg, mut b) = (message_null(), Box::new([0u8; ENVELOPE_BYTES]));
            // SAFETY: as above; the message has exactly ENVELOPE_BYTES bytes.
            unsafe {
                PMPI_Improbe(st.MPI_SOURCE, st.MPI_TAG, comm, &mut flag, &mut msg, &mut st);
                if flag == 0 {
                    continue;
                }
                PMPI_Mrecv(b.as_mut_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), &mut msg, status_ignore());
            }
            let env = Envelope::decode(&b[..], self.job_hash);
            self.stash.push(Stashed { comm, source: st.MPI_SOURCE, tag: st.MPI_TAG, bytes: b, env });
        }
    }

    // ---------------------------------------------------------------------------
    // Progress
    // ---------------------------------------------------------------------------

    /// One round of progress: gpulmt, matching, and every running operation.
    pub fn progress(&mut self) {
        self.progress_transfers();
        self.match_posted();
        let running: Vec<u64> = self.ops.keys().copied().collect();
        for id in running {
            self.poll(id);
        }
    }

    /// Lets gpulmt read and send control packets and start and finish copies, without
    /// looking at the shim's own operations.
    fn progress_transfers(&mut self) {
        if let Err(e) = self.ctx.progress() {
            tracing::warn!(error = %e, "gpulmt progress");
        }
    }

    fn poll(&mut self, id: u64) {
        let Some(op) = self.ops.get_mut(&id) else { return };
        if matches!(op.state, State::Posted) {
            return;
        }
        let spec = op.recv;
        // Out of the table while polled (only `poll` touches a matched operation).
        let mut state = std::mem::replace(&mut op.state, State::Posted);
        match self.poll_state(&mut state, spec) {
            Some(done) => self.finish(id, done),
            None => {
                if let Some(op) = self.ops.get_mut(&id) {
                    op.state = state;
                }
            }
        }
    }

    /// Polls a matched operation; its result once it finished.
    fn poll_state(&mut self, state: &mut State, spec: Option<RecvSpec>) -> Option<Done> {
        Some(match state {
            State::Posted => return None,
            State::Finished(d) => *d,
            State::RawRecv { inner, staging } => {
                let (mut flag, mut st) = (0, empty_status());
                // SAFETY: our request from PMPI_Imrecv.
                let rc = unsafe { PMPI_Test(inner, &mut flag, &mut st) };
                if flag == 0 && rc == SUCCESS {
                    return None;
                }
                let err = if rc == SUCCESS {
                    SUCCESS
                } else if st.MPI_ERROR != SUCCESS {
                    st.MPI_ERROR
                } else {
                    rc
                };
                let bytes = status_bytes(&st);
                match staging.take() {
                    Some(staging) if err == SUCCESS => {
                        let spec = spec.expect("receives have a spec");
                        self.write_data(&spec, st.MPI_SOURCE, st.MPI_TAG, &staging[..bytes.min(staging.len())])
                    }
                    _ => Done { source: st.MPI_SOURCE, tag: st.MPI_TAG, bytes, error: err, cancelled: false },
                }
            }
            State::LmtRecv { req, source, tag, staging } => {
                let (source, tag) = (*source, *tag);
                match self.ctx.test(req) {
                    Ok(None) => return None,
                    Ok(Some(s)) => {
                        let n = s.len as usize;
                        let mut d = Done::ok(source, tag, n);
                        if let Some(staging) = staging.take() {
                            let spec = spec.expect("receives have a spec");
                            d.error = if spec.device { ERR_TYPE } else { unpack(&spec, &staging[..n]) };
                        }
                        d
                    }
                    Err(e) => {
                        let code = match e.as_transfer() {
                            Some(ProtoError::Truncated { .. }) => ERR_TRUNCATE,
                            _ => {
                                tracing::error!(error = %e, "gpulmt receive failed");
                                ERR_OTHER
                            }
                        };
                        Done::err(source, tag, code)
                    }
                }
            }
            State::LmtSend { env_req, lmt, error, .. } => {
                if *env_req != request_null() {
                    let mut flag = 0;
                    // SAFETY: our request from PMPI_Isend (set to MPI_REQUEST_NULL when done).
                    let rc = unsafe { PMPI_Test(env_req, &mut flag, status_ignore()) };
                    if rc != SUCCESS {
                        *error = rc;
                        *env_req = request_null();
                    }
                }
                if let Some(r) = lmt {
                    match self.ctx.test(r) {
                        Ok(None) => {}
                        Ok(Some(_)) => *lmt = None,
                        Err(e) => {
                            tracing::error!(error = %e, "gpulmt send failed");
                            *error = ERR_OTHER;
                            *lmt = None;
                        }
                    }
                }
                if *env_req != request_null() || lmt.is_some() {
                    return None;
                }
                Done::err(0, 0, *error)
            }
            State::MpiSend { inner, .. } => {
                let mut flag = 0;
                // SAFETY: our request from PMPI_Isend / PMPI_Issend.
                let rc = unsafe { PMPI_Test(inner, &mut flag, status_ignore()) };
                if flag == 0 && rc == SUCCESS {
                    return None;
                }
                Done::err(0, 0, rc)
            }
        })
    }

    /// Cancels a receive that no message was matched to yet (`cancel_fn`).
    fn cancel(&mut self, id: u64) {
        if let Some(i) = self.posted.iter().position(|&p| p == id) {
            self.posted.remove(i);
            let spec = self.ops[&id].recv.expect("posted");
            let mut d = Done::ok(spec.source, spec.tag, 0);
            d.cancelled = true;
            self.set_state(id, State::Finished(d));
        }
    }
}

/// Unpacks contiguous bytes into a host buffer of a non-contiguous datatype.
fn unpack(spec: &RecvSpec, data: &[u8]) -> c_int {
    let elem = if spec.count > 0 { spec.cap / spec.count as usize } else { 0 };
    if elem == 0 || data.is_empty() {
        return SUCCESS;
    }
    let mut pos = 0;
    // SAFETY: the user's buffer and datatype for up to `count` elements; `data` is
    // the packed (homogeneous: raw) image of whole elements.
    unsafe {
        PMPI_Unpack(
            data.as_ptr().cast(),
            data.len() as c_int,
            &mut pos,
            spec.buf as *mut c_void,
            (data.len() / elem) as c_int,
            spec.dtype,
            spec.comm,
        )
    }
}

/// Releases a plugin context locally; rank 0 removes the job's shared memory.
fn release(ctx: Context, job: &str, rank0: bool) {
    drop(ctx);
    if rank0 {
        let _ = gpulmt::shm::job::JobSegment::unlink(job);
    }
}

// -------------------------------------------------------------------------------
// Generalized-request callbacks
// -------------------------------------------------------------------------------

unsafe extern "C" fn query_fn(extra: *mut c_void, status: *mut MPI_Status) -> c_int {
    // SAFETY: our GreqState, alive until free_fn.
    let d = unsafe { (*(extra as *const GreqState)).done };
    // SAFETY: MPI passes a status to fill.
    unsafe { fill_status(status, d.source, d.tag, d.error, d.bytes, d.cancelled) };
    d.error
}

unsafe extern "C" fn free_fn(extra: *mut c_void) -> c_int {
    errored().retain(|e| e.state != extra as usize);
    // SAFETY: the Box made in new_op; MPI calls free_fn once.
    drop(unsafe { Box::from_raw(extra as *mut GreqState) });
    SUCCESS
}

unsafe extern "C" fn cancel_fn(extra: *mut c_void, complete: c_int) -> c_int {
    if complete != 0 {
        return SUCCESS;
    }
    // SAFETY: our GreqState, alive until free_fn (which comes after completion).
    let op = unsafe { (*(extra as *const GreqState)).op };
    // MPI_Cancel is not intercepted, so the lock is free unless another thread holds it.
    if let Ok(mut g) = SHIM.lock() {
        if let Some(s) = g.as_mut() {
            s.cancel(op);
        }
    }
    SUCCESS
}
