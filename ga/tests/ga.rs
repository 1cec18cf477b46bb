//! Global arrays across ranks on sim devices (`gpulmt-ga-check`, one job per scenario
//! and rank count): random sections from every rank against a serial reference, order
//! of overlapping operations, exact accumulate totals, non-blocking operations under
//! fence, every bad input, short messages; on 2, 3 and 4 ranks.

use gpulmt_tests::{Job, JobOutput};

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-ga-check");

fn run(n: usize, args: &[&str], scenario: &str) -> JobOutput {
    let out = Job::new(CHECK, n, args).timeout_s(120).run();
    out.assert_ok(n, scenario);
    out.assert_no_litter();
    out
}

#[test]
fn random_sections_from_every_rank_match_a_serial_reference_on_2_3_and_4_ranks() {
    for (n, seed) in [(2, "11"), (3, "12"), (4, "13")] {
        let out = run(n, &["random", "--seed", seed], "random");
        for r in 0..n {
            let c = out.counters(r, "ga-random");
            assert_eq!(c["arrays"], 12, "rank {r}\n{}", out.dump());
            assert!(c["checked"] > 0, "rank {r} compared nothing\n{}", out.dump());
        }
    }
}

#[test]
fn overlapping_sections_from_one_rank_complete_in_order() {
    for n in [2, 3, 4] {
        let out = run(n, &["order"], "order");
        for r in 0..n {
            assert!(out.counters(r, "ga-order")["checks"] > 0, "rank {r}\n{}", out.dump());
        }
    }
}

#[test]
fn accumulates_from_every_rank_give_the_exact_total() {
    for n in [2u64, 3, 4] {
        let out = run(n as usize, &["acc-total", "--times", "40"], "acc-total");
        // Section [1..6, 2..8] of x = 1..=30, scale 2, 40 times per rank.
        let expected = (1..=30u64).sum::<u64>() * 2 * 40 * n;
        for r in 0..n as usize {
            assert_eq!(out.counters(r, "ga-acc")["total"], expected, "rank {r}\n{}", out.dump());
        }
    }
}

#[test]
fn non_blocking_operations_are_complete_after_fence_and_their_handles() {
    for n in [2, 3, 4] {
        let out = run(n, &["nb"], "nb");
        for r in 0..n {
            assert_eq!(out.counters(r, "ga-nb")["ok"], 1, "rank {r}\n{}", out.dump());
        }
    }
}

#[test]
fn every_bad_input_is_refused_and_nothing_is_written() {
    for n in [2, 3] {
        let out = run(n, &["bad"], "bad");
        for r in 0..n {
            // 16 out of bounds, 3 type mismatches, 5 buffers too small, 1 ld, 1 rank,
            // 3 bad creates, 1 message to no rank, 8 calls on a destroyed array; sizes that
            // overflow (3 creates, 1 grid, 1 registered buffer, 1 ld) and a put from a freed
            // device buffer (issue 46).
            assert_eq!(out.counters(r, "ga-bad")["refused"], 45, "rank {r}\n{}", out.dump());
        }
    }
}

#[test]
fn short_messages_go_around_a_ring() {
    for n in [2, 4] {
        let out = run(n, &["msg", "--iters", "200"], "msg");
        for r in 0..n {
            assert_eq!(out.counters(r, "ga-msg")["rounds"], 200, "rank {r}\n{}", out.dump());
        }
    }
}
