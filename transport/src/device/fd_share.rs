//! File descriptors from one process to another on the node, over a Unix-domain socket.
//!
//! Some GPU memory is shared through a POSIX file descriptor rather than through opaque
//! bytes: CUDA's `cuMemPoolExportToShareableHandle` and `cuMemExportToShareableHandle` give
//! an fd, and the importing process needs an fd of its own that refers to the same file.
//! The exporter runs an [`FdServer`] on a Unix socket; an importer [`fetch`]es the fd for a
//! key, and the kernel installs a duplicate in the importer as `SCM_RIGHTS` ancillary data.
//!
//! Why `SCM_RIGHTS` rather than `pidfd_getfd(2)`: `pidfd_getfd` needs the exporter's pid in
//! the importer's PID namespace and ptrace permission over it (Yama's `ptrace_scope`, or
//! `CAP_SYS_PTRACE`), which containers of one job often lack; a socket only needs both
//! processes to see the socket's directory, and gpulmt already requires a shared
//! `/dev/shm`, where the socket lives.
//!
//! The exporter holds no fd between requests: its producer makes one when asked (so an
//! idle exporter keeps no GPU memory alive through a stray descriptor), and the server
//! closes it as soon as the kernel has taken its copy.
//!
//! Access control is the socket file's mode: it is created with the process umask
//! (typically 0755 under umask 022, so only the owner, who alone may write it, can
//! connect) and it lives in a directory whose permissions the node's administrator set.
//!
//! Wire protocol, one request per connection:
//! - the client writes the key, 8 bytes little endian;
//! - the server answers with one `sendmsg`: status `u32` LE (0 ok, 1 refused), payload
//!   length `u32` LE, then the payload (the metadata when ok, the reason in UTF-8 when
//!   refused), at most [`MAX_PAYLOAD`] bytes; when ok, the fd rides on that `sendmsg`.

use std::io::{self, IoSlice, IoSliceMut, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::io::{retry_on_intr, Errno};
use rustix::net::sockopt::{set_socket_timeout, Timeout};
use rustix::net::{
    recvmsg, send, sendmsg, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, Shutdown, SocketAddrUnix, SocketFlags, SocketType,
};

/// What an exporter offers under a key: the producer makes the fd at request time (so the
/// exporter holds no fd, which would keep GPU memory alive), plus metadata bytes sent with it.
/// An `Err` is a refusal; its message reaches the importer as [`FetchError::Refused`].
pub(crate) type Produce = Box<dyn Fn(u64) -> Result<(OwnedFd, Vec<u8>), String> + Send + Sync>;

/// Most payload bytes (metadata, or a refusal's reason) one answer carries: small enough
/// that the answer is one socket buffer's worth and the client's buffer lives on the stack.
pub(crate) const MAX_PAYLOAD: usize = 4096;

/// Status `u32` + payload length `u32`.
const HEADER: usize = 8;
const STATUS_OK: u32 = 0;
const STATUS_REFUSED: u32 = 1;

/// How long the server waits on one client's read or write: the server answers one
/// connection at a time, so a stuck client delays the others at most this long.
const CLIENT_IO_TIMEOUT: Duration = Duration::from_secs(1);

/// Pause after a failed `accept` (out of fds, say), so the thread does not spin on it.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(10);

/// `sun_path` holds 108 bytes including the terminating NUL (std refuses a path that
/// leaves no room for it).
const SUN_PATH_MAX: usize = 107;

const THREAD_NAME: &str = "gpulmt-fd-share";

/// The path of the server of exporter (`pid`, `nonce`) under `dir`:
/// `dir/gpulmt-fd-<pid>-<nonce as 16 hex digits>.sock`. An error when the path would not
/// fit a Unix socket address.
pub(crate) fn socket_path(dir: &Path, pid: u32, nonce: u64) -> io::Result<PathBuf> {
    let path = dir.join(format!("{}{pid}-{nonce:016x}.sock", crate::shm::object::FD_SOCKET_PREFIX));
    let len = path.as_os_str().len();
    if len > SUN_PATH_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "fd-share socket path {} is {len} bytes, more than the {SUN_PATH_MAX} a Unix socket address holds: \
                 use a shorter directory than {}",
                path.display(),
                dir.display()
            ),
        ));
    }
    Ok(path)
}

/// What the server's thread and its owner share.
struct Shared {
    listener: UnixListener,
    stop: AtomicBool,
    served: AtomicU64,
}

/// An exporter's server: one thread that answers fd requests with a [`Produce`].
/// Dropping it stops the thread and removes the socket file.
pub(crate) struct FdServer {
    path: PathBuf,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl FdServer {
    /// Binds a `SOCK_STREAM` Unix listener at [`socket_path`]`(dir, pid, nonce)` (removing a
    /// stale file of that name first: it can only be left by an earlier process with the
    /// same pid) and starts one thread, "gpulmt-fd-share", that accepts connections and
    /// answers them with `produce`, one at a time. The socket file gets the process umask's
    /// default mode (see the module's documentation).
    pub(crate) fn start(dir: &Path, pid: u32, nonce: u64, produce: Produce) -> io::Result<FdServer> {
        let path = socket_path(dir, pid, nonce)?;
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::debug!(path = %path.display(), "fd-share: removed a stale socket file"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("cannot remove the stale fd-share socket {}: {e}; remove it by hand", path.display()),
                ))
            }
        }
        let listener = UnixListener::bind(&path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "cannot listen for fd-share requests at {}: {e}; {} must be writable, and shared with the \
                     node's other processes",
                    path.display(),
                    dir.display()
                ),
            )
        })?;
        let shared = Arc::new(Shared { listener, stop: AtomicBool::new(false), served: AtomicU64::new(0) });
        let spawned = std::thread::Builder::new().name(THREAD_NAME.into()).spawn({
            let shared = Arc::clone(&shared);
            move || serve(&shared, &produce)
        });
        match spawned {
            Ok(thread) => Ok(FdServer { path, shared, thread: Some(thread) }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(io::Error::new(e.kind(), format!("cannot start the {THREAD_NAME} thread: {e}")))
            }
        }
    }

    /// The path it listens at.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Requests answered with an fd so far (each answer carries one); refusals and
    /// failed answers do not count.
    #[cfg(test)]
    pub(crate) fn served(&self) -> u64 {
        self.shared.served.load(Ordering::Acquire)
    }
}

impl Drop for FdServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        // Wake the blocking accept. On Linux, shutdown of a listening Unix socket makes
        // accept fail at once (EINVAL), and it works even if someone unlinked the socket
        // file; connecting is the fallback for a kernel where it does not (the thread then
        // accepts that connection and sees the flag). The thread is otherwise busy with at
        // most one client, bounded by CLIENT_IO_TIMEOUT per read and write, plus the producer.
        let _ = rustix::net::shutdown(&self.shared.listener, Shutdown::Both);
        let _ = connect(&self.path, Duration::from_millis(100));
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::debug!(path = %self.path.display(), "fd-share: the server thread panicked");
            }
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => tracing::debug!(path = %self.path.display(), error = %e, "fd-share: cannot remove the socket"),
        }
    }
}

/// The server thread: accept, answer, repeat, until the owner sets `stop`. Nothing a client
/// does ends it: each failure is logged and that connection dropped.
fn serve(shared: &Shared, produce: &Produce) {
    loop {
        let accepted = shared.listener.accept();
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        match accepted {
            Ok((stream, _)) => {
                let answered = answer(&stream, produce);
                // Closed before it counts, so that once `served` shows an answer the
                // server holds nothing more of it (the fd-leak test relies on that).
                drop(stream);
                match answered {
                    Ok(true) => {
                        shared.served.fetch_add(1, Ordering::Release);
                    }
                    Ok(false) => {}
                    Err(why) => tracing::debug!(why, "fd-share: dropped a connection"),
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "fd-share: accept failed");
                std::thread::sleep(ACCEPT_BACKOFF);
            }
        }
    }
}

/// Reads one request from `stream` and answers it: Ok(true) when an fd went out,
/// Ok(false) for a refusal sent, Err(what failed) otherwise.
fn answer(stream: &UnixStream, produce: &Produce) -> Result<bool, String> {
    // A client that connects and then stalls must not hold the server forever.
    stream.set_read_timeout(Some(CLIENT_IO_TIMEOUT)).map_err(|e| format!("setting the read timeout: {e}"))?;
    stream.set_write_timeout(Some(CLIENT_IO_TIMEOUT)).map_err(|e| format!("setting the write timeout: {e}"))?;
    let mut key = [0u8; 8];
    let mut reader = stream;
    reader.read_exact(&mut key).map_err(|e| format!("reading the key: {e}"))?;
    let key = u64::from_le_bytes(key);
    // A panicking producer is a bug, but one key's bug must not end sharing for all.
    let produced = catch_unwind(AssertUnwindSafe(|| produce(key)))
        .unwrap_or_else(|_| Err(format!("the exporter's producer panicked on key {key:#x}")));
    match produced {
        Ok((fd, meta)) if meta.len() <= MAX_PAYLOAD => {
            send_reply(stream, STATUS_OK, &meta, Some(fd.as_fd()))
                .map_err(|e| format!("sending the fd for key {key:#x}: {e}"))?;
            // `fd` drops here: the kernel holds its own reference while the fd is in
            // flight, and the exporter keeps none.
            Ok(true)
        }
        Ok((_fd, meta)) => {
            let reason = format!(
                "the exporter's metadata for key {key:#x} is {} bytes, more than the {MAX_PAYLOAD} the fd-share \
                 protocol carries (a gpulmt bug)",
                meta.len()
            );
            tracing::debug!(reason, "fd-share: refusing");
            send_reply(stream, STATUS_REFUSED, reason.as_bytes(), None)
                .map_err(|e| format!("sending the refusal of key {key:#x}: {e}"))?;
            Ok(false)
        }
        Err(reason) => {
            send_reply(stream, STATUS_REFUSED, truncate_utf8(&reason, MAX_PAYLOAD), None)
                .map_err(|e| format!("sending the refusal of key {key:#x}: {e}"))?;
            Ok(false)
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn truncate_utf8(s: &str, max: usize) -> &[u8] {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s.as_bytes()[..end]
}

/// Sends header + `payload` with `fd` as `SCM_RIGHTS` on the first segment; the rest, if
/// the kernel took only part, follows with plain sends (the fd is already on its way).
fn send_reply(stream: &UnixStream, status: u32, payload: &[u8], fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    debug_assert!(payload.len() <= MAX_PAYLOAD);
    let mut msg = Vec::with_capacity(HEADER + payload.len());
    msg.extend_from_slice(&status.to_le_bytes());
    msg.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    msg.extend_from_slice(payload);

    let fds = fd.as_slice();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("the ancillary buffer has no room for one fd (a gpulmt bug)"));
    }
    // NOSIGNAL: a client gone away must give EPIPE, not a SIGPIPE that kills the exporter
    // (an MPI program's main is rarely Rust's, which ignores SIGPIPE).
    let mut done = retry_on_intr(|| sendmsg(stream, &[IoSlice::new(&msg)], &mut control, SendFlags::NOSIGNAL))?;
    while done < msg.len() {
        match retry_on_intr(|| send(stream, &msg[done..], SendFlags::NOSIGNAL))? {
            0 => return Err(io::ErrorKind::WriteZero.into()),
            n => done += n,
        }
    }
    Ok(())
}

/// Why [`fetch`] failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    /// Nobody listens at `path`: no socket file, or one that no process accepts on.
    #[error(
        "no fd-share server at {}: {source}; the exporting process has exited, or does not share this memory \
         by file descriptor (in containers, both processes must see the same {})",
        .path.display(),
        .path.parent().unwrap_or(Path::new("/")).display()
    )]
    NoServer { path: PathBuf, source: io::Error },
    /// The exporter's producer refused the key; `reason` is its message.
    #[error("the exporter refused key {key:#x}: {reason}")]
    Refused { key: u64, reason: String },
    /// A socket operation failed or timed out (then `source`'s kind is `TimedOut`).
    #[error("fd-share fetch could not {what}: {source}")]
    Io { what: &'static str, source: io::Error },
    /// The answer did not follow the protocol.
    #[error("fd-share protocol error: {reason}; both processes must run the same gpulmt version")]
    Protocol { reason: String },
}

/// Connects to the exporter's server at `path`, asks for `key`, and returns the fd (close-on-exec)
/// and the metadata. Blocks at most `timeout` in total (connect, write, read). Errors:
/// [`FetchError::NoServer`] when nobody listens there (the exporter exited, or does not share
/// by fd), [`FetchError::Refused`] with the producer's message, [`FetchError::Io`] for a failed
/// or timed-out step (kind `TimedOut`), [`FetchError::Protocol`] for a malformed answer.
pub(crate) fn fetch(path: &Path, key: u64, timeout: Duration) -> Result<(OwnedFd, Vec<u8>), FetchError> {
    let deadline = Deadline::new(timeout);
    let sock = connect(path, deadline.remaining("connect to the exporter's fd-share server")?).map_err(|e| {
        match e {
            Errno::NOENT | Errno::CONNREFUSED => FetchError::NoServer { path: path.to_path_buf(), source: e.into() },
            // A full backlog with SO_SNDTIMEO set: the server is busy or hung.
            Errno::AGAIN => deadline.timed_out("connect to the exporter's fd-share server"),
            e => FetchError::Io { what: "connect to the exporter's fd-share server", source: e.into() },
        }
    })?;

    let request = key.to_le_bytes();
    let mut sent = 0;
    while sent < request.len() {
        // The socket's send timeout is still the remaining time set for the connect.
        match retry_on_intr(|| send(&sock, &request[sent..], SendFlags::NOSIGNAL)) {
            Ok(0) => return Err(FetchError::Io { what: "send the request", source: io::ErrorKind::WriteZero.into() }),
            Ok(n) => sent += n,
            Err(e) => return Err(deadline.step_error("send the request", e.into())),
        }
    }

    const WHAT: &str = "receive the answer";
    set_socket_timeout(&sock, Timeout::Recv, Some(deadline.remaining(WHAT)?))
        .map_err(|e| FetchError::Io { what: "set the socket's receive timeout", source: e.into() })?;
    let mut buf = [0u8; HEADER + MAX_PAYLOAD];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received =
        retry_on_intr(|| recvmsg(&sock, &mut [IoSliceMut::new(&mut buf)], &mut control, RecvFlags::CMSG_CLOEXEC));
    // Take ownership of whatever fds arrived before anything can fail, so none leaks.
    let mut fd = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for received_fd in fds {
                if fd.is_none() {
                    fd = Some(received_fd);
                } else {
                    // Dropped at the end of this iteration, closing it.
                    tracing::debug!(key, "fd-share: closing an extra fd in the answer");
                }
            }
        }
    }
    let received = received.map_err(|e| deadline.step_error(WHAT, e.into()))?;
    let mut got = received.bytes;
    if got == 0 {
        // Not a protocol matter: the server drops a connection it could not serve (it is
        // stopping, or gave up waiting for the request) without a word.
        return Err(FetchError::Io {
            what: WHAT,
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "the server at {} closed the connection without answering key {key:#x}: it may be stopping, \
                     or it timed out waiting for the request; retry if the exporter is still alive",
                    path.display()
                ),
            ),
        });
    }

    // The rest of a split answer, by plain reads: the fd came with the first segment.
    let mut expected = HEADER;
    loop {
        if got >= HEADER {
            expected = HEADER + header_len(&buf)?;
        }
        if got >= expected {
            break;
        }
        set_socket_timeout(&sock, Timeout::Recv, Some(deadline.remaining(WHAT)?))
            .map_err(|e| FetchError::Io { what: "set the socket's receive timeout", source: e.into() })?;
        match retry_on_intr(|| rustix::net::recv(&sock, &mut buf[got..], RecvFlags::empty())) {
            Ok((_, 0)) => {
                return Err(FetchError::Protocol {
                    reason: format!("the answer ended after {got} of its {expected} bytes"),
                })
            }
            Ok((_, n)) => got += n,
            Err(e) => return Err(deadline.step_error(WHAT, e.into())),
        }
    }
    let status = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let len = header_len(&buf)?;
    if got > HEADER + len {
        return Err(FetchError::Protocol {
            reason: format!("the answer has {got} bytes, more than the {} its header announces", HEADER + len),
        });
    }
    let payload = &buf[HEADER..HEADER + len];
    match status {
        STATUS_OK => match fd {
            Some(fd) => Ok((fd, payload.to_vec())),
            None if received.flags.contains(ReturnFlags::CTRUNC) => Err(FetchError::Protocol {
                reason: format!(
                    "the fd for key {key:#x} was dropped on receipt (MSG_CTRUNC): this process may have reached its \
                     open-file limit (raise `ulimit -n`)"
                ),
            }),
            None => Err(FetchError::Protocol { reason: format!("the answer for key {key:#x} came without an fd") }),
        },
        // An fd sent along with a refusal drops (closes) here.
        STATUS_REFUSED => Err(FetchError::Refused { key, reason: String::from_utf8_lossy(payload).into_owned() }),
        other => Err(FetchError::Protocol { reason: format!("unknown status {other} in the answer for key {key:#x}") }),
    }
}

/// The payload length from a received header, checked against [`MAX_PAYLOAD`].
fn header_len(buf: &[u8]) -> Result<usize, FetchError> {
    let len = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(FetchError::Protocol {
            reason: format!("the answer announces {len} payload bytes, more than the protocol's {MAX_PAYLOAD}"),
        });
    }
    Ok(len)
}

/// A connected `SOCK_STREAM` Unix socket to `path`, the connect bounded by `timeout`: on
/// Linux a Unix connect waits for room in the listener's backlog for the socket's send
/// timeout, and fails with EAGAIN after it (std's `UnixStream::connect` has no timeout).
fn connect(path: &Path, timeout: Duration) -> Result<OwnedFd, Errno> {
    let sock = rustix::net::socket_with(AddressFamily::UNIX, SocketType::STREAM, SocketFlags::CLOEXEC, None)?;
    set_socket_timeout(&sock, Timeout::Send, Some(timeout))?;
    let addr = SocketAddrUnix::new(path)?;
    retry_on_intr(|| rustix::net::connect(&sock, &addr))?;
    Ok(sock)
}

/// The end of a [`fetch`]'s time.
struct Deadline {
    timeout: Duration,
    /// None: too far to represent, so never.
    at: Option<Instant>,
}

impl Deadline {
    fn new(timeout: Duration) -> Self {
        Deadline { timeout, at: Instant::now().checked_add(timeout) }
    }

    /// The time left, as a socket timeout: at least 1 ms, since a socket timeout that
    /// rounds down to zero microseconds would mean "wait forever".
    fn remaining(&self, what: &'static str) -> Result<Duration, FetchError> {
        let left = match self.at {
            Some(at) => at.saturating_duration_since(Instant::now()),
            None => self.timeout,
        };
        if left.is_zero() {
            return Err(self.timed_out(what));
        }
        Ok(left.max(Duration::from_millis(1)))
    }

    fn timed_out(&self, what: &'static str) -> FetchError {
        FetchError::Io {
            what,
            source: io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no answer within {:?}: the exporter is busy or stalled; retry, or give the fetch more time",
                    self.timeout
                ),
            ),
        }
    }

    /// `e` from step `what`, with a socket timeout's EAGAIN turned into a timeout.
    fn step_error(&self, what: &'static str, e: io::Error) -> FetchError {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => self.timed_out(what),
            _ => FetchError::Io { what, source: e },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fs::File;
    use std::io::Write;
    use std::os::unix::fs::FileExt;
    use std::sync::{Mutex, MutexGuard};
    use std::thread::JoinHandle;

    /// These tests count the process's fds and time the server: one at a time.
    fn serial() -> MutexGuard<'static, ()> {
        static LOCK: Mutex<()> = Mutex::new(());
        LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A fresh directory under the system's temporary one, removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!("gpulmt-fd-share-{}-{n}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const REFUSED_KEY: u64 = 0xdead;
    const BIG_META_KEY: u64 = 0xb16;
    const PANIC_KEY: u64 = 0x9a1c;
    const SLOW_KEY: u64 = 0x510;
    const TIMEOUT: Duration = Duration::from_secs(5);

    fn contents(key: u64) -> Vec<u8> {
        format!("device memory of key {key:#x}").into_bytes()
    }

    fn memfd_with(bytes: &[u8]) -> OwnedFd {
        let fd = rustix::fs::memfd_create("gpulmt-fd-share-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        let mut file = File::from(fd);
        file.write_all(bytes).unwrap();
        file.into()
    }

    /// Read from offset 0: the fd shares its file offset with the producer's, which the
    /// write left at the end.
    fn read_all(fd: OwnedFd) -> Vec<u8> {
        let file = File::from(fd);
        let mut bytes = vec![0; file.metadata().unwrap().len() as usize];
        file.read_exact_at(&mut bytes, 0).unwrap();
        bytes
    }

    fn producer() -> Produce {
        Box::new(|key| match key {
            REFUSED_KEY => Err(format!("key {key:#x} was freed")),
            BIG_META_KEY => Ok((memfd_with(b"x"), vec![0; MAX_PAYLOAD + 1])),
            PANIC_KEY => panic!("producer bug on key {key:#x}"),
            SLOW_KEY => {
                std::thread::sleep(Duration::from_millis(500));
                Ok((memfd_with(&contents(key)), key.to_le_bytes().to_vec()))
            }
            _ => Ok((memfd_with(&contents(key)), key.to_le_bytes().to_vec())),
        })
    }

    fn start(dir: &TempDir) -> FdServer {
        FdServer::start(&dir.0, std::process::id(), 0x0123_4567_89ab_cdef, producer()).unwrap()
    }

    fn check_fetch(path: &Path, key: u64) {
        let (fd, meta) = fetch(path, key, TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(meta, key.to_le_bytes());
        assert_eq!(read_all(fd), contents(key));
    }

    /// `served` counts once the server has closed its side, which may be after the client has its answer.
    fn wait_served(server: &FdServer, n: u64) {
        let until = Instant::now() + Duration::from_secs(2);
        while server.served() < n && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(server.served(), n);
    }

    fn open_fds() -> usize {
        std::fs::read_dir("/proc/self/fd").unwrap().count()
    }

    /// The open memfds these tests made: unlike `open_fds`, blind to other modules' tests.
    fn open_test_memfds() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("/memfd:gpulmt-fd-share-test"))
            .count()
    }

    #[test]
    fn path_is_named_by_pid_and_nonce_and_fits_sockaddr_un() {
        let path = socket_path(Path::new("/dev/shm"), 42, 0xabc).unwrap();
        assert_eq!(path, Path::new("/dev/shm/gpulmt-fd-42-0000000000000abc.sock"));
        let long = PathBuf::from(format!("/{}", "d".repeat(80)));
        let e = socket_path(&long, u32::MAX, u64::MAX).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("shorter directory"), "{e}");
    }

    #[test]
    fn fetch_from_another_thread_gets_the_fd_and_metadata() {
        let _serial = serial();
        let dir = TempDir::new();
        let server = start(&dir);
        assert_eq!(server.path(), socket_path(&dir.0, std::process::id(), 0x0123_4567_89ab_cdef).unwrap());
        let path = server.path().to_path_buf();
        std::thread::spawn(move || {
            for key in [1, 2, u64::MAX] {
                check_fetch(&path, key);
            }
        })
        .join()
        .unwrap();
        wait_served(&server, 3);
    }

    #[test]
    fn refusals_carry_the_reason_and_the_server_survives_them() {
        let _serial = serial();
        let dir = TempDir::new();
        let server = start(&dir);
        match fetch(server.path(), REFUSED_KEY, TIMEOUT) {
            Err(FetchError::Refused { key: REFUSED_KEY, reason }) => assert_eq!(reason, "key 0xdead was freed"),
            other => panic!("{other:?}"),
        }
        match fetch(server.path(), BIG_META_KEY, TIMEOUT) {
            Err(FetchError::Refused { key: BIG_META_KEY, reason }) => {
                assert!(reason.contains("4097 bytes"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        match fetch(server.path(), PANIC_KEY, TIMEOUT) {
            Err(FetchError::Refused { key: PANIC_KEY, reason }) => assert!(reason.contains("panicked"), "{reason}"),
            other => panic!("{other:?}"),
        }
        check_fetch(server.path(), 7);
        wait_served(&server, 1);
    }

    #[test]
    fn no_server_is_reported_at_once() {
        let _serial = serial();
        let dir = TempDir::new();
        let path = socket_path(&dir.0, 1, 2).unwrap();
        let t0 = Instant::now();
        let e = fetch(&path, 1, TIMEOUT).unwrap_err();
        assert!(matches!(&e, FetchError::NoServer { path: p, .. } if *p == path), "{e:?}");
        assert!(e.to_string().contains("has exited"), "{e}");
        // A file there that nobody listens on: a socket left by an exporter that died.
        File::create(&path).unwrap();
        let e = fetch(&path, 1, TIMEOUT).unwrap_err();
        assert!(matches!(e, FetchError::NoServer { .. }), "{e:?}");
        assert!(t0.elapsed() < Duration::from_millis(500), "{:?}", t0.elapsed());
    }

    #[test]
    fn start_replaces_a_stale_socket_file() {
        let _serial = serial();
        let dir = TempDir::new();
        let path = socket_path(&dir.0, std::process::id(), 0x0123_4567_89ab_cdef).unwrap();
        File::create(&path).unwrap();
        let server = start(&dir);
        check_fetch(server.path(), 3);
    }

    #[test]
    fn bad_clients_do_not_stop_the_server() {
        let _serial = serial();
        let dir = TempDir::new();
        let server = start(&dir);
        // Connects and sends nothing, holding the connection: the server gives up on it
        // after CLIENT_IO_TIMEOUT and answers the next one.
        let silent = UnixStream::connect(server.path()).unwrap();
        let path = server.path().to_path_buf();
        let t0 = Instant::now();
        let next = std::thread::spawn(move || check_fetch(&path, 11));
        next.join().unwrap();
        assert!(t0.elapsed() < CLIENT_IO_TIMEOUT * 3, "{:?}", t0.elapsed());
        drop(silent);
        // Half a key, then gone.
        UnixStream::connect(server.path()).unwrap().write_all(&[1, 2, 3]).unwrap();
        // A whole key, gone before the answer: the server's send meets a closed peer.
        UnixStream::connect(server.path()).unwrap().write_all(&12u64.to_le_bytes()).unwrap();
        // Garbage longer than a key, answers never read.
        let mut garbage = UnixStream::connect(server.path()).unwrap();
        garbage.write_all(&[0xff; 100]).unwrap();
        check_fetch(server.path(), 13);
        drop(garbage);
        check_fetch(server.path(), 14);
    }

    #[test]
    fn a_slow_exporter_times_the_fetch_out() {
        let _serial = serial();
        let dir = TempDir::new();
        let server = start(&dir);
        let t0 = Instant::now();
        match fetch(server.path(), SLOW_KEY, Duration::from_millis(100)) {
            Err(FetchError::Io { what, source }) => {
                assert_eq!(what, "receive the answer");
                assert_eq!(source.kind(), io::ErrorKind::TimedOut, "{source}");
            }
            other => panic!("{other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_millis(400), "{:?}", t0.elapsed());
        // The server's late answer meets a closed socket, and it goes on.
        check_fetch(server.path(), 15);
    }

    #[test]
    fn fetches_leak_no_fds() {
        let _serial = serial();
        let dir = TempDir::new();
        let server = start(&dir);
        // Warm-up: whatever the first request opens for good (tracing, say) is open
        // before the count.
        check_fetch(server.path(), 0);
        wait_served(&server, 1);
        // Other modules' tests may open and close fds meanwhile: a real leak (one per
        // fetch) fails every attempt, a neighbour's fd rarely all three.
        let mut counts = Vec::new();
        for _ in 0..3 {
            let before = open_fds();
            for key in 1..=2000 {
                let (fd, meta) = fetch(server.path(), key, TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(meta, key.to_le_bytes());
                drop(fd);
            }
            // The server closes its side of the last answer a moment after the client has it.
            wait_served(&server, 1 + 2000 * (counts.len() as u64 + 1));
            let after = open_fds();
            if before == after {
                return;
            }
            counts.push((before, after));
        }
        panic!("open fds before and after 2000 fetches: {counts:?}");
    }

    #[test]
    fn drop_stops_the_server_quickly_and_removes_the_socket() {
        let _serial = serial();
        let dir = TempDir::new();
        let server = start(&dir);
        check_fetch(server.path(), 21);
        let path = server.path().to_path_buf();
        let t0 = Instant::now();
        drop(server);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(!path.exists());
        assert!(matches!(fetch(&path, 21, TIMEOUT), Err(FetchError::NoServer { .. })));

        // Even while a client holds the server in a read.
        let server = start(&dir);
        let idle = UnixStream::connect(server.path()).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        drop(server);
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(!path.exists());
        drop(idle);
    }

    /// A one-connection server at `dir/name` that reads the key and then runs `reply`
    /// instead of the real answer, to check the client against answers `FdServer` never gives.
    fn fake_server(
        dir: &TempDir,
        name: &str,
        reply: impl FnOnce(&UnixStream) + Send + 'static,
    ) -> (PathBuf, JoinHandle<()>) {
        let path = dir.0.join(name);
        let listener = UnixListener::bind(&path).unwrap();
        let thread = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut key = [0u8; 8];
            (&stream).read_exact(&mut key).unwrap();
            reply(&stream);
        });
        (path, thread)
    }

    fn answer_bytes(status: u32, len: u32, payload: &[u8]) -> Vec<u8> {
        [&status.to_le_bytes()[..], &len.to_le_bytes(), payload].concat()
    }

    fn send_with_fds(stream: &UnixStream, bytes: &[u8], fds: &[BorrowedFd<'_>]) {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(fds)));
        assert_eq!(sendmsg(stream, &[IoSlice::new(bytes)], &mut control, SendFlags::NOSIGNAL).unwrap(), bytes.len());
    }

    #[test]
    fn split_answers_are_reassembled() {
        let _serial = serial();
        let dir = TempDir::new();
        // Inside the header, at its end, and inside the payload.
        for split in [3, HEADER, HEADER + 5] {
            let (path, server) = fake_server(&dir, &format!("split-{split}.sock"), move |stream| {
                let msg = answer_bytes(STATUS_OK, 12, b"metadata-abc");
                let fd = memfd_with(&contents(99));
                send_with_fds(stream, &msg[..split], &[fd.as_fd()]);
                std::thread::sleep(Duration::from_millis(20));
                assert_eq!(send(stream, &msg[split..], SendFlags::NOSIGNAL).unwrap(), msg.len() - split);
            });
            let (fd, meta) = fetch(&path, 99, TIMEOUT).unwrap_or_else(|e| panic!("split at {split}: {e}"));
            assert_eq!(meta, b"metadata-abc");
            assert_eq!(read_all(fd), contents(99));
            server.join().unwrap();
        }
    }

    #[test]
    fn answers_off_protocol_are_errors_that_leak_nothing() {
        let _serial = serial();
        let dir = TempDir::new();
        type Reply = fn(&UnixStream);
        let cases: [(&str, Reply); 4] = [
            ("came without an fd", |s| (&*s).write_all(&answer_bytes(STATUS_OK, 2, b"ok")).unwrap()),
            ("more than the protocol's", |s| {
                (&*s).write_all(&answer_bytes(STATUS_OK, MAX_PAYLOAD as u32 + 1, b"")).unwrap()
            }),
            ("unknown status 7", |s| {
                let fd = memfd_with(b"x");
                send_with_fds(s, &answer_bytes(7, 0, b""), &[fd.as_fd()]);
            }),
            ("more than the 10 its header announces", |s| {
                let fd = memfd_with(b"x");
                send_with_fds(s, &answer_bytes(STATUS_OK, 2, b"ok++"), &[fd.as_fd()]);
            }),
        ];
        assert_eq!(open_test_memfds(), 0);
        for (n, (expected, reply)) in cases.into_iter().enumerate() {
            let (path, server) = fake_server(&dir, &format!("bad-{n}.sock"), reply);
            match fetch(&path, 5, TIMEOUT) {
                Err(FetchError::Protocol { reason }) => assert!(reason.contains(expected), "{reason}"),
                other => panic!("{expected}: {other:?}"),
            }
            server.join().unwrap();
        }
        let (path, server) = fake_server(&dir, "silent.sock", |_| {});
        match fetch(&path, 5, TIMEOUT) {
            Err(FetchError::Io { what: "receive the answer", source }) => {
                assert_eq!(source.kind(), io::ErrorKind::UnexpectedEof, "{source}");
                assert!(source.to_string().contains("without answering key 0x5"), "{source}");
            }
            other => panic!("{other:?}"),
        }
        server.join().unwrap();
        // Two fds on an answer: the first is the answer's, the second closed. An fd on a
        // refusal: closed.
        let (path, server) = fake_server(&dir, "two-fds.sock", |s| {
            let (first, second) = (memfd_with(&contents(1)), memfd_with(b"second"));
            send_with_fds(s, &answer_bytes(STATUS_OK, 0, b""), &[first.as_fd(), second.as_fd()]);
        });
        let (fd, meta) = fetch(&path, 1, TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
        assert!(meta.is_empty());
        assert_eq!(read_all(fd), contents(1));
        server.join().unwrap();
        let (path, server) = fake_server(&dir, "refused-fd.sock", |s| {
            let fd = memfd_with(b"x");
            send_with_fds(s, &answer_bytes(STATUS_REFUSED, 2, b"no"), &[fd.as_fd()]);
        });
        assert!(matches!(fetch(&path, 1, TIMEOUT), Err(FetchError::Refused { key: 1, reason }) if reason == "no"));
        server.join().unwrap();
        assert_eq!(open_test_memfds(), 0);
    }
}
