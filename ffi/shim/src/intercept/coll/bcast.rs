//! `MPI_Bcast` and `MPI_Ibcast`: the root's device buffer is staged in, the others'
//! staged back. Staged whole (not split: the ranks' counts and datatypes may differ,
//! only their type signatures must match); beyond `GPULMT_MPI_STAGING_MAX` an error
//! that names the call. Large calls on device buffers of every rank take the
//! [`super::device`] path.

use std::ffi::{c_int, c_void};

use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request, PMPI_Bcast, PMPI_Ibcast};

use super::{blocking, nonblocking, Arg, Site};
use crate::staging::{Role, Shape};

/// The buffer: read at the root, written elsewhere.
fn bcast_args(site: &Site, count: c_int, dt: MPI_Datatype, root: c_int) -> [Arg<'static>; 1] {
    let role = if site.rank == root { Role::In } else { Role::Out };
    [Arg::Buf(Shape::Count { count: count.into(), dt }, role)]
}

/// `MPI_Bcast`: a device buffer staged.
///
/// # Safety
/// As `MPI_Bcast`: `buf` holds `count` elements of `dt`, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Bcast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the caller's arguments.
    if let Some(rc) = unsafe { super::device::bcast(buf, count, dt, root, comm) } {
        return rc;
    }
    let describe = |site: &Site| Ok(bcast_args(site, count, dt, root));
    // SAFETY: the caller's arguments, passed on.
    unsafe { blocking("MPI_Bcast", comm, [buf], describe, |p| PMPI_Bcast(p[0], count, dt, root, comm)) }
}

/// `MPI_Ibcast`: a device buffer staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Ibcast`: as [`MPI_Bcast`], the buffer stays valid until the request completes,
/// and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ibcast(
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let describe = |site: &Site| Ok(bcast_args(site, count, dt, root));
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Ibcast",
            comm,
            [buf],
            describe,
            |p, req| PMPI_Ibcast(p[0], count, dt, root, comm, req),
            request,
        )
    }
}
