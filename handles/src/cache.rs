//! Receiver-side cache of opened peer mappings.
//!
//! Opening an IPC handle costs about 0.93 ms on an H200 while copying 1 MiB
//! takes about 5 us, so a receiver that opened the sender's buffer for every
//! message would spend almost all its time in the driver. The cache keeps
//! mappings open between messages and shares one mapping among all transfers
//! that use the same peer buffer at the same time (osu_bw keeps 64 messages in
//! flight on one buffer).
//!
//! # Rules
//!
//! * Entries are keyed by [`MappingOpener::Key`], which includes the
//!   exporter's buffer id. An address alone is not enough: the peer may free a
//!   buffer and get the same address back for a new allocation, and the old
//!   mapping would then show stale memory.
//! * While an entry exists its handle is never opened again. The CUDA driver
//!   refuses to open one handle twice in a process, so this is a correctness
//!   rule, not only an optimisation.
//! * Every [`acquire`](HandleCache::acquire) takes a lease that must be given
//!   back with one [`release`](HandleCache::release). Entries with leases are
//!   *in use* and are never closed; entries without are *idle* and sit in an
//!   LRU list, bounded by [`CacheLimits`].
//! * If every entry is in use, the cache goes over its limits instead of
//!   failing the transfer or closing memory someone is copying from. It shrinks
//!   back as leases are released.
//! * With [`CacheLimits::enabled`] false the cache keeps no idle entries (as if
//!   its idle capacity were zero): the last release closes the mapping. Users
//!   that overlap still share one mapping, because a second open of the same
//!   handle would fail in the driver.
//!
//! # Invalidation
//!
//! When a peer's buffer is freed (two-phase free, see [`crate::free`]) or the
//! peer dies, its entries are invalidated: idle ones are closed at once, in-use
//! ones are *doomed* — closed at their last release and never handed out again.
//!
//! Acquiring a doomed key fails with [`CacheError::Doomed`] instead of waiting
//! or opening again. Opening again would be a second open of a handle that is
//! still open (the driver refuses it), and waiting would block inside a cache
//! that does no IO and has no idea when the other users finish. The case
//! cannot happen for keys built from buffer ids, since a freed buffer's id is
//! never reused; hitting it means a caller bug or a dead peer, and failing
//! loudly is the right answer to both. Once the doomed mapping is closed the
//! key is forgotten, and acquiring it again opens afresh.
//!
//! The cache is not thread-safe by itself (`&mut self` everywhere): wrap it in
//! a lock, and keep one cache per process and local device, since the driver's
//! "open once" rule is per process.

use rustc_hash::FxBuildHasher;
use std::fmt::Debug;
use std::time::Instant;

use lru::LruCache;

use crate::opener::MappingOpener;

/// Bounds on the idle part of a [`HandleCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most entries (in use or idle) kept open. In-use entries may exceed it.
    pub max_entries: usize,
    /// Most bytes kept mapped, counted with the sizes given to `acquire`.
    /// Mappings use virtual address space and keep a freed peer allocation
    /// alive, so this is bounded even though it uses no local memory.
    pub max_bytes: u64,
    /// `false` keeps no idle entries (for `GPULMT_HANDLE_CACHE=0`
    /// comparisons); concurrent users still share one mapping.
    pub enabled: bool,
}

impl CacheLimits {
    /// Default for [`max_entries`](Self::max_entries).
    pub const DEFAULT_MAX_ENTRIES: usize = 1024;
    /// Default for [`max_bytes`](Self::max_bytes): 256 GiB, more than the
    /// memory of the GPUs in one node share with one rank in practice.
    pub const DEFAULT_MAX_BYTES: u64 = 256 << 30;

    /// Limits with caching turned off.
    pub fn disabled() -> Self {
        CacheLimits { enabled: false, ..Self::default() }
    }
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits { max_entries: Self::DEFAULT_MAX_ENTRIES, max_bytes: Self::DEFAULT_MAX_BYTES, enabled: true }
    }
}

/// Counters and current sizes of a [`HandleCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Acquires served without opening (shared in-use entry or idle entry).
    pub hits: u64,
    /// Acquires that had to open (including opens that failed).
    pub misses: u64,
    /// Idle entries closed to respect the limits.
    pub evictions: u64,
    /// Successful opens.
    pub opens: u64,
    /// Closes attempted, successful or not: a mapping whose close failed is
    /// dropped from the cache all the same, so `opens - closes == entries`.
    pub closes: u64,
    /// Closes that returned an error (a subset of `closes`).
    pub close_failures: u64,
    /// Total time spent in the opener's `open`, failed opens included.
    pub open_nanos: u64,
    /// Entries with at least one lease.
    pub in_use: usize,
    /// Outstanding leases (acquires not yet released).
    pub leases: usize,
    /// Entries open now, in use or idle.
    pub entries: usize,
    /// Bytes mapped now.
    pub bytes: u64,
    /// In-use entries that will close at their last release.
    pub doomed: usize,
}

impl CacheStats {
    /// Mean time of one open, if any open was attempted.
    pub fn mean_open_nanos(&self) -> Option<u64> {
        self.open_nanos.checked_div(self.misses)
    }
}

/// What [`HandleCache::invalidate`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalidation {
    /// The key had no entry: nothing to close.
    NotCached,
    /// The entry was idle and has been closed.
    Closed,
    /// The entry is in use by `users` leases; it will be closed at the last
    /// release. Poll [`HandleCache::is_open`] to know when.
    Doomed {
        /// Leases still outstanding.
        users: usize,
    },
}

/// What [`HandleCache::invalidate_where`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InvalidateSummary {
    /// Idle entries closed now.
    pub closed: usize,
    /// In-use entries that will close at their last release.
    pub doomed: usize,
    /// Closes that failed; the errors wait in
    /// [`HandleCache::take_close_errors`].
    pub close_failures: usize,
}

/// Errors of [`HandleCache`]; `K` is the key type and `E` the opener's error.
#[derive(Debug, thiserror::Error)]
pub enum CacheError<K, E> {
    /// The opener failed to map the peer buffer.
    #[error(
        "opening the peer mapping for {key:?} failed; the buffer cannot be \
         read through IPC: fall back to a staged copy or fail the transfer"
    )]
    Open {
        /// The key that was being opened.
        key: K,
        /// The opener's error.
        #[source]
        source: E,
    },
    /// The opener failed to unmap; the cache has dropped the entry anyway.
    #[error(
        "closing the peer mapping for {key:?} failed; the cache forgot it, but \
         the peer memory may stay mapped until this process exits"
    )]
    Close {
        /// The key that was being closed.
        key: K,
        /// The opener's error.
        #[source]
        source: E,
    },
    /// `release` without a matching `acquire`.
    #[error(
        "release of {key:?}, which holds no lease; every release must match \
         exactly one successful acquire (caller bug)"
    )]
    NotHeld {
        /// The key that was released.
        key: K,
    },
    /// `acquire` of a key that was invalidated while in use.
    #[error(
        "{key:?} was invalidated (buffer freed or peer dead) while {users} \
         transfers still use it, so it cannot be handed out; buffer ids of \
         freed buffers must not be reused, and a dead peer's memory must not \
         be read"
    )]
    Doomed {
        /// The key that was acquired.
        key: K,
        /// Leases still holding the old mapping.
        users: usize,
    },
    /// `close_all` could not leave the cache empty.
    #[error(
        "finalize left {} mappings in use ({in_use:?}) and {} closes failed; \
         release every acquire before finalizing (in-use mappings now close at \
         their last release)",
        in_use.len(),
        failed.len()
    )]
    Finalize {
        /// Keys still leased and how many leases each has.
        in_use: Vec<(K, usize)>,
        /// Closes that failed, now or earlier and not yet taken.
        failed: Vec<(K, E)>,
    },
}

/// [`CacheError`] for the key and error types of opener `O`.
pub type CacheErrorOf<O> = CacheError<<O as MappingOpener>::Key, <O as MappingOpener>::Error>;

#[derive(Debug)]
struct Entry<M> {
    mapping: M,
    bytes: u64,
    /// Leases; always >= 1 for entries in `in_use`, 0 in `idle`.
    users: usize,
    doomed: bool,
}

/// Receiver-side cache of opened peer mappings; see the module docs.
pub struct HandleCache<O: MappingOpener> {
    opener: O,
    limits: CacheLimits,
    /// Every open entry, in use or idle, most recently acquired or released first, so
    /// that idle entries are in the order of their last release. One map, so that a copy's
    /// acquire and release are one lookup each and allocate nothing (an entry moving
    /// between an in-use map and an idle list cost two lookups, an allocation and a free
    /// per copy, on the path of every small message). Eviction skips in-use entries,
    /// which an acquire has just moved to the front. Unbounded: the limits count in-use
    /// entries too, so `trim` enforces them, not `lru`. Fx hashing: keys are this job's
    /// own (peer, buffer id).
    entries: LruCache<O::Key, Entry<O::Mapping>, FxBuildHasher>,
    /// Entries with at least one lease.
    in_use: usize,
    bytes: u64,
    hits: u64,
    misses: u64,
    evictions: u64,
    opens: u64,
    closes: u64,
    close_failures: u64,
    open_nanos: u64,
    /// Close errors from evictions and bulk invalidation, which have no
    /// caller waiting for that key's result.
    close_errors: Vec<(O::Key, O::Error)>,
}

impl<O: MappingOpener> Debug for HandleCache<O> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleCache")
            .field("limits", &self.limits)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<O: MappingOpener> HandleCache<O> {
    /// An empty cache that opens and closes through `opener`.
    pub fn new(opener: O, limits: CacheLimits) -> Self {
        HandleCache {
            opener,
            limits,
            entries: LruCache::unbounded_with_hasher(FxBuildHasher),
            in_use: 0,
            bytes: 0,
            hits: 0,
            misses: 0,
            evictions: 0,
            opens: 0,
            closes: 0,
            close_failures: 0,
            open_nanos: 0,
            close_errors: Vec::new(),
        }
    }

    /// The limits in force.
    pub fn limits(&self) -> CacheLimits {
        self.limits
    }

    /// Changes the limits, closing idle entries that no longer fit.
    /// Returns how many were closed.
    pub fn set_limits(&mut self, limits: CacheLimits) -> usize {
        self.limits = limits;
        self.trim()
    }

    /// The opener, e.g. to inspect a mock in tests.
    pub fn opener(&self) -> &O {
        &self.opener
    }

    /// Gives the opener back. Mappings still open are not closed: call
    /// [`close_all`](Self::close_all) first.
    pub fn into_opener(self) -> O {
        self.opener
    }

    /// Returns the mapping of `key`, opening it with `handle` if no entry
    /// exists, and takes a lease on it.
    ///
    /// `bytes` is the size of the exported allocation, used for the byte
    /// limit; for an existing entry the size given at open is kept. The mapping
    /// stays valid until the matching [`release`](Self::release).
    ///
    /// Before opening, idle entries are evicted (least recently used first)
    /// to make room for the new one.
    ///
    /// # Errors
    ///
    /// [`CacheError::Doomed`] if `key` was invalidated and is still in use;
    /// [`CacheError::Open`] if the opener fails (no lease is taken).
    pub fn acquire(&mut self, key: &O::Key, handle: &O::Handle, bytes: u64) -> Result<O::Mapping, CacheErrorOf<O>> {
        if let Some(entry) = self.entries.get_mut(key) {
            // Doomed entries are in use: an idle one is closed when doomed.
            if entry.doomed {
                return Err(CacheError::Doomed { key: key.clone(), users: entry.users });
            }
            if entry.users == 0 {
                self.in_use += 1;
            }
            entry.users += 1;
            self.hits += 1;
            return Ok(entry.mapping);
        }

        self.misses += 1;
        self.make_room(bytes);
        // The one clock in the sans-IO crates (see .clippy.toml): it only measures the
        // opener's cost for `CacheStats::open_nanos`; no decision here depends on it.
        #[allow(clippy::disallowed_methods)]
        let started = Instant::now();
        let opened = self.opener.open(key, handle);
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.open_nanos = self.open_nanos.saturating_add(nanos);
        let mapping = opened.map_err(|source| CacheError::Open { key: key.clone(), source })?;
        self.opens += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        self.in_use += 1;
        self.entries.push(key.clone(), Entry { mapping, bytes, users: 1, doomed: false });
        Ok(mapping)
    }

    /// [`acquire`](Self::acquire), but where the opener refuses because this process
    /// still maps something the new handle collides with (`collides` says which of its
    /// errors mean that), closes the idle entries and tries once more.
    ///
    /// CUDA refuses `cuIpcOpenMemHandle` (`CUDA_ERROR_ALREADY_MAPPED`) for a peer's new
    /// allocation while this process still maps an older one that the peer freed and
    /// whose place its allocator reused. That stale mapping is idle here (the peer gave
    /// the buffer up, so no transfer of ours uses it); Open MPI's CUDA IPC cache answers
    /// the same refusal the same way. In-use entries stay: a collision with one of them
    /// is an error.
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire), the second attempt's error where there was one.
    pub fn acquire_evicting_on(
        &mut self,
        key: &O::Key,
        handle: &O::Handle,
        bytes: u64,
        collides: impl Fn(&O::Error) -> bool,
    ) -> Result<O::Mapping, CacheErrorOf<O>> {
        match self.acquire(key, handle, bytes) {
            Err(CacheError::Open { source, .. }) if collides(&source) && self.evict_idle() > 0 => {
                self.acquire(key, handle, bytes)
            }
            r => r,
        }
    }

    /// Gives back one lease on `key`.
    ///
    /// At the last lease the entry becomes idle, or is closed at once if it
    /// is doomed or the cache is disabled; idle entries beyond the limits are
    /// then evicted.
    ///
    /// # Errors
    ///
    /// [`CacheError::NotHeld`] if `key` has no lease; [`CacheError::Close`]
    /// if closing this entry failed (the lease is given back all the same).
    /// Failed evictions of other entries go to
    /// [`take_close_errors`](Self::take_close_errors).
    pub fn release(&mut self, key: &O::Key) -> Result<(), CacheErrorOf<O>> {
        // Moved to the front: the most recently released idle entry is evicted last.
        let entry = match self.entries.get_mut(key) {
            Some(entry) if entry.users > 0 => entry,
            _ => return Err(CacheError::NotHeld { key: key.clone() }),
        };
        entry.users -= 1;
        if entry.users > 0 {
            return Ok(());
        }
        self.in_use -= 1;
        if entry.doomed || !self.limits.enabled {
            let Some((key, entry)) = self.entries.pop_entry(key) else {
                return Ok(()); // unreachable: found just above
            };
            return self.close_entry(key, entry).map_err(|(key, source)| CacheError::Close { key, source });
        }
        self.trim();
        Ok(())
    }

    /// Stops `key` from being handed out: closes it now if idle, else dooms it
    /// so that its last release closes it.
    ///
    /// # Errors
    ///
    /// [`CacheError::Close`] if closing an idle entry failed; the entry is
    /// forgotten anyway.
    pub fn invalidate(&mut self, key: &O::Key) -> Result<Invalidation, CacheErrorOf<O>> {
        match self.entries.peek_mut(key) {
            Some(entry) if entry.users > 0 => {
                entry.doomed = true;
                return Ok(Invalidation::Doomed { users: entry.users });
            }
            _ => {}
        }
        match self.entries.pop_entry(key) {
            Some((key, entry)) => {
                self.close_entry(key, entry).map_err(|(key, source)| CacheError::Close { key, source })?;
                Ok(Invalidation::Closed)
            }
            None => Ok(Invalidation::NotCached),
        }
    }

    /// [`invalidate`](Self::invalidate) for every key matching `pred`, e.g.
    /// all keys of a dead peer. Failed closes go to
    /// [`take_close_errors`](Self::take_close_errors).
    pub fn invalidate_where(&mut self, mut pred: impl FnMut(&O::Key) -> bool) -> InvalidateSummary {
        let mut summary = InvalidateSummary::default();
        let mut idle = Vec::new();
        for (key, entry) in self.entries.iter_mut() {
            if !pred(key) {
                continue;
            }
            if entry.users > 0 {
                entry.doomed = true;
                summary.doomed += 1;
            } else {
                idle.push(key.clone());
            }
        }
        for key in idle {
            if let Some((key, entry)) = self.entries.pop_entry(&key) {
                summary.closed += 1;
                if let Err(failed) = self.close_entry(key, entry) {
                    summary.close_failures += 1;
                    self.close_errors.push(failed);
                }
            }
        }
        summary
    }

    /// Evicts idle entries, least recently used first, until the limits hold
    /// (or nothing idle is left). Returns how many were closed.
    ///
    /// Called by `release` and `set_limits`; exposed for callers that want to
    /// shrink at a quiet moment.
    pub fn trim(&mut self) -> usize {
        let mut evicted = 0;
        while self.over_limits(0, 0) && self.evict_one() {
            evicted += 1;
        }
        evicted
    }

    /// Whether the entries, with `more` entries of `more_bytes` in all added, exceed the
    /// limits (a disabled cache keeps no idle entry: it is always over).
    fn over_limits(&self, more: usize, more_bytes: u64) -> bool {
        !self.limits.enabled
            || self.len() + more > self.limits.max_entries
            || self.bytes.saturating_add(more_bytes) > self.limits.max_bytes
    }

    /// Closes every idle entry (counted as evictions). Returns how many.
    pub fn evict_idle(&mut self) -> usize {
        let mut evicted = 0;
        while self.evict_one() {
            evicted += 1;
        }
        evicted
    }

    /// Finalize: closes every idle entry and dooms the in-use ones.
    ///
    /// # Errors
    ///
    /// [`CacheError::Finalize`] listing the keys still in use (they will close
    /// at their last release) and every close failure not yet taken with
    /// [`take_close_errors`](Self::take_close_errors).
    pub fn close_all(&mut self) -> Result<(), CacheErrorOf<O>> {
        let mut failed = std::mem::take(&mut self.close_errors);
        while let Some((key, entry)) = self.pop_lru_idle() {
            if let Err(f) = self.close_entry(key, entry) {
                failed.push(f);
            }
        }
        let in_use: Vec<(O::Key, usize)> = self
            .entries
            .iter_mut()
            .map(|(key, entry)| {
                entry.doomed = true;
                (key.clone(), entry.users)
            })
            .collect();
        if in_use.is_empty() && failed.is_empty() {
            Ok(())
        } else {
            Err(CacheError::Finalize { in_use, failed })
        }
    }

    /// Close errors from evictions and bulk invalidation, oldest first;
    /// clears the list.
    pub fn take_close_errors(&mut self) -> Vec<(O::Key, O::Error)> {
        std::mem::take(&mut self.close_errors)
    }

    /// True when no lease is outstanding.
    pub fn is_idle(&self) -> bool {
        self.in_use == 0
    }

    /// True while `key` has an open mapping (in use, idle or doomed). After
    /// invalidating, wait for this to turn false before telling the owner the
    /// memory may be freed.
    pub fn is_open(&self, key: &O::Key) -> bool {
        self.entries.contains(key)
    }

    /// How many open mappings (in use or idle) have a key `pred` accepts; lets a
    /// caller wait until every mapping it invalidated has really closed.
    pub fn count_open_where(&self, mut pred: impl FnMut(&O::Key) -> bool) -> usize {
        self.entries.iter().filter(|(k, _)| pred(k)).count()
    }

    /// Leases on `key`: `None` if not open, `Some(0)` if idle.
    pub fn users(&self, key: &O::Key) -> Option<usize> {
        self.entries.peek(key).map(|entry| entry.users)
    }

    /// Entries open now, in use or idle.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Acquires that had to open, and the time spent opening (ns), so far: the two
    /// counters a caller compares around one acquire, in constant time.
    pub fn open_counters(&self) -> (u64, u64) {
        (self.misses, self.open_nanos)
    }

    /// Counters and sizes.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            hits: self.hits,
            misses: self.misses,
            evictions: self.evictions,
            opens: self.opens,
            closes: self.closes,
            close_failures: self.close_failures,
            open_nanos: self.open_nanos,
            in_use: self.in_use,
            leases: self.entries.iter().map(|(_, e)| e.users).sum(),
            entries: self.len(),
            bytes: self.bytes,
            doomed: self.entries.iter().filter(|(_, e)| e.doomed).count(),
        }
    }

    /// Room for one more entry of `bytes`, taken from idle entries only.
    fn make_room(&mut self, bytes: u64) {
        while self.over_limits(1, bytes) && self.evict_one() {}
    }

    /// Takes the least recently released idle entry out of the cache. In-use entries are
    /// skipped; acquires move them to the front, so few lie behind the idle ones.
    fn pop_lru_idle(&mut self) -> Option<(O::Key, Entry<O::Mapping>)> {
        if self.entries.len() == self.in_use {
            return None;
        }
        let key = self.entries.iter().rev().find(|(_, e)| e.users == 0).map(|(k, _)| k.clone())?;
        self.entries.pop_entry(&key)
    }

    /// Closes the least recently used idle entry; false if none.
    fn evict_one(&mut self) -> bool {
        let Some((key, entry)) = self.pop_lru_idle() else {
            return false;
        };
        self.evictions += 1;
        if let Err(failed) = self.close_entry(key, entry) {
            self.close_errors.push(failed);
        }
        true
    }

    /// Closes an entry already taken out of the map.
    fn close_entry(&mut self, key: O::Key, entry: Entry<O::Mapping>) -> Result<(), (O::Key, O::Error)> {
        debug_assert_eq!(entry.users, 0, "closing a mapping that is in use");
        self.bytes = self.bytes.saturating_sub(entry.bytes);
        self.closes += 1;
        match self.opener.close(&key, entry.mapping) {
            Ok(()) => Ok(()),
            Err(source) => {
                self.close_failures += 1;
                Err((key, source))
            }
        }
    }
}
