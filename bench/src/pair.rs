//! The two-rank set-up and tear-down shared by the point-to-point benchmarks: the
//! context, which side this rank is, and its send and receive buffers in the
//! placement of its side (rank 0 takes the first placement argument, rank 1 the
//! second, as in OSU).

use gpulmt::Context;

use crate::{or_die, print_stats, Buffer, Options};

/// One rank of a two-rank benchmark.
pub struct Pair {
    pub ctx: Context,
    pub me: u32,
    pub peer: u32,
    pub sbuf: Buffer,
    pub rbuf: Buffer,
}

impl Pair {
    /// Joins the job and allocates buffers of the largest size; exits with a usage
    /// message when fewer than two ranks run.
    pub fn setup(o: &Options, name: &str) -> Pair {
        let mut ctx = or_die(join(), "init");
        if ctx.size() < 2 {
            eprintln!("{name} needs 2 ranks: gpulmt-run -n 2 {}", std::env::args().next().unwrap_or_default());
            std::process::exit(2);
        }
        let me = ctx.rank();
        let place = if me == 0 { o.send } else { o.recv };
        let sbuf = or_die(Buffer::new_as(&mut ctx, place, o.mem, o.range.1), "allocating the send buffer");
        let rbuf = or_die(Buffer::new_as(&mut ctx, place, o.mem, o.range.1), "allocating the receive buffer");
        Pair { ctx, me, peer: 1 - me.min(1), sbuf, rbuf }
    }

    /// Prints counters if asked, frees the buffers (two-phase), finalizes; returns
    /// the exit code.
    pub fn finish(self, o: &Options, failed: bool) -> i32 {
        let Pair { mut ctx, sbuf, rbuf, .. } = self;
        print_stats(&ctx, o);
        or_die(sbuf.free(&mut ctx), "free");
        or_die(rbuf.free(&mut ctx), "free");
        or_die(ctx.mem_free_commit(), "free commit");
        or_die(ctx.finalize(), "finalize");
        finalize_mpi();
        i32::from(failed)
    }
}

/// MPI_Finalize, if MPI started this rank ([`join`]): after gpulmt's finalize.
pub fn finalize_mpi() {
    #[cfg(feature = "mpi")]
    MPI.with(|m| drop(m.borrow_mut().take()));
}

#[cfg(feature = "mpi")]
thread_local! {
    /// The MPI environment when an MPI launcher started this rank; dropping it
    /// finalizes MPI.
    static MPI: std::cell::RefCell<Option<gpulmt::mpi::rsmpi::environment::Universe>> =
        const { std::cell::RefCell::new(None) };
}

/// Joins the job: through MPI (the node's ranks of `MPI_COMM_WORLD`) when built with
/// the `mpi` feature and started by `mpirun` without `GPULMT_JOB`, else from the
/// environment of `gpulmt-run` (Stencil2D joins the same way).
pub fn join() -> gpulmt::Result<Context> {
    #[cfg(feature = "mpi")]
    if gpulmt::mpi::launched_by_mpi() {
        // MPI_THREAD_MULTIPLE: across nodes the internode path's proxy thread calls MPI too.
        let (universe, _) = gpulmt::mpi::rsmpi::initialize_with_threading(gpulmt::mpi::rsmpi::Threading::Multiple)
            .ok_or_else(|| gpulmt::Error::Bootstrap("MPI was initialized already".into()))?;
        let ctx = gpulmt::mpi::init_from_mpi(&universe.world());
        MPI.with(|m| *m.borrow_mut() = Some(universe));
        return ctx;
    }
    Context::init()
}
