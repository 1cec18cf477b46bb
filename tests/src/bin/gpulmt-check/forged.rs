//! `forged`: rank 1 writes forged control packets straight into its ring to rank 0
//! (garbage, a wrong version, RTSs whose regions lie or carry forged handles, answers to
//! messages that do not exist). Rank 0 counts violations, fails the receives that forged
//! RTSs matched without writing a byte, and keeps working.

use std::time::{Duration, Instant};

use gpulmt::{Context, ProtoError, Request, Tag};

use crate::api::{expect_status, irecv, isend, need_ranks};
use crate::buffers::{pattern, Buf, Kind, GUARD_RECV, GUARD_SEND};
use crate::report::{fail, OrFail, PROMPTLY};

pub const FORGED_LEN: usize = 1 << 20;
pub const FORGED_MSG: u64 = 1 << 40;

pub fn run(ctx: &mut Context) {
    use gpulmt::shm::job::node_id;
    use gpulmt_protocols::wire::{AbortReason, CtsMode, Dir, MemDesc, Packet, Region, WIRE_VERSION};
    need_ranks(ctx, 2, "forged");
    let me = ctx.rank();
    if me >= 2 {
        return;
    }
    // Receives that forged RTSs match (tags 42..=44).
    let tags: [Tag; 3] = [42, 43, 44];
    if me == 0 {
        let mut bufs: Vec<Buf> = (0..3).map(|_| Buf::new(ctx, Kind::Dev, FORGED_LEN, 4096, GUARD_RECV)).collect();
        let reqs: Vec<Request> = bufs.iter_mut().zip(tags).map(|(b, t)| irecv(ctx, b, Some(1), Some(t))).collect();
        let v0 = ctx.stats().violations;
        ctx.send(b"ready", 1, 1).or_fail("forged: ready");
        let mut done = [0u8; 4];
        ctx.recv(&mut done, Some(1), Some(2)).or_fail("forged: done");
        let t0 = Instant::now();
        let mut reqs = reqs.into_iter();
        for (i, what) in
            [(0, "an RTS whose region claims more than its allocation"), (1, "an RTS with a forged handle")]
        {
            let r = reqs.next().expect("three requests");
            match ctx.wait(r) {
                Err(e) if e.as_transfer().is_some() => println!("rank=0 forged: {what}: {e}"),
                other => fail(format!(
                    "forged: the receive matched by {what} completed with {other:?}, expected a transfer error"
                )),
            }
            bufs[i].verify(ctx, &[], GUARD_RECV, &format!("forged: receive buffer after {what}"));
        }
        // The RTS of another node was refused: its receive is still waiting.
        let r = reqs.next().expect("three requests");
        ensure!(ctx.test(&r).or_fail("test").is_none(), "forged: a receive matched an RTS of another node");
        ensure!(ctx.cancel(&r), "forged: cancel");
        ensure!(
            matches!(ctx.wait(r), Err(e) if matches!(e.as_transfer(), Some(ProtoError::Cancelled))),
            "forged: cancelled receive"
        );
        bufs[2].verify(ctx, &[], GUARD_RECV, "forged: receive buffer of the refused RTS");
        ensure!(t0.elapsed() < PROMPTLY, "forged: failing forged transfers took {:?}", t0.elapsed());
        let violations = ctx.stats().violations - v0;
        println!("rank=0 forged violations={violations}");
        ensure!(violations >= 12, "forged: only {violations} protocol violations counted for 16 forged packets");
        // Still working: a real rendezvous from rank 1 and one back.
        let mut b = Buf::new(ctx, Kind::Dev, FORGED_LEN, 4096, GUARD_RECV);
        let rr = irecv(ctx, &mut b, Some(1), Some(3));
        let st = ctx.wait(rr).or_fail("forged: a real message after the forged ones");
        expect_status(&st, 1, 3, FORGED_LEN, "forged: real message");
        b.verify(ctx, &pattern(17, FORGED_LEN), GUARD_RECV, "forged: real message after the forged ones");
        let sr = isend(ctx, &mut b, FORGED_LEN, 1, 4);
        ctx.wait(sr).or_fail("forged: a real message back");
        b.release(ctx);
        for b in bufs {
            b.release(ctx);
        }
    } else {
        let mut x = Buf::new(ctx, Kind::Dev, 65536, 0, GUARD_SEND);
        x.write(ctx, &pattern(16, 65536));
        let info = ctx.backend().pointer_info(x.dev).or_fail("pointer_info");
        let handle = ctx.backend().export_handle(x.dev).or_fail("export_handle").0;
        let region = Region {
            handle,
            alloc_size: 65536,
            offset: 0,
            device: ctx.device(),
            node: node_id(),
            buffer_id: info.buffer_id,
        };
        let mut ready = [0u8; 5];
        ctx.recv(&mut ready, Some(0), Some(1)).or_fail("forged: ready");
        let rts = |n: u64, tag: Tag, len: u64, src: MemDesc| Packet::Rts { msg: FORGED_MSG + n, tag, len, src };
        let big = FORGED_LEN as u64;
        let dev = |r: Region| MemDesc::Device(r);
        let mut wrong_version = Packet::Done { msg: FORGED_MSG, dir: Dir::ToSender }.to_vec();
        wrong_version[0] = WIRE_VERSION.wrapping_add(1);
        let packets: Vec<Vec<u8>> = vec![
            vec![0xff; 40],
            wrong_version,
            // The region does not cover the message.
            rts(1, 41, big, dev(region)).to_vec(),
            // Lies about the allocation's size: a real 64 KiB handle claimed as 1 MiB.
            rts(2, 42, big, dev(Region { alloc_size: big, ..region })).to_vec(),
            // A forged handle.
            rts(
                3,
                43,
                big,
                dev(Region {
                    handle: [0xab; gpulmt_protocols::wire::HANDLE_BYTES],
                    alloc_size: big,
                    buffer_id: 999_999,
                    ..region
                }),
            )
            .to_vec(),
            // Another node's memory.
            rts(4, 44, big, dev(Region { alloc_size: big, node: region.node ^ 1, ..region })).to_vec(),
            // A device that does not exist.
            rts(5, 45, big, dev(Region { alloc_size: big, device: 999, ..region })).to_vec(),
            // An empty rendezvous.
            rts(6, 46, 0, MemDesc::Host).to_vec(),
            // An offset that overflows.
            rts(7, 47, big, dev(Region { offset: u64::MAX - 10, alloc_size: big, ..region })).to_vec(),
            // Answers to messages that do not exist.
            Packet::Cts { msg: FORGED_MSG + 8, mode: CtsMode::Put, dst: Some(region), split: 0 }.to_vec(),
            Packet::Done { msg: FORGED_MSG + 9, dir: Dir::ToSender }.to_vec(),
            Packet::Done { msg: FORGED_MSG + 10, dir: Dir::ToReceiver }.to_vec(),
            Packet::Chunk { msg: FORGED_MSG + 11, index: 0, len: 10, slot: u32::MAX }.to_vec(),
            Packet::Cookie { msg: FORGED_MSG + 12 }.to_vec(),
            Packet::Abort { msg: FORGED_MSG + 13, reason: AbortReason::CopyFailed, dir: Dir::ToSender }.to_vec(),
            Packet::FreeAck { epoch: 123_456 }.to_vec(),
        ];
        // This rank's context has no packet of its own waiting for this ring, and
        // nothing else runs meanwhile, so the ring stays single-producer.
        let deadline = Instant::now() + Duration::from_secs(10);
        for p in &packets {
            // Sealed as this rank's own packets: rank 0 must refuse them by what they say.
            while !ctx.push_sealed(0, p).or_fail("forged: pushing into the ring") {
                ensure!(Instant::now() < deadline, "forged: rank 0 does not drain its ring");
                std::thread::yield_now();
            }
        }
        ctx.send(b"done", 0, 2).or_fail("forged: done");
        let mut b = Buf::new(ctx, Kind::Dev, FORGED_LEN, 4096, GUARD_SEND);
        b.write(ctx, &pattern(17, FORGED_LEN));
        let sr = isend(ctx, &mut b, FORGED_LEN, 0, 3);
        ctx.wait(sr).or_fail("forged: a real message after the forged ones");
        b.fill(ctx, GUARD_RECV);
        let rr = irecv(ctx, &mut b, Some(0), Some(4));
        ctx.wait(rr).or_fail("forged: a real message back");
        b.verify(ctx, &pattern(17, FORGED_LEN), GUARD_RECV, "forged: real message back");
        b.release(ctx);
        x.release(ctx);
    }
    ctx.mem_free_commit().or_fail("forged: mem_free_commit");
}
