//! Bootstrap from an MPI job (feature `mpi`): a context spans every rank of an MPI
//! communicator, so programs launched by an MPI launcher need no `gpulmt-run` and no
//! `GPULMT_JOB` / `GPULMT_RANK` / `GPULMT_SIZE`.
//!
//! ```no_run
//! let universe = gpulmt::mpi::rsmpi::initialize().expect("MPI_Init");
//! let ctx = gpulmt::mpi::init_from_mpi(&universe.world()).expect("gpulmt init");
//! // ... transfers between the ranks of the communicator ...
//! ctx.finalize().expect("finalize");
//! drop(universe); // MPI_Finalize, after gpulmt's own finalize
//! ```
//!
//! Ranks in the API and in statuses are the communicator's ranks. The ranks of one node
//! (a host, or a pseudo-node of `GPULMT_PSEUDO_NODES`) form an LMT job of their own, with
//! its shared-memory segment, as `gpulmt-run`'s ranks do ([`crate::topology`]); ranks of
//! other nodes are reached through the internode path (`docs/internode.md`).

use ::mpi::topology::Communicator;
use ::mpi::traits::{CommunicatorCollectives, Root};

use crate::config::Config;
use crate::context::{Context, JobInfo};
use crate::error::{Error, Result};
use crate::offnode::OffNodePath;
use crate::topology::{HostSlot, Topology};

/// The rsmpi crate this module is built against, so callers need no dependency of
/// their own (and cannot pick a second version of it).
pub use ::mpi as rsmpi;

/// Bytes of the job-id broadcast buffer: ids are short ASCII ("mpi<pid>x<hex time>").
const JOB_ID_BYTES: usize = 64;

/// Why ranks of other nodes cannot be reached yet: the production internode path (GIO
/// queues and the proxy, `crate::net`) is not plugged in here yet.
pub const NOT_BUILT: &str = "internode path not built yet";

/// Whether this process was started by an MPI launcher (Open MPI's
/// `OMPI_COMM_WORLD_SIZE`, or `PMI_SIZE` of MPICH / Hydra / Slurm) rather than by
/// `gpulmt-run` (which sets `GPULMT_JOB`, and wins).
pub fn launched_by_mpi() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    (set("OMPI_COMM_WORLD_SIZE") || set("PMI_SIZE")) && !set("GPULMT_JOB")
}

/// Joins the gpulmt job of every rank of `comm` (collective over `comm`).
///
/// Each host's ranks come from `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`, keyed by the
/// rank in `comm` so the order on the host follows it; an allgather tells every rank
/// where every other runs ([`Topology`]), and `GPULMT_PSEUDO_NODES` splits each host into
/// nodes. The first rank of each host makes the job id (unique per host: pid and time)
/// and broadcasts it within the host; each pseudo-node's LMT job adds its node number.
/// The configuration comes from the `GPULMT_*` variables ([`Config::from_env`]); the
/// device is `GPULMT_GPU`, else `GPULMT_LOCAL_RANK`, else the rank's index on its host,
/// modulo the devices.
///
/// Until the internode path is plugged in, transfers with ranks of other nodes fail with
/// an error that says so ([`NOT_BUILT`]); those within a node work.
pub fn init_from_mpi(comm: &impl Communicator) -> Result<Context> {
    let cfg = Config::from_env()?;
    let host = comm.split_shared(comm.rank());
    // The host's first rank names the host (by its rank in `comm`) and makes the job id.
    let mut first = comm.rank();
    host.process_at_rank(0).broadcast_into(&mut first);
    let mut id = [0u8; JOB_ID_BYTES];
    if host.rank() == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let job = format!("mpi{}x{nanos:x}", std::process::id());
        id[..job.len()].copy_from_slice(job.as_bytes());
    }
    host.process_at_rank(0).broadcast_into(&mut id[..]);
    let len = id.iter().position(|&b| b == 0).unwrap_or(JOB_ID_BYTES);
    let base = std::str::from_utf8(&id[..len])
        .map_err(|_| Error::Bootstrap("the job id broadcast by the host's first rank is not UTF-8".into()))?
        .to_owned();
    if base.is_empty() {
        return Err(Error::Bootstrap("the host's first rank broadcast an empty job id".into()));
    }

    let mine = [first as u32, host.rank() as u32];
    let mut all = vec![0u32; 2 * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let hosts: Vec<HostSlot> = all.chunks_exact(2).map(|c| HostSlot { host: c[0], local: c[1] }).collect();
    let topology = Topology::from_hosts(comm.rank() as u32, &hosts, cfg.pseudo_nodes)
        .map_err(|e| Error::Bootstrap(e.to_string()))?;
    let place = topology.place();
    let job = if cfg.pseudo_nodes > 1 { format!("{base}p{}", place.node) } else { base };
    let info = JobInfo { job, rank: place.local, size: topology.local_size() };

    let single = topology.is_single_node();
    // PLUG-IN POINT for the internode path (issue 27): where some rank runs on another
    // node, start the production path here and pass it, e.g.
    //     let offnode = (!single).then(|| crate::net::start(comm, &topology, &cfg)).transpose()?;
    // and drop the `set_offnode_absent` below.
    let offnode: Option<Box<dyn OffNodePath>> = None;
    let mut ctx = Context::init_world(cfg, info, topology, offnode)?;
    if !single {
        ctx.set_offnode_absent(NOT_BUILT);
    }
    Ok(ctx)
}
