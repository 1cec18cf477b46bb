//! The symmetric heap (OpenSHMEM / NVSHMEM, seeds 000 and 001): memory that every rank
//! allocates collectively at the same offset of its own heap, so that one address names
//! "this object on PE p" for host calls and for device code (`include/gpulmt_device.cuh`,
//! `docs/device-api.md`, `docs/memory-model.md`).
//!
//! - **One heap per rank**, `GPULMT_SYM_HEAP` bytes on the rank's device (sim: shared
//!   memory, which the host reads and writes directly), reserved at the first
//!   [`Context::sym_alloc`] (a collective call, so every rank reserves it together).
//!   Its first bytes are gpulmt's control area ([`layout`]).
//! - **Peers map each other's heaps at setup**: each rank exports its heap's IPC handle,
//!   the ranks exchange them, and every rank opens the heaps of the peers its device can
//!   reach through the handle cache (a lease held until finalize, so a message that
//!   later moves a buffer of the heap shares the mapping). A peer on another node, or on
//!   a device without peer access, is not mappable: its base is 0 in the device context,
//!   and operations to it take the GIO queues of the internode path when it lives on
//!   another node (`sym::offnode`: the heap is a window of the path), or are refused.
//! - **A deterministic allocator** ([`alloc`]): the same calls in the same order give
//!   the same offsets. Each `sym_alloc` and `sym_free` first exchanges its arguments
//!   among the ranks and fails on every rank, with the same message, when they differ.
//! - **Host operations** on the heap ([`host`]): put, get, put_signal, signal waits and
//!   64-bit atomics, each complete when it returns (the `_nbi` puts and gets at the next
//!   quiet), on mapped heaps and through the queue alike.
//!
//! - **Device code** includes `include/gpulmt_device.cuh` (embedded here for NVRTC:
//!   [`nvrtc`]) and gets its context from [`Context::sym_device_ctx`].
//!
//! The collectives use a reserved tag ([`SYM_TAG`]) of the context's own messages.

pub mod alloc;
pub mod host;
pub mod layout;
pub mod nvrtc;
mod offnode;
#[cfg(test)]
mod tests;

use gpulmt_protocols::{Rank, Tag};

use crate::context::Context;
use crate::device::{BackendKind, DevId, IpcHandle, MemoryKind, IPC_HANDLE_BYTES};
use crate::error::{Error, Result};
use crate::mapping::PeerBufferKey;

pub use crate::device::Copy2d;
pub use alloc::{AllocError, HeapAllocator, ALIGN};
pub use gpulmt_protocols::gio::SignalOp;
pub use host::{Cmp, DeviceAccessError, Signal};
pub use layout::{DeviceCtx, DeviceOp, QueueTable, SendQueue, DEVICE_CTX_VERSION};

/// Tag of the symmetric heap's collectives (reserved: above `TAG_UB`, below the
/// barrier's).
pub const SYM_TAG: Tag = i32::MAX - 4;

/// Heap size where `GPULMT_SYM_HEAP` is unset, on CUDA: NVSHMEM's default symmetric size.
pub const DEFAULT_HEAP_CUDA: u64 = 1 << 30;
/// Heap size where `GPULMT_SYM_HEAP` is unset, on sim: its memory is reserved in
/// /dev/shm, which tests on small machines share.
pub const DEFAULT_HEAP_SIM: u64 = 64 << 20;

/// A symmetric allocation: the same offset in every rank's heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SymPtr {
    addr: usize,
    offset: u64,
    len: usize,
}

impl SymPtr {
    /// The allocation's address in this rank's heap: its symmetric address, valid in
    /// host calls of this rank and in its device code (device memory on CUDA).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// Offset of the allocation in every rank's heap.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Bytes asked for (the heap rounds the reservation up to [`ALIGN`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte was asked for (never: such allocations are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The symmetric address `bytes` into the allocation.
    pub fn at(&self, bytes: usize) -> usize {
        self.addr + bytes
    }
}

/// One rank's heap as this rank knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerHeap {
    /// The node it lives on.
    pub node: u64,
    /// Its device (ordinal on its node).
    pub device: DevId,
    /// Its base address in its own process (what the proxy's window names).
    pub remote_base: u64,
    /// Its base as mapped in this process; None where this rank cannot map it.
    pub mapped: Option<usize>,
    /// The handle cache's key of the mapping this rank holds a lease on.
    key: Option<PeerBufferKey>,
    /// Its heap's window id on the internode path, where this rank reaches it through
    /// the GIO queues (another node).
    pub window: Option<crate::net::WindowId>,
}

/// The heap state of a context that has called [`Context::sym_alloc`].
pub(crate) struct SymHeap {
    pub(crate) base: usize,
    pub(crate) alloc: HeapAllocator,
    pub(crate) peers: Vec<PeerHeap>,
    /// Collective calls made so far (named in disagreement errors).
    calls: u64,
    /// Bytes asked for by each live allocation (by offset), for [`SymPtr::len`].
    asked: rustc_hash::FxHashMap<u64, usize>,
    /// The internode path's share: off-node PEs' heaps (None: single node).
    pub(crate) net: Option<offnode::SymNet>,
    /// The `_nbi` 2-D copies to mapped heaps in flight (`host::HEAP_LANE`), completed by
    /// `sym_quiet`, before a blocking 2-D copy, and before a free or finalize.
    pub(crate) copies: std::sync::Mutex<Vec<crate::device::CopyTicket>>,
}

impl SymHeap {
    /// The live allocation (offset, bytes asked for) that holds every byte of
    /// `[addr, addr + len)` (`len == 0`: the byte at `addr`), if one does. The bytes the
    /// allocator added to round an allocation up belong to none.
    pub(crate) fn allocation_of(&self, addr: usize, len: usize) -> Option<(u64, usize)> {
        let offset = addr.checked_sub(self.base)? as u64;
        let (at, _) = self.alloc.containing(offset, len as u64)?;
        let asked = self.asked[&at];
        let end = offset.checked_add(len.max(1) as u64)?;
        (end <= at + asked as u64).then_some((at, asked))
    }
}

/// What every rank says at each collective call: which call, and its argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CallRecord {
    /// 1: sym_alloc, 2: sym_free.
    kind: u8,
    call: u64,
    arg: u64,
}

impl CallRecord {
    const BYTES: usize = 17;

    fn encode(&self) -> Vec<u8> {
        let mut v = vec![self.kind];
        v.extend_from_slice(&self.call.to_le_bytes());
        v.extend_from_slice(&self.arg.to_le_bytes());
        v
    }

    fn decode(b: &[u8]) -> CallRecord {
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        CallRecord { kind: b[0], call: word(1), arg: word(9) }
    }

    fn describe(&self) -> String {
        match self.kind {
            1 => format!("sym_alloc({} bytes)", self.arg),
            _ => format!("sym_free(offset {})", self.arg),
        }
    }
}

/// Bytes of a setup verdict: 1 if the rank mapped every heap it should, then its heap's
/// window id on the internode path (`u32::MAX`: none).
const VERDICT_BYTES: usize = 5;

/// What every rank says about its heap at setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SetupRecord {
    ok: bool,
    node: u64,
    device: DevId,
    buffer_id: u64,
    base: u64,
    size: u64,
    handle: [u8; IPC_HANDLE_BYTES],
}

impl SetupRecord {
    const BYTES: usize = 1 + 8 + 4 + 8 + 8 + 8 + IPC_HANDLE_BYTES;

    fn encode(&self) -> Vec<u8> {
        let mut v = vec![u8::from(self.ok)];
        v.extend_from_slice(&self.node.to_le_bytes());
        v.extend_from_slice(&self.device.to_le_bytes());
        for w in [self.buffer_id, self.base, self.size] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&self.handle);
        v
    }

    fn decode(b: &[u8]) -> SetupRecord {
        let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        SetupRecord {
            ok: b[0] == 1,
            node: word(1),
            device: u32::from_le_bytes(b[9..13].try_into().expect("4 bytes")),
            buffer_id: word(13),
            base: word(21),
            size: word(29),
            handle: b[37..37 + IPC_HANDLE_BYTES].try_into().expect("handle bytes"),
        }
    }
}

impl Context {
    /// Collective over the job (every rank calls it, with the same `bytes`, in the same
    /// order as its other `sym_alloc`/`sym_free` calls): allocates `bytes` in every
    /// rank's symmetric heap at the same offset. The first call reserves the heaps
    /// (`GPULMT_SYM_HEAP` bytes each) and maps the peers' heaps.
    ///
    /// Fails on every rank alike when the ranks asked for different sizes, when the
    /// heap has no room, or for 0 bytes. The memory is not cleared.
    pub fn sym_alloc(&mut self, bytes: usize) -> Result<SymPtr> {
        self.sym_setup()?;
        let call = self.sym_agree(1, bytes as u64)?;
        let heap = self.sym.as_mut().expect("set up above");
        let offset = heap.alloc.alloc(bytes as u64).map_err(|e| sym_error("sym_alloc", call, e))?;
        heap.asked.insert(offset, bytes);
        Ok(SymPtr { addr: heap.base + offset as usize, offset, len: bytes })
    }

    /// Collective (as [`sym_alloc`](Self::sym_alloc)): frees `p` in every rank's heap.
    /// No kernel may still use it. Like OpenSHMEM's `shmem_free` it first completes
    /// this rank's operations through the GIO queues (the host's `_nbi` ones, and those
    /// of kernels that have ended, which a kernel's end does not complete), and the
    /// ranks then agree, so no operation of any rank lands in the freed memory after a
    /// later `sym_alloc` handed it out again. Fails on every rank alike when the ranks
    /// name different allocations, or one that is not live.
    pub fn sym_free(&mut self, p: SymPtr) -> Result<()> {
        self.sym_free_at(p.addr)
    }

    /// [`sym_free`](Self::sym_free) of the allocation that starts at the symmetric
    /// address `addr` (for callers that keep only addresses, as C does). Any address is
    /// checked collectively: a rank passing a wrong one fails every rank, none waits.
    pub fn sym_free_at(&mut self, addr: usize) -> Result<()> {
        let Some(heap) = self.sym.as_ref() else {
            return Err(Error::InvalidArgument(format!(
                "sym_free({addr:#x}): this rank has no symmetric heap (no sym_alloc was made)"
            )));
        };
        let offset = addr.wrapping_sub(heap.base) as u64;
        // No copy of this rank may still write or read the memory once it is free.
        self.sym_copies_complete()?;
        // Before the agreement, which no rank passes before every rank got there: then
        // every rank's operations are complete before any rank frees.
        self.net_drain("sym_free")?;
        let call = self.sym_agree(2, offset)?;
        let heap = self.sym.as_mut().expect("checked above");
        heap.alloc.free(offset).map_err(|e| sym_error("sym_free", call, e))?;
        heap.asked.remove(&offset);
        Ok(())
    }

    /// The live symmetric allocation that holds the symmetric address `addr` (for
    /// callers that keep only addresses, as C does).
    pub fn sym_lookup(&self, addr: usize) -> Option<SymPtr> {
        let heap = self.sym.as_ref()?;
        let (at, len) = heap.allocation_of(addr, 0)?;
        Some(SymPtr { addr: heap.base + at as usize, offset: at, len })
    }

    /// Every rank's heap as this rank sees it (empty before the first `sym_alloc`).
    pub fn sym_heaps(&self) -> &[PeerHeap] {
        self.sym.as_ref().map_or(&[], |h| &h.peers)
    }

    /// Bytes of each rank's heap (0 before the first `sym_alloc`).
    pub fn sym_heap_size(&self) -> u64 {
        self.sym.as_ref().map_or(0, |h| h.alloc.size())
    }

    /// Ranks of this rank's node (its pseudo-node under `GPULMT_PSEUDO_NODES`) bound to
    /// this rank's device, this one included. Not the GPU's sharers across pseudo-nodes:
    /// device code that sizes a persistent grid counts those by the GPU's UUID over the
    /// whole job instead (`bench/src/device`'s `DeviceModule::load`), since kernels of every
    /// rank sharing a GPU must fit on it together.
    pub fn ranks_on_my_device(&self) -> u32 {
        // The segment holds this node's ranks, by local index.
        let me = self.info.rank as usize;
        let (node, dev) = (self.seg.rank_node(me), self.seg.rank_device(me));
        (0..self.info.size as usize)
            .filter(|&r| self.seg.rank_node(r) == node && self.seg.rank_device(r) == dev)
            .count() as u32
    }

    /// Exchanges one call's record with every rank; fails when any differs from ours.
    /// Returns the call's number.
    fn sym_agree(&mut self, kind: u8, arg: u64) -> Result<u64> {
        let heap = self.sym.as_mut().expect("the heap is set up before any collective call");
        heap.calls += 1;
        let mine = CallRecord { kind, call: heap.calls, arg };
        let all = self.sym_allgather(&mine.encode(), CallRecord::BYTES)?;
        let records: Vec<CallRecord> = all.iter().map(|b| CallRecord::decode(b)).collect();
        if let Some(other) = records.iter().position(|r| *r != mine) {
            let (r, o) = (&records[self.rank() as usize], &records[other]);
            return Err(Error::InvalidArgument(format!(
                "symmetric heap call #{} disagrees: rank {} called {} and rank {other} called {} (call #{}); \
                 sym_alloc and sym_free are collective: every rank makes the same calls with the same \
                 arguments in the same order",
                r.call,
                self.rank(),
                r.describe(),
                o.describe(),
                o.call
            )));
        }
        Ok(mine.call)
    }

    /// Sends `mine` (`len` bytes) to every rank and returns every rank's, in rank order.
    fn sym_allgather(&mut self, mine: &[u8], len: usize) -> Result<Vec<Vec<u8>>> {
        let (me, n) = (self.rank(), self.size());
        let mut all: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; len]).collect();
        let mut reqs = Vec::new();
        for (r, buf) in all.iter_mut().enumerate().filter(|(r, _)| *r as Rank != me) {
            // SAFETY: `buf` is a host buffer of `len` bytes that outlives the request:
            // wait_all below completes it before `all` is read or dropped.
            reqs.push(unsafe { self.irecv_tagged(buf.as_mut_ptr(), len, Some(r as Rank), Some(SYM_TAG))? });
        }
        for r in (0..n).filter(|&r| r != me) {
            // SAFETY: `mine` outlives the request (wait_all below).
            reqs.push(unsafe { self.isend_tagged(mine.as_ptr(), mine.len(), r, SYM_TAG)? });
        }
        for st in self.wait_all(reqs)? {
            if st.len as usize != len && st.source != me {
                return Err(Error::Bootstrap(format!(
                    "rank {} sent a symmetric heap record of {} bytes, not {len}: ranks of different gpulmt builds?",
                    st.source, st.len
                )));
            }
        }
        all[me as usize] = mine.to_vec();
        Ok(all)
    }

    /// Reserves this rank's heap and maps the peers' (collective; once).
    fn sym_setup(&mut self) -> Result<()> {
        if self.sym.is_some() {
            return Ok(());
        }
        let n = self.size();
        let size = self.cfg.sym_heap.unwrap_or(match self.backend.kind() {
            BackendKind::Cuda => DEFAULT_HEAP_CUDA,
            BackendKind::Sim => DEFAULT_HEAP_SIM,
        });
        let reserved = layout::reserved_bytes(n);
        let mut mine = SetupRecord {
            ok: false,
            node: self.node,
            device: self.device,
            buffer_id: 0,
            base: 0,
            size,
            handle: [0; IPC_HANDLE_BYTES],
        };
        let local = if size < reserved + ALIGN {
            Err(Error::InvalidArgument(format!(
                "GPULMT_SYM_HEAP={size} leaves no room after the {reserved} bytes of the heap's control area \
                 with {n} ranks; give it at least {}",
                reserved + ALIGN
            )))
        } else {
            self.sym_reserve(size, reserved)
        };
        if let Ok((base, buffer_id, handle)) = &local {
            (mine.ok, mine.base, mine.buffer_id, mine.handle) = (true, *base as u64, *buffer_id, handle.0);
        }
        // Every rank takes part in the exchange even when its own reservation failed, so
        // that all of them fail together instead of waiting for it.
        let exchanged = self.sym_allgather(&mine.encode(), SetupRecord::BYTES);
        let records: Vec<SetupRecord> = match exchanged {
            Ok(all) => all.iter().map(|b| SetupRecord::decode(b)).collect(),
            Err(e) => {
                self.sym_unreserve(local.as_ref().ok().map(|l| l.0));
                return Err(e);
            }
        };
        let (base, _, _) = local?;
        if let Some(bad) = records.iter().position(|r| !r.ok || r.size != size) {
            self.sym_unreserve(Some(base));
            let r = &records[bad];
            return Err(Error::Bootstrap(if r.ok {
                format!(
                    "rank {bad} has a symmetric heap of {} bytes and rank {} of {size}: give every rank the same \
                     GPULMT_SYM_HEAP",
                    r.size,
                    self.rank()
                )
            } else {
                format!("rank {bad} could not reserve its symmetric heap (its own error says why)")
            }));
        }
        let mut peers = Vec::with_capacity(n as usize);
        let mut failure = None;
        for (r, rec) in records.iter().enumerate() {
            let mut peer = PeerHeap {
                node: rec.node,
                device: rec.device,
                remote_base: rec.base,
                mapped: None,
                key: None,
                window: None,
            };
            if r == self.rank() as usize {
                peer.mapped = Some(base);
            } else if failure.is_none()
                && rec.node == self.node
                && self.backend.can_access_peer(self.device, rec.device)
            {
                let key = PeerBufferKey { peer: r as u32, device: rec.device, buffer_id: rec.buffer_id };
                match self.cache.acquire(&key, &IpcHandle(rec.handle), rec.size) {
                    Ok(m) => (peer.mapped, peer.key) = (Some(m.ptr), Some(key)),
                    Err(e) => failure = Some(format!("mapping rank {r}'s symmetric heap: {e}")),
                }
            }
            peers.push(peer);
        }
        if failure.is_none() {
            let table: Vec<u8> = peers.iter().flat_map(|p| (p.mapped.unwrap_or(0) as u64).to_le_bytes()).collect();
            // SAFETY: the bases table lies in the control area of our own heap (reserved
            // covers it), which nothing uses before setup completes; `table` is a host
            // buffer of its length.
            if let Err(e) = unsafe {
                self.backend.copy_sync(base + layout::CTRL_BASES as usize, table.as_ptr() as usize, table.len())
            } {
                failure = Some(format!("writing the heap table: {e}"));
            }
        }
        // Where the job spans nodes, the heap becomes a window of the internode path
        // before the verdicts, so that it is exposed before any peer can reach it.
        let mut window = None;
        if failure.is_none() {
            match self.sym_net_expose(base, size) {
                Ok(w) => window = w,
                Err(e) => failure = Some(e.to_string()),
            }
        }
        // A second round: every rank learns whether every other one mapped the heaps,
        // and each rank's window id.
        let mut verdict = vec![u8::from(failure.is_none())];
        verdict.extend_from_slice(&window.unwrap_or(u32::MAX).to_le_bytes());
        let verdicts = self.sym_allgather(&verdict, VERDICT_BYTES);
        let all_ok = matches!(&verdicts, Ok(v) if v.iter().all(|b| b[0] == 1));
        self.sym = Some(SymHeap {
            base,
            alloc: HeapAllocator::new(size, reserved),
            peers,
            calls: 0,
            asked: Default::default(),
            net: None,
            copies: Default::default(),
        });
        if let (true, Some(_), Ok(v)) = (all_ok, window, &verdicts) {
            let windows: Vec<Option<crate::net::WindowId>> = v
                .iter()
                .map(|b| u32::from_le_bytes(b[1..5].try_into().expect("4 bytes")))
                .map(|w| (w != u32::MAX).then_some(w))
                .collect();
            // A failure here is this rank's alone, while its peers go on into the next
            // collective: the heap stays (peers may already write into its window), and
            // this rank's operations to other nodes fail, each saying why.
            match self.sym_net_connect(&windows, size) {
                Ok(net) => self.sym.as_mut().expect("set just above").net = Some(net),
                Err(e) => tracing::error!(
                    error = %e,
                    "the symmetric heap cannot reach PEs of other nodes from this rank; its operations to them fail"
                ),
            }
        }
        if all_ok {
            tracing::info!(
                size,
                mapped = self.sym_heaps().iter().filter(|p| p.mapped.is_some()).count(),
                ranks = n,
                "symmetric heap ready"
            );
            return Ok(());
        }
        // Undo on every rank: release the mappings, wait until every rank has, free.
        self.sym_release_mappings();
        let _ = self.barrier();
        self.sym_free_heap();
        Err(match (failure, verdicts) {
            (Some(why), _) => Error::Bootstrap(format!("symmetric heap setup: {why}")),
            (None, Err(e)) => e,
            (None, Ok(v)) => Error::Bootstrap(format!(
                "symmetric heap setup failed on rank {} (its own error says why)",
                v.iter().position(|b| b[0] != 1).unwrap_or(0)
            )),
        })
    }

    /// Allocates this rank's heap, zeroes its control area and exports its handle.
    fn sym_reserve(&mut self, size: u64, reserved: u64) -> Result<(usize, u64, IpcHandle)> {
        let bytes = usize::try_from(size)
            .map_err(|_| Error::InvalidArgument(format!("GPULMT_SYM_HEAP={size} does not fit this machine")))?;
        let base = self.backend.alloc(self.device, bytes)?;
        let prepared = (|| {
            let info = self.backend.pointer_info(base)?;
            let zeros = vec![0u8; reserved as usize];
            // SAFETY: `base` is our fresh allocation of at least `reserved` bytes (checked
            // by the caller), unknown to anyone yet; `zeros` is a host buffer of as many.
            unsafe { self.backend.copy_sync(base, zeros.as_ptr() as usize, zeros.len())? };
            let backend = &self.backend;
            let handle = *self.exports.get_or_export(info.buffer_id, || backend.export_handle(base))?;
            Ok::<_, Error>((info.buffer_id, handle))
        })();
        match prepared {
            Ok((id, handle)) => Ok((base, id, handle)),
            Err(e) => {
                self.sym_unreserve(Some(base));
                Err(e)
            }
        }
    }

    /// Frees a heap no peer has mapped (setup failed before the exchange completed).
    fn sym_unreserve(&mut self, base: Option<usize>) {
        let Some(base) = base else { return };
        if let Ok(info) = self.backend.pointer_info(base) {
            self.exports.forget(&info.buffer_id);
        }
        // SAFETY: our own allocation; setup failed before any peer could map it (the
        // handle was never sent, or every rank fails before opening it) and no copy of
        // ours uses it.
        if let Err(e) = unsafe { self.backend.free(base) } {
            tracing::warn!(error = %e, "freeing the symmetric heap after a failed setup");
        }
    }

    /// Gives back the leases on the peers' heaps (finalize, before the handle cache
    /// closes every mapping). Device code must no longer use them.
    pub(crate) fn sym_release_mappings(&mut self) {
        // The peers' heaps are unmapped below: no copy of this rank may still use them.
        if let Err(e) = self.sym_copies_complete() {
            tracing::warn!(error = %e, "completing the symmetric heap's copies at finalize");
        }
        let Some(heap) = self.sym.as_mut() else { return };
        for p in heap.peers.iter_mut() {
            if let Some(key) = p.key.take() {
                p.mapped = None;
                if let Err(e) = self.cache.release(&key) {
                    tracing::warn!(error = %e, peer = key.peer, "releasing a peer's symmetric heap");
                }
            }
        }
    }

    /// Frees this rank's heap (finalize, once every rank closed its mappings of it).
    pub(crate) fn sym_free_heap(&mut self) {
        let Some(mut heap) = self.sym.take() else { return };
        // The device's queue table: no kernel runs, and the path is shut down (finalize),
        // or never carried the heap (a failed setup).
        if let Some(device) = heap.net.take().and_then(|n| n.device) {
            device.free(&self.backend);
        }
        if let Ok(info) = self.backend.pointer_info(heap.base) {
            debug_assert_eq!(info.kind, MemoryKind::Device(self.device));
            self.exports.forget(&info.buffer_id);
        }
        // SAFETY: the caller runs this after every rank released its mappings of the heap
        // (a barrier in between), no copy of ours uses it, and the heap's memory is
        // gpulmt's only until finalize.
        if let Err(e) = unsafe { self.backend.free(heap.base) } {
            tracing::warn!(error = %e, "freeing the symmetric heap");
        }
    }
}

/// A refused allocation or free, naming the call.
fn sym_error(what: &str, call: u64, e: AllocError) -> Error {
    Error::InvalidArgument(format!("{what} (symmetric heap call #{call}): {e}"))
}
