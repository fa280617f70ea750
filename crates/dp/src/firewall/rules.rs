//! Security-group rules compiled for the data path: per port and direction, a flat list of
//! the rules of the port's groups, with `remote_group` resolved to the member ports'
//! addresses. Only a packet that no tracked connection knows is matched against it (a new
//! connection, or a packet of a stateless rule), so its cost is paid once per connection.

use qswitch_api::config::{
    Config, IpPrefix, PortConfig, RuleDirection, RuleEthertype, RuleRemote, SecurityGroupConfig,
};
use qswitch_wire::ct::{CtKey, CtPacket, L4};
use qswitch_wire::flow::IpPair;

use super::conntrack::RuleRef;

/// A rule ready to match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Group and index, for trace and counters.
    pub id: RuleRef,
    /// The group is stateless: a match allows the packet and tracks nothing.
    pub stateless: bool,
    v4: bool,
    v6: bool,
    proto: Option<u8>,
    ports: Vec<(u16, u16)>,
    icmp_type: Option<u8>,
    icmp_code: Option<u8>,
    /// `None`: any address; `Some`: one of these (an empty list matches nothing: a
    /// `remote_group` with no addresses).
    remote: Option<Vec<IpPrefix>>,
    /// New connections and stateless frames this rule allowed on this port (kept across
    /// recompiles for the same rule: [`RuleSet::keep_hits`]).
    pub hits: Hits,
    /// The rule's identity across recompiles: a hash of its group's name, the rule as
    /// configured, and how many identical rules come before it in the group. Its index
    /// may change (a rule before it removed); this does not.
    pub key: u64,
}

/// A rule's hit counter: relaxed, counted once per new connection or stateless frame;
/// clones share it, and it plays no part in comparing rules.
#[derive(Debug, Clone, Default)]
pub struct Hits(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Hits {
    /// One more hit.
    #[inline]
    pub fn hit(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Hits so far.
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl PartialEq for Hits {
    fn eq(&self, _: &Hits) -> bool {
        true
    }
}

impl Eq for Hits {}

impl Rule {
    /// Whether the rule allows `p`, where `remote` is the address at the other end (the
    /// source for ingress, the destination for egress).
    #[inline]
    pub fn matches(&self, p: &CtPacket) -> bool {
        let v6 = p.key.is_ipv6();
        if !(if v6 { self.v6 } else { self.v4 }) {
            return false;
        }
        if self.proto.is_some_and(|n| n != p.key.proto) {
            return false;
        }
        if !self.ports.is_empty()
            && !self
                .ports
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&p.key.dst))
        {
            return false;
        }
        if let Some(t) = self.icmp_type {
            let (ty, code) = match p.l4 {
                L4::Echo { request, .. } => match (v6, request) {
                    (false, true) => (8, 0),
                    (false, false) => (0, 0),
                    (true, true) => (128, 0),
                    (true, false) => (129, 0),
                },
                L4::IcmpError { ty, code, .. } | L4::IcmpOther { ty, code } => (ty, code),
                _ => return false,
            };
            if ty != t || self.icmp_code.is_some_and(|c| c != code) {
                return false;
            }
        }
        true
    }

    fn remote_matches(&self, remote: std::net::IpAddr) -> bool {
        match &self.remote {
            None => true,
            Some(prefixes) => prefixes.iter().any(|p| p.contains(remote)),
        }
    }
}

/// The rules that filter one port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortRules {
    /// Toward the port's VM.
    pub ingress: Vec<Rule>,
    /// From the port's VM.
    pub egress: Vec<Rule>,
    /// The port's `max_sessions`.
    pub max_sessions: Option<u32>,
    /// The rules of each direction by address family and protocol ([`PortRules::reindex`]).
    index: RuleIndex,
}

/// Per direction, for each address family and each protocol that has ports or types to
/// match (TCP, UDP, ICMP, ICMPv6, SCTP), the positions of the rules that can match such a
/// packet (their family, and their protocol that one or any), in order: a new connection
/// walks only those, so 49 TCP rules before the UDP rule that matches cost a UDP packet
/// nothing. Those with destination ports are kept by port ([`Candidates`]), so 25 UDP rules
/// for other ports cost a binary search. Packets of other protocols walk the whole list.
/// Derived from the rules, so it plays no part in comparing them.
#[derive(Debug, Clone, Default)]
struct RuleIndex {
    /// The lengths of `ingress` and `egress` when it was built: a list changed since (and
    /// not reindexed) is walked whole.
    built: [usize; 2],
    /// `[direction][family * PROTOS.len() + protocol]`.
    lists: [[Candidates; 2 * PROTOS.len()]; 2],
}

/// The rules that can match packets of one family and protocol, by how their destination
/// ports are given: the first that allows a packet is the first, in rule order, of the
/// first allowing rule of each part.
#[derive(Debug, Clone, Default)]
struct Candidates {
    /// Rules without ports, in order.
    open: Vec<u16>,
    /// Each port of rules whose ports are at most [`EXPANDED`] in all, with the rule:
    /// sorted by port, then rule.
    ported: Vec<(u16, u16)>,
    /// Rules with more ports than that, in order.
    wide: Vec<u16>,
}

/// The most destination ports a rule may have to be kept port by port ([`Candidates`]).
const EXPANDED: usize = 256;

/// The protocols [`RuleIndex`] keeps lists for.
const PROTOS: [u8; 5] = [6, 17, 1, 58, qswitch_wire::ct::PROTO_SCTP];

impl PartialEq for RuleIndex {
    fn eq(&self, _: &RuleIndex) -> bool {
        true
    }
}

impl Eq for RuleIndex {}

impl RuleIndex {
    fn slot(p: &CtPacket) -> Option<usize> {
        let proto = PROTOS.iter().position(|&n| n == p.key.proto)?;
        Some(usize::from(p.key.is_ipv6()) * PROTOS.len() + proto)
    }

    fn build(ingress: &[Rule], egress: &[Rule]) -> RuleIndex {
        let mut index = RuleIndex {
            built: [ingress.len(), egress.len()],
            ..RuleIndex::default()
        };
        for (d, rules) in [ingress, egress].into_iter().enumerate() {
            for (i, r) in rules.iter().enumerate() {
                let Ok(i) = u16::try_from(i) else { break };
                let ports: usize = r
                    .ports
                    .iter()
                    .map(|&(lo, hi)| usize::from(hi.saturating_sub(lo)) + 1)
                    .sum();
                for (family, on) in [r.v4, r.v6].into_iter().enumerate() {
                    for (k, &proto) in PROTOS.iter().enumerate() {
                        if on && r.proto.is_none_or(|n| n == proto) {
                            let c = &mut index.lists[d][family * PROTOS.len() + k];
                            if r.ports.is_empty() {
                                c.open.push(i);
                            } else if ports <= EXPANDED {
                                for &(lo, hi) in &r.ports {
                                    c.ported.extend((lo..=hi).map(|port| (port, i)));
                                }
                            } else {
                                c.wide.push(i);
                            }
                        }
                    }
                }
            }
        }
        for c in index.lists.iter_mut().flatten() {
            c.ported.sort_unstable();
            c.ported.dedup();
        }
        index
    }
}

impl PortRules {
    /// Rebuilds the index of the rules by family and protocol; call it after changing
    /// `ingress` or `egress` ([`RuleSet::compile_ports`] does). Until then a list whose
    /// length changed is walked whole.
    pub fn reindex(&mut self) {
        self.index = RuleIndex::build(&self.ingress, &self.egress);
    }

    /// The first rule of `direction` that allows `p`.
    #[inline]
    pub fn first_match(&self, direction: RuleDirection, p: &CtPacket) -> Option<&Rule> {
        let (rules, remote, d) = match direction {
            RuleDirection::Ingress => (&self.ingress, src(&p.key), 0),
            RuleDirection::Egress => (&self.egress, dst(&p.key), 1),
        };
        let allows = |r: &&Rule| r.matches(p) && r.remote_matches(remote);
        match RuleIndex::slot(p) {
            Some(k) if self.index.built[d] == rules.len() => {
                let c = &self.index.lists[d][k];
                let allowed = |i: u16| rules.get(usize::from(i)).filter(allows).is_some();
                let mut first = c.open.iter().copied().find(|&i| allowed(i));
                let dst = p.key.dst;
                let at = c.ported.partition_point(|&(port, _)| port < dst);
                for &(port, i) in &c.ported[at..] {
                    if port != dst || first.is_some_and(|f| i > f) {
                        break;
                    }
                    if allowed(i) {
                        first = Some(i);
                        break;
                    }
                }
                for &i in &c.wide {
                    if first.is_some_and(|f| i > f) {
                        break;
                    }
                    if allowed(i) {
                        first = Some(i);
                        break;
                    }
                }
                first.and_then(|i| rules.get(usize::from(i)))
            }
            _ => rules.iter().find(allows),
        }
    }
}

fn src(k: &CtKey) -> std::net::IpAddr {
    match k.ips {
        IpPair::V4 { src, .. } => src.into(),
        IpPair::V6 { src, .. } => src.into(),
    }
}

fn dst(k: &CtKey) -> std::net::IpAddr {
    match k.ips {
        IpPair::V4 { dst, .. } => dst.into(),
        IpPair::V6 { dst, .. } => dst.into(),
    }
}

/// Every filtered port's rules, indexed like the config's ports (the zone of a port is its
/// index), and the group names for showing a [`RuleRef`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    /// `None`: the port is not filtered.
    pub ports: Vec<Option<PortRules>>,
    /// Group names, by [`RuleRef::group`].
    pub groups: Vec<String>,
}

impl RuleSet {
    /// Compiles the config's groups for its ports. The config has been validated (groups
    /// named by ports and rules exist).
    pub fn compile(config: &Config) -> RuleSet {
        let ports: Vec<Option<&PortConfig>> = config.ports.iter().map(Some).collect();
        RuleSet::compile_ports(&config.security_groups, &ports)
    }

    /// Compiles `groups` for `ports`, indexed by zone (`None`: no port in that zone). A
    /// group a port names that is not in `groups` gives it no rules (it denies).
    pub fn compile_ports(groups: &[SecurityGroupConfig], ports: &[Option<&PortConfig>]) -> RuleSet {
        let names: Vec<String> = groups.iter().map(|g| g.name.clone()).collect();
        let find = |name: &str| groups.iter().position(|g| g.name == name);
        // The addresses of the members of a group: the `security.ips` of its ports.
        // ... and the addresses set for its members on other hosts.
        let members = |name: &str| -> Vec<IpPrefix> {
            ports
                .iter()
                .flatten()
                .filter(|p| p.security_groups.iter().any(|g| g == name))
                .filter_map(|p| p.security.as_ref())
                .flat_map(|s| s.ips.iter().copied())
                .chain(
                    groups
                        .iter()
                        .filter(|g| g.name == name)
                        .flat_map(|g| g.addresses.iter().copied()),
                )
                .collect()
        };
        let ports = ports
            .iter()
            .map(|p| {
                let p = (*p)?;
                if p.security_groups.is_empty() {
                    return None;
                }
                let mut rules = PortRules {
                    max_sessions: p.max_sessions,
                    ..PortRules::default()
                };
                for name in &p.security_groups {
                    let Some(gi) = find(name) else { continue };
                    compile_group(gi, &groups[gi], &members, &mut rules);
                }
                rules.reindex();
                Some(rules)
            })
            .collect();
        RuleSet {
            ports,
            groups: names,
        }
    }

    /// `group/index` of a rule, as trace shows it.
    pub fn name(&self, r: RuleRef) -> String {
        let g = self
            .groups
            .get(usize::from(r.group))
            .map_or("?", String::as_str);
        format!("{g}/{}", r.index)
    }
}

fn compile_group(
    gi: usize,
    g: &SecurityGroupConfig,
    members: &dyn Fn(&str) -> Vec<IpPrefix>,
    out: &mut PortRules,
) {
    let mut seen = std::collections::HashMap::new();
    for (i, r) in g.rules.iter().enumerate() {
        let key = {
            use std::hash::{Hash, Hasher};
            let text = format!("{r:?}");
            let before = seen.entry(text.clone()).or_insert(0usize);
            let mut h = std::hash::DefaultHasher::new();
            (&g.name, &text, *before).hash(&mut h);
            *before += 1;
            h.finish()
        };
        let rule = Rule {
            id: RuleRef {
                group: u16::try_from(gi).unwrap_or(u16::MAX),
                index: u16::try_from(i).unwrap_or(u16::MAX),
            },
            stateless: g.stateless,
            v4: r.ethertype != Some(RuleEthertype::Ipv6),
            v6: r.ethertype != Some(RuleEthertype::Ipv4),
            proto: r.protocol.number(),
            ports: r.ports.as_ref().map(|p| p.0.clone()).unwrap_or_default(),
            icmp_type: r.icmp_type,
            icmp_code: r.icmp_code,
            remote: match &r.remote {
                None => None,
                Some(RuleRemote::Prefix(p)) => Some(vec![*p]),
                Some(RuleRemote::Group(name)) => Some(members(name)),
            },
            hits: Hits::default(),
            key,
        };
        match r.direction {
            RuleDirection::Ingress => out.ingress.push(rule),
            RuleDirection::Egress => out.egress.push(rule),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_wire::ct::{Fragment, TcpInfo};

    fn packet(v6: bool, proto: u8, dst: u16) -> CtPacket {
        let ips = if v6 {
            IpPair::V6 {
                src: [0xfd; 16],
                dst: [0xfe; 16],
            }
        } else {
            IpPair::V4 {
                src: [10, 0, 0, 1],
                dst: [10, 0, 0, 2],
            }
        };
        let l4 = match proto {
            6 => L4::Tcp(TcpInfo {
                flags: 0x02,
                seq: 1,
                ack: 0,
                window: 100,
                payload_len: 0,
                wscale: None,
            }),
            17 => L4::Udp,
            1 | 58 => L4::Echo {
                id: dst,
                request: true,
            },
            _ => L4::Other,
        };
        CtPacket {
            key: CtKey {
                ips,
                proto,
                src: 4000,
                dst,
            },
            l4,
            fragment: Fragment::No,
            vlan: None,
        }
    }

    #[test]
    fn the_index_finds_what_the_walk_finds() {
        let c = Config::from_toml(
            r#"
[[security_group]]
name = "g"
rules = [
  { direction = "ingress", protocol = "tcp", ports = "22" },
  { direction = "ingress", ethertype = "ipv6", protocol = "udp", ports = "53" },
  { direction = "ingress", protocol = 47 },
  { direction = "ingress", protocol = "icmp", icmp_type = 8 },
  { direction = "ingress", ethertype = "ipv4", ports = "80", protocol = "tcp" },
  { direction = "ingress", ethertype = "ipv4", protocol = "udp" },
  { direction = "ingress", protocol = "icmpv6" },
  { direction = "ingress", ethertype = "ipv6" },
  { direction = "egress", protocol = "sctp", ports = "9" },
  { direction = "egress", remote = "10.0.0.0/8" },
  { direction = "ingress", protocol = "tcp", ports = "20-30", remote = "192.0.2.0/24" },
  { direction = "ingress", protocol = "tcp", ports = "1-1000" },
  { direction = "ingress", protocol = "udp", ports = "53,80,8-9" },
  { direction = "ingress", protocol = "udp", ports = "53,1-60000" },
  { direction = "egress", protocol = "tcp", ports = "22,22,80" },
  { direction = "egress", protocol = "udp", ports = "8", remote = "10.0.0.2/32" },
]
[[port]]
name = "vm"
type = "gen"
security_groups = ["g"]
"#,
        )
        .unwrap();
        let set = RuleSet::compile(&c);
        let indexed = set.ports[0].clone().unwrap();
        let mut walked = indexed.clone();
        walked.index = RuleIndex::default();
        for v6 in [false, true] {
            for proto in [6, 17, 1, 58, 132, 47, 99] {
                for dst in [9, 22, 53, 80, 8, 25, 999, 1000, 1001, 0, 65535] {
                    let p = packet(v6, proto, dst);
                    for d in [RuleDirection::Ingress, RuleDirection::Egress] {
                        let a = indexed.first_match(d, &p).map(|r| r.id);
                        let b = walked.first_match(d, &p).map(|r| r.id);
                        assert_eq!(a, b, "v6 {v6} proto {proto} port {dst} {d:?}");
                    }
                }
            }
        }
        // A list changed and not reindexed is walked whole.
        let mut changed = indexed.clone();
        changed.ingress.remove(0);
        let p = packet(false, 6, 80);
        assert_eq!(
            changed
                .first_match(RuleDirection::Ingress, &p)
                .map(|r| r.id.index),
            Some(4)
        );
    }
}
