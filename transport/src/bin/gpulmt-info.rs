//! `gpulmt-info`: what gpulmt sees on this node and what it would do, like `ucx_info`.
//!
//! ```text
//! gpulmt-info [--sizes 8,4K,64K,512K,2M,64M]
//! ```
//!
//! Prints, in sections that start with `# `:
//! - `# backend`: the device backend the configuration selects, and the driver's version;
//! - `# devices`: each device, the peer-access matrix and whether MPS serves each device;
//! - `# configuration`: every `GPULMT_*` setting, its value and whether it was set or is
//!   the default (and `GPULMT_*` variables of the environment that are no setting);
//! - `# protocols`: the protocol a message takes with this configuration, per size and
//!   placement (sender's and receiver's memory), for each pair of local devices. The
//!   protocol engine itself decides: two engines of a pretend two-rank job are driven
//!   through the message's first packets, so what is printed is what a job would do.
//!
//! Exit status: 0; 1 when the configuration is invalid or no backend is available (what
//! can be printed still is).

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Parser;
use gpulmt::config::{self, Config, DefaultValue, Variable, LAUNCHER_VARIABLES, VARIABLES};
use gpulmt::device::{self, Backend, BackendKind};
use gpulmt_protocols::engine::{Action, BufDesc, Engine};
use gpulmt_protocols::wire::{Packet, Region};
use gpulmt_protocols::{Rank, ReqId};

#[derive(Parser, Debug)]
#[command(name = "gpulmt-info", about = "Prints gpulmt's backend, devices, configuration and protocol choices")]
struct Args {
    /// Message sizes of the protocol table (bytes; K/M/G suffixes allowed).
    #[arg(long, value_delimiter = ',', default_value = "8,4K,64K,512K,2M,64M", value_parser = parse_size)]
    sizes: Vec<u64>,
}

fn parse_size(s: &str) -> Result<u64, String> {
    config::parse_size(s).ok_or_else(|| format!("{s:?} is not a size such as 8, 4K or 2M"))
}

/// Appends a line to the report.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        // Writing into a String cannot fail.
        let _ = writeln!($out, $($arg)*);
    }};
}

fn main() -> ExitCode {
    gpulmt::logging::init("warn");
    let args = Args::parse();
    let mut out = String::new();
    let status = report(&mut out, &args);
    // One write at the end; a reader that stops early (`| head`) is not an error.
    use std::io::Write as _;
    let _ = std::io::stdout().write_all(out.as_bytes());
    status
}

/// The whole report; the exit status says whether it is complete.
fn report(out: &mut String, args: &Args) -> ExitCode {
    say!(out, "gpulmt-info {}", env!("CARGO_PKG_VERSION"));
    let cfg = Config::from_env();
    let backend = cfg.as_ref().ok().map(|c| (c.device, device::select(c.device)));
    print_backend(out, &backend.as_ref().map(|(choice, b)| (*choice, b.as_ref().map_err(|e| e.to_string()))));
    if let Some((_, Ok(b))) = &backend {
        print_devices(out, b);
    }
    print_configuration(out, &|k| std::env::var(k).ok());
    let cfg = match cfg {
        Ok(c) => c,
        Err(e) => {
            say!(out, "\nerror: {e}");
            return ExitCode::FAILURE;
        }
    };
    match backend {
        Some((_, Ok(b))) => {
            print_protocols(out, &cfg, &b, &args.sizes);
            ExitCode::SUCCESS
        }
        _ => ExitCode::FAILURE,
    }
}

fn choice_name(c: config::DeviceChoice) -> &'static str {
    match c {
        config::DeviceChoice::Auto => "auto",
        config::DeviceChoice::Cuda => "cuda",
        config::DeviceChoice::Sim => "sim",
    }
}

/// The backend line and the driver's version.
fn print_backend(out: &mut String, backend: &Option<(config::DeviceChoice, Result<&Backend, String>)>) {
    say!(out, "\n# backend");
    match backend {
        None => say!(out, "backend: not selected (the configuration is invalid, see below)"),
        Some((choice, Err(e))) => say!(out, "backend: none (GPULMT_DEVICE={}): {e}", choice_name(*choice)),
        Some((choice, Ok(b))) => {
            let why = match (choice, b.kind()) {
                (config::DeviceChoice::Auto, BackendKind::Sim) => match device::cuda::CudaBackend::try_new() {
                    Err(e) => format!("GPULMT_DEVICE=auto, CUDA unavailable: {e}"),
                    Ok(_) => "GPULMT_DEVICE=auto".into(),
                },
                (config::DeviceChoice::Auto, BackendKind::Cuda) => "GPULMT_DEVICE=auto, driver and GPU found".into(),
                (c, _) => format!("GPULMT_DEVICE={}", choice_name(*c)),
            };
            say!(out, "backend: {} ({why})", b.kind());
            match b.kind() {
                BackendKind::Cuda => say!(out, "driver: {}", cuda_driver_version()),
                BackendKind::Sim => {
                    say!(out, "driver: none (simulated devices: memory in /dev/shm, copies on threads)")
                }
            }
        }
    }
}

/// The CUDA driver's version, as `cuDriverGetVersion` reports it.
fn cuda_driver_version() -> String {
    let mut v: std::ffi::c_int = 0;
    // SAFETY: the CUDA backend was created, so the driver library is loaded and
    // initialised; `v` is a valid out-pointer for the call's duration.
    let rc = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if rc == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        format!("CUDA driver {}.{} (API version {v})", v / 1000, (v % 1000) / 10)
    } else {
        format!("CUDA driver (version unknown: cuDriverGetVersion returned {rc:?})")
    }
}

/// A device's name: the GPU's for CUDA.
fn device_name(b: &Backend, dev: u32) -> String {
    match b.kind() {
        BackendKind::Sim => "simulated device".into(),
        BackendKind::Cuda => cudarc::driver::result::device::get(dev as i32)
            .and_then(cudarc::driver::result::device::get_name)
            .unwrap_or_else(|e| format!("(name unknown: {e})")),
    }
}

fn print_devices(out: &mut String, b: &Backend) {
    let n = b.device_count();
    say!(out, "\n# devices");
    say!(out, "devices: {n}");
    for d in 0..n {
        let mps = match b.mps_enabled(d) {
            Some(true) => "MPS on",
            Some(false) => "MPS off",
            None => "MPS unknown",
        };
        say!(out, "device {d}: {} ({mps})", device_name(b, d));
    }
    say!(out, "peer access (y: the copy engine of the row's device reaches the memory of the column's):");
    let header: String = (0..n).map(|d| format!("{d:>4}")).collect();
    say!(out, "       {header}");
    for a in 0..n {
        let row: String = (0..n)
            .map(|c| {
                format!(
                    "{:>4}",
                    if a == c {
                        "-"
                    } else if b.can_access_peer(a, c) {
                        "y"
                    } else {
                        "n"
                    }
                )
            })
            .collect();
        say!(out, "dev {a:<3}{row}");
    }
}

/// Every setting with its value and where it came from, then the `GPULMT_*` variables of
/// the environment that are no setting (a misspelt name is silently ignored otherwise).
fn print_configuration(out: &mut String, get: &dyn Fn(&str) -> Option<String>) {
    say!(out, "\n# configuration");
    let width = VARIABLES.iter().map(|v| v.name.len()).max().unwrap_or(0);
    for v in VARIABLES {
        let (value, from) = setting(v, get);
        say!(out, "{:<width$} = {value:<10} ({from}; {})", v.name, v.class.name());
    }
    let mut unknown: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| k.starts_with("GPULMT_"))
        // The launcher's variables, and the PMPI shim's own settings.
        .filter(|k| !LAUNCHER_VARIABLES.iter().any(|(n, _)| n == k) && !k.starts_with("GPULMT_MPI_"))
        .filter(|k| config::variable(k).is_none())
        .collect();
    unknown.sort();
    for k in unknown {
        say!(out, "{k} is set but is no gpulmt setting (misspelt?)");
    }
}

/// A setting's value and whether it was set, with a note when the value is invalid.
fn setting(v: &Variable, get: &dyn Fn(&str) -> Option<String>) -> (String, String) {
    match get(v.name).filter(|t| !t.trim().is_empty()) {
        Some(text) => {
            let note = match v.kind.parse(&text) {
                Ok(_) => "set".to_string(),
                Err(why) => format!("set, INVALID: {why}"),
            };
            (text, note)
        }
        None => match v.default {
            DefaultValue::Text(t) => (t.to_string(), "default".into()),
            DefaultValue::Unset(means) => ("unset".into(), format!("default: {means}")),
        },
    }
}

// ---------------------------------------------------------------------------------
// Protocol choices
// ---------------------------------------------------------------------------------

/// Node id of the pretend job: its regions must name the engines' own node.
const NODE: u64 = 1;
const TAG: i32 = 7;

/// One buffer of the pretend transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mem {
    Host,
    Device(u32),
}

/// When the message meets its receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// The message arrives before its receive is posted, traffic one way.
    Lone,
    /// The receive is posted first (an RTR offer where `auto` makes one).
    ReceiveFirst,
    /// The receiver's own rendezvous to the sender is in flight (traffic both ways).
    BothWays,
}

fn desc(mem: Mem, len: u64) -> BufDesc {
    match mem {
        Mem::Host => BufDesc::host(len),
        Mem::Device(d) => BufDesc {
            len,
            device: Some(d),
            region: Some(Region {
                handle: [0; gpulmt_protocols::wire::HANDLE_BYTES],
                alloc_size: len,
                offset: 0,
                device: d,
                node: NODE,
                buffer_id: 1,
            }),
        },
    }
}

/// Moves every packet `from` emits into `to`; returns the other actions.
fn deliver(from: &mut Engine, from_rank: Rank, to: &mut Engine) -> Vec<Action> {
    let mut rest = Vec::new();
    while let Some(a) = from.poll_action() {
        match a {
            Action::Send { packet, .. } => to.on_packet(from_rank, packet),
            other => rest.push(other),
        }
    }
    rest
}

/// The protocol a message of `len` bytes from `src` (rank 0) to `dst` (rank 1) takes, and
/// why, as the engines of a two-rank job with `cfg` decide it.
fn decide(cfg: &Config, devices: u32, peer: &[bool], src: Mem, dst: Mem, len: u64, case: Case) -> (String, String) {
    let engine = |rank| Engine::new(cfg.engine_config(rank, 2, NODE, devices, peer.to_vec()));
    let (mut tx, mut rx) = (engine(0), engine(1));
    if tx.is_eager(len, src != Mem::Host) {
        let limit = if src == Mem::Host { "GPULMT_EAGER_LIMIT" } else { "GPULMT_DEVICE_EAGER_LIMIT" };
        return ("eager".into(), format!("at most {limit}: inline in the control packet"));
    }
    if case == Case::BothWays {
        rx.post_send(ReqId(9), 0, TAG + 1, desc(dst, len), None);
        while rx.poll_action().is_some() {}
    }
    if case == Case::ReceiveFirst {
        rx.post_recv(ReqId(2), Some(0), Some(TAG), desc(dst, len));
        deliver(&mut rx, 1, &mut tx);
        tx.post_send(ReqId(1), 1, TAG, desc(src, len), None);
        let mut pushed = false;
        while let Some(a) = tx.poll_action() {
            match a {
                Action::Send { packet: Packet::RtrPut { .. }, .. } => pushed = true,
                Action::Send { packet, .. } => rx.on_packet(0, packet),
                _ => {}
            }
        }
        if pushed {
            return ("put".into(), "the receive was offered (RTR): the sender's engine pushes at once".into());
        }
    } else {
        tx.post_send(ReqId(1), 1, TAG, desc(src, len), None);
        deliver(&mut tx, 0, &mut rx);
        rx.post_recv(ReqId(2), Some(0), Some(TAG), desc(dst, len));
    }
    while let Some(a) = rx.poll_action() {
        if let Action::Chose { choice, .. } = a {
            return (choice.protocol.to_string(), choice.reason.to_string());
        }
    }
    ("?".into(), "the engine chose no protocol (a bug of gpulmt-info)".into())
}

fn print_protocols(out: &mut String, cfg: &Config, b: &Backend, sizes: &[u64]) {
    let n = b.device_count();
    let peer: Vec<bool> = (0..n * n).map(|i| b.can_access_peer(i / n, i % n)).collect();
    say!(out, "\n# protocols");
    say!(out, "GPULMT_PROTOCOL={}; placement: the sender's memory, then the receiver's (D device, H host)", {
        format!("{:?}", cfg.protocol).to_ascii_lowercase()
    });
    say!(out, "lone: the message arrives before its receive; receive-first: the receive was posted before it;");
    say!(out, "both-ways: the receiver's own rendezvous to the sender is in flight");
    // Device pairs with the same choices share one table.
    let mut tables: BTreeMap<Vec<String>, Vec<(u32, u32)>> = BTreeMap::new();
    let mut order = Vec::new();
    for s in 0..n {
        for d in 0..n {
            let rows = protocol_rows(cfg, n, &peer, s, d, sizes);
            if !tables.contains_key(&rows) {
                order.push(rows.clone());
            }
            tables.entry(rows).or_default().push((s, d));
        }
    }
    for rows in order {
        let pairs: Vec<String> = tables[&rows].iter().map(|(s, d)| format!("{s}->{d}")).collect();
        say!(out, "\ndevices {}:", pairs.join(" "));
        say!(
            out,
            "{:>8}  {:<9}  {:<6} {:<13} {:<9}  why (lone)",
            "size",
            "placement",
            "lone",
            "receive-first",
            "both-ways"
        );
        for r in rows {
            say!(out, "{r}");
        }
    }
}

/// The table of one device pair, a line per size and placement.
fn protocol_rows(cfg: &Config, n: u32, peer: &[bool], s: u32, d: u32, sizes: &[u64]) -> Vec<String> {
    let mut rows = Vec::new();
    for &len in sizes {
        for (name, src, dst) in [
            ("D D", Mem::Device(s), Mem::Device(d)),
            ("D H", Mem::Device(s), Mem::Host),
            ("H D", Mem::Host, Mem::Device(d)),
            ("H H", Mem::Host, Mem::Host),
        ] {
            let (lone, why) = decide(cfg, n, peer, src, dst, len, Case::Lone);
            let (first, _) = decide(cfg, n, peer, src, dst, len, Case::ReceiveFirst);
            let (both, _) = decide(cfg, n, peer, src, dst, len, Case::BothWays);
            rows.push(format!(
                "{:>8}  {name:<9}  {lone:<6} {first:<13} {both:<9}  {why}",
                config::show_size(len).replace(' ', "")
            ));
        }
    }
    rows
}
