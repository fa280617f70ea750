//! `qswitch sg` and `qswitch ct` against a running daemon: groups and rules changed live,
//! recorded (state file, `config dump`, restart), reloaded from the file; the conntrack
//! commands answer; bad input is refused in one line. Gen ports only: no root needed.

mod common;

use std::path::Path;

use common::{add_security_group, qs, qs_json, worker_cpus, DaemonChild, TempDir};

fn config(control: &Path, web_rules: &str) -> String {
    format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
         [[security_group]]\nname = \"web\"\nrules = [{web_rules}]\n\
         [[port]]\nname = \"g1\"\ntype = \"gen\"\n\
         [[port]]\nname = \"vm\"\ntype = \"gen\"\nsecurity = {{ ips = [\"10.0.0.5\"] }}\n\
         security_groups = [\"web\"]\n",
        worker_cpus(1),
        control.display(),
    )
}

const WEB: &str = r#"{ direction = "ingress", protocol = "tcp", ports = "80,443" }"#;

/// The one line `qswitch args` fails with; it must contain `want`.
fn refused(control: &Path, args: &[&str], want: &str) {
    let out = qs(control, args);
    out.assert_no_panic();
    assert!(!out.ok(), "{args:?} accepted: {out:?}");
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {out:?}");
    assert!(
        lines[0].contains(want),
        "{args:?}: {:?} lacks {want:?}",
        lines[0]
    );
}

/// The `sg rule add` arguments of an ingress rule with the fields `rest`.
fn ingress_rule<'a>(rest: &[&'a str]) -> Vec<&'a str> {
    [&["--direction", "ingress"], rest].concat()
}

/// `sg rule add db --direction ingress REST` is refused in one line containing `want`.
fn refused_rule(control: &Path, rest: &[&str], want: &str) {
    let args = [&["sg", "rule", "add", "db"][..], &ingress_rule(rest)].concat();
    refused(control, &args, want);
}

fn group(control: &Path, name: &str) -> serde_json::Value {
    let v = qs_json(control, &["sg", "show", name, "--json"]);
    v[0]["group"].clone()
}

#[test]
fn groups_change_live_persist_and_reload_and_ct_answers() {
    let dir = TempDir::new("fwcli");
    let control = dir.join("control.sock");
    let mut d = DaemonChild::start(dir.path(), "f", &config(&control, WEB), &control);

    // The file's group, then live changes.
    let list = qs(&control, &["sg", "list"]);
    list.assert_ok("sg list");
    assert!(
        list.stdout.contains("web") && list.stdout.contains("vm"),
        "{}",
        list.stdout
    );
    add_security_group(
        &control,
        "db",
        &[
            &ingress_rule(&[
                "--protocol",
                "tcp",
                "--ports",
                "5432",
                "--remote-group",
                "web",
            ]),
            &["--direction", "egress"],
        ],
        &[],
    )
    .unwrap_or_else(|e| panic!("{e}"));
    qs(
        &control,
        &["sg", "addresses", "web", "--set", "10.0.0.7,10.0.1.0/24"],
    )
    .assert_ok("sg addresses");
    let db = group(&control, "db");
    assert_eq!(db["rules"].as_array().map(Vec::len), Some(2), "{db}");
    assert_eq!(db["rules"][0]["remote_group"], "web", "{db}");
    assert_eq!(db["rules"][0]["ports"], "5432", "{db}");
    let show = qs(&control, &["sg", "show", "db"]);
    show.assert_ok("sg show");
    assert!(
        show.stdout.contains("0: {") && show.stdout.contains("1: {"),
        "{}",
        show.stdout
    );
    qs(&control, &["sg", "rule", "del", "db", "1"]).assert_ok("rule del");
    assert_eq!(
        group(&control, "db")["rules"].as_array().map(Vec::len),
        Some(1)
    );

    // Bad input: one line each, nothing changed.
    refused(
        &control,
        &["sg", "rule", "add", "nope", "--direction", "egress"],
        "security group 'nope' does not exist",
    );
    refused(
        &control,
        &["sg", "show", "nope"],
        "security group 'nope' does not exist",
    );
    refused_rule(&control, &["--remote", "10.0.0.0/33"], "remote");
    refused_rule(
        &control,
        &["--protocol", "tcp", "--ports", "90-80"],
        "reversed",
    );
    refused_rule(
        &control,
        &["--remote", "10.0.0.0/8", "--remote-group", "web"],
        "exclusive",
    );
    refused_rule(&control, &["--protocol", "300"], "out of range");
    refused_rule(
        &control,
        &["--remote-group", "nope"],
        "unknown remote_group 'nope'",
    );
    refused(&control, &["sg", "rule", "del", "db", "5"], "has no rule 5");
    refused(&control, &["sg", "add", "db"], "already exists");
    refused(
        &control,
        &["sg", "del", "web"],
        "security group 'web' is used by port 'vm'",
    );
    refused(
        &control,
        &["sg", "addresses", "web", "--set", "10.0.0.300"],
        "10.0.0.300",
    );
    refused(
        &control,
        &["ct", "list", "--port", "nope"],
        "port 'nope' does not exist",
    );
    refused(
        &control,
        &["ct", "flush", "--port", "nope"],
        "port 'nope' does not exist",
    );
    assert_eq!(
        group(&control, "db")["rules"].as_array().map(Vec::len),
        Some(1)
    );

    // The conntrack commands answer (vm is filtered; no traffic here: nothing tracked).
    let st = qs_json(&control, &["ct", "stats", "--json"]);
    assert_eq!(st["sessions"], 0, "{st}");
    assert_eq!(st["enabled"], true, "{st}");
    assert_eq!(st["ports"][0]["port"], "vm", "{st}");
    assert!(st["max_sessions"].as_u64() > Some(0), "{st}");
    qs(&control, &["ct", "stats"]).assert_ok("ct stats");
    let l = qs_json(
        &control,
        &["ct", "list", "--port", "g1", "--limit", "10", "--json"],
    );
    assert_eq!(l.as_array().map(Vec::len), Some(0), "{l}");
    qs(&control, &["ct", "list"]).assert_ok("ct list");
    let f = qs(&control, &["ct", "flush", "--port", "g1"]);
    f.assert_ok("ct flush");
    assert!(f.stdout.contains("0 connections ended"), "{}", f.stdout);

    // Recorded: `config dump` has them, and a restart keeps them.
    let dump = qs(&control, &["config", "dump"]);
    dump.assert_ok("config dump");
    assert!(dump.stdout.contains("name = \"db\""), "{}", dump.stdout);
    assert!(dump.stdout.contains("10.0.1.0/24"), "{}", dump.stdout);
    d.child.stop();
    let mut d = DaemonChild::start(dir.path(), "f", &config(&control, WEB), &control);
    let db = group(&control, "db");
    assert_eq!(db["rules"][0]["remote_group"], "web", "{db}");
    let web = group(&control, "web");
    assert_eq!(web["addresses"][1], "10.0.1.0/24", "{web}");

    // A reload applies the file's changed group; the live-added one stays.
    let changed = format!("{WEB}, {{ direction = \"egress\" }}");
    std::fs::write(dir.join("f.toml"), config(&control, &changed)).unwrap();
    let out = qs(&control, &["reload"]);
    out.assert_ok("reload");
    assert!(
        out.stdout.contains("security group web: changed"),
        "{}",
        out.stdout
    );
    let web = group(&control, "web");
    assert_eq!(web["rules"].as_array().map(Vec::len), Some(2), "{web}");
    assert_eq!(
        group(&control, "db")["rules"].as_array().map(Vec::len),
        Some(1)
    );
    qs(&control, &["sg", "del", "db"]).assert_ok("sg del db");
    refused(&control, &["sg", "show", "db"], "does not exist");
    d.child.stop();
}

fn ports_of(control: &Path, group: &str) -> serde_json::Value {
    qs_json(control, &["sg", "show", group, "--json"])[0]["ports"].clone()
}

/// `port set --security-groups`: a port's groups set and removed live, recorded (`config
/// dump`, restart), an unknown group refused in one line; a reload that changes only a
/// port's groups applies them without removing the port.
#[test]
fn port_groups_set_live_persist_and_reload() {
    let dir = TempDir::new("fwpg");
    let control = dir.join("control.sock");
    let mut d = DaemonChild::start(dir.path(), "f", &config(&control, WEB), &control);

    qs(&control, &["port", "set", "g1", "--security-groups", "web"]).assert_ok("port set");
    assert_eq!(ports_of(&control, "web"), serde_json::json!(["g1", "vm"]));
    let st = qs_json(&control, &["ct", "stats", "--json"]);
    let filtered: Vec<&str> = (st["ports"].as_array().unwrap().iter())
        .filter_map(|p| p["port"].as_str())
        .collect();
    assert!(filtered.contains(&"g1"), "{st}");
    refused(
        &control,
        &["port", "set", "g1", "--security-groups", "nope"],
        "unknown security group 'nope'",
    );
    refused(
        &control,
        &["sg", "del", "web"],
        "security group 'web' is used by port",
    );
    assert_eq!(ports_of(&control, "web"), serde_json::json!(["g1", "vm"]));
    let dump = qs(&control, &["config", "dump"]);
    dump.assert_ok("config dump");
    assert_eq!(
        dump.stdout.matches("security_groups = [\"web\"]").count(),
        2,
        "{}",
        dump.stdout
    );

    // A restart keeps them; "" removes them.
    d.child.stop();
    let mut d = DaemonChild::start(dir.path(), "f", &config(&control, WEB), &control);
    assert_eq!(ports_of(&control, "web"), serde_json::json!(["g1", "vm"]));
    qs(&control, &["port", "set", "g1", "--security-groups", ""]).assert_ok("port set ''");
    assert_eq!(ports_of(&control, "web"), serde_json::json!(["vm"]));

    // A reload that takes vm's groups away changes them live: vm stays.
    let text = config(&control, WEB).replace("security_groups = [\"web\"]\n", "");
    std::fs::write(dir.join("f.toml"), text).unwrap();
    let out = qs(&control, &["reload"]);
    out.assert_ok("reload");
    assert!(
        out.stdout.contains("port vm: security groups set"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("removed"), "{}", out.stdout);
    assert_eq!(ports_of(&control, "web"), serde_json::json!([]));
    d.child.stop();
}
