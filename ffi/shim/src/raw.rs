//! Small helpers over mpi-sys: the MPI constants (which rsmpi exports as statics, as
//! Open MPI defines most of them as addresses), status access, datatype geometry.

use std::ffi::c_int;

use mpi_sys::*;

pub const SUCCESS: c_int = MPI_SUCCESS as c_int;
pub const ERR_TRUNCATE: c_int = MPI_ERR_TRUNCATE as c_int;
pub const ERR_OTHER: c_int = MPI_ERR_OTHER as c_int;
pub const ERR_INTERN: c_int = MPI_ERR_INTERN as c_int;
pub const ERR_TYPE: c_int = MPI_ERR_TYPE as c_int;
pub const ERR_COUNT: c_int = MPI_ERR_COUNT as c_int;

// SAFETY (all accessors below): rsmpi's constants are immutable statics defined in C
// from the MPI library's own constants; reading them has no precondition.
pub fn comm_world() -> MPI_Comm {
    unsafe { RSMPI_COMM_WORLD }
}
pub fn comm_null() -> MPI_Comm {
    unsafe { RSMPI_COMM_NULL }
}
pub fn group_null() -> MPI_Group {
    unsafe { RSMPI_GROUP_NULL }
}
pub fn byte() -> MPI_Datatype {
    unsafe { RSMPI_UINT8_T }
}
pub fn int32() -> MPI_Datatype {
    unsafe { RSMPI_INT32_T }
}
pub fn op_min() -> MPI_Op {
    unsafe { RSMPI_MIN }
}
pub fn any_source() -> c_int {
    unsafe { RSMPI_ANY_SOURCE }
}
pub fn any_tag() -> c_int {
    unsafe { RSMPI_ANY_TAG }
}
pub fn proc_null() -> c_int {
    unsafe { RSMPI_PROC_NULL }
}
pub fn undefined() -> c_int {
    unsafe { RSMPI_UNDEFINED }
}
pub fn comm_type_shared() -> c_int {
    unsafe { RSMPI_COMM_TYPE_SHARED }
}
pub fn info_null() -> MPI_Info {
    unsafe { RSMPI_INFO_NULL }
}
pub fn request_null() -> MPI_Request {
    unsafe { RSMPI_REQUEST_NULL }
}
pub fn message_null() -> MPI_Message {
    unsafe { RSMPI_MESSAGE_NULL }
}
pub fn status_ignore() -> *mut MPI_Status {
    unsafe { RSMPI_STATUS_IGNORE }
}

/// A zeroed status to be filled by the MPI library.
pub fn empty_status() -> MPI_Status {
    // SAFETY: MPI_Status is a plain C struct of integers.
    unsafe { std::mem::zeroed() }
}

/// Bytes of a received or probed message.
pub fn status_bytes(st: &MPI_Status) -> usize {
    let mut n: c_int = 0;
    // SAFETY: a status the library filled; `n` is a valid out-pointer.
    unsafe { PMPI_Get_count(st, byte(), &mut n) };
    if n < 0 {
        // MPI_UNDEFINED: more than INT_MAX bytes; the shim handles up to 2 GiB.
        return usize::MAX;
    }
    n as usize
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
    let (mut size, mut tlb, mut text, mut lb, mut ext): (c_int, MPI_Aint, MPI_Aint, MPI_Aint, MPI_Aint) = (0, 0, 0, 0, 0);
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
    let contiguous = count == 0 || size == 0 || (tlb == 0 && text == size as MPI_Aint && (count == 1 || ext == size as MPI_Aint));
    Ok((bytes, contiguous))
}

/// Datatype geometry without MPI calls for the predefined types a program uses. A
/// predefined (named) type is never freed, so its handle means the same type for the
/// whole run and its geometry is learned once; the three MPI calls of `type_geometry`
/// then leave the per-message path (they were a third of the shim's cost on an 8-byte
/// host ping-pong). User types are asked every time: a freed one's handle may come back
/// as another type.
#[derive(Default)]
pub struct NamedTypes {
    /// Handle, size, contiguous as one element, contiguous as several.
    known: Vec<(MPI_Datatype, usize, bool, bool)>,
}

/// Predefined types a program is likely to use at once; more are asked every time.
const NAMED_TYPES: usize = 16;

impl NamedTypes {
    /// As `type_geometry(dt, count)`.
    pub fn geometry(&mut self, dt: MPI_Datatype, count: c_int) -> Result<(usize, bool), c_int> {
        if count < 0 {
            return Err(ERR_COUNT);
        }
        if let Some(&(_, size, one, many)) = self.known.iter().find(|k| k.0 == dt) {
            let contiguous = count == 0 || size == 0 || (one && (count == 1 || many));
            return Ok((size * count as usize, contiguous));
        }
        let geometry = type_geometry(dt, count)?;
        if self.known.len() < NAMED_TYPES && is_named(dt) {
            let (size, one) = type_geometry(dt, 1)?;
            let many = type_geometry(dt, 2)?.1;
            self.known.push((dt, size, one, many));
        }
        Ok(geometry)
    }
}

/// Whether `dt` is a predefined type.
fn is_named(dt: MPI_Datatype) -> bool {
    let (mut ints, mut addrs, mut types, mut combiner): (c_int, c_int, c_int, c_int) = (0, 0, 0, -1);
    // SAFETY: out-pointers to locals; an invalid datatype makes the call fail.
    let rc = unsafe { PMPI_Type_get_envelope(dt, &mut ints, &mut addrs, &mut types, &mut combiner) };
    rc == SUCCESS && combiner == MPI_COMBINER_NAMED as c_int
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
