//! Matching messages to posted receives with MPI's rules (post order; the MPI library
//! orders each sender's messages), taking exactly the probed message, and what
//! `MPI_Iprobe` reports, envelopes included.

use std::ffi::{c_int, c_void};

use mpi_sys::*;

use super::ops::{Done, RecvSpec, Stashed, State};
use super::Shim;
use crate::envelope::{Envelope, ENVELOPE_BYTES};
use crate::raw::*;
use crate::staging::pool::MessageBuf;

impl Shim {
    /// Matches posted receives with messages, in post order.
    pub(super) fn match_posted(&mut self) {
        let mut i = 0;
        while i < self.posted.len() {
            let id = self.posted[i];
            let spec = self.ops[&id].recv.expect("posted receives have a spec");
            // A message Probe took out of the MPI library comes first.
            if let Some(k) =
                self.stash.iter().position(|s| s.comm == spec.comm && matches(spec.source, spec.tag, s.source, s.tag))
            {
                let s = self.stash.remove(k);
                self.posted.remove(i);
                self.deliver_small(id, &spec, s.source, s.tag, &s.bytes, s.env);
                continue;
            }
            let mut flag = 0;
            let mut st = empty_status();
            // SAFETY: the user's communicator; locals as out-pointers.
            unsafe { PMPI_Iprobe(spec.source, spec.tag, spec.comm, &mut flag, &mut st) };
            if flag == 0 {
                i += 1;
                continue;
            }
            let earlier = self.posted[..i].iter().any(|e| {
                let s = self.ops[e].recv.expect("posted");
                s.comm == spec.comm && matches(s.source, s.tag, st.MPI_SOURCE, st.MPI_TAG)
            });
            if earlier {
                // It arrived after the earlier receive looked: that receive gets first
                // pick among the messages it matches. Scan again from the start.
                i = 0;
                continue;
            }
            // Take exactly the probed message: the first from its source with its tag.
            let mut msg = message_null();
            // SAFETY: as above.
            unsafe { PMPI_Improbe(st.MPI_SOURCE, st.MPI_TAG, spec.comm, &mut flag, &mut msg, &mut st) };
            if flag == 0 {
                // Another thread took it; look again later.
                i += 1;
                continue;
            }
            self.posted.remove(i);
            self.deliver(id, &spec, msg, st.MPI_SOURCE, st.MPI_TAG, status_bytes(&st));
        }
    }

    /// Receives the matched message `msg` (`bytes` long, from `source` with `tag`) for
    /// operation `id`.
    pub(super) fn deliver(
        &mut self,
        id: u64,
        spec: &RecvSpec,
        mut msg: MPI_Message,
        source: c_int,
        tag: c_int,
        bytes: usize,
    ) {
        if bytes == ENVELOPE_BYTES {
            let mut b = Box::new([0u8; ENVELOPE_BYTES]);
            // SAFETY: a matched message of exactly this many bytes.
            unsafe { PMPI_Mrecv(b.as_mut_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), &mut msg, status_ignore()) };
            let env = Envelope::decode(&b[..], self.job_hash);
            return self.deliver_small(id, spec, source, tag, &b, env);
        }
        let mut inner = request_null();
        let (rc, staging) = if spec.device || bytes > spec.cap {
            // The MPI library writes host memory: a device buffer (any datatype) gets the
            // message staged, written to it at the end (`write_data`). A message longer
            // than the buffer is staged too: the shim truncates it itself, so the library
            // reports no error (MPICH would raise it on MPI_COMM_WORLD's handler, not the
            // receive's) and writes nothing past the count (Open MPI would).
            let mut staging = MessageBuf::new(bytes);
            if spec.device {
                self.counters.staged_recvs += 1;
            } else {
                self.counters.host_recvs += 1;
            }
            // SAFETY: staging holds the whole message and lives in the operation.
            let rc = unsafe { PMPI_Imrecv(staging.as_mut_ptr().cast(), bytes as c_int, byte(), &mut msg, &mut inner) };
            (rc, Some(staging))
        } else {
            self.counters.host_recvs += 1;
            // SAFETY: the user's host buffer and datatype, valid until the receive completes.
            let rc = unsafe { PMPI_Imrecv(spec.buf as *mut c_void, spec.count, spec.dtype, &mut msg, &mut inner) };
            (rc, None)
        };
        if rc != SUCCESS {
            return self.finish(id, Done::err(source, tag, rc));
        }
        self.set_state(id, State::RawRecv { inner, staging });
    }

    /// MPI_Iprobe: the status of the message a receive of (source, tag, comm) would
    /// get now, with the payload's size for envelopes.
    pub fn iprobe(&mut self, source: c_int, tag: c_int, comm: MPI_Comm) -> Option<(c_int, c_int, usize)> {
        self.progress();
        loop {
            if let Some(s) = self.stash.iter().find(|s| s.comm == comm && matches(source, tag, s.source, s.tag)) {
                let bytes = s.env.as_ref().map_or(ENVELOPE_BYTES, |e| e.total as usize);
                return Some((s.source, s.tag, bytes));
            }
            let mut flag = 0;
            let mut st = empty_status();
            // SAFETY: the user's communicator; locals as out-pointers.
            unsafe { PMPI_Iprobe(source, tag, comm, &mut flag, &mut st) };
            if flag == 0 {
                return None;
            }
            let taken = self.posted.iter().any(|e| {
                let s = self.ops[e].recv.expect("posted");
                s.comm == comm && matches(s.source, s.tag, st.MPI_SOURCE, st.MPI_TAG)
            });
            if taken {
                // A posted receive gets it first; match, then look again.
                self.match_posted();
                continue;
            }
            let bytes = status_bytes(&st);
            if bytes != ENVELOPE_BYTES || !self.envelopes_possible() {
                return Some((st.MPI_SOURCE, st.MPI_TAG, bytes));
            }
            // Envelope-sized: take it to look inside, and keep it for its receive.
            let (mut msg, mut b) = (message_null(), Box::new([0u8; ENVELOPE_BYTES]));
            // SAFETY: as above; the message has exactly ENVELOPE_BYTES bytes.
            unsafe {
                PMPI_Improbe(st.MPI_SOURCE, st.MPI_TAG, comm, &mut flag, &mut msg, &mut st);
                if flag == 0 {
                    continue;
                }
                PMPI_Mrecv(b.as_mut_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), &mut msg, status_ignore());
            }
            let env = Envelope::decode(&b[..], self.job_hash);
            self.stash.push(Stashed { comm, source: st.MPI_SOURCE, tag: st.MPI_TAG, bytes: b, env });
        }
    }
}
