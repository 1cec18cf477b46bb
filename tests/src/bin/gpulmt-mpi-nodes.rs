//! `gpulmt-mpi-nodes`: the rank program of the pseudo-node test (feature `mpi`), started
//! by `mpirun` with `GPULMT_PSEUDO_NODES`, so that one host's ranks form several nodes:
//!
//! ```text
//! mpirun -np 4 -x GPULMT_DEVICE=sim -x GPULMT_PSEUDO_NODES=2 target/debug/gpulmt-mpi-nodes
//! ```
//!
//! It checks, on every rank:
//! - the topology: `MPI_COMM_WORLD`'s ranks in contiguous groups, this rank's node;
//! - that each node has a shared-memory segment of its own: every rank of a node names
//!   the same LMT job, ranks of different nodes different ones, and the segment's rank
//!   table holds exactly the processes of the node's ranks;
//! - traffic within the node (a ring over the node's ranks), every placement (H H, H D,
//!   D H, D D) and sizes from 0 to 4 MiB at an offset, byte for byte;
//! - traffic across nodes: until the internode path is plugged into
//!   `gpulmt::mpi::init_from_mpi`, every transfer with a rank of another node fails at once
//!   with `gpulmt::mpi::NOT_BUILT` (see [`across_nodes`]).
//!
//! On success each rank prints `rank R ok checks=N`; at the first failure a `FAIL:` line
//! on stderr, and the job aborts.

use gpulmt::mpi::rsmpi::traits::{Communicator, CommunicatorCollectives};
use gpulmt::{Context, Rank};

/// Sizes of the messages, up to a NET / SHM rendezvous (4 MiB).
const SIZES: [usize; 6] = [0, 1, 4095, 8193, 65537, 4 << 20];
/// Byte offset of each message within its buffer.
const OFFSET: usize = 3;
/// Bytes of a job id exchanged between ranks.
const JOB_ID_BYTES: usize = 64;

/// Reports a failure and aborts the whole job (the other ranks may be waiting for us).
fn fail(rank: i32, what: String) -> ! {
    eprintln!("FAIL: rank {rank}: {what}");
    gpulmt::mpi::rsmpi::topology::SimpleCommunicator::world().abort(1)
}

/// The byte `i` of a message from `from` of `len` bytes.
fn pattern(from: Rank, len: usize, i: usize) -> u8 {
    (i as u8).wrapping_mul(13).wrapping_add(from as u8 * 29).wrapping_add(len as u8)
}

/// A buffer of one message size plus the offset, in host or device memory.
struct Buffer {
    ptr: usize,
    host: Option<Vec<u8>>,
}

impl Buffer {
    fn new(ctx: &mut Context, device: bool, bytes: usize) -> gpulmt::Result<Buffer> {
        if device {
            Ok(Buffer { ptr: ctx.mem_alloc(bytes)?, host: None })
        } else {
            let mut v = vec![0u8; bytes];
            Ok(Buffer { ptr: v.as_mut_ptr() as usize, host: Some(v) })
        }
    }

    fn write(&self, ctx: &Context, data: &[u8]) -> gpulmt::Result<()> {
        // SAFETY: the buffer holds OFFSET + the largest size; no transfer uses it now.
        unsafe { ctx.copy_sync(self.ptr, data.as_ptr() as usize, data.len()) }
    }

    fn read(&self, ctx: &Context, len: usize) -> gpulmt::Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        // SAFETY: as for `write`.
        unsafe { ctx.copy_sync(out.as_mut_ptr() as usize, self.ptr, len) }?;
        Ok(out)
    }
}

/// Sends every size to `to` and receives every size from `from`, in the placement given,
/// and checks what arrived byte for byte (and that the bytes around it were not written).
fn exchange(ctx: &mut Context, to: Rank, from: Rank, send_dev: bool, recv_dev: bool) -> gpulmt::Result<usize> {
    let bytes = OFFSET + SIZES[SIZES.len() - 1] + 1;
    let (send, recv) = (Buffer::new(ctx, send_dev, bytes)?, Buffer::new(ctx, recv_dev, bytes)?);
    let me = ctx.rank();
    let mut checks = 0;
    for (tag, &len) in SIZES.iter().enumerate() {
        let mut out = vec![0u8; OFFSET + len];
        out[OFFSET..].iter_mut().enumerate().for_each(|(i, b)| *b = pattern(me, len, i));
        send.write(ctx, &out)?;
        recv.write(ctx, &vec![0xee; bytes])?;
        let tag = tag as i32;
        // SAFETY: both buffers hold OFFSET + len bytes and outlive the requests (waited below).
        let r = unsafe { ctx.irecv((recv.ptr + OFFSET) as *mut u8, len, Some(from), Some(tag))? };
        // SAFETY: as above.
        let s = unsafe { ctx.isend((send.ptr + OFFSET) as *const u8, len, to, tag)? };
        let st = ctx.wait_all(vec![s, r])?;
        let got = recv.read(ctx, OFFSET + len + 1)?;
        let place = format!("{} -> {}", if send_dev { "D" } else { "H" }, if recv_dev { "D" } else { "H" });
        if (st[1].source, st[1].tag, st[1].len) != (from, tag, len as u64) {
            fail(me as i32, format!("{place} {len} bytes from {from}: status {:?}", st[1]));
        }
        if let Some(i) = (0..len).find(|&i| got[OFFSET + i] != pattern(from, len, i)) {
            fail(me as i32, format!("{place} {len} bytes from {from}: byte {i} differs"));
        }
        if got[..OFFSET].iter().chain(&got[OFFSET + len..]).any(|&b| b != 0xee) {
            fail(me as i32, format!("{place} {len} bytes from {from}: bytes outside the message were written"));
        }
        checks += 1;
    }
    drop((send.host, recv.host));
    Ok(checks)
}

/// A ring over `ranks` (job ranks, this one among them): every placement, every size.
fn ring(ctx: &mut Context, ranks: &[Rank]) -> gpulmt::Result<usize> {
    let at = ranks.iter().position(|&r| r == ctx.rank()).expect("this rank is in the ring");
    let n = ranks.len();
    let (to, from) = (ranks[(at + 1) % n], ranks[(at + n - 1) % n]);
    let mut checks = 0;
    for (send_dev, recv_dev) in [(false, false), (false, true), (true, false), (true, true)] {
        checks += exchange(ctx, to, from, send_dev, recv_dev)?;
    }
    Ok(checks)
}

/// Traffic with the ranks of other nodes: a ring over one rank of each node, this one's
/// index on its node picking them (2 x 2 nodes: 0 <-> 2 and 1 <-> 3).
///
/// Until the internode path is plugged into `init_from_mpi`, every such transfer fails at
/// once with `NOT_BUILT`. Once it is, replace the `match` with `ring(ctx, &peers)`.
fn across_nodes(ctx: &mut Context) -> usize {
    let topo = ctx.topology().clone();
    let local = topo.place().local as usize;
    let peers: Vec<Rank> = (0..topo.node_count()).filter_map(|n| topo.members(n).get(local).copied()).collect();
    if peers.len() < 2 {
        return 0;
    }
    match ring(ctx, &peers) {
        Err(e) if e.to_string().contains(gpulmt::mpi::NOT_BUILT) => 1,
        other => fail(
            ctx.rank() as i32,
            format!("a transfer with another node gave {other:?}, not {:?}", gpulmt::mpi::NOT_BUILT),
        ),
    }
}

fn main() {
    let universe = gpulmt::mpi::rsmpi::initialize().expect("MPI_Init");
    let world = universe.world();
    let me = world.rank();
    let mut ctx = gpulmt::mpi::init_from_mpi(&world).unwrap_or_else(|e| fail(me, format!("init_from_mpi: {e}")));
    let topo = ctx.topology().clone();
    let place = topo.place();
    let job = ctx.node_job().clone();
    println!("rank {me} node {} local {} of {} job {}", place.node, place.local, topo.local_size(), job.job);
    let mut checks = 0;

    // The topology: ranks in contiguous groups of one host; the LMT job is the node's.
    if topo.rank() != me as Rank || topo.size() != world.size() as u32 {
        fail(me, format!("topology says rank {} of {}", topo.rank(), topo.size()));
    }
    if (job.rank, job.size) != (place.local, topo.local_size()) {
        fail(me, format!("node job {job:?} but place {place:?}"));
    }
    let members = topo.node_members().to_vec();
    if members.windows(2).any(|w| w[1] != w[0] + 1) || !members.contains(&(me as Rank)) {
        fail(me, format!("node {} holds ranks {members:?}", place.node));
    }
    checks += 1;

    // Each node's segment: one job id per node, and only the node's processes in it.
    let mut id = [0u8; JOB_ID_BYTES];
    id[..job.job.len()].copy_from_slice(job.job.as_bytes());
    let mut ids = vec![0u8; JOB_ID_BYTES * world.size() as usize];
    world.all_gather_into(&id[..], &mut ids[..]);
    let pid = std::process::id();
    let mut pids = vec![0u32; world.size() as usize];
    world.all_gather_into(&pid, &mut pids[..]);
    for r in 0..world.size() as Rank {
        let same_id = ids[r as usize * JOB_ID_BYTES..][..JOB_ID_BYTES] == id;
        if same_id != topo.on_node(r) {
            fail(me, format!("rank {r} (on this node: {}) has job id equal to ours: {same_id}", topo.on_node(r)));
        }
    }
    // The context's own mapping: the segment's name is gone once every rank joined.
    let seg = ctx.job_segment();
    let in_segment: Vec<u32> = (0..seg.nranks()).map(|l| seg.rank_pid(l)).collect();
    let of_node: Vec<u32> = members.iter().map(|&r| pids[r as usize]).collect();
    if in_segment != of_node {
        fail(me, format!("segment {} lists pids {in_segment:?}, the node's ranks are {of_node:?}", seg.name()));
    }
    checks += 1;

    // Within the node: every placement and size, over the rings, IPC and staging.
    if members.len() > 1 {
        checks += ring(&mut ctx, &members).unwrap_or_else(|e| fail(me, format!("traffic within node: {e}")));
    }
    checks += across_nodes(&mut ctx);

    world.barrier();
    ctx.finalize().unwrap_or_else(|e| fail(me, format!("finalize: {e}")));
    println!("rank {me} ok checks={checks}");
}
