//! Copies on the CUDA backend: the streams of each device (one per lane, created on first
//! use, with the priority asked for), the events that mark a copy finished, the tickets of
//! the copies in flight, and the routing of small copies to the device's copy server.

use std::ffi::{c_int, c_uint};
use std::ptr;
use std::sync::atomic::Ordering;

use cudarc::driver::sys::{self, CUdeviceptr};
use rustc_hash::FxHashMap;

use super::driver::{check, cu, lock, CuFailure, Event, Stream};
use super::memory::known_info;
use super::{CudaBackend, Device};
use crate::device::{CopyTicket, DevId, DeviceBackend, DeviceError, FinishedThrough, MemoryKind, PointerInfo};

/// Stream slot of [`DeviceBackend::copy_sync`]; lanes of `copy_async` follow it.
pub(super) const SYNC_SLOT: usize = 0;

pub(super) fn lane_slot(lane: u32) -> usize {
    lane as usize + 1
}

/// The application's legacy default stream (`CU_STREAM_LEGACY`).
pub(super) const LEGACY_STREAM: sys::CUstream = 1usize as sys::CUstream;

/// A copy in flight. The newest copy on a stream has no event: it is finished when its
/// stream is idle (`cuStreamQuery`), so a lone copy, the latency case, costs one driver
/// call to issue rather than two. Issuing the next copy on that stream first records an
/// event behind it (see `copy_async`).
#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub(super) dev: DevId,
    /// The stream it runs on and its slot; None for a zero-length copy (nothing to wait
    /// for) or one the copy server makes.
    pub(super) stream: Option<(Stream, usize)>,
    pub(super) event: Option<Event>,
    /// The copy server's sequence number for a copy it makes.
    pub(super) served: Option<u64>,
}

/// The copies in flight, and per stream the one copy that has no event yet.
#[derive(Default)]
pub(super) struct Tickets {
    /// Tickets are our own counter, not an adversary's input: a fast hasher is safe
    /// (every poll of a copy looks its ticket up).
    pub(super) pending: FxHashMap<u64, Pending>,
    /// (device, stream slot) -> the newest copy issued there, which has no event.
    pub(super) bare: FxHashMap<(DevId, usize), u64>,
    /// Per (device, stream slot): how far the stream has been seen finished. Its
    /// tickets increase in queue order because they are drawn under this lock.
    pub(super) finished: FinishedThrough<(DevId, usize)>,
}

impl CudaBackend {
    /// Whether the copy server, not the copy engine, makes the copy of `ticket` (false
    /// once the ticket has completed): for diagnostics and tests.
    pub fn copy_served(&self, ticket: CopyTicket) -> bool {
        lock(&self.tickets).pending.get(&ticket.0).is_some_and(|p| p.served.is_some())
    }

    /// Copies `len` bytes from `src` to `dst` on `engine` again and again, each waited
    /// for, until the copy server takes one (the first copy after the server was enabled
    /// or went idle goes to the engine and starts one; a backoff may delay that start):
    /// for diagnostics and tests. How many copies that took, or None after `limit`.
    ///
    /// # Safety
    /// As [`DeviceBackend::copy_sync`]'s: `src..src+len` readable and `dst..dst+len`
    /// writable for the whole call, with nothing else writing `src` or accessing `dst`.
    pub unsafe fn copy_until_served(
        &self,
        engine: DevId,
        (dst, src, len): (usize, usize, usize),
        limit: std::time::Duration,
    ) -> Result<Option<u32>, DeviceError> {
        let start = std::time::Instant::now();
        for copies in 1.. {
            // SAFETY: this function's contract keeps both ranges valid until it returns,
            // and it waits for each copy to finish before the next or its return.
            let t = unsafe { self.copy_async(engine, 0, dst, src, len)? };
            let served = self.copy_served(t);
            while !self.copy_poll(t)? {
                std::hint::spin_loop();
            }
            if served {
                return Ok(Some(copies));
            }
            if start.elapsed() >= limit {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        Ok(None)
    }

    /// The priority of `d`'s new streams: the context's greatest, or the default (0);
    /// `d`'s context must be current.
    pub(super) fn stream_priority(d: &Device) -> Result<c_int, DeviceError> {
        if !d.high_priority.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let (mut least, mut greatest): (c_int, c_int) = (0, 0);
        cu!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest))?;
        Ok(greatest)
    }

    /// The stream in `slot` of `d`, created on first use; `d`'s context must be current.
    pub(super) fn stream(d: &Device, slot: usize) -> Result<sys::CUstream, DeviceError> {
        let mut streams = lock(&d.streams);
        if let Some(Some(s)) = streams.get(slot) {
            return Ok(s.0);
        }
        let mut s: sys::CUstream = ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as c_uint;
        cu!(cuStreamCreateWithPriority(&mut s, flags, Self::stream_priority(d)?))?;
        if streams.len() <= slot {
            streams.resize_with(slot + 1, || None);
        }
        streams[slot] = Some(Stream(s));
        Ok(s)
    }

    /// An event from `d`'s pool, or a new one; `d`'s context must be current.
    pub(super) fn take_event(d: &Device) -> Result<Event, DeviceError> {
        if let Some(ev) = lock(&d.events).pop() {
            return Ok(ev);
        }
        let mut ev: sys::CUevent = ptr::null_mut();
        cu!(cuEventCreate(&mut ev, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint))?;
        Ok(Event(ev))
    }

    /// Queues a copy on stream `slot` of `dev`, then runs `then` with that stream while the
    /// context is still current. Unified addressing lets the driver work out the direction.
    /// With `after_app`, the copy also waits for the work the application queued so far
    /// on its legacy default stream (see [`DeviceBackend::copy_sync`]).
    ///
    /// # Safety
    /// `src..src+len` readable and `dst..dst+len` writable until the copy has finished on
    /// the stream (which `then` may wait for), as [`DeviceBackend::copy_async`] requires.
    pub(super) unsafe fn enqueue<T>(
        &self,
        dev: DevId,
        slot: usize,
        (dst, src, len): (usize, usize, usize),
        after_app: bool,
        then: impl FnOnce(&Device, sys::CUstream) -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let issue = |stream| cu!(cuMemcpyAsync(dst as CUdeviceptr, src as CUdeviceptr, len, stream));
        // SAFETY: this function's contract covers the copy `issue` queues.
        unsafe { self.enqueue_with(dev, slot, after_app, issue, then) }
    }

    /// [`enqueue`](Self::enqueue) of any copy: `issue` queues it on the stream it is given.
    ///
    /// # Safety
    /// What `issue` queues reads and writes only memory that stays valid until the copy
    /// has finished on the stream, as [`DeviceBackend::copy_2d_async`] requires.
    pub(super) unsafe fn enqueue_with<T>(
        &self,
        dev: DevId,
        slot: usize,
        after_app: bool,
        issue: impl FnOnce(sys::CUstream) -> Result<(), CuFailure>,
        then: impl FnOnce(&Device, sys::CUstream) -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let d = self.device(dev)?;
        let _current = self.enter(dev)?;
        let stream = Self::stream(d, slot)?;
        if after_app {
            Self::after_app_work(d, stream)?;
        }
        issue(stream)?;
        then(d, stream)
    }

    /// Makes `stream` wait for the work the application queued so far on its legacy
    /// default stream; `d`'s context must be current.
    fn after_app_work(d: &Device, stream: sys::CUstream) -> Result<(), DeviceError> {
        let ev = Self::take_event(d)?;
        // The wait takes the event's state now, so it can go back to the pool at once.
        let ordered = cu!(cuEventRecord(ev.0, LEGACY_STREAM)).and_then(|()| cu!(cuStreamWaitEvent(stream, ev.0, 0)));
        lock(&d.events).push(ev);
        Ok(ordered?)
    }

    /// Queues a copy on stream `slot` of `engine`'s device (its context current).
    ///
    /// # Safety
    /// As [`DeviceBackend::copy_async`]'s: both ranges valid until the ticket's copy is
    /// reported finished.
    pub(super) unsafe fn engine_copy(
        &self,
        engine: DevId,
        d: &Device,
        slot: usize,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<CopyTicket, DeviceError> {
        let issue = |stream| cu!(cuMemcpyAsync(dst as CUdeviceptr, src as CUdeviceptr, len, stream));
        // SAFETY: this function's contract covers the copy `issue` queues.
        unsafe { self.engine_issue(engine, d, slot, issue) }
    }

    /// [`engine_copy`](Self::engine_copy) of any copy: `issue` queues it on the stream it
    /// is given, and the ticket stands for it.
    ///
    /// # Safety
    /// What `issue` queues reads and writes only memory that stays valid until the
    /// ticket's copy is reported finished.
    pub(super) unsafe fn engine_issue(
        &self,
        engine: DevId,
        d: &Device,
        slot: usize,
        issue: impl FnOnce(sys::CUstream) -> Result<(), CuFailure>,
    ) -> Result<CopyTicket, DeviceError> {
        let stream = Self::stream(d, slot)?;
        // Held across the driver calls, so that the copy that gets an event below is still
        // the newest on the stream when the next one is queued behind it, and so that the
        // tickets of one stream increase in the order its copies are queued.
        let mut tickets = lock(&self.tickets);
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let t = &mut *tickets;
        if let Some(prev) = t.bare.remove(&(engine, slot)) {
            if let Some(p) = t.pending.get_mut(&prev) {
                // The event completes when every copy queued so far on the stream has, which
                // is when `prev`, the newest of them, has.
                let ev = Self::take_event(d)?;
                if let Err(f) = cu!(cuEventRecord(ev.0, stream)) {
                    lock(&d.events).push(ev);
                    t.bare.insert((engine, slot), prev);
                    return Err(f.into());
                }
                p.event = Some(ev);
            }
        }
        issue(stream)?;
        t.pending.insert(id, Pending { dev: engine, stream: Some((Stream(stream), slot)), event: None, served: None });
        t.bare.insert((engine, slot), id);
        Ok(CopyTicket(id))
    }

    /// Posts a copy to `dev`'s copy server if it takes it: both ends in device memory `dev`
    /// reaches or in pinned memory of `alloc_host_mapped` (the kernel cannot touch pageable
    /// host memory), and room in its ring. Its sequence number. (Pinned staging buffers
    /// are recycled: the server reads them afresh only thanks to its acquire fence after
    /// taking descriptors; without it a D D check across pseudo-nodes received stale bytes.)
    ///
    /// # Safety
    /// As [`DeviceBackend::copy_async`]'s: both ranges valid until the server reports the
    /// copy finished.
    pub(super) unsafe fn serve(
        &self,
        dev: DevId,
        d: &Device,
        dst: usize,
        src: usize,
        len: usize,
    ) -> Result<Option<u64>, DeviceError> {
        // Device memory this device's kernels reach: its own, or a peer's with access
        // enabled. (A kernel's bad access would end the context; the engine's is an error.)
        // Both ends looked up under one lock of `known` (allocations and IPC mappings are
        // there); anything else is asked of the driver.
        // Pinned memory of alloc_host_mapped is reachable too, at its device address (a
        // staging buffer of the internode path, the context's eager bounce buffer).
        let [dst_pinned, src_pinned] = self.pinned_device_addresses([dst, src], len);
        let [dst_info, src_info] = {
            let known = lock(&self.known);
            [dst, src].map(|p| known_info(&known, p))
        };
        let reachable = |p, pinned: Option<usize>, info: Option<PointerInfo>| {
            pinned.is_some()
                || match info.map_or_else(|| self.query_pointer(p), Ok) {
                    Ok(PointerInfo { kind: MemoryKind::Device(on), .. }) => self.can_access_peer(dev, on),
                    _ => false,
                }
        };
        if !(reachable(dst, dst_pinned, dst_info) && reachable(src, src_pinned, src_info)) {
            return Ok(None);
        }
        let (dst, src) = (dst_pinned.unwrap_or(dst), src_pinned.unwrap_or(src));
        let mut server = lock(&d.server);
        let Some(server) = server.as_mut() else { return Ok(None) };
        // SAFETY: this function's contract is post's; a pinned end is the same memory at
        // its device address.
        unsafe { server.post((dst, src, len), || self.enter(dev), std::time::Instant::now) }
    }
}
