//! The receiver's decision on a matched RTS and the start of the chosen protocol.
//!
//! The policy ([`crate::policy::choose`]) picks GET, PUT, COOPERATE or SHM from the
//! placement of both buffers, peer access, the size and this rank's load per peer
//! (counted by `insert_recv` here and released by `finish_recv`), and NET for a sender
//! on another node. Starting the protocol is either this side's copies (GET,
//! COOPERATE's back part, a copy to itself) or a CTS that hands the sender its part
//! (PUT, COOPERATE, SHM), after posting the network receive for NET.

use crate::policy::{self, PeerLoad, Protocol, ProtocolChoice};
use crate::wire::{AbortReason, CtsMode, Dir, MemDesc, Packet};
use crate::{MsgId, ProtoError, Rank, ReqId, Tag};

use super::copies::OpOwner;
use super::recv::RecvXfer;
use super::shm::ShmState;
use super::{Action, BufDesc, CopyEngine, Engine, Loc};

impl Engine {
    /// Receive `req` into `buf` takes message `msg` of `len` bytes from `from`, announced
    /// by an RTS for `src`: refuse it if it does not fit, else choose its protocol and
    /// start this side's part.
    // The RTS's fields travel separately: they come from a matched unexpected message
    // or from a host-carried RTS packet, and bundling them would only repack them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start_rendezvous(
        &mut self,
        req: ReqId,
        from: Rank,
        msg: MsgId,
        tag: Tag,
        len: u64,
        src: MemDesc,
        buf: BufDesc,
    ) {
        let pushed = matches!(src, MemDesc::Net { pushed: true });
        if len > buf.len {
            if pushed {
                // The data is on its way: drop it here, and the sender's send completes
                // once it is (MPI: a truncated message's send succeeds).
                self.post_net_drain(from, msg, len);
            } else {
                self.send(from, Packet::Abort { msg, reason: AbortReason::Truncated, dir: Dir::ToSender });
            }
            return self.complete(req, Err(ProtoError::Truncated { msg_len: len, buf_len: buf.len }));
        }
        let choice = if from == self.cfg.rank {
            ProtocolChoice { protocol: Protocol::SelfCopy, reason: "sender and receiver are the same rank" }
        } else {
            let cfg = &self.cfg;
            let f = from as usize;
            let load =
                PeerLoad { sender_busy: self.sends_to[f] > 0, pulling: self.pulling[f], pushing: self.pushing[f] };
            // A buffer this rank failed to map before is chosen for as memory no peer
            // can map (`fallback`): the policy then never maps it.
            let failed = matches!(src, MemDesc::Device(r) if self.is_unmappable(from, r.buffer_id));
            let seen = if failed { &MemDesc::Staged } else { &src };
            policy::choose(&cfg.policy, seen, buf.device, buf.region.is_some(), len, load, |a, b| cfg.can_access(a, b))
        };
        let mut choice = choice;
        let split = self.coop_split(len);
        if choice.protocol == Protocol::Coop && (split == 0 || split >= len) {
            choice = ProtocolChoice { protocol: Protocol::Get, reason: "message too small to split: receiver pulls" };
        }
        self.emit(Action::Chose { req, peer: from, len, choice });
        let mut x = RecvXfer {
            req,
            tag,
            len,
            buf,
            proto: choice.protocol,
            pending: 0,
            part_done: false,
            shm: None,
            net: None,
            error: None,
            unmapped: None,
            awaiting_sender: false,
        };
        let owner = |chunk| OpOwner::Recv { from, msg, chunk };
        match choice.protocol {
            Protocol::SelfCopy => {
                // The sender is this engine: copy straight between the two user buffers.
                let Some(s) = self.sends.get_mut(&msg) else {
                    self.violation(from, format!("self RTS {msg} without a send"));
                    return self.complete(req, Err(ProtoError::Protocol { rank: from, what: "lost self send".into() }));
                };
                s.proto = Some(Protocol::SelfCopy);
                let sreq = s.req;
                let engine = match (s.buf.device, buf.device) {
                    (Some(d), _) | (None, Some(d)) => CopyEngine::Device(d),
                    (None, None) => CopyEngine::Host,
                };
                x.pending = self.issue_range(
                    owner(None),
                    engine,
                    |o| Loc::User { req: sreq, offset: o },
                    |o| Loc::User { req, offset: o },
                    0,
                    len,
                );
            }
            Protocol::Get => {
                let (MemDesc::Device(region), Some(dev)) = (src, buf.device) else { unreachable!("policy") };
                x.pending = self.issue_range(
                    owner(None),
                    CopyEngine::Device(dev),
                    |o| Loc::Peer { peer: from, region, offset: o },
                    |o| Loc::User { req, offset: o },
                    0,
                    len,
                );
            }
            Protocol::Put => {
                self.send(from, Packet::Cts { msg, mode: CtsMode::Put, dst: buf.region, split: len });
            }
            Protocol::Coop => {
                let (MemDesc::Device(region), Some(dev)) = (src, buf.device) else { unreachable!("policy") };
                self.send(from, Packet::Cts { msg, mode: CtsMode::Coop, dst: buf.region, split });
                x.pending = self.issue_range(
                    owner(None),
                    CopyEngine::Device(dev),
                    |o| Loc::Peer { peer: from, region, offset: o },
                    |o| Loc::User { req, offset: o },
                    split,
                    len,
                );
            }
            Protocol::Shm => {
                self.send(from, Packet::Cts { msg, mode: CtsMode::Shm, dst: None, split: 0 });
                x.shm = Some(ShmState::new(len, self.cfg.chunk_size));
            }
            Protocol::Net => {
                // The data receive first: the sender starts sending on the CTS, unless
                // it pushed the data already.
                x.net = Some(self.post_net_recv(req, from, msg, len));
                x.pending = 1;
                if !pushed {
                    self.send(from, Packet::Cts { msg, mode: CtsMode::Net, dst: None, split: 0 });
                }
            }
        }
        self.insert_recv((from, msg), x);
    }

    /// Starts tracking a receive, counted in its sender's engine load.
    pub(super) fn insert_recv(&mut self, key: (Rank, MsgId), x: RecvXfer) {
        if let Some(n) = self.load_of(key.0, x.proto) {
            *n += 1;
        }
        self.recvs.insert(key, x);
    }

    /// The per-peer count a receive by `proto` is part of, if any.
    pub(super) fn load_of(&mut self, from: Rank, proto: Protocol) -> Option<&mut u32> {
        match proto {
            Protocol::Get => Some(&mut self.pulling[from as usize]),
            Protocol::Put => Some(&mut self.pushing[from as usize]),
            _ => None,
        }
    }

    /// Where COOPERATE splits a message: the sender's share, aligned down to 4 KiB
    /// so neither engine's part starts mid-page.
    fn coop_split(&self, len: u64) -> u64 {
        let raw = (len as u128 * self.cfg.coop_sender_permille as u128 / 1000) as u64;
        raw & !0xfff
    }
}
