//! The GIO packet: one 64-byte cache line of eight `u64` words, its commit word and
//! lap parity, and its structural decoding.
//!
//! # Layout
//! Word 0 is the **commit word**, written last by the producer (see [`commit_word`]):
//!
//! | bits   | field   | meaning                                                        |
//! |--------|---------|----------------------------------------------------------------|
//! | 0..8   | op      | [`OpCode`]                                                     |
//! | 8..16  | flags   | [`Flags`]: `SRC_DEVICE`, `DST_DEVICE`, `FENCE`, `DISCARD`      |
//! | 16..24 | variant | [`SignalOp`] of a `PUT_SIGNAL`, [`AmoOp`] of an `AMO`, else 0  |
//! | 24..32 | reserved| zero                                                           |
//! | 32..63 | target  | index into the queue's template table (31 bits)                |
//! | 63     | commit  | lap parity XOR 1 ([`commit_bit`])                              |
//!
//! Words 1-7 have one meaning per position, so every op writes the same few words and
//! the proxy reads them the same way ([`word`]):
//!
//! | word | CTRL | SEND | RECV | PUT | PUT_SIGNAL | GET | AMO |
//! |------|------|------|------|-----|------------|-----|-----|
//! | 1 local address | src | src | dst | src | src | dst | result (0: none) |
//! | 2 remote offset | - | - | - | dst offset | dst offset | src offset | word offset |
//! | 3 size (bytes)  | size | size | size | size | size | size | - (8) |
//! | 4 arg0          | - | tag | tag | - | signal offset | - | operand |
//! | 5 arg1          | - | - | - | - | signal value | - | compare (CAS) |
//! | 6               | - | - | - | - | - | - | - |
//! | 7 cookie        | cookie | cookie | cookie | cookie | cookie | cookie | cookie |
//!
//! A NOP reads only the cookie.
//! Every word is written by the **producer** (a host thread, or a GPU thread block) and
//! read by the **proxy**. Local addresses are the producer's own (host or device, as
//! `SRC_DEVICE`/`DST_DEVICE` say); remote offsets are offsets into the target's window
//! named by the template; the cookie is the producer's own word (a request id), never
//! interpreted, and echoed in logs.
//!
//! A word marked "-" is not read: slots are never cleared, so an unused word may still
//! hold an earlier lap's value, and decoding must ignore it. Word 0 is written whole
//! every time, so its reserved bits are checked.

use super::BadPacket;

/// Words of a packet.
pub const PACKET_WORDS: usize = 8;

/// One ring slot as it lies in memory: a 64-byte cache line, so a packet never shares a
/// line with its neighbour (no false sharing between producers of adjacent slots) and a
/// GPU writes it in whole-line transactions.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RawPacket {
    /// `words[0]` is the commit word; see the module docs for the rest.
    pub words: [u64; PACKET_WORDS],
}

const _: () = assert!(std::mem::size_of::<RawPacket>() == 64);
const _: () = assert!(std::mem::align_of::<RawPacket>() == 64);

/// Word positions of a packet (module docs: which op uses which).
pub mod word {
    /// The commit word: op, flags, variant, target, commit bit. Written last.
    pub const COMMIT: usize = 0;
    /// A local address: the source of data sent, the destination of data received.
    pub const LOCAL_ADDR: usize = 1;
    /// An offset into the target's window.
    pub const REMOTE_OFFSET: usize = 2;
    /// A size in bytes.
    pub const SIZE: usize = 3;
    /// Tag (SEND, RECV), signal offset (PUT_SIGNAL), operand (AMO).
    pub const ARG0: usize = 4;
    /// Signal value (PUT_SIGNAL), compare value (AMO compare-swap).
    pub const ARG1: usize = 5;
    /// The producer's cookie, echoed and never interpreted.
    pub const COOKIE: usize = 7;
}

/// Shift of the op code in the commit word.
pub const OP_SHIFT: u32 = 0;
/// Shift of the flags in the commit word.
pub const FLAGS_SHIFT: u32 = 8;
/// Shift of the variant in the commit word.
pub const VARIANT_SHIFT: u32 = 16;
/// Bits of the commit word that must be zero.
pub const RESERVED_MASK: u64 = 0xff << 24;
/// Shift of the target index in the commit word.
pub const TARGET_SHIFT: u32 = 32;
/// The largest target index a commit word can carry.
pub const MAX_TARGET: u32 = (1 << 31) - 1;
/// The commit bit: lap parity XOR 1.
pub const COMMIT_BIT: u64 = 1 << 63;

/// Parity (0 or 1) of the lap that position `pos` falls in, on a ring of `slots`.
///
/// Positions are monotonic counts (never reduced modulo the ring), so `pos / slots` is
/// the lap and `pos % slots` the slot.
pub const fn lap_parity(pos: u64, slots: u64) -> u64 {
    (pos / slots) & 1
}

/// The commit bit a packet at `pos` carries: lap parity XOR 1 (MSCCL++'s rule). Lap 0
/// commits with 1, so a zeroed ring reads as empty at every lap-0 position; lap 1
/// commits with 0, so a slot still holding its lap-0 packet reads as empty again. A
/// consumed slot therefore never needs clearing: the next lap's parity makes it stale.
pub const fn commit_bit(pos: u64, slots: u64) -> u64 {
    lap_parity(pos, slots) ^ 1
}

/// Index of position `pos`'s slot in a ring of `slots`.
pub const fn slot_index(pos: u64, slots: u64) -> usize {
    (pos % slots) as usize
}

/// The commit word of a packet at `pos`: the header fields and the commit bit, in one
/// word so that one release store publishes the whole packet.
///
/// # Panics
/// If `target` exceeds [`MAX_TARGET`] (it would overwrite the commit bit); a
/// [`super::TemplateTable`] never holds more targets.
pub const fn commit_word(pos: u64, slots: u64, op: OpCode, flags: Flags, variant: u8, target: u32) -> u64 {
    assert!(target <= MAX_TARGET, "GIO target index exceeds MAX_TARGET");
    (op as u64) << OP_SHIFT
        | (flags.0 as u64) << FLAGS_SHIFT
        | (variant as u64) << VARIANT_SHIFT
        | (target as u64) << TARGET_SHIFT
        | commit_bit(pos, slots) << 63
}

/// Whether `word`, read from position `pos`'s slot, commits the packet of `pos` (and not
/// a stale one of the previous lap, nor a zeroed slot).
pub const fn is_committed(pos: u64, slots: u64, word: u64) -> bool {
    word >> 63 == commit_bit(pos, slots)
}

/// What a packet asks the proxy to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpCode {
    /// Nothing; completes at once. Code 0, so an all-zero committed packet is a valid
    /// no-op, and a producer that reserved more slots than it used (a thread block)
    /// fills the rest with it.
    Nop = 0,
    /// Send an encoded control packet (eager, RTS, CTS, ABORT) to the target's rank.
    Ctrl = 1,
    /// Send the data of a rendezvous (two-sided) under a transfer tag.
    Send = 2,
    /// Receive the data of a rendezvous from the target's rank under a transfer tag.
    Recv = 3,
    /// Write local data into the target's window.
    Put = 4,
    /// PUT, then update a signal word in the window; the data lands before the signal.
    PutSignal = 5,
    /// Read from the target's window into local memory.
    Get = 6,
    /// A 64-bit atomic on a word of the target's window (a later issue implements it).
    Amo = 7,
}

impl OpCode {
    /// The op of a code, if it is one.
    pub const fn from_u8(code: u8) -> Option<OpCode> {
        Some(match code {
            0 => OpCode::Nop,
            1 => OpCode::Ctrl,
            2 => OpCode::Send,
            3 => OpCode::Recv,
            4 => OpCode::Put,
            5 => OpCode::PutSignal,
            6 => OpCode::Get,
            7 => OpCode::Amo,
            _ => return None,
        })
    }

    /// Whether the op addresses the target's window (one-sided), so its template must
    /// have one.
    pub const fn one_sided(self) -> bool {
        matches!(self, OpCode::Put | OpCode::PutSignal | OpCode::Get | OpCode::Amo)
    }

    /// The flags this op may carry. A flag that means nothing for an op is rejected
    /// rather than ignored: it shows a producer that encodes something else than it
    /// thinks.
    pub const fn allowed_flags(self) -> Flags {
        Flags(match self {
            OpCode::Nop => 0,
            OpCode::Ctrl => Flags::FENCE.0,
            OpCode::Send | OpCode::Put | OpCode::PutSignal => Flags::SRC_DEVICE.0 | Flags::FENCE.0,
            OpCode::Recv => Flags::DST_DEVICE.0 | Flags::FENCE.0 | Flags::DISCARD.0,
            OpCode::Get | OpCode::Amo => Flags::DST_DEVICE.0 | Flags::FENCE.0,
        })
    }
}

/// Flags of the commit word.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(pub u8);

impl Flags {
    /// The local source (word 1 of SEND, PUT, PUT_SIGNAL) is device memory.
    pub const SRC_DEVICE: Flags = Flags(1);
    /// The local destination (word 1 of RECV, GET; AMO's result) is device memory.
    pub const DST_DEVICE: Flags = Flags(2);
    /// Do not start this op before every earlier op of this queue to the same target
    /// has completed ([`super::FenceGate`]).
    pub const FENCE: Flags = Flags(4);
    /// RECV only: receive the data and drop it (a pushed message no receive takes);
    /// the local address is unused (0). Host producers only.
    pub const DISCARD: Flags = Flags(8);
    /// No flag.
    pub const NONE: Flags = Flags(0);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of flags.
    pub const fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }
}

/// How PUT_SIGNAL updates its signal word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SignalOp {
    /// Store the value.
    Set = 0,
    /// Add the value (wrapping).
    Add = 1,
}

/// The atomic of an AMO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AmoOp {
    /// Add the operand; the old value goes to the result address (if any).
    FetchAdd = 0,
    /// Store the operand if the word equals the compare value; the old value goes to
    /// the result address (if any).
    CompareSwap = 1,
    /// Store the operand.
    Set = 2,
    /// Read the word into the result address (required).
    Fetch = 3,
}

/// A decoded packet's op and its op-specific fields (module docs: which word holds
/// which). Addresses are the producer's; offsets are into the target's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Nothing.
    Nop,
    /// Send the `size` bytes of an encoded control packet at `src` (host memory).
    Ctrl { src: u64, size: u64 },
    /// Send `size` bytes at `src` under transfer tag `tag`.
    Send { src: u64, size: u64, tag: u64 },
    /// Receive up to `size` bytes into `dst` under transfer tag `tag`.
    Recv { dst: u64, size: u64, tag: u64 },
    /// Write `size` bytes at `src` to `dst_offset` in the target's window.
    Put { src: u64, dst_offset: u64, size: u64 },
    /// PUT, then update the 8-byte word at `signal_offset` with `signal_value`.
    PutSignal { src: u64, dst_offset: u64, size: u64, signal_offset: u64, signal_value: u64, signal_op: SignalOp },
    /// Read `size` bytes at `src_offset` in the target's window into `dst`.
    Get { dst: u64, src_offset: u64, size: u64 },
    /// A 64-bit atomic on the word at `offset`; the old value goes to `result` (0: none).
    Amo { amo: AmoOp, offset: u64, operand: u64, compare: u64, result: u64 },
}

impl Op {
    /// The op's code.
    pub const fn code(&self) -> OpCode {
        match self {
            Op::Nop => OpCode::Nop,
            Op::Ctrl { .. } => OpCode::Ctrl,
            Op::Send { .. } => OpCode::Send,
            Op::Recv { .. } => OpCode::Recv,
            Op::Put { .. } => OpCode::Put,
            Op::PutSignal { .. } => OpCode::PutSignal,
            Op::Get { .. } => OpCode::Get,
            Op::Amo { .. } => OpCode::Amo,
        }
    }

    /// The variant byte of the commit word.
    const fn variant(&self) -> u8 {
        match self {
            Op::PutSignal { signal_op, .. } => *signal_op as u8,
            Op::Amo { amo, .. } => *amo as u8,
            _ => 0,
        }
    }
}

/// A packet as the producer means it and the proxy decodes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    pub op: Op,
    pub flags: Flags,
    /// Index into the queue's template table (at most [`MAX_TARGET`]).
    pub target: u32,
    /// The producer's own word (word 7).
    pub cookie: u64,
}

impl Packet {
    /// The commit word of this packet at position `pos` of a ring of `slots`.
    pub const fn commit_word(&self, pos: u64, slots: u64) -> u64 {
        commit_word(pos, slots, self.op.code(), self.flags, self.op.variant(), self.target)
    }

    /// Words 1-7, which the producer writes before the commit word. Unused words are 0
    /// here, but a decoder never relies on that.
    pub const fn body(&self) -> [u64; PACKET_WORDS - 1] {
        let (local, remote, size, arg0, arg1) = match self.op {
            Op::Nop => (0, 0, 0, 0, 0),
            Op::Ctrl { src, size } => (src, 0, size, 0, 0),
            Op::Send { src, size, tag } => (src, 0, size, tag, 0),
            Op::Recv { dst, size, tag } => (dst, 0, size, tag, 0),
            Op::Put { src, dst_offset, size } => (src, dst_offset, size, 0, 0),
            Op::PutSignal { src, dst_offset, size, signal_offset, signal_value, .. } => {
                (src, dst_offset, size, signal_offset, signal_value)
            }
            Op::Get { dst, src_offset, size } => (dst, src_offset, size, 0, 0),
            Op::Amo { offset, operand, compare, result, .. } => (result, offset, 0, operand, compare),
        };
        [local, remote, size, arg0, arg1, 0, self.cookie]
    }

    /// The whole slot image of this packet at `pos`: what a producer leaves in memory.
    pub const fn encode(&self, pos: u64, slots: u64) -> RawPacket {
        let b = self.body();
        RawPacket { words: [self.commit_word(pos, slots), b[0], b[1], b[2], b[3], b[4], b[5], b[6]] }
    }

    /// Decodes the structure of a slot's packet: op code, variant, flags and reserved
    /// bits. The commit bit is not looked at (the consumer checked it); the target and
    /// the window bounds are checked by [`super::TemplateTable::check`].
    pub fn decode(raw: &RawPacket) -> Result<Packet, BadPacket> {
        let w = &raw.words;
        let head = w[word::COMMIT];
        let code = (head >> OP_SHIFT) as u8;
        let flags = Flags((head >> FLAGS_SHIFT) as u8);
        let variant = (head >> VARIANT_SHIFT) as u8;
        let target = ((head >> TARGET_SHIFT) as u32) & MAX_TARGET;
        let op = OpCode::from_u8(code).ok_or(BadPacket::UnknownOp { code })?;
        if head & RESERVED_MASK != 0 {
            return Err(BadPacket::ReservedBits { word: head });
        }
        if flags.0 & !op.allowed_flags().0 != 0 {
            return Err(BadPacket::FlagsNotAllowed { op, flags: flags.0 });
        }
        let bad_variant = BadPacket::UnknownVariant { op, variant };
        let (local, remote, size, arg0, arg1) =
            (w[word::LOCAL_ADDR], w[word::REMOTE_OFFSET], w[word::SIZE], w[word::ARG0], w[word::ARG1]);
        if variant != 0 && !matches!(op, OpCode::PutSignal | OpCode::Amo) {
            return Err(bad_variant);
        }
        let op = match op {
            OpCode::Nop => Op::Nop,
            OpCode::Ctrl => Op::Ctrl { src: local, size },
            OpCode::Send => Op::Send { src: local, size, tag: arg0 },
            OpCode::Recv => Op::Recv { dst: local, size, tag: arg0 },
            OpCode::Put => Op::Put { src: local, dst_offset: remote, size },
            OpCode::PutSignal => Op::PutSignal {
                src: local,
                dst_offset: remote,
                size,
                signal_offset: arg0,
                signal_value: arg1,
                signal_op: match variant {
                    0 => SignalOp::Set,
                    1 => SignalOp::Add,
                    _ => return Err(bad_variant),
                },
            },
            OpCode::Get => Op::Get { dst: local, src_offset: remote, size },
            OpCode::Amo => Op::Amo {
                amo: match variant {
                    0 => AmoOp::FetchAdd,
                    1 => AmoOp::CompareSwap,
                    2 => AmoOp::Set,
                    3 => AmoOp::Fetch,
                    _ => return Err(bad_variant),
                },
                offset: remote,
                operand: arg0,
                compare: arg1,
                result: local,
            },
        };
        Ok(Packet { op, flags, target, cookie: w[word::COOKIE] })
    }
}
