//! [`EngineConfig`]: the static parameters of an engine (job shape and which ranks share
//! this rank's node, eager limits, SHM ring geometry, copy splitting, RTR, the node's
//! device peer-access matrix).
//!
//! The transport builds it from its configuration table; the engine never reads the
//! environment itself (sans-IO), so tests set every field directly.

use crate::policy::PolicyConfig;
use crate::Rank;

/// Static parameters of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub rank: Rank,
    pub size: u32,
    /// Node id of this rank; regions from other nodes cannot be mapped.
    pub node: u64,
    /// Per job rank (`size` entries): whether it shares this rank's node, so that the
    /// LMT protocols (IPC mappings, SHM staging, rings) reach it. Ranks marked false
    /// (another node, or another pseudo-node of this host) get only eager messages and
    /// the network rendezvous ([`Protocol::Net`](crate::Protocol::Net)). This rank is
    /// always on its own node. All true by default: a job of one node.
    pub on_node: Vec<bool>,
    /// Messages to a rank on another node of at most this many bytes travel inline in
    /// the control message, from host and device memory alike (the transport stages a
    /// device payload to the host before [`post_send`](super::Engine::post_send), as
    /// for device eager messages on the node); larger ones take the network rendezvous.
    pub net_eager_limit: u64,
    /// Network rendezvous of at most this many bytes are *pushed*: the sender's data
    /// leaves right after the RTS instead of on the receiver's CTS, which saves a trip
    /// between the nodes' proxies (the network holds the data until the receiver's
    /// receive matches it). 0: never.
    pub net_push_max: u64,
    /// At most this many pushed sends of this engine in flight at once (each may hold
    /// staging buffers before its receiver matches it); past it a send waits for its CTS.
    pub net_push_sends: u32,
    /// Host messages of at most this many bytes travel inline in the control packet.
    pub eager_limit: u64,
    /// The same for messages from device memory, whose payload must first be staged
    /// to the host by a copy engine: with peer access one GET copy is faster, so
    /// this is usually lower than `eager_limit`.
    pub device_eager_limit: u64,
    pub policy: PolicyConfig,
    /// SHM staging chunk size in bytes.
    pub chunk_size: u64,
    /// SHM staging slots per directed pair (pipeline depth).
    pub depth: u32,
    /// Largest single copy; longer ranges are split into pieces (0 = never split).
    pub copy_split: u64,
    /// Copy queues per engine the pieces of one transfer are spread over.
    pub lanes: u32,
    /// COOPERATE: the sender's share of the message, in thousandths.
    pub coop_sender_permille: u32,
    /// Device sends of at most this many bytes use a receiver's RTR when one waits for
    /// them; receives are offered by RTR only when this is not 0.
    pub rtr_put_max: u64,
    /// Number of devices on the node and whether device a's engine reaches device b
    /// (row-major `devices x devices`).
    pub devices: u32,
    pub peer_access: Vec<bool>,
}

impl EngineConfig {
    /// A configuration for `size` ranks with every device pair peer-accessible.
    pub fn new(rank: Rank, size: u32, devices: u32) -> Self {
        Self {
            rank,
            size,
            node: 0,
            on_node: vec![true; size as usize],
            net_eager_limit: 4096,
            net_push_max: u64::MAX,
            net_push_sends: 16,
            eager_limit: 8192,
            device_eager_limit: 8192,
            policy: PolicyConfig::default(),
            chunk_size: 1 << 20,
            depth: 8,
            copy_split: 0,
            lanes: 1,
            coop_sender_permille: 500,
            rtr_put_max: 0,
            devices,
            peer_access: vec![true; (devices * devices) as usize],
        }
    }

    /// Whether rank `r` shares this rank's node (false for ranks outside the job).
    #[inline]
    pub fn is_on_node(&self, r: Rank) -> bool {
        self.on_node.get(r as usize).copied().unwrap_or(false)
    }

    /// Whether device `a`'s engine can reach device `b`'s memory.
    pub fn can_access(&self, a: u32, b: u32) -> bool {
        a == b || (a < self.devices && b < self.devices && self.peer_access[(a * self.devices + b) as usize])
    }
}
