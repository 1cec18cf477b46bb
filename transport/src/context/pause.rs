//! The pause between two polls of a blocking wait (`Context::wait`, `wait_all`): a spin
//! hint for the first polls, then a yield of the CPU at each.
//!
//! Why yield at all: a waiting thread that only spins keeps its CPU from the threads that
//! would end the wait where there are more runnable threads than cores: the proxy thread
//! of the internode path, the sim backend's copy threads, the peer rank itself. On a
//! 2-core host two ranks across pseudo-nodes, each spinning in its wait, left their proxies
//! a time slice now and then, and an 8 B message took 6 ms; 100-184 us with this pause
//! (git history: bench/results/sim/wait_pause1 at c15a975). Why spin first: a message of
//! a ping-pong arrives within microseconds, and a yield (a system call) in that time would
//! only delay seeing it; past [`SPIN_POLLS`] polls (some 100-300 us of polling) the wait is
//! long anyway. Why only every [`YIELD_EVERY`]th poll: a yield on a core nobody else wants
//! returns at once but still costs a system call, and yielding at every poll looked slower
//! for 128 KiB-4 MiB host messages on one H200 in one of two rounds, where yielding at
//! every 16th did not (git history: bench/results/h200x1/wait_pause1 at c15a975).

/// Polls a wait spins through before it starts yielding.
pub(crate) const SPIN_POLLS: u64 = 1024;
/// Past them, the polls between two yields.
pub(crate) const YIELD_EVERY: u64 = 16;

/// One wait's count of polls that found nothing.
#[derive(Default)]
pub(crate) struct WaitPause {
    /// 64 bits: a count that wrapped would start a long wait's spin phase again.
    polls: u64,
}

/// What a pause did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Paused {
    Spun,
    Yielded,
}

impl WaitPause {
    /// After a poll that found the wait not over.
    pub fn pause(&mut self) -> Paused {
        self.polls += 1;
        if self.polls > SPIN_POLLS && self.polls.is_multiple_of(YIELD_EVERY) {
            std::thread::yield_now();
            Paused::Yielded
        } else {
            std::hint::spin_loop();
            Paused::Spun
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait spins through its first polls, then yields at every YIELD_EVERY-th.
    #[test]
    fn spins_first_then_yields_now_and_then() {
        let mut p = WaitPause::default();
        for i in 1..=SPIN_POLLS {
            assert_eq!(p.pause(), Paused::Spun, "poll {i} of the spin phase");
        }
        let yields: Vec<u64> =
            (SPIN_POLLS + 1..=SPIN_POLLS + 4 * YIELD_EVERY).filter(|_| p.pause() == Paused::Yielded).collect();
        assert_eq!(yields.len(), 4, "one yield per {YIELD_EVERY} polls after the spin phase: {yields:?}");
    }
}
