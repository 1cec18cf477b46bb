//! The model the interleaving tests drive engines over: each rank's memory, the rings
//! between ranks (FIFO per directed pair), the copies and network transfers in flight,
//! and the [`Schedule`] that picks which of them goes next. It executes every action the
//! engines emit and checks on the way what must hold whatever the order (no engine
//! reaches memory it cannot, no write into a completed receive, no staging slot used
//! twice at once).

use std::collections::{HashMap, VecDeque};

use gpulmt_protocols::engine::{Action, BufDesc, CopyCmd, CopyEngine, Engine, EngineConfig, Loc};
use gpulmt_protocols::policy::{Protocol, ProtocolOverride};
use gpulmt_protocols::wire::{Packet, Region};
use gpulmt_protocols::{CopyId, ProtoError, Rank, ReqId, Status, Tag};
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
}

pub fn region(owner: Rank, req: ReqId, alloc_len: u64, offset: u64, device: u32) -> Region {
    let mut handle = [0u8; 64];
    handle[..4].copy_from_slice(&owner.to_le_bytes());
    handle[4..12].copy_from_slice(&req.0.to_le_bytes());
    Region { handle, alloc_size: alloc_len, offset, device, node: 0, buffer_id: req.0 }
}

impl World {
    pub fn new(n: u32, schedule: Schedule, mode: ProtocolOverride, coop_min: u64, devices: u32, peer: bool) -> Self {
        let chunk = 4096;
        let engines = (0..n)
            .map(|r| {
                let mut c = EngineConfig::new(r, n, devices);
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
        }
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
        let p = e.is_eager(b.len, b.device.is_some()).then_some(payload);
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
        while let Some(a) = self.engines[rank as usize].poll_action() {
            match a {
                Action::Send { to, packet } => {
                    // Exercise the encoding on every packet.
                    let bytes = packet.to_vec();
                    let back = Packet::decode(&bytes).expect("own packets decode");
                    self.wires.entry((rank, to)).or_default().push_back(back);
                }
                Action::Copy(c) => {
                    self.check_engine_reaches_both_ends(rank, &c);
                    self.check_staging_conflicts(&c);
                    self.copies[rank as usize].push(c);
                }
                Action::Deliver { req, payload } => {
                    let (a, off) = self.mem[rank as usize].allocs.get_mut(&req).unwrap();
                    a[*off as usize..*off as usize + payload.len()].copy_from_slice(&payload);
                }
                Action::Complete { req, result } => {
                    assert!(self.done.insert((rank, req), result).is_none(), "rank {rank} {req:?} completed twice");
                }
                Action::Chose { req, choice, .. } => {
                    self.chosen.insert((rank, req), choice.protocol);
                }
                Action::Violation { peer, what } => panic!("rank {rank}: violation by {peer}: {what}"),
                Action::NetSend { .. } | Action::NetRecv { .. } | Action::NetCancel { .. } => {
                    panic!("rank {rank}: network transfer in a job of one node: {a:?}")
                }
                Action::MapPeer { peer, region } => {
                    assert_ne!(peer, rank);
                    self.mapped[rank as usize] += 1;
                    assert!(self.mem[peer as usize]
                        .allocs
                        .contains_key(&ReqId(u64::from_le_bytes(region.handle[4..12].try_into().unwrap()))));
                }
            }
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

    /// One step in the schedule's order; false when nothing is left to do.
    pub fn step(&mut self) -> bool {
        let mut wires: Vec<(Rank, Rank)> = self.wires.iter().filter(|(_, q)| !q.is_empty()).map(|(k, _)| *k).collect();
        // In a fixed order (the map's is random per process), so that a schedule replays.
        wires.sort_unstable();
        let copiers: Vec<Rank> =
            (0..self.copies.len() as Rank).filter(|r| !self.copies[*r as usize].is_empty()).collect();
        let n = wires.len() + copiers.len();
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
        } else {
            let r = copiers[pick - wires.len()];
            // Copies on different lanes may finish in any order.
            let i = self.schedule.pick(self.copies[r as usize].len());
            let c = self.copies[r as usize].remove(i);
            self.execute(r, c);
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
