//! SpTS: a distributed sparse lower-triangular solve `L x = b`, the second application of
//! seed 000 (GPU-initiated, "intra-kernel" communication with irregular dependencies).
//!
//! Every rank builds the same matrix ([`matrix`]: synthetic from a seed, or a MatrixMarket
//! file's pattern) and owns a set of rows ([`plan::Dist`]: contiguous or block-cyclic).
//! Two modes ([`app::Mode`]):
//! - `gio` ([`gio`]): one persistent kernel per rank solves its rows sync-free, a warp per
//!   row waiting on its dependencies' ready flags; a producer puts each solved value with
//!   its flag (put_signal) into every consuming rank's symmetric heap. On sim the same
//!   protocol runs on the host through the heap's host operations.
//! - `inter-k` ([`interk`]): level-set scheduling, a kernel per level, and after each
//!   level the host puts the newly solved values that other ranks consume (one put_signal
//!   per consumer and level) and waits for those it consumes.
//!
//! `--check` compares every rank's rows with the serial CPU reference bit for bit: the
//! kernels round each operation as the CPU does ([`matrix::row_value`]).
//!
//! Modules: [`matrix`] (the matrix, levels, reference), [`plan`] (distribution, what each
//! rank solves and exchanges), [`cuda`] (the kernels and the plan on the GPU), [`gio`],
//! [`interk`], [`app`] (options, timing, check, report).

pub mod app;
pub mod cuda;
pub mod gio;
pub mod interk;
pub mod matrix;
pub mod plan;

use std::time::Duration;

use gpulmt::sym::Cmp;
use gpulmt::Context;

/// What can go wrong in an SpTS run (the application benchmarks' error).
pub type SptsError = crate::program::AppError;

pub type Result<T> = std::result::Result<T, SptsError>;

/// How long a host wait for another rank's signal may take before the run fails.
const HOST_WAIT: Duration = Duration::from_secs(60);

/// One solve of the system on this rank, numbered `epoch` (from 1: flags and signals of
/// earlier solves are smaller, so nothing is reset between solves).
pub trait Solver {
    /// Solves (on CUDA: returns once the solve is complete on this rank).
    fn solve(&mut self, ctx: &mut Context, epoch: u64) -> Result<()>;
    /// Where it computes, for the report.
    fn describe(&self) -> String;
    fn release(self: Box<Self>, ctx: &mut Context) -> Result<()>;
}

/// Waits on the host until this rank's signal word at `addr` is at least `value`.
fn wait_signal(ctx: &Context, addr: usize, value: u64, what: &str) -> Result<()> {
    match ctx.sym_signal_wait_until(addr, Cmp::Ge, value, Some(HOST_WAIT))? {
        Some(_) => Ok(()),
        None => Err(SptsError::Protocol(format!("no signal {value} for {what} after {HOST_WAIT:?}"))),
    }
}
