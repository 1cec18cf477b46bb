//! Stencil2D over gpulmt: SHOC's 9-point stencil with halo exchange, the application
//! benchmark of the seed paper ("DMA-assisted intranode communication in MPICH2").
//!
//! Each rank owns a block of a 2D grid of points (a `px x py` process grid, as square
//! as the rank count allows) on the device it is bound to. Every `h` steps (`--halo`)
//! the ranks exchange `h` ghost layers with their neighbours: whole rows north and
//! south first (contiguous), then columns west and east, packed into contiguous
//! buffers and spanning the ghost rows just received so that corners travel on to the
//! diagonal neighbours without messages of their own. The global boundary is fixed
//! (non-periodic).
//!
//! How the halos travel is the `--mode`:
//! - `staged`: device -> host copies, gpulmt messages between host buffers, host ->
//!   device copies (the seed's shared-memory baseline);
//! - `inter-k`: after the kernel, messages straight between device buffers, which
//!   gpulmt moves with the GPUs' copy engines;
//! - `inter-k-overlap`: as `inter-k`, but the interior of the first step after an
//!   exchange is computed while the halos move, the boundary strips after;
//! - `gio`: the fields in the symmetric heap, one persistent kernel that puts its halos
//!   into the neighbours' ghost cells with put_signal and waits for theirs, no kernel
//!   boundary per step ([`gio`]; on sim the same protocol on the host).
//!
//! `--check` compares the gathered result with the same problem computed by one CPU
//! rank ([`kernel::reference`]): bit for bit.
//!
//! Modules, bottom up: [`grid`] (decomposition and regions), [`kernel`] (arithmetic,
//! initial values, reference), [`compute`] (where the arithmetic runs: CUDA kernels
//! or the CPU on sim device memory), [`exchange`] (the halo exchange), [`gio`] (the
//! intra-kernel mode), [`check`] (`--check`), [`app`]
//! (options, the time loop, the report).

pub mod app;
pub mod check;
pub mod compute;
pub mod exchange;
pub mod gio;
pub mod grid;
pub mod kernel;

pub use app::{Mode, Precision, StencilOptions};

/// What can go wrong in a Stencil2D run (the application benchmarks' error).
pub type StencilError = crate::program::AppError;

pub type Result<T> = std::result::Result<T, StencilError>;
