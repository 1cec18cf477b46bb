//! `PacketRing`: the lock-free single-producer single-consumer ring of fixed-size slots
//! that carries control packets from one local rank to another through shared memory.
//!
//! Layout at the ring's base (which must be aligned to [`RING_ALIGN`]):
//!
//! ```text
//! [ head: AtomicU64, own cache line(s) ]  consumer's index: packets popped so far
//! [ tail: AtomicU64, seen_head: AtomicU64, own cache line(s) ]
//!                                         producer's index: packets pushed so far, and
//!                                         the last head it read (its private cache)
//! [ slot 0 ][ slot 1 ] ... [ slot slots-1 ]   each `slot_size` bytes:
//!     [ len: u32 ][ stamp: u32 ][ payload: len bytes ... ]
//! ```
//!
//! The indices only grow (a u64 does not wrap in the life of a job); slot `i` is at
//! `i & (slots - 1)`, the ring is empty when `head == tail` and full when
//! `tail - head == slots`. Each index has exactly one writer, so no RMW is needed:
//! the producer owns `tail`, the consumer owns `head`.
//!
//! A packet hop costs the cache misses on its path, so each side touches the other's
//! lines only when it must: the producer publishes packet `i` by writing the stamp
//! `(i + 1) as u32` into its slot header, and the consumer polls that stamp, so the
//! miss that tells it a packet arrived also brings the packet's first bytes (polling
//! `tail` would cost a second miss before the slot's). The producer reads the
//! consumer's `head` only when the head it saw last says the ring is full. `tail` is
//! still kept, for [`PacketRing::len`] and [`PacketRing::is_empty`].
//!
//! The slot header is 8 bytes so that payloads are 8-byte aligned when `slot_size` is
//! a multiple of 8 (required), letting receivers read u64 fields in place.
//!
//! Peers are other processes that may crash or be buggy: everything read from the
//! shared memory (indices, lengths) is validated before it is used as an offset. A
//! stamp a broken producer never writes only stops its own packets.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// Bytes at the start of every slot: the u32 payload length and the u32 stamp.
pub const SLOT_HEADER: usize = 8;

/// Alignment the ring's base pointer needs (that of a cache-padded index).
pub const RING_ALIGN: usize = std::mem::align_of::<CachePadded<AtomicU64>>();

/// Size of one padded index.
const INDEX_BYTES: usize = std::mem::size_of::<CachePadded<AtomicU64>>();
// The producer's `seen_head` lives in the tail's padding.
const _: () = assert!(INDEX_BYTES >= 16);

/// Smallest slot: the header and 8 payload bytes.
pub const MIN_SLOT_SIZE: usize = SLOT_HEADER + 8;

/// Cache lines of a packet fetched ahead at once (its first line came with the stamp).
const PREFETCH_LINES: usize = 8;

/// Asks for the packet's lines after the first, up to [`PREFETCH_LINES`], before it is
/// read: the producer's core holds each modified, and a reader walking them in order
/// pays one cross-core miss after another (on 2x H200's host a 2-line packet took
/// 0.22 us longer to hop than a 1-line one); fetched together, the misses overlap.
#[inline(always)]
fn prefetch_rest(slot: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let lines = bytes.div_ceil(64).min(PREFETCH_LINES + 1);
        for i in 1..lines {
            // SAFETY: a prefetch never faults, and slot + 64 * i stays inside the slot
            // (i * 64 < bytes <= slot_size).
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(slot.add(64 * i).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slot, bytes);
}

/// Errors of the packet ring.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingError {
    /// The payload does not fit one slot; nothing was pushed.
    #[error("packet of {len} bytes exceeds the ring's maximum payload of {max} bytes per packet")]
    TooLarge { len: usize, max: usize },
    /// A slot claimed a length larger than a slot can hold: the shared memory was
    /// overwritten or the peer is broken. The slot was skipped (released) so that the
    /// ring keeps flowing, and the packet is lost: the caller should fail the job.
    #[error(
        "corrupt packet in ring slot #{index}: length {len} exceeds the maximum payload {max}; the packet was skipped"
    )]
    CorruptLength { index: u64, len: u32, max: usize },
    /// The indices are impossible (`tail - head > slots`): the ring is unusable.
    #[error("corrupt ring indices: head {head}, tail {tail}, capacity {slots} (shared memory overwritten?)")]
    CorruptIndices { head: u64, tail: u64, slots: usize },
    /// `slots`/`slot_size` cannot make a ring.
    #[error("invalid ring geometry ({slots} slots of {slot_size} bytes): {reason}")]
    Geometry { slots: usize, slot_size: usize, reason: &'static str },
}

/// A view of a packet ring living in (shared) memory. Cheap to copy.
///
/// Exactly one producer and one consumer may use a ring at a time (across all views
/// and processes): see [`PacketRing::attach`].
#[derive(Debug, Clone, Copy)]
pub struct PacketRing {
    head: *const AtomicU64,
    tail: *const AtomicU64,
    /// The producer's copy of the last `head` it read, next to `tail` in its own line.
    seen_head: *const AtomicU64,
    slots_base: *mut u8,
    slots: usize,
    slot_size: usize,
}

// SAFETY: the view only holds pointers into memory that outlives it (attach's contract)
// and is accessed through atomics and the SPSC protocol, not thread-affine state. It is
// deliberately not Sync: a role (producer or consumer) belongs to one thread at a time.
unsafe impl Send for PacketRing {}

impl PacketRing {
    /// Checks that `slots` slots of `slot_size` bytes make a valid ring.
    pub fn check_geometry(slots: usize, slot_size: usize) -> Result<(), RingError> {
        let bad = |reason| Err(RingError::Geometry { slots, slot_size, reason });
        if slots == 0 || !slots.is_power_of_two() {
            return bad("slots must be a power of two");
        }
        if slot_size < MIN_SLOT_SIZE {
            return bad("slot_size must be at least 16 bytes");
        }
        if slot_size & 7 != 0 {
            return bad("slot_size must be a multiple of 8");
        }
        if slot_size - SLOT_HEADER > u32::MAX as usize {
            return bad("slot_size must leave a payload that fits a u32 length");
        }
        if slots.checked_mul(slot_size).and_then(|b| b.checked_add(2 * INDEX_BYTES)).is_none() {
            return bad("ring size overflows usize");
        }
        Ok(())
    }

    /// Bytes a ring of `slots` slots of `slot_size` bytes occupies.
    ///
    /// # Panics
    /// If the geometry is invalid (see [`PacketRing::check_geometry`]).
    pub fn bytes_needed(slots: usize, slot_size: usize) -> usize {
        if let Err(e) = Self::check_geometry(slots, slot_size) {
            panic!("{e}");
        }
        2 * INDEX_BYTES + slots * slot_size
    }

    /// Initializes an empty ring at `ptr` by zeroing all of it.
    ///
    /// (Fresh shared memory from `ftruncate` already reads as zeros, which is exactly this
    /// state, so the job segment does not need to call this.)
    ///
    /// # Safety
    /// `ptr` must be valid for writes of [`PacketRing::bytes_needed`] bytes, aligned to
    /// [`RING_ALIGN`], and no one may use the ring during the call.
    ///
    /// # Panics
    /// If the geometry is invalid or `ptr` is misaligned.
    pub unsafe fn init(ptr: *mut u8, slots: usize, slot_size: usize) {
        let n = Self::bytes_needed(slots, slot_size);
        assert_eq!(ptr as usize % RING_ALIGN, 0, "ring base must be {RING_ALIGN}-byte aligned");
        // SAFETY: the caller guarantees n writable bytes at ptr and exclusive access.
        unsafe { std::ptr::write_bytes(ptr, 0, n) };
    }

    /// A view of the ring at `ptr` (initialized by [`PacketRing::init`] or zeroed memory).
    ///
    /// # Safety
    /// - `ptr` must be valid for reads and writes of [`PacketRing::bytes_needed`] bytes,
    ///   aligned to [`RING_ALIGN`], for as long as any copy of the view is used;
    /// - every process and thread sharing the ring must use the same geometry;
    /// - at any time at most one thread pushes and at most one thread pops (over all
    ///   views and processes). The job segment's convention is that only rank `from`
    ///   pushes to ring `(from, to)` and only rank `to` pops from it.
    ///
    /// # Panics
    /// If the geometry is invalid or `ptr` is misaligned.
    pub unsafe fn attach(ptr: *mut u8, slots: usize, slot_size: usize) -> PacketRing {
        let _ = Self::bytes_needed(slots, slot_size);
        assert_eq!(ptr as usize % RING_ALIGN, 0, "ring base must be {RING_ALIGN}-byte aligned");
        // SAFETY: in bounds of the bytes_needed bytes at ptr (caller's contract).
        unsafe {
            let head: *const CachePadded<AtomicU64> = ptr.cast();
            let tail: *const CachePadded<AtomicU64> = ptr.add(INDEX_BYTES).cast();
            PacketRing {
                head: &**head,
                tail: &**tail,
                // Inside the tail's padding (at least 64 bytes), so on the producer's line.
                seen_head: ptr.add(INDEX_BYTES + 8).cast(),
                slots_base: ptr.add(2 * INDEX_BYTES),
                slots,
                slot_size,
            }
        }
    }

    /// Largest payload one packet can carry.
    pub fn max_payload(&self) -> usize {
        self.slot_size - SLOT_HEADER
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.slots
    }

    /// Bytes per slot (header included).
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    fn head(&self) -> &AtomicU64 {
        // SAFETY: valid for the view's lifetime (attach's contract).
        unsafe { &*self.head }
    }

    fn tail(&self) -> &AtomicU64 {
        // SAFETY: valid for the view's lifetime (attach's contract).
        unsafe { &*self.tail }
    }

    fn seen_head(&self) -> &AtomicU64 {
        // SAFETY: valid for the view's lifetime (attach's contract); 8-aligned.
        unsafe { &*self.seen_head }
    }

    /// The publication stamp in the header of the slot at `slot`.
    fn stamp(slot: *mut u8) -> &'static AtomicU32 {
        // SAFETY: every slot starts with an 8-aligned 8-byte header whose second u32 is
        // the stamp; the ring's memory outlives every view (attach's contract).
        unsafe { &*slot.add(4).cast::<AtomicU32>() }
    }

    /// Start of the slot that index `i` maps to.
    fn slot(&self, i: u64) -> *mut u8 {
        let idx = (i as usize) & (self.slots - 1);
        // SAFETY: idx < slots, so the slot is inside the ring.
        unsafe { self.slots_base.add(idx * self.slot_size) }
    }

    /// Pushes `payload` as one packet. `Ok(false)` if the ring is full: backpressure,
    /// the caller keeps the packet and retries later.
    pub fn try_push(&self, payload: &[u8]) -> Result<bool, RingError> {
        self.try_push_with(payload.len(), |dst| dst.copy_from_slice(payload))
    }

    /// Pushes a packet of `len` bytes that `fill` writes in place into the slot (no
    /// intermediate copy). `fill` is called only if there is room; `Ok(false)` if full.
    /// If `fill` panics nothing is published.
    pub fn try_push_with(&self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<bool, RingError> {
        self.try_push_upto(len, |slot| {
            fill(slot);
            len
        })
    }

    /// Pushes a packet of at most `max_len` bytes that `fill` writes in place and whose
    /// length it returns: for encoders that learn the length by encoding.
    ///
    /// # Panics
    /// If `fill` returns more than `max_len` (nothing is published then).
    pub fn try_push_upto(&self, max_len: usize, fill: impl FnOnce(&mut [u8]) -> usize) -> Result<bool, RingError> {
        let (max, len) = (self.max_payload(), max_len);
        if len > max {
            return Err(RingError::TooLarge { len, max });
        }
        // Relaxed: we are the only writer of tail and seen_head, so we read our own stores.
        let tail = self.tail().load(Ordering::Relaxed);
        let seen = self.seen_head().load(Ordering::Relaxed);
        if tail.wrapping_sub(seen) >= self.slots as u64 {
            // Full as far as we last knew: look at the consumer's progress (a miss on its
            // line, paid once per ring's worth of packets at most).
            // Acquire: pairs with the consumer's Release of head, so its reads of the slots
            // it freed are done before we overwrite them (a head read earlier stays valid:
            // head only grows).
            let head = self.head().load(Ordering::Acquire);
            let used = tail.wrapping_sub(head);
            if used > self.slots as u64 {
                return Err(RingError::CorruptIndices { head, tail, slots: self.slots });
            }
            self.seen_head().store(head, Ordering::Relaxed);
            if used == self.slots as u64 {
                return Ok(false);
            }
        }
        let slot = self.slot(tail);
        // SAFETY: the slot is ours until we stamp it (the consumer reads only stamped
        // slots), and slot_size = SLOT_HEADER + max >= SLOT_HEADER + len bytes.
        unsafe {
            let written = fill(std::slice::from_raw_parts_mut(slot.add(SLOT_HEADER), len));
            assert!(written <= len, "ring fill wrote {written} bytes into {len}");
            slot.cast::<u32>().write(written as u32);
        }
        // Release: publishes the slot's length and payload before the consumer can see
        // the stamp. The stamp differs from the slot's previous one (index - slots + 1)
        // and from zeroed memory for every index.
        Self::stamp(slot).store(tail.wrapping_add(1) as u32, Ordering::Release);
        // Relaxed: tail is only read for len()/is_empty() snapshots, never to read a slot.
        self.tail().store(tail.wrapping_add(1), Ordering::Relaxed);
        Ok(true)
    }

    /// Pops the oldest packet, handing its payload in place to `f`; the slot is released
    /// after `f` returns. `Ok(None)` if the ring is empty.
    ///
    /// A slot whose length is impossible is skipped (released) and reported as
    /// [`RingError::CorruptLength`]. If `f` panics the slot is not released and the
    /// packet is seen again by the next pop.
    pub fn try_pop<R>(&self, f: impl FnOnce(&[u8]) -> R) -> Result<Option<R>, RingError> {
        // Relaxed: we are the only writer of head, so we read our own last store.
        let head = self.head().load(Ordering::Relaxed);
        let slot = self.slot(head);
        // Acquire: pairs with the producer's Release of the stamp, so the slot's contents
        // are visible before we read them.
        if Self::stamp(slot).load(Ordering::Acquire) != head.wrapping_add(1) as u32 {
            return Ok(None);
        }
        let max = self.max_payload();
        // SAFETY: the slot holds a published packet that the producer does not touch
        // until we advance head; the length is validated before it bounds a read.
        let out = unsafe {
            let len = slot.cast::<u32>().read();
            if len as usize > max {
                // Release: hand the slot back even though it was garbage, so the ring
                // keeps flowing.
                self.head().store(head.wrapping_add(1), Ordering::Release);
                return Err(RingError::CorruptLength { index: head, len, max });
            }
            prefetch_rest(slot, SLOT_HEADER + len as usize);
            f(std::slice::from_raw_parts(slot.add(SLOT_HEADER), len as usize))
        };
        // Release: our reads of the slot are done before the producer can see it free and
        // overwrite it.
        self.head().store(head.wrapping_add(1), Ordering::Release);
        Ok(Some(out))
    }

    /// True if no packet is waiting. Exact for the consumer; a hint for anyone else.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Packets waiting (a snapshot; clamped to the capacity if the indices are corrupt).
    pub fn len(&self) -> usize {
        // Acquire on both: a consistent-enough snapshot. tail is stored after the stamp,
        // so the consumer may already have popped a packet whose tail is not visible yet:
        // a head ahead of tail reads as empty.
        let head = self.head().load(Ordering::Acquire);
        let tail = self.tail().load(Ordering::Acquire);
        if head > tail {
            return 0;
        }
        (tail - head).min(self.slots as u64) as usize
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::alloc::{alloc_zeroed, dealloc, Layout};

    /// Heap memory aligned for a ring, standing in for shared memory.
    pub(crate) struct Buf {
        ptr: *mut u8,
        layout: Layout,
    }
    // SAFETY: plain heap memory; the tests share it between threads through the ring.
    unsafe impl Send for Buf {}
    // SAFETY: as for Send: `&Buf` hands out the pointer only, and the ring synchronises
    // what the threads write through it.
    unsafe impl Sync for Buf {}
    impl Buf {
        pub(crate) fn new(len: usize) -> Buf {
            let layout = Layout::from_size_align(len, RING_ALIGN.max(64)).unwrap();
            // SAFETY: non-zero size.
            let ptr = unsafe { alloc_zeroed(layout) };
            assert!(!ptr.is_null());
            Buf { ptr, layout }
        }
    }
    impl Drop for Buf {
        fn drop(&mut self) {
            // SAFETY: allocated with this layout.
            unsafe { dealloc(self.ptr, self.layout) }
        }
    }

    fn ring(buf: &Buf, slots: usize, slot_size: usize) -> PacketRing {
        // SAFETY: buf is big enough, aligned, and outlives the views in each test.
        unsafe {
            PacketRing::init(buf.ptr, slots, slot_size);
            PacketRing::attach(buf.ptr, slots, slot_size)
        }
    }

    #[test]
    fn geometry() {
        assert!(PacketRing::check_geometry(3, 64).is_err());
        assert!(PacketRing::check_geometry(0, 64).is_err());
        assert!(PacketRing::check_geometry(4, 12).is_err());
        assert!(PacketRing::check_geometry(4, 68).is_err());
        assert!(PacketRing::check_geometry(4, 64).is_ok());
        assert_eq!(PacketRing::bytes_needed(4, 64), 2 * INDEX_BYTES + 256);
    }

    #[test]
    fn push_upto_publishes_the_length_the_fill_wrote() {
        let buf = Buf::new(PacketRing::bytes_needed(4, 32));
        let r = ring(&buf, 4, 32);
        assert_eq!(
            r.try_push_upto(24, |d| {
                d[..5].copy_from_slice(b"short");
                5
            }),
            Ok(true)
        );
        assert_eq!(r.try_push_upto(25, |_| 0), Err(RingError::TooLarge { len: 25, max: 24 }));
        let over = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.try_push_upto(8, |_| 9)));
        assert!(over.is_err(), "a fill claiming more than it was given panics");
        assert_eq!(r.try_pop(|p| p.to_vec()), Ok(Some(b"short".to_vec())));
        assert_eq!(r.try_pop(|p| p.to_vec()), Ok(None), "the overlong fill published nothing");
    }

    #[test]
    fn fifo_full_empty() {
        let buf = Buf::new(PacketRing::bytes_needed(4, 32));
        let r = ring(&buf, 4, 32);
        assert_eq!(r.max_payload(), 24);
        assert!(r.is_empty());
        assert_eq!(r.try_pop(|p| p.to_vec()), Ok(None));
        for i in 0..4u8 {
            assert_eq!(r.try_push(&vec![i; i as usize + 1]), Ok(true));
        }
        assert_eq!(r.len(), 4);
        assert_eq!(r.try_push(b"x"), Ok(false), "full: backpressure");
        assert_eq!(r.try_push(&[0; 25]), Err(RingError::TooLarge { len: 25, max: 24 }));
        assert_eq!(r.try_pop(|p| p.to_vec()), Ok(Some(vec![0])));
        assert_eq!(r.try_push_with(24, |d| d.fill(9)), Ok(true));
        for i in 1..4u8 {
            assert_eq!(r.try_pop(|p| p.to_vec()), Ok(Some(vec![i; i as usize + 1])));
        }
        assert_eq!(r.try_pop(|p| p.to_vec()), Ok(Some(vec![9; 24])));
        assert!(r.is_empty());
        assert_eq!(r.try_push(b""), Ok(true), "empty packets are packets");
        assert_eq!(r.try_pop(|p| p.len()), Ok(Some(0)));
        assert_eq!(r.try_pop(|p| p.len()), Ok(None));
    }

    #[test]
    fn payload_is_8_aligned() {
        let buf = Buf::new(PacketRing::bytes_needed(2, 24));
        let r = ring(&buf, 2, 24);
        for _ in 0..3 {
            r.try_push(&[1; 16]).unwrap();
            r.try_pop(|p| assert_eq!(p.as_ptr() as usize % 8, 0)).unwrap().unwrap();
        }
    }

    #[test]
    fn corrupt_length_and_indices() {
        let buf = Buf::new(PacketRing::bytes_needed(4, 32));
        let r = ring(&buf, 4, 32);
        r.try_push(b"good").unwrap();
        r.try_push(b"next").unwrap();
        // Scribble an impossible length over the first packet.
        // SAFETY: first slot of the ring, inside buf.
        unsafe { buf.ptr.add(2 * INDEX_BYTES).cast::<u32>().write(1_000_000) };
        assert_eq!(r.try_pop(|_| ()), Err(RingError::CorruptLength { index: 0, len: 1_000_000, max: 24 }));
        // The bad slot was skipped; the next packet is intact.
        assert_eq!(r.try_pop(|p| p.to_vec()), Ok(Some(b"next".to_vec())));
        assert_eq!(r.try_pop(|_| ()), Ok(None));
        // A slot stamped for another round is not a packet.
        r.try_push(b"late").unwrap();
        // SAFETY: the stamp of slot 2 (index 2), inside buf.
        let stamp = unsafe { &*buf.ptr.add(2 * INDEX_BYTES + 2 * 32 + 4).cast::<AtomicU32>() };
        stamp.store(7, Ordering::Relaxed);
        assert_eq!(r.try_pop(|_| ()), Ok(None));
        stamp.store(3, Ordering::Relaxed);
        assert_eq!(r.try_pop(|p| p.to_vec()), Ok(Some(b"late".to_vec())));
        // Impossible indices: head far ahead of tail, seen when the producer looks.
        // SAFETY: the head index and the producer's copy, inside buf.
        unsafe {
            (*buf.ptr.cast::<AtomicU64>()).store(100, Ordering::Relaxed);
            (*buf.ptr.add(INDEX_BYTES + 8).cast::<AtomicU64>()).store(0, Ordering::Relaxed);
        }
        for _ in 0..4 {
            if r.try_push(b"x") != Ok(true) {
                break;
            }
        }
        assert!(matches!(r.try_push(b"x"), Err(RingError::CorruptIndices { .. })));
    }

    #[test]
    fn two_thread_stress() {
        const PACKETS: u64 = 1_000_000;
        const SLOTS: usize = 64;
        const SLOT: usize = 64;
        let buf = Buf::new(PacketRing::bytes_needed(SLOTS, SLOT));
        let r = ring(&buf, SLOTS, SLOT);
        let max = r.max_payload();
        // Length varies with the sequence number, from 8 (the seq itself) to max; the
        // payload after the seq is a pattern derived from it.
        let len_of = |seq: u64| 8 + (seq as usize * 7) % (max - 7);
        std::thread::scope(|s| {
            s.spawn(move || {
                let mut seq = 0u64;
                let mut spins = 0u32;
                while seq < PACKETS {
                    let len = len_of(seq);
                    let pushed = r
                        .try_push_with(len, |d| {
                            d[..8].copy_from_slice(&seq.to_le_bytes());
                            for (i, b) in d[8..].iter_mut().enumerate() {
                                *b = (seq as u8).wrapping_add(i as u8);
                            }
                        })
                        .unwrap();
                    if pushed {
                        seq += 1;
                        spins = 0;
                    } else {
                        spins += 1;
                        if spins > 64 {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                }
            });
            s.spawn(move || {
                let mut expect = 0u64;
                let mut spins = 0u32;
                while expect < PACKETS {
                    let got = r
                        .try_pop(|p| {
                            let seq = u64::from_le_bytes(p[..8].try_into().unwrap());
                            assert_eq!(seq, expect, "lost or reordered packet");
                            assert_eq!(p.len(), len_of(seq), "length of packet {seq}");
                            for (i, b) in p[8..].iter().enumerate() {
                                assert_eq!(*b, (seq as u8).wrapping_add(i as u8), "payload of packet {seq}");
                            }
                        })
                        .unwrap();
                    if got.is_some() {
                        expect += 1;
                        spins = 0;
                    } else {
                        spins += 1;
                        if spins > 64 {
                            std::thread::yield_now();
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                }
            });
        });
        assert!(r.is_empty());
    }
}
