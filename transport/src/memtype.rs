//! A small cache of buffers known to be host memory, so the eager path skips the
//! driver's pointer query (`cuPointerGetAttributes`: 150-230 ns for host memory on an
//! H200 host, `lab/gpu/pointer_query.c`). Only host ranges are cached: a device buffer's
//! id changes when it is freed and reallocated, so device buffers are always queried.
//!
//! A host range is cached only where the driver can never map device memory later:
//! below the program break (the executable's image and the `brk` heap, where glibc
//! serves small allocations) and in the main thread's stack. Anywhere else (`mmap`ed
//! memory: large `malloc`s, thread stacks and arenas) the address may be freed and then
//! reused: on the CUDA 13 driver a `cudaMalloc` of 64 MiB took the very address range of
//! a 64 MiB `malloc` just freed, 20 times in 20 (`lab/gpu/pointer_query.c`), and a cache
//! that still called it host memory sent a device buffer as host memory (a crash in the
//! PMPI shim). `GPULMT_MEMTYPE_CACHE=0` turns the cache off altogether.

use std::sync::OnceLock;

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

    /// Remembers `[ptr, ptr+len)` as host memory, if it lies where the driver cannot map
    /// device memory later ([`stable_host_range`]); anything else is asked again next time.
    pub fn insert(&mut self, ptr: usize, len: usize) {
        if len == 0 || self.contains(ptr, len) || !stable_host_range(ptr, len) {
            return;
        }
        self.ranges[self.next] = (ptr, ptr.saturating_add(len));
        self.next = (self.next + 1) % WAYS;
        self.filled = (self.filled + 1).min(WAYS);
    }
}

/// Whether `[ptr, ptr+len)` lies where no later mapping can reuse the address: below the
/// program break (the executable's image and the `brk` heap: `mmap` places mappings from
/// the top of the address space down, far above it) or inside the main thread's stack
/// (the kernel keeps `mmap` below the stack's reserved size). Memory the program or
/// glibc `mmap`s may be unmapped and the address handed to the GPU driver.
pub fn stable_host_range(ptr: usize, len: usize) -> bool {
    let Some(end) = ptr.checked_add(len) else { return false };
    // SAFETY: sbrk(0) only reads the current break (it moves nothing).
    let brk = unsafe { libc::sbrk(0) } as usize;
    if end <= brk && brk != usize::MAX {
        return true;
    }
    let (lo, hi) = main_stack();
    lo <= ptr && end <= hi
}

/// The main thread's stack, `[lo, hi)`, as `/proc/self/maps` shows it at the first call
/// (empty where it cannot be read).
fn main_stack() -> (usize, usize) {
    static STACK: OnceLock<(usize, usize)> = OnceLock::new();
    *STACK.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        maps.lines()
            .find(|l| l.ends_with("[stack]"))
            .and_then(|l| {
                let (lo, hi) = l.split_whitespace().next()?.split_once('-')?;
                Some((usize::from_str_radix(lo, 16).ok()?, usize::from_str_radix(hi, 16).ok()?))
            })
            .unwrap_or((0, 0))
    })
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

    static IMAGE: [u8; 64] = [7; 64];

    #[test]
    fn only_ranges_no_mapping_can_reuse_are_remembered() {
        let mut c = HostRangeCache::new();
        // The executable's image lies below the break.
        let image = IMAGE.as_ptr() as usize;
        assert!(stable_host_range(image, IMAGE.len()));
        c.insert(image, IMAGE.len());
        assert!(c.contains(image, IMAGE.len()), "a static buffer is remembered");
        // Mapped memory may be unmapped and its address reused by the driver.
        let len = 1 << 20;
        // SAFETY: an anonymous private mapping, unmapped below; nothing else uses it.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        let m = map as usize;
        assert!(!stable_host_range(m, len));
        c.insert(m, len);
        assert!(!c.contains(m, 8), "an mmap'ed range is asked again every time");
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(map, len) };
        // So is a large Vec (glibc maps it), and a range that wraps.
        let v = vec![0u8; 64 << 20];
        assert!(!stable_host_range(v.as_ptr() as usize, v.len()));
        assert!(!stable_host_range(usize::MAX - 4, 8));
        // The main thread's stack is found (the test threads' own stacks are mapped).
        let (lo, hi) = main_stack();
        assert!(lo < hi, "no [stack] in /proc/self/maps");
    }
}
