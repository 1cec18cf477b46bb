//! Which rendezvous protocol moves a message, decided by the receiver on an RTS.
//!
//! The choice decides which DMA engine works: GET drives the receiver's copy engine,
//! PUT the sender's, COOPERATE both, SHM both processes' host links through pinned
//! shared staging. A sender on another node leaves one choice, NET: the data crosses
//! the network, moved by MPI, whatever either buffer is and whatever
//! `GPULMT_PROTOCOL` forces (those protocols need memory both ranks reach, which ranks
//! of different nodes never have). Every decision carries a reason, recorded in the transfer's
//! tracing span, so a user can tell why a message took the path it took.

use std::fmt;

use crate::wire::MemDesc;

/// A rendezvous protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// The receiver's engine pulls from the mapped sender buffer.
    Get,
    /// The sender's engine pushes into the mapped receiver buffer.
    Put,
    /// Each engine moves its part: the sender the front, the receiver the back.
    Coop,
    /// Pipelined through pinned shared host staging chunks.
    Shm,
    /// Sender and receiver are the same process: one local copy.
    SelfCopy,
    /// Sender and receiver are on different nodes: the receiver's transport posts the
    /// receive of the data, the sender's sends it, through MPI (`docs/internode.md`).
    Net,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Get => "get",
            Protocol::Put => "put",
            Protocol::Coop => "coop",
            Protocol::Shm => "shm",
            Protocol::SelfCopy => "self",
            Protocol::Net => "net",
        })
    }
}

/// The user's override of the automatic choice (`GPULMT_PROTOCOL`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ProtocolOverride {
    #[default]
    Auto,
    Get,
    Put,
    Coop,
    Shm,
}

impl std::str::FromStr for ProtocolOverride {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "auto" => Self::Auto,
            "get" => Self::Get,
            "put" => Self::Put,
            "coop" | "cooperate" => Self::Coop,
            "shm" => Self::Shm,
            _ => return Err(format!("unknown protocol '{s}': use auto, get, put, coop or shm")),
        })
    }
}

/// A decision and why it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolChoice {
    pub protocol: Protocol,
    pub reason: &'static str,
}

/// The knobs of the automatic policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyConfig {
    pub mode: ProtocolOverride,
    /// Messages of at least this many bytes between peer-accessible devices use
    /// COOPERATE under `auto` (u64::MAX: never).
    pub coop_min: u64,
    /// Below `coop_min`, messages of at least this many bytes use PUT under `auto`:
    /// the sender's engine pushes (posted NVLink writes beat the reads of a GET once
    /// the CTS round trip is hidden by the copy time).
    pub put_min: u64,
    /// With traffic both ways (the sender's engine is busy pulling this receiver's
    /// messages), messages of at least this many bytes use PUT under `auto`: each
    /// engine then pushes its own data, as two concurrent push streams do best on
    /// NVLink (measured on H200 with sends progressed while they are posted: pushes
    /// win from 512 KiB; without that, GET's reads won below 32 MiB).
    pub bidir_put_min: u64,
    /// Below `coop_min`, messages under this many bytes from a sender that is not busy
    /// are spread over both engines (0: never): each goes to the engine with fewer of
    /// that sender's messages in flight, its preferred one (PUT from `put_min`, GET
    /// below) on a tie. A lone message keeps its preferred engine; a window of them
    /// splits the copies' driver calls between the two processes, which bind small
    /// copies more than NVLink does (a copy's issue and completion cost about 2 and
    /// 1.4 us of CPU on H200, a 64 KiB copy 0.2 us of engine time).
    pub balance_max: u64,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            mode: ProtocolOverride::Auto,
            coop_min: u64::MAX,
            put_min: u64::MAX,
            bidir_put_min: u64::MAX,
            balance_max: 0,
        }
    }
}

/// What the receiver knows of the work already given to the two engines for one
/// sender's messages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerLoad {
    /// The sender's engine is moving this receiver's own messages to it (traffic both
    /// ways).
    pub sender_busy: bool,
    /// The sender's messages this receiver's engine is pulling now (GET).
    pub pulling: u32,
    /// The sender's messages its engine is pushing here now (PUT, RTR).
    pub pushing: u32,
}

/// Decides the protocol for a message of `len` bytes from a sender whose buffer is
/// `src` to a receiver whose buffer is `dst` (device ordinal, and whether it is
/// exported so the sender may map it). `can_access(a, b)` says whether device `a`'s
/// engine can reach device `b`'s memory. When `load` says the sender's engine is
/// already moving this receiver's own messages to it (traffic both ways), `auto`
/// leaves it alone rather than COOPERATE or PUT on it, since two engines each
/// serving one direction beat two engines sharing both (measured on H200). A `src` of
/// [`MemDesc::Net`] (the sender is on another node) always gives NET.
pub fn choose(
    cfg: &PolicyConfig,
    src: &MemDesc,
    dst_device: Option<u32>,
    dst_exported: bool,
    len: u64,
    load: PeerLoad,
    can_access: impl Fn(u32, u32) -> bool,
) -> ProtocolChoice {
    let pick = |protocol, reason| ProtocolChoice { protocol, reason };
    let (s, d) = match (src, dst_device) {
        // Before the override: forcing an LMT protocol cannot make another node's
        // memory reachable.
        (MemDesc::Net { .. }, _) => return pick(Protocol::Net, "peer on another node: the network moves it"),
        (MemDesc::Device(r), Some(d)) => (r.device, d),
        (MemDesc::Host, _) => return pick(Protocol::Shm, "sender buffer is host memory"),
        (MemDesc::Staged, _) => {
            return pick(Protocol::Shm, "sender buffer is device memory no peer can map (its kind has no IPC)")
        }
        (_, None) => return pick(Protocol::Shm, "receiver buffer is host memory"),
    };
    // GET: the receiver's engine (device d) reads the sender's memory (device s).
    let get_ok = can_access(d, s);
    // PUT: the sender's engine writes the receiver's memory, which must be exported.
    let put_ok = can_access(s, d) && dst_exported;
    let coop_ok = get_ok && put_ok;
    match cfg.mode {
        ProtocolOverride::Shm => pick(Protocol::Shm, "forced by GPULMT_PROTOCOL=shm"),
        ProtocolOverride::Get if get_ok => pick(Protocol::Get, "forced by GPULMT_PROTOCOL=get"),
        ProtocolOverride::Put if put_ok => pick(Protocol::Put, "forced by GPULMT_PROTOCOL=put"),
        ProtocolOverride::Coop if coop_ok => pick(Protocol::Coop, "forced by GPULMT_PROTOCOL=coop"),
        ProtocolOverride::Get | ProtocolOverride::Put | ProtocolOverride::Coop => {
            pick(Protocol::Shm, "forced protocol impossible: devices not peer-accessible")
        }
        ProtocolOverride::Auto => {
            let sender_busy = load.sender_busy;
            // Both processes issue copies, so a window is queued by two CPUs, not one: the
            // driver's CPU cost per copy, not the engine, bounds a window of small messages.
            let balance = coop_ok && len < cfg.balance_max && !sender_busy;
            if s == d && !balance {
                pick(Protocol::Get, "same device: one engine copies within it")
            } else if s != d && coop_ok && len >= cfg.coop_min && !sender_busy {
                pick(Protocol::Coop, "peer-accessible and large: both engines move a part")
            } else if balance {
                // The preferred engine, unless the other has fewer of this sender's messages.
                if s != d && len >= cfg.put_min {
                    if load.pulling < load.pushing {
                        pick(Protocol::Get, "window of messages: receiver's engine takes this one")
                    } else {
                        pick(Protocol::Put, "peer-accessible and mid-sized: sender's engine pushes")
                    }
                } else if load.pushing < load.pulling {
                    pick(Protocol::Put, "window of messages: sender's engine takes this one")
                } else {
                    pick(Protocol::Get, "peer-accessible: receiver's engine pulls")
                }
            } else if put_ok && len >= cfg.put_min && !sender_busy {
                pick(Protocol::Put, "peer-accessible and mid-sized: sender's engine pushes")
            } else if put_ok && len >= cfg.bidir_put_min && sender_busy {
                pick(Protocol::Put, "traffic both ways and large: each engine pushes its own data")
            } else if get_ok {
                pick(Protocol::Get, "peer-accessible: receiver's engine pulls")
            } else if put_ok {
                pick(Protocol::Put, "only the sender's device reaches the receiver's")
            } else {
                pick(Protocol::Shm, "devices not peer-accessible")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Region;

    fn dev(d: u32) -> MemDesc {
        MemDesc::Device(Region {
            handle: [0; crate::wire::HANDLE_BYTES],
            alloc_size: 100,
            offset: 0,
            device: d,
            node: 0,
            buffer_id: 1,
        })
    }

    fn idle() -> PeerLoad {
        PeerLoad::default()
    }

    fn busy() -> PeerLoad {
        PeerLoad { sender_busy: true, ..PeerLoad::default() }
    }

    fn load(pulling: u32, pushing: u32) -> PeerLoad {
        PeerLoad { sender_busy: false, pulling, pushing }
    }

    #[test]
    fn host_memory_goes_through_shm() {
        let c = PolicyConfig::default();
        assert_eq!(choose(&c, &MemDesc::Host, Some(0), true, 1 << 20, idle(), |_, _| true).protocol, Protocol::Shm);
        // Device memory no peer maps: staging, whatever the override asks.
        for mode in [ProtocolOverride::Auto, ProtocolOverride::Get, ProtocolOverride::Put, ProtocolOverride::Coop] {
            let forced = PolicyConfig { mode, ..c };
            assert_eq!(
                choose(&forced, &MemDesc::Staged, Some(0), true, 1 << 20, idle(), |_, _| true).protocol,
                Protocol::Shm
            );
        }
        assert_eq!(choose(&c, &dev(0), None, false, 1 << 20, idle(), |_, _| true).protocol, Protocol::Shm);
    }

    #[test]
    fn auto_by_accessibility_and_size() {
        let mut c = PolicyConfig::default();
        assert_eq!(choose(&c, &dev(0), Some(1), true, 1 << 20, idle(), |_, _| true).protocol, Protocol::Get);
        assert_eq!(choose(&c, &dev(0), Some(1), true, 1 << 20, idle(), |_, _| false).protocol, Protocol::Shm);
        // Only the sender (0) reaches the receiver (1).
        assert_eq!(
            choose(&c, &dev(0), Some(1), true, 1 << 20, idle(), |a, b| a == 0 && b == 1).protocol,
            Protocol::Put
        );
        assert_eq!(
            choose(&c, &dev(0), Some(1), false, 1 << 20, idle(), |a, b| a == 0 && b == 1).protocol,
            Protocol::Shm
        );
        c.put_min = 1 << 19;
        assert_eq!(choose(&c, &dev(0), Some(1), true, 1 << 20, idle(), |_, _| true).protocol, Protocol::Put);
        assert_eq!(choose(&c, &dev(0), Some(1), true, 1 << 18, idle(), |_, _| true).protocol, Protocol::Get);
        c.coop_min = 1 << 20;
        assert_eq!(choose(&c, &dev(0), Some(1), true, 1 << 20, idle(), |_, _| true).protocol, Protocol::Coop);
        // Traffic both ways: the sender's engine is taken, the receiver pulls...
        assert_eq!(choose(&c, &dev(0), Some(1), true, 1 << 20, busy(), |_, _| true).protocol, Protocol::Get);
        // ...unless the message is large enough that pushing its own data wins.
        c.bidir_put_min = 32 << 20;
        assert_eq!(choose(&c, &dev(0), Some(1), true, 32 << 20, busy(), |_, _| true).protocol, Protocol::Put);
        assert_eq!(choose(&c, &dev(0), Some(1), true, 32 << 20, idle(), |_, _| true).protocol, Protocol::Coop);
        assert_eq!(choose(&c, &dev(0), Some(0), true, 1 << 20, idle(), |_, _| true).protocol, Protocol::Get);
    }

    #[test]
    fn balance_spreads_a_window_over_both_engines() {
        let c = PolicyConfig { put_min: 1 << 20, coop_min: 4 << 20, balance_max: 2 << 20, ..Default::default() };
        let p = |len, l, access: fn(u32, u32) -> bool| choose(&c, &dev(0), Some(1), true, len, l, access).protocol;
        let all: fn(u32, u32) -> bool = |_, _| true;
        // Below put_min GET is preferred: a lone message and ties keep it.
        assert_eq!(p(64 << 10, load(0, 0), all), Protocol::Get);
        assert_eq!(p(64 << 10, load(3, 3), all), Protocol::Get);
        assert_eq!(p(64 << 10, load(1, 0), all), Protocol::Put);
        assert_eq!(p(64 << 10, load(2, 5), all), Protocol::Get);
        // From put_min PUT is preferred.
        assert_eq!(p(1 << 20, load(0, 0), all), Protocol::Put);
        assert_eq!(p(1 << 20, load(0, 1), all), Protocol::Get);
        assert_eq!(p(1 << 20, load(1, 1), all), Protocol::Put);
        // Not from balance_max, not with traffic both ways, not unless both engines reach.
        assert_eq!(p(2 << 20, load(1, 0), all), Protocol::Put);
        assert_eq!(p(64 << 10, PeerLoad { sender_busy: true, pulling: 1, pushing: 0 }, all), Protocol::Get);
        assert_eq!(p(64 << 10, load(1, 0), |a, b| a == 1 && b == 0), Protocol::Get);
        assert_eq!(p(64 << 10, load(0, 1), |a, b| a == 0 && b == 1), Protocol::Put);
        // COOPERATE above its threshold, whatever the load.
        assert_eq!(p(4 << 20, load(0, 5), all), Protocol::Coop);
        // On one device both processes' streams reach it: the window is spread too, and a
        // lone message stays a GET, whatever put_min says.
        let same = |len, l| choose(&c, &dev(0), Some(0), true, len, l, all).protocol;
        assert_eq!(same(1 << 20, load(0, 0)), Protocol::Get);
        assert_eq!(same(1 << 20, load(1, 0)), Protocol::Put);
        assert_eq!(same(1 << 20, load(1, 1)), Protocol::Get);
        assert_eq!(same(2 << 20, load(1, 0)), Protocol::Get, "from balance_max one engine");
        assert_eq!(
            choose(&c, &dev(0), Some(0), false, 64 << 10, load(1, 0), all).protocol,
            Protocol::Get,
            "PUT needs the receiver's buffer exported"
        );
        // Off by default.
        let off = PolicyConfig::default();
        assert_eq!(choose(&off, &dev(0), Some(1), true, 64 << 10, load(5, 0), all).protocol, Protocol::Get);
    }

    #[test]
    fn a_sender_on_another_node_takes_the_network_whatever_is_forced() {
        for mode in [
            ProtocolOverride::Auto,
            ProtocolOverride::Get,
            ProtocolOverride::Put,
            ProtocolOverride::Coop,
            ProtocolOverride::Shm,
        ] {
            let c = PolicyConfig { mode, coop_min: 0, put_min: 0, balance_max: u64::MAX, ..Default::default() };
            for dst in [None, Some(0), Some(1)] {
                let r = choose(&c, &MemDesc::Net { pushed: false }, dst, true, 1 << 20, idle(), |_, _| true);
                assert_eq!(r.protocol, Protocol::Net, "{mode:?} into {dst:?}");
                assert!(r.reason.contains("another node"), "{}", r.reason);
            }
        }
        assert_eq!(Protocol::Net.to_string(), "net");
    }

    #[test]
    fn overrides_fall_back_when_impossible() {
        let c = PolicyConfig { mode: ProtocolOverride::Put, ..Default::default() };
        assert_eq!(choose(&c, &dev(0), Some(1), true, 10, idle(), |_, _| true).protocol, Protocol::Put);
        let r = choose(&c, &dev(0), Some(1), true, 10, idle(), |_, _| false);
        assert_eq!(r.protocol, Protocol::Shm);
        assert!(r.reason.contains("impossible"));
        assert_eq!("COOP".parse::<ProtocolOverride>(), Ok(ProtocolOverride::Coop));
        assert!("fast".parse::<ProtocolOverride>().is_err());
    }
}
