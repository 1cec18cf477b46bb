//! Device memory a context released: a buffer that lies in it must be refused, not read.
//!
//! Once `mem_free_commit` (or the backend) released an allocation, the backend no longer
//! knows its addresses and classifies them as host memory; an `isend` from there would
//! then read unmapped memory (SIGSEGV in a copy). So the context remembers every range
//! `mem_alloc` handed out, and a buffer the backend calls host memory that lies in one of
//! them is checked: if its pages are no longer mapped it is refused; if they are mapped
//! again (the address space was reused for something else) it is accepted.

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

/// Whether every page of `[ptr, ptr+len)` is mapped in this process (`mincore` fails with
/// ENOMEM for a range with an unmapped page).
fn mapped(ptr: usize, len: usize) -> bool {
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
    let start = ptr / page * page;
    let pages = (ptr + len - start).div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only inspects the mapping of the range (never touches its memory)
    // and writes one byte per page into `vec`, which has one per page.
    unsafe { libc::mincore(start as *mut libc::c_void, pages * page, vec.as_mut_ptr()) == 0 }
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
}
