//! Receives: posting one, the direct path's hand-over of an envelope-sized message, and
//! writing a matched message into the user's buffer (data copied in or unpacked, or an
//! envelope that starts gpulmt's receive of the payload).

use std::ffi::{c_int, c_void};

use gpulmt::anatomy::{self, probe, Point};
use mpi_sys::*;

use super::ops::{Done, RecvSpec, State};
use super::Shim;
use crate::envelope::{Envelope, ENVELOPE_BYTES};
use crate::raw::*;
use crate::staging::Role;

impl Shim {
    /// Posts a receive; returns the operation and, with `greq`, the user's request.
    #[allow(clippy::too_many_arguments)]
    pub fn post_recv(
        &mut self,
        buf: usize,
        count: c_int,
        dtype: MPI_Datatype,
        source: c_int,
        tag: c_int,
        comm: MPI_Comm,
        greq: bool,
    ) -> Result<(u64, MPI_Request), c_int> {
        let spec = self.recv_spec(buf, count, dtype, source, tag, comm)?;
        let r = self.new_op(Some(spec), comm, State::Posted, greq);
        self.posted.push(r.0);
        self.progress();
        Ok(r)
    }

    /// The receive the user gives (an invalid count or datatype: the library's error).
    pub(super) fn recv_spec(
        &mut self,
        buf: usize,
        count: c_int,
        dtype: MPI_Datatype,
        source: c_int,
        tag: c_int,
        comm: MPI_Comm,
    ) -> Result<RecvSpec, c_int> {
        let (cap, contiguous) = crate::hostmem::geometry(dtype, count)?;
        let device = cap > 0 && self.is_device(buf, cap);
        if device {
            self.settle_app_writes(buf);
        }
        Ok(RecvSpec { buf, count, dtype, source, tag, comm, device, contiguous, cap })
    }

    /// Whether a blocking receive into `buf` may go straight to the MPI library (see
    /// `recv_direct` in intercept/direct_recv.rs): a contiguous host buffer while no shim
    /// operation or stashed message could claim the next message first. Returns its bytes
    /// then.
    pub fn direct_recv_bytes(&mut self, buf: usize, count: c_int, dtype: MPI_Datatype) -> Option<usize> {
        if !self.quiet() {
            return None;
        }
        let (cap, contiguous) = crate::hostmem::geometry(dtype, count).ok()?;
        (contiguous && !(cap > 0 && self.is_device(buf, cap))).then_some(cap)
    }

    /// Delivers a message of envelope size that a direct receive took from the MPI
    /// library (`bytes`, from `source` with `tag`) to the receive the user posted:
    /// data is copied in, an envelope starts gpulmt's receive. Returns the operation.
    #[allow(clippy::too_many_arguments)]
    pub fn deliver_direct(
        &mut self,
        recv: (usize, c_int, MPI_Datatype, c_int, c_int, MPI_Comm),
        source: c_int,
        tag: c_int,
        bytes: &[u8; ENVELOPE_BYTES],
    ) -> u64 {
        let (buf, count, dtype, want_source, want_tag, comm) = recv;
        let cap = crate::hostmem::geometry(dtype, count).map_or(0, |g| g.0);
        let spec = RecvSpec {
            buf,
            count,
            dtype,
            source: want_source,
            tag: want_tag,
            comm,
            device: false,
            contiguous: true,
            cap,
        };
        let (id, _) = self.new_op(Some(spec), comm, State::Posted, false);
        let env = Envelope::decode(&bytes[..], self.job_hash);
        self.deliver_small(id, &spec, source, tag, bytes, env);
        id
    }

    /// Whether `bytes` are an envelope of this node's job.
    pub fn is_envelope(&self, bytes: &[u8]) -> bool {
        Envelope::decode(bytes, self.job_hash).is_some()
    }

    /// Delivers a message of envelope size already taken from the MPI library: an
    /// envelope starts gpulmt's receive; anything else is data.
    pub(super) fn deliver_small(
        &mut self,
        id: u64,
        spec: &RecvSpec,
        source: c_int,
        tag: c_int,
        b: &[u8; ENVELOPE_BYTES],
        env: Option<Envelope>,
    ) {
        match env {
            Some(env) => self.start_lmt_recv(id, spec, source, tag, env),
            None => {
                let done = self.write_data(spec, source, tag, &b[..]);
                if spec.device {
                    self.counters.staged_recvs += 1;
                } else {
                    self.counters.host_recvs += 1;
                }
                self.finish(id, done);
            }
        }
    }

    /// Writes `data` (a whole message, already in host memory) into a receive's buffer.
    pub(super) fn write_data(&mut self, spec: &RecvSpec, source: c_int, tag: c_int, data: &[u8]) -> Done {
        let n = data.len().min(spec.cap);
        let err = if data.len() > spec.cap { ERR_TRUNCATE } else { SUCCESS };
        let rc = self.write_packed(spec, &data[..n]);
        let mut d = Done::ok(source, tag, n);
        d.error = if rc != SUCCESS { rc } else { err };
        d
    }

    /// Writes `data`, the packed image of whole elements of the receive's datatype (at
    /// most its count), into its buffer: copied into a contiguous one, unpacked into
    /// another; a device buffer of a non-contiguous datatype is staged around the unpack
    /// (the span its elements cover, copied in first so that the gaps stay as they were).
    pub(super) fn write_packed(&mut self, spec: &RecvSpec, data: &[u8]) -> c_int {
        let n = data.len();
        if n == 0 {
            return SUCCESS;
        }
        if spec.contiguous && spec.device {
            // SAFETY: `spec.buf` is the receive's contiguous device buffer of `spec.cap >= n`
            // bytes, which MPI's rules keep valid and unused until the receive completes.
            return match unsafe { self.ctx.copy_sync(spec.buf, data.as_ptr() as usize, n) } {
                Ok(()) => SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "copying received data to device memory");
                    ERR_OTHER
                }
            };
        }
        if spec.contiguous {
            // SAFETY: the user's buffer holds `cap` >= n bytes.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), spec.buf as *mut u8, n) };
            return SUCCESS;
        }
        if !spec.device {
            // SAFETY: the user's host buffer of `count` elements of its datatype.
            return unsafe { unpack(spec, spec.buf, data) };
        }
        let staged = match self.stage_buffer(spec.buf, spec.count, spec.dtype, Role::Out, "MPI_Recv") {
            Ok(Some(staged)) => staged,
            Ok(None) => return ERR_INTERN,
            Err(code) => return code,
        };
        // SAFETY: the staged copy of the user's buffer, laid out as it (`Staged::pointer`).
        let rc = unsafe { unpack(spec, staged.pointer(0, spec.buf as *mut c_void) as usize, data) };
        if rc != SUCCESS {
            return rc;
        }
        crate::staging::count_bytes(staged.bytes(false));
        match staged.copy_out(self.ctx.backend()) {
            Ok(()) => SUCCESS,
            Err(e) => e.code("MPI_Recv"),
        }
    }

    fn start_lmt_recv(&mut self, id: u64, spec: &RecvSpec, source: c_int, tag: c_int, env: Envelope) {
        let from = env.sender;
        let mut staging = (!spec.contiguous).then(|| vec![0u8; spec.cap]);
        let (ptr, len) = match &mut staging {
            Some(s) => (s.as_mut_ptr() as usize, s.len()),
            None => (spec.buf, spec.cap),
        };
        self.counters.lmt_recvs += 1;
        anatomy::mark(Point::Probe, probe::SHIM_ENVELOPE_MATCHED);
        // SAFETY: the user's buffer (or our staging) stays valid until completion.
        match unsafe { self.ctx.lmt_start_recv(from, &env.cookie, ptr as *mut u8, len) } {
            Ok((req, cts)) => {
                anatomy::mark(Point::Probe, probe::SHIM_RECV_STARTED);
                // The CTS, where the protocol has one, went on gpulmt's ring (init_plugin_rings).
                debug_assert!(cts.is_none(), "a rings plugin context hands back no CTS cookie");
                self.set_state(id, State::LmtRecv { req, source, tag, staging })
            }
            Err(e) => {
                // The sender's transfer cannot finish either; it learns nothing from us.
                tracing::error!(error = %e, from_world = env.world_rank, "gpulmt could not start receiving an envelope's payload");
                self.finish(id, Done::err(source, tag, ERR_OTHER));
            }
        }
    }
}

/// Unpacks contiguous bytes into `buf`, host memory laid out as the receive's buffer
/// (its own, or a staged copy of it).
///
/// # Safety
/// `buf` is valid for writes of `spec.count` elements of `spec.dtype`.
unsafe fn unpack(spec: &RecvSpec, buf: usize, data: &[u8]) -> c_int {
    let elem = if spec.count > 0 { spec.cap / spec.count as usize } else { 0 };
    if elem == 0 || data.is_empty() {
        return SUCCESS;
    }
    let mut pos = 0;
    // SAFETY: the caller's buffer for up to `count` elements; `data` is the packed
    // (homogeneous: raw) image of whole elements.
    unsafe {
        PMPI_Unpack(
            data.as_ptr().cast(),
            data.len() as c_int,
            &mut pos,
            buf as *mut c_void,
            (data.len() / elem) as c_int,
            spec.dtype,
            spec.comm,
        )
    }
}
