//! `qswitch bond show [NAME] [--json]` and `qswitch bond set NAME --active MEMBER` against a
//! running daemon (root only): an active-backup bond of two veth members whose peers are
//! up in a namespace this test creates. Both members come up; `bond show` (text and JSON)
//! shows the mode, both members and the active one; `bond set --active` moves the active
//! member to the other and `bond show` says so; an unknown member, and an unknown bond, are
//! one-line errors that change nothing. The bond has `capacity`: `qos show` says how many
//! members are up, also after the backup member's link goes down. Namespace and veths are removed on drop, also on
//! failure.

mod common;

use std::time::Duration;

use common::{
    qs, qs_json, root_or_skip, sh_ok, wait_until, worker_cpus, DaemonChild, LinkGuard, Netns,
    TempDir,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn bond_show_and_set_active_from_the_cli() {
    if !root_or_skip() {
        return;
    }
    let pid = std::process::id();
    let dir = TempDir::new("bond-cli");
    let ns = Netns::new(&format!("qs-bondcli-{pid}"));
    let if0 = format!("qc{}a", pid % 1_000_000);
    let if1 = format!("qc{}b", pid % 1_000_000);
    let mut links = Vec::new();
    for (ifname, peer) in [(&if0, "eth0"), (&if1, "eth1")] {
        sh_ok(&[
            "ip", "link", "add", ifname, "type", "veth", "peer", "name", peer, "netns", &ns.name,
        ]);
        links.push(LinkGuard(ifname.to_string()));
        ns.ok(&["ip", "link", "set", "dev", peer, "up"]);
        sh_ok(&["ip", "link", "set", "dev", ifname, "up"]);
    }

    let control = dir.join("control.sock");
    let config = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"bond0\"\ntype = \"bond\"\nmode = \"active-backup\"\n\
         capacity = \"1G\"\n\
         members = [ {{ type = \"veth\", ifname = \"{if0}\" }}, \
         {{ type = \"veth\", ifname = \"{if1}\" }} ]\n",
        worker_cpus(2),
        control.display()
    );
    let _daemon = DaemonChild::start(dir.path(), "qswitch", &config, &control);

    let show = || -> Value {
        let all = qs_json(&control, &["bond", "show", "bond0", "--json"]);
        assert_eq!(all.as_array().map(Vec::len), Some(1), "{all}");
        all[0].clone()
    };
    let mut b = Value::Null;
    let up = wait_until(WAIT, || {
        b = show();
        b["members"]
            .as_array()
            .is_some_and(|m| m.len() == 2 && m.iter().all(|m| m["enabled"] == true))
            && b["active"].is_string()
    });
    assert!(up, "both members never came up: {b}");
    assert_eq!(b["name"], "bond0", "{b}");
    assert_eq!(b["mode"], "active-backup", "{b}");
    assert_eq!(b["members"][0]["name"], if0.as_str(), "{b}");
    assert_eq!(b["members"][1]["name"], if1.as_str(), "{b}");
    for m in b["members"].as_array().unwrap() {
        assert_eq!(m["carrier"], true, "{b}");
    }

    // The text form: the bond's line and a row per member.
    let text = qs(&control, &["bond", "show"]);
    text.assert_ok("bond show");
    assert!(
        text.stdout.contains("bond bond0: mode active-backup"),
        "{}",
        text.stdout
    );
    for ifname in [&if0, &if1] {
        assert!(
            text.stdout
                .lines()
                .any(|l| l.trim_start().starts_with(ifname.as_str())),
            "no row for {ifname}: {}",
            text.stdout
        );
    }

    // Move the active member to the other one.
    let active = b["active"].as_str().unwrap().to_string();
    let other = if active == if0 { &if1 } else { &if0 };
    qs(&control, &["bond", "set", "bond0", "--active", other]).assert_ok("bond set --active");
    let moved = wait_until(WAIT, || {
        b = show();
        b["active"] == other.as_str()
    });
    assert!(moved, "active member is not {other}: {b}");

    // An unknown member and an unknown bond: one-line errors, nothing changes.
    let e = qs(&control, &["bond", "set", "bond0", "--active", "nosuch0"]);
    assert!(!e.ok(), "bond set to an unknown member succeeded");
    let lines = e.stderr_lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("nosuch0"), "{lines:?}");
    assert_eq!(show()["active"], other.as_str());
    let e = qs(&control, &["bond", "show", "nosuch0"]);
    assert!(!e.ok(), "bond show of an unknown bond succeeded");
    assert_eq!(e.stderr_lines().len(), 1, "{:?}", e.stderr_lines());

    // QoS: the bond uplink (capacity 1G) shares the capacity of its members up; `qos show`
    // says how many are up. The backup member's link goes down: 1 of 2, 500M.
    let qos = || -> Value {
        let r = qs_json(&control, &["qos", "show", "--json"]);
        r["ports"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "bond0").cloned())
            .unwrap_or(Value::Null)
    };
    let mut q = Value::Null;
    assert!(
        wait_until(WAIT, || {
            q = qos();
            q["bond_members_up"] == serde_json::json!([2, 2])
        }),
        "qos show: {q}"
    );
    sh_ok(&["ip", "link", "set", "dev", &active, "down"]);
    assert!(
        wait_until(WAIT, || {
            q = qos();
            q["bond_members_up"] == serde_json::json!([1, 2])
        }),
        "qos show after a member went down: {q}"
    );
    assert_eq!(q["capacity"], 1_000_000_000u64, "{q}");
    let text = qs(&control, &["qos", "show"]);
    text.assert_ok("qos show");
    assert!(text.stdout.contains("cap 500M (1/2 up)"), "{}", text.stdout);
}
