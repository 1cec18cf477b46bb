//! What staging needs of the shim: which of a call's buffers are device memory (settled
//! before staging reads them), the copier, the device buffer of a point-to-point call
//! staged whole, and calls the MPI library runs on staged buffers, whose requests the
//! shim completes after copying the results back.

use std::ffi::c_int;

use mpi_sys::*;

use super::ops::{Done, State};
use super::Shim;
use crate::raw::*;
use crate::staging::{Copier, Region, Role, Shape, Staged};

impl Shim {
    /// Whether any of these pointers is device memory (a quick look: one byte each).
    pub fn any_device(&mut self, ptrs: impl IntoIterator<Item = usize>) -> bool {
        let mut any = false;
        for p in ptrs {
            // Every pointer is classified (and remembered when host memory).
            any |= self.is_device(p, 1);
        }
        any
    }

    /// Whether `r` lies in device memory; if so, the application's default-stream work
    /// on it has landed when this returns.
    pub fn region_on_device(&mut self, r: &Region) -> bool {
        let device = self.is_device(r.start(), r.bytes());
        if device {
            self.settle_app_writes(r.start());
        }
        device
    }

    /// Device-host copies for staging: the backend, this rank's device, and a lane of
    /// its own (after gpulmt's lanes, so staging copies do not queue behind transfers).
    pub fn copier(&self) -> Copier {
        Copier { backend: self.ctx.backend().clone(), engine: self.ctx.device(), lane: self.ctx.config().lanes }
    }

    /// Takes over a non-blocking call the MPI library runs on staged buffers (`inner`):
    /// the user's request is a generalized request, completed once `inner` has and the
    /// results are copied back. `call` names it in errors.
    pub fn track_staged(
        &mut self,
        inner: MPI_Request,
        staged: Staged,
        comm: MPI_Comm,
        call: &'static str,
    ) -> MPI_Request {
        self.track_staged_op(inner, staged, comm, call, true).1
    }

    /// As [`track_staged`](Self::track_staged); without `greq`, for a blocking call whose
    /// caller waits for the operation (`wait_op`). Returns the operation and the request.
    pub fn track_staged_op(
        &mut self,
        inner: MPI_Request,
        staged: Staged,
        comm: MPI_Comm,
        call: &'static str,
        greq: bool,
    ) -> (u64, MPI_Request) {
        self.new_op(None, comm, State::Staged { inner, staged, call }, greq)
    }

    /// Stages the buffer of a point-to-point call, `count` elements of `dt` at `buf`
    /// (any datatype: the whole span the elements cover), when it is device memory:
    /// copied in (what `role` reads, and a written span with gaps, so that they come
    /// back unchanged). `None` for host memory or an empty buffer; an invalid count or
    /// datatype is left to the library (`None` too). A failure is an MPI error code
    /// naming `call`.
    pub fn stage_buffer(
        &mut self,
        buf: usize,
        count: c_int,
        dt: MPI_Datatype,
        role: Role,
        call: &str,
    ) -> Result<Option<Staged>, c_int> {
        self.stage_buffers(&[(buf, count, dt, role)], call)
    }

    /// [`stage_buffer`](Self::stage_buffer) for the buffers of one call, staged together
    /// (`Staged::pointer(i, ..)` for the i-th); `None` when none is device memory.
    pub fn stage_buffers(
        &mut self,
        bufs: &[(usize, c_int, MPI_Datatype, Role)],
        call: &str,
    ) -> Result<Option<Staged>, c_int> {
        let mut regions = Vec::with_capacity(bufs.len());
        for &(buf, count, dt, role) in bufs {
            // NULL: a buffer the call ignores (MPI_Fetch_and_op's origin with MPI_NO_OP).
            let region = match Region::of(buf, Shape::Count { count: count.into(), dt }, role) {
                Ok(Some(r)) if buf != 0 && self.region_on_device(&r) => Some(r),
                _ => None,
            };
            regions.push(region);
        }
        let staged_buffers = regions.iter().flatten().count();
        if staged_buffers == 0 {
            return Ok(None);
        }
        // SAFETY: the regions lie in the call's buffers, which MPI's rules keep valid (and,
        // where the call writes them, unused by the program) until the call completes; the
        // caller keeps the `Staged` no longer than that.
        let staged = unsafe { Staged::new(regions) }.map_err(|e| e.code(call))?;
        crate::staging::count_staged(staged_buffers, staged.bytes(true));
        staged.copy_in(self.ctx.backend()).map_err(|e| e.code(call))?;
        Ok(Some(staged))
    }

    /// Polls a non-blocking call on staged buffers; its result once it finished.
    pub(super) fn poll_staged(&mut self, inner: &mut MPI_Request, staged: &Staged, call: &str) -> Option<Done> {
        let mut flag = 0;
        // SAFETY: the library's request of this collective.
        let rc = unsafe { PMPI_Test(inner, &mut flag, status_ignore()) };
        if flag == 0 && rc == SUCCESS {
            return None;
        }
        let code = match rc {
            SUCCESS => {
                match staged.copy_out(self.ctx.backend()).inspect(|()| crate::staging::count_bytes(staged.bytes(false)))
                {
                    Ok(()) => SUCCESS,
                    Err(e) => crate::mpierr::for_call(ERR_OTHER, call, format_args!("copying the results back: {e}")),
                }
            }
            rc => rc,
        };
        Some(Done::err(0, 0, code))
    }
}
