//! Templates (what the host prefills per queue and target) and the proxy's validation of
//! a packet against them.
//!
//! Everything static about a target lives here, written once by the host at setup, so a
//! GPU producer writes only op, addresses, offset, size (and signal) and names the rest
//! by a target index (seed 000, section 4: packet templates). The packet comes from
//! memory a GPU kernel writes, so the proxy treats it as untrusted: [`TemplateTable::check`]
//! rejects every packet that would make it read or write outside a window, overflow an
//! address, exceed a size limit or name a target that does not exist, with a
//! [`BadPacket`] that says what is wrong. The proxy completes such a packet with an error
//! ([`super::OpFailure::bad_packet`]) instead of performing it.
//!
//! Local addresses (the producer's own buffers) cannot be checked here beyond null and
//! overflow: the producer is the process's own thread or kernel, and its buffers are its
//! business, as they are for `MPI_Isend`. Windows are the target's memory, which a
//! producer must never reach outside of.

use super::{AmoOp, Flags, Op, OpCode, Packet, RawPacket, MAX_TARGET};
use crate::Rank;

/// A target's registered window: the memory that one-sided ops address by offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The window's id at the target (which registration it is).
    pub id: u32,
    /// Address of the window's first byte in the target process (its heap base).
    pub base: u64,
    /// Bytes in the window.
    pub size: u64,
}

impl Window {
    /// The target address of `[offset, offset + len)` if that range lies inside the
    /// window; `None` if it does not or its arithmetic overflows. The target's proxy
    /// uses this too before it writes.
    pub fn address_of(&self, offset: u64, len: u64) -> Option<u64> {
        let end = offset.checked_add(len)?;
        (end <= self.size).then(|| self.base + offset)
    }
}

/// What the host prefills for one (queue, target) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Template {
    /// The target's rank in the job (the proxy's communicator).
    pub rank: Rank,
    /// The transport's handle of the communicator the proxy uses for this target.
    pub comm: u32,
    /// The target's window, for one-sided ops; `None` for a two-sided-only target.
    pub window: Option<Window>,
}

/// Size limits the proxy enforces before handing an op to MPI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest encoded control packet (CTRL), bytes: the proxy's receive buffers.
    pub max_ctrl: u64,
    /// Largest data op (SEND, RECV, PUT, PUT_SIGNAL, GET), bytes.
    pub max_size: u64,
    /// Largest transfer tag (SEND, RECV): the MPI library's `MPI_TAG_UB`.
    pub max_tag: u64,
}

impl Default for Limits {
    /// 64 KiB control packets, 1 TiB data ops (no practical limit, but far from
    /// overflow), and tags up to `i32::MAX` (lower it to the library's `MPI_TAG_UB`).
    fn default() -> Self {
        Limits { max_ctrl: 64 << 10, max_size: 1 << 40, max_tag: i32::MAX as u64 }
    }
}

/// Why a packet is refused. The proxy logs it with the queue and slot and completes the
/// op with an error; nothing is read or written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadPacket {
    #[error("unknown GIO op code {code}: the producer and the proxy disagree on the packet format; build both from one gpulmt")]
    UnknownOp { code: u8 },
    #[error("GIO commit word {word:#018x} has reserved bits set: the producer wrote a corrupt header")]
    ReservedBits { word: u64 },
    #[error("GIO {op:?} packet carries flags {flags:#04x}, which that op does not take (allowed: {:#04x})", op.allowed_flags().0)]
    FlagsNotAllowed { op: OpCode, flags: u8 },
    #[error("GIO {op:?} packet has unknown variant {variant} (signal op or atomic)")]
    UnknownVariant { op: OpCode, variant: u8 },
    #[error("GIO packet names target {target}, but its queue has {templates} templates; post only to targets set up for the queue")]
    TargetOutOfRange { target: u32, templates: usize },
    #[error("GIO {op:?} to target {target} needs a window, and the target has none registered; register one first")]
    NoWindow { op: OpCode, target: u32 },
    #[error("GIO {op:?} to target {target} touches [{offset}, {offset} + {size}) outside its {window} byte window")]
    OutOfWindow { op: OpCode, target: u32, offset: u64, size: u64, window: u64 },
    #[error("GIO {op:?} of {size} bytes exceeds the proxy's limit of {limit} bytes; split it")]
    TooLarge { op: OpCode, size: u64, limit: u64 },
    #[error("GIO CTRL packet of 0 bytes: a control packet is never empty")]
    EmptyControl,
    #[error("GIO {op:?} has a bad local address {addr:#x} for {size} bytes (null, or the range overflows)")]
    BadAddress { op: OpCode, addr: u64, size: u64 },
    #[error("GIO {op:?} word offset {offset} is not 8-byte aligned; 64-bit signals and atomics need aligned words")]
    Misaligned { op: OpCode, offset: u64 },
    #[error("GIO atomic fetch without a result address: give word 1 the address of the result")]
    NoResultAddress,
    #[error("GIO transfer tag {tag} exceeds the MPI library's tag bound {limit}")]
    TagTooLarge { tag: u64, limit: u64 },
}

impl BadPacket {
    /// A stable number per kind, carried in an error completion's detail
    /// ([`super::OpFailure::bad_packet`]); the full text goes to the log.
    pub const fn code(&self) -> u32 {
        match self {
            BadPacket::UnknownOp { .. } => 1,
            BadPacket::ReservedBits { .. } => 2,
            BadPacket::FlagsNotAllowed { .. } => 3,
            BadPacket::UnknownVariant { .. } => 4,
            BadPacket::TargetOutOfRange { .. } => 5,
            BadPacket::NoWindow { .. } => 6,
            BadPacket::OutOfWindow { .. } => 7,
            BadPacket::TooLarge { .. } => 8,
            BadPacket::EmptyControl => 9,
            BadPacket::BadAddress { .. } => 10,
            BadPacket::Misaligned { .. } => 11,
            BadPacket::NoResultAddress => 12,
            BadPacket::TagTooLarge { .. } => 13,
        }
    }
}

/// Why a template table cannot be built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("{count} GIO templates exceed the {} a packet can name", MAX_TARGET as u64 + 1)]
    TooMany { count: usize },
    #[error("GIO target {target}'s window at {base:#x} of {size} bytes wraps the address space")]
    WindowOverflow { target: u32, base: u64, size: u64 },
}

/// A packet that passed [`TemplateTable::check`], with its template (`None` for NOP,
/// which names no target).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked<'a> {
    pub packet: Packet,
    pub template: Option<&'a Template>,
}

/// One queue's templates, indexed by a packet's target, and the proxy's limits.
#[derive(Clone, Debug)]
pub struct TemplateTable {
    templates: Vec<Template>,
    limits: Limits,
}

impl TemplateTable {
    /// A table of `templates` (index = target) under `limits`.
    pub fn new(templates: Vec<Template>, limits: Limits) -> Result<Self, TemplateError> {
        if templates.len() > MAX_TARGET as usize + 1 {
            return Err(TemplateError::TooMany { count: templates.len() });
        }
        for (target, t) in templates.iter().enumerate() {
            if let Some(w) = t.window {
                if w.base.checked_add(w.size).is_none() {
                    return Err(TemplateError::WindowOverflow { target: target as u32, base: w.base, size: w.size });
                }
            }
        }
        Ok(TemplateTable { templates, limits })
    }

    /// The template of a target.
    pub fn get(&self, target: u32) -> Option<&Template> {
        self.templates.get(target as usize)
    }

    /// Templates in the table.
    pub fn len(&self) -> usize {
        self.templates.len()
    }

    /// Whether the table has no template.
    pub fn is_empty(&self) -> bool {
        self.templates.is_empty()
    }

    /// The limits the table checks.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Decodes a committed slot and checks it against its template: the target exists,
    /// one-sided ops have a window and stay inside it, sizes and tags are within the
    /// limits, local ranges neither are null nor overflow. All arithmetic is checked, so
    /// no field value can make a later address computation wrap.
    pub fn check(&self, raw: &RawPacket) -> Result<Checked<'_>, BadPacket> {
        let packet = Packet::decode(raw)?;
        let op = packet.op.code();
        let target = packet.target;
        if op == OpCode::Nop {
            return Ok(Checked { packet, template: None });
        }
        let template = self.get(target).ok_or(BadPacket::TargetOutOfRange { target, templates: self.len() })?;
        let window = match template.window {
            None if op.one_sided() => return Err(BadPacket::NoWindow { op, target }),
            window => window,
        };
        let limits = &self.limits;
        let local = |addr: u64, size: u64| match addr.checked_add(size) {
            Some(_) if addr != 0 || size == 0 => Ok(()),
            _ => Err(BadPacket::BadAddress { op, addr, size }),
        };
        let data_size = |size: u64| match size <= limits.max_size {
            true => Ok(()),
            false => Err(BadPacket::TooLarge { op, size, limit: limits.max_size }),
        };
        let tag = |tag: u64| match tag <= limits.max_tag {
            true => Ok(()),
            false => Err(BadPacket::TagTooLarge { tag, limit: limits.max_tag }),
        };
        let inside = |offset: u64, size: u64| match window.map(|w| (w.size, w.address_of(offset, size))) {
            Some((_, Some(_))) => Ok(()),
            Some((window, None)) => Err(BadPacket::OutOfWindow { op, target, offset, size, window }),
            None => unreachable!("one-sided ops have a window (checked above)"),
        };
        let word = |offset: u64| match offset % 8 {
            0 => inside(offset, 8),
            _ => Err(BadPacket::Misaligned { op, offset }),
        };
        match packet.op {
            Op::Nop => {}
            Op::Ctrl { src, size } => {
                if size == 0 {
                    return Err(BadPacket::EmptyControl);
                }
                if size > limits.max_ctrl {
                    return Err(BadPacket::TooLarge { op, size, limit: limits.max_ctrl });
                }
                local(src, size)?;
            }
            Op::Send { src: addr, size, tag: t } | Op::Recv { dst: addr, size, tag: t } => {
                data_size(size)?;
                tag(t)?;
                // A drain (DISCARD, which only a RECV may carry) writes nowhere: it names no
                // local range.
                if !packet.flags.contains(Flags::DISCARD) {
                    local(addr, size)?;
                }
            }
            Op::Put { src: addr, dst_offset: offset, size } | Op::Get { dst: addr, src_offset: offset, size } => {
                data_size(size)?;
                local(addr, size)?;
                inside(offset, size)?;
            }
            Op::PutSignal { src, dst_offset, size, signal_offset, .. } => {
                data_size(size)?;
                local(src, size)?;
                inside(dst_offset, size)?;
                word(signal_offset)?;
            }
            Op::Amo { amo, offset, result, .. } => {
                word(offset)?;
                match (amo, result) {
                    (AmoOp::Fetch, 0) => return Err(BadPacket::NoResultAddress),
                    (_, 0) => {}
                    (_, r) => local(r, 8)?,
                }
            }
        }
        Ok(Checked { packet, template: Some(template) })
    }
}
