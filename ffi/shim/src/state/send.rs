//! Starting the sends the shim manages: a device buffer to a rank of this node goes as an
//! envelope (gpulmt's RTS cookie) on the user's communicator and tag, then gpulmt moves
//! the payload; to another node, or below `GPULMT_MPI_LMT_MIN` bytes, it is staged
//! through host memory for the MPI library. Host sends are tracked while the shim is
//! busy.

use std::ffi::c_int;

use gpulmt::anatomy::{self, probe, Point};
use mpi_sys::*;

use super::ops::State;
use super::Shim;
use crate::envelope::{Envelope, ENVELOPE_BYTES, KIND_LMT};
use crate::raw::*;
use crate::staging::pool::MessageBuf;

impl Shim {
    /// Starts a send of a device buffer of `bytes` contiguous bytes. Returns the
    /// operation and, with `greq`, the user's request.
    #[allow(clippy::too_many_arguments)]
    pub fn start_device_send(
        &mut self,
        buf: usize,
        bytes: usize,
        dest: c_int,
        tag: c_int,
        comm: MPI_Comm,
        sync: bool,
        greq: bool,
    ) -> Result<(u64, MPI_Request), c_int> {
        anatomy::mark(Point::SendPost, 0);
        self.settle_app_writes(buf);
        let Some(to) = self.gpulmt_peer(comm, dest, bytes) else {
            // A small message, or another node without the internode path: stage through
            // host memory.
            let mut staging = MessageBuf::new(bytes);
            // SAFETY: `buf` is the application's device buffer of `bytes` bytes for this send,
            // which MPI's rules keep valid and unmodified until the send completes.
            if let Err(e) = unsafe { self.ctx.copy_sync(staging.as_mut_ptr() as usize, buf, bytes) } {
                tracing::error!(error = %e, "staging a device send");
                return Err(ERR_OTHER);
            }
            let mut inner = request_null();
            // SAFETY: the staging buffer lives in the operation until the send completes.
            let rc = unsafe {
                let f = if sync { PMPI_Issend } else { PMPI_Isend };
                f(staging.as_ptr().cast(), bytes as c_int, byte(), dest, tag, comm, &mut inner)
            };
            if rc != SUCCESS {
                return Err(rc);
            }
            self.counters.staged_sends += 1;
            return Ok(self.new_op(None, comm, State::MpiSend { inner, _staging: Some(staging) }, greq));
        };
        // SAFETY: the caller (MPI semantics) keeps the buffer valid until completion.
        let (lmt, cookie) = match unsafe { self.ctx.lmt_initiate(buf as *const u8, bytes, to) } {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, dest, bytes, "gpulmt could not start a device send");
                return Err(ERR_OTHER);
            }
        };
        let env = Envelope {
            kind: KIND_LMT,
            total: bytes as u64,
            job_hash: self.job_hash,
            world_rank: self.world_rank,
            sender: self.ctx.rank(),
            cookie,
        };
        let Some(env) = env.encode().map(Box::new) else {
            tracing::error!("gpulmt's RTS cookie does not fit the envelope");
            return Err(ERR_INTERN);
        };
        let mut env_req = request_null();
        // SAFETY: the envelope lives in the operation until its send completes.
        let rc =
            unsafe { PMPI_Isend(env.as_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), dest, tag, comm, &mut env_req) };
        if rc != SUCCESS {
            // The receiver will never see it; gpulmt's request stays orphaned.
            tracing::error!(rc, "sending an envelope failed");
            return Err(rc);
        }
        anatomy::mark(Point::Probe, probe::SHIM_ENVELOPE_SENT);
        self.counters.lmt_sends += 1;
        let r = self.new_op(None, comm, State::LmtSend { _env: env, env_req, lmt: Some(lmt), error: SUCCESS }, greq);
        // As gpulmt's own isend does (GPULMT_PROGRESS_ON_POST): the peer's answers to the
        // sends posted so far start their copies while the application posts the rest.
        if self.ctx.config().progress_on_post {
            self.progress_transfers();
        }
        Ok(r)
    }

    /// Tracks a send the MPI library moves from a host buffer (blocking sends while the
    /// shim is busy: the caller waits for it with progress).
    pub fn track_host_send(&mut self, inner: MPI_Request, comm: MPI_Comm) -> u64 {
        self.new_op(None, comm, State::MpiSend { inner, _staging: None }, false).0
    }
}
