//! Two-phase free: marks, the commit state machine, and a simulation of four
//! ranks with messages delivered in random order.

use std::collections::{HashMap, VecDeque};

use gpulmt_handles::{CommitError, DoubleFree, FreeCommit, FreeMarks, FreeMsg, Outgoing, Phase};
use proptest::prelude::*;
use proptest::sample::Index;

/// (owner rank, buffer id)
type Buf = (usize, u64);

#[test]
fn double_free_is_an_error() {
    let mut marks = FreeMarks::new();
    marks.mark((0, 1)).unwrap();
    marks.mark((0, 2)).unwrap();
    assert_eq!(marks.mark((0, 1)), Err(DoubleFree { key: (0, 1) }));
    assert!(marks.mark((0, 1)).unwrap_err().to_string().contains("freed"));
    assert!(marks.is_marked(&(0, 2)));
    assert_eq!(marks.take(), vec![(0, 1), (0, 2)], "in the order freed");
    assert!(marks.is_empty() && !marks.is_marked(&(0, 1)));
}

#[test]
fn marks_in_a_running_commit_are_visible() {
    let mut c = FreeCommit::new(2, 0).unwrap();
    c.start(vec![(0, 5)]).unwrap();
    assert!(c.is_releasing(&(0, 5)));
    assert_eq!(c.own_marks(), &[(0, 5)]);
}

/// Delivers everything in FIFO order, driving each rank's caller steps.
fn run_sync(commits: &mut [FreeCommit<Buf>], marks: Vec<Vec<Buf>>) -> Vec<Vec<Buf>> {
    let mut net: VecDeque<(usize, Outgoing<Buf>)> = VecDeque::new();
    for (r, m) in marks.into_iter().enumerate() {
        for o in commits[r].start(m).unwrap() {
            net.push_back((r, o));
        }
    }
    let mut released = vec![Vec::new(); commits.len()];
    loop {
        let mut progressed = false;
        while let Some((from, o)) = net.pop_front() {
            commits[o.to].on_message(from, o.msg).unwrap();
            progressed = true;
        }
        for r in 0..commits.len() {
            match commits[r].phase() {
                Phase::CloseMappings => {
                    for o in commits[r].mappings_closed().unwrap() {
                        net.push_back((r, o));
                    }
                    progressed = true;
                }
                Phase::ReleaseOwn => {
                    released[r] = commits[r].release_own().unwrap();
                    progressed = true;
                }
                _ => {}
            }
        }
        if !progressed {
            return released;
        }
    }
}

#[test]
fn commit_with_nothing_marked_is_still_a_round() {
    let mut commits: Vec<_> = (0..3).map(|r| FreeCommit::<Buf>::new(3, r).unwrap()).collect();
    for epoch in 0..3 {
        let released = run_sync(&mut commits, vec![vec![]; 3]);
        assert!(released.iter().all(Vec::is_empty));
        for c in &commits {
            assert_eq!((c.phase(), c.epoch()), (Phase::Done, Some(epoch)));
        }
    }
}

#[test]
fn marks_reach_every_peer_and_owners_release_them() {
    let mut commits: Vec<_> = (0..3).map(|r| FreeCommit::<Buf>::new(3, r).unwrap()).collect();
    let plan = vec![vec![(0, 1), (0, 2)], vec![], vec![(2, 9)]];
    let released = run_sync(&mut commits, plan.clone());
    assert_eq!(released, plan);
    let seen: HashMap<usize, Vec<Buf>> = commits[1].peer_marks().map(|(r, m)| (r, m.to_vec())).collect();
    assert_eq!(seen, HashMap::from([(0, plan[0].clone()), (2, plan[2].clone())]));
}

#[test]
fn single_rank_commits_alone() {
    let mut c = FreeCommit::new(1, 0).unwrap();
    assert!(c.start(vec![(0, 1)]).unwrap().is_empty());
    assert_eq!(c.phase(), Phase::CloseMappings);
    assert!(c.mappings_closed().unwrap().is_empty());
    assert_eq!(c.release_own().unwrap(), vec![(0, 1)]);
    assert_eq!(c.phase(), Phase::Done);
}

#[test]
fn early_marks_before_start_are_kept() {
    let mut a = FreeCommit::new(2, 0).unwrap();
    let mut b = FreeCommit::new(2, 1).unwrap();
    // Rank 0 is fast: its marks reach rank 1 before rank 1 starts.
    let out_a = a.start(vec![(0, 7)]).unwrap();
    assert_eq!(out_a, vec![Outgoing { to: 1, msg: FreeMsg::Marks { epoch: 0, marks: vec![(0, 7)] } }]);
    b.on_message(0, out_a[0].msg.clone()).unwrap();
    assert_eq!(b.phase(), Phase::Idle);
    assert_eq!(b.peer_marks().count(), 0, "nothing to close before start");
    let out_b = b.start(vec![]).unwrap();
    assert_eq!(b.phase(), Phase::CloseMappings, "early marks counted at start");
    assert_eq!(b.peer_marks().collect::<Vec<_>>(), vec![(0, &[(0, 7)][..])]);
    a.on_message(1, out_b[0].msg.clone()).unwrap();
    assert_eq!(a.phase(), Phase::CloseMappings);
    // An ack may not precede this rank's own start of the epoch.
    let acks_b = b.mappings_closed().unwrap();
    assert_eq!(b.waiting_for(), vec![0]);
    a.on_message(1, acks_b[0].msg.clone()).unwrap();
    assert_eq!(a.phase(), Phase::CloseMappings, "rank 0 has not closed its own mappings yet");
    let acks_a = a.mappings_closed().unwrap();
    assert_eq!(a.phase(), Phase::ReleaseOwn);
    b.on_message(0, acks_a[0].msg.clone()).unwrap();
    assert_eq!(a.release_own().unwrap(), vec![(0, 7)]);
    assert_eq!(b.release_own().unwrap(), vec![]);

    // Rank 0 runs ahead to epoch 1 while rank 1 is Done at 0.
    let out_a = a.start(vec![]).unwrap();
    b.on_message(0, out_a[0].msg.clone()).unwrap();
    // Further ahead is out of step.
    assert!(matches!(b.on_marks(0, 2, vec![]), Err(CommitError::FutureEpoch { epoch: 2, started: Some(0), .. })));
    assert!(matches!(b.on_marks(0, 1, vec![]), Err(CommitError::DuplicateMarks { from: 0, epoch: 1 })));
    b.start(vec![]).unwrap();
    assert_eq!(b.phase(), Phase::CloseMappings);
}

#[test]
fn protocol_violations_are_errors() {
    assert_eq!(FreeCommit::<Buf>::new(2, 2).unwrap_err(), CommitError::InvalidRank { rank: 2, ranks: 2 });
    let mut c = FreeCommit::<Buf>::new(3, 1).unwrap();
    assert!(matches!(c.on_ack(0, 0), Err(CommitError::FutureEpoch { started: None, .. })));
    assert!(matches!(c.mappings_closed(), Err(CommitError::WrongPhase { phase: Phase::Idle, .. })));
    assert!(matches!(c.release_own(), Err(CommitError::WrongPhase { .. })));
    c.start(vec![]).unwrap();
    assert!(matches!(c.start(vec![]), Err(CommitError::Busy { epoch: 0, phase: Phase::CollectingMarks })));
    assert!(matches!(c.mappings_closed(), Err(CommitError::WrongPhase { phase: Phase::CollectingMarks, .. })));
    assert_eq!(c.on_marks(3, 0, vec![]), Err(CommitError::UnknownRank { from: 3, ranks: 3 }));
    assert_eq!(c.on_marks(1, 0, vec![]), Err(CommitError::FromSelf { rank: 1 }));
    c.on_marks(0, 0, vec![]).unwrap();
    assert_eq!(c.on_marks(0, 0, vec![]), Err(CommitError::DuplicateMarks { from: 0, epoch: 0 }));
    c.on_ack(0, 0).unwrap(); // reordered ack before rank 2's marks: fine
    assert_eq!(c.on_ack(0, 0), Err(CommitError::DuplicateAck { from: 0, epoch: 0 }));
    assert!(matches!(c.on_ack(2, 1), Err(CommitError::FutureEpoch { epoch: 1, .. })));
    assert_eq!(c.waiting_for(), vec![2]);
    c.on_marks(2, 0, vec![]).unwrap();
    c.mappings_closed().unwrap();
    c.on_ack(2, 0).unwrap();
    c.release_own().unwrap();
    c.start(vec![]).unwrap();
    assert_eq!(c.on_marks(0, 0, vec![]), Err(CommitError::StaleEpoch { from: 0, epoch: 0, current: 1 }));
    assert_eq!(c.on_ack(0, 0), Err(CommitError::StaleEpoch { from: 0, epoch: 0, current: 1 }));
    assert_eq!(c.on_peer_failed(1), Err(CommitError::FromSelf { rank: 1 }));
    assert_eq!(c.on_peer_failed(9), Err(CommitError::UnknownRank { from: 9, ranks: 3 }));
    let msg = CommitError::Busy { epoch: 4, phase: Phase::AwaitingAcks }.to_string();
    assert!(msg.contains("finish it"), "{msg}");
}

#[test]
fn failed_peer_is_no_longer_waited_for() {
    let mut commits: Vec<_> = (0..3).map(|r| FreeCommit::<Buf>::new(3, r).unwrap()).collect();
    // Rank 2 dies before sending anything.
    let mut net = Vec::new();
    for (r, c) in commits.iter_mut().enumerate().take(2) {
        for o in c.start(vec![(r, 1)]).unwrap() {
            net.push((r, o));
        }
    }
    for (from, o) in net.drain(..) {
        if o.to != 2 {
            commits[o.to].on_message(from, o.msg).unwrap();
        }
    }
    assert_eq!(commits[0].waiting_for(), vec![2]);
    commits[0].on_peer_failed(2).unwrap();
    commits[1].on_peer_failed(2).unwrap();
    commits[1].on_peer_failed(2).unwrap(); // idempotent
    assert_eq!(commits[0].phase(), Phase::CloseMappings);
    let a0 = commits[0].mappings_closed().unwrap();
    let a1 = commits[1].mappings_closed().unwrap();
    assert_eq!(a0.len(), 1, "no ack sent to the dead rank");
    commits[1].on_message(0, a0[0].msg.clone()).unwrap();
    commits[0].on_message(1, a1[0].msg.clone()).unwrap();
    assert_eq!(commits[0].release_own().unwrap(), vec![(0, 1)]);
    assert_eq!(commits[1].release_own().unwrap(), vec![(1, 1)]);
    assert_eq!(commits[0].on_marks(2, 0, vec![]), Err(CommitError::FromFailedPeer { from: 2 }));
    // Later commits skip it from the start.
    assert_eq!(commits[0].start(vec![]).unwrap().len(), 1);
}

// ---------------------------------------------------------------------------
// Simulation: 4 ranks, several commits, messages delivered in random order.

const RANKS: usize = 4;
const EPOCHS: u64 = 3;

struct Sim {
    commits: Vec<FreeCommit<Buf>>,
    /// In flight: (from, to, msg).
    net: Vec<(usize, usize, FreeMsg<Buf>)>,
    /// plan[epoch][rank]: what the rank frees in that commit.
    plan: Vec<Vec<Vec<Buf>>>,
    /// (epoch, rank) -> peers' marks it had closed when it acked.
    closed: HashMap<(u64, usize), HashMap<usize, Vec<Buf>>>,
    released: HashMap<(u64, usize), Vec<Buf>>,
    dead: Option<usize>,
    /// told[r]: rank r has been told of the death.
    told: Vec<bool>,
}

#[derive(Clone, Copy, Debug)]
enum Action {
    Start(usize),
    Deliver(usize),
    Close(usize),
    Release(usize),
    Tell(usize),
    Kill(usize),
}

impl Sim {
    fn new(plan: Vec<Vec<Vec<Buf>>>) -> Self {
        Sim {
            commits: (0..RANKS).map(|r| FreeCommit::new(RANKS, r).unwrap()).collect(),
            net: Vec::new(),
            plan,
            closed: HashMap::new(),
            released: HashMap::new(),
            dead: None,
            told: vec![false; RANKS],
        }
    }

    fn alive(&self, r: usize) -> bool {
        self.dead != Some(r)
    }

    fn actions(&self, may_kill: Option<usize>) -> Vec<Action> {
        let mut actions = Vec::new();
        for r in (0..RANKS).filter(|&r| self.alive(r)) {
            let c = &self.commits[r];
            match c.phase() {
                Phase::Idle => actions.push(Action::Start(r)),
                Phase::Done if c.epoch().unwrap() + 1 < EPOCHS => actions.push(Action::Start(r)),
                Phase::CloseMappings => actions.push(Action::Close(r)),
                Phase::ReleaseOwn => actions.push(Action::Release(r)),
                _ => {}
            }
            if self.dead.is_some() && !self.told[r] {
                actions.push(Action::Tell(r));
            }
        }
        actions.extend((0..self.net.len()).map(Action::Deliver));
        if let (Some(victim), None) = (may_kill, self.dead) {
            actions.push(Action::Kill(victim));
        }
        actions
    }

    fn send(&mut self, from: usize, out: Vec<Outgoing<Buf>>) {
        self.net.extend(out.into_iter().map(|o| (from, o.to, o.msg)));
    }

    fn step(&mut self, action: Action) -> Result<(), TestCaseError> {
        match action {
            Action::Start(r) => {
                let epoch = self.commits[r].epoch().map_or(0, |e| e + 1);
                let out = self.commits[r].start(self.plan[epoch as usize][r].clone()).unwrap();
                self.send(r, out);
            }
            Action::Deliver(i) => {
                let (from, to, msg) = self.net.swap_remove(i);
                if !self.alive(to) {
                    return Ok(()); // lost with the dead rank
                }
                match self.commits[to].on_message(from, msg) {
                    Ok(()) => {}
                    // Only a dead rank's messages may be refused, and only
                    // once the receiver knows it is dead.
                    Err(CommitError::FromFailedPeer { from: f }) => {
                        prop_assert_eq!(Some(f), self.dead);
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("{from}->{to}: {e}"))),
                }
            }
            Action::Close(r) => {
                let epoch = self.commits[r].epoch().unwrap();
                let seen: HashMap<usize, Vec<Buf>> =
                    self.commits[r].peer_marks().map(|(p, m)| (p, m.to_vec())).collect();
                // Every live peer's marks, exactly as planned.
                for p in (0..RANKS).filter(|&p| p != r && !self.commits[r].is_failed(p)) {
                    prop_assert_eq!(seen.get(&p), Some(&self.plan[epoch as usize][p]));
                }
                self.closed.insert((epoch, r), seen);
                let out = self.commits[r].mappings_closed().unwrap();
                self.send(r, out);
            }
            Action::Release(r) => {
                let epoch = self.commits[r].epoch().unwrap();
                let own = self.commits[r].release_own().unwrap();
                prop_assert_eq!(&own, &self.plan[epoch as usize][r]);
                // Every live peer closed its mappings of these before now.
                for p in (0..RANKS).filter(|&p| p != r && self.alive(p)) {
                    let seen = self.closed.get(&(epoch, p));
                    prop_assert!(seen.is_some(), "rank {} released epoch {} before rank {} closed", r, epoch, p);
                    prop_assert_eq!(seen.unwrap().get(&r), Some(&own));
                }
                self.released.insert((epoch, r), own);
            }
            Action::Tell(r) => {
                self.commits[r].on_peer_failed(self.dead.unwrap()).unwrap();
                self.told[r] = true;
            }
            Action::Kill(victim) => {
                self.dead = Some(victim);
                self.told[victim] = true;
            }
        }
        Ok(())
    }
}

fn plan() -> impl Strategy<Value = Vec<Vec<Vec<Buf>>>> {
    prop::collection::vec(prop::collection::vec(0usize..3, RANKS), EPOCHS as usize).prop_map(|counts| {
        let mut next_id = 0u64;
        counts
            .into_iter()
            .map(|per_rank| {
                per_rank
                    .into_iter()
                    .enumerate()
                    .map(|(r, n)| {
                        (0..n)
                            .map(|_| {
                                next_id += 1;
                                (r, next_id)
                            })
                            .collect()
                    })
                    .collect()
            })
            .collect()
    })
}

fn simulate(plan: Vec<Vec<Vec<Buf>>>, choices: Vec<Index>, victim: Option<usize>) -> Result<(), TestCaseError> {
    let mut sim = Sim::new(plan);
    let mut steps = 0usize;
    loop {
        let actions = sim.actions(victim);
        if actions.is_empty() {
            break;
        }
        // Random choices first, then the first available action.
        let pick = choices.get(steps).map_or(0, |i| i.index(actions.len()));
        sim.step(actions[pick])?;
        steps += 1;
        prop_assert!(steps < 10_000, "no progress");
    }
    for r in (0..RANKS).filter(|&r| sim.alive(r)) {
        let c = &sim.commits[r];
        prop_assert_eq!(c.phase(), Phase::Done, "rank {} stuck, waiting for {:?}", r, c.waiting_for());
        prop_assert_eq!(c.epoch(), Some(EPOCHS - 1));
        for e in 0..EPOCHS {
            prop_assert!(sim.released.contains_key(&(e, r)));
        }
    }
    prop_assert!(
        sim.net.iter().all(|(from, to, _)| !sim.alive(*from) || !sim.alive(*to)),
        "undelivered messages between live ranks"
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn four_ranks_random_delivery_all_finish(
        plan in plan(),
        choices in prop::collection::vec(any::<Index>(), 0..400),
    ) {
        simulate(plan, choices, None)?;
    }

    #[test]
    fn four_ranks_with_one_dying_survivors_finish(
        plan in plan(),
        choices in prop::collection::vec(any::<Index>(), 0..400),
        victim in 0..RANKS,
    ) {
        simulate(plan, choices, Some(victim))?;
    }
}
