//! The symmetric heap's allocator: first fit over offsets, deterministic, so that ranks
//! which make the same calls in the same order hand out the same offsets (OpenSHMEM's
//! symmetric heap: "the same offset in every rank's heap").
//!
//! It keeps no pointers, only offsets into a heap of `size` bytes whose first `start`
//! bytes are reserved (gpulmt's control area, see [`super::layout`]). Every allocation
//! is rounded up to [`ALIGN`] bytes and starts at a multiple of it, so device code may
//! use vector loads and stores on any allocation. The state is a pure function of the
//! call sequence: no clock, no address, no hash order.

use std::collections::BTreeMap;
use std::fmt;

/// Alignment and granularity of allocations: a GPU cache line's worth of 128-bit
/// vectors (and every atomic's natural alignment).
pub const ALIGN: u64 = 256;

/// Why an allocation or a free was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllocError {
    /// Zero bytes were asked for.
    Zero,
    /// No free range is large enough.
    Exhausted { bytes: u64, largest_free: u64, heap: u64 },
    /// The offset is not the start of a live allocation.
    NotAllocated { offset: u64 },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::Zero => write!(f, "a symmetric allocation of 0 bytes: ask for at least one byte"),
            AllocError::Exhausted { bytes, largest_free, heap } => write!(
                f,
                "the symmetric heap of {heap} bytes has no free range of {bytes} bytes (largest free: \
                 {largest_free}); raise GPULMT_SYM_HEAP or free symmetric memory first"
            ),
            AllocError::NotAllocated { offset } => write!(
                f,
                "heap offset {offset} is not the start of a live symmetric allocation (never allocated, or \
                 already freed)"
            ),
        }
    }
}

/// Offsets of a symmetric heap in use and free.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeapAllocator {
    size: u64,
    start: u64,
    /// Free ranges, offset -> length; adjacent ranges are always merged.
    free: BTreeMap<u64, u64>,
    /// Live allocations, offset -> rounded length.
    used: BTreeMap<u64, u64>,
}

impl HeapAllocator {
    /// A heap of `size` bytes whose first `start` bytes are never handed out. `start`
    /// is rounded up to [`ALIGN`]; a heap with no room left is valid (every allocation
    /// then fails).
    pub fn new(size: u64, start: u64) -> Self {
        let start = start.next_multiple_of(ALIGN).min(size);
        let end = size - size % ALIGN;
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        HeapAllocator { size, start, free, used: BTreeMap::new() }
    }

    /// Bytes of the heap, control area included.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The first offset an allocation may have (the end of the control area).
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Allocates `bytes` (rounded up to [`ALIGN`]) at the lowest offset that fits.
    pub fn alloc(&mut self, bytes: u64) -> Result<u64, AllocError> {
        if bytes == 0 {
            return Err(AllocError::Zero);
        }
        let exhausted = || AllocError::Exhausted { bytes, largest_free: self.largest_free(), heap: self.size };
        let len = bytes.checked_next_multiple_of(ALIGN).ok_or_else(exhausted)?;
        let (&at, &free_len) = self.free.iter().find(|(_, &l)| l >= len).ok_or_else(exhausted)?;
        self.free.remove(&at);
        if free_len > len {
            self.free.insert(at + len, free_len - len);
        }
        self.used.insert(at, len);
        Ok(at)
    }

    /// Frees the allocation that starts at `offset`; returns its rounded length.
    pub fn free(&mut self, offset: u64) -> Result<u64, AllocError> {
        let len = self.used.remove(&offset).ok_or(AllocError::NotAllocated { offset })?;
        let (mut at, mut end) = (offset, offset + len);
        if let Some((&prev, &prev_len)) = self.free.range(..offset).next_back() {
            if prev + prev_len == at {
                self.free.remove(&prev);
                at = prev;
            }
        }
        if let Some(next_len) = self.free.remove(&end) {
            end += next_len;
        }
        self.free.insert(at, end - at);
        Ok(len)
    }

    /// The live allocation (start, rounded length) that holds every byte of
    /// `[offset, offset + len)`, if one does (`len == 0` asks about `offset` alone).
    pub fn containing(&self, offset: u64, len: u64) -> Option<(u64, u64)> {
        let (&at, &alloc_len) = self.used.range(..=offset).next_back()?;
        let end = offset.checked_add(len.max(1))?;
        (end <= at + alloc_len).then_some((at, alloc_len))
    }

    /// Live allocations.
    pub fn live(&self) -> usize {
        self.used.len()
    }

    /// Bytes allocated now (rounded lengths).
    pub fn used_bytes(&self) -> u64 {
        self.used.values().sum()
    }

    /// The largest free range.
    pub fn largest_free(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_from_the_end_of_the_control_area_rounded_to_the_alignment() {
        let mut h = HeapAllocator::new(1 << 20, 1000);
        assert_eq!(h.start(), 1024);
        assert_eq!(h.alloc(1), Ok(1024));
        assert_eq!(h.alloc(257), Ok(1024 + 256));
        assert_eq!(h.alloc(256), Ok(1024 + 768));
        assert_eq!(h.containing(1024 + 256 + 300, 200), Some((1280, 512)));
        assert_eq!(h.containing(1024 + 256 + 500, 20), None, "runs past its allocation");
        assert_eq!(h.containing(10, 1), None, "the control area is no allocation");
        assert_eq!(h.used_bytes(), 256 + 512 + 256);
    }

    #[test]
    fn frees_merge_with_both_neighbours_and_the_space_is_reused_lowest_first() {
        let mut h = HeapAllocator::new(4096, 0);
        let a = h.alloc(1024).unwrap();
        let b = h.alloc(1024).unwrap();
        let c = h.alloc(1024).unwrap();
        assert_eq!((a, b, c), (0, 1024, 2048));
        assert_eq!(h.free(a), Ok(1024));
        assert_eq!(h.free(c), Ok(1024));
        assert_eq!(h.largest_free(), 2048, "c merged with the tail");
        assert_eq!(h.free(b), Ok(1024));
        assert_eq!(h.largest_free(), 4096, "everything merged back");
        assert_eq!(h.live(), 0);
        assert_eq!(h.alloc(4096), Ok(0));
    }

    #[test]
    fn refusals_say_why() {
        let mut h = HeapAllocator::new(4096, 1024);
        assert_eq!(h.alloc(0), Err(AllocError::Zero));
        assert_eq!(h.alloc(4096), Err(AllocError::Exhausted { bytes: 4096, largest_free: 3072, heap: 4096 }));
        assert!(matches!(h.alloc(u64::MAX), Err(AllocError::Exhausted { .. })));
        let a = h.alloc(8).unwrap();
        assert_eq!(h.free(a + 8), Err(AllocError::NotAllocated { offset: a + 8 }));
        assert_eq!(h.free(a), Ok(256));
        assert_eq!(h.free(a), Err(AllocError::NotAllocated { offset: a }), "double free");
        assert!(AllocError::Zero.to_string().contains("at least one byte"));
        let tiny = HeapAllocator::new(100, 4096);
        assert_eq!(tiny.largest_free(), 0);
    }

    /// Two heaps fed the same calls agree at every step (what makes the heap symmetric).
    #[test]
    fn same_calls_same_offsets() {
        let mut x = HeapAllocator::new(1 << 16, 512);
        let mut y = HeapAllocator::new(1 << 16, 512);
        let mut live = Vec::new();
        let mut seed = 7u64;
        for i in 0..400 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            if seed >> 62 == 0 && !live.is_empty() {
                let at = live.swap_remove((seed >> 20) as usize % live.len());
                assert_eq!(x.free(at), y.free(at), "call {i}");
            } else {
                let bytes = 1 + (seed >> 40) % 3000;
                let (a, b) = (x.alloc(bytes), y.alloc(bytes));
                assert_eq!(a, b, "call {i}");
                if let Ok(at) = a {
                    live.push(at);
                }
            }
        }
        assert_eq!(x, y);
    }
}
