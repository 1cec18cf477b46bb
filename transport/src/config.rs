//! Run-time configuration, read from `GPULMT_*` environment variables.
//!
//! [`VARIABLES`] is the one table of every setting, its default and meaning; the
//! README's configuration table is generated from it (`gpulmt-run --config-table`),
//! so documentation and code cannot drift apart.

use gpulmt_protocols::ProtocolOverride;

/// Which device backend to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// CUDA when a driver and a GPU are present, sim otherwise.
    Auto,
    Cuda,
    Sim,
}

/// The priority of gpulmt's copy streams (`GPULMT_COPY_PRIORITY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyPriority {
    /// High where other ranks of the node share this rank's GPU, normal otherwise.
    Auto,
    High,
    Normal,
}

/// Every setting: (variable, default, meaning).
pub const VARIABLES: &[(&str, &str, &str)] = &[
    ("GPULMT_DEVICE", "auto", "device backend: `cuda`, `sim`, or `auto` (CUDA when a driver and a GPU are present, else sim); the choice is logged"),
    ("GPULMT_GPU", "local rank mod devices", "device this rank is bound to"),
    ("GPULMT_PROTOCOL", "auto", "rendezvous protocol: `auto`, `get`, `put`, `coop`, `shm` (a forced protocol that cannot work falls back to `shm`, logged)"),
    ("GPULMT_EAGER_LIMIT", "8192", "messages up to this size travel inline in the control packet (must fit a ring slot)"),
    ("GPULMT_DEVICE_EAGER_LIMIT", "0", "the eager limit for messages from device memory, whose payload needs a staging copy (0: device messages always rendezvous, one DMA instead of two)"),
    ("GPULMT_COOP_MIN", "2M", "`auto` uses COOPERATE between peer-accessible GPUs for messages at least this large, unless the sender's engine is busy with traffic the other way (`never` to disable; 2 MiB measured on 2x H200)"),
    ("GPULMT_PUT_MIN", "512K", "below GPULMT_COOP_MIN, `auto` uses PUT (sender's engine pushes) between peer-accessible GPUs for messages at least this large, unless traffic flows both ways (`never` to disable; measured on 2x H200)"),
    ("GPULMT_BIDIR_PUT_MIN", "64K", "with traffic both ways between two ranks, `auto` uses PUT (each engine pushes its own data) for messages at least this large (`never` to disable; on 2x H200 osu_bibw D D PUT beat GET at 64, 128 and 256 KiB in each of runs 13-16, by 17-70 %, and from 256 KiB since PROGRESS_ON_POST: 603 vs 484 GB/s at 4 MiB)"),
    ("GPULMT_BALANCE_MAX", "2M", "`auto` spreads a window of messages under this size from one sender over both engines (GET or PUT, whichever engine has fewer of that sender's messages in flight; a lone message keeps its usual engine), so both processes issue copies: one CPU issues a copy in 2-4 us, slower than the engine moves 64 KiB - 1 MiB (0: off; two ranks on one H200 under MPS, osu_bw +65-78 % from 64 KiB to 1 MiB)"),
    ("GPULMT_RTR_PUT_MAX", "64K", "`auto`: a receive posted for one source and tag into a device buffer, with no earlier receive for them, is offered to its sender (RTR); a device send of at most this size that is the sender's next message to that rank is then pushed at once by the sender's engine, with no RTS or CTS (0 to disable)"),
    ("GPULMT_RTR_WAIT_NS", "2000", "how long a send that could use an RTR waits for it when the peer's last offer arrived just too late (a blocking ping-pong offers each receive only once its previous send completed); each wait in vain costs one of four credits and each offer used gives one back; without credit only one such send in 64 waits (0: never wait)"),
    ("GPULMT_COOP_SENDER_SHARE", "500", "COOPERATE: the sender's share of the bytes, in thousandths"),
    ("GPULMT_COPY_SPLIT", "0", "split each GET/PUT/COOPERATE copy into pieces of at most this size (0: one copy)"),
    ("GPULMT_LANES", "1", "copy queues (CUDA streams) per engine that the pieces are spread over"),
    ("GPULMT_CHUNK_SIZE", "2M", "SHM staging chunk size (2 MiB: 51-52 GB/s from 4 MiB on 2x H200, 1 MiB: 47-49)"),
    ("GPULMT_PIPELINE_DEPTH", "8", "SHM staging chunks per directed pair of ranks"),
    ("GPULMT_RING_SLOTS", "64", "control-ring slots per directed pair (power of two)"),
    ("GPULMT_SLOT_SIZE", "8448", "bytes per control-ring slot (eager payload + header)"),
    ("GPULMT_HANDLE_CACHE", "1", "cache opened IPC handles (`0`: open and close per transfer, for comparison)"),
    ("GPULMT_HANDLE_CACHE_ENTRIES", "1024", "most cached peer mappings kept open while unused"),
    ("GPULMT_HANDLE_CACHE_BYTES", "64G", "most bytes of cached peer mappings kept open while unused"),
    ("GPULMT_MEMTYPE_CACHE", "1", "remember recently used host buffers to skip the driver's pointer query on the eager path (`0` to disable)"),
    ("GPULMT_PROGRESS_ON_POST", "1", "a rendezvous isend also makes one progress pass, so the peer's answers start copies while an application is still posting a window of sends (`0`: progress only in test/wait; on 2x H200 osu_bibw 4 MiB 596 vs 530 GB/s, 8 B latency 9.2 vs 10.1 us)"),
    ("GPULMT_POLL_NEWEST", "1", "with 4 or more copies in flight on one copy queue, ask whether its newest (then second newest) is done before the oldest: a queue finishes in order, so one driver answer \"done\" (1.3-1.5 us of CPU on H200) retires a window instead of one copy each (two ranks on one H200, medians of 3-5 rounds: osu_bw D D +5 to +18 % from 64 KiB to 2 MiB, osu_bibw up to +14 %, 8 B latency unchanged; not yet measured across two GPUs) (`0`: oldest first)"),
    ("GPULMT_COPY_SERVER_MAX", "0", "CUDA: copies between device memory of at most this many bytes are made by a copy server, one block of a kernel resident on the rank's GPU that polls a descriptor ring in pinned memory, instead of the copy engine: no driver call to issue a copy or to see it finished (two ranks on one H200 under MPS: osu_latency D D 8 B 4.5 vs 11.6 us, osu_bw 64 KiB 57 vs 17 GB/s; Stencil2D overlapped 14-35 % faster, inter-k see `GPULMT_COPY_SERVER_IDLE_US`) (0: off, the default: not measured across two GPUs yet, and cudaDeviceSynchronize waits for a running server; refused where ranks share a GPU without MPS, whose time-slicing would stall it)"),
    ("GPULMT_COPY_SERVER_IDLE_US", "100", "a copy server exits after this long without a copy and the next copy starts it again (about 3 us): an application's cudaDeviceSynchronize waits for a running server, so at most this long after gpulmt's last small copy. A server pays only where small copies come closer together than this (README, Running on GPUs); one that leaves after fewer than 8 copies is relaunched only after a backoff (1 ms, doubling to 128 ms)"),
    ("GPULMT_COPY_PRIORITY", "auto", "CUDA: priority of gpulmt's copy streams and copy server: `high` (the device's greatest), `normal`, or `auto` (high where other ranks of the node share this rank's GPU, normal otherwise). Two ranks on one H200 under MPS: at normal, a copy within the GPU waited for the kernels running there, the other rank's too (259 us beside Stencil2D's 258 us steps, 11 us at high), and Stencil2D with overlapped exchanges took 54.3 / 151.3 us per step (2048² / 4096²) against 34.8 / 128.3 at high; on an idle GPU a lone copy and wait took 0.0-0.4 us longer at high (4 runs), osu_latency D D showed no difference beyond its spread"),
    ("GPULMT_INIT_TIMEOUT_MS", "30000", "how long a rank waits for the others to join the job"),
    ("GPULMT_LIVENESS_MS", "20", "how often a waiting rank checks that its peers are alive"),
    ("GPULMT_SIM_DEVICES", "2", "sim backend: number of devices"),
    ("GPULMT_SIM_PEER", "all", "sim backend: peer-accessible pairs: `all`, `none`, or pairs like `0-1,2-3`"),
    ("GPULMT_SIM_IPC_OPEN_US", "0", "sim backend: cost of opening an IPC handle in microseconds (H200: about 930)"),
    ("GPULMT_SIM_COPY", "thread", "sim backend: `thread` (each device's copies run on a copy-engine thread) or `inline` (made inside the call that starts them: a zero-time engine, to measure the host path alone) or `inline:NS` (made there, seen finished NS ns after their issue: the host paths overlap a copy as on a GPU)"),
    ("GPULMT_SIM_DRIVER_NS", "unset", "sim backend: `ISSUE,DONE,NOT_READY` nanoseconds of CPU that starting a copy, a poll answering done and one answering not yet spin for, a model of the CUDA driver's calls (2x H200: about `1600,1400,150`) under which small-message bandwidth is bound by driver calls as on GPUs; polls the CUDA backend answers without the driver cost nothing"),
    ("GPULMT_LOG", "warn", "log filter (tracing `EnvFilter` syntax, e.g. `gpulmt=debug`)"),
];

/// An invalid setting.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{var}={value:?} is invalid: {why}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub why: String,
}

/// The parsed configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub device: DeviceChoice,
    pub gpu: Option<u32>,
    pub protocol: ProtocolOverride,
    pub eager_limit: u64,
    pub device_eager_limit: u64,
    pub coop_min: u64,
    pub put_min: u64,
    pub bidir_put_min: u64,
    pub balance_max: u64,
    pub rtr_put_max: u64,
    pub rtr_wait_ns: u64,
    pub coop_sender_permille: u32,
    pub copy_split: u64,
    pub lanes: u32,
    pub chunk_size: u64,
    pub depth: u32,
    pub ring_slots: u32,
    pub slot_size: u32,
    pub handle_cache: bool,
    pub cache_entries: usize,
    pub cache_bytes: u64,
    pub init_timeout_ms: u64,
    pub liveness_ms: u64,
    pub memtype_cache: bool,
    pub progress_on_post: bool,
    pub poll_newest: bool,
    pub copy_priority: CopyPriority,
    pub copy_server_max: u64,
    pub copy_server_idle_us: u64,
}

/// Bytes of a ring slot that are not eager payload (slot header + packet header).
pub const SLOT_OVERHEAD: u32 = crate::shm::ring::SLOT_HEADER as u32 + gpulmt_protocols::wire::eager_overhead() as u32;

impl Default for Config {
    fn default() -> Self {
        Self {
            device: DeviceChoice::Auto,
            gpu: None,
            protocol: ProtocolOverride::Auto,
            eager_limit: 8192,
            device_eager_limit: 0,
            coop_min: 2 << 20,
            put_min: 512 << 10,
            bidir_put_min: 64 << 10,
            balance_max: 2 << 20,
            rtr_put_max: 64 << 10,
            rtr_wait_ns: 2000,
            coop_sender_permille: 500,
            copy_split: 0,
            lanes: 1,
            chunk_size: 2 << 20,
            depth: 8,
            ring_slots: 64,
            slot_size: 8192 + 256,
            handle_cache: true,
            cache_entries: 1024,
            cache_bytes: 64 << 30,
            init_timeout_ms: 30_000,
            liveness_ms: 20,
            memtype_cache: true,
            progress_on_post: true,
            poll_newest: true,
            copy_priority: CopyPriority::Auto,
            copy_server_max: 0,
            copy_server_idle_us: 100,
        }
    }
}

/// Parses a byte size: `4096`, `64K`, `1M`, `2G`, `1MiB`, `1mb` (binary units).
pub fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(mult)
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the configuration through `get` (testable without touching the environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        let err = |var: &'static str, value: &str, why: &str| ConfigError {
            var,
            value: value.to_string(),
            why: why.to_string(),
        };
        let size = |var: &'static str, dst: &mut u64| -> Result<(), ConfigError> {
            if let Some(v) = get(var) {
                *dst = parse_size(&v).ok_or_else(|| err(var, &v, "expected a size such as 8192, 64K, 1M or 2G"))?;
            }
            Ok(())
        };
        let num = |var: &'static str, dst: &mut u32, min: u32, max: u32| -> Result<(), ConfigError> {
            if let Some(v) = get(var) {
                *dst = v
                    .trim()
                    .parse()
                    .ok()
                    .filter(|n| (min..=max).contains(n))
                    .ok_or_else(|| err(var, &v, &format!("expected a whole number from {min} to {max}")))?;
            }
            Ok(())
        };
        // A setting with named values; empty means the first (`auto`).
        fn one_of<T: Copy>(var: &'static str, v: &str, options: &[(&str, T)]) -> Result<T, ConfigError> {
            let v_lower = v.trim().to_ascii_lowercase();
            let pick =
                if v_lower.is_empty() { options.first() } else { options.iter().find(|(name, _)| *name == v_lower) };
            pick.map(|&(_, value)| value).ok_or_else(|| {
                let names: Vec<&str> = options.iter().map(|(name, _)| *name).collect();
                ConfigError { var, value: v.to_string(), why: format!("expected one of {}", names.join(", ")) }
            })
        }
        if let Some(v) = get("GPULMT_DEVICE") {
            c.device = one_of(
                "GPULMT_DEVICE",
                &v,
                &[("auto", DeviceChoice::Auto), ("cuda", DeviceChoice::Cuda), ("sim", DeviceChoice::Sim)],
            )?;
        }
        if let Some(v) = get("GPULMT_COPY_PRIORITY") {
            let options =
                [("auto", CopyPriority::Auto), ("high", CopyPriority::High), ("normal", CopyPriority::Normal)];
            c.copy_priority = one_of("GPULMT_COPY_PRIORITY", &v, &options)?;
        }
        if let Some(v) = get("GPULMT_GPU") {
            c.gpu = Some(v.trim().parse().map_err(|_| err("GPULMT_GPU", &v, "expected a device ordinal"))?);
        }
        if let Some(v) = get("GPULMT_PROTOCOL") {
            c.protocol = v.parse().map_err(|why: String| err("GPULMT_PROTOCOL", &v, &why))?;
        }
        size("GPULMT_EAGER_LIMIT", &mut c.eager_limit)?;
        size("GPULMT_DEVICE_EAGER_LIMIT", &mut c.device_eager_limit)?;
        if c.device_eager_limit > c.eager_limit {
            return Err(err(
                "GPULMT_DEVICE_EAGER_LIMIT",
                &c.device_eager_limit.to_string(),
                "must not exceed GPULMT_EAGER_LIMIT (the ring slot is sized for that)",
            ));
        }
        for (var, dst) in [
            ("GPULMT_COOP_MIN", &mut c.coop_min),
            ("GPULMT_PUT_MIN", &mut c.put_min),
            ("GPULMT_BIDIR_PUT_MIN", &mut c.bidir_put_min),
        ] {
            match get(var) {
                Some(v) if v.trim().eq_ignore_ascii_case("never") => *dst = u64::MAX,
                _ => size(var, dst)?,
            }
        }
        size("GPULMT_BALANCE_MAX", &mut c.balance_max)?;
        size("GPULMT_COPY_SERVER_MAX", &mut c.copy_server_max)?;
        size("GPULMT_COPY_SERVER_IDLE_US", &mut c.copy_server_idle_us)?;
        size("GPULMT_RTR_PUT_MAX", &mut c.rtr_put_max)?;
        size("GPULMT_RTR_WAIT_NS", &mut c.rtr_wait_ns)?;
        num("GPULMT_COOP_SENDER_SHARE", &mut c.coop_sender_permille, 1, 999)?;
        size("GPULMT_COPY_SPLIT", &mut c.copy_split)?;
        num("GPULMT_LANES", &mut c.lanes, 1, 16)?;
        size("GPULMT_CHUNK_SIZE", &mut c.chunk_size)?;
        if c.chunk_size == 0 || c.chunk_size > u32::MAX as u64 {
            return Err(err("GPULMT_CHUNK_SIZE", &c.chunk_size.to_string(), "must be between 1 byte and 4 GiB"));
        }
        num("GPULMT_PIPELINE_DEPTH", &mut c.depth, 1, 1024)?;
        num("GPULMT_RING_SLOTS", &mut c.ring_slots, 2, 1 << 16)?;
        if !c.ring_slots.is_power_of_two() {
            return Err(err("GPULMT_RING_SLOTS", &c.ring_slots.to_string(), "must be a power of two"));
        }
        let explicit_slot = get("GPULMT_SLOT_SIZE").is_some();
        num("GPULMT_SLOT_SIZE", &mut c.slot_size, 256, 1 << 24)?;
        if c.slot_size % 8 != 0 {
            return Err(err("GPULMT_SLOT_SIZE", &c.slot_size.to_string(), "must be a multiple of 8"));
        }
        if !explicit_slot {
            // Size the slots for the eager limit unless told otherwise.
            let need = (c.eager_limit as u32).saturating_add(SLOT_OVERHEAD + 64).next_multiple_of(64);
            c.slot_size = c.slot_size.max(need);
        }
        if c.eager_limit + SLOT_OVERHEAD as u64 > c.slot_size as u64 {
            return Err(err(
                "GPULMT_EAGER_LIMIT",
                &c.eager_limit.to_string(),
                &format!(
                    "an eager message must fit a ring slot: raise GPULMT_SLOT_SIZE to at least {}",
                    c.eager_limit + SLOT_OVERHEAD as u64
                ),
            ));
        }
        for (var, dst) in [
            ("GPULMT_HANDLE_CACHE", &mut c.handle_cache),
            ("GPULMT_MEMTYPE_CACHE", &mut c.memtype_cache),
            ("GPULMT_PROGRESS_ON_POST", &mut c.progress_on_post),
            ("GPULMT_POLL_NEWEST", &mut c.poll_newest),
        ] {
            if let Some(v) = get(var) {
                *dst = match v.trim() {
                    "1" | "on" | "true" | "yes" => true,
                    "0" | "off" | "false" | "no" => false,
                    _ => return Err(err(var, &v, "expected 1 or 0")),
                };
            }
        }
        let mut entries = c.cache_entries as u64;
        size("GPULMT_HANDLE_CACHE_ENTRIES", &mut entries)?;
        c.cache_entries = entries as usize;
        size("GPULMT_HANDLE_CACHE_BYTES", &mut c.cache_bytes)?;
        size("GPULMT_INIT_TIMEOUT_MS", &mut c.init_timeout_ms)?;
        size("GPULMT_LIVENESS_MS", &mut c.liveness_ms)?;
        Ok(c)
    }

    /// The README's configuration table, in Markdown.
    pub fn markdown_table() -> String {
        let mut s = String::from("| variable | default | meaning |\n| --- | --- | --- |\n");
        for (v, d, m) in VARIABLES {
            s.push_str(&format!("| `{v}` | {d} | {m} |\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn readme_configuration_table_is_the_generated_one() {
        let readme = include_str!("../../README.md");
        assert!(
            readme.contains(Config::markdown_table().trim_end()),
            "README.md's configuration table differs from config::VARIABLES: paste `gpulmt-run --config-table` over it"
        );
    }

    fn cfg(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_lookup(|k| m.get(k).cloned())
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
        let c = cfg(&[("GPULMT_COPY_SERVER_MAX", "64K"), ("GPULMT_COPY_SERVER_IDLE_US", "500")]).unwrap();
        assert_eq!((c.copy_server_max, c.copy_server_idle_us), (64 << 10, 500));
    }

    #[test]
    fn eager_limit_grows_slots_unless_slot_size_is_explicit() {
        let c = cfg(&[("GPULMT_EAGER_LIMIT", "64K")]).unwrap();
        assert!(c.slot_size as u64 >= 65536 + SLOT_OVERHEAD as u64);
        let e = cfg(&[("GPULMT_EAGER_LIMIT", "64K"), ("GPULMT_SLOT_SIZE", "4096")]).unwrap_err();
        assert_eq!(e.var, "GPULMT_EAGER_LIMIT");
        assert!(e.to_string().contains("GPULMT_SLOT_SIZE"));
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
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert_eq!(e.var, k, "{e}");
        }
    }

    #[test]
    fn table_lists_every_variable() {
        let t = Config::markdown_table();
        for (v, _, _) in VARIABLES {
            assert!(t.contains(v));
        }
    }
}
