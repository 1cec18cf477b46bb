//! Two jobs with one `GPULMT_JOB` (issue 46): once a job is marked contested (a process
//! of the other was refused a place in it), its running ranks fail their transfers with
//! every local peer within a liveness period, rather than run on with strangers.
//! (The refusals that mark it run in `tests/tests/reliability.rs`, in processes.)

use std::time::{Duration, Instant};

use gpulmt::config::{Config, DeviceChoice};
use gpulmt::{Context, JobInfo, Topology};

fn sim_config() -> Config {
    let mut cfg = Config::from_lookup(|_| None).unwrap();
    cfg.device = DeviceChoice::Sim;
    cfg
}

fn rank(job: &str, rank: u32) -> Context {
    let info = JobInfo { job: job.to_owned(), rank, size: 2 };
    Context::init_world(sim_config(), info, Topology::single_node(rank, 2), None).unwrap()
}

#[test]
fn a_job_marked_contested_while_running_fails_its_transfers_with_every_peer() {
    let job = format!("contest{}", std::process::id());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let peer = {
        let job = job.clone();
        std::thread::spawn(move || {
            let mut ctx = rank(&job, 1);
            let mut got = vec![0u8; 1 << 20];
            // SAFETY: `got` outlives the request, which is waited for below.
            let r = unsafe { ctx.irecv(got.as_mut_ptr(), got.len(), Some(0), Some(7)) }.unwrap();
            ready_tx.send(()).unwrap();
            let t0 = Instant::now();
            let waited = ctx.wait(r);
            (waited.map(|_| ()).map_err(|e| e.to_string()), t0.elapsed(), ctx)
        })
    };
    let mut ctx = rank(&job, 0);
    ready_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    // A rendezvous send to a receive posted with another tag: it waits for a match.
    let data = vec![5u8; 1 << 20];
    // SAFETY: `data` outlives the request, which is waited for below.
    let s = unsafe { ctx.isend(data.as_ptr(), data.len(), 1, 8) }.unwrap();
    ctx.job_segment().mark_contested(4242);
    let t0 = Instant::now();
    let sent = ctx.wait(s);
    let took = t0.elapsed();
    let (received, recv_took, other) = peer.join().unwrap();
    let e = sent.expect_err("the send to a peer of a contested job must fail");
    assert!(e.to_string().contains("failed"), "{e}");
    assert!(took < Duration::from_secs(10), "the send failed only after {took:?}");
    let e = received.expect_err("the receive from a peer of a contested job must fail");
    assert!(e.contains("failed"), "{e}");
    assert!(recv_took < Duration::from_secs(10), "the receive failed only after {recv_took:?}");
    // Both can still leave (finalize's barrier fails on the contested job, within bounds).
    let t0 = Instant::now();
    let ends = std::thread::spawn(move || other.finalize().map_err(|e| e.to_string()));
    let mine = ctx.finalize().map_err(|e| e.to_string());
    let theirs = ends.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30), "finalize took {:?}", t0.elapsed());
    for r in [mine, theirs] {
        if let Err(e) = r {
            assert!(e.contains("same GPULMT_JOB") || e.contains("failed"), "{e}");
        }
    }
}
