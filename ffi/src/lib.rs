//! The C ABI of gpulmt (`libgpulmt.so` / `libgpulmt.a`, header `include/gpulmt.h`).
//!
//! Two faces over one opaque `gpulmt_ctx*`:
//! - the plain endpoint API for C programs started by `gpulmt-run`: `gpulmt_init`,
//!   `gpulmt_isend` / `gpulmt_irecv` / `gpulmt_test` / `gpulmt_wait`, device memory
//!   (`gpulmt_mem_alloc`, two-phase `gpulmt_mem_free` + `gpulmt_mem_free_commit`),
//!   `gpulmt_copy`, `gpulmt_finalize` ([`endpoint`]); or, started by `mpirun`, across
//!   nodes over an MPI communicator: `gpulmt_init_mpi` ([`mod@mpi`], feature `mpi`);
//! - the LMT plugin ABI for MPI libraries that own matching and their own control
//!   channel, mirroring MPICH Nemesis' LMT hooks: `gpulmt_plugin_init`,
//!   `gpulmt_lmt_initiate`, `gpulmt_lmt_start_recv`, `gpulmt_lmt_handle_cts`,
//!   `gpulmt_lmt_done`, `gpulmt_plugin_deliver`, `gpulmt_peer_terminated` ([`plugin`]);
//!   or, without a `send_blob` callback, carrying only the RTS cookie while gpulmt's own
//!   shared-memory rings carry the rest (as the PMPI shim does).
//!
//! Conventions: every function returns `GPULMT_SUCCESS` (0) or a `GPULMT_ERR_*` code
//! ([`error`]) and never unwinds into C (a panic becomes `GPULMT_ERR_INTERNAL`); the
//! failing call's message is `gpulmt_last_error()` on the same thread. A context is
//! used by one thread at a time (it may move between threads); progress happens
//! inside the calls on it.
//!
//! The header is generated from this crate by cbindgen; `tests/header.rs` fails when
//! `include/gpulmt.h` is stale and says how to regenerate it.

pub mod endpoint;
pub mod error;
pub mod ga;
pub mod handle;
pub mod mpi;
pub mod plugin;
mod registry;
pub mod sym;

use std::ffi::c_int;

pub use endpoint::*;
pub use error::*;
pub use ga::*;
pub use handle::{gpulmt_ctx, gpulmt_request, gpulmt_status, GPULMT_ANY_SOURCE, GPULMT_ANY_TAG, GPULMT_REQUEST_NULL};
pub use mpi::*;
pub use plugin::*;
pub use sym::*;

/// Major version of the header (compare with `gpulmt_version` at run time).
pub const GPULMT_VERSION_MAJOR: c_int = 0;
/// Minor version of the header.
pub const GPULMT_VERSION_MINOR: c_int = 1;
/// Patch version of the header.
pub const GPULMT_VERSION_PATCH: c_int = 0;

/// Tags of `gpulmt_isend` / `gpulmt_irecv` are below this bound (above it, gpulmt's
/// own collectives).
pub const GPULMT_TAG_UB: c_int = 2147483631;

/// Parses a decimal version component at compile time.
const fn parse_version(s: &str) -> c_int {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n: c_int = 0;
    while i < b.len() {
        assert!(b[i].is_ascii_digit(), "version components are decimal");
        n = n * 10 + (b[i] - b'0') as c_int;
        i += 1;
    }
    n
}

// The header's constants are literals (cbindgen copies them); these keep them true.
const _: () = assert!(GPULMT_VERSION_MAJOR == parse_version(env!("CARGO_PKG_VERSION_MAJOR")));
const _: () = assert!(GPULMT_VERSION_MINOR == parse_version(env!("CARGO_PKG_VERSION_MINOR")));
const _: () = assert!(GPULMT_VERSION_PATCH == parse_version(env!("CARGO_PKG_VERSION_PATCH")));
const _: () = assert!(GPULMT_TAG_UB == gpulmt::context::TAG_UB);

/// Gives the version of the library (which may differ from the header's
/// `GPULMT_VERSION_*` when a program runs against another build). Each pointer may be
/// NULL.
///
/// # Safety
/// Each pointer is NULL or valid for writes of an `int`.
#[no_mangle]
pub unsafe extern "C" fn gpulmt_version(major: *mut c_int, minor: *mut c_int, patch: *mut c_int) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        unsafe {
            handle::set_opt(major, GPULMT_VERSION_MAJOR);
            handle::set_opt(minor, GPULMT_VERSION_MINOR);
            handle::set_opt(patch, GPULMT_VERSION_PATCH);
        }
        Ok(())
    })
}

/// The ABI driven from Rust in a one-rank job (no `gpulmt-run` environment): what C
/// sees for arguments, requests, statuses and errors. The multi-process paths are
/// exercised by the C examples (`tests/examples.rs`).
#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::{c_void, CStr};
    use std::ptr::{null, null_mut};

    fn last_error() -> String {
        // SAFETY: gpulmt_last_error always returns a valid C string.
        unsafe { CStr::from_ptr(gpulmt_last_error()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn version_matches_the_package() {
        let (mut a, mut b, mut c) = (-1, -1, -1);
        // SAFETY: valid out-pointers; NULLs are allowed.
        unsafe {
            assert_eq!(gpulmt_version(&mut a, &mut b, &mut c), GPULMT_SUCCESS);
            assert_eq!(gpulmt_version(null_mut(), null_mut(), null_mut()), GPULMT_SUCCESS);
        }
        assert_eq!(format!("{a}.{b}.{c}"), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn null_arguments_are_rejected_not_dereferenced() {
        // SAFETY: every function checks its NULL arguments before using them.
        unsafe {
            assert_eq!(gpulmt_init(null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_finalize(null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!(gpulmt_rank(null_mut(), null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains("context is NULL"), "{}", last_error());
            assert_eq!(gpulmt_progress(null_mut(), null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            let mut out = null_mut();
            assert_eq!(gpulmt_plugin_init(null(), c"job".as_ptr(), 0, 1, &mut out), GPULMT_ERR_INVALID_ARGUMENT);
            assert!(out.is_null());
            assert!(last_error().contains("ops is NULL"));
        }
    }

    #[test]
    fn a_panic_poisons_the_context_until_it_is_released() {
        let mut ctx = null_mut();
        // SAFETY: a live context from gpulmt_init, released by gpulmt_finalize last.
        unsafe {
            assert_eq!(gpulmt_init(&mut ctx), GPULMT_SUCCESS, "{}", last_error());
            assert_eq!(handle::with_ctx(ctx, |_| panic!("injected")), GPULMT_ERR_INTERNAL);
            assert!(last_error().contains("injected"));
            let mut rank = -1;
            assert_eq!(gpulmt_rank(ctx, &mut rank), GPULMT_ERR_INTERNAL);
            assert!(last_error().contains("unusable"), "{}", last_error());
            assert_eq!(gpulmt_finalize(ctx), GPULMT_ERR_INTERNAL);
            assert!(last_error().contains("released without finalizing"), "{}", last_error());
        }
    }

    #[test]
    fn one_rank_job_through_the_abi() {
        let mut ctx = null_mut();
        // SAFETY: every pointer handed over is valid for the call; buffers outlive their
        // requests (each is waited for before the buffer goes).
        unsafe {
            assert_eq!(gpulmt_init(&mut ctx), GPULMT_SUCCESS, "{}", last_error());
            let (mut rank, mut size) = (-1, -1);
            assert_eq!(gpulmt_rank(ctx, &mut rank), GPULMT_SUCCESS);
            assert_eq!(gpulmt_size(ctx, &mut size), GPULMT_SUCCESS);
            assert_eq!((rank, size), (0, 1));

            // A message to self, received with wildcards.
            let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let mut got = vec![0u8; data.len()];
            let (mut rreq, mut sreq) = (GPULMT_REQUEST_NULL, GPULMT_REQUEST_NULL);
            let rbuf = got.as_mut_ptr().cast::<c_void>();
            assert_eq!(gpulmt_irecv(ctx, rbuf, got.len(), GPULMT_ANY_SOURCE, GPULMT_ANY_TAG, &mut rreq), 0);
            assert_eq!(gpulmt_isend(ctx, data.as_ptr().cast(), data.len(), 0, 42, &mut sreq), 0);
            assert_ne!(rreq, GPULMT_REQUEST_NULL);
            let mut st = gpulmt_status::empty(-1);
            assert_eq!(gpulmt_wait(ctx, &mut rreq, &mut st), GPULMT_SUCCESS, "{}", last_error());
            assert_eq!(rreq, GPULMT_REQUEST_NULL);
            assert_eq!(st, gpulmt_status { source: 0, tag: 42, count: data.len(), error: 0 });
            let mut flag = 0;
            while flag == 0 {
                assert_eq!(gpulmt_test(ctx, &mut sreq, &mut flag, null_mut()), GPULMT_SUCCESS);
            }
            assert!(got == data);
            // A completed (null) request completes again at once.
            assert_eq!(gpulmt_test(ctx, &mut sreq, &mut flag, &mut st), GPULMT_SUCCESS);
            assert_eq!((flag, st.source, st.error), (1, GPULMT_ANY_SOURCE, 0));
            // An unknown request is an error about the call and stays as it was.
            let mut bogus: gpulmt_request = 0xdead_0000_0001;
            assert_eq!(gpulmt_test(ctx, &mut bogus, &mut flag, null_mut()), GPULMT_ERR_INVALID_ARGUMENT);
            assert_eq!((bogus, flag), (0xdead_0000_0001, 0));

            // Truncation: the request completes with its error, in the status too.
            let small = [0u8; 10];
            let mut small_buf = small;
            assert_eq!(gpulmt_irecv(ctx, small_buf.as_mut_ptr().cast(), 10, 0, 7, &mut rreq), 0);
            assert_eq!(gpulmt_isend(ctx, data.as_ptr().cast(), 100, 0, 7, &mut sreq), 0);
            assert_eq!(gpulmt_wait(ctx, &mut rreq, &mut st), GPULMT_ERR_TRUNCATED);
            assert_eq!((rreq, st.error), (GPULMT_REQUEST_NULL, GPULMT_ERR_TRUNCATED));
            assert!(last_error().contains("truncated"), "{}", last_error());
            assert_eq!(gpulmt_wait(ctx, &mut sreq, null_mut()), GPULMT_SUCCESS);

            // Bad arguments name themselves.
            assert_eq!(gpulmt_isend(ctx, data.as_ptr().cast(), 1, 5, 0, &mut sreq), GPULMT_ERR_BAD_RANK);
            assert_eq!(sreq, GPULMT_REQUEST_NULL);
            assert_eq!(gpulmt_isend(ctx, data.as_ptr().cast(), 1, -3, 0, &mut sreq), GPULMT_ERR_BAD_RANK);
            assert_eq!(
                gpulmt_isend(ctx, data.as_ptr().cast(), 1, 0, GPULMT_TAG_UB, &mut sreq),
                GPULMT_ERR_INVALID_ARGUMENT
            );
            assert_eq!(gpulmt_isend(ctx, null(), 1, 0, 0, &mut sreq), GPULMT_ERR_INVALID_ARGUMENT);
            assert!(last_error().contains("buf is NULL"), "{}", last_error());

            // Device memory: fill, read back, two-phase free.
            let mut dev = null_mut();
            assert_eq!(gpulmt_mem_alloc(ctx, 4096, &mut dev), GPULMT_SUCCESS, "{}", last_error());
            assert!(!dev.is_null());
            assert_eq!(gpulmt_copy(ctx, dev, data.as_ptr().cast(), 4096), GPULMT_SUCCESS);
            let mut back = vec![0u8; 4096];
            assert_eq!(gpulmt_copy(ctx, back.as_mut_ptr().cast(), dev, 4096), GPULMT_SUCCESS);
            assert!(back[..] == data[..4096]);
            assert_eq!(gpulmt_mem_free(ctx, dev), GPULMT_SUCCESS);
            assert_eq!(gpulmt_mem_free(ctx, dev), GPULMT_ERR_FREE);
            assert_eq!(gpulmt_mem_free(ctx, back.as_mut_ptr().cast()), GPULMT_ERR_FREE);
            assert_eq!(gpulmt_mem_free_commit(ctx), GPULMT_SUCCESS, "{}", last_error());

            // The plugin calls need a plugin context.
            let (mut cookie, mut n) = ([0u8; GPULMT_COOKIE_MAX], GPULMT_COOKIE_MAX);
            let rc =
                gpulmt_lmt_initiate(ctx, data.as_ptr().cast(), 1, 0, &mut sreq, cookie.as_mut_ptr().cast(), &mut n);
            assert_eq!(rc, GPULMT_ERR_UNSUPPORTED);
            assert!(last_error().contains("gpulmt_plugin_init"));
            assert_eq!(gpulmt_peer_terminated(ctx, 0), GPULMT_ERR_INVALID_ARGUMENT);

            let mut stats = gpulmt_stats::default();
            let mut did = -1;
            assert_eq!(gpulmt_progress(ctx, &mut did), GPULMT_SUCCESS);
            assert!(did == 0 || did == 1);
            assert_eq!(gpulmt_get_stats(ctx, &mut stats), GPULMT_SUCCESS);
            assert!(stats.protocols[GPULMT_PROTOCOL_SELF] >= 1, "{stats:?}");
            assert_eq!(gpulmt_barrier(ctx), GPULMT_SUCCESS);
            assert_eq!(gpulmt_finalize(ctx), GPULMT_SUCCESS, "{}", last_error());
        }
    }
}
