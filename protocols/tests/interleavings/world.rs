//! The model the interleaving tests drive engines over: each rank's memory and node, the
//! control channels between ranks (FIFO per directed pair, as a ring or MPI's order per
//! source and tag keeps them), the copies and network transfers in flight, and the
//! [`Schedule`] that picks which of them goes next. It executes every action the engines
//! emit and checks on the way what must hold whatever the order: no engine reaches
//! memory it cannot, no write into a completed receive, no staging slot used twice at
//! once, nothing but eager, RTS(net), CTS(net) and ABORT between nodes (no region, copy,
//! staging or mapping across them), a network receive posted before its CTS, and no
//! request completed while its network transfer is outstanding.
//!
//! Network transfers model MPI: a send moves its data once the matching receive (same
//! pair and transfer id) is posted, and completes then; a receive completes once its
//! data landed. A cancelled transfer ends with an error unless it completed first (for a
//! send the schedule picks which), one with a dead peer ends with an error, and one of a
//! request in `net_faults` fails at any moment (a send then moves nothing).

use std::collections::{HashMap, HashSet, VecDeque};

use gpulmt_protocols::engine::{Action, BufDesc, CopyCmd, CopyEngine, Engine, EngineConfig, Loc};
use gpulmt_protocols::policy::{Protocol, ProtocolOverride};
use gpulmt_protocols::wire::{CtsMode, MemDesc, Packet, Region};
use gpulmt_protocols::{CopyId, MsgId, NetId, ProtoError, Rank, ReqId, Status, Tag};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng};

/// The scheduler's choices: at each step, which ready packet or copy goes next.
#[derive(Debug)]
pub enum Schedule {
    /// Drawn by proptest ([`schedule`]): one pick per choice (the candidate at the pick
    /// modulo their number), then, once they run out, always the first candidate (the
    /// lowest directed pair's packet, else the oldest copy). Shrinking shortens the
    /// picks and moves them towards 0, the first candidate.
    Drawn { picks: Vec<u8>, next: usize },
    /// The fixed tests' order: pseudo-random without end, the same for the same seed.
    Seeded(Box<TestRng>),
}

impl Schedule {
    pub fn seeded(seed: u64) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        Schedule::Seeded(Box::new(TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)))
    }

    /// Which of `n` candidates goes next.
    pub fn pick(&mut self, n: usize) -> usize {
        match self {
            Schedule::Drawn { picks, next } => {
                let pick = picks.get(*next).map_or(0, |&p| p as usize % n);
                *next += 1;
                pick
            }
            Schedule::Seeded(rng) => (rng.next_u64() % n as u64) as usize,
        }
    }
}

/// Most picks a drawn schedule holds. An all-to-all run takes a few hundred (about 230
/// typically, 550 at most), so most drawn schedules stay random to the end and the
/// rest end first-come.
const SCHEDULE_PICKS: usize = 1500;

/// A scheduler's picks, as proptest draws and shrinks them. (A byte per pick: rarely
/// more than a few dozen candidates are ready at once, and small values shrink fast.)
pub fn schedule() -> impl Strategy<Value = Schedule> {
    prop::collection::vec(any::<u8>(), 0..SCHEDULE_PICKS).prop_map(|picks| Schedule::Drawn { picks, next: 0 })
}

/// The property tests' configuration: `cases` random cases, and on failure enough
/// shrinking to delete and minimise hundreds of picks (the default budget, 4 per case,
/// would stop long before; it costs nothing unless a case fails).
pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, max_shrink_iters: 20_000, max_shrink_time: 120_000, ..ProptestConfig::default() }
}

/// One rank's buffers: allocation bytes, and where the request's buffer starts.
#[derive(Default)]
struct Memory {
    pub allocs: HashMap<ReqId, (Vec<u8>, u64)>,
}

pub struct World {
    pub engines: Vec<Engine>,
    mem: Vec<Memory>,
    /// Packets in flight per directed pair, FIFO as the rings are.
    pub wires: HashMap<(Rank, Rank), VecDeque<Packet>>,
    /// Copies started and not finished, per rank.
    pub copies: Vec<Vec<CopyCmd>>,
    pub staging: HashMap<(Rank, Rank, u32), Vec<u8>>,
    pub done: HashMap<(Rank, ReqId), Result<Status, ProtoError>>,
    pub chosen: HashMap<(Rank, ReqId), Protocol>,
    /// The device of each request's buffer (None: host).
    pub devices: HashMap<(Rank, ReqId), Option<u32>>,
    /// Per rank: offered regions it was asked to map.
    pub mapped: Vec<u32>,
    pub schedule: Schedule,
    pub chunk: u64,
    pub dead: Vec<bool>,
    /// Each rank's node.
    pub nodes: Vec<u32>,
    /// Network transfers posted and not reported done, in the order posted.
    pub nets: Vec<NetOp>,
    /// Network receives ever posted: (receiver, sender, transfer).
    pub net_recvs_posted: HashSet<(Rank, Rank, MsgId)>,
    /// Requests whose network transfer fails (at any time; a send then moves nothing).
    pub net_faults: HashSet<(Rank, ReqId)>,
    /// Pushed messages, (sender, message), from their RTS on: none may get a CTS.
    pub pushed: HashSet<(Rank, MsgId)>,
    /// CTS(net) packets sent.
    pub net_cts: usize,
    /// Peer buffers a rank cannot map, (mapper, owner, owner's request): a copy through
    /// one is reported unmappable and moves nothing.
    pub unmappable: HashSet<(Rank, Rank, ReqId)>,
    /// Unmappable buffers the engines reported: (mapper, owner, buffer id).
    pub fell_back: Vec<(Rank, Rank, u64)>,
    /// Ranks every copy of which fails (moving nothing).
    pub copy_faults: HashSet<Rank>,
}

/// A network transfer (one side's) in flight.
#[derive(Clone, Debug)]
pub struct NetOp {
    pub rank: Rank,
    pub id: NetId,
    pub req: ReqId,
    pub peer: Rank,
    pub xfer: MsgId,
    pub len: u64,
    pub send: bool,
    /// The engine asked to end it (NetCancel).
    pub cancelled: bool,
    /// A receive: the data is in its buffer.
    pub landed: bool,
    /// A receive that drops its data (NetDrain); its `req` is [`DRAIN_REQ`].
    pub drain: bool,
}

/// The request of a drain, which has none.
pub const DRAIN_REQ: ReqId = ReqId(u64::MAX);

/// The eager limit between nodes in the model: between the on-node limits (16 for
/// device memory, 64 for host), so each size class shows which limit applies.
pub const NET_EAGER_LIMIT: u64 = 48;

pub fn region(owner: Rank, req: ReqId, alloc_len: u64, offset: u64, device: u32) -> Region {
    let mut handle = [0u8; gpulmt_protocols::wire::HANDLE_BYTES];
    handle[..4].copy_from_slice(&owner.to_le_bytes());
    handle[4..12].copy_from_slice(&req.0.to_le_bytes());
    Region { handle, alloc_size: alloc_len, offset, device, node: 0, buffer_id: req.0 }
}

impl World {
    pub fn new(n: u32, schedule: Schedule, mode: ProtocolOverride, coop_min: u64, devices: u32, peer: bool) -> Self {
        Self::with_nodes(vec![0; n as usize], schedule, mode, coop_min, devices, peer)
    }

    /// A world whose rank r is on node `nodes[r]`.
    pub fn with_nodes(
        nodes: Vec<u32>,
        schedule: Schedule,
        mode: ProtocolOverride,
        coop_min: u64,
        devices: u32,
        peer: bool,
    ) -> Self {
        let n = nodes.len() as u32;
        let chunk = 4096;
        let engines = (0..n)
            .map(|r| {
                let mut c = EngineConfig::new(r, n, devices);
                c.on_node = nodes.iter().map(|m| *m == nodes[r as usize]).collect();
                c.net_eager_limit = NET_EAGER_LIMIT;
                c.eager_limit = 64;
                c.device_eager_limit = 16;
                c.chunk_size = chunk;
                c.depth = 3;
                c.copy_split = 5000;
                c.lanes = 2;
                c.policy.mode = mode;
                c.policy.coop_min = coop_min;
                if mode == ProtocolOverride::Auto {
                    c.rtr_put_max = 40_000;
                    // Windows from one sender spread over both engines (a lone
                    // message still takes GET, which `expected` relies on).
                    c.policy.balance_max = 40_000;
                }
                if !peer {
                    c.peer_access = (0..devices * devices).map(|i| i / devices == i % devices).collect();
                }
                Engine::new(c)
            })
            .collect();
        World {
            engines,
            mem: (0..n).map(|_| Memory::default()).collect(),
            wires: HashMap::new(),
            copies: (0..n).map(|_| Vec::new()).collect(),
            staging: HashMap::new(),
            done: HashMap::new(),
            chosen: HashMap::new(),
            devices: HashMap::new(),
            mapped: vec![0; n as usize],
            schedule,
            chunk,
            dead: vec![false; n as usize],
            nodes,
            nets: Vec::new(),
            net_recvs_posted: HashSet::new(),
            net_faults: HashSet::new(),
            pushed: HashSet::new(),
            net_cts: 0,
            unmappable: HashSet::new(),
            fell_back: Vec::new(),
            copy_faults: HashSet::new(),
        }
    }

    /// The same world with every engine pushing network rendezvous of at most `max`
    /// bytes, `sends` at a time (`EngineConfig::net_push_max`, `net_push_sends`); before
    /// any traffic.
    pub fn net_push(mut self, max: u64, sends: u32) -> Self {
        assert!(self.wires.is_empty() && self.nets.is_empty(), "set before any traffic");
        for e in &mut self.engines {
            let mut c = e.config().clone();
            (c.net_push_max, c.net_push_sends) = (max, sends);
            *e = Engine::new(c);
        }
        self
    }

    pub fn on_node(&self, a: Rank, b: Rank) -> bool {
        self.nodes[a as usize] == self.nodes[b as usize]
    }

    pub fn buf(&mut self, rank: Rank, req: ReqId, data: Vec<u8>, offset: u64, device: Option<u32>) -> BufDesc {
        let len = data.len() as u64;
        let mut alloc = vec![0xEE; (offset + len + 3) as usize];
        alloc[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        let alloc_len = alloc.len() as u64;
        self.mem[rank as usize].allocs.insert(req, (alloc, offset));
        self.devices.insert((rank, req), device);
        BufDesc { len, device, region: device.map(|d| region(rank, req, alloc_len, offset, d)) }
    }

    pub fn user(&self, rank: Rank, req: ReqId) -> &[u8] {
        let (a, off) = &self.mem[rank as usize].allocs[&req];
        &a[*off as usize..]
    }

    pub fn send(&mut self, rank: Rank, req: ReqId, to: Rank, tag: Tag, data: Vec<u8>, dev: Option<u32>) {
        let payload = data.clone();
        let b = self.buf(rank, req, data, 5, dev);
        let e = &mut self.engines[rank as usize];
        let p = e.is_eager_to(to, b.len, b.device.is_some()).then_some(payload);
        e.post_send(req, to, tag, b, p);
        self.drain(rank);
    }

    pub fn recv(&mut self, rank: Rank, req: ReqId, from: Option<Rank>, tag: Option<Tag>, len: usize, dev: Option<u32>) {
        let b = self.buf(rank, req, vec![0; len], 3, dev);
        self.engines[rank as usize].post_recv(req, from, tag, b);
        self.drain(rank);
    }

    /// Executes a rank's actions; copies and packets are queued for the scheduler.
    pub fn drain(&mut self, rank: Rank) {
        // Each network send's form, checked once the call's actions are in: a pushed
        // send's RTS and its network send come together, device data's send first.
        let mut forms = Vec::new();
        while let Some(a) = self.engines[rank as usize].poll_action() {
            match a {
                Action::Send { to, packet } => {
                    self.check_packet_fits_the_path(rank, to, &packet);
                    // Exercise the encoding on every packet.
                    let bytes = packet.to_vec();
                    let back = Packet::decode(&bytes).expect("own packets decode");
                    self.wires.entry((rank, to)).or_default().push_back(back);
                }
                Action::Copy(c) => {
                    self.check_copy_stays_on_node(rank, &c);
                    self.check_engine_reaches_both_ends(rank, &c);
                    self.check_staging_conflicts(&c);
                    self.copies[rank as usize].push(c);
                }
                Action::Deliver { req, payload } => {
                    let (a, off) = self.mem[rank as usize].allocs.get_mut(&req).unwrap();
                    a[*off as usize..*off as usize + payload.len()].copy_from_slice(&payload);
                }
                Action::Complete { req, result } => {
                    let outstanding = self.nets.iter().find(|o| o.rank == rank && o.req == req);
                    assert!(outstanding.is_none(), "rank {rank} completed {req:?} with {outstanding:?} outstanding");
                    assert!(self.done.insert((rank, req), result).is_none(), "rank {rank} {req:?} completed twice");
                }
                Action::Chose { req, choice, .. } => {
                    self.chosen.insert((rank, req), choice.protocol);
                }
                Action::Violation { peer, what } => panic!("rank {rank}: violation by {peer}: {what}"),
                Action::Unmappable { peer, buffer_id, .. } => self.fell_back.push((rank, peer, buffer_id)),
                Action::NetRecv { id, req, from, xfer, len } => {
                    assert!(!self.on_node(rank, from), "rank {rank}: network receive from {from}, on its node");
                    assert!(len <= self.buf_len(rank, req), "rank {rank}: network receive past {req:?}'s buffer");
                    assert!(self.net_recvs_posted.insert((rank, from, xfer)), "transfer {xfer} received twice");
                    let (send, cancelled, landed, drain) = (false, false, false, false);
                    let op = NetOp { rank, id, req, peer: from, xfer, len, send, cancelled, landed, drain };
                    self.nets.push(op);
                }
                Action::NetDrain { id, from, xfer, len } => {
                    assert!(!self.on_node(rank, from), "rank {rank}: network drain from {from}, on its node");
                    assert!(self.net_recvs_posted.insert((rank, from, xfer)), "transfer {xfer} received twice");
                    let (send, cancelled, landed, drain) = (false, false, false, true);
                    let op = NetOp { rank, id, req: DRAIN_REQ, peer: from, xfer, len, send, cancelled, landed, drain };
                    self.nets.push(op);
                }
                Action::NetSend { id, req, to, xfer, len, pushed } => {
                    forms.push((xfer, pushed));
                    assert!(!self.on_node(rank, to), "rank {rank}: network send to {to}, on its node");
                    assert_eq!(len, self.buf_len(rank, req), "rank {rank}: network send of part of {req:?}");
                    let (send, cancelled, landed, drain) = (true, false, false, false);
                    let op = NetOp { rank, id, req, peer: to, xfer, len, send, cancelled, landed, drain };
                    self.nets.push(op);
                }
                Action::NetCancel { id } => {
                    let op = self.nets.iter_mut().find(|o| o.rank == rank && o.id == id);
                    let op = op.unwrap_or_else(|| panic!("rank {rank}: cancel of {id:?}, not outstanding"));
                    assert!(!op.cancelled, "rank {rank}: {id:?} cancelled twice");
                    op.cancelled = true;
                }
                Action::MapPeer { peer, region } => {
                    assert_ne!(peer, rank);
                    assert!(self.on_node(rank, peer), "rank {rank} maps a region of {peer}, on another node");
                    self.mapped[rank as usize] += 1;
                    assert!(self.mem[peer as usize]
                        .allocs
                        .contains_key(&ReqId(u64::from_le_bytes(region.handle[4..12].try_into().unwrap()))));
                }
            }
        }
        for (xfer, pushed) in forms {
            assert_eq!(pushed, self.pushed.contains(&(rank, xfer)), "rank {rank}: send {xfer}'s form");
        }
    }

    fn read(&self, rank: Rank, loc: Loc, len: u64) -> Vec<u8> {
        let (owner, req, off) = match loc {
            Loc::User { req, offset } => (rank, req, offset),
            Loc::Peer { peer, region, offset } => {
                let req = ReqId(u64::from_le_bytes(region.handle[4..12].try_into().unwrap()));
                assert_eq!(peer, u32::from_le_bytes(region.handle[..4].try_into().unwrap()));
                return self.mem[peer as usize].allocs[&req].0
                    [(region.offset + offset) as usize..(region.offset + offset + len) as usize]
                    .to_vec();
            }
            Loc::Staging { from, to, slot } => {
                let s = self.staging.get(&(from, to, slot)).expect("staging slot filled before drained");
                assert!(s.len() as u64 >= len);
                return s[..len as usize].to_vec();
            }
        };
        self.user(owner, req)[off as usize..(off + len) as usize].to_vec()
    }

    fn write(&mut self, rank: Rank, loc: Loc, data: &[u8]) {
        let (owner, req, abs) = match loc {
            Loc::User { req, offset } => {
                let off = self.mem[rank as usize].allocs[&req].1;
                (rank, req, off + offset)
            }
            Loc::Peer { peer, region, offset } => {
                let req = ReqId(u64::from_le_bytes(region.handle[4..12].try_into().unwrap()));
                (peer, req, region.offset + offset)
            }
            Loc::Staging { from, to, slot } => {
                assert!(data.len() as u64 <= self.chunk);
                self.staging.insert((from, to, slot), data.to_vec());
                return;
            }
        };
        let a = &mut self.mem[owner as usize].allocs.get_mut(&req).unwrap().0;
        a[abs as usize..abs as usize + data.len()].copy_from_slice(data);
    }

    /// Bytes of request `req`'s buffer.
    fn buf_len(&self, rank: Rank, req: ReqId) -> u64 {
        let (a, off) = &self.mem[rank as usize].allocs[&req];
        a.len() as u64 - off - 3
    }

    /// Between nodes only what the NET rendezvous exchanges, and never a region: eager,
    /// RTS(net), CTS(net) after its network receive was posted and never for a pushed
    /// message, ABORT. Within a node, never RTS(net) or CTS(net).
    fn check_packet_fits_the_path(&mut self, rank: Rank, to: Rank, p: &Packet) {
        let net = match p {
            Packet::Rts { src: MemDesc::Net { pushed }, msg, .. } => {
                if *pushed {
                    self.pushed.insert((rank, *msg));
                }
                true
            }
            Packet::Cts { mode: CtsMode::Net, dst, msg, .. } => {
                assert!(dst.is_none(), "rank {rank}: region in a CTS(net)");
                assert!(!self.pushed.contains(&(to, *msg)), "rank {rank}: CTS(net) for message {msg} of {to}, pushed");
                self.net_cts += 1;
                assert!(
                    self.net_recvs_posted.contains(&(rank, to, *msg)),
                    "rank {rank}: CTS(net) for message {msg} of {to} before its network receive"
                );
                true
            }
            Packet::Eager { .. } | Packet::Abort { .. } => return,
            _ => false,
        };
        assert_eq!(net, !self.on_node(rank, to), "rank {rank} to {to} (nodes {:?}): {p:?}", self.nodes);
    }

    /// A copy's peer buffer or staging slot belongs to a rank of the copier's node.
    fn check_copy_stays_on_node(&self, rank: Rank, c: &CopyCmd) {
        for loc in [c.src, c.dst] {
            match loc {
                Loc::Peer { peer, .. } => assert!(self.on_node(rank, peer), "rank {rank} copies across nodes: {c:?}"),
                Loc::Staging { from, to, .. } => {
                    assert!(self.on_node(rank, from) && self.on_node(rank, to), "staging across nodes: {c:?}")
                }
                Loc::User { .. } => {}
            }
        }
    }

    /// Index in `nets` of the receive that send `op` matches.
    fn net_partner(&self, op: &NetOp) -> Option<usize> {
        self.nets.iter().position(|o| !o.send && o.rank == op.peer && o.peer == op.rank && o.xfer == op.xfer)
    }

    /// Whether network transfer `i` can complete now (successfully or not).
    fn net_ready(&self, i: usize) -> bool {
        let op = &self.nets[i];
        op.cancelled
            || self.dead[op.peer as usize]
            || self.net_faults.contains(&(op.rank, op.req))
            || if op.send { self.net_partner(op).is_some() } else { op.landed }
    }

    /// Completes network transfer `i` (a send first moves its data, unless it is
    /// cancelled and the schedule says the cancel won) and reports it.
    fn complete_net(&mut self, i: usize) {
        let op = self.nets.remove(i);
        let result = if self.net_faults.contains(&(op.rank, op.req)) {
            Err("injected fault".to_string())
        } else if op.send {
            match self.net_partner(&op) {
                Some(j) if !op.cancelled || self.schedule.pick(2) == 1 => {
                    let r = self.nets[j].clone();
                    assert_eq!(r.len, op.len, "transfer {} sent and received with different lengths", op.xfer);
                    if r.drain {
                        self.nets[j].landed = true;
                        self.engines[op.rank as usize].on_net_done(op.id, Ok(()));
                        return self.drain(op.rank);
                    }
                    assert!(
                        !self.done.contains_key(&(r.rank, r.req)),
                        "rank {} sends into rank {}'s {:?}, which has completed",
                        op.rank,
                        r.rank,
                        r.req
                    );
                    let data = self.read(op.rank, Loc::User { req: op.req, offset: 0 }, op.len);
                    self.write(r.rank, Loc::User { req: r.req, offset: 0 }, &data);
                    self.nets[j].landed = true;
                    Ok(())
                }
                _ if op.cancelled => Err("cancelled".to_string()),
                _ => Err(format!("rank {} failed", op.peer)),
            }
        } else if op.landed {
            Ok(())
        } else if op.cancelled {
            Err("cancelled".to_string())
        } else {
            Err(format!("rank {} failed", op.peer))
        };
        self.engines[op.rank as usize].on_net_done(op.id, result);
        self.drain(op.rank);
    }

    /// Rank `r` dies: what it had in flight is gone, and every other rank learns it.
    pub fn kill(&mut self, r: Rank) {
        self.dead[r as usize] = true;
        self.wires.retain(|(f, _), _| *f != r);
        self.copies[r as usize].clear();
        self.nets.retain(|o| o.rank != r);
        for o in 0..self.engines.len() as Rank {
            if !self.dead[o as usize] {
                self.engines[o as usize].on_peer_failed(r);
                self.drain(o);
            }
        }
    }

    /// One step in the schedule's order; false when nothing is left to do.
    pub fn step(&mut self) -> bool {
        let mut wires: Vec<(Rank, Rank)> = self.wires.iter().filter(|(_, q)| !q.is_empty()).map(|(k, _)| *k).collect();
        // In a fixed order (the map's is random per process), so that a schedule replays.
        wires.sort_unstable();
        let copiers: Vec<Rank> =
            (0..self.copies.len() as Rank).filter(|r| !self.copies[*r as usize].is_empty()).collect();
        // Network transfers last: with none (a job of one node) the picks mean what they did.
        let nets: Vec<usize> = (0..self.nets.len()).filter(|i| self.net_ready(*i)).collect();
        let n = wires.len() + copiers.len() + nets.len();
        if n == 0 {
            return false;
        }
        let pick = self.schedule.pick(n);
        if pick < wires.len() {
            let (from, to) = wires[pick];
            let p = self.wires.get_mut(&(from, to)).unwrap().pop_front().unwrap();
            if !self.dead[to as usize] {
                self.engines[to as usize].on_packet(from, p);
                self.drain(to);
            }
        } else if pick < wires.len() + copiers.len() {
            let r = copiers[pick - wires.len()];
            // Copies on different lanes may finish in any order.
            let i = self.schedule.pick(self.copies[r as usize].len());
            let c = self.copies[r as usize].remove(i);
            self.execute(r, c);
        } else {
            self.complete_net(nets[pick - wires.len() - copiers.len()]);
        }
        true
    }

    /// A device engine must reach the memory of both ends (its own device's, or a peer's
    /// it has access to); staging is host memory, which every engine reaches.
    fn check_engine_reaches_both_ends(&self, rank: Rank, c: &CopyCmd) {
        let CopyEngine::Device(e) = c.engine else { return };
        let cfg = self.engines[rank as usize].config();
        for loc in [c.src, c.dst] {
            let device = match loc {
                Loc::User { req, .. } => self.devices.get(&(rank, req)).copied().flatten(),
                Loc::Peer { region, .. } => Some(region.device),
                Loc::Staging { .. } => None,
            };
            if let Some(d) = device {
                assert!(cfg.can_access(e, d), "rank {rank}: engine {e} cannot reach device {d} for {c:?}");
            }
        }
    }

    /// A staging slot is written by one copy at a time and never while a copy reads
    /// it: a new copy that touches a slot another unfinished copy touches (a fill
    /// over a chunk not yet drained, a drain of a slot being refilled) is a bug.
    fn check_staging_conflicts(&self, c: &CopyCmd) {
        let slot_of = |l: &Loc| match *l {
            Loc::Staging { from, to, slot } => Some((from, to, slot)),
            _ => None,
        };
        let Some(mine) = slot_of(&c.src).or(slot_of(&c.dst)) else { return };
        for other in self.copies.iter().flatten() {
            assert!(
                slot_of(&other.src) != Some(mine) && slot_of(&other.dst) != Some(mine),
                "staging slot {mine:?} used by {c:?} while {other:?} still runs"
            );
        }
    }

    /// Performs copy `c` of rank `r` and reports it finished.
    pub fn execute(&mut self, r: Rank, c: CopyCmd) {
        // No engine may write into the buffer of a receive that has ended.
        let (owner, req) = match c.dst {
            Loc::User { req, .. } => (r, Some(req)),
            Loc::Peer { peer, region, .. } => {
                (peer, Some(ReqId(u64::from_le_bytes(region.handle[4..12].try_into().unwrap()))))
            }
            Loc::Staging { .. } => (r, None),
        };
        if let Some(req) = req {
            assert!(
                !self.done.contains_key(&(owner, req)),
                "rank {r} writes into rank {owner}'s {req:?}, which has completed: {c:?}"
            );
        }
        if self.copy_faults.contains(&r) {
            self.engines[r as usize].on_copy_done(c.id, Err("model: copy fault".into()));
            return self.drain(r);
        }
        for loc in [c.src, c.dst] {
            let Loc::Peer { peer, region, .. } = loc else { continue };
            let req = ReqId(u64::from_le_bytes(region.handle[4..12].try_into().unwrap()));
            if self.unmappable.contains(&(r, peer, req)) {
                self.engines[r as usize].on_copy_unmappable(c.id, region.buffer_id, "model: refused".into());
                return self.drain(r);
            }
        }
        let data = self.read(r, c.src, c.len);
        self.write(r, c.dst, &data);
        self.finish_copy(r, c.id);
    }

    /// Delivers every packet in flight from `from` to `to`.
    pub fn deliver(&mut self, from: Rank, to: Rank) {
        while let Some(p) = self.wires.get_mut(&(from, to)).and_then(VecDeque::pop_front) {
            self.engines[to as usize].on_packet(from, p);
            self.drain(to);
        }
    }

    pub fn finish_copy(&mut self, r: Rank, id: CopyId) {
        self.engines[r as usize].on_copy_done(id, Ok(()));
        self.drain(r);
    }

    pub fn run(&mut self) {
        let mut steps = 0;
        while self.step() {
            steps += 1;
            assert!(steps < 1_000_000, "no progress: livelock");
        }
    }

    pub fn assert_quiet(&self) {
        for (r, e) in self.engines.iter().enumerate() {
            if !self.dead[r] {
                assert!(e.is_idle(), "rank {r} still has transfers: deadlock");
            }
        }
        assert!(self.nets.is_empty(), "network transfers never ended: {:?}", self.nets);
    }
}

/// Message bytes that differ between messages (`id`) and along each, so that bytes
/// delivered to the wrong message or offset show. (A fill, not a source of choices:
/// nothing here decides what a test does.)
pub fn pattern(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(2654435761).wrapping_add(12345) | 1;
    (0..len)
        .map(|_| {
            // xorshift64: cheap, and no period short enough to hide a misplaced chunk.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn placement(i: u8) -> (Option<u32>, Option<u32>) {
    match i % 4 {
        0 => (Some(0), Some(1)),
        1 => (Some(0), None),
        2 => (None, Some(1)),
        _ => (None, None),
    }
}
