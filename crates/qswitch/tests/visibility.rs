//! Flow export settings (issue 32): `[switch.ipfix]` and `[switch.sflow]` are checked before
//! anything starts (one line, exit 2, by `qswitch run` and `--check`), and a reload applies
//! them live. The traffic itself is checked against real collectors in `tests/export.rs`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{first_cpu, root_or_skip, run_timeout, Netns, TempDir, QSWITCH};

/// `qswitch run` (and `--check`) of `table` under `[switch]`: exit 2 and one line that
/// contains `want`, nothing started. In namespace `ns` if given.
fn refused(dir: &TempDir, case: &str, table: &str, want: &str, ns: Option<&Netns>) {
    let control = dir.join(&format!("{case}.sock"));
    let path = dir.join(&format!("{case}.toml"));
    std::fs::write(
        &path,
        format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n{table}",
            first_cpu(),
            control.display()
        ),
    )
    .unwrap();
    for check in [false, true] {
        let state = path.with_extension("state");
        let mut args = vec!["run", "--config", path.to_str().unwrap()];
        if check {
            args.push("--check");
        }
        let mut cmd = match ns {
            Some(ns) => {
                let env = format!("STATE_DIRECTORY={}", state.display());
                let mut full = vec!["env", &env, QSWITCH];
                full.extend(&args);
                ns.cmd(&full)
            }
            None => {
                let mut c = Command::new(QSWITCH);
                c.args(&args).env("STATE_DIRECTORY", &state);
                c
            }
        };
        let out = run_timeout(&mut cmd, Duration::from_secs(10));
        out.assert_no_panic();
        assert_eq!(out.code, Some(2), "{case} (check {check}): {out:?}");
        let lines = out.stderr_lines();
        assert_eq!(lines.len(), 1, "{case}: one line: {out:?}");
        assert!(lines[0].contains(want), "{case}: {out:?}");
        assert!(!control.exists(), "{case}: the daemon did not start");
    }
}

#[test]
fn bad_export_settings_are_refused_in_one_line() {
    let dir = TempDir::new("vis-refuse");
    for (case, table, want) in [
        (
            "sampling0",
            "[switch.ipfix]\ncollector = \"127.0.0.1:4739\"\nsampling = 0\n",
            "[switch.ipfix] sampling = 0: must be at least 1",
        ),
        (
            "sflow0",
            "[switch.sflow]\ncollector = \"127.0.0.1:6343\"\nsampling = 0\n",
            "[switch.sflow] sampling = 0: must be at least 1",
        ),
        (
            "noport",
            "[switch.ipfix]\ncollector = \"192.0.2.9\"\n",
            "expected a unicast IP address and UDP port",
        ),
        (
            "name",
            "[switch.sflow]\ncollector = \"collector.example:6343\"\nsampling = 10\n",
            "expected a unicast IP address and UDP port",
        ),
    ] {
        refused(&dir, case, table, want, None);
    }
}

/// A collector this host has no route to (here: a namespace with only loopback, so neither
/// an IPv4 nor an IPv6 collector elsewhere can be reached) is refused before anything
/// starts, not exported to in silence.
#[test]
fn a_collector_the_host_cannot_reach_is_refused() {
    if !root_or_skip() {
        return;
    }
    let dir = TempDir::new("vis-unreach");
    let ns = Netns::new(&format!("qsvis{}", std::process::id()));
    for (case, table) in [
        ("v4", "[switch.ipfix]\ncollector = \"192.0.2.9:4739\"\n"),
        (
            "v6",
            "[switch.sflow]\ncollector = \"[2001:db8::9]:6343\"\nsampling = 100\n",
        ),
    ] {
        refused(&dir, case, table, "this host cannot send to it", Some(&ns));
    }
}

/// A reload of a file that now asks for export starts it, and says nothing is wrong; a bad
/// collector is one line and the rest of the switch is unchanged.
#[test]
fn reload_starts_and_stops_export() {
    let dir = TempDir::new("vis-reload");
    let control = dir.join("control.sock");
    let http = format!("127.0.0.1:{}", 20000 + std::process::id() % 20000);
    let base = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\nhttp = \"{http}\"\n\
         [[port]]\nname = \"a\"\ntype = \"gen\"\n",
        first_cpu(),
        control.display(),
        dir.join("state").display()
    );
    let mut daemon = common::DaemonChild::start(dir.path(), "v", &base, &control);
    let file = dir.join("v.toml");
    let with = base.replace(
        "[[port]]",
        "[switch.sflow]\ncollector = \"127.0.0.1:6343\"\nsampling = 10\n[[port]]",
    );
    std::fs::write(&file, &with).unwrap();
    let out = common::qs(&control, &["reload"]);
    assert!(out.ok(), "{out:?}");
    let metrics = || {
        use std::io::{Read, Write};
        let Ok(mut c) = std::net::TcpStream::connect(&http) else {
            return String::new();
        };
        let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        let req = format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
        let _ = c.write_all(req.as_bytes());
        let mut text = String::new();
        let _ = c.read_to_string(&mut text);
        text
    };
    // Counter samples every 20 s, the first at once: one datagram out.
    assert!(
        common::wait_until(Duration::from_secs(10), || metrics()
            .contains("qswitch_export_datagrams_total{protocol=\"sflow\"} 1")),
        "{}",
        metrics()
    );
    let dump = common::qs(&control, &["config", "dump"]);
    assert!(dump.stdout.contains("[switch.sflow]"), "{dump:?}");
    std::fs::write(&file, &base).unwrap();
    assert!(common::qs(&control, &["reload"]).ok());
    let dump = common::qs(&control, &["config", "dump"]);
    assert!(!dump.stdout.contains("[switch.sflow]"), "{dump:?}");
    assert_eq!(common::port_names(&control), ["a"]);
    assert!(daemon.terminate(Duration::from_secs(10)).is_some());
}

/// `qswitch export ...`: set live, shown, recorded (a restart keeps it), off again; bad
/// values are one line and change nothing.
#[test]
fn export_cli_sets_shows_records_and_turns_off() {
    let dir = TempDir::new("vis-cli");
    let control = dir.join("control.sock");
    let base = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\n\
         [[port]]\nname = \"a\"\ntype = \"gen\"\n",
        first_cpu(),
        control.display(),
        dir.join("state").display()
    );
    let mut daemon = common::DaemonChild::start(dir.path(), "v", &base, &control);
    let show = |control: &std::path::Path| common::qs_json(control, &["export", "show", "--json"]);
    assert!(show(&control)["ipfix"].is_null() && show(&control)["sflow"].is_null());
    let out = common::qs(
        &control,
        &[
            "export",
            "ipfix",
            "set",
            "--collector",
            "127.0.0.1:4739",
            "--sampling",
            "0",
        ],
    );
    assert!(!out.ok() && out.stderr_lines().len() == 1, "{out:?}");
    assert!(
        out.stderr_lines()[0].contains("sampling = 0: must be at least 1"),
        "{out:?}"
    );
    let out = common::qs(
        &control,
        &[
            "export",
            "ipfix",
            "set",
            "--collector",
            "127.0.0.1:4739",
            "--sampling",
            "10",
            "--idle-timeout",
            "5",
        ],
    );
    assert!(out.ok(), "{out:?}");
    let out = common::qs(
        &control,
        &[
            "export",
            "sflow",
            "set",
            "--collector",
            "[::1]:6343",
            "--sampling",
            "100",
        ],
    );
    assert!(out.ok(), "{out:?}");
    let s = show(&control);
    assert_eq!(s["ipfix"]["collector"], "127.0.0.1:4739", "{s}");
    assert_eq!(
        (
            s["ipfix"]["sampling"].as_u64(),
            s["ipfix"]["idle_timeout"].as_u64()
        ),
        (Some(10), Some(5))
    );
    assert_eq!(s["sflow"]["collector"], "[::1]:6343", "{s}");
    let text = common::qs(&control, &["export", "show"]);
    assert!(
        text.stdout
            .contains("ipfix  to 127.0.0.1:4739  sampling 1 in 10"),
        "{text:?}"
    );
    assert!(common::qs(&control, &["config", "dump"])
        .stdout
        .contains("[switch.ipfix]"));
    // Recorded: a restart exports the same.
    assert!(daemon.terminate(Duration::from_secs(10)).is_some());
    let mut daemon = common::DaemonChild::start(dir.path(), "v", &base, &control);
    let s = show(&control);
    assert_eq!(s["ipfix"]["sampling"].as_u64(), Some(10), "{s}");
    assert_eq!(s["sflow"]["sampling"].as_u64(), Some(100), "{s}");
    assert!(common::qs(&control, &["export", "off", "ipfix"]).ok());
    let s = show(&control);
    assert!(s["ipfix"].is_null() && !s["sflow"].is_null(), "{s}");
    assert!(daemon.terminate(Duration::from_secs(10)).is_some());
}
