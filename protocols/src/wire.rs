//! Control packets exchanged between the ranks of a job, and their binary encoding.
//!
//! Packets travel through shared-memory rings written by another process (ranks of one
//! node) or as MPI messages from another node's proxy, so a decoder must treat every
//! byte as untrusted: [`Packet::decode`] rejects wrong
//! versions, unknown kinds, short or over-long packets, and regions whose offset
//! and length do not fit inside the allocation they claim. The engine checks the
//! semantic rules (that a region covers the message, that a CTS answers an RTS).

use crate::{MsgId, Tag};

/// Version of the wire format; a peer speaking another version is rejected.
/// 4: RTS source `Net` and CTS mode `Net`, the rendezvous with a rank on another node.
/// 5: the learn form of a region (see [`RegionMemo`]): a plain full region no longer
/// enters a memo; every packet of a channel with memos ends in its seal.
/// 6: RTS source `Staged` (device memory no peer maps); handles of 96 bytes.
pub const WIRE_VERSION: u8 = 6;
/// Bytes of an IPC handle carried in a region: the backend's, opaque here (CUDA's 64-byte
/// `CUipcMemHandle` or `CUmemPoolPtrExportData`, then which kind it is and where its
/// exporter hands out the file descriptors of shareable memory).
pub const HANDLE_BYTES: usize = 96;

/// An exported window of device memory: the cookie of the RTS and CTS.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The IPC handle of the whole allocation.
    pub handle: [u8; HANDLE_BYTES],
    /// Size of the whole allocation, as the exporter's driver reports it.
    pub alloc_size: u64,
    /// Offset of the user buffer inside the allocation.
    pub offset: u64,
    /// Device ordinal of the allocation (node-local numbering).
    pub device: u32,
    /// Node the allocation lives on.
    pub node: u64,
    /// The exporter's buffer id: unique per allocation for the exporter's lifetime,
    /// so a recycled address is never mistaken for the old buffer.
    pub buffer_id: u64,
}

impl Region {
    /// Whether `[offset, offset + len)` lies inside the allocation.
    pub fn covers(&self, len: u64) -> bool {
        self.offset.checked_add(len).is_some_and(|end| end <= self.alloc_size)
    }
}

/// One end's memory of the last [`MEMO_SLOTS`] allocations whose regions crossed one
/// ordered channel (one direction of one pair's ring) in full. A region of a remembered
/// allocation then crosses as its buffer id and offset, 17 bytes instead of 133: an RTR or
/// RTS fits one cache line. Every region on a channel is a buffer of its sending rank;
/// several slots because that rank's send buffers (its RTSs) and receive buffers (its
/// CTSs and RTRs) cross in turn. Both ends update their memo packet by packet in channel
/// order (a learnt region takes its buffer id's slot, else the oldest), so they agree; the
/// buffer id in the short form guards the rest (a memo that disagrees makes the packet
/// undecodable, never maps another allocation). Channels that do not keep order, or whose
/// ends keep no memo, encode and decode with `None`: always in full.
///
/// Every packet of such a channel also ends in a seal of [`SEAL_BYTES`]: 64 bits mixed
/// from the channel's key and the count of packets sealed so far. The receiving end
/// takes a packet only if it carries exactly the next seal ([`RegionMemo::open`]), so
/// bytes written into the channel by anyone but the sender's encoder (a forged packet,
/// a replayed one) are refused before anything reads them: they count as
/// no message (the count that RTR offers name), match no receive and answer no
/// transfer, and the sender's next packet still opens.
///
/// Only the sending end's memo decides what is learnt. It sends a region to remember in
/// the learn form, which carries the tag of its next learning: 64 bits mixed from the
/// channel's key and the count of regions learnt so far (both ends are made with the same
/// key, [`RegionMemo::keyed`]). The receiving end learns a region only from a whole,
/// well-formed packet whose learn form carries exactly its own next tag. So bytes that
/// did not come from the sender's encoder (a forged packet in the ring, a plain full
/// region, a corrupted one) never enter the memo: they cannot push the sender's
/// allocations out, nor replace one under its buffer id, and the sender's later short
/// regions still decode. Only a forger that knows the key and the count, and so can
/// forge any packet of the sender's, could make the memos disagree.
#[derive(Clone, Debug, Default)]
pub struct RegionMemo {
    slots: [Option<Region>; MEMO_SLOTS],
    /// The slot the next learnt region takes.
    next: usize,
    /// The channel's key: with `learnt`, what the tag of the next learn form is.
    key: u64,
    /// Regions learnt so far.
    learnt: u64,
    /// Packets sealed (sending end) or opened (receiving end) so far.
    sealed: u64,
}

/// Bytes the seal adds to every packet of a channel whose ends keep memos.
pub const SEAL_BYTES: usize = 8;

/// Mixed into the key for seals, so that no seal equals a learn form's tag.
const SEAL_DOMAIN: u64 = 0x5ea1_5ea1_5ea1_5ea1;

/// The `n`th tag of the sequence of `key`: splitmix64's finalizer, a bijection, so
/// every tag of a sequence differs, and consecutive tags share no pattern a corrupted
/// byte could hit.
fn keyed_tag(key: u64, n: u64) -> u64 {
    let mut z = key.wrapping_add(n.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Allocations a [`RegionMemo`] remembers.
pub const MEMO_SLOTS: usize = 4;

impl RegionMemo {
    /// An empty memo for one end of the channel with key `key`; the other end's memo
    /// must have the same key (say, a number both ranks read from their job, mixed with
    /// the channel's two ends).
    pub fn keyed(key: u64) -> RegionMemo {
        RegionMemo { key, ..RegionMemo::default() }
    }

    /// The tag that the learn form of the channel's next learnt region carries.
    fn next_tag(&self) -> u64 {
        keyed_tag(self.key, self.learnt + 1)
    }

    /// The seal of the channel's next packet.
    fn next_seal(&self) -> [u8; SEAL_BYTES] {
        keyed_tag(self.key ^ SEAL_DOMAIN, self.sealed + 1).to_le_bytes()
    }

    /// Seals the channel's next packet (sending end): writes its seal into the first
    /// [`SEAL_BYTES`] of `out`, which follow the packet. For packets written without
    /// [`Packet::encode_with`] (an eager payload copied straight into a ring slot).
    pub fn seal(&mut self, out: &mut [u8]) {
        out[..SEAL_BYTES].copy_from_slice(&self.next_seal());
        self.sealed += 1;
    }

    /// Opens the channel's next packet (receiving end): the packet in `bytes` without its
    /// seal, if the seal is the next one (it then counts as opened). Else
    /// [`DecodeError::Seal`], and the memo is unchanged: the bytes are not the sender's.
    pub fn open<'a>(&mut self, bytes: &'a [u8]) -> Result<&'a [u8], DecodeError> {
        let body = bytes.len().checked_sub(SEAL_BYTES).ok_or(DecodeError::Seal)?;
        if bytes[body..] != self.next_seal() {
            return Err(DecodeError::Seal);
        }
        self.sealed += 1;
        Ok(&bytes[..body])
    }

    /// Whether `r` lies in a remembered allocation.
    fn knows(&self, r: &Region) -> bool {
        // Field by field, the buffer id first: no copies of the handle on the send path.
        self.slots.iter().flatten().any(|m| {
            m.buffer_id == r.buffer_id
                && m.alloc_size == r.alloc_size
                && m.device == r.device
                && m.node == r.node
                && m.handle == r.handle
        })
    }

    /// The remembered allocation with this buffer id.
    fn find(&self, buffer_id: u64) -> Option<Region> {
        self.slots.iter().flatten().find(|m| m.buffer_id == buffer_id).copied()
    }

    /// Remembers a region that crossed in learn form: in place of one with its buffer id
    /// (ids never repeat for a correct peer, but the two ends must never hold two entries
    /// for one id), else of the oldest.
    fn learn(&mut self, r: Region) {
        self.learnt += 1;
        if let Some(same) = self.slots.iter_mut().flatten().find(|m| m.buffer_id == r.buffer_id) {
            *same = r;
            return;
        }
        self.slots[self.next] = Some(r);
        self.next = (self.next + 1) % MEMO_SLOTS;
    }
}

/// The form byte that leads an encoded region.
const REGION_FULL: u8 = 1;
const REGION_SHORT: u8 = 2;
/// A full region for the receiving end's memo, followed by its tag (see [`RegionMemo`]).
const REGION_LEARN: u8 = 4;
/// Bytes the learn form adds to the full form: the tag.
const LEARN_TAG_BYTES: usize = 8;
/// The form bytes of an RTS's source that carry no region.
const SRC_HOST: u8 = 0;
const SRC_NET: u8 = 3;
const SRC_NET_PUSHED: u8 = 5;
const SRC_STAGED: u8 = 6;

/// Where a message's buffer lives, as told to the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemDesc {
    /// Host memory: peers cannot map it; only SHM staging can move it.
    Host,
    /// Device memory, exported so a peer can map it.
    Device(Region),
    /// Device memory that no peer can map (managed memory, a pool or VMM allocation
    /// without a shareable handle type, an export that failed): as for host memory, only
    /// SHM staging moves it, each side's copy engine copying between its buffer and the
    /// staging chunks.
    Staged,
    /// A buffer of a rank on another node, host or device memory alike: nothing of it
    /// can be mapped by the receiver (no IPC region crosses nodes), and only the
    /// network rendezvous ([`crate::Protocol::Net`]) moves it. Every RTS between ranks
    /// of different nodes says this, and only those RTSs do.
    ///
    /// `pushed`: the sender's data left with the RTS, without waiting for a CTS (the
    /// network holds it until the receiver's receive matches), so the receiver sends no
    /// CTS, and drains the data it does not want (`engine::net`).
    Net { pushed: bool },
}

/// Why a receiver refused a rendezvous, or a side gave up on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AbortReason {
    /// The receive buffer was too small; the sender completes successfully (MPI).
    Truncated = 1,
    /// The RTS was malformed or pointed outside its allocation.
    BadRequest = 2,
    /// A copy failed on the side that sends this.
    CopyFailed = 3,
    /// The receive was cancelled or the request torn down.
    Cancelled = 4,
    /// The transfer cannot be done on this node (e.g. the peer is on another node).
    Unsupported = 5,
}

impl AbortReason {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => Self::Truncated,
            2 => Self::BadRequest,
            3 => Self::CopyFailed,
            4 => Self::Cancelled,
            5 => Self::Unsupported,
            _ => return None,
        })
    }
}

/// Which way a packet that both sides send flows; it says whose request the
/// message id names (message ids are assigned by senders, so a receiver's and a
/// sender's ids may collide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Dir {
    /// From the message's receiver to its sender.
    ToSender = 1,
    /// From the message's sender to its receiver.
    ToReceiver = 2,
}

/// Which rendezvous protocol the receiver picked (carried by the CTS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CtsMode {
    Put = 1,
    Coop = 2,
    Shm = 3,
    /// The receiver (on another node) posted the receive of the data: the sender's
    /// transport sends it through the network. Carries no region.
    Net = 4,
}

/// A control packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Packet {
    /// A small message with its payload inline.
    Eager { msg: MsgId, tag: Tag, payload: Vec<u8> },
    /// Request to send: announces a large message and its buffer.
    Rts { msg: MsgId, tag: Tag, len: u64, src: MemDesc },
    /// Clear to send: the receiver's choice of PUT, COOPERATE, SHM or NET. PUT and
    /// COOPERATE carry the receiver's region; COOPERATE carries where the sender's
    /// part ends (`split`): the sender moves `[0, split)`, the receiver the rest.
    Cts { msg: MsgId, mode: CtsMode, dst: Option<Region>, split: u64 },
    /// COOPERATE: the receiver finished its part.
    Cookie { msg: MsgId },
    /// The side that drove the last copy finished: the transfer is complete.
    Done { msg: MsgId, dir: Dir },
    /// SHM: chunk `index` (`len` bytes) of the message is in staging slot `slot` of
    /// the directed pair's ring.
    Chunk { msg: MsgId, index: u32, len: u32, slot: u32 },
    /// SHM: the receiver copied chunk `index` out; its slot is free again.
    ChunkAck { msg: MsgId, index: u32 },
    /// The transfer is refused or abandoned.
    Abort { msg: MsgId, reason: AbortReason, dir: Dir },
    /// Ready to receive (receiver to sender): receive `recv` of the receiver, for tag
    /// `tag` into `dst` (`len` bytes), takes the sender's message number `expect` to it
    /// (counting every message the sender sent it, from 0) if that message has this tag.
    Rtr { recv: u64, expect: u64, tag: Tag, len: u64, dst: Region },
    /// The sender's message `msg` (its next to this receiver) is being pushed into the
    /// buffer of receive `recv`, which an RTR offered; DONE follows when it has landed.
    RtrPut { msg: MsgId, tag: Tag, len: u64, recv: u64 },
    /// The receiver wants to cancel receive `recv`, which it offered by RTR.
    RtrRevoke { recv: u64 },
    /// The sender will not use the RTR of receive `recv` (any RTR_PUT into it was sent
    /// before this).
    RtrRevoked { recv: u64 },
    /// Two-phase free: the sender's buffers marked for release in this epoch.
    FreeMarks { epoch: u64, buffer_ids: Vec<u64> },
    /// Two-phase free: the sender closed its mappings of every marked buffer.
    FreeAck { epoch: u64 },
}

/// Why bytes could not be decoded into a packet.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("packet is {got} bytes, shorter than its {kind} layout needs")]
    Short { kind: &'static str, got: usize },
    #[error("wire version {0} is not {WIRE_VERSION}: every rank of a job must run the same gpulmt version")]
    Version(u8),
    #[error("unknown packet kind {0}")]
    Kind(u8),
    #[error("invalid field {field}: {value}")]
    Field { field: &'static str, value: u64 },
    #[error("{0} trailing bytes after the packet")]
    Trailing(usize),
    #[error(
        "the packet does not end in its channel's next seal: not written by the peer's encoder (forged or replayed)"
    )]
    Seal,
}

const K_EAGER: u8 = 1;
const K_RTS: u8 = 2;
const K_CTS: u8 = 3;
const K_COOKIE: u8 = 4;
const K_DONE: u8 = 5;
const K_CHUNK: u8 = 6;
const K_CHUNK_ACK: u8 = 7;
const K_ABORT: u8 = 8;
const K_FREE_MARKS: u8 = 9;
const K_FREE_ACK: u8 = 10;
const K_RTR: u8 = 11;
const K_RTR_PUT: u8 = 12;
const K_RTR_REVOKE: u8 = 13;
const K_RTR_REVOKED: u8 = 14;

/// Fixed part of every packet: version and kind.
const HEADER: usize = 2;
/// Encoded size of a region.
pub const REGION_BYTES: usize = HANDLE_BYTES + 8 + 8 + 4 + 8 + 8;

impl Packet {
    /// The message a packet belongs to, for the LMT packets.
    pub fn msg(&self) -> Option<MsgId> {
        match *self {
            Packet::Eager { msg, .. }
            | Packet::Rts { msg, .. }
            | Packet::Cts { msg, .. }
            | Packet::Cookie { msg }
            | Packet::Done { msg, .. }
            | Packet::Chunk { msg, .. }
            | Packet::ChunkAck { msg, .. }
            | Packet::Abort { msg, .. }
            | Packet::RtrPut { msg, .. } => Some(msg),
            Packet::FreeMarks { .. }
            | Packet::FreeAck { .. }
            | Packet::Rtr { .. }
            | Packet::RtrRevoke { .. }
            | Packet::RtrRevoked { .. } => None,
        }
    }

    /// Bytes [`encode`](Self::encode) writes (with no memo).
    pub fn encoded_len(&self) -> usize {
        // A region with its form byte, in full.
        const REGION: usize = 1 + REGION_BYTES;
        HEADER
            + match self {
                Packet::Eager { payload, .. } => 8 + 4 + payload.len(),
                Packet::Rts { src, .. } => 8 + 4 + 8 + if matches!(src, MemDesc::Device(_)) { REGION } else { 1 },
                Packet::Cts { dst, .. } => 8 + 1 + 8 + if dst.is_some() { REGION } else { 1 },
                Packet::Cookie { .. } => 8,
                Packet::Done { .. } => 8 + 1,
                Packet::Chunk { .. } => 8 + 4 + 4 + 4,
                Packet::ChunkAck { .. } => 8 + 4,
                Packet::Abort { .. } => 8 + 1 + 1,
                Packet::FreeMarks { buffer_ids, .. } => 8 + 4 + 8 * buffer_ids.len(),
                Packet::FreeAck { .. } => 8,
                Packet::Rtr { .. } => 8 + 8 + 4 + 8 + REGION,
                Packet::RtrPut { .. } => 8 + 4 + 8 + 8,
                Packet::RtrRevoke { .. } | Packet::RtrRevoked { .. } => 8,
            }
    }

    /// The most bytes [`encode_with`](Self::encode_with) writes with a memo: the seal,
    /// and a region in learn form carries its tag beyond the full form (in short form it
    /// is shorter).
    pub fn encoded_len_with_memo(&self) -> usize {
        let region = matches!(
            self,
            Packet::Rts { src: MemDesc::Device(_), .. } | Packet::Cts { dst: Some(_), .. } | Packet::Rtr { .. }
        );
        self.encoded_len() + SEAL_BYTES + if region { LEARN_TAG_BYTES } else { 0 }
    }

    /// Encodes into `out`, which must hold [`encoded_len`](Self::encoded_len) bytes;
    /// returns the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> usize {
        self.encode_with(out, None)
    }

    /// Encodes for an ordered channel whose sending end keeps `memo` (see [`RegionMemo`]);
    /// `out` must hold [`encoded_len_with_memo`](Self::encoded_len_with_memo) bytes (with
    /// `None`, [`encoded_len`](Self::encoded_len)); returns the bytes written (fewer where
    /// the memo shortened a region).
    pub fn encode_with(&self, out: &mut [u8], memo: Option<&mut RegionMemo>) -> usize {
        let mut w = Writer { buf: out, pos: 0, memo };
        w.u8(WIRE_VERSION);
        match self {
            Packet::Eager { msg, tag, payload } => {
                w.u8(K_EAGER);
                w.u64(*msg);
                w.i32(*tag);
                w.bytes(payload);
            }
            Packet::Rts { msg, tag, len, src } => {
                w.u8(K_RTS);
                w.u64(*msg);
                w.i32(*tag);
                w.u64(*len);
                match src {
                    MemDesc::Host => w.u8(SRC_HOST),
                    MemDesc::Staged => w.u8(SRC_STAGED),
                    MemDesc::Net { pushed: false } => w.u8(SRC_NET),
                    MemDesc::Net { pushed: true } => w.u8(SRC_NET_PUSHED),
                    MemDesc::Device(r) => w.region(r),
                }
            }
            Packet::Cts { msg, mode, dst, split } => {
                w.u8(K_CTS);
                w.u64(*msg);
                w.u8(*mode as u8);
                w.u64(*split);
                match dst {
                    None => w.u8(0),
                    Some(r) => w.region(r),
                }
            }
            Packet::Cookie { msg } => {
                w.u8(K_COOKIE);
                w.u64(*msg);
            }
            Packet::Done { msg, dir } => {
                w.u8(K_DONE);
                w.u64(*msg);
                w.u8(*dir as u8);
            }
            Packet::Chunk { msg, index, len, slot } => {
                w.u8(K_CHUNK);
                w.u64(*msg);
                w.u32(*index);
                w.u32(*len);
                w.u32(*slot);
            }
            Packet::ChunkAck { msg, index } => {
                w.u8(K_CHUNK_ACK);
                w.u64(*msg);
                w.u32(*index);
            }
            Packet::Abort { msg, reason, dir } => {
                w.u8(K_ABORT);
                w.u64(*msg);
                w.u8(*reason as u8);
                w.u8(*dir as u8);
            }
            Packet::FreeMarks { epoch, buffer_ids } => {
                w.u8(K_FREE_MARKS);
                w.u64(*epoch);
                w.u32(buffer_ids.len() as u32);
                for id in buffer_ids {
                    w.u64(*id);
                }
            }
            Packet::FreeAck { epoch } => {
                w.u8(K_FREE_ACK);
                w.u64(*epoch);
            }
            Packet::Rtr { recv, expect, tag, len, dst } => {
                w.u8(K_RTR);
                w.u64(*recv);
                w.u64(*expect);
                w.i32(*tag);
                w.u64(*len);
                w.region(dst);
            }
            Packet::RtrPut { msg, tag, len, recv } => {
                w.u8(K_RTR_PUT);
                w.u64(*msg);
                w.i32(*tag);
                w.u64(*len);
                w.u64(*recv);
            }
            Packet::RtrRevoke { recv } => {
                w.u8(K_RTR_REVOKE);
                w.u64(*recv);
            }
            Packet::RtrRevoked { recv } => {
                w.u8(K_RTR_REVOKED);
                w.u64(*recv);
            }
        }
        let n = w.pos;
        match w.memo {
            Some(memo) => {
                memo.seal(&mut w.buf[n..]);
                n + SEAL_BYTES
            }
            None => n,
        }
    }

    /// Encodes into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        self.to_vec_with(None)
    }

    /// Encodes into a new vector for an ordered channel whose sending end keeps `memo`.
    pub fn to_vec_with(&self, memo: Option<&mut RegionMemo>) -> Vec<u8> {
        let mut v = vec![0; if memo.is_some() { self.encoded_len_with_memo() } else { self.encoded_len() }];
        let n = self.encode_with(&mut v, memo);
        v.truncate(n);
        v
    }

    /// Decodes untrusted bytes.
    pub fn decode(bytes: &[u8]) -> Result<Packet, DecodeError> {
        Self::decode_with(bytes, None)
    }

    /// Decodes untrusted bytes from an ordered channel whose receiving end keeps `memo`
    /// (see [`RegionMemo`]); every packet of the channel must pass through here (or
    /// through [`RegionMemo::open`] and [`decode_opened`](Self::decode_opened)), in order.
    /// Bytes without the channel's next seal are refused; the memo learns only from a
    /// packet that decodes whole.
    pub fn decode_with(bytes: &[u8], mut memo: Option<&mut RegionMemo>) -> Result<Packet, DecodeError> {
        let body = match memo.as_deref_mut() {
            Some(m) => m.open(bytes)?,
            None => bytes,
        };
        Self::decode_opened(body, memo)
    }

    /// Decodes a packet of a channel with memos that [`RegionMemo::open`] took out of its
    /// seal (the ring's receive path looks at an eager packet before decoding).
    pub fn decode_opened(bytes: &[u8], memo: Option<&mut RegionMemo>) -> Result<Packet, DecodeError> {
        let mut r = Reader { buf: bytes, pos: 0, kind: "header", memo, learn: None };
        let version = r.u8()?;
        if version != WIRE_VERSION {
            return Err(DecodeError::Version(version));
        }
        let kind = r.u8()?;
        let pkt = match kind {
            K_EAGER => {
                r.kind = "eager";
                let msg = r.u64()?;
                let tag = r.i32()?;
                let payload = r.rest().to_vec();
                Packet::Eager { msg, tag, payload }
            }
            K_RTS => {
                r.kind = "rts";
                let msg = r.u64()?;
                let tag = r.i32()?;
                let len = r.u64()?;
                let src = match r.u8()? {
                    SRC_HOST => MemDesc::Host,
                    SRC_STAGED => MemDesc::Staged,
                    SRC_NET => MemDesc::Net { pushed: false },
                    SRC_NET_PUSHED => MemDesc::Net { pushed: true },
                    form => MemDesc::Device(r.region(form)?),
                };
                Packet::Rts { msg, tag, len, src }
            }
            K_CTS => {
                r.kind = "cts";
                let msg = r.u64()?;
                let mode = match r.u8()? {
                    1 => CtsMode::Put,
                    2 => CtsMode::Coop,
                    3 => CtsMode::Shm,
                    4 => CtsMode::Net,
                    v => return Err(DecodeError::Field { field: "cts.mode", value: v as u64 }),
                };
                let split = r.u64()?;
                let dst = match r.u8()? {
                    0 => None,
                    form => Some(r.region(form)?),
                };
                Packet::Cts { msg, mode, dst, split }
            }
            K_COOKIE => {
                r.kind = "cookie";
                Packet::Cookie { msg: r.u64()? }
            }
            K_DONE => {
                r.kind = "done";
                Packet::Done { msg: r.u64()?, dir: r.dir()? }
            }
            K_CHUNK => {
                r.kind = "chunk";
                Packet::Chunk { msg: r.u64()?, index: r.u32()?, len: r.u32()?, slot: r.u32()? }
            }
            K_CHUNK_ACK => {
                r.kind = "chunk_ack";
                Packet::ChunkAck { msg: r.u64()?, index: r.u32()? }
            }
            K_ABORT => {
                r.kind = "abort";
                let msg = r.u64()?;
                let v = r.u8()?;
                let reason =
                    AbortReason::from_u8(v).ok_or(DecodeError::Field { field: "abort.reason", value: v as u64 })?;
                Packet::Abort { msg, reason, dir: r.dir()? }
            }
            K_FREE_MARKS => {
                r.kind = "free_marks";
                let epoch = r.u64()?;
                let n = r.u32()? as usize;
                // The count is untrusted: bound it by the bytes actually present.
                if n > r.remaining() / 8 {
                    return Err(DecodeError::Field { field: "free_marks.count", value: n as u64 });
                }
                let mut buffer_ids = Vec::with_capacity(n);
                for _ in 0..n {
                    buffer_ids.push(r.u64()?);
                }
                Packet::FreeMarks { epoch, buffer_ids }
            }
            K_FREE_ACK => {
                r.kind = "free_ack";
                Packet::FreeAck { epoch: r.u64()? }
            }
            K_RTR => {
                r.kind = "rtr";
                let (recv, expect, tag, len) = (r.u64()?, r.u64()?, r.i32()?, r.u64()?);
                let form = r.u8()?;
                Packet::Rtr { recv, expect, tag, len, dst: r.region(form)? }
            }
            K_RTR_PUT => {
                r.kind = "rtr_put";
                Packet::RtrPut { msg: r.u64()?, tag: r.i32()?, len: r.u64()?, recv: r.u64()? }
            }
            K_RTR_REVOKE => {
                r.kind = "rtr_revoke";
                Packet::RtrRevoke { recv: r.u64()? }
            }
            K_RTR_REVOKED => {
                r.kind = "rtr_revoked";
                Packet::RtrRevoked { recv: r.u64()? }
            }
            k => return Err(DecodeError::Kind(k)),
        };
        if r.remaining() != 0 {
            return Err(DecodeError::Trailing(r.remaining()));
        }
        if let (Some(region), Some(memo)) = (r.learn, r.memo) {
            memo.learn(region);
        }
        Ok(pkt)
    }
}

/// Writes an eager packet's header into `out` (at least [`eager_overhead`] bytes);
/// the payload follows it. Lets the transport copy a payload straight from the
/// user's buffer into a ring slot.
pub fn encode_eager_header(out: &mut [u8], msg: MsgId, tag: Tag) {
    let mut w = Writer { buf: out, pos: 0, memo: None };
    w.u8(WIRE_VERSION);
    w.u8(K_EAGER);
    w.u64(msg);
    w.i32(tag);
}

/// If `bytes` is a well-formed eager packet, its message id, tag and payload,
/// borrowed in place (the receive fast path copies the payload once, into the
/// user's buffer).
pub fn peek_eager(bytes: &[u8]) -> Option<(MsgId, Tag, &[u8])> {
    if bytes.len() < eager_overhead() || bytes[0] != WIRE_VERSION || bytes[1] != K_EAGER {
        return None;
    }
    let msg = u64::from_le_bytes(bytes[2..10].try_into().ok()?);
    let tag = i32::from_le_bytes(bytes[10..14].try_into().ok()?);
    Some((msg, tag, &bytes[eager_overhead()..]))
}

/// Bytes an eager packet adds to its payload (the ring slot must hold both).
pub const fn eager_overhead() -> usize {
    HEADER + 8 + 4
}

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
    memo: Option<&'a mut RegionMemo>,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
    }
    fn u8(&mut self, v: u8) {
        self.bytes(&[v]);
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn i32(&mut self, v: i32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    /// A region with its form byte: short when the channel's memo knows its allocation,
    /// else in learn form for a memo (the receiving end's then learns it), else in full.
    fn region(&mut self, r: &Region) {
        let mut tag = None;
        if let Some(memo) = self.memo.as_deref_mut() {
            if memo.knows(r) {
                self.u8(REGION_SHORT);
                self.u64(r.buffer_id);
                self.u64(r.offset);
                return;
            }
            tag = Some(memo.next_tag());
            memo.learn(*r);
        }
        self.u8(if tag.is_some() { REGION_LEARN } else { REGION_FULL });
        self.bytes(&r.handle);
        self.u64(r.alloc_size);
        self.u64(r.offset);
        self.u32(r.device);
        self.u64(r.node);
        self.u64(r.buffer_id);
        if let Some(tag) = tag {
            self.u64(tag);
        }
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    kind: &'static str,
    memo: Option<&'a mut RegionMemo>,
    /// A region in learn form with the memo's next tag: learnt once the whole packet
    /// has decoded.
    learn: Option<Region>,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.buf.len() - self.pos < n {
            return Err(DecodeError::Short { kind: self.kind, got: self.buf.len() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn dir(&mut self) -> Result<Dir, DecodeError> {
        match self.u8()? {
            1 => Ok(Dir::ToSender),
            2 => Ok(Dir::ToReceiver),
            v => Err(DecodeError::Field { field: "dir", value: v as u64 }),
        }
    }
    /// A region whose form byte (already read) is `form`.
    fn region(&mut self, form: u8) -> Result<Region, DecodeError> {
        let r = match form {
            REGION_FULL | REGION_LEARN => {
                let mut handle = [0u8; HANDLE_BYTES];
                handle.copy_from_slice(self.take(HANDLE_BYTES)?);
                let r = Region {
                    handle,
                    alloc_size: self.u64()?,
                    offset: self.u64()?,
                    device: self.u32()?,
                    node: self.u64()?,
                    buffer_id: self.u64()?,
                };
                if form == REGION_LEARN {
                    // Only a channel's memo encodes the learn form, and only its memo can
                    // take it. A tag other than the next one is not the sender's learning
                    // (forged or corrupt): the region decodes, but is not remembered.
                    let tag = self.u64()?;
                    let memo = self
                        .memo
                        .as_deref()
                        .ok_or(DecodeError::Field { field: "region.form", value: REGION_LEARN as u64 })?;
                    if tag == memo.next_tag() {
                        self.learn = Some(r);
                    }
                }
                r
            }
            REGION_SHORT => {
                let (buffer_id, offset) = (self.u64()?, self.u64()?);
                // Without a memo, or one of another allocation, the short form names
                // nothing this end knows.
                let known = self.memo.as_deref().and_then(|m| m.find(buffer_id));
                let last = known.ok_or(DecodeError::Field { field: "region.buffer_id", value: buffer_id })?;
                Region { offset, ..last }
            }
            v => return Err(DecodeError::Field { field: "region.form", value: v as u64 }),
        };
        if r.offset > r.alloc_size {
            return Err(DecodeError::Field { field: "region.offset", value: r.offset });
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn region(seed: u8) -> Region {
        Region { handle: [seed; HANDLE_BYTES], alloc_size: 1 << 20, offset: 4096, device: 1, node: 77, buffer_id: 9 }
    }

    fn samples() -> Vec<Packet> {
        vec![
            Packet::Eager { msg: 1, tag: -3, payload: vec![1, 2, 3] },
            Packet::Eager { msg: 2, tag: 0, payload: vec![] },
            Packet::Rts { msg: 3, tag: 7, len: 1 << 30, src: MemDesc::Host },
            Packet::Rts { msg: 7, tag: 7, len: 1 << 22, src: MemDesc::Staged },
            Packet::Rts { msg: 4, tag: 7, len: 10, src: MemDesc::Device(region(5)) },
            Packet::Rts { msg: 5, tag: -2, len: 1 << 40, src: MemDesc::Net { pushed: false } },
            Packet::Rts { msg: 6, tag: -2, len: 1 << 20, src: MemDesc::Net { pushed: true } },
            Packet::Cts { msg: 5, mode: CtsMode::Net, dst: None, split: 0 },
            Packet::Cts { msg: 4, mode: CtsMode::Put, dst: Some(region(6)), split: 0 },
            Packet::Cts { msg: 4, mode: CtsMode::Shm, dst: None, split: 0 },
            Packet::Cookie { msg: 4 },
            Packet::Done { msg: 4, dir: Dir::ToSender },
            Packet::Done { msg: 4, dir: Dir::ToReceiver },
            Packet::Chunk { msg: 4, index: 3, len: 4096, slot: 2 },
            Packet::ChunkAck { msg: 4, index: 3 },
            Packet::Abort { msg: 4, reason: AbortReason::Truncated, dir: Dir::ToSender },
            Packet::FreeMarks { epoch: 2, buffer_ids: vec![1, 2, 3] },
            Packet::FreeAck { epoch: 2 },
            Packet::Rtr { recv: 5, expect: 12, tag: -1, len: 8, dst: region(7) },
            Packet::RtrPut { msg: 6, tag: 3, len: 8, recv: 5 },
            Packet::RtrRevoke { recv: 5 },
            Packet::RtrRevoked { recv: 5 },
        ]
    }

    #[test]
    fn round_trip_every_kind() {
        for p in samples() {
            let v = p.to_vec();
            assert_eq!(v.len(), p.encoded_len(), "{p:?}");
            assert_eq!(Packet::decode(&v).unwrap(), p);
        }
    }

    #[test]
    fn network_rendezvous_fields_round_trip_without_a_region() {
        // The RTS to a rank on another node names no region: one form byte, whatever the
        // sender's memory; the CTS of the network rendezvous carries none either.
        for (pushed, form) in [(true, SRC_NET_PUSHED), (false, SRC_NET)] {
            let rts = Packet::Rts { msg: 9, tag: 4, len: 1 << 33, src: MemDesc::Net { pushed } };
            let v = rts.to_vec();
            assert_eq!(v.len(), HEADER + 8 + 4 + 8 + 1);
            assert_eq!(v[v.len() - 1], form);
            assert_eq!(Packet::decode(&v), Ok(rts));
        }
        let rts = Packet::Rts { msg: 9, tag: 4, len: 1 << 33, src: MemDesc::Net { pushed: false } };
        let v = rts.to_vec();
        // The memo of an ordered channel is neither used nor changed by it.
        let (mut tx, mut rx) = (RegionMemo::default(), RegionMemo::default());
        assert_eq!(hop(&rts, &mut tx, &mut rx), (v.len() + SEAL_BYTES, Ok(rts)));
        assert!(tx.slots.iter().chain(rx.slots.iter()).all(Option::is_none));
        let cts = Packet::Cts { msg: 9, mode: CtsMode::Net, dst: None, split: 0 };
        let v = cts.to_vec();
        assert_eq!(v[HEADER + 8], CtsMode::Net as u8);
        assert_eq!(Packet::decode(&v), Ok(cts));
        // A peer of the previous wire version (which had neither) is refused.
        let mut old = v.clone();
        old[0] = 3;
        assert_eq!(Packet::decode(&old), Err(DecodeError::Version(3)));
        let mut bad = v;
        bad[HEADER + 8] = 5;
        assert_eq!(Packet::decode(&bad), Err(DecodeError::Field { field: "cts.mode", value: 5 }));
    }

    #[test]
    fn rejects_version_kind_truncation_trailing() {
        let mut v = Packet::Done { msg: 1, dir: Dir::ToSender }.to_vec();
        v[0] = 9;
        assert_eq!(Packet::decode(&v), Err(DecodeError::Version(9)));
        let mut v = Packet::Done { msg: 1, dir: Dir::ToSender }.to_vec();
        v[1] = 200;
        assert_eq!(Packet::decode(&v), Err(DecodeError::Kind(200)));
        let v = Packet::Done { msg: 1, dir: Dir::ToSender }.to_vec();
        assert!(matches!(Packet::decode(&v[..5]), Err(DecodeError::Short { .. })));
        let mut v = Packet::Done { msg: 1, dir: Dir::ToSender }.to_vec();
        v.push(0);
        assert_eq!(Packet::decode(&v), Err(DecodeError::Trailing(1)));
    }

    #[test]
    fn rejects_region_offset_past_allocation() {
        let mut r = region(1);
        r.offset = r.alloc_size + 1;
        let v = Packet::Rts { msg: 1, tag: 0, len: 1, src: MemDesc::Device(r) }.to_vec();
        assert!(matches!(Packet::decode(&v), Err(DecodeError::Field { field: "region.offset", .. })));
    }

    #[test]
    fn free_marks_count_is_bounded_by_bytes() {
        let mut v = Packet::FreeMarks { epoch: 1, buffer_ids: vec![5] }.to_vec();
        v[10..14].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Packet::decode(&v), Err(DecodeError::Field { .. })));
    }

    #[test]
    fn eager_header_and_peek_agree_with_the_codec() {
        let p = Packet::Eager { msg: 42, tag: 9, payload: vec![1, 2, 3] };
        let v = p.to_vec();
        assert_eq!(peek_eager(&v), Some((42, 9, &[1u8, 2, 3][..])));
        let mut w = vec![0u8; eager_overhead() + 3];
        encode_eager_header(&mut w, 42, 9);
        w[eager_overhead()..].copy_from_slice(&[1, 2, 3]);
        assert_eq!(w, v);
        assert_eq!(peek_eager(&Packet::Done { msg: 1, dir: Dir::ToSender }.to_vec()), None);
    }

    #[test]
    fn covers_checks_overflow() {
        let mut r = region(1);
        r.offset = 10;
        assert!(r.covers(r.alloc_size - 10));
        assert!(!r.covers(r.alloc_size - 9));
        assert!(!r.covers(u64::MAX));
    }

    /// Region `alloc` (one of a few allocations) at `offset`.
    fn alloc_region(alloc: u8, offset: u64) -> Region {
        Region { buffer_id: 100 + alloc as u64, handle: [alloc; HANDLE_BYTES], offset, ..region(0) }
    }

    /// The packet in `v`, encoded with a memo, without its seal: what a seal opened.
    fn body(v: &[u8]) -> &[u8] {
        &v[..v.len() - SEAL_BYTES]
    }

    /// Encodes `p` through `tx` and decodes it through `rx`, as the two ends of a ring do;
    /// the bytes that crossed (the seal included) and what was decoded.
    fn hop(p: &Packet, tx: &mut RegionMemo, rx: &mut RegionMemo) -> (usize, Result<Packet, DecodeError>) {
        let v = p.to_vec_with(Some(tx));
        assert!(v.len() <= p.encoded_len_with_memo(), "{p:?}");
        (v.len(), Packet::decode_with(&v, Some(rx)))
    }

    #[test]
    fn memo_shortens_regions_of_remembered_allocations_and_both_ends_agree() {
        let (mut tx, mut rx) = (RegionMemo::default(), RegionMemo::default());
        let rtr = |dst| Packet::Rtr { recv: 5, expect: 12, tag: -1, len: 8, dst };
        let rts = |src| Packet::Rts { msg: 1, tag: 2, len: 3, src: MemDesc::Device(src) };
        let full = rtr(alloc_region(1, 0)).encoded_len();
        let full_rts = rts(alloc_region(1, 0)).encoded_len();
        // (packet, whether its region crosses in short form)
        let seq = [
            (rtr(alloc_region(1, 0)), false),
            (rtr(alloc_region(1, 64)), true),
            (rts(alloc_region(1, 128)), true),
            (Packet::Cts { msg: 1, mode: CtsMode::Put, dst: Some(alloc_region(2, 0)), split: 0 }, false),
            (rtr(alloc_region(2, 8)), true),
            (Packet::Done { msg: 1, dir: Dir::ToSender }, false),
            // Both allocations stay remembered: a send buffer and a receive buffer in turn.
            (rtr(alloc_region(1, 0)), true),
            (rts(alloc_region(2, 4)), true),
            (rts(alloc_region(3, 0)), false),
            (rtr(alloc_region(4, 0)), false),
            // A fifth allocation takes the oldest slot (allocation 1's).
            (rtr(alloc_region(5, 0)), false),
            (rtr(alloc_region(2, 0)), true),
            (rtr(alloc_region(1, 0)), false),
        ];
        for (p, short) in seq {
            let (len, got) = hop(&p, &mut tx, &mut rx);
            assert_eq!(got.as_ref(), Ok(&p));
            match p {
                Packet::Rtr { .. } => assert_eq!(len < full, short, "{p:?}"),
                Packet::Rts { .. } => assert_eq!(len < full_rts, short, "{p:?}"),
                _ => {}
            }
        }
        // A short RTR and its ring slot header fit one cache line.
        let (len, _) = hop(&rtr(alloc_region(3, 512)), &mut tx, &mut rx);
        assert!(len + 8 <= 64, "short RTR is {len} bytes");
    }

    #[test]
    fn short_region_needs_the_memo_of_its_allocation() {
        let mut tx = RegionMemo::default();
        let _ = Packet::Rtr { recv: 1, expect: 0, tag: 0, len: 8, dst: alloc_region(1, 0) }.to_vec_with(Some(&mut tx));
        let short =
            Packet::Rtr { recv: 2, expect: 1, tag: 0, len: 8, dst: alloc_region(1, 8) }.to_vec_with(Some(&mut tx));
        let bad_id = Err(DecodeError::Field { field: "region.buffer_id", value: 101 });
        // Decoded without a memo (a channel that keeps none), or by an end whose memo holds
        // another allocation: refused, never mapped to the wrong buffer.
        assert_eq!(Packet::decode(body(&short)), bad_id);
        let mut other = RegionMemo::default();
        other.learn(alloc_region(2, 0));
        assert_eq!(Packet::decode_opened(body(&short), Some(&mut other)), bad_id);
        // An offset past the remembered allocation is refused as in the full form.
        let mut rx = RegionMemo::default();
        rx.learn(alloc_region(1, 0));
        let past = Packet::Rtr { recv: 2, expect: 1, tag: 0, len: 8, dst: alloc_region(1, (1 << 20) + 1) }
            .to_vec_with(Some(&mut tx));
        assert!(matches!(
            Packet::decode_opened(body(&past), Some(&mut rx)),
            Err(DecodeError::Field { field: "region.offset", .. })
        ));
        let mut v = body(&short).to_vec();
        let form_at = v.len() - 17;
        v[form_at] = 7;
        assert_eq!(
            Packet::decode_opened(&v, Some(&mut rx)),
            Err(DecodeError::Field { field: "region.form", value: 7 })
        );
    }

    #[test]
    fn a_changed_region_under_a_known_buffer_id_replaces_it() {
        let (mut tx, mut rx) = (RegionMemo::default(), RegionMemo::default());
        let rtr = |dst| Packet::Rtr { recv: 1, expect: 0, tag: 0, len: 8, dst };
        let old = alloc_region(1, 0);
        let new = Region { handle: [0xee; HANDLE_BYTES], alloc_size: 4096, ..old };
        let full = rtr(old).encoded_len();
        for (r, short) in [(old, false), (new, false), (Region { offset: 8, ..new }, true)] {
            let (len, got) = hop(&rtr(r), &mut tx, &mut rx);
            assert_eq!(got, Ok(rtr(r)), "decoded from the entry that replaced the old one");
            assert_eq!(len < full, short);
        }
        assert_eq!(tx.slots.iter().flatten().count(), 1);
        assert_eq!(rx.slots.iter().flatten().count(), 1);
    }

    /// Issue 31: forged packets in a ring, between the sender's real ones, whose regions
    /// would once push the sender's allocations out of the receiver's memo (its later
    /// short regions then could not be decoded, and their transfers hung): full regions
    /// of other allocations, a full region under a real buffer id, learn forms of another
    /// channel's key, a learn form with the channel's next tag in a packet that does not
    /// decode. None enters the memo; every real short region still decodes to its
    /// allocation. The forged bytes are handed over as opened (as if the sender's own
    /// encoder had sealed them), so that this tests the memo, not the seal.
    #[test]
    fn forged_regions_never_push_the_senders_allocations_out_of_the_memo() {
        let (mut tx, mut rx) = (RegionMemo::keyed(0x5eed), RegionMemo::keyed(0x5eed));
        let rts = |r| Packet::Rts { msg: 1, tag: 2, len: 3, src: MemDesc::Device(r) };
        for a in 1..=MEMO_SLOTS as u8 {
            let (len, got) = hop(&rts(alloc_region(a, 0)), &mut tx, &mut rx);
            assert_eq!(got, Ok(rts(alloc_region(a, 0))));
            assert!(len > rts(alloc_region(a, 0)).encoded_len(), "learn form");
        }
        let mut forged: Vec<Vec<u8>> = (10..16).map(|a| rts(alloc_region(a, 0)).to_vec()).collect();
        let impostor = Region { handle: [0xee; HANDLE_BYTES], ..alloc_region(1, 0) };
        forged.push(Packet::Cts { msg: 9, mode: CtsMode::Put, dst: Some(impostor), split: 0 }.to_vec());
        let mut other_key = RegionMemo::keyed(0xbad);
        forged.extend((20..26).map(|a| body(&rts(alloc_region(a, 0)).to_vec_with(Some(&mut other_key))).to_vec()));
        let mut next_tag = tx.clone();
        let mut trailing = body(&rts(alloc_region(30, 0)).to_vec_with(Some(&mut next_tag))).to_vec();
        trailing.push(0);
        forged.push(trailing);
        for v in &forged {
            let _ = Packet::decode_opened(v, Some(&mut rx));
        }
        for a in 1..=MEMO_SLOTS as u8 {
            let p = rts(alloc_region(a, 64 * a as u64));
            let (len, got) = hop(&p, &mut tx, &mut rx);
            assert_eq!(got, Ok(p.clone()), "allocation {a} after {} forged packets", forged.len());
            assert!(len < p.encoded_len(), "short form");
        }
        // The learn form is a memo's: decoded without one it is refused (one encoding per
        // packet), as is a short region.
        let v = rts(alloc_region(40, 0)).to_vec_with(Some(&mut tx));
        assert_eq!(
            Packet::decode(body(&v)),
            Err(DecodeError::Field { field: "region.form", value: REGION_LEARN as u64 })
        );
    }

    /// Issue 31: bytes written into a ring by anyone but the sender's encoder (a forged
    /// eager packet or RTS would count as a message of the sender's, and shift the count
    /// that RTR offers name) are refused at the seal and change nothing: unsealed
    /// packets, another channel's seals, a replayed real packet, a forged one with the
    /// last real seal, a seal alone. (A seal places a packet in the sender's sequence; it
    /// is no checksum of its bytes: a channel in shared memory does not corrupt them.) The sender's next packets, an eager packet sealed in
    /// place among them, still open and decode.
    #[test]
    fn packets_without_the_channels_next_seal_are_refused_and_change_nothing() {
        let (mut tx, mut rx) = (RegionMemo::keyed(0x5eed), RegionMemo::keyed(0x5eed));
        let eager = |msg| Packet::Eager { msg, tag: 5, payload: vec![7; 40] };
        let real = eager(1).to_vec_with(Some(&mut tx));
        assert_eq!(Packet::decode_with(&real, Some(&mut rx)), Ok(eager(1)));
        let mut other = RegionMemo::keyed(0xbad);
        // A forged packet that carries the seal of the sender's last one.
        let mut copied_seal = eager(2).to_vec();
        copied_seal.extend_from_slice(&real[real.len() - SEAL_BYTES..]);
        let forged = [
            eager(2).to_vec(),
            Packet::Rts { msg: 2, tag: 5, len: 1 << 20, src: MemDesc::Host }.to_vec(),
            eager(2).to_vec_with(Some(&mut other)),
            real.clone(),
            copied_seal,
            real[real.len() - SEAL_BYTES..].to_vec(),
            Vec::new(),
        ];
        for v in &forged {
            assert_eq!(Packet::decode_with(v, Some(&mut rx)), Err(DecodeError::Seal), "{v:?}");
        }
        assert_eq!(Packet::decode_with(&eager(2).to_vec_with(Some(&mut tx)), Some(&mut rx)), Ok(eager(2)));
        // An eager packet written in place (header, payload, then its seal), opened before
        // it is looked at.
        let mut slot = vec![0u8; eager_overhead() + 3 + SEAL_BYTES];
        encode_eager_header(&mut slot, 3, 9);
        slot[eager_overhead()..eager_overhead() + 3].copy_from_slice(&[1, 2, 3]);
        tx.seal(&mut slot[eager_overhead() + 3..]);
        assert_eq!(rx.clone().open(&forged[0]), Err(DecodeError::Seal));
        let opened = rx.open(&slot).expect("the sender's seal opens");
        assert_eq!(peek_eager(opened), Some((3, 9, &[1u8, 2, 3][..])));
        let p = Packet::Rts { msg: 4, tag: 5, len: 8, src: MemDesc::Host };
        assert_eq!(Packet::decode_with(&p.to_vec_with(Some(&mut tx)), Some(&mut rx)), Ok(p));
    }

    proptest! {
        /// Real packets with regions cross a memo pair unchanged, and short exactly as
        /// without forgeries, whatever forged packets (full regions of any allocation,
        /// under real buffer ids too, learn forms of other keys, corrupted learn forms)
        /// come between them, handed over as opened (this tests the memo, not the seal).
        #[test]
        fn forged_packets_between_real_ones_leave_the_memos_agreeing(
            seq in proptest::collection::vec((any::<bool>(), 0u8..3, 0u8..12, 0u64..4096, any::<u8>()), 1..80)
        ) {
            let (mut tx, mut rx) = (RegionMemo::keyed(7), RegionMemo::keyed(7));
            let mut forger = RegionMemo::keyed(8);
            let mut fulls: Vec<u8> = Vec::new();
            for (real, kind, alloc, offset, noise) in seq {
                let mut r = alloc_region(alloc % 7, offset);
                if !real && noise % 2 == 0 {
                    r.handle[0] ^= 0xff; // A real buffer id, another allocation.
                }
                let p = match kind {
                    0 => Packet::Rtr { recv: 1, expect: 2, tag: 3, len: 4, dst: r },
                    1 => Packet::Rts { msg: 1, tag: 2, len: 3, src: MemDesc::Device(r) },
                    _ => Packet::Cts { msg: 1, mode: CtsMode::Put, dst: Some(r), split: 0 },
                };
                if real {
                    let (len, got) = hop(&p, &mut tx, &mut rx);
                    prop_assert_eq!(got, Ok(p.clone()));
                    let short = fulls.iter().rev().take(MEMO_SLOTS).any(|&a| a == alloc % 7);
                    prop_assert_eq!(len < p.encoded_len(), short);
                    if !short {
                        fulls.push(alloc % 7);
                    }
                    continue;
                }
                let mut v = match noise % 3 {
                    0 => p.to_vec(),
                    _ => body(&p.to_vec_with(Some(&mut forger))).to_vec(),
                };
                if noise % 5 == 0 {
                    let at = noise as usize % v.len();
                    v[at] ^= 1 << (noise % 8);
                }
                let _ = Packet::decode_opened(&v, Some(&mut rx));
            }
        }
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder, and whatever decodes re-encodes
        /// to the same bytes (no two encodings of one packet).
        #[test]
        fn decode_is_total_and_canonical(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(p) = Packet::decode(&bytes) {
                prop_assert_eq!(p.to_vec(), bytes);
            }
        }

        /// Any sequence of packets with regions of a few allocations crosses a memo pair
        /// unchanged, each region short exactly when its allocation is among the last
        /// MEMO_SLOTS that crossed in full.
        #[test]
        fn memo_pairs_carry_any_sequence(seq in proptest::collection::vec((0u8..4, 0u8..7, 0u64..4096), 1..60)) {
            let (mut tx, mut rx) = (RegionMemo::default(), RegionMemo::default());
            let mut fulls: Vec<u8> = Vec::new();
            for (kind, alloc, offset) in seq {
                let r = alloc_region(alloc, offset);
                let p = match kind {
                    0 => Packet::Rtr { recv: 1, expect: 2, tag: 3, len: 4, dst: r },
                    1 => Packet::Rts { msg: 1, tag: 2, len: 3, src: MemDesc::Device(r) },
                    2 => Packet::Cts { msg: 1, mode: CtsMode::Put, dst: Some(r), split: 0 },
                    _ => Packet::Cts { msg: 1, mode: CtsMode::Shm, dst: None, split: 0 },
                };
                let (len, got) = hop(&p, &mut tx, &mut rx);
                prop_assert_eq!(got, Ok(p.clone()));
                if kind < 3 {
                    let short = fulls.iter().rev().take(MEMO_SLOTS).any(|&a| a == alloc);
                    prop_assert_eq!(len < p.encoded_len(), short);
                    if !short {
                        fulls.push(alloc);
                    }
                }
            }
        }

        #[test]
        fn mutated_packets_never_panic(idx in 0usize..64, pos in 0usize..200, val in any::<u8>()) {
            let all = samples();
            let p = &all[idx % all.len()];
            let mut v = p.to_vec();
            let n = v.len();
            v[pos % n] = val;
            let _ = Packet::decode(&v);
        }
    }
}
