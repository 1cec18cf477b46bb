//! Which kinds of device memory this rank moved through staging because no peer can map
//! them (`docs/memory-kinds.md`): counted for the traffic line, and logged once per kind
//! and reason at `GPULMT_LOG=info`, so a user sees why a transfer took the SHM path and
//! what would give it IPC, without a line per message.

use crate::context::Context;
use crate::device::{AllocKind, MemoryKind, PointerInfo};
use crate::error::Error;

/// Rendezvous buffers staged because their memory cannot be mapped, by kind.
#[derive(Default, Debug)]
pub(crate) struct MemoryKinds {
    /// (kind, reason) pairs already logged.
    logged: Vec<(AllocKind, String)>,
    /// Buffers staged so far.
    staged: u64,
}

impl MemoryKinds {
    /// Notes a rendezvous buffer of `kind` that goes through staging for `reason`.
    pub(crate) fn staged(&mut self, kind: AllocKind, reason: &str) {
        self.staged += 1;
        if !self.logged.iter().any(|(k, r)| *k == kind && r == reason) {
            tracing::info!(
                kind = kind.name(),
                reason,
                "device memory no peer can map: its messages go through shared-memory staging (logged once per kind)"
            );
            self.logged.push((kind, reason.to_owned()));
        }
    }

    /// Rendezvous buffers staged so far because no peer can map them.
    pub(crate) fn staged_count(&self) -> u64 {
        self.staged
    }
}

impl Context {
    /// The error for a device buffer `ptr..ptr+len` that runs past the memory `info`
    /// describes: it names both allocations where it runs into another one.
    pub(crate) fn past_allocation_error(&self, info: PointerInfo, ptr: usize, len: usize) -> Error {
        let (base, span) = (info.base, info.span);
        let last = ptr + len - 1;
        let next = self.backend.pointer_info(last).ok().filter(|n| n.kind != MemoryKind::Host && n.base != base);
        Error::InvalidArgument(match next {
            Some(n) => format!(
                "buffer {ptr:#x}+{len} spans two device allocations, {base:#x}+{span} and {:#x}+{}: a message must lie in one allocation",
                n.base, n.span
            ),
            None => format!("buffer {ptr:#x}+{len} runs past the end of its device allocation {base:#x}+{span}"),
        })
    }
}
