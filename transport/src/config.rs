//! Run-time configuration, read from `GPULMT_*` environment variables.
//!
//! [`VARIABLES`] is the one table of every setting: its kind (type and valid values),
//! default, class and meaning. [`Config::from_lookup`] reads each value through it, so
//! sizes, durations and counts are parsed by their kind and checked against their range;
//! `Config::default()` is the table's defaults read the same way; `docs/configuration.md`
//! is rendered from the table ([`reference_markdown`], `gpulmt-run --config-table`), and a
//! test fails when the file differs.

mod kind;
mod net;
mod reference;
mod variables;

use std::time::Duration;

use gpulmt_protocols::engine::EngineConfig;
use gpulmt_protocols::policy::PolicyConfig;
use gpulmt_protocols::ProtocolOverride;

pub use kind::{parse_duration, parse_size, show_duration, show_size, Kind, TimeUnit, Value};
pub use net::NetConfig;
pub use reference::reference_markdown;
pub use variables::{variable, Class, DefaultValue, Variable, LAUNCHER_VARIABLES, VARIABLES};

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

/// An invalid setting.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{var}={value:?} is invalid: {why}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub why: String,
}

/// The parsed configuration. Each field is the variable of the same meaning in
/// [`VARIABLES`]; sizes are in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub device: DeviceChoice,
    pub gpu: Option<u32>,
    pub protocol: ProtocolOverride,
    pub eager_limit: u64,
    pub device_eager_limit: u64,
    /// `u64::MAX`: never.
    pub coop_min: u64,
    /// `u64::MAX`: never.
    pub put_min: u64,
    /// `u64::MAX`: never.
    pub bidir_put_min: u64,
    pub balance_max: u64,
    pub rtr_put_max: u64,
    pub rtr_wait: Duration,
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
    pub init_timeout: Duration,
    pub liveness_interval: Duration,
    pub memtype_cache: bool,
    /// Whether memory of shareable pools crosses by IPC (`GPULMT_POOL_IPC`).
    pub pool_ipc: bool,
    pub progress_on_post: bool,
    pub poll_newest: bool,
    pub copy_priority: CopyPriority,
    pub copy_server_max: u64,
    pub copy_server_idle: Duration,
    pub pseudo_nodes: u32,
    /// The internode path's settings (`GPULMT_NET_*`).
    pub net: NetConfig,
    /// Bytes of each rank's symmetric heap; None: the backend's default (`crate::sym`).
    pub sym_heap: Option<u64>,
}

/// Bytes of a ring slot that are not eager payload (slot header, packet header, seal).
pub const SLOT_OVERHEAD: u32 = (crate::shm::ring::SLOT_HEADER
    + gpulmt_protocols::wire::eager_overhead()
    + gpulmt_protocols::wire::SEAL_BYTES) as u32;

impl Default for Config {
    /// The defaults of [`VARIABLES`].
    fn default() -> Self {
        Config::from_lookup(|_| None).unwrap_or_else(|e| panic!("a default of config::VARIABLES is invalid: {e}"))
    }
}

/// Reads variables through a lookup, by the kinds of the table. An unset or empty
/// variable takes its default.
struct Reader<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
}

impl Reader<'_> {
    /// Whether `name` is set (to something other than blanks).
    fn is_set(&self, name: &str) -> bool {
        (self.get)(name).is_some_and(|v| !v.trim().is_empty())
    }

    /// The value of `name`, or its default; None when it is unset without a default.
    fn read(&self, name: &'static str) -> Result<Option<Value>, ConfigError> {
        let var = variable(name).unwrap_or_else(|| panic!("{name} is read but missing from config::VARIABLES"));
        let text = match (self.get)(name).filter(|v| !v.trim().is_empty()) {
            Some(text) => text,
            None => match var.default {
                DefaultValue::Text(text) => text.to_string(),
                DefaultValue::Unset(_) => return Ok(None),
            },
        };
        var.kind.parse(&text).map(Some).map_err(|why| ConfigError { var: name, value: text, why })
    }

    fn wrong_kind(name: &str, got: Option<Value>) -> ! {
        panic!("{name} is read as another kind than config::VARIABLES gives it (read {got:?})")
    }

    fn bool(&self, name: &'static str) -> Result<bool, ConfigError> {
        match self.read(name)? {
            Some(Value::Bool(b)) => Ok(b),
            other => Self::wrong_kind(name, other),
        }
    }

    fn size(&self, name: &'static str) -> Result<u64, ConfigError> {
        match self.read(name)? {
            Some(Value::Size(n)) => Ok(n),
            other => Self::wrong_kind(name, other),
        }
    }

    /// A size without a default (None when unset).
    fn size_opt(&self, name: &'static str) -> Result<Option<u64>, ConfigError> {
        match self.read(name)? {
            Some(Value::Size(n)) => Ok(Some(n)),
            None => Ok(None),
            other => Self::wrong_kind(name, other),
        }
    }

    /// A count whose range the table keeps within `u32`.
    fn count(&self, name: &'static str) -> Result<u32, ConfigError> {
        match self.read(name)? {
            Some(Value::Count(n)) => {
                Ok(u32::try_from(n).unwrap_or_else(|_| panic!("the range of {name} in config::VARIABLES passes u32")))
            }
            other => Self::wrong_kind(name, other),
        }
    }

    fn duration(&self, name: &'static str) -> Result<Duration, ConfigError> {
        match self.read(name)? {
            Some(Value::Duration(d)) => Ok(d),
            other => Self::wrong_kind(name, other),
        }
    }

    fn choice(&self, name: &'static str) -> Result<&'static str, ConfigError> {
        match self.read(name)? {
            Some(Value::Choice(c)) => Ok(c),
            other => Self::wrong_kind(name, other),
        }
    }

    fn device(&self, name: &'static str) -> Result<Option<u32>, ConfigError> {
        match self.read(name)? {
            Some(Value::Device(d)) => Ok(Some(d)),
            None => Ok(None),
            other => Self::wrong_kind(name, other),
        }
    }
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the configuration through `get` (testable without touching the environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let r = Reader { get: &get };
        let mut c = Config {
            device: match r.choice("GPULMT_DEVICE")? {
                "cuda" => DeviceChoice::Cuda,
                "sim" => DeviceChoice::Sim,
                _ => DeviceChoice::Auto,
            },
            gpu: r.device("GPULMT_GPU")?,
            protocol: match r.choice("GPULMT_PROTOCOL")? {
                "get" => ProtocolOverride::Get,
                "put" => ProtocolOverride::Put,
                "coop" => ProtocolOverride::Coop,
                "shm" => ProtocolOverride::Shm,
                _ => ProtocolOverride::Auto,
            },
            eager_limit: r.size("GPULMT_EAGER_LIMIT")?,
            device_eager_limit: r.size("GPULMT_DEVICE_EAGER_LIMIT")?,
            coop_min: r.size("GPULMT_COOP_MIN")?,
            put_min: r.size("GPULMT_PUT_MIN")?,
            bidir_put_min: r.size("GPULMT_BIDIR_PUT_MIN")?,
            balance_max: r.size("GPULMT_BALANCE_MAX")?,
            rtr_put_max: r.size("GPULMT_RTR_PUT_MAX")?,
            rtr_wait: r.duration("GPULMT_RTR_WAIT_NS")?,
            coop_sender_permille: r.count("GPULMT_COOP_SENDER_SHARE")?,
            copy_split: r.size("GPULMT_COPY_SPLIT")?,
            lanes: r.count("GPULMT_LANES")?,
            chunk_size: r.size("GPULMT_CHUNK_SIZE")?,
            depth: r.count("GPULMT_PIPELINE_DEPTH")?,
            ring_slots: r.count("GPULMT_RING_SLOTS")?,
            // The table bounds a slot to 16 MiB.
            slot_size: r.size("GPULMT_SLOT_SIZE")? as u32,
            handle_cache: r.bool("GPULMT_HANDLE_CACHE")?,
            cache_entries: r.count("GPULMT_HANDLE_CACHE_ENTRIES")? as usize,
            cache_bytes: r.size("GPULMT_HANDLE_CACHE_BYTES")?,
            init_timeout: r.duration("GPULMT_INIT_TIMEOUT_MS")?,
            liveness_interval: r.duration("GPULMT_LIVENESS_MS")?,
            memtype_cache: r.bool("GPULMT_MEMTYPE_CACHE")?,
            pool_ipc: r.bool("GPULMT_POOL_IPC")?,
            progress_on_post: r.bool("GPULMT_PROGRESS_ON_POST")?,
            poll_newest: r.bool("GPULMT_POLL_NEWEST")?,
            copy_priority: match r.choice("GPULMT_COPY_PRIORITY")? {
                "high" => CopyPriority::High,
                "normal" => CopyPriority::Normal,
                _ => CopyPriority::Auto,
            },
            copy_server_max: r.size("GPULMT_COPY_SERVER_MAX")?,
            copy_server_idle: r.duration("GPULMT_COPY_SERVER_IDLE_US")?,
            pseudo_nodes: r.count("GPULMT_PSEUDO_NODES")?,
            net: NetConfig::read(&r)?,
            sym_heap: r.size_opt("GPULMT_SYM_HEAP")?,
        };
        if c.device_eager_limit > c.eager_limit {
            return Err(ConfigError {
                var: "GPULMT_DEVICE_EAGER_LIMIT",
                value: c.device_eager_limit.to_string(),
                why: format!(
                    "must not exceed GPULMT_EAGER_LIMIT ({}), which the ring slots are sized for",
                    c.eager_limit
                ),
            });
        }
        let window = crate::net::ops_in_flight(u64::from(c.net.queue_slots));
        if u64::from(c.net.push_sends) > window {
            return Err(ConfigError {
                var: "GPULMT_NET_PUSH_SENDS",
                value: c.net.push_sends.to_string(),
                why: format!(
                    "pushed sends have a GIO queue of their own, which keeps at most {window} ops in flight with \
                     GPULMT_NET_QUEUE_SLOTS={}: lower it, or raise GPULMT_NET_QUEUE_SLOTS",
                    c.net.queue_slots
                ),
            });
        }
        // The eager limit fits in u32: the table bounds it to 1 MiB.
        let need_slot = c.eager_limit as u32 + SLOT_OVERHEAD;
        if !r.is_set("GPULMT_SLOT_SIZE") {
            // Size the slots for the eager limit unless told otherwise.
            c.slot_size = c.slot_size.max((need_slot + 64).next_multiple_of(64));
        }
        if need_slot > c.slot_size {
            return Err(ConfigError {
                var: "GPULMT_EAGER_LIMIT",
                value: c.eager_limit.to_string(),
                why: format!(
                    "an eager message must fit a ring slot: raise GPULMT_SLOT_SIZE ({}) to at least {need_slot}",
                    c.slot_size
                ),
            });
        }
        Ok(c)
    }

    /// The knobs of the `auto` protocol policy.
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            mode: self.protocol,
            coop_min: self.coop_min,
            put_min: self.put_min,
            bidir_put_min: self.bidir_put_min,
            balance_max: self.balance_max,
        }
    }

    /// The protocol engine's parameters for rank `rank` of a job of `size` ranks on node
    /// `node`, whose `devices` devices reach each other as `peer_access` says (row-major
    /// `devices x devices`, see [`EngineConfig::can_access`]).
    pub fn engine_config(&self, rank: u32, size: u32, node: u64, devices: u32, peer_access: Vec<bool>) -> EngineConfig {
        let mut e = EngineConfig::new(rank, size, devices);
        e.node = node;
        e.eager_limit = self.eager_limit;
        e.device_eager_limit = self.device_eager_limit;
        e.net_eager_limit = self.net.eager_limit;
        e.net_push_max = self.net.push_max;
        e.net_push_sends = self.net.push_sends;
        e.policy = self.policy();
        // A forced protocol is the one that runs: no RTR offers then.
        e.rtr_put_max = if self.protocol == ProtocolOverride::Auto { self.rtr_put_max } else { 0 };
        e.chunk_size = self.chunk_size;
        e.depth = self.depth;
        e.copy_split = self.copy_split;
        e.lanes = self.lanes;
        e.coop_sender_permille = self.coop_sender_permille;
        e.peer_access = peer_access;
        e
    }
}

#[cfg(test)]
mod tests;
