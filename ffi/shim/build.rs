//! Compiles `csrc/mpi_consts.c` against the MPI library that `mpi-sys` binds (found the
//! same way: `MPICC`, `MPI_PKG_CONFIG`, `mpicc`, pkg-config), for the constants bindgen
//! cannot translate (`MPI_IN_PLACE`, a pointer cast in a macro), and tells the tests
//! which MPI that is (`GPULMT_SHIM_MPI`: `mpich` or `openmpi`, and `GPULMT_SHIM_MPICC`, the
//! compiler wrapper found, if any), so that `tests/mpi.rs` compiles and launches its C
//! programs with the same MPI. It also probes whether that MPI's `mpi.h` declares the
//! MPI-4 persistent collectives (`MPI_Allreduce_init`, ...: MPICH 4 does, Open MPI 4.1
//! does not) and sets the cfg `mpi_persistent_coll` when it does, so that the shim
//! defines its own `MPI_*_init` collectives only where the library has them.

fn main() {
    println!("cargo:rerun-if-changed=csrc/mpi_consts.c");
    println!("cargo:rerun-if-env-changed=MPICC");
    println!("cargo:rerun-if-env-changed=MPI_PKG_CONFIG");
    println!("cargo:rustc-check-cfg=cfg(mpi_persistent_coll)");
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
    if declares_persistent_collectives(&build) {
        println!("cargo:rustc-cfg=mpi_persistent_coll");
    }
    build.compile("gpulmt_mpi_consts");
}

/// Whether the MPI's `mpi.h` declares `MPI_Allreduce_init` (MPI-4's persistent
/// collectives): a syntax check of a one-line program with the compiler `build` uses.
fn declares_persistent_collectives(build: &cc::Build) -> bool {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let probe = out.join("persistent_collectives.c");
    let source = "#include <mpi.h>\nint (*gpulmt_probe)(const void *, void *, int, MPI_Datatype, MPI_Op, MPI_Comm, \
                  MPI_Info, MPI_Request *) = MPI_Allreduce_init;\n";
    if std::fs::write(&probe, source).is_err() {
        return false;
    }
    let Ok(tool) = build.try_get_compiler() else { return false };
    tool.to_command()
        .arg("-fsyntax-only")
        .arg(&probe)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
