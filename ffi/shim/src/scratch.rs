//! The landing buffer of blocking receives smaller than an envelope (`recv_direct`).
//!
//! Such a receive goes to the MPI library with a buffer of an envelope's size, so that
//! an envelope is never truncated, and the data is copied out: one receive instead of a
//! matched probe and a receive. The buffer must survive a message far longer than it:
//! Open MPI 4.1 writes a truncated message longer than its eager limit past the
//! receive's count, whole (measured: a 1 MiB message into a 100-byte receive wrote
//! 1 MiB). So the buffer is the start of a large reservation of address space whose
//! pages are committed only when written, and released again after such a write: an
//! erroneous program's truncated message costs memory for a moment and corrupts
//! nothing, where the plain library would overwrite the user's memory.

use std::ptr;

/// Address space reserved per thread. A message longer than this, truncated into a
/// receive smaller than an envelope, still overruns it (onto unmapped address space).
const RESERVE: usize = 1 << 34;

/// Pages below this stay committed after an overrun: the envelope-sized head reused by
/// every receive.
const HEAD: usize = 1 << 16;

/// Reserves a landing buffer (one per thread: `hostmem` keeps it); `None` where the
/// address space cannot be reserved (strict overcommit, a small address-space limit):
/// callers then take the slower path that needs no landing buffer.
pub fn reserve() -> Option<*mut u8> {
    // SAFETY: an anonymous private mapping at an address of the kernel's choice.
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            RESERVE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        tracing::debug!(error = %std::io::Error::last_os_error(), "no landing reservation; small receives take a matched probe");
        return None;
    }
    Some(p.cast())
}

/// After a receive into the landing buffer reported a message of `bytes` bytes: gives
/// back the pages a longer message may have written beyond the head.
#[inline]
pub fn release_overrun(base: *mut u8, bytes: usize) {
    if bytes > HEAD {
        release(base, bytes);
    }
}

#[cold]
fn release(base: *mut u8, bytes: usize) {
    let end = bytes.min(RESERVE);
    // SAFETY: [base + HEAD, base + end) lies inside this thread's reservation;
    // MADV_DONTNEED on a private anonymous mapping only drops its pages.
    unsafe { libc::madvise(base.add(HEAD).cast(), end - HEAD, libc::MADV_DONTNEED) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn landing_buffer_survives_a_long_overrun() {
        let p = reserve().expect("reserving address space");
        // What Open MPI does with a truncated long message: writes it whole.
        let long = 3 << 20;
        // SAFETY: inside the reservation.
        unsafe { ptr::write_bytes(p, 0x5a, long) };
        release_overrun(p, long);
        // SAFETY: as above; released pages read as zero again, the head keeps its bytes.
        unsafe {
            assert_eq!(*p, 0x5a);
            assert_eq!(*p.add(HEAD + 4096), 0);
        }
    }
}
