//! Neighborhood collectives (`MPI_Neighbor_allgather`, `_allgatherv`, `_alltoall`,
//! `_alltoallv`, `_alltoallw`, their `MPI_Ineighbor_...` forms, and where the library
//! declares them (build.rs: `mpi_persistent_coll`) their MPI-4 persistent
//! `MPI_Neighbor_..._init` forms, refused at init): not staged. Device
//! buffers are refused with `MPI_ERR_UNSUPPORTED_OPERATION` naming the call, raised on the
//! communicator (a library that is not CUDA-aware would read device memory as host
//! memory); host buffers go to the library, the blocking forms keeping the shim's
//! transfers moving meanwhile. A rank that refuses does not enter the collective: as
//! with every collective error, its peers would wait there, so a program that lets
//! the error return must have refused on every rank.

use std::ffi::{c_int, c_void};

use mpi_sys::*;

use super::super::{active, raise, with};
use super::candidate;
use crate::state::while_blocked;

/// The error for device buffers in `call`, or `None` when no buffer is device memory.
fn refused(call: &str, bufs: [*const c_void; 2]) -> Option<c_int> {
    if !active() {
        return None;
    }
    let ptrs = || bufs.into_iter().filter(|p| candidate(*p)).map(|p| p as usize);
    if ptrs().all(|p| crate::hostmem::is_host(p, 1)) || !with(|s| s.any_device(ptrs())).unwrap_or(false) {
        return None;
    }
    Some(crate::mpierr::for_call(
        MPI_ERR_UNSUPPORTED_OPERATION as c_int,
        call,
        "device buffers in neighborhood collectives are not supported (the shim does not stage them); use host \
         buffers, or point-to-point calls, which take device buffers",
    ))
}

/// Defines neighborhood collectives: `name => pmpi(args) blocking|nonblocking on` the
/// send buffer, the receive buffer and the communicator among the arguments.
macro_rules! neighbor {
    ($($name:ident => $pmpi:ident($($arg:ident: $ty:ty),* $(,)?) $form:ident on $sb:ident, $rb:ident, $comm:ident;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: device buffers refused (see the module's doc).")]
        ///
        /// # Safety
        /// As the MPI function: the buffers and arrays hold what the standard says for the
        /// communicator's topology, and the handles and out-pointers are valid.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            if let Some(code) = refused(stringify!($name), [$sb.cast(), $rb.cast_const().cast()]) {
                // SAFETY: the caller's communicator.
                return unsafe { raise($comm, code) };
            }
            neighbor!(@call $form $pmpi($($arg),*))
        }
    )*};
    (@call blocking $pmpi:ident($($arg:ident),*)) => {
        // SAFETY: the caller's arguments, passed on.
        while_blocked(|| unsafe { $pmpi($($arg),*) })
    };
    (@call nonblocking $pmpi:ident($($arg:ident),*)) => {
        // SAFETY: the caller's arguments, passed on.
        unsafe { $pmpi($($arg),*) }
    };
}

neighbor! {
    MPI_Neighbor_allgather => PMPI_Neighbor_allgather(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int,
        recvtype: MPI_Datatype, comm: MPI_Comm,
    ) blocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_allgatherv => PMPI_Neighbor_allgatherv(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void,
        recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm,
    ) blocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_alltoall => PMPI_Neighbor_alltoall(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int,
        recvtype: MPI_Datatype, comm: MPI_Comm,
    ) blocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_alltoallv => PMPI_Neighbor_alltoallv(
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm,
    ) blocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_alltoallw => PMPI_Neighbor_alltoallw(
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype,
        comm: MPI_Comm,
    ) blocking on sendbuf, recvbuf, comm;
    MPI_Ineighbor_allgather => PMPI_Ineighbor_allgather(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int,
        recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Ineighbor_allgatherv => PMPI_Ineighbor_allgatherv(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void,
        recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm,
        request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Ineighbor_alltoall => PMPI_Ineighbor_alltoall(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int,
        recvtype: MPI_Datatype, comm: MPI_Comm, request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Ineighbor_alltoallv => PMPI_Ineighbor_alltoallv(
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm,
        request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Ineighbor_alltoallw => PMPI_Ineighbor_alltoallw(
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype,
        comm: MPI_Comm, request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
}

#[cfg(mpi_persistent_coll)]
neighbor! {
    MPI_Neighbor_allgather_init => PMPI_Neighbor_allgather_init(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int,
        recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_allgatherv_init => PMPI_Neighbor_allgatherv_init(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void,
        recvcounts: *const c_int, displs: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info,
        request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_alltoall_init => PMPI_Neighbor_alltoall_init(
        sendbuf: *const c_void, sendcount: c_int, sendtype: MPI_Datatype, recvbuf: *mut c_void, recvcount: c_int,
        recvtype: MPI_Datatype, comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_alltoallv_init => PMPI_Neighbor_alltoallv_init(
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const c_int, sendtype: MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const c_int, recvtype: MPI_Datatype, comm: MPI_Comm,
        info: MPI_Info, request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
    MPI_Neighbor_alltoallw_init => PMPI_Neighbor_alltoallw_init(
        sendbuf: *const c_void, sendcounts: *const c_int, sdispls: *const MPI_Aint, sendtypes: *const MPI_Datatype,
        recvbuf: *mut c_void, recvcounts: *const c_int, rdispls: *const MPI_Aint, recvtypes: *const MPI_Datatype,
        comm: MPI_Comm, info: MPI_Info, request: *mut MPI_Request,
    ) nonblocking on sendbuf, recvbuf, comm;
}
