//! The symmetric heap's off-node half: PEs of other nodes reached through the internode
//! path's GIO queues and proxy (`crate::net`, `docs/internode.md`).
//!
//! - **The heap is a window of the path**, exposed when the heap is reserved (collective
//!   with the rest of the setup): every rank exposes its heap, the ranks exchange the
//!   window ids with the setup's verdicts, and each rank then adds every off-node peer's
//!   heap (base and size from the setup records) to the templates of its queues. The
//!   proxy of the target checks every access against the heap's window again.
//! - **Host operations** to such a PE take one queue the heap claims from the path
//!   ([`SymNet::queue`], one host thread at a time behind a mutex): a put is a PUT
//!   packet, a put_signal a PUT_SIGNAL (the target's proxy writes the signal only once the
//!   data is in place), an atomic an AMO whose old value comes back into a word of the
//!   caller's, a fence marks the queue's next op to each PE, and a quiet waits for the
//!   queue's completion counter to reach its tail (the target acknowledged each op). The
//!   blocking calls post and then quiet: they are complete on return, as the mapped
//!   path's are.
//! - **Device code** gets the queues the path has left ([`DeviceQueues`]): one
//!   `gpulmt_gio_sq` record per queue (block `b` posts to `sq[b % n_sq]`), with the
//!   device-owned words the header's producer needs (its reservation counter, fence
//!   marks, the template index of each PE) in one device allocation whose address goes
//!   into [`DeviceCtx::queues`](super::DeviceCtx::queues), and the AMO result slots in
//!   pinned host memory mapped into the device, which the proxy writes directly.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{AmoOp, SignalOp};
use gpulmt_protocols::{ProtoError, Rank};

use super::layout::{QueueTable, SendQueue};
use crate::context::Context;
use crate::device::{Backend, DevId, HostMapped, MemoryKind};
use crate::error::{Error, Result};
use crate::net::producer::Backoff;
use crate::net::queue::{CQ_AT, HEAD_AT, RING_AT, TAIL_AT};
use crate::net::{HostQueue, NetPath, QuietError, WindowId};
use crate::offnode::PostError;

/// How long a host operation to an off-node PE waits for its completion: far longer than
/// any transfer of the heap takes, short enough that a peer that stopped answering ends
/// the call with an error instead of hanging it.
const NET_WAIT: Duration = Duration::from_secs(120);

/// Where an operation's target lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// The PE's heap is mapped here: the local address of the target.
    Mapped(usize),
    /// Through the queue: the PE's window and the offset in it.
    Queue { pe: Rank, window: WindowId, offset: u64 },
}

/// The heap's share of the internode path.
pub(crate) struct SymNet {
    /// The host's producer queue for operations to off-node PEs.
    queue: Mutex<HostQueue>,
    /// The device's queues and their table; None where the path had no queue left.
    pub(crate) device: Option<DeviceQueues>,
}

/// The queues device code posts to, and the memory describing them.
pub(crate) struct DeviceQueues {
    /// Held for the device until finalize: no host thread posts to them (the host only
    /// reads their doorbells and completion counters, [`Context::net_drain`]).
    queues: Vec<HostQueue>,
    /// The device allocation holding the [`QueueTable`], the records and their words.
    pub(crate) mem: usize,
    /// The AMO result slots of every queue: pinned host memory mapped into the device,
    /// which the proxy writes with a plain store (no copy engine on an AMO's path).
    results: HostMapped,
    pub(crate) n_sq: u32,
}

impl SymNet {
    /// The host's queue (one host thread posts at a time).
    fn queue(&self) -> MutexGuard<'_, HostQueue> {
        // A panic while posting leaves the producer consistent (each post is whole or
        // not made), so a poisoned lock's queue is still good.
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A post or quiet that failed, as the heap's callers see it.
fn net_error(what: &str, pe: Rank, why: impl std::fmt::Display) -> Error {
    Error::Transfer(ProtoError::CopyFailed {
        what: format!("{what} to PE {pe} on another node, through the internode path: {why}"),
    })
}

fn post_error(what: &str, pe: Rank, e: PostError) -> Error {
    net_error(what, pe, e)
}

impl Context {
    /// GIO send queues device code of this rank posts to for PEs of other nodes (0: it
    /// reaches none; `docs/device-api.md`).
    pub fn sym_device_queues(&self) -> u32 {
        self.sym.as_ref().and_then(|h| h.net.as_ref()).and_then(|n| n.device.as_ref()).map_or(0, |d| d.n_sq)
    }

    /// Setup, before the verdicts: exposes this rank's heap as a window of the internode
    /// path, where the context has one. Returns its id.
    pub(super) fn sym_net_expose(&mut self, base: usize, size: u64) -> Result<Option<WindowId>> {
        let kind = self.backend.pointer_info(base)?.kind;
        let Some(path) = self.offnode.net_path() else { return Ok(None) };
        // SAFETY: the heap is this rank's device memory of `size` bytes, freed only at
        // finalize after the path shut down (Context::finalize), or after a failed setup
        // whose peers never learnt the window; other ranks' ops land whenever they come,
        // which the heap's contract leaves to the application (quiet, signals).
        let id = unsafe { path.expose_window(base, size, kind) }
            .map_err(|e| Error::Bootstrap(format!("exposing the symmetric heap to other nodes: {e}")))?;
        Ok(Some(id))
    }

    /// Setup, after every rank agreed: adds each off-node peer's heap (its window id in
    /// `windows`) to the path's templates, claims the host's queue and the device's.
    /// Sets each reached peer's [`PeerHeap::window`](super::PeerHeap).
    pub(super) fn sym_net_connect(&mut self, windows: &[Option<WindowId>], size: u64) -> Result<SymNet> {
        let (n, device, backend) = (self.size(), self.device, self.backend.clone());
        let mut peers = std::mem::take(&mut self.sym.as_mut().expect("set up before connecting").peers);
        let done = (|| {
            let path = self.offnode.net_path().expect("exposed through it");
            let reached: Vec<Rank> = path.peers().to_vec();
            let mut target_of_pe = vec![-1i32; n as usize];
            for &pe in &reached {
                let (p, Some(id)) = (&mut peers[pe as usize], windows[pe as usize]) else { continue };
                if p.mapped.is_some() {
                    continue;
                }
                path.add_peer_window(pe, id, p.remote_base, size)
                    .map_err(|e| Error::Bootstrap(format!("adding PE {pe}'s symmetric heap to the templates: {e}")))?;
                p.window = Some(id);
                target_of_pe[pe as usize] = path.window_target(pe, id).expect("a peer of the path") as i32;
            }
            let queue = path.queue().ok_or_else(|| {
                Error::Bootstrap(
                    "the symmetric heap needs a GIO queue of the internode path for its host operations, and every \
                     queue is held: raise GPULMT_NET_QUEUES"
                        .into(),
                )
            })?;
            let device = DeviceQueues::claim(path, &backend, device, &target_of_pe)?;
            if device.is_none() {
                tracing::warn!(
                    "no GIO queue left for device code: kernels cannot reach PEs of other nodes (raise GPULMT_NET_QUEUES)"
                );
            }
            Ok(SymNet { queue: Mutex::new(queue), device })
        })();
        self.sym.as_mut().expect("set up before connecting").peers = peers;
        done
    }

    fn sym_net(&self, what: &str, pe: Rank) -> Result<&SymNet> {
        self.sym.as_ref().and_then(|h| h.net.as_ref()).ok_or_else(|| {
            net_error(what, pe, "this rank's heap is not on the internode path (a bug: the route said it was)")
        })
    }

    /// The kind of memory at `addr` (host where the backend does not know it).
    fn kind_of(&self, addr: usize) -> MemoryKind {
        self.backend.pointer_info(addr).map_or(MemoryKind::Host, |i| i.kind)
    }

    /// Waits until every operation of the host's queue completed.
    fn net_quiet(q: &mut HostQueue, what: &str, pe: Rank) -> Result<()> {
        q.quiet(Instant::now() + NET_WAIT).map_err(|e| match e {
            QuietError::Failed { .. } => net_error(what, pe, e),
            QuietError::TimedOut { .. } => net_error(what, pe, format!("{e} within {NET_WAIT:?}")),
        })
    }

    /// A put of `len` bytes at `src` to `offset` of `pe`'s heap; with `wait`, complete on
    /// return.
    ///
    /// # Safety
    /// `src..src+len` stays readable and unchanged until the op completes (on return with
    /// `wait`, else at the next quiet).
    pub(super) unsafe fn net_put(
        &self,
        route: (Rank, WindowId, u64),
        src: usize,
        len: usize,
        wait: bool,
    ) -> Result<()> {
        let (pe, window, offset) = route;
        let mut q = self.sym_net("sym_put", pe)?.queue();
        // SAFETY: the caller's contract.
        unsafe { q.put_nbi(pe, window, offset, src, len, self.kind_of(src)) }
            .map_err(|e| post_error("sym_put", pe, e))?;
        if wait {
            Self::net_quiet(&mut q, "sym_put", pe)?;
        }
        Ok(())
    }

    /// A get of `len` bytes at `offset` of `pe`'s heap into `dst`.
    ///
    /// # Safety
    /// `dst..dst+len` stays writable and unused until the op completes.
    pub(super) unsafe fn net_get(
        &self,
        route: (Rank, WindowId, u64),
        dst: usize,
        len: usize,
        wait: bool,
    ) -> Result<()> {
        let (pe, window, offset) = route;
        let mut q = self.sym_net("sym_get", pe)?.queue();
        // SAFETY: the caller's contract.
        unsafe { q.get_nbi(pe, window, offset, dst, len, self.kind_of(dst)) }
            .map_err(|e| post_error("sym_get", pe, e))?;
        if wait {
            Self::net_quiet(&mut q, "sym_get", pe)?;
        }
        Ok(())
    }

    /// A 2-D copy between `local` and the heap block at `offset` of `pe`'s heap: a PUT
    /// (`put`) or GET per row, one for a contiguous block. The queue has no strided op,
    /// and packing would need a staging buffer held until the quiet; a row per packet
    /// keeps the `_nbi` form simple, and the proxy carries the packets while the caller
    /// goes on. With `wait`, complete on return.
    ///
    /// # Safety
    /// The local rows stay valid for the copy (readable for a put, writable and unused for
    /// a get) until it completes.
    pub(super) unsafe fn net_2d(
        &self,
        what: &str,
        put: bool,
        route: (Rank, WindowId, u64),
        local: usize,
        shape: crate::device::Copy2d,
        wait: bool,
    ) -> Result<()> {
        let (pe, window, offset) = route;
        let mut q = self.sym_net(what, pe)?.queue();
        let kind = self.kind_of(local);
        let (rows, width) = if shape.is_contiguous() { (1, shape.bytes()) } else { (shape.height, shape.width) };
        let (local_pitch, remote_pitch) =
            if put { (shape.src_pitch, shape.dst_pitch) } else { (shape.dst_pitch, shape.src_pitch) };
        for i in 0..rows {
            let (at, remote) = (local + i * local_pitch, offset + (i * remote_pitch) as u64);
            // SAFETY: row `i` of the local rows, the caller's contract.
            let posted = unsafe {
                if put {
                    q.put_nbi(pe, window, remote, at, width, kind)
                } else {
                    q.get_nbi(pe, window, remote, at, width, kind)
                }
            };
            posted.map_err(|e| post_error(what, pe, e))?;
        }
        if wait {
            Self::net_quiet(&mut q, what, pe)?;
        }
        Ok(())
    }

    /// A put of `len` bytes, then the signal's update at `signal_offset` after the data
    /// (the target's proxy applies it once the data is in place); complete on return.
    ///
    /// # Safety
    /// As [`net_put`](Self::net_put)'s with `wait`.
    pub(super) unsafe fn net_put_signal(
        &self,
        route: (Rank, WindowId, u64),
        src: usize,
        len: usize,
        signal: (u64, u64, SignalOp),
    ) -> Result<()> {
        let ((pe, window, offset), (signal_offset, value, op)) = (route, signal);
        let mut q = self.sym_net("sym_put_signal", pe)?.queue();
        // SAFETY: the caller's contract.
        unsafe { q.put_signal_nbi(pe, window, offset, src, len, self.kind_of(src), signal_offset, value, op) }
            .map_err(|e| post_error("sym_put_signal", pe, e))?;
        Self::net_quiet(&mut q, "sym_put_signal", pe)
    }

    /// An AMO on the word at `offset` of `pe`'s heap; returns the old value (0 for a
    /// set, which fetches nothing). Complete on return.
    pub(super) fn net_amo(
        &self,
        what: &str,
        route: (Rank, WindowId, u64),
        amo: AmoOp,
        operand: u64,
        compare: u64,
    ) -> Result<u64> {
        let (pe, window, offset) = route;
        let mut q = self.sym_net(what, pe)?.queue();
        let mut old = Box::new(0u64);
        let result = match amo {
            AmoOp::Set => 0,
            _ => &mut *old as *mut u64 as usize,
        };
        // SAFETY: `old` is a host word that lives until the quiet below completed the op
        // (on an error, until the queue's quiet: the op may still complete, so the word
        // is leaked rather than freed under the proxy).
        let posted = unsafe { q.amo_nbi(pe, window, offset, amo, operand, compare, result, MemoryKind::Host) };
        posted.map_err(|e| post_error(what, pe, e))?;
        match Self::net_quiet(&mut q, what, pe) {
            Ok(()) => Ok(*old),
            Err(e) => {
                std::mem::forget(old);
                Err(e)
            }
        }
    }

    /// Orders the host queue's later operations to each PE after its earlier ones.
    pub(super) fn net_fence(&self) {
        if let Some(net) = self.sym.as_ref().and_then(|h| h.net.as_ref()) {
            net.queue().fence();
        }
    }

    /// Waits until every operation this rank posted through the GIO queues so far has
    /// completed at its target: the host's queue (its `_nbi` ops) and every device
    /// queue up to its doorbell (the ops of kernels that have ended: a kernel's `_nbi`
    /// ops and its last packets through the queue path are still in flight when the
    /// kernel ends, unless it quieted). Failures are left for the next `sym_quiet` to
    /// report; only a queue that stops completing ends the wait, after [`NET_WAIT`].
    ///
    /// `sym_free` drains before it frees: an op still in flight would otherwise land
    /// in, or read from, memory the next `sym_alloc` hands out again (the off-node
    /// `barrier_rounds` failure of bench/results/h200x1/offnode_probe3, in git history at
    /// c15a975: the earlier `quiet_busy` check's kernel ended with 1 MiB puts queued, which
    /// then wrote over `barrier_rounds`' fresh allocations at the same offsets).
    pub(super) fn net_drain(&self, what: &str) -> Result<()> {
        let Some(net) = self.sym.as_ref().and_then(|h| h.net.as_ref()) else { return Ok(()) };
        let deadline = Instant::now() + NET_WAIT;
        let drained = |name: String, mem: &crate::net::queue::QueueMem, until: u64| {
            let mut backoff = Backoff::default();
            loop {
                let done = mem.load_cq().done;
                if done >= until {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err(Error::Transfer(ProtoError::CopyFailed {
                        what: format!(
                            "{what} on rank {}: {name} completed {done} of the {until} operations posted to PEs of                              other nodes within {NET_WAIT:?}; a kernel still posting (finish the kernels first)                              or a peer that stopped answering",
                            self.rank()
                        ),
                    }));
                }
                backoff.wait();
            }
        };
        {
            let q = net.queue();
            drained("the host's GIO queue".into(), q.mem().as_ref(), q.tail())?;
        }
        for (i, q) in net.device.iter().flat_map(|d| d.queues.iter().enumerate()) {
            // The doorbell: a block rings it (a max) once its packet is committed, so
            // once the kernels ended it covers every packet they posted.
            drained(format!("device queue {i}"), q.mem().as_ref(), q.mem().load_tail())?;
        }
        Ok(())
    }

    /// Completes every operation of the host's queue.
    pub(super) fn net_quiet_all(&self) -> Result<()> {
        match self.sym.as_ref().and_then(|h| h.net.as_ref()) {
            Some(net) => Self::net_quiet(&mut net.queue(), "sym_quiet", self.rank()),
            None => Ok(()),
        }
    }
}

impl DeviceQueues {
    /// Claims every queue the path has left for device code and writes their records.
    fn claim(
        path: &mut NetPath,
        backend: &Backend,
        device: DevId,
        target_of_pe: &[i32],
    ) -> Result<Option<DeviceQueues>> {
        let mut queues = Vec::new();
        while let Some(q) = path.queue() {
            queues.push(q);
        }
        if queues.is_empty() {
            return Ok(None);
        }
        let n_pes = target_of_pe.len();
        let slots: Vec<usize> = queues.iter().map(|q| q.mem().slots() as usize).collect();
        let layout = TableLayout::new(&slots, n_pes);
        let result_bytes: usize = queues.iter().map(|q| 8 * q.mem().slots() as usize).sum();
        let results = backend.alloc_host_mapped(result_bytes)?;
        let mem = match backend.alloc(device, layout.bytes) {
            Ok(m) => m,
            Err(e) => {
                // SAFETY: our allocation, unknown to anyone yet.
                let _ = unsafe { backend.free_host_mapped(results.host) };
                return Err(e.into());
            }
        };
        let mut image = vec![0u8; layout.bytes];
        let table = QueueTable { n_sq: queues.len() as u32, pad: 0, sq: (mem + layout.records) as u64 };
        image[..16].copy_from_slice(&table.bytes());
        let mut result_at = results.device;
        for (i, q) in queues.iter().enumerate() {
            let words = mem + layout.words[i];
            let dq = q.mem().device_queue();
            let sq = SendQueue {
                ring: dq.base + RING_AT as u64,
                slots: dq.slots,
                reserve: words as u64,
                doorbell: dq.base + TAIL_AT as u64,
                head: dq.base + HEAD_AT as u64,
                cq_done: dq.base + CQ_AT as u64,
                cq_failed: dq.base + CQ_AT as u64 + 8,
                results: result_at as u64,
                target_of_pe: (words + layout.targets_at) as u64,
                fence_epoch_of_pe: (words + layout.epochs_at) as u64,
                fence_epoch: (words + 8) as u64,
                result_free: (words + layout.free_at) as u64,
            };
            result_at += 8 * dq.slots as usize;
            let at = layout.records + i * std::mem::size_of::<SendQueue>();
            image[at..at + std::mem::size_of::<SendQueue>()].copy_from_slice(&sq.bytes());
            let w = layout.words[i];
            // The device's reservations continue at the queue's tail: positions never
            // restart (the proxy's consumer goes on from where it is).
            image[w..w + 8].copy_from_slice(&q.tail().to_le_bytes());
            // Every result word is free for the first lap from the tail: as if the op a
            // lap before each position had released it.
            for s in 0..dq.slots as usize {
                let at = w + layout.free_at + 8 * s;
                image[at..at + 8].copy_from_slice(&q.tail().to_le_bytes());
            }
            for (pe, t) in target_of_pe.iter().enumerate() {
                let at = w + layout.targets_at + 4 * pe;
                image[at..at + 4].copy_from_slice(&t.to_le_bytes());
            }
        }
        // SAFETY: `mem` is our fresh allocation of `layout.bytes`; `image` a host buffer
        // of as many.
        if let Err(e) = unsafe { backend.copy_sync(mem, image.as_ptr() as usize, image.len()) } {
            // SAFETY: our allocations, unknown to anyone yet.
            unsafe {
                let _ = backend.free(mem);
                let _ = backend.free_host_mapped(results.host);
            }
            return Err(e.into());
        }
        Ok(Some(DeviceQueues { queues, mem, results, n_sq: layout.words.len() as u32 }))
    }

    /// Frees the table (finalize, after the path shut down and no kernel runs).
    pub(crate) fn free(self, backend: &Backend) {
        // SAFETY: the caller's contract: nothing reads the table or the results any more
        // (the proxy, which writes the results, has stopped).
        let freed = unsafe { backend.free(self.mem).and_then(|()| backend.free_host_mapped(self.results.host)) };
        if let Err(e) = freed {
            tracing::warn!(error = %e, "freeing the device's GIO queue table");
        }
    }
}

/// Where each part of the device's queue table lies in its allocation.
struct TableLayout {
    bytes: usize,
    /// Offset of the first [`SendQueue`] record.
    records: usize,
    /// Per queue: offset of its words (reserve, fence_epoch, then the arrays below).
    words: Vec<usize>,
    /// Offsets inside a queue's words.
    epochs_at: usize,
    targets_at: usize,
    /// The `result_free` words, one per slot.
    free_at: usize,
}

impl TableLayout {
    /// The layout of queues of `slots[i]` slots each, for `n_pes` PEs.
    fn new(slots: &[usize], n_pes: usize) -> TableLayout {
        // Each queue's words on lines of their own: the blocks of different queues
        // reserve and fence without sharing a line.
        const LINE: usize = 128;
        let records = 64;
        let (epochs_at, targets_at) = (16, 16 + 4 * n_pes);
        let free_at = (targets_at + 4 * n_pes).next_multiple_of(8);
        let mut at = (records + slots.len() * std::mem::size_of::<SendQueue>()).next_multiple_of(LINE);
        let mut words = Vec::with_capacity(slots.len());
        for &s in slots {
            words.push(at);
            at = (at + free_at + 8 * s).next_multiple_of(LINE);
        }
        TableLayout { bytes: at, records, words, epochs_at, targets_at, free_at }
    }
}
