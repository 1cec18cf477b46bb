//! [`NetIface`] over MPI (feature `mpi`): nonblocking point-to-point on the proxy's own
//! communicator (a dup of the job's, with `MPI_ERRORS_RETURN`, made by [`crate::net::start`]).
//!
//! rsmpi's requests are scoped (a request must finish inside the scope that owns its
//! buffer), which does not fit a proxy whose requests outlive any call; so this calls
//! `MPI_Isend`, `MPI_Irecv`, `MPI_Testsome` and `MPI_Cancel` through `mpi::ffi` and keeps
//! the requests in one dense array that `MPI_Testsome` scans.
//!
//! Every call is made through its profiling name (`PMPI_*`): the proxy's traffic is
//! gpulmt's own, not the application's, so a tool or library that interposes the `MPI_*`
//! symbols (a profiler, gpulmt's own PMPI shim) neither sees it nor is entered again from
//! the proxy's thread.

use std::ffi::{c_int, c_void};

use ::mpi::ffi;
use gpulmt_protocols::Rank;

use super::{Arrival, IfaceCaps, NetFail, NetIface, ReqId, Status};

/// The text of an MPI error code.
pub(crate) fn error_string(code: c_int) -> String {
    let mut buf = vec![0u8; ffi::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: the buffer holds MPI_MAX_ERROR_STRING bytes, as the call requires; `len`
    // is a local.
    let rc = unsafe { ffi::PMPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
    if rc != ffi::MPI_SUCCESS as c_int {
        return format!("MPI error {code}");
    }
    buf.truncate(len.clamp(0, ffi::MPI_MAX_ERROR_STRING as c_int) as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Checks an MPI return code.
pub(crate) fn check(call: &'static str, rc: c_int) -> Result<(), NetFail> {
    match rc == ffi::MPI_SUCCESS as c_int {
        true => Ok(()),
        false => Err(NetFail::Call { call, code: rc, message: error_string(rc) }),
    }
}

/// Whether MPI has been finalized (then no MPI call may be made).
pub(crate) fn finalized() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time; `flag` is a local.
    unsafe { ffi::PMPI_Finalized(&mut flag) };
    flag != 0
}

/// One request in flight.
struct Pending {
    id: ReqId,
    recv: bool,
}

/// This rank's MPI endpoint.
pub struct MpiIface {
    comm: ffi::MPI_Comm,
    rank: Rank,
    size: u32,
    caps: IfaceCaps,
    max_in_flight: usize,
    /// Requests in flight, dense for `MPI_Testsome`, and what each is.
    reqs: Vec<ffi::MPI_Request>,
    pending: Vec<Pending>,
    indices: Vec<c_int>,
    statuses: Vec<ffi::MPI_Status>,
    closed: bool,
}

// SAFETY: the communicator and requests are MPI handles, usable from any thread under
// MPI_THREAD_MULTIPLE (checked by `net::start` before an MpiIface exists); the iface is
// used by one thread at a time (the proxy's), which `&mut self` enforces.
unsafe impl Send for MpiIface {}

impl MpiIface {
    /// An endpoint on `comm`, which it owns from now on (freed by `close`).
    ///
    /// # Safety
    /// `comm` is a live intra-communicator that nothing else uses or frees, and MPI runs
    /// with `MPI_THREAD_MULTIPLE`.
    pub unsafe fn new(comm: ffi::MPI_Comm, rank: Rank, size: u32, caps: IfaceCaps, max_in_flight: usize) -> MpiIface {
        MpiIface {
            comm,
            rank,
            size,
            caps,
            max_in_flight,
            reqs: Vec::new(),
            pending: Vec::new(),
            indices: Vec::new(),
            statuses: Vec::new(),
            closed: false,
        }
    }

    fn push(&mut self, req: ffi::MPI_Request, id: ReqId, recv: bool) {
        self.reqs.push(req);
        self.pending.push(Pending { id, recv });
    }

    fn count(len: usize) -> Result<c_int, NetFail> {
        c_int::try_from(len).map_err(|_| NetFail::Call {
            call: "MPI_Isend/MPI_Irecv",
            code: -1,
            message: format!("{len} bytes exceed an MPI count (the proxy splits data into pieces)"),
        })
    }
}

impl NetIface for MpiIface {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn caps(&self) -> IfaceCaps {
        self.caps
    }

    unsafe fn ep_send(
        &mut self,
        req: ReqId,
        to: Rank,
        tag: i32,
        buf: usize,
        len: usize,
    ) -> Result<Status<()>, NetFail> {
        if self.reqs.len() >= self.max_in_flight {
            return Ok(Status::NoResource);
        }
        let count = Self::count(len)?;
        // SAFETY: an MPI_Request is a plain handle; MPI_Isend overwrites it.
        let mut r: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: ep_send's contract keeps buf..buf+len readable until the request is
        // reported; the communicator is live (new's contract) and the datatype a constant.
        let rc = unsafe {
            ffi::PMPI_Isend(buf as *const c_void, count, ffi::RSMPI_UINT8_T, to as c_int, tag, self.comm, &mut r)
        };
        check("MPI_Isend", rc)?;
        self.push(r, req, false);
        Ok(Status::InProgress)
    }

    unsafe fn ep_recv(
        &mut self,
        req: ReqId,
        from: Option<Rank>,
        tag: i32,
        buf: usize,
        len: usize,
    ) -> Result<Status<Arrival>, NetFail> {
        if self.reqs.len() >= self.max_in_flight {
            return Ok(Status::NoResource);
        }
        let count = Self::count(len)?;
        // SAFETY: reads an extern constant of the MPI library.
        let source = from.map_or(unsafe { ffi::RSMPI_ANY_SOURCE }, |r| r as c_int);
        // SAFETY: an MPI_Request is a plain handle; MPI_Irecv overwrites it.
        let mut r: ffi::MPI_Request = unsafe { std::mem::zeroed() };
        // SAFETY: ep_recv's contract keeps buf..buf+len writable and unused by others
        // until the request is reported; the communicator is live.
        let rc =
            unsafe { ffi::PMPI_Irecv(buf as *mut c_void, count, ffi::RSMPI_UINT8_T, source, tag, self.comm, &mut r) };
        check("MPI_Irecv", rc)?;
        self.push(r, req, true);
        Ok(Status::InProgress)
    }

    fn ep_cancel(&mut self, req: ReqId) {
        if let Some(i) = self.pending.iter().position(|p| p.id == req) {
            // SAFETY: a live request of this iface; it stays in the array and completes
            // (cancelled or not) through MPI_Testsome.
            let rc = unsafe { ffi::PMPI_Cancel(&mut self.reqs[i]) };
            if let Err(e) = check("MPI_Cancel", rc) {
                tracing::warn!(error = %e, "MPI_Cancel failed; the operation completes as it would have");
            }
        }
    }

    fn iface_progress(&mut self, done: &mut dyn FnMut(ReqId, Result<Arrival, NetFail>)) -> usize {
        let n = self.reqs.len();
        if n == 0 {
            return 0;
        }
        self.indices.resize(n, 0);
        // SAFETY: a zeroed status is a valid value for MPI to overwrite.
        self.statuses.resize(n, unsafe { std::mem::zeroed() });
        let mut outcount: c_int = 0;
        // SAFETY: the arrays hold n entries each; the requests are live handles of this
        // iface (completed ones MPI sets to MPI_REQUEST_NULL, removed below).
        let rc = unsafe {
            ffi::PMPI_Testsome(
                n as c_int,
                self.reqs.as_mut_ptr(),
                &mut outcount,
                self.indices.as_mut_ptr(),
                self.statuses.as_mut_ptr(),
            )
        };
        let in_status = rc == ffi::MPI_ERR_IN_STATUS as c_int;
        if rc != ffi::MPI_SUCCESS as c_int && !in_status {
            tracing::error!(error = %error_string(rc), "MPI_Testsome failed; retrying next round");
            return 0;
        }
        // SAFETY: reads an extern constant of the MPI library.
        if outcount <= 0 || outcount == unsafe { ffi::RSMPI_UNDEFINED } {
            return 0;
        }
        let mut finished: Vec<usize> = Vec::with_capacity(outcount as usize);
        for k in 0..outcount as usize {
            let i = self.indices[k] as usize;
            let status = &self.statuses[k];
            let p = &self.pending[i];
            let mut cancelled: c_int = 0;
            // SAFETY: a status MPI_Testsome filled in.
            unsafe { ffi::PMPI_Test_cancelled(status, &mut cancelled) };
            let result = if cancelled != 0 {
                Err(NetFail::Cancelled)
            } else if in_status && status.MPI_ERROR != ffi::MPI_SUCCESS as c_int {
                let call = if p.recv { "MPI_Irecv" } else { "MPI_Isend" };
                Err(NetFail::Call { call, code: status.MPI_ERROR, message: error_string(status.MPI_ERROR) })
            } else if p.recv {
                let mut count: c_int = 0;
                // SAFETY: a status MPI_Testsome filled in for a receive of bytes.
                unsafe { ffi::PMPI_Get_count(status, ffi::RSMPI_UINT8_T, &mut count) };
                Ok(Arrival { source: status.MPI_SOURCE as Rank, len: count.max(0) as usize })
            } else {
                Ok(Arrival { source: self.rank, len: 0 })
            };
            done(p.id, result);
            finished.push(i);
        }
        // Highest index first, so each swap_remove moves an entry not yet visited.
        finished.sort_unstable_by(|a, b| b.cmp(a));
        for &i in &finished {
            self.reqs.swap_remove(i);
            self.pending.swap_remove(i);
        }
        finished.len()
    }

    fn in_flight(&self) -> usize {
        self.reqs.len()
    }

    fn close(&mut self) {
        if self.closed || finalized() {
            return;
        }
        self.closed = true;
        // SAFETY: the iface owns the communicator (new's contract); requests still in
        // flight keep it alive inside MPI until they end, as MPI_Comm_free specifies.
        if let Err(e) = check("MPI_Comm_free", unsafe { ffi::PMPI_Comm_free(&mut self.comm) }) {
            tracing::warn!(error = %e, "freeing the proxy's communicator");
        }
    }
}

impl Drop for MpiIface {
    fn drop(&mut self) {
        self.close();
    }
}
