//! The NET rendezvous: a message between ranks of different nodes, whose data the
//! transport moves through MPI (`docs/internode.md`, "Two-sided messages across nodes").
//!
//! One engine matches for every rank of a job: the eager messages and RTSs of a rank on
//! another node reach the same [`Matcher`](crate::matching::Matcher) as those of the
//! node's ranks, so (source, tag), wildcards and per-sender order hold across both paths,
//! provided the transport hands each peer's control packets over in the order sent (a
//! ring does; MPI does for one source, communicator and tag). Per peer
//! ([`EngineConfig::on_node`](super::EngineConfig::on_node)):
//! - **Eager** up to `net_eager_limit` bytes, host and device memory alike
//!   ([`Engine::is_eager_to`]).
//! - **Rendezvous** above it, with an RTS whose source is [`MemDesc::Net`]: no IPC region
//!   ever goes to another node (nothing there could map it, and with pseudo-nodes it must
//!   not), so a sender's buffer needs no export. The transfer is named by the sender's
//!   message id (`xfer`), which both sides know from the RTS and which is unique per
//!   sender for the job's life, so (sender, `xfer`) can select the MPI message. Two forms,
//!   chosen by the sender and told by the RTS (`MemDesc::Net { pushed }`):
//!   - **Pushed** (up to `net_push_max` bytes, at most `net_push_sends` at once): the
//!     sender emits [`Action::NetSend`] with the RTS (before it for device data, whose
//!     staging copy should start first; after it for host data), and the network holds the
//!     data until the receive matches it (MPI's own rendezvous does that for large
//!     pieces, its eager buffers for small ones). The receiver matches the RTS and
//!     emits [`Action::NetRecv`], no CTS: one trip between the nodes' proxies less than
//!     the other form, and the sender's staging copies overlap the RTS's trip. A
//!     pushed message that does not fit is drained ([`Action::NetDrain`]: received and
//!     dropped) and the receive fails with truncation; the sender is told nothing and
//!     its send completes when the drain took the data, as MPI's does. The cap on
//!     pushed sends bounds what waits in the network (and the sender's staging buffers
//!     it holds) before receivers match.
//!   - **Asked for**: the receiver matches it, refuses it if it does not fit (ABORT,
//!     truncation as on the node), else chooses [`Protocol::Net`] (whatever
//!     `GPULMT_PROTOCOL` forces: see `policy`) and emits, in this order,
//!     [`Action::NetRecv`] and the CTS (`CtsMode::Net`). Posting the data receive first
//!     means the sender's data never arrives at an MPI library that has no receive for
//!     it. The sender answers the CTS with [`Action::NetSend`].
//! - **Completion**: each side's request completes when the transport reports its own
//!   transfer done ([`Engine::on_net_done`]). MPI completes both sides, so no DONE packet.
//!
//! Failure follows the copies' rule: a network transfer counts among its request's
//! pending operations, so a request completes only once the transport reported its
//! transfer done, even when it failed meanwhile (MPI may still write the buffer until
//! then). A request that fails with its transfer outstanding (the peer sent ABORT, or
//! died) asks for it to end ([`Action::NetCancel`]); one with none outstanding fails at
//! once. A transfer that fails fails its request, with `ProtoError::CopyFailed` (the data
//! movement failed; a variant of its own would need a C error code too), and the peer is
//! told by ABORT, so its side is cancelled. MPI may complete the sender's side before the
//! receiver's fails: that ABORT then finds the send ended, and is dropped without
//! complaint (the engine remembers its last NET sends for this).
//!
//! What never crosses nodes: RTR offers (they carry a region; `rtr`), the copy and SHM
//! packets (COOKIE, DONE, CHUNK, CHUNK_ACK) and CTSs other than NET: a rank on another
//! node that sends one breaks the protocol, and the packet is dropped (`Engine::on_packet`).
//! The two-phase free packets (FREE_MARKS, FREE_ACK) are not the engine's at all: the
//! transport runs the free commit, and since no region of this rank ever reaches another
//! node, ranks there never map its memory and take no part in it. This assumes the
//! transport runs the commit among the ranks of the node only and never routes a free
//! packet of another node's rank to it (the engine reports one as a violation, as ever).

use crate::policy::Protocol;
use crate::wire::{AbortReason, CtsMode, Dir, Packet};
use crate::{MsgId, NetId, Rank, ReqId};

use super::copies::OpOwner;
use super::{Action, Engine};

impl Engine {
    /// Whether a message of `len` bytes to `to` from host (or, with `device`, device)
    /// memory travels eagerly: within the node by [`is_eager`](Self::is_eager), to
    /// another node up to `net_eager_limit` whatever the memory. Empty messages always do.
    pub fn is_eager_to(&self, to: Rank, len: u64, device: bool) -> bool {
        if self.cfg.is_on_node(to) {
            self.is_eager(len, device)
        } else {
            len == 0 || len <= self.cfg.net_eager_limit
        }
    }

    /// Whether `packet` may come from a rank on another node: eager messages, RTSs, CTSs
    /// and ABORTs are all that the NET rendezvous exchanges.
    pub(super) fn crosses_nodes(packet: &Packet) -> bool {
        matches!(packet, Packet::Eager { .. } | Packet::Rts { .. } | Packet::Cts { .. } | Packet::Abort { .. })
    }

    /// Receiver, on a matched RTS from another node that fits: posts the receive of the
    /// data (before the CTS, which the caller sends next). Returns the transfer's id.
    pub(super) fn post_net_recv(&mut self, req: ReqId, from: Rank, msg: MsgId, len: u64) -> NetId {
        let id = self.new_net(OpOwner::Recv { from, msg, chunk: None });
        self.emit(Action::NetRecv { id, req, from, xfer: msg, len });
        id
    }

    /// Receiver, on a matched pushed RTS it refuses (truncated): drops the data.
    pub(super) fn post_net_drain(&mut self, from: Rank, msg: MsgId, len: u64) {
        let id = self.new_net(OpOwner::Drain { from, msg });
        self.emit(Action::NetDrain { id, from, xfer: msg, len });
    }

    /// Sender, on the receiver's CTS for send `msg` (checked by the caller), or with the
    /// RTS of a pushed send: sends the data.
    pub(super) fn post_net_send(&mut self, msg: MsgId) {
        let id = self.new_net(OpOwner::Send { msg, chunk: None });
        let s = self.sends.get_mut(&msg).expect("live send");
        s.proto = Some(Protocol::Net);
        s.pending += 1;
        s.net = Some(id);
        let (req, to, len, pushed) = (s.req, s.to, s.buf.len, s.pushed);
        self.emit(Action::NetSend { id, req, to, xfer: msg, len, pushed });
    }

    fn new_net(&mut self, owner: OpOwner) -> NetId {
        let id = NetId(self.next_net);
        self.next_net += 1;
        self.nets.insert(id.0, owner);
        id
    }

    /// A network transfer finished (Err carries the transport's description of the
    /// failure). Every [`Action::NetSend`] and [`Action::NetRecv`] is reported exactly
    /// once, cancelled ones included.
    pub fn on_net_done(&mut self, id: NetId, result: Result<(), String>) {
        let Some(owner) = self.nets.remove(id.0) else {
            return self.violation(self.cfg.rank, format!("completion of unknown network transfer {id:?}"));
        };
        match owner {
            OpOwner::Send { msg, .. } => {
                let Some(s) = self.sends.get_mut(&msg) else { return };
                s.net = None;
                let to = s.to;
                let result = result.map_err(|e| format!("network transfer of message {msg} to rank {to}: {e}"));
                self.on_send_copy_done(msg, None, result);
            }
            OpOwner::Recv { from, msg, .. } => {
                let Some(r) = self.recvs.get_mut(&(from, msg)) else { return };
                r.net = None;
                let result = result.map_err(|e| format!("network transfer of message {msg} from rank {from}: {e}"));
                self.on_recv_copy_done((from, msg), None, result);
            }
            // No request waits for a drain. One that failed leaves the sender's data in the
            // network, and its send waiting for it: tell the sender to give up.
            OpOwner::Drain { from, msg } => {
                if result.is_err() {
                    self.send(from, Packet::Abort { msg, reason: AbortReason::CopyFailed, dir: Dir::ToSender });
                }
            }
        }
    }

    /// Whether rank `from` may answer an RTS with `mode`: NET from a rank on another node,
    /// and only from one.
    pub(super) fn cts_mode_fits_peer(&self, from: Rank, mode: CtsMode) -> bool {
        (mode == CtsMode::Net) != self.cfg.is_on_node(from)
    }
}
