//! The host shadow of a window over device memory: the memory the MPI library exposes
//! (a library that is not CUDA-aware cannot touch device memory), kept coherent with the
//! device buffer the way MPI's *separate* memory model keeps a window's public copy (the
//! shadow) and its private copy (the device buffer) coherent.
//!
//! The model's rules (MPI 4.0, 12.7) make this exact without knowing which bytes anyone
//! wrote. Once the owner stores to its private copy, no put or accumulate may access
//! the window (even disjoint locations) until the store is made public, and once a put
//! or accumulate has started on the window, the owner may not store to it until the
//! update is made private. So between two synchronizations either the device buffer
//! changed or the shadow did, never both. A *snapshot* holds what both were at the last
//! synchronization:
//! - [`Shadow::publish`] (before `MPI_Win_fence`, `MPI_Win_post`, an owner's
//!   `MPI_Win_unlock`/`MPI_Win_unlock_all`, `MPI_Win_sync`): reads the device buffer, and
//!   writes the chunks that differ from the snapshot to the shadow (the owner's stores);
//! - [`Shadow::absorb`] (after `MPI_Win_fence`, `MPI_Win_wait`/`MPI_Win_test`, an owner's
//!   `MPI_Win_lock`/`MPI_Win_lock_all`, `MPI_Win_sync`, `MPI_Win_free`): writes the chunks
//!   of the shadow that differ from the snapshot to the device buffer (the updates of
//!   puts and accumulates).
//!
//! Only chunks that changed are written, so a synchronization does not undo what the
//! other side wrote elsewhere. A chunk the library is writing while `absorb` reads it
//! (the next epoch's updates, at other ranks already) may reach the device torn; the
//! snapshot then holds the same torn bytes, so the next synchronization finds the
//! finished bytes different and writes them (and the owner may not read a location an
//! update is under way on anyway).
//!
//! Costs: three host copies of the window's size (shadow, snapshot, a buffer the device
//! buffer is read into); each `publish` reads the whole device buffer.

use gpulmt::device::{Backend, DeviceError};

/// Granularity of the comparison.
const CHUNK: usize = 4096;

/// A window's shadow, snapshot and device buffer.
pub struct Shadow {
    backend: Backend,
    /// The device buffer (the window's private copy).
    device: usize,
    size: usize,
    /// The shadow: an anonymous mapping of `size` bytes (at least a page).
    shadow: usize,
    mapped: usize,
    pinned: bool,
    snapshot: Vec<u8>,
    pull: Vec<u8>,
}

// SAFETY: the mapping and buffers are owned by the value; the window's users order their
// calls on it (the registry's lock).
unsafe impl Send for Shadow {}

impl Shadow {
    /// A shadow of `size` bytes of device memory at `device`, holding its contents.
    ///
    /// # Safety
    /// `device..device+size` is device memory of `backend` that stays valid until the
    /// shadow is dropped, and that nothing else writes while `new`, `publish` or `absorb`
    /// runs (MPI's rules for a window's memory during its synchronizations).
    pub unsafe fn new(backend: Backend, device: usize, size: usize) -> Result<Shadow, String> {
        let mapped = size.max(1).div_ceil(CHUNK) * CHUNK;
        // SAFETY: an anonymous private mapping at an address of the kernel's choice.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!("mapping {size} bytes of host memory for the window's shadow failed"));
        }
        let shadow = p as usize;
        // SAFETY: our fresh mapping of `mapped` bytes. Pageable memory works too.
        let pinned = unsafe { backend.register_host(shadow, mapped) }.is_ok();
        let mut s =
            Shadow { backend, device, size, shadow, mapped, pinned, snapshot: vec![0; size], pull: vec![0; size] };
        // SAFETY: the caller's device range; the snapshot is ours.
        unsafe { s.backend.copy_sync(s.snapshot.as_mut_ptr() as usize, device, size) }
            .map_err(|e| format!("reading the window's device memory failed: {e}"))?;
        // SAFETY: the shadow holds `size` bytes; no one else knows it yet.
        unsafe { std::ptr::copy_nonoverlapping(s.snapshot.as_ptr(), shadow as *mut u8, size) };
        Ok(s)
    }

    /// The memory the library exposes.
    pub fn host(&self) -> *mut std::ffi::c_void {
        self.shadow as *mut std::ffi::c_void
    }

    /// The device buffer.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Makes the owner's stores public: chunks of the device buffer that differ from the
    /// snapshot go to the shadow. Returns the bytes written.
    pub fn publish(&mut self) -> Result<usize, DeviceError> {
        // SAFETY: the device range of `new`'s contract; the pull buffer is ours.
        unsafe { self.backend.copy_sync(self.pull.as_mut_ptr() as usize, self.device, self.size) }?;
        let mut written = 0;
        for at in (0..self.size).step_by(CHUNK) {
            let end = (at + CHUNK).min(self.size);
            if self.pull[at..end] != self.snapshot[at..end] {
                self.snapshot[at..end].copy_from_slice(&self.pull[at..end]);
                // SAFETY: the shadow holds `size` bytes; the library reads it concurrently at
                // most (the model forbids updates to the window while stores are unpublished).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.pull.as_ptr().add(at),
                        (self.shadow as *mut u8).add(at),
                        end - at,
                    )
                };
                written += end - at;
            }
        }
        Ok(written)
    }

    /// Makes the updates of puts and accumulates private: chunks of the shadow that differ
    /// from the snapshot go to the device buffer. Returns the bytes written.
    pub fn absorb(&mut self) -> Result<usize, DeviceError> {
        let mut written = 0;
        let mut run: Option<(usize, usize)> = None;
        let mut chunk = [0u8; CHUNK];
        for at in (0..self.size).step_by(CHUNK) {
            let end = (at + CHUNK).min(self.size);
            let n = end - at;
            // One read of the chunk (the library may be writing it: see the module's doc).
            // SAFETY: the shadow holds `size` bytes.
            unsafe { std::ptr::copy_nonoverlapping((self.shadow as *const u8).add(at), chunk.as_mut_ptr(), n) };
            if chunk[..n] == self.snapshot[at..end] {
                if let Some(r) = run.take() {
                    written += self.write_back(r)?;
                }
                continue;
            }
            self.snapshot[at..end].copy_from_slice(&chunk[..n]);
            run = Some(run.map_or((at, end), |(s, _)| (s, end)));
        }
        if let Some(r) = run {
            written += self.write_back(r)?;
        }
        Ok(written)
    }

    /// Copies the snapshot's bytes `start..end` to the device buffer.
    fn write_back(&self, (start, end): (usize, usize)) -> Result<usize, DeviceError> {
        // SAFETY: the device range of `new`'s contract; the snapshot is ours.
        unsafe { self.backend.copy_sync(self.device + start, self.snapshot.as_ptr() as usize + start, end - start) }?;
        Ok(end - start)
    }
}

impl Drop for Shadow {
    fn drop(&mut self) {
        if self.pinned {
            // SAFETY: registered in `new`; no copy runs on it any more.
            let _ = unsafe { self.backend.unregister_host(self.shadow) };
        }
        // SAFETY: our mapping, which the library no longer uses (the window is freed).
        unsafe { libc::munmap(self.shadow as *mut libc::c_void, self.mapped) };
    }
}
