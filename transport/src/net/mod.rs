//! The internode path (`docs/internode.md`): GIO send queues in pinned host memory mapped
//! into the devices, and this process's proxy thread, which turns their packets into
//! network operations over MPI and reports completions back through the queues.
//!
//! | piece | file |
//! |-------|------|
//! | the memory of one queue (ring, doorbell, credit, CQ, control slab) | [`queue`] |
//! | a host producer handle: post, completions, put/get, fence, quiet | [`producer`] |
//! | the network as a small table (UCX style), over MPI or a loopback | [`iface`] |
//! | what proxies say to each other (tags, envelopes, one-sided requests) | [`wire`] |
//! | one transfer's pieces and the staging pipeline | [`stream`] |
//! | the proxy thread | `proxy` |
//! | the context's path ([`OffNodePath`](crate::offnode::OffNodePath)) and windows | [`NetPath`] |
//! | starting it over MPI (feature `mpi`) | `start` (`net::mpi`) |
//!
//! The queue format and its state machines (producer, consumer, completions, fence,
//! quiet) are the protocols crate's sans-IO `gio` module; this module does the memory
//! accesses, the threads and the network.
//!
//! # How a context uses it
//! ```ignore
//! // every rank of `comm` calls this (collective: it dups `comm` and checks settings)
//! let path = gpulmt::net::start(&comm, &off_node_ranks, &cfg.net, backend.clone())?;
//! let path: Box<dyn OffNodePath> = Box::new(path);
//! // ... post_ctrl / post_send / post_recv, poll_inbound / poll_done / poll_failed ...
//! path.shutdown(Instant::now() + cfg.net.drain)?; // before MPI_Finalize
//! ```
//!
//! # Decisions beyond `docs/internode.md`
//! - **The queue set is sized at start** (`GPULMT_NET_QUEUES`) and never grows: a
//!   producer claims a free queue and gives it back; device producers (issue 28) claim
//!   theirs the same way. The context's thread holds two: one for pushed sends, whose
//!   ops wait for the peer's application (`path`, which says why). The proxy's list of queues needs no lock, and every queue's
//!   memory exists before a kernel could see it.
//! - **Control bytes are copied out** of the slot's control slab when the proxy takes the
//!   packet (at most 16 KiB), so a slot's credit frees its slab entry too, and the bytes
//!   MPI sends live in the proxy's memory until MPI is done with them.
//! - **Control messages carry a per-destination sequence number**: MPI matches one
//!   sender's messages to the receive pool in order, but they may complete out of order;
//!   the receiver reorders them before the engine sees them.
//! - **A transfer's tag is chosen by the proxy**: a SEND/RECV packet's tag word is the
//!   sender's message id (`xfer`), mapped into the rendezvous half of the data tags; a
//!   one-sided transfer's tag comes from its initiator's counter (the upper half).
//! - **Pieces are `GPULMT_NET_CHUNK` bytes for every memory kind**, so both sides cut a
//!   transfer the same way whatever memory either side has; `start` checks that every
//!   rank has the same value.
//! - **An op is accepted** once the network took its first message or its first staging
//!   copy started; before that its packet stays in the ring (backpressure).
//! - **Ops the network never lets go** (a send MPI cannot cancel, at shutdown) are never
//!   reported done: their buffers stay in use, and `shutdown` says how many.
//! - **GIO atomics** are applied by the target's proxy, one at a time on its thread
//!   (`proxy/target.rs` says how they are atomic, and where not: CUDA device memory
//!   against the GPU's own atomics); the old value comes back in the reply and goes to
//!   the packet's result address before the op completes.
//! - **The symmetric heap** (`crate::sym`) is a window of the path: its host calls to
//!   off-node PEs take one claimed queue, device code every queue left over.

mod idle;
pub mod iface;
#[cfg(feature = "mpi")]
mod mpi;
mod path;
pub mod producer;
pub mod profile;
mod proxy;
pub mod queue;
mod shared;
pub mod stream;
pub mod wire;

#[cfg(feature = "mpi")]
pub use mpi::{register_window, start, start_raw};
pub use path::NetPath;
pub use producer::{HostQueue, QuietError, Targets, WindowId};
pub(crate) use proxy::ops_in_flight;
pub use shared::LocalWindow;

#[cfg(test)]
mod tests;
