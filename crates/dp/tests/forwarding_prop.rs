//! A seeded property test of the forwarding engine: random sequences of port additions and
//! removals, queue pins, frames and clock steps, replayed on a [`qswitch_dp::Switch::manual`]
//! switch with two workers (so queues also move between workers, by pin and by the dynamic
//! balancer), checked after every poll against what any correct learning switch must do:
//!
//! - nothing is left behind: every frame on a live port is taken by the next poll;
//! - a frame never leaves through its ingress port, nor into another VLAN;
//! - no frame is duplicated: a port receives each frame at most once;
//! - a broadcast reaches every other port of its VLAN; a frame to a station whose port is in
//!   the VLAN reaches that port (learned or flooded), so nothing is lost;
//! - frames from one port to another keep their order (across polls, moves and aging).
//!
//! Each port slot has one station behind it; stations never move, so every learned entry is
//! right or gone (removal forgets a port's addresses; aging is 100 ms here).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{numbered, seq_of, Sim, BCAST};
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestCaseError, TestRng, TestRunner};
use qswitch_dp::port::inject::InjectPort;
use qswitch_dp::Options;

/// Port slots (each with its own station).
const SLOTS: usize = 5;
/// Random cases run; the test must stay a few seconds in release mode.
const CASES: u32 = 10_000;
/// The seed of the sequence of cases (fixed: a failure replays).
const SEED: [u8; 32] = *b"qswitch forwarding property 0001";
/// Frames queued on one port before the model polls (a poll takes at most one burst, 32).
const MAX_PENDING: usize = 28;
const VLAN: u16 = 7;
const STRANGER: [u8; 6] = [2, 0, 0, 0, 9, 9];

fn station(slot: usize) -> [u8; 6] {
    [2, 0, 0, 0, 1, slot as u8]
}

#[derive(Debug, Clone, Copy)]
enum Dst {
    Station(usize),
    Broadcast,
    Stranger,
}

#[derive(Debug, Clone)]
enum Op {
    /// Add port `slot`, in VLAN 7 if true (else untagged).
    Add(usize, bool),
    Del(usize),
    /// Queue `n` frames on `slot` toward `dst`.
    Send(usize, Dst, u8),
    /// Move the clock by this many ns and poll once.
    Step(u64),
    /// Pin the slot's queue to worker (CPU) 0 or 1, or unpin it.
    Pin(usize, Option<usize>),
}

fn op() -> impl Strategy<Value = Op> {
    let dst = prop_oneof![
        4 => (0..SLOTS).prop_map(Dst::Station),
        1 => Just(Dst::Broadcast),
        1 => Just(Dst::Stranger),
    ];
    prop_oneof![
        3 => (0..SLOTS, any::<bool>()).prop_map(|(s, v)| Op::Add(s, v)),
        1 => (0..SLOTS).prop_map(Op::Del),
        8 => (0..SLOTS, dst, 1u8..6).prop_map(|(s, d, n)| Op::Send(s, d, n)),
        4 => (0u64..60_000_000).prop_map(Op::Step),
        1 => (0..SLOTS, proptest::option::of(0usize..2)).prop_map(|(s, c)| Op::Pin(s, c)),
    ]
}

struct Live {
    port: Arc<InjectPort>,
    vlan: u16,
}

/// A frame queued on a port and not yet switched.
struct Sent {
    seq: u64,
    from: usize,
    dst: Dst,
}

struct Model {
    sim: Sim,
    slots: Vec<Option<Live>>,
    pending: Vec<Vec<Sent>>,
    next_seq: u64,
    /// Last sequence number seen per (receiver, sender) slot.
    last: BTreeMap<(usize, usize), u64>,
}

impl Model {
    fn new() -> Model {
        let sim = Sim::with(
            2,
            Options {
                fdb_aging: Duration::from_millis(100),
                ..Options::default()
            },
        );
        Model {
            sim,
            slots: (0..SLOTS).map(|_| None).collect(),
            pending: (0..SLOTS).map(|_| Vec::new()).collect(),
            next_seq: 0,
            last: BTreeMap::new(),
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Add(s, tagged) => {
                let vlan = tagged.then_some(VLAN);
                let r = self.sim.sw.add_inject_port(&format!("p{s}"), vlan);
                prop_assert_eq!(r.is_ok(), self.slots[s].is_none());
                if let Ok(port) = r {
                    self.slots[s] = Some(Live {
                        port,
                        vlan: vlan.unwrap_or(0),
                    });
                }
            }
            Op::Del(s) => {
                let r = self.sim.sw.del_port(&format!("p{s}"));
                prop_assert_eq!(r.is_ok(), self.slots[s].is_some());
                // Frames still queued on it go with it.
                self.slots[s] = None;
                self.pending[s].clear();
            }
            Op::Send(s, dst, n) => {
                if self.slots[s].is_none() {
                    return Ok(());
                }
                for _ in 0..n {
                    if self.pending[s].len() >= MAX_PENDING {
                        self.step(1_000)?;
                    }
                    let to = match dst {
                        Dst::Station(j) => station(j),
                        Dst::Broadcast => BCAST,
                        Dst::Stranger => STRANGER,
                    };
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    if let Some(l) = &self.slots[s] {
                        l.port.inject(&numbered(to, station(s), seq));
                    }
                    self.pending[s].push(Sent { seq, from: s, dst });
                }
            }
            Op::Step(ns) => self.step(ns)?,
            Op::Pin(s, cpu) => {
                let r = self.sim.sw.pin(&format!("p{s}"), 0, cpu);
                prop_assert_eq!(r.is_ok(), self.slots[s].is_some(), "{:?}", r);
            }
        }
        Ok(())
    }

    /// One poll, then every check on what it switched.
    fn step(&mut self, ns: u64) -> Result<(), TestCaseError> {
        self.sim.step(ns);
        let vlan_of = |slots: &[Option<Live>], s: usize| slots[s].as_ref().map(|l| l.vlan);
        // Every frame queued on a live port was taken by this poll.
        let mut switched: BTreeMap<u64, (Sent, u16)> = BTreeMap::new();
        for s in 0..SLOTS {
            let Some(l) = &self.slots[s] else { continue };
            prop_assert_eq!(l.port.pending(), 0, "frames left on p{}", s);
            for sent in self.pending[s].drain(..) {
                switched.insert(sent.seq, (sent, l.vlan));
            }
        }
        let mut receivers: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for r in 0..SLOTS {
            let Some(l) = &self.slots[r] else { continue };
            for f in l.port.take_captured() {
                let seq = seq_of(&f);
                let Some((sent, vlan)) = switched.get(&seq) else {
                    return Err(TestCaseError::fail(format!(
                        "p{r} got frame {seq}, which was not switched by this poll"
                    )));
                };
                prop_assert_ne!(r, sent.from, "frame {} went back out of its ingress", seq);
                prop_assert_eq!(l.vlan, *vlan, "frame {} crossed into another VLAN", seq);
                let got = receivers.entry(seq).or_default();
                prop_assert!(!got.contains(&r), "p{} got frame {} twice", r, seq);
                got.push(r);
                let last = self.last.insert((r, sent.from), seq);
                prop_assert!(
                    last.is_none_or(|l| l < seq),
                    "p{} got frame {} from p{} after {:?}",
                    r,
                    seq,
                    sent.from,
                    last
                );
            }
        }
        for (seq, (sent, vlan)) in &switched {
            let got = receivers.get(seq).map_or(&[][..], Vec::as_slice);
            match sent.dst {
                Dst::Broadcast => {
                    let mut want: Vec<usize> = (0..SLOTS)
                        .filter(|&s| s != sent.from && vlan_of(&self.slots, s) == Some(*vlan))
                        .collect();
                    let mut got = got.to_vec();
                    got.sort_unstable();
                    want.sort_unstable();
                    prop_assert_eq!(got, want, "broadcast {} from p{}", seq, sent.from);
                }
                Dst::Station(j) if j != sent.from && vlan_of(&self.slots, j) == Some(*vlan) => {
                    prop_assert!(
                        got.contains(&j),
                        "frame {} from p{} to p{}'s station was lost (got by {:?})",
                        seq,
                        sent.from,
                        j,
                        got
                    );
                }
                _ => {}
            }
        }
        Ok(())
    }
}

fn replay(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut m = Model::new();
    for op in ops {
        m.apply(op)?;
    }
    // Whatever is still queued is switched and checked too.
    m.step(1_000)?;
    m.sim.sw.shutdown();
    Ok(())
}

#[test]
fn no_frame_is_lost_duplicated_reordered_or_hairpinned() {
    let config = ProptestConfig {
        cases: CASES,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &SEED));
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| replay(&ops));
    if let Err(e) = result {
        panic!("{e}");
    }
}
