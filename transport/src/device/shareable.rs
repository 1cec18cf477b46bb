//! The layout of an [`IpcHandle`] by kind of memory, shared by the backends.
//!
//! A legacy handle is the driver's 64 bytes (`CUipcMemHandle`) with zeros after them. The
//! memory a shareable handle type lets cross (pool and VMM allocations, [`AllocKind`])
//! needs a file descriptor besides: the handle then says which kind it is, which
//! exporter's fd server hands out the descriptor (its pid and nonce: `fd_share`) and under
//! which key, so that the importer fetches it over a Unix socket with `SCM_RIGHTS`.
//!
//! ```text
//! [0..64)  the backend's payload: CUipcMemHandle | CUmemPoolPtrExportData | zeros (VMM)
//! [64]     kind: 0 legacy, 1 pool allocation, 2 VMM chunk
//! [65..68) zero
//! [68..72) the exporter's device (u32, little endian)
//! [72..76) the exporter's pid
//! [76..80) zero
//! [80..88) the exporter's nonce (tells two instances of one pid apart)
//! [88..96) key: the pool's key (pool), the chunk's buffer id (VMM)
//! ```

use super::{DevId, DeviceError, IpcHandle, IPC_HANDLE_BYTES};

/// Bytes of the backend's payload at the start of a handle.
pub(crate) const PAYLOAD_BYTES: usize = 64;
const KIND_AT: usize = 64;
const DEVICE_AT: usize = 68;
const PID_AT: usize = 72;
const NONCE_AT: usize = 80;
const KEY_AT: usize = 88;
const _: () = assert!(KEY_AT + 8 == IPC_HANDLE_BYTES, "the layout fills the handle");

/// What a handle's fd names, for memory that crosses as a file descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum SharedKind {
    /// An allocation of a pool: the fd is the pool's, the payload the allocation's export data.
    Pool,
    /// A VMM chunk (one physical allocation): the fd is the chunk's.
    Vmm,
}

/// A decoded handle of memory that crosses as a file descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SharedHandle {
    pub(crate) kind: SharedKind,
    pub(crate) payload: [u8; PAYLOAD_BYTES],
    pub(crate) device: DevId,
    pub(crate) pid: u32,
    pub(crate) nonce: u64,
    pub(crate) key: u64,
}

impl SharedHandle {
    pub(crate) fn encode(&self) -> IpcHandle {
        let mut b = [0u8; IPC_HANDLE_BYTES];
        b[..PAYLOAD_BYTES].copy_from_slice(&self.payload);
        b[KIND_AT] = match self.kind {
            SharedKind::Pool => 1,
            SharedKind::Vmm => 2,
        };
        b[DEVICE_AT..DEVICE_AT + 4].copy_from_slice(&self.device.to_le_bytes());
        b[PID_AT..PID_AT + 4].copy_from_slice(&self.pid.to_le_bytes());
        b[NONCE_AT..NONCE_AT + 8].copy_from_slice(&self.nonce.to_le_bytes());
        b[KEY_AT..KEY_AT + 8].copy_from_slice(&self.key.to_le_bytes());
        IpcHandle(b)
    }

    /// The shared handle in `h`; None for a legacy one (kind 0); an unknown kind is a
    /// forged or corrupt handle.
    pub(crate) fn decode(h: &IpcHandle) -> Result<Option<SharedHandle>, DeviceError> {
        let b = &h.0;
        let kind = match b[KIND_AT] {
            0 => return Ok(None),
            1 => SharedKind::Pool,
            2 => SharedKind::Vmm,
            k => {
                return Err(DeviceError::BadHandle {
                    reason: format!("unknown kind {k} of memory (forged or corrupt handle)"),
                })
            }
        };
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        Ok(Some(SharedHandle {
            kind,
            payload: b[..PAYLOAD_BYTES].try_into().expect("payload bytes"),
            device: u32_at(DEVICE_AT),
            pid: u32_at(PID_AT),
            nonce: u64_at(NONCE_AT),
            key: u64_at(KEY_AT),
        }))
    }
}

/// A legacy handle: the driver's bytes, zeros after them (kind 0).
pub(crate) fn legacy_handle(payload: &[u8; PAYLOAD_BYTES]) -> IpcHandle {
    let mut b = [0u8; IPC_HANDLE_BYTES];
    b[..PAYLOAD_BYTES].copy_from_slice(payload);
    IpcHandle(b)
}

/// Where fd servers listen: beside the job's shared memory, which every rank of a node
/// shares (containers too), unlike a PID namespace.
pub(crate) fn fd_dir() -> std::path::PathBuf {
    std::path::PathBuf::from("/dev/shm")
}

/// How long an importer waits for an exporter's fd server to answer.
pub(crate) const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_handles_round_trip_and_legacy_ones_say_so() {
        for kind in [SharedKind::Pool, SharedKind::Vmm] {
            let h =
                SharedHandle { kind, payload: [7; PAYLOAD_BYTES], device: 3, pid: 4242, nonce: u64::MAX - 1, key: 99 };
            assert_eq!(SharedHandle::decode(&h.encode()).unwrap(), Some(h));
        }
        assert_eq!(SharedHandle::decode(&legacy_handle(&[9; PAYLOAD_BYTES])).unwrap(), None);
        let mut forged = legacy_handle(&[0; PAYLOAD_BYTES]);
        forged.0[KIND_AT] = 7;
        assert!(matches!(SharedHandle::decode(&forged), Err(DeviceError::BadHandle { .. })));
    }
}
