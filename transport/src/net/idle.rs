//! The proxy's idle sleep, which a host producer cuts short.
//!
//! An idle proxy backs off to sleeps of up to `GPULMT_NET_IDLE_SLEEP` (50 us by default).
//! A packet a host thread posts meanwhile used to wait out the sleep: the first message
//! after an application's compute phase paid up to 50 us. Now the proxy marks itself
//! asleep before it parks, and a host producer that rings a doorbell (or posts a command)
//! unparks it when the mark is set. A GPU producer cannot unpark a thread; its packets, and
//! messages arriving from the network, are still seen at the end of the sleep, whose cap
//! bounds them as before.
//!
//! No wake-up is lost. The proxy stores the mark, fences, then looks at the doorbells one
//! last time before it parks; a producer stores its doorbell, fences, then loads the mark.
//! With both fences sequentially consistent, either the proxy sees the doorbell (and does
//! not park) or the producer sees the mark (and unparks: an unpark before the park makes
//! the park return at once). A spurious or missed wake-up costs at most the sleep's length.
//!
//! A thread of this rank that waits on the network (a `test`/`wait` loop with requests
//! outstanding, a host quiet) keeps the proxy from sleeping: it bumps a counter each time
//! it polls, and unparks a sleeping proxy. The proxy, before each sleep, looks whether the
//! counter moved since its last look, and if so yields instead: a message that a thread
//! waits for is taken from MPI as soon as it arrives, not at the end of a sleep (a receive
//! after a compute phase found its proxy in 50 us sleeps, since nothing else had woken it).
//! No fence on this side: a wait polls again and again, so a proxy that parks just after a
//! poll looked at the mark is unparked by the next poll.

use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;
use std::time::Duration;

use crossbeam_utils::CachePadded;

/// The mark and the thread to unpark.
#[derive(Default)]
pub(crate) struct IdleGate {
    /// Set while the proxy is about to park or parked; read by every host post.
    asleep: CachePadded<AtomicBool>,
    proxy: OnceLock<Thread>,
    /// Unparks made (the tests read it: a post found the proxy asleep).
    wakes: AtomicU64,
    /// Polls of threads waiting on the network: written by them, read by the proxy only
    /// when it is about to sleep, so a busy proxy never reads the line.
    waits: CachePadded<AtomicU64>,
}

impl IdleGate {
    /// The proxy thread, from inside it, before its first sleep.
    pub fn register(&self) {
        let _ = self.proxy.set(std::thread::current());
    }

    /// The proxy: sleeps up to `d` unless `work_came` (asked after the mark is set) says
    /// a doorbell or command arrived since the proxy last looked; or until a producer
    /// wakes it.
    pub fn sleep(&self, d: Duration, work_came: impl FnOnce() -> bool) {
        self.asleep.store(true, Ordering::Relaxed);
        // SeqCst, pairs with wake's: the mark is visible before the doorbells are read
        // below (see the module's comment). Scope: host.
        fence(Ordering::SeqCst);
        if !work_came() {
            std::thread::park_timeout(d);
        }
        self.asleep.store(false, Ordering::Relaxed);
    }

    /// A host producer, after its doorbell or command is stored: unparks a sleeping proxy.
    pub fn wake(&self) {
        // SeqCst, pairs with sleep's: the doorbell is visible before the mark is read.
        // Scope: host.
        fence(Ordering::SeqCst);
        self.unpark_if_asleep();
    }

    /// A thread of this rank waiting on the network, at each poll: keeps the proxy from
    /// sleeping (see the module's comment), and unparks it if it sleeps.
    pub fn waiting(&self) {
        // A plain increment, not a read-modify-write: the proxy only asks whether the
        // count moved, which two racing waiters' stores still do; a locked add would stall
        // this poll on the line the proxy reads. Relaxed: nothing is published with it.
        let n = self.waits.load(Ordering::Relaxed);
        self.waits.store(n.wrapping_add(1), Ordering::Relaxed);
        // No fence: a park just after this poll's look is undone by the next poll's.
        self.unpark_if_asleep();
    }

    /// Unparks the proxy if its mark says it is about to park or parked.
    fn unpark_if_asleep(&self) {
        // Relaxed: the callers order the look (wake by its fence, waiting by polling again).
        if self.asleep.load(Ordering::Relaxed) {
            if let Some(t) = self.proxy.get() {
                self.wakes.fetch_add(1, Ordering::Relaxed);
                t.unpark();
            }
        }
    }

    /// The proxy, before it sleeps: whether a thread waited on the network since the last
    /// call (`seen` holds the count that call saw).
    pub fn waited_on(&self, seen: &mut u64) -> bool {
        // Relaxed: only whether the count moved matters; a stale value delays the answer
        // by one back-off step at most.
        let n = self.waits.load(Ordering::Relaxed);
        std::mem::replace(seen, n) != n
    }

    /// Unparks made so far.
    #[cfg(test)]
    pub fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Relaxed)
    }

    /// Whether the proxy is about to park or parked now.
    #[cfg(test)]
    pub fn asleep(&self) -> bool {
        self.asleep.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use super::IdleGate;

    /// Posts while the proxy parks (for up to 20 s) or is about to: each is seen at once,
    /// none waits out the sleep, and the gate unparked the sleeper for some of them.
    #[test]
    fn a_post_cuts_the_sleep_short_and_none_is_lost() {
        const ROUNDS: u64 = 300;
        let gate = Arc::new(IdleGate::default());
        let (doorbell, acked) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let sleeper = {
            let (gate, doorbell, acked) = (gate.clone(), doorbell.clone(), acked.clone());
            std::thread::spawn(move || {
                gate.register();
                let (mut seen, mut longest) = (0, Duration::ZERO);
                while seen < ROUNDS {
                    let start = Instant::now();
                    gate.sleep(Duration::from_secs(20), || doorbell.load(Ordering::Relaxed) != seen);
                    longest = longest.max(start.elapsed());
                    seen = doorbell.load(Ordering::Relaxed);
                    acked.store(seen, Ordering::Relaxed);
                }
                longest
            })
        };
        for i in 1..=ROUNDS {
            // Every other post comes once the sleeper has surely parked.
            if i % 2 == 0 {
                std::thread::sleep(Duration::from_micros(300));
            }
            doorbell.store(i, Ordering::Relaxed);
            gate.wake();
            let posted = Instant::now();
            while acked.load(Ordering::Relaxed) < i {
                assert!(posted.elapsed() < Duration::from_secs(5), "post {i} was lost: the sleeper did not see it");
                std::hint::spin_loop();
            }
        }
        let longest = sleeper.join().expect("the sleeper ends");
        assert!(longest < Duration::from_secs(5), "a post was lost: the sleeper slept {longest:?}");
        assert!(gate.wakes() > 0, "no post found the sleeper parked");
    }

    /// A waiter's polls move the count the proxy asks about before it sleeps (once per
    /// move), and a poll unparks a proxy parked for 20 s.
    #[test]
    fn a_waiter_is_seen_before_a_sleep_and_unparks_a_sleeping_proxy() {
        let gate = Arc::new(IdleGate::default());
        let mut seen = 0;
        assert!(!gate.waited_on(&mut seen), "nobody waited yet");
        gate.waiting();
        assert!(gate.waited_on(&mut seen), "a poll since the last look");
        assert!(!gate.waited_on(&mut seen), "no poll since the last look");
        assert_eq!(gate.wakes(), 0, "nothing slept, so nothing was unparked");

        let sleeper = {
            let gate = gate.clone();
            std::thread::spawn(move || {
                gate.register();
                let start = Instant::now();
                gate.sleep(Duration::from_secs(20), || false);
                start.elapsed()
            })
        };
        while !gate.asleep() {
            std::thread::yield_now();
        }
        // The waiter polls, as a wait loop does, until the sleeper is up again.
        while gate.asleep() {
            gate.waiting();
            std::thread::yield_now();
        }
        let slept = sleeper.join().expect("the sleeper ends");
        assert!(gate.wakes() > 0, "the waiter never found the sleeper parked");
        assert!(slept < Duration::from_secs(10), "the waiter did not cut the sleep short: {slept:?}");
    }
}
