//! The queue-placement runtime: which worker polls each rx queue, and how a queue moves.
//!
//! [`Core::replan`] turns the static plan ([`crate::control::placement::plan`]) and the operator's pins
//! into a worker per queue; [`Core::apply`] publishes that to the workers, handing a moving
//! queue off in two steps (see [`super`]); [`Core::housekeep`] ages addresses and, in dynamic
//! mode, lets [`crate::control::balance`] move queues by load. All of it runs under the control lock.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use qswitch_api::request::{MoveInfo, PortSetInfo};
use qswitch_api::PlacementMode;

use super::{Core, SwitchError, BALANCE_EVERY_NS};
use crate::control::balance::{Balancer, Decision, QueueLoad};
use crate::control::placement::{self, Plan, PortReq, Rule};
use crate::ids::{CpuId, PortId, WorkerId};
use crate::table::{PortEntry, PortTable};

/// How often learned addresses are aged out.
const SWEEP_EVERY_NS: u64 = 1_000_000_000;
/// How often the connection table's next entry slots are backed ahead of the workers.
const PREFAULT_EVERY_NS: u64 = 100_000_000;
/// Queue moves kept for `placement` to show.
const MOVES_KEPT: usize = 64;

/// Why a queue is on its worker.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reason {
    /// Where the static rules put it.
    Home,
    /// Pinned by the operator.
    Pinned,
    /// Gathered with the others at low load.
    Coalesced { total: f64 },
    /// Moved off a worker that was too busy.
    Spread { cpu: CpuId, busy: f64 },
    /// Moved to the worker of the queue carrying the other direction of its traffic.
    Paired { with: String },
}

/// Control-plane view of one rx queue.
#[derive(Debug, Clone)]
pub(super) struct QueueState {
    /// The worker that owns it (published), or none when no CPU is available.
    pub(super) worker: Option<WorkerId>,
    /// The worker of its CPU in the static plan.
    pub(super) home: Option<WorkerId>,
    /// Workers it may run on: its operator set, or any unreserved worker.
    allowed: Vec<WorkerId>,
    /// Its entry in [`Control::plan`]'s queues: the static rules behind the home CPU.
    plan_queue: Option<usize>,
    pin: Option<WorkerId>,
    pub(super) reason: Reason,
    /// Its busy-time counter at the last evaluation, and the load since.
    prev_busy_ns: u64,
    pub(super) load: f64,
}

/// Control-plane state, behind the one control lock.
pub(super) struct Control {
    /// Per worker (indexed by [`WorkerId`]): the (port, queue) pairs it polls now (as
    /// published).
    pub(super) published: Vec<Vec<(PortId, u16)>>,
    pub(super) queues: BTreeMap<(PortId, u16), QueueState>,
    /// Operator pins by port name and queue: the worker.
    pub(super) pins: BTreeMap<(String, u16), WorkerId>,
    pub(super) mode: PlacementMode,
    /// The static plan of the last full replan; its words are rendered only when reported.
    pub(super) plan: Plan,
    /// Ports were appended by [`Core::replan`]'s fast path since: `plan` (the rules in
    /// words, the warnings) and the queues' `plan_queue` are behind; a report replans fully
    /// first (same homes, see `replan_appended`).
    pub(super) plan_stale: bool,
    pub(super) port_sets: Vec<PortSetInfo>,
    pub(super) balancer: Balancer,
    /// Time of the last evaluation and each worker's busy counter then.
    pub(super) last_eval: Option<(u64, Vec<u64>)>,
    /// Packets each worker had sent to each port at the last evaluation, by (port, worker).
    pub(super) prev_tx: BTreeMap<(PortId, usize), u64>,
    /// Per worker (indexed by [`WorkerId`]): its busy share at the last evaluation.
    pub(super) worker_busy: Vec<f64>,
    pub(super) moves: VecDeque<MoveInfo>,
    pub(super) moves_total: u64,
    pub(super) next_sweep: u64,
    /// When [`crate::firewall::Firewall::prefault`] next runs.
    pub(super) next_prefault: u64,
    /// `Shared::bpdu_trips` at the last look for a tripped port.
    pub(super) trips_seen: u64,
    /// Ports added with [`Switch::add_ports_or_wait`](super::Switch::add_ports_or_wait)
    /// whose interface did not exist: listed, switching nothing, until it appears
    /// ([`Switch::attach_waiting`](super::Switch::attach_waiting)).
    pub(super) waiting: Vec<qswitch_api::PortConfig>,
    /// [`Core::activity`] at the last evaluation, and whether every queue's load was zero
    /// then: while both hold, an evaluation has nothing to measure ([`Core::rebalance`]).
    pub(super) idle_at: Option<u64>,
    /// A hand-off was postponed (a worker did not let go in time): housekeeping retries it.
    pub(super) handoff_postponed: bool,
    /// The slots of the ports housekeeping's LLDP tick looks at (an agent, or a bond's
    /// members' agents), worked out once per port table (a weak reference: it keeps no
    /// port open), so that a tick costs nothing per port without LLDP.
    pub(super) lldp_slots: (std::sync::Weak<PortTable>, Vec<usize>),
    /// Mirror sessions, in the order they were added ([`crate::mirror`]).
    pub(super) mirrors: Vec<Arc<crate::mirror::Session>>,
    /// The firewall's groups; compiled with the ports' `security_groups` into the rules in
    /// force whenever the port table changes ([`Switch::firewall`](super::Switch::firewall)).
    pub(super) security_groups: Vec<qswitch_api::config::SecurityGroupConfig>,
}

impl Control {
    /// The static rules behind `st`'s home CPU, in words.
    pub(super) fn why(&self, st: &QueueState) -> String {
        st.plan_queue
            .and_then(|i| self.plan.queues.get(i))
            .map(|q| self.plan.why(q))
            .unwrap_or_default()
    }

    /// The plan's warnings, in words.
    pub(super) fn plan_warnings(&self) -> Vec<String> {
        self.plan
            .warnings
            .iter()
            .chain(&self.plan.shared_warnings())
            .map(ToString::to_string)
            .collect()
    }
}

impl Core {
    /// The CPU worker `w` runs on.
    pub(super) fn cpu_of(&self, w: WorkerId) -> CpuId {
        self.workers[w.0].cpu
    }

    /// The workers running on `cpu`.
    fn workers_on(&self, cpu: CpuId) -> impl Iterator<Item = WorkerId> + '_ {
        self.workers
            .iter()
            .filter(move |w| w.cpu == cpu)
            .map(|w| w.id)
    }

    /// Recomputes the static plan for the ports of `table` and brings every queue's state up
    /// to date: new queues go home (or to their pin), queues of removed ports are forgotten.
    /// In static mode every queue goes home; in dynamic mode a queue stays where it is while
    /// that is allowed.
    pub(super) fn replan(&self, ctl: &mut Control, table: &PortTable) {
        if self.replan_appended(ctl, table) {
            ctl.plan_stale = true;
            return;
        }
        self.replan_full(ctl, table);
    }

    /// The placement report's view: a full replan if the fast path left the plan behind.
    pub(super) fn refresh_plan(&self, ctl: &mut Control) {
        if ctl.plan_stale {
            let table = self.shared.ports.load_full();
            self.replan_full(ctl, &table);
            // The same homes as the fast path gave (its tests check that): nothing moves,
            // but publish whatever differs all the same.
            self.apply(ctl, None);
        }
    }

    /// The fast path of [`Core::replan`] for the common way a switch grows: ports appended
    /// after every planned port, every port on the default rules (no CPU set, no NUMA node,
    /// no pins), and no more unreserved worker CPUs than planned ports with queues, so that
    /// every port's default set is one CPU before and after. Then [`placement::place`]
    /// gives the planned ports the same CPUs as before (a port's choice depends on the
    /// ports before it only), and each new port the least-held CPU, by the same keys:
    /// computing that for the new ports alone keeps `port add` at a thousand ports about
    /// as cheap as at ten. Returns false, changing nothing, when it does not apply.
    fn replan_appended(&self, ctl: &mut Control, table: &PortTable) -> bool {
        if !ctl.pins.is_empty() || !self.reserved.is_empty() {
            return false;
        }
        let ports: Vec<&Arc<PortEntry>> = table.iter().flatten().collect();
        let default = |p: &PortEntry| {
            p.config.cpu_set().is_none()
                && !matches!(&p.dev, crate::port::Device::AfXdp(a) if a.numa_node().is_some())
        };
        // The planned ports come first, in the same order, then the new ones.
        let planned = ctl.port_sets.len();
        if planned == 0
            || ports.len() <= planned
            || ports
                .iter()
                .zip(&ctl.port_sets)
                .any(|(p, s)| p.config.name != s.port || s.operator || s.cpus.len() != 1)
            || !ports.iter().all(|p| default(p))
        {
            return false;
        }
        let cpus: Vec<CpuId> = {
            let mut c: Vec<CpuId> = self.workers.iter().map(|w| w.cpu).collect();
            c.sort();
            c.dedup();
            c
        };
        let with_queues = |ps: &[&Arc<PortEntry>]| ps.iter().filter(|p| p.rx_queues() > 0).count();
        if cpus.len() > with_queues(&ports[..planned]) {
            return false;
        }
        // Every planned queue must still be there (a port changed in place replans fully).
        let planned_queues: usize = ports[..planned]
            .iter()
            .map(|p| usize::from(p.rx_queues()))
            .sum();
        if ctl.queues.len() != planned_queues {
            return false;
        }
        // The core (package, core) of each CPU, as place() sees it.
        let core_of = |c: CpuId| {
            self.topology
                .cpus
                .iter()
                .find(|i| i.cpu == c.0)
                .map_or((usize::MAX, c.0), |i| (i.package, i.core))
        };
        // Holders per CPU and per core (every set is one CPU), and queues per CPU in plan
        // order (for the turn of workers sharing a CPU).
        let mut holders: BTreeMap<CpuId, usize> = BTreeMap::new();
        let mut core_total: BTreeMap<(usize, usize), usize> = BTreeMap::new();
        for s in &ctl.port_sets {
            let c = CpuId(s.cpus[0]);
            *holders.entry(c).or_insert(0) += 1;
            *core_total.entry(core_of(c)).or_insert(0) += 1;
        }
        let mut turns: BTreeMap<CpuId, usize> = BTreeMap::new();
        for st in ctl.queues.values() {
            if let Some(h) = st.home {
                *turns.entry(self.cpu_of(h)).or_insert(0) += 1;
            }
        }
        let unreserved: Vec<WorkerId> = self.workers.iter().map(|w| w.id).collect();
        for p in &ports[planned..] {
            let queues = p.rx_queues();
            let cpu = if queues == 0 {
                None
            } else {
                // allocate_defaults' keys with one CPU per set and no NUMA node:
                // (held, node rank 0, others on the core, mine 0, cpu).
                cpus.iter().copied().min_by_key(|&c| {
                    let held = holders.get(&c).copied().unwrap_or(0);
                    let others = core_total.get(&core_of(c)).copied().unwrap_or(0);
                    (held, others, c.0)
                })
            };
            let set: Vec<usize> = cpu.map(|c| vec![c.0]).unwrap_or_default();
            if let Some(c) = cpu {
                *holders.entry(c).or_insert(0) += 1;
                *core_total.entry(core_of(c)).or_insert(0) += 1;
                let on_cpu: Vec<WorkerId> = self.workers_on(c).collect();
                for q in 0..queues {
                    let turn = turns.entry(c).or_insert(0);
                    let home = on_cpu.get(*turn % on_cpu.len().max(1)).copied();
                    *turn += 1;
                    ctl.queues.insert(
                        (p.id, q),
                        QueueState {
                            worker: home,
                            home,
                            allowed: unreserved.clone(),
                            plan_queue: None,
                            pin: None,
                            reason: Reason::Home,
                            prev_busy_ns: 0,
                            load: 0.0,
                        },
                    );
                }
            }
            ctl.port_sets.push(PortSetInfo {
                port: p.config.name.clone(),
                cpus: set,
                operator: false,
            });
        }
        true
    }

    /// Recomputes the whole static plan (see [`Core::replan`]).
    fn replan_full(&self, ctl: &mut Control, table: &PortTable) {
        let ports: Vec<&Arc<PortEntry>> = table.iter().flatten().collect();
        let reqs: Vec<PortReq> = ports
            .iter()
            .map(|p| PortReq {
                name: p.config.name.clone(),
                queues: p.rx_queues(),
                cpus: p.config.cpu_set(),
                numa_node: match &p.dev {
                    crate::port::Device::AfXdp(a) => a.numa_node().map(|n| n as usize),
                    _ => None,
                },
            })
            .collect();
        let cpus: Vec<usize> = self.workers.iter().map(|w| w.cpu.0).collect();
        // Without the words (O(ports²) when many ports share a CPU): they are rendered
        // when reported.
        let plan = placement::place(&self.topology, &cpus, &self.reserved, &reqs);
        let unreserved: Vec<WorkerId> = self
            .workers
            .iter()
            .filter(|w| !self.reserved.contains(&w.cpu.0))
            .map(|w| w.id)
            .collect();
        // Home workers: the plan's CPU; several workers on one CPU take turns.
        let mut per_cpu_turn: BTreeMap<CpuId, usize> = BTreeMap::new();
        let mut states = BTreeMap::new();
        // The plan lists the ports' sets in port order, and their queues by port, then queue.
        let mut next = 0;
        for (i, (p, req)) in ports.iter().zip(&reqs).enumerate() {
            let set = plan
                .port_sets
                .get(i)
                .filter(|(n, _)| *n == req.name)
                .map(|(_, s)| s.clone())
                .unwrap_or_default();
            let first = next;
            while plan.queues.get(next).is_some_and(|q| q.port == req.name) {
                next += 1;
            }
            let mine = first..next;
            let operator = req.cpus.is_some()
                && plan.queues[mine.clone()]
                    .iter()
                    .any(|q| q.rules.first() == Some(&Rule::OperatorSet));
            let allowed: Vec<WorkerId> = if operator {
                set.iter()
                    .flat_map(|&c| self.workers_on(CpuId(c)))
                    .collect()
            } else {
                unreserved.clone()
            };
            for (qi, q) in mine.map(|k| (k, &plan.queues[k])) {
                let on_cpu: Vec<WorkerId> = self.workers_on(CpuId(q.cpu)).collect();
                let turn = per_cpu_turn.entry(CpuId(q.cpu)).or_insert(0);
                let home = on_cpu.get(*turn % on_cpu.len().max(1)).copied();
                *turn += 1;
                let key = (p.id, q.queue);
                let old = ctl.queues.get(&key);
                let pin = if ctl.pins.is_empty() {
                    None
                } else {
                    ctl.pins.get(&(req.name.clone(), q.queue)).copied()
                };
                let stay = old
                    .and_then(|o| o.worker)
                    .filter(|w| ctl.mode == PlacementMode::Dynamic && allowed.contains(w));
                let (worker, reason) = match (pin, stay) {
                    (Some(w), _) => (Some(w), Reason::Pinned),
                    (None, Some(w)) => (
                        Some(w),
                        old.map_or(Reason::Home, |o| {
                            if o.reason == Reason::Pinned || Some(w) == home {
                                Reason::Home
                            } else {
                                o.reason.clone()
                            }
                        }),
                    ),
                    (None, None) => (home, Reason::Home),
                };
                states.insert(
                    key,
                    QueueState {
                        worker,
                        home,
                        allowed: allowed.clone(),
                        plan_queue: Some(qi),
                        pin,
                        reason,
                        prev_busy_ns: old.map_or(0, |o| o.prev_busy_ns),
                        load: old.map_or(0.0, |o| o.load),
                    },
                );
            }
        }
        ctl.queues = states;
        ctl.port_sets = plan
            .port_sets
            .iter()
            .zip(&reqs)
            .map(|((port, cpus), req)| PortSetInfo {
                port: port.clone(),
                cpus: cpus.clone(),
                operator: req.cpus.is_some(),
            })
            .collect();
        ctl.plan = plan;
        ctl.plan_stale = false;
    }

    /// Publishes the queue states (and `table`, if given) to the workers. A queue that changes
    /// worker is handed off in two steps (see the module documentation).
    pub(super) fn apply(&self, ctl: &mut Control, table: Option<PortTable>) {
        let table_given = table.is_some();
        let table = match table {
            Some(t) => Arc::new(t),
            None => self.shared.ports.load_full(),
        };
        let mut target: Vec<Vec<(PortId, u16)>> = vec![Vec::new(); self.workers.len()];
        for (&key, st) in &ctl.queues {
            if let Some(w) = st.worker {
                target[w.0].push(key);
            }
        }
        if !table_given && target == ctl.published {
            return;
        }
        let mut owner: BTreeMap<(PortId, u16), WorkerId> = BTreeMap::new();
        for (w, list) in ctl.published.iter().enumerate() {
            for &k in list {
                owner.insert(k, WorkerId(w));
            }
        }
        // Step 1: nobody gets a queue that another worker still has.
        let step1: Vec<Vec<(PortId, u16)>> = target
            .iter()
            .enumerate()
            .map(|(w, list)| {
                list.iter()
                    .copied()
                    .filter(|k| owner.get(k).is_none_or(|&o| o == WorkerId(w)))
                    .collect()
            })
            .collect();
        let handoff = step1 != target;
        let acked = self.publish(&table, &step1);
        ctl.published = step1;
        if handoff {
            if !acked {
                // A worker did not let go within the bound: giving its queue to another now
                // could have two workers on it. Leave the queue unpolled; the next change
                // retries.
                tracing::error!("a worker did not release its queues; moves postponed");
                ctl.handoff_postponed = true;
                return;
            }
            self.publish(&table, &target);
            ctl.published = target;
        }
        ctl.handoff_postponed = false;
    }

    /// Stores per-worker queue lists and the table, bumps the epoch, wakes the workers and
    /// waits (bounded) until each runs it. Returns whether all did.
    fn publish(&self, table: &Arc<PortTable>, lists: &[Vec<(PortId, u16)>]) -> bool {
        for (w, list) in self.workers.iter().zip(lists) {
            let queues: Vec<_> = list
                .iter()
                .filter_map(|(p, q)| {
                    table
                        .get(usize::from(p.0))
                        .cloned()
                        .flatten()
                        .map(|e| (e, *q))
                })
                .collect();
            w.queues.store(Arc::new(queues));
        }
        self.shared.ports.store(table.clone());
        self.shared.qos.notify();
        let epoch = self.shared.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        for w in &self.workers {
            let _ = w.wake.notify();
        }
        // Workers without threads take the change now, as a thread would between bursts.
        if let Some(m) = &self.manual {
            for w in m.lock().workers.iter_mut() {
                w.sync(&self.shared);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut all = true;
        // A woken worker acknowledges within microseconds: give up the CPU to it a few
        // hundred times before falling back to short sleeps.
        let mut yields = 0u32;
        for w in &self.workers {
            loop {
                let seen = w.seen_epoch.load(Ordering::Acquire);
                if seen != u64::MAX && seen >= epoch {
                    break;
                }
                if Instant::now() > deadline || self.shared.stopping() {
                    tracing::warn!(
                        worker = w.id.0,
                        "worker did not pick up a change within 5 s"
                    );
                    all = false;
                    break;
                }
                if yields < 500 {
                    yields += 1;
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
        }
        all
    }

    /// Periodic work: age out addresses every second, log ports bpdu_guard disabled,
    /// evaluate placement every [`BALANCE_EVERY_NS`].
    pub(super) fn housekeep(&self, now: u64) {
        let mut ctl = self.control.lock();
        if now >= ctl.next_sweep {
            ctl.next_sweep = now + SWEEP_EVERY_NS;
            self.shared.fdb.sweep(now);
            // Idle connections go (a shard locked at a time; nothing when no port is
            // filtered).
            self.shared.firewall.expire(now);
        }
        if now >= ctl.next_prefault {
            // The connection table's next slots backed here rather than by a worker's
            // page faults (nothing without a table or when it did not grow).
            ctl.next_prefault = now + PREFAULT_EVERY_NS;
            self.shared.firewall.prefault();
        }
        // Ports disabled by bpdu_guard since the last look, logged once; only looked for when
        // a port tripped, so an idle tick costs nothing per port.
        let trips = self.shared.bpdu_trips.load(Ordering::Acquire);
        if trips != ctl.trips_seen {
            ctl.trips_seen = trips;
            for p in self.shared.ports.load().iter().flatten() {
                if p.disabled.take_tripped() {
                    tracing::warn!(
                        port = %p.config.name,
                        "BPDU received on a port with bpdu_guard: port disabled until `qswitch port enable {}`",
                        p.config.name
                    );
                }
            }
        }
        self.lldp_tick(&mut ctl, now);
        self.sync_fastpath(now);
        let due = ctl
            .last_eval
            .as_ref()
            .is_none_or(|(t, _)| now.saturating_sub(*t) >= BALANCE_EVERY_NS);
        if due && !self.shared.stopping() {
            self.rebalance(&mut ctl, now);
            // Retries a hand-off that a slow worker made us postpone (a move publishes
            // itself in `rebalance`).
            if ctl.handoff_postponed {
                self.apply(&mut ctl, None);
            }
        }
    }

    /// Mirrors the fdb into the veth ports' kernel fast path, if there is one (see
    /// [`crate::port::veth`]): every housekeeping tick, and at once after a port is added or
    /// removed, its policy set or a mirror session added or removed; QoS settings and
    /// captures take a veth port off (or back onto) the fast path at the next tick, at most
    /// [`super::start::HOUSEKEEP_EVERY`] later.
    pub(super) fn sync_fastpath(&self, now: u64) {
        self.drivers
            .veth
            .sync(&self.shared.ports.load(), &self.shared.fdb, now);
    }

    /// Measures every queue's and worker's load since the last evaluation and, in dynamic
    /// mode, carries out what the balancer decides.
    ///
    /// Idle costs nothing per queue: when no worker moved a frame since an evaluation that
    /// found every queue's load zero ([`Core::activity`] stood still), no queue's busy time
    /// or transmit count can have moved either (a worker adds to them only for a burst that
    /// moved frames), so the loads stay zero without being read; with every queue on one
    /// worker the balancer could then only keep them there ([`Balancer::idle`]).
    fn rebalance(&self, ctl: &mut Control, now: u64) {
        let activity = self.activity();
        let busy_now: Vec<u64> = self
            .workers
            .iter()
            .map(|w| w.counters.busy_ns.get())
            .collect();
        let one_worker = ctl.published.iter().filter(|l| !l.is_empty()).count() <= 1;
        if ctl.last_eval.is_some()
            && ctl.idle_at == Some(activity)
            && (one_worker || ctl.mode != PlacementMode::Dynamic)
        {
            ctl.last_eval = Some((now, busy_now));
            ctl.worker_busy.iter_mut().for_each(|b| *b = 0.0);
            if ctl.mode == PlacementMode::Dynamic {
                ctl.balancer.idle();
            }
            return;
        }
        let table = self.shared.ports.load_full();
        let Some((then, busy_then)) = ctl.last_eval.replace((now, busy_now.clone())) else {
            for (&(p, q), st) in ctl.queues.iter_mut() {
                st.prev_busy_ns = queue_busy(&table, p, q);
            }
            return;
        };
        let dt = now.saturating_sub(then).max(1) as f64;
        ctl.worker_busy = busy_now
            .iter()
            .zip(&busy_then)
            .map(|(n, t)| (n.saturating_sub(*t) as f64 / dt).min(1.0))
            .collect();
        let mut all_idle = true;
        for (&(p, q), st) in ctl.queues.iter_mut() {
            let b = queue_busy(&table, p, q);
            st.load = (b.saturating_sub(st.prev_busy_ns) as f64 / dt).min(1.0);
            st.prev_busy_ns = b;
            all_idle &= st.load == 0.0;
        }
        // The activity read before the counters: a burst after it shows at the next look.
        ctl.idle_at = all_idle.then_some(activity);
        // What each worker sent to each port since the last evaluation.
        let mut sent: BTreeMap<(PortId, usize), u64> = BTreeMap::new();
        for e in table.iter().flatten() {
            for (w, c) in e.counters.tx.iter().enumerate() {
                let n = c.tx_packets.get();
                let before = ctl.prev_tx.insert((e.id, w), n).unwrap_or(n);
                sent.insert((e.id, w), n.saturating_sub(before));
            }
        }
        ctl.prev_tx.retain(|k, _| sent.contains_key(k));
        if ctl.mode != PlacementMode::Dynamic {
            return;
        }
        let keys: Vec<(PortId, u16)> = ctl
            .queues
            .iter()
            .filter(|(_, st)| st.worker.is_some() && st.home.is_some())
            .map(|(k, _)| *k)
            .collect();
        let mut loads: Vec<QueueLoad> = keys
            .iter()
            .map(|k| {
                let st = &ctl.queues[k];
                // The balancer works on plain worker indices.
                let current = st.worker.map_or(0, |w| w.0);
                let mut allowed: Vec<usize> = st.allowed.iter().map(|w| w.0).collect();
                if !allowed.contains(&current) {
                    allowed.push(current);
                }
                allowed.sort_unstable();
                QueueLoad {
                    load: st.load,
                    current,
                    home: st.home.map_or(current, |w| w.0),
                    allowed,
                    pinned: st.pin.is_some(),
                    partner: None,
                }
            })
            .collect();
        for (i, j) in partners(&keys, &loads, &sent, dt) {
            loads[i].partner = Some(j);
        }
        let busy = ctl.worker_busy.clone();
        let (targets, reason) = match ctl.balancer.evaluate(&loads, &busy) {
            Decision::Keep => return,
            Decision::Coalesce { targets, total, .. } => (targets, Reason::Coalesced { total }),
            Decision::Pair {
                targets,
                queues: (_, to),
            } => {
                let (p, q) = keys[to];
                let with = format!("{}/{q}", port_name(&table, p));
                (targets, Reason::Paired { with })
            }
            Decision::Spread { targets, hot, busy } => (
                targets,
                Reason::Spread {
                    cpu: self.cpu_of(WorkerId(hot)),
                    busy,
                },
            ),
        };
        let mut moved = 0;
        for (k, &to) in keys.iter().zip(&targets) {
            let to = WorkerId(to);
            let name = port_name(&table, k.0);
            let Some(st) = ctl.queues.get_mut(k) else {
                continue;
            };
            if st.worker == Some(to) {
                continue;
            }
            let from_cpu = st.worker.map(|w| self.cpu_of(w));
            st.worker = Some(to);
            st.reason = if st.home == Some(to) {
                Reason::Home
            } else {
                reason.clone()
            };
            let why = match &reason {
                Reason::Coalesced { total } => format!(
                    "coalesce: all queues together use {:.1}% of a core",
                    total * 100.0
                ),
                Reason::Spread { cpu, busy } => {
                    format!(
                        "spread: the worker on CPU {cpu} was {:.0}% busy",
                        busy * 100.0
                    )
                }
                Reason::Paired { with } => {
                    format!("pair: with {with}, which carries the other direction of its traffic")
                }
                _ => String::new(),
            };
            let to_cpu = self.cpu_of(to);
            tracing::info!(port = %name, queue = k.1, from = ?from_cpu.map(|c| c.0), to = to_cpu.0, "{why}");
            record_move(ctl, now, name, k.1, from_cpu, to_cpu, why);
            moved += 1;
        }
        if moved > 0 {
            self.apply(ctl, None);
        }
    }

    /// Pins rx queue `queue` of port `port` to the worker on `cpu` (`None` removes the pin).
    /// The queue moves there at once, without loss or reordering.
    pub fn pin(&self, port: &str, queue: u16, cpu: Option<usize>) -> Result<(), SwitchError> {
        let mut ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let entry = table
            .iter()
            .flatten()
            .find(|p| p.config.name == port)
            .ok_or_else(|| SwitchError::NoSuchPort(port.to_string()))?;
        let key = (entry.id, queue);
        if !ctl.queues.contains_key(&key) {
            return Err(SwitchError::NoSuchQueue {
                port: port.to_string(),
                queue,
                queues: entry.rx_queues(),
            });
        }
        let worker = match cpu {
            Some(cpu) => {
                if self.reserved.contains(&cpu) {
                    return Err(SwitchError::ReservedCpu(cpu));
                }
                Some(self.workers_on(CpuId(cpu)).next().ok_or_else(|| {
                    SwitchError::NoWorkerOnCpu {
                        cpu,
                        workers: qswitch_api::CpuList::from_cpus(
                            self.workers.iter().map(|w| w.cpu.0),
                        )
                        .map_or_else(|| "none".into(), |l| l.to_string()),
                    }
                })?)
            }
            None => None,
        };
        let now = self.shared.now();
        let mode = ctl.mode;
        let (from, to) = match ctl.queues.get_mut(&key) {
            Some(st) => {
                let from = st.worker;
                st.pin = worker;
                st.reason = if worker.is_some() {
                    Reason::Pinned
                } else {
                    Reason::Home
                };
                if worker.is_some() {
                    st.worker = worker;
                } else if mode == PlacementMode::Static {
                    st.worker = st.home;
                }
                (from, st.worker)
            }
            None => (None, None),
        };
        match worker {
            Some(w) => ctl.pins.insert((port.to_string(), queue), w),
            None => ctl.pins.remove(&(port.to_string(), queue)),
        };
        if let (Some(to), true) = (to, to != from) {
            let (from_cpu, to_cpu) = (from.map(|w| self.cpu_of(w)), self.cpu_of(to));
            let why = if worker.is_some() {
                "pinned by the operator"
            } else {
                "unpinned"
            };
            record_move(
                &mut ctl,
                now,
                port.to_string(),
                queue,
                from_cpu,
                to_cpu,
                why.into(),
            );
        }
        self.apply(&mut ctl, None);
        Ok(())
    }

    /// Switches placement between dynamic and static. Going static sends every queue that is
    /// not pinned home.
    pub fn set_placement_mode(&self, mode: PlacementMode) {
        let mut ctl = self.control.lock();
        ctl.mode = mode;
        ctl.balancer = Balancer::default();
        if mode == PlacementMode::Static {
            let now = self.shared.now();
            let table = self.shared.ports.load_full();
            let mut moves = Vec::new();
            for (&(p, q), st) in ctl.queues.iter_mut() {
                if st.pin.is_none() && st.worker != st.home {
                    moves.push((p, q, st.worker, st.home));
                    st.worker = st.home;
                    st.reason = Reason::Home;
                }
            }
            for (p, q, from, to) in moves {
                if let Some(to) = to {
                    let name = port_name(&table, p);
                    let from_cpu = from.map(|w| self.cpu_of(w));
                    let to_cpu = self.cpu_of(to);
                    record_move(
                        &mut ctl,
                        now,
                        name,
                        q,
                        from_cpu,
                        to_cpu,
                        "static placement".into(),
                    );
                }
            }
        }
        self.apply(&mut ctl, None);
        tracing::info!(%mode, "placement mode changed");
    }
}

/// Least packets per second each way before two queues count as one conversation.
const PAIR_MIN_PPS: f64 = 1000.0;
/// Share of a worker's transmitted packets that must go to one port for the worker's queue
/// to count as talking to that port.
const PAIR_SHARE: f64 = 0.9;
/// Least load (share of a worker's time) for a queue to count as carrying traffic in the
/// pair rule; quieter queues (the idle queues of a multi-queue port) are not counted.
const PAIR_ACTIVE_LOAD: f64 = 0.02;

/// Conversations for the balancer's pair rule, as (queue, partner) index pairs into `keys`
/// (both directions listed). Only *active* queues count (load ≥ [`PAIR_ACTIVE_LOAD`]).
/// Active queue *i* of port P talks to port D when its worker polls no other active queue
/// (so what the worker sent is what queue *i* brought in) and sent at least [`PAIR_SHARE`]
/// of its packets, and [`PAIR_MIN_PPS`], to D; its partner is D's only active queue, when
/// that queue talks back to P the same way and P has no other active queue. So one TCP
/// flow through a multi-queue uplink (the NIC hashes it to one queue; the others idle)
/// pairs like a single-queue one, while ports with several busy queues are never paired
/// (which of their queues a reply arrives on is not known here).
fn partners(
    keys: &[(PortId, u16)],
    loads: &[QueueLoad],
    sent: &BTreeMap<(PortId, usize), u64>,
    dt_ns: f64,
) -> Vec<(usize, usize)> {
    let min = (PAIR_MIN_PPS * dt_ns / 1e9).max(1.0) as u64;
    let active = |i: usize| loads[i].load >= PAIR_ACTIVE_LOAD;
    let on = |w: usize| {
        (0..loads.len())
            .filter(|&i| active(i) && loads[i].current == w)
            .count()
    };
    let active_of = |p: PortId| {
        (0..keys.len())
            .filter(|&i| active(i) && keys[i].0 == p)
            .count()
    };
    // The port active queue i's worker sends nearly everything to, if any.
    let talks_to = |i: usize| -> Option<PortId> {
        let w = loads[i].current;
        if !active(i) || on(w) != 1 {
            return None;
        }
        let mut total = 0;
        let mut best: Option<(PortId, u64)> = None;
        for (&(p, pw), &n) in sent {
            if pw != w {
                continue;
            }
            total += n;
            if best.is_none_or(|(_, b)| n > b) {
                best = Some((p, n));
            }
        }
        let (p, n) = best?;
        (n >= min && n as f64 >= PAIR_SHARE * total as f64).then_some(p)
    };
    let mut out = Vec::new();
    for i in 0..keys.len() {
        let Some(d) = talks_to(i) else { continue };
        if d == keys[i].0 || active_of(d) != 1 || active_of(keys[i].0) != 1 {
            continue;
        }
        let Some(j) = (0..keys.len()).find(|&j| active(j) && keys[j].0 == d) else {
            continue;
        };
        if talks_to(j) == Some(keys[i].0) {
            out.push((i, j));
        }
    }
    out
}

/// Port `p`'s name, or "" when it is gone.
fn port_name(table: &PortTable, p: PortId) -> String {
    table
        .get(usize::from(p.0))
        .and_then(|e| e.as_ref())
        .map(|e| e.config.name.clone())
        .unwrap_or_default()
}

fn queue_busy(table: &PortTable, p: PortId, q: u16) -> u64 {
    table
        .get(usize::from(p.0))
        .and_then(|e| e.as_ref())
        .and_then(|e| e.counters.rx.get(usize::from(q)))
        .map_or(0, |c| c.busy_ns.get())
}

fn record_move(
    ctl: &mut Control,
    now: u64,
    port: String,
    queue: u16,
    from_cpu: Option<CpuId>,
    to_cpu: CpuId,
    reason: String,
) {
    ctl.moves_total += 1;
    if ctl.moves.len() == MOVES_KEPT {
        ctl.moves.pop_front();
    }
    ctl.moves.push_back(MoveInfo {
        at_ms: now / 1_000_000,
        port,
        queue,
        from_cpu: from_cpu.map(|c| c.0),
        to_cpu: to_cpu.0,
        reason,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(current: usize) -> QueueLoad {
        QueueLoad {
            load: 0.4,
            current,
            home: current,
            allowed: vec![0, 1],
            pinned: false,
            partner: None,
        }
    }

    /// One second of counters: worker 0 polls the uplink's queue, worker 1 the TAP's.
    fn sent(up_to_tap: u64, tap_to_up: u64, noise: u64) -> BTreeMap<(PortId, usize), u64> {
        BTreeMap::from([
            ((PortId(1), 0), up_to_tap),
            ((PortId(0), 1), tap_to_up),
            ((PortId(2), 0), noise),
        ])
    }

    #[test]
    fn two_single_queue_ports_talking_to_each_other_are_partners() {
        let keys = [(PortId(0), 0), (PortId(1), 0)];
        let loads = [q(0), q(1)];
        assert_eq!(
            partners(&keys, &loads, &sent(800_000, 20_000, 0), 1e9),
            vec![(0, 1), (1, 0)]
        );
    }

    #[test]
    fn no_partners_for_little_traffic_shared_workers_several_queues_or_a_third_port() {
        let keys = [(PortId(0), 0), (PortId(1), 0)];
        // Below PAIR_MIN_PPS one way.
        assert!(partners(&keys, &[q(0), q(1)], &sent(800_000, 10, 0), 1e9).is_empty());
        // Much of worker 0's traffic goes to a third port.
        assert!(partners(&keys, &[q(0), q(1)], &sent(800_000, 20_000, 200_000), 1e9).is_empty());
        // Already on one worker: what the worker sent cannot be told apart by queue.
        assert!(partners(&keys, &[q(0), q(0)], &sent(800_000, 20_000, 0), 1e9).is_empty());
        // The uplink has two busy rx queues: which one the replies belong to is unknown.
        let keys3 = [(PortId(0), 0), (PortId(0), 1), (PortId(1), 0)];
        let loads3 = [q(0), q(0), q(1)];
        assert!(partners(&keys3, &loads3, &sent(800_000, 20_000, 0), 1e9).is_empty());
        let loads3 = [q(0), q(1), q(1)];
        assert!(partners(&keys3, &loads3, &sent(800_000, 20_000, 0), 1e9).is_empty());
    }

    #[test]
    fn idle_queues_of_a_multi_queue_port_do_not_count() {
        // A 4-queue uplink (port 0): the flow hashed to queue 2 on worker 0; the idle
        // queues sit on both workers, beside the TAP's queue (port 1) on worker 1.
        let keys = [
            (PortId(0), 0),
            (PortId(0), 1),
            (PortId(0), 2),
            (PortId(0), 3),
            (PortId(1), 0),
        ];
        let idle = |w| QueueLoad {
            load: 0.001,
            ..q(w)
        };
        let loads = [idle(0), idle(1), q(0), idle(1), q(1)];
        assert_eq!(
            partners(&keys, &loads, &sent(800_000, 20_000, 0), 1e9),
            vec![(2, 4), (4, 2)]
        );
    }
}
