//! What each thread knows about host messages, in one thread-local reached once per
//! message (in a shared library every thread-local access is a call): the host ranges
//! it has classified, the geometry of predefined datatypes, and the landing buffer of
//! small receives (`scratch`). With it a blocking host send or receive can go to the
//! MPI library without the shim's lock while the shim is idle (`ready`).
//!
//! The ranges are gpulmt's `HostRangeCache`, with its premise: a host range never
//! becomes device memory, as device allocations come from the driver's own address
//! range; memory the shim allocates itself (`gpulmt_mpi_alloc`) makes every thread
//! forget.

use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use gpulmt::memtype::HostRangeCache;
use mpi_sys::MPI_Datatype;

use crate::raw::NamedTypes;
use crate::scratch;

/// Whether ranges are remembered at all (gpulmt's `GPULMT_MEMTYPE_CACHE`).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Bumped to make every thread forget its ranges.
static GENERATION: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct HostThread {
    /// The generation `ranges` belong to.
    generation: u64,
    ranges: HostRangeCache,
    types: NamedTypes,
    /// This thread's landing buffer: not yet reserved, reserved, or not to be had.
    landing: Option<Option<*mut u8>>,
}

impl HostThread {
    fn is_host(&mut self, ptr: usize, len: usize) -> bool {
        // Relaxed: the flag and the generation guard this cache, not other data; a thread
        // that sees a stale generation only misses, and asks the slow path.
        if !ENABLED.load(Ordering::Relaxed) {
            return false;
        }
        self.current();
        self.ranges.contains(ptr, len)
    }

    /// Drops ranges of an older generation.
    fn current(&mut self) {
        // Acquire: pairs with `forget_all`, so the new mapping that made it forget is seen.
        let now = GENERATION.load(Ordering::Acquire);
        if self.generation != now {
            self.ranges.clear();
            self.generation = now;
        }
    }
}

thread_local! {
    static THREAD: RefCell<HostThread> = RefCell::new(HostThread::default());
}

/// Turns remembering ranges on or off (at the shim's start, from gpulmt's configuration).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
    forget_all();
}

/// Whether `[ptr, ptr + len)` is known to be host memory.
pub fn is_host(ptr: usize, len: usize) -> bool {
    THREAD.with(|t| t.borrow_mut().is_host(ptr, len))
}

/// Remembers `[ptr, ptr + len)` as host memory for this thread.
pub fn remember(ptr: usize, len: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        THREAD.with(|t| {
            let mut t = t.borrow_mut();
            t.current();
            t.ranges.insert(ptr, len);
        });
    }
}

/// Makes every thread forget (new device memory may have been mapped).
pub fn forget_all() {
    // Release: a thread that sees the new generation also sees what preceded it.
    GENERATION.fetch_add(1, Ordering::Release);
}

/// As `raw::type_geometry(dt, count)`, from this thread's knowledge of predefined types.
pub fn geometry(dt: MPI_Datatype, count: c_int) -> Result<(usize, bool), c_int> {
    THREAD.with(|t| t.borrow_mut().types.geometry(dt, count))
}

/// The bytes of `count` elements of `dt` at `buf` when they are contiguous and known to
/// be host memory (or none), in one thread-local access; `None` sends the caller to the
/// shim's locked path.
pub fn ready(buf: usize, count: c_int, dt: MPI_Datatype) -> Option<usize> {
    THREAD.with(|t| {
        let mut t = t.borrow_mut();
        match t.types.geometry(dt, count) {
            Ok((bytes, true)) if bytes == 0 || t.is_host(buf, bytes) => Some(bytes),
            _ => None,
        }
    })
}

/// This thread's landing buffer (`scratch`), reserved on first use; `None` where the
/// address space cannot be reserved.
pub fn landing() -> Option<*mut u8> {
    THREAD.with(|t| *t.borrow_mut().landing.get_or_insert_with(scratch::reserve))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_per_thread_and_forgets_everywhere() {
        enable(true);
        let buf = vec![0u8; 4096];
        let p = buf.as_ptr() as usize;
        assert!(!is_host(p, 16));
        remember(p, 4096);
        assert!(is_host(p + 100, 16));
        let elsewhere = std::thread::spawn(move || is_host(p, 16)).join().unwrap();
        assert!(!elsewhere, "another thread has not classified it");
        forget_all();
        assert!(!is_host(p, 16));
        remember(p, 4096);
        enable(false);
        assert!(!is_host(p, 16), "disabled");
    }

    #[test]
    fn landing_buffer_is_reserved_once_per_thread() {
        let p = landing().expect("reserving address space");
        assert_eq!(landing(), Some(p));
        let other = std::thread::spawn(|| landing().map(|p| p as usize)).join().unwrap();
        assert_ne!(other, Some(p as usize), "each thread has its own");
    }
}
