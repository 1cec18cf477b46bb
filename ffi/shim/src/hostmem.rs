//! What the shim knows about host messages, reached once per message: the host ranges
//! it has classified, the geometry of predefined datatypes, and the landing buffer of
//! small receives (`scratch`). With it a blocking host send or receive can go to the
//! MPI library without the shim's lock while the shim is idle (`ready`, `recv_ready`).
//!
//! Where this state lives depends on the thread level MPI provided. Under
//! MPI_THREAD_MULTIPLE each thread has its own (a thread-local; in a shared library every
//! access to one is a call to `__tls_get_addr`). Below it the program makes no two MPI
//! calls at once (SINGLE, FUNNELED: one thread; SERIALIZED: the program orders its
//! threads' calls), and this state is only used inside the shim's MPI functions, so one
//! shared copy serves every thread without a lock or a thread-local: `set_serialized`.
//!
//! The ranges are gpulmt's `HostRangeCache`, which remembers only ranges where no later
//! device allocation can take the address (below the program break, the main thread's
//! stack): the driver reuses freed `mmap`ed ranges for device memory, so a large host
//! buffer freed and a `cudaMalloc` after it share an address. The memo below inherits
//! that: it is set only for buffers the ranges hold. Memory the shim allocates itself
//! (`gpulmt_mpi_alloc`) makes every thread forget.

use std::cell::{Cell, RefCell};
use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

// Host ranges, per thread (or one for all below MPI_THREAD_MULTIPLE): gpulmt's own cache.
use gpulmt::memtype::HostRangeCache as HostRanges;
use mpi_sys::MPI_Datatype;

use crate::envelope::ENVELOPE_BYTES;
use crate::raw::{NamedTypes, NO_TYPE};
use crate::scratch;

/// Whether ranges are remembered at all (gpulmt's `GPULMT_MEMTYPE_CACHE`).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Bumped to make every thread forget its ranges.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// Whether the shared copy (`SHARED`) is used instead of the thread-local one.
static SERIALIZED: AtomicBool = AtomicBool::new(false);

/// The last buffer `ready` found contiguous host memory, with a predefined datatype
/// (whose geometry never changes): the same buffer, count and type in the same
/// generation give the same answer without a look at the types or ranges. A ping-pong
/// sends and receives with one buffer; the rest pay a few compares more.
#[derive(Clone, Copy)]
struct Memo {
    buf: usize,
    count: c_int,
    dt: MPI_Datatype,
    /// `u64::MAX` (no generation reaches it) until set.
    generation: u64,
    bytes: usize,
}

/// The ranges and the datatypes, for the slow path of `ready` and the shim's locked
/// paths.
struct HostThread {
    /// The generation `ranges` belong to.
    generation: u64,
    ranges: HostRanges,
    types: NamedTypes,
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

/// What one thread (or below MPI_THREAD_MULTIPLE, every thread) knows. The memo and the
/// landing buffer sit in cells of their own, so that the fast path copies them out
/// without taking the RefCell of the rest.
struct State {
    memo: Cell<Memo>,
    /// Not yet reserved, reserved, or not to be had.
    landing: Cell<Option<Option<*mut u8>>>,
    rest: RefCell<HostThread>,
}

impl State {
    const fn new() -> State {
        State {
            memo: Cell::new(Memo { buf: 0, count: 0, dt: NO_TYPE, generation: u64::MAX, bytes: 0 }),
            landing: Cell::new(None),
            rest: RefCell::new(HostThread { generation: 0, ranges: HostRanges::new(), types: NamedTypes::new() }),
        }
    }

    /// Bytes of `count` elements of `dt` at `buf` when contiguous host memory (or none).
    #[inline(always)]
    fn ready(&self, buf: usize, count: c_int, dt: MPI_Datatype) -> Option<usize> {
        self.memo(buf, count, dt).or_else(|| self.ready_slow(buf, count, dt))
    }

    /// `ready` when the memo knows the buffer.
    #[inline(always)]
    fn memo(&self, buf: usize, count: c_int, dt: MPI_Datatype) -> Option<usize> {
        let m = self.memo.get();
        // Acquire: pairs with `forget_all` (a memo of an older generation is not used).
        let known =
            m.buf == buf && m.count == count && m.dt == dt && m.generation == GENERATION.load(Ordering::Acquire);
        known.then_some(m.bytes)
    }

    /// `ready` past the memo, which it sets when it can.
    #[inline(never)]
    fn ready_slow(&self, buf: usize, count: c_int, dt: MPI_Datatype) -> Option<usize> {
        let mut t = self.rest.borrow_mut();
        let (named, geometry) = match t.types.known(dt, count) {
            Some(g) => (true, Ok(g)),
            None => (false, t.types.geometry(dt, count)),
        };
        let bytes = match geometry {
            Ok((bytes, true)) if bytes == 0 || t.is_host(buf, bytes) => bytes,
            _ => return None,
        };
        if named {
            // The generation the answer holds for (`is_host` may not have looked).
            t.current();
            self.memo.set(Memo { buf, count, dt, generation: t.generation, bytes });
        }
        Some(bytes)
    }

    #[inline(always)]
    fn recv_ready(&self, buf: usize, count: c_int, dt: MPI_Datatype) -> Option<(usize, Option<*mut u8>)> {
        let cap = self.ready(buf, count, dt)?;
        Some((cap, if cap < ENVELOPE_BYTES { self.landing() } else { None }))
    }

    #[inline(always)]
    fn landing(&self) -> Option<*mut u8> {
        match self.landing.get() {
            Some(l) => l,
            None => self.reserve(),
        }
    }

    #[cold]
    fn reserve(&self) -> Option<*mut u8> {
        let l = scratch::reserve();
        self.landing.set(Some(l));
        l
    }
}

thread_local! {
    // Built in a constant and without a destructor: an access is `__tls_get_addr` and
    // no lazy initialisation. (A thread's landing reservation stays mapped when the
    // thread ends: address space only, its few touched pages aside.)
    static THREAD: State = const { State::new() };
}

/// The copy every thread uses below MPI_THREAD_MULTIPLE.
struct Shared(State);

// SAFETY: `SHARED` is only used while `SERIALIZED` is set, which `set_serialized` does
// only when MPI provided less than MPI_THREAD_MULTIPLE, and only from the shim's MPI
// functions: the program makes no two MPI calls at once then, and the order it imposes
// on its threads' calls (MPI requires it) orders their uses of this copy. The RefCell
// still turns a use from inside another (a bug) into a panic instead of aliasing.
unsafe impl Sync for Shared {}

static SHARED: Shared = Shared(State::new());

/// Runs `f` on the state this thread uses.
#[inline]
fn with<R>(f: impl FnOnce(&State) -> R) -> R {
    // Relaxed: set before the shim becomes active (the store that activates it is a
    // Release, which every MPI function's Acquire load of it pairs with), never after.
    if SERIALIZED.load(Ordering::Relaxed) {
        f(&SHARED.0)
    } else {
        THREAD.with(f)
    }
}

/// Uses one shared copy of this state for every thread: only for a thread level below
/// MPI_THREAD_MULTIPLE, before the shim becomes active (see the module's comment).
pub fn set_serialized(on: bool) {
    SERIALIZED.store(on, Ordering::Relaxed);
}

/// Whether the program makes no two MPI calls at once (`set_serialized`).
#[inline]
pub fn serialized() -> bool {
    // Relaxed: as in `with`.
    SERIALIZED.load(Ordering::Relaxed)
}

/// Turns remembering ranges on or off (at the shim's start, from gpulmt's configuration).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
    forget_all();
}

/// Whether `[ptr, ptr + len)` is known to be host memory.
pub fn is_host(ptr: usize, len: usize) -> bool {
    with(|s| s.rest.borrow_mut().is_host(ptr, len))
}

/// Remembers `[ptr, ptr + len)` as host memory for this thread.
pub fn remember(ptr: usize, len: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        with(|s| {
            let mut t = s.rest.borrow_mut();
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
    with(|s| s.rest.borrow_mut().types.geometry(dt, count))
}

/// The bytes of `count` elements of `dt` at `buf` when they are contiguous and known to
/// be host memory (or none); `None` sends the caller to the shim's locked path. (As
/// `with`, spelt out: through `with` the closure was called from two places, and
/// compiled as a call.)
#[inline(always)]
pub fn ready(buf: usize, count: c_int, dt: MPI_Datatype) -> Option<usize> {
    if serialized() {
        SHARED.0.ready(buf, count, dt)
    } else {
        THREAD.with(|s| s.ready(buf, count, dt))
    }
}

/// As `ready`, for a receive: with the landing buffer when the receive is smaller than
/// an envelope (`None` in it where none can be had), in the same access.
#[inline(always)]
pub fn recv_ready(buf: usize, count: c_int, dt: MPI_Datatype) -> Option<(usize, Option<*mut u8>)> {
    if serialized() {
        SHARED.0.recv_ready(buf, count, dt)
    } else {
        THREAD.with(|s| s.recv_ready(buf, count, dt))
    }
}

/// `ready` when the memo knows the buffer, below MPI_THREAD_MULTIPLE: no call, where a
/// thread-local needs one (`None` does not say the buffer is not ready).
#[inline(always)]
pub fn memo_ready(buf: usize, count: c_int, dt: MPI_Datatype) -> Option<usize> {
    if serialized() {
        SHARED.0.memo(buf, count, dt)
    } else {
        None
    }
}

/// As `memo_ready`, for a receive smaller than an envelope whose landing buffer is
/// reserved: the receive's bytes and its landing buffer.
#[inline(always)]
pub fn memo_recv_ready(buf: usize, count: c_int, dt: MPI_Datatype) -> Option<(usize, *mut u8)> {
    if !serialized() {
        return None;
    }
    let cap = SHARED.0.memo(buf, count, dt).filter(|&cap| cap < ENVELOPE_BYTES)?;
    Some((cap, SHARED.0.landing.get()??))
}

/// This thread's landing buffer (`scratch`), reserved on first use; `None` where the
/// address space cannot be reserved.
pub fn landing() -> Option<*mut u8> {
    with(|s| s.landing())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory below the program break, which the ranges remember.
    static BUF: [u8; 4096] = [0; 4096];

    #[test]
    fn remembers_per_thread_and_forgets_everywhere() {
        enable(true);
        let p = BUF.as_ptr() as usize;
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
        enable(true);
        // A mapped buffer (a large Vec) may become device memory once freed: never kept.
        let big = vec![0u8; 64 << 20];
        remember(big.as_ptr() as usize, big.len());
        assert!(!is_host(big.as_ptr() as usize, 16), "an mmap'ed range was remembered");
        enable(false);
    }

    #[test]
    fn landing_buffer_is_reserved_once_per_thread() {
        let p = landing().expect("reserving address space");
        assert_eq!(landing(), Some(p));
        let other = std::thread::spawn(|| landing().map(|p| p as usize)).join().unwrap();
        assert_ne!(other, Some(p as usize), "each thread has its own");
    }
}
