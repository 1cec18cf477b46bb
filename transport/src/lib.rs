//! gpulmt: GPU-aware intranode message transport.
//!
//! Moves MPI-style point-to-point messages between processes of one node, choosing
//! per message among eager, GET, PUT, COOPERATE and pipelined shared-memory (SHM)
//! protocols so that the copy engines of the GPUs move the bytes directly over
//! NVLink/PCIe peer mappings when they can.
//!
//! Layers (bottom up):
//! - [`device`]: the device backends (CUDA through cudarc, or `sim`).
//! - [`shm`]: the job's shared-memory segment: control rings and staging chunks.
//! - `gpulmt-protocols`: the sans-IO protocol engine (in its own crate).
//! - [`context`]: the progress engine and public API that ties them together.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod anatomy;
mod barrier;
pub mod binding;
pub mod config;
pub mod context;
pub mod device;
mod eager_bounce;
pub mod error;
mod free;
pub mod logging;
pub mod mapping;
mod memory_kinds;
pub mod memtype;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod net;
pub mod offnode;
pub mod plugin;
pub mod progress;
mod requests;
mod routing;
pub mod shm;
pub mod sym;
pub mod topology;

pub use context::{Context, JobInfo, Request};
pub use error::{Error, Result};
pub use gpulmt_protocols::{policy::Protocol, ProtoError, Rank, Status, Tag};
pub use sym::SymPtr;
pub use topology::Topology;
