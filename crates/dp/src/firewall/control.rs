//! The firewall's control side: listing and flushing connections, statistics, and new
//! rules with the connections they no longer allow ended (docs/firewall.md).
//!
//! Nothing here holds a shard's lock for more than [`super::conntrack::SCAN_CHUNK`] entry slots
//! ([`CtTable::visit`]), and statistics read counters only, so the control plane answers
//! in bounded time whatever the table holds and never stalls a worker for longer than one
//! chunk's work (`tests::control_calls_with_a_million_sessions` measures it).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use qswitch_api::config::RuleDirection;
use qswitch_wire::ct::{CtPacket, Fragment, TcpInfo, L4};
use qswitch_wire::tcp::FLAG_SYN;

use super::conntrack::{Entry, RuleRef, Visit};
use super::{CtTable, Firewall, RuleSet};

/// One zone's (port's) connection-tracking counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZoneStats {
    pub zone: u32,
    /// Connections tracked now.
    pub sessions: u32,
    /// The port's `max_sessions`, if it has one.
    pub max_sessions: Option<u32>,
    /// Connections opened since start.
    pub new: u64,
    pub ct_invalid: u64,
    pub ct_limit: u64,
    pub ct_fragment: u64,
}

/// The table as a whole and the filtered zones, read from counters only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CtStats {
    /// Connections tracked now, switch-wide.
    pub sessions: u32,
    /// The switch-wide limit.
    pub max_sessions: u32,
    /// Entries allocated (the limit plus the shards' slack).
    pub capacity: usize,
    /// Bytes the table holds, all allocated at start.
    pub memory_bytes: usize,
    /// Zones filtered now, and zones that still have connections or counts.
    pub zones: Vec<ZoneStats>,
    /// Every compiled rule of the filtered zones, with its hits.
    pub rules: Vec<RuleHits>,
}

/// The hits of one rule on one port (zone): new connections and stateless frames it
/// allowed (kept across recompiles: [`RuleSet::keep_hits`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleHits {
    pub zone: u32,
    pub rule: RuleRef,
    pub hits: u64,
}

impl Firewall {
    /// Up to `limit` connections of `zone` (of every zone: `None`).
    pub fn list(&self, zone: Option<u32>, limit: usize, now: u64) -> Vec<Entry> {
        self.table
            .get()
            .map_or_else(Vec::new, |t| t.list(now, zone, limit))
    }

    /// Connections tracked now, switch-wide.
    pub fn table_len(&self) -> u32 {
        self.table.get().map_or(0, CtTable::len)
    }

    /// Counters of the table and of each zone that is filtered or has anything to show.
    pub fn stats(&self) -> CtStats {
        let rules = self.rules.load();
        let zones = self
            .zones
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let zone = u32::try_from(i).ok()?;
                let port = rules.ports.get(i).and_then(Option::as_ref);
                let z = ZoneStats {
                    zone,
                    sessions: self.sessions(zone),
                    max_sessions: port.and_then(|p| p.max_sessions),
                    new: c.new.load(Ordering::Relaxed),
                    ct_invalid: c.ct_invalid.load(Ordering::Relaxed),
                    ct_limit: c.ct_limit.load(Ordering::Relaxed),
                    ct_fragment: c.ct_fragment.load(Ordering::Relaxed),
                };
                let shown = port.is_some()
                    || z.sessions > 0
                    || z.new + z.ct_invalid + z.ct_limit + z.ct_fragment > 0;
                shown.then_some(z)
            })
            .collect();
        let mut hits = Vec::new();
        for (i, port) in rules.ports.iter().enumerate() {
            let (Some(port), Ok(zone)) = (port, u32::try_from(i)) else {
                continue;
            };
            for r in port.ingress.iter().chain(&port.egress) {
                hits.push(RuleHits {
                    zone,
                    rule: r.id,
                    hits: r.hits.get(),
                });
            }
        }
        let table = self.table.get();
        CtStats {
            rules: hits,
            sessions: table.map_or(0, CtTable::len),
            max_sessions: self.max_sessions,
            capacity: table.map_or(0, CtTable::capacity),
            memory_bytes: table.map_or(0, CtTable::memory_bytes),
            zones,
        }
    }

    /// Zeroes a zone's counters (a port removed, its slot to be reused).
    pub fn reset_zone(&self, zone: u32) {
        if let Some(c) = self.zones.get(zone as usize) {
            c.new.store(0, Ordering::Relaxed);
            c.ct_invalid.store(0, Ordering::Relaxed);
            c.ct_limit.store(0, Ordering::Relaxed);
            c.ct_fragment.store(0, Ordering::Relaxed);
        }
    }
}

impl RuleSet {
    /// Gives each rule of these new rules the hit counter of the same rule in `old` (same
    /// zone, same [`super::Rule::key`]: its group, its configuration, its rank among identical
    /// rules), so that a recompile (a rule added or removed elsewhere, a member port
    /// added) neither resets nor shifts the counts. The counter is shared, not copied:
    /// hits counted by a worker still on the old rules are not lost.
    pub fn keep_hits(&mut self, old: &RuleSet) {
        for (zone, new) in self.ports.iter_mut().enumerate() {
            let (Some(new), Some(Some(old))) = (new, old.ports.get(zone)) else {
                continue;
            };
            let before: HashMap<u64, &super::Hits> = (old.ingress.iter())
                .chain(&old.egress)
                .map(|r| (r.key, &r.hits))
                .collect();
            for r in new.ingress.iter_mut().chain(new.egress.iter_mut()) {
                if let Some(h) = before.get(&r.key) {
                    r.hits = (*h).clone();
                }
            }
        }
    }
}

/// The direction each rule of `rules` allows in.
fn directions(rules: &RuleSet) -> HashMap<RuleRef, RuleDirection> {
    let mut out = HashMap::new();
    for p in rules.ports.iter().flatten() {
        for r in &p.ingress {
            out.insert(r.id, RuleDirection::Ingress);
        }
        for r in &p.egress {
            out.insert(r.id, RuleDirection::Egress);
        }
    }
    out
}

/// The first packet of a connection, as the rules see it: its key, and the upper layer a
/// packet that opens such a connection has.
fn opening_packet(e: &Entry) -> CtPacket {
    let l4 = match e.key.proto {
        6 => L4::Tcp(TcpInfo {
            flags: FLAG_SYN,
            seq: 0,
            ack: 0,
            window: 0,
            payload_len: 0,
            wscale: None,
        }),
        17 => L4::Udp,
        qswitch_wire::ct::PROTO_SCTP => L4::Sctp,
        1 | 58 => L4::Echo {
            id: e.key.src,
            request: true,
        },
        _ => L4::Other,
    };
    CtPacket {
        key: e.key,
        l4,
        fragment: Fragment::No,
        vlan: None,
    }
}

/// Judges every connection again by `new`, which replaced `old` ([`Firewall::set_rules`]):
/// each tracked connection's first packet is judged again by the new rules of its zone in
/// the direction it was opened; a connection no stateful rule allows any more (its rule
/// removed, its remote address out of a `remote_group`, its port's groups gone) is
/// removed, the others take the rule that now allows them, as Neutron does. A rule added
/// needs nothing: the workers' next new connection sees it. Returns how many connections
/// were ended.
///
/// The swap is atomic; this then walks the table chunk by chunk ([`CtTable::visit`]).
/// A worker that loaded the old rules just before the swap may still open a connection by
/// them in the instant after it, behind this scan: the window is one packet's check.
pub(super) fn revalidate(table: &CtTable, old: &RuleSet, new: &RuleSet) -> u32 {
    // Only the zones whose rules changed (adding a port without groups changes none):
    // when none did, the table is not walked at all.
    fn rules_of(r: &RuleSet, z: usize) -> Option<&super::PortRules> {
        r.ports.get(z).and_then(Option::as_ref)
    }
    let changed: Vec<bool> = (0..old.ports.len().max(new.ports.len()))
        .map(|z| rules_of(old, z) != rules_of(new, z))
        .collect();
    if !changed.contains(&true) {
        return 0;
    }
    let dirs = directions(old);
    // What `zone`'s new rules say of the connection `e` it opened by `rule`: unchanged
    // (its rules did not change), the rule that allows it now, or none.
    let judge = |e: &Entry, zone: u32, rule: RuleRef| -> Option<Option<RuleRef>> {
        if !changed.get(zone as usize).copied().unwrap_or(false) {
            return None;
        }
        let Some(port) = new.ports.get(zone as usize).and_then(Option::as_ref) else {
            return Some(None);
        };
        let p = opening_packet(e);
        // The direction it was opened in; both if its rule is unknown (it always is known).
        let tried: &[RuleDirection] = match dirs.get(&rule) {
            Some(RuleDirection::Ingress) => &[RuleDirection::Ingress],
            Some(RuleDirection::Egress) => &[RuleDirection::Egress],
            None => &[RuleDirection::Ingress, RuleDirection::Egress],
        };
        Some(
            tried
                .iter()
                .find_map(|&d| port.first_match(d, &p).filter(|r| !r.stateless))
                .map(|r| r.id),
        )
    };
    let mut ended = 0;
    // Time 0: nothing counts as expired here; expiry has its own sweep.
    let removed = table.visit(0, |e| {
        // An entry two ports share: each port's rules judge its own part.
        let peer = (e.peer != super::NO_PEER).then(|| (e.peer, judge(e, e.peer, e.peer_rule)));
        match judge(e, e.zone, e.rule) {
            None => {}
            Some(Some(rule)) => e.rule = rule,
            Some(None) => {
                if peer.is_none_or(|(_, p)| p == Some(None)) {
                    // Each port's connection counts as one ended.
                    ended += u32::from(peer.is_some());
                    return Visit::Remove;
                }
                let zone = e.zone;
                ended += 1;
                table.detach(e, zone);
            }
        }
        match peer {
            Some((zone, Some(None))) if e.covers(zone) => {
                ended += 1;
                table.detach(e, zone);
            }
            Some((zone, Some(Some(rule)))) if e.zone == zone => e.rule = rule,
            Some((_, Some(Some(rule)))) => e.peer_rule = rule,
            _ => {}
        }
        Visit::Keep
    });
    removed + ended
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use qswitch_api::config::Config;
    use qswitch_api::config::RuleDirection::{Egress, Ingress};
    use qswitch_test_support::frames::{ipv4_packet as frame, ipv4_udp as udp, tcp_header};
    use qswitch_wire::ct::CtKey;
    use qswitch_wire::flow::IpPair;

    use super::*;
    use crate::firewall::{CtState, Dir};

    const S: u64 = 1_000_000_000;
    const VM: [u8; 4] = [10, 0, 0, 5];
    const PEER: [u8; 4] = [10, 0, 0, 6];
    const OUT: [u8; 4] = [192, 0, 2, 9];

    /// Ports `vm` (zone 0, group g, 10.0.0.5), `peer` (zone 1, group `peer_groups`,
    /// 10.0.0.6) and the groups of `groups` (TOML).
    fn config(groups: &str, peer_groups: &str) -> Config {
        Config::from_toml(&format!(
            r#"
{groups}
[[port]]
name = "vm"
type = "gen"
security = {{ ips = ["10.0.0.5"] }}
security_groups = ["g"]
[[port]]
name = "peer"
type = "gen"
security = {{ ips = ["10.0.0.6"] }}
security_groups = [{peer_groups}]
"#
        ))
        .unwrap()
    }

    fn syn(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
        frame(src, dst, 6, &tcp_header(sport, dport, FLAG_SYN, 0, 0, 1000))
    }

    #[test]
    fn list_flush_and_stats_by_port() {
        let groups = r#"[[security_group]]
name = "g"
rules = [{ direction = "egress" }]"#;
        let fw = Firewall::from_config(&config(groups, "\"g\"")).unwrap();
        for p in 0..30 {
            assert!(fw
                .check(0, Egress, &udp(VM, OUT, 1000 + p, 53), S)
                .allowed());
        }
        for p in 0..5 {
            assert!(fw
                .check(1, Egress, &udp(PEER, OUT, 1000 + p, 53), S)
                .allowed());
        }
        assert_eq!(fw.list(None, 1000, S).len(), 35);
        assert_eq!(fw.list(None, 10, S).len(), 10);
        let peer = fw.list(Some(1), 1000, S);
        assert_eq!(peer.len(), 5);
        assert!(peer
            .iter()
            .all(|e| e.zone == 1 && e.state == CtState::Unreplied));
        assert!(fw.list(Some(7), 10, S).is_empty());
        assert_eq!(fw.list(Some(0), 0, S).len(), 0);

        let st = fw.stats();
        assert_eq!(
            (st.sessions, st.max_sessions),
            (35, crate::firewall::DEFAULT_MAX_SESSIONS)
        );
        assert!(st.capacity >= st.max_sessions as usize && st.memory_bytes > 0);
        let zones: Vec<(u32, u32, u64)> = st
            .zones
            .iter()
            .map(|z| (z.zone, z.sessions, z.new))
            .collect();
        assert_eq!(zones, [(0, 30, 30), (1, 5, 5)]);

        // Flushing one port leaves the other's.
        assert_eq!(fw.flush(Some(1), S), 5);
        assert_eq!(fw.list(Some(1), 10, S).len(), 0);
        assert_eq!(fw.sessions(0), 30);
        // Expired entries are neither listed nor counted once a scan has passed.
        assert!(fw.list(None, 1000, 100 * S).is_empty());
        assert_eq!(fw.table().len(), 0);
        fw.reset_zone(0);
        assert_eq!(fw.stats().zones[0].new, 0);
    }

    #[test]
    fn a_removed_rule_ends_its_connections_an_added_one_applies_at_once() {
        let both = r#"[[security_group]]
name = "g"
rules = [
  { direction = "ingress", protocol = "tcp", ports = 22 },
  { direction = "ingress", protocol = "tcp", ports = 80 },
  { direction = "egress" },
]"#;
        let c = config(both, "");
        let fw = Firewall::from_config(&c).unwrap();
        assert!(fw.check(0, Ingress, &syn(OUT, VM, 5000, 22), S).allowed());
        assert!(fw.check(0, Ingress, &syn(OUT, VM, 5001, 80), S).allowed());
        assert!(fw.check(0, Egress, &udp(VM, OUT, 7, 53), S).allowed());
        assert!(!fw.check(0, Ingress, &syn(OUT, VM, 5002, 443), S).allowed());
        // Rule 0 (port 22) removed: its connection ends, port 80's stays under its new
        // index, the egress one stays.
        let only80 = both
            .replace(
                r#"  { direction = "ingress", protocol = "tcp", ports = 22 },"#,
                "",
            )
            .replace(
                "ports = 80 }",
                "ports = 80 },\n  { direction = \"ingress\", protocol = \"tcp\", ports = 443 }",
            );
        let ended = fw.set_rules(RuleSet::compile(&config(&only80, "")));
        assert_eq!(ended, 1);
        let left: Vec<(u16, RuleRef)> = fw
            .list(Some(0), 10, S)
            .iter()
            .map(|e| (e.key.dst, e.rule))
            .collect();
        assert_eq!(left.len(), 2);
        assert!(left.contains(&(80, RuleRef { group: 0, index: 0 })));
        assert!(left.contains(&(53, RuleRef { group: 0, index: 2 })));
        // The removed rule's port is closed, even to a retransmitted SYN; the added one opens.
        assert!(!fw.check(0, Ingress, &syn(OUT, VM, 5000, 22), S).allowed());
        assert!(fw.check(0, Ingress, &syn(OUT, VM, 5002, 443), S).allowed());
        // The same rules again end nothing.
        assert_eq!(fw.set_rules(RuleSet::compile(&config(&only80, ""))), 0);
        // The port's groups gone: everything of it ends.
        let mut c = config(&only80, "");
        c.ports[0].security_groups.clear();
        assert_eq!(fw.set_rules(RuleSet::compile(&c)), 3);
        assert!(fw.table().is_empty());
    }

    /// A connection between two filtered ports of the switch (`vm` zone 0, `peer` zone 1)
    /// is one entry both share: the destination's check of a frame the source's check
    /// found is no second lookup; each port's own rules still decide its own part, and a
    /// flush or a removed rule of one port leaves the other's.
    #[test]
    fn two_filtered_ports_share_one_entry() {
        let g = r#"[[security_group]]
name = "g"
rules = [ { direction = "egress" }, { direction = "ingress", protocol = "udp" } ]
[[security_group]]
name = "h"
rules = [ { direction = "egress" }, { direction = "ingress", protocol = "udp", ports = 53 } ]"#;
        let fw = Firewall::from_config(&config(g, "\"h\"")).unwrap();
        let allowed = |zone, f: &[u8], seen: crate::firewall::Seen| {
            let mut out = None;
            fw.check_burst(zone, Ingress, 1, |_| f, |_| seen, S, |_, v| out = Some(v));
            out.unwrap()
        };
        let there = udp(VM, PEER, 4000, 53);
        let back = udp(PEER, VM, 53, 4000);
        let mut seen = crate::firewall::Seen::NONE;
        // vm's egress opens, peer's ingress joins: one entry, one session on each port.
        assert!(fw.check_seen(0, Egress, &there, S, &mut seen).allowed());
        let v = allowed(1, &there, seen);
        assert_eq!(
            v,
            crate::firewall::Verdict::Allow(
                crate::firewall::Allowed::New(RuleRef { group: 1, index: 1 }),
                Some(CtState::Unreplied)
            )
        );
        assert_eq!(
            (fw.table().len(), fw.sessions(0), fw.sessions(1)),
            (1, 1, 1)
        );
        // The next frame: the source's lookup covers the destination.
        assert!(fw.check_seen(0, Egress, &there, S, &mut seen).allowed());
        assert!(matches!(
            allowed(1, &there, seen),
            crate::firewall::Verdict::Allow(crate::firewall::Allowed::Tracked(r, Dir::Original), _)
                if r == RuleRef { group: 1, index: 1 }
        ));
        // The reply, from peer's egress, finds the same entry and moves it on once.
        assert!(fw.check_seen(1, Egress, &back, S, &mut seen).allowed());
        assert!(matches!(
            allowed(0, &back, seen),
            crate::firewall::Verdict::Allow(
                crate::firewall::Allowed::Tracked(_, Dir::Reply),
                Some(CtState::Replied)
            )
        ));
        assert_eq!(fw.table().len(), 1);
        // Listed once per port, each with its own rule.
        let by_peer = fw.list(Some(1), 10, S);
        assert_eq!(by_peer.len(), 1);
        assert_eq!((by_peer[0].zone, by_peer[0].rule.group), (1, 1));
        assert_eq!(fw.list(None, 10, S).len(), 2);
        // vm's flush leaves peer's connection.
        assert_eq!(fw.flush(Some(0), S), 1);
        assert_eq!(
            (fw.table().len(), fw.sessions(0), fw.sessions(1)),
            (1, 0, 1)
        );
        assert_eq!(fw.list(Some(1), 10, S)[0].zone, 1);
        // A new connection to another port of peer: peer's rule 53 no longer allows it
        // once removed; vm's part stays.
        let other = udp(VM, PEER, 4001, 5353);
        let mut seen = crate::firewall::Seen::NONE;
        assert!(fw.check_seen(0, Egress, &other, S, &mut seen).allowed());
        assert!(!allowed(1, &other, seen).allowed());
        let there2 = udp(VM, PEER, 4002, 53);
        assert!(fw.check_seen(0, Egress, &there2, S, &mut seen).allowed());
        assert!(allowed(1, &there2, seen).allowed());
        assert_eq!((fw.sessions(0), fw.sessions(1)), (2, 2));
        let closed = g.replace(
            r#"{ direction = "ingress", protocol = "udp", ports = 53 }"#,
            r#"{ direction = "ingress", protocol = "tcp" }"#,
        );
        assert_eq!(fw.set_rules(RuleSet::compile(&config(&closed, "\"h\""))), 2);
        assert_eq!((fw.sessions(0), fw.sessions(1)), (2, 0));
        assert_eq!(fw.table().len(), 2);
        // peer's ingress judges anew: denied.
        assert!(fw.check_seen(0, Egress, &there2, S, &mut seen).allowed());
        assert!(!allowed(1, &there2, seen).allowed());
    }

    /// The hits of the rule on port 80 and 22 of `vm` (zone 0), by the port the rule opens.
    fn hits_by_port(fw: &Firewall) -> Vec<(u16, u64)> {
        let rules = fw.rules();
        let vm = rules.ports[0].as_ref().unwrap();
        let mut out: Vec<(u16, u64)> = (vm.ingress.iter())
            .map(|r| {
                let p = [80, 22, 443]
                    .into_iter()
                    .find(|&p| r.matches(&qswitch_wire::ct::parse(&syn(OUT, VM, 1, p)).unwrap()))
                    .unwrap_or(0);
                (p, r.hits.get())
            })
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn rule_hits_survive_a_recompile_by_identity_not_index() {
        let group = |rules: &[&str]| {
            let rules: Vec<String> = (rules.iter())
                .map(|p| format!(r#"{{ direction = "ingress", protocol = "tcp", ports = "{p}" }}"#))
                .collect();
            format!(
                "[[security_group]]\nname = \"g\"\nrules = [{}]",
                rules.join(", ")
            )
        };
        let fw = Firewall::from_config(&config(&group(&["22", "80"]), "")).unwrap();
        for p in 0..3 {
            assert!(fw
                .check(0, Ingress, &syn(OUT, VM, 6000 + p, 80), S)
                .allowed());
        }
        assert!(fw.check(0, Ingress, &syn(OUT, VM, 6100, 22), S).allowed());
        assert_eq!(hits_by_port(&fw), [(22, 1), (80, 3)]);
        // A rule added before both: theirs move down one index and keep their counts.
        let mut rules = RuleSet::compile(&config(&group(&["443", "22", "80"]), ""));
        rules.keep_hits(&fw.rules());
        fw.set_rules(rules);
        assert_eq!(hits_by_port(&fw), [(22, 1), (80, 3), (443, 0)]);
        // The rule on 22 removed: 80's (now index 1) keeps its count.
        let mut rules = RuleSet::compile(&config(&group(&["443", "80"]), ""));
        rules.keep_hits(&fw.rules());
        fw.set_rules(rules);
        assert_eq!(hits_by_port(&fw), [(80, 3), (443, 0)]);
        assert!(fw.check(0, Ingress, &syn(OUT, VM, 6200, 80), S).allowed());
        assert_eq!(hits_by_port(&fw), [(80, 4), (443, 0)]);
        // Without keep_hits a recompile starts again from zero.
        fw.set_rules(RuleSet::compile(&config(&group(&["443", "80"]), "")));
        assert_eq!(hits_by_port(&fw), [(80, 0), (443, 0)]);
    }

    #[test]
    fn remote_group_members_and_address_sets_apply_at_once() {
        let groups = r#"[[security_group]]
name = "g"
rules = [{ direction = "ingress", protocol = "udp", remote_group = "web" }]
[[security_group]]
name = "web"
rules = [{ direction = "egress" }]"#;
        // peer is not in web yet: denied.
        let fw = Firewall::from_config(&config(groups, "")).unwrap();
        assert!(!fw.check(0, Ingress, &udp(PEER, VM, 9, 9), S).allowed());
        // peer joins web: reachable at once.
        fw.set_rules(RuleSet::compile(&config(groups, "\"web\"")));
        assert!(fw.check(0, Ingress, &udp(PEER, VM, 9, 9), S).allowed());
        // A member on another host, by its address set.
        assert!(!fw.check(0, Ingress, &udp(OUT, VM, 9, 9), S).allowed());
        let mut c = config(groups, "\"web\"");
        c.security_groups[1].addresses = vec!["192.0.2.0/28".parse().unwrap()];
        fw.set_rules(RuleSet::compile(&c));
        assert!(fw.check(0, Ingress, &udp(OUT, VM, 9, 9), S).allowed());
        assert_eq!(fw.sessions(0), 2);
        // peer leaves web and the address set empties: both connections end.
        assert_eq!(fw.set_rules(RuleSet::compile(&config(groups, ""))), 2);
        assert!(!fw.check(0, Ingress, &udp(PEER, VM, 9, 9), S).allowed());
    }

    /// `ct stats`, `ct list --limit 10` and a listing by port with 1 M sessions: printed
    /// timings (the issue asks for 50 ms), not asserted (the machine is shared). Run with
    /// `cargo test --release -p qswitch-dp --lib -- --ignored --nocapture million`.
    #[test]
    #[ignore = "fills 1 M sessions (130 MiB); a printed measurement"]
    fn control_calls_with_a_million_sessions() {
        const N: u32 = 1 << 20;
        let config = qswitch_api::config::FirewallConfig {
            max_sessions: Some(N),
            ..Default::default()
        };
        let fw = Firewall::for_switch(Some(&config), 4096);
        // Session `i`'s key (zone `i % 64`).
        let key = |i: u32| CtKey {
            ips: IpPair::V4 {
                src: [10, (i >> 16) as u8, (i >> 8) as u8, i as u8],
                dst: [192, 0, 2, 1],
            },
            proto: 17,
            src: 1000 + (i % 7) as u16,
            dst: 53,
        };
        let t = Instant::now();
        let mut added = 0u32;
        for i in 0..N {
            let zone = i % 64;
            let e = Entry::new(
                zone,
                key(i),
                CtState::Unreplied,
                3600 * S,
                RuleRef::default(),
            );
            added += u32::from(matches!(fw.table().insert(e, S, None), Ok(Some(_))));
        }
        println!("filled {added} sessions in {:?}", t.elapsed());
        let time = |what: &str, f: &mut dyn FnMut() -> usize| {
            let t = Instant::now();
            let n = f();
            println!("{what}: {:?} ({n} results)", t.elapsed());
        };
        time("ct stats", &mut || fw.stats().zones.len());
        time("ct list --limit 10", &mut || fw.list(None, 10, S).len());
        time("ct list --port 63 --limit 10", &mut || {
            fw.list(Some(63), 10, S).len()
        });
        time("ct list --port 4000 (no sessions)", &mut || {
            fw.list(Some(4000), 10, S).len()
        });
        time("ct list --limit 1000", &mut || fw.list(None, 1000, S).len());
        // A worker's lookups while a flush of one port walks the whole table: the
        // longest a lookup waited.
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let worker = s.spawn(|| {
                let mut worst = std::time::Duration::ZERO;
                let (mut n, mut slow) = (0u64, 0u64);
                let mut i = 1u32;
                while !done.load(Ordering::Relaxed) {
                    i = i.wrapping_mul(2_654_435_761) % N;
                    let t = Instant::now();
                    fw.table().with(i % 64, &key(i), S, |_, _, _| ((), false));
                    let d = t.elapsed();
                    worst = worst.max(d);
                    n += 1;
                    slow += u64::from(d > std::time::Duration::from_micros(100));
                }
                (worst, n, slow)
            });
            time("ct flush --port 5", &mut || fw.flush(Some(5), S) as usize);
            done.store(true, Ordering::Relaxed);
            let (worst, n, slow) = worker.join().unwrap();
            println!(
                "lookups during the flush: {n}, {slow} over 100 µs, longest {worst:?} \
                 (on a shared machine the longest is the thread's preemption)"
            );
        });
        assert_eq!(fw.sessions(5), 0);
    }
}
