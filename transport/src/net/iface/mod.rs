//! `NetIface`: the network underneath the proxy, as a small table of operations in UCX's
//! `uct_iface_ops` style, so that the proxy's logic runs the same over MPI (`mpi`) and
//! over an in-process loopback for unit tests ([`loopback`]).
//!
//! It moves byte messages between ranks under (source, tag) matching with MPI's rules:
//! messages from one source under one tag are matched in the order sent, to receives in
//! the order posted. Every operation names a [`ReqId`] the caller chose (UCX's completion
//! pointer) and answers with a [`Status`]:
//! - [`Status::Done`]: finished now; it will not be reported again;
//! - [`Status::InProgress`]: accepted; [`NetIface::iface_progress`] reports it once;
//! - [`Status::NoResource`]: not taken (too many operations in flight): retry later.
//!
//! An error return means the operation was not taken either. The buffers an operation
//! names belong to the interface until it is reported finished (or answered `Done`), as
//! with `MPI_Isend`; that is why `ep_send` and `ep_recv` are `unsafe`.

pub mod loopback;
#[cfg(feature = "mpi")]
pub mod mpi;

use gpulmt_protocols::Rank;

/// The caller's name for one operation, echoed in its completion.
pub type ReqId = u64;

/// What an operation call answers (UCX's `UCS_OK`, `UCS_INPROGRESS`,
/// `UCS_ERR_NO_RESOURCE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Status<T> {
    /// Finished at once; `T` says how (a receive's arrival).
    Done(T),
    /// Accepted; its completion comes through [`NetIface::iface_progress`].
    InProgress,
    /// Not taken: too many operations in flight. Retry after progress.
    NoResource,
}

/// How a receive completed: who sent the message and how many bytes it carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    pub source: Rank,
    pub len: usize,
}

/// Why a network operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NetFail {
    /// The library returned an error code for the call.
    #[error("{call} failed with error {code}: {message}")]
    Call { call: &'static str, code: i32, message: String },
    /// The message is longer than the receive buffer.
    #[error("a message of at least {got} bytes arrived for a receive of {len} bytes (truncated)")]
    Truncated { len: usize, got: usize },
    /// The operation was cancelled before it matched.
    #[error("cancelled before it matched")]
    Cancelled,
    /// The peer is gone.
    #[error("rank {rank} is gone")]
    PeerGone { rank: Rank },
}

impl NetFail {
    /// The code a CQ error record carries (`OpFailure::net`): the library's code, or a
    /// negative number of gpulmt's own for the other cases.
    pub fn code(&self) -> i32 {
        match self {
            NetFail::Call { code, .. } => *code,
            NetFail::Truncated { .. } => -2,
            NetFail::Cancelled => -3,
            NetFail::PeerGone { .. } => -4,
        }
    }
}

/// What the network can do, for the proxy to plan transfers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IfaceCaps {
    /// Device pointers may be passed directly (a CUDA-aware MPI library).
    pub device_memory: bool,
    /// Largest tag (`MPI_TAG_UB`).
    pub max_tag: i32,
}

/// A network endpoint: this rank's side of a connection to every rank of the job.
///
/// Called by the proxy thread only. Nothing here blocks.
pub trait NetIface: Send {
    /// This rank.
    fn rank(&self) -> Rank;

    /// Ranks of the job.
    fn size(&self) -> u32;

    /// What the network can do.
    fn caps(&self) -> IfaceCaps;

    /// Sends `len` bytes at `buf` to `to` under `tag`.
    ///
    /// # Safety
    /// `buf..buf + len` stays readable and unmodified until the operation is reported
    /// finished (`Done` now, or by [`iface_progress`](Self::iface_progress)).
    unsafe fn ep_send(&mut self, req: ReqId, to: Rank, tag: i32, buf: usize, len: usize)
        -> Result<Status<()>, NetFail>;

    /// Receives a message of at most `len` bytes from `from` (any rank if `None`) under
    /// `tag` into `buf`.
    ///
    /// # Safety
    /// `buf..buf + len` stays writable and unused by anyone else until the operation is
    /// reported finished.
    unsafe fn ep_recv(
        &mut self,
        req: ReqId,
        from: Option<Rank>,
        tag: i32,
        buf: usize,
        len: usize,
    ) -> Result<Status<Arrival>, NetFail>;

    /// Asks for `req` to end early: a receive not yet matched is cancelled (reported with
    /// [`NetFail::Cancelled`]); anything else completes as it would have. It is still
    /// reported once.
    fn ep_cancel(&mut self, req: ReqId);

    /// Reports operations that finished since the last call (sends with a zero-length
    /// arrival from this rank); returns how many.
    fn iface_progress(&mut self, done: &mut dyn FnMut(ReqId, Result<Arrival, NetFail>)) -> usize;

    /// Operations accepted and not yet reported.
    fn in_flight(&self) -> usize;

    /// Releases what the interface holds (MPI: frees its communicator). Called once, by
    /// the proxy at its exit, after every operation it could end has been reported.
    fn close(&mut self) {}
}
