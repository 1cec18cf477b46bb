//! The table of every `GPULMT_*` setting: name, kind (type and valid values), default,
//! class and meaning. Each default is written here once; `Config::default()` is these
//! defaults read by their kinds, and `docs/configuration.md` is rendered from this table.
//!
//! Meanings say what a setting does and when to change it. Measurements behind the
//! defaults belong to `docs/performance.md`, not here.

use std::time::Duration;

use super::kind::{Kind, TimeUnit};

/// Who a setting is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Settings a user may tune or needs to know.
    Normal,
    /// Switches for measurements and comparisons (turning an optimisation off, splitting
    /// copies...): the defaults are the ones to run with.
    Diagnostic,
    /// Read by the sim backend only (`GPULMT_DEVICE=sim`, or `auto` without a GPU).
    SimOnly,
}

impl Class {
    /// Every class, in the order the documentation lists them.
    pub const ALL: [Class; 3] = [Class::Normal, Class::Diagnostic, Class::SimOnly];

    pub fn name(self) -> &'static str {
        match self {
            Class::Normal => "normal",
            Class::Diagnostic => "diagnostic",
            Class::SimOnly => "sim-only",
        }
    }
}

/// A variable's default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultValue {
    /// This text, read by the variable's kind as if it had been set.
    Text(&'static str),
    /// Unset, which means what the text says.
    Unset(&'static str),
}

/// One setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variable {
    pub name: &'static str,
    pub kind: Kind,
    pub default: DefaultValue,
    pub class: Class,
    /// What it does and when to change it.
    pub meaning: &'static str,
}

/// Largest `GPULMT_NET_EAGER_LIMIT`: an eager packet (header and payload) fills at most
/// one control slot of the internode path.
const NET_EAGER_MAX: u64 = (crate::net::wire::CTRL_MAX - gpulmt_protocols::wire::eager_overhead()) as u64;
const _: () = assert!(NET_EAGER_MAX == 16370, "the meaning of GPULMT_NET_EAGER_LIMIT names this bound");

/// Any size at all.
const ANY_SIZE: Kind = Kind::Size { min: 0, max: u64::MAX, multiple_of: 1, zero_is_off: false, never: false };
/// A size threshold of the `auto` policy: any size, or `never`.
const THRESHOLD: Kind = Kind::Size { min: 0, max: u64::MAX, multiple_of: 1, zero_is_off: false, never: true };

use Class::*;
use DefaultValue::{Text, Unset};

/// Every setting, in the order the documentation lists them within each class.
pub const VARIABLES: &[Variable] = &[
    Variable {
        name: "GPULMT_DEVICE",
        kind: Kind::Choice(&["auto", "cuda", "sim"]),
        default: Text("auto"),
        class: Normal,
        meaning: "Device backend. `auto` takes CUDA when a driver and a GPU are present and the sim otherwise, \
                  and logs its choice; `cuda` fails where CUDA is unavailable; `sim` keeps device memory in \
                  shared memory (tests, machines without a GPU).",
    },
    Variable {
        name: "GPULMT_GPU",
        kind: Kind::Device,
        default: Unset("the local rank modulo the device count"),
        class: Normal,
        meaning: "The device this rank uses. Set it where ranks must use particular GPUs; by default the ranks of \
                  a node spread over its devices in local-rank order.",
    },
    Variable {
        name: "GPULMT_PROTOCOL",
        kind: Kind::Choice(&["auto", "get", "put", "coop", "shm"]),
        default: Text("auto"),
        class: Normal,
        meaning: "Rendezvous protocol. `auto` chooses per message from the buffers' memory, peer access, size \
                  and traffic (`gpulmt-info` prints its choices); the others force one protocol for every \
                  rendezvous, to compare protocols or to work around a problem. A forced protocol that cannot \
                  work between two devices falls back to `shm`, logged.",
    },
    Variable {
        name: "GPULMT_EAGER_LIMIT",
        kind: Kind::Size { min: 0, max: 1 << 20, multiple_of: 1, zero_is_off: false, never: false },
        default: Text("8K"),
        class: Normal,
        meaning: "Host messages up to this size travel inline in the control packet: no rendezvous, one copy \
                  in and one out. Raising it grows the control-ring slots (`GPULMT_SLOT_SIZE`), and so the \
                  shared memory of every pair of ranks.",
    },
    Variable {
        name: "GPULMT_DEVICE_EAGER_LIMIT",
        kind: Kind::Size { min: 0, max: 1 << 20, multiple_of: 1, zero_is_off: false, never: false },
        default: Text("0"),
        class: Normal,
        meaning: "The eager limit of messages from device memory, whose payload the sender must first copy to \
                  the host. 0: device messages always rendezvous (one copy between the devices instead of two \
                  through the host). At most `GPULMT_EAGER_LIMIT`.",
    },
    Variable {
        name: "GPULMT_COOP_MIN",
        kind: THRESHOLD,
        default: Text("2M"),
        class: Normal,
        meaning: "`auto` uses COOPERATE (both GPUs' copy engines move a part) between peer-accessible GPUs for \
                  messages at least this large, unless the sender's engine is busy with traffic the other way. \
                  `never` disables it.",
    },
    Variable {
        name: "GPULMT_PUT_MIN",
        kind: THRESHOLD,
        default: Text("512K"),
        class: Normal,
        meaning: "Below `GPULMT_COOP_MIN`, `auto` uses PUT (the sender's engine pushes) between peer-accessible \
                  GPUs for messages at least this large while traffic flows one way; smaller ones use GET (the \
                  receiver's engine pulls). `never`: GET at every size.",
    },
    Variable {
        name: "GPULMT_BIDIR_PUT_MIN",
        kind: THRESHOLD,
        default: Text("64K"),
        class: Normal,
        meaning: "With traffic both ways between two ranks, `auto` uses PUT for messages at least this large, so \
                  that each engine pushes its own rank's data; smaller ones use GET. `never` disables it.",
    },
    Variable {
        name: "GPULMT_BALANCE_MAX",
        kind: ANY_SIZE,
        default: Text("2M"),
        class: Normal,
        meaning: "`auto` spreads a window of one-way messages under this size from one sender over both ranks' \
                  copy engines (GET or PUT, whichever has fewer of that sender's messages in flight; a lone \
                  message keeps its usual engine), so that both processes issue copies: a window of small \
                  copies is bound by the CPU time of issuing them, not by the link. 0: off.",
    },
    Variable {
        name: "GPULMT_RTR_PUT_MAX",
        kind: ANY_SIZE,
        default: Text("64K"),
        class: Normal,
        meaning: "`auto`: a receive posted for one source and tag into a device buffer, with no earlier receive \
                  for them, is offered to its sender (RTR); a device send of at most this size that is the \
                  sender's next message to that rank is then pushed at once by the sender's engine, with no RTS \
                  or CTS. 0: off.",
    },
    Variable {
        name: "GPULMT_RTR_WAIT_NS",
        kind: Kind::Duration { plain: TimeUnit::Nanos, min: Duration::ZERO, max: Duration::from_secs(1) },
        default: Text("2us"),
        class: Normal,
        meaning: "How long a send that could use an RTR waits for one when the peer's last offer arrived just \
                  too late (a blocking ping-pong offers each receive only once its previous send completed). \
                  Each wait in vain costs one of four credits and each offer used gives one back; without \
                  credit only one such send in 64 waits. 0: never wait.",
    },
    Variable {
        name: "GPULMT_COOP_SENDER_SHARE",
        kind: Kind::Count { min: 0, max: 1000, power_of_two: false },
        default: Text("500"),
        class: Normal,
        meaning: "COOPERATE: the sender's share of each message, in thousandths (aligned down to 4 KiB); the \
                  receiver's engine moves the rest. Change it where one GPU's engine is faster than the \
                  other's. A share that leaves one side nothing makes the message a GET.",
    },
    Variable {
        name: "GPULMT_CHUNK_SIZE",
        kind: Kind::Size { min: 4 << 10, max: 1 << 30, multiple_of: 4 << 10, zero_is_off: false, never: false },
        default: Text("2M"),
        class: Normal,
        meaning: "SHM staging chunk: messages that cannot go from GPU to GPU (host memory, no peer access) move \
                  through pinned shared host memory in chunks of this size, each one copy in and one copy out. \
                  Larger chunks make fewer copies and handshakes per message; the staging memory of each \
                  directed pair of ranks is this times `GPULMT_PIPELINE_DEPTH`. Chunks start on page \
                  boundaries, hence the multiple of 4 KiB.",
    },
    Variable {
        name: "GPULMT_PIPELINE_DEPTH",
        kind: Kind::Count { min: 1, max: 1024, power_of_two: false },
        default: Text("8"),
        class: Normal,
        meaning: "SHM staging chunks per directed pair of ranks: how many chunks of a message are in flight at \
                  once between filling and draining.",
    },
    Variable {
        name: "GPULMT_RING_SLOTS",
        kind: Kind::Count { min: 2, max: 1 << 16, power_of_two: true },
        default: Text("64"),
        class: Normal,
        meaning: "Slots of the control ring of each directed pair of ranks: the control packets and eager \
                  messages one rank can have in flight to another before further ones wait in its outbox.",
    },
    Variable {
        name: "GPULMT_SLOT_SIZE",
        kind: Kind::Size { min: 256, max: 16 << 20, multiple_of: 8, zero_is_off: false, never: false },
        default: Text("8448"),
        class: Normal,
        meaning: "Bytes per control-ring slot: the largest eager payload plus the slot and packet headers. \
                  Unset, it grows with `GPULMT_EAGER_LIMIT` as needed; set, it must hold an eager message of \
                  that limit. The minimum holds the largest control packet.",
    },
    Variable {
        name: "GPULMT_HANDLE_CACHE_ENTRIES",
        kind: Kind::Count { min: 0, max: 1 << 20, power_of_two: false },
        default: Text("1024"),
        class: Normal,
        meaning: "Most peer mappings (opened IPC handles) kept open while unused, for the next transfer from \
                  the same allocation. Lower it where peer allocations are many and short-lived.",
    },
    Variable {
        name: "GPULMT_HANDLE_CACHE_BYTES",
        kind: ANY_SIZE,
        default: Text("64G"),
        class: Normal,
        meaning: "Most bytes of peer mappings kept open while unused.",
    },
    Variable {
        name: "GPULMT_COPY_SERVER_MAX",
        kind: ANY_SIZE,
        default: Text("0"),
        class: Normal,
        meaning: "CUDA: copies between device memory of at most this many bytes are made by a copy server, a \
                  one-block kernel resident on the rank's GPU that polls a descriptor ring in pinned memory, \
                  instead of the copy engine: no driver call to issue a copy or to see it finished, which \
                  speeds up small device messages. 0: off, the default, because an application's \
                  `cudaDeviceSynchronize` waits for a running server (see `GPULMT_COPY_SERVER_IDLE_US`). \
                  Refused where ranks share a GPU without MPS, whose time slicing would stall it.",
    },
    Variable {
        name: "GPULMT_COPY_SERVER_IDLE_US",
        kind: Kind::Duration { plain: TimeUnit::Micros, min: Duration::ZERO, max: Duration::from_secs(60) },
        default: Text("100us"),
        class: Normal,
        meaning: "A copy server exits after this long without a copy, and the next copy starts it again (a few \
                  microseconds): an application's `cudaDeviceSynchronize` waits at most this long after \
                  gpulmt's last small copy. A server pays only where small copies come closer together than \
                  this; one that exits after fewer than 8 copies is relaunched only after a backoff (1 ms, \
                  doubling up to 128 ms). Also the timeout of a server started only to make 64-bit atomics on \
                  device memory for the host (other nodes' AMOs and signal adds, host `sym_atomic_*`).",
    },
    Variable {
        name: "GPULMT_SYM_HEAP",
        kind: Kind::Size { min: 64 << 10, max: u64::MAX, multiple_of: 1, zero_is_off: false, never: false },
        default: Unset("1 GiB on CUDA (NVSHMEM's default), 64 MiB on sim"),
        class: Normal,
        meaning: "Bytes of each rank's symmetric heap, reserved on the rank's device at the first \
                  `sym_alloc` / `gpulmt_sym_malloc` (collective): every symmetric allocation comes from it. Every \
                  rank must give the same value. The first few KiB hold gpulmt's control words (device \
                  barriers, the table of the peers' heaps).",
    },
    Variable {
        name: "GPULMT_COPY_PRIORITY",
        kind: Kind::Choice(&["auto", "high", "normal"]),
        default: Text("auto"),
        class: Normal,
        meaning: "CUDA: priority of gpulmt's copy streams and copy server: `high` (the device's greatest), \
                  `normal`, or `auto`: high where other ranks of the node share this rank's GPU (at normal \
                  priority a copy within the GPU waits behind the kernels running there, the other ranks' \
                  too), normal otherwise.",
    },
    Variable {
        name: "GPULMT_INIT_TIMEOUT_MS",
        kind: Kind::Duration {
            plain: TimeUnit::Millis,
            min: Duration::from_millis(1),
            max: Duration::from_secs(86_400),
        },
        default: Text("30s"),
        class: Normal,
        meaning: "How long a rank waits for the others to join the job, and at finalize for them to arrive \
                  (its barrier over every rank, then again its node's): past it finalize returns an error naming \
                  the rank it waited for. Raise it where ranks start or finish far apart (a slow file system, a \
                  loaded node, uneven work).",
    },
    Variable {
        name: "GPULMT_LIVENESS_MS",
        kind: Kind::Duration { plain: TimeUnit::Millis, min: Duration::from_millis(1), max: Duration::from_secs(60) },
        default: Text("20ms"),
        class: Normal,
        meaning: "How often a waiting rank checks that its peers are alive: about the longest a dead peer goes \
                  unnoticed before its requests fail.",
    },
    Variable {
        name: "GPULMT_LOG",
        kind: Kind::Syntax("tracing `EnvFilter` directives, e.g. `info` or `gpulmt=debug`"),
        default: Text("warn"),
        class: Normal,
        meaning: "Log filter of the subscriber that gpulmt's binaries and C entry points install (to standard \
                  error). `info` says which backend and protocols were chosen and why; `debug` traces every \
                  transfer.",
    },
    Variable {
        name: "GPULMT_NET_EAGER_LIMIT",
        kind: Kind::Size { min: 0, max: NET_EAGER_MAX, multiple_of: 1, zero_is_off: false, never: false },
        default: Text("4K"),
        class: Normal,
        meaning: "Internode path: messages to a rank of another node up to this size, host or device memory \
                  alike, travel inside the control message (a device payload is copied to the host first); \
                  larger ones take a rendezvous over MPI. At most the control slot less the packet header \
                  (16370 bytes). 4K: an 8 KiB message took 15-20 % less time by the pushed rendezvous than \
                  eager over Open MPI's shared memory, whose own eager limit a larger control message \
                  passes.",
    },
    Variable {
        name: "GPULMT_NET_PUSH_MAX",
        kind: Kind::Size { min: 0, max: u64::MAX, multiple_of: 1, zero_is_off: true, never: false },
        default: Text("1T"),
        class: Normal,
        meaning: "Internode path: a rendezvous message up to this size is pushed: the sender's data leaves right \
                  after its RTS, and MPI holds it until the receiver's receive matches, instead of waiting for \
                  the receiver's CTS (a trip between the two proxies less; the sender's staging copies overlap \
                  the RTS's way). `0` waits for the CTS always. The default pushes every message.",
    },
    Variable {
        name: "GPULMT_NET_PUSH_SENDS",
        kind: Kind::Count { min: 0, max: 1 << 16, power_of_two: false },
        default: Text("16"),
        class: Normal,
        meaning: "Internode path: pushed sends of a rank in flight at once (each may hold staging buffers, and \
                  MPI memory at the receiver, before its receive matches); past it a send waits for its CTS. \
                  `0` pushes none. At most 4 x GPULMT_NET_QUEUE_SLOTS: pushed sends have a queue of their \
                  own, whose ops in flight the proxy bounds so.",
    },
    Variable {
        name: "GPULMT_NET_QUEUES",
        kind: Kind::Count { min: 3, max: 4096, power_of_two: false },
        default: Text("10"),
        class: Normal,
        meaning: "Internode path: GIO send queues this rank sets up at start, one per producer (the context's \
                  thread takes the first three (control packets and sends, receives, pushed sends: \
                  docs/internode.md says why), the heap's host calls one, and kernels the rest: 6 by default, \
                  block b posting to queue b mod 6). Blocks that share a queue share its \
                  quiet: a block's quiet then also waits for its neighbours' operations (a check whose block \
                  quieted beside a block flooding the same queue with 1 MiB puts took 1.25 s a round instead \
                  of under 20 ms). The proxy polls every queue in use; raise it for more producers.",
    },
    Variable {
        name: "GPULMT_NET_QUEUE_SLOTS",
        kind: Kind::Count { min: 4, max: 1 << 16, power_of_two: true },
        default: Text("64"),
        class: Normal,
        meaning: "Internode path: slots (64-byte packets) of each GIO send queue: the operations one producer \
                  can have posted and not yet taken by the proxy before it waits for credit.",
    },
    Variable {
        name: "GPULMT_NET_BATCH",
        kind: Kind::Count { min: 1, max: 1 << 16, power_of_two: false },
        default: Text("32"),
        class: Normal,
        meaning: "Internode path: most packets the proxy takes from one queue per round, so that one busy \
                  producer cannot starve the others.",
    },
    Variable {
        name: "GPULMT_NET_CHUNK",
        kind: Kind::Size { min: 4 << 10, max: 1 << 30, multiple_of: 4 << 10, zero_is_off: false, never: false },
        default: Text("512K"),
        class: Normal,
        meaning: "Internode path: data travels in MPI messages of at most this size, and device data is staged \
                  through pinned host buffers of this size (copy of one piece overlaps the wire of the next). \
                  Every rank of a job must use the same value; the path checks at start. 512K with a depth \
                  of 8 moved D D 1.2-1.4x Open MPI's own H H bandwidth over TCP across pseudo-nodes on one \
                  H200, where 1M x 4 moved 0.86-1.31x, and the same as 1M x 4 over shared memory.",
    },
    Variable {
        name: "GPULMT_NET_DEPTH",
        kind: Kind::Count { min: 1, max: 256, power_of_two: false },
        default: Text("8"),
        class: Normal,
        meaning: "Internode path: pieces of one transfer in flight at once (staging copies and MPI messages).",
    },
    Variable {
        name: "GPULMT_NET_CTRL_POOL",
        kind: Kind::Count { min: 1, max: 4096, power_of_two: false },
        default: Text("32"),
        class: Normal,
        meaning: "Internode path: receives the proxy keeps posted for control packets and one-sided requests \
                  from any rank (each of them, 16 KiB apiece; the one-sided pools keep one until the rank \
                  exposes or reaches a window). Raise it where many ranks send at once.",
    },
    Variable {
        name: "GPULMT_NET_STALL_MS",
        kind: Kind::Duration { plain: TimeUnit::Millis, min: Duration::from_millis(1), max: Duration::from_secs(3600) },
        default: Text("2s"),
        class: Normal,
        meaning: "Internode path: a producer that reserved a queue slot and did not fill it for this long is \
                  taken as stopped: its queue fails with an error completion and a log line naming the slot.",
    },
    Variable {
        name: "GPULMT_NET_DRAIN_MS",
        kind: Kind::Duration { plain: TimeUnit::Millis, min: Duration::ZERO, max: Duration::from_secs(3600) },
        default: Text("5s"),
        class: Normal,
        meaning: "At finalize: how long packets still waiting for room (a ring, a GIO queue) may wait before \
                  they are abandoned, and then how long internode operations still in flight may finish before \
                  they are cancelled and reported failed.",
    },
    Variable {
        name: "GPULMT_NET_IDLE_SLEEP",
        kind: Kind::Duration { plain: TimeUnit::Micros, min: Duration::ZERO, max: Duration::from_millis(100) },
        default: Text("50us"),
        class: Normal,
        meaning: "Internode path: the longest the proxy thread sleeps between rounds when idle (it spins, then \
                  yields, then sleeps longer and longer up to this). A host thread's post wakes it at once, \
                  and it does not sleep while a thread of the rank waits on the network (a `test`/`wait` \
                  with requests outstanding, a host quiet); otherwise packets from GPU threads and \
                  messages from other nodes wait up to this. Lower it for latency (`0`: the proxy never \
                  sleeps, so even the first message after a compute phase is taken at once), raise it to \
                  leave the CPU to the application.",
    },
    Variable {
        name: "GPULMT_NET_PROXY_CPU",
        kind: Kind::CpuList,
        default: Unset("not pinned"),
        class: Normal,
        meaning: "Internode path: pin proxy threads to these CPUs (cores the application does not use), one \
                  per rank of a host: the rank of index i among its host's ranks (`MPI_Comm_split_type` \
                  shared) takes the list's i-th CPU, so `mpirun -x GPULMT_NET_PROXY_CPU=8-11` gives the four \
                  ranks of each host cores 8, 9, 10 and 11. A host with more ranks than CPUs listed counts \
                  round the list again (proxies then share a core, and the log warns).",
    },
    Variable {
        name: "GPULMT_HANDLE_CACHE",
        kind: Kind::Bool,
        default: Text("1"),
        class: Diagnostic,
        meaning: "Keep opened IPC mappings of peers' buffers for later transfers. `0` opens and closes a mapping \
                  per transfer, to measure what the cache saves.",
    },
    Variable {
        name: "GPULMT_POOL_IPC",
        kind: Kind::Bool,
        default: Text("0"),
        class: Normal,
        meaning: "Move memory of a stream-ordered pool created with a POSIX-fd handle type by IPC (the pool \
                  as an fd, each allocation by `cuMemPoolExportPointer`) instead of staging it \
                  (docs/memory-kinds.md). Off by default: CUDA requires importers to release an import \
                  before the application frees the allocation, which an application that frees its \
                  buffers itself breaks; its next allocation at that address then fails to import, \
                  and those messages fall back to staging (correct, but an import is paid each time).",
    },
    Variable {
        name: "GPULMT_MEMTYPE_CACHE",
        kind: Kind::Bool,
        default: Text("1"),
        class: Diagnostic,
        meaning: "Remember recently used host buffers, so that the eager path skips the driver's pointer query. \
                  Only buffers no later device allocation can take the address of are remembered: in the heap \
                  below the program break and in the main thread's stack (the driver reuses freed `mmap`ed \
                  ranges, large `malloc`s among them, for device memory). `0` asks the driver every time, for \
                  comparison.",
    },
    Variable {
        name: "GPULMT_PROGRESS_ON_POST",
        kind: Kind::Bool,
        default: Text("1"),
        class: Diagnostic,
        meaning: "A rendezvous send also makes one progress pass, so that the peer's answers start copies while \
                  an application is still posting a window of sends. `0`: progress only in test and wait, for \
                  comparison.",
    },
    Variable {
        name: "GPULMT_POLL_NEWEST",
        kind: Kind::Bool,
        default: Text("1"),
        class: Diagnostic,
        meaning: "With 4 or more copies in flight on one copy queue, ask whether its newest (then second newest) \
                  is done before the oldest: a queue finishes in order, so one driver answer \"done\" retires \
                  a window instead of one copy. `0`: oldest first, for comparison.",
    },
    Variable {
        name: "GPULMT_COPY_SPLIT",
        kind: Kind::Size { min: 4 << 10, max: u64::MAX, multiple_of: 1, zero_is_off: true, never: false },
        default: Text("0"),
        class: Diagnostic,
        meaning: "Split each GET, PUT and COOPERATE copy into pieces of at most this size, spread over \
                  `GPULMT_LANES` copy queues. 0: one copy per part of a transfer.",
    },
    Variable {
        name: "GPULMT_LANES",
        kind: Kind::Count { min: 1, max: 16, power_of_two: false },
        default: Text("1"),
        class: Diagnostic,
        meaning: "Copy queues (CUDA streams) per engine that the pieces of `GPULMT_COPY_SPLIT` are spread over.",
    },
    Variable {
        name: "GPULMT_ANATOMY_OUT",
        kind: Kind::Syntax("a path prefix"),
        default: Unset("no log"),
        class: Diagnostic,
        meaning: "Builds with the `anatomy` cargo feature only: each rank writes host timestamps of the steps \
                  of its messages to `PREFIX.<rank>.csv` at finalize (see `transport/src/anatomy.rs`), to \
                  find where a small message's latency goes.",
    },
    Variable {
        name: "GPULMT_PSEUDO_NODES",
        kind: Kind::Count { min: 1, max: 1024, power_of_two: false },
        default: Text("1"),
        class: Diagnostic,
        meaning: "A test setting for jobs started by `mpirun` (`gpulmt::mpi::init_from_mpi`): split the ranks of \
                  each host into this many nodes, contiguous groups by their index on the host (3 ranks in 2: \
                  {0, 1} and {2}). Ranks of different groups share no shared memory and no IPC handle: \
                  everything between them takes the internode path, so that one machine exercises it. The \
                  PMPI shim splits its nodes alike (large device messages between them take the internode \
                  path too, the shim asking MPI for `MPI_THREAD_MULTIPLE`). From 1 to the ranks of the smallest host; a job started by `gpulmt-run` is one node and refuses \
                  more than 1.",
    },
    Variable {
        name: "GPULMT_SIM_DEVICES",
        kind: Kind::Count { min: 1, max: 1024, power_of_two: false },
        default: Text("2"),
        class: SimOnly,
        meaning: "Number of simulated devices.",
    },
    Variable {
        name: "GPULMT_SIM_PEER",
        kind: Kind::Syntax("`all`, `none`, or device pairs like `0-1,2-3`"),
        default: Text("all"),
        class: SimOnly,
        meaning: "Which pairs of simulated devices are peer-accessible, to test the paths of a topology without \
                  NVLink.",
    },
    Variable {
        name: "GPULMT_SIM_IPC_OPEN_US",
        kind: Kind::Syntax("a whole number of microseconds"),
        default: Text("0"),
        class: SimOnly,
        meaning: "Time that opening an IPC handle takes, to model a real driver's cost (about a millisecond on \
                  recent GPUs) in tests of the handle cache.",
    },
    Variable {
        name: "GPULMT_SIM_REFUSE_OPENS",
        kind: Kind::Syntax("`0` or `1`"),
        default: Text("0"),
        class: SimOnly,
        meaning: "Fault injection: `1` makes every open of a peer's IPC handle fail as a driver's refusal would, \
                  to test that a GET falls back to shared-memory staging and nothing else maps the buffer.",
    },
    Variable {
        name: "GPULMT_SIM_COPY",
        kind: Kind::Syntax("`thread`, `inline` or `inline:NS`"),
        default: Text("thread"),
        class: SimOnly,
        meaning: "`thread`: each device's copies run on a copy-engine thread. `inline`: copies are made inside \
                  the call that starts them, an engine that takes no time, to measure the host path alone. \
                  `inline:NS`: made there, and seen finished NS ns after their issue, so that the host paths \
                  overlap a copy as on a GPU.",
    },
    Variable {
        name: "GPULMT_SIM_DRIVER_NS",
        kind: Kind::Syntax("`ISSUE,DONE,NOT_READY` whole nanoseconds"),
        default: Unset("no cost"),
        class: SimOnly,
        meaning: "CPU time that starting a copy, a poll answering \"done\" and one answering \"not yet\" spin \
                  for: a model of the CUDA driver's calls, under which the bandwidth of small messages is bound \
                  by driver calls as on GPUs. Polls that the CUDA backend answers without the driver cost \
                  nothing.",
    },
];

/// Variables the launcher (`gpulmt-run`) sets for each rank: who the rank is, not how
/// it behaves. Not settings; listed so that the documentation and the tests know them.
pub const LAUNCHER_VARIABLES: &[(&str, &str)] = &[
    ("GPULMT_JOB", "the job's id, which names its shared-memory objects"),
    ("GPULMT_RANK", "the rank's index in the job"),
    ("GPULMT_SIZE", "the number of ranks"),
    ("GPULMT_LOCAL_RANK", "the rank's index on its node"),
    ("GPULMT_LOCAL_SIZE", "the number of ranks on its node"),
];

/// The table's entry for `name`.
pub fn variable(name: &str) -> Option<&'static Variable> {
    VARIABLES.iter().find(|v| v.name == name)
}
