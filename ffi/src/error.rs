//! Error codes, the thread-local last-error message, and the guards that turn every
//! Rust failure (an [`gpulmt::Error`], an invalid argument, a panic) into an `int`
//! return code at the ABI boundary.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use gpulmt::{Error, ProtoError};

/// The call succeeded.
pub const GPULMT_SUCCESS: c_int = 0;
/// An argument is invalid: a null pointer, a negative size or rank, a tag out of
/// range, an unknown request, a cookie buffer smaller than `GPULMT_COOKIE_MAX`.
pub const GPULMT_ERR_INVALID_ARGUMENT: c_int = 1;
/// A `GPULMT_*` environment variable is invalid (the message names it).
pub const GPULMT_ERR_CONFIG: c_int = 2;
/// The job could not be set up (job identity, other ranks not joining in time).
pub const GPULMT_ERR_BOOTSTRAP: c_int = 3;
/// The device layer (CUDA or sim) failed.
pub const GPULMT_ERR_DEVICE: c_int = 4;
/// The job's shared memory failed.
pub const GPULMT_ERR_SHM: c_int = 5;
/// Two-phase free was misused (not from `gpulmt_mem_alloc`, double free) or failed.
pub const GPULMT_ERR_FREE: c_int = 6;
/// A received message was larger than the receive buffer.
pub const GPULMT_ERR_TRUNCATED: c_int = 7;
/// The peer of a transfer failed or exited.
pub const GPULMT_ERR_PEER_FAILED: c_int = 8;
/// A rank is outside the job.
pub const GPULMT_ERR_BAD_RANK: c_int = 9;
/// A peer violated the protocol.
pub const GPULMT_ERR_PROTOCOL: c_int = 10;
/// A device copy of a transfer failed.
pub const GPULMT_ERR_COPY_FAILED: c_int = 11;
/// The peer aborted the transfer.
pub const GPULMT_ERR_ABORTED: c_int = 12;
/// The request was cancelled.
pub const GPULMT_ERR_CANCELLED: c_int = 13;
/// The operation is not supported (by this kind of context, or this build).
pub const GPULMT_ERR_UNSUPPORTED: c_int = 14;
/// gpulmt hit an internal error (a bug): the context must not be used again except
/// to pass it to `gpulmt_finalize`, which then only releases it.
pub const GPULMT_ERR_INTERNAL: c_int = 15;
/// A global array section reaches outside the array (`gpulmt_ga_*`).
pub const GPULMT_ERR_GA_BOUNDS: c_int = 16;
/// A global array holds another element type than the call named.
pub const GPULMT_ERR_GA_TYPE: c_int = 17;
/// The global array was destroyed (or never existed).
pub const GPULMT_ERR_GA_DESTROYED: c_int = 18;
/// A local buffer is too small for the section with its leading dimension.
pub const GPULMT_ERR_GA_BUFFER: c_int = 19;

/// Every code with its fixed description (`gpulmt_strerror`). NUL-terminated so the
/// pointers handed to C are static.
const DESCRIPTIONS: &[(c_int, &CStr)] = &[
    (GPULMT_SUCCESS, c"success"),
    (GPULMT_ERR_INVALID_ARGUMENT, c"invalid argument"),
    (GPULMT_ERR_CONFIG, c"invalid configuration (GPULMT_* environment variable)"),
    (GPULMT_ERR_BOOTSTRAP, c"job setup failed"),
    (GPULMT_ERR_DEVICE, c"device error"),
    (GPULMT_ERR_SHM, c"shared memory error"),
    (GPULMT_ERR_FREE, c"device memory free failed or was misused"),
    (GPULMT_ERR_TRUNCATED, c"message truncated: the receive buffer is too small"),
    (GPULMT_ERR_PEER_FAILED, c"peer rank failed or exited"),
    (GPULMT_ERR_BAD_RANK, c"rank outside the job"),
    (GPULMT_ERR_PROTOCOL, c"protocol violation by a peer"),
    (GPULMT_ERR_COPY_FAILED, c"device copy failed"),
    (GPULMT_ERR_ABORTED, c"transfer aborted by the peer"),
    (GPULMT_ERR_CANCELLED, c"request cancelled"),
    (GPULMT_ERR_UNSUPPORTED, c"operation not supported"),
    (GPULMT_ERR_INTERNAL, c"internal error in gpulmt (a bug); the context is unusable"),
    (GPULMT_ERR_GA_BOUNDS, c"global array section out of bounds"),
    (GPULMT_ERR_GA_TYPE, c"global array element type mismatch"),
    (GPULMT_ERR_GA_DESTROYED, c"global array destroyed or unknown"),
    (GPULMT_ERR_GA_BUFFER, c"local buffer too small for the global array section"),
];

/// A failure at the ABI boundary: the code returned to C and the message kept for
/// `gpulmt_last_error`.
#[derive(Debug)]
pub(crate) struct FfiError {
    pub code: c_int,
    pub message: String,
}

impl FfiError {
    pub fn new(code: c_int, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(GPULMT_ERR_INVALID_ARGUMENT, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(GPULMT_ERR_UNSUPPORTED, message)
    }
}

/// The code of a transfer error.
pub(crate) fn proto_code(e: &ProtoError) -> c_int {
    match e {
        ProtoError::Truncated { .. } => GPULMT_ERR_TRUNCATED,
        ProtoError::PeerFailed { .. } => GPULMT_ERR_PEER_FAILED,
        ProtoError::BadRank { .. } => GPULMT_ERR_BAD_RANK,
        ProtoError::Protocol { .. } => GPULMT_ERR_PROTOCOL,
        ProtoError::CopyFailed { .. } => GPULMT_ERR_COPY_FAILED,
        ProtoError::Aborted { .. } => GPULMT_ERR_ABORTED,
        ProtoError::Cancelled => GPULMT_ERR_CANCELLED,
        ProtoError::Unsupported { .. } => GPULMT_ERR_UNSUPPORTED,
    }
}

/// The code of an error of the Rust API.
pub(crate) fn error_code(e: &Error) -> c_int {
    match e {
        Error::Config(_) => GPULMT_ERR_CONFIG,
        Error::Device(_) => GPULMT_ERR_DEVICE,
        Error::Shm(_) => GPULMT_ERR_SHM,
        Error::Transfer(p) => proto_code(p),
        Error::Bootstrap(_) => GPULMT_ERR_BOOTSTRAP,
        Error::InvalidArgument(_) => GPULMT_ERR_INVALID_ARGUMENT,
        Error::Free(_) => GPULMT_ERR_FREE,
    }
}

impl From<Error> for FfiError {
    fn from(e: Error) -> Self {
        Self::new(error_code(&e), e.to_string())
    }
}

thread_local! {
    /// The message of the last failed call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as this thread's last error and returns its code.
pub(crate) fn record(e: FfiError) -> c_int {
    // A message with an interior NUL would be cut by C; replace the NULs instead.
    let msg = CString::new(e.message.replace('\0', " ")).unwrap_or_default();
    // Never panics (this runs outside catch_unwind): during thread teardown the
    // message is dropped, the code still returned.
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut last) = l.try_borrow_mut() {
            *last = msg;
        }
    });
    e.code
}

/// The message of a caught panic.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    let what = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message");
    format!("internal error in gpulmt (please report it): {what}")
}

/// Runs the body of an extern function: its error, or a panic, becomes the returned
/// code and this thread's last error.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), FfiError>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => GPULMT_SUCCESS,
        Ok(Err(e)) => record(e),
        Err(payload) => record(FfiError::new(GPULMT_ERR_INTERNAL, panic_message(&*payload))),
    }
}

/// Gives the message of the last call that failed on the calling thread.
///
/// Returns a NUL-terminated string, empty if no call failed on this thread yet. It is
/// not cleared by successful calls.
///
/// # Safety
/// Always safe to call. The string is owned by gpulmt and stays valid until the next
/// failing gpulmt call on the same thread; copy it to keep it longer. Never free it.
#[no_mangle]
pub extern "C" fn gpulmt_last_error() -> *const c_char {
    LAST_ERROR.try_with(|l| l.try_borrow().map(|m| m.as_ptr()).ok()).ok().flatten().unwrap_or(c"".as_ptr())
}

/// Describes an error code (`GPULMT_SUCCESS` or a `GPULMT_ERR_*` constant).
///
/// Returns a static NUL-terminated string; an unknown code gives
/// "unknown gpulmt error code". For the details of a failure (which variable, which
/// rank, which pointer), use `gpulmt_last_error`.
///
/// # Safety
/// Always safe to call. The string is static: never free or modify it.
#[no_mangle]
pub extern "C" fn gpulmt_strerror(code: c_int) -> *const c_char {
    DESCRIPTIONS.iter().find(|(c, _)| *c == code).map_or(c"unknown gpulmt error code", |(_, d)| *d).as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_one_description() {
        // The global array codes follow GPULMT_ERR_INTERNAL; GPULMT_ERR_GA_BUFFER is the last.
        for code in GPULMT_SUCCESS..=GPULMT_ERR_GA_BUFFER {
            assert_eq!(DESCRIPTIONS.iter().filter(|(c, _)| *c == code).count(), 1, "code {code}");
        }
        assert_eq!(DESCRIPTIONS.len() as c_int, GPULMT_ERR_GA_BUFFER + 1);
        // SAFETY: gpulmt_strerror returns static NUL-terminated strings.
        let unknown = unsafe { CStr::from_ptr(gpulmt_strerror(9999)) };
        assert_eq!(unknown.to_str().unwrap(), "unknown gpulmt error code");
    }

    #[test]
    fn guard_records_errors_and_panics() {
        assert_eq!(guard(|| Ok(())), GPULMT_SUCCESS);
        assert_eq!(guard(|| Err(FfiError::invalid("bad\0thing"))), GPULMT_ERR_INVALID_ARGUMENT);
        // SAFETY: the last error is a valid C string until the next failing call.
        let msg = unsafe { CStr::from_ptr(gpulmt_last_error()) }.to_str().unwrap().to_owned();
        assert_eq!(msg, "bad thing");
        assert_eq!(guard(|| panic!("boom")), GPULMT_ERR_INTERNAL);
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(gpulmt_last_error()) }.to_str().unwrap().to_owned();
        assert!(msg.contains("boom"), "{msg}");
        // Success leaves the last error alone.
        assert_eq!(guard(|| Ok(())), GPULMT_SUCCESS);
        // SAFETY: as above.
        assert!(unsafe { CStr::from_ptr(gpulmt_last_error()) }.to_str().unwrap().contains("boom"));
    }

    #[test]
    fn transfer_errors_map_to_their_codes() {
        let e: FfiError = Error::from(ProtoError::Truncated { msg_len: 10, buf_len: 5 }).into();
        assert_eq!(e.code, GPULMT_ERR_TRUNCATED);
        assert!(e.message.contains("truncated"));
        assert_eq!(proto_code(&ProtoError::PeerFailed { rank: 1 }), GPULMT_ERR_PEER_FAILED);
        assert_eq!(error_code(&Error::Free("x".into())), GPULMT_ERR_FREE);
    }
}
