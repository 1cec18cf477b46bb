//! osu_latency, osu_bw and osu_bibw on two sim ranks through the `gpulmt-run` launcher:
//! with `-c` each prints OSU 7.x's `Validation` column, `Pass` for every size whose bytes
//! both ranks checked, and exits 0; without it the table keeps its two columns.
//!
//! The launcher is another package's binary: `cargo build --workspace --bins` first.

use std::process::{Command, Stdio};

use gpulmt_tests::{job_lock, launcher};

/// Runs `bench args` on two sim ranks; the exit code and stdout.
fn osu(bench: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let _lock = job_lock();
    let mut cmd = Command::new(launcher());
    cmd.args(["-n", "2", "--timeout", "60", "--", bench]).args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("GPULMT_")) {
            cmd.env_remove(k);
        }
    }
    let out = cmd.env("GPULMT_DEVICE", "sim").stdin(Stdio::null()).output().expect("start the launcher");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The table's header and rows (lines after the `# ` preamble), split into columns on
/// runs of spaces; the header keeps `# Size` as one column.
fn table(stdout: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let header = stdout.lines().find(|l| l.starts_with("# Size")).expect("no table header");
    let columns = header["# Size".len()..].split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from);
    let header: Vec<String> = std::iter::once("# Size".to_string()).chain(columns).collect();
    let rows = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect();
    (header, rows)
}

/// With `-c`: the third column is `Validation`, every row says `Pass`, one row per size.
fn validated(bench: &str, column: &str, sizes: &[&str], placement: [&str; 2]) {
    let (code, stdout, stderr) = osu(bench, &["-m", "0:4K", "-i", "20", "-x", "2", "-c", placement[0], placement[1]]);
    let dump = format!("{bench}: exit {code:?}\n{stdout}\n{stderr}");
    assert_eq!(code, Some(0), "{dump}");
    let (header, rows) = table(&stdout);
    assert_eq!(header, ["# Size", column, "Validation"], "{dump}");
    let got: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(got, sizes, "{dump}");
    for r in &rows {
        assert_eq!(r.len(), 3, "{dump}");
        assert!(r[1].parse::<f64>().is_ok_and(|v| v >= 0.0), "{dump}");
        assert_eq!(r[2], "Pass", "{dump}");
    }
}

const POWERS_1_TO_4K: [&str; 13] = ["1", "2", "4", "8", "16", "32", "64", "128", "256", "512", "1024", "2048", "4096"];

#[test]
fn latency_prints_a_validation_column() {
    let sizes: Vec<&str> = std::iter::once("0").chain(POWERS_1_TO_4K).collect();
    validated(env!("CARGO_BIN_EXE_osu_latency"), "Latency (us)", &sizes, ["D", "D"]);
    validated(env!("CARGO_BIN_EXE_osu_latency"), "Latency (us)", &sizes, ["H", "D"]);
}

#[test]
fn bandwidth_prints_a_validation_column() {
    validated(env!("CARGO_BIN_EXE_osu_bw"), "Bandwidth (MB/s)", &POWERS_1_TO_4K, ["D", "D"]);
    validated(env!("CARGO_BIN_EXE_osu_bibw"), "Bandwidth (MB/s)", &POWERS_1_TO_4K, ["D", "H"]);
}

#[test]
fn without_validation_the_table_has_two_columns() {
    let (code, stdout, stderr) =
        osu(env!("CARGO_BIN_EXE_osu_latency"), &["-m", "1:8", "-i", "20", "-x", "2", "D", "D"]);
    let dump = format!("exit {code:?}\n{stdout}\n{stderr}");
    assert_eq!(code, Some(0), "{dump}");
    let (header, rows) = table(&stdout);
    assert_eq!(header, ["# Size", "Latency (us)"], "{dump}");
    assert_eq!(rows.len(), 4, "{dump}");
    assert!(rows.iter().all(|r| r.len() == 2), "{dump}");
}
