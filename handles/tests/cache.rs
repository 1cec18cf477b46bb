//! HandleCache against the strict mock opener: every open the mock accepts
//! proves the cache did not double-open, every close it accepts proves the
//! mapping was open.

use std::collections::{HashMap, HashSet};

use gpulmt_handles::mock::{MockError, MockMapping, MockOpener};
use gpulmt_handles::{CacheError, CacheLimits, HandleCache, Invalidation};
use proptest::prelude::*;

/// (peer rank, exporter's buffer id)
type Key = (u32, u64);
type Cache = HandleCache<MockOpener<Key>>;

const MIB: u64 = 1 << 20;

fn cache(limits: CacheLimits) -> Cache {
    HandleCache::new(MockOpener::new(), limits)
}

fn limits(max_entries: usize, max_bytes: u64) -> CacheLimits {
    CacheLimits { max_entries, max_bytes, enabled: true }
}

/// The cache's and the mock's view of what is open agree.
fn assert_consistent(c: &Cache) {
    let s = c.stats();
    assert_eq!(s.opens, c.opener().opens());
    assert_eq!(s.closes, c.opener().closes());
    assert_eq!(s.opens - s.closes, s.entries as u64);
    assert_eq!(c.opener().open_count(), s.entries);
}

/// A peer freed a buffer and its allocator put a new one at the same address: the
/// opener refuses the new key while the old, idle mapping stays (CUDA's
/// ALREADY_MAPPED); `acquire_evicting_on` closes the idle entries and opens it. A
/// collision with an entry in use stays an error, and that entry stays open.
#[test]
fn a_reused_peer_address_evicts_the_stale_idle_mapping() {
    let mut opener = MockOpener::new();
    opener.refuse_mapped_addresses(true);
    let mut c: Cache = HandleCache::new(opener, CacheLimits::default());
    let collides = |e: &MockError| matches!(e, MockError::AddressMapped { .. });
    c.acquire(&(1, 7), &0x1000, MIB).unwrap();
    c.release(&(1, 7)).unwrap();
    assert!(matches!(c.acquire(&(1, 8), &0x1000, MIB), Err(CacheError::Open { .. })));
    let m = c.acquire_evicting_on(&(1, 8), &0x1000, MIB, collides).unwrap();
    assert_eq!(m.peer_addr, 0x1000);
    assert!(!c.is_open(&(1, 7)) && c.is_open(&(1, 8)));
    assert_consistent(&c);
    // (1, 8) is in use: a third allocation at the same place cannot evict it.
    assert!(matches!(c.acquire_evicting_on(&(1, 9), &0x1000, MIB, collides), Err(CacheError::Open { .. })));
    assert!(c.is_open(&(1, 8)));
    assert_consistent(&c);
}

#[test]
fn idle_entry_is_reused() {
    let mut c = cache(CacheLimits::default());
    let a = c.acquire(&(1, 7), &0x1000, MIB).unwrap();
    c.release(&(1, 7)).unwrap();
    let b = c.acquire(&(1, 7), &0x1000, MIB).unwrap();
    assert_eq!(a, b);
    let s = c.stats();
    assert_eq!((s.opens, s.hits, s.misses, s.closes), (1, 1, 1, 0));
    assert!(s.mean_open_nanos().is_some());
    c.release(&(1, 7)).unwrap();
    assert!(c.is_idle());
    c.close_all().unwrap();
    assert_eq!(c.opener().opens(), c.opener().closes());
}

#[test]
fn recycled_address_with_new_buffer_id_opens_again() {
    let mut c = cache(CacheLimits::default());
    let old = c.acquire(&(1, 7), &0x1000, MIB).unwrap();
    c.release(&(1, 7)).unwrap();
    // The peer freed buffer 7 and got the same address for buffer 8.
    let new = c.acquire(&(1, 8), &0x1000, MIB).unwrap();
    assert_eq!(old.peer_addr, new.peer_addr);
    assert_ne!(old.serial, new.serial, "the stale mapping must not be handed out");
    assert_eq!(c.stats().opens, 2);
    assert_eq!(c.invalidate(&(1, 7)).unwrap(), Invalidation::Closed);
    c.release(&(1, 8)).unwrap();
    c.close_all().unwrap();
    assert_consistent(&c);
}

#[test]
fn sixty_four_concurrent_acquires_open_once() {
    let mut c = cache(CacheLimits::default());
    let first = c.acquire(&(2, 1), &0x2000, 64 * MIB).unwrap();
    for _ in 1..64 {
        assert_eq!(c.acquire(&(2, 1), &0x2000, 64 * MIB).unwrap(), first);
    }
    let s = c.stats();
    assert_eq!((s.opens, s.hits, s.misses, s.leases, s.in_use), (1, 63, 1, 64, 1));
    assert_eq!(s.bytes, 64 * MIB, "shared entries are counted once");
    for _ in 0..64 {
        c.release(&(2, 1)).unwrap();
    }
    assert!(c.is_idle());
    assert_eq!(c.users(&(2, 1)), Some(0));
    c.close_all().unwrap();
    assert_eq!((c.opener().opens(), c.opener().closes()), (1, 1));
}

#[test]
fn eviction_never_closes_held_mappings() {
    let mut c = cache(limits(4, 1 << 40));
    let held: Vec<Key> = (0..6).map(|i| (0, i)).collect();
    let mut mappings = HashMap::new();
    for k in &held {
        mappings.insert(*k, c.acquire(k, &(k.1 * 0x1000), MIB).unwrap());
    }
    // Everything in use: over the limit rather than failing.
    assert_eq!(c.len(), 6);
    for round in 0..20u64 {
        let k = (1, round);
        c.acquire(&k, &0x9000, MIB).unwrap();
        c.release(&k).unwrap();
        for h in &held {
            assert_eq!(c.opener().mapping(h), Some(mappings[h]), "held mapping closed");
        }
        assert_consistent(&c);
    }
    assert_eq!(c.len(), 6, "idle entries evicted while over the limit");
    assert!(c.stats().evictions >= 20);
    // Releasing shrinks back to the limit.
    for k in &held {
        c.release(k).unwrap();
        assert!(c.len() <= 6);
    }
    assert_eq!(c.len(), 4);
    assert_eq!(c.stats().bytes, 4 * MIB);
    c.close_all().unwrap();
    assert_eq!(c.opener().opens(), c.opener().closes());
}

#[test]
fn byte_limit_evicts_least_recently_used() {
    let mut c = cache(limits(100, 3 * MIB));
    for id in 0..3 {
        c.acquire(&(0, id), &0, MIB).unwrap();
        c.release(&(0, id)).unwrap();
    }
    // Touch id 0 so id 1 becomes least recently used.
    c.acquire(&(0, 0), &0, MIB).unwrap();
    c.release(&(0, 0)).unwrap();
    c.acquire(&(0, 3), &0, MIB).unwrap();
    assert!(!c.is_open(&(0, 1)));
    assert!(c.is_open(&(0, 0)) && c.is_open(&(0, 2)) && c.is_open(&(0, 3)));
    assert_eq!(c.stats().evictions, 1);
    assert_eq!(c.stats().bytes, 3 * MIB);
    c.release(&(0, 3)).unwrap();
    assert_eq!(c.set_limits(limits(1, 3 * MIB)), 2);
    assert!(c.is_open(&(0, 3)), "most recently used survives");
    c.close_all().unwrap();
    assert_consistent(&c);
}

#[test]
fn disabled_cache_shares_concurrent_users_and_closes_at_zero() {
    let mut c = cache(CacheLimits::disabled());
    let k = (3, 9);
    let a = c.acquire(&k, &0x3000, MIB).unwrap();
    let b = c.acquire(&k, &0x3000, MIB).unwrap();
    assert_eq!(a, b, "a second open would fail in the driver");
    assert_eq!(c.opener().opens(), 1);
    c.release(&k).unwrap();
    assert!(c.opener().is_open(&k));
    c.release(&k).unwrap();
    assert!(!c.opener().is_open(&k), "closed at refcount 0");
    assert!(c.is_empty());
    let again = c.acquire(&k, &0x3000, MIB).unwrap();
    assert_ne!(again.serial, a.serial, "disabled: reopened every time");
    c.release(&k).unwrap();
    let s = c.stats();
    assert_eq!((s.opens, s.closes, s.hits, s.misses, s.evictions), (2, 2, 1, 2, 0));
    c.close_all().unwrap();
}

#[test]
fn max_entries_zero_behaves_like_disabled() {
    let mut c = cache(limits(0, u64::MAX));
    let k = (0, 0);
    c.acquire(&k, &0, 1).unwrap();
    c.acquire(&k, &0, 1).unwrap();
    c.release(&k).unwrap();
    assert!(c.is_open(&k));
    c.release(&k).unwrap();
    assert!(!c.is_open(&k));
    assert_consistent(&c);
}

#[test]
fn invalidate_while_held_dooms_then_closes_at_last_release() {
    let mut c = cache(CacheLimits::default());
    let k = (1, 5);
    let first = c.acquire(&k, &0x5000, MIB).unwrap();
    c.acquire(&k, &0x5000, MIB).unwrap();
    assert_eq!(c.invalidate(&k).unwrap(), Invalidation::Doomed { users: 2 });
    assert_eq!(c.stats().doomed, 1);
    match c.acquire(&k, &0x5000, MIB) {
        Err(CacheError::Doomed { key, users }) => assert_eq!((key, users), (k, 2)),
        other => panic!("expected Doomed, got {other:?}"),
    }
    c.release(&k).unwrap();
    assert!(c.is_open(&k), "still one user");
    c.release(&k).unwrap();
    assert!(!c.is_open(&k) && !c.opener().is_open(&k));
    // Forgotten once closed: a new acquire opens afresh.
    let fresh = c.acquire(&k, &0x5000, MIB).unwrap();
    assert_ne!(fresh.serial, first.serial);
    c.release(&k).unwrap();
    c.close_all().unwrap();
    assert_consistent(&c);
}

#[test]
fn invalidate_idle_and_unknown() {
    let mut c = cache(CacheLimits::default());
    assert_eq!(c.invalidate(&(0, 1)).unwrap(), Invalidation::NotCached);
    c.acquire(&(0, 1), &0, MIB).unwrap();
    c.release(&(0, 1)).unwrap();
    assert_eq!(c.invalidate(&(0, 1)).unwrap(), Invalidation::Closed);
    assert!(c.is_empty());
    assert_consistent(&c);
}

#[test]
fn invalidate_where_handles_a_dead_peer() {
    let mut c = cache(CacheLimits::default());
    for id in 0..3 {
        c.acquire(&(4, id), &0, MIB).unwrap();
        c.acquire(&(5, id), &0, MIB).unwrap();
    }
    c.release(&(4, 0)).unwrap();
    c.release(&(4, 1)).unwrap();
    let summary = c.invalidate_where(|k| k.0 == 4);
    assert_eq!((summary.closed, summary.doomed, summary.close_failures), (2, 1, 0));
    assert!(matches!(c.acquire(&(4, 2), &0, MIB), Err(CacheError::Doomed { .. })));
    assert!(c.acquire(&(5, 0), &0, MIB).is_ok(), "other peers unaffected");
    c.release(&(4, 2)).unwrap();
    assert!(!c.is_open(&(4, 2)));
    c.release(&(5, 0)).unwrap();
    for id in 0..3 {
        c.release(&(5, id)).unwrap();
    }
    c.close_all().unwrap();
    assert_consistent(&c);
}

#[test]
fn release_without_acquire_is_an_error() {
    let mut c = cache(CacheLimits::default());
    assert!(matches!(c.release(&(0, 0)), Err(CacheError::NotHeld { key: (0, 0) })));
    c.acquire(&(0, 0), &0, 1).unwrap();
    c.release(&(0, 0)).unwrap();
    let err = c.release(&(0, 0)).unwrap_err();
    assert!(matches!(err, CacheError::NotHeld { .. }), "idle entries hold no lease");
    assert!(err.to_string().contains("(0, 0)"));
}

#[test]
fn close_all_reports_in_use_and_closes_them_later() {
    let mut c = cache(CacheLimits::default());
    c.acquire(&(0, 0), &0, 1).unwrap();
    c.acquire(&(0, 0), &0, 1).unwrap();
    c.acquire(&(0, 1), &0, 1).unwrap();
    c.release(&(0, 1)).unwrap();
    match c.close_all() {
        Err(CacheError::Finalize { in_use, failed }) => {
            assert_eq!(in_use, vec![((0, 0), 2)]);
            assert!(failed.is_empty());
        }
        other => panic!("expected Finalize, got {other:?}"),
    }
    assert!(!c.is_open(&(0, 1)));
    assert!(matches!(c.acquire(&(0, 0), &0, 1), Err(CacheError::Doomed { .. })));
    c.release(&(0, 0)).unwrap();
    c.release(&(0, 0)).unwrap();
    assert!(c.is_empty());
    c.close_all().unwrap();
    assert_eq!(c.opener().opens(), c.opener().closes());
}

#[test]
fn open_failure_takes_no_lease() {
    let mut opener = MockOpener::new();
    opener.fail_open((0, 0), true);
    let mut c = HandleCache::new(opener, CacheLimits::default());
    let err = c.acquire(&(0, 0), &0, 1).unwrap_err();
    assert!(matches!(err, CacheError::Open { key: (0, 0), source: MockError::InjectedOpen { .. } }));
    assert!(std::error::Error::source(&err).is_some());
    assert!(c.is_idle() && c.is_empty());
    assert_eq!((c.stats().misses, c.stats().opens), (1, 0));
    assert!(matches!(c.release(&(0, 0)), Err(CacheError::NotHeld { .. })));
}

#[test]
fn close_failures_are_reported_and_forgotten() {
    let mut opener = MockOpener::new();
    opener.fail_close((0, 0), true);
    opener.fail_close((0, 1), true);
    let mut c = HandleCache::new(opener, limits(1, u64::MAX));
    c.acquire(&(0, 0), &0, 1).unwrap();
    c.release(&(0, 0)).unwrap();
    // Evicting (0, 0) fails in the background.
    c.acquire(&(0, 1), &0, 1).unwrap();
    let errors = c.take_close_errors();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].0, (0, 0));
    // Doomed close at release fails in the caller's face.
    c.invalidate(&(0, 1)).unwrap();
    assert!(matches!(c.release(&(0, 1)), Err(CacheError::Close { key: (0, 1), .. })));
    let s = c.stats();
    assert_eq!((s.closes, s.close_failures, s.entries), (2, 2, 0));
    c.close_all().unwrap();
}

#[test]
fn errors_say_what_to_do() {
    let e: CacheError<Key, MockError> = CacheError::Doomed { key: (1, 2), users: 3 };
    let text = e.to_string();
    assert!(text.contains("(1, 2)") && text.contains('3') && text.contains("reused"), "{text}");
    let e: CacheError<Key, MockError> = CacheError::Finalize { in_use: vec![((1, 2), 1)], failed: vec![] };
    assert!(e.to_string().contains("release every acquire"));
}

// ---------------------------------------------------------------------------
// Property test: random operations against a model.

const PEERS: u32 = 2;
const IDS: u64 = 3;

fn bytes_of(k: &Key) -> u64 {
    (k.1 + 1) * 100
}

#[derive(Clone, Debug)]
enum Op {
    Acquire(Key),
    Release(Key),
    Invalidate(Key),
    InvalidatePeer(u32),
    EvictIdle,
    Trim,
    SetLimits(CacheLimits),
}

fn key() -> impl Strategy<Value = Key> {
    (0..PEERS, 0..IDS)
}

fn cache_limits() -> impl Strategy<Value = CacheLimits> {
    (0usize..5, prop_oneof![Just(0u64), Just(250), Just(600), Just(u64::MAX)], prop::bool::weighted(0.8))
        .prop_map(|(max_entries, max_bytes, enabled)| CacheLimits { max_entries, max_bytes, enabled })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => key().prop_map(Op::Acquire),
        5 => key().prop_map(Op::Release),
        2 => key().prop_map(Op::Invalidate),
        1 => (0..PEERS).prop_map(Op::InvalidatePeer),
        1 => Just(Op::EvictIdle),
        1 => Just(Op::Trim),
        1 => cache_limits().prop_map(Op::SetLimits),
    ]
}

#[derive(Default)]
struct Model {
    users: HashMap<Key, usize>,
    handed: HashMap<Key, MockMapping>,
    doomed: HashSet<Key>,
}

impl Model {
    fn users(&self, k: &Key) -> usize {
        self.users.get(k).copied().unwrap_or(0)
    }
    fn drop_lease(&mut self, k: &Key) {
        let u = self.users.get_mut(k).unwrap();
        *u -= 1;
        if *u == 0 {
            self.users.remove(k);
            self.handed.remove(k);
            self.doomed.remove(k);
        }
    }
}

fn check_invariants(c: &mut Cache, m: &Model) -> Result<(), TestCaseError> {
    let s = c.stats();
    // Never double open / close: the mock would have refused, and no error
    // ever reaches here. Counters agree with the mock.
    prop_assert_eq!(s.opens, c.opener().opens());
    prop_assert_eq!(s.closes, c.opener().closes());
    prop_assert_eq!(s.opens - s.closes, s.entries as u64);
    prop_assert_eq!(c.opener().open_count(), s.entries);
    prop_assert_eq!(s.close_failures, 0);
    prop_assert!(c.take_close_errors().is_empty());
    // Never closed (or reopened) while held.
    for (k, mapping) in &m.handed {
        prop_assert_eq!(c.opener().mapping(k), Some(*mapping), "held {:?} closed", k);
        prop_assert_eq!(c.users(k), Some(m.users(k)));
    }
    prop_assert_eq!(s.in_use, m.users.len());
    prop_assert_eq!(s.leases, m.users.values().sum::<usize>());
    prop_assert_eq!(s.doomed, m.doomed.len());
    // Bytes match what is open.
    let open_bytes: u64 = (0..PEERS)
        .flat_map(|p| (0..IDS).map(move |i| (p, i)))
        .filter(|k| c.opener().is_open(k))
        .map(|k| bytes_of(&k))
        .sum();
    prop_assert_eq!(s.bytes, open_bytes);
    // Idle entries only within the limits.
    let idle = s.entries - s.in_use;
    let l = c.limits();
    if !l.enabled {
        prop_assert_eq!(idle, 0);
    } else if idle > 0 {
        prop_assert!(s.entries <= l.max_entries && s.bytes <= l.max_bytes);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_operations_keep_invariants(
        initial in cache_limits(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut c = cache(initial);
        let mut m = Model::default();
        for op in ops {
            match op {
                Op::Acquire(k) => {
                    let r = c.acquire(&k, &(k.1 * 0x1000), bytes_of(&k));
                    if m.doomed.contains(&k) {
                        let doomed = matches!(r, Err(CacheError::Doomed { .. }));
                        prop_assert!(doomed, "acquire of doomed {:?}: {:?}", k, r);
                    } else {
                        let mapping = r.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                        if let Some(prev) = m.handed.get(&k) {
                            prop_assert_eq!(*prev, mapping, "concurrent users share");
                        }
                        m.handed.insert(k, mapping);
                        *m.users.entry(k).or_default() += 1;
                    }
                }
                Op::Release(k) => {
                    let r = c.release(&k);
                    if m.users(&k) == 0 {
                        let not_held = matches!(r, Err(CacheError::NotHeld { .. }));
                        prop_assert!(not_held, "{:?}", r);
                    } else {
                        prop_assert!(r.is_ok(), "{:?}", r);
                        m.drop_lease(&k);
                    }
                }
                Op::Invalidate(k) => {
                    let was_open = c.is_open(&k);
                    let r = c.invalidate(&k).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                    let users = m.users(&k);
                    let expected = if users > 0 {
                        m.doomed.insert(k);
                        Invalidation::Doomed { users }
                    } else if was_open {
                        Invalidation::Closed
                    } else {
                        Invalidation::NotCached
                    };
                    prop_assert_eq!(r, expected);
                    if users == 0 {
                        prop_assert!(!c.is_open(&k));
                    }
                }
                Op::InvalidatePeer(p) => {
                    let s = c.invalidate_where(|k| k.0 == p);
                    let held: Vec<Key> = m.users.keys().filter(|k| k.0 == p).copied().collect();
                    prop_assert_eq!(s.doomed, held.len());
                    m.doomed.extend(held);
                    for i in 0..IDS {
                        if m.users(&(p, i)) == 0 {
                            prop_assert!(!c.is_open(&(p, i)));
                        }
                    }
                }
                Op::EvictIdle => {
                    c.evict_idle();
                    prop_assert_eq!(c.len(), m.users.len());
                }
                Op::Trim => {
                    c.trim();
                }
                Op::SetLimits(l) => {
                    c.set_limits(l);
                }
            }
            check_invariants(&mut c, &m)?;
        }
        // Drain every lease; finalize must leave nothing open.
        let leases: Vec<(Key, usize)> = m.users.iter().map(|(k, u)| (*k, *u)).collect();
        for (k, u) in leases {
            for _ in 0..u {
                c.release(&k).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                m.drop_lease(&k);
            }
            check_invariants(&mut c, &m)?;
        }
        prop_assert!(c.is_idle());
        c.close_all().map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
        prop_assert_eq!(c.opener().opens(), c.opener().closes());
        prop_assert_eq!(c.opener().open_count(), 0);
        prop_assert_eq!(c.stats().bytes, 0);
    }
}
