//! CPU binding of a node's ranks, for the launcher (`gpulmt-run --bind`).
//!
//! Every rank busy-polls its control rings and copy completions, so a rank that the
//! scheduler moves between cores pays for it in latency: on 2x H200, ranks pinned with
//! `taskset` read 8 B D-D latencies of 8.32-8.61 us against 8.27-8.96 unpinned (pin1).
//! Like `mpirun`, which binds to cores by default for small jobs, the launcher gives each
//! rank a core of its own: one hardware thread per physical core first, further threads of
//! a core only when the ranks outnumber the cores, and no binding at all when they
//! outnumber the CPUs the launcher may use (spinning ranks sharing a CPU would starve each
//! other).

use std::collections::BTreeSet;

/// The CPUs, one per rank, that `n` ranks are bound to, or `None` (no binding) when
/// there are fewer `allowed` CPUs than ranks. `core_of(cpu)` names the physical core of a
/// CPU (any value shared by exactly the hardware threads of one core); CPUs it does not
/// know count as cores of their own.
pub fn spread(allowed: &[usize], n: usize, core_of: impl Fn(usize) -> Option<(usize, usize)>) -> Option<Vec<usize>> {
    if n == 0 || n > allowed.len() {
        return None;
    }
    // First hardware thread of each core, in CPU order, then the others in CPU order.
    let mut seen = BTreeSet::new();
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for &cpu in allowed {
        let core = core_of(cpu).unwrap_or((usize::MAX, cpu));
        if seen.insert(core) {
            first.push(cpu);
        } else {
            rest.push(cpu);
        }
    }
    first.extend(rest);
    first.truncate(n);
    Some(first)
}

/// The CPUs this process may run on.
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, and sched_getaffinity writes at
    // most size_of::<cpu_set_t>() bytes into it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// The (package, core) of `cpu` from sysfs, where the kernel exposes it.
pub fn core_of(cpu: usize) -> Option<(usize, usize)> {
    let read = |what: &str| -> Option<usize> {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}")).ok()?.trim().parse().ok()
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

/// The CPU of each of `n` ranks on this machine, or `None` (no binding).
pub fn cpus_for_ranks(n: usize) -> Option<Vec<usize>> {
    spread(&allowed_cpus(), n, core_of)
}

/// Binds the calling process to `cpu`. Only makes a syscall, so it may run between
/// `fork` and `exec`.
pub fn bind_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: as in allowed_cpus; CPU_SET only writes inside the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Lets the calling thread run on every CPU the process's cpuset allows, whatever the
/// process was bound to (helper threads that stand for hardware, such as the sim's copy
/// engines). Best effort: on failure the thread keeps its binding.
pub fn unbind_this_thread() {
    // SAFETY: as in allowed_cpus; the kernel intersects the full set with the cpuset.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for c in 0..libc::CPU_SETSIZE as usize {
            libc::CPU_SET(c, &mut set);
        }
        let _ = libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 4 cores with two threads each, numbered as Linux numbers them on x86
    /// (cpu i and i + 4 share core i % 4).
    fn smt(cpu: usize) -> Option<(usize, usize)> {
        Some((0, cpu % 4))
    }

    #[test]
    fn one_thread_per_core_before_siblings() {
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(spread(&all, 2, smt), Some(vec![0, 1]));
        assert_eq!(spread(&all, 4, smt), Some(vec![0, 1, 2, 3]));
        assert_eq!(spread(&all, 6, smt), Some(vec![0, 1, 2, 3, 4, 5]));
        // Siblings numbered next to each other (0 and 1 share a core).
        assert_eq!(spread(&all, 3, |c| Some((0, c / 2))), Some(vec![0, 2, 4]));
        // Two packages whose core ids repeat.
        assert_eq!(spread(&[0, 1, 2, 3], 2, |c| Some((c / 2, 0))), Some(vec![0, 2]));
    }

    #[test]
    fn only_allowed_cpus_and_no_binding_when_oversubscribed() {
        assert_eq!(spread(&[2, 3, 6, 7], 2, smt), Some(vec![2, 3]));
        assert_eq!(spread(&[2, 6], 2, smt), Some(vec![2, 6]));
        assert_eq!(spread(&[0, 1], 3, smt), None);
        assert_eq!(spread(&[0, 1], 0, smt), None);
        // Unknown topology: every CPU is a core.
        assert_eq!(spread(&[5, 9], 2, |_| None), Some(vec![5, 9]));
    }

    #[test]
    fn a_thread_bound_to_one_cpu_can_be_unbound() {
        let all = allowed_cpus();
        std::thread::spawn(move || {
            bind_to(all[0]).unwrap();
            assert_eq!(allowed_cpus(), vec![all[0]]);
            unbind_this_thread();
            // At least the process's own set again (more if the process itself was bound).
            let now = allowed_cpus();
            assert!(all.iter().all(|c| now.contains(c)), "{now:?} lacks some of {all:?}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn this_machine_has_cpus_with_known_or_unknown_cores() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let picked = cpus_for_ranks(cpus.len()).expect("as many ranks as CPUs are bound");
        assert_eq!(picked.iter().collect::<BTreeSet<_>>().len(), cpus.len());
        assert_eq!(cpus_for_ranks(cpus.len() + 1), None);
    }
}
