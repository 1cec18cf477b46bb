//! Draining the send queues: reading packets in order, checking them, and taking each only
//! once its op was accepted (or rejected with an error completion, or parked by the fence
//! gate); a producer that stopped mid-queue fails its queue.

use std::time::Instant;

use gpulmt_protocols::gio::{BadPacket, Flags, Limits, Op, OpFailure, Packet, Stop, Take, Template};

use super::Proxy;
use crate::net::queue::{FailureDetail, QueueState};
use crate::net::wire::{self, CTRL_MAX};

/// The limits every template table of the proxy checks: control packets fit the slab and
/// the receive pools; data sizes are bounded only far from overflow (they travel in
/// pieces); a transfer's tag is any word (the proxy maps it into its data tags).
pub(crate) fn limits() -> Limits {
    Limits { max_ctrl: CTRL_MAX as u64, max_size: 1 << 40, max_tag: u64::MAX }
}

/// What the proxy keeps of a taken packet until its op starts: the checked packet, its
/// template, and a CTRL packet's message (its bytes copied out of the slab when taken,
/// since the slot's credit frees the slab entry too, behind room for the envelope).
#[derive(Clone, Debug)]
pub(super) struct Held {
    pub seq: u64,
    pub packet: Packet,
    pub template: Template,
    pub ctrl: Option<Vec<u8>>,
}

/// How starting an op went.
pub(super) enum Start {
    /// The network (or a copy engine) took it; it is in `ops`.
    Accepted,
    /// No resource now: leave it where it is and retry.
    Refused,
    /// It cannot run: complete it with this failure.
    Failed(OpFailure, String),
}

impl Proxy {
    /// Drains every live queue, one bounded batch each. Returns whether any packet was
    /// taken or any queue failed.
    pub(super) fn drain_queues(&mut self, now: Instant) -> bool {
        if matches!(self.stopping, super::Stopping::Cancelling(_)) {
            return false;
        }
        let mut work = false;
        for qi in 0..self.queues.len() {
            if self.queues[qi].dead {
                continue;
            }
            let tail = self.queues[qi].mem.load_tail();
            self.queues[qi].seen_tail = tail;
            // Nothing reserved since the last packet taken: every producer rings the
            // doorbell once it committed (a committed packet whose ring is still to come
            // waits a round), so an idle queue costs the proxy one load a round.
            if tail == self.queues[qi].consumer.head() {
                continue;
            }
            let mem = self.queues[qi].mem.clone();
            // The consumer is worked on outside its queue's entry so the closure may use
            // the whole proxy; it is put back below.
            let mut consumer = self.queues[qi].consumer.clone();
            let batch = self.cfg.batch;
            let drained = consumer.drain(tail, now, batch, |i| mem.load_commit(i), |pos, idx| self.take(qi, pos, idx));
            self.queues[qi].consumer = consumer;
            match drained {
                Ok(d) => {
                    if let Some(head) = d.credit {
                        mem.publish_head(head);
                        work = true;
                    }
                    if let Stop::Stalled { pos } = d.stop {
                        self.fail_queue(qi, pos, tail, QueueState::Stalled);
                        work = true;
                    }
                }
                Err(e) => {
                    tracing::error!(queue = qi, error = %e, "GIO proxy: queue indices are impossible; the queue is failed");
                    let head = self.queues[qi].consumer.head();
                    self.fail_queue(qi, head, tail, QueueState::Corrupt);
                    work = true;
                }
            }
        }
        work
    }

    /// Takes the packet at `pos` (slot `idx`) of queue `qi` if its op can start now.
    fn take(&mut self, qi: usize, pos: u64, idx: usize) -> Take {
        if !self.queues[qi].tracker.admits(pos) {
            // Too many of this queue's ops in flight for the tracker: backpressure.
            return Take::Refused;
        }
        let raw = self.queues[qi].mem.read_slot(idx);
        let cookie = raw.words[gpulmt_protocols::gio::word::COOKIE];
        let checked = match self.templates.check(&raw) {
            Ok(c) => c,
            Err(bad) => {
                self.reject(qi, pos, idx, cookie, bad);
                return Take::Taken;
            }
        };
        let packet = checked.packet;
        crate::anatomy::mark(crate::anatomy::Point::NetTaken, packet.op.code() as u8);
        let Some(&template) = checked.template else {
            // A NOP: nothing to do.
            self.complete(qi, pos, Ok(()));
            return Take::Taken;
        };
        let ctrl = match packet.op {
            Op::Ctrl { src, size } => match self.queues[qi].mem.ctrl_host_addr(src, size) {
                Some(at) => {
                    // SAFETY: the range lies in this queue's control slab (checked), which
                    // the producer filled before its release commit that load_commit acquired.
                    let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, size as usize) };
                    Some(wire::ctrl_message(bytes))
                }
                None => {
                    self.reject(qi, pos, idx, cookie, BadPacket::BadAddress { op: packet.op.code(), addr: src, size });
                    return Take::Taken;
                }
            },
            _ => None,
        };
        let fenced = packet.flags.contains(Flags::FENCE);
        let mut held = Held { seq: pos, packet, template, ctrl };
        let gate_key = template.rank;
        if !self.queues[qi].gate.may_issue(gate_key, fenced) {
            return match self.queues[qi].gate.hold(gate_key, fenced, held) {
                Ok(()) => Take::Taken,
                Err(_) => Take::Refused,
            };
        }
        match self.start(qi, &mut held) {
            Start::Accepted => {
                self.queues[qi].gate.on_issue(gate_key);
                Take::Taken
            }
            Start::Refused => Take::Refused,
            Start::Failed(failure, text) => {
                self.complete(qi, pos, Err((failure, text)));
                Take::Taken
            }
        }
    }

    /// Starts the ops the fence gates release, oldest first.
    pub(super) fn start_held(&mut self) -> bool {
        let mut work = false;
        for qi in 0..self.queues.len() {
            while let Some((t, held)) = self.queues[qi].gate.poll_op() {
                let mut held = held.clone();
                match self.start(qi, &mut held) {
                    Start::Accepted => {
                        self.queues[qi].gate.issue_held(t);
                    }
                    Start::Refused => break,
                    Start::Failed(failure, text) => {
                        let gate = &mut self.queues[qi].gate;
                        gate.issue_held(t);
                        gate.on_complete(t);
                        self.complete(qi, held.seq, Err((failure, text)));
                    }
                }
                work = true;
            }
        }
        work
    }

    /// Starts the op of `held`, taken from queue `qi`.
    fn start(&mut self, qi: usize, held: &mut Held) -> Start {
        if self.cancels.remove(&(qi, held.seq)) {
            return Start::Failed(
                OpFailure::cancelled(),
                "cancelled before it started: its request failed first".into(),
            );
        }
        match held.packet.op {
            Op::Nop => unreachable!("NOPs complete when taken"),
            Op::Ctrl { .. } => self.start_ctrl(qi, held),
            Op::Send { .. } | Op::Recv { .. } => self.start_data(qi, held),
            Op::Put { .. } | Op::PutSignal { .. } => self.start_put(qi, held),
            Op::Get { .. } => self.start_get(qi, held),
            Op::Amo { .. } => self.start_amo(qi, held),
        }
    }

    /// Rejects a bad packet: logged with its queue and slot, completed with an error.
    fn reject(&mut self, qi: usize, pos: u64, idx: usize, cookie: u64, bad: BadPacket) {
        tracing::error!(queue = qi, slot = idx, seq = pos, cookie, "GIO proxy rejected a packet: {bad}");
        self.complete(qi, pos, Err((OpFailure::bad_packet(&bad), bad.to_string())));
    }

    /// Op `seq` of queue `qi` completed; its failure's story goes to the queue first.
    pub(super) fn complete(&mut self, qi: usize, seq: u64, result: Result<(), (OpFailure, String)>) {
        let q = &mut self.queues[qi];
        let result = match result {
            Ok(()) => Ok(()),
            Err((failure, text)) => {
                q.mem.record_detail(seq, FailureDetail { failure, text });
                Err(failure)
            }
        };
        match q.tracker.complete(seq, result) {
            Ok(advanced) => {
                q.dirty |= advanced;
                if q.mem.reports_each_op() {
                    q.mem.record_ended(seq);
                }
            }
            Err(e) => tracing::error!(queue = qi, seq, error = %e, "GIO proxy: completion refused (a proxy bug)"),
        }
    }

    /// Fails queue `qi` from `pos` (a stalled or impossible slot) up to what the producer
    /// reserved: those ops complete with an error, and no packet is taken any more.
    pub(super) fn fail_queue(&mut self, qi: usize, pos: u64, tail: u64, why: QueueState) {
        let q = &mut self.queues[qi];
        let slots = q.mem.slots();
        let (failure, text) = match why {
            QueueState::Stalled => {
                tracing::error!(
                    queue = qi,
                    slot = pos % slots,
                    seq = pos,
                    timeout = ?self.cfg.stall,
                    "GIO proxy: the producer reserved this slot and did not commit it in time; it stopped mid-queue, so the queue is failed"
                );
                (OpFailure::stalled(), format!("queue {qi}: the producer stopped mid-queue at slot {}", pos % slots))
            }
            QueueState::Closed => {
                (OpFailure::cancelled(), format!("queue {qi} closed at shutdown before this op was taken"))
            }
            _ => (OpFailure::stalled(), format!("queue {qi}: its indices are impossible (corrupt memory)")),
        };
        q.dead = true;
        q.mem.set_state(why);
        let end = tail.clamp(pos, pos + slots);
        let failing: Vec<u64> = (pos..end).filter(|&seq| q.tracker.pending(seq)).collect();
        for &seq in &failing {
            q.mem.record_detail(seq, FailureDetail { failure, text: text.clone() });
        }
        match q.tracker.fail_range(pos..end, failure) {
            Ok(advanced) => {
                q.dirty |= advanced;
                if q.mem.reports_each_op() {
                    failing.into_iter().for_each(|seq| q.mem.record_ended(seq));
                }
            }
            Err(e) => {
                tracing::error!(queue = qi, error = %e, "GIO proxy: failing a queue's ops was refused (a proxy bug)")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpulmt_protocols::gio::{TemplateTable, Window};

    #[test]
    fn limits_refuse_control_packets_larger_than_the_pools() {
        let t = Template { rank: 3, comm: 0, window: Some(Window { id: 0, base: 0x1000, size: 64 }) };
        let table = TemplateTable::new(vec![t], limits()).unwrap();
        let ok = Packet { op: Op::Ctrl { src: 0x10, size: CTRL_MAX as u64 }, flags: Flags::NONE, target: 0, cookie: 1 };
        assert!(table.check(&ok.encode(0, 4)).is_ok());
        let big = Packet { op: Op::Ctrl { src: 0x10, size: CTRL_MAX as u64 + 1 }, ..ok };
        assert!(matches!(table.check(&big.encode(0, 4)), Err(BadPacket::TooLarge { .. })));
        let tag = Packet { op: Op::Send { src: 0x10, size: 1, tag: u64::MAX }, ..ok };
        assert!(table.check(&tag.encode(0, 4)).is_ok(), "any transfer tag: the proxy maps it");
    }
}
