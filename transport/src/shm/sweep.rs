//! The sweep: removes from `/dev/shm` what dead processes left there (a job killed
//! while starting, a rank killed under `mpirun` with its simulated device memory), so
//! that leftovers clean themselves up instead of filling `/dev/shm`.
//!
//! Every job runs it when it starts (rank 0, before it creates its segment), a rank
//! whose local peer died runs it for that peer ([`DeadPeerSweep`]: a job under `mpirun`
//! has no launcher of ours to clean up after a killed rank), and `gpulmt-run` after every
//! run, with [`Evidence::Locks`]: an object goes only when its
//! owner locks prove every owner dead ([`super::owner`]), which holds across pid
//! namespaces. `gpulmt-run --cleanup` uses [`Evidence::Any`], which also trusts pids
//! (for objects of gpulmt versions without owner locks) and age (for objects it cannot
//! attribute at all).
//!
//! What proves an object abandoned:
//! - a job segment `gpulmt-<job>` (and the job's other objects `gpulmt-<job>-*`): no
//!   rank and not its creator holds a lock on it. Its creator locks it before it
//!   publishes the segment's magic, so a segment being created is never taken for one;
//! - simulated device memory `gpulmt-sim-<pid>-<nonce>-*`: its owner object
//!   `gpulmt-sim-<pid>-<nonce>-owner` is unlocked;
//! - an fd server's socket `gpulmt-fd-*` (`device/fd_share.rs`): a connect to it is
//!   refused, so nobody listens there (this too holds across pid namespaces).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use super::object::{entries, is_object_of, unlink_counted, FD_SOCKET_PREFIX, OBJECT_PREFIX, SHM_DIR, SIM_PREFIX};
use super::owner::{pid_alive, Owner, OwnerLock, OWNER_SUFFIX};

/// Unparseable `gpulmt-*` objects older than this are presumed abandoned by `--cleanup`.
pub const STALE_UNPARSEABLE_AGE: Duration = Duration::from_secs(3600);

/// What may prove an object abandoned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// Owner locks only: safe to run unattended (at every job start), even beside
    /// processes of other pid namespaces that share `/dev/shm`.
    Locks,
    /// Also a dead pid for objects without owner locks, and for objects that cannot be
    /// attributed at all an age beyond [`STALE_UNPARSEABLE_AGE`]: what a user asks for
    /// with `gpulmt-run --cleanup`. Pids are this pid namespace's.
    Any,
}

/// Removes every abandoned gpulmt object (see the module documentation); returns how
/// many.
pub fn sweep(evidence: Evidence) -> usize {
    cleanup_stale_jobs(evidence) + cleanup_stale_sim_objects(evidence) + cleanup_stale_fd_sockets()
}

/// How long a rank keeps trying to remove what a dead peer left (its owner lock may
/// outlive the lock that showed it dead by a moment, as the kernel closes a dying
/// process's descriptors one by one).
pub const DEAD_PEER_SWEEP_FOR: Duration = Duration::from_secs(5);

/// Least time between two sweeps for dead peers (each reads `/dev/shm` whole).
const DEAD_PEER_SWEEP_EVERY: Duration = Duration::from_millis(100);

/// The sweeps a rank owes its dead local peers: what a killed peer left in `/dev/shm`
/// (its simulated device memory, its fd server's socket) is removed by the ranks that
/// survive it, not only by the next job's start. A peer that is still alive (it marked
/// itself failed) holds its owner lock, so nothing of it is taken; its own exit removes
/// its objects.
#[derive(Debug, Default)]
pub struct DeadPeerSweep {
    /// Pids of dead peers whose objects may remain, with when to stop trying.
    pending: Vec<(u32, Instant)>,
    last: Option<Instant>,
}

impl DeadPeerSweep {
    /// Peer process `pid` died (or failed): sweep for it now and at later polls.
    pub fn peer_died(&mut self, pid: u32, now: Instant) {
        if pid != 0 && !self.pending.iter().any(|&(p, _)| p == pid) {
            self.pending.push((pid, now + DEAD_PEER_SWEEP_FOR));
            self.last = None;
            self.poll(now);
        }
    }

    /// Sweeps while a dead peer's objects remain (at most every 100 ms, each peer for
    /// [`DEAD_PEER_SWEEP_FOR`]); returns how many objects it removed.
    pub fn poll(&mut self, now: Instant) -> usize {
        if self.pending.is_empty() || self.last.is_some_and(|t| now.duration_since(t) < DEAD_PEER_SWEEP_EVERY) {
            return 0;
        }
        self.last = Some(now);
        let removed = sweep(Evidence::Locks);
        if removed > 0 {
            tracing::info!(removed, "removed shared-memory objects that dead peers left behind");
        }
        self.pending.retain(|&(pid, until)| now < until && !entries(&format!("{SIM_PREFIX}{pid}-")).is_empty());
        removed
    }

    /// One more sweep now if a dead peer's objects may remain (a rank that leaves).
    pub fn last_chance(&mut self) {
        self.last = None;
        self.poll(Instant::now());
    }
}

/// Removes the sockets of fd servers that nobody listens on (their process died without
/// its drop); returns how many. A connect that is refused proves it whatever the evidence
/// asked for; one that succeeds or fails otherwise keeps the socket.
pub fn cleanup_stale_fd_sockets() -> usize {
    let mut removed = 0;
    for n in entries(FD_SOCKET_PREFIX) {
        let path = Path::new(SHM_DIR).join(&n);
        let refused = std::os::unix::net::UnixStream::connect(&path)
            .err()
            .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        if refused && std::fs::remove_file(&path).is_ok() {
            tracing::debug!(name = n, "removed the socket of a dead fd server");
            removed += 1;
        }
    }
    removed
}

/// Age of `/dev/shm/<name>` by modification time (None if unknown).
fn object_age(name: &str) -> Option<Duration> {
    let modified = std::fs::metadata(Path::new(SHM_DIR).join(name)).ok()?.modified().ok()?;
    SystemTime::now().duration_since(modified).ok()
}

/// Removes the objects of jobs whose segments nobody holds; returns how many.
///
/// For every `gpulmt-<job>` job segment of this layout version that nobody holds a lock
/// on, it removes the segment and the job's other objects (`gpulmt-<job>-*`); a held
/// job's objects are kept. With [`Evidence::Any`], other `gpulmt-*` objects it cannot
/// attribute to a parsed job (not a job segment, a segment still being initialized,
/// another version's or another user's) go when older than [`STALE_UNPARSEABLE_AGE`].
/// Simulated-device objects (`gpulmt-sim-*`) are left to [`cleanup_stale_sim_objects`].
pub fn cleanup_stale_jobs(evidence: Evidence) -> usize {
    let names: Vec<String> = entries(OBJECT_PREFIX)
        .into_iter()
        .filter(|n| !n.starts_with(SIM_PREFIX) && !n.starts_with(FD_SOCKET_PREFIX))
        .collect();
    // (segment name, abandoned)
    let jobs: Vec<(String, bool)> =
        names.iter().filter_map(|n| super::job::probe_abandoned(n).map(|gone| (n.clone(), gone))).collect();
    let mut removed = 0;
    for n in &names {
        // The longest parsed job segment this name belongs to (a job id may itself
        // contain '-', so `gpulmt-a-b` could be an object of `gpulmt-a` or a segment).
        let owner = jobs.iter().filter(|(j, _)| is_object_of(n, j)).max_by_key(|(j, _)| j.len());
        let stale = match owner {
            Some((_, gone)) => *gone,
            None => evidence == Evidence::Any && object_age(n).is_some_and(|age| age > STALE_UNPARSEABLE_AGE),
        };
        if stale {
            removed += unlink_counted(n);
        }
    }
    removed
}

/// The owner pid in the name of a simulated-device object, `gpulmt-sim-<pid>-...`.
pub fn sim_object_pid(name: &str) -> Option<u32> {
    let (pid, _) = name.strip_prefix(SIM_PREFIX)?.split_once('-')?;
    pid.parse().ok()
}

/// The group of a simulated-device object, `gpulmt-sim-<pid>-<nonce>-`: the objects of
/// one backend instance, claimed by its owner object (the group and [`OWNER_SUFFIX`]).
fn sim_group(name: &str) -> Option<&str> {
    let rest = name.strip_prefix(SIM_PREFIX)?;
    let (pid, rest) = rest.split_once('-')?;
    let (nonce, _) = rest.split_once('-')?;
    let ok = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) && !nonce.is_empty();
    ok.then(|| &name[..SIM_PREFIX.len() + pid.len() + nonce.len() + 2])
}

/// Removes simulated-device objects whose owners are gone; returns how many.
///
/// A group whose owner object is unlocked goes whole, the owner object last. With
/// [`Evidence::Any`], objects without an owner object (gpulmt versions before owner
/// objects, or names without a group) go when the `<pid>` of their name is dead
/// ([`pid_alive`]: zombies count as dead); names without a pid are not ours to judge.
pub fn cleanup_stale_sim_objects(evidence: Evidence) -> usize {
    let names = entries(SIM_PREFIX);
    let owner_of = |group: &str| format!("{group}{OWNER_SUFFIX}");
    let is_owner =
        |n: &str| sim_group(n).is_some_and(|g| n.len() == g.len() + OWNER_SUFFIX.len() && n.ends_with(OWNER_SUFFIX));
    // What each owner object says, probed once per group.
    let owners: BTreeMap<&str, Owner> =
        names.iter().filter(|n| is_owner(n)).filter_map(|n| sim_group(n).map(|g| (g, OwnerLock::probe(n)))).collect();
    let dead_pid = |n: &str| evidence == Evidence::Any && sim_object_pid(n).is_some_and(|p| !pid_alive(p));
    // A stillborn owner object (unlocked, no magic) whose creator is dead: the unheld lock
    // is the evidence; the pid only rules out a creator still inside its creation window.
    let stillborn_dead = |n: &str, o: Owner| o == Owner::Stillborn && sim_object_pid(n).is_some_and(|p| !pid_alive(p));
    let mut removed = 0;
    for n in names.iter().filter(|n| !is_owner(n)) {
        let stale = match sim_group(n).and_then(|g| owners.get(g)) {
            Some(Owner::Gone) => true,
            Some(&o @ Owner::Stillborn) => stillborn_dead(n, o),
            // Alive, or an owner object being created: the group is in use.
            Some(Owner::Alive) | Some(Owner::Unknown) => false,
            None => dead_pid(n),
        };
        if stale {
            removed += unlink_counted(n);
        }
    }
    // Owner objects last: while one is there, a concurrent sweep still sees its group as
    // abandoned (not as a group without an owner, which only pids could judge).
    for (g, owner) in &owners {
        let name = owner_of(g);
        // An owner object without its magic whose creator died making it: unlocked, and
        // its pid dead; one that cannot be read at all: pids only, where they may judge.
        if *owner == Owner::Gone || stillborn_dead(&name, *owner) || (*owner == Owner::Unknown && dead_pid(&name)) {
            removed += unlink_counted(&name);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::object::tests::{dead_pid, unique};
    use crate::shm::object::{remove_objects_with_prefix, ShmSegment};

    fn exists(name: &str) -> bool {
        Path::new(SHM_DIR).join(name).exists()
    }

    /// An owner object without its magic and unlocked (its creator was killed between
    /// creating and locking it) goes at the unattended sweep when its pid is dead, and
    /// stays while its pid lives (a creator inside that window).
    #[test]
    fn stillborn_owner_objects_go_when_their_creator_is_dead() {
        let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let dead = format!("{SIM_PREFIX}{}-sb{nonce:x}-{OWNER_SUFFIX}", dead_pid());
        let live = format!("{SIM_PREFIX}{}-sb{nonce:x}-{OWNER_SUFFIX}", std::process::id());
        drop(ShmSegment::create(&dead, 4096).unwrap());
        drop(ShmSegment::create(&live, 4096).unwrap());
        cleanup_stale_sim_objects(Evidence::Locks);
        assert!(!exists(&dead), "a stillborn owner object of a dead creator must go");
        assert!(exists(&live), "one whose creator lives may be in its creation window");
        ShmSegment::unlink(&live).unwrap();
    }

    #[test]
    fn stale_sim_objects() {
        let dead = dead_pid();
        let stale = format!("{SIM_PREFIX}{dead}-test-dev0");
        let live = format!("{SIM_PREFIX}{}-test-dev0", std::process::id());
        drop(ShmSegment::create(&stale, 4096).unwrap());
        drop(ShmSegment::create(&live, 4096).unwrap());
        // Without an owner object only pids can tell: not enough for the unattended sweep.
        cleanup_stale_sim_objects(Evidence::Locks);
        assert!(exists(&stale), "pids are not evidence enough for the sweep at job start");
        assert!(cleanup_stale_sim_objects(Evidence::Any) >= 1);
        assert!(!exists(&stale));
        assert!(exists(&live), "objects of live processes must be kept");
        ShmSegment::unlink(&live).unwrap();
    }

    #[test]
    fn objects_of_one_pid_by_prefix() {
        let dead = dead_pid();
        let make = |pid: u32, tag: &str| {
            let name = format!("{SIM_PREFIX}{pid}-{tag}-1");
            drop(ShmSegment::create(&name, 4096).unwrap());
            name
        };
        let other = make(dead, "00000000cafef00d");
        let live = make(std::process::id(), "00000000feedface");
        assert_eq!(remove_objects_with_prefix(&format!("{SIM_PREFIX}{dead}-")), 1);
        assert!(!exists(&other));
        assert!(exists(&live));
        ShmSegment::unlink(&live).unwrap();
        assert_eq!(sim_object_pid("gpulmt-sim-123-abc-4"), Some(123));
        assert_eq!(sim_object_pid("gpulmt-other-123-abc-4"), None);
        assert_eq!(sim_group("gpulmt-sim-123-abc-4"), Some("gpulmt-sim-123-abc-"));
        assert_eq!(sim_group("gpulmt-sim-123-abc-owner"), Some("gpulmt-sim-123-abc-"));
        assert_eq!(sim_group("gpulmt-sim-123-dev0"), None);
        assert_eq!(sim_group("gpulmt-sim-x1-abc-4"), None);
    }

    /// A group whose owner lock died goes whole, whatever its pid says (here: a live
    /// pid, as a process of another pid namespace would look); a held group stays.
    #[test]
    fn groups_go_when_their_owner_lock_is_released() {
        let tag = unique("grp").replace('-', "");
        let me = std::process::id();
        let held = format!("{SIM_PREFIX}{me}-{tag}a-");
        let gone = format!("{SIM_PREFIX}{me}-{tag}b-");
        let owner = OwnerLock::create(&format!("{held}{OWNER_SUFFIX}")).unwrap();
        let dropped = OwnerLock::create(&format!("{gone}{OWNER_SUFFIX}")).unwrap();
        for g in [&held, &gone] {
            drop(ShmSegment::create(&format!("{g}1"), 4096).unwrap());
            drop(ShmSegment::create(&format!("{g}2"), 4096).unwrap());
        }
        // The holder of `gone` dies without removing anything.
        crate::shm::owner::tests::die_holding(dropped);
        assert!(cleanup_stale_sim_objects(Evidence::Locks) >= 3);
        for n in ["1", "2", OWNER_SUFFIX] {
            assert!(!exists(&format!("{gone}{n}")), "{gone}{n} was left");
            assert!(exists(&format!("{held}{n}")), "{held}{n} of a live owner was removed");
        }
        drop(owner);
        for n in ["1", "2"] {
            ShmSegment::unlink(&format!("{held}{n}")).unwrap();
        }
    }
}
