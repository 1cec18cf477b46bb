//! A small cache of buffers known to be host memory, so the eager path skips the
//! driver's pointer query (`cuPointerGetAttributes` costs a good part of a host
//! message's latency). Only host ranges are cached: a device buffer's id changes
//! when it is freed and reallocated, so device buffers are always queried. Under
//! unified addressing device allocations come from the driver's own reserved
//! address range, so a host range never turns into device memory; set
//! `GPULMT_MEMTYPE_CACHE=0` for allocators that break that rule.

const WAYS: usize = 16;

/// Recently seen host ranges, replaced round-robin.
#[derive(Debug, Default)]
pub struct HostRangeCache {
    ranges: [(usize, usize); WAYS],
    next: usize,
    /// Ways in use: only they are scanned (a device buffer, which misses, is then checked
    /// against the few host ranges a job uses instead of all the ways).
    filled: usize,
}

impl HostRangeCache {
    /// An empty cache (`const`: usable in a static, as the PMPI shim's is).
    pub const fn new() -> HostRangeCache {
        HostRangeCache { ranges: [(0, 0); WAYS], next: 0, filled: 0 }
    }

    /// Whether `[ptr, ptr+len)` lies inside a range known to be host memory.
    #[inline]
    pub fn contains(&self, ptr: usize, len: usize) -> bool {
        let end = ptr.saturating_add(len);
        self.ranges[..self.filled].iter().any(|&(b, e)| b <= ptr && end <= e && b < e)
    }

    /// Forgets every range.
    pub fn clear(&mut self) {
        *self = Self::new();
    }

    /// Remembers `[ptr, ptr+len)` as host memory.
    pub fn insert(&mut self, ptr: usize, len: usize) {
        if len == 0 || self.contains(ptr, len) {
            return;
        }
        self.ranges[self.next] = (ptr, ptr.saturating_add(len));
        self.next = (self.next + 1) % WAYS;
        self.filled = (self.filled + 1).min(WAYS);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_inside_ranges_only() {
        let mut c = HostRangeCache::new();
        assert!(!c.contains(0, 0), "the empty slots match nothing");
        assert!(!c.contains(100, 1));
        c.insert(100, 50);
        assert!(c.contains(100, 50));
        assert!(c.contains(120, 10));
        assert!(!c.contains(120, 31));
        assert!(!c.contains(99, 2));
        for i in 0..WAYS {
            c.insert(1000 * (i + 1), 10);
        }
        assert!(!c.contains(100, 1), "oldest range replaced");
        c.clear();
        assert!(!c.contains(1000, 10));
    }
}
