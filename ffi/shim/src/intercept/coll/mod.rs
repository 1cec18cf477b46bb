//! The collectives: the MPI library runs them, on host copies of device buffers.
//!
//! Every collective is the same MPI call on every rank, whatever its buffers are: a rank
//! with device buffers stages them through host memory ([`crate::staging`]) around the
//! `PMPI_*` call its peers make on host buffers (blocking calls stay blocking,
//! non-blocking ones non-blocking), so placements may differ between ranks and between
//! the buffers of one call. Without a device buffer the call goes to the library as it
//! is: the only cost is a look at each buffer pointer.
//!
//! The one change to the calls themselves: a blocking reduction (`MPI_Reduce`,
//! `MPI_Allreduce`, `MPI_Scan`, `MPI_Exscan`) larger than a piece (a quarter of
//! `GPULMT_MPI_STAGING_MAX`, agreed at `MPI_Init`) is split into calls on element
//! ranges, on every rank (host buffers too, as a rank cannot know where its peers'
//! buffers are): exactly the same results, as reductions work element by element and
//! MPI requires the same count and datatype on every rank. Staging then holds two pieces
//! at a time, and the copies of one overlap the MPI call on the other. Other
//! collectives (their counts and datatypes may differ between ranks, or their blocks
//! follow the rank order) are staged whole; beyond the cap they fail with an MPI error
//! that names the call, as does anything else unsupported: device buffers in a
//! collective on an intercommunicator.
//!
//! While a blocking collective waits in the library, the shim's helper thread moves its
//! transfers (`crate::state::while_blocked`; `MPI_Barrier` waits for a `PMPI_Ibarrier`
//! with progress instead: see `barrier`). Non-blocking ones on staged buffers
//! are generalized requests that the shim's progress completes after copying the
//! results back; on host buffers the library's own requests.
//!
//! This module holds the driver every collective goes through; the calls are in one
//! module per family: [`reduce`], [`bcast`], [`gather`], [`scatter`], [`alltoall`],
//! [`neighbor`]. Large blocking `MPI_Bcast`, `MPI_Allgather`, `MPI_Allreduce` and
//! `MPI_Reduce_scatter_block` on
//! device buffers of every rank take the [`device`] path instead (gpulmt's
//! point-to-point and a reduction on the GPU), when the ranks agree to. MPI-4's
//! persistent collectives, where the library declares them, start the non-blocking
//! forms (`persistent`, built where the library has them).

pub mod alltoall;
pub mod bcast;
pub mod device;
pub mod gather;
pub mod neighbor;
#[cfg(mpi_persistent_coll)]
pub mod persistent;
pub mod reduce;
pub mod scatter;

use std::ffi::{c_int, c_void};

use mpi_sys::*;

use super::{active, raise, with};
use crate::mpierr;
use crate::raw::*;
use crate::staging::{Copier, Region, Role, Shape, Staged};
use crate::state::while_blocked;

/// What one buffer argument is to the call on this rank.
#[derive(Clone, Copy)]
pub enum Arg<'a> {
    /// Not used on this rank (`MPI_IN_PLACE`, or a buffer significant only at the
    /// root): passed as given.
    Given,
    /// Read, written or both, with the contents `Shape` describes.
    Buf(Shape<'a>, Role),
}

/// The calling rank's place in the collective's communicator.
pub struct Site {
    pub rank: c_int,
    pub size: c_int,
}

/// What the driver found for a call.
enum Plan {
    /// No device buffer (or the shim is off): the call as given.
    Pass,
    /// A failure to report to the communicator's handler.
    Failed(c_int),
    /// Device buffers, staged and copied in.
    Staged(Staged, Copier),
}

/// Whether `p` is a buffer pointer worth a look: not `MPI_IN_PLACE`, not NULL
/// (`MPI_BOTTOM`, or a buffer a rank does not use).
fn candidate(p: *const c_void) -> bool {
    !p.is_null() && p != in_place().cast_const()
}

/// The regions of the call's device buffers (`None` where an argument is host memory
/// or unused), or why there are none to stage: `Ok(None)` when no buffer is device
/// memory.
///
/// # Safety
/// `comm` is a valid communicator; `describe` may read the caller's arrays.
unsafe fn device_regions<'a, const N: usize>(
    name: &'static str,
    comm: MPI_Comm,
    bufs: &[*mut c_void; N],
    describe: impl FnOnce(&Site) -> Result<[Arg<'a>; N], c_int>,
) -> Result<Option<Vec<Option<Region>>>, c_int> {
    if !active() {
        return Ok(None);
    }
    let ptrs = || bufs.iter().filter(|p| candidate(p.cast_const())).map(|&p| p as usize);
    // The common case, without the shim's lock: every buffer known to be host memory.
    if ptrs().all(|p| crate::hostmem::is_host(p, 1)) || !with(|s| s.any_device(ptrs())).unwrap_or(false) {
        return Ok(None);
    }
    let (mut inter, mut rank, mut size) = (0, 0, 0);
    // SAFETY: the caller's communicator; locals as out-pointers.
    unsafe {
        PMPI_Comm_test_inter(comm, &mut inter);
        PMPI_Comm_rank(comm, &mut rank);
        PMPI_Comm_size(comm, &mut size);
    }
    if inter != 0 {
        return Err(mpierr::for_call(
            MPI_ERR_COMM as c_int,
            name,
            "device buffers in a collective on an intercommunicator are not supported (the shim stages only \
             intracommunicator collectives); use host buffers there",
        ));
    }
    // Arguments the library would reject: it reports them itself (before touching a buffer).
    let Ok(args) = describe(&Site { rank, size }) else { return Ok(None) };
    let mut regions = Vec::with_capacity(N);
    for (arg, &buf) in args.iter().zip(bufs) {
        regions.push(match *arg {
            Arg::Buf(shape, role) if candidate(buf.cast_const()) => match Region::of(buf as usize, shape, role) {
                Ok(r) => r,
                Err(_) => return Ok(None),
            },
            _ => None,
        });
    }
    let device =
        with(|s| regions.iter().map(|r| r.as_ref().is_some_and(|r| s.region_on_device(r))).collect::<Vec<_>>())
            .unwrap_or_default();
    let mut any = false;
    for (r, d) in regions.iter_mut().zip(device) {
        if !d {
            *r = None;
        }
        any |= r.is_some();
    }
    Ok(any.then_some(regions))
}

/// Stages the device buffers of a call and copies them in.
///
/// # Safety
/// As [`device_regions`].
unsafe fn plan<'a, const N: usize>(
    name: &'static str,
    comm: MPI_Comm,
    bufs: &[*mut c_void; N],
    describe: impl FnOnce(&Site) -> Result<[Arg<'a>; N], c_int>,
) -> Plan {
    // SAFETY: the caller's contract.
    let regions = match unsafe { device_regions(name, comm, bufs, describe) } {
        Ok(None) => return Plan::Pass,
        Ok(Some(r)) => r,
        Err(code) => return Plan::Failed(code),
    };
    let Some(copier) = with(|s| s.copier()) else { return Plan::Pass };
    // SAFETY: the regions describe the call's own buffers, which the caller's contract (the
    // MPI call's) keeps valid while the call runs, and the staging ends with it.
    let staged = match unsafe { Staged::new(regions) } {
        Ok(s) => s,
        Err(e) => return Plan::Failed(e.code(name)),
    };
    crate::staging::count_staged(staged.buffers(), staged.bytes(true));
    match staged.copy_in(&copier.backend) {
        Ok(()) => Plan::Staged(staged, copier),
        Err(e) => Plan::Failed(e.code(name)),
    }
}

/// A blocking collective: `call` with the buffers as given, or with staged copies of
/// the device ones (copied back when it succeeded).
///
/// # Safety
/// The caller's arguments of the MPI function `name`: `comm` is valid, `bufs` are the
/// call's buffer pointers in the order `describe` describes them (and `call` takes
/// them), and `describe` reads only arrays valid for the sizes it is given.
pub unsafe fn blocking<'a, const N: usize>(
    name: &'static str,
    comm: MPI_Comm,
    bufs: [*mut c_void; N],
    describe: impl FnOnce(&Site) -> Result<[Arg<'a>; N], c_int>,
    call: impl FnOnce([*mut c_void; N]) -> c_int,
) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { plan(name, comm, &bufs, describe) } {
        Plan::Pass => while_blocked(|| call(bufs)),
        // SAFETY: the caller's communicator.
        Plan::Failed(code) => unsafe { raise(comm, code) },
        Plan::Staged(staged, copier) => {
            let rc = while_blocked(|| call(std::array::from_fn(|i| staged.pointer(i, bufs[i]))));
            if rc != SUCCESS {
                return rc;
            }
            crate::staging::count_bytes(staged.bytes(false));
            match staged.copy_out(&copier.backend) {
                Ok(()) => SUCCESS,
                // SAFETY: as above.
                Err(e) => unsafe { raise(comm, e.code(name)) },
            }
        }
    }
}

/// A non-blocking collective: `call` with the buffers as given and the user's request,
/// or with staged copies of the device ones and a request of the shim's, handed to the
/// user as a generalized request completed after the results are copied back.
///
/// # Safety
/// As [`blocking`]; `request` is valid for writes.
pub unsafe fn nonblocking<'a, const N: usize>(
    name: &'static str,
    comm: MPI_Comm,
    bufs: [*mut c_void; N],
    describe: impl FnOnce(&Site) -> Result<[Arg<'a>; N], c_int>,
    call: impl FnOnce([*mut c_void; N], *mut MPI_Request) -> c_int,
    request: *mut MPI_Request,
) -> c_int {
    // SAFETY: the caller's contract.
    match unsafe { plan(name, comm, &bufs, describe) } {
        Plan::Pass => call(bufs, request),
        // SAFETY: the caller's communicator.
        Plan::Failed(code) => unsafe { raise(comm, code) },
        Plan::Staged(staged, _) => {
            let mut inner = request_null();
            let rc = call(std::array::from_fn(|i| staged.pointer(i, bufs[i])), &mut inner);
            if rc != SUCCESS {
                return rc;
            }
            match with(|s| s.track_staged(inner, staged, comm, name)) {
                Some(handle) => {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *request = handle };
                    SUCCESS
                }
                // The shim went away (MPI_Finalize on another thread: erroneous).
                // SAFETY: the caller's communicator.
                None => unsafe { raise(comm, ERR_INTERN) },
            }
        }
    }
}

/// Whether a blocking reduction of `count` elements of `dt` is split, and into pieces
/// of how many elements (and the extent that places them): the same answer on every
/// rank, as it depends only on arguments MPI requires to be the same everywhere and on
/// the piece size agreed at `MPI_Init`.
fn split(count: c_int, dt: MPI_Datatype) -> Option<(usize, isize)> {
    let piece = crate::staging::piece_bytes()?;
    let (mut lb, mut extent): (MPI_Count, MPI_Count) = (0, 0);
    // SAFETY: out-pointers to locals; an invalid datatype makes the call fail.
    if unsafe { PMPI_Type_get_extent_x(dt, &mut lb, &mut extent) } != SUCCESS || extent <= 0 || count <= 0 {
        return None;
    }
    let per = (piece as MPI_Count / extent).max(1);
    (count as MPI_Count > per).then_some((per as usize, extent as isize))
}

/// A blocking reduction on a send and a receive buffer (`MPI_Reduce`, `MPI_Allreduce`,
/// `MPI_Scan`, `MPI_Exscan`, `MPI_Reduce_local`): as [`blocking`], split into element
/// ranges when large (see `split`). `describe(site, count)` describes the two buffers
/// for `count` elements; `call(send, recv, count)` runs the library's function.
///
/// # Safety
/// As [`blocking`], for `[sendbuf, recvbuf]`.
pub unsafe fn reduction(
    name: &'static str,
    comm: MPI_Comm,
    bufs: [*mut c_void; 2],
    count: c_int,
    dt: MPI_Datatype,
    describe: impl Fn(&Site, c_int) -> [Arg<'static>; 2],
    mut call: impl FnMut(*mut c_void, *mut c_void, c_int) -> c_int,
) -> c_int {
    let Some((per, extent)) = split(count, dt) else {
        // SAFETY: the caller's contract.
        return unsafe { blocking(name, comm, bufs, |site| Ok(describe(site, count)), |p| call(p[0], p[1], count)) };
    };
    let pieces = (count as usize).div_ceil(per);
    crate::staging::count_split(pieces);
    // Piece k: its element count, and its buffers (MPI_IN_PLACE and NULL stay as they are).
    let at = |k: usize| -> (c_int, [*mut c_void; 2]) {
        let n = per.min(count as usize - k * per) as c_int;
        let off = (k * per) as isize * extent;
        let moved = bufs.map(|b| if candidate(b.cast_const()) { b.wrapping_byte_offset(off) } else { b });
        (n, moved)
    };
    let mut site = None;
    // SAFETY: the caller's contract.
    let whole = unsafe {
        device_regions(name, comm, &bufs, |s| {
            site = Some(Site { rank: s.rank, size: s.size });
            Ok(describe(s, count))
        })
    };
    let device = match whole {
        Err(code) => {
            // SAFETY: the caller's communicator.
            return unsafe { raise(comm, code) };
        }
        Ok(None) => None,
        Ok(Some(regions)) => with(|s| s.copier()).map(|c| (regions.iter().map(Option::is_some).collect::<Vec<_>>(), c)),
    };
    let Some((on_device, copier)) = device else {
        for k in 0..pieces {
            let (n, [s, r]) = at(k);
            let rc = while_blocked(|| call(s, r, n));
            if rc != SUCCESS {
                return rc;
            }
        }
        return SUCCESS;
    };
    let site = site.expect("device_regions described the call");
    let regions = |k: usize| -> Vec<Option<Region>> {
        let (n, moved) = at(k);
        let args = describe(&site, n);
        moved
            .iter()
            .zip(&args)
            .zip(&on_device)
            .map(|((&b, arg), &dev)| match (*arg, dev) {
                (Arg::Buf(shape, role), true) => Region::of(b as usize, shape, role).ok().flatten(),
                _ => None,
            })
            .collect()
    };
    crate::staging::count_staged(on_device.iter().filter(|&&d| d).count(), 0);
    // SAFETY: every piece's regions lie in the call's own buffers, valid while it runs
    // (this function's contract), and run_pieces returns before the call does.
    let run = unsafe {
        crate::staging::pieces::run_pieces(&copier, pieces, regions, |k, staged| {
            let (n, [s, r]) = at(k);
            crate::staging::count_bytes(staged.bytes(true) + staged.bytes(false));
            while_blocked(|| call(staged.pointer(0, s), staged.pointer(1, r), n))
        })
    };
    match run {
        Ok(rc) => rc,
        // SAFETY: the caller's communicator.
        Err(e) => unsafe { raise(comm, e.code(name)) },
    }
}
