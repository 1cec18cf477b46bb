//! Configuration of the sim backend: how many devices, which pairs have peer access, and
//! what its copies and handle opens cost, from `GPULMT_SIM_*` or given directly.

use super::{ENV_COPY, ENV_DEVICES, ENV_DRIVER_NS, ENV_IPC_OPEN_US, ENV_PEER, ENV_REFUSE_OPENS, MAX_SIM_DEVICES};
use crate::device::{DevId, DeviceError};

/// Which pairs of distinct devices have peer access. A device always reaches itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerMatrix {
    /// Every pair of devices is peer-accessible (an NVLink/NVSwitch node).
    All,
    /// No two distinct devices are (e.g. GPUs behind different PCIe root complexes).
    NoPeers,
    /// Exactly these symmetric pairs are; each stored as `(min, max)`.
    Pairs(Vec<(DevId, DevId)>),
}

/// Renders the form `GPULMT_SIM_PEER` accepts, so messages quote it back as written.
impl std::fmt::Display for PeerMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerMatrix::All => f.write_str("all"),
            PeerMatrix::NoPeers => f.write_str("none"),
            PeerMatrix::Pairs(pairs) => {
                for (i, (a, b)) in pairs.iter().enumerate() {
                    write!(f, "{}{a}-{b}", if i > 0 { "," } else { "" })?;
                }
                Ok(())
            }
        }
    }
}

impl PeerMatrix {
    /// Parses `all`, `none` or a comma-separated list of pairs like `0-1,2-3`
    /// (case-insensitive, blanks around items ignored). The error text names the
    /// accepted forms; the caller prefixes the variable name.
    pub fn parse(text: &str) -> Result<PeerMatrix, String> {
        let t = text.trim();
        if t.eq_ignore_ascii_case("all") {
            return Ok(PeerMatrix::All);
        }
        if t.eq_ignore_ascii_case("none") {
            return Ok(PeerMatrix::NoPeers);
        }
        let mut pairs = Vec::new();
        for item in t.split(',') {
            let item = item.trim();
            let (a, b) = item.split_once('-').ok_or_else(|| format!("item {item:?} is not a pair `A-B`"))?;
            let parse = |s: &str| {
                s.trim().parse::<DevId>().map_err(|_| format!("item {item:?}: {s:?} is not a device ordinal"))
            };
            let (a, b) = (parse(a)?, parse(b)?);
            let pair = (a.min(b), a.max(b));
            if !pairs.contains(&pair) {
                pairs.push(pair);
            }
        }
        Ok(PeerMatrix::Pairs(pairs))
    }

    /// Whether `a` can reach `b` (symmetric; true when `a == b`). Does not check that
    /// the devices exist.
    pub fn allows(&self, a: DevId, b: DevId) -> bool {
        if a == b {
            return true;
        }
        match self {
            PeerMatrix::All => true,
            PeerMatrix::NoPeers => false,
            PeerMatrix::Pairs(pairs) => pairs.contains(&(a.min(b), a.max(b))),
        }
    }
}

/// Configuration of a [`SimBackend`](super::SimBackend).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Number of simulated devices (at least 1).
    pub devices: u32,
    /// Peer-access topology.
    pub peer: PeerMatrix,
    /// How long [`open_handle`](crate::device::DeviceBackend::open_handle) sleeps, in microseconds, to model the
    /// real driver's cost of opening an IPC handle.
    pub ipc_open_us: u64,
    /// Copies made inside `copy_async`, finished when it returns: an engine that takes no
    /// time, so that what a benchmark measures is the host path of the protocols alone
    /// (what gpulmt adds to a copy ping-pong; `copy_pingpong` on the same setting is the
    /// floor). Copies then never overlap the caller's work.
    pub copy_inline: bool,
    /// With `copy_inline`: an inline copy is reported finished only this many nanoseconds
    /// after its issue (its bytes have landed at once), so that the host paths of both
    /// ranks overlap a copy's time as they do on a GPU (an 8 B peer copy is seen done
    /// about 6.5 us after its issue began on 2x H200).
    pub copy_done_ns: u64,
    /// CPU time the driver's copy calls take, modelled by spinning (None: no cost).
    pub driver: Option<DriverCost>,
    /// Fault injection: every open of a peer's handle fails as a driver's refusal would
    /// (what an application's memory the importer cannot map meets), so the layers above
    /// must fall back (`protocols::engine::fallback`).
    pub refuse_opens: bool,
}

/// CPU time of the driver calls of a copy, in nanoseconds. On 2x H200 (copy_probe):
/// `cuMemcpyAsync` of a peer copy 1560-2000, a query answering "done" 1380-1460 (even for
/// a copy long finished), one answering "not yet" 150. Bandwidth of small messages is
/// bound by these, not by NVLink, so modelling them lets the sim rank policies that
/// spread or save driver calls (a poll the backend answers from what it already knows
/// costs nothing, as in the CUDA backend).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverCost {
    pub issue_ns: u64,
    pub done_ns: u64,
    pub not_ready_ns: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            devices: 2,
            peer: PeerMatrix::All,
            ipc_open_us: 0,
            copy_inline: false,
            copy_done_ns: 0,
            driver: None,
            refuse_opens: false,
        }
    }
}

impl SimConfig {
    /// Reads `GPULMT_SIM_DEVICES`, `GPULMT_SIM_PEER` and `GPULMT_SIM_IPC_OPEN_US`.
    /// Unset or empty variables take their defaults (2, `all`, 0).
    pub fn from_env() -> Result<SimConfig, DeviceError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `lookup`: lets tests
    /// and launchers parse a child's environment without touching the process's own.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<SimConfig, DeviceError> {
        // An empty value counts as unset: `VAR= cmd` is a common way to clear one.
        let get = |name: &str| lookup(name).filter(|v| !v.trim().is_empty());
        let bad = |var: &str, value: &str, accepted: &str| DeviceError::Unavailable {
            reason: format!("sim backend: {var}={value:?} is invalid: expected {accepted}"),
        };
        let mut cfg = SimConfig::default();
        if let Some(v) = get(ENV_DEVICES) {
            cfg.devices =
                v.trim().parse::<u32>().ok().filter(|n| (1..=MAX_SIM_DEVICES).contains(n)).ok_or_else(|| {
                    bad(ENV_DEVICES, &v, &format!("an integer from 1 to {MAX_SIM_DEVICES} (default 2)"))
                })?;
        }
        if let Some(v) = get(ENV_PEER) {
            cfg.peer = PeerMatrix::parse(&v).map_err(|why| {
                bad(
                    ENV_PEER,
                    &v,
                    &format!("`all` (default), `none`, or comma-separated device pairs like `0-1,2-3` ({why})"),
                )
            })?;
        }
        if let Some(v) = get(ENV_IPC_OPEN_US) {
            cfg.ipc_open_us = v
                .trim()
                .parse::<u64>()
                .map_err(|_| bad(ENV_IPC_OPEN_US, &v, "a whole number of microseconds, e.g. 930 (default 0)"))?;
        }
        if let Some(v) = get(ENV_COPY) {
            let accepted =
                "`thread` (default), `inline` or `inline:NS` (NS: nanoseconds from a copy's issue to its completion)";
            (cfg.copy_inline, cfg.copy_done_ns) = match v.trim() {
                "thread" => (false, 0),
                "inline" => (true, 0),
                other => match other.strip_prefix("inline:").map(|ns| ns.trim().parse::<u64>()) {
                    Some(Ok(ns)) => (true, ns),
                    _ => return Err(bad(ENV_COPY, &v, accepted)),
                },
            };
        }
        if let Some(v) = get(ENV_DRIVER_NS) {
            let ns: Vec<Option<u64>> = v.split(',').map(|x| x.trim().parse().ok()).collect();
            cfg.driver = match ns[..] {
                [Some(issue_ns), Some(done_ns), Some(not_ready_ns)] => {
                    Some(DriverCost { issue_ns, done_ns, not_ready_ns })
                }
                _ => {
                    return Err(bad(
                        ENV_DRIVER_NS,
                        &v,
                        "three whole numbers of nanoseconds `ISSUE,DONE,NOT_READY`, e.g. 1600,1400,150",
                    ))
                }
            };
        }
        if let Some(v) = get(ENV_REFUSE_OPENS) {
            cfg.refuse_opens = match v.trim() {
                "0" => false,
                "1" => true,
                _ => return Err(bad(ENV_REFUSE_OPENS, &v, "0 (default) or 1")),
            };
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks the device count and that every peer pair names existing devices.
    pub fn validate(&self) -> Result<(), DeviceError> {
        if !(1..=MAX_SIM_DEVICES).contains(&self.devices) {
            return Err(DeviceError::Unavailable {
                reason: format!(
                    "sim backend: {ENV_DEVICES}={} is invalid: expected an integer from 1 to {MAX_SIM_DEVICES}",
                    self.devices
                ),
            });
        }
        if let PeerMatrix::Pairs(pairs) = &self.peer {
            if let Some(&(a, b)) = pairs.iter().find(|&&(a, b)| a.max(b) >= self.devices) {
                return Err(DeviceError::Unavailable {
                    reason: format!(
                        "sim backend: {ENV_PEER} names pair {a}-{b} but only devices 0..{} exist ({ENV_DEVICES}={}); expected `all`, `none`, or pairs like `0-1,2-3` of existing devices",
                        self.devices, self.devices
                    ),
                });
            }
        }
        Ok(())
    }
}
