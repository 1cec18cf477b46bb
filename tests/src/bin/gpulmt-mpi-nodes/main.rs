//! `gpulmt-mpi-nodes`: the rank program of the internode tests (feature `mpi`), started
//! by `mpirun` with `GPULMT_PSEUDO_NODES`, so that one host's ranks form several nodes
//! (tests/tests/internode.rs runs it):
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
//!   D H, D D) and sizes from 0 to 4 MiB at an offset, byte for byte ([`ring`]);
//! - traffic across nodes, through the internode path: the same ring over one rank of
//!   each node with sizes up to `--max` (64 MiB by default); ANY_SOURCE receives over
//!   senders of this node and of others ([`wildcard`]); truncation ([`truncate`]); a
//!   burst past the GIO queue's slots ([`burst`]); gpulmt's barrier ([`barrier`]);
//! - the symmetric heap across nodes: host puts, gets, put_signal, fence, quiet and
//!   atomics to every PE, accesses outside the heap refused, and the device's queue
//!   table used as the device header uses it ([`sym`]).
//!
//! `gpulmt-mpi-nodes die` instead kills the last rank in the middle of a transfer to rank
//! 0 ([`die`]): the job must end with an error, which `mpirun` reports.
//!
//! On success each rank prints `rank R ok checks=N`; at the first failure a `FAIL:` line
//! on stderr, and the job aborts.

mod barrier;
mod buffer;
mod burst;
mod die;
mod order;
mod ring;
mod soak;
mod sym;
mod truncate;
mod wildcard;

use buffer::fail;
use gpulmt::mpi::rsmpi::traits::{Communicator, CommunicatorCollectives};
use gpulmt::mpi::rsmpi::Threading;
use gpulmt::{Context, Rank};

/// Sizes within a node, up to a rendezvous of 4 MiB.
const NODE_SIZES: [usize; 6] = [0, 1, 4095, 8193, 65537, 4 << 20];
/// Sizes across nodes (below `--max`): empty, eager, past the eager limit, a staged
/// pipeline of several pieces, and 64 MiB.
const NET_SIZES: [usize; 7] = [0, 1, 4095, 8193, 65537, 4 << 20, 64 << 20];
/// Bytes of a job id exchanged between ranks.
const JOB_ID_BYTES: usize = 64;

/// One rank of each node, this one's index on its node picking them (2 x 2 nodes:
/// 0 <-> 2 and 1 <-> 3); a rank whose index no other node has gets just itself.
fn partners(ctx: &Context) -> Vec<Rank> {
    let topo = ctx.topology();
    let local = topo.place().local as usize;
    (0..topo.node_count()).filter_map(|n| topo.members(n).get(local).copied()).collect()
}

/// The options: `die`, and `--max BYTES` (the largest message across nodes).
struct Options {
    die: bool,
    max: usize,
    soak: Option<soak::Soak>,
    order: bool,
}

fn options() -> Options {
    let mut o = Options { die: false, max: 64 << 20, soak: None, order: false };
    let number = |name: &str, v: Option<String>| -> u64 {
        let v = v.unwrap_or_default();
        v.parse().unwrap_or_else(|_| {
            eprintln!("gpulmt-mpi-nodes: {name} {v:?} is not a number");
            std::process::exit(2)
        })
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "die" => o.die = true,
            "order" => o.order = true,
            "soak" => o.soak = Some(soak::Soak { seed: 1, count: 200, window: 30, sizes: None }),
            "--sizes" if o.soak.is_some() => {
                let v = args.next().unwrap_or_default();
                let sizes: Vec<usize> = v.split(',').map(|x| number("--sizes", Some(x.to_string())) as usize).collect();
                o.soak.as_mut().expect("checked").sizes = Some(sizes.leak());
            }
            "--seed" | "--count" | "--window" if o.soak.is_some() => {
                let n = number(&a, args.next());
                let s = o.soak.as_mut().expect("checked");
                match a.as_str() {
                    "--seed" => s.seed = n,
                    "--count" => s.count = n as usize,
                    _ => s.window = n as usize,
                }
            }
            "--max" => {
                let v = args.next().unwrap_or_default();
                o.max = gpulmt::config::parse_size(&v).map(|n| n as usize).unwrap_or_else(|| {
                    eprintln!("gpulmt-mpi-nodes: --max {v:?} is not a size");
                    std::process::exit(2)
                });
            }
            _ => {
                eprintln!("usage: gpulmt-mpi-nodes [die] [--max BYTES] | order | soak [--seed S] [--count N] [--window W] [--sizes A,B,..]");
                std::process::exit(2)
            }
        }
    }
    o
}

fn main() {
    let opts = options();
    // MPI_THREAD_MULTIPLE: the internode path's proxy thread calls MPI beside this one.
    let (universe, _) = gpulmt::mpi::rsmpi::initialize_with_threading(Threading::Multiple).expect("MPI_Init_thread");
    let world = universe.world();
    let me = world.rank() as Rank;
    let mut ctx = gpulmt::mpi::init_from_mpi(&world).unwrap_or_else(|e| fail(me, format!("init_from_mpi: {e}")));
    let topo = ctx.topology().clone();
    let place = topo.place();
    let job = ctx.node_job().clone();
    println!("rank {me} node {} local {} of {} job {}", place.node, place.local, topo.local_size(), job.job);
    let mut checks = 0;

    // The topology: ranks in contiguous groups of one host; the LMT job is the node's.
    if topo.rank() != me || topo.size() != world.size() as u32 {
        fail(me, format!("topology says rank {} of {}", topo.rank(), topo.size()));
    }
    if (job.rank, job.size) != (place.local, topo.local_size()) {
        fail(me, format!("node job {job:?} but place {place:?}"));
    }
    let members = topo.node_members().to_vec();
    if members.windows(2).any(|w| w[1] != w[0] + 1) || !members.contains(&me) {
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

    if opts.die {
        die::run(&mut ctx, &world);
    }
    if opts.soak.is_some() || opts.order {
        if let Some(s) = opts.soak {
            checks += soak::run(&mut ctx, s);
        } else {
            checks += order::run(&mut ctx);
        }
        world.barrier();
        ctx.finalize().unwrap_or_else(|e| fail(me, format!("finalize: {e}")));
        println!("rank {me} ok checks={checks}");
        return;
    }

    // Within the node: every placement and size, over the rings, IPC and staging.
    if members.len() > 1 {
        checks += ring::ring(&mut ctx, &members, &NODE_SIZES);
    }
    // Across nodes, through the internode path.
    let peers = partners(&ctx);
    if peers.len() > 1 {
        let sizes: Vec<usize> = NET_SIZES.iter().copied().filter(|&n| n <= opts.max).collect();
        checks += ring::ring(&mut ctx, &peers, &sizes);
        let at = peers.iter().position(|&r| r == me).expect("this rank is among its partners");
        let n = peers.len();
        let (to, from) = (peers[(at + 1) % n], peers[(at + n - 1) % n]);
        checks += truncate::run(&mut ctx, to, from);
        checks += burst::run(&mut ctx, to, from);
    }
    world.barrier();
    if topo.node_count() > 1 {
        checks += wildcard::run(&mut ctx, &world, 0);
        checks += barrier::run(&mut ctx, &world);
        checks += sym::run(&mut ctx, &world);
    }

    world.barrier();
    ctx.finalize().unwrap_or_else(|e| fail(me, format!("finalize: {e}")));
    println!("rank {me} ok checks={checks}");
}
