//! What the engine knows of a user request: the buffer it moves ([`BufDesc`]) and the
//! status it completes with ([`Status`]).
//!
//! The engine never touches user memory; it names buffers by request id and these
//! descriptions, and the transport resolves them to addresses.

use crate::wire::Region;
use crate::{Rank, Tag};

/// A user buffer, as the engine needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufDesc {
    pub len: u64,
    /// The device holding it, None for host memory.
    pub device: Option<u32>,
    /// Its exported region (device buffers of rendezvous size; a sender's is required).
    pub region: Option<Region>,
}

impl BufDesc {
    pub fn host(len: u64) -> Self {
        Self { len, device: None, region: None }
    }
}

/// Completion status of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// The peer (for a receive: the sender).
    pub source: Rank,
    pub tag: Tag,
    /// Bytes moved.
    pub len: u64,
}
