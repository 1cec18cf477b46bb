//! Tests of the configuration: reading values by their kinds, the cross-checks between
//! variables, the table against the sources that read the variables, and the generated
//! reference against `docs/configuration.md`.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::reference::REGENERATE;
use super::*;
use crate::device::sim::SimConfig;

fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Config::from_lookup(|k| m.get(k).cloned())
}

#[test]
fn docs_configuration_md_is_the_generated_reference() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let file = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; write it with `{REGENERATE}`", path.display()));
    let generated = reference_markdown();
    if file != generated {
        let line = file
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| file.lines().count().min(generated.lines().count()) + 1, |i| i + 1);
        panic!(
            "{} differs from config::VARIABLES (first at line {line}): regenerate it from the repository root with\n    {REGENERATE}",
            path.display()
        );
    }
}

/// `"GPULMT_..."` string literals of a Rust source: the variables it names.
fn variable_literals(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = source;
    while let Some(at) = rest.find("\"GPULMT_") {
        let name: String =
            rest[at + 1..].chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
        // A name ending in `_` is a prefix (`"GPULMT_SIM_"`), not a variable.
        if rest[at + 1 + name.len()..].starts_with('"') && !name.ends_with('_') {
            found.insert(name);
        }
        rest = &rest[at + 1..];
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Every `GPULMT_*` variable a transport source names is in the table (or set by the
/// launcher, or a test's own plumbing), and every variable of the table is read by some
/// source other than the table itself.
#[test]
fn the_table_lists_exactly_the_variables_the_sources_read() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let table = src.join("config/variables.rs");
    // This file names variables as test inputs, not as reads.
    let this_test = src.join("config/tests.rs");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(files.len() > 10 && files.contains(&table), "the scan found {files:?}");
    let mut read = BTreeSet::new();
    for f in files.iter().filter(|f| **f != table && **f != this_test) {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for name in variable_literals(&text) {
            read.insert(name);
        }
    }
    // Sanity: the scan sees reads in config.rs, the sim backend, logging and the launcher.
    for name in ["GPULMT_CHUNK_SIZE", "GPULMT_SIM_PEER", "GPULMT_LOG", "GPULMT_RANK"] {
        assert!(read.contains(name), "the scan missed {name}: {read:?}");
    }
    let known: BTreeSet<String> =
        VARIABLES.iter().map(|v| v.name).chain(LAUNCHER_VARIABLES.iter().map(|(n, _)| *n)).map(String::from).collect();
    // Variables that only tests set for their child processes are not settings.
    let missing: Vec<&String> = read.iter().filter(|n| !known.contains(*n) && !n.contains("TEST")).collect();
    assert!(missing.is_empty(), "read by transport sources but missing from config::VARIABLES: {missing:?}");
    let unread: Vec<&String> = known.iter().filter(|n| !read.contains(*n)).collect();
    assert!(unread.is_empty(), "in config::VARIABLES but read by no source: {unread:?}");
}

#[test]
fn variable_literals_finds_whole_names_only() {
    let src = r#"var("GPULMT_LOG"); const P: &str = "GPULMT_SIM_"; x("GPULMT_A1", "GPULMT_x") "GPULMT_"#;
    assert_eq!(variable_literals(src), ["GPULMT_A1", "GPULMT_LOG"].map(String::from).into());
}

/// Each default is valid for its kind, and setting a variable to its default changes
/// nothing: the defaults are written once, in the table.
#[test]
fn every_default_is_valid_and_setting_it_changes_nothing() {
    let defaults = Config::default();
    assert_eq!(cfg(&[]).unwrap(), defaults);
    let sim_defaults = SimConfig::default();
    for v in VARIABLES {
        let DefaultValue::Text(text) = v.default else { continue };
        v.kind.parse(text).unwrap_or_else(|e| panic!("{}'s default {text:?}: {e}", v.name));
        match v.class {
            Class::SimOnly => {
                let sim = SimConfig::from_lookup(|k| (k == v.name).then(|| text.to_string()))
                    .unwrap_or_else(|e| panic!("{}={text}: {e}", v.name));
                assert_eq!(sim, sim_defaults, "{}={text} is not the sim backend's default", v.name);
            }
            _ => assert_eq!(cfg(&[(v.name, text)]), Ok(defaults.clone()), "{}={text} is not the default", v.name),
        }
    }
    // The defaults the rest of the library relies on.
    assert_eq!((defaults.device, defaults.protocol, defaults.gpu), (DeviceChoice::Auto, ProtocolOverride::Auto, None));
    assert_eq!((defaults.eager_limit, defaults.chunk_size, defaults.slot_size), (8192, 2 << 20, 8448));
    assert_eq!((defaults.coop_min, defaults.put_min, defaults.bidir_put_min), (2 << 20, 512 << 10, 64 << 10));
    assert_eq!(
        (defaults.init_timeout, defaults.liveness_interval),
        (Duration::from_secs(30), Duration::from_millis(20))
    );
    assert_eq!((defaults.rtr_wait, defaults.copy_server_idle), (Duration::from_micros(2), Duration::from_micros(100)));
}

#[test]
fn meanings_fit_a_markdown_table_row() {
    for v in VARIABLES {
        assert!(!v.meaning.contains('|') && !v.meaning.contains('\n'), "{}", v.name);
        assert!(!v.kind.accepted().contains('|'), "{}", v.name);
        assert!(v.meaning.ends_with('.'), "{}: a meaning is sentences", v.name);
    }
    let names: BTreeSet<&str> = VARIABLES.iter().map(|v| v.name).collect();
    assert_eq!(names.len(), VARIABLES.len(), "a variable is listed twice");
}

#[test]
fn defaults_and_sizes() {
    assert_eq!(cfg(&[]).unwrap(), Config::default());
    assert_eq!(parse_size("64K"), Some(65536));
    assert_eq!(parse_size("1MiB"), Some(1 << 20));
    assert_eq!(parse_size("2g"), Some(2 << 30));
    assert_eq!(parse_size("12x"), None);
    let c = cfg(&[("GPULMT_PROTOCOL", "coop"), ("GPULMT_CHUNK_SIZE", "256K"), ("GPULMT_COOP_MIN", "4M")]).unwrap();
    assert_eq!(c.protocol, ProtocolOverride::Coop);
    assert_eq!(c.chunk_size, 256 << 10);
    assert_eq!(c.coop_min, 4 << 20);
    assert_eq!(cfg(&[("GPULMT_PUT_MIN", "never")]).unwrap().put_min, u64::MAX);
    assert!(!cfg(&[("GPULMT_PROGRESS_ON_POST", "0")]).unwrap().progress_on_post);
    assert_eq!(cfg(&[("GPULMT_BALANCE_MAX", "512K")]).unwrap().balance_max, 512 << 10);
    assert!(!cfg(&[("GPULMT_POLL_NEWEST", "0")]).unwrap().poll_newest);
    assert_eq!(cfg(&[]).unwrap().copy_priority, CopyPriority::Auto);
    assert_eq!(cfg(&[("GPULMT_COPY_PRIORITY", "Normal")]).unwrap().copy_priority, CopyPriority::Normal);
    assert_eq!(cfg(&[("GPULMT_COPY_PRIORITY", "high")]).unwrap().copy_priority, CopyPriority::High);
    let e = cfg(&[("GPULMT_COPY_PRIORITY", "max")]).unwrap_err();
    assert_eq!((e.var, e.why.as_str()), ("GPULMT_COPY_PRIORITY", "expected one of auto, high, normal"));
    assert_eq!(cfg(&[("GPULMT_DEVICE", " CUDA ")]).unwrap().device, DeviceChoice::Cuda);
    assert_eq!(cfg(&[("GPULMT_DEVICE", "")]).unwrap().device, DeviceChoice::Auto);
    assert_eq!(cfg(&[("GPULMT_DEVICE", "rocm")]).unwrap_err().why, "expected one of auto, cuda, sim");
    assert_eq!(cfg(&[("GPULMT_GPU", "3")]).unwrap().gpu, Some(3));
    let c = cfg(&[("GPULMT_COPY_SERVER_MAX", "64K"), ("GPULMT_COPY_SERVER_IDLE_US", "500")]).unwrap();
    assert_eq!((c.copy_server_max, c.copy_server_idle), (64 << 10, Duration::from_micros(500)));
}

/// Durations take units; a plain number keeps the unit of the variable's name, so that
/// settings written before units were accepted mean what they meant.
#[test]
fn durations_take_units_and_plain_numbers_keep_the_old_unit() {
    let c = cfg(&[
        ("GPULMT_INIT_TIMEOUT_MS", "5000"),
        ("GPULMT_LIVENESS_MS", "1500us"),
        ("GPULMT_RTR_WAIT_NS", "1000000"),
        ("GPULMT_COPY_SERVER_IDLE_US", "2ms"),
    ])
    .unwrap();
    assert_eq!(c.init_timeout, Duration::from_secs(5));
    assert_eq!(c.liveness_interval, Duration::from_micros(1500));
    assert_eq!(c.rtr_wait, Duration::from_millis(1));
    assert_eq!(c.copy_server_idle, Duration::from_millis(2));
    assert_eq!(cfg(&[("GPULMT_INIT_TIMEOUT_MS", "2m")]).unwrap().init_timeout, Duration::from_secs(120));
}

#[test]
fn eager_limit_grows_slots_unless_slot_size_is_explicit() {
    let c = cfg(&[("GPULMT_EAGER_LIMIT", "64K")]).unwrap();
    assert!(c.slot_size as u64 >= 65536 + SLOT_OVERHEAD as u64);
    let e = cfg(&[("GPULMT_EAGER_LIMIT", "64K"), ("GPULMT_SLOT_SIZE", "4096")]).unwrap_err();
    assert_eq!(e.var, "GPULMT_EAGER_LIMIT");
    assert!(e.to_string().contains("GPULMT_SLOT_SIZE"));
    let e = cfg(&[("GPULMT_EAGER_LIMIT", "4K"), ("GPULMT_DEVICE_EAGER_LIMIT", "8K")]).unwrap_err();
    assert_eq!(e.var, "GPULMT_DEVICE_EAGER_LIMIT");
    assert!(e.why.contains("GPULMT_EAGER_LIMIT"), "{e}");
}

#[test]
fn bad_values_name_the_variable() {
    for (k, v) in [
        ("GPULMT_DEVICE", "tpu"),
        ("GPULMT_PROTOCOL", "fast"),
        ("GPULMT_RING_SLOTS", "3"),
        ("GPULMT_PIPELINE_DEPTH", "0"),
        ("GPULMT_HANDLE_CACHE", "maybe"),
        ("GPULMT_CHUNK_SIZE", "0"),
        ("GPULMT_PROGRESS_ON_POST", "2"),
        ("GPULMT_BALANCE_MAX", "lots"),
        ("GPULMT_GPU", "first"),
        ("GPULMT_INIT_TIMEOUT_MS", "soon"),
    ] {
        let e = cfg(&[(k, v)]).unwrap_err();
        assert_eq!(e.var, k, "{e}");
    }
}

/// Values of the right form but outside the range the code works with are refused, and
/// the error names the variable, the value and the accepted range.
#[test]
fn out_of_range_values_are_refused_with_the_accepted_range() {
    for (k, v, range) in [
        ("GPULMT_CHUNK_SIZE", "1", "4 KiB to 1 GiB, a multiple of 4 KiB"),
        ("GPULMT_CHUNK_SIZE", "6", "4 KiB to 1 GiB, a multiple of 4 KiB"),
        ("GPULMT_CHUNK_SIZE", "5000", "4 KiB to 1 GiB, a multiple of 4 KiB"),
        ("GPULMT_CHUNK_SIZE", "2G", "4 KiB to 1 GiB, a multiple of 4 KiB"),
        ("GPULMT_RING_SLOTS", "48", "a power of two from 2 to 65536"),
        ("GPULMT_RING_SLOTS", "1", "a power of two from 2 to 65536"),
        ("GPULMT_SLOT_SIZE", "64", "256 B to 16 MiB, a multiple of 8 B"),
        ("GPULMT_SLOT_SIZE", "4100", "256 B to 16 MiB, a multiple of 8 B"),
        ("GPULMT_COOP_SENDER_SHARE", "1001", "from 0 to 1000"),
        ("GPULMT_LANES", "0", "from 1 to 16"),
        ("GPULMT_COPY_SPLIT", "100", "`0` (off) or at least 4 KiB"),
        ("GPULMT_EAGER_LIMIT", "2M", "0 B to 1 MiB"),
        ("GPULMT_RTR_WAIT_NS", "2s", "0 ns to 1 s (a plain number is in ns)"),
        ("GPULMT_LIVENESS_MS", "0", "1 ms to 60 s (a plain number is in ms)"),
    ] {
        let e = cfg(&[(k, v)]).unwrap_err();
        assert_eq!((e.var, e.value.as_str()), (k, v), "{e}");
        let text = e.to_string();
        assert!(text.contains(k) && text.contains(v) && text.contains(range), "{k}={v}: {text}");
    }
    assert_eq!(cfg(&[("GPULMT_COOP_SENDER_SHARE", "0")]).unwrap().coop_sender_permille, 0);
    assert_eq!(cfg(&[("GPULMT_COOP_SENDER_SHARE", "1000")]).unwrap().coop_sender_permille, 1000);
    assert_eq!(cfg(&[("GPULMT_CHUNK_SIZE", "4K")]).unwrap().chunk_size, 4096);
    assert_eq!(cfg(&[("GPULMT_COPY_SPLIT", "0")]).unwrap().copy_split, 0);
}

#[test]
fn the_engine_gets_the_configured_policy() {
    let c =
        cfg(&[("GPULMT_PUT_MIN", "1M"), ("GPULMT_RTR_PUT_MAX", "32K"), ("GPULMT_COOP_SENDER_SHARE", "250")]).unwrap();
    let e = c.engine_config(1, 4, 7, 2, vec![true, false, false, true]);
    assert_eq!((e.rank, e.size, e.node, e.devices), (1, 4, 7, 2));
    assert_eq!(e.policy, c.policy());
    assert_eq!((e.policy.put_min, e.rtr_put_max, e.coop_sender_permille), (1 << 20, 32 << 10, 250));
    assert!(!e.can_access(0, 1) && e.can_access(1, 1));
    // A forced protocol is the one that runs: no RTR offers.
    let forced = cfg(&[("GPULMT_PROTOCOL", "get")]).unwrap().engine_config(0, 2, 0, 1, vec![true]);
    assert_eq!(forced.rtr_put_max, 0);
}
