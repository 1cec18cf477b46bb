//! `gpulmt-info` on the sim backend: its sections, the devices and peer matrix it
//! reports, the configuration in force (set or default, and stray variables), the
//! protocols the engine chooses per size, placement and device pair, and an invalid
//! setting reported by name.

use std::process::Command;

use gpulmt_tests::{info_program, job_lock, objects_of};

/// Runs gpulmt-info with no `GPULMT_*` variable of the test's environment but `envs`;
/// returns its exit code and stdout, having checked that it left nothing in /dev/shm.
fn info(envs: &[(&str, &str)]) -> (Option<i32>, String) {
    let _lock = job_lock();
    let mut cmd = Command::new(info_program());
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("GPULMT_")) {
            cmd.env_remove(k);
        }
    }
    let child = cmd.envs(envs.iter().copied()).stdout(std::process::Stdio::piped()).spawn().expect("start gpulmt-info");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for gpulmt-info");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let left = objects_of(&[], &[pid]);
    assert!(left.is_empty(), "gpulmt-info left {left:?} in /dev/shm\n{stdout}");
    (out.status.code(), stdout)
}

/// The words of the line of `text` that starts with `head` (after leading blanks).
fn line<'a>(text: &'a str, head: &str) -> Vec<&'a str> {
    text.lines()
        .map(str::trim_start)
        .find(|l| l.starts_with(head))
        .unwrap_or_else(|| panic!("no line starting with {head:?}\n{text}"))
        .split_whitespace()
        .collect()
}

/// The lines of the protocol table of the device pair `pair` (e.g. "0->1").
fn pair_table<'a>(text: &'a str, pair: &str) -> Vec<&'a str> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("devices ") && l.trim_end_matches(':').split_whitespace().any(|w| w == pair))
        .unwrap_or_else(|| panic!("no protocol table lists the pair {pair}\n{text}"));
    lines[start + 1..].iter().take_while(|l| !l.is_empty()).copied().collect()
}

/// (lone, receive-first, both-ways) of the row for `size` and `placement` ("D D").
fn choice<'a>(table: &[&'a str], size: &str, placement: &str) -> (&'a str, &'a str, &'a str) {
    let row: Vec<&str> = table
        .iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() > 5 && w[0] == size && format!("{} {}", w[1], w[2]) == placement)
        .unwrap_or_else(|| panic!("no row for {size} {placement} in {table:#?}"));
    (row[3], row[4], row[5])
}

#[test]
fn info_reports_backend_devices_configuration_and_protocols_on_sim() {
    let (code, out) = info(&[
        ("GPULMT_DEVICE", "sim"),
        ("GPULMT_SIM_DEVICES", "3"),
        ("GPULMT_SIM_PEER", "0-1"),
        ("GPULMT_CHUNK_SIZE", "256K"),
        ("GPULMT_NOT_A_SETTING", "1"),
    ]);
    assert_eq!(code, Some(0), "{out}");
    let sections: Vec<&str> = out.lines().filter(|l| l.starts_with("# ")).collect();
    assert_eq!(sections, ["# backend", "# devices", "# configuration", "# protocols"], "{out}");
    assert!(out.contains("backend: sim (GPULMT_DEVICE=sim)"), "{out}");
    assert_eq!(line(&out, "devices:"), ["devices:", "3"]);
    // The peer matrix: 0 and 1 reach each other, 2 reaches no one.
    assert_eq!(line(&out, "dev 0 "), ["dev", "0", "-", "y", "n"], "{out}");
    assert_eq!(line(&out, "dev 2 "), ["dev", "2", "n", "n", "-"], "{out}");

    // Every setting is listed, with its value and where it came from.
    for v in gpulmt::config::VARIABLES {
        assert!(out.lines().any(|l| l.starts_with(&format!("{} ", v.name))), "{} not listed\n{out}", v.name);
    }
    assert_eq!(&line(&out, "GPULMT_CHUNK_SIZE ")[2..4], ["256K", "(set;"], "{out}");
    assert_eq!(&line(&out, "GPULMT_EAGER_LIMIT ")[2..4], ["8K", "(default;"], "{out}");
    assert!(out.contains("GPULMT_NOT_A_SETTING is set but is no gpulmt setting"), "{out}");

    // What the engine chooses: peer-accessible devices by size, SHM without peer access
    // or with host memory, eager for small host messages, GET within one device.
    let peers = pair_table(&out, "0->1");
    assert_eq!(choice(&peers, "8B", "H H"), ("eager", "eager", "eager"));
    assert_eq!(
        choice(&peers, "8B", "D D"),
        ("get", "put", "get"),
        "small device receives posted first are offered (RTR)"
    );
    assert_eq!(choice(&peers, "512KiB", "D D").0, "put");
    assert_eq!(choice(&peers, "64MiB", "D D"), ("coop", "coop", "put"));
    assert_eq!(choice(&peers, "64MiB", "D H").0, "shm");
    let apart = pair_table(&out, "0->2");
    assert_eq!(choice(&apart, "512KiB", "D D"), ("shm", "shm", "shm"));
    let same = pair_table(&out, "1->1");
    assert_eq!(choice(&same, "64MiB", "D D").0, "get");
}

#[test]
fn info_names_an_invalid_setting_and_fails() {
    let (code, out) = info(&[("GPULMT_DEVICE", "sim"), ("GPULMT_CHUNK_SIZE", "6")]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("GPULMT_CHUNK_SIZE") && out.contains("INVALID"), "{out}");
    assert!(out.contains("error: GPULMT_CHUNK_SIZE=\"6\" is invalid: expected 4 KiB to 1 GiB"), "{out}");
    assert!(!out.contains("# protocols"), "{out}");
}
