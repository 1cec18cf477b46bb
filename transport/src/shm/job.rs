//! `JobSegment`: the one shared-memory segment of a job, `/dev/shm/gpulmt-<job>`.
//!
//! Rank 0 creates it, the other local ranks open it, and the launcher opens it to mark
//! ranks that died. It holds everything the ranks of one node share:
//!
//! ```text
//! page 0            Header: magic (written last), layout, creator pid, instance nonce,
//!                   contest mark, barrier counter
//! page-aligned      rank table: [nranks] RankEntry { pid, state, node_id, device, .. }
//! page-aligned      nranks*nranks PacketRings; ring (from, to) carries from -> to
//!                   (the diagonal is allocated but unused, for simple indexing)
//! page-aligned      nranks*nranks staging areas of depth*chunk_size bytes, each
//!                   4096-aligned; area (from, to) holds the chunks `from` fills and
//!                   `to` drains in the pipelined SHM protocol
//! ```
//!
//! The object is sparse: fresh pages read as zeros (which is also the empty state of
//! every ring and rank entry) and staging pages cost memory only once touched.
//!
//! Publication: the creator writes the header and only then stores the magic with
//! Release; openers poll the magic with Acquire, so once they see it every header
//! field is visible. The layout is never changed after that.
//!
//! Ownership and liveness ([`super::owner`]): every handle keeps the object's descriptor
//! open, and holds OFD locks through it that the kernel drops when the process dies.
//! The creator locks byte [`CREATOR_LOCK`] before it publishes the magic; a rank claims
//! byte `rank` when it registers ([`JobSegment::claim_rank`]), and that lock is how its
//! peers see it alive (a zombie holds none) and how a second process claiming the same
//! rank is refused. A segment nobody holds a lock on is abandoned, and the next job's
//! sweep removes it ([`super::sweep`]).
//!
//! The name is needed only until every rank has opened the segment: the job's rank 0
//! removes it once the ranks met at their first barrier, so a job that dies later
//! leaves nothing named behind, and a job started later with the same `GPULMT_JOB`
//! cannot reach this one's segment.

use std::io;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::object::{Opts, ShmError, ShmSegment, OBJECT_PREFIX};
use super::owner::{locked_by_others, pid_alive, try_lock_byte};
use super::ring::{PacketRing, RING_ALIGN};
use super::wait::sleep_toward;

/// Environment variable that carries the job id (set by `gpulmt-run`).
pub const JOB_ENV: &str = "GPULMT_JOB";

/// "GLMTSHM1": marks a fully initialized job segment.
pub const MAGIC: u64 = u64::from_le_bytes(*b"GLMTSHM1");

/// Bumped whenever the layout below changes, so mismatched binaries fail loudly.
/// Version 2: the instance nonce, and owner locks (a version-1 segment holds none, so the
/// sweep must not judge it by them). Version 3: the contest mark.
pub const LAYOUT_VERSION: u32 = 3;

/// Most local ranks a job segment supports (nranks^2 rings and staging areas).
pub const MAX_RANKS: u32 = 1024;

/// The byte of the segment's object its creator holds a lock on for its life (rank `r`
/// holds byte `r`; locks may lie beyond the end of a file).
pub const CREATOR_LOCK: u64 = MAX_RANKS as u64;

const PAGE: usize = 4096;

/// The job id from [`JOB_ENV`], if set and non-empty.
pub fn job_from_env() -> Option<String> {
    std::env::var(JOB_ENV).ok().filter(|s| !s.is_empty())
}

/// The shared-memory object name of job `job`: `gpulmt-<job>`.
pub fn segment_name(job: &str) -> String {
    format!("{OBJECT_PREFIX}{job}")
}

/// Checks that `job` can name a segment and cannot be confused with other objects.
fn check_job_id(job: &str) -> Result<(), ShmError> {
    let bad = |reason: &str| ShmError::BadLayout(format!("job id {job:?} {reason}"));
    if job.is_empty() {
        return Err(bad("is empty (is GPULMT_JOB set? start jobs with gpulmt-run)"));
    }
    if job.len() > 200 {
        return Err(bad("is longer than 200 bytes"));
    }
    if !job.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.') {
        return Err(bad("may only contain ASCII letters, digits, '-', '_' and '.'"));
    }
    // gpulmt-sim-* belongs to the simulated devices; keep the namespaces disjoint.
    if job == "sim" || job.starts_with("sim-") {
        return Err(bad("must not start with \"sim\" (reserved for simulated devices)"));
    }
    Ok(())
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_add(to - 1).map(|v| v / to * to)
}

/// Geometry of a job segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLayout {
    /// Local ranks of the job.
    pub nranks: u32,
    /// Slots per packet ring (power of two).
    pub ring_slots: u32,
    /// Bytes per ring slot, 8-byte header included (multiple of 8, >= 16).
    pub slot_size: u32,
    /// Bytes per staging chunk (0 together with `depth` 0: no staging).
    pub chunk_size: u64,
    /// Chunks per staging area (pipeline depth).
    pub depth: u32,
}

/// Byte offsets of the sections, derived from a [`JobLayout`].
#[derive(Debug, Clone, Copy)]
struct Offsets {
    ranks: usize,
    rings: usize,
    ring_stride: usize,
    staging: usize,
    staging_stride: usize,
    total: usize,
}

impl JobLayout {
    /// Checks the layout and computes its offsets with overflow checks.
    fn offsets(&self) -> Result<Offsets, ShmError> {
        let bad = |m: String| Err(ShmError::BadLayout(m));
        if self.nranks == 0 || self.nranks > MAX_RANKS {
            return bad(format!("nranks {} must be in 1..={MAX_RANKS}", self.nranks));
        }
        PacketRing::check_geometry(self.ring_slots as usize, self.slot_size as usize)
            .map_err(|e| ShmError::BadLayout(e.to_string()))?;
        let n = self.nranks as usize;
        let pairs = n * n;
        let overflow = || ShmError::BadLayout(format!("{self:?} does not fit the address space"));
        let ranks = PAGE;
        let rank_bytes = n * std::mem::size_of::<RankEntry>();
        let rings = round_up(ranks + rank_bytes, PAGE).ok_or_else(overflow)?;
        let ring_stride =
            round_up(PacketRing::bytes_needed(self.ring_slots as usize, self.slot_size as usize), RING_ALIGN)
                .ok_or_else(overflow)?;
        let staging = pairs
            .checked_mul(ring_stride)
            .and_then(|b| b.checked_add(rings))
            .and_then(|e| round_up(e, PAGE))
            .ok_or_else(overflow)?;
        let area = usize::try_from(self.chunk_size)
            .ok()
            .and_then(|c| c.checked_mul(self.depth as usize))
            .ok_or_else(overflow)?;
        let staging_stride = round_up(area, PAGE).ok_or_else(overflow)?;
        let total = pairs
            .checked_mul(staging_stride)
            .and_then(|b| b.checked_add(staging))
            .filter(|&t| libc::off_t::try_from(t).is_ok())
            .ok_or_else(overflow)?;
        Ok(Offsets { ranks, rings, ring_stride, staging, staging_stride, total })
    }

    /// Checks that the layout can be laid out (see the field docs).
    pub fn validate(&self) -> Result<(), ShmError> {
        self.offsets().map(|_| ())
    }

    /// Bytes of the whole segment (most of it sparse staging).
    ///
    /// # Panics
    /// If the layout is invalid; check with [`JobLayout::validate`] first.
    pub fn total_bytes(&self) -> usize {
        match self.offsets() {
            Ok(o) => o.total,
            Err(e) => panic!("{e}"),
        }
    }

    /// Bytes of one staging area (`depth * chunk_size`).
    pub fn staging_bytes(&self) -> usize {
        (self.chunk_size as usize) * (self.depth as usize)
    }
}

/// Page 0 of the segment.
#[repr(C)]
struct Header {
    /// [`MAGIC`] once the header is complete; 0 before.
    magic: AtomicU64,
    version: u32,
    nranks: u32,
    ring_slots: u32,
    slot_size: u32,
    chunk_size: u64,
    depth: u32,
    creator_pid: u32,
    /// Total size the creator laid out; checked against the object size by openers.
    total_bytes: u64,
    /// A random number drawn by the creator: names this instance of the job in messages.
    instance: u64,
    /// 0, or the pid of a process that was refused a place in this job while it started
    /// (see [`JobSegment::mark_contested`]); set once, never cleared.
    contested: AtomicU32,
    /// Arrivals at barriers since creation; on its own line since every rank polls it.
    barrier: CachePadded<AtomicU64>,
}

const _: () = assert!(std::mem::size_of::<Header>() <= PAGE);

/// Lifecycle of a rank, as stored in the rank table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RankState {
    /// Not registered yet.
    Empty = 0,
    /// Registered and running.
    Alive = 1,
    /// Finished cleanly (finalize): sends nothing more, expects nothing more.
    Finalized = 2,
    /// Died or aborted (marked by itself or by the launcher).
    Failed = 3,
}

impl RankState {
    /// Decodes a stored state; unknown values (corruption) read as `Failed` so that
    /// peers stop waiting for that rank rather than hang.
    pub fn from_raw(v: u32) -> RankState {
        match v {
            0 => RankState::Empty,
            1 => RankState::Alive,
            2 => RankState::Finalized,
            _ => RankState::Failed,
        }
    }
}

/// What a rank can tell about a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerStatus {
    /// Registered, and its process exists.
    Alive,
    /// Finalized cleanly.
    Finalized,
    /// Marked failed, or registered but its process no longer exists.
    Failed,
    /// Not registered yet: it may still be starting.
    Unknown,
}

/// One entry of the rank table (own cache line: each rank writes only its own).
#[repr(C, align(64))]
struct RankEntry {
    pid: AtomicU32,
    /// A [`RankState`] as u32.
    state: AtomicU32,
    node_id: AtomicU64,
    device: AtomicU32,
    _reserved: u32,
    /// Last barrier generation this rank arrived at (for "who is missing" reports).
    barrier_gen: AtomicU64,
}

/// The mapped job segment. Shared by all threads of a rank (`Sync`).
#[derive(Debug)]
pub struct JobSegment {
    seg: ShmSegment,
    job: String,
    layout: JobLayout,
    off: Offsets,
    /// Ranks this handle claimed: its own locks, which its descriptor cannot see.
    claimed: Mutex<Vec<usize>>,
}

impl JobSegment {
    /// Creates and initializes the segment of `job` (rank 0 does this, once), with every
    /// page reserved: a `/dev/shm` too small for it fails here ([`ShmError::NoSpace`],
    /// saying how much is needed), not as a SIGBUS in some rank later.
    ///
    /// Fails with `EEXIST` if it already exists: a leftover (`gpulmt-run --cleanup`), or
    /// another job's with the same id, which this marks contested
    /// ([`mark_contested`](Self::mark_contested)) since its ranks may be this one's.
    pub fn create(job: &str, layout: JobLayout) -> Result<Self, ShmError> {
        check_job_id(job)?;
        let off = layout.offsets()?;
        let name = segment_name(job);
        // Open-or-create in one call, then the creator lock decides who made it: an
        // O_EXCL create that fails and an open after it could both miss a segment whose
        // job removes its name in between, and so could not reach it to mark it.
        let fd = ShmSegment::open_or_create_fd(&name)?;
        // Locked before the object has a size: a segment with the magic always has a live
        // creator or a dead one, never one that has not locked yet (the sweep relies on it).
        let exists = || ShmError::os("shm_open", &name, libc::EEXIST);
        if !try_lock_byte(fd.as_fd(), CREATOR_LOCK).map_err(|e| lock_error(&name, e))? {
            // Another rank 0 of this id lives and made it (or is making it).
            Self::contest(fd, job, &name);
            return Err(exists());
        }
        if super::object::fd_len(fd.as_fd()).map_err(|e| ShmError::os("fstat", &name, e))? != 0 {
            // Sized by a creator that died: a leftover, not ours to remove or reuse (the
            // sweep removes it once no rank of it holds a lock).
            return Err(exists());
        }
        let seg =
            ShmSegment::size_new(fd, &name, off.total, Opts { reserve: true, keep_fd: true }).map_err(|e| match e {
                ShmError::NoSpace { name, needed, free, size, .. } => {
                    ShmError::NoSpace { what: JOB_SEGMENT_WHAT, name, needed, free, size }
                }
                e => e,
            })?;
        // Fresh pages read as zeros: rank entries are Empty, rings are empty, the
        // barrier counter is 0. Only the header needs writing.
        let hdr = seg.ptr().cast::<Header>();
        // SAFETY: the header lies in page 0 of the fresh mapping; nobody reads the fields
        // before the magic is published below.
        unsafe {
            std::ptr::addr_of_mut!((*hdr).version).write(LAYOUT_VERSION);
            std::ptr::addr_of_mut!((*hdr).nranks).write(layout.nranks);
            std::ptr::addr_of_mut!((*hdr).ring_slots).write(layout.ring_slots);
            std::ptr::addr_of_mut!((*hdr).slot_size).write(layout.slot_size);
            std::ptr::addr_of_mut!((*hdr).chunk_size).write(layout.chunk_size);
            std::ptr::addr_of_mut!((*hdr).depth).write(layout.depth);
            std::ptr::addr_of_mut!((*hdr).creator_pid).write(std::process::id());
            std::ptr::addr_of_mut!((*hdr).total_bytes).write(off.total as u64);
            std::ptr::addr_of_mut!((*hdr).instance).write(instance_nonce());
        }
        let me = JobSegment { seg, job: job.to_owned(), layout, off, claimed: Mutex::new(Vec::new()) };
        // Release: publishes every header field above to openers that Acquire the magic.
        me.header().magic.store(MAGIC, Ordering::Release);
        tracing::debug!(name = me.name(), bytes = off.total, ?layout, "created job segment");
        Ok(me)
    }

    /// Marks the segment `fd` refers to contested, once its creator has published it
    /// (up to 100 ms; a creator that takes longer is not reached, and this job's refusal
    /// is all that remains).
    fn contest(fd: std::os::fd::OwnedFd, job: &str, name: &str) {
        let deadline = Instant::now() + Duration::from_millis(100);
        let mut fd = Some(fd);
        while let Some(f) = fd.take() {
            let dup = f.try_clone();
            match Self::from_existing(ShmSegment::map_existing(f, name, Opts { keep_fd: true, reserve: false }), job) {
                Ok(Some(seg)) => return seg.mark_contested(std::process::id()),
                Ok(None) | Err(ShmError::Empty { .. }) if Instant::now() < deadline => {
                    sleep_toward(deadline, Duration::from_millis(1));
                    fd = dup.ok();
                }
                _ => return,
            }
        }
    }

    /// Opens the segment of `job`, waiting up to `timeout` for rank 0 to create and
    /// initialize it (at least one attempt is made, so `Duration::ZERO` tries once).
    pub fn open(job: &str, timeout: Duration) -> Result<Self, ShmError> {
        check_job_id(job)?;
        let name = segment_name(job);
        let start = Instant::now();
        let deadline = start + timeout;
        let mut pause = Duration::from_micros(200);
        let mut last_state;
        loop {
            match Self::try_open(job, &name) {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => last_state = "it exists but rank 0 has not finished initializing it",
                Err(ShmError::Empty { .. }) => last_state = "it exists but rank 0 has not sized it yet",
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => last_state = "it does not exist yet",
                Err(e) => return Err(e),
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(ShmError::Timeout {
                    what: format!(
                        "job segment \"/{name}\" ({last_state}); is rank 0 running and do all ranks have the same {JOB_ENV}?"
                    ),
                    waited,
                });
            }
            sleep_toward(deadline, pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// One attempt: `Ok(None)` if the segment exists but its magic is not set yet.
    fn try_open(job: &str, name: &str) -> Result<Option<Self>, ShmError> {
        Self::from_existing(ShmSegment::open_opts(name, Opts { keep_fd: true, reserve: false }), job)
    }

    /// The job segment `seg` maps, once its creator published it (`Ok(None)` before).
    fn from_existing(seg: Result<ShmSegment, ShmError>, job: &str) -> Result<Option<Self>, ShmError> {
        let seg = seg?;
        let name = seg.name().to_owned();
        let name = name.as_str();
        let bad = |reason: String| ShmError::BadSegment { name: name.to_owned(), reason };
        if seg.len() < PAGE {
            return Err(bad(format!("size {} is smaller than its header page", seg.len())));
        }
        let hdr_ptr = seg.ptr().cast::<Header>();
        // SAFETY: page 0 is mapped; only the atomic magic is touched until it is set (the
        // creator may still be writing the other fields).
        let magic = unsafe { &*std::ptr::addr_of!((*hdr_ptr).magic) };
        // Acquire: pairs with the creator's Release; the header fields are complete.
        match magic.load(Ordering::Acquire) {
            0 => return Ok(None),
            MAGIC => {}
            m => return Err(bad(format!("bad magic {m:#018x}: not a gpulmt job segment"))),
        }
        // SAFETY: the magic is set, so the header is complete and no longer written.
        let hdr = unsafe { &*hdr_ptr };
        if hdr.version != LAYOUT_VERSION {
            return Err(bad(format!(
                "layout version {} but this binary speaks {LAYOUT_VERSION}: all ranks must run the same gpulmt",
                hdr.version
            )));
        }
        let layout = JobLayout {
            nranks: hdr.nranks,
            ring_slots: hdr.ring_slots,
            slot_size: hdr.slot_size,
            chunk_size: hdr.chunk_size,
            depth: hdr.depth,
        };
        let off = layout.offsets().map_err(|e| bad(format!("header holds an invalid layout: {e}")))?;
        if hdr.total_bytes != off.total as u64 || seg.len() < off.total {
            return Err(bad(format!(
                "header says {} bytes, layout needs {}, object has {}",
                hdr.total_bytes,
                off.total,
                seg.len()
            )));
        }
        Ok(Some(JobSegment { seg, job: job.to_owned(), layout, off, claimed: Mutex::new(Vec::new()) }))
    }

    /// Removes the name of `job`'s segment (mappings stay valid). `Ok(false)` if absent.
    pub fn unlink(job: &str) -> Result<bool, ShmError> {
        check_job_id(job)?;
        ShmSegment::unlink(&segment_name(job))
    }

    fn header(&self) -> &Header {
        // SAFETY: page 0 is mapped for the segment's lifetime and initialized (magic set).
        unsafe { &*self.seg.ptr().cast::<Header>() }
    }

    fn entry(&self, r: usize) -> &RankEntry {
        assert!(r < self.nranks(), "rank {r} out of range (nranks {})", self.nranks());
        // SAFETY: the rank table holds nranks entries at off.ranks, 64-aligned.
        unsafe { &*self.seg.ptr().add(self.off.ranks).cast::<RankEntry>().add(r) }
    }

    fn pair(&self, from: usize, to: usize) -> usize {
        let n = self.nranks();
        assert!(from < n && to < n, "rank pair ({from}, {to}) out of range (nranks {n})");
        from * n + to
    }

    /// The object name, `gpulmt-<job>`.
    pub fn name(&self) -> &str {
        self.seg.name()
    }

    /// The job id.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The segment's geometry.
    pub fn layout(&self) -> JobLayout {
        self.layout
    }

    /// Local ranks of the job.
    pub fn nranks(&self) -> usize {
        self.layout.nranks as usize
    }

    /// Pid of the process that created the segment.
    pub fn creator_pid(&self) -> u32 {
        self.header().creator_pid
    }

    /// The random number that names this instance of the job (drawn by its creator).
    pub fn instance(&self) -> u64 {
        self.header().instance
    }

    /// The descriptor the locks of this handle are held through.
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.seg.fd().expect("job segments keep their descriptor")
    }

    /// Whether some other process's handle (or another handle of this one) holds a lock
    /// on the segment: its creator or a registered rank. None if the kernel cannot say.
    pub fn held_by_others(&self) -> Option<bool> {
        locked_by_others(self.fd(), 0, CREATOR_LOCK + 1).ok()
    }

    /// The ring that carries packets from rank `from` to rank `to`.
    ///
    /// Protocol invariant (not checkable here, since peers are other processes): only
    /// rank `from` pushes to it, only rank `to` pops from it, each from one thread at a
    /// time. The view is valid while `self` lives.
    ///
    /// # Panics
    /// If a rank is out of range.
    pub fn ring(&self, from: usize, to: usize) -> PacketRing {
        let p = self.pair(from, to);
        // SAFETY: ring p lies inside the rings section, RING_ALIGN-aligned (page-aligned
        // base, stride a multiple of RING_ALIGN), with the layout's geometry; the SPSC
        // discipline is the job-wide convention documented above.
        unsafe {
            PacketRing::attach(
                self.seg.ptr().add(self.off.rings + p * self.off.ring_stride),
                self.layout.ring_slots as usize,
                self.layout.slot_size as usize,
            )
        }
    }

    /// Address and length of the staging area of `(from, to)` (4096-aligned).
    pub fn staging(&self, from: usize, to: usize) -> (usize, usize) {
        let p = self.pair(from, to);
        let addr = self.seg.ptr() as usize + self.off.staging + p * self.off.staging_stride;
        (addr, self.layout.staging_bytes())
    }

    /// Address of chunk `slot` (< depth) of the staging area of `(from, to)`.
    pub fn staging_chunk(&self, from: usize, to: usize, slot: usize) -> usize {
        assert!(slot < self.layout.depth as usize, "staging slot {slot} out of range (depth {})", self.layout.depth);
        self.staging(from, to).0 + slot * self.layout.chunk_size as usize
    }

    /// Claims rank `rank` for this handle (its lock, held until the handle is dropped or
    /// the process dies) and registers it as alive with its pid, node and device.
    ///
    /// Fails with [`ShmError::RankTaken`] when a live handle elsewhere holds the rank:
    /// two processes claiming one rank (a second job instance with this job's id, or a
    /// second context for the rank), whose registration would break the first's.
    pub fn claim_rank(&self, rank: usize, pid: u32, node_id: u64, device: u32) -> Result<(), ShmError> {
        let e = self.entry(rank);
        if !try_lock_byte(self.fd(), rank as u64).map_err(|err| lock_error(self.name(), err))? {
            return Err(ShmError::RankTaken {
                name: self.name().to_owned(),
                rank,
                pid: e.pid.load(Ordering::Acquire),
                instance: self.instance(),
            });
        }
        let mut claimed = self.claimed.lock().unwrap_or_else(|p| p.into_inner());
        if !claimed.contains(&rank) {
            claimed.push(rank);
        }
        // Relaxed: published by the Release store of the state below.
        e.pid.store(pid, Ordering::Relaxed);
        e.node_id.store(node_id, Ordering::Relaxed);
        e.device.store(device, Ordering::Relaxed);
        // Release: a peer that Acquires state == Alive sees pid, node and device.
        e.state.store(RankState::Alive as u32, Ordering::Release);
        Ok(())
    }

    /// Marks the job as contested by process `pid`: a process refused a place in it
    /// while it started (its rank was taken, or it found the segment existing as a rank
    /// 0), so two jobs run with one `GPULMT_JOB`. Which ranks belong to which job cannot
    /// be told apart from here, so the whole job stops: the init barrier fails, and a
    /// running rank's liveness check fails its transfers with every local peer. Rather
    /// that than a job of mixed processes that would run the wrong peers' programs.
    /// The first mark stays.
    pub fn mark_contested(&self, pid: u32) {
        // Release (pairs with `contested`'s Acquire): the mark publishes nothing else, so
        // Relaxed would do; the pair costs nothing on this cold path and reads plainly.
        let _ = self.header().contested.compare_exchange(0, pid.max(1), Ordering::Release, Ordering::Relaxed);
    }

    /// The pid that contested this job ([`mark_contested`](Self::mark_contested)), if any.
    pub fn contested(&self) -> Option<u32> {
        // Acquire: pairs with mark_contested's Release.
        Some(self.header().contested.load(Ordering::Acquire)).filter(|&p| p != 0)
    }

    /// Stored state of rank `r`.
    pub fn rank_state(&self, r: usize) -> RankState {
        // Acquire: pairs with set_rank's Release, for the fields read after it.
        RankState::from_raw(self.entry(r).state.load(Ordering::Acquire))
    }

    /// Sets the state of rank `r` (a rank finalizing itself, the launcher marking it
    /// failed...).
    pub fn mark_state(&self, r: usize, state: RankState) {
        // Release: whatever the marker wrote before (e.g. final ring packets) is visible to
        // a peer that observes the new state.
        self.entry(r).state.store(state as u32, Ordering::Release);
    }

    /// Pid rank `r` registered (0 if not registered).
    pub fn rank_pid(&self, r: usize) -> u32 {
        self.entry(r).pid.load(Ordering::Acquire)
    }

    /// Node id rank `r` registered.
    pub fn rank_node(&self, r: usize) -> u64 {
        self.entry(r).node_id.load(Ordering::Acquire)
    }

    /// Device rank `r` registered.
    pub fn rank_device(&self, r: usize) -> u32 {
        self.entry(r).device.load(Ordering::Acquire)
    }

    /// What we can tell about rank `r`. `Alive` entries are double-checked with the
    /// rank's lock (a process killed by SIGKILL cannot mark itself, and the kernel drops
    /// its lock as it dies, before it is a zombie), so this makes a syscall: poll it at a
    /// modest rate (e.g. every few ms while blocked on a peer).
    pub fn peer_status(&self, r: usize) -> PeerStatus {
        match self.rank_state(r) {
            RankState::Empty => PeerStatus::Unknown,
            RankState::Finalized => PeerStatus::Finalized,
            RankState::Failed => PeerStatus::Failed,
            RankState::Alive => {
                // Locks and pids only mean something on our own machine.
                if self.rank_node(r) != node_id() || self.claimed_here(r) {
                    return PeerStatus::Alive;
                }
                let alive = match locked_by_others(self.fd(), r as u64, 1) {
                    Ok(held) => held,
                    // The kernel cannot say (never on tmpfs): the pid, zombies as dead.
                    Err(_) => {
                        let pid = self.rank_pid(r);
                        pid == 0 || pid_alive(pid)
                    }
                };
                if alive {
                    PeerStatus::Alive
                } else {
                    PeerStatus::Failed
                }
            }
        }
    }

    /// Whether this handle claimed rank `r` (its own lock, invisible to its descriptor).
    fn claimed_here(&self, r: usize) -> bool {
        self.claimed.lock().unwrap_or_else(|p| p.into_inner()).contains(&r)
    }

    /// Waits until all `nranks` ranks have called `barrier` for the same generation.
    ///
    /// A generation barrier on the header counter: each arrival adds 1; generation `g`
    /// is complete when the counter reaches `g * nranks`. No rank can arrive at
    /// generation `g + 1` before `g` is complete, so the counter never needs a reset.
    ///
    /// Fails, naming the ranks that have not arrived, if `timeout` passes, if a missing
    /// peer is failed or finalized (it will never come), or if `should_abort()` returns
    /// true (polled while waiting). A failed barrier leaves the counter out of step:
    /// the job must abort, not retry.
    pub fn barrier(&self, me: usize, timeout: Duration, should_abort: impl Fn() -> bool) -> Result<(), ShmError> {
        let n = self.nranks() as u64;
        let me_entry = self.entry(me);
        // AcqRel: Release publishes our writes before the barrier to every rank that
        // leaves it; Acquire (with the loads below) makes theirs visible to us.
        let arrived = self.header().barrier.fetch_add(1, Ordering::AcqRel) + 1;
        let generation = (arrived - 1) / n + 1;
        let target = generation * n;
        // Relaxed: diagnostics only (who is missing).
        me_entry.barrier_gen.store(generation, Ordering::Relaxed);
        let start = Instant::now();
        let deadline = start + timeout;
        let mut last_peer_check = start;
        let mut spins = 0u32;
        loop {
            // Acquire: pairs with every rank's AcqRel fetch_add (a release sequence).
            if self.header().barrier.load(Ordering::Acquire) >= target {
                return Ok(());
            }
            let fail = |reason: String| {
                let missing: Vec<usize> = (0..self.nranks())
                    .filter(|&r| self.entry(r).barrier_gen.load(Ordering::Relaxed) < generation)
                    .collect();
                Err(ShmError::Barrier { name: self.name().to_owned(), me, generation, missing, reason })
            };
            if should_abort() {
                return fail("aborted by the caller".into());
            }
            if let Some(pid) = self.contested() {
                return fail(contest_reason(pid, self.job()));
            }
            let now = Instant::now();
            if now.duration_since(start) >= timeout {
                return fail(format!("timed out after {timeout:?}"));
            }
            // Peer checks make syscalls: do them every 10 ms, not every spin.
            if now.duration_since(last_peer_check) >= Duration::from_millis(10) {
                last_peer_check = now;
                for r in 0..self.nranks() {
                    if self.entry(r).barrier_gen.load(Ordering::Relaxed) >= generation {
                        continue;
                    }
                    match self.peer_status(r) {
                        PeerStatus::Failed => {
                            return fail(format!("rank {r} (pid {}) has failed", self.rank_pid(r)));
                        }
                        PeerStatus::Finalized => {
                            return fail(format!("rank {r} has already finalized and will not arrive"));
                        }
                        PeerStatus::Alive | PeerStatus::Unknown => {}
                    }
                }
            }
            // Spin briefly (barriers of running ranks complete in microseconds), then
            // yield, then sleep so that a long wait does not burn a core that a rank
            // still computing may need.
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else if spins < 1000 {
                std::thread::yield_now();
            } else {
                sleep_toward(deadline, Duration::from_micros(200));
            }
        }
    }
}

/// Why a contested job stops ([`JobSegment::mark_contested`]), for errors and logs.
pub fn contest_reason(pid: u32, job: &str) -> String {
    format!(
        "process {pid} was refused a place in job {job} while it started: two jobs run with the same GPULMT_JOB, \
         and which ranks belong to which cannot be told, so every rank of this job stops; start each job with its \
         own id (gpulmt-run makes one)"
    )
}

/// What the errors of a job segment that does not fit `/dev/shm` call it, with what
/// sizes it.
const JOB_SEGMENT_WHAT: &str =
    "the job segment (per pair of local ranks GPULMT_CHUNK_SIZE x GPULMT_PIPELINE_DEPTH of staging, which smaller values shrink)";

/// A failed lock operation on the segment's object as an [`ShmError::Os`].
fn lock_error(name: &str, e: io::Error) -> ShmError {
    ShmError::os("fcntl(F_OFD_SETLK)", name, e.raw_os_error().unwrap_or(0))
}

/// A random number for a new instance of a job (std's `RandomState` draws its keys from
/// the OS; the time and pid make instances differ even if it did not).
fn instance_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

/// FNV-1a 64: a hash that is the same in every process and every build (unlike std's).
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// An id of this machine that all ranks on it agree on (cached).
///
/// The kernel's boot id comes first: it is the same for every process of one running
/// kernel, containers included (a container image may carry a copied
/// `/etc/machine-id`, so that file alone could match across hosts). Where there is no
/// boot id, `/etc/machine-id`, then the host name, stand in.
pub fn node_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        let read = |p: &str| std::fs::read_to_string(p).ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty());
        let source = read("/proc/sys/kernel/random/boot_id")
            .map(|b| format!("boot:{b}"))
            .or_else(|| read("/etc/machine-id").map(|m| format!("machine:{m}")))
            .unwrap_or_else(|| format!("host:{}", hostname()));
        fnv1a(source.as_bytes(), 0xcbf2_9ce4_8422_2325)
    })
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        tracing::warn!(error = %io::Error::last_os_error(), "gethostname failed; node id falls back to a constant");
        return String::from("unknown");
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// For the sweep: if `name` is an initialized job segment of this layout version,
/// whether it is abandoned (nobody holds a lock on it: its creator and every rank that
/// claimed one are gone); `None` if it cannot be parsed as one.
pub(crate) fn probe_abandoned(name: &str) -> Option<bool> {
    let job = name.strip_prefix(OBJECT_PREFIX)?;
    check_job_id(job).ok()?;
    let seg = JobSegment::try_open(job, name).ok()??;
    Some(!seg.held_by_others()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::object::tests::dead_pid;
    use crate::shm::object::SHM_DIR;
    use crate::shm::sweep::{cleanup_stale_jobs, Evidence};
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    fn unique_job(tag: &str) -> String {
        static N: AtomicUsize = AtomicUsize::new(0);
        format!("test{}x{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
    }

    fn layout(nranks: u32) -> JobLayout {
        JobLayout { nranks, ring_slots: 16, slot_size: 128, chunk_size: 1 << 20, depth: 4 }
    }

    /// Removes the job's objects even if the test fails.
    struct Cleanup(String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            crate::shm::object::remove_job_objects(&self.0);
        }
    }

    #[test]
    fn layout_math() {
        let l = layout(3);
        let off = l.offsets().unwrap();
        assert_eq!(off.rings % PAGE, 0);
        assert_eq!(off.staging % PAGE, 0);
        assert_eq!(off.staging_stride, 4 << 20);
        assert_eq!(off.total, off.staging + 9 * (4 << 20));
        assert_eq!(l.total_bytes(), off.total);
        assert!(JobLayout { nranks: 0, ..l }.validate().is_err());
        assert!(JobLayout { ring_slots: 12, ..l }.validate().is_err());
        assert!(JobLayout { chunk_size: u64::MAX, ..l }.validate().is_err());
        assert!(JobLayout { chunk_size: 0, depth: 0, ..l }.validate().is_ok());
        assert!(check_job_id("sim-1").is_err());
        assert!(check_job_id("a/b").is_err());
        assert!(check_job_id("1f2e-17ab").is_ok());
    }

    #[test]
    fn create_then_open_another_handle() {
        let job = unique_job("open");
        let _c = Cleanup(job.clone());
        let a = JobSegment::create(&job, layout(3)).unwrap();
        assert_eq!(a.name(), format!("gpulmt-{job}"));
        let b = JobSegment::open(&job, Duration::from_secs(1)).unwrap();
        assert_eq!(b.layout(), layout(3));
        assert_eq!(b.creator_pid(), std::process::id());

        assert_eq!(b.instance(), a.instance());

        // Rank table.
        assert_eq!(b.peer_status(1), PeerStatus::Unknown);
        a.claim_rank(1, std::process::id(), node_id(), 7).unwrap();
        assert_eq!(b.rank_state(1), RankState::Alive);
        assert_eq!(b.rank_pid(1), std::process::id());
        assert_eq!(b.rank_device(1), 7);
        assert_eq!(b.peer_status(1), PeerStatus::Alive);
        // A second claim of rank 1 through another handle (another process) is refused,
        // and leaves the first's registration alone.
        match b.claim_rank(1, 4242, node_id(), 3) {
            Err(e @ ShmError::RankTaken { rank: 1, .. }) => {
                assert!(e.to_string().contains("GPULMT_JOB"), "{e}");
                assert!(e.to_string().contains(&format!("{:016x}", a.instance())), "{e}");
            }
            other => panic!("second claim of rank 1: {other:?}"),
        }
        assert_eq!((b.rank_pid(1), b.rank_device(1)), (std::process::id(), 7));
        a.claim_rank(1, std::process::id(), node_id(), 7).unwrap();
        b.mark_state(1, RankState::Finalized);
        assert_eq!(a.peer_status(1), PeerStatus::Finalized);

        // Rings: what one handle pushes the other pops; rings are distinct.
        assert!(a.ring(0, 1).try_push(b"hello").unwrap());
        assert!(b.ring(1, 0).is_empty());
        assert_eq!(b.ring(0, 1).try_pop(|p| p.to_vec()).unwrap(), Some(b"hello".to_vec()));

        // Staging: aligned, disjoint, shared.
        let (s01, len) = a.staging(0, 1);
        let (s10, _) = a.staging(1, 0);
        assert_eq!(len, 4 << 20);
        assert_eq!(s01 % PAGE, 0);
        assert!(s10 >= s01 + len || s01 >= s10 + len);
        assert_eq!(a.staging_chunk(0, 1, 2), s01 + 2 * (1 << 20));
        // SAFETY: inside the staging area of both mappings.
        unsafe {
            *(a.staging_chunk(2, 2, 3) as *mut u8) = 5;
            assert_eq!(*(b.staging_chunk(2, 2, 3) as *const u8), 5);
        }
        // The last byte of the last area is inside the mapping.
        let (last, len) = a.staging(2, 2);
        assert!(last + len <= a.seg.ptr() as usize + a.seg.len());

        assert!(matches!(JobSegment::create(&job, layout(3)), Err(e) if e.raw_os_error() == Some(libc::EEXIST)));
    }

    #[test]
    fn open_waits_for_creator_then_times_out() {
        let job = unique_job("wait");
        let _c = Cleanup(job.clone());
        let t0 = Instant::now();
        let e = JobSegment::open(&job, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, ShmError::Timeout { .. }), "{e}");
        assert!(e.to_string().contains("does not exist yet"), "{e}");
        assert!(t0.elapsed() >= Duration::from_millis(100));

        // An opener started before the creator gets the segment once it is published.
        std::thread::scope(|s| {
            let opener = s.spawn(|| JobSegment::open(&job, Duration::from_secs(10)));
            std::thread::sleep(Duration::from_millis(50));
            let _a = JobSegment::create(&job, layout(2)).unwrap();
            assert_eq!(opener.join().unwrap().unwrap().layout(), layout(2));
        });
    }

    #[test]
    fn barrier_three_threads() {
        let job = unique_job("barrier");
        let _c = Cleanup(job.clone());
        let seg = JobSegment::create(&job, layout(3)).unwrap();
        let counter = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for me in 0..3 {
                let (job, counter) = (&job, &counter);
                s.spawn(move || {
                    // Each "rank" has its own mapping, as separate processes would.
                    let seg = JobSegment::open(job, Duration::from_secs(5)).unwrap();
                    seg.claim_rank(me, std::process::id(), node_id(), 0).unwrap();
                    for round in 0..200 {
                        counter.fetch_add(1, Ordering::Relaxed);
                        seg.barrier(me, Duration::from_secs(20), || false).unwrap();
                        // Everyone has incremented for this round before anyone leaves.
                        assert!(counter.load(Ordering::Relaxed) >= 3 * (round + 1));
                        seg.barrier(me, Duration::from_secs(20), || false).unwrap();
                    }
                });
            }
        });
        assert_eq!(seg.header().barrier.load(Ordering::Relaxed), 3 * 400);
    }

    #[test]
    fn barrier_reports_missing_failed_and_aborts() {
        let job = unique_job("barrier-fail");
        let _c = Cleanup(job.clone());
        let seg = JobSegment::create(&job, layout(3)).unwrap();
        // Timeout names the two ranks that never came.
        let e = seg.barrier(0, Duration::from_millis(50), || false).unwrap_err();
        match &e {
            ShmError::Barrier { missing, generation: 1, me: 0, .. } => assert_eq!(missing, &vec![1, 2]),
            other => panic!("unexpected {other}"),
        }
        assert!(e.to_string().contains("timed out"), "{e}");

        // A failed peer ends the wait early.
        let job2 = unique_job("barrier-fail2");
        let _c2 = Cleanup(job2.clone());
        let seg = JobSegment::create(&job2, layout(2)).unwrap();
        seg.mark_state(1, RankState::Failed);
        let t0 = Instant::now();
        let e = seg.barrier(0, Duration::from_secs(30), || false).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(e.to_string().contains("rank 1"), "{e}");

        // should_abort ends it too.
        let job3 = unique_job("barrier-abort");
        let _c3 = Cleanup(job3.clone());
        let seg = JobSegment::create(&job3, layout(2)).unwrap();
        let stop = AtomicBool::new(true);
        let e = seg.barrier(1, Duration::from_secs(30), || stop.load(Ordering::Relaxed)).unwrap_err();
        assert!(e.to_string().contains("aborted"), "{e}");
    }

    /// A second rank 0 of a job's id is refused and marks the job contested, and so does
    /// (in the context's init) a second claim of a rank; a contested job's barrier fails
    /// at once, naming the process and what to do. A leftover whose creator died is
    /// refused without a mark.
    #[test]
    fn a_second_creator_marks_the_job_contested_and_its_barrier_fails() {
        let job = unique_job("contest");
        let _c = Cleanup(job.clone());
        let first = JobSegment::create(&job, layout(3)).unwrap();
        assert_eq!(first.contested(), None);
        let e = JobSegment::create(&job, layout(3)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
        assert_eq!(first.contested(), Some(std::process::id()));
        let t0 = Instant::now();
        let e = first.barrier(0, Duration::from_secs(30), || false).unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5), "the contested barrier waited {:?}", t0.elapsed());
        assert!(e.to_string().contains("same GPULMT_JOB"), "{e}");
        // The first mark stays.
        first.mark_contested(4242);
        assert_eq!(first.contested(), Some(std::process::id()));

        // A segment whose creator is gone (its descriptor closed) but whose name stays:
        // a new rank 0 is refused, and marks nothing (nobody of that job runs on).
        let job2 = unique_job("leftover");
        let _c2 = Cleanup(job2.clone());
        let reader = {
            let gone = JobSegment::create(&job2, layout(2)).unwrap();
            let reader = JobSegment::open(&job2, Duration::ZERO).unwrap();
            drop(gone);
            reader
        };
        let e = JobSegment::create(&job2, layout(2)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST), "{e}");
        assert_eq!(reader.contested(), None);
    }

    /// A rank's handle going away the way a process's does at death (its descriptor
    /// closes, nobody marks it) makes it Failed: the lock it held is gone.
    #[test]
    fn peer_status_detects_dead_pid() {
        let job = unique_job("dead");
        let _c = Cleanup(job.clone());
        let seg = JobSegment::create(&job, layout(2)).unwrap();
        let rank1 = JobSegment::open(&job, Duration::ZERO).unwrap();
        rank1.claim_rank(1, dead_pid(), node_id(), 0).unwrap();
        assert_eq!(seg.peer_status(1), PeerStatus::Alive, "its lock is held");
        drop(rank1);
        assert_eq!(seg.rank_state(1), RankState::Alive, "nobody marked it");
        assert_eq!(seg.peer_status(1), PeerStatus::Failed, "but its process is gone");
        // A rank on another node is not ours to check.
        let rank1 = JobSegment::open(&job, Duration::ZERO).unwrap();
        rank1.claim_rank(1, dead_pid(), node_id() ^ 1, 0).unwrap();
        drop(rank1);
        assert_eq!(seg.peer_status(1), PeerStatus::Alive);
    }

    /// Where `zombie_rank_is_seen_dead` tells its helper process which job to join.
    const ZOMBIE_JOB_ENV: &str = "GPULMT_TEST_ZOMBIE_JOB";

    /// Not a test by itself: the rank process of [`zombie_rank_is_seen_dead`], which runs
    /// this test binary filtered to it. Without the variable it does nothing.
    #[test]
    fn zombie_helper() {
        let Ok(job) = std::env::var(ZOMBIE_JOB_ENV) else { return };
        let seg = JobSegment::open(&job, Duration::from_secs(20)).unwrap();
        seg.claim_rank(1, std::process::id(), node_id(), 0).unwrap();
        std::thread::sleep(Duration::from_secs(120));
    }

    /// A rank killed while its parent does not reap it is a zombie, which `kill(pid, 0)`
    /// still finds; its peers must see it dead at once all the same.
    #[test]
    fn zombie_rank_is_seen_dead() {
        let job = unique_job("zombie");
        let _c = Cleanup(job.clone());
        let seg = JobSegment::create(&job, layout(2)).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "shm::job::tests::zombie_helper", "--test-threads=1"])
            .env(ZOMBIE_JOB_ENV, &job)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let t0 = Instant::now();
        while seg.rank_pid(1) != pid || seg.rank_state(1) != RankState::Alive {
            assert!(t0.elapsed() < Duration::from_secs(30), "the helper never claimed rank 1");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(seg.peer_status(1), PeerStatus::Alive);
        // SAFETY: signalling our own child; it is reaped below, after the checks.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let stat = || std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        while !stat().rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')) {
            assert!(t0.elapsed() < Duration::from_secs(30), "the helper never became a zombie: {}", stat());
            std::thread::sleep(Duration::from_millis(1));
        }
        // The group leader shows `Z` as soon as it has exited, while the process's other
        // threads may still be exiting and holding its descriptors, so its lock: on a loaded
        // machine that took long enough to fail a single look (seen in CI). The lock goes
        // with the last thread, within a moment.
        let t1 = Instant::now();
        while seg.peer_status(1) != PeerStatus::Failed {
            assert!(t1.elapsed() < Duration::from_secs(10), "the zombie rank counts as alive");
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: signal 0 sends nothing: the zombie, not reaped yet, still answers.
        assert_eq!(unsafe { libc::kill(pid as i32, 0) }, 0, "a zombie answers kill(pid, 0)");
        child.wait().unwrap();
    }

    #[test]
    fn cleanup_removes_dead_jobs_only() {
        let dead_job = unique_job("stale");
        let live_job = unique_job("live");
        let _c1 = Cleanup(dead_job.clone());
        let _c2 = Cleanup(live_job.clone());
        {
            let seg = JobSegment::create(&dead_job, layout(2)).unwrap();
            // Pretend a dead process created it and ran its ranks.
            // SAFETY: header page of our own mapping; no concurrent readers of this field.
            unsafe { std::ptr::addr_of_mut!((*seg.seg.ptr().cast::<Header>()).creator_pid).write(dead_pid()) };
            seg.claim_rank(0, dead_pid(), node_id(), 0).unwrap();
            let _extra = ShmSegment::create(&format!("gpulmt-{dead_job}-x"), 4096).unwrap();
        }
        let _live = JobSegment::create(&live_job, layout(2)).unwrap();
        let rank1 = JobSegment::open(&live_job, Duration::ZERO).unwrap();
        rank1.claim_rank(1, dead_pid(), node_id(), 0).unwrap();
        drop(rank1); // rank 1 died, but the creator (us) still holds the segment
        let _extra = ShmSegment::create(&format!("gpulmt-{live_job}-x"), 4096).unwrap();

        assert!(cleanup_stale_jobs(Evidence::Locks) >= 2);
        let exists = |n: String| Path::new(SHM_DIR).join(n).exists();
        assert!(!exists(format!("gpulmt-{dead_job}")));
        assert!(!exists(format!("gpulmt-{dead_job}-x")));
        assert!(exists(format!("gpulmt-{live_job}")));
        assert!(exists(format!("gpulmt-{live_job}-x")));
    }

    /// A segment larger than /dev/shm fails its creation, saying how much it needs and
    /// how to get it, instead of being made sparse (and killing ranks with SIGBUS later).
    #[test]
    fn a_segment_larger_than_dev_shm_is_refused_at_creation() {
        let huge = JobLayout { nranks: 64, ring_slots: 16, slot_size: 128, chunk_size: 1 << 30, depth: 1 };
        let (size, _) = crate::shm::object::shm_space();
        let needed = huge.total_bytes() as u64;
        if size == 0 || size >= needed {
            eprintln!("SKIPPED: /dev/shm has no size limit below {needed} bytes (size {size})");
            return;
        }
        let job = unique_job("huge");
        let _c = Cleanup(job.clone());
        match JobSegment::create(&job, huge) {
            Err(e @ ShmError::NoSpace { needed: n, .. }) => {
                assert_eq!(n, needed);
                let msg = e.to_string();
                for want in ["--shm-size", "remount", "GPULMT_CHUNK_SIZE", "job segment"] {
                    assert!(msg.contains(want), "{want:?} missing from: {msg}");
                }
            }
            other => panic!("a {needed}-byte segment on a {size}-byte /dev/shm: {other:?}"),
        }
        assert!(!Path::new(SHM_DIR).join(segment_name(&job)).exists(), "the failed segment was left");
    }

    #[test]
    fn node_id_is_stable() {
        assert_eq!(node_id(), node_id());
        assert_ne!(node_id(), 0);
    }
}
