//! SpTS on sim devices, as real multi-process jobs: both modes (gio: the sync-free
//! protocol on the host; inter-k: levels and the host's exchange) on 1, 2, 3 and 4 ranks,
//! contiguous and block-cyclic rows, a MatrixMarket file, each checked bit for bit against
//! the serial CPU reference with `--check`; the check catching a wrong value; the CSV row;
//! with the `mpi` feature, both modes across 2 pseudo-nodes under `mpirun` (every remote
//! value through the heap's host queue and the proxies). The kernels compile under NVRTC
//! where it is installed.
//!
//! The launcher is another package's binary: `cargo build --workspace --bins` first. Jobs
//! take the session's job lock.

use std::process::Stdio;
use std::time::Duration;

use gpulmt_tests::live::LiveJob;
use gpulmt_tests::{job_lock, launcher_command, run_program, JobOutput};

const SPTS: &str = env!("CARGO_BIN_EXE_spts");
const MODES: [&str; 2] = ["gio", "inter-k"];

/// Runs `spts args` on `n` sim ranks (2 devices).
fn job(n: usize, args: &[&str]) -> JobOutput {
    let _lock = job_lock();
    let mut cmd = launcher_command(n, 100, SPTS.as_ref(), args, &[("GPULMT_SIM_DEVICES", "2")]);
    cmd.stdin(Stdio::null());
    LiveJob::spawn(cmd, format!("gpulmt-run -n {n} spts {}", args.join(" "))).finish(Duration::from_secs(120))
}

/// Exit 0 and a bit-identical check of every row.
fn assert_passed(out: &JobOutput) {
    out.assert_code(0);
    assert!(
        out.stdout.lines().any(|l| l.starts_with("check: PASS") && l.contains(", 0 not bit-identical")),
        "no passed check\n{}",
        out.dump()
    );
}

#[test]
fn both_modes_match_the_reference_on_one_to_four_ranks() {
    for n in [1, 2, 3, 4] {
        for mode in MODES {
            assert_passed(&job(n, &["--n", "3000", "--iters", "2", "--mode", mode, "--check"]));
        }
    }
}

/// Block-cyclic rows: every rank depends on every other, in both directions.
#[test]
fn block_cyclic_rows_match_the_reference() {
    for mode in MODES {
        for cyclic in ["1", "37"] {
            let out = job(4, &["--n", "2000", "--iters", "1", "--mode", mode, "--cyclic", cyclic, "--check"]);
            assert_passed(&out);
            assert!(out.stdout.contains(&format!("block-cyclic, {cyclic} rows a block")), "{}", out.dump());
        }
    }
}

#[test]
fn a_matrix_market_pattern_solves() {
    let dir = std::env::temp_dir().join(format!("spts-mtx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("chain.mtx");
    // A chain (row i reads i - 1) with long-range entries from row 0, upper entries too.
    let mut text = String::from("%%MatrixMarket matrix coordinate real general\n% test\n");
    let rows = 400;
    let mut entries = Vec::new();
    for i in 1..=rows {
        entries.push(format!("{i} {i} 4"));
        if i > 1 {
            entries.push(format!("{i} {} -1", i - 1));
            entries.push(format!("{} {i} -1", i - 1));
        }
        if i > 10 && i % 7 == 0 {
            entries.push(format!("{i} 1 0.5"));
        }
    }
    text += &format!("{rows} {rows} {}\n{}\n", entries.len(), entries.join("\n"));
    std::fs::write(&path, text).unwrap();
    let mtx = path.to_str().unwrap();
    for mode in MODES {
        let out = job(3, &["--mtx", mtx, "--mode", mode, "--iters", "1", "--check"]);
        assert_passed(&out);
        assert!(out.stdout.contains("levels 400"), "a chain of 400 rows has 400 levels\n{}", out.dump());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_check_catches_a_wrong_value_and_the_csv_has_the_run() {
    for mode in MODES {
        let out = job(2, &["--n", "1000", "--iters", "1", "--mode", mode, "--corrupt-rank", "1"]);
        out.assert_code(1);
        assert!(
            out.stdout.lines().any(|l| l.starts_with("check: FAIL 1000 rows, 1 not bit-identical")),
            "{}",
            out.dump()
        );
    }
    let csv = std::env::temp_dir().join(format!("spts-{}.csv", std::process::id()));
    let _ = std::fs::remove_file(&csv);
    for mode in MODES {
        let out = job(2, &["--n", "1500", "--iters", "2", "--mode", mode, "--csv", csv.to_str().unwrap()]);
        out.assert_code(0);
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    std::fs::remove_file(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "bench,mode,ranks,n,nnz,levels,time_ms");
    assert_eq!(lines.len(), 3, "{text}");
    for (line, mode) in lines[1..].iter().zip(MODES) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(&f[..4], ["spts", mode, "2", "1500"], "{line}");
        assert!(f[4].parse::<usize>().unwrap() > 1500 && f[5].parse::<usize>().unwrap() > 10, "{line}");
        assert!(f[6].parse::<f64>().unwrap() > 0.0, "{line}");
    }
}

#[test]
fn the_kernels_compile_under_nvrtc_where_it_is_installed() {
    let (out, text) = run_program(SPTS, &[], &["--compile-only"]);
    match out.status.code() {
        Some(0) => assert!(text.contains("spts_gio and spts_level compiled with NVRTC"), "{text}"),
        // Exit 2: NVRTC is not installed here; the message says how to get it.
        Some(2) => {
            assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
            eprintln!(
                "skipped: NVRTC (libnvrtc) not found; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH to run this"
            );
        }
        _ => panic!("spts --compile-only failed\n{text}"),
    }
}

/// Across 2 pseudo-nodes (`mpirun`, the `mpi` feature): 2 ranks (every remote value
/// through the queues and the proxies) and 4 (2 a node: some direct, some queued); gio
/// with its streams to the other node, and with a put per value (`--unbatched`).
#[cfg(feature = "mpi")]
#[test]
fn both_modes_match_the_reference_across_pseudo_nodes() {
    use gpulmt_tests::{have_mpirun, mpirun_command};
    if !have_mpirun() {
        return;
    }
    let _lock = job_lock();
    for np in [2, 4] {
        for mode in [&["--mode", "gio"][..], &["--mode", "gio", "--unbatched"], &["--mode", "inter-k"]] {
            let mut args = vec!["--n", "2000", "--iters", "1", "--cyclic", "16", "--check"];
            args.extend_from_slice(mode);
            let cmd = mpirun_command(np, &[], SPTS.as_ref(), &args, &[("GPULMT_PSEUDO_NODES", "2")]);
            let what = format!("mpirun -np {np} spts {} across 2 pseudo-nodes", args.join(" "));
            let out = LiveJob::spawn(cmd, what).finish(Duration::from_secs(300));
            assert_passed(&out);
            if mode.len() == 2 && mode[1] == "gio" {
                let summary = out.stdout.lines().find(|l| l.starts_with("summary:")).unwrap_or_default();
                assert!(
                    summary.contains(" in streams to other nodes") && !summary.contains(" 0 in streams"),
                    "rank 0 streams to the other node\n{}",
                    out.dump()
                );
            }
        }
    }
}
