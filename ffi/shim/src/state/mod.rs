//! The shim's state: the node's gpulmt context in plugin mode (RTS cookies ride the
//! envelopes the MPI library matches; gpulmt's other control packets take its own
//! shared-memory rings), the operations the shim manages itself, and the progress
//! that drives them.
//!
//! Operations the shim manages (all others go straight to the MPI library):
//! - every receive (`Posted` until a message is matched to it: the receiver cannot
//!   know whether the sender used a host or a device buffer);
//! - sends of device buffers (`LmtSend` to a rank of this node: an envelope on the
//!   user's communicator and tag, then gpulmt moves the payload; `MpiSend` with host
//!   staging to a rank of another node, or below `GPULMT_MPI_LMT_MIN` bytes: copied to
//!   host memory and sent by the MPI library);
//! - host sends issued while other shim operations are in flight, when they block.
//!
//! Non-blocking operations are handed to the user as generalized requests
//! (`MPI_Grequest_start`), so their handles are real MPI requests that every MPI
//! function accepts; the shim completes them (`MPI_Grequest_complete`) from its
//! progress, and MPI asks the shim for their status through `query_fn`.
//!
//! Matching keeps MPI's rules: posted receives are matched in the order they were
//! posted (a message found for a later receive that an earlier one also matches
//! restarts the scan, so the earlier receive gets its first message), and messages
//! from one sender come in MPI's order because the MPI library itself matches them
//! (`MPI_Iprobe` to look, `MPI_Improbe` on the concrete source and tag to take).
//!
//! This module holds the [`Shim`] itself and its counters; the rest, by idea:
//! - [`lock`](mod@lock): the global shim behind its lock, and the busy flag the host fast paths
//!   read without it;
//! - [`setup`]: joining the node's gpulmt job at `MPI_Init`, leaving it at
//!   `MPI_Finalize`;
//! - [`placement`]: where a buffer lives (host or device) and whether a rank shares
//!   this node: what decides an operation's path;
//! - [`ops`]: the table of operations, their states, and how they finish;
//! - [`greq`]: the generalized requests the user holds, and MPI's callbacks on them;
//! - [`send`]: starting device sends (through gpulmt, or staged);
//! - [`recv`]: posting receives and writing a matched message into the user's buffer;
//! - [`matching`]: matching messages to posted receives in MPI's order, and probes;
//! - [`mprobe`]: the program's own matched probes and their receives;
//! - [`progress`]: polling gpulmt and every running operation;
//! - [`background`]: progress from a helper thread while the application's thread waits
//!   in a blocking call of the MPI library;
//! - [`staging`](mod@staging): what staging needs: which buffers are device memory, the
//!   copier, and non-blocking calls on staged buffers.

mod background;
mod greq;
mod lock;
mod matching;
mod mprobe;
mod ops;
mod placement;
mod progress;
mod recv;
mod send;
mod setup;
mod staging;

use std::collections::HashMap;
use std::ffi::c_int;

use gpulmt::Context;
use mpi_sys::*;

pub use background::{stop as stop_background, while_blocked};
pub use greq::errored;
pub use lock::{host_fast_path, lock};
pub use ops::Done;
use ops::{Op, Stashed, State};
pub use setup::offnode_queues_wanted;

/// Counters for tests and users (`gpulmt_mpi_get_counters`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(non_camel_case_types)]
pub struct gpulmt_mpi_counters {
    /// Device sends moved by gpulmt (envelope + LMT).
    pub lmt_sends: u64,
    /// Receives whose message was an envelope: payload moved by gpulmt.
    pub lmt_recvs: u64,
    /// Device sends staged through host memory and sent by the MPI library.
    pub staged_sends: u64,
    /// Receives into device buffers of data the MPI library moved (host staging).
    pub staged_recvs: u64,
    /// Receives into host buffers of data the MPI library moved.
    pub host_recvs: u64,
}

/// The shim while active: the node's gpulmt context, what it learned of the node at
/// `MPI_Init`, and the operations it manages.
pub struct Shim {
    pub ctx: Context,
    job_hash: u64,
    world_rank: c_int,
    world_group: MPI_Group,
    /// A private duplicate of the node's communicator (of the world's where the internode
    /// path runs), for the finalize barriers and the placeholder messages of matched
    /// probes (`mprobe`).
    shim_comm: MPI_Comm,
    /// This rank's rank in `shim_comm`.
    shim_rank: c_int,
    /// The context has the internode path: large device messages to other nodes go as
    /// envelopes and a rendezvous the proxies move, not staged for the MPI library.
    offnode: bool,
    ops: HashMap<u64, Op>,
    next_op: u64,
    /// Receives without a message, in post order.
    posted: Vec<u64>,
    stash: Vec<Stashed>,
    /// Messages the program's matched probes found, by the handle it holds (`mprobe`).
    probed: HashMap<u64, mprobe::Probed>,
    /// Results of blocking operations, picked up by their waiters.
    finished: HashMap<u64, Done>,
    /// Device allocations made through gpulmt_mpi_alloc (released at finalize).
    pub allocations: Vec<usize>,
    /// The last device buffer `is_device` found, and its device.
    last_device: Option<(usize, u32)>,
    /// Device messages below this many bytes are staged (`GPULMT_MPI_LMT_MIN`).
    lmt_min: usize,
    /// Whether device buffers wait for the application's legacy default stream first
    /// (`GPULMT_MPI_SETTLE`).
    settle: bool,
    /// The library provides `MPI_THREAD_MULTIPLE`: the helper thread of `background`
    /// may make MPI calls while the application's thread is inside the library.
    thread_multiple: bool,
    pub counters: gpulmt_mpi_counters,
}

// SAFETY: the MPI handles are plain values the MPI library accepts from any thread
// (the user's MPI thread level governs concurrent calls); raw pointers to generalized
// request states are only dereferenced under the shim's lock or by MPI's callbacks.
unsafe impl Send for Shim {}

/// Why the shim is not active.
pub type InitError = String;

impl Shim {
    /// No operation of the shim is running and no control packet waits to be sent:
    /// MPI calls may block without starving a transfer.
    pub fn is_idle(&self) -> bool {
        self.ops.is_empty() && !self.ctx.control_pending()
    }

    /// Idle, and no message a probe took out of the MPI library is waiting: the next
    /// message on any communicator may go straight to the MPI library.
    fn quiet(&self) -> bool {
        self.is_idle() && self.stash.is_empty()
    }

    /// Whether a message of this rank can be an envelope: another rank shares the node,
    /// or the internode path reaches other nodes. Without either, the shim leaves
    /// messages of an envelope's size in the library.
    fn envelopes_possible(&self) -> bool {
        self.ctx.topology().local_size() > 1 || self.offnode
    }

    /// Some matched transfer is in flight (unmatched receives aside) or a control
    /// packet waits for room in a peer's ring.
    fn busy(&self) -> bool {
        self.ctx.control_pending() || self.ops.values().any(|op| !matches!(op.state, State::Posted))
    }
}
