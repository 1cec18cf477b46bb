//! Who owns a shared-memory object, and whether they are still alive: open file
//! description (OFD) locks that die with their holder, the owner object that keeps a
//! group of objects claimed, and the liveness of a process that sees zombies as dead.
//!
//! Why locks and not pids: a pid says little once its process is gone. A killed process
//! whose parent has not reaped it yet is a zombie that still answers `kill(pid, 0)`, a
//! recycled pid belongs to somebody else, and a process of another pid namespace that
//! shares `/dev/shm` (a container) has another number there. An OFD lock lives on the
//! object's inode, and the kernel drops it when the last descriptor of its open file
//! description closes, which happens while a process exits (before it is a zombie). So
//! "nobody holds a lock on it" proves that its owners are gone, whatever the pid
//! namespaces; "somebody does" proves that one lives.
//!
//! Two caveats come with OFD locks. A lock is held per open file description, not per
//! process: a `fork` without `exec` shares the description and keeps the lock alive as
//! long as the child lives. And `F_OFD_GETLK` reports only locks of *other* open file
//! descriptions: a descriptor never sees its own locks as conflicts.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::object::{c_name, ShmError, ShmSegment};

/// Asks the kernel about or sets a write lock on `[start, start+len)` of `fd`'s file
/// (`len` 0: to the end of any file). Returns the `flock` the kernel filled in.
fn ofd_lock(fd: BorrowedFd<'_>, cmd: libc::c_int, start: u64, len: u64) -> io::Result<libc::flock> {
    // SAFETY: zeroed is a valid flock (l_pid must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = libc::off_t::try_from(start).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    fl.l_len = libc::off_t::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: fd is open; fl is a valid flock the call reads and (GETLK) writes.
    if unsafe { libc::fcntl(fd.as_raw_fd(), cmd, &mut fl) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fl)
}

/// Takes a write lock on byte `offset` of `fd`'s file without waiting. `Ok(false)` if
/// another open file description holds it (its holder is alive); `Ok(true)` once this
/// description holds it (again: retaking a lock one holds succeeds).
pub fn try_lock_byte(fd: BorrowedFd<'_>, offset: u64) -> io::Result<bool> {
    match ofd_lock(fd, libc::F_OFD_SETLK, offset, 1) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether another open file description holds a lock on any byte of `[start,
/// start+len)` of `fd`'s file (`len` 0: to the end). Locks of `fd`'s own description
/// are not seen.
pub fn locked_by_others(fd: BorrowedFd<'_>, start: u64, len: u64) -> io::Result<bool> {
    let fl = ofd_lock(fd, libc::F_OFD_GETLK, start, len)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// Liveness of a process on this machine: no such process, or a zombie (killed or
/// exited but not reaped yet: `/proc/<pid>/stat` says `Z` or `X`), is dead. `kill(pid,
/// 0)` failing with EPERM means it exists but belongs to someone else: alive. Pid 0 and
/// pids beyond `pid_t` name no process of ours: not alive. Pids mean something only in
/// this pid namespace: prefer an owner lock where there is one.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks for existence and permission; it sends nothing.
    if unsafe { libc::kill(p, 0) } != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // A process that /proc does not show (hidepid, no /proc) counts as kill() says.
    !matches!(proc_state(pid), Some('Z') | Some('X'))
}

/// The state letter of `/proc/<pid>/stat` (`R`, `S`, `Z`...), if readable. The command
/// name in parentheses may itself hold spaces and parentheses: the state follows the
/// last `)`.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The last part of an owner object's name: `<group prefix>owner` claims every object
/// whose name starts with the group prefix.
pub const OWNER_SUFFIX: &str = "owner";

/// What the first bytes of an owner object hold once its creator holds the lock.
const OWNER_MAGIC: [u8; 8] = *b"GLMTOWN1";

/// The object that keeps a group of shared-memory objects claimed while its creator
/// lives: created and locked before any object of the group exists, released (unlinked)
/// when dropped, and found unlocked once its creator died, however it died. The sweep
/// ([`super::sweep`]) then removes the whole group.
#[derive(Debug)]
pub struct OwnerLock {
    /// Held for its lock, which lives as long as this descriptor (or the process).
    _held: OwnedFd,
    /// Without the leading `/`.
    name: String,
}

/// What an owner object says about its group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// Its creator holds the lock: the group is in use.
    Alive,
    /// Nobody holds the lock: the creator is gone, the group is abandoned.
    Gone,
    /// No such object, or one that cannot be read.
    Unknown,
    /// An object without the magic that nobody holds locked: its creator died between
    /// creating it and locking it (a SIGKILL's window), or is inside that window now
    /// (microseconds); the pid in its name tells the two apart.
    Stillborn,
}

impl OwnerLock {
    /// Creates the owner object `name` (it must not exist), locks it, then writes the
    /// magic: an object with the magic is always one whose creator took the lock first.
    pub fn create(name: &str) -> Result<OwnerLock, ShmError> {
        let (bare, cname) = c_name(name)?;
        // SAFETY: cname is a valid NUL-terminated string.
        let raw = unsafe {
            libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC, 0o600)
        };
        if raw < 0 {
            return Err(ShmError::last_os("shm_open", &bare));
        }
        // SAFETY: raw is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let fail = |err: ShmError, cname: &CString| {
            // SAFETY: cname is valid; we created this name just now.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
            err
        };
        match try_lock_byte(fd.as_fd(), 0) {
            Ok(true) => {}
            Ok(false) => return Err(fail(ShmError::os("fcntl(F_OFD_SETLK)", &bare, libc::EAGAIN), &cname)),
            Err(e) => {
                return Err(fail(ShmError::os("fcntl(F_OFD_SETLK)", &bare, e.raw_os_error().unwrap_or(0)), &cname))
            }
        }
        // SAFETY: fd is open; the buffer is 8 readable bytes.
        let n = unsafe { libc::pwrite(fd.as_raw_fd(), OWNER_MAGIC.as_ptr().cast(), OWNER_MAGIC.len(), 0) };
        if n != OWNER_MAGIC.len() as isize {
            return Err(fail(ShmError::last_os("pwrite", &bare), &cname));
        }
        Ok(OwnerLock { _held: fd, name: bare })
    }

    /// The object's name, without the leading `/`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Looks at the owner object `name` (another process's): whether its creator lives.
    pub fn probe(name: &str) -> Owner {
        let Ok((_, cname)) = c_name(name) else { return Owner::Unknown };
        // SAFETY: cname is a valid NUL-terminated string.
        let raw = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if raw < 0 {
            return Owner::Unknown;
        }
        // SAFETY: raw is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut magic = [0u8; 8];
        // SAFETY: fd is open; magic is 8 writable bytes.
        let n = unsafe { libc::pread(fd.as_raw_fd(), magic.as_mut_ptr().cast(), magic.len(), 0) };
        let complete = n == magic.len() as isize && magic == OWNER_MAGIC;
        // The creator locks before it writes the magic: a locked object is alive either way.
        match (locked_by_others(fd.as_fd(), 0, 1), complete) {
            (Ok(true), _) => Owner::Alive,
            (Ok(false), true) => Owner::Gone,
            (Ok(false), false) => Owner::Stillborn,
            (Err(_), _) => Owner::Unknown,
        }
    }
}

impl Drop for OwnerLock {
    fn drop(&mut self) {
        // The name first: once it is gone nobody can mistake the group for abandoned.
        if let Err(e) = ShmSegment::unlink(&self.name) {
            tracing::warn!(error = %e, "removing an owner object");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::shm::object::tests::{dead_pid, unique};
    use crate::shm::object::Opts;
    use std::process::Command;

    /// What a holder's death does to its owner lock: the descriptor closes, the name stays
    /// (drop, which a killed process never runs, would remove it).
    pub(crate) fn die_holding(held: OwnerLock) {
        let raw = held._held.as_raw_fd();
        std::mem::forget(held);
        // SAFETY: the descriptor of the forgotten lock, closed once, here.
        assert_eq!(unsafe { libc::close(raw) }, 0);
    }

    #[test]
    fn zombies_are_dead() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(dead_pid()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX));
        // A child that exited but is not reaped yet: kill(pid, 0) still succeeds.
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        let t0 = std::time::Instant::now();
        while proc_state(pid) != Some('Z') {
            assert!(t0.elapsed().as_secs() < 10, "the child never became a zombie");
            std::thread::yield_now();
        }
        // SAFETY: signal 0 sends nothing.
        assert_eq!(unsafe { libc::kill(pid as i32, 0) }, 0, "a zombie answers kill(pid, 0)");
        assert!(!pid_alive(pid), "but it is dead");
        c.wait().unwrap();
    }

    #[test]
    fn owner_object_is_alive_while_held_and_gone_after() {
        let name = unique("owner");
        assert_eq!(OwnerLock::probe(&name), Owner::Unknown);
        let held = OwnerLock::create(&name).unwrap();
        assert_eq!(OwnerLock::probe(&name), Owner::Alive);
        assert!(OwnerLock::create(&name).is_err(), "one owner per name");
        die_holding(held);
        assert_eq!(OwnerLock::probe(&name), Owner::Gone);
        ShmSegment::unlink(&name).unwrap();
        // An object without the magic that nobody holds (a creator that died before
        // locking it) is stillborn.
        drop(ShmSegment::create(&name, 4096).unwrap());
        assert_eq!(OwnerLock::probe(&name), Owner::Stillborn);
        ShmSegment::unlink(&name).unwrap();
    }

    #[test]
    fn byte_locks_conflict_between_descriptions_only() {
        let name = unique("bytes");
        let a = ShmSegment::create_opts(&name, 4096, Opts { keep_fd: true, reserve: false }).unwrap();
        let b = ShmSegment::open_opts(&name, Opts { keep_fd: true, reserve: false }).unwrap();
        let (fa, fb) = (a.fd().unwrap(), b.fd().unwrap());
        assert!(try_lock_byte(fa, 3).unwrap());
        assert!(try_lock_byte(fa, 3).unwrap(), "retaking one's own lock");
        assert!(!try_lock_byte(fb, 3).unwrap(), "another description's lock");
        assert!(try_lock_byte(fb, 4).unwrap());
        assert!(locked_by_others(fb, 3, 1).unwrap());
        assert!(!locked_by_others(fa, 3, 1).unwrap(), "own locks are not conflicts");
        assert!(locked_by_others(fa, 0, 0).unwrap(), "b's byte 4");
        drop(a);
        assert!(!locked_by_others(fb, 3, 1).unwrap(), "released with its description");
        assert!(try_lock_byte(fb, 3).unwrap());
        ShmSegment::unlink(&name).unwrap();
    }
}
