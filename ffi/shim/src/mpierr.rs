//! MPI error codes that carry the shim's own message: for a failure the MPI library
//! knows nothing of (a staging cap exceeded, an unsupported case), a code of the fitting
//! predefined class (`MPI_Error_class` answers it) whose `MPI_Error_string` says which
//! call failed, why, and what to do; the error handler that aborts prints it.

use std::collections::HashMap;
use std::ffi::{c_int, CString};
use std::sync::{Mutex, PoisonError};

use mpi_sys::{PMPI_Add_error_code, PMPI_Add_error_string, MPI_MAX_ERROR_STRING};

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

fn new_code(class: c_int, message: &str) -> Option<c_int> {
    let mut text: String = format!("gpulmt-mpi: {message}");
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
