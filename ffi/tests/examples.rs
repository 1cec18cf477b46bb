//! The C examples, compiled with the system C compiler against `include/gpulmt.h` and
//! the cdylib this `cargo test` built, and run on sim devices:
//! - `examples/host.c`: a host that drives the LMT plugin ABI over its own socketpair,
//!   through every protocol, with the protocol counts checked against the policy, and
//!   with a peer that leaves mid-transfer;
//! - `examples/pingpong.c`: the plain endpoint API under `gpulmt-run -n 2`, host and
//!   device buffers;
//! - `tests/c/misuse.c`: the ABI called wrongly (NULL, stale and garbage contexts,
//!   impossible lengths, released device memory, a configuration out of range): every
//!   call must return its error code.
//! - `examples/sym.c`: the symmetric heap's host calls under `gpulmt-run -n 3`, with
//!   both headers included (gpulmt.h and gpulmt_device.cuh compiled as C).
//! - `examples/ga.c`: global arrays (`gpulmt_ga_*`) under `gpulmt-run -n 2` and `-n 3`.
//!
//! Needs `cc` (or `$CC`) and the launcher: run `cargo build --workspace` first.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpulmt_tests::{
    compile_c as compile, expected_pingpong, expected_protocol, job_lock, repo_root, sizes, target_profile_dir, Job,
    JobOutput, Mem, Setup,
};

/// Runs `cmd` with only the given `GPULMT_*` settings, killing it after `limit`.
fn run_with_limit(mut cmd: Command, env: &[(&str, &str)], limit: Duration, what: String) -> JobOutput {
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|k| k.starts_with("GPULMT_")) {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let t0 = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    while child.try_wait().expect("wait for the example").is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("collect the example's output");
    JobOutput {
        what,
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        elapsed: t0.elapsed(),
    }
}

/// `examples/host.c`, compiled once for the tests that run it.
fn host_example() -> &'static Path {
    static HOST: OnceLock<PathBuf> = OnceLock::new();
    HOST.get_or_init(|| compile("ffi/examples/host.c", "host", &["-std=c11"], true))
}

#[test]
fn header_compiles_alone_as_c99_and_cxx() {
    let dir = target_profile_dir().join("ffi-examples");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("header_only.c");
    std::fs::write(&src, "#include <gpulmt.h>\nint main(void) { return GPULMT_SUCCESS; }\n").unwrap();
    let src = src.to_str().unwrap();
    compile(src, "header_only_c99", &["-std=c99"], false);
    // C++ too, where a C++ compiler is installed.
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if Command::new(&cxx).arg("--version").output().is_ok_and(|o| o.status.success()) {
        let o = Command::new(&cxx)
            .args(["-x", "c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-I"])
            .arg(repo_root().join("include"))
            .arg(src)
            .output()
            .unwrap();
        assert!(o.status.success(), "gpulmt.h does not compile as C++:\n{}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn host_example_moves_device_buffers_through_every_protocol() {
    host_example_every_protocol("0");
}

/// As above, with no `send_blob`: gpulmt's rings carry every control packet but the RTS
/// cookie (host.c fails if a CTS cookie or a blob reaches its own channel).
#[test]
fn host_example_on_gpulmts_rings_moves_device_buffers_through_every_protocol() {
    host_example_every_protocol("1");
}

fn host_example_every_protocol(rings: &str) {
    let host = host_example();
    for protocol in ["get", "put", "coop", "shm", "auto"] {
        let _lock = job_lock();
        // Both ranks send at once, so `auto`'s one-way PUT and COOPERATE rules may or may not apply
        // depending on timing: keep `auto` to its deterministic part here.
        let env = [
            ("GPULMT_DEVICE", "sim"),
            ("GPULMT_PROTOCOL", protocol),
            ("GPULMT_PUT_MIN", "never"),
            ("GPULMT_COOP_MIN", "never"),
            ("GPULMT_HOST_RINGS", rings),
        ];
        let what = format!(
            "GPULMT_DEVICE=sim GPULMT_PROTOCOL={protocol} GPULMT_PUT_MIN=never GPULMT_COOP_MIN=never GPULMT_HOST_RINGS={rings} {}",
            host.display()
        );
        let out = run_with_limit(Command::new(host), &env, Duration::from_secs(90), what);
        out.assert_ok(2, &format!("host {protocol}")).assert_no_litter();
        // Each rank received one message of each size, device to device, between the
        // two peer-accessible sim devices.
        let list = out.stdout.lines().find_map(|l| l.strip_prefix("sizes=")).expect("sizes= line");
        let setup = Setup { protocol, put_min: u64::MAX, coop_min: u64::MAX, ..Setup::default() };
        for rank in 0..2 {
            let mut want: gpulmt_tests::Counters =
                ["get", "put", "coop", "shm", "self"].map(|k| (k.to_string(), 0)).into();
            for len in sizes(list) {
                let p = expected_protocol(&setup, Mem::D, Mem::D, len).expect("every size is a rendezvous");
                *want.get_mut(p).unwrap() += 1;
            }
            assert_eq!(out.protocols(rank), want, "rank {rank}: protocols\n{}", out.dump());
        }
    }
}

#[test]
fn host_example_fails_transfers_with_a_departed_peer() {
    let host = host_example();
    let _lock = job_lock();
    for rings in ["0", "1"] {
        let what = format!("GPULMT_DEVICE=sim GPULMT_HOST_RINGS={rings} {} --peer-dies", host.display());
        let mut cmd = Command::new(host);
        cmd.arg("--peer-dies");
        let out = run_with_limit(
            cmd,
            &[("GPULMT_DEVICE", "sim"), ("GPULMT_HOST_RINGS", rings)],
            Duration::from_secs(90),
            what,
        );
        out.assert_ok(2, "host peer-dies").assert_no_litter();
    }
}

#[test]
fn pingpong_example_runs_under_the_launcher() {
    let pingpong = compile("ffi/examples/pingpong.c", "pingpong", &["-std=c11"], true);
    let list = "0,1,7,4095,4096,65537,4194304";
    for (placement, mem) in [("host", Mem::H), ("device", Mem::D)] {
        let mut args = vec![placement, "2"];
        args.extend(list.split(','));
        let out = Job::new(pingpong.to_str().unwrap(), 2, &args).run();
        out.assert_ok(2, "pingpong");
        // Two round trips per size.
        let once = expected_pingpong(&Setup::default(), mem, mem, &sizes(list));
        for (rank, want) in once.iter().enumerate() {
            let want: gpulmt_tests::Counters = want.iter().map(|(k, v)| (k.clone(), 2 * v)).collect();
            let got = out.protocols(rank);
            assert_eq!(
                gpulmt_tests::rtr_merged(&got),
                gpulmt_tests::rtr_merged(&want),
                "rank {rank}: protocols ({placement})\n{}",
                out.dump()
            );
            assert!(
                got["put"] >= want["put"],
                "rank {rank}: fewer pushes than the policy's ({placement})\n{}",
                out.dump()
            );
        }
    }
}

/// Misuse of the C ABI gives error codes, never a crash or a success: calls after
/// `gpulmt_finalize` (stale handle), made-up handles, `SIZE_MAX` and other lengths
/// beyond `PTRDIFF_MAX`, device memory after `gpulmt_mem_free` + `gpulmt_mem_free_commit`,
/// a second `gpulmt_init` while the first context lives; and each of
/// `GPULMT_CHUNK_SIZE=1..6` fails `gpulmt_init` with `GPULMT_ERR_CONFIG`.
#[test]
fn misuse_of_the_c_abi_gives_error_codes() {
    let misuse = compile("ffi/tests/c/misuse.c", "misuse", &["-std=c11"], true);
    let out = Job::new(misuse.to_str().unwrap(), 2, &["7"]).run();
    out.assert_ok(2, "misuse");
    for size in ["1", "2", "3", "4", "5", "6"] {
        let _lock = job_lock();
        let what = format!("GPULMT_CHUNK_SIZE={size} misuse config");
        let mut cmd = Command::new(&misuse);
        cmd.arg("config");
        let out = run_with_limit(
            cmd,
            &[("GPULMT_DEVICE", "sim"), ("GPULMT_CHUNK_SIZE", size)],
            Duration::from_secs(60),
            what,
        );
        out.assert_ok(1, "config");
        assert!(out.stdout.contains(&format!("GPULMT_CHUNK_SIZE=\"{size}\" is invalid")), "{}", out.dump());
    }
}

#[test]
fn sym_example_runs_under_the_launcher() {
    let sym = compile("ffi/examples/sym.c", "sym", &["-std=c11"], true);
    let out = Job::new(sym.to_str().unwrap(), 3, &[]).run();
    out.assert_ok(3, "sym").assert_no_litter();
    for rank in 0..3 {
        let c = out.counters(rank, "symc");
        assert_eq!((c["ctx_pe"], c["ctx_pes"], c["total"]), (rank as u64, 3, 1500), "rank {rank}\n{}", out.dump());
        assert_eq!(c["offset"], out.counters(0, "symc")["offset"], "rank {rank}: another offset\n{}", out.dump());
    }
}

#[test]
fn ga_example_runs_under_the_launcher() {
    let ga = compile("ffi/examples/ga.c", "ga", &["-std=c11"], true);
    for n in [2u64, 3] {
        let out = Job::new(ga.to_str().unwrap(), n as usize, &[]).run();
        out.assert_ok(n as usize, "ga").assert_no_litter();
        for rank in 0..n as usize {
            let c = out.counters(rank, "gac");
            // 9 elements, 20 accumulates of 2 from each rank; the 10x7 array owned once;
            // 8 refusals (two of them waits: on a copy of a waited handle, after destroy).
            assert_eq!((c["total"], c["owned"], c["refused"]), (9 * 40 * n, 70, 8), "rank {rank}\n{}", out.dump());
        }
    }
}
