//! The proxy's side of the network: the interface, the staging resources, the registry of
//! network operations in flight (who owns each [`ReqId`]), and the pools of receives kept
//! posted for messages from any rank.

use gpulmt_protocols::gio::{BadPacket, OpCode};
use gpulmt_protocols::Rank;
use rustc_hash::FxHashMap;

use crate::device::{Backend, MemoryKind};
use crate::net::iface::{Arrival, IfaceCaps, NetFail, NetIface, ReqId, Status};
use crate::net::profile::StageProfile;
use crate::net::stream::{BouncePool, Io, PieceReqs, Pipeline, Place};
use crate::net::wire::{DataTags, POOL_BUFFER};

/// Who a network operation belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Owner {
    /// Piece `piece` of the transfer of op (or target op) `key`.
    Piece { key: u64, piece: u64 },
    /// The one message of op `key` (a control packet, a one-sided request).
    Message { key: u64 },
    /// Slot `slot` of receive pool `pool`.
    Pool { pool: usize, slot: usize },
    /// A reply to another rank's one-sided request; its buffer is in `Net::replies`.
    Reply,
}

/// The proxy's network and staging resources.
pub(super) struct Net {
    pub iface: Box<dyn NetIface>,
    pub backend: Backend,
    pub bounce: BouncePool,
    pub caps: IfaceCaps,
    pub tags: DataTags,
    pub pipe: Pipeline,
    next_req: ReqId,
    pub owners: FxHashMap<ReqId, Owner>,
    /// Operations answered `Done` when posted, reported with the next progress.
    pub done_now: Vec<(ReqId, Result<Arrival, NetFail>)>,
    /// Reply messages in flight and their bytes.
    pub replies: FxHashMap<ReqId, Vec<u8>>,
    /// Where the staging pipelines' time goes (logged at exit).
    pub profile: StageProfile,
}

impl Net {
    pub fn new(iface: Box<dyn NetIface>, backend: Backend, chunk: u64, depth: u32) -> Net {
        let caps = iface.caps();
        let bounce = BouncePool::new(backend.clone(), chunk as usize, 4 * depth as usize);
        Net {
            iface,
            backend,
            bounce,
            caps,
            tags: DataTags::new(caps.max_tag),
            pipe: Pipeline { chunk, depth },
            next_req: 1,
            owners: FxHashMap::default(),
            done_now: Vec::new(),
            replies: FxHashMap::default(),
            profile: StageProfile::default(),
        }
    }

    pub fn register(&mut self, owner: Owner) -> ReqId {
        let req = self.next_req;
        self.next_req += 1;
        self.owners.insert(req, owner);
        req
    }

    /// Runs `f` with the I/O a transfer of op `key` needs.
    pub fn with_io<R>(&mut self, key: u64, f: impl FnOnce(&mut Io<'_>) -> R) -> R {
        let Net { iface, backend, bounce, next_req, owners, profile, .. } = self;
        let mut reqs = KeyReqs { next: next_req, owners, key };
        f(&mut Io { iface: &mut **iface, backend, bounce, reqs: &mut reqs, profile })
    }

    /// How the local range `addr..addr + len` moves: direct for host memory (and device
    /// memory under a CUDA-aware MPI), staged through its device's engine otherwise. A
    /// device range that leaves its allocation is a bad packet: nothing is read or
    /// written out of bounds.
    pub fn place(&self, op: OpCode, addr: u64, len: u64) -> Result<(Place, MemoryKind), BadPacket> {
        let bad = BadPacket::BadAddress { op, addr, size: len };
        let info = self.backend.pointer_info(addr as usize).map_err(|_| bad)?;
        Ok((self.place_of(info.kind), info.kind)).and_then(|p| match info.kind {
            MemoryKind::Host => Ok(p),
            MemoryKind::Device(_) => {
                let end = (addr as usize).checked_add(len as usize).ok_or(bad)?;
                match end <= info.base + info.size {
                    true => Ok(p),
                    false => Err(bad),
                }
            }
        })
    }

    /// How memory of `kind` moves.
    pub fn place_of(&self, kind: MemoryKind) -> Place {
        match kind {
            MemoryKind::Device(dev) if !self.caps.device_memory => Place::Staged(dev),
            _ => Place::Direct,
        }
    }

    /// Sends the proxy-owned bytes `msg` (which stay put until reported) as one message;
    /// `Done` answers are queued for the next progress, so the owner sees one path.
    pub fn send(&mut self, owner: Owner, to: Rank, tag: i32, msg: &[u8]) -> Result<Option<ReqId>, NetFail> {
        let req = self.register(owner);
        crate::anatomy::mark(crate::anatomy::Point::Probe, crate::anatomy::probe::NET_SEND_CALL);
        // SAFETY: `msg` is owned by the op (or `replies`) that `owner` names, which keeps
        // it unmoved and unmodified until this request is reported.
        let status = unsafe { self.iface.ep_send(req, to, tag, msg.as_ptr() as usize, msg.len()) };
        if matches!(status, Ok(Status::Done(()) | Status::InProgress)) {
            crate::anatomy::mark(crate::anatomy::Point::NetIssued, 0);
        }
        self.posted(
            req,
            status.map(|s| match s {
                Status::Done(()) => Status::Done(Arrival { source: to, len: 0 }),
                Status::InProgress => Status::InProgress,
                Status::NoResource => Status::NoResource,
            }),
        )
    }

    /// Posts a receive into `buf..buf + len` for `owner`.
    ///
    /// # Safety
    /// The range stays writable and unused by anyone else until the request is reported.
    pub unsafe fn recv(
        &mut self,
        owner: Owner,
        from: Option<Rank>,
        tag: i32,
        buf: usize,
        len: usize,
    ) -> Result<Option<ReqId>, NetFail> {
        let req = self.register(owner);
        // SAFETY: this function's contract.
        let status = unsafe { self.iface.ep_recv(req, from, tag, buf, len) };
        self.posted(req, status)
    }

    fn posted(&mut self, req: ReqId, status: Result<Status<Arrival>, NetFail>) -> Result<Option<ReqId>, NetFail> {
        match status {
            Ok(Status::InProgress) => Ok(Some(req)),
            Ok(Status::Done(a)) => {
                self.done_now.push((req, Ok(a)));
                Ok(Some(req))
            }
            Ok(Status::NoResource) => {
                self.owners.remove(&req);
                Ok(None)
            }
            Err(e) => {
                self.owners.remove(&req);
                Err(e)
            }
        }
    }
}

/// The pieces of op `key` name their network operations in the proxy's registry.
struct KeyReqs<'a> {
    next: &'a mut ReqId,
    owners: &'a mut FxHashMap<ReqId, Owner>,
    key: u64,
}

impl PieceReqs for KeyReqs<'_> {
    fn register(&mut self, piece: u64) -> ReqId {
        let req = *self.next;
        *self.next += 1;
        self.owners.insert(req, Owner::Piece { key: self.key, piece });
        req
    }

    fn forget(&mut self, req: ReqId) {
        self.owners.remove(&req);
    }
}

/// Which pool a message arrived in.
pub(super) const POOL_CTRL: usize = 0;
pub(super) const POOL_AM: usize = 1;
pub(super) const POOL_REPLY: usize = 2;

/// Receives kept posted for messages from any rank under one tag.
///
/// A pool may start **small**: one receive posted instead of all its slots, until
/// [`grow`](Self::grow). Every posted receive is tested in every proxy round (one
/// `MPI_Testsome` over them all), and 96 of them cost an 8 B hand-off 0.25-0.35 us more
/// than one did (`lab/gpu/proxy_floor.c` on 2x H200's host), so the one-sided pools stay
/// at one receive while the rank uses no windows. One is enough for correctness: a message
/// is never lost for want of a posted receive, MPI holds it until one is.
pub(super) struct Pool {
    pub tag: i32,
    /// The buffers of the slots kept posted (a small pool has one until it grows).
    bufs: Vec<Box<[u8]>>,
    /// The request of each slot while posted.
    posted: Vec<Option<ReqId>>,
    /// Slots once grown.
    slots: usize,
}

impl Pool {
    /// A pool of `slots` receives, all kept posted.
    pub fn new(tag: i32, slots: usize) -> Pool {
        let mut pool = Pool::small(tag, slots);
        pool.grow();
        pool
    }

    /// A pool of `slots` receives of which one is kept posted until [`grow`](Self::grow),
    /// with one buffer: a job that never uses a window never pays for the others.
    pub fn small(tag: i32, slots: usize) -> Pool {
        let mut pool = Pool { tag, bufs: Vec::new(), posted: Vec::new(), slots };
        pool.add_slots(slots.min(1));
        pool
    }

    /// Keeps every slot posted from the next refill on; whether it was small.
    pub fn grow(&mut self) -> bool {
        let was_small = self.bufs.len() < self.slots;
        self.add_slots(self.slots);
        was_small
    }

    /// Slots (buffers, none posted yet) up to `n`. The slots before stay where they are:
    /// each buffer is an allocation of its own, which a posted receive points into.
    fn add_slots(&mut self, n: usize) {
        while self.bufs.len() < n {
            self.bufs.push(vec![0u8; POOL_BUFFER].into_boxed_slice());
            self.posted.push(None);
        }
    }

    /// Posts every slot not posted; stops at the first refusal. Returns whether every slot
    /// is posted now, or an error the proxy logs (the slot is retried next round).
    pub fn refill(&mut self, pool: usize, net: &mut Net) -> Result<bool, NetFail> {
        for slot in 0..self.bufs.len() {
            if self.posted[slot].is_some() {
                continue;
            }
            let buf = self.bufs[slot].as_mut_ptr() as usize;
            // SAFETY: the slot's buffer is the pool's, unused until its request is
            // reported (the pool is dropped only after its requests ended, or leaked).
            match unsafe { net.recv(Owner::Pool { pool, slot }, None, self.tag, buf, POOL_BUFFER) }? {
                Some(req) => self.posted[slot] = Some(req),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The bytes of slot `slot`'s arrival; the slot counts as free again.
    pub fn arrived(&mut self, slot: usize, len: usize) -> &[u8] {
        self.posted[slot] = None;
        &self.bufs[slot][..len.min(POOL_BUFFER)]
    }

    /// Cancels every posted receive (shutdown).
    pub fn cancel(&self, net: &mut Net) {
        for req in self.posted.iter().flatten() {
            net.iface.ep_cancel(*req);
        }
    }

    /// Receives still posted.
    pub fn outstanding(&self) -> usize {
        self.posted.iter().flatten().count()
    }

    /// Keeps the buffers of receives the library never released from being freed.
    pub fn leak_if_outstanding(self) {
        if self.outstanding() > 0 {
            std::mem::forget(self.bufs);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pool;

    /// A small pool holds one buffer until it grows, then every slot's; growing twice is
    /// growing once.
    #[test]
    fn a_small_pool_allocates_its_other_buffers_when_it_grows() {
        let mut p = Pool::small(2, 32);
        assert_eq!((p.bufs.len(), p.posted.len(), p.outstanding()), (1, 1, 0));
        assert!(p.grow(), "it was small");
        assert_eq!((p.bufs.len(), p.posted.len()), (32, 32));
        assert!(!p.grow(), "it had grown already");
        assert_eq!(p.bufs.len(), 32);
        let full = Pool::new(1, 8);
        assert_eq!(full.bufs.len(), 8);
        assert_eq!(Pool::small(3, 0).bufs.len(), 0, "no slots, no buffer");
    }
}
