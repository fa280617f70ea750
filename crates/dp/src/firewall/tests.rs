//! The behaviours Open vSwitch's userspace conntrack system tests check (TCP handshake and
//! teardown states, invalid packets, UDP single direction, ICMP related over IPv4 and IPv6,
//! fragments), written against [`Firewall::check`], plus limits, rules and two threads.

use super::*;
use qswitch_api::config::RuleDirection::{Egress, Ingress};
use qswitch_wire::tcp::FLAG_PSH;

const VM: [u8; 4] = [10, 0, 0, 5];
const PEER: [u8; 4] = [10, 0, 0, 9];
const OUT: [u8; 4] = [192, 0, 2, 1];
const S: u64 = SEC;

fn eth(ethertype: [u8; 2]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    f.extend_from_slice(&ethertype);
    f
}

fn v4_frag(src: [u8; 4], dst: [u8; 4], proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
    let mut f = eth([0x08, 0x00]);
    let total = u16::try_from(20 + l4.len()).unwrap();
    f.extend_from_slice(&[0x45, 0]);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1]);
    f.extend_from_slice(&frag.to_be_bytes());
    f.extend_from_slice(&[64, proto, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(l4);
    f
}

fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    v4_frag(src, dst, proto, 0, l4)
}

fn v6(src: &str, dst: &str, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = eth([0x86, 0xdd]);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&u16::try_from(l4.len()).unwrap().to_be_bytes());
    f.extend_from_slice(&[proto, 64]);
    f.extend_from_slice(&src.parse::<std::net::Ipv6Addr>().unwrap().octets());
    f.extend_from_slice(&dst.parse::<std::net::Ipv6Addr>().unwrap().octets());
    f.extend_from_slice(l4);
    f
}

fn tcp(sport: u16, dport: u16, flags: u8, seq: u32, ack: u32, payload: usize) -> Vec<u8> {
    let mut h = vec![0u8; 20 + payload];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..8].copy_from_slice(&seq.to_be_bytes());
    h[8..12].copy_from_slice(&ack.to_be_bytes());
    h[12] = 5 << 4;
    h[13] = flags;
    h[14..16].copy_from_slice(&1000u16.to_be_bytes());
    h
}

fn udp(sport: u16, dport: u16) -> Vec<u8> {
    let mut h = vec![0u8; 12];
    h[0..2].copy_from_slice(&sport.to_be_bytes());
    h[2..4].copy_from_slice(&dport.to_be_bytes());
    h[4..6].copy_from_slice(&12u16.to_be_bytes());
    h
}

fn icmp(ty: u8, code: u8, rest: &[u8]) -> Vec<u8> {
    let mut h = vec![ty, code, 0, 0];
    h.extend_from_slice(rest);
    h
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
    let mut rules = String::new();
    for i in 0..49 {
        rules.push_str(&format!(
            "{{ direction = \"egress\", protocol = \"tcp\", ports = {} }},\n",
            1000 + i
        ));
    }
    rules.push_str(r#"{ direction = "egress", protocol = "udp", ports = 53 },"#);
    let fw = firewall(&rules, "");
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
