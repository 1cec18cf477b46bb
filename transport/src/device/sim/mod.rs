//! The `sim` device backend: lets the whole transport run on machines without a GPU
//! (CI, laptops) while behaving like the CUDA driver wherever the layers above depend
//! on it.
//!
//! What it models, and how:
//! - **Device memory** is POSIX shared memory, one named object per allocation
//!   (`/dev/shm/gpulmt-sim-<pid>-<nonce>-<buffer id>`), so that another process can map
//!   it from an exported handle exactly as `cuIpcOpenMemHandle` maps a peer's
//!   allocation. The first 4096 bytes of each object are a header (`object.rs`) that lets the
//!   opener verify the handle and lets the owner count the peers that map it. Pages are
//!   reserved at allocation, so a full `/dev/shm` fails `alloc` as out-of-memory does.
//!   The instance's owner object (`gpulmt-sim-<pid>-<nonce>-owner`, locked while the
//!   instance has allocations) lets the next job remove the objects of a process that was killed
//!   (see [`crate::shm::sweep`]): a peer may open a handle at any time, so the names
//!   must live as long as the allocations.
//! - **IPC rules** of the real driver are enforced because the handle cache above
//!   relies on them: a handle cannot be opened twice in one process
//!   ([`DeviceError::DoubleOpen`]), a process cannot open its own handle, a forged or
//!   stale handle fails with [`DeviceError::BadHandle`], opening needs peer access
//!   between the devices, and freeing an allocation a peer still maps is reported
//!   ([`DeviceError::FreedWhileMapped`]) although, as in CUDA, the peer's pages stay alive.
//! - **Kinds of memory** (`kinds.rs`, [`DeviceBackend::alloc_as`]) as CUDA 13 has them:
//!   legacy memory exports by a legacy handle; a shareable pool's allocations and
//!   shareable VMM chunks cross as a file descriptor from the instance's fd server; the
//!   default pool's, non-shareable VMM and managed memory cannot be exported
//!   ([`DeviceError::NotShareable`]). Pools hand a freed allocation of the same size back
//!   at the same address with a new buffer id; a VMM range is chunks of one object, each
//!   its own allocation to `pointer_info`.
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
//!
//! Files: this one (the backend and its [`DeviceBackend`] table), `config.rs`,
//! `object.rs` (an allocation's shared-memory object: header page, handle, name),
//! `registry.rs` (what an instance has mapped), `kinds.rs` (pools, VMM ranges, managed
//! memory, sharing by file descriptor), `engine.rs` (copy engine threads and tickets) and
//! `tests.rs`.

mod config;
mod engine;
mod kinds;
mod object;
mod registry;
#[cfg(test)]
mod tests;

pub use config::{DriverCost, PeerMatrix, SimConfig};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::fd_share::FdServer;
use super::shareable::SharedHandle;
use super::{
    AllocKind, AtomicState, AtomicTicket, BackendKind, Copy2d, CopyTicket, DevId, DeviceBackend, DeviceError,
    HostMapped, IpcHandle, Mapping, MemoryKind, PointerInfo, WordAtomic,
};
use crate::shm::object::{ShmError, ShmSegment};
use crate::shm::wait::sleep_for;
use engine::{spin_ns, Engine, Tickets};
use object::{
    bad_handle, fresh_nonce, header, object_len, release_mapper, shm_error, shm_name, HandleFields, HEADER_BYTES,
    HEADER_MAGIC,
};
use registry::{drop_object, OpenKey, PeerMap, PeerMem, Region, State};

/// Environment variable: number of simulated devices.
pub const ENV_DEVICES: &str = "GPULMT_SIM_DEVICES";
/// Environment variable: peer-access topology (`all`, `none` or pairs like `0-1,2-3`).
pub const ENV_PEER: &str = "GPULMT_SIM_PEER";
/// Environment variable: time in microseconds that opening an IPC handle takes.
pub const ENV_IPC_OPEN_US: &str = "GPULMT_SIM_IPC_OPEN_US";
/// Environment variable: `1` makes every open of a peer's handle fail (fault injection).
pub const ENV_REFUSE_OPENS: &str = "GPULMT_SIM_REFUSE_OPENS";
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

/// The simulated device backend. See the module documentation.
///
/// Dropping it first lets its copy engines finish the copies queued on them, then releases
/// its allocations and peer mappings.
pub struct SimBackend {
    cfg: SimConfig,
    pid: u32,
    nonce: u64,
    /// Shared with the fd server's thread, which answers from it.
    state: Arc<Mutex<State>>,
    /// Hands out the fds of the shareable memory exported (`kinds.rs`); started by the
    /// first such export, stopped on drop.
    server: Mutex<Option<FdServer>>,
    /// One copy engine per device, started on first use.
    engines: Vec<Mutex<Option<Engine>>>,
    next_ticket: AtomicU64,
    /// Copies in flight: their done flag, and for inline copies with a completion time
    /// (`copy_done_ns`), when they may be seen finished.
    tickets: Mutex<Tickets>,
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
            state: Arc::new(Mutex::new(State::default())),
            server: Mutex::new(None),
            engines,
            next_ticket: AtomicU64::new(1),
            tickets: Mutex::new(Default::default()),
        })
    }

    /// The configuration this backend runs with.
    pub fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// Refuses an open on device `on` of memory of device `owner_dev` (of process `pid`) that
    /// `on` cannot reach, with the error CUDA gives.
    fn check_peer_access(&self, on: DevId, owner_dev: DevId, pid: u32) -> Result<(), DeviceError> {
        if self.can_access_peer(on, owner_dev) {
            return Ok(());
        }
        Err(DeviceError::Driver {
            call: "cuIpcOpenMemHandle",
            code: CUDA_ERROR_PEER_ACCESS_UNSUPPORTED,
            message: format!(
                "peer access unavailable: device {on} cannot reach device {owner_dev} of pid {pid} ({ENV_PEER}={})",
                self.cfg.peer
            ),
        })
    }

    fn check_dev(&self, dev: DevId) -> Result<(), DeviceError> {
        if dev >= self.cfg.devices {
            return Err(DeviceError::NoSuchDevice { dev, count: self.cfg.devices });
        }
        Ok(())
    }

    /// Reserves `key` for an open in progress, so that a concurrent second open of one
    /// handle fails ([`DeviceError::DoubleOpen`]) instead of both mapping it; the key is
    /// released when the reservation drops (the open failed), kept by forgetting it.
    fn reserve(&self, key: OpenKey) -> Result<Reservation<'_>, DeviceError> {
        if !lock(&self.state).open_keys.insert(key) {
            return Err(DeviceError::DoubleOpen { owner: key.owner_pid, buffer_id: key.buffer_id });
        }
        Ok(Reservation { st: &self.state, key })
    }
}

/// A handle's key reserved by [`SimBackend::reserve`].
struct Reservation<'a> {
    st: &'a Mutex<State>,
    key: OpenKey,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        lock(self.st).open_keys.remove(&self.key);
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
        let local = self.make_object(dev, bytes, size, AllocKind::Legacy, (1, size))?;
        let data = local.map.ptr() as usize + HEADER_BYTES;
        let buffer_id = local.buffer_id;
        lock(&self.state).regions.insert(data, Region::Local(local));
        debug!(dev, bytes, buffer_id, ptr = format_args!("{data:#x}"), "sim: alloc");
        Ok(data)
    }

    fn alloc_as(&self, dev: DevId, bytes: usize, kind: AllocKind, chunks: u32) -> Result<usize, DeviceError> {
        match kind {
            AllocKind::Legacy => self.alloc(dev, bytes),
            _ => self.alloc_kind(dev, bytes, kind, chunks),
        }
    }

    unsafe fn free(&self, ptr: usize) -> Result<(), DeviceError> {
        let (buffer_id, kept) = {
            let mut st = lock(&self.state);
            match st.regions.get(&ptr) {
                Some(Region::Local(_)) => match st.regions.remove(&ptr) {
                    Some(Region::Local(l)) => {
                        // Nobody can fetch it any more; a pool allocation made again at the
                        // address is offered under its new id once exported.
                        for id in l.ids() {
                            st.offers.remove(&id);
                        }
                        (l.buffer_id, kinds::pool_keeps(&mut st, l))
                    }
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
        let released = match kept {
            Ok((evicted, mappers)) => {
                for map in evicted {
                    if let Err(e) = drop_object(map) {
                        warn!(error = %e, "sim: releasing a pool's oldest freed allocation");
                    }
                }
                Ok(mappers)
            }
            Err(local) => local.release(),
        };
        {
            // No allocation left, nor one a pool keeps: nothing for the owner object to
            // claim (a process that freed all its device memory leaves nothing in
            // /dev/shm). The next alloc makes it again.
            let mut st = lock(&self.state);
            if !st.has_objects() {
                st.owner = None;
            }
        }
        let mappers = released?;
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
            Some((base, Region::Local(l))) => l.info(base, ptr),
            Some((base, Region::Peer(p))) => PointerInfo::device(p.owner_dev, base, p.size, p.key.buffer_id, p.alloc),
            None => PointerInfo::host(ptr),
        })
    }

    fn export_handle(&self, base: usize) -> Result<IpcHandle, DeviceError> {
        let st = lock(&self.state);
        // The start of an allocation, or of one of a VMM range's chunks (each its own).
        let found = match st.find(base) {
            Some((start, Region::Local(l))) if (base - start).is_multiple_of(l.chunk) => {
                Some((start, (base - start) / l.chunk, l))
            }
            _ => None,
        };
        let Some((start, k, l)) = found else {
            return Err(DeviceError::InvalidPointer {
                op: "export_handle",
                ptr: base,
                expected: "the start of a device allocation of this process",
            });
        };
        if let Some(reason) = l.alloc.unmappable_reason() {
            return Err(DeviceError::NotShareable { base, reason: reason.to_owned() });
        }
        match l.alloc {
            AllocKind::Legacy => Ok(HandleFields {
                owner_pid: self.pid,
                nonce: self.nonce,
                buffer_id: l.buffer_id,
                size: l.size as u64,
                device: l.dev,
            }
            .encode()),
            _ => self.export_shared(st, start, k),
        }
    }

    fn open_handle(&self, handle: &IpcHandle, on: DevId) -> Result<Mapping, DeviceError> {
        if self.cfg.refuse_opens {
            return Err(DeviceError::Driver {
                call: "open_handle",
                code: 0,
                message: format!("refused by {ENV_REFUSE_OPENS}=1 (sim fault injection)"),
            });
        }
        if let Some(shared) = SharedHandle::decode(handle)? {
            return self.open_shared(&shared, on);
        }
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
        let reservation = self.reserve(key)?;

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
        let (magic, owner_pid, device, hsize) = (h.magic, h.owner_pid, h.device, h.size);
        let buffer_id = h.buffer_id.load(Ordering::SeqCst);
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
        // Only legacy memory exports a legacy handle: one naming another kind's object is
        // forged (the pools' and VMM's cross as fds, the rest not at all).
        if h.alloc != 0 {
            return Err(bad_handle(format!(
                "/{name} is not legacy memory (kind {}): a legacy handle cannot open it (forged handle)",
                h.alloc
            )));
        }
        if h.freed.load(Ordering::SeqCst) != 0 {
            return Err(bad_handle(format!("buffer {} of pid {}: the owner freed it", f.buffer_id, f.owner_pid)));
        }
        self.check_peer_access(on, f.device, f.owner_pid)?;
        // Pairs with release_local's store-then-load (see there).
        h.mappers.fetch_add(1, Ordering::SeqCst);
        if h.freed.load(Ordering::SeqCst) != 0 {
            release_mapper(h, f.buffer_id);
            return Err(bad_handle(format!("buffer {} of pid {}: the owner freed it", f.buffer_id, f.owner_pid)));
        }
        if self.cfg.ipc_open_us > 0 {
            sleep_for(Duration::from_micros(self.cfg.ipc_open_us));
        }
        let data = map.ptr() as usize + HEADER_BYTES;
        let peer = PeerMap {
            key,
            owner_dev: f.device,
            size,
            alloc: AllocKind::Legacy,
            map: PeerMem::Object(map),
            origin: None,
        };
        lock(&self.state).regions.insert(data, Region::Peer(peer));
        // The key stays reserved until close_handle.
        std::mem::forget(reservation);
        debug!(owner = f.owner_pid, buffer_id = f.buffer_id, on, ptr = format_args!("{data:#x}"), "sim: open_handle");
        Ok(Mapping { ptr: data, size })
    }

    unsafe fn close_handle(&self, mapping: Mapping) -> Result<(), DeviceError> {
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
        release_mapper(peer.map.header(), peer.key.buffer_id);
        let (owner, buffer_id) = (peer.key.owner_pid, peer.key.buffer_id);
        peer.map.unmap()?;
        debug!(owner, buffer_id, "sim: close_handle");
        Ok(())
    }

    unsafe fn copy_async(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<CopyTicket, DeviceError> {
        // SAFETY: copy_async's contract is start_copy's for one row of `len` bytes.
        unsafe { self.start_copy("copy_async", engine, lane, (dst, src), Copy2d::row(len)) }
    }

    unsafe fn copy_2d_async(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        shape: Copy2d,
    ) -> Result<CopyTicket, DeviceError> {
        // SAFETY: copy_2d_async's contract is start_copy's.
        unsafe { self.start_copy("copy_2d_async", engine, lane, (dst, src), shape) }
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

    unsafe fn copy_sync(&self, dst: usize, src: usize, len: usize) -> Result<(), DeviceError> {
        // SAFETY: copy_sync's contract is copy_now's for one row of `len` bytes.
        unsafe { self.copy_now("copy_sync", dst, src, Copy2d::row(len)) }
    }

    unsafe fn copy_2d_sync(&self, dst: usize, src: usize, shape: Copy2d) -> Result<(), DeviceError> {
        // SAFETY: copy_2d_sync's contract is copy_now's.
        unsafe { self.copy_now("copy_2d_sync", dst, src, shape) }
    }

    /// Made at once: the sim's device memory is host memory, shared between the ranks'
    /// processes, so one atomic instruction of the host is atomic against theirs.
    unsafe fn word_atomic_start(
        &self,
        dev: DevId,
        addr: usize,
        op: WordAtomic,
    ) -> Result<Option<AtomicTicket>, DeviceError> {
        let _ = dev;
        let device_word = addr.is_multiple_of(8) && matches!(self.pointer_info(addr)?.kind, MemoryKind::Device(_));
        if !device_word {
            return Err(DeviceError::InvalidPointer {
                op: "word_atomic_start",
                ptr: addr,
                expected: "an 8-byte aligned word of device memory",
            });
        }
        // SAFETY: an aligned word of sim device memory, mapped into this process (checked
        // above) and valid for the call (the caller's contract); every host access to it
        // is atomic (the caller's contract), so an `AtomicU64` view of it is sound.
        let old = op.apply(unsafe { AtomicU64::from_ptr(addr as *mut u64) });
        Ok(Some(AtomicTicket(AtomicState::Done(old))))
    }

    /// Anonymous shared memory: zeroed, page-aligned, and at the same address for the
    /// "device", as under CUDA's unified addressing. It is host memory to
    /// [`pointer_info`](DeviceBackend::pointer_info), like CUDA's pinned memory.
    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped, DeviceError> {
        let len = bytes.max(1);
        // SAFETY: a fresh anonymous mapping; no existing memory is named or touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            return Err(DeviceError::Driver {
                call: "alloc_host_mapped",
                code: CUDA_ERROR_OUT_OF_MEMORY,
                message: format!("mmap of {len} bytes: {e}"),
            });
        }
        let host = ptr as usize;
        lock(&self.state).host_mapped.insert(host, len);
        debug!(bytes, ptr = format_args!("{host:#x}"), "sim: alloc_host_mapped");
        Ok(HostMapped { host, device: host, len: bytes })
    }

    unsafe fn free_host_mapped(&self, host: usize) -> Result<(), DeviceError> {
        let Some(len) = lock(&self.state).host_mapped.remove(&host) else {
            return Err(DeviceError::InvalidPointer {
                op: "free_host_mapped",
                ptr: host,
                expected: "the start of an alloc_host_mapped allocation not yet freed",
            });
        };
        // SAFETY: the range is a mapping alloc_host_mapped made and nobody freed since
        // (just removed from the registry under its lock); the caller guarantees nothing
        // uses it any more.
        if unsafe { libc::munmap(host as *mut libc::c_void, len) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(DeviceError::Driver { call: "free_host_mapped", code: 0, message: format!("munmap: {e}") });
        }
        Ok(())
    }

    unsafe fn register_host(&self, ptr: usize, len: usize) -> Result<(), DeviceError> {
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

    unsafe fn unregister_host(&self, ptr: usize) -> Result<(), DeviceError> {
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
        // The fd server next: it answers from the state taken below.
        drop(lock(&self.server).take());
        let st = std::mem::take(&mut *lock(&self.state));
        for (host, len) in st.host_mapped {
            // SAFETY: a mapping of alloc_host_mapped never freed; the backend is going, and
            // with it every user of its memory (its copy engines were joined above).
            unsafe { libc::munmap(host as *mut libc::c_void, len) };
        }
        for (ptr, region) in st.regions {
            match region {
                Region::Peer(p) => {
                    release_mapper(p.map.header(), p.key.buffer_id);
                    if let Err(e) = p.map.unmap() {
                        warn!(error = %e, "sim: unmapping a peer mapping at shutdown");
                    }
                }
                Region::Local(l) => match (l.buffer_id, l.release()) {
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
        for (_, pool) in st.pools {
            for (_, map) in pool.free {
                if let Err(e) = drop_object(map) {
                    warn!(error = %e, "sim: releasing a pool's freed allocation at shutdown");
                }
            }
        }
        // Last: the allocations' names are gone, nothing is left for it to claim.
        drop(st.owner);
    }
}
