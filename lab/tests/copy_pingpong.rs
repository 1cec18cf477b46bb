//! copy_pingpong, the copy-engine ping-pong floor that osu_latency is compared with, on
//! sim devices: it prints one anchor row per size with a positive half round trip, on
//! two devices and on one shared by both processes (each side checks the bytes it got,
//! and a mismatch would fail the run), and it fails fast, naming the cause, when the two
//! devices cannot reach each other.

use std::process::Output;

use gpulmt_tests::run_program;

fn run(envs: &[(&str, &str)], args: &[&str]) -> (Output, String) {
    let mut all = vec![("GPULMT_DEVICE", "sim")];
    all.extend_from_slice(envs);
    run_program(env!("CARGO_BIN_EXE_copy_pingpong"), &all, args)
}

/// (bytes, half round trip) of each row, after checking the header.
fn rows(out: &Output, text: &str) -> Vec<(u64, f64)> {
    assert!(out.status.success(), "{text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("anchor,metric,bytes,value"), "{text}");
    lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            assert_eq!(&f[..2], ["copy_pingpong", "half_rtt_us"], "{text}");
            (f[2].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect()
}

#[test]
fn a_row_per_size_on_two_devices() {
    let (out, text) = run(&[("GPULMT_SIM_DEVICES", "2")], &["-m", "1:64K", "-i", "200", "-w", "20"]);
    let rows = rows(&out, &text);
    let sizes: Vec<u64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(sizes, (0..=16).map(|k| 1u64 << k).collect::<Vec<_>>(), "{text}");
    assert!(rows.iter().all(|r| r.1.is_finite() && r.1 > 0.0), "{text}");
}

#[test]
fn both_processes_on_one_device() {
    let (out, text) = run(&[("GPULMT_SIM_DEVICES", "1")], &["-m", "8:8", "-i", "200", "-w", "20"]);
    assert_eq!(rows(&out, &text).len(), 1, "{text}");
}

#[test]
fn unreachable_devices_fail_with_the_cause() {
    let (out, text) = run(&[("GPULMT_SIM_DEVICES", "2"), ("GPULMT_SIM_PEER", "none")], &["-i", "10"]);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("peer access unavailable"), "{text}");
    assert!(text.contains("the second process ended before it was ready"), "{text}");
}
