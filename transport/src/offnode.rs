//! The boundary between a [`Context`](crate::Context) and the path to ranks on other
//! nodes (`docs/internode.md`).
//!
//! The context keeps everything that decides: the protocol engine, MPI matching across
//! both paths, the requests. Per peer it routes the engine's actions: an on-node peer's
//! packets take the shared-memory rings, an off-node peer's take an [`OffNodePath`]. The
//! production path is the GIO queues and the proxy thread over MPI (`crate::net`); the
//! trait keeps the context ignorant of queues, MPI and threads, as UCX's `uct_iface_ops`
//! keeps a protocol ignorant of its transport.
//!
//! Calls come from the context's owning thread only. Every `post_*` either takes the
//! operation (it will be reported by [`OffNodePath::poll_done`], exactly once) or answers
//! [`PostError::NoResource`] (nothing was taken: the caller keeps it and retries after a
//! progress pass), never a silent drop.

use std::time::Instant;

use gpulmt_protocols::{NetId, Rank};

use crate::device::MemoryKind;

/// Why an operation failed on the off-node path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetError {
    /// The MPI library returned an error for the operation.
    #[error("MPI {call} failed: {message}")]
    Mpi { call: &'static str, message: String },
    /// A staging copy between device memory and the proxy's bounce buffers failed.
    #[error("staging copy failed: {0}")]
    Staging(String),
    /// The peer rank failed or left; its operations cannot complete.
    #[error("rank {rank} on another node failed or exited")]
    PeerFailed { rank: Rank },
    /// The operation was cancelled (the request failed first, or the context shut down).
    #[error("operation cancelled: {0}")]
    Cancelled(String),
    /// The proxy rejected the operation (bad packet, queue stalled, out of bounds...).
    #[error("rejected by the proxy: {0}")]
    Rejected(String),
    /// The off-node path is not running (not started, already shut down, or its proxy died).
    #[error("the internode path is not running: {0}")]
    Down(String),
}

/// Why a post was not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// No room right now (queue full, in-flight window full): retry after progress.
    #[error("no resource: retry after progress")]
    NoResource,
    /// The operation can never be taken.
    #[error(transparent)]
    Failed(#[from] NetError),
}

/// The off-node path as a context drives it.
pub trait OffNodePath: Send {
    /// Posts an encoded control packet (eager with its payload, RTS, CTS, ABORT) of `len`
    /// bytes for the off-node job rank `to`, which `encode` writes into the path's own
    /// memory (a queue slot's control entry), all `len` bytes of the slice it gets, before
    /// this returns: so an eager payload is written once on its way out. Not called when
    /// the post is refused. Packets to one rank arrive there in the order they were posted.
    fn post_ctrl_with(&mut self, to: Rank, len: usize, encode: &mut dyn FnMut(&mut [u8])) -> Result<(), PostError>;

    /// [`post_ctrl_with`](Self::post_ctrl_with) of a packet already encoded.
    fn post_ctrl(&mut self, to: Rank, packet: &[u8]) -> Result<(), PostError> {
        self.post_ctrl_with(to, packet.len(), &mut |out| out.copy_from_slice(packet))
    }

    /// Posts the sending side of rendezvous `xfer` (the sender's message id) to `to`:
    /// `len` bytes at `buf`, host or device memory as `mem` says; `pushed` when it goes
    /// before `to` has posted the receive (its end then waits for `to`'s application, so
    /// nothing else posted may wait behind it). Reported by
    /// [`poll_done`](Self::poll_done) under `id`.
    ///
    /// # Safety
    /// `buf..buf + len` is valid for reads, in memory of the kind `mem` names, and stays
    /// valid and unmodified until `id` is reported done.
    // Every field a SEND packet carries, each a plain value: a struct would only repack them.
    #[allow(clippy::too_many_arguments)]
    unsafe fn post_send(
        &mut self,
        id: NetId,
        to: Rank,
        xfer: u64,
        buf: usize,
        len: usize,
        mem: MemoryKind,
        pushed: bool,
    ) -> Result<(), PostError>;

    /// Posts the receiving side of rendezvous `xfer` from `from` into `len` bytes at `buf`.
    ///
    /// # Safety
    /// `buf..buf + len` is valid for writes, in memory of the kind `mem` names, and is
    /// neither used nor freed until `id` is reported done.
    unsafe fn post_recv(
        &mut self,
        id: NetId,
        from: Rank,
        xfer: u64,
        buf: usize,
        len: usize,
        mem: MemoryKind,
    ) -> Result<(), PostError>;

    /// Whether the path took data op `id` from its queue: the op's first network
    /// operation started (for a receive: its first MPI receive is posted), or it already
    /// ended. A CTS must not leave before its data receive was taken: the sender's data
    /// then always finds its receive posted, so a send answering a CTS ends without
    /// waiting for anything of the receiving rank but its network (`docs/internode.md`,
    /// "Why nothing waits in a circle"). True by default: a path that takes every op when
    /// it is posted.
    fn taken(&self, _id: NetId) -> bool {
        true
    }

    /// Posts a receive of rendezvous `xfer` from `from` that drops its `len` bytes: the
    /// data of a pushed message that no receive takes, which the sender's send waits to
    /// hand over.
    fn post_drain(&mut self, id: NetId, from: Rank, xfer: u64, len: usize) -> Result<(), PostError>;

    /// Asks for `id` to end soon; it is still reported done (with an error if it was cut
    /// short), and its buffer is in use until then.
    fn cancel(&mut self, id: NetId);

    /// Hands every control packet that arrived from off-node ranks to `deliver`, in
    /// arrival order (per sender, the order it posted them), each packet's bytes moved
    /// (not copied) to the caller; returns how many.
    fn poll_inbound(&mut self, deliver: &mut dyn FnMut(Rank, Vec<u8>)) -> usize;

    /// A thread of this rank waits on what this path delivers (a `test`/`wait` loop with
    /// requests outstanding), at each poll: the path's progress thread should not sleep
    /// meanwhile (`net::idle`). Nothing by default: a path without such a thread.
    fn waiting(&self) {}

    /// Hands every data operation that finished since the last call to `done`; returns
    /// how many.
    fn poll_done(&mut self, done: &mut dyn FnMut(NetId, Result<(), NetError>)) -> usize;

    /// Hands every off-node rank found failed since the last call to `failed`.
    fn poll_failed(&mut self, failed: &mut dyn FnMut(Rank));

    /// Stops the path: operations in flight are drained until `deadline`, then cancelled
    /// and reported failed; afterwards every post answers [`NetError::Down`].
    fn shutdown(&mut self, deadline: Instant) -> Result<(), NetError>;

    /// The GIO path itself, for what only it offers (windows and producer queues: the
    /// symmetric heap's off-node operations, `crate::sym`); None for other paths (tests'
    /// scripted ones), whose off-node PEs the heap cannot reach.
    fn net_path(&mut self) -> Option<&mut crate::net::NetPath> {
        None
    }
}
