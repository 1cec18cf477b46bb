//! The device layer: one small table of operations (UCX's uct style) that every
//! backend implements, and that the progress engine drives.
//!
//! Addresses are plain `usize` so that a CUDA device pointer (`CUdeviceptr`),
//! a simulated device pointer and a host pointer travel the same way; the
//! backend says which is which through [`DeviceBackend::pointer_info`].
//!
//! The operations that read or write through an address the caller passes, or release
//! memory others may still use (`copy_async`, `copy_sync`, `copy_2d_async`, `copy_2d_sync`,
//! `free`, `close_handle`,
//! `register_host`, `unregister_host`), are `unsafe fn`: a backend checks what it can
//! (device ranges against their allocations, addresses it never made), but it cannot know
//! whether host memory is live or whether a buffer is still in use, so the caller
//! guarantees that, as with the driver calls they stand for.
//!
//! Backends:
//! - [`sim`]: device memory in POSIX shared memory, one copy-engine thread per
//!   device, configurable peer topology; for CI and machines without a GPU.
//! - [`cuda`]: NVIDIA driver API through cudarc, loaded at run time.

pub mod cuda;
pub(crate) mod fd_share;
mod finished;
mod shareable;
mod sharing;
pub mod sim;
mod word_atomic;

pub(crate) use finished::FinishedThrough;
pub(crate) use sharing::{copy_server_refusal, shared_device, time_slicing_warning};
pub(crate) use word_atomic::AtomicState;
pub use word_atomic::{wait_word_atomic, AtomicTicket, WordAtomic, WORD_ATOMIC_TIMEOUT};

use std::fmt;
use std::sync::Arc;

use crate::anatomy::{self, probe, Point};

/// Ordinal of a device as the backend numbers them on this node.
pub type DevId = u32;

/// Size in bytes of an exported IPC handle: the driver's 64 bytes and what the kind of
/// memory needs besides (`shareable.rs`).
pub const IPC_HANDLE_BYTES: usize = gpulmt_protocols::wire::HANDLE_BYTES;

/// Where a pointer's memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Host memory (pageable or pinned); peers cannot map it through IPC.
    Host,
    /// Memory of the given device.
    Device(DevId),
}

/// How a device allocation was made, which decides how a peer process can map it
/// (`docs/memory-kinds.md`). Measured on one H200 with CUDA 13 (`lab/gpu/memory_kinds.cu`),
/// under MPS and without: only `Legacy` takes `cuIpcGetMemHandle`; a shareable pool or VMM
/// allocation crosses as a POSIX file descriptor; the others cannot be mapped at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum AllocKind {
    /// `cuMemAlloc` / `cudaMalloc`: a legacy IPC handle maps it. Also what host memory says.
    #[default]
    Legacy,
    /// From a stream-ordered memory pool (`cudaMallocAsync`, `cudaMallocFromPoolAsync`).
    /// `shareable`: the pool was created with a POSIX-fd handle type, so the pool crosses
    /// as an fd and the allocation as `cuMemPoolExportPointer`'s data. The device's default
    /// pool has no handle type.
    Pool { shareable: bool },
    /// The virtual memory API (`cuMemCreate` + `cuMemMap`): one physical chunk per mapping.
    /// `shareable`: created with a POSIX-fd handle type, so each chunk crosses as an fd.
    Vmm { shareable: bool },
    /// `cudaMallocManaged`: migrates between host and device; no IPC of any kind.
    Managed,
}

impl AllocKind {
    /// The kinds a test or benchmark can ask [`DeviceBackend::alloc_as`] for, by name.
    pub const NAMES: [(&'static str, AllocKind); 6] = [
        ("legacy", AllocKind::Legacy),
        ("pool", AllocKind::Pool { shareable: false }),
        ("pool-ipc", AllocKind::Pool { shareable: true }),
        ("vmm", AllocKind::Vmm { shareable: false }),
        ("vmm-ipc", AllocKind::Vmm { shareable: true }),
        ("managed", AllocKind::Managed),
    ];

    /// The kind's name in [`NAMES`](Self::NAMES).
    pub fn name(self) -> &'static str {
        Self::NAMES.iter().find(|(_, k)| *k == self).map_or("?", |(n, _)| n)
    }

    /// The kind named `s` (one of [`NAMES`](Self::NAMES)).
    pub fn from_name(s: &str) -> Option<AllocKind> {
        Self::NAMES.iter().find(|(n, _)| *n == s).map(|(_, k)| *k)
    }

    /// Why a peer cannot map memory of this kind, or None where it can.
    pub fn unmappable_reason(self) -> Option<&'static str> {
        match self {
            AllocKind::Legacy | AllocKind::Pool { shareable: true } | AllocKind::Vmm { shareable: true } => None,
            AllocKind::Pool { shareable: false } => Some(
                "memory of a pool without a shareable handle type (the default cudaMallocAsync pool): create the pool with handleTypes = cudaMemHandleTypePosixFileDescriptor for IPC",
            ),
            AllocKind::Vmm { shareable: false } => Some(
                "cuMemCreate memory without a shareable handle type: set requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR for IPC",
            ),
            AllocKind::Managed => Some("managed memory (cudaMallocManaged): CUDA has no IPC for it"),
        }
    }
}

/// What the backend knows of a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    pub kind: MemoryKind,
    /// Start of the allocation that holds the pointer (the pointer itself for host memory):
    /// for VMM memory the one mapping (physical chunk) that holds it, the unit a peer maps.
    pub base: usize,
    /// Size of that allocation in bytes (0 for host memory: unknown).
    pub size: usize,
    /// Identifier unique for the lifetime of this process: a freed and reallocated
    /// address gets a new one (CUDA's `CU_POINTER_ATTRIBUTE_BUFFER_ID`). 0 for host memory.
    pub buffer_id: u64,
    /// How the allocation was made (`Legacy` for host memory).
    pub alloc: AllocKind,
    /// Bytes from `base` that are device memory of this kind with no hole: `size`, except
    /// for VMM memory whose chunks are mapped one after another behind one reserved range
    /// (CUDA's `RANGE_START_ADDR`/`RANGE_SIZE` then cover them all): a buffer may run past its
    /// chunk into the next one.
    pub span: usize,
}

impl PointerInfo {
    /// What host memory (or memory the backend does not know) is.
    pub fn host(ptr: usize) -> PointerInfo {
        PointerInfo { kind: MemoryKind::Host, base: ptr, size: 0, buffer_id: 0, alloc: AllocKind::Legacy, span: 0 }
    }

    /// A device allocation of `size` bytes at `base` that is its own span.
    pub fn device(dev: DevId, base: usize, size: usize, buffer_id: u64, alloc: AllocKind) -> PointerInfo {
        PointerInfo { kind: MemoryKind::Device(dev), base, size, buffer_id, alloc, span: size }
    }
}

/// An exported handle to a device allocation, opaque bytes another process opens.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcHandle(pub [u8; IPC_HANDLE_BYTES]);

impl fmt::Debug for IpcHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcHandle(")?;
        for b in &self.0[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

/// A peer allocation mapped into this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// Local address of the start of the peer's allocation.
    pub ptr: usize,
    /// Size of the mapped allocation as the backend (driver) reports it.
    pub size: usize,
}

/// Pinned host memory that the devices can also address: from
/// [`DeviceBackend::alloc_host_mapped`]. The host reaches it at `host`, a kernel at `device`
/// (the same address on the sim and under CUDA's unified addressing, but not guaranteed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostMapped {
    /// The host's address of the first byte (page-aligned).
    pub host: usize,
    /// A device's address of the same byte.
    pub device: usize,
    /// Bytes of the allocation.
    pub len: usize,
}

/// An asynchronous copy in flight; poll it with [`DeviceBackend::copy_poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CopyTicket(pub u64);

/// The shape of a 2-D copy ([`DeviceBackend::copy_2d_async`], CUDA's `cuMemcpy2D`):
/// `height` rows of `width` bytes, `dst_pitch` bytes apart at the destination and
/// `src_pitch` at the source. A strided block of a matrix (Global Arrays' patches) moves
/// as one copy instead of one per row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy2d {
    pub width: usize,
    pub height: usize,
    pub dst_pitch: usize,
    pub src_pitch: usize,
}

impl Copy2d {
    /// One contiguous row of `len` bytes.
    pub fn row(len: usize) -> Copy2d {
        Copy2d { width: len, height: 1, dst_pitch: len, src_pitch: len }
    }

    /// Whether no byte moves (no rows, or rows of no bytes).
    pub fn is_empty(&self) -> bool {
        self.width == 0 || self.height == 0
    }

    /// Bytes moved.
    pub fn bytes(&self) -> usize {
        self.width * self.height
    }

    /// Whether both ends are one run of [`bytes`](Self::bytes) (one row, or rows with no
    /// gap between them): then a 1-D copy does it.
    pub fn is_contiguous(&self) -> bool {
        self.height <= 1 || (self.dst_pitch == self.width && self.src_pitch == self.width)
    }

    /// Checks the shape for `op`: rows that do not overlap at either end (a pitch at least
    /// the width where there is more than one row) and ends that fit the address space.
    /// Returns the spans of the destination and the source: bytes from the first row's
    /// start to the last row's end (0 for an empty shape, which accesses nothing).
    pub fn check(&self, op: &'static str) -> Result<(usize, usize), DeviceError> {
        if self.is_empty() {
            return Ok((0, 0));
        }
        let span = |end: &str, pitch: usize| {
            if self.height > 1 && pitch < self.width {
                return Err(DeviceError::BadShape {
                    op,
                    reason: format!(
                        "{} rows of {} bytes {pitch} bytes apart at the {end} overlap; the pitch must be at least the width",
                        self.height, self.width
                    ),
                });
            }
            (self.height - 1).checked_mul(pitch).and_then(|b| b.checked_add(self.width)).ok_or_else(|| {
                DeviceError::BadShape {
                    op,
                    reason: format!("{} rows {pitch} bytes apart at the {end} overflow the address space", self.height),
                }
            })
        };
        Ok((span("destination", self.dst_pitch)?, span("source", self.src_pitch)?))
    }
}

/// Which backend is active.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    Sim,
    Cuda,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Sim => "sim",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// Errors of the device layer: each names the operation that failed and what to do.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// A driver call returned an error code.
    #[error("{call} failed with {code}: {message}")]
    Driver { call: &'static str, code: i64, message: String },
    /// The pointer is not in memory the backend can use for this operation.
    #[error("{op}: pointer {ptr:#x} is not {expected}")]
    InvalidPointer { op: &'static str, ptr: usize, expected: &'static str },
    /// The device ordinal does not exist.
    #[error("device {dev} does not exist (this node has {count}); check GPULMT_GPU / GPULMT_SIM_DEVICES")]
    NoSuchDevice { dev: DevId, count: u32 },
    /// A handle was opened a second time in one process: the CUDA driver rejects this,
    /// so a caller that does it has bypassed the handle cache.
    #[error("IPC handle of buffer {buffer_id} (owner pid {owner}) is already open in this process; open it once and share the mapping (handle cache)")]
    DoubleOpen { owner: u32, buffer_id: u64 },
    /// An allocation was freed while another process still mapped it.
    #[error("allocation {ptr:#x} (buffer {buffer_id}) freed while {mappers} peer mapping(s) still open; free through mem_free + mem_free_commit")]
    FreedWhileMapped { ptr: usize, buffer_id: u64, mappers: u32 },
    /// The handle does not name a live allocation (forged, corrupt, or the owner freed it).
    #[error("IPC handle cannot be opened: {reason}")]
    BadHandle { reason: String },
    /// No backend can run here.
    #[error("no device backend available: {reason}")]
    Unavailable { reason: String },
    /// A 2-D copy's shape cannot be copied (overlapping rows, a span past the address
    /// space): see [`Copy2d::check`].
    #[error("{op}: {reason}")]
    BadShape { op: &'static str, reason: String },
    /// The backend does not support the operation.
    #[error("{op} is not supported by the {backend} backend")]
    Unsupported { op: &'static str, backend: BackendKind },
    /// The allocation at `base` cannot be exported for another process to map: its kind
    /// has no IPC, or the export failed. Callers move such memory through staging instead.
    #[error("allocation {base:#x} cannot be shared with another process: {reason}")]
    NotShareable { base: usize, reason: String },
}

/// The operations the LMT needs from a device layer.
///
/// All methods take `&self`: backends synchronise internally, so one backend can be
/// shared by the progress engine and the user's thread that allocates memory.
pub trait DeviceBackend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// Number of devices visible to this process.
    fn device_count(&self) -> u32;

    /// Whether the copy engine of device `from` can read and write memory of device `to`
    /// through a peer mapping (true when `from == to`).
    fn can_access_peer(&self, from: DevId, to: DevId) -> bool;

    /// Whether contexts that processes create on `dev` are shared through NVIDIA MPS, so
    /// that ranks on one device run at once instead of being time-sliced; None where the
    /// backend cannot tell or the question does not apply (the sim).
    fn mps_enabled(&self, _dev: DevId) -> Option<bool> {
        None
    }

    /// Allocates `bytes` of memory on `dev`; returns its address.
    fn alloc(&self, dev: DevId, bytes: usize) -> Result<usize, DeviceError>;

    /// Allocates `bytes` on `dev` the way an application of that kind does (a pool, the
    /// virtual memory API, managed memory), for tests and benchmarks of every kind; `chunks`
    /// (VMM only, at least 1) physical chunks behind one range, each its own allocation.
    /// [`free`](Self::free) frees any of them. Backends that cannot make a kind answer
    /// `Unsupported`.
    fn alloc_as(&self, dev: DevId, bytes: usize, kind: AllocKind, chunks: u32) -> Result<usize, DeviceError> {
        let _ = chunks;
        match kind {
            AllocKind::Legacy => self.alloc(dev, bytes),
            _ => Err(DeviceError::Unsupported { op: "alloc_as", backend: self.kind() }),
        }
    }

    /// Frees an allocation made by [`alloc`](Self::alloc). An address that is not the
    /// start of an allocation of this backend is refused with an error.
    ///
    /// # Safety
    /// No copy that reads or writes the allocation may be in flight (started by
    /// [`copy_async`](Self::copy_async) and not yet reported finished by
    /// [`copy_poll`](Self::copy_poll)), and nothing may read or write it afterwards: the
    /// memory goes at once (the sim unmaps it).
    unsafe fn free(&self, ptr: usize) -> Result<(), DeviceError>;

    /// Classifies a pointer (host or device, allocation range, buffer id).
    fn pointer_info(&self, ptr: usize) -> Result<PointerInfo, DeviceError>;

    /// Exports an IPC handle for the allocation that starts at `base`. Memory that no peer
    /// can map ([`AllocKind::unmappable_reason`]) is [`DeviceError::NotShareable`].
    fn export_handle(&self, base: usize) -> Result<IpcHandle, DeviceError>;

    /// Opens a peer's handle so that device `on` can reach it. Fails with
    /// [`DeviceError::DoubleOpen`] if this process already holds it open.
    fn open_handle(&self, handle: &IpcHandle, on: DevId) -> Result<Mapping, DeviceError>;

    /// Closes a mapping returned by [`open_handle`](Self::open_handle). A mapping that is
    /// not open is refused with an error.
    ///
    /// # Safety
    /// No copy that reads or writes the mapping may be in flight, and nothing may read or
    /// write addresses inside it afterwards: it is unmapped at once.
    unsafe fn close_handle(&self, mapping: Mapping) -> Result<(), DeviceError>;

    /// Starts a copy of `len` bytes on the copy engine of device `engine`, on queue
    /// `lane` of that engine (copies on one lane run in order; lanes run concurrently).
    /// Either end may be host memory, local device memory or a peer mapping.
    ///
    /// # Safety
    /// `src..src+len` must be readable and `dst..dst+len` writable (host memory of this
    /// process, device memory of this backend, or a mapping open in it), and both must stay
    /// so until [`copy_poll`](Self::copy_poll) reports the copy finished: not freed,
    /// unmapped or closed, with nothing else writing `src` or accessing `dst` meanwhile.
    /// With `len == 0` nothing is accessed.
    unsafe fn copy_async(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<CopyTicket, DeviceError>;

    /// Whether the copy has finished (then the ticket is consumed and must not be
    /// polled again). Never blocks.
    fn copy_poll(&self, ticket: CopyTicket) -> Result<bool, DeviceError>;

    /// [`copy_async`](Self::copy_async) on `lane` of `engine`, then spins on
    /// [`copy_poll`](Self::copy_poll) until it finished. Unlike
    /// [`copy_sync`](Self::copy_sync) it is not ordered after the application's work on its
    /// legacy default stream (the same contract as the rendezvous copies': the data is final
    /// when the request is posted); on CUDA that wait is a stream query of 1.4-1.8 us once a
    /// copy has run in the context (git history: `bench/results/h200x1/net_anatomy1` at c15a975). A small copy to or from pinned
    /// memory that the copy server may take makes no driver call at all.
    ///
    /// On an error from the poll the copy may still run: the caller must not reuse a
    /// buffer of its own that the copy writes.
    ///
    /// # Safety
    /// As [`copy_async`](Self::copy_async)'s, until this returns.
    unsafe fn copy_wait(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        // SAFETY: this function's contract is copy_async's, and it returns only once the copy
        // was seen finished (or its poll failed, which the caller is told about).
        let t = unsafe { self.copy_async(engine, lane, dst, src, len)? };
        anatomy::mark(Point::Probe, probe::COPY_WAIT_ISSUED);
        while !self.copy_poll(t)? {
            std::hint::spin_loop();
        }
        anatomy::mark(Point::Probe, probe::COPY_WAIT_DONE);
        Ok(())
    }

    /// Copies and waits, in any direction (host or device at either end).
    ///
    /// # Safety
    /// `src..src+len` must be readable and `dst..dst+len` writable for the whole call (host
    /// memory of this process, device memory of this backend, or a mapping open in it),
    /// with nothing else writing `src` or accessing `dst` meanwhile. With `len == 0`
    /// nothing is accessed.
    unsafe fn copy_sync(&self, dst: usize, src: usize, len: usize) -> Result<(), DeviceError>;

    /// Starts a 2-D copy (CUDA's `cuMemcpy2DAsync`) on queue `lane` of the copy engine of
    /// device `engine`, in order with that lane's other copies: `shape.height` rows of
    /// `shape.width` bytes from rows `shape.src_pitch` bytes apart at `src` into rows
    /// `shape.dst_pitch` bytes apart at `dst`. One ticket stands for the whole block. Either
    /// end may be host memory, local device memory or a peer mapping. A shape
    /// [`Copy2d::check`] refuses is [`DeviceError::BadShape`], before anything moves.
    ///
    /// # Safety
    /// Every source row `src + i * src_pitch .. + width` (`i < height`) must be readable
    /// and every destination row `dst + i * dst_pitch .. + width` writable, as
    /// [`copy_async`](Self::copy_async) requires of its ranges, until
    /// [`copy_poll`](Self::copy_poll) reports the copy finished; the destination rows must
    /// not overlap the source rows. With an empty shape nothing is accessed.
    unsafe fn copy_2d_async(
        &self,
        engine: DevId,
        lane: u32,
        dst: usize,
        src: usize,
        shape: Copy2d,
    ) -> Result<CopyTicket, DeviceError>;

    /// [`copy_2d_async`](Self::copy_2d_async) that waits, in any direction, ordered as
    /// [`copy_sync`](Self::copy_sync) is.
    ///
    /// # Safety
    /// As `copy_2d_async`'s, for the whole call.
    unsafe fn copy_2d_sync(&self, dst: usize, src: usize, shape: Copy2d) -> Result<(), DeviceError>;

    /// Waits until the work the application queued on its default stream of device
    /// `dev` so far has finished, if any is pending. For callers that move buffers an
    /// application fills or clears through the runtime's default stream (a `cudaMemcpy`
    /// from pageable memory returns before its DMA lands): the PMPI shim. Backends
    /// without such a stream return at once.
    fn wait_app_default_stream(&self, dev: DevId) -> Result<(), DeviceError> {
        let _ = dev;
        Ok(())
    }

    /// Lets a kernel resident on `dev` (a copy server) make the copies of at most `max_len`
    /// bytes between device memory that [`copy_async`](Self::copy_async) starts on `dev`,
    /// instead of its copy engine: no driver call per copy. The server exits after `idle`
    /// without work (an application's device-wide synchronize waits for it until then) and
    /// is started again by the next copy. With `max_len` 0 copies keep the engine and the
    /// server serves [`word_atomic_start`](Self::word_atomic_start) only; call this before
    /// the application's kernels run (a CUDA module load may wait for them). Backends
    /// without one answer `Unsupported`.
    fn enable_copy_server(&self, dev: DevId, max_len: usize, idle: std::time::Duration) -> Result<(), DeviceError> {
        let _ = (dev, max_len, idle);
        Err(DeviceError::Unsupported { op: "enable_copy_server", backend: self.kind() })
    }

    /// Starts `op` on the 8-byte word at `addr` of device memory, made by device `dev`
    /// itself (see `word_atomic.rs`), so that it is atomic against kernels' atomics on the
    /// word and against the other calls of this. `Ok(None)`: not taken yet (CUDA: the copy
    /// server that makes it is starting, or its ring is full): call again. A backend
    /// without device atomics answers `Unsupported`.
    ///
    /// # Safety
    /// `addr` is an 8-byte aligned word of device memory that `dev` reaches (its own, or a
    /// peer mapping with access enabled), valid until
    /// [`word_atomic_poll`](Self::word_atomic_poll) returns its old value, and every access
    /// to it from the host goes through this.
    unsafe fn word_atomic_start(
        &self,
        dev: DevId,
        addr: usize,
        op: WordAtomic,
    ) -> Result<Option<AtomicTicket>, DeviceError> {
        let _ = (dev, addr, op);
        Err(DeviceError::Unsupported { op: "word_atomic_start", backend: self.kind() })
    }

    /// The word's old value once the atomic of `ticket` was made (the ticket is then
    /// consumed), None before. Never blocks.
    fn word_atomic_poll(&self, ticket: AtomicTicket) -> Result<Option<u64>, DeviceError> {
        match ticket.0 {
            AtomicState::Done(old) => Ok(Some(old)),
            AtomicState::Served { .. } => {
                Err(DeviceError::Unsupported { op: "word_atomic_poll", backend: self.kind() })
            }
        }
    }

    /// Gives the streams this backend creates from now on (its copy queues and its copy
    /// server's) the device's greatest priority, `high`, or the default. At the default, a
    /// copy within one GPU waited behind the kernels running there, an MPS neighbour's too
    /// (one H200: 259 us beside Stencil2D's 258 us steps, 11 us at the greatest priority),
    /// and a copy server's launch may wait for their blocks. Call before the first copy.
    /// Backends without stream priorities answer `Unsupported`.
    fn set_copy_priority(&self, high: bool) -> Result<(), DeviceError> {
        let _ = high;
        Err(DeviceError::Unsupported { op: "set_copy_priority", backend: self.kind() })
    }

    /// Allocates `bytes` of zeroed, pinned host memory that every device of this backend
    /// can address too (CUDA: `cuMemHostAlloc(PORTABLE | DEVICEMAP)` and
    /// `cuMemHostGetDevicePointer`; the sim: plain anonymous shared memory). The GIO queues
    /// live in it, so that a kernel can be a producer; staging buffers use it because copy
    /// engines DMA it without registration. Free it with
    /// [`free_host_mapped`](Self::free_host_mapped).
    fn alloc_host_mapped(&self, bytes: usize) -> Result<HostMapped, DeviceError>;

    /// Frees memory from [`alloc_host_mapped`](Self::alloc_host_mapped), named by its host
    /// address. An address that is not the start of such an allocation is refused.
    ///
    /// # Safety
    /// No copy or kernel may still read or write the memory, and nothing may touch it
    /// afterwards: it is unmapped at once.
    unsafe fn free_host_mapped(&self, host: usize) -> Result<(), DeviceError>;

    /// Pins and registers host memory so device engines can DMA it (shared staging
    /// chunks); registering the same range twice is not an error.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be host memory of this process (not device memory: a backend
    /// that can tell refuses it), and stay mapped while any copy through the registration
    /// may read or write it.
    unsafe fn register_host(&self, ptr: usize, len: usize) -> Result<(), DeviceError>;

    /// Undoes [`register_host`](Self::register_host); a range not registered is refused
    /// with an error.
    ///
    /// # Safety
    /// No copy that reads or writes the range may be in flight: its pages stop being
    /// pinned for the engines.
    unsafe fn unregister_host(&self, ptr: usize) -> Result<(), DeviceError>;
}

/// A shared backend handle.
pub type Backend = Arc<dyn DeviceBackend>;

/// Picks the backend `choice` asks for: `Auto` takes CUDA when a driver and a GPU
/// are present and falls back to sim; `Cuda` fails when CUDA is unavailable.
/// The choice and its reason are logged.
pub fn select(choice: crate::config::DeviceChoice) -> Result<Backend, DeviceError> {
    use crate::config::DeviceChoice;
    match choice {
        DeviceChoice::Sim => {
            tracing::info!(backend = "sim", reason = "GPULMT_DEVICE=sim", "device backend selected");
            Ok(Arc::new(sim::SimBackend::from_env()?))
        }
        DeviceChoice::Cuda => {
            let b = cuda::CudaBackend::try_new()?;
            tracing::info!(backend = "cuda", reason = "GPULMT_DEVICE=cuda", "device backend selected");
            Ok(Arc::new(b))
        }
        DeviceChoice::Auto => match cuda::CudaBackend::try_new() {
            Ok(b) => {
                tracing::info!(backend = "cuda", reason = "driver and GPU found", "device backend selected");
                Ok(Arc::new(b))
            }
            Err(e) => {
                tracing::info!(backend = "sim", reason = %e, "device backend selected: CUDA unavailable");
                Ok(Arc::new(sim::SimBackend::from_env()?))
            }
        },
    }
}
