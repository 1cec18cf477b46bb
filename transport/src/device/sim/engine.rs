//! The copy engines: one thread per device, started on first use, makes that device's
//! copies strictly one after another, so copies queued on one engine really contend;
//! and the tickets of the copies in flight.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{lock, SimBackend};
use crate::device::{Copy2d, DevId, DeviceError, FinishedThrough};

/// A copy queued on an engine: a 1-D copy is one row.
pub(super) struct CopyJob {
    pub(super) dst: usize,
    pub(super) src: usize,
    pub(super) shape: Copy2d,
    pub(super) done: Arc<AtomicBool>,
}

/// Copies the rows of a 2-D block, as a copy engine does: one `memmove` when the block is
/// contiguous, else one per row.
///
/// # Safety
/// Every source row of `shape` at `src` readable and every destination row at `dst`
/// writable for the call, with nothing else writing either.
pub(super) unsafe fn copy_rows(dst: usize, src: usize, shape: Copy2d) {
    if shape.is_empty() {
        return;
    }
    if shape.is_contiguous() {
        // SAFETY: the caller's contract covers the block, one run of `bytes()` at each end.
        // `copy` handles overlap.
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, shape.bytes()) };
        return;
    }
    for i in 0..shape.height {
        // SAFETY: row `i` of both ends, inside the caller's contract.
        unsafe {
            std::ptr::copy(
                (src + i * shape.src_pitch) as *const u8,
                (dst + i * shape.dst_pitch) as *mut u8,
                shape.width,
            )
        };
    }
}

pub(super) struct Engine {
    pub(super) tx: mpsc::Sender<CopyJob>,
    pub(super) thread: JoinHandle<()>,
}

fn engine_main(rx: mpsc::Receiver<CopyJob>) {
    // Ends when the backend drops the sender, after draining what was queued, so a
    // dropped backend never leaves a copy half done.
    for job in rx {
        // SAFETY: copy_async's (and copy_2d_async's) contract keeps the source rows
        // readable and the destination rows writable until copy_poll reports the copy
        // finished, which it does only after the store below; dropping the backend joins
        // this thread before it releases any memory.
        unsafe { copy_rows(job.dst, job.src, job.shape) };
        // Release: publishes the bytes just written to whoever Acquire-loads the flag
        // in copy_poll, so a completed poll implies the data is visible.
        job.done.store(true, Ordering::Release);
    }
}

/// A copy in flight.
pub(super) struct SimTicket {
    pub(super) done: Arc<AtomicBool>,
    /// For inline copies with `copy_done_ns`: when it may be seen finished.
    pub(super) seen_at: Option<Instant>,
    pub(super) engine: DevId,
}

#[derive(Default)]
pub(super) struct Tickets {
    pub(super) pending: std::collections::HashMap<u64, SimTicket>,
    /// Per engine (one in-order queue each): how far polls have seen it finished, so
    /// that the driver cost model charges nothing for what a poll already knows.
    pub(super) finished: FinishedThrough<DevId>,
}

/// Spins for `ns` nanoseconds: the CPU time a driver call takes.
pub(super) fn spin_ns(ns: u64) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_nanos(ns) {
        std::hint::spin_loop();
    }
}

impl SimBackend {
    /// The sender of `dev`'s engine, starting its thread on first use.
    pub(super) fn engine_sender(&self, dev: DevId) -> Result<mpsc::Sender<CopyJob>, DeviceError> {
        let mut slot = lock(&self.engines[dev as usize]);
        if let Some(e) = slot.as_ref() {
            return Ok(e.tx.clone());
        }
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("gpulmt-sim-ce{dev}"))
            .spawn(move || {
                // The thread stands for a GPU's copy engine, not for the rank's CPU work: it
                // must not share the one core a launcher may have bound the rank to (ranks
                // busy-poll, and the copies would crawl).
                crate::binding::unbind_this_thread();
                engine_main(rx)
            })
            .map_err(|e| DeviceError::Driver {
                call: "pthread_create",
                code: e.raw_os_error().unwrap_or(0) as i64,
                message: format!("starting the copy engine thread of sim device {dev}: {e}"),
            })?;
        *slot = Some(Engine { tx: tx.clone(), thread });
        Ok(tx)
    }
}

impl SimBackend {
    /// Checks a copy's ends (`shape` whole: every byte of both spans inside its device
    /// allocation where it is device memory) and starts it on `engine`'s thread, or inline
    /// with `GPULMT_SIM_COPY_INLINE`. Lanes are accepted and ignored: one FIFO per device
    /// keeps each lane's order trivially and serialises lanes, which the trait allows
    /// (lanes *may* run concurrently) and which makes contention on one engine visible.
    ///
    /// # Safety
    /// As [`DeviceBackend::copy_2d_async`](crate::device::DeviceBackend::copy_2d_async)'s.
    pub(super) unsafe fn start_copy(
        &self,
        op: &'static str,
        engine: DevId,
        _lane: u32,
        (dst, src): (usize, usize),
        shape: Copy2d,
    ) -> Result<crate::device::CopyTicket, DeviceError> {
        self.check_dev(engine)?;
        let done = Arc::new(AtomicBool::new(false));
        let mut seen_at = None;
        if self.check_copy(op, dst, src, shape)? {
            done.store(true, Ordering::Relaxed);
        } else {
            if let Some(d) = self.cfg.driver {
                spin_ns(d.issue_ns);
            }
            if self.cfg.copy_inline {
                // SAFETY: the caller keeps every row of both ends valid until the copy is
                // reported finished, which is after this line; device ranges that overrun
                // their allocation were refused above.
                unsafe { copy_rows(dst, src, shape) };
                done.store(true, Ordering::Release);
                seen_at =
                    (self.cfg.copy_done_ns > 0).then(|| Instant::now() + Duration::from_nanos(self.cfg.copy_done_ns));
            } else {
                let job = CopyJob { dst, src, shape, done: done.clone() };
                self.engine_sender(engine)?.send(job).map_err(|_| DeviceError::Driver {
                    call: op,
                    code: 0,
                    message: format!("copy engine thread of sim device {engine} has stopped"),
                })?;
            }
        }
        let id = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        lock(&self.tickets).pending.insert(id, SimTicket { done, seen_at, engine });
        Ok(crate::device::CopyTicket(id))
    }

    /// A copy on the calling thread, checked as [`start_copy`](Self::start_copy)'s.
    ///
    /// # Safety
    /// As [`DeviceBackend::copy_2d_sync`](crate::device::DeviceBackend::copy_2d_sync)'s.
    pub(super) unsafe fn copy_now(
        &self,
        op: &'static str,
        dst: usize,
        src: usize,
        shape: Copy2d,
    ) -> Result<(), DeviceError> {
        if !self.check_copy(op, dst, src, shape)? {
            // SAFETY: the caller keeps every row of both ends valid for the call; device
            // ranges that overrun their allocation were refused by the check.
            unsafe { copy_rows(dst, src, shape) };
        }
        Ok(())
    }

    /// Checks a copy's shape and both spans; whether it moves nothing.
    fn check_copy(&self, op: &'static str, dst: usize, src: usize, shape: Copy2d) -> Result<bool, DeviceError> {
        let (dst_span, src_span) = shape.check(op)?;
        if shape.is_empty() {
            return Ok(true);
        }
        let st = lock(&self.state);
        st.check_range(op, dst, dst_span)?;
        st.check_range(op, src, src_span)?;
        Ok(false)
    }
}
