//! Every rendezvous protocol x buffer placement: data checked byte for byte (guards
//! around both buffers) by `gpulmt-check pingpong`, and the protocol counts the ranks
//! print checked against what the policy must choose.

use gpulmt_tests::{expected_pingpong, placement, rtr_merged, sizes, Job, Setup};

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-check");

/// The sizes of the brief, 64 MiB included.
const FULL: &str = "0,1,7,4095,4096,65537,4194304,67108864";
/// The same without 64 MiB, for most combinations.
const SMALL: &str = "0,1,7,4095,4096,65537,4194304";

fn pingpong(protocol: &str, place: &str, list: &str, env: &[(&str, &str)], setup: Setup, offset: &str) {
    let out = Job::new(CHECK, 2, &["pingpong", "--placement", place, "--sizes", list, "--offset", offset])
        .env("GPULMT_PROTOCOL", protocol)
        .envs(env)
        .run();
    out.assert_ok(2, "pingpong");
    let (p0, p1) = placement(place);
    let expect = expected_pingpong(&Setup { protocol, ..setup }, p0, p1, &sizes(list));
    for (r, e) in expect.iter().enumerate() {
        let got = out.protocols(r);
        if protocol == "auto" {
            // RTR offers may turn GETs into the sender's pushes, never anything else.
            assert_eq!(
                rtr_merged(&got),
                rtr_merged(e),
                "rank {r}: protocol counts differ from the policy's\n{}",
                out.dump()
            );
            assert!(got["put"] >= e["put"], "rank {r}: fewer pushes than the policy's\n{}", out.dump());
        } else {
            assert_eq!(&got, e, "rank {r}: protocol counts differ from the policy's\n{}", out.dump());
        }
    }
    // The expectation itself is not vacuous: some rendezvous ran on each rank, and for
    // device-to-device placements the forced protocol is among them.
    for r in 0..2 {
        let total: u64 = out.protocols(r).values().sum();
        assert!(total > 0, "rank {r} ran no rendezvous at all\n{}", out.dump());
    }
    if place == "D D" && setup.peer_access && protocol != "auto" {
        let forced = out.protocols(1)[protocol];
        assert!(forced > 0, "GPULMT_PROTOCOL={protocol} never ran\n{}", out.dump());
    }
    if place != "D D" {
        for r in 0..2 {
            let c = out.protocols(r);
            assert_eq!(
                c["shm"],
                c.values().sum::<u64>(),
                "rank {r}: host memory must move through shm\n{}",
                out.dump()
            );
        }
    }
}

macro_rules! matrix {
    ($($name:ident: $proto:literal, $place:literal, $sizes:expr;)*) => {
        $(
            #[test]
            fn $name() {
                pingpong($proto, $place, $sizes, &[], Setup::default(), "4096");
            }
        )*
    };
}

matrix! {
    auto_dd: "auto", "D D", FULL;
    auto_dh: "auto", "D H", FULL;
    auto_hd: "auto", "H D", FULL;
    auto_hh: "auto", "H H", FULL;
    get_dd: "get", "D D", FULL;
    get_dh: "get", "D H", SMALL;
    get_hd: "get", "H D", SMALL;
    get_hh: "get", "H H", SMALL;
    put_dd: "put", "D D", FULL;
    put_dh: "put", "D H", SMALL;
    put_hd: "put", "H D", SMALL;
    put_hh: "put", "H H", SMALL;
    coop_dd: "coop", "D D", FULL;
    coop_dh: "coop", "D H", SMALL;
    coop_hd: "coop", "H D", SMALL;
    coop_hh: "coop", "H H", SMALL;
    shm_dd: "shm", "D D", FULL;
    shm_dh: "shm", "D H", SMALL;
    shm_hd: "shm", "H D", SMALL;
    shm_hh: "shm", "H H", SMALL;
}

/// Without peer access between the two devices, device-to-device messages fall back
/// to SHM whatever protocol is asked for.
#[test]
fn no_peer_access_forces_shm_for_device_to_device() {
    let setup = Setup { peer_access: false, ..Setup::default() };
    for proto in ["auto", "get", "put", "coop"] {
        pingpong(proto, "D D", SMALL, &[("GPULMT_SIM_PEER", "none")], setup, "4096");
    }
}

/// On one device peer access is not needed: GET even with GPULMT_SIM_PEER=none.
#[test]
fn one_device_uses_get_without_peer_access() {
    let setup = Setup { peer_access: false, same_device: true, ..Setup::default() };
    pingpong("auto", "D D", SMALL, &[("GPULMT_SIM_DEVICES", "1"), ("GPULMT_SIM_PEER", "none")], setup, "4096");
}

/// The device eager path: device messages up to 8 KiB are staged through the host and
/// travel inline (no rendezvous for them).
#[test]
fn device_eager_limit() {
    let setup = Setup { device_eager_limit: 8192, ..Setup::default() };
    let env = [("GPULMT_DEVICE_EAGER_LIMIT", "8192")];
    pingpong("auto", "D D", "0,1,7,4095,4096,8192,8193,65537", &env, setup, "4096");
    pingpong("auto", "D H", "0,1,7,4095,4096,8192,8193,65537", &env, setup, "4096");
    pingpong("put", "D D", "0,1,8192,8193", &env, setup, "4096");
}

/// Buffers at odd offsets (not even 8-byte aligned) in both memories.
#[test]
fn unaligned_buffers() {
    pingpong("coop", "D D", SMALL, &[], Setup::default(), "3");
    pingpong("put", "D D", "1,4097,65537", &[], Setup::default(), "1");
    pingpong("auto", "H D", SMALL, &[], Setup::default(), "5");
    pingpong("auto", "H H", SMALL, &[], Setup::default(), "7");
}

/// A small SHM pipeline (4 KiB chunks, depth 2) wraps its staging ring many times.
#[test]
fn shm_small_chunks_and_shallow_pipeline() {
    let env = [("GPULMT_CHUNK_SIZE", "4K"), ("GPULMT_PIPELINE_DEPTH", "2")];
    pingpong("shm", "D D", "1,4095,4096,4097,65537,1048577", &env, Setup::default(), "4096");
    pingpong("auto", "H D", "8193,65537,1048577", &env, Setup::default(), "4096");
}

/// Copies split in pieces over several lanes (GET, PUT and COOPERATE).
#[test]
fn split_copies_over_lanes() {
    let env = [("GPULMT_COPY_SPLIT", "64K"), ("GPULMT_LANES", "3")];
    for proto in ["get", "put", "coop"] {
        pingpong(proto, "D D", "1,65537,4194304,4194305", &env, Setup::default(), "4096");
    }
}

/// `GPULMT_COPY_SERVER_MAX` names a CUDA feature; on the sim (no resident kernels) it is
/// reported as ignored and every copy still runs, checked byte for byte.
#[test]
fn copy_server_setting_on_the_sim_is_reported_and_harmless() {
    let out = Job::new(CHECK, 2, &["pingpong", "--placement", "D D", "--sizes", "1,4096,65537", "--offset", "3"])
        .envs(&[("GPULMT_COPY_SERVER_MAX", "64K"), ("GPULMT_LOG", "gpulmt=info")])
        .run();
    out.assert_ok(2, "pingpong");
    assert_eq!(
        out.stderr.matches("GPULMT_COPY_SERVER_MAX ignored: this backend has no copy server").count(),
        2,
        "each rank says why\n{}",
        out.dump()
    );
}
