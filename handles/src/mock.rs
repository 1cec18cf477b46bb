//! A strict in-memory [`MappingOpener`] for tests, usable by crates that have
//! no GPU.
//!
//! It refuses to open a key that is already open, exactly like the CUDA driver
//! refuses a second `cuIpcOpenMemHandle` of one handle, and refuses to close
//! what is not open or with the wrong mapping. A cache that behaves with this
//! mock therefore never double-opens or double-closes. Failures can be
//! injected per key to exercise error paths.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

use crate::opener::MappingOpener;

/// A mapping made by [`MockOpener`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MockMapping {
    /// Made-up local address, distinct for every open.
    pub local_addr: u64,
    /// The peer address given as the handle.
    pub peer_addr: u64,
    /// 1 for the first open, 2 for the second...: tells a cached mapping from
    /// a fresh open of the same key.
    pub serial: u64,
}

/// Why [`MockOpener`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MockError {
    /// Second open of an open key (the driver's "already mapped").
    #[error("{key} is already open; the CUDA driver refuses to open one handle twice")]
    AlreadyOpen {
        /// The key, formatted.
        key: String,
    },
    /// Close of a key that is not open.
    #[error("{key} is not open; closing it would be a double close")]
    NotOpen {
        /// The key, formatted.
        key: String,
    },
    /// Close with a mapping other than the one open for the key.
    #[error("{key} is open with another mapping; the close passed a stale one")]
    WrongMapping {
        /// The key, formatted.
        key: String,
    },
    /// Open of a handle (peer address) that another open key maps, where
    /// [`MockOpener::refuse_mapped_addresses`] asks for it (the driver's
    /// `CUDA_ERROR_ALREADY_MAPPED` for a peer's reused address).
    #[error("{key}: the peer address is mapped under another key")]
    AddressMapped {
        /// The key, formatted.
        key: String,
    },
    /// Injected with [`MockOpener::fail_open`].
    #[error("injected open failure for {key}")]
    InjectedOpen {
        /// The key, formatted.
        key: String,
    },
    /// Injected with [`MockOpener::fail_close`]; the mapping is gone anyway.
    #[error("injected close failure for {key}")]
    InjectedClose {
        /// The key, formatted.
        key: String,
    },
}

/// A strict mock opener; see the module docs.
#[derive(Debug)]
pub struct MockOpener<K> {
    open: HashMap<K, MockMapping>,
    serial: u64,
    opens: u64,
    closes: u64,
    peak_open: usize,
    fail_open: HashSet<K>,
    fail_close: HashSet<K>,
    refuse_mapped: bool,
}

impl<K> Default for MockOpener<K> {
    fn default() -> Self {
        MockOpener {
            open: HashMap::new(),
            serial: 0,
            opens: 0,
            closes: 0,
            peak_open: 0,
            fail_open: HashSet::new(),
            fail_close: HashSet::new(),
            refuse_mapped: false,
        }
    }
}

impl<K: Clone + Eq + Hash + Debug> MockOpener<K> {
    /// Nothing open.
    pub fn new() -> Self {
        Self::default()
    }

    /// Successful opens so far.
    pub fn opens(&self) -> u64 {
        self.opens
    }

    /// Closes so far (injected failures included, since they unmap too).
    pub fn closes(&self) -> u64 {
        self.closes
    }

    /// Most mappings open at once.
    pub fn peak_open(&self) -> usize {
        self.peak_open
    }

    /// Mappings open now.
    pub fn open_count(&self) -> usize {
        self.open.len()
    }

    /// The mapping open for `key`, if any.
    pub fn mapping(&self, key: &K) -> Option<MockMapping> {
        self.open.get(key).copied()
    }

    /// True if `key` is open.
    pub fn is_open(&self, key: &K) -> bool {
        self.open.contains_key(key)
    }

    /// Makes opens of `key` fail (`true`) or succeed again (`false`).
    pub fn fail_open(&mut self, key: K, fail: bool) {
        if fail {
            self.fail_open.insert(key);
        } else {
            self.fail_open.remove(&key);
        }
    }

    /// Refuses (`true`) an open whose handle (peer address) another open key maps, as
    /// CUDA refuses a peer's new allocation at the place of an older one still mapped.
    pub fn refuse_mapped_addresses(&mut self, refuse: bool) {
        self.refuse_mapped = refuse;
    }

    /// Makes closes of `key` fail (`true`) or succeed again (`false`).
    pub fn fail_close(&mut self, key: K, fail: bool) {
        if fail {
            self.fail_close.insert(key);
        } else {
            self.fail_close.remove(&key);
        }
    }
}

impl<K: Clone + Eq + Hash + Debug> MappingOpener for MockOpener<K> {
    type Key = K;
    /// The peer's address of the buffer.
    type Handle = u64;
    type Mapping = MockMapping;
    type Error = MockError;

    fn open(&mut self, key: &K, handle: &u64) -> Result<MockMapping, MockError> {
        if self.open.contains_key(key) {
            return Err(MockError::AlreadyOpen { key: format!("{key:?}") });
        }
        if self.fail_open.contains(key) {
            return Err(MockError::InjectedOpen { key: format!("{key:?}") });
        }
        if self.refuse_mapped && self.open.values().any(|m| m.peer_addr == *handle) {
            return Err(MockError::AddressMapped { key: format!("{key:?}") });
        }
        self.serial += 1;
        let mapping =
            MockMapping { local_addr: 0x7f00_0000_0000 + (self.serial << 32), peer_addr: *handle, serial: self.serial };
        self.open.insert(key.clone(), mapping);
        self.opens += 1;
        self.peak_open = self.peak_open.max(self.open.len());
        Ok(mapping)
    }

    fn close(&mut self, key: &K, mapping: MockMapping) -> Result<(), MockError> {
        match self.open.get(key) {
            None => Err(MockError::NotOpen { key: format!("{key:?}") }),
            Some(open) if *open != mapping => Err(MockError::WrongMapping { key: format!("{key:?}") }),
            Some(_) => {
                self.open.remove(key);
                self.closes += 1;
                if self.fail_close.contains(key) {
                    return Err(MockError::InjectedClose { key: format!("{key:?}") });
                }
                Ok(())
            }
        }
    }
}
