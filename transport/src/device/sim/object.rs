//! An allocation's shared-memory object: its name, the header page in front of its data,
//! and the 64-byte handle another process opens it by. The objects themselves are made,
//! mapped and removed through [`crate::shm::object`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tracing::warn;

use crate::device::{DevId, DeviceError, IpcHandle, IPC_HANDLE_BYTES};
use crate::shm::object::{ShmError, ShmSegment, SIM_PREFIX};
use crate::shm::owner::OWNER_SUFFIX;

/// Size of the header page in front of each allocation's data.
pub(super) const HEADER_BYTES: usize = 4096;
/// Allocation sizes are rounded up to this, as the driver rounds to its granularity.
const ALLOC_GRANULARITY: usize = 4096;

/// Magic of the header page ("GLMTSIMA").
pub(super) const HEADER_MAGIC: u64 = u64::from_le_bytes(*b"GLMTSIMA");
/// Magic of an exported handle ("GLMTSIMH"); differs from the header's so that a
/// header page mistaken for a handle (or the reverse) is caught.
const HANDLE_MAGIC: u64 = u64::from_le_bytes(*b"GLMTSIMH");
/// Version of the handle layout; bump when [`HandleFields`] changes.
const HANDLE_VERSION: u32 = 1;

/// The first bytes of every allocation's shared-memory object. The plain fields are
/// written once by the owner before the handle can be exported, so openers read them
/// without synchronisation; the atomics are shared between processes (atomics on a
/// MAP_SHARED mapping are coherent across processes on every platform we run on).
///
/// The fields after `freed` were added with the kinds of memory (`kinds.rs`); an object
/// of an older build has zeros there, which read as a legacy allocation of one chunk.
#[repr(C)]
pub(super) struct Header {
    pub(super) magic: u64,
    pub(super) owner_pid: u32,
    pub(super) device: u32,
    /// The allocation's buffer id (a VMM range's: its first chunk's, the others follow it).
    /// Atomic because a pool object the owner recycles gets a new one while a peer may be
    /// checking it (`kinds.rs`); written once for every other kind.
    pub(super) buffer_id: AtomicU64,
    /// Data size as allocated (the caller's size, at least 1; a VMM range's whole length).
    pub(super) size: u64,
    /// Number of other processes (backend instances) that have it open.
    pub(super) mappers: AtomicU32,
    /// Set to 1 by the owner when it frees the allocation (a pool object: back to 0 when
    /// the pool hands it out again).
    pub(super) freed: AtomicU32,
    /// The kind of memory, as [`kind_code`](super::kinds::kind_code) numbers them (0: legacy).
    pub(super) alloc: u32,
    /// VMM: the number of chunks (0 in objects of older builds: one).
    pub(super) chunks: u32,
    /// VMM: bytes of each chunk (0 in objects of older builds: `size`).
    pub(super) chunk_bytes: u64,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);

/// The fields of an exported handle, little-endian in its 64 bytes:
/// `[0..8)` magic, `[8..12)` version, `[12..16)` owner pid, `[16..24)` nonce,
/// `[24..32)` buffer id, `[32..40)` size, `[40..44)` device, rest zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HandleFields {
    pub(super) owner_pid: u32,
    pub(super) nonce: u64,
    pub(super) buffer_id: u64,
    pub(super) size: u64,
    pub(super) device: DevId,
}

impl HandleFields {
    pub(super) fn encode(&self) -> IpcHandle {
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

    pub(super) fn decode(h: &IpcHandle) -> Result<HandleFields, DeviceError> {
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
pub(super) fn shm_name(pid: u32, nonce: u64, buffer_id: u64) -> String {
    format!("{SIM_PREFIX}{pid}-{nonce:016x}-{buffer_id}")
}

/// Name of the owner object of a backend instance's allocations (see
/// [`crate::shm::owner::OwnerLock`]): their common prefix and [`OWNER_SUFFIX`].
pub(super) fn owner_name(pid: u32, nonce: u64) -> String {
    format!("{SIM_PREFIX}{pid}-{nonce:016x}-{OWNER_SUFFIX}")
}

/// Bytes of the whole object (header page + data rounded up) for a data size; None when
/// no object can be that large (it must fit `off_t`).
pub(super) fn object_len(size: usize) -> Option<usize> {
    round_up(size.max(1))?.checked_add(HEADER_BYTES).filter(|&len| libc::off_t::try_from(len).is_ok())
}

/// `bytes` rounded up to the allocation granularity (a page: what `mmap` maps, so that a
/// VMM chunk starts at an offset a peer can map on its own); None on overflow.
pub(super) fn round_up(bytes: usize) -> Option<usize> {
    Some(bytes.checked_add(ALLOC_GRANULARITY - 1)? / ALLOC_GRANULARITY * ALLOC_GRANULARITY)
}

pub(super) fn bad_handle(reason: impl Into<String>) -> DeviceError {
    DeviceError::BadHandle { reason: reason.into() }
}

/// A failure of the shared-memory layer as a [`DeviceError::Driver`] naming the libc call
/// (and its errno) where there is one.
pub(super) fn shm_error(e: ShmError) -> DeviceError {
    // Out of /dev/shm is what out of device memory looks like here: say so.
    let e = match e {
        ShmError::NoSpace { name, needed, free, size, .. } => ShmError::NoSpace {
            what: "the sim device allocation (simulated device memory lives in /dev/shm)",
            name,
            needed,
            free,
            size,
        },
        e => e,
    };
    let call = match &e {
        ShmError::Os { call, .. } => call,
        _ => "shm",
    };
    DeviceError::Driver { call, code: e.raw_os_error().unwrap_or(0) as i64, message: e.to_string() }
}

/// Removes an allocation's object name; unlike cleanup paths, a name already gone is an
/// error here: only this instance removes its own names while it lives.
pub(super) fn unlink(name: &str) -> Result<(), DeviceError> {
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
pub(super) fn header(map: &ShmSegment) -> &Header {
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
pub(super) fn fresh_nonce() -> u64 {
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
pub(super) fn release_mapper(h: &Header, buffer_id: u64) {
    if h.mappers.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_err() {
        warn!(buffer_id, "sim: mapper count of a peer allocation was already 0");
    }
}
