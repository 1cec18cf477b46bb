//! Routing to the ranks of other nodes (`docs/internode.md`, "World, nodes and routing"):
//! the engine's control packets and network transfers for a rank off this node go to the
//! context's [`OffNodePath`], and what the path reports goes back to the engine.
//!
//! Per peer the transport routes: a rank of this node gets the rings and the LMT copies
//! (`progress`), a rank of another node the path. A post the path cannot take now
//! ([`PostError::NoResource`]) waits in that rank's queue, and every later post to the rank
//! waits behind it, as ring backpressure waits in the outbox. So the rank gets its control
//! packets in the order sent, and a data receive is posted before the CTS that lets its
//! sender start (the engine emits them in that order).
//!
//! Without a path (a context of one node, or one started without it), or once it is down,
//! transfers with ranks of other nodes fail at once with an error that says why.

use std::collections::VecDeque;
use std::time::Instant;

use gpulmt_protocols::wire::Packet;
use gpulmt_protocols::{MsgId, NetId, ProtoError, Rank, ReqId};

use crate::anatomy::{self, Point};
use crate::context::{Context, ReqState};
use crate::device::MemoryKind;
use crate::error::{Error, Result};
use crate::offnode::{NetError, OffNodePath, PostError};
use crate::requests::RequestTable;
use crate::topology::Topology;

/// Why ranks of other nodes cannot be reached when the context has no path.
const NO_PATH: &str = "this context was started without an internode path";

/// A post waiting for the path.
enum NetPost {
    /// An encoded control packet.
    Ctrl(Vec<u8>),
    /// The sending side of a NET rendezvous: the first `len` bytes of `req`'s buffer,
    /// `pushed` with its RTS or on the receiver's CTS.
    Send { id: NetId, req: ReqId, xfer: MsgId, len: u64, pushed: bool },
    /// The receiving side: into the first `len` bytes of `req`'s buffer.
    Recv { id: NetId, req: ReqId, xfer: MsgId, len: u64 },
    /// A receiving side that drops the data (a pushed message no receive takes).
    Drain { id: NetId, xfer: MsgId, len: u64 },
}

impl NetPost {
    fn transfer(&self) -> Option<NetId> {
        match self {
            NetPost::Ctrl(_) => None,
            NetPost::Send { id, .. } | NetPost::Recv { id, .. } | NetPost::Drain { id, .. } => Some(*id),
        }
    }
}

/// A context's side of the internode path.
pub(crate) struct OffNode {
    path: Option<Box<dyn OffNodePath>>,
    /// Why ranks of other nodes cannot be reached (no path, or it went down); None while
    /// the path runs.
    down: Option<String>,
    /// Whether the path's `shutdown` ran.
    shut: bool,
    /// Per job rank: posts waiting for the path, oldest first.
    queues: Vec<VecDeque<NetPost>>,
    /// Per job rank: the last data receive posted from it, until the path took it. A
    /// control packet to the rank (the receive's CTS, and whatever follows it) waits
    /// until then ([`OffNodePath::taken`] says why).
    untaken: Vec<Option<NetId>>,
    queued: usize,
    /// Scratch of the polls, kept for their allocations (control packets as they came).
    inbound: Vec<(Rank, Vec<u8>)>,
    done: Vec<(NetId, Result<(), NetError>)>,
    failed: Vec<Rank>,
}

impl OffNode {
    pub(crate) fn new(topo: &Topology, path: Option<Box<dyn OffNodePath>>) -> OffNode {
        OffNode {
            down: path.is_none().then(|| NO_PATH.to_string()),
            path,
            shut: false,
            queues: (0..topo.size()).map(|_| VecDeque::new()).collect(),
            untaken: vec![None; topo.size() as usize],
            queued: 0,
            inbound: Vec::new(),
            done: Vec::new(),
            failed: Vec::new(),
        }
    }

    /// Whether a path exists that progress must poll.
    #[inline]
    pub(crate) fn has_path(&self) -> bool {
        self.path.is_some() && !self.shut
    }

    /// Whether the ranks of other nodes can be reached.
    pub(crate) fn is_up(&self) -> bool {
        self.down.is_none()
    }

    /// The GIO path, while it runs (the symmetric heap's windows and queues).
    pub(crate) fn net_path(&mut self) -> Option<&mut crate::net::NetPath> {
        match (self.shut, self.path.as_mut()) {
            (false, Some(p)) => p.net_path(),
            _ => None,
        }
    }

    /// Posts waiting for room in the path.
    pub(crate) fn queued(&self) -> usize {
        self.queued
    }

    /// Whether a control packet to `r` must wait: its last data receive from `r` is
    /// not taken yet. Clears the mark once it is.
    fn ctrl_gated(&mut self, r: Rank) -> bool {
        let slot = &mut self.untaken[r as usize];
        // A path that is down takes nothing any more: the packet goes on to fail there.
        let live = self.path.as_ref().filter(|_| !self.shut && self.down.is_none());
        match (*slot, live) {
            (Some(id), Some(path)) if !path.taken(id) => true,
            _ => {
                *slot = None;
                false
            }
        }
    }

    /// Forgets the control packets waiting for job rank `r` (it failed).
    pub(crate) fn drop_ctrl_to(&mut self, r: Rank) {
        if let Some(q) = self.queues.get_mut(r as usize) {
            let before = q.len();
            q.retain(|p| p.transfer().is_some());
            self.queued -= before - q.len();
        }
    }
}

/// Where a transfer of `len` bytes of request `req` lies: its buffer's start, `len`, and
/// the buffer's memory kind; an error if the request is gone or its buffer too short.
fn transfer_buffer(
    reqs: &RequestTable<ReqState>,
    req: ReqId,
    len: u64,
) -> std::result::Result<(usize, usize, MemoryKind), PostError> {
    let st =
        reqs.get(req.0).ok_or_else(|| NetError::Rejected(format!("the request {} of the transfer is gone", req.0)))?;
    if len > st.len as u64 {
        let what = format!("a transfer of {len} bytes overruns the {}-byte buffer of its request", st.len);
        return Err(NetError::Rejected(what).into());
    }
    Ok((st.ptr, len as usize, st.kind))
}

impl Context {
    /// Whether job rank `r` can be reached: a rank of this node always, a rank of another
    /// node while the internode path runs. The error says why not.
    #[inline]
    pub(crate) fn check_reachable(&self, r: Rank) -> Result<()> {
        match &self.offnode.down {
            Some(why) if !self.topo.on_node(r) => {
                let node = self.topo.place_of(r).map_or(0, |p| p.node);
                let what = format!("rank {r} runs on another node (node {node}), which this rank cannot reach: {why}");
                Err(ProtoError::Unsupported { what }.into())
            }
            _ => Ok(()),
        }
    }

    /// Installs the path to the ranks of other nodes in a context made without one
    /// ([`Context::init_world`] with `None`): from then on they are reachable. The path
    /// needs the context's device backend for its queues' memory, which is why it comes
    /// after the context (`gpulmt::mpi::init_from_mpi` and the PMPI shim start
    /// [`crate::net`]'s path this way). Refused when the context has a path already, or
    /// has no rank on another node.
    pub fn attach_offnode_path(&mut self, path: Box<dyn OffNodePath>) -> Result<()> {
        if self.offnode.path.is_some() {
            return Err(Error::InvalidArgument("this context has an internode path already".into()));
        }
        if self.topo.is_single_node() {
            return Err(Error::InvalidArgument(
                "this context's job has one node: no rank needs an internode path".into(),
            ));
        }
        self.offnode.path = Some(path);
        self.offnode.down = None;
        Ok(())
    }

    /// Sends control packet `p` to `to`, a rank of another node.
    pub(crate) fn send_offnode(&mut self, to: Rank, p: &Packet) {
        let len = p.encoded_len();
        self.send_offnode_with(to, len, &mut |out| {
            p.encode(out);
        });
    }

    /// Sends a control packet of `len` bytes, which `encode` writes, to `to`, a rank of
    /// another node: encoded straight into the path's queue when nothing waits for `to`
    /// (no copy in between), else into the backlog, which the general post handles (it
    /// queues the packet, or fails it with the rank).
    pub(crate) fn send_offnode_with(&mut self, to: Rank, len: usize, encode: &mut dyn FnMut(&mut [u8])) {
        self.stats.packets_sent += 1;
        let waiting = !self.offnode.queues[to as usize].is_empty() || self.offnode.ctrl_gated(to);
        if let Some(path) = self.offnode.path.as_mut().filter(|_| self.offnode.down.is_none() && !waiting) {
            let mut kind = 0;
            let mut write = |out: &mut [u8]| {
                encode(out);
                kind = out.get(1).copied().unwrap_or(0);
            };
            if path.post_ctrl_with(to, len, &mut write).is_ok() {
                anatomy::mark(Point::PacketOut, kind);
                return;
            }
        }
        let mut bytes = vec![0; len];
        encode(&mut bytes);
        self.post_offnode(to, NetPost::Ctrl(bytes));
    }

    /// The engine's [`NetSend`](gpulmt_protocols::engine::Action::NetSend).
    pub(crate) fn post_net_send(&mut self, id: NetId, req: ReqId, to: Rank, xfer: MsgId, len: u64, pushed: bool) {
        self.post_offnode(to, NetPost::Send { id, req, xfer, len, pushed });
    }

    /// The engine's [`NetRecv`](gpulmt_protocols::engine::Action::NetRecv).
    pub(crate) fn post_net_recv(&mut self, id: NetId, req: ReqId, from: Rank, xfer: MsgId, len: u64) {
        self.post_offnode(from, NetPost::Recv { id, req, xfer, len });
    }

    /// The engine's [`NetDrain`](gpulmt_protocols::engine::Action::NetDrain).
    pub(crate) fn post_net_drain(&mut self, id: NetId, from: Rank, xfer: MsgId, len: u64) {
        self.post_offnode(from, NetPost::Drain { id, xfer, len });
    }

    /// Posts to the path, or queues behind what waits for `peer` already.
    fn post_offnode(&mut self, peer: Rank, post: NetPost) {
        let gated = matches!(post, NetPost::Ctrl(_)) && self.offnode.ctrl_gated(peer);
        let behind = !self.offnode.queues[peer as usize].is_empty();
        if !behind && !gated {
            match self.try_post(peer, &post) {
                Ok(()) => return,
                Err(PostError::NoResource) => {}
                Err(PostError::Failed(e)) => return self.post_failed(peer, post, e),
            }
        }
        // Backpressure is a path without room (now, or for the posts ahead); a packet
        // that only waits for its receive's take is not.
        if behind || !gated {
            self.stats.backpressure += 1;
        }
        self.offnode.queues[peer as usize].push_back(post);
        self.offnode.queued += 1;
    }

    fn try_post(&mut self, peer: Rank, post: &NetPost) -> std::result::Result<(), PostError> {
        let Some(path) = self.offnode.path.as_mut().filter(|_| self.offnode.down.is_none()) else {
            let why = self.offnode.down.as_deref().unwrap_or(NO_PATH);
            return Err(NetError::Down(why.to_string()).into());
        };
        match *post {
            NetPost::Ctrl(ref bytes) => {
                path.post_ctrl(peer, bytes)?;
                anatomy::mark(Point::PacketOut, bytes.get(1).copied().unwrap_or(0));
                Ok(())
            }
            NetPost::Send { id, req, xfer, len, pushed } => {
                let (buf, len, mem) = transfer_buffer(&self.reqs, req, len)?;
                // SAFETY: `buf..buf + len` lies in the buffer of request `req` (checked just
                // above), of the memory kind `classify` found, which isend's contract (and
                // lmt_initiate's) keeps valid and unmodified until the request completes; the
                // engine completes it only after this transfer is reported done
                // (`on_net_done`), and the context waits for that or shuts the path down
                // (which ends it) before it goes.
                unsafe { path.post_send(id, peer, xfer, buf, len, mem, pushed) }
            }
            NetPost::Recv { id, req, xfer, len } => {
                let (buf, len, mem) = transfer_buffer(&self.reqs, req, len)?;
                // SAFETY: as for the send: irecv's contract (and lmt_start_recv's) keeps the
                // request's buffer valid for writes and unused until the request completes,
                // which is after this transfer is reported done.
                unsafe { path.post_recv(id, peer, xfer, buf, len, mem) }?;
                self.offnode.untaken[peer as usize] = Some(id);
                Ok(())
            }
            NetPost::Drain { id, xfer, len } => {
                let len = usize::try_from(len).map_err(|_| NetError::Rejected(format!("a {len}-byte drain")))?;
                path.post_drain(id, peer, xfer, len)
            }
        }
    }

    /// The path refused a post for good: a transfer fails; a rank that cannot take its
    /// control packets has failed for this rank.
    fn post_failed(&mut self, peer: Rank, post: NetPost, e: NetError) {
        if let (NetError::Down(why), None) = (&e, &self.offnode.down) {
            self.offnode.down = Some(format!("the internode path is down: {why}"));
        }
        match post {
            NetPost::Ctrl(_) => {
                tracing::error!(peer, error = %e, "the internode path refused a control packet: failing the rank's transfers");
                self.peer_failed(peer);
            }
            NetPost::Send { id, .. } | NetPost::Recv { id, .. } | NetPost::Drain { id, .. } => {
                self.engine.on_net_done(id, Err(e.to_string()));
                self.run_actions();
            }
        }
    }

    /// Posts what waits for the path, per rank in order, until the path has no room.
    fn flush_offnode(&mut self) -> bool {
        let mut did = false;
        for t in 0..self.offnode.queues.len() {
            while let Some(post) = self.offnode.queues[t].pop_front() {
                if matches!(post, NetPost::Ctrl(_)) && self.offnode.ctrl_gated(t as Rank) {
                    self.offnode.queues[t].push_front(post);
                    break;
                }
                match self.try_post(t as Rank, &post) {
                    Ok(()) => self.offnode.queued -= 1,
                    Err(PostError::NoResource) => {
                        self.offnode.queues[t].push_front(post);
                        break;
                    }
                    Err(PostError::Failed(e)) => {
                        self.offnode.queued -= 1;
                        self.post_failed(t as Rank, post, e);
                    }
                }
                did = true;
            }
            if self.offnode.queued == 0 {
                break;
            }
        }
        did
    }

    /// The engine's [`NetCancel`](gpulmt_protocols::engine::Action::NetCancel): a transfer
    /// still waiting here ends now, one the path took is asked to end.
    pub(crate) fn cancel_net(&mut self, id: NetId) {
        for q in &mut self.offnode.queues {
            if let Some(i) = q.iter().position(|p| p.transfer() == Some(id)) {
                q.remove(i);
                self.offnode.queued -= 1;
                self.engine.on_net_done(id, Err("cancelled before the internode path took it".into()));
                return;
            }
        }
        if let Some(path) = self.offnode.path.as_mut() {
            path.cancel(id);
        }
    }

    /// One pass over the path: control packets that arrived go to the engine, finished
    /// transfers complete, failed ranks fail; then what waits for room is posted.
    pub(crate) fn progress_offnode(&mut self) -> bool {
        let Some(path) = self.offnode.path.as_mut() else { return false };
        if !self.reqs.is_empty() {
            // Someone polls for a request, which the network may complete: keep the proxy
            // awake while they do (an outstanding request on the node only keeps it
            // yielding too, which costs a core the waiter spins on anyway).
            path.waiting();
        }
        let mut inbound = std::mem::take(&mut self.offnode.inbound);
        let mut done = std::mem::take(&mut self.offnode.done);
        let mut failed = std::mem::take(&mut self.offnode.failed);
        path.poll_inbound(&mut |from, bytes| {
            anatomy::mark(Point::NetPacketIn, bytes.get(1).copied().unwrap_or(0));
            inbound.push((from, bytes))
        });
        // Packets first: a receive may be spinning on one (an eager message's copy starts
        // here), and the completions' polls read lines the proxy writes.
        let mut did = !inbound.is_empty();
        for (from, bytes) in inbound.drain(..) {
            self.on_offnode_packet(from, &bytes);
        }
        let path = self.offnode.path.as_mut().expect("packets do not take the path away");
        path.poll_done(&mut |id, result| done.push((id, result)));
        path.poll_failed(&mut |r| failed.push(r));
        did |= !(done.is_empty() && failed.is_empty());
        for (id, result) in done.drain(..) {
            if let Err(e) = &result {
                // Its request fails with it, if it has one (a drain has none).
                tracing::info!(transfer = id.0, error = %e, "a network transfer failed");
            }
            self.engine.on_net_done(id, result.map_err(|e| e.to_string()));
            self.run_actions();
        }
        for r in failed.drain(..) {
            if r < self.size() && !self.topo.on_node(r) {
                self.peer_failed(r);
            } else {
                tracing::warn!(rank = r, "the internode path reported a failed rank that is not of another node");
            }
        }
        (self.offnode.inbound, self.offnode.done, self.offnode.failed) = (inbound, done, failed);
        if self.offnode.queued > 0 {
            did |= self.flush_offnode();
        }
        did
    }

    /// A control packet from `from` that the path delivered: an eager message a receive
    /// waits for goes straight into its buffer, as from a ring (`take_eager`); the rest is
    /// decoded for the engine.
    fn on_offnode_packet(&mut self, from: Rank, bytes: &[u8]) {
        if from >= self.size() || self.topo.on_node(from) {
            self.stats.violations += 1;
            tracing::warn!(
                rank = from,
                "dropped a packet the internode path says came from a rank not of another node"
            );
            return;
        }
        if self.take_eager(from, bytes) {
            self.stats.packets_received += 1;
            return;
        }
        match Packet::decode(bytes) {
            Ok(p) => self.on_control(from, p),
            Err(e) => {
                self.stats.violations += 1;
                tracing::warn!(peer = from, error = %e, "dropped an undecodable control packet from another node");
            }
        }
    }

    /// Stops the path (once): its transfers in flight drain until `deadline`, then are
    /// cancelled; the ranks of other nodes are unreachable from then on.
    pub(crate) fn shutdown_offnode(&mut self, deadline: Instant) -> Result<()> {
        let Some(path) = self.offnode.path.as_mut().filter(|_| !self.offnode.shut) else { return Ok(()) };
        self.offnode.shut = true;
        self.offnode.down.get_or_insert_with(|| "the internode path was shut down".into());
        path.shutdown(deadline).map_err(|e| Error::Bootstrap(format!("shutting down the internode path: {e}")))
    }
}

#[cfg(test)]
mod tests;
