//! `libgpulmt_mpi.so`: a PMPI shim that makes an unmodified MPI program GPU-aware
//! between the ranks of a node, with gpulmt moving device buffers over CUDA IPC (or
//! the sim backend's shared memory):
//!
//! ```text
//! mpirun -np 2 -x LD_PRELOAD=/path/to/libgpulmt_mpi.so ./app
//! ```
//!
//! (Open MPI as root, as in containers, also wants `--allow-run-as-root`, and more ranks
//! than cores `--oversubscribe`; README.md has the details and a sim example.)
//!
//! The shim defines the MPI functions below; each calls the MPI library's `PMPI_*`
//! entry point for what it does not handle itself:
//!
//! - `MPI_Init`, `MPI_Init_thread`: after `PMPI_Init*`, every rank joins a gpulmt
//!   context of the job in plugin mode, its node's ranks
//!   (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`) reached through shared memory; gpulmt's
//!   control packets after the RTS take its own rings, and where the job spans nodes (and
//!   MPI gives `MPI_THREAD_MULTIPLE`, which the shim asks for there) its internode path.
//!   `MPI_Finalize` drains the shim's traffic and releases gpulmt first.
//! - Sends (`MPI_Send`, `MPI_Ssend`, `MPI_Isend`, `MPI_Issend`): host buffers go
//!   straight to the MPI library. A contiguous device buffer to a rank of the same
//!   node sends an *envelope* (see [`envelope`]) with gpulmt's RTS on the user's
//!   communicator and tag, so the MPI library's matching orders it among the user's
//!   messages; gpulmt then moves the payload. To a rank of another node the same,
//!   through gpulmt's GIO queues and proxy, above `GPULMT_NET_EAGER_LIMIT`; smaller
//!   device messages to other nodes (all with `GPULMT_MPI_OFFNODE=mpi`), and those
//!   below `GPULMT_MPI_LMT_MIN` bytes, are staged through host memory.
//! - Receives (`MPI_Recv`, `MPI_Irecv`, and `MPI_Sendrecv`): matched by the shim with
//!   `MPI_Iprobe`/`MPI_Improbe` in post order; an envelope starts gpulmt's receive into
//!   the user's buffer, other messages are received by `MPI_Imrecv` (into host
//!   staging for device buffers).
//! - Completion (`MPI_Wait`, `MPI_Waitall`, `MPI_Waitany`, `MPI_Waitsome`, `MPI_Test`,
//!   `MPI_Testall`, `MPI_Testany`, `MPI_Testsome`), `MPI_Probe`, `MPI_Iprobe` and
//!   `MPI_Barrier` (always a `PMPI_Ibarrier`, the same call on every rank) drive the
//!   shim's progress. The shim's non-blocking operations are
//!   generalized requests, so `MPI_Cancel` (of unmatched receives), `MPI_Request_free`
//!   and `MPI_Get_count` work on them unmodified, and every status carries the user's
//!   source, tag and byte count. Their errors go to their communicator's handler.
//!
//! - Collectives (`MPI_Bcast`, `MPI_Reduce`, `MPI_Allreduce`, the gathers, scatters,
//!   all-to-alls, reduce-scatters, scans, their non-blocking forms, `MPI_Reduce_local`):
//!   the MPI library runs them, on host copies of device buffers ([`staging`]), every
//!   rank making the same call whatever its buffers are. Large blocking reductions are
//!   split into element ranges on every rank; see [`intercept::coll`].
//!
//! Extra C functions (`include/gpulmt_mpi.h`): `gpulmt_mpi_alloc` / `gpulmt_mpi_free`
//! (device memory of the shim's gpulmt context: what makes the same program run on
//! sim devices and on CUDA), `gpulmt_mpi_memcpy`, `gpulmt_mpi_active`,
//! `gpulmt_mpi_get_counters`, `gpulmt_mpi_get_staging_counters`.
//!
//! Progress of device transfers happens inside the intercepted calls (as with most
//! MPI libraries' rendezvous). See README.md for what is not covered.
//!
//! Layout: [`intercept`] holds the MPI functions, one module per family of calls;
//! [`api`] the shim's own C functions; `state` the shim itself (its gpulmt context and
//! the operations it manages); [`envelope`] the message that carries gpulmt's RTS
//! through the MPI library; [`staging`] device buffers copied through bounded host
//! memory around a `PMPI_*` call; `mpierr` MPI error codes with the shim's own
//! messages; `hostmem`, `scratch` and `raw` the host fast path and the MPI helpers
//! underneath.

#![allow(non_snake_case)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod api;
pub mod device_reduce;
pub mod envelope;
mod hostmem;
pub mod intercept;
mod mpierr;
mod raw;
pub mod rma;
mod scratch;
pub mod staging;
mod state;

pub use state::gpulmt_mpi_counters;
