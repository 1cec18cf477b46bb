//! Gathers: `MPI_Gather`, `MPI_Gatherv`, `MPI_Allgather`, `MPI_Allgatherv` and their
//! non-blocking forms, device buffers staged whole. The receive buffer is used at the
//! root only (`MPI_Gather*`), or everywhere (`MPI_Allgather*`); with `MPI_IN_PLACE` it
//! holds the rank's own contribution too, so it is staged in as well as back.

use std::ffi::{c_int, c_void};

use mpi_sys::{
    MPI_Comm, MPI_Datatype, MPI_Request, PMPI_Allgather, PMPI_Allgatherv, PMPI_Gather, PMPI_Gatherv, PMPI_Iallgather,
    PMPI_Iallgatherv, PMPI_Igather, PMPI_Igatherv,
};

use super::{blocking, nonblocking, Arg, Site};
use crate::raw::*;
use crate::staging::{Role, Shape};

/// The receive buffer as the call describes it: `count` elements per rank one after the
/// other, or per-rank counts and displacements.
#[derive(Clone, Copy)]
enum Recv {
    Each(c_int),
    Varied(*const c_int, *const c_int),
}

impl Recv {
    /// Its shape on a communicator of `size` ranks.
    ///
    /// # Safety
    /// `Varied` arrays hold `size` entries each.
    unsafe fn shape<'a>(self, size: c_int, dt: MPI_Datatype) -> Result<Shape<'a>, c_int> {
        Ok(match self {
            Recv::Each(count) => Shape::Count { count: i64::from(count) * i64::from(size), dt },
            Recv::Varied(counts, displs) => {
                if counts.is_null() || displs.is_null() {
                    return Err(ERR_COUNT);
                }
                // SAFETY: the caller's arrays of one entry per rank.
                let (counts, displs) = unsafe {
                    (
                        std::slice::from_raw_parts(counts, size as usize),
                        std::slice::from_raw_parts(displs, size as usize),
                    )
                };
                Shape::Blocks { counts, displs: Some(displs), dt }
            }
        })
    }
}

/// The buffers of a gather: the send buffer in (unless `MPI_IN_PLACE`), the receive
/// buffer out where it is used (`root`: only there; `None`: everywhere).
///
/// # Safety
/// As [`Recv::shape`].
#[allow(clippy::too_many_arguments)]
unsafe fn gather_args<'a>(
    site: &Site,
    send: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recv: Recv,
    rtype: MPI_Datatype,
    root: Option<c_int>,
) -> Result<[Arg<'a>; 2], c_int> {
    let receives = root.is_none_or(|r| r == site.rank);
    let in_place = send == in_place().cast_const();
    let send = if in_place { Arg::Given } else { Arg::Buf(Shape::Count { count: scount.into(), dt: stype }, Role::In) };
    if !receives {
        return Ok([send, Arg::Given]);
    }
    // SAFETY: the caller's contract.
    let shape = unsafe { recv.shape(site.size, rtype)? };
    Ok([send, Arg::Buf(shape, if in_place { Role::InOut } else { Role::Out })])
}

/// `MPI_Gather`: device buffers staged.
///
/// # Safety
/// As `MPI_Gather`: the buffers hold what the counts and datatypes say where significant,
/// and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Gather(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: no arrays.
    let describe =
        |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, Recv::Each(rcount), rtype, Some(root)) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Gather", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Gather(p[0], scount, stype, p[1], rcount, rtype, root, comm)
        })
    }
}

/// `MPI_Gatherv`: device buffers staged.
///
/// # Safety
/// As `MPI_Gatherv`: the buffers hold what the counts, displacements and datatypes say
/// where significant (the arrays one entry per rank at the root), and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Gatherv(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    let recv = Recv::Varied(rcounts, displs);
    // SAFETY: the root's arrays of one entry per rank (read at the root only).
    let describe = |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, recv, rtype, Some(root)) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Gatherv", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Gatherv(p[0], scount, stype, p[1], rcounts, displs, rtype, root, comm)
        })
    }
}

/// `MPI_Allgather`: device buffers staged.
///
/// # Safety
/// As `MPI_Allgather`: the buffers hold what the counts and datatypes say, and the handles
/// are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allgather(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the caller's arguments.
    if let Some(rc) = unsafe { super::device::allgather(sendbuf, scount, stype, recvbuf, rcount, rtype, comm) } {
        return rc;
    }
    // SAFETY: no arrays.
    let describe = |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, Recv::Each(rcount), rtype, None) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Allgather", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Allgather(p[0], scount, stype, p[1], rcount, rtype, comm)
        })
    }
}

/// `MPI_Allgatherv`: device buffers staged.
///
/// # Safety
/// As `MPI_Allgatherv`: the buffers hold what the counts, displacements and datatypes say
/// (the arrays one entry per rank), and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allgatherv(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
) -> c_int {
    let recv = Recv::Varied(rcounts, displs);
    // SAFETY: the caller's arrays of one entry per rank.
    let describe = |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, recv, rtype, None) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Allgatherv", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Allgatherv(p[0], scount, stype, p[1], rcounts, displs, rtype, comm)
        })
    }
}

/// `MPI_Igather`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Igather`: as [`MPI_Gather`], the buffers stay valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Igather(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: no arrays.
    let describe =
        |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, Recv::Each(rcount), rtype, Some(root)) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Igather",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Igather(p[0], scount, stype, p[1], rcount, rtype, root, comm, req),
            request,
        )
    }
}

/// `MPI_Igatherv`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Igatherv`: as [`MPI_Gatherv`], the buffers and arrays stay valid until the
/// request completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Igatherv(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let recv = Recv::Varied(rcounts, displs);
    // SAFETY: the root's arrays of one entry per rank (read at the root only).
    let describe = |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, recv, rtype, Some(root)) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Igatherv",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Igatherv(p[0], scount, stype, p[1], rcounts, displs, rtype, root, comm, req),
            request,
        )
    }
}

/// `MPI_Iallgather`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Iallgather`: as [`MPI_Allgather`], the buffers stay valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgather(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: no arrays.
    let describe = |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, Recv::Each(rcount), rtype, None) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Iallgather",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Iallgather(p[0], scount, stype, p[1], rcount, rtype, comm, req),
            request,
        )
    }
}

/// `MPI_Iallgatherv`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Iallgatherv`: as [`MPI_Allgatherv`], the buffers and arrays stay valid until
/// the request completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iallgatherv(
    sendbuf: *const c_void,
    scount: c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcounts: *const c_int,
    displs: *const c_int,
    rtype: MPI_Datatype,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let recv = Recv::Varied(rcounts, displs);
    // SAFETY: the caller's arrays of one entry per rank.
    let describe = |site: &Site| unsafe { gather_args(site, sendbuf, scount, stype, recv, rtype, None) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Iallgatherv",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Iallgatherv(p[0], scount, stype, p[1], rcounts, displs, rtype, comm, req),
            request,
        )
    }
}
