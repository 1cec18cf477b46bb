//! Joining the node's gpulmt job after `PMPI_Init` (collective over the node: a job id
//! from local rank 0, a plugin context with rings on every rank, or none anywhere), and
//! leaving it before `PMPI_Finalize` (drain, barrier with progress, release).
//!
//! The node is what [`Topology`] makes of the job (`docs/internode.md`, "World, nodes and
//! routing"): the ranks of one host (`MPI_Comm_split_type(SHARED)`), or with
//! `GPULMT_PSEUDO_NODES=N` one of the N groups each host's ranks are split into, as for
//! `gpulmt::mpi::init_from_mpi`. The context spans the job: its ranks are world ranks,
//! those of this node reached through rings, IPC and shared memory. Where the job has
//! several nodes and MPI gives `MPI_THREAD_MULTIPLE` (the shim's `MPI_Init` asks for it
//! where the launcher says the job spans hosts, or with pseudo-nodes), the context also
//! gets the internode path: GIO queues and a proxy thread whose MPI calls are `PMPI_*`
//! ones, so they never enter the shim. Large device messages to another node then go as
//! an envelope the MPI library matches and a rendezvous the proxies move (`send.rs`,
//! `recv.rs`); without the path (`GPULMT_MPI_OFFNODE=mpi`, or a lower thread level) they
//! are staged through host memory around the PMPI call (docs/internode.md, "The PMPI
//! shim across nodes").

use std::collections::HashMap;
use std::ffi::c_int;

use gpulmt::config::Config;
use gpulmt::topology::{HostSlot, Topology};
use gpulmt::{Context, JobInfo};
use mpi_sys::*;

use super::{gpulmt_mpi_counters, InitError, Shim};
use crate::envelope::job_hash;
use crate::raw::*;

impl Shim {
    /// Sets up the shim after PMPI_Init (collective over MPI_COMM_WORLD).
    pub fn init() -> Result<Shim, InitError> {
        let world = comm_world();
        let (mut wrank, mut wsize) = (0, 0);
        // SAFETY: MPI is initialized; every out-pointer is a local.
        unsafe {
            PMPI_Comm_rank(world, &mut wrank);
            PMPI_Comm_size(world, &mut wsize);
        }
        let (mut node, topology) = split_nodes(world, wrank, wsize)?;
        let (lrank, lsize) = (topology.place().local as c_int, topology.local_size() as c_int);
        let mut id = [0u8; 64];
        if lrank == 0 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let job = format!("mpi{}x{nanos:x}", std::process::id());
            id[..job.len()].copy_from_slice(job.as_bytes());
        }
        let mut node_comm = comm_null();
        let mut world_group = group_null();
        // The envelopes' job hash is one for the whole job (world rank 0's id), so that an
        // envelope from another node is recognised too; the node's own id names its
        // shared memory.
        let mut world_id = id;
        // SAFETY: buffers of the size given; collective over the world, then the node.
        unsafe {
            PMPI_Bcast(world_id.as_mut_ptr().cast(), world_id.len() as c_int, byte(), 0, world);
            PMPI_Bcast(id.as_mut_ptr().cast(), id.len() as c_int, byte(), 0, node);
            PMPI_Comm_dup(node, &mut node_comm);
            PMPI_Comm_group(world, &mut world_group);
        }
        let mut level = 0;
        // SAFETY: a local out-pointer; MPI is initialized.
        let thread_multiple =
            unsafe { PMPI_Query_thread(&mut level) } == SUCCESS && level >= MPI_THREAD_MULTIPLE as c_int;
        let job = id_text(&id);

        let topology_for_ctx = topology.clone();
        let made = (|| -> Result<(Context, usize, bool), String> {
            let lmt_min = match std::env::var("GPULMT_MPI_LMT_MIN") {
                Ok(v) if !v.trim().is_empty() => gpulmt::config::parse_size(v.trim())
                    .ok_or_else(|| format!("GPULMT_MPI_LMT_MIN={v:?} is not a size (like 1, 64K, 1M)"))?
                    as usize,
                _ => 1,
            };
            // Agreed at MPI_Init already (an invalid value counted as the default there).
            crate::staging::cap_from_env()?;
            let settle = match std::env::var("GPULMT_MPI_SETTLE").as_deref().map(str::trim) {
                Err(_) | Ok("") | Ok("default-stream") => true,
                Ok("none") => false,
                Ok(v) => return Err(format!("GPULMT_MPI_SETTLE={v:?} is neither `default-stream` nor `none`")),
            };
            let cfg = Config::from_env().map_err(|e| e.to_string())?;
            let info = JobInfo { job: job.clone(), rank: lrank as u32, size: lsize as u32 };
            // Rings, not blobs over MPI: a packet crosses in a ring slot the peer's
            // progress reads, where an MPI message cost both ranks an Isend, an Iprobe
            // and a Recv, and every progress round an Iprobe on one more communicator.
            // The context's ranks are world ranks (the topology places them).
            let ctx = Context::init_world(cfg, info, topology_for_ctx, None).map_err(|e| e.to_string())?;
            Ok((ctx, lmt_min.max(1), settle))
        })();
        // Every local rank must have joined, or none uses gpulmt.
        let all = every_rank(node, made.is_ok());
        let mut fail = |why: String, ctx: Option<Context>| {
            // Dropped, not finalized: its peers are told that it failed. (The job segment's
            // name went at init, once every rank had mapped it: unlinking it by name here
            // could remove another job instance's segment.)
            drop(ctx);
            // SAFETY: communicators and group made above; nothing uses them any more.
            unsafe {
                PMPI_Comm_free(&mut node_comm);
                PMPI_Comm_free(&mut node);
                PMPI_Group_free(&mut world_group);
            }
            Err(why)
        };
        // Every node decides alike whether the internode path starts: it is collective
        // over the world (and every rank reaches this agreement, so none waits in it for
        // a node whose shim stays off).
        let node_ok = made.is_ok() && all;
        let want = node_ok && topology.node_count() > 1 && thread_multiple && offnode_queues_wanted();
        let go = every_rank(world, want);
        let (mut ctx, lmt_min, settle) = match made {
            Err(why) => return fail(why, None),
            Ok(v) if !all => return fail("another rank of this node could not start gpulmt".into(), Some(v.0)),
            Ok(v) => v,
        };
        // Every rank learns whether every rank has the path (a rank-local failure to attach
        // it turns it off everywhere: routing needs both ends to agree).
        let offnode = every_rank(world, go && start_offnode(&mut ctx, world));
        // The shim's own communicator spans the world where the internode path runs: its
        // finalize barrier must meet the other nodes, and a placeholder message of a
        // node of one rank must not be on a communicator of one rank (`mprobe`).
        let shim_rank = if offnode {
            // SAFETY: made above, nothing uses it yet; then a collective over the world
            // (every rank agreed on `offnode`) into the same local.
            unsafe {
                PMPI_Comm_free(&mut node_comm);
                PMPI_Comm_dup(world, &mut node_comm);
            }
            wrank
        } else {
            lrank
        };
        // The node communicator's work is done (the finalize barriers use node_comm,
        // a duplicate of it): in Open MPI 4.1 each communicator a program
        // holds adds to the cost of every host message (libnbc's progress polling).
        // SAFETY: made above; nothing uses it any more.
        unsafe { PMPI_Comm_free(&mut node) };
        // Sim devices too: device memory a program can pass comes from gpulmt_mpi_alloc,
        // which makes every thread forget its host ranges.
        crate::hostmem::enable(ctx.config().memtype_cache);
        // Staging memory is pinned for this context's device engines.
        crate::staging::pool::attach(ctx.backend().clone());
        tracing::info!(
            job = %job,
            local_rank = lrank,
            local_size = lsize,
            world_rank = wrank,
            offnode_queues = offnode,
            "gpulmt-mpi shim active"
        );
        Ok(Shim {
            ctx,
            job_hash: job_hash(&id_text(&world_id)),
            world_rank: wrank,
            world_group,
            shim_comm: node_comm,
            shim_rank,
            offnode,
            ops: HashMap::new(),
            next_op: 1,
            posted: Vec::new(),
            stash: Vec::new(),
            probed: HashMap::new(),
            finished: HashMap::new(),
            allocations: Vec::new(),
            last_device: None,
            lmt_min,
            settle,
            thread_multiple,
            counters: gpulmt_mpi_counters::default(),
        })
    }

    /// Leaves: finishes this rank's traffic, then (collectively over the node) waits
    /// until every rank has, and releases gpulmt. Called before PMPI_Finalize.
    pub fn finalize(mut self) {
        // Transfers already matched (peers may depend on them) get time to finish;
        // receives nothing matched are the program's leaks and are abandoned.
        let t0 = std::time::Instant::now();
        while self.busy() {
            self.progress();
            if t0.elapsed() > std::time::Duration::from_secs(30) {
                tracing::warn!(
                    ops = self.ops.len(),
                    "MPI_Finalize: shim transfers still running after 30 s; abandoning them"
                );
                break;
            }
        }
        // Peers may still need our packets to finish theirs: progress until all arrive
        // (over the shim's communicator: the node's ranks, or every rank of the job where
        // the internode path reaches other nodes).
        let mut req = request_null();
        // SAFETY: collective over the shim communicator's ranks, request out-pointer.
        let mut rc = unsafe { PMPI_Ibarrier(self.shim_comm, &mut req) };
        // Waits as long as a peer computes before its MPI_Finalize (as MPI does), but not
        // past an error: a failed test leaves the flag 0, and would loop for good.
        while rc == SUCCESS {
            self.progress();
            let mut flag = 0;
            // SAFETY: the barrier's request.
            rc = unsafe { PMPI_Test(&mut req, &mut flag, status_ignore()) };
            if flag != 0 {
                break;
            }
        }
        if rc != SUCCESS {
            tracing::warn!(rc, "MPI_Finalize: the shim's closing barrier failed; leaving without it");
        }
        // Nobody drives gpulmt after this barrier: releasing cannot alarm a peer.
        // SAFETY: collective over the shim communicator's ranks.
        unsafe { PMPI_Barrier(self.shim_comm) };
        crate::staging::pool::shut_down();
        for ptr in std::mem::take(&mut self.allocations) {
            // SAFETY: memory of gpulmt_mpi_alloc, which the application may not use after
            // MPI_Finalize; after the barrier no rank drives a copy on it.
            let _ = unsafe { self.ctx.backend().free(ptr) };
        }
        let Shim { ctx, shim_comm: mut node_comm, mut world_group, .. } = self;
        // Every rank got here (the barrier above): the context's own finalize closes its
        // peer mappings and the internode path in order, and writes its traffic line (and
        // the anatomy log, with `gpulmt/anatomy`). Dropped instead, it would tell the
        // node's other ranks that it failed.
        if let Err(e) = ctx.finalize() {
            tracing::warn!(error = %e, "MPI_Finalize: gpulmt's finalize");
        }
        // SAFETY: the shim's own communicators and group, unused from now on.
        unsafe {
            PMPI_Comm_free(&mut node_comm);
            PMPI_Group_free(&mut world_group);
        }
    }
}

/// A job id as broadcast: the text up to its first NUL.
fn id_text(id: &[u8; 64]) -> String {
    let len = id.iter().position(|&b| b == 0).unwrap_or(id.len());
    String::from_utf8_lossy(&id[..len]).into_owned()
}

/// Whether off-node device messages should take the GIO queues and the proxy
/// (`GPULMT_MPI_OFFNODE`: `queues`, the default, or `mpi`); an unknown value says so and
/// counts as the default.
pub fn offnode_queues_wanted() -> bool {
    match std::env::var("GPULMT_MPI_OFFNODE").as_deref().map(str::trim) {
        Err(_) | Ok("") | Ok("queues") => true,
        Ok("mpi") => false,
        Ok(v) => {
            tracing::warn!("GPULMT_MPI_OFFNODE={v:?} is neither `queues` nor `mpi`: using `queues`");
            true
        }
    }
}

/// Whether `mine` holds on every rank of `comm` (collective over it).
fn every_rank(comm: MPI_Comm, mine: bool) -> bool {
    let mine = c_int::from(mine);
    let mut all = 0;
    // SAFETY: one int each way; collective over the world.
    let rc = unsafe {
        PMPI_Allreduce((&mine as *const c_int).cast(), (&mut all as *mut c_int).cast(), 1, int32(), op_min(), comm)
    };
    rc == SUCCESS && all != 0
}

/// Starts the internode path and gives it to `ctx` (collective over `world`, on every rank
/// alike); whether every rank has it. Where any rank failed, none keeps it: off-node
/// device messages are then staged for the MPI library, as without the path.
fn start_offnode(ctx: &mut Context, world: MPI_Comm) -> bool {
    let peers = ctx.topology().off_node_peers();
    // SAFETY: MPI_COMM_WORLD is live until MPI_Finalize, after the shim's release.
    let started = unsafe { gpulmt::net::start_raw(world, &peers, &ctx.config().net, ctx.backend().clone()) };
    let path = match started {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(error = %e, "the internode path did not start: device messages to other nodes are staged for MPI");
            None
        }
    };
    if !every_rank(world, path.is_some()) {
        if let Some(mut p) = path {
            use gpulmt::offnode::OffNodePath;
            let _ = p.shutdown(std::time::Instant::now());
        }
        return false;
    }
    match ctx.attach_offnode_path(Box::new(path.expect("every rank started its path"))) {
        Ok(()) => true,
        Err(e) => {
            // Only an internal error: the context was made without a path.
            tracing::error!(error = %e, "attaching the internode path");
            false
        }
    }
}

/// The communicator of this rank's node and the job's [`Topology`] (collective over
/// `world`): the host's ranks by `MPI_Comm_split_type(SHARED)`, each rank's place on its
/// host gathered by every rank, and with `GPULMT_PSEUDO_NODES=N` the host's communicator
/// split by the pseudo-node [`Topology::from_hosts`] gives each rank, so that its rank
/// in the node's communicator is its local index. Every rank gathers the same placement
/// and pseudo-node counts, so every rank returns the same error, if any (a count that
/// differs between ranks, or that a host cannot split), and none waits for another.
fn split_nodes(world: MPI_Comm, wrank: c_int, wsize: c_int) -> Result<(MPI_Comm, Topology), InitError> {
    let mut host = comm_null();
    let mut hrank = 0;
    // SAFETY: MPI is initialized; every out-pointer is a local.
    unsafe {
        PMPI_Comm_split_type(world, comm_type_shared(), wrank, info_null(), &mut host);
        PMPI_Comm_rank(host, &mut hrank);
    }
    // The host's first rank names it by its world rank (as `init_from_mpi` does). An
    // invalid configuration counts as no pseudo-nodes here: `Config::from_env` fails
    // again below, on every rank alike, and the shim stays off everywhere.
    let mut first = wrank;
    // SAFETY: one int; collective over the host.
    unsafe { PMPI_Bcast((&mut first as *mut c_int).cast(), 1, int32(), 0, host) };
    let pseudo = Config::from_env().map_or(1, |c| c.pseudo_nodes) as c_int;
    let mine = [first, hrank, pseudo];
    let mut all = vec![0 as c_int; 3 * wsize as usize];
    // SAFETY: buffers of the sizes given; collective over the world.
    unsafe { PMPI_Allgather(mine.as_ptr().cast(), 3, int32(), all.as_mut_ptr().cast(), 3, int32(), world) };
    let topology = match node_topology(wrank as u32, &all) {
        Ok(t) => t,
        Err(why) => {
            // SAFETY: made above; nothing uses it any more.
            unsafe { PMPI_Comm_free(&mut host) };
            return Err(why);
        }
    };
    if pseudo <= 1 {
        return Ok((host, topology));
    }
    let place = topology.place();
    let mut node = comm_null();
    // SAFETY: collective over the host's ranks, each with its pseudo-node as the colour
    // and its local index as the key; the host communicator is not used afterwards.
    unsafe {
        PMPI_Comm_split(host, place.node as c_int, place.local as c_int, &mut node);
        PMPI_Comm_free(&mut host);
    }
    Ok((node, topology))
}

/// The topology of the job from every rank's `[host's first world rank, index on the
/// host, GPULMT_PSEUDO_NODES]`, gathered in world-rank order, seen from world rank `rank`.
fn node_topology(rank: u32, gathered: &[c_int]) -> Result<Topology, InitError> {
    let pseudo = gathered.get(2).copied().unwrap_or(1);
    if let Some(r) = gathered.chunks_exact(3).position(|c| c[2] != pseudo) {
        return Err(format!(
            "GPULMT_PSEUDO_NODES differs between ranks (rank 0 counts {pseudo}, rank {r} {}): \
             give every rank the same setting (mpirun -x GPULMT_PSEUDO_NODES)",
            gathered[3 * r + 2]
        ));
    }
    let hosts: Vec<HostSlot> =
        gathered.chunks_exact(3).map(|c| HostSlot { host: c[0] as u32, local: c[1] as u32 }).collect();
    Topology::from_hosts(rank, &hosts, pseudo.max(0) as u32).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `[host, index on host, pseudo-nodes]` per world rank.
    fn gathered(slots: &[(i32, i32)], pseudo: i32) -> Vec<c_int> {
        slots.iter().flat_map(|&(h, l)| [h, l, pseudo]).collect()
    }

    #[test]
    fn pseudo_nodes_split_the_host_as_the_rust_bootstrap_does() {
        // One host of 4 ranks, 2 pseudo-nodes: {0, 1} and {2, 3}; world rank 3 is local 1
        // of node 1, and ranks 0 and 1 are off-node to it.
        let all = gathered(&[(0, 0), (0, 1), (0, 2), (0, 3)], 2);
        let t = node_topology(3, &all).unwrap();
        assert_eq!(t.node_members(), &[2, 3]);
        assert_eq!((t.place().local, t.local_size()), (1, 2));
        let on_node: Vec<bool> = (0..4).map(|w| t.on_node(w)).collect();
        assert_eq!(on_node, vec![false, false, true, true]);
        // Without pseudo-nodes the host is the node.
        let t = node_topology(3, &gathered(&[(0, 0), (0, 1), (0, 2), (0, 3)], 1)).unwrap();
        assert_eq!(t.node_members(), &[0, 1, 2, 3]);
    }

    #[test]
    fn pseudo_node_counts_that_differ_or_cannot_split_are_refused() {
        let mut all = gathered(&[(0, 0), (0, 1)], 2);
        all[5] = 1;
        let e = node_topology(0, &all).unwrap_err();
        assert!(e.contains("differs between ranks") && e.contains("rank 1 1"), "{e}");
        let e = node_topology(0, &gathered(&[(0, 0), (0, 1)], 3)).unwrap_err();
        assert!(e.contains("GPULMT_PSEUDO_NODES=3"), "{e}");
    }
}
