//! Joining the node's gpulmt job after `PMPI_Init` (collective over the node: a job id
//! from local rank 0, a plugin context with rings on every rank, or none anywhere), and
//! leaving it before `PMPI_Finalize` (drain, barrier with progress, release).

use std::collections::HashMap;
use std::ffi::c_int;

use gpulmt::config::Config;
use gpulmt::{Context, JobInfo};
use mpi_sys::*;

use super::{gpulmt_mpi_counters, InitError, Shim};
use crate::envelope::job_hash;
use crate::raw::*;

impl Shim {
    /// Sets up the shim after PMPI_Init (collective over MPI_COMM_WORLD).
    pub fn init() -> Result<Shim, InitError> {
        let world = comm_world();
        let (mut wrank, mut wsize) = (0, 0);
        let mut node = comm_null();
        let (mut lrank, mut lsize) = (0, 0);
        // SAFETY: MPI is initialized; every out-pointer is a local.
        unsafe {
            PMPI_Comm_rank(world, &mut wrank);
            PMPI_Comm_size(world, &mut wsize);
            PMPI_Comm_split_type(world, comm_type_shared(), wrank, info_null(), &mut node);
            PMPI_Comm_rank(node, &mut lrank);
            PMPI_Comm_size(node, &mut lsize);
        }
        // Which world ranks share the node, in local-rank order.
        let mut members = vec![0i32; lsize as usize];
        let mut id = [0u8; 64];
        if lrank == 0 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            let job = format!("mpi{}x{nanos:x}", std::process::id());
            id[..job.len()].copy_from_slice(job.as_bytes());
        }
        let mut node_comm = comm_null();
        let mut world_group = group_null();
        // SAFETY: buffers of the sizes given; collective over the node communicator.
        unsafe {
            PMPI_Allgather((&wrank as *const c_int).cast(), 1, int32(), members.as_mut_ptr().cast(), 1, int32(), node);
            PMPI_Bcast(id.as_mut_ptr().cast(), id.len() as c_int, byte(), 0, node);
            PMPI_Comm_dup(node, &mut node_comm);
            PMPI_Comm_group(world, &mut world_group);
        }
        let mut level = 0;
        // SAFETY: a local out-pointer; MPI is initialized.
        let thread_multiple =
            unsafe { PMPI_Query_thread(&mut level) } == SUCCESS && level >= MPI_THREAD_MULTIPLE as c_int;
        let mut world_to_local = vec![-1i32; wsize as usize];
        for (l, &w) in members.iter().enumerate() {
            world_to_local[w as usize] = l as i32;
        }
        let len = id.iter().position(|&b| b == 0).unwrap_or(id.len());
        let job = String::from_utf8_lossy(&id[..len]).into_owned();

        let made = (|| -> Result<(Context, usize, bool), String> {
            let lmt_min = match std::env::var("GPULMT_MPI_LMT_MIN") {
                Ok(v) if !v.trim().is_empty() => gpulmt::config::parse_size(v.trim())
                    .ok_or_else(|| format!("GPULMT_MPI_LMT_MIN={v:?} is not a size (like 1, 64K, 1M)"))?
                    as usize,
                _ => 1,
            };
            // Agreed at MPI_Init already (an invalid value counted as the default there).
            crate::staging::cap_from_env()?;
            let settle = match std::env::var("GPULMT_MPI_SETTLE").as_deref().map(str::trim) {
                Err(_) | Ok("") | Ok("default-stream") => true,
                Ok("none") => false,
                Ok(v) => return Err(format!("GPULMT_MPI_SETTLE={v:?} is neither `default-stream` nor `none`")),
            };
            let cfg = Config::from_env().map_err(|e| e.to_string())?;
            let info = JobInfo { job: job.clone(), rank: lrank as u32, size: lsize as u32 };
            // Rings, not blobs over MPI: a packet crosses in a ring slot the peer's
            // progress reads, where an MPI message cost both ranks an Isend, an Iprobe
            // and a Recv, and every progress round an Iprobe on one more communicator.
            let ctx = Context::init_plugin_rings(cfg, info).map_err(|e| e.to_string())?;
            Ok((ctx, lmt_min.max(1), settle))
        })();
        // Every local rank must have joined, or none uses gpulmt.
        let mine = c_int::from(made.is_ok());
        let mut all = 0;
        // SAFETY: one int each way; collective over the node communicator.
        unsafe {
            PMPI_Allreduce((&mine as *const c_int).cast(), (&mut all as *mut c_int).cast(), 1, int32(), op_min(), node)
        };
        let mut fail = |why: String, ctx: Option<Context>| {
            if let Some(ctx) = ctx {
                release(ctx);
            }
            // SAFETY: communicators and group made above; nothing uses them any more.
            unsafe {
                PMPI_Comm_free(&mut node_comm);
                PMPI_Comm_free(&mut node);
                PMPI_Group_free(&mut world_group);
            }
            Err(why)
        };
        let (ctx, lmt_min, settle) = match made {
            Err(why) => return fail(why, None),
            Ok(v) if all == 0 => return fail("another rank of this node could not start gpulmt".into(), Some(v.0)),
            Ok(v) => v,
        };
        // The node communicator's work is done (the finalize barriers use node_comm,
        // a duplicate of it): in Open MPI 4.1 each communicator a program
        // holds adds to the cost of every host message (libnbc's progress polling).
        // SAFETY: made above; nothing uses it any more.
        unsafe { PMPI_Comm_free(&mut node) };
        // Sim devices too: device memory a program can pass comes from gpulmt_mpi_alloc,
        // which makes every thread forget its host ranges.
        crate::hostmem::enable(ctx.config().memtype_cache);
        // Staging memory is pinned for this context's device engines.
        crate::staging::pool::attach(ctx.backend().clone());
        tracing::info!(job = %job, local_rank = lrank, local_size = lsize, world_rank = wrank, "gpulmt-mpi shim active");
        Ok(Shim {
            ctx,
            job_hash: job_hash(&job),
            world_rank: wrank,
            world_group,
            node_comm,
            world_to_local,
            ops: HashMap::new(),
            next_op: 1,
            posted: Vec::new(),
            stash: Vec::new(),
            probed: HashMap::new(),
            finished: HashMap::new(),
            allocations: Vec::new(),
            last_device: None,
            lmt_min,
            settle,
            thread_multiple,
            counters: gpulmt_mpi_counters::default(),
        })
    }

    /// Leaves: finishes this rank's traffic, then (collectively over the node) waits
    /// until every rank has, and releases gpulmt. Called before PMPI_Finalize.
    pub fn finalize(mut self) {
        // Transfers already matched (peers may depend on them) get time to finish;
        // receives nothing matched are the program's leaks and are abandoned.
        let t0 = std::time::Instant::now();
        while self.busy() {
            self.progress();
            if t0.elapsed() > std::time::Duration::from_secs(30) {
                tracing::warn!(
                    ops = self.ops.len(),
                    "MPI_Finalize: shim transfers still running after 30 s; abandoning them"
                );
                break;
            }
        }
        // Peers may still need our packets to finish theirs: progress until all arrive.
        let mut req = request_null();
        // SAFETY: collective over the node's ranks, request out-pointer.
        unsafe { PMPI_Ibarrier(self.node_comm, &mut req) };
        loop {
            self.progress();
            let mut flag = 0;
            // SAFETY: the barrier's request.
            unsafe { PMPI_Test(&mut req, &mut flag, status_ignore()) };
            if flag != 0 {
                break;
            }
        }
        // Nobody drives gpulmt after this barrier: releasing cannot alarm a peer.
        // SAFETY: collective over the node's ranks.
        unsafe { PMPI_Barrier(self.node_comm) };
        crate::staging::pool::shut_down();
        for ptr in std::mem::take(&mut self.allocations) {
            // SAFETY: memory of gpulmt_mpi_alloc, which the application may not use after
            // MPI_Finalize; after the barrier no rank drives a copy on it.
            let _ = unsafe { self.ctx.backend().free(ptr) };
        }
        let Shim { ctx, mut node_comm, mut world_group, .. } = self;
        release(ctx);
        // SAFETY: the shim's own communicators and group, unused from now on.
        unsafe {
            PMPI_Comm_free(&mut node_comm);
            PMPI_Group_free(&mut world_group);
        }
    }
}

/// Releases a plugin context locally. The job segment's name went at init, once every rank
/// had mapped it: unlinking it by name here could remove another job instance's segment.
fn release(ctx: Context) {
    drop(ctx);
}
