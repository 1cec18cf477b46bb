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

/// Whether `[ptr, ptr+len)` lies where no later mapping can reuse the address: between the
/// start of the executable's image and the program break (the image and the `brk` heap:
/// `mmap` places mappings from the top of the address space down, far above it) or inside
/// the main thread's stack (the kernel keeps `mmap` below the stack's reserved size).
/// Memory the program or glibc `mmap`s may be unmapped and the address handed to the GPU
/// driver. Below the image is not stable either: the CUDA driver keeps its unified address
/// range there (`cudaMallocHost` memory at 0x8e_e820_0000 below a PIE at 0x56..., on one
/// H200), and a pinned buffer freed there gave its address to the next `cudaMalloc`
/// (`bench/gpu/kinds.sh`: the shim then wrote that device memory with the CPU).
pub fn stable_host_range(ptr: usize, len: usize) -> bool {
    let Some(end) = ptr.checked_add(len) else { return false };
    // SAFETY: sbrk(0) only reads the current break (it moves nothing).
    let brk = unsafe { libc::sbrk(0) } as usize;
    if image_start() <= ptr && end <= brk && brk != usize::MAX {
        return true;
    }
    let (lo, hi) = main_stack();
    lo <= ptr && end <= hi
}

/// The lowest address of the executable's image, as `/proc/self/maps` shows it at the first
/// call (`usize::MAX`, so that nothing below the break counts, where it cannot be read).
fn image_start() -> usize {
    static START: OnceLock<usize> = OnceLock::new();
    *START.get_or_init(|| {
        let exe = std::fs::read_link("/proc/self/exe").ok();
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let exe = exe.as_ref().and_then(|p| p.to_str());
        maps.lines()
            .filter(|l| exe.is_some_and(|e| l.split_whitespace().nth(5) == Some(e)))
            .filter_map(|l| usize::from_str_radix(l.split('-').next()?, 16).ok())
            .min()
            .unwrap_or(usize::MAX)
    })
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
    fn only_the_image_the_heap_and_the_stack_are_stable() {
        let start = image_start();
        assert!(start != usize::MAX && start > 0, "the executable's image is in /proc/self/maps");
        // A small heap allocation comes from brk, above the image.
        let small = Box::new(7u64);
        assert!(stable_host_range(&*small as *const u64 as usize, 8));
        // (A test thread's stack is mmap'ed, not the main thread's: not asked here.)
        // Below the image: where the CUDA driver puts pinned and device memory alike.
        assert!(!stable_host_range(start - 4096, 8));
        assert!(!stable_host_range(0x8e_e820_0000.min(start - 4096), 8));
        // A large allocation is mmap'ed: not stable.
        let big = vec![0u8; 64 << 20];
        assert!(!stable_host_range(big.as_ptr() as usize, big.len()));
    }

    #[test]
    fn hits_inside_ranges_only() {
        // Addresses inside the executable's image: ranges the cache may remember.
        let b = image_start();
        let mut c = HostRangeCache::new();
        assert!(!c.contains(0, 0), "the empty slots match nothing");
        assert!(!c.contains(b + 100, 1));
        c.insert(b + 100, 50);
        assert!(c.contains(b + 100, 50));
        assert!(c.contains(b + 120, 10));
        assert!(!c.contains(b + 120, 31));
        assert!(!c.contains(b + 99, 2));
        for i in 0..WAYS {
            c.insert(b + 1000 * (i + 1), 10);
        }
        assert!(!c.contains(b + 100, 1), "oldest range replaced");
        c.clear();
        assert!(!c.contains(b + 1000, 10));
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
