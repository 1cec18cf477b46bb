//! Sender-side cache of exported handles, one per buffer.
//!
//! Exporting (`cuIpcGetMemHandle`) is a driver call too, and its result is the
//! same for the whole life of an allocation, so it is computed once per buffer
//! id and reused for every message sent from that buffer. The entry must be
//! dropped with [`ExportCache::forget`] when the buffer is freed: the id is
//! never reused, so a stale entry would only waste memory, but forgetting
//! keeps the cache the size of the live allocations.
//!
//! No eviction: an entry is a few dozen bytes per live allocation and holds no
//! driver resource.

use rustc_hash::FxHashMap as HashMap;
use std::hash::Hash;

/// Counters and size of an [`ExportCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportStats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups that exported (including exports that failed).
    pub misses: u64,
    /// Entries dropped by `forget`.
    pub forgotten: u64,
    /// Entries held now.
    pub entries: usize,
}

/// Exported handles `H` per buffer id `Id`; see the module docs.
#[derive(Debug)]
pub struct ExportCache<Id, H> {
    handles: HashMap<Id, H>,
    hits: u64,
    misses: u64,
    forgotten: u64,
}

impl<Id, H> Default for ExportCache<Id, H> {
    fn default() -> Self {
        ExportCache { handles: HashMap::default(), hits: 0, misses: 0, forgotten: 0 }
    }
}

impl<Id: Eq + Hash, H> ExportCache<Id, H> {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The handle of buffer `id`, calling `export` only the first time.
    ///
    /// # Errors
    ///
    /// Whatever `export` returns; nothing is cached then, so the next call
    /// tries again.
    pub fn get_or_export<E>(&mut self, id: Id, export: impl FnOnce() -> Result<H, E>) -> Result<&H, E> {
        use std::collections::hash_map::Entry;
        match self.handles.entry(id) {
            Entry::Occupied(occupied) => {
                self.hits += 1;
                Ok(occupied.into_mut())
            }
            Entry::Vacant(vacant) => {
                self.misses += 1;
                Ok(vacant.insert(export()?))
            }
        }
    }

    /// The cached handle of `id`, without exporting or counting.
    pub fn peek(&self, id: &Id) -> Option<&H> {
        self.handles.get(id)
    }

    /// Drops the handle of a freed buffer; returns it if there was one.
    pub fn forget(&mut self, id: &Id) -> Option<H> {
        let handle = self.handles.remove(id);
        if handle.is_some() {
            self.forgotten += 1;
        }
        handle
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }

    /// Counters and size.
    pub fn stats(&self) -> ExportStats {
        ExportStats { hits: self.hits, misses: self.misses, forgotten: self.forgotten, entries: self.handles.len() }
    }
}
