//! A seeded property test of the forwarding engine: random sequences of port additions and
//! removals, queue pins, frames and clock steps, replayed on a [`qswitch_dp::Switch::manual`]
//! switch with two workers (so queues also move between workers, by pin and by the dynamic
//! balancer), checked after every poll against what any correct learning switch must do:
//!
//! - nothing is left behind: every frame on a live port is taken by the next poll;
//! - a frame never leaves through its ingress port, nor into another VLAN: ports are random
//!   access ports and trunks (native VLAN or none, VLANs 7 and 8 carried tagged, changed
//!   live), frames untagged or tagged 7, 8 or 9; a frame leaves untagged exactly where its
//!   VLAN is native and tagged with its VID where it is carried, and a frame whose VLAN the
//!   ingress does not carry reaches nobody;
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
use qswitch_dp::policy::PortPolicy;
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
/// The VLANs ports are in: 0 (none), 7 and 8; frames may also be tagged 9 (never carried).
const VLANS: [u16; 2] = [7, 8];
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
    /// Add port `slot` with access VLAN none, 7 or 8 (0, 1, 2), carrying tagged the VLANs
    /// of the mask (bit 0: 7, bit 1: 8).
    Add(usize, u8, u8),
    Del(usize),
    /// Queue `n` frames on `slot` toward `dst`, untagged or tagged with this VID.
    Send(usize, Dst, u8, Option<u16>),
    /// Set the slot's tagged VLANs (mask as in `Add`) live.
    Trunk(usize, u8),
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
    let mask = prop_oneof![2 => Just(0u8), 1 => 1u8..4];
    let tag =
        prop_oneof![6 => Just(None), 1 => Just(Some(7u16)), 1 => Just(Some(8)), 1 => Just(Some(9))];
    prop_oneof![
        3 => (0..SLOTS, 0u8..3, mask.clone()).prop_map(|(s, v, m)| Op::Add(s, v, m)),
        1 => (0..SLOTS).prop_map(Op::Del),
        8 => (0..SLOTS, dst, 1u8..6, tag).prop_map(|(s, d, n, t)| Op::Send(s, d, n, t)),
        1 => (0..SLOTS, mask).prop_map(|(s, m)| Op::Trunk(s, m)),
        4 => (0u64..60_000_000).prop_map(Op::Step),
        1 => (0..SLOTS, proptest::option::of(0usize..2)).prop_map(|(s, c)| Op::Pin(s, c)),
    ]
}

struct Live {
    port: Arc<InjectPort>,
    /// The configured access VLAN.
    vlan: Option<u16>,
    /// VLANs carried tagged.
    tagged: Vec<u16>,
}

impl Live {
    /// The untagged VLAN: the access VLAN, else 0 unless the port is a trunk.
    fn native(&self) -> Option<u16> {
        match self.vlan {
            Some(v) => Some(v),
            None if !self.tagged.is_empty() => None,
            None => Some(0),
        }
    }

    /// The VLAN of a frame received with `tag`, if the port takes it.
    fn ingress(&self, tag: Option<u16>) -> Option<u16> {
        match tag {
            None => self.native(),
            Some(v) => self.tagged.contains(&v).then_some(v),
        }
    }

    /// How a frame of `vlan` leaves: `Some(None)` untagged, `Some(Some(v))` tagged.
    fn egress(&self, vlan: u16) -> Option<Option<u16>> {
        if self.native() == Some(vlan) {
            Some(None)
        } else if self.tagged.contains(&vlan) {
            Some(Some(vlan))
        } else {
            None
        }
    }
}

fn tagged_of(mask: u8) -> Vec<u16> {
    VLANS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, &v)| v)
        .collect()
}

fn policy_of(tagged: &[u16]) -> PortPolicy {
    PortPolicy {
        vlans: tagged.iter().copied().collect(),
        ..PortPolicy::default()
    }
}

/// `f` with a tag for `vid` pushed, or as is.
fn with_tag(f: Vec<u8>, vid: Option<u16>) -> Vec<u8> {
    let Some(vid) = vid else { return f };
    let mut t = f[..12].to_vec();
    t.extend_from_slice(&[0x81, 0x00]);
    t.extend_from_slice(&vid.to_be_bytes());
    t.extend_from_slice(&f[12..]);
    t
}

/// The VID of a tagged frame and the frame without its tag.
fn untag(f: &[u8]) -> (Option<u16>, Vec<u8>) {
    if f[12..14] == [0x81, 0x00] {
        let vid = u16::from_be_bytes([f[14], f[15]]) & 0xfff;
        let mut u = f[..12].to_vec();
        u.extend_from_slice(&f[16..]);
        (Some(vid), u)
    } else {
        (None, f.to_vec())
    }
}

/// A frame queued on a port and not yet switched.
struct Sent {
    seq: u64,
    from: usize,
    dst: Dst,
    tag: Option<u16>,
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
            Op::Add(s, v, mask) => {
                let vlan = [None, Some(VLANS[0]), Some(VLANS[1])][usize::from(v)];
                let r = self.sim.sw.add_inject_port(&format!("p{s}"), vlan);
                prop_assert_eq!(r.is_ok(), self.slots[s].is_none());
                if let Ok(port) = r {
                    let tagged = tagged_of(mask);
                    if !tagged.is_empty() {
                        let name = format!("p{s}");
                        let set = self.sim.sw.set_port_policy(&name, policy_of(&tagged));
                        prop_assert!(set.is_ok(), "{:?}", set);
                    }
                    self.slots[s] = Some(Live { port, vlan, tagged });
                }
            }
            Op::Trunk(s, mask) => {
                let tagged = tagged_of(mask);
                let r = self
                    .sim
                    .sw
                    .set_port_policy(&format!("p{s}"), policy_of(&tagged));
                prop_assert_eq!(r.is_ok(), self.slots[s].is_some());
                if let Some(l) = &mut self.slots[s] {
                    l.tagged = tagged;
                }
            }
            Op::Del(s) => {
                let r = self.sim.sw.del_port(&format!("p{s}"));
                prop_assert_eq!(r.is_ok(), self.slots[s].is_some());
                // Frames still queued on it go with it.
                self.slots[s] = None;
                self.pending[s].clear();
            }
            Op::Send(s, dst, n, tag) => {
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
                        l.port.inject(&with_tag(numbered(to, station(s), seq), tag));
                    }
                    self.pending[s].push(Sent {
                        seq,
                        from: s,
                        dst,
                        tag,
                    });
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
        let member = |slots: &[Option<Live>], s: usize, v: u16| {
            slots[s].as_ref().is_some_and(|l| l.egress(v).is_some())
        };
        // Every frame queued on a live port was taken by this poll; its VLAN is decided by
        // the port's policy now (`None`: the port does not take it).
        let mut switched: BTreeMap<u64, (Sent, Option<u16>)> = BTreeMap::new();
        for s in 0..SLOTS {
            let Some(l) = &self.slots[s] else { continue };
            prop_assert_eq!(l.port.pending(), 0, "frames left on p{}", s);
            for sent in self.pending[s].drain(..) {
                let vlan = l.ingress(sent.tag);
                switched.insert(sent.seq, (sent, vlan));
            }
        }
        let mut receivers: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for r in 0..SLOTS {
            let Some(l) = &self.slots[r] else { continue };
            for f in l.port.take_captured() {
                let (tag, inner) = untag(&f);
                let seq = seq_of(&inner);
                let Some((sent, vlan)) = switched.get(&seq) else {
                    return Err(TestCaseError::fail(format!(
                        "p{r} got frame {seq}, which was not switched by this poll"
                    )));
                };
                prop_assert_ne!(r, sent.from, "frame {} went back out of its ingress", seq);
                let Some(vlan) = *vlan else {
                    return Err(TestCaseError::fail(format!(
                        "p{r} got frame {seq} (tag {:?}), which p{} does not take",
                        sent.tag, sent.from
                    )));
                };
                prop_assert_eq!(
                    l.egress(vlan),
                    Some(tag),
                    "frame {} of VLAN {} left p{} with tag {:?}",
                    seq,
                    vlan,
                    r,
                    tag
                );
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
            let Some(vlan) = vlan else { continue };
            match sent.dst {
                Dst::Broadcast => {
                    let mut want: Vec<usize> = (0..SLOTS)
                        .filter(|&s| s != sent.from && member(&self.slots, s, *vlan))
                        .collect();
                    let mut got = got.to_vec();
                    got.sort_unstable();
                    want.sort_unstable();
                    prop_assert_eq!(got, want, "broadcast {} from p{}", seq, sent.from);
                }
                Dst::Station(j) if j != sent.from && member(&self.slots, j, *vlan) => {
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
