//! ExportCache: one export per buffer id, forgotten on free.

use gpulmt_handles::ExportCache;

#[test]
fn exports_once_per_buffer_and_forgets_on_free() {
    let mut c: ExportCache<u64, [u8; 64]> = ExportCache::new();
    let mut exports = 0;
    for _ in 0..3 {
        let h = c
            .get_or_export(7, || {
                exports += 1;
                Ok::<_, ()>([7; 64])
            })
            .unwrap();
        assert_eq!(h[0], 7);
    }
    assert_eq!(exports, 1);
    let s = c.stats();
    assert_eq!((s.hits, s.misses, s.entries), (2, 1, 1));
    assert_eq!(c.forget(&7), Some([7; 64]));
    assert_eq!(c.forget(&7), None);
    assert!(c.is_empty() && c.peek(&7).is_none());
    assert_eq!(c.stats().forgotten, 1);
}

#[test]
fn failed_export_is_not_cached() {
    let mut c: ExportCache<u64, u32> = ExportCache::new();
    assert_eq!(c.get_or_export(1, || Err("driver says no")), Err("driver says no"));
    assert!(c.is_empty());
    assert_eq!(c.get_or_export(1, || Ok::<_, &str>(5)), Ok(&5));
    assert_eq!(c.stats().misses, 2);
}
