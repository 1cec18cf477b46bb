//! Scatters: `MPI_Scatter`, `MPI_Scatterv` and their non-blocking forms, device buffers
//! staged whole. The send buffer is used at the root only; the root's receive buffer may
//! be `MPI_IN_PLACE` (its block then stays where it is in the send buffer).

use std::ffi::{c_int, c_void};

use mpi_sys::{MPI_Comm, MPI_Datatype, MPI_Request, PMPI_Iscatter, PMPI_Iscatterv, PMPI_Scatter, PMPI_Scatterv};

use super::{blocking, nonblocking, Arg, Site};
use crate::raw::*;
use crate::staging::{Role, Shape};

/// The send buffer as the call describes it: `count` elements per rank one after the
/// other, or per-rank counts and displacements.
#[derive(Clone, Copy)]
enum Send {
    Each(c_int),
    Varied(*const c_int, *const c_int),
}

/// The buffers of a scatter: the send buffer in at the root, the receive buffer out
/// (unless `MPI_IN_PLACE` at the root).
///
/// # Safety
/// `Varied` arrays hold `site.size` entries each at the root.
#[allow(clippy::too_many_arguments)]
unsafe fn scatter_args<'a>(
    site: &Site,
    send: Send,
    stype: MPI_Datatype,
    recv: *const c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
) -> Result<[Arg<'a>; 2], c_int> {
    let recv = if recv == in_place().cast_const() {
        Arg::Given
    } else {
        Arg::Buf(Shape::Count { count: rcount.into(), dt: rtype }, Role::Out)
    };
    if site.rank != root {
        return Ok([Arg::Given, recv]);
    }
    let shape = match send {
        Send::Each(count) => Shape::Count { count: i64::from(count) * i64::from(site.size), dt: stype },
        Send::Varied(counts, displs) => {
            if counts.is_null() || displs.is_null() {
                return Err(ERR_COUNT);
            }
            let n = site.size as usize;
            // SAFETY: the root's arrays of one entry per rank.
            let (counts, displs) =
                unsafe { (std::slice::from_raw_parts(counts, n), std::slice::from_raw_parts(displs, n)) };
            Shape::Blocks { counts, displs: Some(displs), dt: stype }
        }
    };
    Ok([Arg::Buf(shape, Role::In), recv])
}

/// `MPI_Scatter`: device buffers staged.
///
/// # Safety
/// As `MPI_Scatter`: the buffers hold what the counts and datatypes say where significant,
/// and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Scatter(
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
    let describe = |site: &Site| unsafe { scatter_args(site, Send::Each(scount), stype, recvbuf, rcount, rtype, root) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Scatter", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Scatter(p[0], scount, stype, p[1], rcount, rtype, root, comm)
        })
    }
}

/// `MPI_Scatterv`: device buffers staged.
///
/// # Safety
/// As `MPI_Scatterv`: the buffers hold what the counts, displacements and datatypes say
/// where significant (the arrays one entry per rank at the root), and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Scatterv(
    sendbuf: *const c_void,
    scounts: *const c_int,
    displs: *const c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    let send = Send::Varied(scounts, displs);
    // SAFETY: the root's arrays of one entry per rank (read at the root only).
    let describe = |site: &Site| unsafe { scatter_args(site, send, stype, recvbuf, rcount, rtype, root) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Scatterv", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Scatterv(p[0], scounts, displs, stype, p[1], rcount, rtype, root, comm)
        })
    }
}

/// `MPI_Iscatter`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Iscatter`: as [`MPI_Scatter`], the buffers stay valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatter(
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
    let describe = |site: &Site| unsafe { scatter_args(site, Send::Each(scount), stype, recvbuf, rcount, rtype, root) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Iscatter",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Iscatter(p[0], scount, stype, p[1], rcount, rtype, root, comm, req),
            request,
        )
    }
}

/// `MPI_Iscatterv`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Iscatterv`: as [`MPI_Scatterv`], the buffers and arrays stay valid until the
/// request completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iscatterv(
    sendbuf: *const c_void,
    scounts: *const c_int,
    displs: *const c_int,
    stype: MPI_Datatype,
    recvbuf: *mut c_void,
    rcount: c_int,
    rtype: MPI_Datatype,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let send = Send::Varied(scounts, displs);
    // SAFETY: the root's arrays of one entry per rank (read at the root only).
    let describe = |site: &Site| unsafe { scatter_args(site, send, stype, recvbuf, rcount, rtype, root) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Iscatterv",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Iscatterv(p[0], scounts, displs, stype, p[1], rcount, rtype, root, comm, req),
            request,
        )
    }
}
