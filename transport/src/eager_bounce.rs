//! The context's pinned bounce buffer for small device payloads: an eager send from device
//! memory is copied out through it, and an eager payload for a device buffer copied in.
//!
//! Why not a plain vector: a copy between device memory and pageable host memory costs
//! the driver a staging copy of its own and, for the backend, a pointer query of an
//! address it has never seen; between device memory and pinned memory the backend knows,
//! the CUDA backend makes a small copy without any driver call when its copy server runs
//! (`GPULMT_COPY_SERVER_MAX`), or with one copy engine call otherwise. On an 8 B
//! device-to-device message across nodes the two copies are most of the latency
//! (`docs/performance.md`, the internode section).
//!
//! The copies run on a lane of their own ([`EAGER_LANE`]) and are waited for with
//! [`DeviceBackend::copy_wait`](crate::device::DeviceBackend::copy_wait): like the
//! rendezvous copies, and unlike `copy_sync`, they are not ordered after the application's
//! legacy default stream (a stream query of 1.8 us per copy under MPS, measured on one
//! H200): a send buffer's data is final when the send is posted, as the API requires (the
//! PMPI shim waits for that stream itself, `GPULMT_MPI_SETTLE`).
//!
//! The buffer is allocated at the first device eager payload, as large as the largest
//! eager payload the configuration allows; a larger one (none should exist) goes through
//! a vector and `copy_sync`.

use crate::device::{Backend, DevId, DeviceError, HostMapped};

/// The copy lane of eager payloads: a stream of its own on the copy engine, so that a small
/// payload never waits behind the progress engine's rendezvous copies (lanes below 16) or
/// the internode proxy's staging (`net::stream::NET_LANE`).
pub(crate) const EAGER_LANE: u32 = 17;

/// A pinned buffer of `len` bytes, freed with the context.
pub(crate) struct EagerBounce {
    backend: Backend,
    mem: Option<HostMapped>,
    len: usize,
}

impl EagerBounce {
    /// A bounce buffer of `len` bytes, allocated at its first use.
    pub fn new(backend: Backend, len: usize) -> EagerBounce {
        EagerBounce { backend, mem: None, len }
    }

    /// The buffer's host address, allocating it first; None when `len` does not fit or the
    /// allocation failed (the caller copies through a vector instead, and the failure is
    /// logged once).
    fn buffer(&mut self, len: usize) -> Option<usize> {
        if len > self.len {
            return None;
        }
        if self.mem.is_none() {
            match self.backend.alloc_host_mapped(self.len) {
                Ok(m) => self.mem = Some(m),
                Err(e) => {
                    tracing::warn!(error = %e, bytes = self.len, "no pinned bounce buffer for eager device payloads; they go through pageable memory");
                    self.len = 0;
                    return None;
                }
            }
        }
        self.mem.map(|m| m.host)
    }

    /// Copies `len` bytes between the bounce buffer `b` and device memory on `dev`, and
    /// waits. After a failed copy or poll the copy may still touch the buffer: it is given
    /// up (leaked, not freed) and the next payload allocates another.
    ///
    /// # Safety
    /// `dst`/`src` as `copy_async` requires, one of them `b`.
    unsafe fn copy(&mut self, dev: DevId, dst: usize, src: usize, len: usize) -> Result<(), DeviceError> {
        // SAFETY: the caller's contract; copy_wait returns once the copy has finished.
        let r = unsafe { self.backend.copy_wait(dev, EAGER_LANE, dst, src, len) };
        if r.is_err() {
            tracing::warn!(bytes = self.len, "the eager bounce buffer is given up after a failed copy");
            self.mem = None;
        }
        r
    }

    /// Reads `len` bytes of device memory at `src` on `dev` into a new vector.
    ///
    /// # Safety
    /// `src..src+len` is device memory of `dev` of this backend that nothing writes during
    /// the call.
    pub unsafe fn read_device(&mut self, dev: DevId, src: usize, len: usize) -> Result<Vec<u8>, DeviceError> {
        let mut v = vec![0u8; len];
        if len == 0 {
            return Ok(v);
        }
        match self.buffer(len) {
            Some(b) => {
                // SAFETY: the bounce buffer holds `self.len >= len` bytes and is ours alone
                // (the context's thread); the source is the caller's. The copy has finished
                // when this returns Ok, so the bytes may be read right after.
                unsafe { self.copy(dev, b, src, len)? };
                // SAFETY: `len` bytes just written by the copy, inside the buffer.
                v.copy_from_slice(unsafe { std::slice::from_raw_parts(b as *const u8, len) });
            }
            // SAFETY: the source as above; the destination our own vector of `len` bytes.
            None => unsafe { self.backend.copy_sync(v.as_mut_ptr() as usize, src, len)? },
        }
        Ok(v)
    }

    /// Writes `bytes` into device memory at `dst` on `dev`.
    ///
    /// # Safety
    /// `dst..dst+bytes.len()` is device memory of `dev` of this backend that nothing else
    /// accesses during the call.
    pub unsafe fn write_device(&mut self, dev: DevId, dst: usize, bytes: &[u8]) -> Result<(), DeviceError> {
        if bytes.is_empty() {
            return Ok(());
        }
        match self.buffer(bytes.len()) {
            Some(b) => {
                // SAFETY: inside the bounce buffer, which is ours alone.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b as *mut u8, bytes.len()) };
                // SAFETY: the bounce buffer holds the bytes; the destination is the
                // caller's contract; the copy has finished when this returns.
                unsafe { self.copy(dev, dst, b, bytes.len()) }
            }
            // SAFETY: as above, from the caller's slice.
            None => unsafe { self.backend.copy_sync(dst, bytes.as_ptr() as usize, bytes.len()) },
        }
    }
}

impl Drop for EagerBounce {
    fn drop(&mut self) {
        if let Some(m) = self.mem.take() {
            // SAFETY: every copy through the buffer was waited for (a buffer whose copy
            // failed was given up), so none still uses it.
            if let Err(e) = unsafe { self.backend.free_host_mapped(m.host) } {
                tracing::warn!(error = %e, "freeing the eager bounce buffer");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::sim::{PeerMatrix, SimBackend, SimConfig};
    use std::sync::Arc;

    #[test]
    fn round_trips_through_device_memory_and_falls_back_when_too_large() {
        let cfg = SimConfig {
            devices: 1,
            peer: PeerMatrix::All,
            ipc_open_us: 0,
            copy_inline: false,
            copy_done_ns: 0,
            refuse_opens: false,
            driver: None,
        };
        let backend: Backend = Arc::new(SimBackend::new(cfg).expect("sim backend"));
        let dev = backend.alloc(0, 4096).expect("alloc");
        let mut bounce = EagerBounce::new(backend.clone(), 64);
        let data: Vec<u8> = (0..100u8).collect();
        for len in [0, 1, 64, 100] {
            // SAFETY: `dev` is a 4 KiB allocation of this backend that nothing else uses.
            unsafe { bounce.write_device(0, dev, &data[..len]).expect("write") };
            // SAFETY: as above.
            let back = unsafe { bounce.read_device(0, dev, len).expect("read") };
            assert_eq!(back, &data[..len], "{len} bytes");
        }
        assert!(bounce.mem.is_some(), "the buffer was allocated at the first fitting payload");
        drop(bounce);
        // SAFETY: allocated above; nothing uses it any more.
        unsafe { backend.free(dev).expect("free") };
    }
}
