//! Starting the internode path over MPI (feature `mpi`), and registering windows across
//! the job.

use std::ffi::{c_int, c_void};

use ::mpi::ffi;
use ::mpi::raw::AsRaw;
use ::mpi::traits::{Communicator, CommunicatorCollectives};
use gpulmt_protocols::Rank;

use super::iface::mpi::{check, MpiIface};
use super::iface::IfaceCaps;
use super::producer::WindowId;
use super::NetPath;
use crate::config::NetConfig;
use crate::device::{Backend, BackendKind, MemoryKind};
use crate::offnode::NetError;

/// MPI requests the proxy keeps in flight besides its receive pools; past it, ops wait in
/// their queues (backpressure), so a burst cannot make `MPI_Testsome` scan without end.
const MAX_REQUESTS: usize = 4096;

fn down(what: &str, e: impl std::fmt::Display) -> NetError {
    NetError::Down(format!("{what}: {e}"))
}

/// Whether the MPI library passes device pointers itself: `MPIX_Query_cuda_support() ==
/// 1`. Open MPI declares it in `mpi-ext.h` (which rsmpi's bindings leave out), so it is
/// looked up at run time; a library without it (MPICH) counts as not CUDA-aware.
fn mpi_cuda_aware() -> bool {
    // SAFETY: dlsym on the process's global scope with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"MPIX_Query_cuda_support".as_ptr()) };
    if sym.is_null() {
        return false;
    }
    // SAFETY: Open MPI's mpi-ext.h declares `int MPIX_Query_cuda_support(void)`, and the
    // symbol is that function.
    let query: extern "C" fn() -> c_int = unsafe { std::mem::transmute(sym) };
    query() == 1
}

/// Starts the internode path of this rank of `comm` toward `peers`, the ranks of `comm`
/// on other nodes; ranks in the path are ranks of `comm` ("job ranks").
///
/// **Collective over `comm`**: every rank calls it (a rank without off-node peers with an
/// empty `peers`, or no rank at all where the job has one node). It duplicates `comm` for
/// the proxy (with `MPI_ERRORS_RETURN`: MPI errors become error completions) and checks
/// that every rank uses the same `GPULMT_NET_CHUNK`.
///
/// MPI must run with `MPI_THREAD_MULTIPLE` (the proxy thread calls MPI beside the
/// application's threads): a lower level is refused with an error that says how to
/// initialise MPI. Device data goes to MPI as device pointers when the library is
/// CUDA-aware (`MPIX_Query_cuda_support`), else through the proxy's staging buffers.
///
/// Shut the path down ([`OffNodePath::shutdown`](crate::offnode::OffNodePath::shutdown))
/// before `MPI_Finalize`: that frees the proxy's communicator.
pub fn start<C>(comm: &C, peers: &[Rank], cfg: &NetConfig, backend: Backend) -> Result<NetPath, NetError>
where
    C: Communicator + AsRaw<Raw = ffi::MPI_Comm>,
{
    // SAFETY: rsmpi's handle of a live communicator.
    unsafe { start_raw(comm.as_raw(), peers, cfg, backend) }
}

/// [`start`] on a raw communicator handle, for a caller that holds no rsmpi communicator
/// (the PMPI shim). Every MPI call it makes is a `PMPI_*` one (`iface::mpi`).
///
/// # Safety
/// `comm` is a live intra-communicator for the whole call.
pub unsafe fn start_raw(
    comm: ffi::MPI_Comm,
    peers: &[Rank],
    cfg: &NetConfig,
    backend: Backend,
) -> Result<NetPath, NetError> {
    let mut provided: c_int = 0;
    // SAFETY: MPI_Query_thread writes the level into a local.
    check("MPI_Query_thread", unsafe { ffi::PMPI_Query_thread(&mut provided) }).map_err(|e| down("MPI", e))?;
    // SAFETY: reads an extern constant of the MPI library.
    if provided < unsafe { ffi::RSMPI_THREAD_MULTIPLE } {
        return Err(NetError::Down(format!(
            "MPI runs at thread level {provided}, but the internode path's proxy thread calls MPI beside the \
             application's threads and needs MPI_THREAD_MULTIPLE: initialise MPI with \
             MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) (rsmpi: \
             gpulmt::mpi::rsmpi::initialize_with_threading(Threading::Multiple))"
        )));
    }
    // SAFETY: an MPI_Comm is a plain handle; MPI_Comm_dup overwrites it.
    let mut dup: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    // SAFETY: `comm` is a live communicator (rsmpi's handle); `dup` is a local.
    check("MPI_Comm_dup", unsafe { ffi::PMPI_Comm_dup(comm, &mut dup) }).map_err(|e| down("MPI", e))?;
    let free = |mut c: ffi::MPI_Comm| {
        // SAFETY: a communicator this function made and nothing else holds.
        unsafe { ffi::PMPI_Comm_free(&mut c) };
    };
    // SAFETY: `dup` is live; the handler is a constant of the library.
    let rc = unsafe { ffi::PMPI_Comm_set_errhandler(dup, ffi::RSMPI_ERRORS_RETURN) };
    if let Err(e) = check("MPI_Comm_set_errhandler", rc) {
        free(dup);
        return Err(down("MPI", e));
    }
    // Every rank cuts transfers into pieces of the same size: compare max and min.
    let mine = [cfg.chunk as i64, -(cfg.chunk as i64)];
    let mut all = [0i64; 2];
    // SAFETY: two i64 in and out, a constant datatype and op, the live `dup`.
    let rc = unsafe {
        ffi::PMPI_Allreduce(mine.as_ptr().cast(), all.as_mut_ptr().cast(), 2, ffi::RSMPI_INT64_T, ffi::RSMPI_MAX, dup)
    };
    if let Err(e) = check("MPI_Allreduce", rc) {
        free(dup);
        return Err(down("MPI", e));
    }
    if all[0] != -all[1] {
        free(dup);
        return Err(NetError::Down(format!(
            "GPULMT_NET_CHUNK differs between ranks (from {} to {} bytes): give every rank the same setting",
            -all[1], all[0]
        )));
    }
    let mut tag_ub: *mut c_int = std::ptr::null_mut();
    let mut flag: c_int = 0;
    // SAFETY: MPI_TAG_UB's value is a pointer to an int the library owns; `tag_ub` and
    // `flag` are locals it writes.
    let rc = unsafe {
        ffi::PMPI_Comm_get_attr(
            dup,
            ffi::MPI_TAG_UB as c_int,
            (&mut tag_ub as *mut *mut c_int).cast::<c_void>(),
            &mut flag,
        )
    };
    let max_tag = match (check("MPI_Comm_get_attr", rc), flag != 0 && !tag_ub.is_null()) {
        // SAFETY: with the flag set, the library's pointer to its tag bound.
        (Ok(()), true) => unsafe { *tag_ub },
        _ => 32767,
    };
    let device_memory = backend.kind() == BackendKind::Cuda && mpi_cuda_aware();
    let caps = IfaceCaps { device_memory, max_tag };
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `dup` is live; the out-pointers are locals.
    unsafe {
        ffi::PMPI_Comm_rank(dup, &mut rank);
        ffi::PMPI_Comm_size(dup, &mut size);
    }
    let (rank, size) = (rank as Rank, size as u32);
    tracing::info!(rank, max_tag, cuda_aware = device_memory, "internode path: MPI endpoint");
    // The proxy's CPU is picked by the rank's index on its host, pseudo-nodes or not:
    // they share the host's cores.
    let (host_local, host_size) = match host_place(dup) {
        Ok(v) => v,
        Err(e) => {
            free(dup);
            return Err(down("MPI", e));
        }
    };
    if !cfg.proxy_cpus.is_empty() && host_size > cfg.proxy_cpus.len() {
        tracing::warn!(
            ranks_on_host = host_size,
            cpus = cfg.proxy_cpus.len(),
            "GPULMT_NET_PROXY_CPU names fewer CPUs than this host has ranks: proxies share CPUs (list one per rank)"
        );
    }
    let max_requests = MAX_REQUESTS + 3 * cfg.ctrl_pool as usize;
    // SAFETY: `dup` is live, owned by nothing else from here on, and MPI runs with
    // MPI_THREAD_MULTIPLE (checked above).
    let iface = unsafe { MpiIface::new(dup, rank, size, caps, max_requests) };
    NetPath::start_with(Box::new(iface), peers, cfg, backend, host_local)
}

/// This rank's index among the ranks of its host, and their number
/// (`MPI_Comm_split_type` shared on `comm`; collective).
fn host_place(comm: ffi::MPI_Comm) -> Result<(u32, usize), super::iface::NetFail> {
    // SAFETY: an MPI_Comm is a plain handle; the split overwrites it.
    let mut host: ffi::MPI_Comm = unsafe { std::mem::zeroed() };
    let (mut rank, mut size): (c_int, c_int) = (0, 0);
    // SAFETY: `comm` is live; the split type and info are constants of the library; the
    // out-pointers are locals; `host` is freed before returning.
    unsafe {
        check("MPI_Comm_rank", ffi::PMPI_Comm_rank(comm, &mut rank))?;
        let rc =
            ffi::PMPI_Comm_split_type(comm, ffi::MPI_COMM_TYPE_SHARED as c_int, rank, ffi::RSMPI_INFO_NULL, &mut host);
        check("MPI_Comm_split_type", rc)?;
        let got = check("MPI_Comm_rank", ffi::PMPI_Comm_rank(host, &mut rank))
            .and_then(|()| check("MPI_Comm_size", ffi::PMPI_Comm_size(host, &mut size)));
        ffi::PMPI_Comm_free(&mut host);
        got?;
    }
    Ok((rank as u32, size as usize))
}

/// Exposes `base..base + size` on this rank and learns every peer's window of the same
/// id: **collective over `comm`** (the communicator the path was started on, or one with
/// the same ranks), called by every rank in the same order, as a symmetric allocation
/// would be. Returns the window's id.
///
/// # Safety
/// As [`NetPath::expose_window`].
pub unsafe fn register_window<C: Communicator>(
    path: &mut NetPath,
    comm: &C,
    base: usize,
    size: u64,
    mem: MemoryKind,
) -> Result<WindowId, NetError> {
    // SAFETY: this function's contract.
    let exposed = unsafe { path.expose_window(base, size, mem) };
    // The exchange happens even if exposing failed (a zero-sized entry), so that no rank
    // is left waiting in the collective.
    let mine = [base as u64, exposed.as_ref().map_or(u64::MAX, |_| size)];
    let mut all = vec![0u64; 2 * comm.size() as usize];
    comm.all_gather_into(&mine[..], &mut all[..]);
    let id = exposed?;
    for &peer in path.peers().to_vec().iter() {
        let (b, s) = (all[2 * peer as usize], all[2 * peer as usize + 1]);
        if s == u64::MAX {
            return Err(NetError::Down(format!("rank {peer} could not expose window {id}")));
        }
        path.add_peer_window(peer, id, b, s)?;
    }
    Ok(id)
}
