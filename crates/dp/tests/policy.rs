//! Per-port policy on the manual engine: VLAN trunks (tag push/pop, native VLAN, VIDs not
//! carried), storm control on the manual clock, port security; and `trace` against the
//! engine for each of them (`trace_then_switch`). No test sleeps.

mod common;

use common::{frame, Sim, BCAST, MAC_A, MAC_B, MAC_C};
use qswitch_dp::policy::{IpPrefix, PortPolicy, Security, Storm};
use qswitch_dp::port::inject::InjectPort;
use qswitch_wire::MacAddr;

const MAC_D: [u8; 6] = [2, 0, 0, 0, 0, 0xd];

/// `f` with an 802.1Q tag (PCP `pcp`, VID `vid`) after the MAC addresses.
fn tag(f: &[u8], pcp: u8, vid: u16) -> Vec<u8> {
    let tci = (u16::from(pcp) << 13) | vid;
    let mut t = f[..12].to_vec();
    t.extend_from_slice(&0x8100u16.to_be_bytes());
    t.extend_from_slice(&tci.to_be_bytes());
    t.extend_from_slice(&f[12..]);
    t
}

fn trunk(vlans: &str) -> PortPolicy {
    PortPolicy {
        vlans: vlans.parse().unwrap(),
        ..PortPolicy::default()
    }
}

fn drops(sim: &Sim, port: &str, reason: &str) -> u64 {
    let st = sim.sw.stats();
    let p = st.ports.iter().find(|p| p.name == port).unwrap();
    p.drops.get(reason).copied().unwrap_or(0)
}

/// Every port's captured frames, cleared.
fn take(ports: &[&InjectPort]) -> Vec<Vec<Vec<u8>>> {
    ports.iter().map(|p| p.take_captured()).collect()
}

#[test]
fn access_to_trunk_pushes_and_trunk_to_access_pops() {
    let mut sim = Sim::new(1);
    let a10 = sim.sw.add_inject_port("a10", Some(10)).unwrap();
    let a20 = sim.sw.add_inject_port("a20", Some(20)).unwrap();
    let t = sim.sw.add_inject_port("t", None).unwrap();
    sim.sw.set_port_policy("t", trunk("10,20")).unwrap();

    let f = frame(BCAST, MAC_A, 60);
    sim.send(&a10, std::slice::from_ref(&f));
    let [to10, to20, to_t] = take(&[&a10, &a20, &t]).try_into().unwrap();
    assert!(to10.is_empty() && to20.is_empty());
    assert_eq!(to_t, vec![tag(&f, 0, 10)], "tagged 10 on the trunk");

    // Back from the trunk, tagged 10 with a priority: only the VLAN 10 port, untagged.
    let reply = frame(MAC_A, MAC_B, 60);
    sim.send(&t, &[tag(&reply, 5, 10)]);
    let [to10, to20, to_t] = take(&[&a10, &a20, &t]).try_into().unwrap();
    assert_eq!(to10, vec![reply.clone()]);
    assert!(to20.is_empty() && to_t.is_empty());

    // And the learned station behind the trunk gets unicast, tagged.
    let u = frame(MAC_B, MAC_A, 100);
    sim.send(&a10, std::slice::from_ref(&u));
    assert_eq!(t.take_captured(), vec![tag(&u, 0, 10)]);
    // The same MAC in VLAN 20 is unknown there: flooded to the trunk tagged 20 only.
    let u20 = frame(MAC_B, MAC_C, 100);
    sim.send(&a20, std::slice::from_ref(&u20));
    assert_eq!(t.take_captured(), vec![tag(&u20, 0, 20)]);
    assert!(a10.take_captured().is_empty());
}

#[test]
fn trunk_to_trunk_keeps_the_tag_and_its_priority() {
    let mut sim = Sim::new(1);
    let t1 = sim.sw.add_inject_port("t1", None).unwrap();
    let t2 = sim.sw.add_inject_port("t2", None).unwrap();
    let t3 = sim.sw.add_inject_port("t3", None).unwrap();
    sim.sw.set_port_policy("t1", trunk("10,30")).unwrap();
    sim.sw.set_port_policy("t2", trunk("10")).unwrap();
    sim.sw.set_port_policy("t3", trunk("30")).unwrap();
    let f = tag(&frame(BCAST, MAC_A, 60), 3, 10);
    sim.send(&t1, std::slice::from_ref(&f));
    let [o1, o2, o3] = take(&[&t1, &t2, &t3]).try_into().unwrap();
    assert!(o1.is_empty() && o3.is_empty());
    assert_eq!(o2, vec![f]);
}

#[test]
fn native_vlan_is_untagged_and_a_pure_trunk_drops_untagged() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", Some(10)).unwrap();
    let n = sim.sw.add_inject_port("n", Some(10)).unwrap();
    let p = sim.sw.add_inject_port("p", None).unwrap();
    // n: native 10, carries 20 tagged; p: carries 10 and 20 tagged, no native VLAN.
    sim.sw.set_port_policy("n", trunk("20")).unwrap();
    sim.sw.set_port_policy("p", trunk("10,20")).unwrap();
    let f = frame(BCAST, MAC_A, 60);
    sim.send(&a, std::slice::from_ref(&f));
    let [_, on_n, on_p] = take(&[&a, &n, &p]).try_into().unwrap();
    assert_eq!(on_n, vec![f.clone()], "native VLAN: untagged");
    assert_eq!(on_p, vec![tag(&f, 0, 10)]);

    // Untagged from n is VLAN 10; tagged 20 from n reaches only p.
    let g = frame(BCAST, MAC_B, 60);
    sim.send(&n, &[g.clone(), tag(&g, 0, 20)]);
    let [on_a, _, on_p] = take(&[&a, &n, &p]).try_into().unwrap();
    assert_eq!(on_a, vec![g.clone()]);
    assert_eq!(on_p, vec![tag(&g, 0, 10), tag(&g, 0, 20)]);

    // Untagged on the pure trunk: dropped and counted.
    sim.send(&p, &[frame(BCAST, MAC_C, 60)]);
    assert!(take(&[&a, &n, &p]).iter().all(Vec::is_empty));
    assert_eq!(drops(&sim, "p", "vlan_not_allowed"), 1);
}

#[test]
fn a_vid_not_carried_is_dropped_and_counted() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", Some(30)).unwrap();
    let t = sim.sw.add_inject_port("t", None).unwrap();
    let t2 = sim.sw.add_inject_port("t2", None).unwrap();
    sim.sw.set_port_policy("t", trunk("10,20,100-200")).unwrap();
    sim.sw.set_port_policy("t2", trunk("30")).unwrap();
    let f = frame(BCAST, MAC_A, 60);
    sim.send(&t, &[tag(&f, 0, 30), tag(&f, 0, 99), tag(&f, 0, 201)]);
    assert!(take(&[&a, &t, &t2]).iter().all(Vec::is_empty));
    assert_eq!(drops(&sim, "t", "vlan_not_allowed"), 3);
    // Tagged frames on an access port keep their old reason.
    sim.send(&a, &[tag(&f, 0, 30)]);
    assert_eq!(drops(&sim, "a", "vlan_tagged"), 1);
    // A tagged VID in the range is switched (to nobody else: no destination).
    sim.send(&t, &[tag(&f, 0, 150)]);
    assert_eq!(drops(&sim, "t", "no_destination"), 1);
}

#[test]
fn a_flood_gives_each_port_its_encoding() {
    let mut sim = Sim::new(1);
    let src = sim.sw.add_inject_port("src", None).unwrap();
    let acc = sim.sw.add_inject_port("acc", Some(10)).unwrap();
    let other = sim.sw.add_inject_port("other", Some(20)).unwrap();
    let t1 = sim.sw.add_inject_port("t1", None).unwrap();
    let nat = sim.sw.add_inject_port("nat", Some(10)).unwrap();
    let acc2 = sim.sw.add_inject_port("acc2", Some(10)).unwrap();
    let t2 = sim.sw.add_inject_port("t2", Some(20)).unwrap();
    sim.sw.set_port_policy("src", trunk("10,20")).unwrap();
    sim.sw.set_port_policy("t1", trunk("10")).unwrap();
    sim.sw.set_port_policy("nat", trunk("20")).unwrap();
    sim.sw.set_port_policy("t2", trunk("10")).unwrap();
    // A burst mixing VLANs and priorities, from the trunk.
    let f1 = frame(BCAST, MAC_A, 60);
    let f2 = frame([0x33, 0x33, 0, 0, 0, 1], MAC_B, 80);
    let f3 = frame(MAC_D, MAC_C, 90);
    sim.send(&src, &[tag(&f1, 1, 10), tag(&f2, 2, 20), tag(&f3, 7, 10)]);
    let got = take(&[&src, &acc, &other, &t1, &nat, &acc2, &t2]);
    assert!(got[0].is_empty(), "never back to the ingress");
    assert_eq!(
        got[1],
        vec![f1.clone(), f3.clone()],
        "acc: VLAN 10 untagged"
    );
    assert_eq!(got[2], vec![f2.clone()], "other: VLAN 20 untagged");
    assert_eq!(
        got[3],
        vec![tag(&f1, 1, 10), tag(&f3, 7, 10)],
        "t1: 10 tagged"
    );
    assert_eq!(
        got[4],
        vec![f1.clone(), tag(&f2, 2, 20), f3.clone()],
        "nat: native 10 untagged, 20 tagged"
    );
    assert_eq!(got[5], vec![f1.clone(), f3.clone()]);
    assert_eq!(
        got[6],
        vec![tag(&f1, 1, 10), f2.clone(), tag(&f3, 7, 10)],
        "t2: native 20 untagged, 10 tagged"
    );
}

#[test]
fn a_policy_change_is_live_and_back_to_plain() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", Some(10)).unwrap();
    let t = sim.sw.add_inject_port("t", None).unwrap();
    let f = frame(BCAST, MAC_A, 60);
    sim.send(&a, std::slice::from_ref(&f));
    assert!(t.take_captured().is_empty(), "t is in the untagged domain");
    sim.sw.set_port_policy("t", trunk("10")).unwrap();
    assert_eq!(sim.sw.port_policy("t").unwrap().vlans.to_string(), "10");
    sim.send(&a, std::slice::from_ref(&f));
    assert_eq!(t.take_captured(), vec![tag(&f, 0, 10)]);
    sim.sw.set_port_policy("t", PortPolicy::default()).unwrap();
    sim.send(&a, std::slice::from_ref(&f));
    assert!(t.take_captured().is_empty());
    assert!(sim.sw.set_port_policy("nope", trunk("10")).is_err());
}

#[test]
fn storm_control_limits_each_class_on_the_switch_clock() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let storm = Storm {
        broadcast: Some(320),
        multicast: Some(640),
        unknown_unicast: Some(320),
    };
    sim.sw
        .set_port_policy(
            "a",
            PortPolicy {
                storm,
                ..PortPolicy::default()
            },
        )
        .unwrap();
    // b is known: unicast to it is never limited.
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    // Depth: max(pps / 10, 32) = 32 broadcast, 64 multicast, 32 unknown unicast.
    let mut burst = Vec::new();
    for _ in 0..50 {
        burst.push(frame(BCAST, MAC_A, 60));
        burst.push(frame([0x01, 0, 0x5e, 0, 0, 1], MAC_A, 60));
        burst.push(frame(MAC_D, MAC_A, 60));
        burst.push(frame(MAC_B, MAC_A, 60));
    }
    for f in &burst {
        a.inject(f);
    }
    // All on one clock instant: no refill.
    while a.pending() > 0 {
        sim.sw.poll_once(sim.now);
    }
    assert_eq!(b.take_captured().len(), 32 + 50 + 32 + 50);
    assert_eq!(drops(&sim, "a", "storm_broadcast"), 18);
    assert_eq!(drops(&sim, "a", "storm_multicast"), 0);
    assert_eq!(drops(&sim, "a", "storm_unknown_unicast"), 18);
    // 100 ms later: 32 more broadcasts pass (320/s), the rest is dropped.
    sim.now += 100_000_000;
    for _ in 0..40 {
        a.inject(&frame(BCAST, MAC_A, 60));
    }
    while a.pending() > 0 {
        sim.sw.poll_once(sim.now);
    }
    assert_eq!(b.take_captured().len(), 32);
    assert_eq!(drops(&sim, "a", "storm_broadcast"), 18 + 8);
}

fn secure(sec: Security) -> PortPolicy {
    PortPolicy {
        security: sec,
        ..PortPolicy::default()
    }
}

/// An Ethernet frame carrying `ethertype` and `payload`.
fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn arp(sender_mac: [u8; 6], sender_ip: [u8; 4], target_ip: [u8; 4]) -> Vec<u8> {
    let mut p = vec![0, 1, 8, 0, 6, 4, 0, 1];
    p.extend_from_slice(&sender_mac);
    p.extend_from_slice(&sender_ip);
    p.extend_from_slice(&[0; 6]);
    p.extend_from_slice(&target_ip);
    eth(BCAST, sender_mac, 0x0806, &p)
}

fn udp4(src_mac: [u8; 6], src: [u8; 4], sport: u16, dport: u16, first: u8) -> Vec<u8> {
    // 20 + 8 + 1 bytes: an IPv4 header, a UDP header and one byte of payload.
    let mut ip = vec![0x45, 0, 0, 29, 0, 0, 0, 0, 64, 17, 0, 0];
    ip.extend_from_slice(&src);
    ip.extend_from_slice(&[255, 255, 255, 255]);
    ip.extend_from_slice(&sport.to_be_bytes());
    ip.extend_from_slice(&dport.to_be_bytes());
    ip.extend_from_slice(&[0, 9, 0, 0, first]);
    eth(BCAST, src_mac, 0x0800, &ip)
}

fn icmp6(src_mac: [u8; 6], src: &str, msg: &[u8]) -> Vec<u8> {
    let src: std::net::Ipv6Addr = src.parse().unwrap();
    let mut ip = vec![0x60, 0, 0, 0];
    ip.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    ip.extend_from_slice(&[58, 255]);
    ip.extend_from_slice(&src.octets());
    ip.extend_from_slice(&[0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    ip.extend_from_slice(msg);
    eth([0x33, 0x33, 0, 0, 0, 1], src_mac, 0x86dd, &ip)
}

/// A neighbour advertisement for `target` with a target link-layer address option.
fn na(target: &str, ll: [u8; 6]) -> Vec<u8> {
    let t: std::net::Ipv6Addr = target.parse().unwrap();
    let mut m = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
    m.extend_from_slice(&t.octets());
    m.extend_from_slice(&[2, 1]);
    m.extend_from_slice(&ll);
    m
}

#[test]
fn f5_a_spoofed_source_mac_is_dropped_and_cannot_steal_the_address() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let c = sim.sw.add_inject_port("c", None).unwrap();
    sim.sw
        .set_port_policy(
            "a",
            secure(Security {
                macs: vec![MacAddr(MAC_A)],
                ..Security::default()
            }),
        )
        .unwrap();
    sim.send(&b, &[frame(BCAST, MAC_B, 60)]);
    take(&[&a, &b, &c]);
    // a claims b's address.
    sim.send(&a, &[frame(MAC_C, MAC_B, 60)]);
    assert_eq!(drops(&sim, "a", "src_mac_not_allowed"), 1);
    assert!(take(&[&a, &b, &c]).iter().all(Vec::is_empty));
    // c → b still reaches b, and only b.
    sim.send(&c, &[frame(MAC_B, MAC_C, 60)]);
    let [on_a, on_b, _] = take(&[&a, &b, &c]).try_into().unwrap();
    assert!(on_a.is_empty());
    assert_eq!(on_b.len(), 1);
    // Its own address passes; an ARP with someone else's sender MAC does not.
    sim.send(
        &a,
        &[
            frame(BCAST, MAC_A, 60),
            arp(MAC_B, [10, 0, 0, 2], [10, 0, 0, 9]),
        ],
    );
    assert_eq!(b.take_captured().len(), 1);
    assert_eq!(drops(&sim, "a", "src_mac_not_allowed"), 2);
}

#[test]
fn ip_anti_spoofing_checks_ip_arp_and_nd() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let ips: Vec<IpPrefix> = ["10.0.0.5", "2001:db8::/64", "fe80::/64"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    sim.sw
        .set_port_policy(
            "a",
            secure(Security {
                ips,
                ..Security::default()
            }),
        )
        .unwrap();
    let ok = vec![
        udp4(MAC_A, [10, 0, 0, 5], 1000, 2000, 0),
        udp4(MAC_A, [0, 0, 0, 0], 68, 67, 1),
        arp(MAC_A, [10, 0, 0, 5], [10, 0, 0, 1]),
        arp(MAC_A, [0, 0, 0, 0], [10, 0, 0, 5]),
        icmp6(MAC_A, "2001:db8::7", &na("2001:db8::7", MAC_A)),
        icmp6(MAC_A, "fe80::1", &[128, 0, 0, 0, 0, 0, 0, 0]),
        frame(BCAST, MAC_A, 60),
    ];
    let bad = vec![
        udp4(MAC_A, [10, 0, 0, 6], 1000, 2000, 0),
        arp(MAC_A, [10, 0, 0, 1], [10, 0, 0, 9]),
        icmp6(MAC_A, "2001:db9::7", &[128, 0, 0, 0, 0, 0, 0, 0]),
        icmp6(MAC_A, "fe80::1", &na("2001:db9::1", MAC_A)),
    ];
    sim.send(&a, &ok);
    assert_eq!(b.take_captured(), ok);
    sim.send(&a, &bad);
    assert!(b.take_captured().is_empty());
    assert_eq!(drops(&sim, "a", "src_ip_not_allowed"), bad.len() as u64);
}

#[test]
fn dhcp_and_ra_guards() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let server = udp4(MAC_A, [10, 0, 0, 1], 67, 68, 2);
    let client = udp4(MAC_A, [0, 0, 0, 0], 68, 67, 1);
    let ra = icmp6(
        MAC_A,
        "fe80::1",
        &[134, 0, 0, 0, 64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
    );
    let redirect = icmp6(MAC_A, "fe80::1", &[137, 0, 0, 0, 0, 0, 0, 0]);
    let ping = icmp6(MAC_A, "fe80::1", &[128, 0, 0, 0, 0, 0, 0, 0]);
    let all = vec![
        server.clone(),
        client.clone(),
        ra.clone(),
        redirect.clone(),
        ping.clone(),
    ];
    // Without guards everything passes.
    sim.send(&a, &all);
    assert_eq!(b.take_captured().len(), all.len());
    sim.sw
        .set_port_policy(
            "a",
            secure(Security {
                dhcp_guard: true,
                ra_guard: true,
                ..Security::default()
            }),
        )
        .unwrap();
    sim.send(&a, &all);
    assert_eq!(b.take_captured(), vec![client, ping]);
    assert_eq!(drops(&sim, "a", "dhcp_guard"), 1);
    assert_eq!(drops(&sim, "a", "ra_guard"), 2);
}

#[test]
fn mac_limit_is_the_fdb_limit() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let _b = sim.sw.add_inject_port("b", None).unwrap();
    sim.sw
        .set_port_policy(
            "a",
            secure(Security {
                mac_limit: Some(2),
                ..Security::default()
            }),
        )
        .unwrap();
    let frames: Vec<Vec<u8>> = (1..=5u8)
        .map(|i| frame(BCAST, [2, 0, 0, 0, 1, i], 60))
        .collect();
    sim.send(&a, &frames);
    let learned = sim.sw.fdb().iter().filter(|e| e.port == "a").count();
    assert_eq!(learned, 2);
}

#[test]
fn config_keys_reach_the_port() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", Some(10)).unwrap();
    let text = r#"
[[port]]
name = "g"
type = "gen"
vlans = "10"
security = { macs = ["02:00:00:00:00:0b"], mac_limit = 7, ra_guard = true }
storm = { broadcast = 100 }
"#;
    let cfg = qswitch_api::Config::from_toml(text).unwrap();
    sim.sw.add_port(&cfg.ports[0]).unwrap();
    let pol = sim.sw.port_policy("g").unwrap();
    assert_eq!(pol.vlans.to_string(), "10");
    assert_eq!(pol.security.macs, vec![MacAddr(MAC_B)]);
    assert_eq!(pol.security.mac_limit, Some(7));
    assert!(pol.security.ra_guard && !pol.security.dhcp_guard);
    assert_eq!(pol.storm.broadcast, Some(100));
    // The gen sink is a trunk carrying 10: a's 60-byte broadcast reaches it tagged (64 bytes).
    sim.send(&a, &[frame(BCAST, MAC_A, 60)]);
    let st = sim.sw.stats();
    let g = st.ports.iter().find(|p| p.name == "g").unwrap();
    assert_eq!((g.tx_packets, g.tx_bytes), (1, 64));
}

// ---- trace against the engine ----------------------------------------------------------

/// Every port's drop counters, by port and reason.
fn all_drops(sim: &Sim) -> std::collections::BTreeMap<(String, String), u64> {
    let mut m = std::collections::BTreeMap::new();
    for p in sim.sw.stats().ports {
        for (r, n) in p.drops {
            m.insert((p.name.clone(), r), n);
        }
    }
    m
}

/// Traces `f` arriving on port `ingress`, then has the engine switch it at the same clock
/// instant, and checks that they agree: the same outputs with the same encoding (untagged,
/// or tagged with the traced VID), or no output and the traced drop counter (and only it)
/// moved by one. Returns the trace.
fn trace_then_switch(
    sim: &mut Sim,
    ports: &[(&str, &InjectPort)],
    ingress: &str,
    f: &[u8],
) -> qswitch_api::request::TraceReport {
    // The trace reads the switch clock as the last poll set it.
    sim.sw.poll_once(sim.now);
    let t = sim.sw.trace(ingress, f).unwrap();
    assert_eq!(
        sim.sw.trace(ingress, f).unwrap(),
        t,
        "tracing changes nothing"
    );
    let before = all_drops(sim);
    let (_, port) = ports.iter().find(|(n, _)| *n == ingress).unwrap();
    port.inject(f);
    while port.pending() > 0 {
        sim.sw.poll_once(sim.now);
    }
    let mut got: Vec<(String, Option<u16>)> = Vec::new();
    for (name, p) in ports {
        for out in p.take_captured() {
            let vid = (out[12..14] == [0x81, 0x00])
                .then(|| u16::from_be_bytes([out[14], out[15]]) & 0xfff);
            got.push((name.to_string(), vid));
        }
    }
    got.sort();
    let mut traced: Vec<(String, Option<u16>)> = t
        .egress
        .iter()
        .map(|e| (e.port.clone(), e.tagged))
        .collect();
    traced.sort();
    assert_eq!(got, traced, "engine vs trace: {:#?}", t.steps);
    let after = all_drops(sim);
    let moved: Vec<(String, String, u64)> = after
        .iter()
        .filter_map(|(k, &n)| {
            let d = n - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.0.clone(), k.1.clone(), d))
        })
        .collect();
    let want: Vec<(String, String, u64)> = t
        .drop_reason
        .iter()
        .map(|r| (ingress.to_string(), r.clone(), 1))
        .collect();
    assert_eq!(moved, want, "drops vs trace: {:#?}", t.steps);
    assert_eq!(t.verdict == "drop", t.drop_reason.is_some());
    t
}

#[test]
fn trace_follows_trunks_native_vlans_and_tags() {
    let mut sim = Sim::new(1);
    let a10 = sim.sw.add_inject_port("a10", Some(10)).unwrap();
    let a20 = sim.sw.add_inject_port("a20", Some(20)).unwrap();
    // t: carries 10 and 20 tagged, no native VLAN; n: native 10, carries 20 tagged.
    let t = sim.sw.add_inject_port("t", None).unwrap();
    let n = sim.sw.add_inject_port("n", Some(10)).unwrap();
    sim.sw.set_port_policy("t", trunk("10,20")).unwrap();
    sim.sw.set_port_policy("n", trunk("20")).unwrap();
    let ports: [(&str, &InjectPort); 4] = [("a10", &a10), ("a20", &a20), ("t", &t), ("n", &n)];
    let egress = |r: &qswitch_api::request::TraceReport| -> Vec<(String, Option<u16>)> {
        r.egress
            .iter()
            .map(|e| (e.port.clone(), e.tagged))
            .collect()
    };
    let eg = |v: &[(&str, Option<u16>)]| -> Vec<(String, Option<u16>)> {
        v.iter().map(|(p, t)| (p.to_string(), *t)).collect()
    };

    // Tagged 10 on the trunk, flooded: VLAN 10 members, the access port and the native
    // port untagged (the engine's order: ports without tagged VLANs first).
    let r = trace_then_switch(&mut sim, &ports, "t", &tag(&frame(BCAST, MAC_B, 60), 3, 10));
    assert_eq!((r.vlan, r.vlan_source.as_deref()), (10, Some("tagged")));
    assert_eq!(r.verdict, "flood");
    assert_eq!(egress(&r), eg(&[("a10", None), ("n", None)]));
    // Tagged 20 on the trunk, flooded: untagged to the access port, tagged 20 on n.
    let r = trace_then_switch(&mut sim, &ports, "t", &tag(&frame(BCAST, MAC_C, 60), 0, 20));
    assert_eq!(egress(&r), eg(&[("a20", None), ("n", Some(20))]));

    // Unicast both ways across the trunk: untagged from the access port to the station
    // learned behind t in VLAN 10 (leaves tagged 10), and tagged back to the access port.
    let r = trace_then_switch(&mut sim, &ports, "a10", &frame(MAC_B, MAC_A, 60));
    assert_eq!(
        (r.verdict.as_str(), r.vlan_source.as_deref()),
        ("unicast", Some("access"))
    );
    assert_eq!(egress(&r), eg(&[("t", Some(10))]));
    let r = trace_then_switch(&mut sim, &ports, "t", &tag(&frame(MAC_A, MAC_B, 60), 5, 10));
    assert_eq!(r.verdict, "unicast");
    assert_eq!(egress(&r), eg(&[("a10", None)]));
    // MAC_B is known in VLAN 10 only: in VLAN 20 it is unknown, flooded.
    let r = trace_then_switch(&mut sim, &ports, "a20", &frame(MAC_B, MAC_D, 60));
    assert_eq!(r.verdict, "flood");
    assert_eq!(egress(&r), eg(&[("t", Some(20)), ("n", Some(20))]));

    // A VID the trunk does not carry, untagged on the trunk without a native VLAN, a tag
    // on an access port: dropped with the engine's reasons, before any VLAN is assigned.
    for (port, f, why) in [
        (
            "t",
            tag(&frame(BCAST, MAC_B, 60), 0, 30),
            "vlan_not_allowed",
        ),
        ("t", frame(BCAST, MAC_B, 60), "vlan_not_allowed"),
        (
            "n",
            tag(&frame(BCAST, MAC_C, 60), 0, 10),
            "vlan_not_allowed",
        ),
        ("a10", tag(&frame(BCAST, MAC_A, 60), 0, 10), "vlan_tagged"),
    ] {
        let r = trace_then_switch(&mut sim, &ports, port, &f);
        assert_eq!(r.drop_reason.as_deref(), Some(why), "{:#?}", r.steps);
        assert!(r.vlan_source.is_none() && r.learn.is_none());
    }

    // Untagged on the trunk with a native VLAN: VLAN 10, tagged 10 on the pure trunk.
    let r = trace_then_switch(&mut sim, &ports, "n", &frame(BCAST, MAC_C, 60));
    assert_eq!((r.vlan, r.vlan_source.as_deref()), (10, Some("native")));
    assert_eq!(egress(&r), eg(&[("a10", None), ("t", Some(10))]));
    // A tagged 20 from n (carried): to the access port of 20 and tagged on t.
    let r = trace_then_switch(&mut sim, &ports, "n", &tag(&frame(BCAST, MAC_C, 60), 0, 20));
    assert_eq!(egress(&r), eg(&[("a20", None), ("t", Some(20))]));
}

#[test]
fn trace_follows_port_security() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    sim.sw
        .set_port_policy(
            "a",
            secure(Security {
                macs: vec![MacAddr(MAC_A)],
                dhcp_guard: true,
                ..Security::default()
            }),
        )
        .unwrap();
    let ports: [(&str, &InjectPort); 2] = [("a", &a), ("b", &b)];
    let cases = [
        // (frame, security verdict, drop reason)
        (frame(BCAST, MAC_A, 60), "pass", None),
        (
            frame(MAC_C, MAC_B, 60),
            "source MAC not in macs",
            Some("src_mac_not_allowed"),
        ),
        (
            arp(MAC_B, [10, 0, 0, 2], [10, 0, 0, 9]),
            "source MAC not in macs",
            Some("src_mac_not_allowed"),
        ),
        (
            {
                // Its own Ethernet source, someone else's ARP sender.
                let mut f = arp(MAC_B, [10, 0, 0, 2], [10, 0, 0, 9]);
                f[6..12].copy_from_slice(&MAC_A);
                f
            },
            "ARP sender MAC not in macs",
            Some("src_mac_not_allowed"),
        ),
        (
            udp4(MAC_A, [10, 0, 0, 1], 67, 68, 2),
            "DHCP server message (dhcp_guard)",
            Some("dhcp_guard"),
        ),
        (udp4(MAC_A, [0, 0, 0, 0], 68, 67, 1), "pass", None),
    ];
    for (f, check, why) in cases {
        let r = trace_then_switch(&mut sim, &ports, "a", &f);
        assert_eq!(r.security.as_deref(), Some(check), "{:#?}", r.steps);
        assert_eq!(r.drop_reason.as_deref(), why);
        // A refused frame teaches the fdb nothing: trace stops before learning.
        assert_eq!(r.learn.is_some(), why.is_none());
    }
    // A port without per-frame checks reports none.
    let r = trace_then_switch(&mut sim, &ports, "b", &frame(BCAST, MAC_B, 60));
    assert!(r.security.is_none());
}

#[test]
fn trace_follows_storm_control_without_taking_tokens() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    sim.sw
        .set_port_policy(
            "a",
            PortPolicy {
                storm: Storm {
                    broadcast: Some(320),
                    ..Storm::default()
                },
                ..PortPolicy::default()
            },
        )
        .unwrap();
    let ports: [(&str, &InjectPort); 2] = [("a", &a), ("b", &b)];
    let bc = frame(BCAST, MAC_A, 60);
    // Within the limit (the bucket is full: 32 frames): flooded.
    let r = trace_then_switch(&mut sim, &ports, "a", &bc);
    let s = r.storm.clone().expect("storm info");
    assert_eq!(
        (s.class.as_str(), s.limit_pps, s.tokens, s.admit),
        ("broadcast", Some(320), Some(32), true)
    );
    assert_eq!(r.verdict, "flood");
    // Use up the rest of the bucket on this clock instant; traces take nothing from it.
    for _ in 0..31 {
        let r = sim.sw.trace("a", &bc).unwrap();
        assert!(r.storm.unwrap().admit);
    }
    for _ in 0..31 {
        a.inject(&bc);
    }
    while a.pending() > 0 {
        sim.sw.poll_once(sim.now);
    }
    assert_eq!(b.take_captured().len(), 31);
    // Beyond it: dropped as storm_broadcast, by trace and engine alike.
    let r = trace_then_switch(&mut sim, &ports, "a", &bc);
    let s = r.storm.clone().unwrap();
    assert_eq!((s.tokens, s.admit), (Some(0), false));
    assert_eq!(r.drop_reason.as_deref(), Some("storm_broadcast"));
    // Other classes have no limit here: pass, reported as such.
    let r = trace_then_switch(&mut sim, &ports, "a", &frame(MAC_D, MAC_A, 60));
    let s = r.storm.clone().unwrap();
    assert_eq!(
        (s.class.as_str(), s.limit_pps, s.admit),
        ("unknown_unicast", None, true)
    );
    // A known destination is never storm-limited.
    sim.send(&b, &[frame(MAC_D, MAC_B, 60)]);
    let _ = a.take_captured();
    let r = trace_then_switch(&mut sim, &ports, "a", &frame(MAC_B, MAC_A, 60));
    assert!(r.storm.is_none() && r.verdict == "unicast");
    // 100 ms later the bucket holds 32 again.
    sim.now += 100_000_000;
    let r = trace_then_switch(&mut sim, &ports, "a", &bc);
    assert_eq!(r.storm.unwrap().tokens, Some(32));
    assert_eq!(r.verdict, "flood");
}

/// A frame to link-local group 01:80:C2:00:00:0`g` from `src`, with the group's EtherType.
fn link_local(g: u8, src: [u8; 6]) -> Vec<u8> {
    let mut f = frame([0x01, 0x80, 0xc2, 0, 0, g], src, 60);
    let ether_type: u16 = match g {
        0x1 => 0x8808,
        0x2 => 0x8809,
        0x3 => 0x888e,
        0xe => 0x88cc,
        // A BPDU is 802.3 with LLC: a length, not an EtherType.
        _ => 39,
    };
    f[12..14].copy_from_slice(&ether_type.to_be_bytes());
    f
}

#[test]
fn link_local_frames_are_never_relayed_and_counted_by_group() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    // s takes the per-frame policy path (storm control), t a trunk's.
    let s = sim.sw.add_inject_port("s", None).unwrap();
    sim.sw
        .set_port_policy(
            "s",
            PortPolicy {
                storm: Storm {
                    multicast: Some(1_000_000),
                    ..Storm::default()
                },
                ..PortPolicy::default()
            },
        )
        .unwrap();
    let ports: [(&str, &InjectPort); 3] = [("a", &a), ("b", &b), ("s", &s)];
    for ingress in ["a", "s"] {
        for g in 0..16u8 {
            let t = trace_then_switch(&mut sim, &ports, ingress, &link_local(g, MAC_A));
            assert!(
                t.egress.is_empty(),
                "group {g} from {ingress}: {:#?}",
                t.steps
            );
            assert!(
                t.steps.iter().any(|s| s.starts_with("link-local:")),
                "{:#?}",
                t.steps
            );
        }
        for (reason, n) in [
            ("bpdu", 1),
            ("pause", 1),
            ("slow_protocols", 1),
            ("eapol", 1),
            ("lldp", 1),
            ("link_local", 11),
        ] {
            assert_eq!(drops(&sim, ingress, reason), n, "{ingress} {reason}");
        }
    }
    // Group addresses next to the range are ordinary multicast: flooded.
    for dst in [[0x01, 0x80, 0xc2, 0, 0, 0x10], [0x01, 0x80, 0xc2, 0, 1, 0]] {
        sim.send(&a, &[frame(dst, MAC_A, 60)]);
        assert_eq!(b.take_captured().len(), 1);
        assert_eq!(s.take_captured().len(), 1);
    }
    // On a trunk, a tagged link-local frame is not relayed either.
    let t = sim.sw.add_inject_port("t", None).unwrap();
    sim.sw.set_port_policy("t", trunk("10")).unwrap();
    let u = sim.sw.add_inject_port("u", None).unwrap();
    sim.sw.set_port_policy("u", trunk("10")).unwrap();
    sim.send(&t, &[tag(&link_local(0xe, MAC_B), 0, 10)]);
    assert!(u.take_captured().is_empty());
    assert_eq!(drops(&sim, "t", "lldp"), 1);
}

#[test]
fn link_local_forward_relays_the_groups_it_names() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let update = qswitch_api::policy::PolicyUpdate {
        link_local_forward: Some("stp,lldp".parse().unwrap()),
        ..Default::default()
    };
    sim.sw.update_port_policy("a", &update).unwrap();
    let ports: [(&str, &InjectPort); 2] = [("a", &a), ("b", &b)];
    for (g, relayed) in [
        (0x0, true),
        (0xe, true),
        (0x3, false),
        (0x1, false),
        (0x2, false),
    ] {
        let t = trace_then_switch(&mut sim, &ports, "a", &link_local(g, MAC_A));
        assert_eq!(
            t.egress.len(),
            usize::from(relayed),
            "group {g}: {:#?}",
            t.steps
        );
    }
    // Only from the port that names them: b's BPDUs stay.
    let t = trace_then_switch(&mut sim, &ports, "b", &link_local(0, MAC_B));
    assert_eq!(t.drop_reason.as_deref(), Some("bpdu"));
    // PAUSE and slow protocols cannot be named.
    assert!("stp,pause"
        .parse::<qswitch_api::policy::LinkLocalGroups>()
        .is_err());
    assert!("2".parse::<qswitch_api::policy::LinkLocalGroups>().is_err());
}

#[test]
fn bpdu_guard_disables_the_port_until_it_is_enabled() {
    let mut sim = Sim::new(1);
    let a = sim.sw.add_inject_port("a", None).unwrap();
    let b = sim.sw.add_inject_port("b", None).unwrap();
    let update = qswitch_api::policy::PolicyUpdate {
        bpdu_guard: Some(true),
        ..Default::default()
    };
    sim.sw.update_port_policy("a", &update).unwrap();
    let ports: [(&str, &InjectPort); 2] = [("a", &a), ("b", &b)];
    let is_disabled = |sim: &Sim| {
        let p = sim.sw.ports().into_iter().find(|p| p.name == "a").unwrap();
        assert!(p.bpdu_guard);
        p.disabled
    };
    // Other link-local frames leave the port enabled.
    trace_then_switch(&mut sim, &ports, "a", &link_local(0xe, MAC_A));
    assert_eq!(is_disabled(&sim), None);
    // Trace says what a BPDU would do, and does not do it.
    let t = sim.sw.trace("a", &link_local(0, MAC_A)).unwrap();
    assert_eq!(t.drop_reason.as_deref(), Some("bpdu_guard"));
    assert_eq!(is_disabled(&sim), None);

    // One burst: a frame before the BPDU goes through, the BPDU disables the port, and the
    // frame after it is dropped with the port.
    let before = frame(BCAST, MAC_A, 60);
    sim.send(
        &a,
        &[
            before.clone(),
            link_local(0, MAC_A),
            frame(BCAST, MAC_A, 61),
        ],
    );
    assert_eq!(b.take_captured(), vec![before]);
    assert_eq!(drops(&sim, "a", "bpdu_guard"), 1);
    assert_eq!(drops(&sim, "a", "port_disabled"), 1);
    assert_eq!(is_disabled(&sim).as_deref(), Some("bpdu_guard"));

    // Disabled: nothing from it, nothing to it (flooded or unicast to a learned MAC).
    sim.send(&a, &[frame(BCAST, MAC_A, 60)]);
    sim.send(&b, &[frame(BCAST, MAC_B, 60), frame(MAC_A, MAC_B, 60)]);
    assert!(take(&[&a, &b]).iter().all(Vec::is_empty));
    assert_eq!(drops(&sim, "a", "port_disabled"), 4);
    let t = sim.sw.trace("a", &frame(BCAST, MAC_A, 60)).unwrap();
    assert_eq!(t.drop_reason.as_deref(), Some("port_disabled"));

    // Enabled again: switched as before.
    assert!(sim.sw.enable_port("a").unwrap());
    assert!(!sim.sw.enable_port("a").unwrap(), "already enabled");
    assert!(sim.sw.enable_port("nope").is_err());
    assert_eq!(is_disabled(&sim), None);
    trace_then_switch(&mut sim, &ports, "a", &frame(BCAST, MAC_A, 60));
    trace_then_switch(&mut sim, &ports, "b", &frame(BCAST, MAC_B, 60));
    // Without the guard, a BPDU is only counted.
    let update = qswitch_api::policy::PolicyUpdate {
        bpdu_guard: Some(false),
        ..Default::default()
    };
    sim.sw.update_port_policy("a", &update).unwrap();
    sim.send(&a, &[link_local(0, MAC_A)]);
    assert_eq!(drops(&sim, "a", "bpdu"), 1);
    assert!(sim.sw.ports().iter().all(|p| p.disabled.is_none()));
}
