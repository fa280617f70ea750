//! `qswitch port set`: live VLAN trunk, port security, storm-control and link-local changes
//! (and `port enable`) through the control socket, end to end through the `qswitch` binary. Nothing here needs root: the
//! daemons use gen ports only.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{counter, drops, first_cpu, qs, qs_json, wait_until, DaemonChild, Out, TempDir};
use serde_json::Value;

/// A sink g2 and a generator g1 sending to it at 2000 frames/s for long enough.
fn gen_config(control: &Path) -> String {
    format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"g2\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\n\
         [[port]]\nname = \"g1\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:01\"\n\
         generate = {{ dst = \"02:00:00:00:00:02\", size = 64, rate = 2000, count = 1000000 }}\n",
        first_cpu(),
        control.display()
    )
}

fn port<'a>(ports: &'a Value, name: &str) -> &'a Value {
    ports
        .as_array()
        .expect("port array")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no port {name}: {ports}"))
}

fn set(control: &Path, args: &[&str]) -> Value {
    let mut a = vec!["port", "set", "g1"];
    a.extend_from_slice(args);
    qs(control, &a).assert_ok(&format!("port set g1 {args:?}"));
    port(&qs_json(control, &["port", "list", "--json"]), "g1").clone()
}

fn assert_refused(out: &Out, needle: &str) {
    out.assert_no_panic();
    assert!(matches!(out.code, Some(c) if c != 0), "{out:?}");
    // One error line (`qswitch: ...` from the daemon's answer, `error: ...` from argument
    // parsing, which adds a usage hint after it).
    let lines: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("error:") || l.starts_with("qswitch:"))
        .collect();
    assert_eq!(lines.len(), 1, "want one error line: {out:?}");
    assert!(
        lines[0].contains(needle),
        "stderr lacks '{needle}': {out:?}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// Waits (10 s at most) until `cond` holds on `stats --json`; returns the last stats.
fn wait_stats(daemon: &DaemonChild, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    let held = wait_until(Duration::from_secs(10), || {
        last = daemon.stats();
        cond(&last)
    });
    assert!(held, "timed out waiting for {what}: {last}");
    last
}

#[test]
fn port_set_changes_each_field_and_port_list_shows_it() {
    let dir = TempDir::new("portset");
    let control = dir.join("control.sock");
    let _daemon = DaemonChild::start(dir.path(), "portset", &gen_config(&control), &control);

    let p = port(&qs_json(&control, &["port", "list", "--json"]), "g1").clone();
    for k in ["vlans", "security", "storm"] {
        assert!(p.get(k).is_none(), "{k} set before any change: {p}");
    }

    let p = set(&control, &["--vlans", "10,20,100-200"]);
    assert_eq!(p["vlans"], "10,20,100-200", "{p}");
    let p = set(
        &control,
        &[
            "--macs",
            "52:54:00:12:34:56,02:00:00:00:00:01",
            "--ips",
            "10.0.0.5,fe80::/64",
        ],
    );
    assert_eq!(
        p["security"]["macs"],
        serde_json::json!(["52:54:00:12:34:56", "02:00:00:00:00:01"]),
        "{p}"
    );
    assert_eq!(
        p["security"]["ips"],
        serde_json::json!(["10.0.0.5/32", "fe80::/64"]),
        "{p}"
    );
    assert_eq!(p["vlans"], "10,20,100-200", "other fields kept: {p}");
    let p = set(
        &control,
        &["--mac-limit", "4", "--dhcp-guard", "on", "--ra-guard", "on"],
    );
    let sec = &p["security"];
    assert_eq!(sec["mac_limit"], 4, "{p}");
    assert_eq!(sec["dhcp_guard"], true, "{p}");
    assert_eq!(sec["ra_guard"], true, "{p}");
    assert_eq!(sec["macs"].as_array().map(Vec::len), Some(2), "{p}");
    let p = set(
        &control,
        &[
            "--storm-broadcast",
            "100",
            "--storm-multicast",
            "0",
            "--storm-unknown-unicast",
            "5000",
        ],
    );
    assert_eq!(
        p["storm"],
        serde_json::json!({"broadcast": 100, "multicast": 0, "unknown_unicast": 5000}),
        "{p}"
    );

    let p = set(
        &control,
        &["--link-local-forward", "lldp,0", "--bpdu-guard", "on"],
    );
    assert_eq!(p["link_local_forward"], "stp,lldp", "{p}");
    assert_eq!(p["bpdu_guard"], true, "{p}");
    assert!(p.get("disabled").is_none(), "{p}");
    // Recorded as config keys (what a restart applies).
    let dump = qs(&control, &["config", "dump"]);
    dump.assert_ok("config dump");
    assert!(
        dump.stdout.contains("link_local_forward = \"stp,lldp\"")
            && dump.stdout.contains("bpdu_guard = true"),
        "{dump:?}"
    );
    // Enabling a port that is enabled changes nothing.
    qs(&control, &["port", "enable", "g1"]).assert_ok("port enable");

    // The table shows it compactly.
    let out = qs(&control, &["port", "list"]);
    out.assert_ok("port list");
    for needle in [
        "link-local-forward stp,lldp; bpdu-guard",
        "trunk 10,20,100-200",
        "macs:52:54:00:12:34:56,02:00:00:00:00:01",
        "mac-limit:4",
        "dhcp-guard",
        "ra-guard",
        "bcast:100/s",
    ] {
        assert!(out.stdout.contains(needle), "'{needle}' missing: {out:?}");
    }

    // Clearing, one field at a time.
    let p = set(&control, &["--vlans", "none"]);
    assert!(p.get("vlans").is_none(), "{p}");
    let p = set(&control, &["--macs", "none", "--ips", "none"]);
    assert!(p["security"].get("macs").is_none(), "{p}");
    assert!(p["security"].get("ips").is_none(), "{p}");
    let p = set(&control, &["--mac-limit", "none", "--dhcp-guard", "off"]);
    assert!(p["security"].get("mac_limit").is_none(), "{p}");
    assert!(p["security"].get("dhcp_guard").is_none(), "{p}");
    let p = set(&control, &["--ra-guard", "off"]);
    assert!(p.get("security").is_none(), "{p}");
    let p = set(
        &control,
        &["--storm-broadcast", "none", "--storm-multicast", "none"],
    );
    assert_eq!(
        p["storm"],
        serde_json::json!({"unknown_unicast": 5000}),
        "{p}"
    );
    let p = set(&control, &["--storm-unknown-unicast", "none"]);
    assert!(p.get("storm").is_none(), "{p}");
    let p = set(
        &control,
        &["--link-local-forward", "none", "--bpdu-guard", "off"],
    );
    assert!(p.get("link_local_forward").is_none(), "{p}");
    assert!(p.get("bpdu_guard").is_none(), "{p}");
    assert!(qs(&control, &["port", "list"]).stdout.lines().count() == 3);
}

#[test]
fn port_set_refuses_bad_values_and_unknown_ports_with_one_line() {
    let dir = TempDir::new("portsetbad");
    let control = dir.join("control.sock");
    let _daemon = DaemonChild::start(dir.path(), "portsetbad", &gen_config(&control), &control);
    let before = qs_json(&control, &["port", "list", "--json"]);

    let cases: &[(&[&str], &str)] = &[
        (
            &["--vlans", "10,4095"],
            "VLAN ID 4095 is out of range 1..=4094",
        ),
        (&["--vlans", "10-x"], "'x' is not a VLAN ID"),
        (&["--vlans", "20-10"], "VLAN range 20-10 is empty"),
        (&["--macs", "zz"], "zz"),
        (&["--macs", "ff:ff:ff:ff:ff:ff"], "ff:ff:ff:ff:ff:ff"),
        (&["--ips", "10.0.0.0/33"], "/33 is not a prefix length"),
        (&["--ips", "10.0.0.1,x"], "'x' is not an IP address"),
        (&["--mac-limit=-1"], "--mac-limit"),
        (&["--dhcp-guard", "maybe"], "'maybe' is not on or off"),
        (&["--storm-broadcast", "lots"], "--storm-broadcast"),
        (
            &["--link-local-forward", "stp,1"],
            "link-local group 1 (01:80:c2:00:00:01, PAUSE) is never relayed",
        ),
        (
            &["--link-local-forward", "2"],
            "(01:80:c2:00:00:02, slow protocols (LACP)) is never relayed",
        ),
        (&[], "nothing to change"),
    ];
    for (args, needle) in cases {
        let mut a = vec!["port", "set", "g1"];
        a.extend_from_slice(args);
        assert_refused(&qs(&control, &a), needle);
    }
    let out = qs(&control, &["port", "set", "nope", "--dhcp-guard", "on"]);
    assert_refused(&out, "port 'nope' does not exist");
    assert_eq!(out.code, Some(1), "{out:?}");
    assert_refused(
        &qs(&control, &["port", "enable", "nope"]),
        "port 'nope' does not exist",
    );
    assert_eq!(
        qs_json(&control, &["port", "list", "--json"]),
        before,
        "a refused change changed something"
    );
}

#[test]
fn mac_allow_list_drops_the_generator_until_cleared() {
    let dir = TempDir::new("portsetmac");
    let control = dir.join("control.sock");
    let daemon = DaemonChild::start(dir.path(), "portsetmac", &gen_config(&control), &control);

    wait_stats(&daemon, "forwarding", |s| {
        counter(s, "g2", "tx_packets") > 0
    });
    qs(
        &control,
        &["port", "set", "g1", "--macs", "02:00:00:00:00:09"],
    )
    .assert_ok("set macs");
    // Once the change is in, the generator's frames are dropped and none reach g2.
    let s = wait_stats(&daemon, "drops", |s| {
        drops(s, "g1", "src_mac_not_allowed") > 0
    });
    let tx = counter(&s, "g2", "tx_packets");
    let d = drops(&s, "g1", "src_mac_not_allowed");
    let s = wait_stats(&daemon, "more drops", |s| {
        drops(s, "g1", "src_mac_not_allowed") >= d + 100
    });
    assert_eq!(
        counter(&s, "g2", "tx_packets"),
        tx,
        "forwarded while refused: {s}"
    );

    // The generator's own MAC allowed: forwarding resumes.
    qs(&control, &["port", "set", "g1", "--macs", "none"]).assert_ok("clear macs");
    let s = wait_stats(&daemon, "forwarding again", |s| {
        counter(s, "g2", "tx_packets") >= tx + 100
    });
    let d = drops(&s, "g1", "src_mac_not_allowed");
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        drops(&daemon.stats(), "g1", "src_mac_not_allowed"),
        d,
        "still dropping after clearing"
    );
}
