//! Every kind of device memory an application allocates (docs/memory-kinds.md) moves, on
//! sim: `gpulmt-check pingpong` with each rank's buffers of a kind (a pool with and without
//! a shareable handle type, VMM chunks with and without one, three chunks behind one range,
//! managed memory) x every protocol x sizes from 0 to 64 MiB + 3, every byte and guard
//! checked by the ranks; and the path each message took checked against its kind: memory
//! no peer can map is never read through a mapping (no GET or COOPERATE from it: staged,
//! and counted so, or pushed by its own engine into a buffer the receiver offered), and
//! memory that crosses by IPC (legacy, shareable pool and VMM) takes a peer mapping under
//! `auto`.

use gpulmt_tests::{Job, JobOutput};

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-check");

const KINDS: [&str; 7] = ["legacy", "pool", "pool-ipc", "vmm", "vmm-ipc", "vmm-ipc:3", "managed"];
/// The brief's sizes: empty, eager, just past a page of 64 KiB, 4 MiB, 64 MiB + 3.
const FULL: &str = "0,8,65537,4194304,67108867";
const SMALL: &str = "0,8,65537,4194304";

/// Whether a peer maps a one-chunk buffer of this kind (a buffer over several VMM chunks is
/// staged, so `vmm-ipc:3` is left out of the rules below).
fn mappable(kind: &str) -> Option<bool> {
    match kind {
        "legacy" | "pool-ipc" | "vmm-ipc" => Some(true),
        "pool" | "vmm" | "managed" => Some(false),
        _ => None,
    }
}

fn pingpong(k0: &str, k1: &str, protocol: &str, sizes: &str) -> JobOutput {
    let args = ["pingpong", "--placement", "D D", "--sizes", sizes, "--mem0", k0, "--mem1", k1];
    // Shareable pools cross by IPC only when asked (GPULMT_POOL_IPC, off by default).
    let out = Job::new(CHECK, 2, &args).env("GPULMT_PROTOCOL", protocol).env("GPULMT_POOL_IPC", "1").run();
    out.assert_ok(2, "pingpong");
    // Rank 1 receives rank 0's messages and rank 0 rank 1's: each rank's protocol counts are
    // the rendezvous it received, chosen by the kind of the other's send buffer.
    for (receiver, sender_kind, sender) in [(1, k0, 0), (0, k1, 1)] {
        let p = out.protocols(receiver);
        let total: u64 = p.values().sum();
        assert!(total > 0, "rank {receiver} received no rendezvous\n{}", out.dump());
        let staged = out.counters(sender, "kinds")["staged"];
        match mappable(sender_kind) {
            Some(false) => {
                // Nothing maps it: no GET or COOPERATE reads it. A PUT may, where the
                // receiver offered its own mapped buffer first (RTR): the sender's engine
                // then reads its own memory.
                let mapped = p["get"] + p["coop"];
                assert_eq!(mapped, 0, "rank {receiver} mapped rank {sender}'s {sender_kind} memory\n{}", out.dump());
                assert!(p["shm"] > 0, "rank {sender}'s {sender_kind} memory was never staged\n{}", out.dump());
                assert!(staged > 0, "rank {sender} counted no staged buffer of {sender_kind}\n{}", out.dump());
            }
            Some(true) if protocol == "auto" && mappable(if sender == 0 { k1 } else { k0 }) == Some(true) => {
                assert!(p["shm"] < total, "rank {sender}'s {sender_kind} memory never crossed by IPC\n{}", out.dump());
                assert_eq!(staged, 0, "rank {sender} staged {sender_kind} memory\n{}", out.dump());
            }
            _ => {}
        }
    }
    out
}

macro_rules! kind_tests {
    ($($name:ident: $kind:literal;)*) => {
        $(
            /// This kind on both ranks, every protocol (FULL sizes under auto and shm).
            #[test]
            fn $name() {
                for protocol in ["auto", "get", "put", "coop", "shm"] {
                    let sizes = if matches!(protocol, "auto" | "shm") { FULL } else { SMALL };
                    pingpong($kind, $kind, protocol, sizes);
                }
            }
        )*
    };
}

kind_tests! {
    legacy_every_protocol: "legacy";
    pool_every_protocol: "pool";
    shareable_pool_every_protocol: "pool-ipc";
    vmm_every_protocol: "vmm";
    shareable_vmm_every_protocol: "vmm-ipc";
    vmm_of_three_chunks_every_protocol: "vmm-ipc:3";
    managed_every_protocol: "managed";
}

/// By default a shareable pool's memory is staged, never mapped (GPULMT_POOL_IPC=0).
#[test]
fn shareable_pool_memory_is_staged_by_default() {
    let args = ["pingpong", "--placement", "D D", "--sizes", SMALL, "--mem0", "pool-ipc", "--mem1", "pool-ipc"];
    let out = Job::new(CHECK, 2, &args).run();
    out.assert_ok(2, "pingpong");
    for r in 0..2 {
        let p = out.protocols(r);
        assert_eq!(p["get"] + p["coop"], 0, "rank {r} mapped a pool it should have staged\n{}", out.dump());
        assert!(out.counters(r, "kinds")["staged"] > 0, "rank {r} staged nothing\n{}", out.dump());
    }
}

/// A pool on one side, legacy (or another kind) on the other, both ways.
#[test]
fn mixed_pairs() {
    for (a, b) in [("pool-ipc", "legacy"), ("pool", "legacy"), ("managed", "pool-ipc"), ("vmm-ipc:3", "vmm-ipc")] {
        pingpong(a, b, "auto", SMALL);
        pingpong(b, a, "auto", SMALL);
    }
}

/// Three rounds of free and reallocate at one size, a new pattern each round: a pool puts
/// each round's buffer at the last one's address (with a new buffer id), and no peer may
/// read through a mapping of an old round.
#[test]
fn freed_and_reallocated_pool_memory_is_never_served_stale() {
    for kind in ["pool-ipc", "pool", "vmm-ipc"] {
        let out = pingpong(kind, kind, "auto", "4194304,4194304,4194304,65537,65537,65537");
        if kind == "pool-ipc" {
            // Each round's buffer is new to the peer: opened again, never a hit of an old one.
            let c = out.cache(1);
            assert!(c["opens"] >= 6, "rank 1 opened {} mappings for 6 new buffers\n{}", c["opens"], out.dump());
        }
    }
}

/// Fall back, never fail: where the receiver cannot open a peer's buffer at all (the sim
/// refuses every open, as a driver refuses an import), each kind that would cross by IPC
/// still moves, byte-checked, by shared-memory staging; each rank reports the buffers it
/// could not map, and nothing is mapped.
#[test]
fn buffers_a_peer_cannot_open_move_by_staging() {
    for kind in ["legacy", "pool-ipc", "vmm-ipc"] {
        for protocol in ["auto", "get", "put", "coop"] {
            let args = ["pingpong", "--placement", "D D", "--sizes", SMALL, "--mem0", kind, "--mem1", kind];
            let out = Job::new(CHECK, 2, &args)
                .env("GPULMT_PROTOCOL", protocol)
                .env("GPULMT_POOL_IPC", "1")
                .env("GPULMT_SIM_REFUSE_OPENS", "1")
                .run();
            out.assert_ok(2, "pingpong");
            // The rank that failed first remembers the buffer, which both directions use, so
            // the other may never try it: the fallbacks are counted by one rank or both.
            let fallbacks: u64 = (0..2).map(|r| out.counters(r, "kinds")["fallbacks"]).sum();
            assert!(fallbacks > 0, "{kind}, {protocol}: no fallback counted\n{}", out.dump());
            for r in 0..2 {
                let what = format!("rank {r}, {kind}, {protocol}\n{}", out.dump());
                assert!(out.protocols(r)["shm"] > 0, "{what}: nothing staged");
                assert_eq!(out.cache(r)["opens"], 0, "{what}: a mapping opened");
            }
        }
    }
}

/// Every kind from 0 bytes to 64 MiB + 3 between kinds, every device buffer at an odd
/// offset (not 8-byte aligned), so a pointer into the middle of an allocation works.
#[test]
fn buffers_inside_allocations_at_odd_offsets() {
    for kind in KINDS {
        let args =
            ["pingpong", "--placement", "D D", "--sizes", SMALL, "--mem0", kind, "--mem1", kind, "--offset", "3"];
        Job::new(CHECK, 2, &args).run().assert_ok(2, "pingpong");
    }
}
