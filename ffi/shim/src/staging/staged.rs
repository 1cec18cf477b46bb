//! The device buffers of one MPI call staged through one block of host memory: each
//! argument's [`Region`] gets a place in the block, is copied in before the call (when
//! the call reads it, or it has gaps), and copied back after (when the call writes it);
//! the call gets a host pointer that addresses the staged copy exactly as the device
//! pointer addressed the device buffer.

use std::ffi::{c_int, c_void};

use mpi_sys::{MPI_ERR_NO_MEM, MPI_ERR_OTHER};

use gpulmt::device::{Backend, CopyTicket, DevId, DeviceError};

use super::pool::{self, Exceeded, HostBlock};
use super::region::Region;

/// Places in the block start at multiples of this (any element's alignment).
const ALIGN: usize = 64;

/// Why a call's buffers could not be staged.
#[derive(Debug)]
pub enum StagingError {
    /// The staging memory would exceed `GPULMT_MPI_STAGING_MAX`.
    Exceeded(Exceeded),
    /// A copy between device and host memory failed.
    Copy(DeviceError),
}

impl std::fmt::Display for StagingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StagingError::Exceeded(e) => write!(
                f,
                "staging {} of device data through host memory would exceed GPULMT_MPI_STAGING_MAX={} ({} held by \
                 other operations not yet completed); raise GPULMT_MPI_STAGING_MAX on every rank",
                Bytes(e.need),
                Bytes(e.cap),
                Bytes(e.in_use)
            ),
            StagingError::Copy(e) => write!(f, "copying between device and host memory failed: {e}"),
        }
    }
}

impl StagingError {
    /// The MPI error code for this failure of the MPI function `call`: of class
    /// `MPI_ERR_NO_MEM` (over the cap) or `MPI_ERR_OTHER`, with a message that names it.
    pub fn code(&self, call: &str) -> c_int {
        let class = match self {
            StagingError::Exceeded(_) => MPI_ERR_NO_MEM,
            StagingError::Copy(_) => MPI_ERR_OTHER,
        };
        crate::mpierr::for_call(class as c_int, call, self)
    }
}

/// A byte count as people read it.
struct Bytes(usize);

impl std::fmt::Display for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        for (unit, shift) in [("G", 30), ("M", 20), ("K", 10)] {
            if n >= 1 << shift && n.is_multiple_of(1 << shift) {
                return write!(f, "{}{unit}", n >> shift);
            }
        }
        write!(f, "{n} bytes")
    }
}

/// Where device-host copies run: the backend and the engine and lane of `copy_async`.
#[derive(Clone)]
pub struct Copier {
    pub backend: Backend,
    pub engine: DevId,
    pub lane: u32,
}

impl Copier {
    /// Starts the copies (dst, src, bytes). When one cannot start, waits for those that
    /// did (they write memory the caller is about to give back) and fails.
    ///
    /// # Safety
    /// Each `src` is valid for reads and each `dst` for writes of `bytes`, until the
    /// returned tickets are waited for.
    unsafe fn start(
        &self,
        copies: impl Iterator<Item = (usize, usize, usize)>,
    ) -> Result<Vec<CopyTicket>, StagingError> {
        let mut started = Vec::new();
        for (dst, src, len) in copies {
            // SAFETY: this function's contract.
            match unsafe { self.backend.copy_async(self.engine, self.lane, dst, src, len) } {
                Ok(t) => started.push(t),
                Err(e) => {
                    let _ = self.wait(started);
                    return Err(StagingError::Copy(e));
                }
            }
        }
        Ok(started)
    }

    /// Waits for copies started by [`Staged::start_in`] or [`Staged::start_out`].
    pub fn wait(&self, tickets: Vec<CopyTicket>) -> Result<(), StagingError> {
        for t in tickets {
            while !self.backend.copy_poll(t).map_err(StagingError::Copy)? {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

/// The staged buffers of one call: per argument, its region and its place in the block
/// (`None`: the argument is passed as given).
pub struct Staged {
    block: HostBlock,
    places: Vec<Option<(Region, usize)>>,
}

impl Staged {
    /// Places the given regions in one block from the pool. Nothing is copied yet.
    ///
    /// # Safety
    /// Every region's device range is valid for the reads and writes its role names (the
    /// MPI call's own buffer contract) for as long as this `Staged` lives: its copy
    /// methods rely on that.
    pub unsafe fn new(regions: Vec<Option<Region>>) -> Result<Staged, StagingError> {
        let mut at = 0;
        let places: Vec<Option<(Region, usize)>> = regions
            .into_iter()
            .map(|r| {
                r.map(|r| {
                    let place = at;
                    at = (at + r.bytes()).div_ceil(ALIGN) * ALIGN;
                    (r, place)
                })
            })
            .collect();
        let block = pool::take(at.max(1)).map_err(StagingError::Exceeded)?;
        Ok(Staged { block, places })
    }

    /// The pointer the call gets for argument `i`: into the block for a staged one,
    /// `given` otherwise.
    pub fn pointer(&self, i: usize, given: *mut c_void) -> *mut c_void {
        match self.places.get(i).copied().flatten() {
            // The staged span starts `place` bytes into the block and `lo` bytes from
            // the pointer the call is given: the pointer sits `lo` before it.
            Some((r, place)) => (self.block.ptr() as usize + place).wrapping_add_signed(-r.lo) as *mut c_void,
            None => given,
        }
    }

    /// (device span, staged span, bytes) of the regions `want` picks.
    fn spans(&self, want: fn(&Region) -> bool) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        let block = self.block.ptr() as usize;
        self.places
            .iter()
            .flatten()
            .filter(move |(r, _)| want(r))
            .map(move |(r, place)| (r.start(), block + place, r.bytes()))
    }

    /// How many arguments are staged.
    pub fn buffers(&self) -> usize {
        self.places.iter().flatten().count()
    }

    /// Bytes the call reads (`read`) or writes, as staging copies them.
    pub fn bytes(&self, read: bool) -> usize {
        self.spans(if read { Region::read } else { Region::written }).map(|(_, _, len)| len).sum()
    }

    /// Copies in, and waits for, what the call reads.
    pub fn copy_in(&self, backend: &Backend) -> Result<(), StagingError> {
        for (dev, host, len) in self.spans(Region::read) {
            // SAFETY: `dev` is a region `new`'s contract keeps valid; `host` lies in our block.
            unsafe { backend.copy_sync(host, dev, len) }.map_err(StagingError::Copy)?;
        }
        Ok(())
    }

    /// Copies back, and waits for, what the call wrote.
    pub fn copy_out(&self, backend: &Backend) -> Result<(), StagingError> {
        for (dev, host, len) in self.spans(Region::written) {
            // SAFETY: `dev` is a region `new`'s contract keeps valid; `host` lies in our block.
            unsafe { backend.copy_sync(dev, host, len) }.map_err(StagingError::Copy)?;
        }
        Ok(())
    }

    /// Starts copying in what the call reads; [`Copier::wait`] for the tickets.
    pub fn start_in(&self, c: &Copier) -> Result<Vec<CopyTicket>, StagingError> {
        // SAFETY: device regions valid by `new`'s contract; host ranges lie in our block,
        // which lives until the caller waits for the tickets (it holds `&self`).
        unsafe { c.start(self.spans(Region::read).map(|(dev, host, len)| (host, dev, len))) }
    }

    /// Starts copying back what the call wrote; [`Copier::wait`] for the tickets.
    pub fn start_out(&self, c: &Copier) -> Result<Vec<CopyTicket>, StagingError> {
        // SAFETY: as in `start_in`.
        unsafe { c.start(self.spans(Region::written)) }
    }
}
