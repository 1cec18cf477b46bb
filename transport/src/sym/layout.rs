//! What device code sees of the symmetric heap: the control area at the start of every
//! rank's heap, and the device context the host fills for kernels. Both are restated
//! in `include/gpulmt_device.cuh` (`GPULMT_CTRL_*`, `gpulmt_device_ctx`); a test
//! compiles that header as C and compares every offset and size with these.
//!
//! # The control area (first [`reserved_bytes`] of each heap)
//! | offset | bytes | what | written by |
//! |---|---|---|---|
//! | [`CTRL_ERRORS`] | 32 | rejected device accesses: count, then the first one's op and PE, symmetric address, size | the device's checks |
//! | [`CTRL_BARRIER_EPOCH`] | 8 | `barrier_all` calls this PE made (its own line) | the PE's barrier thread |
//! | [`CTRL_GRID_COUNT`] | 8 | blocks arrived at the local grid barrier | the PE's blocks |
//! | [`CTRL_GRID_GENERATION`] | 8 | grid barriers completed (its own line) | the last block to arrive |
//! | [`CTRL_BASES`] | 8 x n PEs | each PE's heap as mapped in this process; 0: not mappable | the host at setup |
//! | [`ctrl_barrier_arrivals`] | 8 x n PEs | word p: the last `barrier_all` epoch PE p announced here | PE p alone, by a release store (direct) or the proxy's signal set (off-node) |
//!
//! Counters live on lines of their own (128 bytes apart): a PE's spin on its grid
//! barrier must not share a line with words other threads write. The arrivals of
//! `barrier_all` are a word per PE, not one counter: an off-node PE's arrival is written
//! by a proxy, which on CUDA cannot add atomically against the GPU's own atomics
//! (docs/memory-model.md), and a plain store of one writer needs no read-modify-write. The area is zeroed when the
//! heap is set up; allocations start at [`reserved_bytes`].

/// Version of [`DeviceCtx`] (`GPULMT_DEVICE_CTX_VERSION`): device code built against
/// another layout refuses the context (the header checks it).
pub const DEVICE_CTX_VERSION: u32 = 1;

/// Offset of the record of rejected device accesses: `[count, op << 32 | pe, address, bytes]`.
pub const CTRL_ERRORS: u64 = 0;
/// Offset of the PE's own count of `barrier_all` calls.
pub const CTRL_BARRIER_EPOCH: u64 = 128;
/// Offset of the local grid barrier's arrival count.
pub const CTRL_GRID_COUNT: u64 = 384;
/// Offset of the local grid barrier's generation.
pub const CTRL_GRID_GENERATION: u64 = 512;
/// Offset of the table of every PE's heap base as mapped here.
pub const CTRL_BASES: u64 = 640;
// Each counter on a line of its own, the table after them.
const _: () = {
    let words = [CTRL_ERRORS, CTRL_BARRIER_EPOCH, CTRL_GRID_COUNT, CTRL_GRID_GENERATION, CTRL_BASES];
    let mut i = 1;
    while i < words.len() {
        assert!(words[i] - words[i - 1] >= 128);
        i += 1;
    }
};

/// Granularity of the control area's size.
pub const CTRL_ALIGN: u64 = 4096;

/// Bytes at the start of each heap that gpulmt keeps for itself with `n_pes` PEs in
/// the job: the same on every rank, so allocations start at the same offset.
pub const fn reserved_bytes(n_pes: u32) -> u64 {
    (ctrl_barrier_arrivals(n_pes) + 8 * n_pes as u64).next_multiple_of(CTRL_ALIGN)
}

/// Offset of the table of `barrier_all` arrivals (`GPULMT_CTRL_BARRIER_ARRIVALS_AT` in
/// the header), after the bases: word p is the last epoch PE p announced.
pub const fn ctrl_barrier_arrivals(n_pes: u32) -> u64 {
    CTRL_BASES + 8 * n_pes as u64
}

/// The op codes of a rejected access's record (`GPULMT_OP_*` in the header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum DeviceOp {
    Put = 1,
    Get = 2,
    PutSignal = 3,
    Signal = 4,
    Atomic = 5,
    Ptr = 6,
}

impl DeviceOp {
    /// The op of a record's code.
    pub fn from_code(code: u32) -> Option<DeviceOp> {
        [DeviceOp::Put, DeviceOp::Get, DeviceOp::PutSignal, DeviceOp::Signal, DeviceOp::Atomic, DeviceOp::Ptr]
            .into_iter()
            .find(|op| *op as u32 == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceOp::Put => "put",
            DeviceOp::Get => "get",
            DeviceOp::PutSignal => "put_signal",
            DeviceOp::Signal => "signal",
            DeviceOp::Atomic => "atomic",
            DeviceOp::Ptr => "ptr",
        }
    }
}

/// What device code is told of the job and the heaps: `gpulmt_device_ctx` of the
/// header, byte for byte. The host gets it from [`crate::Context::sym_device_ctx`] and
/// copies it into the module's `gpulmt_dctx` symbol (NVRTC: `cuModuleGetGlobal`;
/// nvcc: `cudaMemcpyToSymbol`) before launching kernels that use the device API.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCtx {
    /// [`DEVICE_CTX_VERSION`].
    pub version: u32,
    /// This rank (PE) in the job.
    pub my_pe: i32,
    /// PEs in the job.
    pub n_pes: i32,
    /// Bytes at the start of every heap that are gpulmt's control area.
    pub reserved: u32,
    /// Bytes of every PE's heap (the same everywhere).
    pub heap_size: u64,
    /// This PE's heap as this process maps it: symmetric addresses are addresses in it.
    pub heap_base: u64,
    /// Device address of `n_pes` words: each PE's heap base as mapped here, 0 where
    /// this GPU cannot map it (another node, or no peer access).
    pub bases: u64,
    /// Device address of the off-node queue table ([`QueueTable`]); 0 where the job has
    /// one node (or the internode path left no queue for device code): operations to
    /// unmappable PEs are then rejected.
    pub queues: u64,
}

const _: () = assert!(std::mem::size_of::<DeviceCtx>() == 48);

/// One GIO send queue as device code posts to it (`gpulmt_gio_sq` in the header): the
/// addresses of the queue's parts in this process, device-visible. The packet format is
/// `gpulmt_protocols::gio::packet`'s.
///
/// The heap fills one per GIO queue the internode path leaves for device code
/// (`sym::offnode`): the ring, doorbell, credit and completion counters are the queue's
/// pinned host memory mapped into the device, and so are the AMO `results`; `reserve`,
/// the fence words and `target_of_pe` are device memory of the heap's queue table. Block `b` posts to
/// `sq[b % n_sq]`; every queue shares the path's template table, in which PE `p`'s heap
/// is template `target_of_pe[p]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendQueue {
    /// `slots` packets of 64 bytes (the ring).
    pub ring: u64,
    /// Slots of the ring, a power of two.
    pub slots: u64,
    /// A `u64` in device memory: positions reserved by the block's threads (atomic).
    pub reserve: u64,
    /// A `u64`: the doorbell, the tail published to the proxy (release).
    pub doorbell: u64,
    /// A `u64` the proxy writes: the consumer's head (the producer's credits).
    pub head: u64,
    /// A `u64` the proxy writes: every op with a lower sequence has completed.
    pub cq_done: u64,
    /// A `u64` the proxy writes: ops below `cq_done` that failed.
    pub cq_failed: u64,
    /// `slots` words the proxy writes: the fetched value of the AMO at that slot.
    pub results: u64,
    /// `n_pes` `i32`: this queue's template index of each PE, -1 where it has none.
    pub target_of_pe: u64,
    /// `n_pes` `u32` in device memory: the fence epoch of each target's last op.
    pub fence_epoch_of_pe: u64,
    /// A `u32` in device memory: fences called on this queue.
    pub fence_epoch: u64,
    /// `slots` `u64` in device memory: per slot, 1 + the position of the last op that
    /// released the slot's word of `results` (a fetching AMO once its thread read the
    /// result, any other op when posted); the next lap's op waits for it.
    pub result_free: u64,
}

/// The table [`DeviceCtx::queues`] points to (`gpulmt_gio_queues` in the header).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueTable {
    /// Send queues in `sq`.
    pub n_sq: u32,
    pub pad: u32,
    /// Device address of `n_sq` [`SendQueue`]s.
    pub sq: u64,
}

impl SendQueue {
    /// The record as device code reads it (little-endian, `#[repr(C)]` order).
    pub fn bytes(&self) -> [u8; 96] {
        let words = [
            self.ring,
            self.slots,
            self.reserve,
            self.doorbell,
            self.head,
            self.cq_done,
            self.cq_failed,
            self.results,
            self.target_of_pe,
            self.fence_epoch_of_pe,
            self.fence_epoch,
            self.result_free,
        ];
        let mut b = [0u8; 96];
        for (i, w) in words.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }
}

impl QueueTable {
    /// The table as device code reads it.
    pub fn bytes(&self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&self.n_sq.to_le_bytes());
        b[4..8].copy_from_slice(&self.pad.to_le_bytes());
        b[8..].copy_from_slice(&self.sq.to_le_bytes());
        b
    }
}

const _: () = assert!(std::mem::size_of::<SendQueue>() == 96);
const _: () = assert!(std::mem::size_of::<QueueTable>() == 16);
