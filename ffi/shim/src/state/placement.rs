//! What decides an operation's path: whether a buffer is device memory (host ranges
//! remembered in `hostmem`), letting the application's default stream land before
//! gpulmt touches a device buffer, and whether a communicator's rank shares this node.

use std::ffi::c_int;

use gpulmt::device::MemoryKind;
use mpi_sys::*;

use super::Shim;
use crate::raw::*;

impl Shim {
    /// Whether `ptr` (with `len` bytes) is device memory. Host ranges are remembered
    /// (`hostmem`), device buffers always asked (their buffer id matters).
    pub fn is_device(&mut self, ptr: usize, len: usize) -> bool {
        if crate::hostmem::is_host(ptr, len.max(1)) {
            return false;
        }
        match self.ctx.backend().pointer_info(ptr) {
            Ok(i) => match i.kind {
                MemoryKind::Device(dev) => {
                    self.last_device = Some((ptr, dev));
                    true
                }
                MemoryKind::Host => {
                    crate::hostmem::remember(ptr, len);
                    false
                }
            },
            Err(e) => {
                tracing::warn!(ptr = format_args!("{ptr:#x}"), error = %e, "pointer query failed; treating as host memory");
                false
            }
        }
    }

    /// Lets the application's default-stream work on the device of `ptr` land before
    /// gpulmt reads or writes that device buffer: an application may fill or clear it
    /// with a `cudaMemcpy` from pageable memory, which returns before its DMA lands.
    pub(super) fn settle_app_writes(&self, ptr: usize) {
        if !self.settle {
            return;
        }
        let backend = self.ctx.backend();
        // The caller has just asked is_device about this buffer: no second query.
        let dev = match self.last_device {
            Some((p, dev)) if p == ptr => Some(dev),
            _ => match backend.pointer_info(ptr) {
                Ok(gpulmt::device::PointerInfo { kind: MemoryKind::Device(dev), .. }) => Some(dev),
                _ => None,
            },
        };
        if let Some(dev) = dev {
            if let Err(e) = backend.wait_app_default_stream(dev) {
                tracing::warn!(error = %e, "waiting for the application's default stream");
            }
        }
    }

    /// The world rank of rank `rank` of `comm` (gpulmt's context names ranks by their
    /// world rank), and whether it shares this rank's node.
    pub(super) fn world_rank_of(&self, comm: MPI_Comm, rank: c_int) -> Option<(u32, bool)> {
        let world_rank = if comm == comm_world() {
            rank
        } else {
            let (mut inter, mut group, mut out) = (0, group_null(), undefined());
            // SAFETY: a communicator the user passed; locals as out-pointers.
            unsafe {
                PMPI_Comm_test_inter(comm, &mut inter);
                if inter != 0 {
                    PMPI_Comm_remote_group(comm, &mut group);
                } else {
                    PMPI_Comm_group(comm, &mut group);
                }
                PMPI_Group_translate_ranks(group, 1, &rank, self.world_group, &mut out);
                PMPI_Group_free(&mut group);
            }
            out
        };
        let w = u32::try_from(world_rank).ok().filter(|&w| w < self.ctx.size())?;
        Some((w, self.ctx.topology().on_node(w)))
    }

    /// The context rank to move a device message of `bytes` bytes to rank `dest` of `comm`
    /// through gpulmt: on this node from `GPULMT_MPI_LMT_MIN` bytes, on another node
    /// (with the internode path) above its eager limit, below which MPI's own eager
    /// message is as quick. `None`: staged for the MPI library.
    pub(super) fn gpulmt_peer(&self, comm: MPI_Comm, dest: c_int, bytes: usize) -> Option<u32> {
        if bytes < self.lmt_min {
            return None;
        }
        match self.world_rank_of(comm, dest)? {
            (w, true) => Some(w),
            (w, false) if self.offnode && bytes as u64 > self.ctx.config().net.eager_limit => Some(w),
            _ => None,
        }
    }
}
