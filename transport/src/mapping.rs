//! Adapts the device layer to the handle cache: the receiver side's opened peer
//! mappings are `HandleCache<DeviceOpener>` entries, keyed by the exporter's rank,
//! device and buffer id (never by address: a freed and reallocated buffer gets a
//! new id, so it can never hit a stale mapping).

use gpulmt_handles::MappingOpener;

use crate::device::{Backend, DevId, DeviceError, IpcHandle, Mapping};

/// Identifies one exported allocation of a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerBufferKey {
    pub peer: u32,
    pub device: u32,
    pub buffer_id: u64,
}

/// Opens and closes peer mappings through the active backend, on this rank's device.
pub struct DeviceOpener {
    pub backend: Backend,
    pub device: DevId,
}

impl MappingOpener for DeviceOpener {
    type Key = PeerBufferKey;
    type Handle = IpcHandle;
    type Mapping = Mapping;
    type Error = DeviceError;

    fn open(&mut self, _key: &PeerBufferKey, handle: &IpcHandle) -> Result<Mapping, DeviceError> {
        self.backend.open_handle(handle, self.device)
    }

    fn close(&mut self, _key: &PeerBufferKey, mapping: Mapping) -> Result<(), DeviceError> {
        // SAFETY: the handle cache closes a mapping only once no lease on it is held, and
        // every copy through a mapping holds a lease until it has finished (progress.rs);
        // nothing else uses the addresses of a closed mapping.
        unsafe { self.backend.close_handle(mapping) }
    }
}
