//! The stateful firewall: security groups with connection tracking (docs/firewall.md).
//!
//! [`Firewall::check`] gives the verdict on one frame crossing one filtered port in one
//! direction (ingress: toward the port's VM; egress: from it). Each port is its own zone:
//! a frame from port A to port B is checked by A's egress filter, then by B's ingress
//! filter, as OVN and Neutron do; when both are filtered the connection is one entry both
//! zones share ([`Entry::peer`], [`Seen`]), so the second check takes the first's lookup.
//!
//! A frame is, in order: not IP (ARP, ...) → allowed (spoofing is port security's job);
//! malformed IP → `ct_invalid`; neighbour discovery, MLD and DHCP client traffic → allowed,
//! as Neutron does; a non-first fragment → dropped and counted (`ct_fragment`: the ports
//! are in the first fragment, and this version keeps no fragment table); an ICMP error →
//! allowed as related when it quotes a tracked connection; a packet of a tracked connection
//! → the TCP state machine or the datagram state, then allowed or `ct_invalid`; otherwise
//! the port's rules: no rule → denied; a stateless rule → allowed untracked; a stateful
//! rule → a new connection (TCP must open with a SYN) if the switch and port limits allow
//! (`ct_limit` otherwise).
//!
//! Time is passed in (`now`, nanoseconds of any monotonic clock); nothing here reads the
//! clock. Not wired into the pipeline yet: see docs/firewall.md for what remains.

pub mod cache;
pub mod conntrack;
pub mod control;
pub mod rules;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

use arc_swap::ArcSwap;
use qswitch_api::config::{Config, FirewallConfig, RuleDirection};
use qswitch_wire::ct::{self, CtError, CtPacket, Fragment, TcpInfo, L4};
use qswitch_wire::tcp::{FLAG_ACK, FLAG_FIN, FLAG_RST, FLAG_SYN};

pub use cache::VerdictCache;
pub use conntrack::{CtState, CtTable, Dir, Entry, RuleRef, TcpDir, NO_PEER};
pub use rules::{Hits, PortRules, Rule, RuleSet};

const SEC: u64 = 1_000_000_000;

/// Frames [`Firewall::check_burst`] prefetches at a time (the engine's burst).
pub const BURST: usize = 32;

/// Default switch-wide `max_sessions`.
pub const DEFAULT_MAX_SESSIONS: u32 = 262_144;

/// How long a connection lives without traffic, by state, in nanoseconds. The defaults are
/// Linux's nf_conntrack ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// SYN_SENT, SYN_RECV (Linux: 120 s, 60 s).
    pub tcp_handshake: u64,
    /// ESTABLISHED (Linux: 5 days).
    pub tcp_established: u64,
    /// FIN_WAIT, CLOSING (Linux: fin_wait 120 s).
    pub tcp_closing: u64,
    /// TIME_WAIT (Linux: 120 s).
    pub tcp_time_wait: u64,
    /// CLOSE, after a RST (Linux: 10 s).
    pub tcp_close: u64,
    /// UDP and SCTP one way (Linux: 30 s).
    pub udp_unreplied: u64,
    /// UDP and SCTP both ways (Linux: udp_stream 120 s).
    pub udp_replied: u64,
    /// ICMP echo (Linux: 30 s).
    pub icmp: u64,
    /// Other protocols (Linux: generic 600 s).
    pub other: u64,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts {
            tcp_handshake: 120 * SEC,
            tcp_established: 5 * 24 * 3600 * SEC,
            tcp_closing: 120 * SEC,
            tcp_time_wait: 120 * SEC,
            tcp_close: 10 * SEC,
            udp_unreplied: 30 * SEC,
            udp_replied: 120 * SEC,
            icmp: 30 * SEC,
            other: 600 * SEC,
        }
    }
}

impl Timeouts {
    /// The defaults with the config's `[firewall]` keys on top.
    pub fn from_config(c: &FirewallConfig) -> Timeouts {
        let d = Timeouts::default();
        let s = |v: Option<u32>, default: u64| v.map_or(default, |v| u64::from(v) * SEC);
        Timeouts {
            tcp_handshake: s(c.tcp_handshake, d.tcp_handshake),
            tcp_established: s(c.tcp_established, d.tcp_established),
            tcp_closing: s(c.tcp_closing, d.tcp_closing),
            tcp_time_wait: s(c.tcp_time_wait, d.tcp_time_wait),
            tcp_close: s(c.tcp_close, d.tcp_close),
            udp_unreplied: s(c.udp_unreplied, d.udp_unreplied),
            udp_replied: s(c.udp_replied, d.udp_replied),
            icmp: s(c.icmp, d.icmp),
            other: s(c.other, d.other),
        }
    }

    fn of(&self, proto: u8, state: CtState) -> u64 {
        match state {
            CtState::SynSent | CtState::SynRecv => self.tcp_handshake,
            CtState::Established => self.tcp_established,
            CtState::FinWait | CtState::Closing => self.tcp_closing,
            CtState::TimeWait => self.tcp_time_wait,
            CtState::Close => self.tcp_close,
            CtState::Unreplied | CtState::Replied => match proto {
                1 | 58 => self.icmp,
                17 | ct::PROTO_SCTP => {
                    if state == CtState::Replied {
                        self.udp_replied
                    } else {
                        self.udp_unreplied
                    }
                }
                _ => self.other,
            },
        }
    }
}

/// Why a frame passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// The port has no security groups.
    Unfiltered,
    /// Not IP: not the firewall's to filter.
    NotIp,
    /// Neighbour discovery, MLD or DHCP client traffic, always allowed.
    Always,
    /// A stateless rule.
    Stateless(RuleRef),
    /// A rule opened a new connection.
    New(RuleRef),
    /// A packet of a tracked connection (opened by that rule), in that direction.
    Tracked(RuleRef, Dir),
    /// An ICMP error about a tracked connection.
    Related(RuleRef),
}

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No rule of the port's groups allows it in this direction.
    NoRule(RuleDirection),
    /// `ct_invalid`: malformed, or not a valid next packet of its connection (an ACK with
    /// no connection, a RST out of window, ...).
    Invalid,
    /// `ct_limit`: a new connection over the switch's or the port's `max_sessions`.
    Limit,
    /// `ct_fragment`: a non-first fragment.
    Fragment,
}

/// The verdict on a frame, with the connection's state after it (for trace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow(Allowed, Option<CtState>),
    Deny(Denied, Option<CtState>),
}

impl Verdict {
    /// Whether the frame goes on.
    pub fn allowed(&self) -> bool {
        matches!(self, Verdict::Allow(..))
    }
}

/// What one filter's check of a frame found in the table, for the next filter the same
/// frame crosses (the destination's `firewall_out` after the source's `firewall_in`): the
/// connection's entry and which zones it covers. When it covers the destination too
/// ([`conntrack::Entry::peer`]), that check is done: the entry was found and moved on by
/// the first; when it is the source's alone, the destination's rules may join it
/// ([`CtTable::attach`]) instead of making a second entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    h: u64,
    slot: u32,
    zone: u32,
    peer: u32,
    rule: RuleRef,
    peer_rule: RuleRef,
    reply: bool,
    state: CtState,
}

impl Seen {
    /// Nothing found (not IP, stateless, denied, a dry run, ...).
    pub const NONE: Seen = Seen {
        h: 0,
        slot: 0,
        zone: NO_PEER,
        peer: NO_PEER,
        rule: RuleRef { group: 0, index: 0 },
        peer_rule: RuleRef { group: 0, index: 0 },
        reply: false,
        state: CtState::SynSent,
    };

    fn of(e: &Entry, h: u64, slot: u32, dir: Dir) -> Seen {
        Seen {
            h,
            slot,
            zone: e.zone,
            peer: e.peer,
            rule: e.rule,
            peer_rule: e.peer_rule,
            reply: dir == Dir::Reply,
            state: e.state,
        }
    }

    /// The verdict of `zone`'s filter when the entry covers it.
    #[inline]
    fn covered(&self, zone: u32) -> Option<Verdict> {
        if zone == NO_PEER || (self.zone != zone && self.peer != zone) {
            return None;
        }
        let rule = if self.zone == zone {
            self.rule
        } else {
            self.peer_rule
        };
        let dir = if self.reply {
            Dir::Reply
        } else {
            Dir::Original
        };
        Some(Verdict::Allow(
            Allowed::Tracked(rule, dir),
            Some(self.state),
        ))
    }

    /// Whether the entry found covers `zone` (its check of the frame is done).
    #[inline]
    pub fn covers(&self, zone: u32) -> bool {
        zone != NO_PEER && (self.zone == zone || self.peer == zone)
    }

    /// Whether a zone other than the entry's own may join it.
    #[inline]
    fn joinable(&self) -> bool {
        self.zone != NO_PEER && self.peer == NO_PEER
    }
}

/// The counters of one zone (port): rare events only, so that workers do not share a
/// cache line per packet; per-packet allowed/denied counts belong to the pipeline's own
/// per-worker statistics.
#[derive(Debug, Default)]
pub struct ZoneCounters {
    /// Connections opened.
    pub new: AtomicU64,
    pub ct_invalid: AtomicU64,
    pub ct_limit: AtomicU64,
    pub ct_fragment: AtomicU64,
}

/// The firewall of a switch: rules, the connection table and counters.
pub struct Firewall {
    /// Allocated (all of it, `max_sessions` entries) when a port is first filtered: a
    /// switch without security groups holds no table.
    table: OnceLock<CtTable>,
    max_sessions: u32,
    shards: usize,
    rules: ArcSwap<RuleSet>,
    /// Bumped after each rule set put in force, so that a worker's verdict cache keeps
    /// its own reference to the rules and reloads them only when this moves
    /// ([`VerdictCache::begin`]).
    rules_version: AtomicU64,
    /// Per zone: whether the port has rules, which the engine reads once per burst.
    filtered: Box<[AtomicBool]>,
    zones: Box<[ZoneCounters]>,
    timeouts: Timeouts,
}

impl Firewall {
    /// The firewall of a validated config; `None` when no port has security groups (then
    /// nothing is allocated and nothing is checked).
    pub fn from_config(config: &Config) -> Option<Firewall> {
        if config.ports.iter().all(|p| p.security_groups.is_empty()) {
            return None;
        }
        let fw = config.firewall.unwrap_or_default();
        let max = fw.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS);
        Some(Firewall::new(
            RuleSet::compile(config),
            max,
            Timeouts::from_config(&fw),
            conntrack::DEFAULT_SHARDS,
        ))
    }

    /// A firewall over `rules`, with a table for `max_sessions` connections in `shards`
    /// shards; it has as many zones as `rules` has ports.
    pub fn new(rules: RuleSet, max_sessions: u32, timeouts: Timeouts, shards: usize) -> Firewall {
        Firewall::with_zones(rules.ports.len(), rules, max_sessions, timeouts, shards)
    }

    /// The firewall of a switch: `zones` zones (one per possible port, the zone of a port
    /// being its [`crate::PortId`]), the groups' rules set later by [`Firewall::set_rules`].
    pub fn for_switch(config: Option<&FirewallConfig>, zones: usize) -> Firewall {
        let fw = config.copied().unwrap_or_default();
        Firewall::with_zones(
            zones,
            RuleSet::default(),
            fw.max_sessions.unwrap_or(DEFAULT_MAX_SESSIONS),
            Timeouts::from_config(&fw),
            conntrack::DEFAULT_SHARDS,
        )
    }

    fn with_zones(
        zones: usize,
        rules: RuleSet,
        max_sessions: u32,
        timeouts: Timeouts,
        shards: usize,
    ) -> Firewall {
        let fw = Firewall {
            table: OnceLock::new(),
            max_sessions,
            shards,
            rules: ArcSwap::from_pointee(RuleSet::default()),
            rules_version: AtomicU64::new(0),
            filtered: (0..zones).map(|_| AtomicBool::new(false)).collect(),
            zones: (0..zones).map(|_| ZoneCounters::default()).collect(),
            timeouts,
        };
        fw.set_rules(rules);
        fw
    }

    /// Puts `rules` in force (indexed by zone); the ports it gives rules to are filtered
    /// from the workers' next burst on. Zones beyond the firewall's are ignored. The first
    /// rule set that filters a port allocates the connection table.
    ///
    /// Connections the new rules no longer allow are ended ([`control`]'s revalidation,
    /// as Neutron does); returns how many. Callers serialize changes (the switch's
    /// control lock).
    pub fn set_rules(&self, rules: RuleSet) -> u32 {
        let any = rules.ports.iter().any(Option::is_some);
        if any {
            self.table();
        }
        let filtered: Vec<bool> = (0..self.filtered.len())
            .map(|z| rules.ports.get(z).is_some_and(Option::is_some))
            .collect();
        let new = std::sync::Arc::new(rules);
        let old = self.rules.swap(new.clone());
        self.rules_version.fetch_add(1, Ordering::AcqRel);
        for (flag, on) in self.filtered.iter().zip(filtered) {
            flag.store(on, Ordering::Release);
        }
        let ended = match self.table.get() {
            Some(table) if *old != *new => control::revalidate(table, &old, &new),
            _ => 0,
        };
        // Whatever the workers cached was judged by the old rules.
        if let Some(table) = self.table.get() {
            table.bump();
        }
        ended
    }

    /// Whether port `zone` has security groups (its frames are checked).
    #[inline]
    pub fn filtered(&self, zone: u32) -> bool {
        self.filtered
            .get(zone as usize)
            .is_some_and(|f| f.load(Ordering::Relaxed))
    }

    /// Whether any port is filtered (a connection table exists).
    pub fn active(&self) -> bool {
        self.table.get().is_some()
    }

    /// The connection table (listing, flushing, expiry, memory); allocated by the first
    /// call (see [`Firewall::active`]).
    pub fn table(&self) -> &CtTable {
        self.table
            .get_or_init(|| CtTable::new(self.max_sessions, self.shards, self.filtered.len()))
    }

    /// The switch-wide connection limit.
    pub fn max_sessions(&self) -> u32 {
        self.max_sessions
    }

    /// The connection timeouts.
    pub fn timeouts(&self) -> &Timeouts {
        &self.timeouts
    }

    /// The rules in force.
    pub fn rules(&self) -> arc_swap::Guard<std::sync::Arc<RuleSet>> {
        self.rules.load()
    }

    /// A zone's counters.
    pub fn zone(&self, zone: u32) -> Option<&ZoneCounters> {
        self.zones.get(zone as usize)
    }

    /// Removes expired connections; returns how many. The control thread calls it about
    /// once a second; it locks one shard at a time.
    pub fn expire(&self, now: u64) -> u32 {
        self.table.get().map_or(0, |t| t.expire(now))
    }

    /// Backs the entry slots the table is about to hand out ([`CtTable::prefault`]), so
    /// that workers do not take their page faults; the control thread calls it every
    /// housekeeping tick. Nothing when no port is filtered (no table).
    pub fn prefault(&self) -> usize {
        self.table.get().map_or(0, CtTable::prefault)
    }

    /// Removes every connection of `zone`, or of every zone; returns how many `zone` had.
    /// A connection `zone` shares with another port ([`Entry::peer`]) stays that port's.
    pub fn flush(&self, zone: Option<u32>, now: u64) -> u32 {
        let Some(z) = zone else {
            return self.sweep(now, Some(&|_: &Entry| true));
        };
        let Some(t) = self.table.get() else {
            return 0;
        };
        let mut detached = 0;
        let removed = t.visit(now, |e| {
            if !e.covers(z) {
                return conntrack::Visit::Keep;
            }
            let v = t.detach(e, z);
            detached += u32::from(v == conntrack::Visit::Keep);
            v
        });
        removed + detached
    }

    /// Expired entries and those `remove` says to go, by [`CtTable::visit`]: a worker waits
    /// at most one chunk of slots, however big the table.
    fn sweep(&self, now: u64, remove: Option<&dyn Fn(&Entry) -> bool>) -> u32 {
        self.table.get().map_or(0, |t| {
            t.visit(now, |e| {
                if remove.is_some_and(|r| r(e)) {
                    conntrack::Visit::Remove
                } else {
                    conntrack::Visit::Keep
                }
            })
        })
    }

    /// Connections of `zone` tracked now.
    pub fn sessions(&self, zone: u32) -> u32 {
        self.table.get().map_or(0, |t| t.zone_len(zone))
    }

    /// The verdict on `frame` crossing port `zone` in `direction` at `now`.
    pub fn check(&self, zone: u32, direction: RuleDirection, frame: &[u8], now: u64) -> Verdict {
        let mut seen = Seen::NONE;
        self.check_once(
            zone, direction, frame, now, true, false, &mut seen, None, None,
        )
    }

    /// [`Firewall::check`], also telling what it found in the table (`seen`), for the
    /// check of the same frame by its destination's filter ([`Firewall::check_burst`]).
    pub fn check_seen(
        &self,
        zone: u32,
        direction: RuleDirection,
        frame: &[u8],
        now: u64,
        seen: &mut Seen,
    ) -> Verdict {
        *seen = Seen::NONE;
        self.check_once(zone, direction, frame, now, true, false, seen, None, None)
    }

    /// [`Firewall::check`] of `n` frames (`frame(i)` for `i` in `0..n`), in order, giving
    /// each verdict to `verdict(i, v)`: the same verdicts and effects as one call each, but
    /// a chunk of [`BURST`] frames is parsed and hashed first and the buckets and then the
    /// entries of their connections asked of the CPU ([`CtTable::prefetch_bucket`],
    /// [`CtTable::prefetch_entry`]) before any is looked up, so that in a big table the
    /// cache misses of a burst overlap instead of coming one after the other. Frames the
    /// short parse does not take (IPv6, VLAN-tagged, ICMP, ...) are checked one by one.
    ///
    /// `seen(i)` is what the source port's filter found for frame `i` on its way in
    /// ([`Firewall::check_seen`], [`Seen::NONE`] if nothing): a frame whose connection's
    /// entry covers `zone` too is allowed as that entry's without a second lookup (the
    /// first moved it on), and a new connection joins the source's entry when it can.
    #[allow(clippy::too_many_arguments)]
    pub fn check_burst<'a>(
        &self,
        zone: u32,
        direction: RuleDirection,
        n: usize,
        frame: impl Fn(usize) -> &'a [u8],
        seen: impl Fn(usize) -> Seen,
        now: u64,
        mut verdict: impl FnMut(usize, Verdict),
    ) {
        let Some(counters) = self.zones.get(zone as usize) else {
            (0..n).for_each(|i| verdict(i, Verdict::Allow(Allowed::Unfiltered, None)));
            return;
        };
        if n == 0 {
            return;
        }
        let table = self.table();
        // The rules, loaded once for the burst (a change applies from the next burst).
        let guard = self.rules.load();
        let rules = Some(&**guard);
        let mut parsed: [Option<CtPacket>; BURST] = [None; BURST];
        let mut hashes = [0u64; BURST];
        let mut prior = [Seen::NONE; BURST];
        for start in (0..n).step_by(BURST) {
            let len = BURST.min(n - start);
            let mut rest = 0;
            for (k, (p, h)) in parsed.iter_mut().zip(&mut hashes).take(len).enumerate() {
                let s = seen(start + k);
                prior[k] = s;
                *p = None;
                if let Some(v) = s.covered(zone) {
                    verdict(start + k, v);
                    continue;
                }
                rest += 1;
                *p = ct::parse_v4_fast(frame(start + k));
                if let Some(p) = p {
                    *h = table.hash(&p.key);
                    if !s.joinable() {
                        // (The source's filter has just touched a joinable entry's
                        // bucket and entry.)
                        table.prefetch_bucket(*h);
                    }
                }
            }
            if rest == 0 {
                continue;
            }
            for ((p, &h), s) in parsed.iter().zip(&hashes).zip(&prior).take(len) {
                if p.is_some() && !s.joinable() {
                    table.prefetch_entry(h);
                }
            }
            for (k, (p, &h)) in parsed.iter().zip(&hashes).take(len).enumerate() {
                let join = &mut prior[k];
                if join.covered(zone).is_some() {
                    continue;
                }
                let v = match p {
                    Some(p) => {
                        let once = (true, false);
                        self.judge(zone, counters, direction, p, h, now, once, join, rules)
                    }
                    None => {
                        let f = frame(start + k);
                        self.check_once(zone, direction, f, now, true, false, join, rules, None)
                    }
                };
                verdict(start + k, v);
            }
        }
    }

    /// [`Firewall::check`] as a dry run (`qswitch trace`): the verdict the frame would get
    /// now, changing no connection and no counter (a connection found expired is still
    /// removed, as any look would).
    pub fn peek(&self, zone: u32, direction: RuleDirection, frame: &[u8], now: u64) -> Verdict {
        let mut seen = Seen::NONE;
        self.check_once(
            zone, direction, frame, now, false, true, &mut seen, None, None,
        )
    }

    /// [`Firewall::check`]: the frame parsed (the short path of [`ct::parse`] first, its
    /// packet judged in place: no copy of it), then [`Firewall::judge`]d. `hint`: the
    /// hash of the key [`ct::parse_v4_fast`] gives for this frame, if already computed
    /// ([`Firewall::prefetch_cached`]).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn check_once(
        &self,
        zone: u32,
        direction: RuleDirection,
        frame: &[u8],
        now: u64,
        retry: bool,
        dry: bool,
        seen: &mut Seen,
        rules: Option<&RuleSet>,
        hint: Option<u64>,
    ) -> Verdict {
        let Some(counters) = self.zones.get(zone as usize) else {
            return Verdict::Allow(Allowed::Unfiltered, None);
        };
        let mut judge = |p: &CtPacket, hint: Option<u64>| {
            let h = hint.unwrap_or_else(|| self.table().hash(&p.key));
            let flags = (retry, dry);
            self.judge(zone, counters, direction, p, h, now, flags, seen, rules)
        };
        if let Some(p) = &ct::parse_v4_fast(frame) {
            return judge(p, hint);
        }
        match &ct::parse_general(frame) {
            Ok(p) => judge(p, None),
            Err(CtError::NotIp) => Verdict::Allow(Allowed::NotIp, None),
            Err(_) => self.invalid(counters, None, dry),
        }
    }

    /// The verdict on packet `p` of `zone`, whose key hashes to `h` ([`CtTable::hash`]);
    /// `retry`: whether to look again when another worker added the connection (its other
    /// direction) between this one's look and its insert; `dry`: a dry run (trace), which
    /// changes nothing. `rules`: the rules in force, if the caller holds them for its burst
    /// (`None`: loaded here). `seen`: in, what another zone's check of the same frame found (a new
    /// connection joins that entry when it can); out, the entry this check found or made.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn judge(
        &self,
        zone: u32,
        counters: &ZoneCounters,
        direction: RuleDirection,
        p: &CtPacket,
        h: u64,
        now: u64,
        (retry, dry): (bool, bool),
        seen: &mut Seen,
        rules: Option<&RuleSet>,
    ) -> Verdict {
        let loaded;
        let rules = match rules {
            Some(r) => r,
            None => {
                loaded = self.rules.load();
                &**loaded
            }
        };
        let join = std::mem::replace(seen, Seen::NONE);
        if always_allowed(p, direction) {
            return Verdict::Allow(Allowed::Always, None);
        }
        if p.fragment == Fragment::Later {
            if !dry {
                counters.ct_fragment.fetch_add(1, Ordering::Relaxed);
            }
            return Verdict::Deny(Denied::Fragment, None);
        }
        let table = self.table();
        if !dry && join.joinable() && join.h == h {
            // The source's filter has just found or made this frame's connection, as
            // its alone: this zone's rules, then a share of that entry, with no look of
            // its own first (`attach` checks under the shard's lock that no other entry
            // tracks the connection for this zone; when one does, the look below finds it).
            if let Some(v) = self.join(zone, counters, direction, p, h, now, &join, rules) {
                return v;
            }
        }
        if let L4::IcmpError { inner, .. } = p.l4 {
            let related = table.with(zone, &inner, now, |e, _, _| {
                ((e.rule_for(zone), e.state), false)
            });
            if let Some((rule, state)) = related {
                return Verdict::Allow(Allowed::Related(rule), Some(state));
            }
        }
        // A packet of a tracked connection.
        let tracked = table.with_hash(h, zone, &p.key, now, |e, dir, slot| {
            // A dry run moves a copy (made only then).
            let mut copy;
            let e = if dry {
                copy = *e;
                &mut copy
            } else {
                e
            };
            let was = e.state;
            let step = advance(e, dir, p);
            if was == CtState::Unreplied && e.state == CtState::Replied && !dry {
                // Workers' caches ([`cache`]) may hold this connection as unreplied.
                table.bump();
            }
            if let Step::Valid = step {
                e.expires = now.saturating_add(self.timeouts.of(e.key.proto, e.state));
                if !dry {
                    *seen = Seen::of(e, h, slot, dir);
                }
            }
            (
                (step, e.rule_for(zone), e.state, dir),
                step == Step::Reopen && !dry,
            )
        });
        match tracked {
            Some((Step::Valid, rule, state, dir)) => {
                return Verdict::Allow(Allowed::Tracked(rule, dir), Some(state))
            }
            Some((Step::Invalid, _, state, _)) => return self.invalid(counters, Some(state), dry),
            Some((Step::Reopen, ..)) | None => {}
        }
        // A new connection: the rules decide.
        let Some(port) = rules.ports.get(zone as usize).and_then(Option::as_ref) else {
            return Verdict::Allow(Allowed::Unfiltered, None);
        };
        let Some(rule) = port.first_match(direction, p) else {
            return Verdict::Deny(Denied::NoRule(direction), None);
        };
        if rule.stateless || matches!(p.l4, L4::IcmpError { .. } | L4::IcmpOther { .. }) {
            // ICMP errors about nothing tracked and other ICMP messages pass by rule alone.
            if !dry {
                rule.hits.hit();
            }
            return Verdict::Allow(Allowed::Stateless(rule.id), None);
        }
        let Some(state) = first_state(p) else {
            return self.invalid(counters, None, dry);
        };
        if dry {
            let zone_full = port.max_sessions.is_some_and(|m| table.zone_len(zone) >= m);
            if table.len() >= self.max_sessions || zone_full {
                return Verdict::Deny(Denied::Limit, None);
            }
            return Verdict::Allow(Allowed::New(rule.id), Some(state));
        }
        let expires = now.saturating_add(self.timeouts.of(p.key.proto, state));
        let mut entry = Entry::new(zone, p.key, state, expires, rule.id);
        if let L4::Tcp(t) = p.l4 {
            entry.tcp[0] = TcpDir {
                end: t.seq.wrapping_add(1).wrapping_add(t.payload_len),
                max_win: u32::from(t.window).max(1),
                wscale: t.wscale,
                fin: false,
            };
        }
        match table.insert_hashed(h, entry, now, port.max_sessions) {
            Ok(Some(slot)) => {
                counters.new.fetch_add(1, Ordering::Relaxed);
                rule.hits.hit();
                *seen = Seen::of(&entry, h, slot, Dir::Original);
                Verdict::Allow(Allowed::New(rule.id), Some(state))
            }
            // Another worker tracked it first (the other direction): this packet belongs
            // to that connection, so its state machine judges it.
            Ok(None) if retry => {
                let once = (false, false);
                self.judge(
                    zone,
                    counters,
                    direction,
                    p,
                    h,
                    now,
                    once,
                    seen,
                    Some(rules),
                )
            }
            Ok(None) => Verdict::Allow(Allowed::New(rule.id), Some(state)),
            Err(_) => {
                counters.ct_limit.fetch_add(1, Ordering::Relaxed);
                Verdict::Deny(Denied::Limit, None)
            }
        }
    }

    /// A new connection of `zone` joining the entry `join` of the source's filter
    /// ([`CtTable::attach`]) when this zone's rules open it; `None` when they do not or the
    /// entry cannot be shared (then [`Firewall::judge`] looks the connection up as usual).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn join(
        &self,
        zone: u32,
        counters: &ZoneCounters,
        direction: RuleDirection,
        p: &CtPacket,
        h: u64,
        now: u64,
        join: &Seen,
        rules: &RuleSet,
    ) -> Option<Verdict> {
        if matches!(p.l4, L4::IcmpError { .. } | L4::IcmpOther { .. }) {
            return None;
        }
        let port = rules.ports.get(zone as usize).and_then(Option::as_ref)?;
        let rule = port.first_match(direction, p)?;
        if rule.stateless || first_state(p).is_none() {
            return None;
        }
        let joined =
            self.table()
                .attach(h, join.slot, &p.key, zone, rule.id, now, port.max_sessions)?;
        Some(match joined {
            Ok(()) => {
                counters.new.fetch_add(1, Ordering::Relaxed);
                rule.hits.hit();
                Verdict::Allow(Allowed::New(rule.id), Some(join.state))
            }
            Err(_) => {
                counters.ct_limit.fetch_add(1, Ordering::Relaxed);
                Verdict::Deny(Denied::Limit, None)
            }
        })
    }

    fn invalid(&self, counters: &ZoneCounters, state: Option<CtState>, dry: bool) -> Verdict {
        if !dry {
            counters.ct_invalid.fetch_add(1, Ordering::Relaxed);
        }
        Verdict::Deny(Denied::Invalid, state)
    }
}

/// Neighbour discovery, MLD and DHCP client traffic: what Neutron lets through whatever the
/// groups say (port security polices who may send it).
fn always_allowed(p: &CtPacket, direction: RuleDirection) -> bool {
    match p.l4 {
        // MLD 130-132 and 143, router and neighbour solicitations and advertisements
        // 133-136, redirect 137.
        L4::IcmpOther { ty, .. } if p.key.is_ipv6() => matches!(ty, 130..=137 | 143),
        L4::Udp => {
            let (client, server) = if p.key.is_ipv6() {
                (546, 547)
            } else {
                (68, 67)
            };
            match direction {
                RuleDirection::Egress => (p.key.src, p.key.dst) == (client, server),
                RuleDirection::Ingress => (p.key.src, p.key.dst) == (server, client),
            }
        }
        _ => false,
    }
}

/// The state of a connection opened by `p`; `None` if `p` cannot open one (a TCP segment
/// other than a SYN, an echo reply).
fn first_state(p: &CtPacket) -> Option<CtState> {
    match p.l4 {
        L4::Tcp(t) => (t.flags & (FLAG_SYN | FLAG_ACK | FLAG_RST | FLAG_FIN) == FLAG_SYN)
            .then_some(CtState::SynSent),
        L4::Echo { request, .. } => request.then_some(CtState::Unreplied),
        L4::Udp | L4::Sctp | L4::Other => Some(CtState::Unreplied),
        L4::IcmpError { .. } | L4::IcmpOther { .. } | L4::LaterFragment => None,
    }
}

/// What a packet does to its tracked connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Valid,
    Invalid,
    /// A SYN on a closed connection (TIME_WAIT, CLOSE): the old entry goes, the packet is
    /// judged as a new connection.
    Reopen,
}

/// Moves the connection on by `p` going `dir`.
#[inline]
fn advance(e: &mut Entry, dir: Dir, p: &CtPacket) -> Step {
    match p.l4 {
        L4::Tcp(t) => tcp_step(e, dir, &t),
        L4::Echo { request, .. } => {
            // A reply comes back; a request may not come from the replying side's reply
            // direction as a reply.
            if dir == Dir::Reply && request {
                return Step::Invalid;
            }
            if dir == Dir::Reply {
                e.state = CtState::Replied;
            }
            Step::Valid
        }
        _ => {
            if dir == Dir::Reply {
                e.state = CtState::Replied;
            }
            Step::Valid
        }
    }
}

/// Sequence-number arithmetic: whether `a` is before `b`.
fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// The TCP state machine (after Linux's nf_conntrack_proto_tcp and OVS's conntrack-tcp,
/// simplified: windows are checked loosely, by the largest window the receiver announced).
#[inline(never)]
fn tcp_step(e: &mut Entry, dir: Dir, t: &TcpInfo) -> Step {
    let d = dir.index();
    let o = 1 - d;
    let flags = t.flags & (FLAG_SYN | FLAG_ACK | FLAG_RST | FLAG_FIN);
    let syn = flags & FLAG_SYN != 0;
    if matches!(e.state, CtState::TimeWait | CtState::Close) && flags == FLAG_SYN {
        return if dir == Dir::Original {
            Step::Reopen
        } else {
            Step::Invalid
        };
    }
    match e.state {
        CtState::SynSent => {
            if dir == Dir::Original {
                // A retransmitted SYN.
                return if flags == FLAG_SYN {
                    Step::Valid
                } else {
                    Step::Invalid
                };
            }
            if flags == FLAG_SYN | FLAG_ACK && t.ack == e.tcp[0].end {
                e.tcp[1] = TcpDir {
                    end: t.seq.wrapping_add(1),
                    max_win: u32::from(t.window).max(1),
                    wscale: t.wscale,
                    fin: false,
                };
                // Scaling holds only when both SYNs asked for it (RFC 7323).
                if e.tcp[0].wscale.is_none() || e.tcp[1].wscale.is_none() {
                    e.tcp[0].wscale = None;
                    e.tcp[1].wscale = None;
                }
                e.state = CtState::SynRecv;
                return Step::Valid;
            }
            if flags & FLAG_RST != 0 && flags & FLAG_ACK != 0 && t.ack == e.tcp[0].end {
                e.state = CtState::Close;
                return Step::Valid;
            }
            return Step::Invalid;
        }
        // Retransmitted SYN and SYN-ACK.
        CtState::SynRecv
            if (dir == Dir::Reply && flags == FLAG_SYN | FLAG_ACK)
                || (dir == Dir::Original && flags == FLAG_SYN) =>
        {
            return Step::Valid;
        }
        _ => {}
    }
    if syn {
        return Step::Invalid;
    }
    // In window: within the largest window the other side announced of what this side
    // has sent so far (backwards for retransmissions, forwards for new data).
    let win = e.tcp[o].max_win.max(1);
    let off = t.seq.wrapping_sub(e.tcp[d].end) as i32;
    let in_window = i64::from(off).abs() <= i64::from(win);
    if !in_window {
        return Step::Invalid;
    }
    if flags & FLAG_RST != 0 {
        e.state = CtState::Close;
        return Step::Valid;
    }
    let fin = flags & FLAG_FIN != 0;
    let end = t
        .seq
        .wrapping_add(t.payload_len)
        .wrapping_add(u32::from(fin));
    if before(e.tcp[d].end, end) {
        e.tcp[d].end = end;
    }
    let w = u32::from(t.window) << e.tcp[d].wscale.unwrap_or(0);
    e.tcp[d].max_win = e.tcp[d].max_win.max(w);
    let ack = flags & FLAG_ACK != 0;
    if fin {
        e.tcp[d].fin = true;
    }
    e.state = match e.state {
        CtState::SynRecv if dir == Dir::Original && ack && t.ack == e.tcp[1].end => {
            if fin {
                CtState::FinWait
            } else {
                CtState::Established
            }
        }
        CtState::SynRecv => CtState::SynRecv,
        CtState::Established if fin => CtState::FinWait,
        CtState::FinWait if e.tcp[0].fin && e.tcp[1].fin => {
            if ack && t.ack == e.tcp[o].end && !fin {
                CtState::TimeWait
            } else {
                CtState::Closing
            }
        }
        CtState::Closing if ack && t.ack == e.tcp[o].end => CtState::TimeWait,
        s => s,
    };
    Step::Valid
}

#[cfg(test)]
mod tests {
    // The behaviours Open vSwitch's userspace conntrack system tests check (TCP handshake and
    // teardown states, invalid packets, UDP single direction, ICMP related over IPv4 and IPv6,
    // fragments), written against [`Firewall::check`], plus limits, rules and two threads.

    use super::*;
    use qswitch_api::config::RuleDirection::{Egress, Ingress};
    use qswitch_test_support::frames::{
        eth_header as eth, icmp_message as icmp, ipv4_fragment as v4_frag, ipv4_packet as v4,
        ipv6_packet as v6, tcp_header, udp_datagram,
    };
    use qswitch_wire::tcp::FLAG_PSH;

    const VM: [u8; 4] = [10, 0, 0, 5];
    const PEER: [u8; 4] = [10, 0, 0, 9];
    const OUT: [u8; 4] = [192, 0, 2, 1];
    const S: u64 = SEC;

    fn tcp(sport: u16, dport: u16, flags: u8, seq: u32, ack: u32, payload: usize) -> Vec<u8> {
        let mut h = tcp_header(sport, dport, flags, seq, ack, 1000);
        h.resize(20 + payload, 0);
        h
    }

    fn udp(sport: u16, dport: u16) -> Vec<u8> {
        udp_datagram(sport, dport, &[0; 4])
    }

    /// Port `vm` (zone 0) in group `g` with `rules`; port `other` (zone 1) unfiltered.
    fn firewall(rules: &str, extra: &str) -> Firewall {
        let text = format!(
            r#"
    [[security_group]]
    name = "g"
    rules = [
    {rules}
    ]
    {extra}
    [[port]]
    name = "vm"
    type = "gen"
    security = {{ ips = ["10.0.0.5", "fd00::5"] }}
    security_groups = ["g"]
    [[port]]
    name = "other"
    type = "gen"
    "#
        );
        let config = Config::from_toml(&text).unwrap();
        Firewall::from_config(&config).unwrap()
    }

    /// Egress anything, ingress nothing: the OpenStack default group without its ingress rule.
    fn egress_only() -> Firewall {
        firewall(r#"{ direction = "egress" },"#, "")
    }

    fn state(v: Verdict) -> Option<CtState> {
        match v {
            Verdict::Allow(_, s) | Verdict::Deny(_, s) => s,
        }
    }

    #[test]
    fn rule_hits_count_new_connections_and_stateless_frames_only() {
        let fw = firewall(
            r#"{ direction = "egress", protocol = "tcp" }, { direction = "egress" },"#,
            "",
        );
        let hits = |index: u16| {
            fw.stats()
                .rules
                .iter()
                .find(|h| h.zone == 0 && h.rule == RuleRef { group: 0, index })
                .map(|h| h.hits)
        };
        let syn = v4(VM, OUT, 6, &tcp(40000, 80, FLAG_SYN, 100, 0, 0));
        let ack = v4(VM, OUT, 6, &tcp(40000, 80, FLAG_ACK, 101, 501, 0));
        assert!(
            fw.peek(0, Egress, &syn, S).allowed(),
            "a dry run counts nothing"
        );
        assert_eq!(hits(0), Some(0));
        assert!(fw.check(0, Egress, &syn, S).allowed());
        assert!(
            fw.check(0, Egress, &syn, S).allowed(),
            "tracked: no second hit"
        );
        let _ = fw.check(0, Egress, &ack, S);
        assert!(fw
            .check(0, Egress, &v4(VM, OUT, 17, &udp(5000, 53)), S)
            .allowed());
        assert_eq!((hits(0), hits(1)), (Some(1), Some(1)));
        assert_eq!(hits(2), None);
    }

    #[test]
    fn tcp_handshake_and_teardown_states() {
        let fw = egress_only();
        let c = |dir, f: &[u8]| fw.check(0, dir, f, S);
        // VM opens: SYN out, SYN-ACK in, ACK out.
        let v = c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_SYN, 100, 0, 0)),
        );
        assert_eq!(
            v,
            Verdict::Allow(
                Allowed::New(RuleRef { group: 0, index: 0 }),
                Some(CtState::SynSent)
            )
        );
        let v = c(
            Ingress,
            &v4(
                OUT,
                VM,
                6,
                &tcp(80, 40000, FLAG_SYN | FLAG_ACK, 500, 101, 0),
            ),
        );
        assert_eq!(state(v), Some(CtState::SynRecv));
        assert!(matches!(
            v,
            Verdict::Allow(Allowed::Tracked(_, Dir::Reply), _)
        ));
        // Retransmissions of the SYN and the SYN-ACK.
        let v = c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_SYN, 100, 0, 0)),
        );
        assert_eq!(state(v), Some(CtState::SynRecv));
        let v = c(
            Ingress,
            &v4(
                OUT,
                VM,
                6,
                &tcp(80, 40000, FLAG_SYN | FLAG_ACK, 500, 101, 0),
            ),
        );
        assert_eq!(state(v), Some(CtState::SynRecv));
        let v = c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_ACK, 101, 501, 0)),
        );
        assert_eq!(state(v), Some(CtState::Established));
        // Data both ways.
        let v = c(
            Egress,
            &v4(
                VM,
                OUT,
                6,
                &tcp(40000, 80, FLAG_ACK | FLAG_PSH, 101, 501, 10),
            ),
        );
        assert_eq!(state(v), Some(CtState::Established));
        let v = c(
            Ingress,
            &v4(OUT, VM, 6, &tcp(80, 40000, FLAG_ACK, 501, 111, 20)),
        );
        assert_eq!(state(v), Some(CtState::Established));
        // FIN from the VM, FIN-ACK from the server, the last ACK: TIME_WAIT.
        let v = c(
            Egress,
            &v4(
                VM,
                OUT,
                6,
                &tcp(40000, 80, FLAG_FIN | FLAG_ACK, 111, 521, 0),
            ),
        );
        assert_eq!(state(v), Some(CtState::FinWait));
        let v = c(
            Ingress,
            &v4(
                OUT,
                VM,
                6,
                &tcp(80, 40000, FLAG_FIN | FLAG_ACK, 521, 112, 0),
            ),
        );
        assert_eq!(state(v), Some(CtState::Closing));
        let v = c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_ACK, 112, 522, 0)),
        );
        assert_eq!(state(v), Some(CtState::TimeWait));
        // A new SYN on the same ports reopens it.
        let v = c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_SYN, 9000, 0, 0)),
        );
        assert_eq!(state(v), Some(CtState::SynSent));
        assert_eq!(fw.sessions(0), 1);
        // TIME_WAIT ends after its timeout.
        let entry = |fw: &Firewall, now| {
            let mut n = 0;
            fw.table().for_each(now, |_| {
                n += 1;
                true
            });
            n
        };
        assert_eq!(entry(&fw, S), 1);
        assert_eq!(entry(&fw, S + 121 * S), 0);
        assert_eq!(fw.expire(S + 121 * S), 1);
        assert_eq!(fw.sessions(0), 0);
    }

    #[test]
    fn tcp_rst_teardown_and_refused_connection() {
        let fw = egress_only();
        let c = |dir, f: &[u8]| fw.check(0, dir, f, S);
        c(Egress, &v4(VM, OUT, 6, &tcp(40001, 81, FLAG_SYN, 7, 0, 0)));
        // The server refuses: RST-ACK acknowledging the SYN.
        let v = c(
            Ingress,
            &v4(OUT, VM, 6, &tcp(81, 40001, FLAG_RST | FLAG_ACK, 0, 8, 0)),
        );
        assert_eq!(state(v), Some(CtState::Close));
        assert!(v.allowed());
        // An established connection reset in window.
        c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40002, 80, FLAG_SYN, 100, 0, 0)),
        );
        c(
            Ingress,
            &v4(
                OUT,
                VM,
                6,
                &tcp(80, 40002, FLAG_SYN | FLAG_ACK, 500, 101, 0),
            ),
        );
        c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40002, 80, FLAG_ACK, 101, 501, 0)),
        );
        let v = c(
            Ingress,
            &v4(OUT, VM, 6, &tcp(80, 40002, FLAG_RST, 501, 0, 0)),
        );
        assert_eq!(state(v), Some(CtState::Close));
    }

    #[test]
    fn invalid_packets() {
        let fw = firewall(
            r#"{ direction = "egress" }, { direction = "ingress", protocol = "tcp", ports = 22 },"#,
            "",
        );
        let c = |dir, f: &[u8]| fw.check(0, dir, f, S);
        let invalid = || fw.zone(0).unwrap().ct_invalid.load(Ordering::Relaxed);
        // An ACK with no connection, even where a rule allows the port.
        let v = c(Ingress, &v4(OUT, VM, 6, &tcp(5555, 22, FLAG_ACK, 1, 1, 0)));
        assert_eq!(v, Verdict::Deny(Denied::Invalid, None));
        assert_eq!(invalid(), 1);
        // A SYN-ACK that acknowledges nothing sent.
        c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_SYN, 100, 0, 0)),
        );
        let v = c(
            Ingress,
            &v4(
                OUT,
                VM,
                6,
                &tcp(80, 40000, FLAG_SYN | FLAG_ACK, 500, 999, 0),
            ),
        );
        assert_eq!(v, Verdict::Deny(Denied::Invalid, Some(CtState::SynSent)));
        // A RST out of window on an established connection.
        c(
            Ingress,
            &v4(
                OUT,
                VM,
                6,
                &tcp(80, 40000, FLAG_SYN | FLAG_ACK, 500, 101, 0),
            ),
        );
        c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_ACK, 101, 501, 0)),
        );
        let v = c(
            Ingress,
            &v4(OUT, VM, 6, &tcp(80, 40000, FLAG_RST, 501 + 1_000_000, 0, 0)),
        );
        assert_eq!(
            v,
            Verdict::Deny(Denied::Invalid, Some(CtState::Established))
        );
        // Data far beyond the window; a SYN in an established connection.
        let v = c(
            Egress,
            &v4(
                VM,
                OUT,
                6,
                &tcp(40000, 80, FLAG_ACK, 101 + 3_000_000, 501, 10),
            ),
        );
        assert!(!v.allowed());
        let v = c(
            Egress,
            &v4(VM, OUT, 6, &tcp(40000, 80, FLAG_SYN, 101, 0, 0)),
        );
        assert!(!v.allowed());
        // A malformed IP packet; an echo reply with no request.
        let mut bad = v4(VM, OUT, 6, &tcp(1, 2, FLAG_SYN, 0, 0, 0));
        bad[14] = 0x44;
        assert_eq!(c(Egress, &bad), Verdict::Deny(Denied::Invalid, None));
        let v = c(Egress, &v4(VM, OUT, 1, &icmp(0, 0, &[0, 1, 0, 1])));
        assert_eq!(v, Verdict::Deny(Denied::Invalid, None));
        assert_eq!(invalid(), 7);
        // Still established after all that.
        let v = c(
            Ingress,
            &v4(OUT, VM, 6, &tcp(80, 40000, FLAG_ACK, 501, 101, 5)),
        );
        assert_eq!(state(v), Some(CtState::Established));
    }

    #[test]
    fn ingress_default_deny_and_rules_that_open() {
        let fw = egress_only();
        let v = fw.check(
            0,
            Ingress,
            &v4(OUT, VM, 6, &tcp(5555, 22, FLAG_SYN, 1, 0, 0)),
            S,
        );
        assert_eq!(v, Verdict::Deny(Denied::NoRule(Ingress), None));
        let fw = firewall(
            r#"{ direction = "ingress", protocol = "tcp", ports = "80,443", remote = "192.0.2.0/24" },
               { direction = "ingress", protocol = "icmp", remote_group = "g" },"#,
            "",
        );
        let syn = |src, port| v4(src, VM, 6, &tcp(5555, port, FLAG_SYN, 1, 0, 0));
        assert!(fw.check(0, Ingress, &syn(OUT, 443), S).allowed());
        assert!(!fw.check(0, Ingress, &syn(OUT, 22), S).allowed());
        assert!(!fw.check(0, Ingress, &syn(PEER, 80), S).allowed());
        // remote_group: the group's members' addresses (vm's own 10.0.0.5 here).
        let ping = |src| v4(src, VM, 1, &icmp(8, 0, &[0, 9, 0, 1]));
        let v = fw.check(0, Ingress, &ping(VM), S);
        assert_eq!(
            v,
            Verdict::Allow(
                Allowed::New(RuleRef { group: 0, index: 1 }),
                Some(CtState::Unreplied)
            )
        );
        assert!(!fw.check(0, Ingress, &ping(PEER), S).allowed());
        assert_eq!(fw.rules().name(RuleRef { group: 0, index: 1 }), "g/1");
        // Egress is denied: no egress rule.
        let v = fw.check(0, Egress, &v4(VM, OUT, 17, &udp(1, 2)), S);
        assert_eq!(v, Verdict::Deny(Denied::NoRule(Egress), None));
        // ARP, ND and DHCP pass whatever the rules.
        let mut arp = eth([0x08, 0x06]);
        arp.extend_from_slice(&[0; 28]);
        assert_eq!(
            fw.check(0, Egress, &arp, S),
            Verdict::Allow(Allowed::NotIp, None)
        );
        let ns = v6("fd00::9", "fd00::5", 58, &icmp(135, 0, &[0; 20]));
        assert_eq!(
            fw.check(0, Ingress, &ns, S),
            Verdict::Allow(Allowed::Always, None)
        );
        let dhcp = v4([0; 4], [255; 4], 17, &udp(68, 67));
        assert_eq!(
            fw.check(0, Egress, &dhcp, S),
            Verdict::Allow(Allowed::Always, None)
        );
    }

    #[test]
    fn udp_single_direction_then_replied() {
        let fw = egress_only();
        let out = v4(VM, OUT, 17, &udp(5000, 53));
        let back = v4(OUT, VM, 17, &udp(53, 5000));
        assert_eq!(
            state(fw.check(0, Egress, &out, S)),
            Some(CtState::Unreplied)
        );
        assert_eq!(
            state(fw.check(0, Egress, &out, 2 * S)),
            Some(CtState::Unreplied)
        );
        // Unreplied lives 30 s from the last packet: a reply after 33 s finds nothing.
        assert_eq!(
            fw.check(0, Ingress, &back, 33 * S),
            Verdict::Deny(Denied::NoRule(Ingress), None)
        );
        assert_eq!(
            state(fw.check(0, Egress, &out, 40 * S)),
            Some(CtState::Unreplied)
        );
        let v = fw.check(0, Ingress, &back, 41 * S);
        assert_eq!(
            v,
            Verdict::Allow(
                Allowed::Tracked(RuleRef::default(), Dir::Reply),
                Some(CtState::Replied)
            )
        );
        // Replied lives 120 s.
        assert!(fw.check(0, Ingress, &back, 150 * S).allowed());
        assert!(!fw.check(0, Ingress, &back, 271 * S).allowed());
        // Another source port from outside is a different connection: denied.
        assert!(!fw
            .check(0, Ingress, &v4(OUT, VM, 17, &udp(54, 5000)), 41 * S)
            .allowed());
    }

    #[test]
    fn icmp_echo_by_identifier() {
        let fw = egress_only();
        let req = v4(VM, OUT, 1, &icmp(8, 0, &[0x12, 0x34, 0, 1]));
        assert_eq!(
            state(fw.check(0, Egress, &req, S)),
            Some(CtState::Unreplied)
        );
        let rep = |id: u8| v4(OUT, VM, 1, &icmp(0, 0, &[0x12, id, 0, 1]));
        assert_eq!(
            state(fw.check(0, Ingress, &rep(0x34), S)),
            Some(CtState::Replied)
        );
        assert!(!fw.check(0, Ingress, &rep(0x35), S).allowed());
        // IPv6.
        let req = v6("fd00::5", "fd00::9", 58, &icmp(128, 0, &[0, 7, 0, 1]));
        let rep = v6("fd00::9", "fd00::5", 58, &icmp(129, 0, &[0, 7, 0, 1]));
        assert!(fw.check(0, Egress, &req, S).allowed());
        assert_eq!(state(fw.check(0, Ingress, &rep, S)), Some(CtState::Replied));
    }

    #[test]
    fn icmp_related_v4_and_v6() {
        let fw = egress_only();
        let out = v4(VM, OUT, 17, &udp(5000, 53));
        fw.check(0, Egress, &out, S);
        // The server's port unreachable quoting the datagram: related.
        let err = v4(OUT, VM, 1, &icmp(3, 3, &[&[0; 4], &out[14..42]].concat()));
        let v = fw.check(0, Ingress, &err, S);
        assert_eq!(
            v,
            Verdict::Allow(
                Allowed::Related(RuleRef::default()),
                Some(CtState::Unreplied)
            )
        );
        // A router's time exceeded (another source) about it: related too.
        let err = v4(PEER, VM, 1, &icmp(11, 0, &[&[0; 4], &out[14..42]].concat()));
        assert!(fw.check(0, Ingress, &err, S).allowed());
        // An error about a connection never made: denied.
        let never = v4(VM, OUT, 17, &udp(6000, 53));
        let err = v4(OUT, VM, 1, &icmp(3, 3, &[&[0; 4], &never[14..42]].concat()));
        assert_eq!(
            fw.check(0, Ingress, &err, S),
            Verdict::Deny(Denied::NoRule(Ingress), None)
        );
        // IPv6: packet too big about a TCP connection.
        let syn = v6("fd00::5", "fd00::9", 6, &tcp(40000, 443, FLAG_SYN, 1, 0, 0));
        fw.check(0, Egress, &syn, S);
        let err = v6(
            "fd00::9",
            "fd00::5",
            58,
            &icmp(2, 0, &[&[0, 0, 5, 0], &syn[14..]].concat()),
        );
        assert!(matches!(
            fw.check(0, Ingress, &err, S),
            Verdict::Allow(Allowed::Related(_), _)
        ));
    }

    #[test]
    fn fragments_first_tracked_later_dropped_and_counted() {
        let fw = egress_only();
        // The first fragment (MF, offset 0) carries the ports: tracked like a whole datagram.
        let first = v4_frag(VM, OUT, 17, 0x2000, &udp(5000, 53));
        assert_eq!(
            state(fw.check(0, Egress, &first, S)),
            Some(CtState::Unreplied)
        );
        let later = v4_frag(VM, OUT, 17, 0x0010, &[0; 16]);
        assert_eq!(
            fw.check(0, Egress, &later, S),
            Verdict::Deny(Denied::Fragment, None)
        );
        assert_eq!(fw.zone(0).unwrap().ct_fragment.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn session_limits_deny_new_and_keep_existing() {
        let fw = firewall(
            r#"{ direction = "egress" },"#,
            "[firewall]\nmax_sessions = 3\n",
        );
        let out = |sport| v4(VM, OUT, 17, &udp(sport, 53));
        for sport in 1..=3 {
            assert!(fw.check(0, Egress, &out(sport), S).allowed());
        }
        assert_eq!(
            fw.check(0, Egress, &out(4), S),
            Verdict::Deny(Denied::Limit, None)
        );
        assert_eq!(fw.zone(0).unwrap().ct_limit.load(Ordering::Relaxed), 1);
        // Existing connections go on, both ways.
        assert!(fw.check(0, Egress, &out(2), S).allowed());
        assert!(fw
            .check(0, Ingress, &v4(OUT, VM, 17, &udp(53, 2)), S)
            .allowed());
        // A flush frees them.
        assert_eq!(fw.flush(Some(0), S), 3);
        assert!(fw.check(0, Egress, &out(4), S).allowed());

        // The port's own limit.
        let text = r#"{ direction = "egress" },"#;
        let config = Config::from_toml(&format!(
            "[[security_group]]\nname = \"g\"\nrules = [{text}]\n[[port]]\nname = \"vm\"\ntype = \"gen\"\nsecurity_groups = [\"g\"]\nmax_sessions = 2\n"
        ))
        .unwrap();
        let fw = Firewall::from_config(&config).unwrap();
        assert!(fw.check(0, Egress, &out(1), S).allowed());
        assert!(fw.check(0, Egress, &out(2), S).allowed());
        assert_eq!(
            fw.check(0, Egress, &out(3), S),
            Verdict::Deny(Denied::Limit, None)
        );
        assert!(fw.check(0, Egress, &out(1), S).allowed());
    }

    #[test]
    fn fifty_rules_only_the_last_matches() {
        let fw = firewall(&qswitch_test_support::firewall::fifty_rules(), "");
        let v = fw.check(0, Egress, &v4(VM, OUT, 17, &udp(5000, 53)), S);
        assert_eq!(
            v,
            Verdict::Allow(
                Allowed::New(RuleRef {
                    group: 0,
                    index: 49
                }),
                Some(CtState::Unreplied)
            )
        );
        // Then the table, not the rules, answers.
        let v = fw.check(0, Egress, &v4(VM, OUT, 17, &udp(5000, 53)), S);
        assert!(matches!(
            v,
            Verdict::Allow(Allowed::Tracked(_, Dir::Original), _)
        ));
    }

    #[test]
    fn stateless_groups_track_nothing() {
        let text = r#"
    [[security_group]]
    name = "acl"
    stateless = true
    rules = [ { direction = "egress", protocol = "udp" } ]
    [[port]]
    name = "vm"
    type = "gen"
    security_groups = ["acl"]
    "#;
        let fw = Firewall::from_config(&Config::from_toml(text).unwrap()).unwrap();
        let v = fw.check(0, Egress, &v4(VM, OUT, 17, &udp(5000, 53)), S);
        assert_eq!(
            v,
            Verdict::Allow(Allowed::Stateless(RuleRef::default()), None)
        );
        assert!(fw.table().is_empty());
        // The reply needs its own rule.
        assert!(!fw
            .check(0, Ingress, &v4(OUT, VM, 17, &udp(53, 5000)), S)
            .allowed());
    }

    #[test]
    fn no_groups_no_firewall() {
        let text = "[[port]]\nname = \"vm\"\ntype = \"gen\"\n";
        assert!(Firewall::from_config(&Config::from_toml(text).unwrap()).is_none());
        // A zone the firewall does not filter (port `other`).
        let fw = egress_only();
        let v = fw.check(1, Ingress, &v4(OUT, VM, 17, &udp(1, 2)), S);
        assert_eq!(v, Verdict::Allow(Allowed::Unfiltered, None));
    }

    /// The two directions of each connection on two threads at once: every packet allowed,
    /// every connection ends up replied, the counts agree.
    #[test]
    fn two_threads_two_directions() {
        let fw = firewall(
            r#"{ direction = "egress" }, { direction = "ingress", protocol = "udp", remote = "192.0.2.0/24" },"#,
            "",
        );
        let n = 2000u16;
        std::thread::scope(|s| {
            s.spawn(|| {
                for p in 0..n {
                    assert!(fw
                        .check(0, Egress, &v4(VM, OUT, 17, &udp(10000 + p, 53)), S)
                        .allowed());
                }
            });
            s.spawn(|| {
                for p in 0..n {
                    // Either direction may come first: the other then finds the entry.
                    assert!(fw
                        .check(0, Ingress, &v4(OUT, VM, 17, &udp(53, 10000 + p)), S)
                        .allowed());
                }
            });
        });
        assert_eq!(fw.table().len(), u32::from(n));
        assert_eq!(fw.sessions(0), u32::from(n));
        let mut replied = 0;
        fw.table().for_each(S, |e| {
            replied += u32::from(e.state == CtState::Replied);
            true
        });
        assert_eq!(replied, u32::from(n));
    }
}
