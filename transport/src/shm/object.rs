//! Named POSIX shared-memory objects, the one place gpulmt makes, maps, lists and
//! removes them: creating or opening an object and mapping it read-write and
//! `MAP_SHARED` ([`ShmSegment`]), removing its name, and listing `/dev/shm` by prefix
//! ([`entries`]). The errors of the whole `shm` layer ([`ShmError`]) live here too.
//!
//! Both users go through it: the job segment ([`super::job`]) and the `sim` device
//! backend, whose simulated device memory is one object per allocation.
//!
//! Every object gpulmt creates is named `gpulmt-...` so that the launcher and
//! `gpulmt-run --cleanup` can find them:
//! - `gpulmt-<job>`: the job segment (see [`super::job`]);
//! - `gpulmt-<job>-<anything>`: further objects of that job;
//! - `gpulmt-sim-<pid>-<nonce>-<anything>`: simulated device memory of one backend
//!   instance of process `<pid>`, claimed by its owner object
//!   `gpulmt-sim-<pid>-<nonce>-owner` (see [`super::owner`]).
//!
//! Names live no longer than they must: the job segment's name goes as soon as every
//! rank has mapped it, a sim allocation's when it is freed. What a killed process
//! leaves behind is found by its owner locks, which die with it, and removed by the
//! next job that starts on the node ([`super::sweep`]), by `gpulmt-run` after every
//! run, and by `gpulmt-run --cleanup`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::time::Duration;

/// Where Linux exposes POSIX shared-memory objects as files.
pub const SHM_DIR: &str = "/dev/shm";

/// Prefix of every shared-memory object gpulmt creates.
pub const OBJECT_PREFIX: &str = "gpulmt-";

/// Prefix of the simulated-device objects: `gpulmt-sim-<pid>-...`.
pub const SIM_PREFIX: &str = "gpulmt-sim-";

/// Prefix of the sockets of the fd servers that hand out shareable device memory
/// (`device/fd_share.rs`): `gpulmt-fd-<pid>-<nonce>.sock`.
pub const FD_SOCKET_PREFIX: &str = "gpulmt-fd-";

/// How to raise the size of `/dev/shm`, for errors that ran out of it.
pub const HINT_SHM_SIZE: &str = "enlarge /dev/shm: in a container start it with a larger --shm-size (docker run --shm-size=1g ...), on a host remount it (as root: mount -o remount,size=4G /dev/shm); `gpulmt-run --cleanup` removes leftovers of dead jobs";

/// What to tell the user when no more specific advice applies.
const HINT_LEFTOVERS: &str = "/dev/shm full or limited? remove leftovers with `gpulmt-run --cleanup` (and check `df -h /dev/shm`; in a container, docker's --shm-size)";

/// Errors of the shared-memory layer. Every message names what failed and what to try.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// A libc call failed.
    #[error("{call}(\"/{name}\") failed: {source}; {hint}")]
    Os {
        /// The libc function, e.g. `shm_open`.
        call: &'static str,
        /// The object name (without the leading `/`).
        name: String,
        #[source]
        source: io::Error,
        /// What the user can do about it.
        hint: &'static str,
    },
    /// The name cannot be a POSIX shared-memory object name.
    #[error("invalid shared-memory object name {name:?}: {reason}")]
    InvalidName { name: String, reason: &'static str },
    /// The object exists but has size 0: its creator has not sized it yet, or died doing so.
    #[error("shared-memory object \"/{name}\" has size 0: its creator has not sized it yet (or died while creating it; `gpulmt-run --cleanup` removes it)")]
    Empty { name: String },
    /// The object exists but its contents are not what we expect (wrong magic or version,
    /// too small for the layout it claims...).
    #[error("shared-memory segment \"/{name}\" is not usable: {reason}")]
    BadSegment { name: String, reason: String },
    /// A job layout or ring geometry that cannot be laid out.
    #[error("invalid shared-memory layout: {0}")]
    BadLayout(String),
    /// Waiting for something shared took too long.
    #[error("timed out after {waited:?} waiting for {what}")]
    Timeout { what: String, waited: Duration },
    /// A job barrier could not complete.
    #[error("barrier #{generation} of job segment \"/{name}\" failed on rank {me}: {reason}; ranks that have not arrived: {missing:?}")]
    Barrier { name: String, me: usize, generation: u64, missing: Vec<usize>, reason: String },
    /// `/dev/shm` has not room for an object (reserved at creation, so that running out
    /// is this error and not a SIGBUS on first touch).
    #[error("{what} \"/{name}\" needs {} of /dev/shm, but only {} of its {} are free; {HINT_SHM_SIZE}", mib(*needed), mib(*free), mib(*size))]
    NoSpace {
        /// What the object is for ("job segment", "sim device allocation").
        what: &'static str,
        name: String,
        /// Bytes the object needs.
        needed: u64,
        /// Free bytes of /dev/shm when it failed, and its size.
        free: u64,
        size: u64,
    },
    /// A rank of a job segment is already held by a live process: two processes claim
    /// the same rank (two job instances with one `GPULMT_JOB`, or a second context).
    #[error("rank {rank} of job segment \"/{name}\" (instance {instance:016x}) is already held by a live process (pid {pid} registered it): is another job running with the same GPULMT_JOB, or a second context for this rank? Start every job with its own id (gpulmt-run makes one)")]
    RankTaken { name: String, rank: usize, pid: u32, instance: u64 },
}

/// `n` bytes in MiB, for messages.
fn mib(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64)
}

impl ShmError {
    /// The errno of an [`ShmError::Os`], if that is what this is.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            ShmError::Os { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Builds an [`ShmError::Os`] from the current `errno`, with advice that fits it.
    pub(crate) fn last_os(call: &'static str, name: &str) -> Self {
        Self::os(call, name, io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// Builds an [`ShmError::Os`] from `errno`, for calls that return it instead of
    /// setting it (`posix_fallocate`).
    pub(crate) fn os(call: &'static str, name: &str, errno: i32) -> Self {
        let source = io::Error::from_raw_os_error(errno);
        ShmError::Os { call, name: name.to_owned(), source, hint: hint_for(call, errno) }
    }
}

/// Advice for a failed libc call, by errno.
fn hint_for(call: &str, errno: i32) -> &'static str {
    match (call, errno) {
        ("shm_open", libc::EEXIST) => {
            "an object of that name already exists: another job with the same GPULMT_JOB, or a leftover of a crashed one (`gpulmt-run --cleanup` removes leftovers)"
        }
        ("shm_open", libc::ENOENT) => {
            "it does not exist (yet): is rank 0 running, and do all ranks have the same GPULMT_JOB? (start jobs with gpulmt-run)"
        }
        (_, libc::EACCES) | (_, libc::EPERM) => {
            "permission denied: the object belongs to another user or has a restrictive mode; use another job id or have its owner remove it"
        }
        (_, libc::EMFILE) | (_, libc::ENFILE) => "too many open files: raise `ulimit -n`",
        (_, libc::ENOSPC) | (_, libc::ENOMEM) | (_, libc::EFBIG) => HINT_LEFTOVERS,
        (_, libc::ENAMETOOLONG) => "the name is too long: use a shorter job id",
        ("mmap", libc::EINVAL) => "the size or alignment is invalid for mmap",
        _ => "see the errno above",
    }
}

/// Checks `name` and returns it without a leading `/` (how we store it) and as the
/// C string `shm_open` wants (with the leading `/`).
pub(crate) fn c_name(name: &str) -> Result<(String, CString), ShmError> {
    let bare = name.strip_prefix('/').unwrap_or(name);
    let invalid = |reason| ShmError::InvalidName { name: name.to_owned(), reason };
    if bare.is_empty() {
        return Err(invalid("empty"));
    }
    // NAME_MAX is 255 on Linux; glibc rejects longer names with ENAMETOOLONG, but a
    // clear message up front is better.
    if bare.len() > 250 {
        return Err(invalid("longer than 250 bytes"));
    }
    if bare.contains('/') {
        return Err(invalid("contains '/' after the leading one"));
    }
    if bare == "." || bare == ".." {
        return Err(invalid("'.' and '..' are not object names"));
    }
    if bare.bytes().any(|b| b == 0 || b.is_ascii_control()) {
        return Err(invalid("contains NUL or control characters"));
    }
    let c = CString::new(format!("/{bare}")).map_err(|_| invalid("contains NUL"))?;
    Ok((bare.to_owned(), c))
}

/// Maps `len` bytes of `fd` read-write and shared; keeps the descriptor if asked (it is
/// closed otherwise: the mapping does not need it). Returns the errno on failure.
fn map(fd: OwnedFd, len: usize, keep_fd: bool) -> Result<(NonNull<u8>, Option<OwnedFd>), i32> {
    // SAFETY: fd is open with at least len bytes; we ask for a fresh mapping anywhere.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok((NonNull::new(p.cast()).expect("mmap returned NULL"), keep_fd.then_some(fd)))
}

/// The size of the object `fd` refers to (`fstat`), or the errno.
pub fn fd_len(fd: BorrowedFd<'_>) -> Result<u64, i32> {
    // SAFETY: zeroed stat is a valid out-buffer for fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is open and st is a valid out-pointer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    Ok(st.st_size.max(0) as u64)
}

/// Reserves the first `len` bytes of `fd` (`posix_fallocate`) with every signal blocked
/// in this thread: tmpfs gives up a reservation (and undoes it) when a signal arrives,
/// so under a fast interval timer (a profiler's SIGPROF, an application's SIGALRM) an
/// unblocked reservation of a large object would fail or never finish. The signals wait
/// until the reservation is done. Returns `posix_fallocate`'s error number (0: done).
fn reserve(fd: BorrowedFd<'_>, len: libc::off_t) -> i32 {
    // SAFETY: zeroed sigset_t values are valid out-buffers; sigfillset initializes `all`.
    let (mut all, mut old): (libc::sigset_t, libc::sigset_t) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: valid sigset pointers; pthread_sigmask changes only this thread's mask,
    // which is restored below before returning.
    let masked =
        unsafe { libc::sigfillset(&mut all) == 0 && libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0 };
    let rc = loop {
        // SAFETY: fd is open. posix_fallocate returns the error instead of setting errno.
        let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len) };
        // Signals the mask cannot block (none for this thread once masked) still end it.
        if rc != libc::EINTR {
            break rc;
        }
    };
    if masked {
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    rc
}

/// The size and free bytes of `/dev/shm` (zeros if unknown).
pub fn shm_space() -> (u64, u64) {
    let Ok(dir) = CString::new(SHM_DIR) else { return (0, 0) };
    // SAFETY: zeroed statvfs is a valid out-buffer.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: dir is a valid C string; st a valid out-pointer.
    if unsafe { libc::statvfs(dir.as_ptr(), &mut st) } != 0 {
        return (0, 0);
    }
    let frsize = st.f_frsize as u64;
    (st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize)
}

/// The error of an object of `len` bytes that `/dev/shm` has no room for.
fn no_space(what: &'static str, name: &str, len: usize) -> ShmError {
    let (size, free) = shm_space();
    ShmError::NoSpace { what, name: name.to_owned(), needed: len as u64, free, size }
}

/// A named POSIX shared-memory object mapped read-write and `MAP_SHARED`.
///
/// Dropping it unmaps it; the name stays until [`ShmSegment::unlink`].
#[derive(Debug)]
pub struct ShmSegment {
    ptr: NonNull<u8>,
    len: usize,
    /// Without the leading `/`.
    name: String,
    /// The descriptor, where kept ([`Opts::keep_fd`]): for locks on the object.
    fd: Option<OwnedFd>,
}

// SAFETY: the segment is a plain mapping of shared memory; it holds no thread-affine
// state. What lives inside is synchronized by its users (atomics, SPSC rings).
unsafe impl Send for ShmSegment {}
// SAFETY: as above; `&ShmSegment` only hands out the raw pointer, the length and the
// descriptor (whose lock operations are system calls, safe from any thread).
unsafe impl Sync for ShmSegment {}

/// How to make or open a [`ShmSegment`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Opts {
    /// Reserve every page at creation (`posix_fallocate`): a full `/dev/shm` fails
    /// creation ([`ShmError::NoSpace`]), like a device allocation running out of memory,
    /// instead of raising SIGBUS when a page is first touched. Filesystems that cannot
    /// reserve leave the object sparse.
    pub reserve: bool,
    /// Keep the descriptor open for the segment's life ([`ShmSegment::fd`]): the object's
    /// locks (see [`super::owner`]) are held through it, and die with it.
    pub keep_fd: bool,
}

impl ShmSegment {
    /// Creates the object `name` (it must not exist), sizes it to `len` bytes and maps it.
    ///
    /// The object has mode 0600: only this user's processes may open it. The file is
    /// sparse: pages cost memory only once touched (and reading untouched pages gives
    /// zeros, so a fresh segment is zero-initialized). Note that tmpfs checks its size
    /// limit when a page is first touched, not here: touching a page of a segment larger
    /// than the free space of `/dev/shm` raises SIGBUS (reserve with [`Opts::reserve`]).
    pub fn create(name: &str, len: usize) -> Result<Self, ShmError> {
        Self::create_opts(name, len, Opts::default())
    }

    /// As [`create`](Self::create), with every page reserved now ([`Opts::reserve`]).
    pub fn create_reserved(name: &str, len: usize) -> Result<Self, ShmError> {
        Self::create_opts(name, len, Opts { reserve: true, keep_fd: false })
    }

    /// As [`create`](Self::create), with the given options.
    pub fn create_opts(name: &str, len: usize, opts: Opts) -> Result<Self, ShmError> {
        let (bare, cname) = c_name(name)?;
        // O_EXCL: two jobs must never share a segment by accident (same job id, leftover).
        // SAFETY: cname is a valid NUL-terminated string.
        let raw = unsafe {
            libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC, 0o600)
        };
        if raw < 0 {
            return Err(ShmError::last_os("shm_open", &bare));
        }
        // SAFETY: raw is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Self::size_new(fd, name, len, opts)
    }

    /// Opens `name`, creating it empty if it does not exist, in one step: unlike an
    /// `O_EXCL` create followed by an open, no removal of the name in between can make
    /// both fail. The caller tells from [`fd_len`] and its own locks whether it made the
    /// object, then sizes it with [`size_new`](Self::size_new) or maps it with
    /// [`map_existing`](Self::map_existing).
    pub fn open_or_create_fd(name: &str) -> Result<OwnedFd, ShmError> {
        let (bare, cname) = c_name(name)?;
        // SAFETY: cname is a valid NUL-terminated string.
        let raw = unsafe { libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
        if raw < 0 {
            return Err(ShmError::last_os("shm_open", &bare));
        }
        // SAFETY: raw is a descriptor we just opened and own.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// Sizes the empty object `name` that `fd` refers to, and this caller made, to `len`
    /// bytes and maps it. On failure the name is removed, or it would block the next
    /// create of this name (`O_EXCL`) and leak until `--cleanup`.
    pub fn size_new(fd: OwnedFd, name: &str, len: usize, opts: Opts) -> Result<Self, ShmError> {
        let (bare, cname) = c_name(name)?;
        let fail_with = |err: ShmError| {
            // SAFETY: cname is valid; the caller made this name just now.
            unsafe { libc::shm_unlink(cname.as_ptr()) };
            err
        };
        if len == 0 {
            return Err(fail_with(ShmError::BadLayout(format!("cannot create \"/{bare}\" with size 0"))));
        }
        let Ok(off_len) = libc::off_t::try_from(len) else {
            return Err(fail_with(ShmError::BadLayout(format!("size {len} of \"/{bare}\" does not fit off_t"))));
        };
        let raw = fd.as_raw_fd();
        let fail = |call: &'static str| fail_with(ShmError::last_os(call, &bare));
        // The umask may have stripped bits from 0600 but cannot have added any; force the
        // exact mode anyway so that a umask of e.g. 0277 cannot leave us read-only.
        // SAFETY: fd is open.
        if unsafe { libc::fchmod(raw, 0o600) } != 0 {
            return Err(fail("fchmod"));
        }
        // ftruncate makes a sparse file: no page is allocated until touched.
        // SAFETY: fd is open.
        if unsafe { libc::ftruncate(raw, off_len) } != 0 {
            return Err(fail("ftruncate"));
        }
        if opts.reserve {
            match reserve(fd.as_fd(), off_len) {
                0 | libc::EOPNOTSUPP => {}
                libc::ENOSPC => return Err(fail_with(no_space("shared-memory object", &bare, len))),
                rc => return Err(fail_with(ShmError::os("posix_fallocate", &bare, rc))),
            }
        }
        match map(fd, len, opts.keep_fd) {
            Ok((ptr, fd)) => Ok(ShmSegment { ptr, len, name: bare, fd }),
            Err(errno) => Err(fail_with(ShmError::os("mmap", &bare, errno))),
        }
    }

    /// Opens and maps the existing object `name`; its size is the object's current size.
    ///
    /// Returns [`ShmError::Empty`] if the object has size 0 (its creator has not sized it
    /// yet), so that waiting openers can retry.
    pub fn open(name: &str) -> Result<Self, ShmError> {
        Self::open_opts(name, Opts::default())
    }

    /// As [`open`](Self::open), with the given options (`reserve` does not apply).
    pub fn open_opts(name: &str, opts: Opts) -> Result<Self, ShmError> {
        let (bare, cname) = c_name(name)?;
        // SAFETY: cname is a valid NUL-terminated string.
        let raw = unsafe { libc::shm_open(cname.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if raw < 0 {
            return Err(ShmError::last_os("shm_open", &bare));
        }
        // SAFETY: raw is a descriptor we just opened and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Self::map_existing(fd, name, opts)
    }

    /// Maps the whole object `name` that `fd` refers to, at its current size
    /// ([`ShmError::Empty`] while it has none).
    pub fn map_existing(fd: OwnedFd, name: &str, opts: Opts) -> Result<Self, ShmError> {
        let (bare, _) = c_name(name)?;
        let len = match usize::try_from(fd_len(fd.as_fd()).map_err(|e| ShmError::os("fstat", &bare, e))?) {
            Ok(0) => return Err(ShmError::Empty { name: bare }),
            Ok(n) => n,
            Err(_) => {
                return Err(ShmError::BadSegment { name: bare, reason: "its size does not fit usize".into() });
            }
        };
        match map(fd, len, opts.keep_fd) {
            Ok((ptr, fd)) => Ok(ShmSegment { ptr, len, name: bare, fd }),
            Err(errno) => Err(ShmError::os("mmap", &bare, errno)),
        }
    }

    /// The descriptor, if the segment was made with [`Opts::keep_fd`].
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Removes the name `name`. Existing mappings stay valid until unmapped.
    ///
    /// Returns `Ok(false)` if no such object existed (so cleanup paths can be idempotent).
    pub fn unlink(name: &str) -> Result<bool, ShmError> {
        let (bare, cname) = c_name(name)?;
        // SAFETY: cname is a valid NUL-terminated string.
        if unsafe { libc::shm_unlink(cname.as_ptr()) } == 0 {
            return Ok(true);
        }
        let err = ShmError::last_os("shm_unlink", &bare);
        if err.raw_os_error() == Some(libc::ENOENT) {
            Ok(false)
        } else {
            Err(err)
        }
    }

    /// Unmaps the object now, reporting a failure that dropping it would only log.
    pub fn unmap(mut self) -> Result<(), ShmError> {
        self.release_mapping()
    }

    /// Unmaps the mapping once: afterwards `len` is 0 and drop has nothing left to do.
    fn release_mapping(&mut self) -> Result<(), ShmError> {
        if self.len == 0 {
            return Ok(());
        }
        let len = std::mem::replace(&mut self.len, 0);
        // SAFETY: ptr/len describe a mapping we made and nobody else unmaps; `len` is 0
        // from now on, so it is unmapped once.
        if unsafe { libc::munmap(self.ptr.as_ptr().cast(), len) } != 0 {
            return Err(ShmError::last_os("munmap", &self.name));
        }
        Ok(())
    }

    /// Start of the mapping (page-aligned).
    pub fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a segment cannot be created or opened with size 0.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The object name, without the leading `/` (the file name under `/dev/shm`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ShmSegment {
    fn drop(&mut self) {
        if let Err(e) = self.release_mapping() {
            tracing::warn!(error = %e, "unmapping a shared-memory object failed");
        }
    }
}

/// Names of the entries of `/dev/shm` that start with `prefix`, sorted (empty if the
/// directory cannot be read: then there is nothing we could remove either). Names that
/// are not UTF-8 are not gpulmt's and are skipped.
pub fn entries(prefix: &str) -> Vec<String> {
    let dir = match std::fs::read_dir(SHM_DIR) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(dir = SHM_DIR, error = %e, "cannot list shared-memory objects");
            return Vec::new();
        }
    };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// Unlinks `name`, counting it if it was removed and logging why if it could not be.
pub(crate) fn unlink_counted(name: &str) -> usize {
    match ShmSegment::unlink(name) {
        Ok(true) => {
            tracing::debug!(name, "removed shared-memory object");
            1
        }
        // Someone else removed it between listing and unlinking: fine.
        Ok(false) => 0,
        Err(e) => {
            tracing::warn!(error = %e, "cannot remove shared-memory object");
            0
        }
    }
}

/// Unlinks every `/dev/shm` entry whose name starts with `prefix`; returns how many.
///
/// The prefix is matched literally: include a trailing separator (`gpulmt-sim-123-`)
/// when a shorter id must not match a longer one.
pub fn remove_objects_with_prefix(prefix: &str) -> usize {
    if prefix.is_empty() || prefix.contains('/') {
        // Never let a bad prefix wipe all of /dev/shm.
        tracing::warn!(prefix, "refusing to remove shared-memory objects by an empty or bad prefix");
        return 0;
    }
    entries(prefix).iter().map(|n| unlink_counted(n)).sum()
}

/// True if `name` is `base` itself or `base` followed by a character that cannot be
/// part of a job id's alphanumeric run (`-`, `.`, `_`...), so that job `ab` does not
/// match the objects of job `abc`.
pub(crate) fn is_object_of(name: &str, base: &str) -> bool {
    match name.strip_prefix(base) {
        Some("") => true,
        Some(rest) => !rest.as_bytes()[0].is_ascii_alphanumeric(),
        None => false,
    }
}

/// Unlinks every `/dev/shm` object of job `job`: `gpulmt-<job>` and `gpulmt-<job>-*`
/// (any non-alphanumeric separator). Returns how many were removed.
pub fn remove_job_objects(job: &str) -> usize {
    if job.is_empty() || job.contains('/') {
        tracing::warn!(job, "refusing to remove the objects of an empty or bad job id");
        return 0;
    }
    let base = format!("{OBJECT_PREFIX}{job}");
    entries(&base).iter().filter(|n| is_object_of(n, &base)).map(|n| unlink_counted(n)).sum()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A name unique to this test process and call, so parallel tests never collide.
    pub(crate) fn unique(tag: &str) -> String {
        static N: AtomicUsize = AtomicUsize::new(0);
        format!("gpulmt-test{}x{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
    }

    /// Pid of a process that has exited and been reaped.
    pub(crate) fn dead_pid() -> u32 {
        let mut c = std::process::Command::new("true").spawn().expect("spawn true");
        let pid = c.id();
        c.wait().expect("wait true");
        pid
    }

    #[test]
    fn create_open_unlink_mode() {
        let name = unique("seg");
        let a = ShmSegment::create(&name, 3 * 4096 + 5).unwrap();
        assert_eq!(a.len(), 3 * 4096 + 5);
        assert_eq!(a.name(), name);
        assert_eq!(a.ptr() as usize % 4096, 0);
        let meta = std::fs::metadata(Path::new(SHM_DIR).join(&name)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);

        // A second create of the same name must fail with EEXIST and a useful hint.
        let e = ShmSegment::create(&name, 4096).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
        assert!(e.to_string().contains("--cleanup"), "{e}");

        // Writes through one mapping are visible through another.
        let b = ShmSegment::open(&format!("/{name}")).unwrap();
        assert_eq!(b.len(), a.len());
        // SAFETY: both mappings are at least 3*4096+5 bytes.
        unsafe {
            assert_eq!(*b.ptr().add(3 * 4096 + 4), 0, "fresh segment reads as zeros");
            *a.ptr().add(4097) = 42;
            assert_eq!(*b.ptr().add(4097), 42);
        }
        assert!(ShmSegment::unlink(&name).unwrap());
        assert!(!ShmSegment::unlink(&name).unwrap(), "second unlink: already gone");
        // The mappings survive the unlink.
        // SAFETY: still mapped.
        unsafe { assert_eq!(*a.ptr().add(4097), 42) };
        let e = ShmSegment::open(&name).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn bad_names_and_sizes() {
        assert!(matches!(ShmSegment::create("", 10), Err(ShmError::InvalidName { .. })));
        assert!(matches!(ShmSegment::create("a/b", 10), Err(ShmError::InvalidName { .. })));
        assert!(matches!(ShmSegment::create(&"x".repeat(300), 10), Err(ShmError::InvalidName { .. })));
        let name = unique("zero");
        assert!(matches!(ShmSegment::create(&name, 0), Err(ShmError::BadLayout(_))));
        assert!(!Path::new(SHM_DIR).join(&name).exists());
    }

    #[test]
    fn remove_by_prefix_respects_boundaries() {
        let base = unique("pfx");
        let a = base.clone();
        let b = format!("{base}-x");
        let longer = format!("{base}7");
        for n in [&a, &b, &longer] {
            drop(ShmSegment::create(n, 4096).unwrap());
        }
        // remove_job_objects takes the job id, i.e. the name without "gpulmt-".
        let job = &base[OBJECT_PREFIX.len()..];
        assert_eq!(remove_job_objects(job), 2);
        assert!(Path::new(SHM_DIR).join(&longer).exists(), "job {job}7 is another job");
        assert_eq!(remove_objects_with_prefix(&longer), 1);
        assert_eq!(remove_objects_with_prefix(""), 0);
    }

    #[test]
    fn entries_lists_by_prefix_sorted() {
        let base = unique("list");
        let names = [format!("{base}-b"), format!("{base}-a"), format!("{base}x")];
        for n in &names {
            drop(ShmSegment::create(n, 4096).unwrap());
        }
        assert_eq!(entries(&format!("{base}-")), [format!("{base}-a"), format!("{base}-b")]);
        assert_eq!(entries(&base).len(), 3);
        for n in &names {
            ShmSegment::unlink(n).unwrap();
        }
        assert!(entries(&base).is_empty());
    }

    #[test]
    fn reserved_objects_and_explicit_unmap() {
        let name = unique("reserved");
        let a = ShmSegment::create_reserved(&name, 2 * 4096).unwrap();
        assert_eq!(a.len(), 2 * 4096);
        let b = ShmSegment::open(&name).unwrap();
        // SAFETY: both mappings are 2 pages long.
        unsafe {
            *a.ptr().add(4096) = 7;
            assert_eq!(*b.ptr().add(4096), 7);
        }
        a.unmap().unwrap();
        b.unmap().unwrap();
        assert!(ShmSegment::unlink(&name).unwrap());
    }
}
