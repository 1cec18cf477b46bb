//! Bootstrap from an MPI job (feature `mpi`): a context spans every rank of an MPI
//! communicator, so programs launched by an MPI launcher need no `gpulmt-run` and no
//! `GPULMT_JOB` / `GPULMT_RANK` / `GPULMT_SIZE`.
//!
//! ```no_run
//! use gpulmt::mpi::rsmpi::Threading;
//! // The internode path's proxy thread calls MPI beside the application's: MPI_THREAD_MULTIPLE.
//! let (universe, _) = gpulmt::mpi::rsmpi::initialize_with_threading(Threading::Multiple).expect("MPI_Init_thread");
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
use ::mpi::traits::{AsRaw, CommunicatorCollectives, Root};

use crate::config::Config;
use crate::context::{Context, JobInfo};
use crate::error::{Error, Result};
use crate::topology::{HostSlot, Topology};

/// The rsmpi crate this module is built against, so callers need no dependency of
/// their own (and cannot pick a second version of it).
pub use ::mpi as rsmpi;

/// Bytes of the job-id broadcast buffer: ids are short ASCII ("mpi<pid>x<hex time>").
const JOB_ID_BYTES: usize = 64;

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
/// Where the job has more than one node, the internode path starts too
/// ([`crate::net::start`], collective over `comm`): MPI must then run with
/// `MPI_THREAD_MULTIPLE` (`rsmpi::initialize_with_threading(Threading::Multiple)`), or
/// the start fails with an error that says so. If any rank fails to join its node or to
/// start its path, every rank returns an error (none waits for the one that failed).
pub fn init_from_mpi<C>(comm: &C) -> Result<Context>
where
    C: Communicator + AsRaw<Raw = ::mpi::ffi::MPI_Comm>,
{
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
    let made = Context::init_world(cfg, info, topology, None);
    // Every rank goes on only if every rank has its context: a rank that failed returns,
    // and the others must not wait for it in the path's collective start.
    agree(comm, made.as_ref().err().map(|e| e.to_string()), "could not join its node's gpulmt job")?;
    let mut ctx = made?;
    if single {
        return Ok(ctx);
    }
    // The internode path (docs/internode.md), collective over `comm`: its proxy thread
    // and queues need the context's device backend for their memory, so it starts after
    // the context, and the context takes it then.
    let peers = ctx.topology().off_node_peers();
    let started = crate::net::start(comm, &peers, &ctx.config().net, ctx.backend().clone());
    agree(comm, started.as_ref().err().map(|e| e.to_string()), "could not start its internode path")?;
    let path = started.map_err(|e| Error::Bootstrap(format!("starting the internode path: {e}")))?;
    ctx.attach_offnode_path(Box::new(path))?;
    Ok(ctx)
}

/// Whether every rank of `comm` succeeded at a step of the start (collective): `failed`
/// is this rank's reason if it did not. A rank that failed gets its own error back; the
/// others learn that some rank failed (its rank, the lowest of those that did), so that
/// no rank waits in a later collective for one that returned.
fn agree(comm: &impl Communicator, failed: Option<String>, what: &str) -> Result<()> {
    let mine = if failed.is_some() { comm.rank() } else { i32::MAX };
    let mut first = i32::MAX;
    comm.all_reduce_into(&mine, &mut first, ::mpi::collective::SystemOperation::min());
    match failed {
        Some(why) => Err(Error::Bootstrap(format!("rank {} {what}: {why}", comm.rank()))),
        None if first != i32::MAX => Err(Error::Bootstrap(format!(
            "rank {first} {what} (its own error says why); every rank of the communicator gives up"
        ))),
        None => Ok(()),
    }
}
