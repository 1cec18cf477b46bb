//! The per-owner lock that makes accumulates atomic per element: Lamport's bakery lock
//! over words in the owner's part of the array's symmetric allocation.
//!
//! Why a lock, and why the bakery: an accumulate is a read, an update and a write of a
//! strided block, so it must exclude other accumulates of the same elements. Per-element
//! compare-swap would fit 64-bit words only (f32 and i32 are 4 bytes) and costs a round
//! trip per element; a lock per owner costs a few word operations per owner and lets
//! the block move as one strided get and put. The heap's compare-swap would make the
//! simplest lock, but the host cannot make one on CUDA device memory (the heap refuses
//! it there, `transport/src/sym/host.rs`), while atomic set and fetch work on every
//! backend. The bakery lock needs only those: each rank writes only its own words and
//! reads the others', so it is correct with plain atomic loads and stores provided each
//! rank's store is visible before its following load, which the SeqCst fence after every
//! store (`mfence` on the host; on CUDA every heap word operation is a completed copy;
//! to an owner on another node, an AMO its proxy applied and acknowledged) gives.
//!
//! Words on the owner, `n` ranks: `choosing[n]` then `number[n]`, 8 bytes each, at the
//! start of the array's allocation. One lock per owner and array: an accumulate takes the
//! locks of its owners one at a time (never two at once: no deadlock).

use std::sync::atomic::{fence, Ordering};

use gpulmt::{Context, Rank};

use crate::error::Result;

/// Bytes of the lock words of a job of `ranks` ranks.
pub fn lock_bytes(ranks: u32) -> usize {
    16 * ranks as usize
}

/// One owner's lock of one array: its words at the symmetric address `base`.
pub(crate) struct OwnerLock {
    /// Symmetric address of the lock words.
    pub(crate) base: usize,
    /// The owner.
    pub(crate) owner: Rank,
}

impl OwnerLock {
    fn choosing(&self, r: Rank) -> usize {
        self.base + 8 * r as usize
    }

    fn number(&self, ctx: &Context, r: Rank) -> usize {
        self.base + 8 * (ctx.size() + r) as usize
    }

    fn set(&self, ctx: &Context, addr: usize, v: u64) -> Result<()> {
        ctx.sym_atomic_set(addr, v, self.owner)?;
        // The bakery's one demand on the memory: this store is visible before the loads
        // that follow it.
        fence(Ordering::SeqCst);
        Ok(())
    }

    fn get(&self, ctx: &Context, addr: usize) -> Result<u64> {
        Ok(ctx.sym_atomic_fetch(addr, self.owner)?)
    }

    /// Takes the lock (waits for the ranks ahead in the bakery's order).
    pub(crate) fn acquire(&self, ctx: &Context) -> Result<()> {
        let me = ctx.rank();
        self.set(ctx, self.choosing(me), 1)?;
        let mut max = 0;
        for r in 0..ctx.size() {
            max = max.max(self.get(ctx, self.number(ctx, r))?);
        }
        let mine = max + 1;
        self.set(ctx, self.number(ctx, me), mine)?;
        self.set(ctx, self.choosing(me), 0)?;
        for r in (0..ctx.size()).filter(|&r| r != me) {
            let mut polls = 0u32;
            while self.get(ctx, self.choosing(r))? != 0 {
                backoff(&mut polls);
            }
            loop {
                let theirs = self.get(ctx, self.number(ctx, r))?;
                if theirs == 0 || (theirs, r) > (mine, me) {
                    break;
                }
                backoff(&mut polls);
            }
        }
        Ok(())
    }

    /// Gives the lock back.
    pub(crate) fn release(&self, ctx: &Context) -> Result<()> {
        self.set(ctx, self.number(ctx, ctx.rank()), 0)
    }
}

/// Spins a little, then yields: the holder may share this rank's cores.
fn backoff(polls: &mut u32) {
    *polls += 1;
    if *polls < 100 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}
