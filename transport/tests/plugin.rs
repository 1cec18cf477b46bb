//! The LMT plugin face: a host that owns matching and its own control channel
//! (here: in-process channels between two threads, each a rank) moves device
//! buffers through every protocol with gpulmt, carrying the RTS/CTS cookies itself,
//! or (`init_plugin_rings`) only the RTS, gpulmt's rings carrying the rest.

use std::sync::mpsc;

use gpulmt::config::{Config, DeviceChoice};
use gpulmt::{Context, JobInfo};

/// What the host's own control channel carries between its two ranks.
enum HostMsg {
    /// The host's RTS with gpulmt's cookie piggybacked.
    Rts(Vec<u8>),
    /// The host's CTS with gpulmt's cookie (empty for GET).
    Cts(Vec<u8>),
    /// Any other gpulmt blob.
    Blob(Vec<u8>),
    /// The host's own goodbye: this rank is done.
    Bye,
}

fn rank(
    job: &str,
    me: u32,
    protocol: &str,
    rings: bool,
    tx: mpsc::Sender<HostMsg>,
    rx: mpsc::Receiver<HostMsg>,
    len: usize,
) {
    let mut cfg = Config::from_lookup(|k| match k {
        "GPULMT_PROTOCOL" => Some(protocol.to_string()),
        _ => None,
    })
    .unwrap();
    cfg.device = DeviceChoice::Sim;
    cfg.gpu = Some(me);
    let info = JobInfo { job: job.to_string(), rank: me, size: 2 };
    let blob_tx = tx.clone();
    let mut ctx = if rings {
        Context::init_plugin_rings(cfg, info).unwrap()
    } else {
        Context::init_plugin(cfg, info, Box::new(move |_to, b| blob_tx.send(HostMsg::Blob(b.to_vec())).unwrap()))
            .unwrap()
    };
    let buf = ctx.mem_alloc(len + 64).unwrap();
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    let peer = 1 - me;
    let req = if me == 0 {
        // SAFETY: `buf + 64` starts `len` bytes of this rank's allocation of `len + 64`, which no
        // transfer uses yet; the source is `data`.
        unsafe { ctx.copy_sync(buf + 64, data.as_ptr() as usize, len) }.unwrap();
        // SAFETY: the allocation outlives the request, which is waited for below, and nothing
        // writes it meanwhile.
        let (req, rts) = unsafe { ctx.lmt_initiate((buf + 64) as *const u8, len, peer).unwrap() };
        tx.send(HostMsg::Rts(rts)).unwrap();
        req
    } else {
        let rts = loop {
            match rx.recv().unwrap() {
                HostMsg::Rts(c) => break c,
                HostMsg::Blob(b) => ctx.deliver(peer, &b).unwrap(),
                HostMsg::Cts(_) | HostMsg::Bye => panic!("CTS or goodbye before RTS"),
            }
        };
        // SAFETY: the allocation outlives the request, which is waited for below, and nothing
        // else uses it meanwhile.
        let (req, cts) = unsafe { ctx.lmt_start_recv(peer, &rts, (buf + 64) as *mut u8, len).unwrap() };
        if rings {
            assert!(cts.is_none(), "{protocol}: with the rings the CTS takes a ring, not the host");
        }
        tx.send(HostMsg::Cts(cts.unwrap_or_default())).unwrap();
        req
    };
    let mut bye = false;
    let status = loop {
        while let Ok(m) = rx.try_recv() {
            match m {
                HostMsg::Cts(c) if !c.is_empty() => ctx.lmt_handle_cts(peer, &c).unwrap(),
                HostMsg::Cts(_) => {}
                HostMsg::Blob(b) => {
                    assert!(!rings, "{protocol}: a blob reached the host's channel with the rings");
                    ctx.deliver(peer, &b).unwrap()
                }
                HostMsg::Rts(_) => panic!("unexpected RTS"),
                HostMsg::Bye => bye = true,
            }
        }
        if let Some(s) = ctx.test(&req).unwrap() {
            break s;
        }
    };
    assert_eq!(status.len, len as u64);
    if me == 1 {
        let mut got = vec![0u8; len];
        // SAFETY: `len` bytes of this rank's allocation, whose receive has completed, into `got`.
        unsafe { ctx.copy_sync(got.as_mut_ptr() as usize, buf + 64, len) }.unwrap();
        assert!(got == data, "{protocol}: data mismatch");
        let s = ctx.stats();
        let want = match protocol {
            "put" => 1,
            "coop" => 2,
            "shm" => 3,
            _ => 0,
        };
        assert_eq!(s.protocols[want], 1, "{protocol}: {:?}", s.protocols);
    }
    // Packets still waiting for ring room reach the peer before we stop progressing.
    while ctx.control_pending() {
        ctx.progress().unwrap();
    }
    // The host's own goodbye: both ranks finished before either tears down.
    tx.send(HostMsg::Bye).ok();
    while !bye {
        match rx.recv() {
            Ok(HostMsg::Bye) | Err(_) => bye = true,
            Ok(HostMsg::Blob(b)) => ctx.deliver(peer, &b).unwrap(),
            Ok(_) => {}
        }
    }
}

#[test]
fn host_driven_lmt_moves_device_buffers_through_every_protocol() {
    run_every_protocol(false);
}

#[test]
fn host_matched_lmt_with_gpulmts_rings_moves_device_buffers_through_every_protocol() {
    run_every_protocol(true);
}

fn run_every_protocol(rings: bool) {
    for (i, protocol) in ["get", "put", "coop", "shm"].into_iter().enumerate() {
        let job = format!("plugintest{}x{rings}{i}", std::process::id());
        let (to1, from0) = mpsc::channel();
        let (to0, from1) = mpsc::channel();
        let len = 3 << 20;
        let t0 = std::thread::spawn({
            let job = job.clone();
            move || rank(&job, 0, protocol, rings, to1, from1, len)
        });
        let t1 = std::thread::spawn({
            let job = job.clone();
            move || rank(&job, 1, protocol, rings, to0, from0, len)
        });
        t0.join().unwrap();
        t1.join().unwrap();
        gpulmt::shm::object::remove_job_objects(&job);
    }
}
