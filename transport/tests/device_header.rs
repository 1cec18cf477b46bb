//! `include/gpulmt_device.cuh` against the library: compiled as C by the host compiler,
//! its layouts and constants must be the Rust ones (the device context the host fills,
//! the control area, the GIO packet's commit word and codes); and, where NVRTC can be
//! loaded, a kernel making every call of the device API must compile.

use std::mem::{offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use gpulmt::sym::layout::{self, DeviceCtx, DeviceOp, QueueTable, SendQueue};
use gpulmt::sym::nvrtc::{compile_device_kernels, nvrtc_available};
use gpulmt::sym::{Cmp, SignalOp};
use gpulmt_protocols::gio::{commit_word, AmoOp, Flags, OpCode};

fn include_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../include")
}

/// `(name, C expression)` pairs the C program prints as `name=value` lines.
fn c_values() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = Vec::new();
    let mut add = |name: &str, expr: &str| v.push((name.to_string(), expr.to_string()));
    add("ctx.size", "sizeof(gpulmt_device_ctx)");
    for f in ["version", "my_pe", "n_pes", "reserved", "heap_size", "heap_base", "bases", "queues"] {
        add(&format!("ctx.{f}"), &format!("offsetof(gpulmt_device_ctx, {f})"));
    }
    add("sq.size", "sizeof(gpulmt_gio_sq)");
    for f in SQ_FIELDS {
        add(&format!("sq.{f}"), &format!("offsetof(gpulmt_gio_sq, {f})"));
    }
    add("queues.size", "sizeof(gpulmt_gio_queues)");
    add("queues.sq", "offsetof(gpulmt_gio_queues, sq)");
    for c in ["ERRORS", "BARRIER_EPOCH", "GRID_COUNT", "GRID_GENERATION", "BASES"] {
        add(&format!("ctrl.{c}"), &format!("GPULMT_CTRL_{c}"));
    }
    for n in [1, 5, 4096] {
        add(&format!("ctrl.BARRIER_ARRIVALS_AT({n})"), &format!("GPULMT_CTRL_BARRIER_ARRIVALS_AT({n})"));
    }
    add("version", "GPULMT_DEVICE_CTX_VERSION");
    for c in ["PUT", "GET", "PUT_SIGNAL", "SIGNAL", "ATOMIC", "PTR"] {
        add(&format!("op.{c}"), &format!("GPULMT_OP_{c}"));
    }
    for c in ["EQ", "NE", "GT", "GE", "LT", "LE"] {
        add(&format!("cmp.{c}"), &format!("GPULMT_CMP_{c}"));
    }
    for c in ["SET", "ADD"] {
        add(&format!("signal.{c}"), &format!("GPULMT_SIGNAL_{c}"));
    }
    for c in
        ["OP_NOP", "OP_PUT", "OP_PUT_SIGNAL", "OP_GET", "OP_AMO", "FLAG_SRC_DEVICE", "FLAG_DST_DEVICE", "FLAG_FENCE"]
    {
        add(&format!("gio.{c}"), &format!("GPULMT_GIO_{c}"));
    }
    for c in ["FETCH_ADD", "COMPARE_SWAP", "SET", "FETCH"] {
        add(&format!("amo.{c}"), &format!("GPULMT_GIO_AMO_{c}"));
    }
    for (i, (pos, slots, op, flags, variant, target)) in COMMIT_CASES.iter().enumerate() {
        add(
            &format!("commit.{i}"),
            &format!("gpulmt_gio_commit_word({pos}ull, {slots}ull, {op}, {flags}, {variant}, {target})"),
        );
    }
    v
}

const SQ_FIELDS: [&str; 12] = [
    "ring",
    "slots",
    "reserve",
    "doorbell",
    "head",
    "cq_done",
    "cq_failed",
    "results",
    "target_of_pe",
    "fence_epoch_of_pe",
    "fence_epoch",
    "result_free",
];

/// `(pos, slots, op, flags, variant, target)`: laps of both parities, every field set.
const COMMIT_CASES: [(u64, u64, u8, u8, u8, u32); 5] = [
    (0, 8, 4, 1, 0, 0),
    (8, 8, 5, 5, 1, 3),
    (17, 8, 7, 2, 3, 0x7fff_ffff),
    (1 << 40, 1 << 20, 6, 2, 0, 12),
    (3, 4, 0, 0, 0, 0),
];

/// The values the library says each name must have.
fn rust_values() -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = Vec::new();
    let mut add = |name: &str, value: u64| v.push((name.to_string(), value));
    add("ctx.size", size_of::<DeviceCtx>() as u64);
    let ctx_offsets = [
        offset_of!(DeviceCtx, version),
        offset_of!(DeviceCtx, my_pe),
        offset_of!(DeviceCtx, n_pes),
        offset_of!(DeviceCtx, reserved),
        offset_of!(DeviceCtx, heap_size),
        offset_of!(DeviceCtx, heap_base),
        offset_of!(DeviceCtx, bases),
        offset_of!(DeviceCtx, queues),
    ];
    for (f, o) in
        ["version", "my_pe", "n_pes", "reserved", "heap_size", "heap_base", "bases", "queues"].iter().zip(ctx_offsets)
    {
        add(&format!("ctx.{f}"), o as u64);
    }
    add("sq.size", size_of::<SendQueue>() as u64);
    // Every field of SendQueue is a u64, in the header's order.
    for (i, f) in SQ_FIELDS.iter().enumerate() {
        add(&format!("sq.{f}"), 8 * i as u64);
    }
    assert_eq!(offset_of!(SendQueue, result_free), 88);
    add("queues.size", size_of::<QueueTable>() as u64);
    add("queues.sq", offset_of!(QueueTable, sq) as u64);
    let ctrl = [
        ("ERRORS", layout::CTRL_ERRORS),
        ("BARRIER_EPOCH", layout::CTRL_BARRIER_EPOCH),
        ("GRID_COUNT", layout::CTRL_GRID_COUNT),
        ("GRID_GENERATION", layout::CTRL_GRID_GENERATION),
        ("BASES", layout::CTRL_BASES),
    ];
    for (c, o) in ctrl {
        add(&format!("ctrl.{c}"), o);
    }
    for n in [1, 5, 4096] {
        add(&format!("ctrl.BARRIER_ARRIVALS_AT({n})"), layout::ctrl_barrier_arrivals(n));
    }
    add("version", layout::DEVICE_CTX_VERSION as u64);
    let ops = [
        ("PUT", DeviceOp::Put),
        ("GET", DeviceOp::Get),
        ("PUT_SIGNAL", DeviceOp::PutSignal),
        ("SIGNAL", DeviceOp::Signal),
        ("ATOMIC", DeviceOp::Atomic),
        ("PTR", DeviceOp::Ptr),
    ];
    for (c, op) in ops {
        add(&format!("op.{c}"), op as u64);
    }
    for (c, cmp) in
        [("EQ", Cmp::Eq), ("NE", Cmp::Ne), ("GT", Cmp::Gt), ("GE", Cmp::Ge), ("LT", Cmp::Lt), ("LE", Cmp::Le)]
    {
        add(&format!("cmp.{c}"), cmp as u64);
    }
    add("signal.SET", SignalOp::Set as u64);
    add("signal.ADD", SignalOp::Add as u64);
    let gio = [
        ("OP_NOP", OpCode::Nop as u64),
        ("OP_PUT", OpCode::Put as u64),
        ("OP_PUT_SIGNAL", OpCode::PutSignal as u64),
        ("OP_GET", OpCode::Get as u64),
        ("OP_AMO", OpCode::Amo as u64),
        ("FLAG_SRC_DEVICE", Flags::SRC_DEVICE.0 as u64),
        ("FLAG_DST_DEVICE", Flags::DST_DEVICE.0 as u64),
        ("FLAG_FENCE", Flags::FENCE.0 as u64),
    ];
    for (c, x) in gio {
        add(&format!("gio.{c}"), x);
    }
    let amos = [
        ("FETCH_ADD", AmoOp::FetchAdd),
        ("COMPARE_SWAP", AmoOp::CompareSwap),
        ("SET", AmoOp::Set),
        ("FETCH", AmoOp::Fetch),
    ];
    for (c, a) in amos {
        add(&format!("amo.{c}"), a as u64);
    }
    for (i, &(pos, slots, op, flags, variant, target)) in COMMIT_CASES.iter().enumerate() {
        let op = OpCode::from_u8(op).expect("a known op");
        add(&format!("commit.{i}"), commit_word(pos, slots, op, Flags(flags), variant, target));
    }
    v
}

#[test]
fn the_header_compiled_as_c_has_the_librarys_layouts_and_codes() {
    let dir = std::env::temp_dir().join(format!("gpulmt-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut prog =
        String::from("#include <stddef.h>\n#include <stdio.h>\n#include \"gpulmt_device.cuh\"\nint main(void) {\n");
    for (name, expr) in c_values() {
        prog += &format!("    printf(\"{name}=%llu\\n\", (unsigned long long)({expr}));\n");
    }
    prog += "    return 0;\n}\n";
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, prog).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-I"])
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}` (set CC to another): {e}"));
    assert!(built.status.success(), "the header does not compile as C:\n{}", String::from_utf8_lossy(&built.stderr));
    let out = Command::new(&exe).output().expect("run the layout program");
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(out.stdout).unwrap();
    let c: Vec<(String, u64)> = text
        .lines()
        .map(|l| {
            let (k, v) = l.split_once('=').expect("name=value");
            (k.to_string(), v.parse().expect("a number"))
        })
        .collect();
    let rust = rust_values();
    assert_eq!(c.len(), rust.len(), "{text}");
    for ((cn, cv), (rn, rv)) in c.iter().zip(&rust) {
        assert_eq!(cn, rn);
        assert_eq!(cv, rv, "{cn}: the header says {cv:#x}, the library {rv:#x}");
    }
}

#[test]
fn a_kernel_making_every_call_compiles_under_nvrtc() {
    if !nvrtc_available() {
        eprintln!("skipped: NVRTC (libnvrtc) not found; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH to run this");
        return;
    }
    let kernels = include_str!("device_header/every_call.cu");
    for opts in [&[][..], &["-DGPULMT_DEVICE_UNCHECKED"], &["--gpu-architecture=compute_90"]] {
        let ptx = compile_device_kernels(kernels, "every_call.cu", opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
        let text = ptx.to_src();
        assert!(text.contains(".entry every_call"), "{opts:?}: no kernel in the PTX");
        assert!(text.contains("gpulmt_dctx"), "{opts:?}: no context symbol in the PTX");
        assert!(text.contains("st.release.sys"), "{opts:?}: put_signal lost its release store");
    }
}
