//! The LMT plugin face of a context, for an MPI implementation that owns matching
//! and wants gpulmt to move the payload of large messages (the Nemesis LMT hooks of
//! MPICH): the sender's RTS cookie is handed to the host to piggyback on its own RTS.
//! The rest of gpulmt's control path goes one of two ways:
//! - [`Context::init_plugin`]: the host's channel. The receiver's CTS cookie is handed
//!   back for the host's CTS, every other packet travels through the host's `send`
//!   callback and comes back through [`Context::deliver`].
//! - [`Context::init_plugin_rings`]: gpulmt's own shared-memory rings, as between
//!   ranks of a gpulmt job, drained by [`Context::progress`]. Only the RTS crosses the
//!   host: its matching orders gpulmt's messages among the host's others, and every
//!   later packet of a transfer answers one the peer sent, so no order between the
//!   two channels is needed.

use gpulmt_protocols::engine::BufDesc;
use gpulmt_protocols::wire::Packet;
use gpulmt_protocols::{ProtoError, Rank, ReqId};

use crate::config::Config;
use crate::context::{Context, JobInfo, Request};
use crate::device::MemoryKind;
use crate::error::{Error, Result};

/// The host's control channel: sends `bytes` to local rank `to`, in order per rank.
pub type HostChannel = Box<dyn FnMut(Rank, &[u8]) + Send>;

/// The plugin's message tag: the host matched the message already.
const PLUGIN_TAG: i32 = 0;

impl Context {
    /// Joins a job as an LMT plugin: `send` carries gpulmt's control blobs to other
    /// local ranks; the host hands incoming ones to [`deliver`](Self::deliver).
    pub fn init_plugin(cfg: Config, info: JobInfo, send: HostChannel) -> Result<Context> {
        Self::init_inner(cfg, info, None, None, Some(send))
    }

    /// Joins a job as an LMT plugin whose control packets, all but the RTS cookie,
    /// travel through gpulmt's own rings: the host carries the RTS and calls
    /// [`progress`](Self::progress) while transfers run (and while
    /// [`control_pending`](Self::control_pending)), instead of carrying blobs.
    pub fn init_plugin_rings(cfg: Config, info: JobInfo) -> Result<Context> {
        Self::init_inner(cfg, info, None, None, None)
    }

    /// Packets wait in this rank's outbox for room in a peer's ring (or in the internode
    /// path): progress must run for the peer to see them, even with no request of this
    /// rank in flight.
    pub fn control_pending(&self) -> bool {
        self.outbox_len > 0 || !self.loopback.is_empty() || self.offnode.queued() > 0
    }

    /// Hands gpulmt a control blob the host received from local rank `from`.
    pub fn deliver(&mut self, from: Rank, blob: &[u8]) -> Result<()> {
        if from >= self.size() {
            return Err(ProtoError::BadRank { rank: from, size: self.size() }.into());
        }
        let p =
            Packet::decode(blob).map_err(|e| Error::InvalidArgument(format!("control blob from rank {from}: {e}")))?;
        self.on_control(from, p);
        self.progress()?;
        Ok(())
    }

    /// Runs `f` with the RTS/CTS it emits captured as a cookie.
    fn capturing<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<(T, Option<Vec<u8>>)> {
        self.capture = Some(None);
        let r = f(self);
        let cookie = self.capture.take().flatten();
        r.map(|v| (v, cookie))
    }

    /// Sender: starts a large-message transfer of `len` bytes at `buf` to `dst`;
    /// returns the request and the RTS cookie for the host's RTS.
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid and unmodified until the request completes.
    pub unsafe fn lmt_initiate(&mut self, buf: *const u8, len: usize, dst: Rank) -> Result<(Request, Vec<u8>)> {
        if dst >= self.size() {
            return Err(ProtoError::BadRank { rank: dst, size: self.size() }.into());
        }
        if len == 0 {
            return Err(Error::InvalidArgument("an LMT transfer needs at least one byte".into()));
        }
        let ptr = buf as usize;
        let (req, cookie) = self.capturing(|ctx| {
            let (kind, desc) = ctx.describe_for_lmt(ptr, len)?;
            let req = ctx.new_request(ptr, len, kind, tracing::debug_span!("lmt_send", to = dst, len));
            ctx.engine.post_send(req, dst, PLUGIN_TAG, desc, None);
            ctx.run_actions();
            Ok(req)
        })?;
        match cookie {
            Some(c) => Ok((Request(req.0), c)),
            None => Err(self.failed_request(req, "no RTS was produced")),
        }
    }

    /// Receiver: starts receiving the message whose RTS cookie the host matched to
    /// this receive, into `buf`. Returns the request and, for PUT, COOPERATE and SHM,
    /// the CTS cookie for the host's CTS (GET needs none; with the rings, the CTS goes
    /// on them and none is returned).
    ///
    /// # Safety
    /// `buf..buf+len` must stay valid and unused until the request completes.
    pub unsafe fn lmt_start_recv(
        &mut self,
        from: Rank,
        rts_cookie: &[u8],
        buf: *mut u8,
        len: usize,
    ) -> Result<(Request, Option<Vec<u8>>)> {
        if from >= self.size() {
            return Err(ProtoError::BadRank { rank: from, size: self.size() }.into());
        }
        let rts = Packet::decode(rts_cookie).map_err(|e| Error::InvalidArgument(format!("RTS cookie: {e}")))?;
        let ptr = buf as usize;
        let (req, cts) = self.capturing(|ctx| {
            let (kind, desc) = ctx.describe_for_lmt(ptr, len)?;
            let req = ctx.new_request(ptr, len, kind, tracing::debug_span!("lmt_recv", from, len));
            ctx.engine.post_matched_recv(req, from, rts, desc);
            ctx.run_actions();
            Ok(req)
        })?;
        Ok((Request(req.0), cts))
    }

    /// The host learned that local rank `rank` terminated: its transfers fail (once
    /// copies on its memory stop) and its mappings are released.
    pub fn peer_terminated(&mut self, rank: Rank) -> Result<()> {
        if rank >= self.size() || rank == self.rank() {
            return Err(Error::InvalidArgument(format!("peer_terminated({rank}): not another rank of this job")));
        }
        self.peer_failed(rank);
        Ok(())
    }

    /// Sender: the host delivered the receiver's CTS cookie.
    pub fn lmt_handle_cts(&mut self, from: Rank, cts_cookie: &[u8]) -> Result<()> {
        self.deliver(from, cts_cookie)
    }

    /// A buffer of an LMT transfer: device buffers are always exported.
    fn describe_for_lmt(&mut self, ptr: usize, len: usize) -> Result<(MemoryKind, BufDesc)> {
        let info = self.classify(ptr, len)?;
        Ok((info.kind, self.describe(info, ptr, len, true)?))
    }

    fn failed_request(&mut self, req: ReqId, what: &str) -> Error {
        match self.reqs.remove(req.0).and_then(|st| st.result) {
            Some(Err(e)) => e.into(),
            _ => Error::InvalidArgument(format!("LMT initiate: {what}")),
        }
    }
}
