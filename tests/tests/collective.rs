//! Jobs of more than two ranks: all-to-all with ANY_SOURCE receives, ranks sharing one
//! device, two-phase free across 4 ranks, and the handle cache under a window of
//! concurrent sends.

use gpulmt_tests::{check, Job, JobOutput};

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-check");

fn sum(out: &JobOutput, n: usize, section: &str, key: &str) -> u64 {
    (0..n).map(|r| out.counters(r, section)[key]).sum()
}

fn alltoall_received(out: &JobOutput, r: usize) -> u64 {
    out.counters(r, "alltoall")["received"]
}

#[test]
fn alltoall_4_ranks_any_source_mixed_sizes_and_memories() {
    let iters = 8;
    let out = Job::new(CHECK, 4, &["alltoall", "--iters", &iters.to_string()]).timeout_s(30).run();
    out.assert_ok(4, "alltoall");
    for r in 0..4 {
        assert_eq!(alltoall_received(&out, r), iters * 3, "rank {r}\n{}", out.dump());
    }
    // The mix really covered device-to-device (GET) and host (SHM) rendezvous.
    check(sum(&out, 4, "protocols", "get") > 0, &out, "no GET rendezvous in the mix");
    check(sum(&out, 4, "protocols", "shm") > 0, &out, "no SHM rendezvous in the mix");
}

/// More devices and ranks than the 2-GPU host has, with a mixed peer topology (pairs
/// of devices peer-accessible, other pairs not): every pair of ranks exchanges, and
/// both the peer (GET/PUT/COOPERATE) and the staged (SHM) paths carry messages.
#[test]
fn alltoall_on_8_and_4_sim_devices_with_mixed_topologies() {
    for (n, peers) in [(8u64, "0-1,2-3,4-5,6-7"), (4, "0-1,1-2")] {
        let devices = n.to_string();
        let out = Job::new(CHECK, n as usize, &["alltoall", "--iters", "4"])
            .envs(&[("GPULMT_SIM_DEVICES", devices.as_str()), ("GPULMT_SIM_PEER", peers)])
            .timeout_s(90)
            .run();
        out.assert_ok(n as usize, "alltoall");
        for r in 0..n as usize {
            assert_eq!(alltoall_received(&out, r), 4 * (n - 1), "rank {r}\n{}", out.dump());
        }
        let peer: u64 = ["get", "put", "coop"].iter().map(|k| sum(&out, n as usize, "protocols", k)).sum();
        check(peer > 0, &out, "no GET/PUT/COOPERATE between peer-accessible devices");
        check(sum(&out, n as usize, "protocols", "shm") > 0, &out, "no SHM between devices without peer access");
    }
}

#[test]
fn alltoall_with_messages_to_self() {
    let out = Job::new(CHECK, 3, &["alltoall", "--iters", "4", "--include-self"]).timeout_s(30).run();
    out.assert_ok(3, "alltoall");
    for r in 0..3 {
        assert_eq!(alltoall_received(&out, r), 4 * 3, "rank {r}\n{}", out.dump());
    }
    check(sum(&out, 3, "protocols", "self") > 0, &out, "no self rendezvous in the mix");
}

/// Two-slot control rings: packets wait in the outbox (backpressure) and still arrive
/// in order.
#[test]
fn alltoall_under_ring_backpressure() {
    let out = Job::new(CHECK, 4, &["alltoall", "--iters", "4"])
        .envs(&[("GPULMT_RING_SLOTS", "2"), ("GPULMT_CHUNK_SIZE", "16K"), ("GPULMT_PIPELINE_DEPTH", "2")])
        .timeout_s(30)
        .run();
    out.assert_ok(4, "alltoall");
    check(sum(&out, 4, "packets", "backpressure") > 0, &out, "two-slot rings never filled up: the test is vacuous");
}

/// Every rank on one sim device: device-to-device messages between processes of one
/// device use GET (one engine copies within the device; RTR offers off, which would
/// turn some into the sender's pushes, as timing has it).
#[test]
fn several_ranks_on_one_device() {
    let out = Job::new(CHECK, 3, &["same-device", "--iters", "2"])
        .env("GPULMT_SIM_DEVICES", "1")
        .env("GPULMT_RTR_PUT_MAX", "0")
        .timeout_s(30)
        .run();
    out.assert_ok(3, "same-device");
    for r in 0..3 {
        let line = out.stdout.lines().find(|l| l.starts_with(&format!("rank={r} pid="))).unwrap_or_default();
        assert!(line.ends_with("device=0 size=3"), "rank {r} not on device 0: {line:?}\n{}", out.dump());
        let c = out.protocols(r);
        assert_eq!((c["get"], c["put"], c["coop"], c["shm"]), (8, 0, 0, 0), "rank {r}\n{}", out.dump());
    }
    check(!out.stdout.contains("device=1"), &out, "a rank was bound to device 1 with GPULMT_SIM_DEVICES=1");
}

#[test]
fn two_phase_free_across_4_ranks() {
    // RTR offers off: the count below is GET's (the receiver maps the sender's buffers).
    let out = Job::new(CHECK, 4, &["free", "--rounds", "3", "--fresh-open"])
        .env("GPULMT_RTR_PUT_MAX", "0")
        .timeout_s(30)
        .run();
    out.assert_ok(4, "free");
    for r in 0..4 {
        let c = out.cache(r);
        // Per round: A, C and the new allocation of the left neighbour.
        assert_eq!(c["opens"], 9, "rank {r}\n{}", out.dump());
        assert_eq!(c["opens"], c["closes"], "rank {r}\n{}", out.dump());
    }
}

/// RTR offers make senders map receive buffers too (whether or not they push into them):
/// the commit closes those as well.
#[test]
fn two_phase_free_with_rtr_offers() {
    let out = Job::new(CHECK, 4, &["free", "--rounds", "3", "--fresh-open"]).timeout_s(30).run();
    out.assert_ok(4, "free");
    for r in 0..4 {
        let c = out.cache(r);
        assert!(c["opens"] >= 9, "rank {r}: at least GET's mappings\n{}", out.dump());
        assert_eq!(c["opens"], c["closes"], "rank {r}\n{}", out.dump());
    }
}

/// PUT maps the receiver's buffers instead; the commit must close those mappings.
#[test]
fn two_phase_free_with_put() {
    let out = Job::new(CHECK, 4, &["free", "--rounds", "2"]).env("GPULMT_PROTOCOL", "put").timeout_s(30).run();
    out.assert_ok(4, "free");
    for r in 0..4 {
        let c = out.cache(r);
        assert!(c["opens"] > 0 && c["opens"] == c["closes"], "rank {r}\n{}", out.dump());
    }
}

fn cache_window(protocol: &str, recv_opens: u64, send_opens: u64, rtr_put_max: &str) -> JobOutput {
    let out = Job::new(
        CHECK,
        2,
        &[
            "cache",
            "--iters",
            "64",
            "--expect-recv-opens",
            &recv_opens.to_string(),
            "--expect-send-opens",
            &send_opens.to_string(),
        ],
    )
    .envs(&[
        ("GPULMT_PROTOCOL", protocol),
        ("GPULMT_SIM_IPC_OPEN_US", "930"),
        ("GPULMT_RTR_PUT_MAX", rtr_put_max),
        // Each message's protocol must be the one asked for: no window spread over both.
        ("GPULMT_BALANCE_MAX", "0"),
    ])
    .timeout_s(30)
    .run();
    out.assert_ok(2, "cache");
    out
}

/// 64 concurrent sends of one device buffer, then 64 from different offsets of the
/// same allocation: the receiver opens the sender's allocation once (GET; RTR offers
/// off, so that every message is a GET).
#[test]
fn handle_cache_opens_each_remote_allocation_once() {
    let out = cache_window("auto", 1, 0, "0");
    let c = out.cache(1);
    assert_eq!((c["opens"], c["misses"], c["hits"]), (1, 1, 127), "{}", out.dump());
    assert_eq!(out.protocols(1)["get"], 128, "{}", out.dump());
}

/// The cache's outcome is in each request's tracing span: of the 128 receives of the
/// window above, the first opened the mapping (and says how long that took), the
/// other 127 were served by the cache.
#[test]
fn handle_cache_outcome_is_recorded_in_request_spans() {
    let out = Job::new(CHECK, 2, &["cache", "--iters", "64", "--expect-recv-opens", "1", "--expect-send-opens", "0"])
        .envs(&[("GPULMT_PROTOCOL", "get"), ("GPULMT_LOG", "gpulmt=debug")])
        .timeout_s(60)
        .run();
    out.assert_ok(2, "cache");
    let completed = |outcome: &str| {
        out.stderr
            .lines()
            .filter(|l| {
                l.contains("recv{") && l.contains(&format!("ipc_cache=\"{outcome}\"")) && l.ends_with(" ok=true")
            })
            .collect::<Vec<_>>()
    };
    let (misses, hits) = (completed("miss"), completed("hit"));
    assert_eq!((misses.len(), hits.len()), (1, 127), "{}", out.dump());
    assert!(misses[0].contains("ipc_open_us="), "the miss records its open time: {}", misses[0]);
    assert!(hits.iter().all(|l| !l.contains("ipc_open_us=")), "{}", out.dump());
}

/// With RTR offers (the default), the first receive of each window is offered: the
/// sender maps the receiver's one allocation once, whether or not it pushes into it.
#[test]
fn handle_cache_with_rtr_offers() {
    let out = cache_window("auto", 1, 1, "64K");
    let p = out.protocols(1);
    assert_eq!(p["get"] + p["put"], 128, "{}", out.dump());
    assert_eq!((out.cache(0)["opens"], out.cache(1)["opens"]), (1, 1), "{}", out.dump());
}

#[test]
fn handle_cache_with_put_and_coop() {
    let out = cache_window("put", 0, 1, "64K");
    assert_eq!(out.protocols(1)["put"], 128, "{}", out.dump());
    let out = cache_window("coop", 1, 1, "64K");
    assert_eq!(out.protocols(1)["coop"], 128, "{}", out.dump());
}

/// With the cache off, mappings close when unused: more than one open, none left.
#[test]
fn handle_cache_disabled_reopens() {
    let out = Job::new(CHECK, 2, &["cache", "--iters", "16"]).env("GPULMT_HANDLE_CACHE", "0").timeout_s(30).run();
    out.assert_ok(2, "cache");
    let c = out.cache(1);
    check(c["opens"] >= 2, &out, "with GPULMT_HANDLE_CACHE=0 the two windows must open the mapping again");
    check(c["opens"] == c["closes"] && c["entries"] == 0, &out, "mappings left open with the cache disabled");
}

fn window(place: &str, same_tag: bool, env: &[(&str, &str)]) -> JobOutput {
    let mut args = vec!["window", "--placement", place, "--count", "12"];
    if same_tag {
        args.push("--same-tag");
    }
    let out = Job::new(CHECK, 2, &args).envs(env).timeout_s(30).run();
    out.assert_ok(2, "window");
    out
}

/// Twelve messages in flight between two ranks, eager and rendezvous mixed: with one
/// tag they match in send order; with distinct tags posted in reverse, the SHM
/// transfers of one pair of ranks queue for its staging ring.
#[test]
fn window_non_overtaking_and_shm_queueing() {
    for same_tag in [true, false] {
        let out = window("H H", same_tag, &[]);
        // Host sender: 7 of the 12 sizes are above the eager limit.
        assert_eq!(out.protocols(1)["shm"], 7, "{}", out.dump());
        let out = window(
            "D D",
            same_tag,
            &[("GPULMT_COOP_MIN", "never"), ("GPULMT_PUT_MIN", "never"), ("GPULMT_BALANCE_MAX", "0")],
        );
        // Device sender: every non-empty message is a rendezvous.
        assert_eq!(out.protocols(1)["get"], 10, "{}", out.dump());
        let out = window("D D", same_tag, &[("GPULMT_SIM_PEER", "none"), ("GPULMT_PIPELINE_DEPTH", "2")]);
        assert_eq!(out.protocols(1)["shm"], 10, "{}", out.dump());
    }
    window("D H", false, &[("GPULMT_CHUNK_SIZE", "256K")]);
    window("H D", true, &[("GPULMT_CHUNK_SIZE", "256K")]);
    window("D D", true, &[("GPULMT_PROTOCOL", "put")]);
}

/// With GPULMT_BALANCE_MAX a window's messages are split between GET and PUT (which
/// one depends on how many are in flight when each RTS is read; the engine's tests pin
/// the alternation down): every byte still lands in the right buffer, each message
/// once.
#[test]
fn balanced_window_moves_every_message_once() {
    for same_tag in [true, false] {
        let env = [("GPULMT_BALANCE_MAX", "2M"), ("GPULMT_COOP_MIN", "never"), ("GPULMT_PUT_MIN", "never")];
        let out = window("D D", same_tag, &env);
        let p = out.protocols(1);
        assert_eq!(p["get"] + p["put"], 10, "{}", out.dump());
        // Both ranks on one device: the window is spread over the two processes too.
        let one_device = [env.as_slice(), &[("GPULMT_SIM_DEVICES", "1")]].concat();
        let out = window("D D", same_tag, &one_device);
        let p = out.protocols(1);
        assert_eq!(p["get"] + p["put"], 10, "{}", out.dump());
    }
}

/// With GPULMT_POLL_NEWEST a long copy queue is asked newest first and the copy found
/// done is reported ahead of older ones. Every message is cut into 4 KiB pieces on one
/// lane, so the queues are long: on the copy-engine threads (which finish when they
/// do) every byte still lands where it belongs, GET, PUT and balanced alike; with
/// copies that land at once the probes must find them.
#[test]
fn polling_newest_first_keeps_every_message_whole() {
    for (copies, protocol) in
        [("thread", "get"), ("thread", "put"), ("thread", "auto"), ("inline", "get"), ("inline", "auto")]
    {
        let env = [
            ("GPULMT_SIM_COPY", copies),
            ("GPULMT_POLL_NEWEST", "1"),
            ("GPULMT_COPY_SPLIT", "4K"),
            ("GPULMT_PROTOCOL", protocol),
            ("GPULMT_BALANCE_MAX", "2M"),
        ];
        let out = window("D D", true, &env);
        let probed: u64 = (0..2).map(|r| out.counters(r, "packets")["probed"]).sum();
        if copies == "inline" {
            assert!(probed > 0, "GPULMT_PROTOCOL={protocol}: no copy found by probing newest first\n{}", out.dump());
        }
    }
}

/// Cache limits: a one-entry cache evicts idle mappings, a one-byte cache keeps none;
/// data and two-phase free stay right.
#[test]
fn handle_cache_limits() {
    let out =
        Job::new(CHECK, 4, &["alltoall", "--iters", "6"]).env("GPULMT_HANDLE_CACHE_ENTRIES", "1").timeout_s(30).run();
    out.assert_ok(4, "alltoall");
    check(sum(&out, 4, "cache", "evictions") > 0, &out, "a one-entry cache never evicted");
    let out = Job::new(CHECK, 4, &["free", "--rounds", "2"]).env("GPULMT_HANDLE_CACHE_BYTES", "1").timeout_s(30).run();
    out.assert_ok(4, "free");
    for r in 0..4 {
        let c = out.cache(r);
        assert_eq!(c["hits"], 0, "rank {r}: nothing may stay cached\n{}", out.dump());
    }
}
