//! Set-up and tear-down: `MPI_Init` and `MPI_Init_thread` start the shim after the MPI
//! library is up (unless `GPULMT_MPI_DISABLE` is set); `MPI_Finalize` drains and
//! releases it before the library goes.

use std::ffi::{c_char, c_int};
use std::sync::atomic::Ordering;

use mpi_sys::{PMPI_Allreduce, PMPI_Finalize, PMPI_Init, PMPI_Init_thread, PMPI_Query_thread};

use super::ACTIVE;
use crate::raw::*;
use crate::state::{lock, Shim};
use crate::{hostmem, raw, staging};

/// Installs the log subscriber before gpulmt does, with one difference to gpulmt's
/// default (`GPULMT_LOG`, default `warn`): the sim backend's warning that a device
/// buffer was freed while a peer still maps it is expected here (peers keep mappings
/// cached, and gpulmt_mpi_free is not collective; CUDA behaves the same, silently),
/// so without `GPULMT_LOG` only its errors show.
fn init_logging() {
    gpulmt::logging::init("warn,gpulmt::device::sim=error");
}

fn start() {
    init_logging();
    let off = std::env::var("GPULMT_MPI_DISABLE").is_ok_and(|v| !matches!(v.trim(), "" | "0"));
    if off {
        return;
    }
    raw::find_count_word();
    agree_staging_limits();
    let mut level = 0;
    // SAFETY: a local out-pointer; MPI is initialized.
    let known = unsafe { PMPI_Query_thread(&mut level) } == SUCCESS;
    hostmem::set_serialized(known && level < mpi_sys::MPI_THREAD_MULTIPLE as c_int);
    match Shim::init() {
        Ok(s) => {
            *lock() = Some(s);
            ACTIVE.store(true, Ordering::Release);
        }
        Err(why) => eprintln!("gpulmt-mpi: shim disabled, device buffers go to the MPI library as they are: {why}"),
    }
}

/// Sets staging's cap, and the size above which reductions are split, to the smallest
/// `GPULMT_MPI_STAGING_MAX` of all ranks (collective over `MPI_COMM_WORLD`): a split
/// changes how many MPI calls a collective is, so every rank must decide alike. Also
/// where gpulmt does not start on this node (the shim is inactive, collectives still
/// split). An invalid setting counts as the default here; `Shim::init` reports it.
/// Then the threshold of the collectives' device path (`coll::device`), agreed alike.
fn agree_staging_limits() {
    let mine = staging::cap_from_env().unwrap_or(staging::pool::DEFAULT_CAP) as u64;
    let mut all = mine;
    // SAFETY: one u64 each way; collective over MPI_COMM_WORLD, which every rank's
    // MPI_Init reaches here.
    let rc = unsafe {
        PMPI_Allreduce((&mine as *const u64).cast(), (&mut all as *mut u64).cast(), 1, uint64(), op_min(), comm_world())
    };
    if rc == SUCCESS {
        staging::set_limits(usize::try_from(all).unwrap_or(usize::MAX));
    }
    // The device path of collectives: the largest threshold of all ranks (`off` anywhere
    // is off everywhere), since every rank must decide alike whether to ask its peers.
    let mine = super::coll::device::min_from_env();
    let mut all = mine;
    // SAFETY: as above.
    let rc = unsafe {
        PMPI_Allreduce((&mine as *const u64).cast(), (&mut all as *mut u64).cast(), 1, uint64(), op_max(), comm_world())
    };
    if rc == SUCCESS {
        super::coll::device::set_min(all);
    }
}

/// Whether the shim asks MPI for `MPI_THREAD_MULTIPLE`, which the internode path's proxy
/// thread needs: where the shim is on, off-node messages may take the queues
/// (`GPULMT_MPI_OFFNODE`), and the job may span nodes, as the launcher says
/// (Open MPI's local size below its world size, MPICH's Hydra alike, Slurm's node count)
/// or pseudo-nodes split the host. Elsewhere the program's own level stands: a higher one
/// slows every MPI call a little.
fn wants_thread_multiple() -> bool {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.trim().parse::<u64>().ok());
    let fewer = |local: &str, all: &str| matches!((var(local), var(all)), (Some(l), Some(a)) if l < a);
    let off = std::env::var("GPULMT_MPI_DISABLE").is_ok_and(|v| !matches!(v.trim(), "" | "0"));
    let spans = var("GPULMT_PSEUDO_NODES").is_some_and(|n| n > 1)
        || fewer("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE")
        || fewer("MPI_LOCALNRANKS", "PMI_SIZE")
        || var("SLURM_NNODES").is_some_and(|n| n > 1);
    !off && spans && crate::state::offnode_queues_wanted()
}

/// `MPI_Init`: initializes the MPI library (`PMPI_Init`, or `PMPI_Init_thread` with
/// `MPI_THREAD_MULTIPLE` where `wants_thread_multiple`), then starts the shim.
///
/// # Safety
/// As `MPI_Init`: `argc` and `argv` are NULL or point to `main`'s arguments.
#[no_mangle]
pub unsafe extern "C" fn MPI_Init(argc: *mut c_int, argv: *mut *mut *mut c_char) -> c_int {
    let rc = if wants_thread_multiple() {
        let mut provided = 0;
        // SAFETY: the caller's arguments, passed on; a local out-pointer.
        unsafe { PMPI_Init_thread(argc, argv, mpi_sys::MPI_THREAD_MULTIPLE as c_int, &mut provided) }
    } else {
        // SAFETY: the caller's arguments, passed on.
        unsafe { PMPI_Init(argc, argv) }
    };
    if rc == SUCCESS {
        start();
    }
    rc
}

/// `MPI_Init_thread`: initializes the MPI library (`PMPI_Init_thread`, at
/// `MPI_THREAD_MULTIPLE` where `wants_thread_multiple`: MPI may provide more than a
/// program requires, and `provided` says what it gave), then starts the shim.
///
/// # Safety
/// As `MPI_Init_thread`: `argc` and `argv` are NULL or point to `main`'s arguments, and
/// `provided` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Init_thread(
    argc: *mut c_int,
    argv: *mut *mut *mut c_char,
    required: c_int,
    provided: *mut c_int,
) -> c_int {
    let required = match wants_thread_multiple() {
        true => required.max(mpi_sys::MPI_THREAD_MULTIPLE as c_int),
        false => required,
    };
    // SAFETY: the caller's arguments, passed on.
    let rc = unsafe { PMPI_Init_thread(argc, argv, required, provided) };
    if rc == SUCCESS {
        start();
    }
    rc
}

/// `MPI_Finalize`: lets the shim's transfers finish and releases gpulmt (collectively over
/// the node), then finalizes the MPI library.
///
/// # Safety
/// As `MPI_Finalize`: MPI is initialized and not yet finalized, and no other thread of the
/// process is in an MPI call.
#[no_mangle]
pub unsafe extern "C" fn MPI_Finalize() -> c_int {
    // The device path's duplicate of MPI_COMM_WORLD, while the library can free it.
    super::coll::device::finalize();
    if ACTIVE.swap(false, Ordering::AcqRel) {
        // The helper thread first: it takes the shim's lock.
        crate::state::stop_background();
        let shim = lock().take();
        if let Some(s) = shim {
            s.finalize();
        }
    }
    // SAFETY: no arguments.
    unsafe { PMPI_Finalize() }
}
