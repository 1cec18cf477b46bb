//! Compiles `csrc/mpi_consts.c` against the MPI library that `mpi-sys` binds (found the
//! same way: `MPICC`, `MPI_PKG_CONFIG`, `mpicc`, pkg-config), for the constants bindgen
//! cannot translate (`MPI_IN_PLACE`, a pointer cast in a macro), and tells the tests
//! which MPI that is (`GPULMT_SHIM_MPI`: `mpich` or `openmpi`, and `GPULMT_SHIM_MPICC`, the
//! compiler wrapper found, if any), so that `tests/mpi.rs` compiles and launches its C
//! programs with the same MPI.

fn main() {
    println!("cargo:rerun-if-changed=csrc/mpi_consts.c");
    println!("cargo:rerun-if-env-changed=MPICC");
    println!("cargo:rerun-if-env-changed=MPI_PKG_CONFIG");
    let lib = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errs) => {
            let why: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
            panic!("no MPI library found (as for mpi-sys; set MPICC or MPI_PKG_CONFIG): {}", why.join("; "));
        }
    };
    let family = if lib.libs.iter().any(|l| l.contains("mpich")) { "mpich" } else { "openmpi" };
    println!("cargo:rustc-env=GPULMT_SHIM_MPI={family}");
    println!("cargo:rustc-env=GPULMT_SHIM_MPICC={}", lib.mpicc.as_deref().unwrap_or(""));
    let mut build = cc::Build::new();
    build.file("csrc/mpi_consts.c");
    match lib.mpicc {
        Some(mpicc) => {
            build.compiler(mpicc);
        }
        None => {
            for inc in &lib.include_paths {
                build.include(inc);
            }
        }
    }
    build.compile("gpulmt_mpi_consts");
}
