//! MPI-4's persistent collectives (`MPI_Allreduce_init`, `MPI_Bcast_init`, ...), defined
//! only where the MPI library the shim is built against declares them (build.rs sets
//! `mpi_persistent_coll`: MPICH 4 does, Open MPI 4.1 does not, so there the program
//! cannot call them at all).
//!
//! With the shim active every rank's request is the shim's, whatever its buffers: a
//! placeholder (`super::super::persistent`) whose every `MPI_Start` runs the shim's
//! non-blocking form of the call (`MPI_Iallreduce`, ...) with the init call's arguments.
//! That form stages device buffers (a generalized request completed once the results
//! are copied back) and passes host buffers to the library's own non-blocking call. So
//! every rank issues the same library call at each start (`PMPI_Iallreduce` and its
//! kin), however the placements differ between ranks: a rank with device buffers cannot
//! use the library's persistent request on staged copies while a peer uses it on its own
//! buffers, as MPI never matches a persistent collective with a non-blocking one. The
//! price: the library's persistent optimizations (a schedule made once) are not used.
//!
//! `MPI_Barrier_init` (no buffers) is the library's; the neighborhood collectives'
//! persistent forms refuse device buffers at init, as their other forms do
//! (`super::neighbor`).

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use mpi_sys::*;

use super::super::active;
use super::super::persistent::create_collective;
use super::alltoall::{MPI_Ialltoall, MPI_Ialltoallv, MPI_Ialltoallw};
use super::bcast::MPI_Ibcast;
use super::gather::{MPI_Iallgather, MPI_Iallgatherv, MPI_Igather, MPI_Igatherv};
use super::reduce::{
    MPI_Iallreduce, MPI_Iexscan, MPI_Ireduce, MPI_Ireduce_scatter, MPI_Ireduce_scatter_block, MPI_Iscan,
};
use super::scatter::{MPI_Iscatter, MPI_Iscatterv};

/// The arguments of an init call, kept for its starts.
#[derive(Clone, Copy)]
struct Kept<T: Copy>(T);

// SAFETY: MPI handles and the program's addresses, which MPI's rules keep valid (and the
// arrays unchanged) until the request is freed; the shim reads them only at a start.
unsafe impl<T: Copy> Send for Kept<T> {}
// SAFETY: as above; never written.
unsafe impl<T: Copy> Sync for Kept<T> {}

impl<T: Copy> Kept<T> {
    /// The arguments (a method, so that a closure captures the whole `Kept`).
    fn get(&self) -> T {
        self.0
    }
}

/// Defines `$name` (MPI's persistent collective, its arguments those of `$nb` plus
/// `info`; `$comm` names its communicator argument): with the shim active a placeholder whose starts run the shim's `$nb`, else
/// the library's `$pmpi`.
macro_rules! persistent_collectives {
    ($($(#[$doc:meta])* $name:ident => $nb:ident, $pmpi:ident($($arg:ident: $ty:ty),* $(,)?) on $comm:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// As the MPI function of that name: the handles are valid, the buffers and arrays
        /// are what the standard says whenever the request is started (and the arrays
        /// stay unchanged until it is freed), and `request` is valid for writes.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty,)* info: MPI_Info, request: *mut MPI_Request) -> c_int {
            if !active() {
                // SAFETY: the caller's arguments, passed on.
                return unsafe { $pmpi($($arg,)* info, request) };
            }
            let kept = Kept(($($arg,)*));
            let start = move |req: *mut MPI_Request| {
                let ($($arg,)*) = kept.get();
                // SAFETY: the init call's arguments, valid at every start (see `Kept`); the
                // shim's own out-pointer.
                unsafe { $nb($($arg,)* req) }
            };
            // SAFETY: the caller's communicator and out-pointer; `start` as described.
            unsafe { create_collective($comm, Arc::new(start), request) }
        }
    )*};
}

persistent_collectives! {
    /// `MPI_Bcast_init`: each start an `MPI_Ibcast` of the shim's.
    MPI_Bcast_init => MPI_Ibcast, PMPI_Bcast_init(
        buf: *mut c_void, count: c_int, dt: MPI_Datatype, root: c_int, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Reduce_init`: each start an `MPI_Ireduce` of the shim's.
    MPI_Reduce_init => MPI_Ireduce, PMPI_Reduce_init(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, dt: MPI_Datatype, op: MPI_Op, root: c_int,
        comm: MPI_Comm,
    ) on comm;
    /// `MPI_Allreduce_init`: each start an `MPI_Iallreduce` of the shim's.
    MPI_Allreduce_init => MPI_Iallreduce, PMPI_Allreduce_init(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, dt: MPI_Datatype, op: MPI_Op, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Scan_init`: each start an `MPI_Iscan` of the shim's.
    MPI_Scan_init => MPI_Iscan, PMPI_Scan_init(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, dt: MPI_Datatype, op: MPI_Op, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Exscan_init`: each start an `MPI_Iexscan` of the shim's.
    MPI_Exscan_init => MPI_Iexscan, PMPI_Exscan_init(
        sendbuf: *const c_void, recvbuf: *mut c_void, count: c_int, dt: MPI_Datatype, op: MPI_Op, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Reduce_scatter_block_init`: each start an `MPI_Ireduce_scatter_block` of the shim's.
    MPI_Reduce_scatter_block_init => MPI_Ireduce_scatter_block, PMPI_Reduce_scatter_block_init(
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcount: c_int, dt: MPI_Datatype, op: MPI_Op, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Reduce_scatter_init`: each start an `MPI_Ireduce_scatter` of the shim's.
    MPI_Reduce_scatter_init => MPI_Ireduce_scatter, PMPI_Reduce_scatter_init(
        sendbuf: *const c_void, recvbuf: *mut c_void, recvcounts: *const c_int, dt: MPI_Datatype, op: MPI_Op,
        comm: MPI_Comm,
    ) on comm;
    /// `MPI_Gather_init`: each start an `MPI_Igather` of the shim's.
    MPI_Gather_init => MPI_Igather, PMPI_Gather_init(
        sendbuf: *const c_void, scount: c_int, stype: MPI_Datatype, recvbuf: *mut c_void, rcount: c_int,
        rtype: MPI_Datatype, root: c_int, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Gatherv_init`: each start an `MPI_Igatherv` of the shim's.
    MPI_Gatherv_init => MPI_Igatherv, PMPI_Gatherv_init(
        sendbuf: *const c_void, scount: c_int, stype: MPI_Datatype, recvbuf: *mut c_void, rcounts: *const c_int,
        displs: *const c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Allgather_init`: each start an `MPI_Iallgather` of the shim's.
    MPI_Allgather_init => MPI_Iallgather, PMPI_Allgather_init(
        sendbuf: *const c_void, scount: c_int, stype: MPI_Datatype, recvbuf: *mut c_void, rcount: c_int,
        rtype: MPI_Datatype, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Allgatherv_init`: each start an `MPI_Iallgatherv` of the shim's.
    MPI_Allgatherv_init => MPI_Iallgatherv, PMPI_Allgatherv_init(
        sendbuf: *const c_void, scount: c_int, stype: MPI_Datatype, recvbuf: *mut c_void, rcounts: *const c_int,
        displs: *const c_int, rtype: MPI_Datatype, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Scatter_init`: each start an `MPI_Iscatter` of the shim's.
    MPI_Scatter_init => MPI_Iscatter, PMPI_Scatter_init(
        sendbuf: *const c_void, scount: c_int, stype: MPI_Datatype, recvbuf: *mut c_void, rcount: c_int,
        rtype: MPI_Datatype, root: c_int, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Scatterv_init`: each start an `MPI_Iscatterv` of the shim's.
    MPI_Scatterv_init => MPI_Iscatterv, PMPI_Scatterv_init(
        sendbuf: *const c_void, scounts: *const c_int, displs: *const c_int, stype: MPI_Datatype,
        recvbuf: *mut c_void, rcount: c_int, rtype: MPI_Datatype, root: c_int, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Alltoall_init`: each start an `MPI_Ialltoall` of the shim's.
    MPI_Alltoall_init => MPI_Ialltoall, PMPI_Alltoall_init(
        sendbuf: *const c_void, scount: c_int, stype: MPI_Datatype, recvbuf: *mut c_void, rcount: c_int,
        rtype: MPI_Datatype, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Alltoallv_init`: each start an `MPI_Ialltoallv` of the shim's.
    MPI_Alltoallv_init => MPI_Ialltoallv, PMPI_Alltoallv_init(
        sendbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, stype: MPI_Datatype,
        recvbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rtype: MPI_Datatype, comm: MPI_Comm,
    ) on comm;
    /// `MPI_Alltoallw_init`: each start an `MPI_Ialltoallw` of the shim's.
    MPI_Alltoallw_init => MPI_Ialltoallw, PMPI_Alltoallw_init(
        sendbuf: *const c_void, scounts: *const c_int, sdispls: *const c_int, stypes: *const MPI_Datatype,
        recvbuf: *mut c_void, rcounts: *const c_int, rdispls: *const c_int, rtypes: *const MPI_Datatype,
        comm: MPI_Comm,
    ) on comm;
}
