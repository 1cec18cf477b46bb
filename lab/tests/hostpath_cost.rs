//! hostpath_cost, the one-thread measure of gpulmt's host path per ping-pong leg: a row per
//! size with a positive cost for each placement, the received bytes checked (a mismatch
//! fails the run), and bad placements refused with the reason.

use std::process::Output;

use gpulmt_tests::run_program;

fn run(args: &[&str]) -> (Output, String) {
    run_program(env!("CARGO_BIN_EXE_hostpath_cost"), &[], args)
}

#[test]
fn a_row_per_size_and_placement() {
    for placement in [["D", "D"], ["H", "H"], ["D", "H"], ["H", "D"]] {
        let (out, text) = run(&["-m", "1:64K", "-i", "100", "--reps", "1", placement[0], placement[1]]);
        assert!(out.status.success(), "{text}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some("anchor,metric,bytes,value"), "{text}");
        let rows: Vec<(u64, f64)> = lines
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                assert_eq!(&f[..2], ["hostpath_cost", "ns_per_leg"], "{text}");
                (f[2].parse().unwrap(), f[3].parse().unwrap())
            })
            .collect();
        let sizes: Vec<u64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(sizes, (0..=16).map(|k| 1u64 << k).collect::<Vec<_>>(), "{text}");
        assert!(rows.iter().all(|r| r.1 > 0.0 && r.1.is_finite()), "{text}");
    }
}

#[test]
fn a_bad_placement_is_refused() {
    let (out, text) = run(&["-i", "10", "D", "X"]);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("placement 'X'"), "{text}");
}
