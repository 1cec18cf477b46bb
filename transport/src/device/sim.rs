//! The `sim` device backend: lets the whole transport run on machines without a GPU
//! (CI, laptops) while behaving like the CUDA driver wherever the layers above depend
//! on it.
//!
//! What it models, and how:
//! - **Device memory** is POSIX shared memory, one named object per allocation
//!   (`/dev/shm/gpulmt-sim-<pid>-<nonce>-<buffer id>`), so that another process can map
//!   it from an exported handle exactly as `cuIpcOpenMemHandle` maps a peer's
//!   allocation. The first 4096 bytes of each object are a [`Header`] that lets the
//!   opener verify the handle and lets the owner count the peers that map it.
//! - **IPC rules** of the real driver are enforced because the handle cache above
//!   relies on them: a handle cannot be opened twice in one process
//!   ([`DeviceError::DoubleOpen`]), a process cannot open its own handle, a forged or
//!   stale handle fails with [`DeviceError::BadHandle`], opening needs peer access
//!   between the devices, and freeing an allocation a peer still maps is reported
//!   ([`DeviceError::FreedWhileMapped`]) although, as in CUDA, the peer's pages stay alive.
//! - **Copy engines**: one thread per device, started on first use, runs its copies
//!   strictly one after another, so copies queued on one engine really contend.
//! - **Topology**: which device pairs have peer access is configurable
//!   ([`PeerMatrix`]), and so is the cost of opening a handle (the real one is ~930 us),
//!   so protocol selection and the handle cache can be exercised as on real nodes.
//!
//! "Same process" for the IPC rules means *same backend instance*: the guard keys on
//! (pid, nonce) and every [`SimBackend`] draws its own nonce. Two instances in one
//! process therefore behave like two processes, which is what the in-process tests
//! (and single-process multi-rank test harnesses) use.
//!
//! Configuration comes from the environment ([`SimConfig::from_env`]):
//! `GPULMT_SIM_DEVICES` (default 2), `GPULMT_SIM_PEER` (`all` | `none` | `0-1,2-3`,
//! default `all`), `GPULMT_SIM_IPC_OPEN_US` (default 0) and `GPULMT_SIM_COPY` (`thread`,
//! the default, or `inline`: copies made inside `copy_async`, to measure host paths;
//! `inline:NS` also reports each copy finished only NS ns after its issue, so the host
//! paths overlap a copy as they do on a GPU) and `GPULMT_SIM_DRIVER_NS`
//! (`ISSUE,DONE,NOT_READY`: CPU time a copy's issue and a poll's answers spin for, as
//! the CUDA driver's calls take; unset: none).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use crate::shm::object::{ShmError, ShmSegment, SIM_PREFIX};

use super::{
    BackendKind, CopyTicket, DevId, DeviceBackend, DeviceError, FinishedThrough, IpcHandle, Mapping, MemoryKind,
    PointerInfo, IPC_HANDLE_BYTES,
};

/// Environment variable: number of simulated devices.
pub const ENV_DEVICES: &str = "GPULMT_SIM_DEVICES";
/// Environment variable: peer-access topology (`all`, `none` or pairs like `0-1,2-3`).
pub const ENV_PEER: &str = "GPULMT_SIM_PEER";
/// Environment variable: time in microseconds that opening an IPC handle takes.
pub const ENV_IPC_OPEN_US: &str = "GPULMT_SIM_IPC_OPEN_US";
/// Environment variable: `thread` (default; each device's copies run on its engine
/// thread), `inline` (each copy is made inside `copy_async`) or `inline:NS` (made there,
/// and seen finished NS nanoseconds after its issue).
pub const ENV_COPY: &str = "GPULMT_SIM_COPY";
/// Environment variable: `ISSUE,DONE,NOT_READY` nanoseconds of CPU that starting a copy,
/// a poll answering "done" and one answering "not yet" spin for.
pub const ENV_DRIVER_NS: &str = "GPULMT_SIM_DRIVER_NS";

/// Upper bound on `GPULMT_SIM_DEVICES`: far beyond any real node, low enough that a
/// typo (an extra digit) is caught rather than silently accepted.
pub const MAX_SIM_DEVICES: u32 = 1024;

/// Size of the header page in front of each allocation's data.
const HEADER_BYTES: usize = 4096;
/// Allocation sizes are rounded up to this, as the driver rounds to its granularity.
const ALLOC_GRANULARITY: usize = 4096;

/// Magic of the header page ("GLMTSIMA").
const HEADER_MAGIC: u64 = u64::from_le_bytes(*b"GLMTSIMA");
/// Magic of an exported handle ("GLMTSIMH"); differs from the header's so that a
/// header page mistaken for a handle (or the reverse) is caught.
const HANDLE_MAGIC: u64 = u64::from_le_bytes(*b"GLMTSIMH");
/// Version of the handle layout; bump when [`HandleFields`] changes.
const HANDLE_VERSION: u32 = 1;

/// CUDA's `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`, reported when a handle is opened on a
/// device without peer access to the owner's device, so logs read as on real nodes.
const CUDA_ERROR_PEER_ACCESS_UNSUPPORTED: i64 = 217;
/// CUDA's `CUDA_ERROR_INVALID_HANDLE`, for polling a ticket that does not exist.
const CUDA_ERROR_INVALID_HANDLE: i64 = 400;
/// CUDA's `CUDA_ERROR_OUT_OF_MEMORY`, for sizes that cannot be represented.
const CUDA_ERROR_OUT_OF_MEMORY: i64 = 2;

/// Buffer ids are unique for the lifetime of the process, across backend instances,
/// so a recycled address (or a second instance) never aliases an old id.
static NEXT_BUFFER_ID: AtomicU64 = AtomicU64::new(1);

// ---------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------

/// Which pairs of distinct devices have peer access. A device always reaches itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerMatrix {
    /// Every pair of devices is peer-accessible (an NVLink/NVSwitch node).
    All,
    /// No two distinct devices are (e.g. GPUs behind different PCIe root complexes).
    NoPeers,
    /// Exactly these symmetric pairs are; each stored as `(min, max)`.
    Pairs(Vec<(DevId, DevId)>),
}

/// Renders the form `GPULMT_SIM_PEER` accepts, so messages quote it back as written.
impl std::fmt::Display for PeerMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerMatrix::All => f.write_str("all"),
            PeerMatrix::NoPeers => f.write_str("none"),
            PeerMatrix::Pairs(pairs) => {
                for (i, (a, b)) in pairs.iter().enumerate() {
                    write!(f, "{}{a}-{b}", if i > 0 { "," } else { "" })?;
                }
                Ok(())
            }
        }
    }
}

impl PeerMatrix {
    /// Parses `all`, `none` or a comma-separated list of pairs like `0-1,2-3`
    /// (case-insensitive, blanks around items ignored). The error text names the
    /// accepted forms; the caller prefixes the variable name.
    pub fn parse(text: &str) -> Result<PeerMatrix, String> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("all") {
            return Ok(PeerMatrix::All);
        }
        if t.eq_ignore_ascii_case("none") {
            return Ok(PeerMatrix::NoPeers);
        }
        let mut pairs = Vec::new();
        for item in t.split(',') {
            let item = item.trim();
            let (a, b) = item.split_once('-').ok_or_else(|| format!("item {item:?} is not a pair `A-B`"))?;
            let parse = |s: &str| {
                s.trim().parse::<DevId>().map_err(|_| format!("item {item:?}: {s:?} is not a device ordinal"))
            };
            let (a, b) = (parse(a)?, parse(b)?);
            let pair = (a.min(b), a.max(b));
            if !pairs.contains(&pair) {
                pairs.push(pair);
            }
        }
        Ok(PeerMatrix::Pairs(pairs))
    }

    /// Whether `a` can reach `b` (symmetric; true when `a == b`). Does not check that
    /// the devices exist.
    pub fn allows(&self, a: DevId, b: DevId) -> bool {
        if a == b {
            return true;
        }
        match self {
            PeerMatrix::All => true,
            PeerMatrix::NoPeers => false,
            PeerMatrix::Pairs(pairs) => pairs.contains(&(a.min(b), a.max(b))),
        }
    }
}

/// Configuration of a [`SimBackend`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of simulated devices (at least 1).
    pub devices: u32,
    /// Peer-access topology.
    pub peer: PeerMatrix,
    /// How long [`DeviceBackend::open_handle`] sleeps, in microseconds, to model the
    /// real driver's cost of opening an IPC handle.
    pub ipc_open_us: u64,
    /// Copies made inside `copy_async`, finished when it returns: an engine that takes no
    /// time, so that what a benchmark measures is the host path of the protocols alone
    /// (what gpulmt adds to a copy ping-pong; `copy_pingpong` on the same setting is the
    /// floor). Copies then never overlap the caller's work.
    pub copy_inline: bool,
    /// With `copy_inline`: an inline copy is reported finished only this many nanoseconds
    /// after its issue (its bytes have landed at once), so that the host paths of both
    /// ranks overlap a copy's time as they do on a GPU (an 8 B peer copy is seen done
    /// about 6.5 us after its issue began on 2x H200).
    pub copy_done_ns: u64,
    /// CPU time the driver's copy calls take, modelled by spinning (None: no cost).
    pub driver: Option<DriverCost>,
}

/// CPU time of the driver calls of a copy, in nanoseconds. On 2x H200 (copy_probe):
/// `cuMemcpyAsync` of a peer copy 1560-2000, a query answering "done" 1380-1460 (even for
/// a copy long finished), one answering "not yet" 150. Bandwidth of small messages is
/// bound by these, not by NVLink, so modelling them lets the sim rank policies that
/// spread or save driver calls (a poll the backend answers from what it already knows
/// costs nothing, as in the CUDA backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverCost {
    pub issue_ns: u64,
    pub done_ns: u64,
    pub not_ready_ns: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 2,
            peer: PeerMatrix::All,
            ipc_open_us: 0,
            copy_inline: false,
            copy_done_ns: 0,
            driver: None,
        }
    }
}

impl SimConfig {
    /// Reads `GPULMT_SIM_DEVICES`, `GPULMT_SIM_PEER` and `GPULMT_SIM_IPC_OPEN_US`.
    /// Unset or empty variables take their defaults (2, `all`, 0).
    pub fn from_env() -> Result<SimConfig, DeviceError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `lookup`: lets tests
    /// and launchers parse a child's environment without touching the process's own.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<SimConfig, DeviceError> {
        // An empty value counts as unset: `VAR= cmd` is a common way to clear one.
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let bad = |var: &str, value: &str, accepted: &str| DeviceError::Unavailable {
            reason: format!("sim backend: {var}={value:?} is invalid: expected {accepted}"),
        };
        let mut cfg = SimConfig::default();
        if let Some(v) = get(ENV_DEVICES) {
            cfg.devices =
                v.trim().parse::<u32>().ok().filter(|n| (1..=MAX_SIM_DEVICES).contains(n)).ok_or_else(|| {
                    bad(ENV_DEVICES, &v, &format!("an integer from 1 to {MAX_SIM_DEVICES} (default 2)"))
                })?;
        }
        if let Some(v) = get(ENV_PEER) {
            cfg.peer = PeerMatrix::parse(&v).map_err(|why| {
                bad(
                    ENV_PEER,
                    &v,
                    &format!("`all` (default), `none`, or comma-separated device pairs like `0-1,2-3` ({why})"),
                )
            })?;
        }
        if let Some(v) = get(ENV_IPC_OPEN_US) {
            cfg.ipc_open_us = v
                .trim()
                .parse::<u64>()
                .map_err(|_| bad(ENV_IPC_OPEN_US, &v, "a whole number of microseconds, e.g. 930 (default 0)"))?;
        }
        if let Some(v) = get(ENV_COPY) {
            let accepted =
                "`thread` (default), `inline` or `inline:NS` (NS: nanoseconds from a copy's issue to its completion)";
            (cfg.copy_inline, cfg.copy_done_ns) = match v.trim() {
                "thread" => (false, 0),
                "inline" => (true, 0),
                other => match other.strip_prefix("inline:").map(|ns| ns.trim().parse::<u64>()) {
                    Some(Ok(ns)) => (true, ns),
                    _ => return Err(bad(ENV_COPY, &v, accepted)),
                },
            };
        }
        if let Some(v) = get(ENV_DRIVER_NS) {
            let ns: Vec<Option<u64>> = v.split(',').map(|x| x.trim().parse().ok()).collect();
            cfg.driver = match ns[..] {
                [Some(issue_ns), Some(done_ns), Some(not_ready_ns)] => {
                    Some(DriverCost { issue_ns, done_ns, not_ready_ns })
                }
                _ => {
                    return Err(bad(
                        ENV_DRIVER_NS,
                        &v,
                        "three whole numbers of nanoseconds `ISSUE,DONE,NOT_READY`, e.g. 1600,1400,150",
                    ))
                }
            };
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the device count and that every peer pair names existing devices.
    pub fn validate(&self) -> Result<(), DeviceError> {
        if !(1..=MAX_SIM_DEVICES).contains(&self.devices) {
            return Err(DeviceError::Unavailable {
                reason: format!(
                    "sim backend: {ENV_DEVICES}={} is invalid: expected an integer from 1 to {MAX_SIM_DEVICES}",
                    self.devices
                ),
            });
        }
        if let PeerMatrix::Pairs(pairs) = &self.peer {
            if let Some(&(a, b)) = pairs.iter().find(|&&(a, b)| a.max(b) >= self.devices) {
                return Err(DeviceError::Unavailable {
                    reason: format!(
                        "sim backend: {ENV_PEER} names pair {a}-{b} but only devices 0..{} exist ({ENV_DEVICES}={}); expected `all`, `none`, or pairs like `0-1,2-3` of existing devices",
                        self.devices, self.devices
                    ),
                });
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Shared-memory layout: header page and handle
// ---------------------------------------------------------------------------------

/// The first bytes of every allocation's shared-memory object. The plain fields are
/// written once by the owner before the handle can be exported, so openers read them
/// without synchronisation; the atomics are shared between processes (atomics on a
/// MAP_SHARED mapping are coherent across processes on every platform we run on).
#[repr(C)]
struct Header {
    magic: u64,
    owner_pid: u32,
    device: u32,
    buffer_id: u64,
    /// Data size as allocated (the caller's size, at least 1).
    size: u64,
    /// Number of other processes (backend instances) that have it open.
    mappers: AtomicU32,
    /// Set to 1 by the owner when it frees the allocation.
    freed: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// The fields of an exported handle, little-endian in its 64 bytes:
/// `[0..8)` magic, `[8..12)` version, `[12..16)` owner pid, `[16..24)` nonce,
/// `[24..32)` buffer id, `[32..40)` size, `[40..44)` device, rest zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HandleFields {
    owner_pid: u32,
    nonce: u64,
    buffer_id: u64,
    size: u64,
    device: DevId,
}

impl HandleFields {
    fn encode(&self) -> IpcHandle {
        let mut b = [0u8; IPC_HANDLE_BYTES];
        b[0..8].copy_from_slice(&HANDLE_MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&HANDLE_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.owner_pid.to_le_bytes());
        b[16..24].copy_from_slice(&self.nonce.to_le_bytes());
        b[24..32].copy_from_slice(&self.buffer_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        b[40..44].copy_from_slice(&self.device.to_le_bytes());
        IpcHandle(b)
    }

    fn decode(h: &IpcHandle) -> Result<HandleFields, DeviceError> {
        let b = &h.0;
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        if u64_at(0) != HANDLE_MAGIC {
            return Err(bad_handle("bad magic: not a handle exported by the sim backend (a CUDA handle, or corrupt)"));
        }
        let version = u32_at(8);
        if version != HANDLE_VERSION {
            return Err(bad_handle(format!(
                "handle version {version}, this build understands {HANDLE_VERSION} (peers built from different gpulmt versions?)"
            )));
        }
        if b[44..].iter().any(|&x| x != 0) {
            return Err(bad_handle("reserved bytes are not zero (corrupt handle)"));
        }
        let f = HandleFields {
            owner_pid: u32_at(12),
            nonce: u64_at(16),
            buffer_id: u64_at(24),
            size: u64_at(32),
            device: u32_at(40),
        };
        if f.buffer_id == 0 || f.size == 0 || f.owner_pid == 0 {
            return Err(bad_handle("zero owner pid, buffer id or size (corrupt handle)"));
        }
        Ok(f)
    }
}

/// Name of an allocation's shared-memory object (the file name under `/dev/shm`).
fn shm_name(pid: u32, nonce: u64, buffer_id: u64) -> String {
    format!("{SIM_PREFIX}{pid}-{nonce:016x}-{buffer_id}")
}

/// Bytes of the whole object (header page + data rounded up) for a data size; None when
/// no object can be that large (it must fit `off_t`).
fn object_len(size: usize) -> Option<usize> {
    let data = size.max(1).checked_add(ALLOC_GRANULARITY - 1)? / ALLOC_GRANULARITY * ALLOC_GRANULARITY;
    data.checked_add(HEADER_BYTES).filter(|&len| libc::off_t::try_from(len).is_ok())
}

fn bad_handle(reason: impl Into<String>) -> DeviceError {
    DeviceError::BadHandle { reason: reason.into() }
}

/// A failure of the shared-memory layer as a [`DeviceError::Driver`] naming the libc call
/// (and its errno) where there is one.
fn shm_error(e: ShmError) -> DeviceError {
    let call = match &e {
        ShmError::Os { call, .. } => call,
        _ => "shm",
    };
    DeviceError::Driver { call, code: e.raw_os_error().unwrap_or(0) as i64, message: e.to_string() }
}

/// Removes an allocation's object name; unlike cleanup paths, a name already gone is an
/// error here: only this instance removes its own names while it lives.
fn unlink(name: &str) -> Result<(), DeviceError> {
    match ShmSegment::unlink(name) {
        Ok(true) => Ok(()),
        Ok(false) => Err(DeviceError::Driver {
            call: "shm_unlink",
            code: libc::ENOENT as i64,
            message: format!("removing /{name}: it was removed by someone else (gpulmt-run --cleanup?)"),
        }),
        Err(e) => Err(shm_error(e)),
    }
}

/// The header page of one of this backend's objects.
fn header(map: &ShmSegment) -> &Header {
    assert!(map.len() >= HEADER_BYTES, "a sim object is shorter than its header page");
    // SAFETY: the mapping is page-aligned (so aligned for Header), at least HEADER_BYTES
    // long (checked above) and stays mapped while `map` is borrowed. Its plain fields are
    // written once by the owner before the handle is exported; the rest are atomics.
    unsafe { &*map.ptr().cast::<Header>() }
}

/// A per-instance random nonce, so that object names never collide between backends
/// (or with leftovers of a dead process whose pid was recycled). `RandomState` is
/// seeded from the OS's randomness; the counter and clock make instances differ even
/// if it were not.
fn fresh_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    h.write_u128(now);
    h.finish()
}

/// Decrements a header's `mappers` without wrapping: a count corrupted by a crashed
/// peer must not turn into 4 billion phantom mappers.
fn release_mapper(h: &Header, buffer_id: u64) {
    if h.mappers.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_err() {
        warn!(buffer_id, "sim: mapper count of a peer allocation was already 0");
    }
}

// ---------------------------------------------------------------------------------
// Registry
// ---------------------------------------------------------------------------------

/// Identifies one allocation of one backend instance across the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct OpenKey {
    owner_pid: u32,
    nonce: u64,
    buffer_id: u64,
}

#[derive(Debug)]
struct LocalAlloc {
    dev: DevId,
    size: usize,
    buffer_id: u64,
    /// The whole object: header page, then the data.
    map: ShmSegment,
}

#[derive(Debug)]
struct PeerMap {
    key: OpenKey,
    owner_dev: DevId,
    size: usize,
    /// The whole object: header page, then the data.
    map: ShmSegment,
}

#[derive(Debug)]
enum Region {
    Local(LocalAlloc),
    Peer(PeerMap),
}

impl Region {
    fn size(&self) -> usize {
        match self {
            Region::Local(l) => l.size,
            Region::Peer(p) => p.size,
        }
    }
}

#[derive(Default)]
struct State {
    /// Local allocations and peer mappings, keyed by the address of their data.
    regions: BTreeMap<usize, Region>,
    /// Handles open (or being opened) in this instance; reserved before the slow part
    /// of `open_handle` so two threads opening one handle cannot both succeed.
    open_keys: HashSet<OpenKey>,
    /// Registered host ranges: start -> length.
    host: BTreeMap<usize, usize>,
}

impl State {
    /// The region holding `ptr`, with its data address.
    fn find(&self, ptr: usize) -> Option<(usize, &Region)> {
        let (&base, r) = self.regions.range(..=ptr).next_back()?;
        (ptr - base < r.size()).then_some((base, r))
    }

    /// Fails if `[ptr, ptr+len)` starts inside device memory but runs past its end:
    /// the driver faults on such a copy, and silently overrunning into the next page
    /// of shared memory would hide the bug.
    fn check_range(&self, op: &'static str, ptr: usize, len: usize) -> Result<(), DeviceError> {
        if ptr == 0 {
            return Err(DeviceError::InvalidPointer { op, ptr, expected: "a non-null address" });
        }
        if let Some((base, r)) = self.find(ptr) {
            if len > r.size() - (ptr - base) {
                return Err(DeviceError::InvalidPointer {
                    op,
                    ptr,
                    expected: "the start of a range that ends inside its device allocation",
                });
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------
// Copy engines
// ---------------------------------------------------------------------------------

struct CopyJob {
    dst: usize,
    src: usize,
    len: usize,
    done: Arc<AtomicBool>,
}

struct Engine {
    tx: mpsc::Sender<CopyJob>,
    thread: JoinHandle<()>,
}

fn engine_main(rx: mpsc::Receiver<CopyJob>) {
    // Ends when the backend drops the sender, after draining what was queued, so a
    // dropped backend never leaves a copy half done.
    for job in rx {
        // SAFETY: copy_async's caller guarantees, as with cuMemcpyAsync, that both
        // ranges stay valid until the copy is observed complete. `copy` handles overlap.
        unsafe { std::ptr::copy(job.src as *const u8, job.dst as *mut u8, job.len) };
        // Release: publishes the bytes just written to whoever Acquire-loads the flag
        // in copy_poll, so a completed poll implies the data is visible.
        job.done.store(true, Ordering::Release);
    }
}

// ---------------------------------------------------------------------------------
// The backend
// ---------------------------------------------------------------------------------

/// The simulated device backend. See the module documentation.
pub struct SimBackend {
    cfg: SimConfig,
    pid: u32,
    nonce: u64,
    state: Mutex<State>,
    /// One copy engine per device, started on first use.
    engines: Vec<Mutex<Option<Engine>>>,
    next_ticket: AtomicU64,
    /// Copies in flight: their done flag, and for inline copies with a completion time
    /// (`copy_done_ns`), when they may be seen finished.
    tickets: Mutex<Tickets>,
}

/// A copy in flight.
struct SimTicket {
    done: Arc<AtomicBool>,
    /// For inline copies with `copy_done_ns`: when it may be seen finished.
    seen_at: Option<Instant>,
    engine: DevId,
}

#[derive(Default)]
struct Tickets {
    pending: std::collections::HashMap<u64, SimTicket>,
    /// Per engine (one in-order queue each): how far polls have seen it finished, so
    /// that the driver cost model charges nothing for what a poll already knows.
    finished: FinishedThrough<DevId>,
}

/// Spins for `ns` nanoseconds: the CPU time a driver call takes.
fn spin_ns(ns: u64) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_nanos(ns) {
        std::hint::spin_loop();
    }
}

// The backend is shared between the progress engine and user threads.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SimBackend>();
};

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend")
            .field("cfg", &self.cfg)
            .field("pid", &self.pid)
            .field("nonce", &format_args!("{:016x}", self.nonce))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere must not make every later call panic too: the state is kept
    // consistent at each unlock, so the poisoned value is still usable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SimBackend {
    /// A backend configured from `GPULMT_SIM_*` (see [`SimConfig::from_env`]).
    pub fn from_env() -> Result<SimBackend, DeviceError> {
        Self::new(SimConfig::from_env()?)
    }

    /// A backend with the given configuration; fails with [`DeviceError::Unavailable`]
    /// if it is inconsistent (no devices, or a peer pair naming a missing device).
    pub fn new(cfg: SimConfig) -> Result<SimBackend, DeviceError> {
        cfg.validate()?;
        let engines = (0..cfg.devices).map(|_| Mutex::new(None)).collect();
        let nonce = fresh_nonce();
        debug!(devices = cfg.devices, peer = ?cfg.peer, ipc_open_us = cfg.ipc_open_us, nonce = format_args!("{nonce:016x}"), "sim backend up");
        Ok(SimBackend {
            cfg,
            pid: std::process::id(),
            nonce,
            state: Mutex::new(State::default()),
            engines,
            next_ticket: AtomicU64::new(1),
            tickets: Mutex::new(Default::default()),
        })
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    fn check_dev(&self, dev: DevId) -> Result<(), DeviceError> {
        if dev >= self.cfg.devices {
            return Err(DeviceError::NoSuchDevice { dev, count: self.cfg.devices });
        }
        Ok(())
    }

    /// The sender of `dev`'s engine, starting its thread on first use.
    fn engine_sender(&self, dev: DevId) -> Result<mpsc::Sender<CopyJob>, DeviceError> {
        let mut slot = lock(&self.engines[dev as usize]);
        if let Some(e) = slot.as_ref() {
            return Ok(e.tx.clone());
        }
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("gpulmt-sim-ce{dev}"))
            .spawn(move || {
                // The thread stands for a GPU's copy engine, not for the rank's CPU work: it
                // must not share the one core a launcher may have bound the rank to (ranks
                // busy-poll, and the copies would crawl).
                crate::binding::unbind_this_thread();
                engine_main(rx)
            })
            .map_err(|e| DeviceError::Driver {
                call: "pthread_create",
                code: e.raw_os_error().unwrap_or(0) as i64,
                message: format!("starting the copy engine thread of sim device {dev}: {e}"),
            })?;
        *slot = Some(Engine { tx: tx.clone(), thread });
        Ok(tx)
    }

    /// Releases a local allocation already removed from the registry. Returns the
    /// number of peers that still mapped it, or the first libc error.
    fn release_local(l: LocalAlloc) -> Result<u32, DeviceError> {
        let h = header(&l.map);
        // SeqCst store-then-load, mirrored by open_handle's add-then-load: at least
        // one side sees the other, so a peer cannot slip in unnoticed between the
        // check and the unlink (at worst both back off, which is safe).
        h.freed.store(1, Ordering::SeqCst);
        let mappers = h.mappers.load(Ordering::SeqCst);
        // Unlink even if unmapping fails: the name must not outlive the allocation.
        let unlinked = unlink(l.map.name());
        let unmapped = l.map.unmap().map_err(shm_error);
        unmapped.and(unlinked)?;
        Ok(mappers)
    }
}

impl DeviceBackend for SimBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Sim
    }

    fn device_count(&self) -> u32 {
        self.cfg.devices
    }

    fn can_access_peer(&self, from: DevId, to: DevId) -> bool {
        from < self.cfg.devices && to < self.cfg.devices && self.cfg.peer.allows(from, to)
    }

    fn alloc(&self, dev: DevId, bytes: usize) -> Result<usize, DeviceError> {
        self.check_dev(dev)?;
        let size = bytes.max(1);
        let map_len = object_len(size).ok_or_else(|| DeviceError::Driver {
            call: "alloc",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            message: format!("{bytes} bytes cannot be allocated"),
        })?;
        let buffer_id = NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed);
        let name = shm_name(self.pid, self.nonce, buffer_id);
        // Pages reserved now: a full /dev/shm must fail here, like cuMemAlloc returning
        // out-of-memory, not as a SIGBUS on first touch deep in a copy.
        let map = ShmSegment::create_reserved(&name, map_len).map_err(shm_error)?;
        // SAFETY: the mapping is fresh, page-aligned and at least HEADER_BYTES long;
        // nobody else can know its name before export, so a plain write is race-free.
        unsafe {
            std::ptr::write(
                map.ptr().cast::<Header>(),
                Header {
                    magic: HEADER_MAGIC,
                    owner_pid: self.pid,
                    device: dev,
                    buffer_id,
                    size: size as u64,
                    mappers: AtomicU32::new(0),
                    freed: AtomicU32::new(0),
                },
            )
        };
        let data = map.ptr() as usize + HEADER_BYTES;
        lock(&self.state).regions.insert(data, Region::Local(LocalAlloc { dev, size, buffer_id, map }));
        debug!(dev, bytes, buffer_id, ptr = format_args!("{data:#x}"), "sim: alloc");
        Ok(data)
    }

    fn free(&self, ptr: usize) -> Result<(), DeviceError> {
        let local = {
            let mut st = lock(&self.state);
            match st.regions.get(&ptr) {
                Some(Region::Local(_)) => match st.regions.remove(&ptr) {
                    Some(Region::Local(l)) => l,
                    _ => unreachable!("checked just above under the same lock"),
                },
                _ => {
                    return Err(DeviceError::InvalidPointer {
                        op: "free",
                        ptr,
                        expected: "the start of a device allocation of this process",
                    })
                }
            }
        };
        let buffer_id = local.buffer_id;
        let mappers = Self::release_local(local)?;
        debug!(buffer_id, ptr = format_args!("{ptr:#x}"), "sim: free");
        if mappers > 0 {
            warn!(
                buffer_id,
                ptr = format_args!("{ptr:#x}"),
                mappers,
                "sim: allocation freed while peers still map it (their pages stay alive, as with CUDA)"
            );
            return Err(DeviceError::FreedWhileMapped { ptr, buffer_id, mappers });
        }
        Ok(())
    }

    fn pointer_info(&self, ptr: usize) -> Result<PointerInfo, DeviceError> {
        let st = lock(&self.state);
        Ok(match st.find(ptr) {
            Some((base, Region::Local(l))) => {
                PointerInfo { kind: MemoryKind::Device(l.dev), base, size: l.size, buffer_id: l.buffer_id }
            }
            Some((base, Region::Peer(p))) => {
                PointerInfo { kind: MemoryKind::Device(p.owner_dev), base, size: p.size, buffer_id: p.key.buffer_id }
            }
            None => PointerInfo { kind: MemoryKind::Host, base: ptr, size: 0, buffer_id: 0 },
        })
    }

    fn export_handle(&self, base: usize) -> Result<IpcHandle, DeviceError> {
        let st = lock(&self.state);
        match st.regions.get(&base) {
            Some(Region::Local(l)) => Ok(HandleFields {
                owner_pid: self.pid,
                nonce: self.nonce,
                buffer_id: l.buffer_id,
                size: l.size as u64,
                device: l.dev,
            }
            .encode()),
            _ => Err(DeviceError::InvalidPointer {
                op: "export_handle",
                ptr: base,
                expected: "the start of a device allocation of this process",
            }),
        }
    }

    fn open_handle(&self, handle: &IpcHandle, on: DevId) -> Result<Mapping, DeviceError> {
        let f = HandleFields::decode(handle)?;
        if f.owner_pid == self.pid && f.nonce == self.nonce {
            return Err(bad_handle(format!(
                "buffer {} was exported by this process; CUDA cannot open its own handles, use the allocation directly",
                f.buffer_id
            )));
        }
        self.check_dev(on)?;
        let size = usize::try_from(f.size).map_err(|_| bad_handle("size does not fit this machine"))?;
        let map_len = object_len(size).ok_or_else(|| bad_handle("size too large (corrupt handle)"))?;
        let key = OpenKey { owner_pid: f.owner_pid, nonce: f.nonce, buffer_id: f.buffer_id };

        // Reserve the key before the slow part, so a concurrent second open fails
        // instead of both mapping it; released again if the open fails.
        if !lock(&self.state).open_keys.insert(key) {
            return Err(DeviceError::DoubleOpen { owner: f.owner_pid, buffer_id: f.buffer_id });
        }
        struct Reservation<'a> {
            st: &'a Mutex<State>,
            key: OpenKey,
        }
        impl Drop for Reservation<'_> {
            fn drop(&mut self) {
                lock(self.st).open_keys.remove(&self.key);
            }
        }
        let reservation = Reservation { st: &self.state, key };

        let name = shm_name(f.owner_pid, f.nonce, f.buffer_id);
        // Mapped at the object's own length, never more, so a forged size cannot turn into
        // a SIGBUS on first touch; the length is checked against the handle's just after.
        let map = match ShmSegment::open(&name) {
            Ok(map) => map,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(bad_handle(format!(
                    "buffer {} of pid {}: no object /{name}: the owner freed it or exited",
                    f.buffer_id, f.owner_pid
                )));
            }
            Err(ShmError::Empty { .. }) => {
                return Err(bad_handle(format!(
                    "/{name} is empty: not an allocation (forged handle, or its owner died making it)"
                )));
            }
            Err(e) => return Err(shm_error(e)),
        };
        if map.len() != map_len {
            return Err(bad_handle(format!(
                "/{name} holds {} bytes but the handle's size {} needs {map_len} (forged or corrupt handle)",
                map.len(),
                f.size
            )));
        }
        let h = header(&map);
        let (magic, owner_pid, device, buffer_id, hsize) = (h.magic, h.owner_pid, h.device, h.buffer_id, h.size);
        if magic != HEADER_MAGIC
            || owner_pid != f.owner_pid
            || buffer_id != f.buffer_id
            || hsize != f.size
            || device != f.device
        {
            return Err(bad_handle(format!(
                "/{name} does not match the handle (header: pid {owner_pid}, device {device}, buffer {buffer_id}, size {hsize}; handle: pid {}, device {}, buffer {}, size {}): forged or corrupt handle",
                f.owner_pid, f.device, f.buffer_id, f.size
            )));
        }
        if h.freed.load(Ordering::SeqCst) != 0 {
            return Err(bad_handle(format!("buffer {} of pid {}: the owner freed it", f.buffer_id, f.owner_pid)));
        }
        if !self.can_access_peer(on, f.device) {
            return Err(DeviceError::Driver {
                call: "cuIpcOpenMemHandle",
                code: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
                message: format!(
                    "peer access unavailable: device {on} cannot reach device {} of pid {} ({ENV_PEER}={})",
                    f.device, f.owner_pid, self.cfg.peer
                ),
            });
        }
        // Pairs with release_local's store-then-load (see there).
        h.mappers.fetch_add(1, Ordering::SeqCst);
        if h.freed.load(Ordering::SeqCst) != 0 {
            release_mapper(h, f.buffer_id);
            return Err(bad_handle(format!("buffer {} of pid {}: the owner freed it", f.buffer_id, f.owner_pid)));
        }
        if self.cfg.ipc_open_us > 0 {
            std::thread::sleep(Duration::from_micros(self.cfg.ipc_open_us));
        }
        let data = map.ptr() as usize + HEADER_BYTES;
        lock(&self.state).regions.insert(data, Region::Peer(PeerMap { key, owner_dev: f.device, size, map }));
        // The key stays reserved until close_handle.
        std::mem::forget(reservation);
        debug!(owner = f.owner_pid, buffer_id = f.buffer_id, on, ptr = format_args!("{data:#x}"), "sim: open_handle");
        Ok(Mapping { ptr: data, size })
    }

    fn close_handle(&self, mapping: Mapping) -> Result<(), DeviceError> {
        let peer = {
            let mut st = lock(&self.state);
            match st.regions.get(&mapping.ptr) {
                Some(Region::Peer(p)) if p.size == mapping.size => {}
                _ => {
                    return Err(DeviceError::InvalidPointer {
                        op: "close_handle",
                        ptr: mapping.ptr,
                        expected: "a mapping returned by open_handle and not yet closed",
                    })
                }
            }
            let Some(Region::Peer(p)) = st.regions.remove(&mapping.ptr) else {
                unreachable!("checked just above under the same lock")
            };
            st.open_keys.remove(&p.key);
            p
        };
        release_mapper(header(&peer.map), peer.key.buffer_id);
        let (owner, buffer_id) = (peer.key.owner_pid, peer.key.buffer_id);
        peer.map.unmap().map_err(shm_error)?;
        debug!(owner, buffer_id, "sim: close_handle");
        Ok(())
    }

    fn copy_async(
        &self,
        engine: DevId,
        _lane: u32,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<CopyTicket, DeviceError> {
        self.check_dev(engine)?;
        let done = Arc::new(AtomicBool::new(false));
        if len == 0 {
            done.store(true, Ordering::Relaxed);
        } else {
            {
                let st = lock(&self.state);
                st.check_range("copy_async", dst, len)?;
                st.check_range("copy_async", src, len)?;
            }
            if let Some(d) = self.cfg.driver {
                spin_ns(d.issue_ns);
            }
            if self.cfg.copy_inline {
                // SAFETY: as in engine_main; the caller keeps both ranges valid until the
                // copy is observed complete, which here is at once.
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
                done.store(true, Ordering::Release);
                let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
                let seen_at =
                    (self.cfg.copy_done_ns > 0).then(|| Instant::now() + Duration::from_nanos(self.cfg.copy_done_ns));
                lock(&self.tickets).pending.insert(id, SimTicket { done, seen_at, engine });
                return Ok(CopyTicket(id));
            }
            // Lanes are accepted and ignored: one FIFO per device keeps each lane's
            // order trivially and serialises lanes, which the trait allows (lanes *may*
            // run concurrently) and which makes contention on one engine visible.
            let job = CopyJob { dst, src, len, done: done.clone() };
            self.engine_sender(engine)?.send(job).map_err(|_| DeviceError::Driver {
                call: "copy_async",
                code: 0,
                message: format!("copy engine thread of sim device {engine} has stopped"),
            })?;
        }
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        lock(&self.tickets).pending.insert(id, SimTicket { done, seen_at: None, engine });
        Ok(CopyTicket(id))
    }

    fn copy_poll(&self, ticket: CopyTicket) -> Result<bool, DeviceError> {
        let mut tickets = lock(&self.tickets);
        let Some(t) = tickets.pending.get(&ticket.0) else {
            return Err(DeviceError::Driver {
                call: "copy_poll",
                code: CUDA_ERROR_INVALID_HANDLE,
                message: format!("unknown copy ticket {} (never issued, or already reported done)", ticket.0),
            });
        };
        // Acquire: pairs with the engine's Release store, so once this reads true the
        // copied bytes are visible to this thread.
        let finished = t.seen_at.is_none_or(|at| Instant::now() >= at) && t.done.load(Ordering::Acquire);
        // The answer is always the copy's own state; the cost model charges a driver
        // query only where the CUDA backend would make one.
        if let Some(d) = self.cfg.driver {
            let engine = t.engine;
            if !tickets.finished.covers(&engine, ticket.0) {
                spin_ns(if finished { d.done_ns } else { d.not_ready_ns });
                if finished {
                    tickets.finished.saw(engine, ticket.0);
                }
            }
        }
        if finished {
            tickets.pending.remove(&ticket.0);
        }
        Ok(finished)
    }

    fn copy_sync(&self, dst: usize, src: usize, len: usize) -> Result<(), DeviceError> {
        if len == 0 {
            return Ok(());
        }
        {
            let st = lock(&self.state);
            st.check_range("copy_sync", dst, len)?;
            st.check_range("copy_sync", src, len)?;
        }
        // SAFETY: as with cuMemcpy, the caller guarantees both ranges are valid; the
        // ranges inside device memory were checked above. `copy` handles overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
        Ok(())
    }

    fn register_host(&self, ptr: usize, len: usize) -> Result<(), DeviceError> {
        let mut st = lock(&self.state);
        if ptr == 0 || len == 0 {
            return Err(DeviceError::InvalidPointer {
                op: "register_host",
                ptr,
                expected: "a non-null host range of at least one byte",
            });
        }
        // cuMemHostRegister rejects device memory; catching it here keeps CI honest.
        if st.find(ptr).is_some() {
            return Err(DeviceError::InvalidPointer { op: "register_host", ptr, expected: "host memory" });
        }
        let e = st.host.entry(ptr).or_insert(len);
        *e = (*e).max(len);
        Ok(())
    }

    fn unregister_host(&self, ptr: usize) -> Result<(), DeviceError> {
        // As cuMemHostUnregister, unregistering what is not registered is an error.
        match lock(&self.state).host.remove(&ptr) {
            Some(_) => Ok(()),
            None => Err(DeviceError::InvalidPointer {
                op: "unregister_host",
                ptr,
                expected: "the start of a registered host range",
            }),
        }
    }
}

impl Drop for SimBackend {
    fn drop(&mut self) {
        // Engines first: they drain their queues, and copies may touch the memory
        // released below.
        for slot in &self.engines {
            if let Some(Engine { tx, thread }) = lock(slot).take() {
                drop(tx);
                if thread.join().is_err() {
                    warn!("sim: a copy engine thread panicked");
                }
            }
        }
        let st = std::mem::take(&mut *lock(&self.state));
        for (ptr, region) in st.regions {
            match region {
                Region::Peer(p) => {
                    release_mapper(header(&p.map), p.key.buffer_id);
                    if let Err(e) = p.map.unmap() {
                        warn!(error = %e, "sim: unmapping a peer mapping at shutdown");
                    }
                }
                Region::Local(l) => match (l.buffer_id, Self::release_local(l)) {
                    (_, Ok(0)) => {}
                    (buffer_id, Ok(mappers)) => warn!(
                        buffer_id,
                        ptr = format_args!("{ptr:#x}"),
                        mappers,
                        "sim: allocation released at shutdown while peers still map it"
                    ),
                    (_, Err(e)) => warn!(error = %e, "sim: releasing an allocation at shutdown"),
                },
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn backend(devices: u32, peer: PeerMatrix, ipc_open_us: u64) -> SimBackend {
        SimBackend::new(SimConfig { devices, peer, ipc_open_us, copy_inline: false, copy_done_ns: 0, driver: None })
            .expect("valid config")
    }

    fn two() -> SimBackend {
        backend(2, PeerMatrix::All, 0)
    }

    fn shm_path(b: &SimBackend, buffer_id: u64) -> std::path::PathBuf {
        format!("/dev/shm/{SIM_PREFIX}{}-{:016x}-{buffer_id}", b.pid, b.nonce).into()
    }

    fn fill(b: &SimBackend, ptr: usize, bytes: &[u8]) {
        b.copy_sync(ptr, bytes.as_ptr() as usize, bytes.len()).unwrap();
    }

    fn read(b: &SimBackend, ptr: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        b.copy_sync(v.as_mut_ptr() as usize, ptr, len).unwrap();
        v
    }

    fn wait(b: &SimBackend, t: CopyTicket) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !b.copy_poll(t).unwrap() {
            assert!(Instant::now() < deadline, "copy {t:?} did not complete");
            std::thread::yield_now();
        }
    }

    fn mappers_of(b: &SimBackend, ptr: usize) -> u32 {
        let st = lock(&b.state);
        let Some(Region::Local(l)) = st.regions.get(&ptr) else { panic!("not local") };
        header(&l.map).mappers.load(Ordering::SeqCst)
    }

    #[test]
    fn alloc_free_pointer_info() {
        let b = two();
        let p = b.alloc(1, 10_000).unwrap();
        assert_eq!(p % 4096, 0);
        let info = b.pointer_info(p + 9_999).unwrap();
        assert_eq!(info.kind, MemoryKind::Device(1));
        assert_eq!((info.base, info.size), (p, 10_000));
        assert!(info.buffer_id > 0);
        // One past the end, and the header page, are not device memory.
        assert_eq!(b.pointer_info(p + 10_000).unwrap().kind, MemoryKind::Host);
        assert_eq!(b.pointer_info(p - 1).unwrap().kind, MemoryKind::Host);
        let host = 0x1234usize;
        assert_eq!(
            b.pointer_info(host).unwrap(),
            PointerInfo { kind: MemoryKind::Host, base: host, size: 0, buffer_id: 0 }
        );
        // The object exists with mode 0600 and the rounded size.
        let path = shm_path(&b, info.buffer_id);
        let md = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(md.permissions().mode() & 0o777, 0o600);
        assert_eq!(md.len(), 4096 + 12_288);

        // Only an allocation's base can be freed, and only once.
        assert!(matches!(b.free(p + 1), Err(DeviceError::InvalidPointer { .. })));
        b.free(p).unwrap();
        assert!(!path.exists(), "free must unlink the object");
        assert!(matches!(b.free(p), Err(DeviceError::InvalidPointer { .. })));
        assert_eq!(b.pointer_info(p).unwrap().kind, MemoryKind::Host);
        assert!(matches!(b.alloc(2, 1), Err(DeviceError::NoSuchDevice { dev: 2, count: 2 })));

        // Zero-size allocations get a byte.
        let z = b.alloc(0, 0).unwrap();
        assert_eq!(b.pointer_info(z).unwrap().size, 1);
        b.free(z).unwrap();
    }

    #[test]
    fn recycled_address_gets_new_buffer_id() {
        let b = two();
        let mut seen = HashSet::new();
        let mut reused = false;
        let mut last: Option<(usize, u64)> = None;
        for _ in 0..64 {
            let p = b.alloc(0, 8192).unwrap();
            let id = b.pointer_info(p).unwrap().buffer_id;
            assert!(seen.insert(id), "buffer id {id} reused");
            if let Some((lp, lid)) = last {
                if lp == p {
                    reused = true;
                    assert_ne!(lid, id);
                }
            }
            last = Some((p, id));
            b.free(p).unwrap();
        }
        // mmap normally hands the hole straight back; if it never did, the id check
        // above still covered every allocation.
        if !reused {
            eprintln!("note: the kernel never recycled an address in this run");
        }
    }

    #[test]
    fn export_open_close_between_instances() {
        let owner = two();
        let peer = two();
        let p = owner.alloc(1, 5000).unwrap();
        let id = owner.pointer_info(p).unwrap().buffer_id;
        fill(&owner, p, &[7u8; 5000]);

        assert!(matches!(owner.export_handle(p + 8), Err(DeviceError::InvalidPointer { .. })));
        let h = owner.export_handle(p).unwrap();
        // A process cannot open its own handle.
        assert!(matches!(owner.open_handle(&h, 0), Err(DeviceError::BadHandle { .. })));

        let m = peer.open_handle(&h, 0).unwrap();
        assert_eq!(m.size, 5000);
        assert_eq!(mappers_of(&owner, p), 1);
        let info = peer.pointer_info(m.ptr + 4999).unwrap();
        assert_eq!(info, PointerInfo { kind: MemoryKind::Device(1), base: m.ptr, size: 5000, buffer_id: id });
        // Shared pages: writes on either side are seen by the other.
        assert_eq!(read(&peer, m.ptr, 5000), vec![7u8; 5000]);
        fill(&peer, m.ptr + 100, b"peer");
        assert_eq!(read(&owner, p + 100, 4), b"peer");

        // The second open of one handle is rejected, as by the CUDA driver.
        assert_eq!(peer.open_handle(&h, 1), Err(DeviceError::DoubleOpen { owner: std::process::id(), buffer_id: id }));
        peer.close_handle(m).unwrap();
        assert_eq!(mappers_of(&owner, p), 0);
        assert_eq!(peer.pointer_info(m.ptr).unwrap().kind, MemoryKind::Host);
        assert!(matches!(peer.close_handle(m), Err(DeviceError::InvalidPointer { .. })));
        // Closed, it can be opened again.
        let m2 = peer.open_handle(&h, 1).unwrap();
        peer.close_handle(m2).unwrap();
        owner.free(p).unwrap();
        // Freed: the handle is dead.
        assert!(matches!(peer.open_handle(&h, 0), Err(DeviceError::BadHandle { .. })));
    }

    #[test]
    fn concurrent_opens_of_one_handle_only_one_wins() {
        let owner = two();
        let peer = Arc::new(backend(2, PeerMatrix::All, 2_000));
        let p = owner.alloc(0, 64).unwrap();
        let h = owner.export_handle(p).unwrap();
        let results: Vec<_> = (0..4)
            .map(|_| {
                let peer = peer.clone();
                std::thread::spawn(move || peer.open_handle(&h, 0))
            })
            .map(|t| t.join().unwrap())
            .collect();
        let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(ok.len(), 1, "{results:?}");
        assert!(results.iter().filter(|r| r.is_err()).all(|r| matches!(r, Err(DeviceError::DoubleOpen { .. }))));
        peer.close_handle(*ok[0]).unwrap();
        owner.free(p).unwrap();
    }

    #[test]
    fn forged_handles_are_rejected() {
        let owner = two();
        let peer = two();
        let p = owner.alloc(0, 100).unwrap();
        let h = owner.export_handle(p).unwrap();
        let f = HandleFields::decode(&h).unwrap();
        let is_bad = |r: Result<Mapping, DeviceError>| matches!(r, Err(DeviceError::BadHandle { .. }));

        let mut magic = h;
        magic.0[0] ^= 0xff;
        assert!(is_bad(peer.open_handle(&magic, 0)));
        let mut version = h;
        version.0[8] = 9;
        assert!(is_bad(peer.open_handle(&version, 0)));
        // Same page count, different size: caught by the header.
        assert!(is_bad(peer.open_handle(&HandleFields { size: 200, ..f }.encode(), 0)));
        // Larger size: caught by the object's length before mapping.
        assert!(is_bad(peer.open_handle(&HandleFields { size: 1 << 20, ..f }.encode(), 0)));
        // Wrong device: caught by the header.
        assert!(is_bad(peer.open_handle(&HandleFields { device: 1, ..f }.encode(), 0)));
        // No such object.
        assert!(is_bad(peer.open_handle(&HandleFields { buffer_id: u64::MAX, ..f }.encode(), 0)));
        assert!(is_bad(peer.open_handle(&HandleFields { nonce: f.nonce ^ 1, ..f }.encode(), 0)));
        assert!(is_bad(peer.open_handle(&IpcHandle([0; IPC_HANDLE_BYTES]), 0)));
        // Failed opens leave nothing behind: the genuine handle still opens.
        assert_eq!(mappers_of(&owner, p), 0);
        let m = peer.open_handle(&h, 0).unwrap();
        peer.close_handle(m).unwrap();
        owner.free(p).unwrap();
    }

    #[test]
    fn free_while_mapped_is_reported_and_pages_survive() {
        let owner = two();
        let peer = two();
        let p = owner.alloc(0, 4096).unwrap();
        let id = owner.pointer_info(p).unwrap().buffer_id;
        let h = owner.export_handle(p).unwrap();
        let m = peer.open_handle(&h, 1).unwrap();
        assert_eq!(owner.free(p), Err(DeviceError::FreedWhileMapped { ptr: p, buffer_id: id, mappers: 1 }));
        // Released locally all the same.
        assert_eq!(owner.pointer_info(p).unwrap().kind, MemoryKind::Host);
        assert!(!shm_path(&owner, id).exists());
        // The peer's pages are still there.
        fill(&peer, m.ptr, b"alive");
        assert_eq!(read(&peer, m.ptr, 5), b"alive");
        peer.close_handle(m).unwrap();
        // A fresh open of the freed allocation fails.
        assert!(matches!(peer.open_handle(&h, 1), Err(DeviceError::BadHandle { .. })));
    }

    #[test]
    fn peer_access_is_enforced_on_open() {
        let owner = backend(3, PeerMatrix::parse("0-2").unwrap(), 0);
        let peer = backend(3, PeerMatrix::parse("0-2").unwrap(), 0);
        assert!(peer.can_access_peer(2, 0) && peer.can_access_peer(1, 1));
        assert!(!peer.can_access_peer(0, 1) && !peer.can_access_peer(0, 3));
        let p = owner.alloc(0, 64).unwrap();
        let h = owner.export_handle(p).unwrap();
        match peer.open_handle(&h, 1) {
            Err(DeviceError::Driver { call: "cuIpcOpenMemHandle", message, .. }) => {
                assert!(message.contains("peer access unavailable"), "{message}")
            }
            other => panic!("expected a peer-access error, got {other:?}"),
        }
        assert!(matches!(peer.open_handle(&h, 7), Err(DeviceError::NoSuchDevice { dev: 7, count: 3 })));
        // The failed opens released their reservation and left no mapper behind.
        assert_eq!(mappers_of(&owner, p), 0);
        let m = peer.open_handle(&h, 2).unwrap();
        peer.close_handle(m).unwrap();
        owner.free(p).unwrap();

        let isolated = backend(2, PeerMatrix::NoPeers, 0);
        let owner2 = backend(2, PeerMatrix::NoPeers, 0);
        let q = owner2.alloc(1, 64).unwrap();
        let h2 = owner2.export_handle(q).unwrap();
        assert!(matches!(isolated.open_handle(&h2, 0), Err(DeviceError::Driver { .. })));
        let m = isolated.open_handle(&h2, 1).unwrap();
        isolated.close_handle(m).unwrap();
        owner2.free(q).unwrap();
    }

    #[test]
    fn open_cost_is_honoured() {
        let owner = two();
        let peer = backend(2, PeerMatrix::All, 20_000);
        let p = owner.alloc(0, 64).unwrap();
        let h = owner.export_handle(p).unwrap();
        let t = Instant::now();
        let m = peer.open_handle(&h, 0).unwrap();
        let took = t.elapsed();
        assert!(took >= Duration::from_micros(20_000), "open took {took:?}");
        peer.close_handle(m).unwrap();
        owner.free(p).unwrap();
    }

    #[test]
    fn engine_copies_complete_with_right_data() {
        let b = two();
        let len = 3 << 20;
        let d0 = b.alloc(0, len).unwrap();
        let d1 = b.alloc(1, len).unwrap();
        let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = vec![0u8; len];

        let t = b.copy_async(0, 0, d0, src.as_ptr() as usize, len).unwrap();
        wait(&b, t);
        let t = b.copy_async(1, 3, d1, d0, len).unwrap();
        wait(&b, t);
        let t = b.copy_async(1, 0, dst.as_mut_ptr() as usize, d1, len).unwrap();
        wait(&b, t);
        assert!(dst == src);
        // A done ticket is consumed.
        assert!(matches!(b.copy_poll(t), Err(DeviceError::Driver { call: "copy_poll", .. })));
        assert!(b.copy_poll(CopyTicket(u64::MAX)).is_err());

        // Copies on one engine run in submission order: the last write wins.
        let a = [1u8; 4096];
        let c = [2u8; 4096];
        let tickets: Vec<_> = (0..32)
            .map(|i| {
                let s = if i % 2 == 0 { &a } else { &c };
                b.copy_async(0, i, d0, s.as_ptr() as usize, 4096).unwrap()
            })
            .collect();
        for t in tickets {
            wait(&b, t);
        }
        assert_eq!(read(&b, d0, 4096), vec![2u8; 4096]);

        // Zero-length copies are done at once; bad engines and overruns are refused.
        let t = b.copy_async(1, 0, 0, 0, 0).unwrap();
        assert!(b.copy_poll(t).unwrap());
        assert!(matches!(b.copy_async(2, 0, d0, d1, 1), Err(DeviceError::NoSuchDevice { .. })));
        assert!(matches!(b.copy_async(0, 0, d0 + 1, d1, len), Err(DeviceError::InvalidPointer { .. })));
        assert!(matches!(b.copy_sync(d0, 0, 1), Err(DeviceError::InvalidPointer { .. })));

        // Overlapping copy_sync behaves like memmove.
        fill(&b, d1, &[1, 2, 3, 4, 5]);
        b.copy_sync(d1 + 1, d1, 4).unwrap();
        assert_eq!(read(&b, d1, 5), [1, 1, 2, 3, 4]);
        b.free(d0).unwrap();
        b.free(d1).unwrap();
    }

    #[test]
    fn driver_cost_model_leaves_the_answers_alone() {
        // Copies seen done 1 ms after issue, polled newest first: with the cost model the
        // answers are each copy's own state, and an older copy polled after a newer one
        // was seen done is done (as the CUDA backend answers it without a query).
        let driver = Some(DriverCost { issue_ns: 1000, done_ns: 500, not_ready_ns: 100 });
        let b = SimBackend::new(SimConfig { copy_inline: true, copy_done_ns: 1_000_000, driver, ..Default::default() })
            .unwrap();
        let len = 4096;
        let (d0, d1) = (b.alloc(0, len).unwrap(), b.alloc(1, len).unwrap());
        let t: Vec<CopyTicket> = (0..4).map(|_| b.copy_async(1, 0, d1, d0, len).unwrap()).collect();
        assert!(!b.copy_poll(t[3]).unwrap(), "not seen done before its time");
        while !b.copy_poll(t[3]).unwrap() {}
        for &old in &t[..3] {
            assert!(b.copy_poll(old).unwrap());
            assert!(b.copy_poll(old).is_err(), "a ticket is reported done once");
        }
        b.free(d0).unwrap();
        b.free(d1).unwrap();
    }

    #[test]
    fn inline_copies_are_done_when_started() {
        let b = SimBackend::new(SimConfig { copy_inline: true, ..Default::default() }).unwrap();
        let len = 1 << 16;
        let (d0, d1) = (b.alloc(0, len).unwrap(), b.alloc(1, len).unwrap());
        let src: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
        let mut dst = vec![0u8; len];
        for (to, from) in [(d0, src.as_ptr() as usize), (d1, d0), (dst.as_mut_ptr() as usize, d1)] {
            let t = b.copy_async(1, 0, to, from, len).unwrap();
            assert!(b.copy_poll(t).unwrap(), "an inline copy is finished when copy_async returns");
            assert!(b.copy_poll(t).is_err(), "and its ticket consumed by that poll");
        }
        assert!(dst == src);
        // The driver's rules still hold, and no engine thread was started.
        assert!(matches!(b.copy_async(0, 0, d0 + 1, d1, len), Err(DeviceError::InvalidPointer { .. })));
        assert!(b.engines.iter().all(|e| lock(e).is_none()));
        b.free(d0).unwrap();
        b.free(d1).unwrap();
    }

    #[test]
    fn register_host_ranges() {
        let b = two();
        let buf = vec![0u8; 8192];
        let p = buf.as_ptr() as usize;
        b.register_host(p, 8192).unwrap();
        b.register_host(p, 8192).unwrap();
        assert_eq!(b.pointer_info(p).unwrap().kind, MemoryKind::Host);
        b.unregister_host(p).unwrap();
        assert!(b.unregister_host(p).is_err());
        let d = b.alloc(0, 64).unwrap();
        assert!(b.register_host(d, 64).is_err());
        b.free(d).unwrap();
    }

    #[test]
    fn drop_releases_everything() {
        let owner = two();
        let peer = two();
        let p = owner.alloc(0, 64).unwrap();
        let id = owner.pointer_info(p).unwrap().buffer_id;
        let _q = peer.alloc(1, 64).unwrap();
        let qid = peer.pointer_info(_q).unwrap().buffer_id;
        let m = peer.open_handle(&owner.export_handle(p).unwrap(), 0).unwrap();
        let t = peer.copy_async(0, 0, m.ptr, _q, 64).unwrap();
        let _ = t;
        let qpath = shm_path(&peer, qid);
        assert!(qpath.exists());
        drop(peer);
        assert!(!qpath.exists(), "drop must unlink own allocations");
        assert_eq!(mappers_of(&owner, p), 0, "drop must close peer mappings");
        let path = shm_path(&owner, id);
        drop(owner);
        assert!(!path.exists());
    }

    #[test]
    fn config_parsing() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(SimConfig::from_lookup(env(&[])).unwrap(), SimConfig::default());
        let c = SimConfig::from_lookup(env(&[
            (ENV_DEVICES, "4"),
            (ENV_PEER, "none"),
            (ENV_IPC_OPEN_US, "930"),
            (ENV_COPY, "inline"),
        ]))
        .unwrap();
        assert_eq!(
            c,
            SimConfig {
                devices: 4,
                peer: PeerMatrix::NoPeers,
                ipc_open_us: 930,
                copy_inline: true,
                copy_done_ns: 0,
                driver: None,
            }
        );
        assert!(!SimConfig::from_lookup(env(&[(ENV_COPY, "thread")])).unwrap().copy_inline);
        let c = SimConfig::from_lookup(env(&[(ENV_COPY, "inline:6500")])).unwrap();
        assert!(c.copy_inline && c.copy_done_ns == 6500);
        let c = SimConfig::from_lookup(env(&[(ENV_DRIVER_NS, "1600, 1400,150")])).unwrap();
        assert_eq!(c.driver, Some(DriverCost { issue_ns: 1600, done_ns: 1400, not_ready_ns: 150 }));
        let c = SimConfig::from_lookup(env(&[(ENV_DEVICES, "4"), (ENV_PEER, " 1-0, 2-3 ")])).unwrap();
        assert_eq!(c.peer, PeerMatrix::Pairs(vec![(0, 1), (2, 3)]));
        assert!(c.peer.allows(0, 1) && c.peer.allows(1, 0) && c.peer.allows(3, 2) && c.peer.allows(2, 2));
        assert!(!c.peer.allows(0, 2) && !c.peer.allows(1, 3));
        assert_eq!(PeerMatrix::parse("ALL").unwrap(), PeerMatrix::All);
        assert_eq!(c.peer.to_string(), "0-1,2-3");
        assert_eq!(PeerMatrix::NoPeers.to_string(), "none");
        assert!(!PeerMatrix::NoPeers.allows(0, 1) && PeerMatrix::NoPeers.allows(1, 1));
        assert_eq!(SimConfig::from_lookup(env(&[(ENV_PEER, "")])).unwrap().peer, PeerMatrix::All);

        let rejected =
            |vars: &'static [(&'static str, &'static str)], var: &str| match SimConfig::from_lookup(env(vars)) {
                Err(DeviceError::Unavailable { reason }) => {
                    assert!(reason.contains(var), "{reason}");
                }
                other => panic!("{vars:?} should be rejected, got {other:?}"),
            };
        rejected(&[(ENV_PEER, "garbage")], ENV_PEER);
        rejected(&[(ENV_PEER, "0-1,")], ENV_PEER);
        rejected(&[(ENV_PEER, "0-x")], ENV_PEER);
        rejected(&[(ENV_PEER, "0-5")], ENV_PEER); // device 5 does not exist
        rejected(&[(ENV_DEVICES, "two")], ENV_DEVICES);
        rejected(&[(ENV_DEVICES, "0")], ENV_DEVICES);
        rejected(&[(ENV_DEVICES, "-1")], ENV_DEVICES);
        rejected(&[(ENV_IPC_OPEN_US, "1ms")], ENV_IPC_OPEN_US);
        rejected(&[(ENV_COPY, "sync")], ENV_COPY);
        rejected(&[(ENV_COPY, "inline:soon")], ENV_COPY);
        rejected(&[(ENV_DRIVER_NS, "1600,1400")], ENV_DRIVER_NS);
        rejected(&[(ENV_DRIVER_NS, "1600,1400,fast")], ENV_DRIVER_NS);
        assert!(SimBackend::new(SimConfig { devices: 0, ..Default::default() }).is_err());
    }

    #[test]
    fn handle_round_trip() {
        let f = HandleFields { owner_pid: 42, nonce: 0xdead_beef, buffer_id: 9, size: 123, device: 3 };
        assert_eq!(HandleFields::decode(&f.encode()).unwrap(), f);
        let mut h = f.encode();
        h.0[63] = 1;
        assert!(HandleFields::decode(&h).is_err());
    }

    /// Environment variable carrying a hex handle to [`cross_process_child`].
    const CHILD_HANDLE_VAR: &str = "GPULMT_SIM_TEST_CHILD_HANDLE";

    /// Child half of [`cross_process_open`]: does nothing unless started by it (the
    /// test binary re-runs itself, filtered to this test, with the handle in the
    /// environment). Re-running the binary rather than fork() keeps the child free
    /// of the harness's threads and locks.
    #[test]
    fn cross_process_child() {
        let Ok(hex) = std::env::var(CHILD_HANDLE_VAR) else {
            return;
        };
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let h = IpcHandle(bytes.try_into().unwrap());
        let b = two();
        let m = b.open_handle(&h, 1).unwrap();
        assert!(matches!(b.open_handle(&h, 0), Err(DeviceError::DoubleOpen { .. })));
        assert_eq!(read(&b, m.ptr, 4), b"ping");
        // Write back through this process's copy engine.
        let t = b.copy_async(1, 0, m.ptr, b"pong".as_ptr() as usize, 4).unwrap();
        wait(&b, t);
        b.close_handle(m).unwrap();
    }

    #[test]
    fn cross_process_open() {
        let owner = two();
        let p = owner.alloc(0, 4096).unwrap();
        fill(&owner, p, b"ping");
        let h = owner.export_handle(p).unwrap();
        let hex: String = h.0.iter().map(|b| format!("{b:02x}")).collect();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "device::sim::tests::cross_process_child", "--test-threads=1", "--nocapture"])
            .env(CHILD_HANDLE_VAR, hex)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "child failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Make sure the child really ran the test rather than filtering it out.
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "{}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(read(&owner, p, 4), b"pong");
        assert_eq!(mappers_of(&owner, p), 0);
        owner.free(p).unwrap();
    }
}
