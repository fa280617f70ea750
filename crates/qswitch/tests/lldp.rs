//! LLDP in the running daemon against Debian's lldpd (root only). Two namespaces this test
//! creates, each with lldpd (its control socket in the test's temp dir, `tx-interval 1`, so
//! its TTL is 4 s) on one end of a veth pair; the other ends are veth ports of a
//! `qswitch run` daemon:
//!
//! - `up`, `lldp = "both"`: `lldpcli show neighbors` on the peer shows qswitch (system
//!   name = the host name, port id = the interface name, TTL 121 s); `qswitch lldp` shows
//!   lldpd's chassis id, port id, system name, port description, management address and
//!   TTL; `/metrics` counts it.
//! - `quiet`, `lldp = "off"`: `qswitch lldp quiet` shows nothing although lldpd's LLDPDUs
//!   reach the port (counted as the `lldp` drop), and lldpd hears nothing from qswitch;
//!   reloaded with `lldp = "rx"`, it shows its lldpd and still sends nothing; when the
//!   peer's link goes down (lldpd can send no shutdown LLDPDU), the neighbour ages out
//!   after its TTL.
//!
//! lldpd is stopped by PID, the namespaces and veths removed on drop, also on failure.

mod common;

use std::time::Duration;

use common::lldpd::{lldpd_or_skip, Lldpd};
use common::{drops, qs, qs_json, wait_until, worker_cpus, DaemonChild, TempDir};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

fn lldp(control: &std::path::Path, port: Option<&str>) -> Vec<Value> {
    let mut args = vec!["lldp", "--json"];
    args.extend(port);
    qs_json(control, &args)
        .as_array()
        .expect("lldp --json is an array")
        .clone()
}

/// The metrics text, from the daemon's HTTP listener on `addr`.
fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect /metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    text
}

#[test]
fn lldp_with_lldpd_both_ways_aging_and_off() {
    if !lldpd_or_skip() {
        return;
    }
    let pid = std::process::id();
    let dir = TempDir::new("lldp");
    let up_if = format!("ql{}u", pid % 1_000_000);
    let quiet_if = format!("ql{}q", pid % 1_000_000);
    let n = pid % 200 + 20;
    let up = Lldpd::start(&dir, "u", &up_if, Some(&format!("10.203.{n}.2/24")));
    let quiet = Lldpd::start(&dir, "q", &quiet_if, Some(&format!("10.204.{n}.2/24")));

    let control = dir.join("control.sock");
    let http = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let config = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nhttp = \"{http}\"\n\
         [[port]]\nname = \"up\"\ntype = \"veth\"\nifname = \"{up_if}\"\nlldp = \"both\"\n\
         [[port]]\nname = \"quiet\"\ntype = \"veth\"\nifname = \"{quiet_if}\"\nlldp = \"off\"\n",
        worker_cpus(2),
        control.display()
    );
    let _daemon = DaemonChild::start(dir.path(), "qswitch", &config, &control);

    // The setting is in the config dump, as every port key is.
    let dump = qs(&control, &["config", "dump"]);
    dump.assert_ok("config dump");
    assert!(dump.stdout.contains("lldp = \"both\""), "{}", dump.stdout);
    assert!(dump.stdout.contains("lldp = \"off\""), "{}", dump.stdout);

    // lldpd sees qswitch on `up`.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let mut shown = String::new();
    let seen = wait_until(WAIT, || {
        shown = up.neighbors();
        shown.contains(&format!("chassis.name={host}"))
    });
    assert!(seen, "lldpd does not show qswitch: {shown}");
    for want in [
        format!("lldp.eth0.port.ifname={up_if}"),
        "lldp.eth0.port.ttl=121".to_string(),
    ] {
        assert!(shown.lines().any(|l| l == want), "no {want} in:\n{shown}");
    }

    // qswitch shows lldpd on `up`.
    let peer_mac = up.ns.mac("eth0");
    let mut ports = Vec::new();
    let heard = wait_until(WAIT, || {
        ports = lldp(&control, Some("up"));
        ports.len() == 1
            && ports[0]["neighbors"]
                .as_array()
                .is_some_and(|n| n.len() == 1)
    });
    assert!(heard, "qswitch lldp up shows no neighbour: {ports:?}");
    let p = &ports[0];
    assert_eq!(p["ifname"], up_if);
    assert_eq!(p["mode"], "both");
    let nb = &p["neighbors"][0];
    assert_eq!(nb["chassis_id"], peer_mac, "{nb}");
    assert_eq!(nb["port_id"], peer_mac, "{nb}");
    assert_eq!(nb["system_name"], up.name.as_str(), "{nb}");
    assert_eq!(nb["port_description"], "eth0", "{nb}");
    assert_eq!(nb["management_address"], format!("10.203.{n}.2"), "{nb}");
    assert_eq!(nb["ttl"], 4, "tx-interval 1 s, hold 4: {nb}");
    assert!(nb["ttl_remaining_s"].as_u64().unwrap() <= 4, "{nb}");
    let text = qs(&control, &["lldp", "up"]);
    text.assert_ok("lldp up");
    assert!(text.stdout.contains(&up.name), "{}", text.stdout);

    // /metrics: the neighbour count and an info line.
    let m = metrics(&http);
    assert!(m.contains("qswitch_lldp_neighbors{port=\"up\"} 1\n"), "{m}");
    assert!(
        m.contains(&format!("system_name=\"{}\"", up.name)),
        "no info metric for the neighbour: {m}"
    );
    assert!(
        m.lines().any(
            |l| l.starts_with("qswitch_lldp_pdus_total{port=\"up\",direction=\"tx\"} ")
                && !l.ends_with(" 0")
        ),
        "{m}"
    );

    // `quiet` (lldp = "off"): lldpd's LLDPDUs reach it and are dropped, nothing is kept,
    // and nothing was sent to lldpd (by now `up` has sent, in the same housekeeping tick).
    let got_there = wait_until(WAIT, || {
        drops(&qs_json(&control, &["stats", "--json"]), "quiet", "lldp") > 0
    });
    assert!(got_there, "lldpd's LLDPDUs never reached port quiet");
    assert!(lldp(&control, Some("quiet")).is_empty());
    let all = lldp(&control, None);
    assert_eq!(all.len(), 1, "only `up` runs LLDP: {all:?}");
    let q = quiet.neighbors();
    assert!(
        !q.contains("chassis.name"),
        "lldpd heard qswitch on an off port: {q}"
    );
    assert!(
        !m.lines()
            .any(|l| l.starts_with("qswitch_lldp") && l.contains("port=\"quiet\"")),
        "{m}"
    );

    // Reload with `quiet` turned to "rx": the port is added again with an agent, which
    // hears its lldpd, and sends nothing.
    std::fs::write(
        dir.join("qswitch.toml"),
        config.replace("lldp = \"off\"", "lldp = \"rx\""),
    )
    .unwrap();
    qs(&control, &["reload"]).assert_ok("reload");
    let mut ports = Vec::new();
    let heard = wait_until(WAIT, || {
        ports = lldp(&control, Some("quiet"));
        ports.len() == 1
            && ports[0]["neighbors"]
                .as_array()
                .is_some_and(|n| n.iter().any(|n| n["system_name"] == quiet.name.as_str()))
    });
    assert!(
        heard,
        "after reload, quiet does not show its lldpd: {ports:?}"
    );
    assert_eq!(
        (&ports[0]["mode"], &ports[0]["tx"]),
        (&"rx".into(), &0.into())
    );
    assert!(!quiet.neighbors().contains("chassis.name"));

    // A neighbour that falls silent (its link goes down: no shutdown LLDPDU) ages out after
    // its 4 s TTL.
    quiet.ns.ok(&["ip", "link", "set", "dev", "eth0", "down"]);
    let mut ports = Vec::new();
    let aged = wait_until(Duration::from_secs(12), || {
        ports = lldp(&control, Some("quiet"));
        ports[0]["neighbors"]
            .as_array()
            .is_some_and(|n| n.is_empty())
    });
    assert!(aged, "the neighbour outlived its TTL: {ports:?}");
    assert_eq!(ports[0]["aged_out"], 1, "{ports:?}");

    // An unknown port is a one-line error.
    let bad = qs(&control, &["lldp", "nosuch"]);
    assert!(!bad.ok());
    assert!(bad.stderr.contains("nosuch"), "{bad:?}");
}

/// LLDP on a bond's members: a bond of two veth members, each to its own lldpd, with
/// `lldp = "both"` on the bond. Each lldpd sees qswitch with port id = the member's
/// interface (also the backup member's: LLDP is per link); `qswitch lldp` lists one agent
/// per member as `BOND/IFNAME`, each with its own lldpd; `/metrics` counts them.
#[test]
fn lldp_on_bond_members_with_lldpd() {
    if !lldpd_or_skip() {
        return;
    }
    let pid = std::process::id();
    let dir = TempDir::new("lldp-bond");
    let if0 = format!("qb{}a", pid % 1_000_000);
    let if1 = format!("qb{}b", pid % 1_000_000);
    let n = pid % 200 + 20;
    let peer0 = Lldpd::start(&dir, "ba", &if0, Some(&format!("10.205.{n}.2/24")));
    let peer1 = Lldpd::start(&dir, "bb", &if1, Some(&format!("10.206.{n}.2/24")));

    let control = dir.join("control.sock");
    let http = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let config = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nhttp = \"{http}\"\n\
         [[port]]\nname = \"bond0\"\ntype = \"bond\"\nlldp = \"both\"\n\
         members = [ {{ type = \"veth\", ifname = \"{if0}\" }}, \
         {{ type = \"veth\", ifname = \"{if1}\" }} ]\n",
        worker_cpus(2),
        control.display()
    );
    let _daemon = DaemonChild::start(dir.path(), "qswitch", &config, &control);

    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    for (peer, ifname) in [(&peer0, &if0), (&peer1, &if1)] {
        let mut shown = String::new();
        let seen = wait_until(WAIT, || {
            shown = peer.neighbors();
            shown.contains(&format!("chassis.name={host}"))
                && shown
                    .lines()
                    .any(|l| l == format!("lldp.eth0.port.ifname={ifname}"))
        });
        assert!(seen, "lldpd on {ifname} does not show qswitch: {shown}");
    }

    let mut ports = Vec::new();
    let heard = wait_until(WAIT, || {
        ports = lldp(&control, Some("bond0"));
        ports.len() == 2
            && ports
                .iter()
                .all(|p| p["neighbors"].as_array().is_some_and(|n| n.len() == 1))
    });
    assert!(
        heard,
        "qswitch lldp bond0 does not show both lldpd: {ports:?}"
    );
    for (p, (peer, ifname)) in ports.iter().zip([(&peer0, &if0), (&peer1, &if1)]) {
        assert_eq!(p["port"], format!("bond0/{ifname}"), "{p}");
        assert_eq!(p["ifname"], ifname.as_str(), "{p}");
        assert_eq!(p["mode"], "both", "{p}");
        assert_eq!(p["neighbors"][0]["system_name"], peer.name, "{p}");
    }
    let m = metrics(&http);
    for ifname in [&if0, &if1] {
        assert!(
            m.contains(&format!(
                "qswitch_lldp_neighbors{{port=\"bond0/{ifname}\"}} 1\n"
            )),
            "{m}"
        );
    }
}
