//! Host timestamps at the steps of a message's path through this rank (cargo feature
//! `anatomy`), to find where a small message's latency goes on real hardware: where a
//! request is posted, a packet crosses a ring, a copy is issued, seen finished, a request
//! completes, and on the internode path where the proxy thread takes a packet, MPI
//! accepts it, a control message arrives and completions are published. Without the
//! feature every call here compiles to nothing; with it, each point costs one
//! `clock_gettime` and a store into a preallocated log of the calling thread, and
//! [`dump`] writes the logs of every thread of the process (the context's and the
//! proxy's), merged in time order, as CSV `ns,point,arg` (CLOCK_MONOTONIC, one clock for
//! all processes of a host) to `$GPULMT_ANATOMY_OUT.<rank>.csv` at finalize.
//! `bench/gpu/anatomy.py` lines the ranks' logs up into the steps of a ping-pong leg;
//! `bench/gpu/anatomy_net.py` those of a leg across nodes.

/// A step of a message's path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Point {
    /// `isend` entered (arg: 0).
    SendPost = 1,
    /// `irecv` entered.
    RecvPost = 2,
    /// A packet was taken from a ring (arg: its kind byte).
    PacketIn = 3,
    /// A packet was written into a ring (arg: its kind byte).
    PacketOut = 4,
    /// A device copy is about to be issued.
    CopyIssue = 5,
    /// The driver accepted the copy (the call returned).
    CopyIssued = 6,
    /// A device copy was seen finished (arg: copy polls since the last copy was issued,
    /// at most 255: the polls this copy took when it is the only one in flight).
    CopyDone = 7,
    /// A request's completion was handed to the application.
    Completed = 8,
    /// A step inside a call (arg: which, see [`probe`]).
    Probe = 9,
    /// The internode proxy took a packet from a GIO send queue (arg: its op code).
    NetTaken = 10,
    /// MPI accepted a message the proxy sent (the `MPI_Isend` returned).
    NetIssued = 11,
    /// A control message from another node reached the proxy (arg: 0).
    NetArrived = 12,
    /// The proxy published completions of a queue (its counters, with release).
    NetPublished = 13,
    /// The context took a control packet the proxy delivered (arg: its kind byte).
    NetPacketIn = 14,
}

/// Args of [`Point::Probe`]: steps inside `irecv` and `isend`, and a packet handled.
pub mod probe {
    /// irecv: the buffer classified; described (exported); the engine posted it.
    pub const RECV_CLASSIFIED: u8 = 1;
    pub const RECV_DESCRIBED: u8 = 2;
    pub const RECV_POSTED: u8 = 3;
    /// isend: the wait for an RTR offer is over; the engine posted the send.
    pub const SEND_OFFER_WAITED: u8 = 4;
    pub const SEND_POSTED: u8 = 5;
    /// isend: an eager payload in device memory was copied out to the host.
    pub const SEND_PAYLOAD_STAGED: u8 = 6;
    /// An eager payload for a device buffer: its copy in starts; it has landed.
    pub const RECV_PAYLOAD_COPY: u8 = 7;
    pub const RECV_PAYLOAD_WRITTEN: u8 = 8;
    /// isend: the buffer classified and the eager decision taken.
    pub const SEND_CLASSIFIED: u8 = 9;
    /// A copy that is waited for (`copy_wait`: the eager payload's either way) was
    /// issued; it was seen finished.
    pub const COPY_WAIT_ISSUED: u8 = 10;
    pub const COPY_WAIT_DONE: u8 = 11;
    /// The proxy calls the network to send a control message (after its checks and
    /// envelope); it handed the control messages that arrived to the context.
    pub const NET_SEND_CALL: u8 = 12;
    pub const NET_HANDED_OVER: u8 = 13;
    /// A transfer's staging piece (`net::stream`): its copy issued; seen finished; its
    /// send or receive handed to the network; its network operation reported.
    pub const STAGE_COPY_ISSUED: u8 = 14;
    pub const STAGE_COPY_DONE: u8 = 15;
    pub const PIECE_ON_WIRE: u8 = 16;
    pub const PIECE_LANDED: u8 = 17;
    /// The PMPI shim (ffi/shim): the envelope of a send gpulmt moves went to the MPI
    /// library (its `MPI_Isend` returned); a receive matched an envelope and starts
    /// gpulmt's receive; that receive was started; an operation was finished for the
    /// application.
    pub const SHIM_ENVELOPE_SENT: u8 = 18;
    pub const SHIM_ENVELOPE_MATCHED: u8 = 19;
    pub const SHIM_RECV_STARTED: u8 = 20;
    pub const SHIM_OP_FINISHED: u8 = 21;
    /// A packet taken from a ring was handled (engine and actions).
    pub const PACKET_HANDLED: u8 = 100;
}

#[cfg(feature = "anatomy")]
mod imp {
    use std::io::Write;
    use std::sync::{Arc, Mutex, PoisonError};

    use super::Point;

    /// Entries kept at most per thread: a long run keeps its first ones.
    const CAPACITY: usize = 4 << 20;

    type Log = Arc<Mutex<Vec<(u64, u8, u8)>>>;

    /// Every thread's log, so that the context's thread writes the proxy's too. Each
    /// thread locks only its own log (uncontended but at the dump).
    static LOGS: Mutex<Vec<Log>> = Mutex::new(Vec::new());

    thread_local! {
        static LOG: Log = {
            let log: Log = Arc::new(Mutex::new(Vec::with_capacity(CAPACITY)));
            LOGS.lock().unwrap_or_else(PoisonError::into_inner).push(log.clone());
            log
        };
        static POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }

    fn now_ns() -> u64 {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }

    pub fn mark(p: Point, arg: u8) {
        let t = now_ns();
        LOG.with(|l| {
            let mut l = l.lock().unwrap_or_else(PoisonError::into_inner);
            if l.len() < CAPACITY {
                l.push((t, p as u8, arg));
            }
        });
    }

    pub fn poll() {
        POLLS.with(|c| c.set(c.get().saturating_add(1)));
    }

    pub fn take_polls() -> u8 {
        POLLS.with(|c| c.replace(0)).min(255) as u8
    }

    pub fn dump(rank: u32) {
        let Some(base) = std::env::var_os("GPULMT_ANATOMY_OUT") else { return };
        let path = format!("{}.{rank}.csv", base.to_string_lossy());
        let mut all: Vec<(u64, u8, u8)> = Vec::new();
        for log in LOGS.lock().unwrap_or_else(PoisonError::into_inner).iter() {
            all.extend_from_slice(&log.lock().unwrap_or_else(PoisonError::into_inner));
        }
        // Stable: one thread's entries of one nanosecond keep their order.
        all.sort_by_key(|e| e.0);
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
            writeln!(f, "ns,point,arg")?;
            all.iter().try_for_each(|(t, p, a)| writeln!(f, "{t},{p},{a}"))?;
            f.flush()
        };
        if let Err(e) = write() {
            tracing::warn!(path, error = %e, "writing the anatomy log");
        }
    }
}

/// Records that this thread reached `p` now.
#[inline(always)]
pub fn mark(_p: Point, _arg: u8) {
    #[cfg(feature = "anatomy")]
    imp::mark(_p, _arg);
}

/// Counts one poll of a copy in flight.
#[inline(always)]
pub fn poll() {
    #[cfg(feature = "anatomy")]
    imp::poll();
}

/// The polls counted since the last call (0 without the feature).
#[inline(always)]
pub fn take_polls() -> u8 {
    #[cfg(feature = "anatomy")]
    return imp::take_polls();
    #[cfg(not(feature = "anatomy"))]
    0
}

/// Writes every thread's log (see the module doc); nothing without the feature.
#[inline(always)]
pub fn dump(_rank: u32) {
    #[cfg(feature = "anatomy")]
    imp::dump(_rank);
}
