//! What one backend instance has mapped: its own allocations and the peers' allocations
//! it opened, by the address of their data, and the host ranges registered with it.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering;

use super::object::{header, shm_error, unlink};
use crate::device::{DevId, DeviceError};
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
    pub(super) size: usize,
    pub(super) buffer_id: u64,
    /// The whole object: header page, then the data.
    pub(super) map: ShmSegment,
}

#[derive(Debug)]
pub(super) struct PeerMap {
    pub(super) key: OpenKey,
    pub(super) owner_dev: DevId,
    pub(super) size: usize,
    /// The whole object: header page, then the data.
    pub(super) map: ShmSegment,
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
}

impl State {
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
    /// Releases a local allocation already removed from the registry. Returns the
    /// number of peers that still mapped it, or the first libc error.
    pub(super) fn release(self) -> Result<u32, DeviceError> {
        let h = header(&self.map);
        // SeqCst store-then-load, mirrored by open_handle's add-then-load: at least
        // one side sees the other, so a peer cannot slip in unnoticed between the
        // check and the unlink (at worst both back off, which is safe).
        h.freed.store(1, Ordering::SeqCst);
        let mappers = h.mappers.load(Ordering::SeqCst);
        // Unlink even if unmapping fails: the name must not outlive the allocation.
        let unlinked = unlink(self.map.name());
        let unmapped = self.map.unmap().map_err(shm_error);
        unmapped.and(unlinked)?;
        Ok(mappers)
    }
}
