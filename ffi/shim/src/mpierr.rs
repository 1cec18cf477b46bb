//! MPI error codes that carry the shim's own message: for a failure the MPI library
//! knows nothing of (a staging cap exceeded, an unsupported case), a code of the fitting
//! predefined class (`MPI_Error_class` answers it) whose `MPI_Error_string` says which
//! call failed, why, and what to do; the error handler that aborts prints it. Every
//! message is also logged (once) on stderr.
//!
//! MPICH 4.0 keeps no string for a code added to a predefined class (`MPI_Add_error_code`
//! makes one whose `MPI_Error_string` reads an unrelated message of its own tables):
//! where the string does not read back, the code is the class itself, and the log line
//! is where the message is.

use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::sync::{Mutex, OnceLock, PoisonError};

use mpi_sys::{PMPI_Add_error_code, PMPI_Add_error_string, PMPI_Error_string, MPI_ERR_OTHER, MPI_MAX_ERROR_STRING};

use crate::raw::SUCCESS;

/// Codes made so far, by class and message (MPI has no way to remove one).
static CODES: Mutex<Option<HashMap<(c_int, String), c_int>>> = Mutex::new(None);

/// A code of `class` whose string is `message` (made once per distinct message, and
/// logged then). Where the library refuses a new code, `class` itself.
pub fn code(class: c_int, message: &str) -> c_int {
    let mut codes = CODES.lock().unwrap_or_else(PoisonError::into_inner);
    let codes = codes.get_or_insert_with(HashMap::new);
    if let Some(&c) = codes.get(&(class, message.to_string())) {
        return c;
    }
    tracing::error!("{message}");
    let c = new_code(class, message).unwrap_or(class);
    codes.insert((class, message.to_string()), c);
    c
}

/// [`code`] for a failure of the MPI function `call`: the message starts with its name.
pub fn for_call(class: c_int, call: &str, why: impl std::fmt::Display) -> c_int {
    code(class, &format!("{call}: {why}"))
}

/// Whether the library keeps the string of a code added to a predefined class (see the
/// module's doc): asked once, with a code of its own.
fn strings_kept() -> bool {
    static KEPT: OnceLock<bool> = OnceLock::new();
    *KEPT.get_or_init(|| {
        let probe = "gpulmt-mpi: probe of MPI_Add_error_string";
        let Some(code) = add_code(MPI_ERR_OTHER as c_int, probe) else { return false };
        let mut buf = vec![0u8; MPI_MAX_ERROR_STRING as usize + 1];
        let mut len = 0;
        // SAFETY: a buffer of MPI_MAX_ERROR_STRING bytes and a local out-pointer.
        let rc = unsafe { PMPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len) };
        rc == SUCCESS && buf.get(..len.max(0) as usize) == Some(probe.as_bytes())
    })
}

fn new_code(class: c_int, message: &str) -> Option<c_int> {
    if !strings_kept() {
        return None;
    }
    add_code(class, &format!("gpulmt-mpi: {message}"))
}

/// A new code of `class` with the string `text` (cut to MPI_MAX_ERROR_STRING).
fn add_code(class: c_int, text: &str) -> Option<c_int> {
    let mut text = text.to_string();
    let max = MPI_MAX_ERROR_STRING as usize - 1;
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    let text = CString::new(text.replace('\0', " ")).ok()?;
    let mut code = 0;
    // SAFETY: a local out-pointer; a NUL-terminated string shorter than
    // MPI_MAX_ERROR_STRING, which the library copies.
    unsafe {
        if PMPI_Add_error_code(class, &mut code) != SUCCESS {
            return None;
        }
        if PMPI_Add_error_string(code, text.as_ptr()) != SUCCESS {
            return None;
        }
    }
    Some(code)
}
