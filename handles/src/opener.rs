//! The one thing this crate needs from a GPU runtime: opening and closing a
//! mapping of a peer's exported buffer.
//!
//! Keeping this a trait (instead of calling the CUDA driver directly) lets the
//! cache and the two-phase free protocol be built and tested on machines with
//! no GPU, and lets the tests use a mock that is *stricter* than the driver.

use std::fmt::Debug;
use std::hash::Hash;

/// Opens and closes local mappings of memory exported by another process.
///
/// For CUDA this is `cuIpcOpenMemHandle` / `cuIpcCloseMemHandle`. The driver
/// refuses to open the same handle twice in one process, so callers must never
/// call [`open`](Self::open) for a key that is already open;
/// [`HandleCache`](crate::HandleCache) guarantees that.
pub trait MappingOpener {
    /// Identifies one exported allocation, e.g. `(peer rank, peer device,
    /// exporter's buffer id)`.
    ///
    /// It must change whenever the exporter frees and reallocates, even at the
    /// same address: a key made from the address alone would hand out a stale
    /// mapping of freed memory. Two keys must never name the same handle, or
    /// the cache would open it twice.
    type Key: Clone + Eq + Hash + Debug;
    /// What opening needs (e.g. the 64-byte IPC handle and the local device).
    type Handle;
    /// The local mapping (e.g. device pointer and size). `Copy` because the
    /// cache hands the same mapping to every concurrent user.
    type Mapping: Copy + Debug;
    /// Why an open or close failed.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Maps the exported allocation into this process.
    fn open(&mut self, key: &Self::Key, handle: &Self::Handle) -> Result<Self::Mapping, Self::Error>;

    /// Unmaps a mapping previously returned by [`open`](Self::open) for `key`.
    fn close(&mut self, key: &Self::Key, mapping: Self::Mapping) -> Result<(), Self::Error>;
}
