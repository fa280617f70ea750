//! The stateful firewall: security groups with connection tracking (docs/firewall.md).
//!
//! [`Firewall::check`] gives the verdict on one frame crossing one filtered port in one
//! direction (ingress: toward the port's VM; egress: from it). Each port is its own zone:
//! a frame from port A to port B is checked by A's egress filter, then by B's ingress
//! filter, and each tracks the connection in its own zone, as OVN and Neutron do.
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

pub mod conntrack;
pub mod rules;

use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use qswitch_api::config::{Config, FirewallConfig, RuleDirection};
use qswitch_wire::ct::{self, CtError, CtPacket, Fragment, TcpInfo, L4};
use qswitch_wire::tcp::{FLAG_ACK, FLAG_FIN, FLAG_RST, FLAG_SYN};

pub use conntrack::{CtState, CtTable, Dir, Entry, RuleRef, TcpDir};
pub use rules::{PortRules, Rule, RuleSet};

const SEC: u64 = 1_000_000_000;

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
    table: CtTable,
    rules: ArcSwap<RuleSet>,
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
    /// shards.
    pub fn new(rules: RuleSet, max_sessions: u32, timeouts: Timeouts, shards: usize) -> Firewall {
        let zones = (0..rules.ports.len())
            .map(|_| ZoneCounters::default())
            .collect();
        Firewall {
            table: CtTable::new(max_sessions, shards, rules.ports.len()),
            rules: ArcSwap::from_pointee(rules),
            zones,
            timeouts,
        }
    }

    /// The connection table (listing, flushing, expiry, memory).
    pub fn table(&self) -> &CtTable {
        &self.table
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
        self.sweep(now, None)
    }

    /// Removes every connection of `zone`, or of every zone.
    pub fn flush(&self, zone: Option<u32>, now: u64) -> u32 {
        self.sweep(
            now,
            Some(&move |e: &Entry| zone.is_none_or(|z| e.zone == z)),
        )
    }

    fn sweep(&self, now: u64, remove: Option<&dyn Fn(&Entry) -> bool>) -> u32 {
        self.table.sweep(now, remove)
    }

    /// Connections of `zone` tracked now.
    pub fn sessions(&self, zone: u32) -> u32 {
        self.table.zone_len(zone)
    }

    /// The verdict on `frame` crossing port `zone` in `direction` at `now`.
    pub fn check(&self, zone: u32, direction: RuleDirection, frame: &[u8], now: u64) -> Verdict {
        let Some(counters) = self.zones.get(zone as usize) else {
            return Verdict::Allow(Allowed::NotIp, None);
        };
        let p = match ct::parse(frame) {
            Ok(p) => p,
            Err(CtError::NotIp) => return Verdict::Allow(Allowed::NotIp, None),
            Err(_) => return self.invalid(counters, None),
        };
        if always_allowed(&p, direction) {
            return Verdict::Allow(Allowed::Always, None);
        }
        if p.fragment == Fragment::Later {
            counters.ct_fragment.fetch_add(1, Ordering::Relaxed);
            return Verdict::Deny(Denied::Fragment, None);
        }
        if let L4::IcmpError { inner, .. } = p.l4 {
            let related = self
                .table
                .with(zone, &inner, now, |e, _| ((e.rule, e.state), false));
            if let Some((rule, state)) = related {
                return Verdict::Allow(Allowed::Related(rule), Some(state));
            }
        }
        // A packet of a tracked connection.
        let tracked = self.table.with(zone, &p.key, now, |e, dir| {
            let step = advance(e, dir, &p);
            let reopen = step == Step::Reopen;
            if let Step::Valid = step {
                e.expires = now.saturating_add(self.timeouts.of(e.key.proto, e.state));
            }
            ((step, e.rule, e.state, dir), reopen)
        });
        match tracked {
            Some((Step::Valid, rule, state, dir)) => {
                return Verdict::Allow(Allowed::Tracked(rule, dir), Some(state))
            }
            Some((Step::Invalid, _, state, _)) => return self.invalid(counters, Some(state)),
            Some((Step::Reopen, ..)) | None => {}
        }
        // A new connection: the rules decide.
        let rules = self.rules.load();
        let Some(port) = rules.ports.get(zone as usize).and_then(Option::as_ref) else {
            return Verdict::Allow(Allowed::NotIp, None);
        };
        let Some(rule) = port.first_match(direction, &p) else {
            return Verdict::Deny(Denied::NoRule(direction), None);
        };
        if rule.stateless || matches!(p.l4, L4::IcmpError { .. } | L4::IcmpOther { .. }) {
            // ICMP errors about nothing tracked and other ICMP messages pass by rule alone.
            return Verdict::Allow(Allowed::Stateless(rule.id), None);
        }
        let Some(state) = first_state(&p) else {
            return self.invalid(counters, None);
        };
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
        match self.table.insert(entry, now, port.max_sessions) {
            Ok(()) => {
                counters.new.fetch_add(1, Ordering::Relaxed);
                Verdict::Allow(Allowed::New(rule.id), Some(state))
            }
            Err(_) => {
                counters.ct_limit.fetch_add(1, Ordering::Relaxed);
                Verdict::Deny(Denied::Limit, None)
            }
        }
    }

    fn invalid(&self, counters: &ZoneCounters, state: Option<CtState>) -> Verdict {
        counters.ct_invalid.fetch_add(1, Ordering::Relaxed);
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
        CtState::SynRecv if dir == Dir::Reply && flags == FLAG_SYN | FLAG_ACK => {
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
mod tests;
