//! `include/gpulmt.h` is generated from the crate by cbindgen: this test regenerates
//! it and fails when the committed header differs (the ABI changed but the header was
//! not regenerated). With `GPULMT_BLESS_HEADER=1` it writes the header instead.

use std::path::{Path, PathBuf};

const BLESS: &str = "GPULMT_BLESS_HEADER";

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The header as cbindgen generates it from the crate's sources now.
fn generate() -> String {
    let dir = crate_dir();
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("read ffi/cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut out = Vec::new();
    bindings.write(&mut out);
    String::from_utf8(out).expect("the header is UTF-8")
}

/// The first line where two texts differ, for the failure message.
fn first_difference(a: &str, b: &str) -> String {
    let (mut la, mut lb) = (a.lines(), b.lines());
    for n in 1.. {
        match (la.next(), lb.next()) {
            (None, None) => return "only line endings differ".into(),
            (x, y) if x != y => {
                return format!(
                    "line {n}:\n  committed: {}\n  generated: {}",
                    x.unwrap_or("<end>"),
                    y.unwrap_or("<end>")
                )
            }
            _ => {}
        }
    }
    unreachable!()
}

#[test]
fn committed_header_matches_the_crate() {
    let header: &Path = &crate_dir().join("../include/gpulmt.h");
    let generated = generate();
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(header, &generated).unwrap_or_else(|e| panic!("write {}: {e}", header.display()));
        return;
    }
    let committed = std::fs::read_to_string(header).unwrap_or_default();
    assert!(
        committed == generated,
        "include/gpulmt.h is out of date with ffi/src ({}).\n\
         Regenerate it with:\n    {BLESS}=1 cargo test -p gpulmt-ffi --test header\n\
         and review the diff (`git diff include/gpulmt.h`): a changed signature or constant is an ABI change.",
        first_difference(&committed, &generated)
    );
}
