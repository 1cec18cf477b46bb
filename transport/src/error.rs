//! The public error type: what failed, and what the user can do about it.

use gpulmt_protocols::ProtoError;

use crate::config::ConfigError;
use crate::device::DeviceError;
use crate::shm::object::ShmError;

/// Errors of the gpulmt API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `GPULMT_*` variable is invalid.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// The device layer failed.
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    /// Shared memory of the job failed.
    #[error("shared memory: {0}")]
    Shm(#[from] ShmError),
    /// A transfer failed (truncation, peer failure, protocol violation...).
    #[error("transfer: {0}")]
    Transfer(#[from] ProtoError),
    /// The job could not be set up.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
    /// An argument is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Two-phase free was misused or could not finish.
    #[error("memory free: {0}")]
    Free(String),
}

impl Error {
    /// The transfer error, when this is one (truncation, peer failure...).
    pub fn as_transfer(&self) -> Option<&ProtoError> {
        match self {
            Error::Transfer(e) => Some(e),
            _ => None,
        }
    }
}

/// Result of the gpulmt API.
pub type Result<T, E = Error> = std::result::Result<T, E>;
