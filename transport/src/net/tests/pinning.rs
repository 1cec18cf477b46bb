//! `GPULMT_NET_PROXY_CPU`: each rank's proxy thread is pinned to the list's CPU of the
//! rank's index on its host, counted round the list.

use super::*;

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<u32> {
    // SAFETY: a zeroed cpu_set_t is an empty set that the call fills in.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the set is a local of the size given.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    assert_eq!(rc, 0, "sched_getaffinity");
    // SAFETY: reads the set filled in above.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).map(|c| c as u32).collect()
}

/// `Cpus_allowed_list` of every thread of this process named `name`.
fn thread_cpus(name: &str) -> Vec<String> {
    let mut found = Vec::new();
    for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != name {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if let Some(l) = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")) {
            found.push(l.trim().to_string());
        }
    }
    found
}

#[test]
fn each_proxy_takes_the_cpu_of_its_index_on_the_host() {
    let cpus = allowed_cpus();
    if cpus.len() < 2 {
        eprintln!("skipped: this process may run on {cpus:?} only, so a pinned and an unpinned proxy look alike");
        return;
    }
    // The list backwards, so that the rank's own number would pick the wrong CPU.
    let (a, b) = (cpus[1], cpus[0]);
    let cfg = NetConfig { proxy_cpus: vec![a, b], ..small_cfg(8) };
    assert_eq!((cfg.proxy_cpu(0), cfg.proxy_cpu(1), cfg.proxy_cpu(2)), (Some(a), Some(b), Some(a)));
    assert_eq!(NetConfig { proxy_cpus: vec![], ..small_cfg(8) }.proxy_cpu(0), None);
    let backend = sim();
    let fabric = LoopbackFabric::new(3, 64);
    let mut paths = world(&fabric, 3, &cfg, &backend);
    // Other tests of this process run proxies of the same names, unpinned: one thread of
    // each name must be pinned to exactly its CPU.
    for (rank, want) in [(0, a), (1, b), (2, a)] {
        let name = format!("gpulmt-proxy{rank}");
        wait_until(&format!("{name} pinned to CPU {want}"), || thread_cpus(&name).contains(&want.to_string()));
    }
    shutdown_all(&mut paths);
}
