//! What one backend instance has mapped: its own allocations and the peers' allocations
//! it opened, by the address of their data, the host ranges registered with it, the
//! freed pool allocations its pools keep for reuse and what its fd server offers.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;

use super::kinds::FdMap;
use super::object::{header, shm_error, unlink, Header};
use crate::device::{AllocKind, DevId, DeviceError, PointerInfo};
use crate::shm::object::ShmSegment;
use crate::shm::owner::OwnerLock;

/// Identifies one allocation of one backend instance across the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct OpenKey {
    pub(super) owner_pid: u32,
    pub(super) nonce: u64,
    pub(super) buffer_id: u64,
}

#[derive(Debug)]
pub(super) struct LocalAlloc {
    pub(super) dev: DevId,
    /// Bytes of device memory from the data's start: the caller's size (at least 1), or a
    /// VMM range's whole length (`chunks * chunk`), which a copy may run through.
    pub(super) size: usize,
    /// The allocation's buffer id; a VMM range's chunk `k` has `buffer_id + k`.
    pub(super) buffer_id: u64,
    /// The whole object: header page, then the data.
    pub(super) map: ShmSegment,
    pub(super) alloc: AllocKind,
    /// Physical chunks behind the range (1 but for VMM memory).
    pub(super) chunks: u32,
    /// Bytes of each chunk (`size` but for VMM memory).
    pub(super) chunk: usize,
}

/// How a peer allocation is mapped here.
#[derive(Debug)]
pub(super) enum PeerMem {
    /// Opened by a legacy handle: the owner's whole object, by name (header page, then
    /// the data).
    Object(ShmSegment),
    /// Opened by the file descriptor the owner's fd server sent: its header page and the
    /// allocation's (or VMM chunk's) range, each mapped on its own.
    Fd { header: FdMap, data: FdMap },
}

impl PeerMem {
    /// The owner's header page.
    pub(super) fn header(&self) -> &Header {
        match self {
            PeerMem::Object(map) => header(map),
            PeerMem::Fd { header, .. } => header.header(),
        }
    }

    /// Unmaps it now, reporting a failure.
    pub(super) fn unmap(self) -> Result<(), DeviceError> {
        match self {
            PeerMem::Object(map) => map.unmap().map_err(shm_error),
            PeerMem::Fd { header, data } => {
                let data = data.unmap();
                header.unmap().and(data).map_err(|e| DeviceError::Driver {
                    call: "munmap",
                    code: e.raw_os_error().unwrap_or(0) as i64,
                    message: format!("unmapping a peer allocation: {e}"),
                })
            }
        }
    }
}

#[derive(Debug)]
pub(super) struct PeerMap {
    pub(super) key: OpenKey,
    pub(super) owner_dev: DevId,
    pub(super) size: usize,
    /// The owner's kind of memory (a legacy handle's is `Legacy`).
    pub(super) alloc: AllocKind,
    pub(super) map: PeerMem,
    /// A pool import's place in the exporter's memory (object identity, offset): a second
    /// import there while this one is held is refused (`kinds.rs`).
    pub(super) origin: Option<((u64, u64), u64)>,
}

#[derive(Debug)]
pub(super) enum Region {
    Local(LocalAlloc),
    Peer(PeerMap),
}

impl Region {
    pub(super) fn size(&self) -> usize {
        match self {
            Region::Local(l) => l.size,
            Region::Peer(p) => p.size,
        }
    }
}

#[derive(Default)]
pub(super) struct State {
    /// Local allocations and peer mappings, keyed by the address of their data.
    pub(super) regions: BTreeMap<usize, Region>,
    /// Handles open (or being opened) in this instance; reserved before the slow part
    /// of `open_handle` so two threads opening one handle cannot both succeed.
    pub(super) open_keys: HashSet<OpenKey>,
    /// Registered host ranges: start -> length.
    pub(super) host: BTreeMap<usize, usize>,
    /// The owner object of this instance's objects, made by an allocation when there is
    /// none and released when the last allocation is freed: held while it exists, it
    /// tells the sweep that they are in use (see
    /// [`crate::shm::owner`]); once the process dies, that they are abandoned.
    pub(super) owner: Option<OwnerLock>,
    /// Host-mapped allocations (`alloc_host_mapped`): start -> length of the mapping.
    pub(super) host_mapped: BTreeMap<usize, usize>,
    /// Freed pool allocations kept for reuse, per (device, shareable) pool.
    pub(super) pools: HashMap<(DevId, bool), PoolCache>,
    /// What the fd server hands out: key (a pool allocation's or VMM chunk's buffer id) ->
    /// the start of the allocation (range) that holds it. Entries go when it is freed.
    pub(super) offers: HashMap<u64, usize>,
}

/// The freed allocations of one pool that it keeps, with their objects and mappings, to
/// hand out again at the same address (real pools do so constantly): oldest first.
#[derive(Debug, Default)]
pub(super) struct PoolCache {
    /// (size the allocation was made with, its object).
    pub(super) free: VecDeque<(usize, ShmSegment)>,
    /// Bytes of the objects in `free`.
    pub(super) bytes: usize,
}

impl State {
    /// Whether this instance still has objects in `/dev/shm`: allocations, or freed pool
    /// allocations kept for reuse (the owner object must live as long as either).
    pub(super) fn has_objects(&self) -> bool {
        self.regions.values().any(|r| matches!(r, Region::Local(_))) || self.pools.values().any(|p| !p.free.is_empty())
    }

    /// The region holding `ptr`, with its data address.
    pub(super) fn find(&self, ptr: usize) -> Option<(usize, &Region)> {
        let (&base, r) = self.regions.range(..=ptr).next_back()?;
        (ptr - base < r.size()).then_some((base, r))
    }

    /// Fails if `[ptr, ptr+len)` starts inside device memory but runs past its end:
    /// the driver faults on such a copy, and silently overrunning into the next page
    /// of shared memory would hide the bug.
    pub(super) fn check_range(&self, op: &'static str, ptr: usize, len: usize) -> Result<(), DeviceError> {
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

impl LocalAlloc {
    /// What [`pointer_info`](crate::device::DeviceBackend::pointer_info) says of `ptr`, an
    /// address inside this allocation whose data starts at `base`: for VMM memory the
    /// chunk that holds it, with the rest of the range as its span.
    pub(super) fn info(&self, base: usize, ptr: usize) -> PointerInfo {
        let k = (ptr - base) / self.chunk;
        let info =
            PointerInfo::device(self.dev, base + k * self.chunk, self.chunk, self.buffer_id + k as u64, self.alloc);
        PointerInfo { span: self.size - k * self.chunk, ..info }
    }

    /// The buffer ids of its chunks (the allocation's one id but for VMM memory).
    pub(super) fn ids(&self) -> std::ops::Range<u64> {
        self.buffer_id..self.buffer_id + u64::from(self.chunks)
    }

    /// Marks the allocation freed in its header; returns how many peers still map it.
    pub(super) fn retire(&self) -> u32 {
        let h = header(&self.map);
        // SeqCst store-then-load, mirrored by the opens' add-then-load: at least one side
        // sees the other, so a peer cannot slip in unnoticed between the check and the
        // unlink (at worst both back off, which is safe).
        h.freed.store(1, Ordering::SeqCst);
        h.mappers.load(Ordering::SeqCst)
    }

    /// Releases a local allocation already removed from the registry. Returns the
    /// number of peers that still mapped it, or the first libc error.
    pub(super) fn release(self) -> Result<u32, DeviceError> {
        let mappers = self.retire();
        drop_object(self.map)?;
        Ok(mappers)
    }
}

/// Removes an object of this instance and unmaps it (an allocation freed, or a freed pool
/// allocation the pool lets go).
pub(super) fn drop_object(map: ShmSegment) -> Result<(), DeviceError> {
    // Unlink even if unmapping fails: the name must not outlive the allocation.
    let unlinked = unlink(map.name());
    let unmapped = map.unmap().map_err(shm_error);
    unmapped.and(unlinked)
}
