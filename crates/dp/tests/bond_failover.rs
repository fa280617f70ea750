//! Active-backup failover of a bond port on carrier loss (root). A namespace `vm` behind a
//! veth port, a bond of two AF_PACKET members whose veth peers sit in a namespace `peer`
//! on a Linux bridge with the address the VM pings (every 10 ms). Five times the active
//! member's link is pulled (`ip link set … down`: carrier loss, seen through netlink link
//! events); the other member takes over, a gratuitous RARP for the VM's MAC (learned on a
//! local port) leaves by it (tcpdump in `peer` sees it), and the pings lost are counted.
//! The median loss in ms (10 ms per lost ping) is printed: the failover figure of
//! docs/teaming.md. And balance-slb: a broadcast from the peer, flooded by its bridge out of
//! both members, reaches each of two VMs once and never comes back out of the other member. Everything is removed on drop, also when an assertion fails.

mod common;

use std::time::Duration;

use common::packet_bond;
use qswitch_api::bond::BondInfo;
use qswitch_api::config::VethConfig;
use qswitch_api::{BondMode, LacpMode, LacpRate};
use qswitch_api::{PortConfig, PortKind};
use qswitch_dp::{Options, Switch};
use qswitch_test_support::harness::{ChildGuard, LinkGuard};
use qswitch_test_support::{have_tool, root_or_skip, sh_ok, skip, wait_until};
use qswitch_test_support::{Netns, TempDir};

const WAIT: Duration = Duration::from_secs(20);

fn bond_info(sw: &Switch) -> BondInfo {
    sw.bonds(Some("uplink")).expect("bond show").remove(0)
}

/// "N packets transmitted, M received" of ping's summary.
fn ping_counts(log: &str) -> Option<(u64, u64)> {
    let line = log.lines().find(|l| l.contains("packets transmitted"))?;
    let mut nums = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<u64>().ok());
    Some((nums.next()??, nums.next()??))
}

/// The test's switch, links and namespaces (dropped in that order): `vms` VM namespaces
/// (10.77.0.1, .3, …) behind veth ports, a bond (`mode`, no LACP) of two AF_PACKET members
/// whose peers are on a bridge (10.77.0.2) in the peer namespace.
struct Lab {
    sw: Switch,
    _links: Vec<LinkGuard>,
    vms: Vec<Netns>,
    peer: Netns,
    members: Vec<String>,
    dir: TempDir,
}

fn tools() -> bool {
    if !root_or_skip() {
        return false;
    }
    for (tool, arg) in [("tcpdump", "--version"), ("ping", "-V")] {
        if !have_tool(tool, &[arg]) {
            skip(&format!("needs {tool}"));
            return false;
        }
    }
    true
}

impl Lab {
    fn new(tag: &str, mode: BondMode, vms: usize) -> Lab {
        let pid = std::process::id() % 100_000;
        let dir = TempDir::new(&format!("bond-{tag}"));
        let peer = Netns::new(&format!("qs-b{tag}-{pid}-peer"));
        let mut links = Vec::new();
        let cpu = qswitch_sys::thread::online_cpus().unwrap()[0];
        let sw = Switch::start(&[cpu], &Options::default()).expect("switch");
        let mut namespaces = Vec::new();
        for v in 0..vms {
            let vm = Netns::new(&format!("qs-b{tag}-{pid}-vm{v}"));
            let vmif = format!("qbv{tag}{pid}{v}");
            sh_ok(&[
                "ip", "link", "add", &vmif, "type", "veth", "peer", "name", "eth0", "netns",
                &vm.name,
            ]);
            links.push(LinkGuard(vmif.clone()));
            sh_ok(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{vmif}.disable_ipv6=1"),
            ]);
            sh_ok(&["ip", "link", "set", "dev", &vmif, "up"]);
            vm.sysctl("net.ipv6.conf.eth0.disable_ipv6", "1");
            let addr = format!("10.77.0.{}/24", if v == 0 { 1 } else { v + 2 });
            vm.ok(&["ip", "addr", "add", &addr, "dev", "eth0"]);
            vm.ok(&["ip", "link", "set", "eth0", "up"]);
            sw.add_port(&PortConfig::new(
                &format!("vm{v}"),
                PortKind::Veth(VethConfig {
                    ifname: vmif.parse().unwrap(),
                    fastpath: false,
                }),
            ))
            .expect("vm port");
            namespaces.push(vm);
        }
        peer.ok(&["ip", "link", "add", "br0", "type", "bridge"]);
        peer.sysctl("net.ipv6.conf.br0.disable_ipv6", "1");
        peer.ok(&["ip", "addr", "add", "10.77.0.2/24", "dev", "br0"]);
        peer.ok(&["ip", "link", "set", "br0", "up"]);
        let mut members = Vec::new();
        for i in 0..2 {
            let m = format!("qbm{tag}{pid}{i}");
            let pe = format!("pe{i}");
            sh_ok(&[
                "ip", "link", "add", &m, "type", "veth", "peer", "name", &pe, "netns", &peer.name,
            ]);
            links.push(LinkGuard(m.clone()));
            sh_ok(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{m}.disable_ipv6=1"),
            ]);
            peer.sysctl(&format!("net.ipv6.conf.{pe}.disable_ipv6"), "1");
            peer.ok(&["ip", "link", "set", &pe, "master", "br0"]);
            peer.ok(&["ip", "link", "set", &pe, "up"]);
            sh_ok(&["ip", "link", "set", "dev", &m, "up"]);
            members.push(m);
        }
        sw.add_port(&packet_bond(
            "uplink",
            mode,
            LacpMode::Off,
            LacpRate::Slow,
            &members,
        ))
        .expect("bond port");
        Lab {
            sw,
            _links: links,
            vms: namespaces,
            peer,
            members,
            dir,
        }
    }

    /// tcpdump in `ns` with `args`, its lines in the temp dir's `log`, once it listens.
    fn tcpdump(&self, ns: &Netns, args: &[&str], log: &str) -> (ChildGuard, std::path::PathBuf) {
        let log = self.dir.join(log);
        let mut all = vec!["tcpdump", "-l", "-n", "-e"];
        all.extend_from_slice(args);
        let cap = ns.spawn(&all, &log);
        assert!(
            wait_until(WAIT, || std::fs::read_to_string(&log)
                .is_ok_and(|t| t.contains("listening on"))),
            "tcpdump did not start"
        );
        (cap, log)
    }
}

fn lines_with(log: &std::path::Path, what: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(what))
        .count()
}

#[test]
fn active_backup_fails_over_on_carrier_loss_and_announces_the_vm() {
    if !tools() {
        return;
    }
    let lab = Lab::new("f", BondMode::ActiveBackup, 1);
    let (sw, vm, peer, members, dir) = (&lab.sw, &lab.vms[0], &lab.peer, &lab.members, &lab.dir);
    let vm_mac = vm
        .ok(&["cat", "/sys/class/net/eth0/address"])
        .stdout
        .trim()
        .to_string();
    assert!(
        wait_until(WAIT, || bond_info(sw).active.as_deref()
            == Some(&members[0])),
        "{:#?}",
        bond_info(sw)
    );
    assert!(
        wait_until(WAIT, || vm
            .run(&["ping", "-c", "1", "-W", "1", "10.77.0.2"])
            .ok()),
        "no ping through the bond: {:#?}",
        bond_info(sw)
    );

    let mut lost_ms = Vec::new();
    for pull in 0..5 {
        let active = bond_info(sw).active.expect("an active member");
        let a = members.iter().position(|m| *m == active).unwrap();
        let other = &members[1 - a];
        // The RARP leaves by the new member: watch its peer end.
        let cap_log = dir.join(&format!("tcpdump{pull}.log"));
        let mut cap = peer.spawn(
            &[
                "tcpdump",
                "-l",
                "-n",
                "-e",
                "-c",
                "1",
                "-i",
                &format!("pe{}", 1 - a),
                "rarp",
            ],
            &cap_log,
        );
        assert!(
            wait_until(WAIT, || std::fs::read_to_string(&cap_log)
                .is_ok_and(|t| t.contains("listening on"))),
            "tcpdump did not start"
        );
        let ping_log = dir.join(&format!("ping{pull}.log"));
        let mut ping = vm.spawn(
            &[
                "ping",
                "-n",
                "-i",
                "0.01",
                "-c",
                "300",
                "-W",
                "1",
                "10.77.0.2",
            ],
            &ping_log,
        );
        // Pull once the pings flow (50 answered).
        assert!(
            wait_until(WAIT, || std::fs::read_to_string(&ping_log)
                .is_ok_and(|t| t.contains("icmp_seq=50 "))),
            "pings did not flow"
        );
        sh_ok(&["ip", "link", "set", "dev", &active, "down"]);
        assert!(
            wait_until(WAIT, || bond_info(sw).active.as_deref() == Some(other)),
            "no failover: {:#?}",
            bond_info(sw)
        );
        assert!(ping.wait_timeout(WAIT).is_some(), "ping did not finish");
        let log = std::fs::read_to_string(&ping_log).unwrap_or_default();
        let (sent, got) = ping_counts(&log).unwrap_or_else(|| panic!("no summary: {log}"));
        let lost = sent - got;
        println!(
            "pull {pull}: {active} down, {lost} of {sent} pings lost ({} ms)",
            lost * 10
        );
        lost_ms.push(lost * 10);
        assert!(
            cap.wait_timeout(WAIT).is_some(),
            "no RARP seen on the new member's link: {}",
            std::fs::read_to_string(&cap_log).unwrap_or_default()
        );
        let seen = std::fs::read_to_string(&cap_log).unwrap_or_default();
        assert!(
            seen.contains(&vm_mac) && seen.to_lowercase().contains("reverse request"),
            "{seen}"
        );
        assert!(lost <= 5, "lost {lost} pings at a failover");
        sh_ok(&["ip", "link", "set", "dev", &active, "up"]);
        assert!(
            wait_until(WAIT, || bond_info(sw).members[a].enabled),
            "{active} did not come back: {:#?}",
            bond_info(sw)
        );
    }
    lost_ms.sort_unstable();
    println!(
        "active-backup failover after carrier loss, 5 pulls: lost {lost_ms:?} ms, median {} ms",
        lost_ms[2]
    );
    let info = bond_info(sw);
    assert!(info.members.iter().all(|m| m.rarp_tx >= 2), "{info:#?}");
}

#[test]
fn balance_slb_takes_a_broadcast_once_and_never_sends_it_back() {
    if !tools() {
        return;
    }
    let lab = Lab::new("s", BondMode::BalanceSlb, 2);
    let sw = &lab.sw;
    assert!(
        wait_until(WAIT, || bond_info(sw).members.iter().all(|m| m.enabled)),
        "{:#?}",
        bond_info(sw)
    );
    const REQ: &str = "ICMP echo request";
    let vms: Vec<_> = (0..2)
        .map(|v| lab.tcpdump(&lab.vms[v], &["-i", "eth0", "icmp"], &format!("vm{v}.log")))
        .collect();
    let back: Vec<_> = (0..2)
        .map(|i| {
            lab.tcpdump(
                &lab.peer,
                &["-Q", "in", "-i", &format!("pe{i}"), "icmp"],
                &format!("pe{i}.log"),
            )
        })
        .collect();
    // Five broadcasts from the peer: its bridge floods each out of both members.
    let _ = lab.peer.run(&[
        "ping",
        "-b",
        "-n",
        "-c",
        "5",
        "-i",
        "0.2",
        "-W",
        "1",
        "10.77.0.255",
    ]);
    for (v, (_, log)) in vms.iter().enumerate() {
        assert!(
            wait_until(WAIT, || lines_with(log, REQ) >= 5),
            "vm{v} got {} broadcasts: {:#?}",
            lines_with(log, REQ),
            bond_info(sw)
        );
    }
    // Nothing more arrives (a duplicate would follow within milliseconds).
    let more = wait_until(Duration::from_secs(1), || {
        vms.iter().any(|(_, log)| lines_with(log, REQ) > 5)
            || back.iter().any(|(_, log)| lines_with(log, REQ) > 0)
    });
    for (v, (_, log)) in vms.iter().enumerate() {
        assert_eq!(lines_with(log, REQ), 5, "vm{v}: each broadcast once");
    }
    for (i, (_, log)) in back.iter().enumerate() {
        assert_eq!(
            lines_with(log, REQ),
            0,
            "a broadcast came back by member {i}"
        );
    }
    assert!(!more);
    let info = bond_info(sw);
    assert!(
        info.members.iter().map(|m| m.rx_dropped).sum::<u64>() >= 5,
        "the other member's copies are refused: {info:#?}"
    );
}
