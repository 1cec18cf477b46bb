//! What a peer's death does to this rank's engine: its transfers fail once their copies
//! stop, receives that only it could match fail at once, drains of its pushed data are
//! asked to end, and its offers and unmatched RTSs are dropped (its eager messages, which
//! arrived whole, stay receivable).

use crate::{MsgId, NetId, ProtoError, Rank};

use super::copies::OpOwner;
use super::recv::Unexpected;
use super::rtr::RtrPeer;
use super::{Action, Engine};

impl Engine {
    /// Rank `peer` died or exited: its transfers fail (once their copies stop), and
    /// receives that can only match it fail now.
    pub fn on_peer_failed(&mut self, peer: Rank) {
        if peer >= self.cfg.size || self.dead[peer as usize] || peer == self.cfg.rank {
            return;
        }
        self.dead[peer as usize] = true;
        // No offers from it or waits for them; its counts no longer matter.
        self.rtr[peer as usize] = RtrPeer { credit: 0, ..RtrPeer::default() };
        for p in self.posted.values_mut() {
            if p.offer.is_some_and(|o| o.to == peer) {
                p.offer = None;
            }
        }
        let err = ProtoError::PeerFailed { rank: peer };
        let sends: Vec<MsgId> = self.sends.iter().filter(|(_, s)| s.to == peer).map(|(m, _)| *m).collect();
        self.shm_rings.remove(&peer);
        for msg in sends {
            self.fail_send(msg, err.clone(), false);
        }
        let recvs: Vec<(Rank, MsgId)> = self.recvs.keys().filter(|(f, _)| *f == peer).copied().collect();
        for key in recvs {
            self.fail_recv(key, err.clone(), false);
        }
        // Its pushed data being drained will not come: the drains end now.
        let drains: Vec<NetId> = (self.nets.iter())
            .filter(|(_, o)| matches!(o, OpOwner::Drain { from, .. } if *from == peer))
            .map(|(id, _)| NetId(id))
            .collect();
        for id in drains {
            self.emit(Action::NetCancel { id });
        }
        for req in self.matcher.drain_posted_from(peer) {
            self.posted.remove(&req);
            self.complete(req, Err(err.clone()));
        }
        // With no live peer left, a wildcard receive could only be matched by this
        // rank itself; fail it rather than wait forever (MPI's fault-tolerance
        // extension reports such receives as failed too).
        let me = self.cfg.rank as usize;
        if self.dead.iter().enumerate().all(|(r, d)| *d || r == me) {
            for req in self.matcher.drain_posted_where(|sel| sel.source.is_none()) {
                self.posted.remove(&req);
                self.complete(req, Err(err.clone()));
            }
        }
        // Its eager messages already arrived whole and stay receivable; its RTSs
        // can never be fetched.
        self.matcher.retain_unexpected(|s, u| !(s == peer && matches!(u, Unexpected::Rts { .. })));
    }

    /// Whether a peer was declared failed.
    pub fn is_peer_failed(&self, peer: Rank) -> bool {
        self.dead.get(peer as usize).copied().unwrap_or(false)
    }
}
