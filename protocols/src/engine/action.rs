//! The engine's outputs: [`Action`]s the transport executes in order, and the copy
//! commands ([`CopyCmd`]) among them with their ends ([`Loc`]) and engines
//! ([`CopyEngine`]); the network transfers of the NET rendezvous are described in
//! `net`.
//!
//! Actions are queued inside the engine and drained with
//! [`Engine::poll_action`](super::Engine::poll_action), so every input handler only
//! changes state and the transport decides when to act (the quinn-proto shape).

use crate::policy::ProtocolChoice;
use crate::wire::{Packet, Region};
use crate::{CopyId, MsgId, NetId, ProtoError, Rank, ReqId};

use super::Status;

/// One end of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    /// The buffer of a local request, at `offset`.
    User { req: ReqId, offset: u64 },
    /// A peer's exported buffer, at `offset` from the start of the user's buffer
    /// (`region.offset + offset` from the allocation's start).
    Peer { peer: Rank, region: Region, offset: u64 },
    /// Staging slot `slot` of the directed pair `from -> to`, at its start.
    Staging { from: Rank, to: Rank, slot: u32 },
}

/// Which engine drives a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyEngine {
    /// The copy engine of this device.
    Device(u32),
    /// The CPU (both ends in host memory).
    Host,
}

/// A copy the transport must start, and report with [`Engine::on_copy_done`](super::Engine::on_copy_done).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyCmd {
    pub id: CopyId,
    pub engine: CopyEngine,
    pub lane: u32,
    pub src: Loc,
    pub dst: Loc,
    pub len: u64,
}

/// What the transport must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a control packet (in order with earlier sends to the same rank).
    Send { to: Rank, packet: Packet },
    /// Start a copy.
    Copy(CopyCmd),
    /// Write an eager payload into the request's buffer at offset 0.
    Deliver { req: ReqId, payload: Vec<u8> },
    /// The request is complete.
    Complete { req: ReqId, result: Result<Status, ProtoError> },
    /// A rendezvous protocol was chosen for the request (for logs and counters).
    Chose { req: ReqId, peer: Rank, len: u64, choice: ProtocolChoice },
    /// This rank could not map peer `peer`'s buffer `buffer_id` (`what` says why): its
    /// message moves by SHM instead, and so do its later ones while the engine remembers
    /// it. Once per buffer, for logs and counters.
    Unmappable { peer: Rank, buffer_id: u64, what: String },
    /// A peer broke the protocol; the packet was dropped.
    Violation { peer: Rank, what: String },
    /// A peer offered this region (RTR): map it now, so that a send that uses the offer
    /// does not pay for opening the mapping (and one that does not, later, neither).
    MapPeer { peer: Rank, region: Region },
    /// NET rendezvous, receiver's side: post the receive of `len` bytes into the buffer
    /// of request `req` (from its start) from rank `from`, on another node, for the
    /// sender's transfer `xfer` (its message id: unique per sender, so (`from`, `xfer`)
    /// names the transfer). Emitted before the CTS that lets the sender start (or, for
    /// a pushed message, after its data may have arrived: the network holds it); report
    /// it with [`Engine::on_net_done`](super::Engine::on_net_done).
    NetRecv { id: NetId, req: ReqId, from: Rank, xfer: MsgId, len: u64 },
    /// NET rendezvous, sender's side (on the receiver's CTS, or with the RTS of a pushed
    /// message: before it for device data, after it for host data): send the first `len` bytes of request `req`'s buffer to rank
    /// `to`, on another node, as transfer `xfer`, which `to` has posted the receive of
    /// or will (`pushed`: the network holds the data until then, however long `to`'s
    /// application takes to post the receive); report it with
    /// [`Engine::on_net_done`](super::Engine::on_net_done).
    NetSend { id: NetId, req: ReqId, to: Rank, xfer: MsgId, len: u64, pushed: bool },
    /// NET rendezvous, receiver's side of a pushed message no receive takes (it was
    /// truncated): receive the `len` bytes of `from`'s transfer `xfer` and drop them, so
    /// the sender's send completes and the network holds nothing of it. No request
    /// waits for it; report it with [`Engine::on_net_done`](super::Engine::on_net_done).
    NetDrain { id: NetId, from: Rank, xfer: MsgId, len: u64 },
    /// End network transfer `id` soon: its request failed (the peer gave up, failed or
    /// died), so it may never be matched. Cancel it if it has not completed; either way
    /// report it done, once, as for every transfer (an error if cancelled). The
    /// request completes only then, since its buffer may be in use until then.
    NetCancel { id: NetId },
}
