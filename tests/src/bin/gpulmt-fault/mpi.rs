//! `gpulmt-fault-mpi`: `gpulmt-fault` (see its `main.rs`) for `mpirun`: the node's
//! ranks form their gpulmt job from MPI (`gpulmt::mpi::init_from_mpi`) instead of the
//! launcher's environment. Built with the `mpi` feature:
//! `cargo build -p gpulmt-tests --features mpi --bin gpulmt-fault-mpi`.

use clap::Parser;

#[path = "scenarios.rs"]
mod scenarios;

fn main() {
    let cli = scenarios::Cli::parse();
    // MPI_THREAD_MULTIPLE: across nodes the internode path's proxy thread calls MPI too.
    let (universe, _) = gpulmt::mpi::rsmpi::initialize_with_threading(gpulmt::mpi::rsmpi::Threading::Multiple)
        .unwrap_or_else(|| scenarios::fail("MPI_Init_thread failed"));
    let world = universe.world();
    // The rank in the environment is what the scenarios print before init.
    std::env::set_var("GPULMT_RANK", mpi_rank(&world).to_string());
    let code = scenarios::main(cli, || gpulmt::mpi::init_from_mpi(&world));
    drop(universe);
    std::process::exit(code);
}

fn mpi_rank(world: &impl gpulmt::mpi::rsmpi::topology::Communicator) -> i32 {
    world.rank()
}
