//! Staging: device buffers of an MPI call the library cannot take as they are, copied
//! through host memory around the `PMPI_*` call, in memory bounded by
//! `GPULMT_MPI_STAGING_MAX`.
//!
//! The pieces, each usable alone by any intercepted call (collectives today; persistent
//! requests, `MPI_Bsend`, `MPI_Sendrecv_replace`, RMA windows can reuse them):
//! - [`region`]: which bytes of a buffer a call touches ([`Region`], from a count and a
//!   datatype, per-rank blocks, or per-rank datatypes) and whether it reads or writes
//!   them ([`Role`]);
//! - [`pool`]: the host memory, pinned through the device backend, bounded by the cap;
//! - [`staged`]: one call's device regions in one block: copy in, the host pointers to
//!   give the call, copy back ([`Staged`]); blocking or asynchronous copies ([`Copier`]);
//! - [`pieces`]: a call split into pieces, two staged at a time, the copies of one
//!   overlapping the call on the other.
//!
//! A blocking call: `Staged::new(regions)`, `copy_in`, the `PMPI_*` call with
//! `pointer(i, given)` for each buffer argument, `copy_out`, drop. A non-blocking one
//! keeps the `Staged` with its request until the request completes, then copies out
//! (the shim's operation table does that: `Shim::track_staged` in `state/staging.rs`).
//!
//! The cap and the size of the pieces are agreed by every rank at `MPI_Init` (the
//! smallest setting wins), because splitting a collective changes how many MPI calls
//! it is, and every rank must make the same calls ([`set_limits`]).

pub mod pieces;
pub mod pool;
pub mod region;
pub mod staged;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub use region::{Region, Role, Shape};
pub use staged::{Copier, Staged, StagingError};

/// Bytes per buffer of one piece of a split collective: a quarter of the cap (two
/// pieces in flight, each with a send and a receive buffer). 0 until set: no split.
static PIECE: AtomicUsize = AtomicUsize::new(0);

/// Sets the cap agreed by every rank (see the module's doc): the pool's, and the pieces'.
pub fn set_limits(cap: usize) {
    pool::set_cap(cap);
    PIECE.store(cap / 4, Ordering::Relaxed);
}

/// Bytes above which a splittable collective is split, on every rank, into pieces of at
/// most this many bytes; `None` when collectives are not split (shim disabled).
pub fn piece_bytes() -> Option<usize> {
    // Relaxed: set once at MPI_Init, before any collective of the program.
    let p = PIECE.load(Ordering::Relaxed);
    (p > 0).then_some(p)
}

/// What staging did so far in this process (`gpulmt_mpi_get_staging_counters`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types)]
pub struct gpulmt_mpi_staging_counters {
    /// MPI calls that staged device buffers (a split call counts once).
    pub staged_calls: u64,
    /// Device buffers those calls staged (arguments: a send and a receive buffer are two).
    pub staged_buffers: u64,
    /// Bytes copied between device and host memory for them, both ways.
    pub staged_bytes: u64,
    /// Calls split into pieces (host buffers too: every rank splits alike).
    pub split_calls: u64,
    /// Pieces those calls made.
    pub pieces: u64,
}

static STAGED_CALLS: AtomicU64 = AtomicU64::new(0);
static STAGED_BUFFERS: AtomicU64 = AtomicU64::new(0);
static STAGED_BYTES: AtomicU64 = AtomicU64::new(0);
static SPLIT_CALLS: AtomicU64 = AtomicU64::new(0);
static PIECES: AtomicU64 = AtomicU64::new(0);

/// Counts a call that staged `buffers` device buffers (`bytes` copied so far).
pub fn count_staged(buffers: usize, bytes: usize) {
    // Relaxed: counters, read for reporting only.
    STAGED_CALLS.fetch_add(1, Ordering::Relaxed);
    STAGED_BUFFERS.fetch_add(buffers as u64, Ordering::Relaxed);
    STAGED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Counts bytes copied by a call already counted.
pub fn count_bytes(bytes: usize) {
    STAGED_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Counts a call split into `pieces`.
pub fn count_split(pieces: usize) {
    SPLIT_CALLS.fetch_add(1, Ordering::Relaxed);
    PIECES.fetch_add(pieces as u64, Ordering::Relaxed);
}

/// The counters so far.
pub fn counters() -> gpulmt_mpi_staging_counters {
    gpulmt_mpi_staging_counters {
        staged_calls: STAGED_CALLS.load(Ordering::Relaxed),
        staged_buffers: STAGED_BUFFERS.load(Ordering::Relaxed),
        staged_bytes: STAGED_BYTES.load(Ordering::Relaxed),
        split_calls: SPLIT_CALLS.load(Ordering::Relaxed),
        pieces: PIECES.load(Ordering::Relaxed),
    }
}

/// `GPULMT_MPI_STAGING_MAX` from the environment (default [`pool::DEFAULT_CAP`]).
pub fn cap_from_env() -> Result<usize, String> {
    match std::env::var("GPULMT_MPI_STAGING_MAX") {
        Ok(v) if !v.trim().is_empty() => match gpulmt::config::parse_size(v.trim()) {
            Some(n) if n >= 4096 => Ok(n as usize),
            _ => Err(format!("GPULMT_MPI_STAGING_MAX={v:?} is not a size of at least 4K (like 64M, 1G)")),
        },
        _ => Ok(pool::DEFAULT_CAP),
    }
}
