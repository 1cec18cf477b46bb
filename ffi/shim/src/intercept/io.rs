//! MPI-IO on device buffers: the library reads and writes files from host memory, so a
//! device buffer (any datatype: the span its elements cover) is staged around the call:
//! copied in for a write, copied back after a read. Blocking calls (`MPI_File_read`,
//! `MPI_File_write` and their `_at`, `_all`, `_at_all`, `_shared` and `_ordered` forms)
//! stage around the library's call, keeping the shim's transfers moving while it blocks
//! (the collective ones wait for other ranks); non-blocking ones (`MPI_File_iread` ...)
//! hand the program a request of the shim's that completes after the copy back.
//!
//! Refused with `MPI_ERR_UNSUPPORTED_OPERATION` naming the call: device buffers in the
//! split collectives (`MPI_File_read_all_begin` ...), whose buffer the `_end` call takes
//! again after the program has run other calls (host buffers go to the library).

use std::ffi::{c_int, c_void};

use mpi_sys::*;

use super::{active, with};
use crate::raw::*;
use crate::staging::{Role, Staged};
use crate::state::while_blocked;

/// Reports an error of a file operation to the file's handler, and returns it.
///
/// # Safety
/// `fh` is a valid file handle.
unsafe fn raise_file(fh: MPI_File, code: c_int) -> c_int {
    if code != SUCCESS {
        // SAFETY: the caller's file.
        unsafe { PMPI_File_call_errhandler(fh, code) };
    }
    code
}

/// The buffer of a file call staged when it is device memory (`None`: host memory, or
/// the shim is off); an error code naming `call` when staging fails.
fn stage(buf: *const c_void, count: c_int, dt: MPI_Datatype, role: Role, call: &str) -> Result<Option<Staged>, c_int> {
    if !active() || buf.is_null() || crate::hostmem::is_host(buf as usize, 1) {
        return Ok(None);
    }
    with(|s| s.stage_buffer(buf as usize, count, dt, role, call)).unwrap_or(Ok(None))
}

/// A blocking file call on a buffer of `role`: `pmpi` with the buffer, or with a staged
/// copy of a device one (copied back after a read).
///
/// # Safety
/// `fh` is valid; `buf` holds (or has room for) `count` elements of `dt`; `pmpi` is the
/// library's call with the caller's other arguments.
unsafe fn blocking(
    call: &'static str,
    fh: MPI_File,
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    role: Role,
    pmpi: impl FnOnce(*mut c_void) -> c_int,
) -> c_int {
    match stage(buf, count, dt, role, call) {
        Ok(None) => while_blocked(|| pmpi(buf)),
        // SAFETY: the caller's file.
        Err(code) => unsafe { raise_file(fh, code) },
        Ok(Some(staged)) => {
            let rc = while_blocked(|| pmpi(staged.pointer(0, buf)));
            if rc != SUCCESS || role == Role::In {
                return rc;
            }
            crate::staging::count_bytes(staged.bytes(false));
            match with(|s| staged.copy_out(s.ctx.backend()).map_err(|e| e.code(call))) {
                Some(Err(code)) => {
                    // SAFETY: the caller's file.
                    unsafe { raise_file(fh, code) }
                }
                _ => SUCCESS,
            }
        }
    }
}

/// A non-blocking file call: `pmpi` with the buffer and the caller's request, or with a
/// staged copy and a request of the shim's that completes after the copy back.
///
/// # Safety
/// As [`blocking`]; the buffer stays valid until the request completes, and `request`
/// is valid for writes.
#[allow(clippy::too_many_arguments)]
unsafe fn nonblocking(
    call: &'static str,
    fh: MPI_File,
    buf: *mut c_void,
    count: c_int,
    dt: MPI_Datatype,
    role: Role,
    request: *mut MPI_Request,
    pmpi: impl FnOnce(*mut c_void, *mut MPI_Request) -> c_int,
) -> c_int {
    match stage(buf, count, dt, role, call) {
        Ok(None) => pmpi(buf, request),
        // SAFETY: the caller's file.
        Err(code) => unsafe { raise_file(fh, code) },
        Ok(Some(staged)) => {
            let mut inner = request_null();
            let rc = pmpi(staged.pointer(0, buf), &mut inner);
            if rc != SUCCESS {
                return rc;
            }
            // A file request belongs to no communicator: a failure to copy back goes to
            // MPI_COMM_SELF's handler.
            match with(|s| s.track_staged(inner, staged, comm_self(), call)) {
                Some(handle) => {
                    // SAFETY: the caller's out-pointer.
                    unsafe { *request = handle };
                    SUCCESS
                }
                // SAFETY: the caller's file.
                None => unsafe { raise_file(fh, ERR_INTERN) },
            }
        }
    }
}

/// Defines blocking file calls: `name => pmpi(extra args) role buffer-type`.
macro_rules! file_blocking {
    ($($name:ident => $pmpi:ident($($pre:ident: $pty:ty),*) $role:ident $bty:ty;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: a device buffer staged around the library's call.")]
        ///
        /// # Safety
        /// As the MPI function: the file handle and datatype are valid, the buffer holds (or
        /// has room for) `count` elements, and `status` is `MPI_STATUS_IGNORE` or valid
        /// for writes.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fh: MPI_File,
            $($pre: $pty,)*
            buf: $bty,
            count: c_int,
            dt: MPI_Datatype,
            status: *mut MPI_Status,
        ) -> c_int {
            // SAFETY: the caller's arguments, the buffer possibly staged.
            unsafe {
                blocking(stringify!($name), fh, buf as *mut c_void, count, dt, Role::$role, |b| {
                    $pmpi(fh, $($pre,)* b as $bty, count, dt, status)
                })
            }
        }
    )*};
}

file_blocking! {
    MPI_File_read => PMPI_File_read() Out *mut c_void;
    MPI_File_read_all => PMPI_File_read_all() Out *mut c_void;
    MPI_File_read_at => PMPI_File_read_at(offset: MPI_Offset) Out *mut c_void;
    MPI_File_read_at_all => PMPI_File_read_at_all(offset: MPI_Offset) Out *mut c_void;
    MPI_File_read_shared => PMPI_File_read_shared() Out *mut c_void;
    MPI_File_read_ordered => PMPI_File_read_ordered() Out *mut c_void;
    MPI_File_write => PMPI_File_write() In *const c_void;
    MPI_File_write_all => PMPI_File_write_all() In *const c_void;
    MPI_File_write_at => PMPI_File_write_at(offset: MPI_Offset) In *const c_void;
    MPI_File_write_at_all => PMPI_File_write_at_all(offset: MPI_Offset) In *const c_void;
    MPI_File_write_shared => PMPI_File_write_shared() In *const c_void;
    MPI_File_write_ordered => PMPI_File_write_ordered() In *const c_void;
}

/// Defines non-blocking file calls: `name => pmpi(extra args) role buffer-type`.
macro_rules! file_nonblocking {
    ($($name:ident => $pmpi:ident($($pre:ident: $pty:ty),*) $role:ident $bty:ty;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: a device buffer staged, the request the shim's.")]
        ///
        /// # Safety
        /// As the MPI function: the file handle and datatype are valid, the buffer holds (or
        /// has room for) `count` elements until the request completes, and `request` is
        /// valid for writes.
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            fh: MPI_File,
            $($pre: $pty,)*
            buf: $bty,
            count: c_int,
            dt: MPI_Datatype,
            request: *mut MPI_Request,
        ) -> c_int {
            // SAFETY: the caller's arguments, the buffer possibly staged.
            unsafe {
                nonblocking(stringify!($name), fh, buf as *mut c_void, count, dt, Role::$role, request, |b, r| {
                    $pmpi(fh, $($pre,)* b as $bty, count, dt, r)
                })
            }
        }
    )*};
}

file_nonblocking! {
    MPI_File_iread => PMPI_File_iread() Out *mut c_void;
    MPI_File_iread_all => PMPI_File_iread_all() Out *mut c_void;
    MPI_File_iread_at => PMPI_File_iread_at(offset: MPI_Offset) Out *mut c_void;
    MPI_File_iread_at_all => PMPI_File_iread_at_all(offset: MPI_Offset) Out *mut c_void;
    MPI_File_iread_shared => PMPI_File_iread_shared() Out *mut c_void;
    MPI_File_iwrite => PMPI_File_iwrite() In *const c_void;
    MPI_File_iwrite_all => PMPI_File_iwrite_all() In *const c_void;
    MPI_File_iwrite_at => PMPI_File_iwrite_at(offset: MPI_Offset) In *const c_void;
    MPI_File_iwrite_at_all => PMPI_File_iwrite_at_all(offset: MPI_Offset) In *const c_void;
    MPI_File_iwrite_shared => PMPI_File_iwrite_shared() In *const c_void;
}

/// Defines the begin calls of split collectives, refusing device buffers.
macro_rules! file_split_begin {
    ($($name:ident => $pmpi:ident($($pre:ident: $pty:ty),*) $bty:ty;)*) => {$(
        #[doc = concat!("`", stringify!($name), "`: device buffers refused (see the module's doc).")]
        ///
        /// # Safety
        /// As the MPI function: the file handle and datatype are valid, and the buffer holds
        /// (or has room for) `count` elements until the matching `_end` call.
        #[no_mangle]
        pub unsafe extern "C" fn $name(fh: MPI_File, $($pre: $pty,)* buf: $bty, count: c_int, dt: MPI_Datatype) -> c_int {
            let device = active()
                && !buf.is_null()
                && !crate::hostmem::is_host(buf as usize, 1)
                && with(|s| s.is_device(buf as usize, 1)).unwrap_or(false);
            if !device {
                // SAFETY: the caller's arguments, passed on.
                return while_blocked(|| unsafe { $pmpi(fh, $($pre,)* buf, count, dt) });
            }
            let code = crate::mpierr::for_call(
                MPI_ERR_UNSUPPORTED_OPERATION as c_int,
                stringify!($name),
                "device buffers in split collective file operations are not supported (the shim stages around one \
                 call, and the buffer is the _end call's); use the blocking or non-blocking form",
            );
            // SAFETY: the caller's file.
            unsafe { raise_file(fh, code) }
        }
    )*};
}

file_split_begin! {
    MPI_File_read_all_begin => PMPI_File_read_all_begin() *mut c_void;
    MPI_File_read_at_all_begin => PMPI_File_read_at_all_begin(offset: MPI_Offset) *mut c_void;
    MPI_File_read_ordered_begin => PMPI_File_read_ordered_begin() *mut c_void;
    MPI_File_write_all_begin => PMPI_File_write_all_begin() *const c_void;
    MPI_File_write_at_all_begin => PMPI_File_write_at_all_begin(offset: MPI_Offset) *const c_void;
    MPI_File_write_ordered_begin => PMPI_File_write_ordered_begin() *const c_void;
}
