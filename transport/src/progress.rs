//! The progress engine: executes the protocol engine's actions (ring packets,
//! copies, completions) and feeds it what happened (packets read, copies done,
//! peers dead). Everything here is I/O; every decision is in `gpulmt-protocols`.
//!
//! The engine speaks job ranks; the rings, staging areas and rank table of the node's
//! segment are indexed by local index ([`crate::topology`]). Packets and transfers for
//! ranks of other nodes go to the internode path (`routing.rs`).

use std::collections::VecDeque;
use std::time::Instant;

use gpulmt_handles::CacheStats;
use gpulmt_protocols::engine::{Action, CopyCmd, CopyEngine, Loc};
use gpulmt_protocols::policy::Protocol;
use gpulmt_protocols::wire::Packet;
use gpulmt_protocols::{CopyId, Rank};

use crate::anatomy::{self, Point};
use crate::context::Context;
use crate::device::{CopyTicket, DevId, MemoryKind};
use crate::error::Result;
use crate::mapping::PeerBufferKey;
use crate::shm::job::{contest_reason, PeerStatus};

/// Counters of one rank.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Rendezvous receives per protocol: get, put, coop, shm, self, net.
    pub protocols: [u64; 6],
    pub packets_sent: u64,
    pub packets_received: u64,
    /// Packets that found their ring full and waited in the outbox.
    pub backpressure: u64,
    /// Packets dropped as malformed or out of protocol.
    pub violations: u64,
    pub copies: u64,
    /// Copies found finished by asking a queue's newest first (`GPULMT_POLL_NEWEST`).
    pub probed: u64,
    /// Rendezvous buffers of device memory that no peer can map (managed memory, pools and
    /// VMM memory without a shareable handle type), moved through staging instead.
    pub staged_kinds: u64,
    /// Peer buffers this rank failed to map for a GET, whose messages fell back to SHM
    /// staging (`Engine::on_copy_unmappable`).
    pub open_fallbacks: u64,
    pub cache: CacheStats,
}

impl Stats {
    pub fn protocol_count(&self, p: Protocol) -> u64 {
        self.protocols[protocol_index(p)]
    }
}

fn protocol_index(p: Protocol) -> usize {
    match p {
        Protocol::Get => 0,
        Protocol::Put => 1,
        Protocol::Coop => 2,
        Protocol::Shm => 3,
        Protocol::SelfCopy => 4,
        Protocol::Net => 5,
    }
}

/// Why a copy end did not resolve to an address.
enum Unresolved {
    /// The peer's buffer `buffer_id` could not be mapped (the engine may move the message
    /// another way: `Engine::on_copy_unmappable`).
    Unmappable {
        buffer_id: u64,
        what: String,
    },
    Other(String),
}

impl From<String> for Unresolved {
    fn from(what: String) -> Self {
        Self::Other(what)
    }
}

/// A device copy in flight, and the peer mapping it holds a lease on.
struct InflightCopy {
    id: CopyId,
    ticket: CopyTicket,
    lease: Option<PeerBufferKey>,
}

/// Copies a queue must hold before `GPULMT_POLL_NEWEST` asks its newest first: shorter
/// queues (a lone copy, a trickle) are served as well oldest first, without the extra
/// "not yet" answers.
const PROBE_MIN_QUEUE: usize = 4;

/// The copies in flight on one lane of one engine, oldest first.
pub(crate) struct CopyQueue {
    engine: DevId,
    lane: u32,
    copies: VecDeque<InflightCopy>,
}

impl Context {
    /// Makes progress on everything in flight; returns whether anything happened.
    pub fn progress(&mut self) -> Result<bool> {
        let mut did = self.take_packets();
        did |= self.poll_copies();
        if self.outbox_len > 0 {
            did |= self.flush_outbox();
        }
        if self.offnode.has_path() {
            did |= self.progress_offnode();
        }
        self.run_actions();
        // By count only: a call that did something is usually one a request completes
        // in, and the clock read (50 ns on 2x H200's host) would delay that completion.
        self.polls_since_liveness += 1;
        if self.polls_since_liveness >= 256 {
            self.polls_since_liveness = 0;
            if self.last_liveness.elapsed() >= self.cfg.liveness_interval {
                self.check_liveness();
            }
        }
        Ok(did)
    }

    /// Takes every packet waiting: our own (loopback), then the ring to us of each rank
    /// of the node.
    pub(crate) fn take_packets(&mut self) -> bool {
        let mut did = false;
        while let Some(p) = self.loopback.pop_front() {
            did = true;
            self.on_packet(self.rank(), p);
        }
        let me = self.info.rank as usize;
        for local in 0..self.rx.len() {
            if local != me {
                did |= self.drain_ring(local);
            }
        }
        did
    }

    /// Reads every packet waiting in the ring to us from local index `local`.
    fn drain_ring(&mut self, local: usize) -> bool {
        let ring = self.rx[local];
        let from = self.topo.job_rank_of(local);
        let mut did = false;
        loop {
            // Eager messages a receive is waiting for are copied from the slot into
            // the user's buffer; everything else is decoded for the engine.
            let popped = ring.try_pop(|bytes| {
                anatomy::mark(Point::PacketIn, bytes.get(1).copied().unwrap_or(0));
                // Nothing reads a packet without the sender's next seal (a forged one).
                let bytes = match self.rx_memo[local].open(bytes) {
                    Ok(body) => body,
                    Err(e) => return Some(Err(e)),
                };
                if self.take_eager(from, bytes) {
                    return None;
                }
                Some(Packet::decode_opened(bytes, Some(&mut self.rx_memo[local])))
            });
            match popped {
                Ok(None) => break,
                Ok(Some(None)) => {
                    did = true;
                    self.stats.packets_received += 1;
                }
                Ok(Some(Some(Ok(p)))) => {
                    did = true;
                    self.stats.packets_received += 1;
                    self.on_packet(from, p);
                    anatomy::mark(Point::Probe, anatomy::probe::PACKET_HANDLED);
                }
                Ok(Some(Some(Err(e)))) => {
                    did = true;
                    self.stats.violations += 1;
                    tracing::warn!(peer = from, error = %e, "dropped an undecodable control packet");
                }
                Err(e) => {
                    self.stats.violations += 1;
                    tracing::error!(peer = from, error = %e, "control ring from peer is corrupt; treating the peer as failed");
                    self.peer_failed(from);
                    break;
                }
            }
        }
        did
    }

    pub(crate) fn on_control(&mut self, from: Rank, p: Packet) {
        self.stats.packets_received += 1;
        self.on_packet(from, p);
    }

    fn on_packet(&mut self, from: Rank, p: Packet) {
        match p {
            Packet::FreeMarks { .. } | Packet::FreeAck { .. } => self.on_free_packet(from, p),
            p => self.engine.on_packet(from, p),
        }
        self.run_actions();
    }

    /// Polls device copies; reports finished ones to the engine.
    ///
    /// A lane runs its copies in order, so polling stops at the first unfinished
    /// copy of each queue: with a window of 64 copies in flight a progress call
    /// costs one driver query per lane, not 64. With `GPULMT_POLL_NEWEST` a long
    /// queue's newest copies are asked first (see [`probe_newest`](Self::probe_newest)).
    fn poll_copies(&mut self) -> bool {
        let mut did = false;
        for q in 0..self.inflight.len() {
            if self.cfg.poll_newest && self.inflight[q].copies.len() >= PROBE_MIN_QUEUE {
                did |= self.probe_newest(q);
            }
            while let Some(c) = self.inflight[q].copies.front() {
                anatomy::poll();
                let result = match self.backend.copy_poll(c.ticket) {
                    Ok(false) => break,
                    Ok(true) => Ok(()),
                    Err(e) => Err(e.to_string()),
                };
                let c = self.inflight[q].copies.pop_front().expect("front exists");
                self.copy_finished(c, result);
                did = true;
            }
        }
        did
    }

    /// Asks whether the newest or the second newest copy of queue `q` is done, and
    /// retires the first that is. Every older copy of the queue is then done too, and
    /// the oldest-first loop that follows retires them without driver queries (the
    /// CUDA backend remembers how far each stream has finished). One answer "done"
    /// then serves a whole window: on H200 such an answer costs 1.3-1.5 us of CPU,
    /// against 0.15 us for "not yet", while a 64 KiB copy takes 0.2 us of engine time.
    /// The second newest is asked because the newest was usually queued just before.
    fn probe_newest(&mut self, q: usize) -> bool {
        let n = self.inflight[q].copies.len();
        for i in [n - 1, n - 2] {
            let result = match self.backend.copy_poll(self.inflight[q].copies[i].ticket) {
                Ok(false) => continue,
                Ok(true) => Ok(()),
                Err(e) => Err(e.to_string()),
            };
            // Reported before the older copies: the engine takes completions in any order.
            let c = self.inflight[q].copies.remove(i).expect("index within the queue");
            self.stats.probed += 1;
            self.copy_finished(c, result);
            return true;
        }
        false
    }

    /// Waits until every copy this context started has finished, without telling the
    /// engine: for a context going away, whose copies must not outlive the memory they
    /// touch (the staging chunks of its job segment, its peer mappings, its allocations).
    /// A copy whose poll fails is not waited for further: the backend no longer tracks it.
    pub(crate) fn wait_copies_in_flight(&mut self) {
        let mut leases = Vec::new();
        for q in &mut self.inflight {
            for c in q.copies.drain(..) {
                while let Ok(false) = self.backend.copy_poll(c.ticket) {
                    std::hint::spin_loop();
                }
                leases.push(c.lease);
            }
        }
        for lease in leases {
            self.release_lease(lease);
        }
    }

    /// Reports a copy that left its queue to the engine and releases its mapping lease.
    fn copy_finished(&mut self, c: InflightCopy, result: std::result::Result<(), String>) {
        anatomy::mark(Point::CopyDone, anatomy::take_polls());
        self.engine.on_copy_done(c.id, result);
        // What the copy ends (a GET's DONE, a completion) goes out before anything
        // else is polled: a peer may be waiting for it.
        self.run_actions();
        self.release_lease(c.lease);
    }

    fn release_lease(&mut self, lease: Option<PeerBufferKey>) {
        if let Some(k) = lease {
            if let Err(e) = self.cache.release(&k) {
                tracing::warn!(key = ?k, error = %e, "releasing a peer mapping");
            }
        }
    }

    /// Executes the engine's actions until it has none. Inlined down to the check, which
    /// is all that most passes of a poll loop do here; the loop itself stays out of line.
    #[inline]
    pub(crate) fn run_actions(&mut self) {
        if self.engine.has_actions() {
            self.run_pending_actions();
        }
    }

    #[inline(never)]
    fn run_pending_actions(&mut self) {
        while let Some(a) = self.engine.poll_action() {
            match a {
                Action::Send { to, packet } => self.send_packet(to, packet),
                Action::Copy(c) => self.start_copy(c),
                Action::Deliver { req, payload } => self.write_payload(req.0, &payload),
                Action::Complete { req, result } => {
                    if let Some(st) = self.reqs.get_mut(req.0) {
                        // A failure recorded while delivering wins over the engine's Ok.
                        if !matches!(st.result, Some(Err(_))) {
                            st.result = Some(result);
                        }
                        let _e = st.span.enter();
                        tracing::debug!(protocol = ?st.protocol, ok = st.result.as_ref().is_some_and(|r| r.is_ok()), "complete");
                    }
                }
                Action::Chose { req, peer, len, choice } => {
                    self.stats.protocols[protocol_index(choice.protocol)] += 1;
                    if let Some(st) = self.reqs.get_mut(req.0) {
                        st.protocol = Some(choice.protocol);
                        st.span.record("protocol", tracing::field::display(choice.protocol));
                        let _e = st.span.enter();
                        tracing::debug!(peer, len, protocol = %choice.protocol, reason = choice.reason, "protocol chosen");
                    }
                }
                Action::Unmappable { peer, buffer_id, what } => {
                    self.stats.open_fallbacks += 1;
                    tracing::info!(peer, buffer_id, error = %what, "a peer's buffer could not be mapped: its messages go through shared-memory staging");
                }
                Action::Violation { peer, what } => {
                    self.stats.violations += 1;
                    tracing::warn!(peer, "protocol violation: {what}");
                }
                Action::MapPeer { peer, region } => self.map_offered(peer, region),
                Action::NetSend { id, req, to, xfer, len, pushed } => {
                    self.post_net_send(id, req, to, xfer, len, pushed)
                }
                Action::NetRecv { id, req, from, xfer, len } => self.post_net_recv(id, req, from, xfer, len),
                Action::NetDrain { id, from, xfer, len } => self.post_net_drain(id, from, xfer, len),
                Action::NetCancel { id } => self.cancel_net(id),
            }
        }
    }

    /// Sends an eager packet whose payload is copied from `payload` directly into
    /// the ring slot or, to another node, the internode path's queue (no intermediate
    /// buffer), or via the outbox or the path's backlog when the ring is full or
    /// packets are already waiting for it.
    pub(crate) fn send_eager_in_place(&mut self, to: Rank, msg: u64, tag: i32, payload: &[u8]) {
        use gpulmt_protocols::wire::{eager_overhead, encode_eager_header, SEAL_BYTES};
        let (hdr, end) = (eager_overhead(), eager_overhead() + payload.len());
        let direct = self.direct_ring(to);
        let pushed = match (direct, self.topo.local_of(to)) {
            (Some(ring), Some(local)) => {
                let memo = &mut self.tx_memo[local];
                ring.try_push_with(end + SEAL_BYTES, |slot| {
                    encode_eager_header(slot, msg, tag);
                    slot[hdr..end].copy_from_slice(payload);
                    // As `encode_with` seals every packet of the ring.
                    memo.seal(&mut slot[end..]);
                })
            }
            _ => Ok(false),
        };
        if let Ok(true) = pushed {
            anatomy::mark(Point::PacketOut, 1);
            self.stats.packets_sent += 1;
            return;
        }
        if to != self.rank() && self.topo.local_of(to).is_none() {
            // Another node's: written once, into the internode path's queue.
            return self.send_offnode_with(to, end, &mut |out| {
                encode_eager_header(out, msg, tag);
                out[hdr..].copy_from_slice(payload);
            });
        }
        self.send_packet(to, Packet::Eager { msg, tag, payload: payload.to_vec() });
    }

    /// The ring to job rank `t` when a packet may be written straight into it: `t` shares
    /// this node, the rings carry the control path (no plugin channel) and nothing waits
    /// ahead of it in the outbox. None when it must be queued or routed instead.
    fn direct_ring(&self, t: Rank) -> Option<crate::shm::ring::PacketRing> {
        let local = self.topo.local_of(t)?;
        (self.outbox[t as usize].is_empty() && self.channel.is_none()).then(|| self.tx[local])
    }

    /// Writes an eager payload (already cut to the buffer's length) into a
    /// request's buffer; a failure is recorded as the request's result.
    fn write_payload(&mut self, req: u64, payload: &[u8]) {
        let Some(st) = self.reqs.get(req) else { return };
        let res = match st.kind {
            // SAFETY: the engine delivers at most the buffer's length into the buffer
            // the user lent us for this request.
            MemoryKind::Host => unsafe {
                std::ptr::copy_nonoverlapping(payload.as_ptr(), st.ptr as *mut u8, payload.len());
                Ok(())
            },
            MemoryKind::Device(dev) => {
                anatomy::mark(Point::Probe, anatomy::probe::RECV_PAYLOAD_COPY);
                // SAFETY: as above, in device memory of this backend; irecv's contract keeps
                // the buffer valid and unused until the request completes, which it has not.
                let r = unsafe { self.eager_bounce.write_device(dev, st.ptr, payload) };
                anatomy::mark(Point::Probe, anatomy::probe::RECV_PAYLOAD_WRITTEN);
                r
            }
        };
        if let Err(e) = res {
            tracing::error!(error = %e, "writing an eager payload to device memory");
            if let Some(st) = self.reqs.get_mut(req) {
                st.result = Some(Err(gpulmt_protocols::ProtoError::CopyFailed { what: e.to_string() }));
            }
        }
    }

    /// The eager receive fast path: if `bytes` are an eager packet from `from` that a
    /// posted receive takes, its payload goes from them straight into the receive's buffer
    /// and the receive completes, without decoding the packet for the engine (a payload
    /// allocation and the action queue less). False: not eager, or no receive waits for it.
    pub(crate) fn take_eager(&mut self, from: Rank, bytes: &[u8]) -> bool {
        let Some((_, tag, payload)) = gpulmt_protocols::wire::peek_eager(bytes) else { return false };
        let Some((req, buf, result)) = self.engine.take_eager_match(from, tag, payload.len() as u64) else {
            return false;
        };
        self.deliver_eager(req.0, &payload[..payload.len().min(buf.len as usize)], result);
        true
    }

    /// Eager fast path: writes the payload and completes the request.
    fn deliver_eager(
        &mut self,
        req: u64,
        payload: &[u8],
        result: Result<gpulmt_protocols::Status, gpulmt_protocols::ProtoError>,
    ) {
        if !payload.is_empty() {
            self.write_payload(req, payload);
        }
        if let Some(st) = self.reqs.get_mut(req) {
            if !matches!(st.result, Some(Err(_))) {
                st.result = Some(result);
            }
        }
    }

    /// Queues a packet to a peer: straight into its ring when there is room and
    /// nothing is waiting ahead of it, else into the outbox (FIFO per peer); a peer of
    /// another node's to the internode path.
    pub(crate) fn send_packet(&mut self, to: Rank, p: Packet) {
        if let Some(slot @ None) = &mut self.capture {
            // The RTS always rides the host's matched message; the CTS only where the
            // host carries the control path (else it takes the ring like the rest).
            if matches!(p, Packet::Rts { .. }) || (matches!(p, Packet::Cts { .. }) && self.channel.is_some()) {
                *slot = Some(p.to_vec());
                return;
            }
        }
        if to == self.rank() {
            self.loopback.push_back(p);
            return;
        }
        let Some(local) = self.topo.local_of(to) else {
            return self.send_offnode(to, &p);
        };
        if let Some(ch) = &mut self.channel {
            self.stats.packets_sent += 1;
            ch(to, &p.to_vec());
            return;
        }
        self.stats.packets_sent += 1;
        let t = to as usize;
        let mut kind = 0;
        // The ring's ends keep region memos: every packet to `t` is encoded with its memo,
        // in ring order (the outbox keeps that order), and decoded so by `drain_ring`.
        let direct = self.direct_ring(to);
        let memo = &mut self.tx_memo[local];
        let pushed = direct.map_or(Ok(false), |ring| {
            // The learn form's length bounds what the memo may write.
            ring.try_push_upto(p.encoded_len_with_memo(), |slot| {
                let n = p.encode_with(slot, Some(memo));
                kind = slot[1];
                n
            })
        });
        match pushed {
            Ok(true) => return anatomy::mark(Point::PacketOut, kind),
            Ok(false) => {}
            Err(e) => {
                // The engine never builds packets larger than a slot (eager
                // payloads are bounded by configuration); this is a bug.
                tracing::error!(error = %e, "control packet does not fit a ring slot");
                return;
            }
        }
        self.stats.backpressure += 1;
        self.outbox[t].push_back(p.to_vec_with(Some(&mut self.tx_memo[local])));
        self.outbox_len += 1;
    }

    fn flush_outbox(&mut self) -> bool {
        let mut did = false;
        for local in 0..self.tx.len() {
            let (ring, t) = (self.tx[local], self.topo.job_rank_of(local) as usize);
            while let Some(bytes) = self.outbox[t].front() {
                match ring.try_push(bytes) {
                    Ok(true) => {
                        self.outbox[t].pop_front();
                        self.outbox_len -= 1;
                        did = true;
                    }
                    Ok(false) => break,
                    Err(e) => {
                        tracing::error!(error = %e, "dropping an oversized control packet");
                        self.outbox[t].pop_front();
                        self.outbox_len -= 1;
                    }
                }
            }
        }
        did
    }

    /// Resolves a copy end to an address; Peer ends take a lease on a cached mapping.
    fn resolve(&mut self, loc: Loc, len: u64, lease: &mut Option<PeerBufferKey>) -> Result<usize, Unresolved> {
        match loc {
            Loc::User { req, offset } => {
                let st = self.reqs.get(req.0).ok_or_else(|| format!("copy for unknown request {}", req.0))?;
                if offset + len > st.len as u64 {
                    return Err(format!("copy of {len} bytes at {offset} overruns the {}-byte buffer", st.len).into());
                }
                Ok(st.ptr + offset as usize)
            }
            Loc::Peer { peer, region, offset } => {
                let key = PeerBufferKey { peer, device: region.device, buffer_id: region.buffer_id };
                let handle = crate::device::IpcHandle(region.handle);
                // A refused double open: the peer freed a buffer this process still maps
                // (idle) and its allocator put this one in its place.
                let stale = |e: &crate::device::DeviceError| matches!(e, crate::device::DeviceError::DoubleOpen { .. });
                let m = self.cache.acquire_evicting_on(&key, &handle, region.alloc_size, stale).map_err(|e| {
                    // The opener's own error says why (the cache's names only the key).
                    let why = std::error::Error::source(&e).map_or_else(String::new, |s| format!(" ({s})"));
                    Unresolved::Unmappable {
                        buffer_id: region.buffer_id,
                        what: format!("mapping rank {peer}'s buffer: {e}{why}"),
                    }
                })?;
                *lease = Some(key);
                // The RTS/CTS promised the range lies inside the allocation; check the
                // promise against what the driver actually mapped.
                let end = region.offset + offset + len;
                if end > m.size as u64 || m.size as u64 != region.alloc_size {
                    return Err(format!(
                        "rank {peer}'s region claims {} bytes but the mapping holds {} (needs {end})",
                        region.alloc_size, m.size
                    )
                    .into());
                }
                Ok(m.ptr + (region.offset + offset) as usize)
            }
            Loc::Staging { from: job_from, to: job_to, slot } => {
                let (Some(from), Some(to)) = (self.topo.local_of(job_from), self.topo.local_of(job_to)) else {
                    return Err(format!("staging between ranks {job_from} and {job_to}, not both of this node").into());
                };
                let pair = from * self.tx.len() + to;
                if !self.staging_registered[pair] {
                    let (base, bytes) = self.seg.staging(from, to);
                    // SAFETY: the staging area lies in the job segment, host memory this
                    // context keeps mapped for its whole life, and it waits for its copies
                    // in flight before the segment goes (Drop, finalize).
                    unsafe { self.backend.register_host(base, bytes) }.map_err(|e| Unresolved::Other(e.to_string()))?;
                    self.staging_registered[pair] = true;
                }
                Ok(self.seg.staging_chunk(from, to, slot as usize))
            }
        }
    }

    /// Opens (or finds cached) the mapping of a region a peer offered by RTR. A region
    /// that cannot be mapped is told to the engine, which then never pushes into it.
    /// Without the handle cache a mapping closes when released, so opening one ahead
    /// would only cost an open and a close.
    fn map_offered(&mut self, peer: Rank, region: gpulmt_protocols::wire::Region) {
        if !self.cfg.handle_cache {
            return;
        }
        let mut lease = None;
        let loc = Loc::Peer { peer, region, offset: 0 };
        match self.resolve(loc, 0, &mut lease) {
            Ok(_) => {}
            // No send will push into it (the engine remembers it and reports it once).
            Err(Unresolved::Unmappable { buffer_id, what }) => self.engine.on_peer_unmappable(peer, buffer_id, what),
            Err(Unresolved::Other(what)) => {
                tracing::warn!(peer, error = %what, "mapping a receive buffer the peer offered")
            }
        }
        self.release_lease(lease);
    }

    fn start_copy(&mut self, c: CopyCmd) {
        anatomy::mark(Point::CopyIssue, 0);
        anatomy::take_polls();
        self.stats.copies += 1;
        let mut lease = None;
        // Only where debug spans are on: otherwise the copy's issue path reads no counters.
        let opens_before = tracing::enabled!(tracing::Level::DEBUG).then(|| self.cache.open_counters());
        let ends =
            self.resolve(c.src, c.len, &mut lease).and_then(|s| self.resolve(c.dst, c.len, &mut lease).map(|d| (s, d)));
        if let (Some(key), Some(before)) = (&lease, opens_before) {
            self.record_cache_outcome(&c, key, before);
        }
        let (src, dst) = match ends {
            Ok(v) => v,
            Err(Unresolved::Unmappable { buffer_id, what }) => {
                self.release_lease(lease);
                self.engine.on_copy_unmappable(c.id, buffer_id, what);
                return;
            }
            Err(Unresolved::Other(what)) => {
                self.release_lease(lease);
                self.engine.on_copy_done(c.id, Err(what));
                return;
            }
        };
        match c.engine {
            CopyEngine::Host => {
                // SAFETY: both ends were resolved to live buffers of at least `len`
                // bytes; they belong to different requests or processes, so they do
                // not overlap.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, c.len as usize) };
                self.release_lease(lease);
                self.engine.on_copy_done(c.id, Ok(()));
            }
            // SAFETY: both ends were resolved to ranges of at least `len` bytes that stay
            // valid until the copy is seen finished: a request's buffer by isend/irecv's
            // contract (the request completes only after this copy), a peer mapping by the
            // lease held until then, a staging chunk by the job segment this context keeps
            // mapped, and waits for its copies in flight before it goes.
            CopyEngine::Device(d) => match unsafe { self.backend.copy_async(d, c.lane, dst, src, c.len as usize) } {
                Ok(ticket) => {
                    anatomy::mark(Point::CopyIssued, 0);
                    let copy = InflightCopy { id: c.id, ticket, lease };
                    match self.inflight.iter_mut().find(|q| q.engine == d && q.lane == c.lane) {
                        Some(q) => q.copies.push_back(copy),
                        None => {
                            self.inflight.push(CopyQueue { engine: d, lane: c.lane, copies: VecDeque::from([copy]) })
                        }
                    }
                }
                Err(e) => {
                    self.release_lease(lease);
                    self.engine.on_copy_done(c.id, Err(e.to_string()));
                }
            },
        }
    }

    /// Records on the span of the request a copy serves whether its peer mapping came
    /// from the handle cache or was opened (and how long the open took).
    fn record_cache_outcome(&self, c: &CopyCmd, key: &PeerBufferKey, (misses, nanos): (u64, u64)) {
        let (misses_now, nanos_now) = self.cache.open_counters();
        let opened = misses_now > misses;
        let open_us = (nanos_now - nanos) as f64 / 1e3;
        if opened {
            tracing::debug!(
                peer = key.peer,
                device = key.device,
                buffer_id = key.buffer_id,
                open_us,
                "opened a peer IPC mapping"
            );
        }
        let served = [c.src, c.dst].into_iter().find_map(|l| match l {
            Loc::User { req, .. } => self.reqs.get(req.0),
            _ => None,
        });
        if let Some(st) = served {
            st.span.record("ipc_cache", if opened { "miss" } else { "hit" });
            if opened {
                st.span.record("ipc_open_us", open_us);
            }
        }
    }

    /// Checks every other rank of the node; a failed or finalized one's transfers fail.
    /// (The internode path reports the ranks of other nodes.)
    fn check_liveness(&mut self) {
        self.last_liveness = Instant::now();
        let me = self.info.rank as usize;
        if let Some(pid) = self.seg.contested() {
            self.job_contested(pid);
            return;
        }
        self.dead_peers.poll(self.last_liveness);
        for local in 0..self.rx.len() {
            let r = self.topo.job_rank_of(local);
            if local == me || self.engine.is_peer_failed(r) {
                continue;
            }
            match self.seg.peer_status(local) {
                PeerStatus::Alive | PeerStatus::Unknown => {}
                status @ (PeerStatus::Finalized | PeerStatus::Failed) => {
                    // What it sent before it went is in its ring: take it first.
                    self.drain_ring(local);
                    self.peer_failed(r);
                    if status == PeerStatus::Failed {
                        // Under mpirun nobody else may remove what it left before the
                        // next job starts.
                        self.dead_peers.peer_died(self.seg.rank_pid(local), self.last_liveness);
                    }
                }
            }
        }
    }

    /// Another job with this job's id started beside it ([`JobSegment::mark_contested`]):
    /// every local peer may be a stranger, so transfers with all of them fail.
    fn job_contested(&mut self, pid: u32) {
        let me = self.info.rank as usize;
        let peers: Vec<Rank> = (0..self.rx.len())
            .filter(|&l| l != me)
            .map(|l| self.topo.job_rank_of(l))
            .filter(|&r| !self.engine.is_peer_failed(r))
            .collect();
        if peers.is_empty() {
            return;
        }
        tracing::error!("{}", contest_reason(pid, &self.info.job));
        for r in peers {
            self.peer_failed(r);
        }
    }

    pub(crate) fn peer_failed(&mut self, r: Rank) {
        if self.engine.is_peer_failed(r) {
            return;
        }
        tracing::warn!(peer = r, "peer failed or exited: failing its transfers");
        self.engine.on_peer_failed(r);
        self.outbox_len -= self.outbox[r as usize].len();
        self.outbox[r as usize].clear();
        // Its control packets waiting for the internode path will never be wanted; its
        // waiting transfers end through the engine's cancels (run below).
        self.offnode.drop_ctrl_to(r);
        // Its mappings stay until our copies on them finish (leases), then close.
        self.cache.invalidate_where(|k| k.peer == r);
        self.free_peer_failed(r);
        self.run_actions();
    }
}
