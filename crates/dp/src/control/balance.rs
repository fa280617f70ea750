//! Dynamic placement (Dynamic VMQ, done right): from measured per-queue load, coalesce queues
//! onto fewer workers at low load and spread them at high load, with hysteresis.
//!
//! [`Balancer::evaluate`] is a pure function of the loads it is given (plus a little memory
//! for hysteresis); the switch measures, calls it about every half second, and carries out
//! the moves it returns (each one a lossless hand-off, see `control/switch/mod.rs`).
//!
//! # Rules
//! - A queue's *load* is the fraction of a core its worker spent on its bursts (rx, switching
//!   and tx to completion) over the last interval; a worker's *busy* is the fraction of the
//!   interval it spent on bursts at all.
//! - **Spread** as soon as a worker is at least [`SPREAD_BUSY`] busy and holds two or more
//!   queues of which one could run elsewhere: queues away from their home (the static plan's
//!   CPU) go home; if all are home already, the lightest queue moves to the least busy worker
//!   it may use, if that worker then stays [`SPREAD_GAIN`] below the hot one. Spreading reacts within one evaluation.
//! - **Coalesce** when every queue together would fit on fewer workers at [`PACK`] load each,
//!   for [`COALESCE_AFTER`] evaluations in a row, and not within [`SETTLE`] evaluations of a
//!   spread: the queues gather on the workers already carrying the most load (fewest moves),
//!   and the emptied workers sleep. The gap between [`PACK`] and [`SPREAD_BUSY`] is the
//!   hysteresis that keeps a queue from flapping.
//! - **Pair** two queues that carry one conversation — each mostly sends to the other's
//!   port, like an uplink's rx queue (TCP data toward a TAP port) and the TAP's rx queue (the
//!   ACKs back) — when they run on different workers, for [`PAIR_AFTER`] evaluations in a
//!   row: the lighter goes to the other's worker, so a reply is switched by the thread that
//!   switched the frame it answers, right after it, instead of waking a second worker on
//!   another CPU (on a 2-CPU machine, one TCP stream through a veth uplink: 9.8 Gbit/s paired
//!   against 7.6 apart). The switch says which queues are partners ([`QueueLoad::partner`]).
//!   Measured loads do not add up here (the two workers were ~50 % busy each; paired, one
//!   is ~60 %), so pairing does not look at them: if the paired worker gets too busy, the
//!   spread rule separates the two again, and after any spread nothing is paired until the
//!   queues have coalesced at low load (no flapping between the two).
//! - Pinned queues never move, and a queue only ever goes to a worker in its `allowed` set.

/// A worker this busy (fraction of its time) with more than one queue triggers a spread.
pub const SPREAD_BUSY: f64 = 0.8;
/// Coalescing packs workers up to this load.
pub const PACK: f64 = 0.5;
/// A queue moved while spreading must leave its new worker at least this much less busy than
/// the hot worker was.
pub const SPREAD_GAIN: f64 = 0.1;
/// Evaluations in a row that must call for coalescing before it happens.
pub const COALESCE_AFTER: u32 = 3;
/// Evaluations after a spread during which nothing coalesces.
pub const SETTLE: u32 = 20;
/// Evaluations in a row that must find a conversation split over two workers before its
/// queues are paired.
pub const PAIR_AFTER: u32 = 2;

/// One queue as the balancer sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueLoad {
    /// Fraction of a core (0.0..).
    pub load: f64,
    /// The worker that runs it now.
    pub current: usize,
    /// The worker the static plan gives it.
    pub home: usize,
    /// Workers it may run on (ascending; contains `home`).
    pub allowed: Vec<usize>,
    /// Pinned by the operator: never moved.
    pub pinned: bool,
    /// The queue (index into the same slice) that carries the other direction of this
    /// queue's traffic, if one does (see the pair rule in the module docs).
    pub partner: Option<usize>,
}

impl QueueLoad {
    fn movable(&self) -> bool {
        !self.pinned && self.allowed.len() > 1
    }
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Leave everything where it is.
    Keep,
    /// Gather the queues on fewer workers: `targets[i]` is queue *i*'s worker.
    Coalesce {
        targets: Vec<usize>,
        /// Total load of all queues.
        total: f64,
        /// Workers in use before and after.
        from: usize,
        to: usize,
    },
    /// Put the two queues of a conversation on one worker: `targets[i]` is queue *i*'s worker;
    /// `queues` are the two (the first moves to the second's worker).
    Pair {
        targets: Vec<usize>,
        queues: (usize, usize),
    },
    /// Move queues off a hot worker: `targets[i]` is queue *i*'s worker.
    Spread {
        targets: Vec<usize>,
        /// The worker that was too busy, and how busy.
        hot: usize,
        busy: f64,
    },
}

/// Hysteresis memory between evaluations.
#[derive(Debug, Clone, Default)]
pub struct Balancer {
    low_streak: u32,
    settle: u32,
    pair_streak: u32,
    /// A spread happened since the last coalesce (or reset): no pairing until one.
    spread_since_coalesce: bool,
}

impl Balancer {
    /// What [`Balancer::evaluate`] does, without the loads, for an interval in which no
    /// queue carried anything and every queue is on one worker: nothing to spread, pair or
    /// coalesce, so it keeps them, and its streaks restart.
    pub fn idle(&mut self) {
        self.settle = self.settle.saturating_sub(1);
        self.pair_streak = 0;
        self.low_streak = 0;
    }

    /// Decides from the loads of the last interval. `busy[w]` is worker *w*'s busy fraction.
    pub fn evaluate(&mut self, queues: &[QueueLoad], busy: &[f64]) -> Decision {
        self.settle = self.settle.saturating_sub(1);
        if let Some(d) = spread(queues, busy) {
            self.low_streak = 0;
            self.pair_streak = 0;
            self.settle = SETTLE;
            self.spread_since_coalesce = true;
            return d;
        }
        match pair(queues) {
            Some(d) if !self.spread_since_coalesce && self.settle == 0 => {
                self.pair_streak += 1;
                if self.pair_streak >= PAIR_AFTER {
                    self.pair_streak = 0;
                    self.low_streak = 0;
                    return d;
                }
            }
            _ => self.pair_streak = 0,
        }
        let total: f64 = queues.iter().map(|q| q.load.max(0.0)).sum();
        let in_use = workers_in_use(queues.iter().map(|q| q.current));
        let want = ((total / PACK).ceil() as usize).max(1);
        if want >= in_use || self.settle > 0 {
            self.low_streak = 0;
            return Decision::Keep;
        }
        self.low_streak += 1;
        if self.low_streak < COALESCE_AFTER {
            return Decision::Keep;
        }
        self.low_streak = 0;
        let targets = coalesce(queues, want);
        let to = workers_in_use(targets.iter().copied());
        if to >= in_use {
            return Decision::Keep;
        }
        self.spread_since_coalesce = false;
        Decision::Coalesce {
            targets,
            total,
            from: in_use,
            to,
        }
    }
}

fn workers_in_use(workers: impl Iterator<Item = usize>) -> usize {
    let mut v: Vec<usize> = workers.collect();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// Load per worker if queue *i* ran on `at(i)`.
fn loads(
    queues: &[QueueLoad],
    at: impl Fn(usize) -> usize,
) -> std::collections::BTreeMap<usize, f64> {
    let mut m = std::collections::BTreeMap::new();
    for (i, q) in queues.iter().enumerate() {
        *m.entry(at(i)).or_insert(0.0) += q.load.max(0.0);
    }
    m
}

fn spread(queues: &[QueueLoad], busy: &[f64]) -> Option<Decision> {
    // The hottest worker that is over the line and has a queue that could go elsewhere.
    let hot = (0..busy.len())
        .filter(|&w| busy[w] >= SPREAD_BUSY)
        .filter(|&w| {
            let mine: Vec<&QueueLoad> = queues.iter().filter(|q| q.current == w).collect();
            mine.len() > 1 && mine.iter().any(|q| q.movable())
        })
        .max_by(|&a, &b| busy[a].total_cmp(&busy[b]).then(b.cmp(&a)))?;
    let mut targets: Vec<usize> = queues.iter().map(|q| q.current).collect();
    // First: queues of the hot worker that are away from home go home.
    let mut moved = false;
    for (i, q) in queues.iter().enumerate() {
        if q.current == hot && q.movable() && q.home != hot && q.allowed.contains(&q.home) {
            targets[i] = q.home;
            moved = true;
        }
    }
    if !moved {
        // Everything is home: move the lightest queue that fits to the least busy worker.
        let load = loads(queues, |i| queues[i].current);
        let busy_of = |w: usize| {
            busy.get(w)
                .copied()
                .unwrap_or(0.0)
                .max(load.get(&w).copied().unwrap_or(0.0))
        };
        let mut mine: Vec<usize> = (0..queues.len())
            .filter(|&i| queues[i].current == hot && queues[i].movable())
            .collect();
        mine.sort_by(|&a, &b| queues[a].load.total_cmp(&queues[b].load).then(a.cmp(&b)));
        'pick: for i in mine {
            let q = &queues[i];
            let best = q
                .allowed
                .iter()
                .copied()
                .filter(|&w| w != hot)
                .min_by(|&a, &b| busy_of(a).total_cmp(&busy_of(b)).then(a.cmp(&b)));
            if let Some(w) = best {
                if busy_of(w) + q.load.max(0.0) < busy[hot] - SPREAD_GAIN {
                    targets[i] = w;
                    moved = true;
                    break 'pick;
                }
            }
        }
    }
    moved.then(|| Decision::Spread {
        targets,
        hot,
        busy: busy[hot],
    })
}

/// The first conversation split over two workers that one move can join: the lighter queue
/// goes to its partner's worker (the other way round when it may not run there).
fn pair(queues: &[QueueLoad]) -> Option<Decision> {
    for (i, q) in queues.iter().enumerate() {
        let Some(j) = q.partner.filter(|&j| j != i) else {
            continue;
        };
        let Some(p) = queues.get(j) else { continue };
        if p.partner != Some(i) || p.current == q.current {
            continue;
        }
        let can = |a: &QueueLoad, b: &QueueLoad| a.movable() && a.allowed.contains(&b.current);
        let (lighter, heavier) = if q.load <= p.load { (i, j) } else { (j, i) };
        let (from, to) = if can(&queues[lighter], &queues[heavier]) {
            (lighter, heavier)
        } else if can(&queues[heavier], &queues[lighter]) {
            (heavier, lighter)
        } else {
            continue;
        };
        let mut targets: Vec<usize> = queues.iter().map(|q| q.current).collect();
        targets[from] = queues[to].current;
        return Some(Decision::Pair {
            targets,
            queues: (from, to),
        });
    }
    None
}

fn coalesce(queues: &[QueueLoad], want: usize) -> Vec<usize> {
    let load = loads(queues, |i| queues[i].current);
    let count = |w: usize| queues.iter().filter(|q| q.current == w).count();
    // Gather on the workers carrying the most now: fewest moves.
    let mut order: Vec<usize> = load.keys().copied().collect();
    order.sort_by(|&a, &b| {
        load[&b]
            .total_cmp(&load[&a])
            .then(count(b).cmp(&count(a)))
            .then(a.cmp(&b))
    });
    order.truncate(want);
    let mut targets: Vec<usize> = queues.iter().map(|q| q.current).collect();
    let mut projected: std::collections::BTreeMap<usize, f64> = std::collections::BTreeMap::new();
    // Queues that stay (pinned, or already on a gathering worker) count first.
    let mut moving = Vec::new();
    for (i, q) in queues.iter().enumerate() {
        if !q.movable() || order.contains(&q.current) {
            *projected.entry(q.current).or_insert(0.0) += q.load.max(0.0);
        } else {
            moving.push(i);
        }
    }
    moving.sort_by(|&a, &b| queues[b].load.total_cmp(&queues[a].load).then(a.cmp(&b)));
    for i in moving {
        let q = &queues[i];
        let p = |w: usize| projected.get(&w).copied().unwrap_or(0.0);
        let best = order
            .iter()
            .copied()
            .filter(|w| q.allowed.contains(w))
            .min_by(|&a, &b| p(a).total_cmp(&p(b)).then(a.cmp(&b)));
        let w = best.unwrap_or(q.current);
        targets[i] = w;
        *projected.entry(w).or_insert(0.0) += q.load.max(0.0);
    }
    targets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(load: f64, current: usize, home: usize) -> QueueLoad {
        QueueLoad {
            load,
            current,
            home,
            allowed: vec![0, 1],
            pinned: false,
            partner: None,
        }
    }

    fn run(b: &mut Balancer, queues: &[QueueLoad], busy: &[f64], times: u32) -> Decision {
        let mut d = Decision::Keep;
        for _ in 0..times {
            d = b.evaluate(queues, busy);
        }
        d
    }

    #[test]
    fn low_load_coalesces_after_a_streak() {
        let mut b = Balancer::default();
        let qs = [q(0.02, 0, 0), q(0.01, 1, 1)];
        assert_eq!(b.evaluate(&qs, &[0.02, 0.01]), Decision::Keep);
        assert_eq!(b.evaluate(&qs, &[0.02, 0.01]), Decision::Keep);
        match b.evaluate(&qs, &[0.02, 0.01]) {
            Decision::Coalesce {
                targets, from, to, ..
            } => {
                assert_eq!(targets, vec![0, 0], "onto the busier worker");
                assert_eq!((from, to), (2, 1));
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn high_load_spreads_at_once_to_home() {
        let mut b = Balancer::default();
        let qs = [q(0.5, 0, 0), q(0.45, 0, 1)];
        match b.evaluate(&qs, &[0.97, 0.0]) {
            Decision::Spread { targets, hot, .. } => {
                assert_eq!(targets, vec![0, 1]);
                assert_eq!(hot, 0);
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn spread_beyond_home_when_home_is_hot() {
        let mut b = Balancer::default();
        // Both queues' home is worker 0 (e.g. a shared default set); worker 1 is idle.
        let qs = [q(0.6, 0, 0), q(0.4, 0, 0)];
        match b.evaluate(&qs, &[0.99, 0.0]) {
            Decision::Spread { targets, .. } => assert_eq!(targets, vec![0, 1]),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn no_flapping_between_thresholds() {
        let mut b = Balancer::default();
        // Spread, then load at 0.3 per worker: 0.6 total does not fit one worker at PACK.
        let qs = [q(0.3, 0, 0), q(0.3, 1, 1)];
        assert_eq!(run(&mut b, &qs, &[0.3, 0.3], 10), Decision::Keep);
        // A spread blocks coalescing for SETTLE evaluations even when load drops.
        let hot = [q(0.5, 0, 0), q(0.45, 0, 1)];
        assert!(matches!(
            b.evaluate(&hot, &[0.95, 0.0]),
            Decision::Spread { .. }
        ));
        let low = [q(0.01, 0, 0), q(0.01, 1, 1)];
        assert_eq!(run(&mut b, &low, &[0.01, 0.01], SETTLE - 1), Decision::Keep);
        assert!(matches!(
            run(&mut b, &low, &[0.01, 0.01], COALESCE_AFTER),
            Decision::Coalesce { .. }
        ));
    }

    #[test]
    fn pinned_and_restricted_queues_stay() {
        let mut b = Balancer::default();
        let mut a = q(0.01, 1, 1);
        a.pinned = true;
        let mut c = q(0.01, 2, 2);
        c.allowed = vec![2];
        let qs = [q(0.02, 0, 0), a, c];
        match run(&mut b, &qs, &[0.02, 0.01, 0.01], COALESCE_AFTER) {
            Decision::Keep => {}
            Decision::Coalesce { targets, .. } => {
                assert_eq!(targets[1], 1);
                assert_eq!(targets[2], 2);
            }
            d => panic!("{d:?}"),
        }
        // A hot worker whose queues cannot move does not spread.
        let mut p1 = q(0.5, 0, 0);
        p1.pinned = true;
        let mut p2 = q(0.5, 0, 0);
        p2.allowed = vec![0];
        assert_eq!(b.evaluate(&[p1, p2], &[1.0, 0.0]), Decision::Keep);
    }

    #[test]
    fn coalesce_to_several_workers_when_one_is_not_enough() {
        let mut b = Balancer::default();
        let qs: Vec<QueueLoad> = (0..4)
            .map(|w| QueueLoad {
                load: 0.2,
                current: w,
                home: w,
                allowed: vec![0, 1, 2, 3],
                pinned: false,
                partner: None,
            })
            .collect();
        match run(&mut b, &qs, &[0.2; 4], COALESCE_AFTER) {
            Decision::Coalesce { targets, to, .. } => {
                assert_eq!(to, 2);
                let mut l = [0.0f64; 4];
                for (i, &w) in targets.iter().enumerate() {
                    l[w] += qs[i].load;
                }
                assert!(l.iter().all(|&x| x <= PACK + 1e-9), "{l:?}");
            }
            d => panic!("{d:?}"),
        }
    }

    fn partners(mut a: QueueLoad, mut b: QueueLoad) -> [QueueLoad; 2] {
        a.partner = Some(1);
        b.partner = Some(0);
        [a, b]
    }

    #[test]
    fn a_conversation_over_two_workers_is_paired_after_a_streak() {
        let mut b = Balancer::default();
        // An uplink queue (data) on worker 0, the TAP queue (its ACKs) on worker 1; together
        // more than PACK, so coalescing would not join them.
        let qs = partners(q(0.47, 0, 0), q(0.49, 1, 1));
        assert_eq!(
            run(&mut b, &qs, &[0.47, 0.49], PAIR_AFTER - 1),
            Decision::Keep
        );
        match b.evaluate(&qs, &[0.47, 0.49]) {
            Decision::Pair { targets, queues } => {
                // The lighter one moves to the other's worker.
                assert_eq!(queues, (0, 1));
                assert_eq!(targets, vec![1, 1]);
            }
            d => panic!("{d:?}"),
        }
        // Once together, nothing more to do.
        let together = partners(q(0.6, 1, 0), q(0.1, 1, 1));
        assert_eq!(run(&mut b, &together, &[0.0, 0.7], 5), Decision::Keep);
    }

    #[test]
    fn pairing_needs_mutual_partners_and_a_worker_both_may_use() {
        let mut b = Balancer::default();
        let mut one_way = partners(q(0.4, 0, 0), q(0.4, 1, 1));
        one_way[1].partner = None;
        assert_eq!(run(&mut b, &one_way, &[0.4, 0.4], 5), Decision::Keep);
        let mut stuck = partners(q(0.4, 0, 0), q(0.4, 1, 1));
        stuck[0].allowed = vec![0];
        stuck[1].pinned = true;
        assert_eq!(run(&mut b, &stuck, &[0.4, 0.4], 5), Decision::Keep);
        // Only the heavier may move: it goes.
        let mut heavy_moves = partners(q(0.3, 0, 0), q(0.4, 1, 1));
        heavy_moves[0].allowed = vec![0];
        match run(&mut b, &heavy_moves, &[0.3, 0.4], PAIR_AFTER) {
            Decision::Pair { targets, queues } => {
                assert_eq!(queues, (1, 0));
                assert_eq!(targets, vec![0, 0]);
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn a_spread_pair_is_not_paired_again_until_a_coalesce() {
        let mut b = Balancer::default();
        // Paired and too busy: the spread rule separates them.
        let hot = partners(q(0.5, 1, 0), q(0.35, 1, 1));
        assert!(matches!(
            b.evaluate(&hot, &[0.0, 0.85]),
            Decision::Spread { .. }
        ));
        // Apart again, still busy: no pairing, however long.
        let apart = partners(q(0.5, 0, 0), q(0.35, 1, 1));
        assert_eq!(
            run(&mut b, &apart, &[0.5, 0.35], SETTLE + 10),
            Decision::Keep
        );
        // Load drops, they coalesce; after that a split conversation pairs again.
        let low = partners(q(0.01, 0, 0), q(0.01, 1, 1));
        assert!(matches!(
            run(&mut b, &low, &[0.01, 0.01], COALESCE_AFTER),
            Decision::Coalesce { .. }
        ));
        assert!(matches!(
            run(&mut b, &apart, &[0.5, 0.35], PAIR_AFTER),
            Decision::Pair { .. }
        ));
    }

    proptest::proptest! {
        #[test]
        fn targets_respect_allowed_and_pins(
            loads in proptest::collection::vec((0.0f64..1.2, 0usize..4, proptest::bool::ANY, 1usize..16, 0usize..16), 1..12),
            busy in proptest::collection::vec(0.0f64..1.0, 4),
        ) {
            let n = loads.len();
            let queues: Vec<QueueLoad> = loads
                .iter()
                .map(|&(load, cur, pinned, mask, partner)| {
                    let mut allowed: Vec<usize> = (0..4).filter(|w| mask & (1 << w) != 0).collect();
                    if !allowed.contains(&cur) { allowed.push(cur); allowed.sort_unstable(); }
                    // Some queues name a partner (possibly not a mutual one, or themselves).
                    let partner = (partner < n).then_some(partner);
                    QueueLoad { load, current: cur, home: allowed[0], allowed, pinned, partner }
                })
                .collect();
            let mut b = Balancer::default();
            for _ in 0..COALESCE_AFTER {
                match b.evaluate(&queues, &busy) {
                    Decision::Keep => {}
                    Decision::Coalesce { targets, .. }
                    | Decision::Spread { targets, .. }
                    | Decision::Pair { targets, .. } => {
                        for (q, t) in queues.iter().zip(&targets) {
                            proptest::prop_assert!(q.allowed.contains(t));
                            if q.pinned { proptest::prop_assert_eq!(*t, q.current); }
                        }
                    }
                }
            }
        }
    }
}
