//! Where a proxy's time goes: the share of its rounds spent in each phase, and how long
//! staging copies and network pieces take, summed over the proxy's life and logged once at
//! exit (`GPULMT_LOG=warn,gpulmt_net_profile=info`).
//!
//! The proxy spins while it has work, so its CPU time says nothing about what limits a
//! transfer; these counters do: a phase that takes most of a round is the round's cost, and
//! a copy whose time from issue to the proxy seeing it finished is long against its bytes
//! waits on the copy engine or on the poll. The phases of one round in [`SAMPLE_EVERY`]
//! are timed, the shares computed over those: six clock reads a round (20-30 ns each, the
//! vDSO) were a quarter of an idle round's 0.46 us on the CI host (`lab/src/bin/round_probe.rs`
//! under perf), and an idle round is what a small message waits for.

use std::time::{Duration, Instant};

/// The phases of a proxy round, in order (`proxy/mod.rs`, "One round").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Commands, draining the queues and starting held ops.
    Take,
    /// Testing the network (`MPI_Testsome`) and dispatching what finished.
    Network,
    /// Staging pipelines and one-sided work.
    Advance,
    /// Pool refills, publishing completions, the inbound hand-over, stopping.
    Publish,
    /// Backing off after a round without work.
    Idle,
}

const PHASES: usize = 5;

/// A sum and a count of durations.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    pub count: u64,
    pub total: Duration,
}

impl Tally {
    pub fn add(&mut self, d: Duration) {
        self.count += 1;
        self.total += d;
    }

    fn mean_us(&self) -> f64 {
        match self.count {
            0 => 0.0,
            n => self.total.as_secs_f64() * 1e6 / n as f64,
        }
    }
}

/// The staging pipeline's side: copies, polls, pieces on the wire, waits for a buffer.
#[derive(Clone, Copy, Debug, Default)]
pub struct StageProfile {
    /// Device-to-host copies, from issue until a poll saw them finished.
    pub copy_out: Tally,
    /// Host-to-device copies, likewise.
    pub copy_in: Tally,
    /// Bytes copied each way.
    pub bytes_out: u64,
    pub bytes_in: u64,
    /// `copy_poll` calls and the time inside them; `pending`: those that found the copy
    /// still running.
    pub polls: Tally,
    pub polls_pending: u64,
    /// Sending and receiving pieces, from the network taking them until it reported them.
    pub wire_send: Tally,
    pub wire_recv: Tally,
    /// Times a transfer could not start its next piece for want of a bounce buffer.
    pub bounce_waits: u64,
}

/// Rounds per timed round: the phases of one round in this many are timed.
pub const SAMPLE_EVERY: u64 = 16;

/// A proxy's profile.
#[derive(Debug)]
pub struct ProxyProfile {
    pub rounds: u64,
    pub idle_rounds: u64,
    phases: [Duration; PHASES],
    /// The phase running and when it began (meaningful while `timing`).
    mark: Instant,
    current: Phase,
    /// This round's phases are timed.
    timing: bool,
    started: Instant,
}

impl Default for ProxyProfile {
    fn default() -> Self {
        let now = Instant::now();
        ProxyProfile {
            rounds: 0,
            idle_rounds: 0,
            phases: [Duration::ZERO; PHASES],
            mark: now,
            current: Phase::Take,
            timing: false,
            started: now,
        }
    }
}

impl ProxyProfile {
    /// Starts a round at `now` (the round's own clock read) in its first phase: ends the
    /// previous round's idle time if that round was timed, and decides whether this one is.
    pub fn begin_round(&mut self, now: Instant) {
        if self.timing {
            self.phases[self.current as usize] += now - self.mark;
        }
        self.timing = self.rounds.is_multiple_of(SAMPLE_EVERY);
        (self.mark, self.current) = (now, Phase::Take);
    }

    /// Ends the running phase and starts `next` (reads the clock only in a timed round).
    pub fn enter(&mut self, next: Phase) {
        if self.timing {
            let now = Instant::now();
            self.phases[self.current as usize] += now - self.mark;
            self.mark = now;
        }
        self.current = next;
    }

    /// One line for the log: phase shares, copy and wire means, poll counts.
    pub fn summary(&self, stage: &StageProfile, bounce_buffers: usize) -> String {
        let life = self.started.elapsed().as_secs_f64().max(1e-9);
        let timed = self.phases.iter().map(Duration::as_secs_f64).sum::<f64>().max(1e-9);
        let share = |p: Phase| 100.0 * self.phases[p as usize].as_secs_f64() / timed;
        let round_us = match self.rounds {
            0 => 0.0,
            n => life * 1e6 / n as f64,
        };
        let gbps = |bytes: u64, t: &Tally| match t.total.is_zero() {
            true => 0.0,
            false => bytes as f64 / t.total.as_secs_f64() / 1e9,
        };
        format!(
            "{:.1} s, {} rounds ({} idle, {:.2} us each); time in take {:.0} %, network {:.0} %, advance {:.0} %, \
             publish {:.0} %, idle {:.0} %; copies out {} ({:.1} us mean, {:.2} GB/s if serial), in {} ({:.1} us, \
             {:.2} GB/s); {} polls ({} pending, {:.2} us each); pieces sent {} ({:.1} us on the wire), received {} \
             ({:.1} us); {} waits for a bounce buffer ({} buffers)",
            life,
            self.rounds,
            self.idle_rounds,
            round_us,
            share(Phase::Take),
            share(Phase::Network),
            share(Phase::Advance),
            share(Phase::Publish),
            share(Phase::Idle),
            stage.copy_out.count,
            stage.copy_out.mean_us(),
            gbps(stage.bytes_out, &stage.copy_out),
            stage.copy_in.count,
            stage.copy_in.mean_us(),
            gbps(stage.bytes_in, &stage.copy_in),
            stage.polls.count,
            stage.polls_pending,
            stage.polls.mean_us(),
            stage.wire_send.count,
            stage.wire_send.mean_us(),
            stage.wire_recv.count,
            stage.wire_recv.mean_us(),
            stage.bounce_waits,
            bounce_buffers,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_round_adds_up_its_phases_and_the_others_are_not_timed() {
        let mut p = ProxyProfile::default();
        // Round 0 is timed (one in SAMPLE_EVERY, counting from the first).
        p.begin_round(Instant::now());
        p.enter(Phase::Network);
        std::thread::sleep(Duration::from_millis(5));
        p.enter(Phase::Idle);
        p.rounds += 1;
        // Round 1 is not: its phases add nothing, however long; it closes round 0's idle.
        p.begin_round(Instant::now());
        assert!(p.phases[Phase::Network as usize] >= Duration::from_millis(5));
        assert!(p.phases[Phase::Idle as usize] > Duration::ZERO, "round 0's idle is closed by round 1");
        let timed = p.phases;
        p.enter(Phase::Network);
        std::thread::sleep(Duration::from_millis(5));
        p.enter(Phase::Idle);
        p.rounds += 1;
        p.begin_round(Instant::now());
        assert_eq!(p.phases, timed, "an untimed round adds nothing");
        let mut stage = StageProfile::default();
        stage.copy_out.add(Duration::from_micros(10));
        stage.copy_out.add(Duration::from_micros(30));
        stage.bytes_out = 2 << 20;
        let s = p.summary(&stage, 3);
        assert!(s.contains("copies out 2 (20.0 us mean"), "{s}");
        assert!(s.contains("(3 buffers)"), "{s}");
        // Shares are of the timed time, round 0's (a loaded host may stretch any phase, so
        // the shares are computed from what was recorded, not assumed).
        let share =
            |ph: Phase| 100.0 * timed[ph as usize].as_secs_f64() / timed.iter().map(Duration::as_secs_f64).sum::<f64>();
        let (network, idle) = (share(Phase::Network), share(Phase::Idle));
        assert!(s.contains(&format!("network {network:.0} %")) && s.contains(&format!("idle {idle:.0} %")), "{s}");
    }
}
