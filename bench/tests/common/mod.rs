//! What the bench crate's multi-process tests share: where the built binaries are, and
//! the job lock that keeps two jobs' busy-polling processes off the same cores.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;

/// `target/<profile>/`, from this test executable (`target/<profile>/deps/...`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("the test executable has a directory");
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("deps has a parent").to_path_buf()
    } else {
        dir.to_path_buf()
    }
}

/// Serializes jobs across test threads and test processes: the same file lock as
/// gpulmt-tests' jobs take.
pub struct JobLock(#[allow(dead_code)] File);

pub fn job_lock() -> JobLock {
    let path = profile_dir().join("gpulmt-tests.lock");
    let f = File::options().create(true).append(true).open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    // SAFETY: a valid open descriptor; flock has no memory-safety preconditions.
    while unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let e = std::io::Error::last_os_error();
        assert_eq!(e.raw_os_error(), Some(libc::EINTR), "flock {}: {e}", path.display());
    }
    JobLock(f)
}
