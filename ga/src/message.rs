//! Short messages (CoGA's `coGA_sendMsg`/`coGA_recvMsg`): a low-latency path for small
//! payloads between two ranks, with no array in between: the context's own two-sided
//! messages (eager through shared memory on-node), on a tag of the layer's own.
//!
//! Any length works, but the path is meant for small payloads (up to a few KiB); larger
//! data belongs in an array, whose puts go by one-sided copies.

use gpulmt::context::TAG_UB;
use gpulmt::{Context, Rank, Tag};

use crate::error::{GaError, Result};

/// The tag of short messages: the highest user tag (applications using the layer leave
/// it alone, and [`crate::array::CREATE_TAG`]).
pub const MSG_TAG: Tag = TAG_UB - 1;

/// Sends `data` to `dst`; returns once the message has left `data`.
pub fn send_msg(ctx: &mut Context, dst: Rank, data: &[u8]) -> Result<()> {
    if dst >= ctx.size() {
        return Err(GaError::InvalidArgument(format!(
            "send_msg: rank {dst} is not in this job of {} ranks",
            ctx.size()
        )));
    }
    ctx.send(data, dst, MSG_TAG)?;
    Ok(())
}

/// Receives the next short message from `src` (None: from any rank) into `buf`;
/// returns its sender and length. A message longer than `buf` fails (truncation).
pub fn recv_msg(ctx: &mut Context, src: Option<Rank>, buf: &mut [u8]) -> Result<(Rank, usize)> {
    if let Some(s) = src.filter(|&s| s >= ctx.size()) {
        return Err(GaError::InvalidArgument(format!("recv_msg: rank {s} is not in this job of {} ranks", ctx.size())));
    }
    let st = ctx.recv(buf, src, Some(MSG_TAG))?;
    Ok((st.source, st.len as usize))
}
