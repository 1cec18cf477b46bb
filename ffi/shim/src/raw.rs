//! Small helpers over mpi-sys: the MPI constants (which rsmpi exports as statics, as
//! Open MPI defines most of them as addresses), status access, datatype geometry.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use mpi_sys::*;

pub const SUCCESS: c_int = MPI_SUCCESS as c_int;
pub const ERR_TRUNCATE: c_int = MPI_ERR_TRUNCATE as c_int;
pub const ERR_OTHER: c_int = MPI_ERR_OTHER as c_int;
pub const ERR_INTERN: c_int = MPI_ERR_INTERN as c_int;
pub const ERR_COUNT: c_int = MPI_ERR_COUNT as c_int;

/// Defines `pub fn $name() -> $ty` reading rsmpi's static `$konst`.
macro_rules! mpi_constants {
    ($($name:ident: $ty:ty = $konst:ident;)*) => {$(
        #[doc = concat!("`", stringify!($konst), "`, as the MPI library defines it.")]
        pub fn $name() -> $ty {
            // SAFETY: rsmpi's constants (and csrc/mpi_consts.c's) are immutable statics,
            // initialized in C from the MPI library's own constants before any Rust code
            // runs; reading one has no precondition.
            unsafe { $konst }
        }
    )*};
}

mpi_constants! {
    comm_world: MPI_Comm = RSMPI_COMM_WORLD;
    comm_null: MPI_Comm = RSMPI_COMM_NULL;
    comm_self: MPI_Comm = RSMPI_COMM_SELF;
    group_null: MPI_Group = RSMPI_GROUP_NULL;
    byte: MPI_Datatype = RSMPI_UINT8_T;
    int32: MPI_Datatype = RSMPI_INT32_T;
    uint64: MPI_Datatype = RSMPI_UINT64_T;
    op_min: MPI_Op = RSMPI_MIN;
    op_max: MPI_Op = RSMPI_MAX;
    any_source: c_int = RSMPI_ANY_SOURCE;
    any_tag: c_int = RSMPI_ANY_TAG;
    proc_null: c_int = RSMPI_PROC_NULL;
    undefined: c_int = RSMPI_UNDEFINED;
    comm_type_shared: c_int = RSMPI_COMM_TYPE_SHARED;
    info_null: MPI_Info = RSMPI_INFO_NULL;
    request_null: MPI_Request = RSMPI_REQUEST_NULL;
    message_null: MPI_Message = RSMPI_MESSAGE_NULL;
    message_no_proc: MPI_Message = RSMPI_MESSAGE_NO_PROC;
    status_ignore: *mut MPI_Status = RSMPI_STATUS_IGNORE;
    in_place: *mut c_void = gpulmt_mpi_in_place;
    combiner_named: c_int = gpulmt_mpi_combiner_named;
    win_base: c_int = gpulmt_mpi_win_base;
    win_model: c_int = gpulmt_mpi_win_model;
}

extern "C" {
    /// `MPI_IN_PLACE`, from `csrc/mpi_consts.c` (build.rs): a pointer cast in mpi.h's
    /// macro, which bindgen does not translate (Open MPI: 1, MPICH: -1).
    static gpulmt_mpi_in_place: *mut c_void;
    /// `MPI_COMBINER_NAMED` (an enumerator of a named enum in MPICH's mpi.h).
    static gpulmt_mpi_combiner_named: c_int;
    /// The predefined window attributes `MPI_WIN_BASE` and `MPI_WIN_MODEL` (enumerators in
    /// Open MPI's mpi.h, macros in MPICH's), and the model `MPI_WIN_SEPARATE`, whose
    /// address `MPI_Win_get_attr` hands out.
    static gpulmt_mpi_win_base: c_int;
    static gpulmt_mpi_win_model: c_int;
    pub static gpulmt_mpi_win_separate: c_int;
}

/// A zeroed status to be filled by the MPI library.
pub fn empty_status() -> MPI_Status {
    // SAFETY: MPI_Status is a plain C struct of integers.
    unsafe { std::mem::zeroed() }
}

/// Where in an `MPI_Status` the MPI library keeps a message's byte count as one word, if
/// it does (Open MPI's `_ucount`): a byte offset, or `NO_COUNT_WORD` until
/// `find_count_word` found it.
static COUNT_WORD: AtomicUsize = AtomicUsize::new(NO_COUNT_WORD);
const NO_COUNT_WORD: usize = usize::MAX;

/// Bytes of a received or probed message (`usize::MAX` for more than `INT_MAX`, as
/// `MPI_Get_count` answers MPI_UNDEFINED then; the shim handles up to 2 GiB). Read from
/// the status itself where `find_count_word` found how: `PMPI_Get_count` was an eighth
/// of the shim's instructions on an 8-byte host ping-pong.
#[inline]
pub fn status_bytes(st: &MPI_Status) -> usize {
    // Relaxed: written once before the shim becomes active, whose Release/Acquire flag
    // orders it for every MPI function.
    let at = COUNT_WORD.load(Ordering::Relaxed);
    let n = if at != NO_COUNT_WORD {
        // SAFETY: find_count_word checked that a usize at `at` lies inside a status.
        unsafe { (st as *const MPI_Status).cast::<u8>().add(at).cast::<usize>().read_unaligned() }
    } else {
        let mut n: c_int = 0;
        // SAFETY: a status the library filled; `n` is a valid out-pointer.
        unsafe { PMPI_Get_count(st, byte(), &mut n) };
        if n < 0 {
            return usize::MAX;
        }
        n as usize
    };
    if n > c_int::MAX as usize {
        return usize::MAX;
    }
    n
}

/// Looks for the status word that holds the byte count (`status_bytes`): a word that
/// equals every count `PMPI_Status_set_elements_x` writes, small or beyond 32 bits,
/// that marking the status cancelled leaves alone, and that equals `PMPI_Get_count`
/// after a real receive. A library that keeps the count otherwise (MPICH splits it
/// over two ints, sharing one with the cancelled bit) fails a check, and
/// `status_bytes` keeps asking `PMPI_Get_count`. Call after MPI_Init, before the shim
/// is active.
pub fn find_count_word() {
    let word = std::mem::size_of::<usize>();
    let words = std::mem::size_of::<MPI_Status>() / word;
    let read = |st: &MPI_Status, w: usize| {
        // SAFETY: w < words: inside the status.
        unsafe { (st as *const MPI_Status).cast::<usize>().add(w).read_unaligned() }
    };
    let counts: [MPI_Count; 5] = [0, 1, 176, c_int::MAX as MPI_Count, 0x1_2345_6789];
    let fits = |w: usize| {
        counts.iter().all(|&n| {
            let mut st = empty_status();
            // SAFETY: a local status; MPI_BYTE; counts a status may hold.
            let set = unsafe { PMPI_Status_set_elements_x(&mut st, byte(), n) };
            let counted = set == SUCCESS && read(&st, w) == n as usize;
            // SAFETY: as above.
            let kept = unsafe { PMPI_Status_set_cancelled(&mut st, 1) } == SUCCESS && read(&st, w) == n as usize;
            counted && kept
        })
    };
    let Some(w) = (0..words).find(|&w| fits(w)) else {
        tracing::debug!("no byte-count word in MPI_Status: receives ask PMPI_Get_count");
        return;
    };
    // A real message: 3 bytes to this process, into room for 8.
    let (out, mut back) = ([1u8, 2, 3], [0u8; 8]);
    let mut st = empty_status();
    // SAFETY: local buffers of the given sizes; MPI_COMM_SELF's only rank is this one.
    let rc = unsafe {
        PMPI_Sendrecv(
            out.as_ptr().cast(),
            3,
            byte(),
            0,
            0,
            back.as_mut_ptr().cast(),
            8,
            byte(),
            0,
            0,
            RSMPI_COMM_SELF,
            &mut st,
        )
    };
    let mut n: c_int = -1;
    // SAFETY: the status just filled; a local out-pointer.
    unsafe { PMPI_Get_count(&st, byte(), &mut n) };
    if rc == SUCCESS && n == 3 && read(&st, w) == 3 {
        // Relaxed: see `status_bytes`.
        COUNT_WORD.store(w * word, Ordering::Relaxed);
    }
}

/// An MPI handle (`MPI_Request`, `MPI_Message`, `MPI_Win`: a pointer in Open MPI, an int
/// in MPICH) as a number, to key the shim's tables by.
pub fn handle_key<T: Copy>(h: T) -> u64 {
    const { assert!(std::mem::size_of::<T>() <= 8) };
    let mut k = 0u64;
    // SAFETY: a handle is plain data of at most 8 bytes (checked above), copied into the
    // low bytes of `k`.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&h as *const T).cast::<u8>(),
            (&mut k as *mut u64).cast::<u8>(),
            std::mem::size_of::<T>(),
        )
    };
    k
}

/// Whether a (source, tag) pair satisfies a receive's (source, tag), wildcards included.
pub fn matches(want_src: c_int, want_tag: c_int, src: c_int, tag: c_int) -> bool {
    (want_src == any_source() || want_src == src) && (want_tag == any_tag() || want_tag == tag)
}

/// Bytes of `count` elements of `dt`, and whether they lie contiguously from the
/// buffer's address (so gpulmt or a device copy can move them as one range).
pub fn type_geometry(dt: MPI_Datatype, count: c_int) -> Result<(usize, bool), c_int> {
    if count < 0 {
        return Err(ERR_COUNT);
    }
    let (mut size, mut tlb, mut text, mut lb, mut ext): (c_int, MPI_Aint, MPI_Aint, MPI_Aint, MPI_Aint) =
        (0, 0, 0, 0, 0);
    // SAFETY: out-pointers to locals; an invalid datatype makes the library fail.
    unsafe {
        let rc = PMPI_Type_size(dt, &mut size);
        if rc != SUCCESS {
            return Err(rc);
        }
        PMPI_Type_get_true_extent(dt, &mut tlb, &mut text);
        PMPI_Type_get_extent(dt, &mut lb, &mut ext);
    }
    let bytes = size as usize * count as usize;
    let contiguous =
        count == 0 || size == 0 || (tlb == 0 && text == size as MPI_Aint && (count == 1 || ext == size as MPI_Aint));
    Ok((bytes, contiguous))
}

/// A datatype handle of all zero bits, for slots that hold none yet (never compared:
/// they lie past what is filled in, or beside a generation no memo reaches).
// SAFETY: a handle is a pointer (Open MPI) or an integer (MPICH): zero bits are valid.
pub const NO_TYPE: MPI_Datatype = unsafe { std::mem::zeroed() };

/// Datatype geometry without MPI calls for the predefined types a program uses. A
/// predefined (named) type is never freed, so its handle means the same type for the
/// whole run and its geometry is learned once; the three MPI calls of `type_geometry`
/// then leave the per-message path (they were a third of the shim's cost on an 8-byte
/// host ping-pong). User types are asked every time: a freed one's handle may come back
/// as another type. A fixed array, so that it can be built in a constant (`hostmem`).
pub struct NamedTypes {
    /// Handle, size, contiguous as one element, contiguous as several.
    known: [(MPI_Datatype, usize, bool, bool); NAMED_TYPES],
    len: usize,
}

/// Predefined types a program is likely to use at once; more are asked every time.
const NAMED_TYPES: usize = 16;

impl NamedTypes {
    pub const fn new() -> NamedTypes {
        NamedTypes { known: [(NO_TYPE, 0, false, false); NAMED_TYPES], len: 0 }
    }

    /// As `type_geometry(dt, count)`.
    pub fn geometry(&mut self, dt: MPI_Datatype, count: c_int) -> Result<(usize, bool), c_int> {
        match self.known(dt, count) {
            Some(g) => Ok(g),
            None => self.learn(dt, count),
        }
    }

    /// `geometry` of a predefined type already learned (and a count that is valid).
    pub fn known(&self, dt: MPI_Datatype, count: c_int) -> Option<(usize, bool)> {
        if count < 0 {
            return None;
        }
        let &(_, size, one, many) = self.known[..self.len].iter().find(|k| k.0 == dt)?;
        let contiguous = count == 0 || size == 0 || (one && (count == 1 || many));
        Some((size * count as usize, contiguous))
    }

    /// `geometry` of a type not (yet) known, or of a negative count.
    #[cold]
    fn learn(&mut self, dt: MPI_Datatype, count: c_int) -> Result<(usize, bool), c_int> {
        let geometry = type_geometry(dt, count)?;
        if self.len < NAMED_TYPES && is_named(dt) {
            let (size, one) = type_geometry(dt, 1)?;
            let many = type_geometry(dt, 2)?.1;
            self.known[self.len] = (dt, size, one, many);
            self.len += 1;
        }
        Ok(geometry)
    }
}

/// Whether `dt` is a predefined type.
fn is_named(dt: MPI_Datatype) -> bool {
    let (mut ints, mut addrs, mut types, mut combiner): (c_int, c_int, c_int, c_int) = (0, 0, 0, -1);
    // SAFETY: out-pointers to locals; an invalid datatype makes the call fail.
    let rc = unsafe { PMPI_Type_get_envelope(dt, &mut ints, &mut addrs, &mut types, &mut combiner) };
    rc == SUCCESS && combiner == combiner_named()
}

/// Fills a user's status (unless it is MPI_STATUS_IGNORE) with what the shim knows:
/// source, tag, error, the count (as `bytes` MPI_BYTEs, so `MPI_Get_count` answers in
/// any datatype), and the cancelled flag.
///
/// # Safety
/// `st` is MPI_STATUS_IGNORE or valid for writes.
pub unsafe fn fill_status(st: *mut MPI_Status, source: c_int, tag: c_int, error: c_int, bytes: usize, cancelled: bool) {
    if st.is_null() || st == status_ignore() {
        return;
    }
    // SAFETY: the caller's contract.
    unsafe {
        (*st).MPI_SOURCE = source;
        (*st).MPI_TAG = tag;
        (*st).MPI_ERROR = error;
        PMPI_Status_set_elements(st, byte(), bytes.min(c_int::MAX as usize) as c_int);
        PMPI_Status_set_cancelled(st, c_int::from(cancelled));
    }
}
