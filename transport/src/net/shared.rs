//! What the proxy thread and the rest of the process share besides the queues: the queue
//! set, the inbound control packets, failed ranks, commands to the proxy, and its stop.
//!
//! The hot path (packets, completions) goes through queue memory, and the context's
//! inbound packets through a lock-free queue; the rest are rare events, behind plain
//! mutexes that a [`Mailbox`]'s count keeps the polling side from touching while nothing
//! is there.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;

use gpulmt_protocols::gio::{FenceMarks, Producer, TemplateTable};
use gpulmt_protocols::Rank;

use super::idle::IdleGate;
use super::queue::QueueMem;
use crate::device::MemoryKind;

/// Control packets the inbound queue holds before the proxy keeps the rest itself: more
/// than the control receives it keeps posted (`GPULMT_NET_CTRL_POOL`, 32 by default), so a
/// context that polls between the proxy's rounds never lets it fill.
pub(crate) const INBOUND_SLOTS: usize = 256;

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

/// Items one thread hands to another that polls for them: a list behind a mutex, and a
/// count of the hand-overs on a cache line of its own.
///
/// The poller reads only the count while nothing came, so its spinning writes no line the
/// other thread uses: locking the mutex on every poll (as the context's progress loop did
/// for inbound packets) made each hand-over and each proxy round pay for that line's trips
/// between the two cores.
pub(crate) struct Mailbox<T> {
    items: CachePadded<Mutex<Vec<T>>>,
    /// Hand-overs so far; bumped after the items are in (under the lock).
    puts: CachePadded<AtomicU64>,
}

impl<T> Default for Mailbox<T> {
    fn default() -> Self {
        Mailbox { items: CachePadded::new(Mutex::new(Vec::new())), puts: CachePadded::new(AtomicU64::new(0)) }
    }
}

impl<T> Mailbox<T> {
    /// Hands `item` over unless an equal one waits already.
    pub fn put_unique(&self, item: T)
    where
        T: PartialEq,
    {
        let mut list = lock(&self.items);
        if !list.contains(&item) {
            list.push(item);
            // Release, pairs with take_new's acquire; the lock orders the items anyway, the
            // count only tells the poller to take it. Scope: host.
            self.puts.fetch_add(1, Ordering::Release);
        }
    }

    /// Everything handed over since the poller last took, if the count moved past `seen`
    /// (the poller's own copy of it, updated here); empty without locking otherwise.
    pub fn take_new(&self, seen: &mut u64) -> Vec<T> {
        // Acquire, pairs with the puts' release (see put_unique). Scope: host.
        let puts = self.puts.load(Ordering::Acquire);
        if puts == *seen {
            return Vec::new();
        }
        // A put between the load and the lock is taken now and its bump seen next time,
        // which then finds the list empty: nothing is ever left behind.
        *seen = puts;
        std::mem::take(&mut *lock(&self.items))
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
    /// One-sided traffic may come and go (this rank exposes or reaches a window): keep the
    /// pools of one-sided requests and replies full.
    OneSided,
}

/// State shared by the proxy thread and the path.
pub(crate) struct Shared {
    pub set: QueueSet,
    /// Control packets from other nodes, in per-sender order, for the context: one push
    /// by the proxy and one pop by the context per packet, lock-free (crossbeam's
    /// `ArrayQueue`: a push's release store of its slot's stamp pairs with the pop's acquire
    /// load, so the packet is whole when popped). A list behind a lock took 0.85-0.90 us
    /// from an arrival to the context (`net_anatomy3`). When it is full the proxy keeps the
    /// rest, in order, and retries every round.
    pub inbound: ArrayQueue<(Rank, Vec<u8>)>,
    /// Ranks found failed, not yet reported.
    pub failed_ranks: Mailbox<Rank>,
    commands: Mutex<Vec<Command>>,
    /// Commands posted so far, and applied so far by the proxy: the proxy reads both every
    /// round, so they sit apart from lines the context writes.
    posted: CachePadded<AtomicU64>,
    applied: CachePadded<AtomicU64>,
    /// Set once shutdown is asked for; `deadline` says until when ops may drain.
    stop: CachePadded<AtomicBool>,
    deadline: Mutex<Option<Instant>>,
    /// The proxy thread runs (cleared when it exits, for any reason).
    pub running: CachePadded<AtomicBool>,
    /// Why the proxy ended, once it has: Ok, or what it could not clean up.
    pub exit: Mutex<Option<Result<(), String>>>,
    /// The proxy's idle sleep, which host posts and commands cut short.
    pub idle: IdleGate,
}

impl Shared {
    pub fn new(set: QueueSet) -> Shared {
        Shared {
            set,
            inbound: ArrayQueue::new(INBOUND_SLOTS),
            failed_ranks: Mailbox::default(),
            commands: Mutex::new(Vec::new()),
            posted: CachePadded::new(AtomicU64::new(0)),
            applied: CachePadded::new(AtomicU64::new(0)),
            stop: CachePadded::new(AtomicBool::new(false)),
            deadline: Mutex::new(None),
            running: CachePadded::new(AtomicBool::new(true)),
            exit: Mutex::new(None),
            idle: IdleGate::default(),
        }
    }

    /// Posts `cmd` for the proxy's next round; returns its number.
    pub fn post_command(&self, cmd: Command) -> u64 {
        let mut c = lock(&self.commands);
        c.push(cmd);
        // Relaxed, pairs with take_commands: the lock orders the count with the command
        // (the proxy reads both under it). Scope: host.
        let seq = self.posted.fetch_add(1, Ordering::Relaxed) + 1;
        drop(c);
        self.idle.wake();
        seq
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

#[cfg(test)]
mod tests {
    use super::Mailbox;

    #[test]
    fn a_mailbox_hands_over_each_item_once_in_order() {
        let m = Mailbox::default();
        let mut seen = 0;
        assert!(m.take_new(&mut seen).is_empty());
        m.put_unique(1);
        m.put_unique(2);
        m.put_unique(3);
        assert_eq!(m.take_new(&mut seen), vec![1, 2, 3]);
        assert!(m.take_new(&mut seen).is_empty());
        m.put_unique(4);
        m.put_unique(4);
        assert_eq!(m.take_new(&mut seen), vec![4]);
        m.put_unique(4);
        assert_eq!(m.take_new(&mut seen), vec![4], "an item taken may come again");
    }

    #[test]
    fn a_mailbox_loses_nothing_between_two_threads() {
        // Distinct items: put_unique looks through what waits (a short list here).
        const N: u64 = 20_000;
        let m = std::sync::Arc::new(Mailbox::default());
        let producer = {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..N {
                    m.put_unique(i);
                }
            })
        };
        let (mut seen, mut got) = (0, Vec::new());
        while got.len() < N as usize {
            got.extend(m.take_new(&mut seen));
            std::hint::spin_loop();
        }
        producer.join().unwrap();
        assert!(m.take_new(&mut seen).is_empty());
        assert_eq!(got, (0..N).collect::<Vec<_>>());
    }
}
