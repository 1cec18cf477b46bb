//! Bootstrap from an MPI job (feature `mpi`): the ranks that `mpirun` started on one
//! node form a gpulmt job of their own, so programs launched by an MPI launcher need
//! no `gpulmt-run` and no `GPULMT_JOB` / `GPULMT_RANK` / `GPULMT_SIZE`.
//!
//! ```no_run
//! let universe = gpulmt::mpi::rsmpi::initialize().expect("MPI_Init");
//! let ctx = gpulmt::mpi::init_from_mpi(&universe.world()).expect("gpulmt init");
//! // ... transfers between the ranks of this node ...
//! ctx.finalize().expect("finalize");
//! drop(universe); // MPI_Finalize, after gpulmt's own finalize
//! ```
//!
//! gpulmt moves data only between processes of one node: ranks on other nodes are
//! not part of the returned context's job (its ranks are the node-local ranks).

use ::mpi::topology::Communicator;
use ::mpi::traits::Root;

use crate::config::Config;
use crate::context::{Context, JobInfo};
use crate::error::{Error, Result};

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

/// Joins the gpulmt job of this node's ranks of `world` (collective over `world`).
///
/// The node-local ranks come from `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`, keyed
/// by the rank in `world` so the local order follows it. Local rank 0 makes the job
/// id (unique per node: pid and time) and broadcasts it within the node. The
/// configuration comes from the `GPULMT_*` variables ([`Config::from_env`]); the
/// device is `GPULMT_GPU`, else `GPULMT_LOCAL_RANK`, else the local rank, modulo the
/// devices.
pub fn init_from_mpi(world: &impl Communicator) -> Result<Context> {
    let node = world.split_shared(world.rank());
    let (rank, size) = (node.rank(), node.size());
    let mut id = [0u8; JOB_ID_BYTES];
    if rank == 0 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let job = format!("mpi{}x{nanos:x}", std::process::id());
        id[..job.len()].copy_from_slice(job.as_bytes());
    }
    node.process_at_rank(0).broadcast_into(&mut id[..]);
    let len = id.iter().position(|&b| b == 0).unwrap_or(JOB_ID_BYTES);
    let job = std::str::from_utf8(&id[..len])
        .map_err(|_| Error::Bootstrap("the job id broadcast by local rank 0 is not UTF-8".into()))?
        .to_owned();
    if job.is_empty() {
        return Err(Error::Bootstrap("local rank 0 broadcast an empty job id".into()));
    }
    let info = JobInfo { job, rank: rank as u32, size: size as u32 };
    Context::init_with(Config::from_env()?, info)
}
