//! Sans-IO state machines of gpulmt's large-message transfer (LMT) protocols.
//!
//! Nothing here performs I/O: no syscalls, threads, clocks, shared memory or GPU
//! calls. The transport feeds [`Engine`] events (a send or receive was posted, a
//! control packet arrived, a copy or network transfer finished, a peer died) and
//! executes the [`Action`]s it emits (send this packet, start this copy on that engine,
//! send or receive this message's data through the network, complete that request). That makes every interleaving testable: the unit and
//! property tests drive two or more engines against each other with packets and
//! copy completions delivered in arbitrary order.
//!
//! Modules:
//! - [`wire`]: control packets and their validated binary encoding.
//! - [`matching`]: MPI matching (source, tag, wildcards, non-overtaking order).
//! - [`policy`]: which protocol moves a message, and why.
//! - [`engine`]: the per-rank protocol engine.
//! - [`gio`]: GIO device queues of the internode path: packet format, producer, consumer,
//!   completions, fence and quiet.

// Pure state machines: nothing here needs unsafe, and it stays so.
#![forbid(unsafe_code)]

pub mod engine;
pub mod gio;
pub mod matching;
pub mod policy;
pub mod wire;

pub use engine::{Action, BufDesc, CopyCmd, CopyEngine, Engine, EngineConfig, Loc, Status};
pub use policy::{Protocol, ProtocolChoice, ProtocolOverride};
pub use wire::{MemDesc, Packet, Region};

/// A rank's index within its job (0-based; a job may span nodes).
pub type Rank = u32;
/// A message tag; wildcards are expressed with `Option<Tag>` (None = any tag).
pub type Tag = i32;

/// Identifier of a user request, chosen by the transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// Identifier of a copy the engine asked for, echoed back on completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyId(pub u64);

/// Identifier of a network transfer (one side's send or receive of a message's data)
/// the engine asked for, echoed back on completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NetId(pub u64);

/// Sender-assigned identifier of a message, unique per sender for the job's life.
pub type MsgId = u64;

/// Why a request failed. Every variant says what happened and what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("message of {msg_len} bytes truncated: the receive buffer holds {buf_len} bytes; post a larger buffer")]
    Truncated { msg_len: u64, buf_len: u64 },
    #[error("rank {rank} failed or exited during the transfer; its requests cannot complete")]
    PeerFailed { rank: Rank },
    #[error("rank {rank} is outside this job of {size} ranks")]
    BadRank { rank: Rank, size: u32 },
    #[error("protocol violation by rank {rank}: {what}")]
    Protocol { rank: Rank, what: String },
    #[error("copy failed: {what}")]
    CopyFailed { what: String },
    #[error("rank {rank} aborted the transfer: {reason}")]
    Aborted { rank: Rank, reason: String },
    #[error("request was cancelled")]
    Cancelled,
    #[error("unsupported: {what}")]
    Unsupported { what: String },
}
