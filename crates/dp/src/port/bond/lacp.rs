//! LACP (IEEE 802.1AX-2014, 6.4) for the members of one bond, as a pure state machine: time
//! is passed in, LACPDUs go in through [`Lacp::receive`] and come out of [`Lacp::poll`], and
//! nothing here reads a clock, sleeps, spawns or does I/O. Whoever owns the bond's members
//! (the bond port's driver; a test's loop) feeds it frames, carrier changes and the time.
//!
//! ```text
//!            per member                                   per bond
//!   LACPDU ─▶ receive machine ─▶ partner info ─┐
//!   carrier ─▶ CURRENT / EXPIRED / DEFAULTED    ├─▶ selection ─▶ mux machine per member
//!   time   ─▶ current_while (3 × the rate)      │   (partner      DETACHED ─▶ ATTACHED ─▶
//!                                               │   system+key)   COLLECTING ─▶ DISTRIBUTING
//!   periodic transmission (1 s fast, 30 s slow) ◀┘   actor state bits ─▶ LACPDUs out
//! ```
//!
//! * **Receive machine** (6.4.12): a LACPDU makes the member CURRENT and records the sender
//!   as the partner; `current_while` runs for 3 s at the fast rate (90 s slow, our own
//!   `LACP_Timeout`). When it runs out the member is EXPIRED (partner out of sync, asked to
//!   talk fast) for another 3 s, then DEFAULTED (the partner forgotten). Carrier loss
//!   forgets the partner at once; carrier back starts from EXPIRED.
//! * **Periodic transmission** (6.4.13): every second when the partner asked for the short
//!   timeout, every 30 s otherwise; nothing when both sides are passive, so two passive
//!   sides never form. A change of our state is sent at once (need-to-transmit), at most
//!   three LACPDUs in any second (6.4.16).
//! * **Selection** (6.4.14, simplified): members that hear a partner which aggregates are
//!   grouped by (partner system priority, partner system, partner key); the group with the
//!   most members wins, ties going to the one with the lowest port number. Only its members
//!   are SELECTED: a bond aggregates with one partner, never two.
//! * **Mux machine** (6.4.15, independent control): a selected member is ATTACHED (our
//!   Synchronization bit set); it collects when the partner is in sync, and distributes only
//!   when the partner is in sync and collecting. Anything less takes it back step by step.
//!
//! Left out, as in Open vSwitch: the Wait-while timer (aggregation is immediate, a member
//! joins as soon as its partner agrees), the Marker protocol, and LACPDU version 2 TLVs.
//! The fallback to active-backup when no partner answers is the bond port's choice, made
//! from [`MemberStatus::rx`].

use std::time::{Duration, Instant};

use qswitch_wire::lacp::{Lacpdu, PortInfo, State, COLLECTOR_MAX_DELAY};
use qswitch_wire::MacAddr;

/// The fast periodic time (6.4.4): LACPDUs every second when the partner asks for it.
pub const FAST_PERIOD: Duration = Duration::from_secs(1);
/// The slow periodic time: every 30 s.
pub const SLOW_PERIOD: Duration = Duration::from_secs(30);
/// Timeouts are this many periods (short timeout 3 s, long 90 s).
pub const TIMEOUT_PERIODS: u32 = 3;
/// At most this many LACPDUs per member in any [`FAST_PERIOD`] (6.4.16).
pub const MAX_TX_PER_PERIOD: usize = 3;

/// Whether a member starts the conversation (active) or only answers (passive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Active,
    Passive,
}

/// The rate this side asks its partner to send at: fast (1 s, timeout 3 s) or slow (30 s,
/// timeout 90 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rate {
    Fast,
    Slow,
}

impl Rate {
    /// The period between LACPDUs at this rate.
    pub fn period(self) -> Duration {
        match self {
            Rate::Fast => FAST_PERIOD,
            Rate::Slow => SLOW_PERIOD,
        }
    }

    /// How long received information stays current at this rate.
    pub fn timeout(self) -> Duration {
        self.period() * TIMEOUT_PERIODS
    }
}

/// What a bond says about itself in every LACPDU, the same on all its members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    pub mode: Mode,
    pub rate: Rate,
    /// System priority (lower wins; 65534 is what Open vSwitch uses, 32768 Linux).
    pub system_priority: u16,
    /// System id: a MAC address of this host (the bond's).
    pub system: MacAddr,
    /// The bond's operational key: the same on every member.
    pub key: u16,
}

/// The receive machine's state (6.4.12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxState {
    /// The member's link is down.
    Disabled,
    /// Waiting for a LACPDU after the partner's information went stale (or at start).
    Expired,
    /// No partner: its information is the administrative default.
    Defaulted,
    /// The partner's information is fresh.
    Current,
}

/// The mux machine's state (6.4.15, independent control).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum MuxState {
    Detached,
    Attached,
    Collecting,
    Distributing,
}

/// One member's state, as `bond show` would print it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    pub rx: RxState,
    pub mux: MuxState,
    pub selected: bool,
    /// What this side sends as the actor.
    pub actor: PortInfo,
    /// What this side knows of the partner.
    pub partner: PortInfo,
    /// Whether the partner says it is in sync with what we sent.
    pub partner_in_sync: bool,
}

/// One member: its receive, transmit and mux state.
#[derive(Debug, Clone)]
struct Member {
    port: u16,
    port_priority: u16,
    link_up: bool,
    rx: RxState,
    /// When the partner information stops being current (CURRENT, EXPIRED).
    current_until: Option<Instant>,
    partner: PortInfo,
    /// The partner's Synchronization as 6.4.9 recordPDU works it out.
    partner_in_sync: bool,
    selected: bool,
    mux: MuxState,
    ntt: bool,
    next_periodic: Option<Instant>,
    /// The last LACPDUs sent, oldest first, for the rate limit.
    sent: [Option<Instant>; MAX_TX_PER_PERIOD],
}

/// LACP for the members of one bond.
#[derive(Debug, Clone)]
pub struct Lacp {
    cfg: Config,
    members: Vec<Member>,
}

impl Lacp {
    /// A bond with no members yet.
    pub fn new(cfg: Config) -> Lacp {
        Lacp {
            cfg,
            members: Vec::new(),
        }
    }

    /// The bond's configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Adds a member with port number `port` (unique in the bond, not 0) and its priority;
    /// its link is down until [`set_link`](Self::set_link). Returns its index.
    pub fn add_member(&mut self, port: u16, port_priority: u16) -> usize {
        self.members.push(Member {
            port,
            port_priority,
            link_up: false,
            rx: RxState::Disabled,
            current_until: None,
            partner: self.default_partner(),
            partner_in_sync: false,
            selected: false,
            mux: MuxState::Detached,
            ntt: false,
            next_periodic: None,
            sent: [None; MAX_TX_PER_PERIOD],
        });
        self.members.len() - 1
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the bond has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The partner an unheard member assumes (6.4.7 Partner_Admin): nobody, passive, at our
    /// own rate (so an active side keeps asking at the rate it was configured for).
    fn default_partner(&self) -> PortInfo {
        let mut state = State::default();
        state.set(State::TIMEOUT, self.cfg.rate == Rate::Fast);
        PortInfo {
            state,
            ..PortInfo::default()
        }
    }

    /// Carrier of member `m` went up or down.
    pub fn set_link(&mut self, m: usize, up: bool, now: Instant) {
        let default = self.default_partner();
        let Some(mb) = self.members.get_mut(m) else {
            return;
        };
        if mb.link_up == up {
            return;
        }
        mb.link_up = up;
        if up {
            mb.expire(now);
            mb.next_periodic = Some(now);
        } else {
            mb.rx = RxState::Disabled;
            mb.current_until = None;
            mb.partner = default;
            mb.partner_in_sync = false;
            mb.selected = false;
            mb.next_periodic = None;
        }
        self.step(now);
    }

    /// A LACPDU arrived on member `m`. Ignored while its link is down.
    pub fn receive(&mut self, m: usize, pdu: &Lacpdu, now: Instant) {
        let actor = self.actor_info(m);
        let timeout = self.cfg.rate.timeout();
        let Some((mb, actor)) = self.members.get_mut(m).zip(actor) else {
            return;
        };
        if !mb.link_up {
            return;
        }
        // 6.4.9 update_Selected: a different partner (or one that stopped aggregating)
        // makes the member unselected until selection runs again.
        let same = |a: &PortInfo, b: &PortInfo| {
            a.system == b.system
                && a.system_priority == b.system_priority
                && a.key == b.key
                && a.port == b.port
                && a.port_priority == b.port_priority
                && a.state.has(State::AGGREGATION) == b.state.has(State::AGGREGATION)
        };
        if !same(&mb.partner, &pdu.actor) {
            mb.selected = false;
        }
        // update_NTT: the partner's view of us is wrong; tell it again.
        const CHECKED: u8 =
            State::ACTIVITY | State::TIMEOUT | State::SYNCHRONIZATION | State::AGGREGATION;
        if !same(&pdu.partner, &actor) || (pdu.partner.state.0 ^ actor.state.0) & CHECKED != 0 {
            mb.ntt = true;
        }
        // recordPDU: the partner is in sync when it says so and has our information right,
        // or when it is an individual link.
        let matched = same(&pdu.partner, &actor);
        mb.partner_in_sync = pdu.actor.state.has(State::SYNCHRONIZATION)
            && (matched || !pdu.actor.state.has(State::AGGREGATION));
        mb.partner = pdu.actor;
        mb.rx = RxState::Current;
        mb.current_until = Some(now + timeout);
        self.step(now);
    }

    /// Runs the timers, selection and the mux machines at `now`, and hands every LACPDU due
    /// to `tx` with the member's index. Call it at [`next_wakeup`](Self::next_wakeup) at the
    /// latest, and after any input.
    pub fn poll(&mut self, now: Instant, mut tx: impl FnMut(usize, &Lacpdu)) {
        self.step(now);
        for m in 0..self.members.len() {
            let Some(pdu) = self.due(m, now) else {
                continue;
            };
            tx(m, &pdu);
        }
    }

    /// When [`poll`](Self::poll) next has something to do (a timer), if ever.
    pub fn next_wakeup(&self) -> Option<Instant> {
        self.members
            .iter()
            .flat_map(|mb| {
                let rate_limited = if mb.ntt {
                    mb.sent[0].map(|t| t + FAST_PERIOD)
                } else {
                    None
                };
                [mb.current_until, mb.next_periodic, rate_limited]
            })
            .flatten()
            .min()
    }

    /// Member `m`'s state.
    pub fn status(&self, m: usize) -> Option<MemberStatus> {
        let mb = self.members.get(m)?;
        Some(MemberStatus {
            rx: mb.rx,
            mux: mb.mux,
            selected: mb.selected,
            actor: self.actor_info(m)?,
            partner: mb.partner,
            partner_in_sync: mb.partner_in_sync,
        })
    }

    /// Whether member `m` may receive frames for the bond.
    pub fn collecting(&self, m: usize) -> bool {
        self.members
            .get(m)
            .is_some_and(|mb| mb.mux >= MuxState::Collecting)
    }

    /// Whether member `m` may send frames for the bond.
    pub fn distributing(&self, m: usize) -> bool {
        self.members
            .get(m)
            .is_some_and(|mb| mb.mux == MuxState::Distributing)
    }

    /// What member `m` says about itself.
    fn actor_info(&self, m: usize) -> Option<PortInfo> {
        let mb = self.members.get(m)?;
        let mut state = State(State::AGGREGATION);
        state.set(State::ACTIVITY, self.cfg.mode == Mode::Active);
        state.set(State::TIMEOUT, self.cfg.rate == Rate::Fast);
        state.set(State::SYNCHRONIZATION, mb.mux >= MuxState::Attached);
        state.set(State::COLLECTING, mb.mux >= MuxState::Collecting);
        state.set(State::DISTRIBUTING, mb.mux == MuxState::Distributing);
        state.set(State::DEFAULTED, mb.rx == RxState::Defaulted);
        state.set(State::EXPIRED, mb.rx == RxState::Expired);
        Some(PortInfo {
            system_priority: self.cfg.system_priority,
            system: self.cfg.system,
            key: self.cfg.key,
            port_priority: mb.port_priority,
            port: mb.port,
            state,
        })
    }

    /// Timers, then selection, then the mux machines.
    fn step(&mut self, now: Instant) {
        let default = self.default_partner();
        for mb in &mut self.members {
            match (mb.rx, mb.current_until) {
                (RxState::Current, Some(t)) if now >= t => mb.expire(now),
                (RxState::Expired, Some(t)) if now >= t => {
                    mb.rx = RxState::Defaulted;
                    mb.current_until = None;
                    mb.partner = default;
                    mb.partner_in_sync = false;
                    mb.selected = false;
                    mb.ntt = true;
                }
                _ => {}
            }
        }
        self.select();
        for mb in &mut self.members {
            let next = match mb.mux {
                _ if !mb.selected => MuxState::Detached,
                MuxState::Detached => MuxState::Attached,
                MuxState::Attached if mb.partner_in_sync => MuxState::Collecting,
                MuxState::Collecting | MuxState::Distributing if !mb.partner_in_sync => {
                    MuxState::Attached
                }
                MuxState::Collecting if mb.partner.state.has(State::COLLECTING) => {
                    MuxState::Distributing
                }
                MuxState::Distributing if !mb.partner.state.has(State::COLLECTING) => {
                    MuxState::Collecting
                }
                s => s,
            };
            if next != mb.mux {
                mb.mux = next;
                mb.ntt = true;
            }
        }
    }

    /// Selection: the largest group of members hearing the same aggregating partner system
    /// and key wins (ties: the group with the lowest member port number).
    fn select(&mut self) {
        type Group = (u16, MacAddr, u16);
        let group = |mb: &Member| -> Option<Group> {
            (mb.link_up && mb.rx == RxState::Current && mb.partner.state.has(State::AGGREGATION))
                .then_some((
                    mb.partner.system_priority,
                    mb.partner.system,
                    mb.partner.key,
                ))
        };
        let mut best: Option<(usize, u16, Group)> = None;
        for mb in &self.members {
            let Some(g) = group(mb) else {
                continue;
            };
            let size = self.members.iter().filter(|o| group(o) == Some(g)).count();
            let low = self
                .members
                .iter()
                .filter(|o| group(o) == Some(g))
                .map(|o| o.port)
                .min()
                .unwrap_or(u16::MAX);
            let better = best.is_none_or(|(s, l, _)| size > s || (size == s && low < l));
            if better {
                best = Some((size, low, g));
            }
        }
        let chosen = best.map(|(_, _, g)| g);
        for mb in &mut self.members {
            mb.selected = chosen.is_some() && group(mb) == chosen;
        }
    }

    /// The LACPDU member `m` sends now, if one is due.
    fn due(&mut self, m: usize, now: Instant) -> Option<Lacpdu> {
        let actor = self.actor_info(m)?;
        let active = self.cfg.mode == Mode::Active;
        let mb = &mut self.members[m];
        if !mb.link_up {
            return None;
        }
        // 6.4.13: no periodic transmission when both sides are passive.
        let periodic_on = active || mb.partner.state.has(State::ACTIVITY);
        if !periodic_on {
            mb.next_periodic = None;
            mb.ntt = false;
            return None;
        }
        let period = if mb.partner.state.has(State::TIMEOUT) {
            FAST_PERIOD
        } else {
            SLOW_PERIOD
        };
        let next = *mb.next_periodic.get_or_insert(now + period);
        if now >= next {
            mb.ntt = true;
        }
        // At most MAX_TX_PER_PERIOD in any FAST_PERIOD.
        let allowed = mb.sent[0].is_none_or(|t| now >= t + FAST_PERIOD);
        if !mb.ntt || !allowed {
            return None;
        }
        mb.ntt = false;
        mb.next_periodic = Some(now + period);
        mb.sent.rotate_left(1);
        mb.sent[MAX_TX_PER_PERIOD - 1] = Some(now);
        Some(Lacpdu {
            actor,
            partner: mb.partner,
            collector_max_delay: COLLECTOR_MAX_DELAY,
        })
    }
}

impl Member {
    /// 6.4.12 EXPIRED: the partner is out of sync and asked to talk fast, for one short
    /// timeout.
    fn expire(&mut self, now: Instant) {
        self.rx = RxState::Expired;
        self.partner_in_sync = false;
        self.partner.state.set(State::SYNCHRONIZATION, false);
        self.partner.state.set(State::TIMEOUT, true);
        self.current_until = Some(now + Rate::Fast.timeout());
        self.ntt = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
    const B: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);

    fn cfg(system: MacAddr, mode: Mode) -> Config {
        Config {
            mode,
            rate: Rate::Fast,
            system_priority: 100,
            system,
            key: 7,
        }
    }

    /// Two bonds of `n` members wired member to member, driven in `step` increments.
    struct Pair {
        a: Lacp,
        b: Lacp,
        now: Instant,
        /// Member i of a is connected to member `wires[i]` of b; `None`: cable out.
        wires: Vec<Option<usize>>,
        /// A side that stopped talking (its LACPDUs are lost).
        silent_b: bool,
        /// LACPDUs each side sent.
        sent: (usize, usize),
    }

    impl Pair {
        fn new(n: usize, ma: Mode, mb: Mode) -> Pair {
            let now = Instant::now();
            let mut a = Lacp::new(cfg(A, ma));
            let mut b = Lacp::new(cfg(B, mb));
            for i in 0..n {
                a.add_member(i as u16 + 1, 255);
                b.add_member(i as u16 + 1, 255);
                a.set_link(i, true, now);
                b.set_link(i, true, now);
            }
            Pair {
                a,
                b,
                now,
                wires: (0..n).map(Some).collect(),
                silent_b: false,
                sent: (0, 0),
            }
        }

        fn run(&mut self, total: Duration) {
            let end = self.now + total;
            while self.now < end {
                let mut to_b = Vec::new();
                let mut to_a = Vec::new();
                self.a.poll(self.now, |m, p| to_b.push((m, *p)));
                self.b.poll(self.now, |m, p| to_a.push((m, *p)));
                self.sent.0 += to_b.len();
                self.sent.1 += to_a.len();
                for (m, p) in to_b {
                    if let Some(peer) = self.wires[m] {
                        self.b.receive(peer, &p, self.now);
                    }
                }
                if !self.silent_b {
                    for (m, p) in to_a {
                        if let Some(i) = self.wires.iter().position(|w| *w == Some(m)) {
                            self.a.receive(i, &p, self.now);
                        }
                    }
                }
                self.now += Duration::from_millis(50);
            }
        }

        fn all_distributing(&self) -> bool {
            (0..self.a.len()).all(|m| self.a.distributing(m) && self.b.distributing(m))
        }
    }

    #[test]
    fn active_pair_forms_and_distributes() {
        let mut p = Pair::new(2, Mode::Active, Mode::Active);
        p.run(Duration::from_millis(500));
        assert!(p.all_distributing());
        let s = p.a.status(0).unwrap();
        assert_eq!(
            (s.rx, s.mux, s.selected),
            (RxState::Current, MuxState::Distributing, true)
        );
        assert_eq!((s.partner.system, s.partner.key), (B, 7));
        assert!(s.actor.state.has(
            State::ACTIVITY
                | State::TIMEOUT
                | State::AGGREGATION
                | State::SYNCHRONIZATION
                | State::COLLECTING
                | State::DISTRIBUTING
        ));
    }

    #[test]
    fn active_passive_forms_passive_passive_never() {
        let mut p = Pair::new(2, Mode::Passive, Mode::Active);
        p.run(Duration::from_secs(2));
        assert!(p.all_distributing());
        let mut p = Pair::new(2, Mode::Active, Mode::Passive);
        p.run(Duration::from_secs(2));
        assert!(p.all_distributing());

        let mut p = Pair::new(2, Mode::Passive, Mode::Passive);
        let mut sent = 0;
        for _ in 0..200 {
            p.a.poll(p.now, |_, _| sent += 1);
            p.b.poll(p.now, |_, _| sent += 1);
            p.now += Duration::from_millis(500);
        }
        assert_eq!(sent, 0, "two passive sides say nothing");
        assert!((0..2).all(|m| !p.a.collecting(m) && !p.b.collecting(m)));
        assert_eq!(p.a.status(0).unwrap().rx, RxState::Defaulted);
    }

    #[test]
    fn silent_partner_expires_within_three_seconds_then_defaults() {
        let mut p = Pair::new(2, Mode::Active, Mode::Active);
        p.run(Duration::from_secs(2));
        assert!(p.all_distributing());
        p.silent_b = true;
        let silent_at = p.now;
        while p.a.distributing(0) {
            p.run(Duration::from_millis(50));
            assert!(p.now - silent_at < Duration::from_secs(4), "not detected");
        }
        // The last LACPDU was at most a period before silence: detection within 3 s.
        assert!(p.now - silent_at <= Duration::from_secs(3) + Duration::from_millis(100));
        assert_eq!(p.a.status(0).unwrap().rx, RxState::Expired);
        assert!(!p.a.collecting(0));
        p.run(Duration::from_secs(3) + Duration::from_millis(100));
        let s = p.a.status(0).unwrap();
        assert_eq!((s.rx, s.mux), (RxState::Defaulted, MuxState::Detached));
        assert!(s.actor.state.has(State::DEFAULTED));
        assert_eq!(s.partner.system, MacAddr::ZERO);
        // It comes back.
        p.silent_b = false;
        p.run(Duration::from_secs(2));
        assert!(p.all_distributing());
    }

    #[test]
    fn periodic_rate_follows_the_partners_timeout() {
        let mut p = Pair::new(1, Mode::Active, Mode::Active);
        p.b.cfg.rate = Rate::Slow;
        p.run(Duration::from_secs(5));
        assert!(p.all_distributing());
        // a hears b ask for the long timeout: a sends every 30 s; b sends every second.
        p.sent = (0, 0);
        p.run(Duration::from_secs(60));
        let (from_a, from_b) = p.sent;
        assert!((2..=3).contains(&from_a), "a sent {from_a} in 60 s");
        assert!((58..=61).contains(&from_b), "b sent {from_b} in 60 s");
    }

    #[test]
    fn carrier_loss_detaches_and_the_other_member_goes_on() {
        let mut p = Pair::new(2, Mode::Active, Mode::Active);
        p.run(Duration::from_secs(1));
        let now = p.now;
        p.a.set_link(0, false, now);
        p.b.set_link(0, false, now);
        assert!(!p.a.distributing(0) && !p.a.collecting(0));
        assert_eq!(p.a.status(0).unwrap().rx, RxState::Disabled);
        p.run(Duration::from_secs(1));
        assert!(p.a.distributing(1) && p.b.distributing(1));
        let now = p.now;
        p.a.set_link(0, true, now);
        p.b.set_link(0, true, now);
        p.run(Duration::from_secs(1));
        assert!(p.all_distributing());
    }

    #[test]
    fn one_partner_per_bond() {
        // Member 1 of a is cabled to a third system: it is not selected.
        let mut p = Pair::new(2, Mode::Active, Mode::Active);
        p.wires[1] = None;
        let mut c = Lacp::new(cfg(MacAddr([2, 0, 0, 0, 0, 0xc]), Mode::Active));
        c.add_member(9, 255);
        c.set_link(0, true, p.now);
        for _ in 0..40 {
            let now = p.now;
            let mut to_c = Vec::new();
            let mut to_a1 = Vec::new();
            let mut to_b0 = Vec::new();
            p.a.poll(now, |m, pdu| {
                if m == 1 {
                    to_c.push(*pdu);
                } else {
                    to_b0.push(*pdu);
                }
            });
            c.poll(now, |_, pdu| to_a1.push(*pdu));
            for pdu in to_c {
                c.receive(0, &pdu, now);
            }
            for pdu in to_b0 {
                p.b.receive(0, &pdu, now);
            }
            for pdu in to_a1 {
                p.a.receive(1, &pdu, now);
            }
            p.run(Duration::from_millis(50));
        }
        assert!(p.a.distributing(0));
        // Tie (one member each): the group with the lower port number, member 0's, wins.
        assert!(!p.a.status(1).unwrap().selected);
        assert!(!p.a.collecting(1));
        assert!(!c.collecting(0), "c never hears a in sync");
    }

    #[test]
    fn a_partner_that_is_not_collecting_keeps_us_from_distributing() {
        let mut a = Lacp::new(cfg(A, Mode::Active));
        a.add_member(1, 255);
        let now = Instant::now();
        a.set_link(0, true, now);
        let mut sent = None;
        a.poll(now, |_, p| sent = Some(*p));
        let ours = sent.unwrap().actor;
        let mut partner = PortInfo {
            system_priority: 1,
            system: B,
            key: 3,
            port_priority: 1,
            port: 5,
            state: State(State::ACTIVITY | State::AGGREGATION | State::SYNCHRONIZATION),
        };
        let mut pdu = Lacpdu {
            actor: partner,
            partner: ours,
            collector_max_delay: 0,
        };
        a.receive(0, &pdu, now);
        // Our state changed (attached): the partner's copy of it is stale but it is in sync
        // only if it has our information right; refresh it as a partner would.
        pdu.partner = a.status(0).unwrap().actor;
        a.receive(0, &pdu, now);
        assert_eq!(a.status(0).unwrap().mux, MuxState::Collecting);
        assert!(a.collecting(0) && !a.distributing(0));
        partner.state.set(State::COLLECTING, true);
        pdu.actor = partner;
        pdu.partner = a.status(0).unwrap().actor;
        a.receive(0, &pdu, now);
        assert!(a.distributing(0));
        // The partner says it has someone else's information: out of sync, back to attached.
        pdu.partner.system = MacAddr([2, 0, 0, 0, 0, 0xee]);
        a.receive(0, &pdu, now);
        assert_eq!(a.status(0).unwrap().mux, MuxState::Attached);
    }

    #[test]
    fn need_to_transmit_is_rate_limited() {
        let mut a = Lacp::new(cfg(A, Mode::Active));
        a.add_member(1, 255);
        let now = Instant::now();
        a.set_link(0, true, now);
        let mut sent = 0;
        for i in 0..20u8 {
            // Every PDU from a changing partner asks for an answer.
            let pdu = Lacpdu {
                actor: PortInfo {
                    system: B,
                    port: u16::from(i) + 1,
                    state: State(State::ACTIVITY | State::AGGREGATION),
                    ..PortInfo::default()
                },
                ..Lacpdu::default()
            };
            a.receive(0, &pdu, now);
            a.poll(now, |_, _| sent += 1);
        }
        assert_eq!(sent, MAX_TX_PER_PERIOD);
        assert!(a.next_wakeup().unwrap() <= now + FAST_PERIOD);
    }
}
