//! The layer's errors: what was wrong with the call, and what to do. Every check runs
//! before the first byte moves, so a refused call has written nothing.

use crate::element::ElemType;
use crate::section::Section;

/// Errors of the Global Arrays layer.
#[derive(Debug, thiserror::Error)]
pub enum GaError {
    /// A section reaches outside the array (or has `lo > hi`).
    #[error("section {section} is outside the {}x{} array #{array} (sections are half-open: rows lo[0]..hi[0], columns lo[1]..hi[1], within the dims)", dims[0], dims[1])]
    OutOfBounds { array: u64, section: Section, dims: [usize; 2] },
    /// The local buffer's element type is not the array's.
    #[error("array #{array} holds {array_type}, the buffer {given}: use a buffer of the array's element type")]
    TypeMismatch { array: u64, array_type: ElemType, given: ElemType },
    /// The array was destroyed.
    #[error("array #{array} was destroyed; create another")]
    Destroyed { array: u64 },
    /// The local buffer cannot hold the section with its leading dimension.
    #[error("{what}: the local buffer holds {given} elements, the section needs {needed} with leading dimension {ld}")]
    BufferTooSmall { what: &'static str, needed: usize, given: usize, ld: usize },
    /// Another argument is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// gpulmt failed (the symmetric heap, a message, the barrier).
    #[error("{0}")]
    Transport(#[from] gpulmt::Error),
}

/// Result of the Global Arrays layer.
pub type Result<T, E = GaError> = std::result::Result<T, E>;
