//! What the proxies of two ranks say to each other over the network: the tags, the
//! control-message envelope, and the one-sided requests and replies (active messages).
//!
//! # Tags (on the proxy's own communicator, a dup of the job's)
//! | tag | carries | received by |
//! |-----|---------|-------------|
//! | [`CTRL_TAG`] | an envelope ([`CTRL_HEADER`] bytes: sequence number) + an encoded control packet | a pool of receives from any rank |
//! | [`AM_TAG`] | a one-sided request ([`AmRequest`]), with its data inline if small | a pool of receives from any rank |
//! | [`REPLY_TAG`] | a one-sided reply ([`AmReply`]): ack, or GET data inline | a pool of receives from any rank |
//! | [`DATA_BASE`].. | the pieces of one transfer (rendezvous or one-sided data) | receives posted per transfer |
//!
//! Data tags split in two halves: rendezvous transfers take the lower half, tag derived
//! from the sender's message id (`xfer`), one-sided data the upper half, from a counter of
//! the rank that chooses it. A tag names one transfer among those in flight between two
//! ranks; both halves wrap after 2^30 transfers (with `MPI_TAG_UB` = 2^31 - 1, as in Open
//! MPI and MPICH), far more than can be in flight.
//!
//! # Why the control envelope has a sequence number
//! Control packets from one rank must reach the engine in the order posted. MPI matches
//! them to the pool's receives in order, but a receive matched earlier may *complete*
//! later than one matched after it (a larger message still landing), so the receiving
//! proxy reorders each source's packets by the sender's per-destination sequence number.
//!
//! All integers are little-endian.

use gpulmt_protocols::gio::{AmoOp, SignalOp};

/// Tag of control packets (eager, RTS, CTS, ABORT) between proxies.
pub const CTRL_TAG: i32 = 1;
/// Tag of one-sided requests to a target's proxy.
pub const AM_TAG: i32 = 2;
/// Tag of the target's replies to one-sided requests.
pub const REPLY_TAG: i32 = 3;
/// First data tag.
pub const DATA_BASE: i32 = 16;

/// Bytes of the control envelope before the packet: the sender's sequence number of
/// control messages to this destination.
pub const CTRL_HEADER: usize = 8;
/// Largest encoded control packet: an eager payload of up to 16 KiB less the engine's
/// header. The control slab and the receive pool are sized by it.
pub const CTRL_MAX: usize = 16 << 10;
/// One-sided data up to this size travels inside the request (PUT) or reply (GET)
/// instead of a data message of its own.
pub const AM_INLINE: usize = 4 << 10;
/// Bytes of a pool receive buffer: the largest message on the pool tags.
pub const POOL_BUFFER: usize = CTRL_HEADER + CTRL_MAX;

const _: () = assert!(AM_REQUEST_HEADER + AM_INLINE <= POOL_BUFFER && AM_REPLY_HEADER + AM_INLINE <= POOL_BUFFER);

/// The data tags: rendezvous in `[DATA_BASE, DATA_BASE + span)`, one-sided data in the
/// span above.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataTags {
    span: i64,
}

impl DataTags {
    /// The data tags under `MPI_TAG_UB = max_tag` (at least 32767 by the MPI standard).
    pub fn new(max_tag: i32) -> Self {
        DataTags { span: ((max_tag as i64 - DATA_BASE as i64 + 1) / 2).max(1) }
    }

    /// The tag of rendezvous transfer `xfer` (the sender's message id).
    pub fn rendezvous(&self, xfer: u64) -> i32 {
        (DATA_BASE as i64 + (xfer % self.span as u64) as i64) as i32
    }

    /// The tag of one-sided data transfer number `n` of the rank choosing it.
    pub fn one_sided(&self, n: u64) -> i32 {
        (DATA_BASE as i64 + self.span + (n % self.span as u64) as i64) as i32
    }
}

/// A control message for `packet`: room for the envelope, then the packet, in one
/// allocation, so the proxy copies a control packet once on its way to MPI; its sequence
/// number is written in when it is sent ([`ctrl_seal`]), since a packet that MPI refuses
/// for now must not use one up.
pub fn ctrl_message(packet: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CTRL_HEADER + packet.len());
    out.extend_from_slice(&[0; CTRL_HEADER]);
    out.extend_from_slice(packet);
    out
}

/// Writes sequence number `seq` into the envelope of `msg` (made by [`ctrl_message`]).
pub fn ctrl_seal(msg: &mut [u8], seq: u64) {
    msg[..CTRL_HEADER].copy_from_slice(&seq.to_le_bytes());
}

/// Splits a control message into its sequence number and packet.
pub fn ctrl_open(msg: &[u8]) -> Option<(u64, &[u8])> {
    let (seq, packet) = msg.split_at_checked(CTRL_HEADER)?;
    Some((u64::from_le_bytes(seq.try_into().ok()?), packet))
}

/// What a one-sided request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AmKind {
    /// Write `size` bytes at `offset`: inline, or in a data transfer under `data_tag`.
    Put,
    /// PUT, then update the signal word.
    PutSignal { signal_offset: u64, signal_value: u64, signal_op: SignalOp },
    /// Read `size` bytes at `offset`: inline in the reply, or in a data transfer under
    /// `data_tag` after it.
    Get,
    /// A 64-bit atomic on the aligned word at `offset` (`size` 8): the reply carries the
    /// word's old value inline (8 bytes) when the status is 0.
    Amo { amo: AmoOp, operand: u64, compare: u64 },
}

/// A one-sided request, as the target's proxy receives it on [`AM_TAG`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmRequest {
    pub kind: AmKind,
    /// The initiator's name for the op, echoed in the reply.
    pub op: u64,
    /// Which of the target's windows.
    pub window: u32,
    pub offset: u64,
    pub size: u64,
    /// Tag of the data transfer (unused when the data is inline).
    pub data_tag: i32,
    /// The PUT's data travels inside this request.
    pub inline: bool,
}

/// Bytes of an encoded [`AmRequest`] before its inline data.
pub const AM_REQUEST_HEADER: usize = 64;

const KIND_PUT: u8 = 1;
const KIND_PUT_SIGNAL: u8 = 2;
const KIND_GET: u8 = 3;
const KIND_AMO: u8 = 4;

impl AmRequest {
    /// Encodes the request followed by `inline` data into `out`.
    pub fn encode(&self, inline: &[u8], out: &mut Vec<u8>) {
        let (kind, sig_op, sig_off, sig_val) = match self.kind {
            AmKind::Put => (KIND_PUT, 0, 0, 0),
            AmKind::PutSignal { signal_offset, signal_value, signal_op } => {
                (KIND_PUT_SIGNAL, signal_op as u8, signal_offset, signal_value)
            }
            AmKind::Get => (KIND_GET, 0, 0, 0),
            AmKind::Amo { amo, operand, compare } => (KIND_AMO, amo as u8, compare, operand),
        };
        out.clear();
        out.extend_from_slice(&[kind, sig_op, self.inline as u8, 0]);
        out.extend_from_slice(&self.window.to_le_bytes());
        for w in [self.op, self.offset, self.size, sig_off, sig_val] {
            out.extend_from_slice(&w.to_le_bytes());
        }
        out.extend_from_slice(&(self.data_tag as u32).to_le_bytes());
        out.resize(AM_REQUEST_HEADER, 0);
        out.extend_from_slice(inline);
    }

    /// Decodes a request and its inline data; `None` if malformed (a peer of another
    /// gpulmt, or corruption): the proxy logs and drops it.
    pub fn decode(msg: &[u8]) -> Option<(AmRequest, &[u8])> {
        let (h, inline) = msg.split_at_checked(AM_REQUEST_HEADER)?;
        let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().expect("8 bytes"));
        let window = u32::from_le_bytes(h[4..8].try_into().ok()?);
        let (op, offset, size, sig_off, sig_val) = (u64_at(8), u64_at(16), u64_at(24), u64_at(32), u64_at(40));
        let data_tag = u32::from_le_bytes(h[48..52].try_into().ok()?) as i32;
        let kind = match h[0] {
            KIND_PUT => AmKind::Put,
            KIND_PUT_SIGNAL => AmKind::PutSignal {
                signal_offset: sig_off,
                signal_value: sig_val,
                signal_op: match h[1] {
                    0 => SignalOp::Set,
                    1 => SignalOp::Add,
                    _ => return None,
                },
            },
            KIND_GET => AmKind::Get,
            KIND_AMO => AmKind::Amo {
                amo: match h[1] {
                    0 => AmoOp::FetchAdd,
                    1 => AmoOp::CompareSwap,
                    2 => AmoOp::Set,
                    3 => AmoOp::Fetch,
                    _ => return None,
                },
                operand: sig_val,
                compare: sig_off,
            },
            _ => return None,
        };
        let inline_flag = h[2] != 0;
        if inline_flag && matches!(kind, AmKind::Put | AmKind::PutSignal { .. }) && inline.len() as u64 != size {
            return None;
        }
        Some((AmRequest { kind, op, window, offset, size, data_tag, inline: inline_flag }, inline))
    }
}

/// The target's answer to a one-sided request, on [`REPLY_TAG`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmReply {
    /// The initiator's op ([`AmRequest::op`]).
    pub op: u64,
    /// 0: done (PUT: written and visible; GET: data follows or is inline); otherwise
    /// the code of the [`gpulmt_protocols::gio::BadPacket`] the target found.
    pub status: u32,
}

/// Bytes of an encoded [`AmReply`] before its inline data.
pub const AM_REPLY_HEADER: usize = 16;

impl AmReply {
    /// Encodes the reply followed by `inline` data (a GET's) into `out`.
    pub fn encode(&self, inline: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.op.to_le_bytes());
        out.extend_from_slice(&self.status.to_le_bytes());
        out.resize(AM_REPLY_HEADER, 0);
        out.extend_from_slice(inline);
    }

    /// Decodes a reply and its inline data.
    pub fn decode(msg: &[u8]) -> Option<(AmReply, &[u8])> {
        let (h, inline) = msg.split_at_checked(AM_REPLY_HEADER)?;
        let op = u64::from_le_bytes(h[0..8].try_into().ok()?);
        let status = u32::from_le_bytes(h[8..12].try_into().ok()?);
        Some((AmReply { op, status }, inline))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let mut buf = Vec::new();
        let reqs = [
            AmRequest { kind: AmKind::Put, op: 7, window: 3, offset: 1 << 40, size: 5, data_tag: 99, inline: true },
            AmRequest {
                kind: AmKind::PutSignal { signal_offset: 64, signal_value: u64::MAX, signal_op: SignalOp::Add },
                op: u64::MAX,
                window: u32::MAX,
                offset: 0,
                size: 1 << 20,
                data_tag: i32::MAX,
                inline: false,
            },
            AmRequest { kind: AmKind::Get, op: 1, window: 0, offset: 8, size: 8, data_tag: 17, inline: true },
            AmRequest {
                kind: AmKind::Amo { amo: AmoOp::CompareSwap, operand: u64::MAX - 1, compare: 3 },
                op: 5,
                window: 2,
                offset: 64,
                size: 8,
                data_tag: 0,
                inline: false,
            },
        ];
        for r in reqs {
            let inline: &[u8] = if r.inline && r.kind == AmKind::Put { b"hello" } else { b"" };
            r.encode(inline, &mut buf);
            assert_eq!(AmRequest::decode(&buf), Some((r, inline)));
        }
        // An inline PUT whose data is not its size is malformed.
        reqs[0].encode(b"hell", &mut buf);
        assert_eq!(AmRequest::decode(&buf), None);
        assert_eq!(AmRequest::decode(&buf[..AM_REQUEST_HEADER - 1]), None);
        let rep = AmReply { op: 42, status: 7 };
        rep.encode(b"data", &mut buf);
        assert_eq!(AmReply::decode(&buf), Some((rep, &b"data"[..])));
    }

    #[test]
    fn data_tags_stay_in_their_halves() {
        for max in [32767, i32::MAX] {
            let t = DataTags::new(max);
            for n in [0, 1, 12345, u64::MAX, u64::MAX / 3] {
                let (r, o) = (t.rendezvous(n), t.one_sided(n));
                assert!((DATA_BASE..DATA_BASE + t.span as i32).contains(&r), "{r}");
                assert!(o >= DATA_BASE + t.span as i32 && o <= max, "{o} > {max}");
            }
        }
        let mut env = ctrl_message(b"pkt");
        ctrl_seal(&mut env, 9);
        assert_eq!(ctrl_open(&env), Some((9, &b"pkt"[..])));
        assert_eq!(ctrl_open(&env[..7]), None);
    }
}
