//! round_probe: the proxy's idle round alone (no context traffic), for a profiler: two
//! ranks' internode paths over the in-process loopback network on sim devices, idle for
//! `SECS` seconds (default 3); each proxy logs its round count and phase shares at exit
//! (`GPULMT_LOG=gpulmt_net_profile=info`). Run under `perf record` to see what an idle
//! round costs on the proxy thread.
use std::sync::Arc;

use gpulmt::config::NetConfig;
use gpulmt::device::sim::{PeerMatrix, SimBackend, SimConfig};
use gpulmt::net::iface::loopback::LoopbackFabric;
use gpulmt::net::NetPath;
use gpulmt::offnode::OffNodePath;

fn main() {
    gpulmt::logging::init("warn,gpulmt_net_profile=info");
    let secs: u64 = std::env::var("SECS").ok().map_or(3, |s| s.parse().expect("SECS: seconds"));
    let cfg = SimConfig {
        devices: 1,
        peer: PeerMatrix::All,
        ipc_open_us: 0,
        copy_inline: true,
        copy_done_ns: 0,
        refuse_opens: false,
        driver: None,
    };
    let backend: gpulmt::device::Backend = Arc::new(SimBackend::new(cfg).expect("sim backend"));
    let fabric = LoopbackFabric::new(2, 1024);
    let net = NetConfig { idle_sleep: std::time::Duration::ZERO, ..NetConfig::default() };
    let mut paths: Vec<NetPath> = (0..2)
        .map(|r| NetPath::start_with(Box::new(fabric.endpoint(r)), &[1 - r], &net, backend.clone(), r).expect("path"))
        .collect();
    std::thread::sleep(std::time::Duration::from_secs(secs));
    for p in &mut paths {
        p.shutdown(std::time::Instant::now() + std::time::Duration::from_secs(1)).expect("shutdown");
    }
}
