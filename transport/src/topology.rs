//! [`Topology`]: where every rank of a job runs, and how the ranks of one node form the
//! LMT job of that node ([`JobInfo`]) (`docs/internode.md`, "World, nodes and routing").
//!
//! A context spans every rank of its job (an MPI communicator, or a `gpulmt-run` job).
//! Ranks in the API and in statuses are **job ranks**. The ranks of one node share a
//! shared-memory segment (rings, staging, rank table) and IPC mappings, addressed by
//! **local index**: the rank's position among its node's ranks. Everything that touches
//! the segment translates a job rank to its local index here; the protocol engine works
//! in job ranks and learns which ranks share this node from [`Topology::on_node_mask`].
//!
//! A node is normally a host (a machine: the ranks `MPI_Comm_split_type(SHARED)` groups).
//! With **pseudo-nodes** (`GPULMT_PSEUDO_NODES=N`, a test setting) the ranks of every host
//! are split into `N` contiguous groups by their index on the host, and each group is a
//! node of its own: ranks of different groups share nothing, and everything between them
//! takes the internode path, so one machine exercises it.

use gpulmt_protocols::Rank;

use crate::error::{Error, Result};

/// Identity of a rank within the LMT job of its node, from the launcher's environment:
/// the job id (which names the node's shared-memory segment), the rank's local index and
/// the node's number of ranks. For a job of one node these are its job rank and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobInfo {
    pub job: String,
    pub rank: u32,
    pub size: u32,
}

impl JobInfo {
    /// Reads `GPULMT_JOB`, `GPULMT_RANK`, `GPULMT_SIZE`; without them this is a
    /// one-rank job of its own.
    pub fn from_env() -> Result<JobInfo> {
        let var = |k: &str| std::env::var(k).ok();
        match (var("GPULMT_JOB"), var("GPULMT_RANK"), var("GPULMT_SIZE")) {
            (Some(job), Some(rank), Some(size)) => {
                let parse = |k: &str, v: &str| {
                    v.trim().parse::<u32>().map_err(|_| Error::Bootstrap(format!("{k}={v:?} is not a number")))
                };
                let (rank, size) = (parse("GPULMT_RANK", &rank)?, parse("GPULMT_SIZE", &size)?);
                if rank >= size {
                    return Err(Error::Bootstrap(format!("GPULMT_RANK={rank} is not below GPULMT_SIZE={size}")));
                }
                Ok(JobInfo { job, rank, size })
            }
            (None, None, None) => {
                Ok(JobInfo { job: format!("solo{}x{:x}", std::process::id(), now_nanos()), rank: 0, size: 1 })
            }
            _ => Err(Error::Bootstrap(
                "GPULMT_JOB, GPULMT_RANK and GPULMT_SIZE must be set together: start ranks with gpulmt-run".into(),
            )),
        }
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Where one rank runs: its node and its index among that node's ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Place {
    /// The node, numbered from 0 host by host (hosts in the order of their lowest job
    /// rank), a host's pseudo-nodes in the order of their ranks' indices on it.
    pub node: u32,
    /// The rank's index among its node's ranks (its rank in the node's LMT job).
    pub local: u32,
}

/// Where one rank runs on its host, as the bootstrap learns it (one entry per job rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostSlot {
    /// Any number that is the same for the ranks of one host and differs between hosts
    /// (the MPI bootstrap uses the job rank of the host's first rank).
    pub host: u32,
    /// The rank's index among its host's ranks, in job-rank order (0..ranks of the host).
    pub local: u32,
}

/// Why a placement cannot make a topology.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// `GPULMT_PSEUDO_NODES` asks for more groups than a host has ranks (or for none).
    #[error(
        "GPULMT_PSEUDO_NODES={asked} cannot split host {host}'s {ranks} rank(s): give 1 to {ranks} \
         (each pseudo-node needs at least one rank), or start more ranks per host"
    )]
    PseudoNodes { asked: u32, host: u32, ranks: u32 },
    /// The gathered placement is inconsistent (a bug of the bootstrap, or of the MPI library).
    #[error("inconsistent rank placement: {0}")]
    Placement(String),
}

/// Job rank <-> (node, local index), for every rank of a job, seen from one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    rank: Rank,
    /// Per job rank.
    places: Vec<Place>,
    /// Per node: its job ranks in local order.
    nodes: Vec<Vec<Rank>>,
    /// Per job rank: whether it shares this rank's node.
    on_node: Vec<bool>,
    /// This rank's index among the ranks of its host (pseudo-nodes split a host; the
    /// device a rank picks by default follows its place on the host, not in its group).
    host_local: u32,
}

impl Topology {
    /// A job of one node, whose job ranks are its local indices (a `gpulmt-run` job, an
    /// LMT plugin's job, a job of one MPI host without pseudo-nodes).
    ///
    /// # Panics
    /// If `rank >= size`.
    pub fn single_node(rank: Rank, size: u32) -> Topology {
        assert!(rank < size, "rank {rank} is not below the job size {size}");
        Topology {
            rank,
            places: (0..size).map(|local| Place { node: 0, local }).collect(),
            nodes: vec![(0..size).collect()],
            on_node: vec![true; size as usize],
            host_local: rank,
        }
    }

    /// The topology of a job whose rank `r` runs at `hosts[r]`, seen from job rank `rank`,
    /// with each host's ranks split into `pseudo_nodes` contiguous groups (1: each host is
    /// one node). A host of `k` ranks gives its first `k % pseudo_nodes` groups one rank
    /// more than the others: 3 ranks in 2 groups are {0, 1} and {2}.
    pub fn from_hosts(rank: Rank, hosts: &[HostSlot], pseudo_nodes: u32) -> Result<Topology, TopologyError> {
        let bad = |m: String| Err(TopologyError::Placement(m));
        let size = hosts.len();
        if rank as usize >= size {
            return bad(format!("rank {rank} is not below the job size {size}"));
        }
        // Hosts in the order of their lowest job rank; each host's ranks by local index.
        let mut order: Vec<u32> = Vec::new();
        let mut members: Vec<Vec<Option<Rank>>> = Vec::new();
        for (r, slot) in hosts.iter().enumerate() {
            let h = match order.iter().position(|&h| h == slot.host) {
                Some(h) => h,
                None => {
                    order.push(slot.host);
                    members.push(Vec::new());
                    order.len() - 1
                }
            };
            let m = &mut members[h];
            let local = slot.local as usize;
            if local >= size {
                return bad(format!("rank {r} claims index {local} on host {}, beyond {size} ranks", slot.host));
            }
            if m.len() <= local {
                m.resize(local + 1, None);
            }
            if let Some(other) = m[local] {
                return bad(format!("ranks {other} and {r} both claim index {local} on host {}", slot.host));
            }
            m[local] = Some(r as Rank);
        }
        let mut places = vec![Place { node: 0, local: 0 }; size];
        let mut nodes: Vec<Vec<Rank>> = Vec::new();
        for (h, m) in members.iter().enumerate() {
            let ranks: Vec<Rank> =
                m.iter().copied().collect::<Option<_>>().ok_or_else(|| {
                    TopologyError::Placement(format!("host {} has gaps in its ranks' indices", order[h]))
                })?;
            let k = ranks.len() as u32;
            if pseudo_nodes == 0 || pseudo_nodes > k {
                return Err(TopologyError::PseudoNodes { asked: pseudo_nodes, host: order[h], ranks: k });
            }
            let mut start = 0u32;
            for g in 0..pseudo_nodes {
                let len = k / pseudo_nodes + u32::from(g < k % pseudo_nodes);
                let node = nodes.len() as u32;
                let group = ranks[start as usize..(start + len) as usize].to_vec();
                for (local, &r) in group.iter().enumerate() {
                    places[r as usize] = Place { node, local: local as u32 };
                }
                nodes.push(group);
                start += len;
            }
        }
        let mine = places[rank as usize].node;
        let on_node = places.iter().map(|p| p.node == mine).collect();
        Ok(Topology { rank, places, nodes, on_node, host_local: hosts[rank as usize].local })
    }

    /// This rank's job rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Ranks of the job.
    pub fn size(&self) -> u32 {
        self.places.len() as u32
    }

    /// Nodes of the job.
    pub fn node_count(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// This rank's node and local index.
    pub fn place(&self) -> Place {
        self.places[self.rank as usize]
    }

    /// Where job rank `r` runs (None outside the job).
    pub fn place_of(&self, r: Rank) -> Option<Place> {
        self.places.get(r as usize).copied()
    }

    /// The job ranks of `node`, in local order (empty for a node outside the job).
    pub fn members(&self, node: u32) -> &[Rank] {
        self.nodes.get(node as usize).map_or(&[], Vec::as_slice)
    }

    /// The job ranks of this rank's node, in local order: local index -> job rank.
    pub fn node_members(&self) -> &[Rank] {
        self.members(self.place().node)
    }

    /// Ranks of this rank's node (the size of its LMT job).
    pub fn local_size(&self) -> u32 {
        self.node_members().len() as u32
    }

    /// Whether job rank `r` shares this rank's node (false outside the job).
    #[inline]
    pub fn on_node(&self, r: Rank) -> bool {
        self.on_node.get(r as usize).copied().unwrap_or(false)
    }

    /// The job ranks of other nodes (the internode path's peers), in order.
    pub fn off_node_peers(&self) -> Vec<Rank> {
        (0..self.size()).filter(|&r| !self.on_node(r)).collect()
    }

    /// Per job rank, whether it shares this rank's node (the engine's `on_node`).
    pub fn on_node_mask(&self) -> Vec<bool> {
        self.on_node.clone()
    }

    /// The local index of job rank `r` when it shares this rank's node.
    #[inline]
    pub fn local_of(&self, r: Rank) -> Option<usize> {
        self.on_node(r).then(|| self.places[r as usize].local as usize)
    }

    /// The job rank of local index `local` of this rank's node.
    ///
    /// # Panics
    /// If `local` is not below [`local_size`](Self::local_size).
    #[inline]
    pub fn job_rank_of(&self, local: usize) -> Rank {
        self.node_members()[local]
    }

    /// Whether every rank of the job shares this rank's node.
    pub fn is_single_node(&self) -> bool {
        self.nodes.len() == 1
    }

    /// This rank's index among the ranks of its host (equal to its local index without
    /// pseudo-nodes).
    pub fn host_local(&self) -> u32 {
        self.host_local
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `hosts` ranks per host, in job-rank order (host h's ranks follow host h-1's).
    fn blocks(per_host: &[u32]) -> Vec<HostSlot> {
        per_host
            .iter()
            .enumerate()
            .flat_map(|(h, &k)| (0..k).map(move |local| HostSlot { host: h as u32, local }))
            .collect()
    }

    /// Checks that job rank <-> (node, local) is a bijection, seen from every rank.
    fn check_bijection(hosts: &[HostSlot], pseudo: u32) {
        for me in 0..hosts.len() as u32 {
            let t = Topology::from_hosts(me, hosts, pseudo).unwrap();
            assert_eq!(t.rank(), me);
            assert_eq!(t.size(), hosts.len() as u32);
            for r in 0..t.size() {
                let p = t.place_of(r).unwrap();
                assert_eq!(t.members(p.node)[p.local as usize], r, "rank {r} at {p:?}");
                assert_eq!(t.on_node(r), p.node == t.place().node);
                assert_eq!(t.local_of(r), t.on_node(r).then_some(p.local as usize));
                assert_eq!(t.off_node_peers().contains(&r), !t.on_node(r));
            }
            for (local, &r) in t.node_members().iter().enumerate() {
                assert_eq!(t.job_rank_of(local), r);
                assert_eq!(t.local_of(r), Some(local));
            }
            assert!(t.on_node(me));
            assert_eq!(t.on_node_mask().iter().filter(|&&b| b).count() as u32, t.local_size());
            assert_eq!(t.place_of(t.size()), None);
            assert!(!t.on_node(t.size()));
        }
    }

    #[test]
    fn single_node_is_the_identity() {
        let t = Topology::single_node(2, 4);
        assert_eq!((t.rank(), t.size(), t.node_count(), t.local_size()), (2, 4, 1, 4));
        assert_eq!(t.place(), Place { node: 0, local: 2 });
        assert_eq!(t.host_local(), 2);
        assert!(t.is_single_node());
        for r in 0..4 {
            assert_eq!(t.local_of(r), Some(r as usize));
            assert_eq!(t.job_rank_of(r as usize), r);
        }
        assert_eq!(t.on_node_mask(), vec![true; 4]);
        // The same as one host without pseudo-nodes.
        assert_eq!(Topology::from_hosts(2, &blocks(&[4]), 1).unwrap(), t);
    }

    #[test]
    fn two_hosts_of_two_and_pseudo_nodes_of_one_host() {
        // 2 hosts x 2 ranks: nodes {0, 1} and {2, 3}.
        let hosts = blocks(&[2, 2]);
        let t = Topology::from_hosts(2, &hosts, 1).unwrap();
        assert_eq!(t.node_count(), 2);
        assert_eq!(t.members(0), &[0, 1]);
        assert_eq!(t.members(1), &[2, 3]);
        assert_eq!(t.place(), Place { node: 1, local: 0 });
        assert_eq!(t.on_node_mask(), vec![false, false, true, true]);
        assert_eq!(t.local_of(3), Some(1));
        assert_eq!(t.local_of(0), None);
        assert_eq!(t.host_local(), 0);
        check_bijection(&hosts, 1);

        // One host of 4 split in 2 pseudo-nodes: the same nodes, but rank 2 keeps its
        // place on the host (it picks a device by it).
        let one = blocks(&[4]);
        let p = Topology::from_hosts(2, &one, 2).unwrap();
        assert_eq!(p.members(0), &[0, 1]);
        assert_eq!(p.members(1), &[2, 3]);
        assert_eq!(p.place(), Place { node: 1, local: 0 });
        assert_eq!(p.host_local(), 2);
        check_bijection(&one, 2);
    }

    #[test]
    fn three_pseudo_nodes_of_one_rank() {
        let hosts = blocks(&[3]);
        let t = Topology::from_hosts(1, &hosts, 3).unwrap();
        assert_eq!(t.node_count(), 3);
        assert_eq!((0..3).map(|n| t.members(n).to_vec()).collect::<Vec<_>>(), vec![vec![0], vec![1], vec![2]]);
        assert_eq!(t.place(), Place { node: 1, local: 0 });
        assert_eq!(t.local_size(), 1);
        assert_eq!(t.on_node_mask(), vec![false, true, false]);
        check_bijection(&hosts, 3);
    }

    #[test]
    fn uneven_groups_give_the_first_groups_the_extra_ranks() {
        // 5 ranks in 2 groups: {0, 1, 2} and {3, 4}; 7 in 3: {0, 1, 2}, {3, 4}, {5, 6}.
        let t = Topology::from_hosts(4, &blocks(&[5]), 2).unwrap();
        assert_eq!(t.members(0), &[0, 1, 2]);
        assert_eq!(t.members(1), &[3, 4]);
        assert_eq!(t.place(), Place { node: 1, local: 1 });
        let t = Topology::from_hosts(0, &blocks(&[7]), 3).unwrap();
        assert_eq!(t.members(0), &[0, 1, 2]);
        assert_eq!(t.members(1), &[3, 4]);
        assert_eq!(t.members(2), &[5, 6]);
        // Hosts of different sizes, each split: 3 -> {2}+{1}, 2 -> {1}+{1}.
        let hosts = blocks(&[3, 2]);
        let t = Topology::from_hosts(4, &hosts, 2).unwrap();
        assert_eq!(
            (0..4).map(|n| t.members(n).to_vec()).collect::<Vec<_>>(),
            vec![vec![0, 1], vec![2], vec![3], vec![4]]
        );
        assert_eq!(t.place(), Place { node: 3, local: 0 });
        for pseudo in 1..=2 {
            check_bijection(&hosts, pseudo);
        }
        check_bijection(&blocks(&[7]), 3);
        check_bijection(&blocks(&[5]), 4);
    }

    #[test]
    fn interleaved_hosts_number_nodes_host_by_host() {
        // Round-robin placement (mpirun --map-by node): ranks 0, 2 on host 7; 1, 3 on 9.
        let hosts = [
            HostSlot { host: 7, local: 0 },
            HostSlot { host: 9, local: 0 },
            HostSlot { host: 7, local: 1 },
            HostSlot { host: 9, local: 1 },
        ];
        let t = Topology::from_hosts(3, &hosts, 1).unwrap();
        assert_eq!(t.members(0), &[0, 2]);
        assert_eq!(t.members(1), &[1, 3]);
        assert_eq!(t.place(), Place { node: 1, local: 1 });
        assert_eq!(t.on_node_mask(), vec![false, true, false, true]);
        // Split in two: host 7's groups come first, as host 7 holds rank 0.
        let t = Topology::from_hosts(1, &hosts, 2).unwrap();
        assert_eq!((0..4).map(|n| t.members(n).to_vec()).collect::<Vec<_>>(), vec![vec![0], vec![2], vec![1], vec![3]]);
        assert_eq!(t.place(), Place { node: 2, local: 0 });
        check_bijection(&hosts, 1);
        check_bijection(&hosts, 2);
    }

    #[test]
    fn bad_pseudo_node_counts_and_placements_are_refused() {
        let hosts = blocks(&[2, 1]);
        let e = Topology::from_hosts(0, &hosts, 2).unwrap_err();
        assert_eq!(e, TopologyError::PseudoNodes { asked: 2, host: 1, ranks: 1 });
        assert!(e.to_string().contains("GPULMT_PSEUDO_NODES=2"), "{e}");
        assert!(matches!(Topology::from_hosts(0, &hosts, 0), Err(TopologyError::PseudoNodes { asked: 0, .. })));
        assert!(Topology::from_hosts(0, &blocks(&[4]), 5).is_err());
        assert!(Topology::from_hosts(0, &blocks(&[4]), 4).is_ok());

        let dup = [HostSlot { host: 0, local: 0 }, HostSlot { host: 0, local: 0 }];
        assert!(matches!(Topology::from_hosts(0, &dup, 1), Err(TopologyError::Placement(_))));
        let gap = [HostSlot { host: 0, local: 0 }, HostSlot { host: 0, local: 2 }];
        assert!(matches!(Topology::from_hosts(0, &gap, 1), Err(TopologyError::Placement(_))));
        assert!(matches!(Topology::from_hosts(2, &blocks(&[2]), 1), Err(TopologyError::Placement(_))));
    }
}
