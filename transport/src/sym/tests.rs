//! The symmetric heap in one-rank jobs on sim (the multi-rank behaviour is tested by
//! `gpulmt-check sym` through the launcher, in `tests/tests/sym.rs`).

use gpulmt_protocols::gio::SignalOp;

use super::layout::{self, reserved_bytes, DeviceOp};
use super::*;
use crate::config::{Config, DeviceChoice};
use crate::context::JobInfo;

fn solo(heap: Option<u64>) -> Context {
    let cfg = Config { device: DeviceChoice::Sim, sym_heap: heap, ..Config::default() };
    let job = format!("symtest{}x{:x}", std::process::id(), rand_word());
    Context::init_with(cfg, JobInfo { job, rank: 0, size: 1 }).expect("a one-rank sim job")
}

fn rand_word() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(7);
    h.finish()
}

#[test]
fn the_control_area_grows_with_the_ranks_in_whole_pages() {
    assert_eq!(reserved_bytes(1), 4096);
    // Two words per PE after the counters: its heap's base and its barrier arrivals.
    assert_eq!(reserved_bytes(216), 4096);
    assert_eq!(reserved_bytes(217), 8192);
    assert_eq!(DeviceOp::from_code(3), Some(DeviceOp::PutSignal));
    assert_eq!(DeviceOp::from_code(0), None);
}

#[test]
fn allocations_are_laid_out_after_the_control_area_and_host_ops_reach_them() {
    let mut ctx = solo(Some(1 << 20));
    assert!(ctx.sym_heaps().is_empty());
    let a = ctx.sym_alloc(100).unwrap();
    let b = ctx.sym_alloc(8).unwrap();
    assert_eq!(a.offset(), reserved_bytes(1));
    assert_eq!(b.offset(), a.offset() + ALIGN);
    assert_eq!((a.len(), ctx.sym_heap_size()), (100, 1 << 20));
    assert_eq!(ctx.sym_heaps()[0].mapped, Some(a.addr() - a.offset() as usize));
    assert_eq!(ctx.sym_lookup(a.at(99)), Some(a));
    assert_eq!(ctx.sym_lookup(a.at(200)), None, "past the asked bytes, inside the rounding: no allocation named");

    let data: Vec<u8> = (0..100).collect();
    let mut back = vec![0u8; 100];
    // SAFETY: host buffers of 100 bytes each, valid for the calls.
    unsafe {
        ctx.sym_put(a.addr(), data.as_ptr(), 100, 0).unwrap();
        ctx.sym_get(back.as_mut_ptr(), a.addr(), 100, 0).unwrap();
    }
    assert_eq!(back, data);
    assert_eq!(ctx.sym_ptr(a.at(5), 0), Some(a.at(5)));

    // put_signal: data, then the signal; set and add.
    // SAFETY: as above.
    unsafe {
        ctx.sym_put_signal(a.addr(), data[50..].as_ptr(), 50, Signal { addr: b.addr(), value: 7, op: SignalOp::Set }, 0)
            .unwrap()
    };
    // SAFETY: as above.
    unsafe {
        ctx.sym_put_signal(a.addr(), data.as_ptr(), 1, Signal { addr: b.addr(), value: 5, op: SignalOp::Add }, 0)
            .unwrap()
    };
    assert_eq!(ctx.sym_signal_wait_until(b.addr(), Cmp::Eq, 12, None).unwrap(), Some(12));
    assert_eq!(
        ctx.sym_signal_wait_until(b.addr(), Cmp::Gt, 12, Some(std::time::Duration::from_millis(5))).unwrap(),
        None
    );

    assert_eq!(ctx.sym_atomic_fetch_add(b.addr(), 3, 0).unwrap(), 12);
    assert_eq!(ctx.sym_atomic_compare_swap(b.addr(), 1, 99, 0).unwrap(), 15, "no swap: 15 is not 1");
    assert_eq!(ctx.sym_atomic_compare_swap(b.addr(), 15, 99, 0).unwrap(), 15);
    ctx.sym_atomic_set(b.addr(), 4, 0).unwrap();
    assert_eq!(ctx.sym_atomic_fetch(b.addr(), 0).unwrap(), 4);

    let d = ctx.sym_device_ctx().unwrap();
    assert_eq!((d.version, d.my_pe, d.n_pes, d.reserved), (DEVICE_CTX_VERSION, 0, 1, 4096));
    assert_eq!((d.heap_size, d.heap_base, d.queues), (1 << 20, a.addr() as u64 - a.offset(), 0));
    assert_eq!(d.bases, d.heap_base + layout::CTRL_BASES);
    // The bases table in the control area names our own heap.
    let mut base0 = 0u64;
    // SAFETY: an 8-byte host word; the table lies in our heap's control area.
    unsafe { ctx.copy_sync(&mut base0 as *mut u64 as usize, d.bases as usize, 8).unwrap() };
    assert_eq!(base0, d.heap_base);
    assert_eq!(ctx.sym_device_errors().unwrap(), None);

    ctx.sym_free(a).unwrap();
    ctx.sym_free(b).unwrap();
    ctx.finalize().unwrap();
}

#[test]
fn bad_input_is_refused_with_what_to_do() {
    let mut ctx = solo(Some(256 << 10));
    assert!(ctx.sym_device_ctx().is_err(), "no heap yet");
    let e = ctx.sym_alloc(0).unwrap_err().to_string();
    assert!(e.contains("0 bytes"), "{e}");
    let e = ctx.sym_alloc(1 << 20).unwrap_err().to_string();
    assert!(e.contains("GPULMT_SYM_HEAP"), "{e}");
    let a = ctx.sym_alloc(64).unwrap();
    let data = [1u8; 512];
    let put = |ctx: &Context, dst: usize, len: usize, pe: u32| {
        // SAFETY: `data` holds 512 readable bytes; len never exceeds it.
        unsafe { ctx.sym_put(dst, data.as_ptr(), len, pe) }.unwrap_err().to_string()
    };
    assert!(put(&ctx, a.addr(), 257, 0).contains("not inside one live symmetric allocation"));
    assert!(put(&ctx, a.addr() - 8, 8, 0).contains("not inside"), "the control area is not an allocation");
    assert!(put(&ctx, 0x1000, 8, 0).contains("not inside"));
    assert!(put(&ctx, a.addr(), 8, 1).contains("PE 1 is not in this job"));
    let e = ctx.sym_atomic_fetch_add(a.at(4), 1, 0).unwrap_err().to_string();
    assert!(e.contains("not 8-byte aligned"), "{e}");
    ctx.sym_free(a).unwrap();
    assert!(put(&ctx, a.addr(), 8, 0).contains("not inside"), "a freed allocation");
    let e = ctx.sym_free(a).unwrap_err().to_string();
    assert!(e.contains("not the start of a live symmetric allocation"), "{e}");
    assert_eq!(ctx.sym_ptr(a.addr(), 0), None);
    ctx.finalize().unwrap();

    let mut small = solo(Some(64 << 10));
    // 64 KiB is the variable's minimum and leaves room; a heap of exactly the control
    // area cannot be configured, so the allocator's own limit is what refuses here.
    assert!(small.sym_alloc(64 << 10).unwrap_err().to_string().contains("no free range"));
    small.finalize().unwrap();
}

#[test]
fn rejected_device_accesses_are_read_back_from_the_control_area() {
    let mut ctx = solo(Some(1 << 20));
    let a = ctx.sym_alloc(8).unwrap();
    let base = a.addr() - a.offset() as usize;
    // What a device check writes: count, op << 32 | pe, address, bytes.
    let record = [2u64, (DeviceOp::Put as u64) << 32 | 3, 0xdead, 64];
    // SAFETY: the record's 32 bytes at the start of our heap's control area.
    unsafe { ctx.copy_sync(base, record.as_ptr() as usize, 32).unwrap() };
    let e = ctx.sym_device_errors().unwrap().expect("a record");
    assert_eq!((e.count, e.op, e.pe, e.addr, e.bytes), (2, Some(DeviceOp::Put), 3, 0xdead, 64));
    assert!(e.to_string().contains("put of 64 bytes"), "{e}");
    ctx.sym_device_errors_clear().unwrap();
    assert_eq!(ctx.sym_device_errors().unwrap(), None);
    ctx.finalize().unwrap();
}

#[test]
fn strided_puts_and_gets_move_blocks_and_refuse_one_that_overruns_its_allocation() {
    let mut ctx = solo(Some(1 << 20));
    let a = ctx.sym_alloc(64).unwrap();
    let zeros = [0u8; 64];
    let src: Vec<u8> = (1..=12).collect();
    // SAFETY: host buffers at least as large as every row the calls touch.
    unsafe {
        ctx.sym_put(a.addr(), zeros.as_ptr(), 64, 0).unwrap();
        // 3 rows of 2 bytes, 4 apart in the source and 10 apart in the heap.
        let shape = Copy2d { width: 2, height: 3, dst_pitch: 10, src_pitch: 4 };
        ctx.sym_put_2d(a.at(1), src.as_ptr(), shape, 0).unwrap();
        let mut all = [0u8; 64];
        ctx.sym_get(all.as_mut_ptr(), a.addr(), 64, 0).unwrap();
        let mut want = [0u8; 64];
        for (row, at) in [(0usize, 1usize), (1, 11), (2, 21)] {
            want[at..at + 2].copy_from_slice(&src[4 * row..4 * row + 2]);
        }
        assert_eq!(all, want);
        // Back into a buffer with rows 3 apart, its padding untouched.
        let mut back = [0xAAu8; 8];
        let shape = Copy2d { width: 2, height: 3, dst_pitch: 3, src_pitch: 10 };
        ctx.sym_get_2d(back.as_mut_ptr(), a.at(1), shape, 0).unwrap();
        assert_eq!(back, [1, 2, 0xAA, 5, 6, 0xAA, 9, 10]);
        // A last row past the allocation (7 rows 10 apart from byte 3: bytes 63 and 64)
        // and rows that overlap are refused, and nothing is written.
        let shape = Copy2d { width: 2, height: 7, dst_pitch: 10, src_pitch: 2 };
        let e = ctx.sym_put_2d(a.at(3), [9u8; 14].as_ptr(), shape, 0).unwrap_err();
        assert!(e.to_string().contains("not inside one live symmetric allocation"), "{e}");
        let shape = Copy2d { width: 4, height: 2, dst_pitch: 2, src_pitch: 4 };
        let e = ctx.sym_put_2d(a.addr(), [9u8; 8].as_ptr(), shape, 0).unwrap_err();
        assert!(e.to_string().contains("overlap"), "{e}");
        ctx.sym_get(all.as_mut_ptr(), a.addr(), 64, 0).unwrap();
        assert_eq!(all, want, "a refused strided put wrote");
    }
    ctx.finalize().unwrap();
}

#[test]
fn strided_nbi_copies_land_in_issue_order_by_the_quiet_and_a_blocking_one_waits_for_them() {
    let mut ctx = solo(Some(1 << 20));
    let a = ctx.sym_alloc(4096).unwrap();
    let zeros = vec![0u8; 4096];
    // A column 4 bytes wide, 32 rows 64 bytes apart in the heap, packed in the buffers.
    let shape = Copy2d { width: 4, height: 32, dst_pitch: 64, src_pitch: 4 };
    let bufs: Vec<Vec<u8>> = (1..=8u8).map(|v| vec![v; 128]).collect();
    let mut got = [vec![0u8; 128], vec![0u8; 128]];
    // SAFETY: every buffer is a host vector of 128 bytes (32 rows of 4) that outlives the
    // quiet below and is not touched until then; every heap block lies in `a`.
    unsafe {
        ctx.sym_put(a.addr(), zeros.as_ptr(), 4096, 0).unwrap();
        // Eight overlapping puts of the same column: the last one issued wins. A get issued
        // after the fourth sees the fourth's data, not a later one's.
        for (i, b) in bufs.iter().enumerate() {
            ctx.sym_put_2d_nbi(a.at(8), b.as_ptr(), shape, 0).unwrap();
            if i == 3 {
                let back = Copy2d { dst_pitch: 4, src_pitch: 64, ..shape };
                ctx.sym_get_2d_nbi(got[0].as_mut_ptr(), a.at(8), back, 0).unwrap();
            }
        }
        ctx.sym_quiet().unwrap();
        assert_eq!(got[0], vec![4u8; 128], "the get saw the put issued before it, and no later one");
        let back = Copy2d { dst_pitch: 4, src_pitch: 64, ..shape };
        ctx.sym_get_2d(got[1].as_mut_ptr(), a.at(8), back, 0).unwrap();
        assert_eq!(got[1], vec![8u8; 128]);
        // A blocking put issued behind an nbi one lands after it, with no quiet between.
        ctx.sym_put_2d_nbi(a.at(8), bufs[0].as_ptr(), shape, 0).unwrap();
        ctx.sym_put_2d(a.at(8), bufs[6].as_ptr(), shape, 0).unwrap();
        ctx.sym_get_2d(got[1].as_mut_ptr(), a.at(8), back, 0).unwrap();
        assert_eq!(got[1], vec![7u8; 128]);
        // Only the column was written: the rest of each row is still zero.
        let mut all = vec![0u8; 4096];
        ctx.sym_get(all.as_mut_ptr(), a.addr(), 4096, 0).unwrap();
        for (i, byte) in all.iter().enumerate() {
            let in_column = i < 32 * 64 && (8..12).contains(&(i % 64));
            assert_eq!(*byte, if in_column { 7 } else { 0 }, "byte {i}");
        }
        // A refused nbi copy is refused at issue, and leaves nothing for the quiet.
        let past = Copy2d { height: 65, ..shape };
        let e = ctx.sym_put_2d_nbi(a.at(8), bufs[0].as_ptr(), past, 0).unwrap_err();
        assert!(e.to_string().contains("not inside one live symmetric allocation"), "{e}");
        ctx.sym_quiet().unwrap();
    }
    ctx.finalize().unwrap();
}
