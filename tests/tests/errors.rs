//! Error paths: truncation, zero-length messages, bad ranks and tags, cancel, iprobe,
//! messages to oneself, and wildcard receives next to the library's own barrier.

use gpulmt_tests::Job;

const CHECK: &str = env!("CARGO_BIN_EXE_gpulmt-check");

fn truncate(place: &str) {
    let out = Job::new(CHECK, 2, &["truncate", "--placement", place]).timeout_s(30).run();
    out.assert_ok(2, "truncate");
}

#[test]
fn truncation_host_to_host() {
    truncate("H H");
}

#[test]
fn truncation_device_to_device() {
    truncate("D D");
    // PUT writes into the receiver's buffer: it must never be offered a short one.
    let out = Job::new(CHECK, 2, &["truncate", "--placement", "D D"]).env("GPULMT_PROTOCOL", "put").timeout_s(30).run();
    out.assert_ok(2, "truncate");
    let out =
        Job::new(CHECK, 2, &["truncate", "--placement", "D D"]).env("GPULMT_PROTOCOL", "coop").timeout_s(30).run();
    out.assert_ok(2, "truncate");
}

#[test]
fn truncation_mixed_memories() {
    truncate("H D");
    truncate("D H");
}

#[test]
fn zero_length_and_bad_arguments() {
    let out = Job::new(CHECK, 2, &["zero-and-bad"]).timeout_s(30).run();
    out.assert_ok(2, "zero-and-bad");
    // The rejections were really exercised (and named the problem).
    for what in
        ["isend to rank == size", "isend with tag -1", "irecv with tag -7", "isend of a device range past the end"]
    {
        assert!(
            out.stdout.lines().filter(|l| l.contains("rejected") && l.contains(what)).count() == 2,
            "both ranks must reject `{what}`\n{}",
            out.dump()
        );
    }
}

#[test]
fn messages_to_self() {
    for n in [1, 2] {
        let out = Job::new(CHECK, n, &["selfsend"]).timeout_s(30).run();
        out.assert_ok(n, "selfsend");
        for r in 0..n {
            let c = out.protocols(r);
            assert_eq!(c["self"], 5, "rank {r}: every rendezvous to oneself is a local copy\n{}", out.dump());
            assert_eq!(c.values().sum::<u64>(), 5, "rank {r}\n{}", out.dump());
        }
    }
}

/// Forged control packets written straight into a rank's ring: counted as violations,
/// receives matched by lying RTSs fail without a byte written (checked by the rank
/// program), and the pair keeps working.
#[test]
fn forged_control_packets_are_rejected() {
    let out = Job::new(CHECK, 2, &["forged"]).timeout_s(30).run();
    out.assert_ok(2, "forged");
    let v = out.counters(0, "forged")["violations"];
    assert!(v >= 12, "only {v} violations\n{}", out.dump());
    assert!(
        out.stdout.contains("rank=0 forged: an RTS whose region claims more than its allocation: transfer:"),
        "{}",
        out.dump()
    );
    assert!(out.stdout.contains("rank=0 forged: an RTS with a forged handle: transfer:"), "{}", out.dump());
}

/// A bad setting fails every rank at init, naming the variable; nothing is left behind.
#[test]
fn invalid_configuration_fails_at_init() {
    for (k, v) in
        [("GPULMT_PROTOCOL", "fast"), ("GPULMT_SIM_PEER", "0-7"), ("GPULMT_GPU", "9"), ("GPULMT_RING_SLOTS", "3")]
    {
        let out = Job::new(CHECK, 2, &["zero-and-bad"]).env(k, v).timeout_s(30).run();
        assert_eq!(out.code, Some(1), "{k}={v} must fail the job\n{}", out.dump());
        assert!(out.stderr.contains("FAIL: Context::init"), "{}", out.dump());
        let named = if k == "GPULMT_GPU" { "device 9" } else { k };
        assert!(out.stderr.contains(named), "the error must name {named}\n{}", out.dump());
    }
}

/// MPI semantics: an ANY_SOURCE/ANY_TAG receive posted before a barrier receives the
/// user's message, not one of the zero-byte messages of the library's barrier (which
/// use a reserved tag). Regression test: before commit 00091e8 the wildcard receive
/// completed with tag i32::MAX-1 and length 0, and the barrier then waited for the
/// message it had lost.
#[test]
fn wildcard_receive_does_not_steal_barrier_messages() {
    let out = Job::new(CHECK, 2, &["wildcard-barrier"]).timeout_s(30).run();
    out.assert_ok(2, "wildcard-barrier");
}
