//! The operations the shim manages: what they report when finished ([`Done`]), the
//! receive the user posted ([`RecvSpec`]), the state each operation is in, and the
//! table that starts, finishes and cancels them.

use std::ffi::c_int;

use gpulmt::anatomy::{self, probe, Point};
use gpulmt::Request;
use mpi_sys::*;

use super::greq::{cancel_fn, errored, free_fn, query_fn, release, Errored, GreqState};
use super::Shim;
use crate::envelope::{Envelope, ENVELOPE_BYTES};
use crate::raw::*;
use crate::staging::pool::MessageBuf;
use crate::staging::Staged;

/// What a finished operation reports.
#[derive(Clone, Copy, Debug)]
pub struct Done {
    pub source: c_int,
    pub tag: c_int,
    pub bytes: usize,
    pub error: c_int,
    pub cancelled: bool,
}

impl Done {
    pub(super) fn ok(source: c_int, tag: c_int, bytes: usize) -> Done {
        Done { source, tag, bytes, error: SUCCESS, cancelled: false }
    }
    pub(super) fn err(source: c_int, tag: c_int, error: c_int) -> Done {
        Done { source, tag, bytes: 0, error, cancelled: false }
    }
}

/// A receive as the user posted it.
#[derive(Clone, Copy)]
pub(super) struct RecvSpec {
    pub(super) buf: usize,
    pub(super) count: c_int,
    pub(super) dtype: MPI_Datatype,
    pub(super) source: c_int,
    pub(super) tag: c_int,
    pub(super) comm: MPI_Comm,
    pub(super) device: bool,
    pub(super) contiguous: bool,
    /// Bytes the buffer holds (count x type size).
    pub(super) cap: usize,
}

pub(super) enum State {
    /// A receive no message was matched to yet.
    Posted,
    /// A receive of data the MPI library moves (`MPI_Imrecv`), into the user's buffer
    /// or, for a device buffer, into host staging copied over at completion.
    RawRecv { inner: MPI_Request, staging: Option<MessageBuf> },
    /// A receive of an envelope's payload through gpulmt (into staging for
    /// non-contiguous datatypes, unpacked at completion).
    LmtRecv { req: Request, source: c_int, tag: c_int, staging: Option<Vec<u8>> },
    /// A device send through gpulmt: the envelope's MPI send, then the transfer.
    LmtSend { _env: Box<[u8; ENVELOPE_BYTES]>, env_req: MPI_Request, lmt: Option<Request>, error: c_int },
    /// A send the MPI library moves from host memory (device data staged, or a host
    /// buffer of a blocking send while the shim is busy).
    MpiSend { inner: MPI_Request, _staging: Option<MessageBuf> },
    /// A non-blocking call the MPI library runs on staged copies of device buffers (a
    /// collective; `call` names it in errors): copied back when `inner` completes.
    Staged { inner: MPI_Request, staged: Staged, call: &'static str },
    /// Finished; completed at the next progress (cancelled receives).
    Finished(Done),
}

pub(super) struct Op {
    pub(super) recv: Option<RecvSpec>,
    /// The user's communicator (whose error handler reports the operation's error).
    pub(super) comm: MPI_Comm,
    pub(super) state: State,
    /// The user's generalized request: its extra state and handle.
    pub(super) greq: Option<(*mut GreqState, MPI_Request)>,
}

/// A message `MPI_Probe` had to take from the MPI library to look at it (it has the
/// size of an envelope), kept for the receive that matches it.
pub(super) struct Stashed {
    pub(super) comm: MPI_Comm,
    pub(super) source: c_int,
    pub(super) tag: c_int,
    pub(super) bytes: Box<[u8; ENVELOPE_BYTES]>,
    pub(super) env: Option<Envelope>,
}

impl Shim {
    pub(super) fn new_op(
        &mut self,
        recv: Option<RecvSpec>,
        comm: MPI_Comm,
        state: State,
        greq: bool,
    ) -> (u64, MPI_Request) {
        let id = self.next_op;
        self.next_op += 1;
        let mut handle = request_null();
        let g = if greq {
            let gs = Box::into_raw(Box::new(GreqState::new(id)));
            // SAFETY: valid callbacks and out-pointer; `gs` is held by MPI (until
            // free_fn) and by the operation (until `finish`): `greq::release`.
            unsafe { PMPI_Grequest_start(Some(query_fn), Some(free_fn), Some(cancel_fn), gs.cast(), &mut handle) };
            Some((gs, handle))
        } else {
            None
        };
        self.ops.insert(id, Op { recv, comm, state, greq: g });
        (id, handle)
    }

    /// Finishes an operation: its generalized request completes, or its blocking
    /// waiter finds the result.
    pub(super) fn finish(&mut self, id: u64, done: Done) {
        let Some(op) = self.ops.remove(&id) else { return };
        anatomy::mark(Point::Probe, probe::SHIM_OP_FINISHED);
        match op.greq {
            Some((gs, handle)) => {
                if done.error != SUCCESS {
                    errored().push(Errored { handle, comm: op.comm, state: gs as usize });
                }
                // SAFETY: the operation still holds the state (MPI may have let it go
                // already: `GreqState`); the handle is the one MPI gave us, valid until
                // the request is complete and freed. The operation lets go last thing.
                unsafe {
                    (*gs).done = done;
                    PMPI_Grequest_complete(handle);
                    release(gs);
                }
            }
            None => {
                self.finished.insert(id, done);
            }
        }
    }

    /// Takes the result of a blocking operation, if it finished.
    pub fn take_finished(&mut self, id: u64) -> Option<Done> {
        self.finished.remove(&id)
    }

    pub(super) fn set_state(&mut self, id: u64, state: State) {
        if let Some(op) = self.ops.get_mut(&id) {
            op.state = state;
        }
    }

    /// Cancels a receive that no message was matched to yet (`cancel_fn`).
    pub(super) fn cancel(&mut self, id: u64) {
        if let Some(i) = self.posted.iter().position(|&p| p == id) {
            self.posted.remove(i);
            let spec = self.ops[&id].recv.expect("posted");
            let mut d = Done::ok(spec.source, spec.tag, 0);
            d.cancelled = true;
            self.set_state(id, State::Finished(d));
        }
    }
}
