//! The endpoint API across nodes: `gpulmt_init_mpi` joins a gpulmt job spanning every
//! rank of an MPI communicator (`gpulmt::mpi::init_from_mpi`), so a C program started by
//! `mpirun` reaches the ranks of its node by the LMT protocols and the ranks of other
//! nodes through the internode path (GIO queues and the proxy over MPI,
//! `docs/internode.md`).
//!
//! The library must be built with the crate feature `mpi` (`cargo build -p gpulmt-ffi
//! --features mpi`), against the MPI the program uses: an `MPI_Comm` is a pointer in Open
//! MPI and an `int` in MPICH, so the header cannot name the type without including
//! `mpi.h`. The caller passes the address of its communicator and its size instead, which
//! the library checks against the handle of the MPI it was built with. Without the
//! feature the function exists (the header is the same) and says how to get it.

use std::ffi::{c_int, c_void};

use crate::error::{guard, FfiError};
use crate::handle::gpulmt_ctx;

/// Joins the gpulmt job of every rank of an MPI communicator (collective over it), for
/// programs started by an MPI launcher (`mpirun`) instead of `gpulmt-run`.
///
/// `comm` is the address of the caller's `MPI_Comm` and `comm_size` its size: call
/// `gpulmt_init_mpi(&comm, sizeof comm, &ctx)` (`comm` may be `MPI_COMM_WORLD` stored
/// in a variable, or any intracommunicator; the library duplicates what it keeps, and
/// the caller keeps and frees its own). Ranks in every later call and in statuses are
/// the communicator's ranks.
///
/// The ranks of one host (or, with `GPULMT_PSEUDO_NODES=N`, of one of the N groups
/// each host's ranks are split into: a test setting) form a node and move messages by
/// the LMT protocols; messages to other nodes go through the internode path, whose
/// proxy thread calls MPI beside the program's threads. When the communicator spans
/// more than one node, MPI must therefore have been initialized with
/// `MPI_Init_thread(..., MPI_THREAD_MULTIPLE, &provided)` giving `MPI_THREAD_MULTIPLE`;
/// otherwise every rank fails with `GPULMT_ERR_BOOTSTRAP` and a message that says so
/// (no rank hangs). A communicator within one node works at any thread level.
///
/// Call it after `MPI_Init_thread`, and `gpulmt_finalize` (collective) before
/// `MPI_Finalize`. On success `*out` is the new context; on failure it is NULL, and
/// the call returns:
/// - `GPULMT_ERR_UNSUPPORTED`: the library was built without MPI (rebuild with
///   `cargo build -p gpulmt-ffi --features mpi`);
/// - `GPULMT_ERR_INVALID_ARGUMENT`: NULL pointers, a `comm_size` that is not the size
///   of this library's MPI_Comm (the program was compiled against another MPI), MPI not
///   initialized or already finalized, `MPI_COMM_NULL` or an intercommunicator;
/// - `GPULMT_ERR_BOOTSTRAP` (or a configuration or device error): a rank could not join
///   its node or start the internode path; every rank of the communicator fails.
///
/// # Safety
/// `comm` is NULL or valid for reads of `comm_size` bytes holding a live communicator
/// handle (or `MPI_COMM_NULL`); `out` is NULL or valid for writes of a pointer.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_init_mpi(comm: *const c_void, comm_size: usize, out: *mut *mut gpulmt_ctx) -> c_int {
    gpulmt::logging::init("warn");
    guard(|| {
        // SAFETY: the caller's contract.
        let slot = unsafe { crate::handle::out(out, "out")? };
        *slot = std::ptr::null_mut();
        if comm.is_null() {
            return Err(FfiError::invalid("comm is NULL: pass the address of an MPI_Comm (&comm)"));
        }
        // SAFETY: `comm` is non-null and, by the caller's contract, readable for
        // `comm_size` bytes; `out` is valid for writes (checked non-null above).
        unsafe { init(comm, comm_size, out) }
    })
}

/// The body of [`gpulmt_init_mpi`] with MPI.
///
/// # Safety
/// As [`gpulmt_init_mpi`], with `comm` and `out` non-null.
#[cfg(feature = "mpi")]
unsafe fn init(comm: *const c_void, comm_size: usize, out: *mut *mut gpulmt_ctx) -> Result<(), FfiError> {
    use gpulmt::mpi::rsmpi::{environment, ffi, raw::FromRaw, topology::SimpleCommunicator};
    use std::mem::{size_of, ManuallyDrop};

    if comm_size != size_of::<ffi::MPI_Comm>() {
        return Err(FfiError::invalid(format!(
            "comm_size is {comm_size}, but this libgpulmt's MPI_Comm has {} bytes: the program was compiled \
             against another MPI than the library (Open MPI's MPI_Comm is a pointer, MPICH's an int); build both \
             with the same mpicc",
            size_of::<ffi::MPI_Comm>()
        )));
    }
    if !environment::is_initialized() || environment::is_finalized() {
        return Err(FfiError::invalid(
            "MPI is not initialized (or already finalized): call MPI_Init_thread(..., MPI_THREAD_MULTIPLE, \
             &provided) before gpulmt_init_mpi, and MPI_Finalize after gpulmt_finalize",
        ));
    }
    // SAFETY: `comm` is readable for `comm_size` bytes, which is the size of an MPI_Comm
    // (checked above); read unaligned, as C gives no alignment promise through void*.
    let raw: ffi::MPI_Comm = unsafe { comm.cast::<ffi::MPI_Comm>().read_unaligned() };
    // SAFETY: reading rsmpi's constants (initialized from the MPI library's own).
    let (null, world, selfc) = unsafe { (ffi::RSMPI_COMM_NULL, ffi::RSMPI_COMM_WORLD, ffi::RSMPI_COMM_SELF) };
    if raw == null {
        return Err(FfiError::invalid("comm is MPI_COMM_NULL: pass an intracommunicator of the job"));
    }
    let mut inter = 0;
    // SAFETY: a live communicator handle (the caller's contract), a local out-pointer.
    if unsafe { ffi::MPI_Comm_test_inter(raw, &mut inter) } != 0 || inter != 0 {
        return Err(FfiError::invalid(
            "comm is an intercommunicator (or not a valid communicator): pass an intracommunicator",
        ));
    }
    // The caller owns its communicator: rsmpi's handle for one that is not predefined
    // would free it when dropped, so it is never dropped.
    let comm = ManuallyDrop::new(if raw == world {
        SimpleCommunicator::world()
    } else if raw == selfc {
        SimpleCommunicator::self_comm()
    } else {
        // SAFETY: a live intracommunicator that is neither predefined one (checked above);
        // rsmpi's handle is never dropped, so the caller's handle stays the caller's.
        unsafe { SimpleCommunicator::from_raw(raw) }
    });
    // Below MPI_THREAD_MULTIPLE a job of one node still starts (no proxy thread); across
    // nodes `init_from_mpi` fails on every rank with the internode path's message.
    let ctx = gpulmt::mpi::init_from_mpi(&*comm)?;
    // SAFETY: `out` is valid for writes (the caller's contract, checked non-null).
    unsafe { crate::endpoint::hand_out(out, gpulmt_ctx::new(ctx, None)) };
    Ok(())
}

/// The body of [`gpulmt_init_mpi`] without MPI: says how to build a library with it.
///
/// # Safety
/// None: nothing is read or written.
#[cfg(not(feature = "mpi"))]
unsafe fn init(_comm: *const c_void, _comm_size: usize, _out: *mut *mut gpulmt_ctx) -> Result<(), FfiError> {
    Err(FfiError::unsupported(
        "this libgpulmt was built without MPI: rebuild it with `cargo build -p gpulmt-ffi --features mpi` \
         (against the MPI the program uses) to call gpulmt_init_mpi",
    ))
}
