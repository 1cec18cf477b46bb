//! Device memory a context released: a buffer that lies in it must be refused, not read.
//!
//! Once `mem_free_commit` (or the backend) released an allocation, the backend no longer
//! knows its addresses and classifies them as host memory; an `isend` from there would
//! then read unmapped memory (SIGSEGV in a copy). So the context remembers every range
//! `mem_alloc` handed out, and a buffer the backend calls host memory that lies in one of
//! them is checked: if its pages are no longer mapped readable it is refused; if they are
//! mapped again (the address space was reused for something else) it is accepted.
//! "Readable", not merely mapped: CUDA keeps its unified address range reserved as
//! `PROT_NONE` mappings after `cuMemFree`, so a freed device buffer still looks mapped to
//! `mincore` (on one H200 an isend from one crashed in the eager copy).

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// The ranges `mem_alloc` returned: start -> length.
#[derive(Debug, Default)]
pub(crate) struct PastAllocations {
    ranges: BTreeMap<usize, usize>,
}

impl PastAllocations {
    /// Remembers a new allocation (forgetting older ones it overlaps: their addresses are
    /// this allocation's now).
    pub(crate) fn note(&mut self, ptr: usize, len: usize) {
        let end = ptr.saturating_add(len.max(1));
        self.ranges.retain(|&s, &mut l| s.saturating_add(l.max(1)) <= ptr || end <= s);
        self.ranges.insert(ptr, len.max(1));
    }

    /// Checks a buffer the backend classified as host memory (see the module docs).
    pub(crate) fn check_host(&self, ptr: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let end = ptr + len;
        let hit = self.ranges.range(..end).next_back().map(|(&s, &l)| (s, l)).filter(|&(s, l)| ptr < s + l);
        let Some((start, size)) = hit else { return Ok(()) };
        if mapped(ptr, len) {
            return Ok(());
        }
        Err(Error::InvalidArgument(format!(
            "buffer {ptr:#x}+{len} lies in device memory that was released (allocation {start:#x}+{size} of mem_alloc, \
             freed by mem_free + mem_free_commit or finalize): it is no longer valid"
        )))
    }
}

/// Whether every byte of `[ptr, ptr+len)` lies in a readable mapping of this process, by
/// `/proc/self/maps` (read only for buffers in released device memory: a cold path).
fn mapped(ptr: usize, len: usize) -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        // Without procfs nothing can be told: accept, as before the check existed.
        return true;
    };
    readable_in(&maps, ptr, ptr + len)
}

/// Whether the mappings that `maps` (the format of `/proc/<pid>/maps`, ascending) lists
/// as readable cover `[start, end)` without a gap.
fn readable_in(maps: &str, start: usize, end: usize) -> bool {
    let mut covered = start;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let Some((lo, hi)) = range.split_once('-') else { continue };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) else { continue };
        if hi <= covered {
            continue;
        }
        if lo > covered || !perms.starts_with('r') {
            return false;
        }
        covered = hi;
        if covered >= end {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn released_ranges_are_refused_until_mapped_again() {
        let mut past = PastAllocations::default();
        // A range that is mapped (a live vector) is accepted.
        let v = vec![0u8; 3 * 4096];
        past.note(v.as_ptr() as usize, v.len());
        assert!(past.check_host(v.as_ptr() as usize + 10, 100).is_ok());
        // An unmapped range is refused: below mmap_min_addr (64 KiB) nothing is ever mapped.
        let p = 0x2000;
        past.note(p, 8192);
        let e = past.check_host(p + 4096, 64).unwrap_err();
        assert!(e.to_string().contains("released"), "{e}");
        assert!(past.check_host(p + 8192, 64).is_ok(), "past the allocation's end");
        assert!(past.check_host(p, 0).is_ok(), "zero bytes are never read");
        past.note(p + 4096, 64);
        assert_eq!(past.ranges.len(), 2, "an overlapping new allocation replaces the old");
    }

    /// A range mapped without read permission (how CUDA leaves a freed device buffer's
    /// addresses) is not readable, nor is one with a gap; one covered by readable
    /// mappings end to end is.
    #[test]
    fn only_readable_mappings_without_gaps_count() {
        let maps = "1000-3000 rw-p 00000000 00:00 0\n3000-5000 r--p 00000000 00:00 0\n\
                    5000-9000 ---p 00000000 00:00 0\na000-b000 rw-s 00000000 00:00 0 /dev/shm/x\n";
        assert!(readable_in(maps, 0x1000, 0x5000));
        assert!(readable_in(maps, 0x2fff, 0x3001));
        assert!(!readable_in(maps, 0x4000, 0x5001), "runs into a PROT_NONE mapping");
        assert!(!readable_in(maps, 0x6000, 0x6040), "inside a PROT_NONE mapping");
        assert!(!readable_in(maps, 0x9000, 0xa100), "a gap before the next mapping");
        assert!(readable_in(maps, 0xa000, 0xb000));
        assert!(!readable_in(maps, 0xb000, 0xb001), "past every mapping");
        // A PROT_NONE mapping of this process, as cuMemFree leaves one.
        // SAFETY: a fresh anonymous mapping, unmapped below; never accessed.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), 8192, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        let mut past = PastAllocations::default();
        past.note(p as usize, 8192);
        let e = past.check_host(p as usize + 100, 64).unwrap_err();
        assert!(e.to_string().contains("released"), "{e}");
        // SAFETY: the mapping made above.
        unsafe { libc::munmap(p, 8192) };
    }
}
