//! The copy engines: one thread per device, started on first use, makes that device's
//! copies strictly one after another, so copies queued on one engine really contend;
//! and the tickets of the copies in flight.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{lock, SimBackend};
use crate::device::{DevId, DeviceError, FinishedThrough};

pub(super) struct CopyJob {
    pub(super) dst: usize,
    pub(super) src: usize,
    pub(super) len: usize,
    pub(super) done: Arc<AtomicBool>,
}

pub(super) struct Engine {
    pub(super) tx: mpsc::Sender<CopyJob>,
    pub(super) thread: JoinHandle<()>,
}

fn engine_main(rx: mpsc::Receiver<CopyJob>) {
    // Ends when the backend drops the sender, after draining what was queued, so a
    // dropped backend never leaves a copy half done.
    for job in rx {
        // SAFETY: copy_async's contract keeps `src` readable and `dst` writable for `len`
        // bytes until copy_poll reports the copy finished, which it does only after the
        // store below; dropping the backend joins this thread before it releases any
        // memory. `copy` handles overlap.
        unsafe { std::ptr::copy(job.src as *const u8, job.dst as *mut u8, job.len) };
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
