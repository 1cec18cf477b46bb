//! The settings of the internode path (`GPULMT_NET_*`, `docs/internode.md`): the GIO
//! queues, the proxy's batching, staging and backoff, and its deadlines.

use std::time::Duration;

use super::{ConfigError, Reader, Value};

/// The internode path's settings; each field is the variable of the same meaning in the
/// table (`config::VARIABLES`). Sizes are in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// `GPULMT_NET_EAGER_LIMIT`: largest message to another node sent inside its control
    /// packet (the engine's `net_eager_limit`).
    pub eager_limit: u64,
    /// `GPULMT_NET_PUSH_MAX`: largest rendezvous message pushed (the engine's
    /// `net_push_max`; 0: none).
    pub push_max: u64,
    /// `GPULMT_NET_PUSH_SENDS`: pushed sends in flight at once (`net_push_sends`).
    pub push_sends: u32,
    /// `GPULMT_NET_QUEUES`: send queues set up at start.
    pub queues: u32,
    /// `GPULMT_NET_QUEUE_SLOTS`: slots per send queue (a power of two).
    pub queue_slots: u32,
    /// `GPULMT_NET_BATCH`: packets taken from one queue per proxy round.
    pub batch: u32,
    /// `GPULMT_NET_CHUNK`: largest MPI message of a transfer, and the staging buffer size.
    pub chunk: u64,
    /// `GPULMT_NET_DEPTH`: pieces of one transfer in flight.
    pub depth: u32,
    /// `GPULMT_NET_CTRL_POOL`: receives kept posted for control packets and one-sided
    /// requests.
    pub ctrl_pool: u32,
    /// `GPULMT_NET_STALL_MS`: a reserved slot left unfilled this long fails its queue.
    pub stall: Duration,
    /// `GPULMT_NET_DRAIN_MS`: how long shutdown lets operations in flight finish.
    pub drain: Duration,
    /// `GPULMT_NET_IDLE_SLEEP`: the idle proxy's longest sleep.
    pub idle_sleep: Duration,
    /// `GPULMT_NET_PROXY_CPU`: the CPUs to pin proxy threads to, one per rank of a host
    /// ([`proxy_cpu`](Self::proxy_cpu)); empty: not pinned.
    pub proxy_cpus: Vec<u32>,
}

impl Default for NetConfig {
    /// The defaults of the table.
    fn default() -> Self {
        super::Config::default().net
    }
}

impl NetConfig {
    pub(super) fn read(r: &Reader<'_>) -> Result<NetConfig, ConfigError> {
        Ok(NetConfig {
            eager_limit: r.size("GPULMT_NET_EAGER_LIMIT")?,
            push_max: r.size("GPULMT_NET_PUSH_MAX")?,
            push_sends: r.count("GPULMT_NET_PUSH_SENDS")?,
            queues: r.count("GPULMT_NET_QUEUES")?,
            queue_slots: r.count("GPULMT_NET_QUEUE_SLOTS")?,
            batch: r.count("GPULMT_NET_BATCH")?,
            chunk: r.size("GPULMT_NET_CHUNK")?,
            depth: r.count("GPULMT_NET_DEPTH")?,
            ctrl_pool: r.count("GPULMT_NET_CTRL_POOL")?,
            stall: r.duration("GPULMT_NET_STALL_MS")?,
            drain: r.duration("GPULMT_NET_DRAIN_MS")?,
            idle_sleep: r.duration("GPULMT_NET_IDLE_SLEEP")?,
            proxy_cpus: match r.read("GPULMT_NET_PROXY_CPU")? {
                None => Vec::new(),
                Some(Value::CpuList(cpus)) => cpus,
                other => Reader::wrong_kind("GPULMT_NET_PROXY_CPU", other),
            },
        })
    }

    /// The CPU the proxy of the rank with index `host_local` among its host's ranks is
    /// pinned to: the list's entry of that index, counted round the list where the host
    /// has more ranks than it names (two proxies then share a CPU, which a warning says).
    pub fn proxy_cpu(&self, host_local: u32) -> Option<u32> {
        let n = self.proxy_cpus.len();
        (n > 0).then(|| self.proxy_cpus[host_local as usize % n])
    }
}
