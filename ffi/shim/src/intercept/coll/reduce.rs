//! Reductions: `MPI_Reduce`, `MPI_Allreduce`, `MPI_Scan`, `MPI_Exscan`,
//! `MPI_Reduce_scatter`, `MPI_Reduce_scatter_block`, their non-blocking forms, and
//! `MPI_Reduce_local`. The blocking ones on one count (all but the scatters) are split
//! into element ranges when large ([`reduction`]).

use std::ffi::{c_int, c_void};

use mpi_sys::{
    MPI_Comm, MPI_Datatype, MPI_Op, MPI_Request, PMPI_Allreduce, PMPI_Exscan, PMPI_Iallreduce, PMPI_Iexscan,
    PMPI_Ireduce, PMPI_Ireduce_scatter, PMPI_Ireduce_scatter_block, PMPI_Iscan, PMPI_Reduce, PMPI_Reduce_local,
    PMPI_Reduce_scatter, PMPI_Reduce_scatter_block, PMPI_Scan,
};

use super::{blocking, nonblocking, reduction, Arg, Site};
use crate::raw::*;
use crate::staging::{Role, Shape};

fn count(count: impl Into<i64>, dt: MPI_Datatype) -> Shape<'static> {
    Shape::Count { count: count.into(), dt }
}

/// `MPI_Reduce`'s buffers: the send buffer everywhere (at the root `MPI_IN_PLACE`, the
/// receive buffer then holding the root's input), the receive buffer at the root.
fn reduce_args(site: &Site, send: *const c_void, n: c_int, dt: MPI_Datatype, root: c_int) -> [Arg<'static>; 2] {
    if site.rank != root {
        [Arg::Buf(count(n, dt), Role::In), Arg::Given]
    } else if send == in_place().cast_const() {
        [Arg::Given, Arg::Buf(count(n, dt), Role::InOut)]
    } else {
        [Arg::Buf(count(n, dt), Role::In), Arg::Buf(count(n, dt), Role::Out)]
    }
}

/// The buffers of a reduction whose every rank receives (`MPI_Allreduce`, `MPI_Scan`,
/// `MPI_Exscan`): `MPI_IN_PLACE` makes the receive buffer the input too. `keep`: the
/// receive buffer is read as well, so that staging leaves it as it was where the call
/// writes nothing (`MPI_Exscan` on rank 0).
fn all_args(send: *const c_void, n: c_int, dt: MPI_Datatype, keep: bool) -> [Arg<'static>; 2] {
    if send == in_place().cast_const() || keep {
        let send = if send == in_place().cast_const() { Arg::Given } else { Arg::Buf(count(n, dt), Role::In) };
        [send, Arg::Buf(count(n, dt), Role::InOut)]
    } else {
        [Arg::Buf(count(n, dt), Role::In), Arg::Buf(count(n, dt), Role::Out)]
    }
}

/// `MPI_Reduce_scatter_block`'s buffers: `recvcount` elements per rank in, `recvcount`
/// out (with `MPI_IN_PLACE`, the receive buffer holds the input).
fn scatter_block_args(site: &Site, send: *const c_void, recvcount: c_int, dt: MPI_Datatype) -> [Arg<'static>; 2] {
    let all = i64::from(recvcount) * i64::from(site.size);
    if send == in_place().cast_const() {
        [Arg::Given, Arg::Buf(count(all, dt), Role::InOut)]
    } else {
        [Arg::Buf(count(all, dt), Role::In), Arg::Buf(count(recvcount, dt), Role::Out)]
    }
}

/// `MPI_Reduce_scatter`'s buffers: the sum of `recvcounts` in, this rank's count out.
///
/// # Safety
/// `recvcounts` holds `site.size` counts.
unsafe fn scatter_args(
    site: &Site,
    send: *const c_void,
    recvcounts: *const c_int,
    dt: MPI_Datatype,
) -> Result<[Arg<'static>; 2], c_int> {
    if recvcounts.is_null() {
        return Err(ERR_COUNT);
    }
    // SAFETY: the caller's array of one count per rank.
    let counts = unsafe { std::slice::from_raw_parts(recvcounts, site.size as usize) };
    let all: i64 = counts.iter().map(|&c| i64::from(c)).sum();
    let mine = counts[site.rank as usize];
    Ok(if send == in_place().cast_const() {
        [Arg::Given, Arg::Buf(count(all, dt), Role::InOut)]
    } else {
        [Arg::Buf(count(all, dt), Role::In), Arg::Buf(count(mine, dt), Role::Out)]
    })
}

/// The library's `MPI_Allreduce`, `MPI_Scan` or `MPI_Exscan`.
type PmpiEveryRank = unsafe extern "C" fn(*const c_void, *mut c_void, c_int, MPI_Datatype, MPI_Op, MPI_Comm) -> c_int;

/// The library's `MPI_Iallreduce`, `MPI_Iscan` or `MPI_Iexscan`.
type PmpiEveryRankNb =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, MPI_Datatype, MPI_Op, MPI_Comm, *mut MPI_Request) -> c_int;

/// A blocking reduction whose every rank receives (`pmpi`: `MPI_Allreduce`, `MPI_Scan`,
/// `MPI_Exscan`; `keep_first`: rank 0's receive buffer, which `MPI_Exscan` leaves
/// undefined, is left as it was), split into element ranges when large.
///
/// # Safety
/// The arguments of `name`, as the caller of that MPI function gives them.
#[allow(clippy::too_many_arguments)]
unsafe fn every_rank(
    name: &'static str,
    pmpi: PmpiEveryRank,
    keep_first: bool,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    let describe = |site: &Site, n| all_args(sendbuf, n, dt, keep_first && site.rank == 0);
    // SAFETY: the caller's arguments, passed on (per element range when split).
    unsafe {
        reduction(name, comm, [sendbuf.cast_mut(), recvbuf], count, dt, describe, |s, r, n| pmpi(s, r, n, dt, op, comm))
    }
}

/// The non-blocking form of [`every_rank`] (`pmpi`: `MPI_Iallreduce`, `MPI_Iscan`,
/// `MPI_Iexscan`): device buffers staged, copied back when the request completes.
///
/// # Safety
/// As [`every_rank`]; the buffers stay valid until the request completes, and `request`
/// is valid for writes.
#[allow(clippy::too_many_arguments)]
unsafe fn every_rank_nb(
    name: &'static str,
    pmpi: PmpiEveryRankNb,
    keep_first: bool,
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let describe = |site: &Site| Ok(all_args(sendbuf, count, dt, keep_first && site.rank == 0));
    // SAFETY: `nonblocking` passes the caller's buffers or their staged copies and a
    // request it owns; the other arguments are the caller's.
    let call = |p: [*mut c_void; 2], req| unsafe { pmpi(p[0], p[1], count, dt, op, comm, req) };
    // SAFETY: the caller's arguments, passed on.
    unsafe { nonblocking(name, comm, [sendbuf.cast_mut(), recvbuf], describe, call, request) }
}

/// `MPI_Reduce`: device buffers staged; split into element ranges when large.
///
/// # Safety
/// As `MPI_Reduce`: the buffers hold `count` elements of `dt` where significant, and the
/// handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
) -> c_int {
    let describe = |site: &Site, n| reduce_args(site, sendbuf, n, dt, root);
    // SAFETY: the caller's arguments, passed on (per element range when split).
    unsafe {
        reduction("MPI_Reduce", comm, [sendbuf.cast_mut(), recvbuf], count, dt, describe, |s, r, n| {
            PMPI_Reduce(s, r, n, dt, op, root, comm)
        })
    }
}

/// `MPI_Allreduce`: device buffers staged; split into element ranges when large.
///
/// # Safety
/// As `MPI_Allreduce`: the buffers hold `count` elements of `dt`, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Allreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the caller's arguments.
    if let Some(rc) = unsafe { super::device::allreduce(sendbuf, recvbuf, count, dt, op, comm) } {
        return rc;
    }
    // SAFETY: the caller's arguments.
    unsafe { every_rank("MPI_Allreduce", PMPI_Allreduce, false, sendbuf, recvbuf, count, dt, op, comm) }
}

/// `MPI_Scan`: device buffers staged; split into element ranges when large.
///
/// # Safety
/// As `MPI_Scan`: the buffers hold `count` elements of `dt`, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Scan(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { every_rank("MPI_Scan", PMPI_Scan, false, sendbuf, recvbuf, count, dt, op, comm) }
}

/// `MPI_Exscan`: device buffers staged; split into element ranges when large. Rank 0's
/// receive buffer, which MPI leaves undefined, is left as it was.
///
/// # Safety
/// As `MPI_Exscan`: the buffers hold `count` elements of `dt`, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Exscan(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { every_rank("MPI_Exscan", PMPI_Exscan, true, sendbuf, recvbuf, count, dt, op, comm) }
}

/// `MPI_Reduce_local`: device buffers staged; split into element ranges when large
/// (errors go to `MPI_COMM_SELF`'s handler).
///
/// # Safety
/// As `MPI_Reduce_local`: both buffers hold `count` elements of `dt`, and the handles are
/// valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_local(
    inbuf: *const c_void,
    inoutbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
) -> c_int {
    let describe = |_: &Site, n| [Arg::Buf(self::count(n, dt), Role::In), Arg::Buf(self::count(n, dt), Role::InOut)];
    // SAFETY: the caller's arguments, passed on (per element range when split).
    unsafe {
        reduction("MPI_Reduce_local", comm_self(), [inbuf.cast_mut(), inoutbuf], count, dt, describe, |i, io, n| {
            PMPI_Reduce_local(i, io, n, dt, op)
        })
    }
}

/// `MPI_Reduce_scatter_block`: device buffers staged whole.
///
/// # Safety
/// As `MPI_Reduce_scatter_block`: the send buffer holds `recvcount` elements of `dt` per
/// rank, the receive buffer `recvcount`, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter_block(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the caller's arguments.
    if let Some(rc) = unsafe { super::device::reduce_scatter_block(sendbuf, recvbuf, recvcount, dt, op, comm) } {
        return rc;
    }
    let describe = |site: &Site| Ok(scatter_block_args(site, sendbuf, recvcount, dt));
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Reduce_scatter_block", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Reduce_scatter_block(p[0], p[1], recvcount, dt, op, comm)
        })
    }
}

/// `MPI_Reduce_scatter`: device buffers staged whole.
///
/// # Safety
/// As `MPI_Reduce_scatter`: `recvcounts` holds a count per rank, the send buffer their
/// sum of elements of `dt`, the receive buffer this rank's count, and the handles are valid.
#[no_mangle]
pub unsafe extern "C" fn MPI_Reduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
) -> c_int {
    // SAFETY: the caller's array of counts, one per rank of `comm`.
    let describe = |site: &Site| unsafe { scatter_args(site, sendbuf, recvcounts, dt) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        blocking("MPI_Reduce_scatter", comm, [sendbuf.cast_mut(), recvbuf], describe, |p| {
            PMPI_Reduce_scatter(p[0], p[1], recvcounts, dt, op, comm)
        })
    }
}

/// `MPI_Ireduce`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Ireduce`: as [`MPI_Reduce`], the buffers stay valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    root: c_int,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let describe = |site: &Site| Ok(reduce_args(site, sendbuf, count, dt, root));
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Ireduce",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Ireduce(p[0], p[1], count, dt, op, root, comm, req),
            request,
        )
    }
}

/// `MPI_Iallreduce`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Iallreduce`: as [`MPI_Allreduce`], the buffers stay valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iallreduce(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { every_rank_nb("MPI_Iallreduce", PMPI_Iallreduce, false, sendbuf, recvbuf, count, dt, op, comm, request) }
}

/// `MPI_Iscan`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Iscan`: as [`MPI_Scan`], the buffers stay valid until the request completes,
/// and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iscan(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { every_rank_nb("MPI_Iscan", PMPI_Iscan, false, sendbuf, recvbuf, count, dt, op, comm, request) }
}

/// `MPI_Iexscan`: device buffers staged, copied back when the request completes (rank 0's
/// receive buffer left as it was).
///
/// # Safety
/// As `MPI_Iexscan`: as [`MPI_Exscan`], the buffers stay valid until the request
/// completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Iexscan(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's arguments.
    unsafe { every_rank_nb("MPI_Iexscan", PMPI_Iexscan, true, sendbuf, recvbuf, count, dt, op, comm, request) }
}

/// `MPI_Ireduce_scatter_block`: device buffers staged, copied back when the request
/// completes.
///
/// # Safety
/// As `MPI_Ireduce_scatter_block`: as [`MPI_Reduce_scatter_block`], the buffers stay valid
/// until the request completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter_block(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcount: c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    let describe = |site: &Site| Ok(scatter_block_args(site, sendbuf, recvcount, dt));
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Ireduce_scatter_block",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Ireduce_scatter_block(p[0], p[1], recvcount, dt, op, comm, req),
            request,
        )
    }
}

/// `MPI_Ireduce_scatter`: device buffers staged, copied back when the request completes.
///
/// # Safety
/// As `MPI_Ireduce_scatter`: as [`MPI_Reduce_scatter`], the buffers and `recvcounts` stay
/// valid until the request completes, and `request` is valid for writes.
#[no_mangle]
pub unsafe extern "C" fn MPI_Ireduce_scatter(
    sendbuf: *const c_void,
    recvbuf: *mut c_void,
    recvcounts: *const c_int,
    dt: MPI_Datatype,
    op: MPI_Op,
    comm: MPI_Comm,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's array of counts, one per rank of `comm`.
    let describe = |site: &Site| unsafe { scatter_args(site, sendbuf, recvcounts, dt) };
    // SAFETY: the caller's arguments, passed on.
    unsafe {
        nonblocking(
            "MPI_Ireduce_scatter",
            comm,
            [sendbuf.cast_mut(), recvbuf],
            describe,
            |p, req| PMPI_Ireduce_scatter(p[0], p[1], recvcounts, dt, op, comm, req),
            request,
        )
    }
}
