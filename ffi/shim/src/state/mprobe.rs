//! Matched probes the application makes (`MPI_Mprobe`, `MPI_Improbe`) and the receives of
//! the messages they matched (`MPI_Mrecv`, `MPI_Imrecv`), beside the shim's own use of
//! the library's matched probes for its receives.
//!
//! A probe follows MPI's order: receives posted earlier get their messages first, then
//! a message `MPI_Iprobe` set aside comes before the library's. What it finds is one of:
//! - a message the library still holds, not of an envelope's size: the program gets the
//!   library's own message handle, and the shim remembers its size, so that its receive
//!   can stage a device buffer or truncate;
//! - a message of an envelope's size, which the shim must take out of the library to
//!   look at (an envelope reports its payload's size): the program gets a placeholder,
//!   a real message of the library (zero bytes, sent to itself on the shim's node
//!   communicator), so that the handle is valid in any MPI call; its receive gets the
//!   payload through gpulmt (an envelope) or the data.
//!
//! The receive is then the shim's operation like any other: a device buffer (any
//! datatype) gets the data staged, an envelope's payload comes through gpulmt.

use std::ffi::c_int;

use mpi_sys::*;

use super::ops::{Stashed, State};
use super::Shim;
use crate::envelope::{Envelope, ENVELOPE_BYTES};
use crate::raw::*;

/// The tag of placeholder messages on the shim's node communicator (which carries
/// nothing else but its barriers).
const PLACEHOLDER_TAG: c_int = 1;

/// A message the program matched with a probe, by its handle.
pub(super) enum Probed {
    /// Taken out of the library (of an envelope's size); the program holds a placeholder.
    Taken(Stashed),
    /// Still in the library, `bytes` long.
    Library { comm: MPI_Comm, source: c_int, tag: c_int, bytes: usize },
}

/// What a probe found: the message handle for the program, its source, tag and bytes
/// (the payload's, for an envelope).
pub type Found = (MPI_Message, c_int, c_int, usize);

impl Shim {
    /// `MPI_Improbe` of the program.
    pub fn improbe(&mut self, source: c_int, tag: c_int, comm: MPI_Comm) -> Result<Option<Found>, c_int> {
        self.progress();
        if let Some(k) = self.stash.iter().position(|s| s.comm == comm && matches(source, tag, s.source, s.tag)) {
            let s = self.stash.remove(k);
            return self.hand_over(s).map(Some);
        }
        loop {
            let (mut flag, mut msg, mut st) = (0, message_null(), empty_status());
            // SAFETY: the program's communicator; locals as out-pointers.
            let rc = unsafe { PMPI_Improbe(source, tag, comm, &mut flag, &mut msg, &mut st) };
            if rc != SUCCESS {
                return Err(rc);
            }
            if flag == 0 {
                return Ok(None);
            }
            let (src, t, bytes) = (st.MPI_SOURCE, st.MPI_TAG, status_bytes(&st));
            // A receive posted earlier that matches it gets it (it arrived after that
            // receive last looked); then look again.
            let earlier = self.posted.iter().position(|e| {
                let s = self.ops[e].recv.expect("posted receives have a spec");
                s.comm == comm && matches(s.source, s.tag, src, t)
            });
            if let Some(i) = earlier {
                let id = self.posted.remove(i);
                let spec = self.ops[&id].recv.expect("posted receives have a spec");
                self.deliver(id, &spec, msg, src, t, bytes);
                continue;
            }
            if bytes != ENVELOPE_BYTES || !self.envelopes_possible() {
                self.probed.insert(handle_key(msg), Probed::Library { comm, source: src, tag: t, bytes });
                return Ok(Some((msg, src, t, bytes)));
            }
            let mut b = Box::new([0u8; ENVELOPE_BYTES]);
            // SAFETY: the matched message has exactly ENVELOPE_BYTES bytes.
            let rc = unsafe {
                PMPI_Mrecv(b.as_mut_ptr().cast(), ENVELOPE_BYTES as c_int, byte(), &mut msg, status_ignore())
            };
            if rc != SUCCESS {
                return Err(rc);
            }
            let env = Envelope::decode(&b[..], self.job_hash);
            return self.hand_over(Stashed { comm, source: src, tag: t, bytes: b, env }).map(Some);
        }
    }

    /// A placeholder for a message taken out of the library.
    fn hand_over(&mut self, s: Stashed) -> Result<Found, c_int> {
        let msg = self.placeholder_message()?;
        let bytes = s.env.as_ref().map_or(ENVELOPE_BYTES, |e| e.total as usize);
        let found = (msg, s.source, s.tag, bytes);
        self.probed.insert(handle_key(msg), Probed::Taken(s));
        Ok(found)
    }

    /// A fresh message of the library to stand for one the shim holds: zero bytes this
    /// rank sends itself on the shim's own communicator (no new communicator: each one a
    /// process holds slows Open MPI's host messages a little; and not one of a single rank,
    /// such as `MPI_COMM_SELF`, whose matched messages MPICH 4.0 crashes receiving): the
    /// node's, which has other ranks where the shim takes messages out of the library
    /// within a node, or the world's where envelopes come from other nodes too.
    fn placeholder_message(&mut self) -> Result<MPI_Message, c_int> {
        let me = self.shim_rank;
        let mut req = request_null();
        // SAFETY: an empty message to this rank on the shim's communicator; the request may
        // be freed before it completes.
        let rc = unsafe {
            let rc = PMPI_Isend(std::ptr::null(), 0, byte(), me, PLACEHOLDER_TAG, self.shim_comm, &mut req);
            if rc == SUCCESS {
                PMPI_Request_free(&mut req)
            } else {
                rc
            }
        };
        if rc != SUCCESS {
            return Err(rc);
        }
        loop {
            let (mut flag, mut msg) = (0, message_null());
            // SAFETY: as above; locals as out-pointers.
            let rc = unsafe { PMPI_Improbe(me, PLACEHOLDER_TAG, self.shim_comm, &mut flag, &mut msg, status_ignore()) };
            if rc != SUCCESS {
                return Err(rc);
            }
            if flag != 0 {
                return Ok(msg);
            }
        }
    }

    /// `MPI_Mrecv` / `MPI_Imrecv` (with `greq`) of a message a probe of the program
    /// matched: `None` when `msg` is no message the shim handed out (the library's to
    /// receive); else the message's communicator and the receive's operation and request,
    /// or an error code.
    #[allow(clippy::type_complexity)]
    pub fn mrecv(
        &mut self,
        buf: usize,
        count: c_int,
        dt: MPI_Datatype,
        msg: MPI_Message,
        greq: bool,
    ) -> Option<(MPI_Comm, Result<(u64, MPI_Request), c_int>)> {
        let probed = self.probed.remove(&handle_key(msg))?;
        let (comm, source, tag) = match &probed {
            Probed::Taken(s) => (s.comm, s.source, s.tag),
            Probed::Library { comm, source, tag, .. } => (*comm, *source, *tag),
        };
        let spec = match self.recv_spec(buf, count, dt, source, tag, comm) {
            Ok(spec) => spec,
            Err(rc) => return Some((comm, Err(rc))),
        };
        let (id, handle) = self.new_op(Some(spec), comm, State::Posted, greq);
        let mut msg = msg;
        match probed {
            Probed::Taken(s) => {
                // SAFETY: the placeholder, an empty message of the shim's communicator.
                unsafe { PMPI_Mrecv(std::ptr::null_mut(), 0, byte(), &mut msg, status_ignore()) };
                self.deliver_small(id, &spec, s.source, s.tag, &s.bytes, s.env);
            }
            Probed::Library { bytes, .. } => self.deliver(id, &spec, msg, source, tag, bytes),
        }
        Some((comm, Ok((id, handle))))
    }
}
