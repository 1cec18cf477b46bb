//! All-to-all: `MPI_Alltoall`, `MPI_Alltoallv`, `MPI_Alltoallw` and their non-blocking
//! forms, device buffers staged whole. With `MPI_IN_PLACE` the receive buffer holds the
//! data to send too, so it is staged in as well as back.

use std::ffi::{c_int, c_void};

use mpi_sys::{
    MPI_Comm, MPI_Datatype, MPI_Request, PMPI_Alltoall, PMPI_Alltoallv, PMPI_Alltoallw, PMPI_Ialltoall,
    PMPI_Ialltoallv, PMPI_Ialltoallw,
};

use super::{blocking, nonblocking, Arg, Site};
use crate::raw::*;
use crate::staging::{Role, Shape};

/// One side (send or receive) of an all-to-all as the call describes it.
#[derive(Clone, Copy)]
enum Side {
    /// `count` elements of the type for every rank, one block after the other.
    Each(c_int, MPI_Datatype),
    /// Per-rank counts and displacements (in elements of the type).
    Varied(*const c_int, *const c_int, MPI_Datatype),
    /// Per-rank counts, displacements in bytes, and types.
    Typed(*const c_int, *const c_int, *const MPI_Datatype),
}

impl Side {
    /// Its shape on a communicator of `size` ranks.
    ///
    /// # Safety
    /// The arrays of `Varied` and `Typed` hold `size` entries each.
    unsafe fn shape<'a>(self, size: c_int) -> Result<Shape<'a>, c_int> {
        let n = size as usize;
        Ok(match self {
            Side::Each(count, dt) => Shape::Count { count: i64::from(count) * i64::from(size), dt },
            Side::Varied(counts, displs, dt) => {
                if counts.is_null() || displs.is_null() {
                    return Err(ERR_COUNT);
                }
                // SAFETY: the caller's arrays of one entry per rank.
                let (counts, displs) =
                    unsafe { (std::slice::from_raw_parts(counts, n), std::slice::from_raw_parts(displs, n)) };
                Shape::Blocks { counts, displs: Some(displs), dt }
            }
            Side::Typed(counts, displs, types) => {
                if counts.is_null() || displs.is_null() || types.is_null() {
                    return Err(ERR_COUNT);
                }
                // SAFETY: as above.
                unsafe {
                    Shape::Typed {
                        counts: std::slice::from_raw_parts(counts, n),
                        displs: std::slice::from_raw_parts(displs, n),
                        types: std::slice::from_raw_parts(types, n),
                    }
                }
            }
        })
    }
}

/// The buffers of an all-to-all: the send buffer in (unless `MPI_IN_PLACE`: the receive
/// buffer is then read too), the receive buffer out.
///
/// # Safety
/// As [`Side::shape`], for both sides (the send side only without `MPI_IN_PLACE`).
unsafe fn alltoall_args<'a>(
    site: &Site,
    sendbuf: *const c_void,
    send: Side,
    recv: Side,
) -> Result<[Arg<'a>; 2], c_int> {
    // SAFETY: the caller's contract.
    let recv_shape = unsafe { recv.shape(site.size)? };
    if sendbuf == in_place().cast_const() {
        return Ok([Arg::Given, Arg::Buf(recv_shape, Role::InOut)]);
    }
    // SAFETY: as above.
    let send_shape = unsafe { send.shape(site.size)? };
    Ok([Arg::Buf(send_shape, Role::In), Arg::Buf(recv_shape, Role::Out)])
}

/// `MPI_Alltoall`: device buffers staged.
///
/// # Safety
/// As `MPI_Alltoall`: the buffers hold what the counts and datatypes say, and the handles
/// are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoall(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    let (send, recv) = (Side::Each(scount, stype), Side::Each(rcount, rtype));
    // SAFETY: no arrays.
    let describe = |site: &Site| unsafe { alltoall_args(site, sendbuf, send, recv) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Alltoall", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Alltoall(p[0], scount, stype, p[1], rcount, rtype, comm)
        })
    }
}

/// `MPI_Alltoallv`: device buffers staged.
///
/// # Safety
/// As `MPI_Alltoallv`: the buffers hold what the counts, displacements and datatypes say
/// (the arrays one entry per rank), and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoallv(
    sendbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    let (send, recv) = (Side::Varied(scounts, sdispls, stype), Side::Varied(rcounts, rdispls, rtype));
    // SAFETY: the caller's arrays of one entry per rank.
    let describe = |site: &Site| unsafe { alltoall_args(site, sendbuf, send, recv) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Alltoallv", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Alltoallv(p[0], scounts, sdispls, stype, p[1], rcounts, rdispls, rtype, comm)
        })
    }
}

/// `MPI_Alltoallw`: device buffers staged.
///
/// # Safety
/// As `MPI_Alltoallw`: the buffers hold what the counts, byte displacements and datatypes
/// say (the arrays one entry per rank), and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Alltoallw(
    sendbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: *const MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: *const MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    let (send, recv) = (Side::Typed(scounts, sdispls, stypes), Side::Typed(rcounts, rdispls, rtypes));
    // SAFETY: the caller's arrays of one entry per rank.
    let describe = |site: &Site| unsafe { alltoall_args(site, sendbuf, send, recv) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Alltoallw", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Alltoallw(p[0], scounts, sdispls, stypes, p[1], rcounts, rdispls, rtypes, comm)
        })
    }
}

/// `MPI_Ialltoall`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Ialltoall`: as [`MPI_Alltoall`], the buffers stay valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoall(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let (send, recv) = (Side::Each(scount, stype), Side::Each(rcount, rtype));
    // SAFETY: no arrays.
    let describe = |site: &Site| unsafe { alltoall_args(site, sendbuf, send, recv) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Ialltoall",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Ialltoall(p[0], scount, stype, p[1], rcount, rtype, comm, req),
            request,
        )
    }
}

/// `MPI_Ialltoallv`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Ialltoallv`: as [`MPI_Alltoallv`], the buffers and arrays stay valid until the
/// request completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoallv(
    sendbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let (send, recv) = (Side::Varied(scounts, sdispls, stype), Side::Varied(rcounts, rdispls, rtype));
    // SAFETY: the caller's arrays of one entry per rank.
    let describe = |site: &Site| unsafe { alltoall_args(site, sendbuf, send, recv) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Ialltoallv",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Ialltoallv(p[0], scounts, sdispls, stype, p[1], rcounts, rdispls, rtype, comm, req),
            request,
        )
    }
}

/// `MPI_Ialltoallw`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Ialltoallw`: as [`MPI_Alltoallw`], the buffers and arrays stay valid until the
/// request completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ialltoallw(
    sendbuf: *const c_void,
    scounts: *const c_int,
    sdispls: *const c_int,
    stypes: *const MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    rdispls: *const c_int,
    rtypes: *const MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let (send, recv) = (Side::Typed(scounts, sdispls, stypes), Side::Typed(rcounts, rdispls, rtypes));
    // SAFETY: the caller's arrays of one entry per rank.
    let describe = |site: &Site| unsafe { alltoall_args(site, sendbuf, send, recv) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Ialltoallw",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Ialltoallw(p[0], scounts, sdispls, stypes, p[1], rcounts, rdispls, rtypes, comm, req),
            request,
        )
    }
}
