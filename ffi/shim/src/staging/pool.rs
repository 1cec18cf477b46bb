//! The host memory that staging uses: page-aligned blocks, pinned through the device
//! backend (so that device engines DMA them, and asynchronous copies overlap), handed
//! out and taken back by a pool of the process whose total (blocks in use and blocks
//! kept for reuse) never exceeds its cap, `GPULMT_MPI_STAGING_MAX`.
//!
//! Blocks are kept after use: mapping, pinning and faulting in fresh memory for every
//! call would cost more than the copies of a small collective. A request that does not
//! fit under the cap first lets kept blocks go; if the blocks in use leave too little,
//! it is refused ([`Exceeded`]), never waited for: a rank waiting here could hold up
//! the peers whose progress would free the memory.

use std::sync::{Mutex, MutexGuard, PoisonError};

use gpulmt::device::Backend;

/// `GPULMT_MPI_STAGING_MAX` when unset.
pub const DEFAULT_CAP: usize = 256 << 20;

/// Requests are rounded up to this (the page), and blocks are aligned to it.
const PAGE: usize = 4096;

/// A request may take a kept block up to this many times its size (plus a page), so a
/// small call does not pin a large block that a large one needs.
const REUSE_SLACK: usize = 2;

/// The staging memory would exceed the cap.
#[derive(Debug, Clone, Copy)]
pub struct Exceeded {
    /// Bytes asked for.
    pub need: usize,
    /// The cap (`GPULMT_MPI_STAGING_MAX`).
    pub cap: usize,
    /// Bytes in use by other staged operations (non-blocking ones not yet completed).
    pub in_use: usize,
}

/// One mapping of host memory.
struct Block {
    ptr: usize,
    len: usize,
    /// Registered (pinned) with the backend that was attached when it was made.
    pinned: bool,
}

struct Pool {
    cap: usize,
    /// Bytes of every block, in use or kept.
    held: usize,
    kept: Vec<Block>,
    /// The backend blocks are pinned with (set while the shim is active).
    backend: Option<Backend>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { cap: DEFAULT_CAP, held: 0, kept: Vec::new(), backend: None });

fn pool() -> MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Sets the cap (kept blocks are let go).
pub fn set_cap(cap: usize) {
    let mut p = pool();
    p.cap = cap;
    p.drain();
}

/// Pins new blocks with `backend` from now on (kept blocks made before are let go).
pub fn attach(backend: Backend) {
    let mut p = pool();
    p.drain();
    p.backend = Some(backend);
}

/// Lets every kept block go and forgets the backend (before the backend goes: at
/// `MPI_Finalize`). Blocks still in use are unmapped when returned, not unpinned.
pub fn shut_down() {
    let mut p = pool();
    p.drain();
    p.backend = None;
}

/// The cap in force.
pub fn cap() -> usize {
    pool().cap
}

impl Pool {
    fn drain(&mut self) {
        for b in std::mem::take(&mut self.kept) {
            self.held -= b.len;
            self.unmap(b);
        }
    }

    fn unmap(&self, b: Block) {
        if b.pinned {
            if let Some(backend) = &self.backend {
                // SAFETY: a block `take` registered; it is no longer handed out, so no copy
                // runs on it.
                if let Err(e) = unsafe { backend.unregister_host(b.ptr) } {
                    tracing::warn!(error = %e, "unpinning a staging block");
                }
            }
        }
        // SAFETY: a mapping of `len` bytes made by `take`, no longer handed out.
        unsafe { libc::munmap(b.ptr as *mut libc::c_void, b.len) };
    }
}

/// Host memory from the pool, at least as long as asked; back to the pool when dropped.
pub struct HostBlock {
    block: Option<Block>,
}

// SAFETY: plain memory owned by this value; the pool's lock orders hand-overs.
unsafe impl Send for HostBlock {}

impl HostBlock {
    /// Start of the block (page-aligned).
    pub fn ptr(&self) -> *mut u8 {
        self.block.as_ref().map_or(std::ptr::null_mut(), |b| b.ptr as *mut u8)
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            let mut p = pool();
            // Kept unless pinned with a backend that has gone since (then it goes too).
            if !b.pinned || p.backend.is_some() {
                p.kept.push(b);
            } else {
                p.held -= b.len;
                p.unmap(b);
            }
        }
    }
}

/// Host memory for one message staged whole (a device buffer's point-to-point message
/// to or from the MPI library): a pool block when the cap leaves room, so that the copy
/// between it and the device is a DMA of pinned memory and the memory is not mapped and
/// faulted in again for every message; heap memory past the cap, where the copy is the
/// driver's pageable one (several times slower: 0.6 GB/s for osu_bw's window of 64 MiB
/// messages across pseudo-nodes, `lab/gpu/shim_offnode.sh`).
pub enum MessageBuf {
    Pool { block: HostBlock, len: usize },
    Heap(Vec<u8>),
}

impl MessageBuf {
    /// `len` bytes of host memory (their content is unspecified: the caller writes them
    /// before reading).
    pub fn new(len: usize) -> MessageBuf {
        // Half the cap at most, so that messages in flight never starve a collective.
        match (len > 0).then(|| take_within(len, 2)) {
            Some(Ok(block)) => MessageBuf::Pool { block, len },
            _ => MessageBuf::Heap(vec![0u8; len]),
        }
    }

    /// Start of the memory, for the MPI library or a copy to write.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        match self {
            MessageBuf::Pool { block, .. } => block.ptr(),
            MessageBuf::Heap(v) => v.as_mut_ptr(),
        }
    }
}

impl std::ops::Deref for MessageBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: the block is a mapping of at least `len` bytes that this value owns;
            // mapped anonymous memory is initialised (zeroes, or an earlier use's bytes).
            MessageBuf::Pool { block, len } => unsafe { std::slice::from_raw_parts(block.ptr(), *len) },
            MessageBuf::Heap(v) => v,
        }
    }
}

/// A block of at least `len` bytes (`len` > 0), or [`Exceeded`] when the blocks in use
/// leave less than that under the cap (or the system has no memory to map).
pub fn take(len: usize) -> Result<HostBlock, Exceeded> {
    take_within(len, 1)
}

/// As [`take`], within `1/share` of the cap: point-to-point messages leave the rest to
/// the collectives, which fail with `MPI_ERR_NO_MEM` where the pool refuses them.
fn take_within(len: usize, share: usize) -> Result<HostBlock, Exceeded> {
    let need = len.max(1).div_ceil(PAGE) * PAGE;
    let mut p = pool();
    let cap = p.cap / share;
    let fits = |b: &Block| b.len >= need && b.len <= need * REUSE_SLACK + PAGE;
    if let Some(i) = p.kept.iter().enumerate().filter(|(_, b)| fits(b)).min_by_key(|(_, b)| b.len).map(|(i, _)| i) {
        let b = p.kept.swap_remove(i);
        return Ok(HostBlock { block: Some(b) });
    }
    // Room under the cap: let kept blocks go, largest first, until it fits.
    while p.held + need > cap {
        let Some(i) = p.kept.iter().enumerate().max_by_key(|(_, b)| b.len).map(|(i, _)| i) else { break };
        let b = p.kept.swap_remove(i);
        p.held -= b.len;
        p.unmap(b);
    }
    let in_use = p.held - p.kept.iter().map(|b| b.len).sum::<usize>();
    let refused = Exceeded { need: len, cap, in_use };
    if p.held + need > cap {
        return Err(refused);
    }
    // SAFETY: an anonymous private mapping at an address of the kernel's choice.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            need,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        tracing::error!(bytes = need, "mapping host memory for staging failed");
        return Err(refused);
    }
    let ptr = ptr as usize;
    let pinned = match &p.backend {
        // SAFETY: `ptr` is our fresh anonymous mapping of `need` bytes.
        Some(backend) => match unsafe { backend.register_host(ptr, need) } {
            Ok(()) => true,
            Err(e) => {
                // Pageable memory still works: copies are then synchronous in effect.
                tracing::debug!(error = %e, "pinning a staging block failed; using it unpinned");
                false
            }
        },
        None => false,
    };
    p.held += need;
    Ok(HostBlock { block: Some(Block { ptr, len: need, pinned }) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test for the whole pool: it is one static of the process.
    #[test]
    fn blocks_are_reused_and_the_cap_holds() {
        set_cap(64 << 10);
        let a = take(10_000).expect("fits");
        let a_ptr = a.ptr();
        assert_eq!(a_ptr as usize % PAGE, 0);
        // SAFETY: the block has at least 10 000 bytes.
        unsafe { std::ptr::write_bytes(a_ptr, 7, 10_000) };
        drop(a);
        let b = take(9_000).expect("a kept block");
        assert_eq!(b.ptr(), a_ptr, "the kept block is reused");
        let c = take(40 << 10).expect("still under the cap");
        let refused = take(20 << 10).err().expect("over the cap while b and c are in use");
        assert_eq!((refused.need, refused.cap), (20 << 10, 64 << 10));
        assert_eq!(refused.in_use, (12 << 10) + (40 << 10));
        drop(c);
        // c's block is kept, but let go for a request it is too small for.
        let d = take(48 << 10).expect("kept blocks make room");
        drop((b, d));
        // A message takes pool memory up to half the cap, then heap memory.
        set_cap(64 << 10);
        let mut m = MessageBuf::new(30 << 10);
        assert!(matches!(m, MessageBuf::Pool { .. }));
        assert_eq!(m.len(), 30 << 10);
        // SAFETY: the message's 30 KiB.
        unsafe { std::ptr::write_bytes(m.as_mut_ptr(), 9, 30 << 10) };
        assert!(m.iter().all(|&b| b == 9));
        let n = MessageBuf::new(8 << 10);
        assert!(matches!(n, MessageBuf::Heap(ref v) if v.len() == 8 << 10), "past half the cap");
        let full = take(32 << 10).expect("the collectives keep the other half");
        drop((m, n, full));
        shut_down();
    }
}
