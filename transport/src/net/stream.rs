//! One transfer's data between two proxies: its pieces, and for device memory the staging
//! pipeline through pinned bounce buffers.
//!
//! A transfer of `len` bytes travels as `max(1, ceil(len / chunk))` messages ("pieces")
//! of `chunk` bytes (the last shorter; one empty message for `len == 0`, so both sides
//! see a message) under one (source, tag): MPI delivers them in order, to receives posted
//! in order. Both sides cut the same pieces because every rank uses the same `chunk`
//! (checked at start). At most `depth` pieces of a transfer are in flight:
//! - **host memory** (or device memory with a CUDA-aware library): each piece goes to
//!   MPI straight from (or into) the buffer;
//! - **device memory otherwise**: a sending piece is copied device-to-host into a bounce
//!   buffer by the backend's copy engine, then sent; a receiving piece is received into a
//!   bounce buffer, then copied host-to-device. With `depth` pieces in flight, copies of
//!   one piece overlap the wire of the next on both sides.
//! - **discard**: a receive whose data must be consumed and dropped (a PUT the target
//!   refused: its data is already on its way).
//!
//! Pieces go to the network strictly in order, even when a later piece's copy finishes
//! first. A failure ends the transfer: no new pieces start, receives still posted are
//! cancelled, and the transfer reports its error only once every piece has stopped, so
//! no buffer is reused while MPI or a copy engine may still touch it.
//!
//! **Bounce buffers** come from a [`BouncePool`] shared by all transfers. Its soft cap
//! bounds its memory; past the cap a transfer that holds no buffer still gets one (a new
//! allocation), so every transfer can always move a piece: no transfer waits for a buffer
//! that only transfers waiting on the network could free (which could deadlock two ranks
//! that send to each other).

use std::collections::VecDeque;
use std::time::Instant;

use gpulmt_protocols::Rank;

use super::iface::{Arrival, NetFail, NetIface, ReqId, Status};
use super::profile::StageProfile;
use crate::anatomy::{mark, probe, Point};
use crate::device::{Backend, CopyTicket, DevId, DeviceError, HostMapped};

/// The copy-engine lane of the proxy's staging copies: a queue of its own on each device
/// (the progress engine's lanes are below 16), so staging never waits behind LMT copies.
pub const NET_LANE: u32 = 16;

/// How transfers are cut: pieces of `chunk` bytes, at most `depth` in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pipeline {
    pub chunk: u64,
    pub depth: u32,
}

/// Which way data moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Send,
    Recv,
}

/// Where the local side of a transfer is, and how it moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Straight to or from MPI (host memory, or device memory with a CUDA-aware MPI).
    Direct,
    /// Device memory of `DevId`, staged through bounce buffers.
    Staged(DevId),
    /// Received and dropped (receives only).
    Discard,
}

/// Why a transfer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("{0}")]
    Net(NetFail),
    #[error("staging copy failed: {0}")]
    Copy(DeviceError),
    #[error("piece {piece} carried {got} bytes where {expected} were expected: the two sides disagree on the transfer's size or on GPULMT_NET_CHUNK")]
    Size { piece: u64, got: usize, expected: usize },
    #[error("cancelled")]
    Cancelled,
}

/// Pinned host buffers of `chunk` bytes for staging.
pub struct BouncePool {
    backend: Backend,
    chunk: usize,
    soft_cap: usize,
    free: Vec<usize>,
    /// Every buffer allocated, by host address.
    all: Vec<HostMapped>,
}

impl BouncePool {
    /// A pool of `chunk`-byte buffers that grows to `soft_cap` buffers (and past it only
    /// for transfers that hold none).
    pub fn new(backend: Backend, chunk: usize, soft_cap: usize) -> Self {
        BouncePool { backend, chunk, soft_cap, free: Vec::new(), all: Vec::new() }
    }

    /// A buffer for a transfer that holds `held` buffers now, or `None` to wait.
    ///
    /// At or past the cap only a transfer that holds none gets one, a free buffer too:
    /// handing free buffers to whoever asks first let every transfer of a 64-message
    /// window reach the full depth, 253 buffers of 1 MiB where the cap is 16, and the
    /// network then moved each piece more slowly (git history: `bench/results/h200x1/net_buffers1` at c15a975).
    fn take(&mut self, held: usize) -> Result<Option<usize>, DeviceError> {
        if held > 0 && self.lent() >= self.soft_cap {
            return Ok(None);
        }
        if let Some(b) = self.free.pop() {
            return Ok(Some(b));
        }
        let m = self.backend.alloc_host_mapped(self.chunk)?;
        self.all.push(m);
        Ok(Some(m.host))
    }

    /// Copies `len <= chunk` bytes of device memory `src` on `dev` out through one of the
    /// pool's pinned buffers and waits for it: into pinned memory a small copy is one DMA
    /// (4-7 us on an H200 under MPS, spinning kernels or not), where pageable memory goes
    /// through the driver's own staging. On the net lane, so not ordered after the
    /// application's default stream.
    ///
    /// # Safety
    /// `src..src+len` is device memory of `dev`, readable until this returns.
    pub unsafe fn copy_out_small(&mut self, dev: DevId, src: usize, len: usize) -> Result<Vec<u8>, DeviceError> {
        assert!(len <= self.chunk, "copy_out_small of {len} bytes through buffers of {}", self.chunk);
        let buf = self.take(0)?.expect("a transfer that holds no buffer always gets one");
        // SAFETY: `buf` is a pinned buffer of `chunk >= len` bytes lent to this call until
        // the copy is seen finished below; `src` is the caller's.
        let copied = unsafe { self.backend.copy_wait(dev, NET_LANE, buf, src, len) };
        // SAFETY: the copy finished (or never started): `buf` holds `len` bytes for us.
        let bytes = copied.map(|()| unsafe { std::slice::from_raw_parts(buf as *const u8, len) }.to_vec());
        // After a failed copy or poll the engine may still write the buffer: not lent again.
        if bytes.is_ok() {
            self.give(buf);
        }
        bytes
    }

    fn give(&mut self, buf: usize) {
        debug_assert!(self.all.iter().any(|m| m.host == buf) && !self.free.contains(&buf));
        self.free.push(buf);
    }

    /// Buffers allocated so far.
    pub fn allocated(&self) -> usize {
        self.all.len()
    }

    /// Buffers lent out now.
    pub fn lent(&self) -> usize {
        self.all.len() - self.free.len()
    }
}

impl Drop for BouncePool {
    fn drop(&mut self) {
        let lent = self.lent();
        if lent > 0 {
            tracing::error!(lent, "GIO proxy: staging buffers still lent at exit are leaked, not freed: an operation that could not be cancelled may still use them");
        }
        for m in self.all.iter().filter(|m| self.free.contains(&m.host)) {
            // SAFETY: a free buffer: no piece holds it, so no copy or MPI operation uses it.
            if let Err(e) = unsafe { self.backend.free_host_mapped(m.host) } {
                tracing::warn!(error = %e, "freeing a staging buffer");
            }
        }
    }
}

/// Names the network operations of one transfer's pieces, so their completions find it.
pub trait PieceReqs {
    /// A new operation of piece `piece`.
    fn register(&mut self, piece: u64) -> ReqId;
    /// An operation the network did not take after all.
    fn forget(&mut self, req: ReqId);
}

/// What a transfer needs to make progress: the network, the copy engines, the buffers,
/// and a way to name its network operations.
pub struct Io<'a> {
    pub iface: &'a mut dyn NetIface,
    pub backend: &'a Backend,
    pub bounce: &'a mut BouncePool,
    pub reqs: &'a mut dyn PieceReqs,
    pub profile: &'a mut StageProfile,
}

#[derive(Debug)]
enum PieceState {
    /// A staging copy runs (since the instant): device-to-host before sending,
    /// host-to-device after receiving.
    Copying(CopyTicket, Instant),
    /// A sending piece's bytes are ready to go to the network.
    Ready,
    /// On the network (since the instant).
    Wire(ReqId, Instant),
    Done,
}

#[derive(Debug)]
struct Piece {
    idx: u64,
    len: usize,
    bounce: Option<usize>,
    state: PieceState,
}

/// One side of one transfer.
#[derive(Debug)]
pub struct Stream {
    dir: Dir,
    peer: Rank,
    tag: i32,
    addr: usize,
    place: Place,
    len: u64,
    chunk: u64,
    depth: usize,
    npieces: u64,
    /// Pieces started so far (the next one's index).
    started: u64,
    /// Pieces handed to the network so far (in order).
    wired: u64,
    /// Started and not retired, in index order.
    pieces: VecDeque<Piece>,
    error: Option<StreamError>,
}

impl Stream {
    /// A transfer of `len` bytes at `addr` with `peer` under `tag`, cut as `pipe` says.
    /// Nothing starts before [`advance`](Self::advance).
    ///
    /// # Safety
    /// `addr..addr + len` is valid for what `dir` does (reads for a send, writes for a
    /// receive) in the memory `place` names (unused for `Discard`), and stays so, with
    /// nothing else writing it (a send) or using it (a receive), until the transfer is
    /// [`finished`](Self::finished) or dropped before its first piece started.
    pub unsafe fn new(dir: Dir, peer: Rank, tag: i32, addr: usize, len: u64, place: Place, pipe: Pipeline) -> Stream {
        let Pipeline { chunk, depth } = pipe;
        assert!(chunk > 0 && chunk <= i32::MAX as u64 && depth > 0);
        assert!(dir == Dir::Recv || place != Place::Discard, "a send cannot discard");
        let npieces = len.div_ceil(chunk).max(1);
        let (started, wired, pieces, error) = (0, 0, VecDeque::new(), None);
        Stream {
            dir,
            peer,
            tag,
            addr,
            place,
            len,
            chunk,
            depth: depth as usize,
            npieces,
            started,
            wired,
            pieces,
            error,
        }
    }

    /// Whether the network or a copy engine took a piece (or the transfer failed): the op
    /// was accepted. Until then dropping the stream leaves nothing behind, and the proxy
    /// leaves the op's packet in its slot (backpressure).
    pub fn accepted(&self) -> bool {
        self.wired > 0 || self.error.is_some() || self.pieces.iter().any(|p| matches!(p.state, PieceState::Copying(..)))
    }

    /// The transfer's outcome once every piece has stopped: `None` while any runs.
    pub fn finished(&self) -> Option<Result<(), StreamError>> {
        if !self.pieces.is_empty() {
            return None;
        }
        match &self.error {
            Some(e) => Some(Err(e.clone())),
            None => (self.started == self.npieces).then_some(Ok(())),
        }
    }

    fn piece_len(&self, idx: u64) -> usize {
        (self.len - idx * self.chunk).min(self.chunk) as usize
    }

    fn held(&self) -> usize {
        self.pieces.iter().filter(|p| p.bounce.is_some()).count()
    }

    /// Ends the transfer early with `error` (if it has none yet): cancels what is on the
    /// network; it finishes once every piece has stopped.
    pub fn fail(&mut self, error: StreamError, iface: &mut dyn NetIface) {
        if self.error.is_none() {
            self.error = Some(error);
            for p in &self.pieces {
                if let PieceState::Wire(req, _) = p.state {
                    iface.ep_cancel(req);
                }
            }
        }
    }

    /// Moves the transfer on: finished copies, pieces to the network in order, new
    /// pieces up to the depth. Returns whether anything changed.
    pub fn advance(&mut self, io: &mut Io<'_>) -> bool {
        let mut changed = self.poll_copies(io);
        loop {
            let wired = self.wire_ready(io);
            let started = self.start_piece(io);
            changed |= wired | started;
            if !started {
                break;
            }
        }
        self.retire(io);
        changed
    }

    /// Polls staging copies in issue order (one lane finishes in order).
    fn poll_copies(&mut self, io: &mut Io<'_>) -> bool {
        let mut changed = false;
        let mut failed = None;
        for p in self.pieces.iter_mut() {
            let PieceState::Copying(t, since) = p.state else { continue };
            let asked = Instant::now();
            let polled = io.backend.copy_poll(t);
            let now = Instant::now();
            io.profile.polls.add(now - asked);
            match polled {
                Ok(false) => {
                    io.profile.polls_pending += 1;
                    break;
                }
                Ok(true) => mark(Point::Probe, probe::STAGE_COPY_DONE),
                Err(e) => failed = Some(e),
            }
            let (tally, bytes) = match self.dir {
                Dir::Send => (&mut io.profile.copy_out, &mut io.profile.bytes_out),
                Dir::Recv => (&mut io.profile.copy_in, &mut io.profile.bytes_in),
            };
            tally.add(now - since);
            *bytes += p.len as u64;
            changed = true;
            p.state = match self.dir {
                Dir::Send => PieceState::Ready,
                Dir::Recv => PieceState::Done,
            };
            if failed.is_some() {
                break;
            }
        }
        if let Some(e) = failed {
            self.fail(StreamError::Copy(e), io.iface);
        }
        changed
    }

    /// Hands ready sending pieces to the network, in index order.
    fn wire_ready(&mut self, io: &mut Io<'_>) -> bool {
        let mut changed = false;
        while self.error.is_none() {
            let Some(p) = self.pieces.iter_mut().find(|p| p.idx == self.wired) else { break };
            if !matches!(p.state, PieceState::Ready) {
                break;
            }
            let buf = p.bounce.unwrap_or(self.addr + (p.idx * self.chunk) as usize);
            let req = io.reqs.register(p.idx);
            // SAFETY: buf..buf+len is the piece's bytes: in the caller's buffer (new's
            // contract keeps it readable until the stream finishes, which waits for this
            // send) or in a bounce buffer the piece holds until the send is reported.
            match unsafe { io.iface.ep_send(req, self.peer, self.tag, buf, p.len) } {
                Ok(Status::InProgress) => {
                    mark(Point::Probe, probe::PIECE_ON_WIRE);
                    p.state = PieceState::Wire(req, Instant::now())
                }
                Ok(Status::Done(())) => {
                    io.reqs.forget(req);
                    p.state = PieceState::Done;
                }
                Ok(Status::NoResource) => {
                    io.reqs.forget(req);
                    break;
                }
                Err(e) => {
                    io.reqs.forget(req);
                    p.state = PieceState::Done;
                    self.fail(StreamError::Net(e), io.iface);
                }
            }
            self.wired += 1;
            changed = true;
        }
        changed
    }

    /// Starts the next piece if the depth and the buffers allow; returns whether it did.
    fn start_piece(&mut self, io: &mut Io<'_>) -> bool {
        if self.error.is_some() || self.started == self.npieces || self.pieces.len() >= self.depth {
            return false;
        }
        let idx = self.started;
        let len = self.piece_len(idx);
        let at = self.addr + (idx * self.chunk) as usize;
        let bounce = match self.place {
            Place::Direct => None,
            Place::Staged(_) | Place::Discard => match io.bounce.take(self.held()) {
                Ok(Some(b)) => Some(b),
                Ok(None) => {
                    io.profile.bounce_waits += 1;
                    return false;
                }
                Err(e) => {
                    self.fail(StreamError::Copy(e), io.iface);
                    return false;
                }
            },
        };
        let state = match (self.dir, self.place) {
            (Dir::Send, Place::Direct) => PieceState::Ready,
            (Dir::Send, Place::Staged(dev)) => {
                let b = bounce.expect("staged pieces hold a buffer");
                // SAFETY: the source is the caller's device range (new's contract), the
                // destination a bounce buffer of `chunk >= len` bytes this piece holds;
                // both stay valid until copy_poll reports the copy finished.
                match unsafe { io.backend.copy_async(dev, NET_LANE, b, at, len) } {
                    Ok(t) => {
                        mark(Point::Probe, probe::STAGE_COPY_ISSUED);
                        PieceState::Copying(t, Instant::now())
                    }
                    Err(e) => {
                        io.bounce.give(b);
                        self.fail(StreamError::Copy(e), io.iface);
                        return false;
                    }
                }
            }
            (Dir::Send, Place::Discard) => unreachable!("checked in new"),
            (Dir::Recv, place) => {
                let buf = bounce.unwrap_or(at);
                let req = io.reqs.register(idx);
                // SAFETY: buf..buf+len is the caller's range (new's contract) or a bounce
                // buffer this piece holds, until the receive is reported.
                match unsafe { io.iface.ep_recv(req, Some(self.peer), self.tag, buf, len) } {
                    Ok(Status::InProgress) => {
                        mark(Point::Probe, probe::PIECE_ON_WIRE);
                        PieceState::Wire(req, Instant::now())
                    }
                    Ok(Status::Done(a)) => {
                        io.reqs.forget(req);
                        self.pieces.push_back(Piece { idx, len, bounce, state: PieceState::Wire(req, Instant::now()) });
                        self.started += 1;
                        self.wired += 1;
                        self.landed(idx, Ok(a), io, place);
                        return true;
                    }
                    Ok(Status::NoResource) => {
                        io.reqs.forget(req);
                        if let Some(b) = bounce {
                            io.bounce.give(b);
                        }
                        return false;
                    }
                    Err(e) => {
                        io.reqs.forget(req);
                        if let Some(b) = bounce {
                            io.bounce.give(b);
                        }
                        self.fail(StreamError::Net(e), io.iface);
                        return false;
                    }
                }
            }
        };
        if self.dir == Dir::Recv {
            self.wired += 1;
        }
        self.pieces.push_back(Piece { idx, len, bounce, state });
        self.started += 1;
        true
    }

    /// The network reported piece `idx`'s operation.
    pub fn on_wire(&mut self, idx: u64, result: Result<Arrival, NetFail>, io: &mut Io<'_>) {
        mark(Point::Probe, probe::PIECE_LANDED);
        match self.dir {
            Dir::Send => {
                if let Some(p) = self.pieces.iter_mut().find(|p| p.idx == idx) {
                    if let PieceState::Wire(_, since) = p.state {
                        io.profile.wire_send.add(since.elapsed());
                    }
                    p.state = PieceState::Done;
                }
                if let Err(e) = result {
                    self.fail(StreamError::Net(e), io.iface);
                }
            }
            Dir::Recv => self.landed(idx, result, io, self.place),
        }
        self.retire(io);
    }

    /// A receiving piece's bytes arrived (or its receive failed).
    fn landed(&mut self, idx: u64, result: Result<Arrival, NetFail>, io: &mut Io<'_>, place: Place) {
        let at = self.addr + (idx * self.chunk) as usize;
        let Some(i) = self.pieces.iter().position(|p| p.idx == idx) else { return };
        let p = &mut self.pieces[i];
        if let PieceState::Wire(_, since) = p.state {
            io.profile.wire_recv.add(since.elapsed());
        }
        p.state = PieceState::Done;
        let error = match result {
            Err(e) => Some(StreamError::Net(e)),
            Ok(a) if a.len != p.len => Some(StreamError::Size { piece: idx, got: a.len, expected: p.len }),
            Ok(_) => None,
        };
        if let Some(e) = error {
            return self.fail(e, io.iface);
        }
        if let (Place::Staged(dev), Some(b), None) = (place, p.bounce, &self.error) {
            // SAFETY: the bounce buffer holds the piece's `len` received bytes and stays
            // the piece's until the copy finishes; the destination is the caller's device
            // range (new's contract).
            match unsafe { io.backend.copy_async(dev, NET_LANE, at, b, p.len) } {
                Ok(t) => {
                    mark(Point::Probe, probe::STAGE_COPY_ISSUED);
                    p.state = PieceState::Copying(t, Instant::now())
                }
                Err(e) => self.fail(StreamError::Copy(e), io.iface),
            }
        }
    }

    /// Drops finished pieces off the front, returning their buffers.
    fn retire(&mut self, io: &mut Io<'_>) {
        // Any finished piece may go (a failed transfer's later pieces can finish first),
        // but only the front's order matters for wiring, which uses indices.
        let bounce = &mut *io.bounce;
        let failed = self.error.is_some();
        self.pieces.retain(|p| match p.state {
            PieceState::Done => {
                if let Some(b) = p.bounce {
                    bounce.give(b);
                }
                false
            }
            // A failed transfer never sends a ready piece: drop it.
            PieceState::Ready if failed => {
                if let Some(b) = p.bounce {
                    bounce.give(b);
                }
                false
            }
            _ => true,
        });
    }

    /// Whether the transfer waits on the network for anything now.
    pub fn on_wire_now(&self) -> usize {
        self.pieces.iter().filter(|p| matches!(p.state, PieceState::Wire(..))).count()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::BouncePool;
    use crate::device::sim::{PeerMatrix, SimBackend, SimConfig};

    fn pool(cap: usize) -> BouncePool {
        let cfg = SimConfig {
            devices: 1,
            peer: PeerMatrix::All,
            ipc_open_us: 0,
            copy_inline: true,
            copy_done_ns: 0,
            refuse_opens: false,
            driver: None,
        };
        BouncePool::new(Arc::new(SimBackend::new(cfg).expect("sim backend")), 4096, cap)
    }

    #[test]
    fn a_small_copy_out_of_device_memory_returns_its_bytes_and_the_buffer() {
        let mut p = pool(2);
        let backend = p.backend.clone();
        let dev = backend.alloc(0, 64).unwrap();
        let pattern: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(7)).collect();
        // SAFETY: `dev` is 64 bytes of the pool's backend, `pattern` 64 host bytes; freed below.
        unsafe { backend.copy_sync(dev, pattern.as_ptr() as usize, 64).unwrap() };
        for (off, len) in [(0, 8), (5, 13), (0, 64)] {
            // SAFETY: dev + off .. + len lies in the allocation, alive until freed below.
            let got = unsafe { p.copy_out_small(0, dev + off, len) }.unwrap();
            assert_eq!(got, pattern[off..off + len], "{len} bytes at +{off}");
            assert_eq!(p.lent(), 0, "the buffer went back");
        }
        assert_eq!(p.allocated(), 1, "one buffer served every copy");
        // SAFETY: no copy of it is in flight.
        unsafe { backend.free(dev).unwrap() };
    }

    #[test]
    fn past_the_cap_only_a_transfer_holding_none_gets_a_buffer_even_a_free_one() {
        let mut p = pool(2);
        let a = p.take(0).unwrap().expect("under the cap");
        let b = p.take(1).unwrap().expect("under the cap");
        assert_eq!(p.take(2).unwrap(), None, "at the cap a transfer that holds some waits");
        let c = p.take(0).unwrap().expect("a transfer that holds none always gets one");
        assert_eq!(p.allocated(), 3);
        p.give(a);
        assert_eq!(p.take(1).unwrap(), None, "still at the cap: the free buffer waits for a transfer holding none");
        assert_eq!(p.take(0).unwrap(), Some(a), "which takes the free buffer, not a new one");
        assert_eq!(p.allocated(), 3, "the pool did not grow");
        for x in [a, b, c] {
            p.give(x);
        }
        assert_eq!(p.lent(), 0);
        let d = p.take(1).unwrap().expect("under the cap again");
        p.give(d);
    }
}
