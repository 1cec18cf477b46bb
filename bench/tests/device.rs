//! `device_check` where there is no GPU: its kernels compile with NVRTC when NVRTC can be
//! loaded (they run on GPUs: `bash bench/gpu/run.sh device`), and on sim devices it says
//! there is nothing to run instead of failing.

use gpulmt_tests::{launcher, run_program};

const DEVICE_CHECK: &str = env!("CARGO_BIN_EXE_device_check");

#[test]
fn every_kernel_compiles_under_nvrtc_where_it_is_installed() {
    let (out, text) = run_program(DEVICE_CHECK, &[], &["--compile-only"]);
    match out.status.code() {
        Some(0) => {
            assert!(text.contains("9 kernels compiled with NVRTC"), "{text}");
            assert!(text.contains("stencil_gio compiled with NVRTC (float, double)"), "{text}");
        }
        // Exit 2: NVRTC is not installed here; the message says how to get it.
        Some(2) => {
            assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
            eprintln!(
                "skipped: NVRTC (libnvrtc) not found; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH to run this"
            );
        }
        _ => panic!("device_check --compile-only failed\n{text}"),
    }
}

#[test]
fn on_sim_devices_it_skips_and_succeeds() {
    let launcher = launcher();
    let (out, text) = run_program(
        launcher.to_str().expect("utf-8 path"),
        &[("GPULMT_DEVICE", "sim")],
        &["-n", "2", "--timeout", "60", "--", DEVICE_CHECK],
    );
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("device_check: skipped: the device API runs on CUDA GPUs"), "{text}");
}
