//! The symmetric heap across ranks on sim devices (`gpulmt-check sym`): the same offsets
//! on every rank, peers' heaps mapped where peer access allows, host put_signal / get /
//! atomics between ranks, and the collective checks.

use gpulmt_tests::{Job, JobOutput};

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-check");

fn offsets(out: &JobOutput, r: usize) -> (u64, u64, u64) {
    let c = out.counters(r, "symheap");
    (c["data"], c["sigs"], c["counter"])
}

#[test]
fn same_offsets_put_signal_ring_and_exact_atomics_on_2_and_4_ranks() {
    for n in [2usize, 4] {
        let out = Job::new(CHECK, n, &["sym"]).timeout_s(60).run();
        out.assert_ok(n, "sym");
        out.assert_no_litter();
        for r in 0..n {
            assert_eq!(offsets(&out, r), offsets(&out, 0), "rank {r}'s offsets\n{}", out.dump());
            assert_eq!(out.counters(r, "symheap")["mapped"], n as u64, "rank {r}\n{}", out.dump());
            let a = out.counters(r, "symatomics");
            assert_eq!(a["total"], 1000 * n as u64, "rank {r}\n{}", out.dump());
            assert_eq!(a["winner"], out.counters(0, "symatomics")["winner"], "ranks saw different winners");
        }
        let winners: u64 = (0..n).map(|r| out.counters(r, "symatomics")["won"]).sum();
        assert_eq!(winners, 1, "exactly one compare-swap wins\n{}", out.dump());
        let (data, sigs, _) = offsets(&out, 0);
        assert!(data >= 4096 && sigs > data, "allocations start after the control area\n{}", out.dump());
    }
}

/// Peer access only within a device (4 ranks on 2 sim devices): each rank maps its own
/// heap and its device neighbour's, and refuses operations on the others.
#[test]
fn heaps_of_ranks_without_peer_access_are_not_mapped() {
    let out = Job::new(CHECK, 4, &["sym", "--expect-unmapped"]).env("GPULMT_SIM_PEER", "none").timeout_s(60).run();
    out.assert_ok(4, "sym");
    for r in 0..4 {
        assert_eq!(out.counters(r, "symheap")["mapped"], 2, "rank {r}\n{}", out.dump());
        assert_eq!(out.counters(r, "symunmapped")["count"], 2, "rank {r}\n{}", out.dump());
    }
}

#[test]
fn ranks_with_different_heap_sizes_all_refuse_the_first_allocation() {
    let out = Job::new(CHECK, 3, &["sym", "--mismatched-heap"]).timeout_s(60).run();
    out.assert_ok(3, "sym");
    out.assert_no_litter();
    for r in 0..3 {
        assert_eq!(out.counters(r, "symheap")["refused"], 1, "rank {r}\n{}", out.dump());
    }
}
