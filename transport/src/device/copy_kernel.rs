//! Copy kernels: small device-to-device copies moved by a GPU's own cores instead of its copy
//! engine, and how a copy is cut into their launch.
//!
//! On 2x H200 one copy-engine copy of 8 B and its completion cost 6.4-7 us, most of it the
//! engine's start-up; the 8 B `osu_latency` target is a microsecond above that. A kernel that
//! loads the bytes (over NVLink for a GET) and stores them starts sooner. It takes the
//! device's cores from the application's kernels, so the transport uses it only up to
//! `GPULMT_SM_COPY_MAX` bytes, and only when both ends are device memory the engine device
//! can address. The kernels (PTX, [`PTX`]) are compiled by the driver when first used.

use std::ffi::CStr;

/// The kernels' PTX, NUL-terminated for `cuModuleLoadData`.
pub(crate) const PTX: &str = concat!(include_str!("copy_kernel.ptx"), "\0");

/// Entry point for copies whose ends and length are multiples of 16 bytes.
pub(crate) const WIDE: &CStr = c"gpulmt_copy_wide";
/// Entry point for any other copy, a byte per thread.
pub(crate) const BYTES: &CStr = c"gpulmt_copy_bytes";

/// Threads per block.
pub(crate) const THREADS: u32 = 256;
/// Most blocks one launch asks for; the kernels loop over whatever is left.
pub(crate) const MAX_BLOCKS: u32 = 1024;

/// How one copy is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KernelLaunch {
    /// 16-byte words ([`WIDE`]) rather than bytes ([`BYTES`]).
    pub wide: bool,
    /// Elements (words or bytes) to copy: the kernel's `n`.
    pub elems: u64,
    pub blocks: u32,
}

impl KernelLaunch {
    /// The launch that copies `len` bytes from `src` to `dst` with one element per thread
    /// (up to [`MAX_BLOCKS`] blocks).
    pub(crate) fn for_copy(dst: usize, src: usize, len: usize) -> Self {
        let wide = (dst | src | len) % 16 == 0;
        let elems = if wide { len as u64 / 16 } else { len as u64 };
        let blocks = elems
            .div_ceil(u64::from(THREADS))
            .clamp(1, u64::from(MAX_BLOCKS)) as u32;
        KernelLaunch {
            wide,
            elems,
            blocks,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_copies_move_words_and_others_bytes() {
        let l = KernelLaunch::for_copy(0x1000, 0x2000, 4096);
        assert_eq!(
            l,
            KernelLaunch {
                wide: true,
                elems: 256,
                blocks: 1
            }
        );
        // Any one of the three off the 16-byte grain makes it bytes.
        for (dst, src, len) in [
            (0x1008, 0x2000, 4096),
            (0x1000, 0x2001, 4096),
            (0x1000, 0x2000, 4100),
        ] {
            let l = KernelLaunch::for_copy(dst, src, len);
            assert!(!l.wide);
            assert_eq!(l.elems, len as u64);
        }
        assert_eq!(
            KernelLaunch::for_copy(0x1000, 0x2000, 8),
            KernelLaunch {
                wide: false,
                elems: 8,
                blocks: 1
            }
        );
    }

    #[test]
    fn one_element_per_thread_up_to_the_block_cap() {
        assert_eq!(KernelLaunch::for_copy(0, 0, 16 * 256 + 16).blocks, 2);
        assert_eq!(KernelLaunch::for_copy(0, 0, 257).blocks, 2);
        assert_eq!(KernelLaunch::for_copy(0, 0, 1 << 30).blocks, MAX_BLOCKS);
        // A zero-length launch still names a valid grid.
        assert_eq!(KernelLaunch::for_copy(0, 0, 0).blocks, 1);
    }

    #[test]
    fn ptx_names_both_entries_and_ends_in_nul() {
        assert!(PTX.ends_with('\0'));
        for e in [WIDE, BYTES] {
            assert!(PTX.contains(&format!(".entry {}(", e.to_str().unwrap())));
        }
    }
}
