//! What the proxy thread and the rest of the process share besides the queues: the queue
//! set, the inbound control packets, failed ranks, commands to the proxy, and its stop.
//!
//! The hot path (packets, completions) goes through queue memory only; these are for
//! rare events and for the context's inbound packets, behind plain mutexes.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpulmt_protocols::gio::{FenceMarks, Producer, TemplateTable};
use gpulmt_protocols::Rank;

use super::queue::QueueMem;
use crate::device::MemoryKind;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values stay consistent at every unlock, so a poisoned lock's value is
    // still good: a panic elsewhere must not take the path down with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A producer's private state of its queue: handed from one handle to the next, so a
/// queue claimed again continues at its positions (they never restart at 0: the ring and
/// the proxy's consumer go on from where they are).
#[derive(Debug)]
pub(crate) struct ProducerState {
    pub producer: Producer,
    pub fence: FenceMarks,
}

/// The queues of this process, set up at start (`GPULMT_NET_QUEUES`).
///
/// **Decision**: the set is sized at start and never grows while the proxy runs. A
/// producer claims a free queue and gives it back when done; a device producer (issue
/// 28) claims one per thread block the same way, so the set must be sized for the blocks
/// that post at once. A fixed set keeps the proxy's list of queues immutable (no lock on
/// its polling path) and the queues' memory allocated before any kernel can see it.
pub(crate) struct QueueSet {
    pub queues: Vec<Arc<QueueMem>>,
    /// Per queue: the producer state while no handle holds it (None: claimed).
    free: Mutex<Vec<Option<ProducerState>>>,
}

impl QueueSet {
    pub fn new(queues: Vec<Arc<QueueMem>>) -> QueueSet {
        let free = queues
            .iter()
            .map(|q| {
                let producer = Producer::new(q.slots()).expect("queue slots are a power of two");
                Some(ProducerState { producer, fence: FenceMarks::default() })
            })
            .collect();
        QueueSet { queues, free: Mutex::new(free) }
    }

    /// Claims a free queue: its number and producer state.
    pub fn claim(&self) -> Option<(usize, ProducerState)> {
        let mut free = lock(&self.free);
        free.iter_mut().enumerate().find_map(|(i, s)| s.take().map(|s| (i, s)))
    }

    /// Gives queue `index` back with its producer state.
    pub fn release(&self, index: usize, state: ProducerState) {
        let mut free = lock(&self.free);
        debug_assert!(free[index].is_none(), "GIO queue {index} released twice");
        free[index] = Some(state);
    }
}

/// A window this rank exposes to one-sided ops: the target side's table entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalWindow {
    pub base: usize,
    pub size: u64,
    pub mem: MemoryKind,
}

/// What the proxy is asked to do besides its queues.
#[derive(Debug)]
pub(crate) enum Command {
    /// Use these templates for every queue from now on.
    Templates(Arc<TemplateTable>),
    /// Expose window `id` to one-sided ops of other ranks.
    Expose { id: u32, window: LocalWindow },
    /// End op `seq` of queue `queue` soon (it still completes, with an error if cut short).
    Cancel { queue: u32, seq: u64 },
}

/// State shared by the proxy thread and the path.
pub(crate) struct Shared {
    pub set: QueueSet,
    /// Control packets from other nodes, in per-sender order, for the context.
    pub inbound: Mutex<VecDeque<(Rank, Vec<u8>)>>,
    /// Ranks found failed, not yet reported.
    pub failed_ranks: Mutex<Vec<Rank>>,
    commands: Mutex<Vec<Command>>,
    /// Commands posted so far, and applied so far by the proxy.
    posted: AtomicU64,
    applied: AtomicU64,
    /// Set once shutdown is asked for; `deadline` says until when ops may drain.
    stop: AtomicBool,
    deadline: Mutex<Option<Instant>>,
    /// The proxy thread runs (cleared when it exits, for any reason).
    pub running: AtomicBool,
    /// Why the proxy ended, once it has: Ok, or what it could not clean up.
    pub exit: Mutex<Option<Result<(), String>>>,
}

impl Shared {
    pub fn new(set: QueueSet) -> Shared {
        Shared {
            set,
            inbound: Mutex::new(VecDeque::new()),
            failed_ranks: Mutex::new(Vec::new()),
            commands: Mutex::new(Vec::new()),
            posted: AtomicU64::new(0),
            applied: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            deadline: Mutex::new(None),
            running: AtomicBool::new(true),
            exit: Mutex::new(None),
        }
    }

    /// Posts `cmd` for the proxy's next round; returns its number.
    pub fn post_command(&self, cmd: Command) -> u64 {
        let mut c = lock(&self.commands);
        c.push(cmd);
        // Relaxed, pairs with take_commands: the lock orders the count with the command
        // (the proxy reads both under it). Scope: host.
        self.posted.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Posts `cmd` and waits until the proxy applied it, for at most `timeout`.
    pub fn command(&self, cmd: Command, timeout: Duration) -> Result<(), String> {
        let seq = self.post_command(cmd);
        let deadline = Instant::now() + timeout;
        // Acquire, pairs with applied's release: the proxy's effects of the command (its
        // tables) are in place before this returns. Scope: host.
        while self.applied.load(Ordering::Acquire) < seq {
            // Acquire, pairs with the proxy thread's release at its exit: its status.
            if !self.running.load(Ordering::Acquire) {
                return Err("the proxy thread has exited".into());
            }
            if Instant::now() >= deadline {
                return Err(format!("the proxy did not apply a command within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// The proxy: whether commands wait (one relaxed load per round).
    pub fn has_commands(&self) -> bool {
        // Relaxed, pairs with post_command: a stale answer only delays a command by a
        // round (a benign race); take_commands reads under the lock.
        self.posted.load(Ordering::Relaxed) != self.applied.load(Ordering::Relaxed)
    }

    /// The proxy: takes the commands; call [`applied`](Self::applied) once they are.
    pub fn take_commands(&self) -> (Vec<Command>, u64) {
        let mut c = lock(&self.commands);
        // Relaxed, pairs with post_command: under the same lock as the commands.
        (std::mem::take(&mut *c), self.posted.load(Ordering::Relaxed))
    }

    /// The proxy applied the commands posted up to `upto`.
    pub fn applied(&self, upto: u64) {
        // Release, pairs with command's acquire: the commands' effects. Scope: host.
        self.applied.store(upto, Ordering::Release);
    }

    /// Asks the proxy to stop: ops in flight may finish until `deadline`.
    pub fn request_stop(&self, deadline: Instant) {
        let mut d = lock(&self.deadline);
        *d = Some(d.map_or(deadline, |old| old.min(deadline)));
        // Release, pairs with stop_deadline's acquire: the deadline is written. Scope: host.
        self.stop.store(true, Ordering::Release);
    }

    /// The proxy: the stop deadline, once stop is asked for.
    pub fn stop_deadline(&self) -> Option<Instant> {
        // Acquire, pairs with request_stop: the deadline. Scope: host.
        match self.stop.load(Ordering::Acquire) {
            true => *lock(&self.deadline),
            false => None,
        }
    }
}
