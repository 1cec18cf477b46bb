//! Communicator constructors (`MPI_Comm_dup`, `MPI_Comm_split`, `MPI_Cart_create`, ...):
//! collectives of the library that take no buffer, so the shim stages nothing; it only
//! keeps its transfers moving while the call blocks, as for any blocking collective
//! (`crate::state::while_blocked`: without it, a peer's receive that needs this rank's
//! part of a transfer would wait until every rank left the constructor, and a peer that
//! enters it only after that receive would never let it finish).

use std::ffi::c_int;

use mpi_sys::*;

use crate::state::while_blocked;

/// Defines `$name` as `$pmpi` run under [`while_blocked`].
macro_rules! with_progress {
    ($($(#[$doc:meta])* $name:ident => $pmpi:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// As the MPI function of that name: the handles are valid, the arrays hold what
        /// the standard says, and the out-pointers are valid for writes.
        #[no_mangle]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            // SAFETY: the caller's arguments, passed on.
            while_blocked(|| unsafe { $pmpi($($arg),*) })
        }
    )*};
}

with_progress! {
    /// `MPI_Comm_dup`, with the shim's progress while it blocks.
    MPI_Comm_dup => PMPI_Comm_dup(comm: MPI_Comm, newcomm: *mut MPI_Comm);
    /// `MPI_Comm_dup_with_info`, with the shim's progress while it blocks.
    MPI_Comm_dup_with_info => PMPI_Comm_dup_with_info(comm: MPI_Comm, info: MPI_Info, newcomm: *mut MPI_Comm);
    /// `MPI_Comm_split`, with the shim's progress while it blocks.
    MPI_Comm_split => PMPI_Comm_split(comm: MPI_Comm, color: c_int, key: c_int, newcomm: *mut MPI_Comm);
    /// `MPI_Comm_split_type`, with the shim's progress while it blocks.
    MPI_Comm_split_type => PMPI_Comm_split_type(
        comm: MPI_Comm, split_type: c_int, key: c_int, info: MPI_Info, newcomm: *mut MPI_Comm,
    );
    /// `MPI_Comm_create`, with the shim's progress while it blocks.
    MPI_Comm_create => PMPI_Comm_create(comm: MPI_Comm, group: MPI_Group, newcomm: *mut MPI_Comm);
    /// `MPI_Comm_create_group`, with the shim's progress while it blocks.
    MPI_Comm_create_group => PMPI_Comm_create_group(comm: MPI_Comm, group: MPI_Group, tag: c_int, newcomm: *mut MPI_Comm);
    /// `MPI_Intercomm_create`, with the shim's progress while it blocks.
    MPI_Intercomm_create => PMPI_Intercomm_create(
        local_comm: MPI_Comm, local_leader: c_int, peer_comm: MPI_Comm, remote_leader: c_int, tag: c_int,
        newintercomm: *mut MPI_Comm,
    );
    /// `MPI_Intercomm_merge`, with the shim's progress while it blocks.
    MPI_Intercomm_merge => PMPI_Intercomm_merge(intercomm: MPI_Comm, high: c_int, newintracomm: *mut MPI_Comm);
    /// `MPI_Cart_create`, with the shim's progress while it blocks.
    MPI_Cart_create => PMPI_Cart_create(
        comm_old: MPI_Comm, ndims: c_int, dims: *const c_int, periods: *const c_int, reorder: c_int,
        comm_cart: *mut MPI_Comm,
    );
    /// `MPI_Cart_sub`, with the shim's progress while it blocks.
    MPI_Cart_sub => PMPI_Cart_sub(comm: MPI_Comm, remain_dims: *const c_int, newcomm: *mut MPI_Comm);
    /// `MPI_Graph_create`, with the shim's progress while it blocks.
    MPI_Graph_create => PMPI_Graph_create(
        comm_old: MPI_Comm, nnodes: c_int, index: *const c_int, edges: *const c_int, reorder: c_int,
        comm_graph: *mut MPI_Comm,
    );
    /// `MPI_Dist_graph_create`, with the shim's progress while it blocks.
    MPI_Dist_graph_create => PMPI_Dist_graph_create(
        comm_old: MPI_Comm, n: c_int, sources: *const c_int, degrees: *const c_int, destinations: *const c_int,
        weights: *const c_int, info: MPI_Info, reorder: c_int, comm_dist_graph: *mut MPI_Comm,
    );
    /// `MPI_Dist_graph_create_adjacent`, with the shim's progress while it blocks.
    MPI_Dist_graph_create_adjacent => PMPI_Dist_graph_create_adjacent(
        comm_old: MPI_Comm, indegree: c_int, sources: *const c_int, sourceweights: *const c_int, outdegree: c_int,
        destinations: *const c_int, destweights: *const c_int, info: MPI_Info, reorder: c_int,
        comm_dist_graph: *mut MPI_Comm,
    );
}
