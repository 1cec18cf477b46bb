//! Kinds of device memory on the sim (`docs/memory-kinds.md`), modelled on what CUDA 13
//! does with each on an H200 (`lab/gpu/memory_kinds.cu`, and `cuda/kinds.rs` for the real
//! routes), so that the layers above meet every kind's rules without a GPU:
//! - legacy (`alloc`): exported by a legacy handle naming its object (`mod.rs`);
//! - a pool (`Pool`): freed allocations stay in the pool, object and mapping, and one of
//!   the same size comes back at the same address with a new buffer id, its bytes not
//!   zeroed; a handle names the buffer id, so a recycled allocation never opens through an
//!   old one. Only a shareable pool's allocations can be exported;
//! - VMM (`Vmm`): one object for the whole range, its data divided into page-aligned
//!   chunks, each its own allocation (buffer id) to `pointer_info` and to export, while
//!   copies may run through consecutive chunks (they are one range);
//! - managed (`Managed`): an ordinary object that no peer may map.
//!
//! Shareable pool and VMM memory crosses as a file descriptor, as under CUDA: the handle
//! ([`SharedHandle`]) names the exporter's fd server (`fd_share`), which opens the object
//! when asked and sends the fd with where the allocation lies in it; the importer maps that
//! range and the header page, and closes the fd at once (the mappings keep the memory).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, warn};

use super::object::{
    bad_handle, header, object_len, owner_name, release_mapper, round_up, shm_error, shm_name, HandleFields, Header,
    HEADER_BYTES, HEADER_MAGIC,
};
use super::registry::{drop_object, LocalAlloc, OpenKey, PeerMap, PeerMem, PoolCache, Region, State};
use super::{lock, SimBackend, CUDA_ERROR_OUT_OF_MEMORY, NEXT_BUFFER_ID};
use crate::device::fd_share::{self, FdServer};
use crate::device::shareable::{self, SharedHandle, SharedKind, PAYLOAD_BYTES};
use crate::device::{AllocKind, DevId, DeviceError, IpcHandle, Mapping};
use crate::shm::object::{c_name, ShmSegment};
use crate::shm::owner::OwnerLock;
use crate::shm::wait::sleep_for;

/// Freed allocations one pool keeps at most, and their bytes at most: beyond either the
/// oldest go (a real pool trims to its release threshold; without a bound a program that
/// frees many sizes would fill `/dev/shm`).
const POOL_KEEPS: usize = 64;
const POOL_KEEPS_BYTES: usize = 256 << 20;

/// The number a header stores for a kind of memory (0: legacy, so that objects of builds
/// before the kinds read as legacy).
pub(super) fn kind_code(kind: AllocKind) -> u32 {
    match kind {
        AllocKind::Legacy => 0,
        AllocKind::Pool { shareable: false } => 1,
        AllocKind::Pool { shareable: true } => 2,
        AllocKind::Vmm { shareable: false } => 3,
        AllocKind::Vmm { shareable: true } => 4,
        AllocKind::Managed => 5,
    }
}

/// The kind a header's number stands for.
fn kind_of(code: u32) -> Option<AllocKind> {
    AllocKind::NAMES.iter().map(|&(_, k)| k).find(|&k| kind_code(k) == code)
}

/// What the fd server sends with the fd: where the allocation (or VMM chunk) lies in the
/// object and what it is. Little endian: `[0..8)` offset of its data in the object (a
/// page multiple), `[8..16)` its length, `[16..20)` device, `[20..28)` buffer id,
/// `[28..32)` kind ([`kind_code`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Meta {
    offset: u64,
    len: u64,
    device: DevId,
    buffer_id: u64,
    alloc: u32,
}

const META_BYTES: usize = 32;

impl Meta {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(META_BYTES);
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.len.to_le_bytes());
        b.extend_from_slice(&self.device.to_le_bytes());
        b.extend_from_slice(&self.buffer_id.to_le_bytes());
        b.extend_from_slice(&self.alloc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Meta> {
        if b.len() != META_BYTES {
            return None;
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        Some(Meta { offset: u64_at(0), len: u64_at(8), device: u32_at(16), buffer_id: u64_at(20), alloc: u32_at(28) })
    }
}

/// A shared mapping of part of a file descriptor's object, unmapped on drop: what an
/// importer maps of an object whose fd it was sent (no name to open it by, as for a
/// [`ShmSegment`]).
#[derive(Debug)]
pub(super) struct FdMap {
    /// Start of the mapping (page-aligned); an address, so the type is `Send` and `Sync`
    /// as the registry that holds it must be.
    addr: usize,
    /// 0 once unmapped.
    len: usize,
}

impl FdMap {
    /// Maps `len` bytes of `fd` from `offset` (a page multiple) read-write and shared.
    fn map(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<FdMap> {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("offset {offset} does not fit off_t")))?;
        // SAFETY: a fresh mapping anywhere of an open descriptor; no existing memory is
        // named or touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(FdMap { addr: p as usize, len })
    }

    /// Start of the mapping.
    pub(super) fn addr(&self) -> usize {
        self.addr
    }

    /// The mapping as an object's header page.
    pub(super) fn header(&self) -> &Header {
        assert!(self.len >= HEADER_BYTES, "a header mapping is shorter than the header page");
        // SAFETY: the mapping is page-aligned (so aligned for Header), at least
        // HEADER_BYTES long (checked above) and stays mapped while `self` is borrowed. Its
        // plain fields were written once by the owner before it exported the memory; the
        // rest are atomics.
        unsafe { &*(self.addr as *const Header) }
    }

    /// Unmaps it now, reporting a failure that dropping it would only log.
    pub(super) fn unmap(mut self) -> io::Result<()> {
        self.release()
    }

    fn release(&mut self) -> io::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        let len = std::mem::replace(&mut self.len, 0);
        // SAFETY: addr/len describe a mapping this made and nobody else unmaps; `len` is 0
        // from now on, so it is unmapped once. Users of the memory are gone (the callers'
        // contracts: close_handle's, the backend's drop).
        if unsafe { libc::munmap(self.addr as *mut libc::c_void, len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for FdMap {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            warn!(error = %e, "sim: unmapping a peer allocation failed");
        }
    }
}

/// Opens the object `name` read-write, for the fd server to send.
fn open_object(name: &str) -> io::Result<OwnedFd> {
    let (_, cname) = c_name(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    // SAFETY: cname is a valid NUL-terminated string.
    let raw = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a descriptor just opened here, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// The fd server's producer: the object of the allocation (or VMM chunk) whose buffer id
/// is `key`, if it is still offered and still that buffer, with where it lies. Runs on the
/// server's thread; the state lock makes the check and the open one step against a free.
fn produce(state: &Mutex<State>, key: u64) -> Result<(OwnedFd, Vec<u8>), String> {
    let st = lock(state);
    let gone = || format!("buffer {key} is not offered: it was freed (or never exported by this process)");
    let &start = st.offers.get(&key).ok_or_else(gone)?;
    let Some(Region::Local(l)) = st.regions.get(&start) else { return Err(gone()) };
    // Offers go with their allocation, so this is a second line: a pool allocation handed
    // out again at the address is another buffer, never the one asked for.
    if !l.ids().contains(&key) {
        return Err(format!("buffer {key} was freed: the memory at {start:#x} is now buffer {}", l.buffer_id));
    }
    let k = (key - l.buffer_id) as usize;
    let fd = open_object(l.map.name()).map_err(|e| format!("opening /{} for buffer {key}: {e}", l.map.name()))?;
    let meta = Meta {
        offset: (HEADER_BYTES + k * l.chunk) as u64,
        len: l.chunk as u64,
        device: l.dev,
        buffer_id: key,
        alloc: kind_code(l.alloc),
    };
    Ok((fd, meta.encode()))
}

impl PoolCache {
    /// The most recently freed allocation of `size` bytes, if the pool keeps one.
    fn take(&mut self, size: usize) -> Option<ShmSegment> {
        let at = self.free.iter().rposition(|(s, _)| *s == size)?;
        let (_, map) = self.free.remove(at).expect("found just above");
        self.bytes -= map.len();
        Some(map)
    }

    /// Keeps a freed allocation of `size` bytes; returns those the pool lets go to stay in
    /// its bounds (the oldest).
    fn put(&mut self, size: usize, map: ShmSegment) -> Vec<ShmSegment> {
        self.bytes += map.len();
        self.free.push_back((size, map));
        let mut out = Vec::new();
        while self.free.len() > POOL_KEEPS || self.bytes > POOL_KEEPS_BYTES {
            let Some((_, old)) = self.free.pop_front() else { break };
            self.bytes -= old.len();
            out.push(old);
        }
        out
    }
}

/// What a free does with an allocation just removed from the registry `st`: a pool
/// allocation goes into its pool in the same step (were it out of both for a moment, a
/// concurrent free could find no object left and drop the owner object that claims it),
/// even one a peer still maps, as CUDA's pool keeps it: the next allocation of its size
/// comes back there and the peer's stale import sees its bytes (`lab/gpu/memory_kinds.cu`,
/// reuse_hold). Returns the objects the pool lets go to stay in its bounds and how many
/// peers still mapped it. Any other allocation is handed back to be released as legacy
/// memory is (a peer's pages staying alive).
pub(super) fn pool_keeps(st: &mut State, l: LocalAlloc) -> Result<(Vec<ShmSegment>, u32), LocalAlloc> {
    let AllocKind::Pool { shareable } = l.alloc else { return Err(l) };
    let mappers = l.retire();
    Ok((st.pools.entry((l.dev, shareable)).or_default().put(l.size, l.map), mappers))
}

impl SimBackend {
    /// Makes an allocation's object and its header: `size` bytes of data (`bytes` is what
    /// the caller asked for, for the error), of `chunks` chunks of `chunk` bytes each (one
    /// chunk of `size` but for VMM memory), with `chunks` buffer ids from a fresh one.
    pub(super) fn make_object(
        &self,
        dev: DevId,
        bytes: usize,
        size: usize,
        alloc: AllocKind,
        (chunks, chunk): (u32, usize),
    ) -> Result<LocalAlloc, DeviceError> {
        let map_len = object_len(size).ok_or_else(|| DeviceError::Driver {
            call: "alloc",
            code: CUDA_ERROR_OUT_OF_MEMORY,
            message: format!("{bytes} bytes cannot be allocated"),
        })?;
        {
            // The owner object before the first allocation object: no allocation of this
            // instance exists that the sweep could take for abandoned.
            let mut st = lock(&self.state);
            if st.owner.is_none() {
                st.owner = Some(OwnerLock::create(&owner_name(self.pid, self.nonce)).map_err(shm_error)?);
            }
        }
        let buffer_id = NEXT_BUFFER_ID.fetch_add(u64::from(chunks), Ordering::Relaxed);
        let name = shm_name(self.pid, self.nonce, buffer_id);
        // Pages reserved now: a full /dev/shm must fail here, like cuMemAlloc returning
        // out-of-memory, not as a SIGBUS on first touch deep in a copy.
        let map = match ShmSegment::create_reserved(&name, map_len) {
            Ok(map) => map,
            Err(e) => {
                // What the pools keep gives way, as a real pool's cached memory does when the
                // device runs out; then one more try (a failed create leaves no name behind).
                if self.trim_pools() == 0 {
                    return Err(shm_error(e));
                }
                ShmSegment::create_reserved(&name, map_len).map_err(shm_error)?
            }
        };
        // SAFETY: the mapping is fresh, page-aligned and at least HEADER_BYTES long;
        // nobody else can know its name before export, so a plain write is race-free.
        unsafe {
            std::ptr::write(
                map.ptr().cast::<Header>(),
                Header {
                    magic: HEADER_MAGIC,
                    owner_pid: self.pid,
                    device: dev,
                    buffer_id: AtomicU64::new(buffer_id),
                    size: size as u64,
                    mappers: AtomicU32::new(0),
                    freed: AtomicU32::new(0),
                    alloc: kind_code(alloc),
                    chunks,
                    chunk_bytes: chunk as u64,
                },
            )
        };
        Ok(LocalAlloc { dev, size, buffer_id, map, alloc, chunks, chunk })
    }

    /// `alloc_as` of every kind but legacy; returns the data's address.
    pub(super) fn alloc_kind(
        &self,
        dev: DevId,
        bytes: usize,
        kind: AllocKind,
        chunks: u32,
    ) -> Result<usize, DeviceError> {
        self.check_dev(dev)?;
        let size = bytes.max(1);
        let local = match kind {
            AllocKind::Legacy => unreachable!("alloc_as takes legacy memory through alloc"),
            AllocKind::Pool { shareable } => {
                // From the pool to the registry in one step, as `pool_keeps` does the reverse.
                let mut st = lock(&self.state);
                if let Some(map) = st.pools.get_mut(&(dev, shareable)).and_then(|p| p.take(size)) {
                    let buffer_id = NEXT_BUFFER_ID.fetch_add(1, Ordering::Relaxed);
                    let h = header(&map);
                    // The new id before "not freed": an open that sees it not freed sees the
                    // new id too (the opens load them in that order), so a handle of the old
                    // buffer cannot pass.
                    h.buffer_id.store(buffer_id, Ordering::SeqCst);
                    h.freed.store(0, Ordering::SeqCst);
                    let data = map.ptr() as usize + HEADER_BYTES;
                    let local = LocalAlloc { dev, size, buffer_id, map, alloc: kind, chunks: 1, chunk: size };
                    st.regions.insert(data, Region::Local(local));
                    debug!(
                        dev,
                        bytes,
                        buffer_id,
                        ptr = format_args!("{data:#x}"),
                        "sim: alloc_as: the pool's freed allocation again"
                    );
                    return Ok(data);
                }
                drop(st);
                self.make_object(dev, bytes, size, kind, (1, size))?
            }
            AllocKind::Vmm { .. } => {
                // As cuMemCreate per chunk: each a granularity multiple, so every chunk
                // starts at a page of the object that a peer can map alone.
                let chunks = chunks.max(1);
                let oom = || DeviceError::Driver {
                    call: "alloc_as",
                    code: CUDA_ERROR_OUT_OF_MEMORY,
                    message: format!("{bytes} bytes in {chunks} chunks cannot be allocated"),
                };
                let chunk = round_up(size.div_ceil(chunks as usize)).ok_or_else(oom)?;
                let total = chunk.checked_mul(chunks as usize).ok_or_else(oom)?;
                self.make_object(dev, bytes, total, kind, (chunks, chunk))?
            }
            AllocKind::Managed => self.make_object(dev, bytes, size, kind, (1, size))?,
        };
        let data = local.map.ptr() as usize + HEADER_BYTES;
        let (buffer_id, chunks) = (local.buffer_id, local.chunks);
        lock(&self.state).regions.insert(data, Region::Local(local));
        debug!(dev, bytes, kind = kind.name(), chunks, buffer_id, ptr = format_args!("{data:#x}"), "sim: alloc_as");
        Ok(data)
    }

    /// Lets go of everything the pools keep; returns how many objects went.
    pub(super) fn trim_pools(&self) -> usize {
        let pools = std::mem::take(&mut lock(&self.state).pools);
        let mut n = 0;
        for (_, pool) in pools {
            for (_, map) in pool.free {
                n += 1;
                if let Err(e) = drop_object(map) {
                    warn!(error = %e, "sim: releasing a pool's freed allocation");
                }
            }
        }
        n
    }

    /// The handle of a shareable pool allocation or VMM chunk (chunk `k` of the local
    /// allocation whose data starts at `start`), offered by this instance's fd server from
    /// now on. The caller found the allocation under the state lock it passes in as `st`.
    pub(super) fn export_shared(
        &self,
        mut st: std::sync::MutexGuard<'_, State>,
        start: usize,
        k: usize,
    ) -> Result<IpcHandle, DeviceError> {
        let Some(Region::Local(l)) = st.regions.get(&start) else { unreachable!("the caller found it") };
        let kind = match l.alloc {
            AllocKind::Pool { shareable: true } => SharedKind::Pool,
            AllocKind::Vmm { shareable: true } => SharedKind::Vmm,
            other => unreachable!("{other:?} is not exported by file descriptor"),
        };
        let key = l.buffer_id + k as u64;
        let base = start + k * l.chunk;
        // The legacy handle's fields in the payload: the opener checks them against the fd
        // server's answer, and a foreign handle fails on their magic.
        let fields = HandleFields {
            owner_pid: self.pid,
            nonce: self.nonce,
            buffer_id: key,
            size: l.chunk as u64,
            device: l.dev,
        };
        let mut payload = [0; PAYLOAD_BYTES];
        payload.copy_from_slice(&fields.encode().0[..PAYLOAD_BYTES]);
        let shared = SharedHandle { kind, payload, device: l.dev, pid: self.pid, nonce: self.nonce, key };
        st.offers.insert(key, start);
        drop(st);
        self.start_fd_server()
            .map_err(|e| DeviceError::NotShareable { base, reason: format!("the fd server did not start: {e}") })?;
        Ok(shared.encode())
    }

    /// Starts this instance's fd server unless it runs; it answers from the state.
    fn start_fd_server(&self) -> io::Result<()> {
        let mut server = lock(&self.server);
        if server.is_none() {
            let state = Arc::clone(&self.state);
            let produce = move |key: u64| produce(&state, key);
            *server = Some(FdServer::start(&shareable::fd_dir(), self.pid, self.nonce, Box::new(produce))?);
        }
        Ok(())
    }

    /// Opens a peer's shareable pool allocation or VMM chunk so that device `on` reaches
    /// it: the fd from the exporter's fd server, its range and header page mapped.
    pub(super) fn open_shared(&self, h: &SharedHandle, on: DevId) -> Result<Mapping, DeviceError> {
        let f = HandleFields::decode(&shareable::legacy_handle(&h.payload))?;
        if (f.owner_pid, f.nonce, f.buffer_id, f.device) != (h.pid, h.nonce, h.key, h.device) {
            return Err(bad_handle(format!(
                "the handle's payload (pid {}, buffer {}, device {}) and its fd fields (pid {}, key {}, device {}) disagree: forged or corrupt handle",
                f.owner_pid, f.buffer_id, f.device, h.pid, h.key, h.device
            )));
        }
        if h.pid == self.pid && h.nonce == self.nonce {
            return Err(bad_handle(format!(
                "buffer {} was exported by this process; CUDA cannot open its own handles, use the allocation directly",
                h.key
            )));
        }
        self.check_dev(on)?;
        let key = OpenKey { owner_pid: h.pid, nonce: h.nonce, buffer_id: h.key };
        let reservation = self.reserve(key)?;
        let whose = format!("buffer {} of pid {}", h.key, h.pid);

        let path = fd_share::socket_path(&shareable::fd_dir(), h.pid, h.nonce)
            .map_err(|e| bad_handle(format!("{whose}: fd server path: {e}")))?;
        let (fd, meta) = fd_share::fetch(&path, h.key, shareable::FETCH_TIMEOUT)
            .map_err(|e| bad_handle(format!("{whose}: the file descriptor of its memory: {e}")))?;
        let m = Meta::decode(&meta).ok_or_else(|| {
            bad_handle(format!("{whose}: the fd server sent {} bytes of metadata, not {META_BYTES}", meta.len()))
        })?;
        let expected = match h.kind {
            SharedKind::Pool => AllocKind::Pool { shareable: true },
            SharedKind::Vmm => AllocKind::Vmm { shareable: true },
        };
        let len = usize::try_from(m.len).ok().filter(|&l| l > 0 && m.len == f.size);
        let placed = m.offset >= HEADER_BYTES as u64 && m.offset.is_multiple_of(HEADER_BYTES as u64);
        let (Some(len), true, Some(alloc)) = (len, placed, kind_of(m.alloc).filter(|&k| k == expected)) else {
            return Err(bad_handle(format!("{whose}: the fd server's answer {m:?} does not fit the handle ({f:?})")));
        };
        if m.buffer_id != h.key || m.device != h.device {
            return Err(bad_handle(format!("{whose}: the fd server answered for another allocation ({m:?})")));
        }
        // The object must hold the whole range, or touching its end would raise SIGBUS.
        let (object, identity) =
            object_bytes(fd.as_fd()).map_err(|e| bad_handle(format!("{whose}: fstat of its fd: {e}")))?;
        let end = round_up(len).and_then(|l| l.checked_add(m.offset as usize));
        if end.is_none_or(|end| end as u64 > object) {
            return Err(bad_handle(format!("{whose}: its object holds {object} bytes, less than {m:?} needs")));
        }
        self.check_peer_access(on, h.device, h.pid)?;
        // CUDA's pool import hands back the import this process still holds of an earlier
        // allocation in the same place (the exporter freed it and its pool put this one
        // there), with the old size and bytes (`lab/gpu/memory_kinds.cu`, reuse_hold); the
        // CUDA backend refuses that as a double open, and so does the model.
        let origin = (alloc == AllocKind::Pool { shareable: true }).then_some((identity, m.offset));
        if origin.is_some() {
            let st = lock(&self.state);
            let held = st.regions.values().find_map(|r| match r {
                Region::Peer(p) if p.origin == origin && p.key.owner_pid == h.pid && p.key.nonce == h.nonce => {
                    Some(p.key.buffer_id)
                }
                _ => None,
            });
            if let Some(old) = held {
                debug!(owner = h.pid, old, new = h.key, "sim: pool import where an earlier one is still held");
                return Err(DeviceError::DoubleOpen { owner: h.pid, buffer_id: h.key });
            }
        }
        let mmap_error = |e: io::Error| DeviceError::Driver {
            call: "mmap",
            code: e.raw_os_error().unwrap_or(0) as i64,
            message: format!("mapping {whose}: {e}"),
        };
        let header_map = FdMap::map(fd.as_fd(), 0, HEADER_BYTES).map_err(mmap_error)?;
        let data = FdMap::map(fd.as_fd(), m.offset, len).map_err(mmap_error)?;
        // The mappings hold the memory now.
        drop(fd);
        let hd = header_map.header();
        let (magic, owner_pid, device, code) = (hd.magic, hd.owner_pid, hd.device, hd.alloc);
        let chunk_ok = match alloc {
            AllocKind::Vmm { .. } => hd.chunk_bytes == m.len,
            _ => hd.size == m.len,
        };
        if magic != HEADER_MAGIC || owner_pid != h.pid || device != h.device || code != m.alloc || !chunk_ok {
            return Err(bad_handle(format!(
                "{whose}: its object's header (pid {owner_pid}, device {device}, kind {code}) does not match the handle"
            )));
        }
        // Which chunk of the object's buffer ids the range is (0 for a pool allocation).
        let k = (m.offset - HEADER_BYTES as u64) / m.len;
        // Pairs with the free's store-then-load (LocalAlloc::retire) and the pool's reuse
        // (new id, then not freed): counted first, then both checked.
        hd.mappers.fetch_add(1, Ordering::SeqCst);
        let current = hd.freed.load(Ordering::SeqCst) == 0 && hd.buffer_id.load(Ordering::SeqCst) + k == h.key;
        if !current {
            release_mapper(hd, h.key);
            return Err(bad_handle(format!("{whose}: the owner freed it")));
        }
        if self.cfg.ipc_open_us > 0 {
            sleep_for(Duration::from_micros(self.cfg.ipc_open_us));
        }
        let ptr = data.addr();
        let map = PeerMem::Fd { header: header_map, data };
        lock(&self.state)
            .regions
            .insert(ptr, Region::Peer(PeerMap { key, owner_dev: h.device, size: len, alloc, map, origin }));
        // The key stays reserved until close_handle.
        std::mem::forget(reservation);
        debug!(
            owner = h.pid,
            buffer_id = h.key,
            kind = alloc.name(),
            on,
            ptr = format_args!("{ptr:#x}"),
            "sim: open_handle by fd"
        );
        Ok(Mapping { ptr, size: len })
    }
}

/// Bytes of the object an fd refers to, and its identity (device, inode).
fn object_bytes(fd: BorrowedFd<'_>) -> io::Result<(u64, (u64, u64))> {
    // SAFETY: zeroed stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open and st is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let bytes = u64::try_from(st.st_size).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "negative size"))?;
    Ok((bytes, (st.st_dev, st.st_ino)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_codes_round_trip_and_legacy_is_zero() {
        assert_eq!(kind_code(AllocKind::Legacy), 0);
        for (_, k) in AllocKind::NAMES {
            assert_eq!(kind_of(kind_code(k)), Some(k));
        }
        assert_eq!(kind_of(6), None);
    }

    #[test]
    fn meta_round_trips() {
        let m = Meta { offset: 8192, len: 4096, device: 3, buffer_id: u64::MAX - 7, alloc: 4 };
        assert_eq!(Meta::decode(&m.encode()), Some(m));
        assert_eq!(Meta::decode(&m.encode()[..31]), None);
    }
}
