//! 64-bit atomics on one word of device memory, made by the host's request: the proxy's
//! AMOs and signal adds for other nodes' PEs, and the host's `sym_atomic_*` on CUDA.
//!
//! The host has no atomic instruction on device memory (PCIe atomics are not exposed to
//! it): a read and a write by the copy engine can fall around a kernel's `atomicAdd` on
//! the same word and lose it (issue 28: 21 of 24576 adds lost across pseudo-nodes). So a
//! backend makes the atomic on the device itself: CUDA asks its resident copy server
//! (`cuda/copy_server.rs`), one of whose threads applies it with a system-scope atomic
//! instruction, atomic against every kernel's atomics on the word and against peers'
//! over NVLink. The sim's device memory is host memory, so there it is one atomic
//! instruction of the host ([`WordAtomic::apply`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{DevId, DeviceBackend, DeviceError};

/// An atomic update of one 64-bit word; each returns the word's old value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordAtomic {
    /// Adds (wrapping).
    FetchAdd(u64),
    /// Stores `desired` if the word holds `expected`.
    CompareSwap { expected: u64, desired: u64 },
    /// Stores the value.
    Swap(u64),
    /// Reads, writing nothing.
    Fetch,
}

impl WordAtomic {
    /// Applies the update to `word` with one atomic instruction of the host. AcqRel: the
    /// update is ordered after what this thread saw before it (the data of an initiator's
    /// earlier, fenced operations) and before what a reader that sees its value reads.
    pub fn apply(self, word: &AtomicU64) -> u64 {
        match self {
            WordAtomic::FetchAdd(v) => word.fetch_add(v, Ordering::AcqRel),
            WordAtomic::CompareSwap { expected, desired } => {
                word.compare_exchange(expected, desired, Ordering::AcqRel, Ordering::Acquire).unwrap_or_else(|v| v)
            }
            WordAtomic::Swap(v) => word.swap(v, Ordering::AcqRel),
            WordAtomic::Fetch => word.load(Ordering::Acquire),
        }
    }
}

/// A word atomic in flight: poll it with [`DeviceBackend::word_atomic_poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicTicket(pub(crate) AtomicState);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicState {
    /// Made when it was started (the sim); the old value.
    Done(u64),
    /// Posted to `dev`'s copy server as descriptor `seq` (CUDA).
    Served { dev: DevId, seq: u64 },
}

/// How long [`wait_word_atomic`] waits for a device to take or finish an atomic.
pub const WORD_ATOMIC_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes `op` on the word at `addr` of device memory through `dev` and waits for its old
/// value, at most [`WORD_ATOMIC_TIMEOUT`]: a device whose every block slot is held by
/// resident kernels never starts the copy server that makes it, and the caller gets an
/// error saying so instead of a hang.
///
/// # Safety
/// As [`DeviceBackend::word_atomic_start`]'s, for the whole call.
pub unsafe fn wait_word_atomic(
    backend: &dyn DeviceBackend,
    dev: DevId,
    addr: usize,
    op: WordAtomic,
) -> Result<u64, DeviceError> {
    let deadline = Instant::now() + WORD_ATOMIC_TIMEOUT;
    let timed_out = |stage: &str| DeviceError::Unavailable {
        reason: format!(
            "a 64-bit atomic on device {dev}'s word {addr:#x} was not {stage} within {WORD_ATOMIC_TIMEOUT:?}: the \
             device makes it with a one-block kernel, which cannot start while resident kernels hold every block \
             slot of the GPU; leave room for one block of 512 threads"
        ),
    };
    let ticket = loop {
        // SAFETY: this function's contract is word_atomic_start's, for the whole call.
        if let Some(t) = unsafe { backend.word_atomic_start(dev, addr, op)? } {
            break t;
        }
        if Instant::now() >= deadline {
            return Err(timed_out("taken"));
        }
        std::thread::yield_now();
    };
    loop {
        if let Some(old) = backend.word_atomic_poll(ticket)? {
            return Ok(old);
        }
        if Instant::now() >= deadline {
            return Err(timed_out("made"));
        }
        std::hint::spin_loop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_returns_the_old_value_and_leaves_the_new_one() {
        // (word before, update, word after)
        for (start, op, after) in [
            (5, WordAtomic::FetchAdd(3), 8),
            (u64::MAX, WordAtomic::FetchAdd(2), 1),
            (7, WordAtomic::CompareSwap { expected: 7, desired: 9 }, 9),
            (8, WordAtomic::CompareSwap { expected: 7, desired: 9 }, 8),
            (1, WordAtomic::Swap(4), 4),
            (6, WordAtomic::Fetch, 6),
        ] {
            let word = AtomicU64::new(start);
            assert_eq!(op.apply(&word), start, "{op:?} returns the old value");
            assert_eq!(word.load(Ordering::Relaxed), after, "{op:?} from {start}");
        }
    }
}
