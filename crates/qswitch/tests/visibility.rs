//! Flow export settings (issue 32): `[switch.ipfix]` and `[switch.sflow]` parse and are
//! checked, but export is not wired to the data path yet, so `qswitch run` (and `--check`)
//! refuse a configuration that asks for it with one line, rather than run without it; so
//! does a reload.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{first_cpu, run_timeout, TempDir, QSWITCH};

#[test]
fn run_refuses_export_it_cannot_do_yet() {
    let dir = TempDir::new("vis-refuse");
    for (case, table) in [
        (
            "ipfix",
            "[switch.ipfix]\ncollector = \"127.0.0.1:4739\"\nsampling = 1\n",
        ),
        (
            "sflow",
            "[switch.sflow]\ncollector = \"127.0.0.1:6343\"\nsampling = 100\n",
        ),
        (
            "bad",
            "[switch.ipfix]\ncollector = \"127.0.0.1:4739\"\nsampling = 0\n",
        ),
    ] {
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
        let want = if case == "bad" {
            "sampling = 0: must be at least 1".to_string()
        } else {
            format!("[switch.{case}]: flow export is not wired to the data path yet")
        };
        for check in [false, true] {
            let mut cmd = Command::new(QSWITCH);
            cmd.args(["run", "--config"])
                .arg(&path)
                .env("STATE_DIRECTORY", path.with_extension("state"));
            if check {
                cmd.arg("--check");
            }
            let out = run_timeout(&mut cmd, Duration::from_secs(10));
            out.assert_no_panic();
            assert_eq!(out.code, Some(2), "{case} (check {check}): {out:?}");
            let lines = out.stderr_lines();
            assert_eq!(lines.len(), 1, "{case}: one line: {out:?}");
            assert!(lines[0].contains(&want), "{case}: {out:?}");
            assert!(!control.exists(), "{case}: the daemon did not start");
        }
    }
}

/// A reload of a file that now asks for export changes nothing and says why in one line.
#[test]
fn reload_refuses_export_it_cannot_do_yet() {
    let dir = TempDir::new("vis-reload");
    let control = dir.join("control.sock");
    let base = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\n\
         [[port]]\nname = \"a\"\ntype = \"gen\"\n",
        first_cpu(),
        control.display(),
        dir.join("state").display()
    );
    let mut daemon = common::DaemonChild::start(dir.path(), "v", &base, &control);
    let file = dir.join("v.toml");
    std::fs::write(
        &file,
        base.replace(
            "[[port]]",
            "[switch.sflow]\ncollector = \"127.0.0.1:6343\"\nsampling = 10\n\
             [[port]]\nname = \"b\"\ntype = \"gen\"\n[[port]]",
        ),
    )
    .unwrap();
    let out = common::qs(&control, &["reload"]);
    assert!(!out.ok(), "{out:?}");
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{out:?}");
    assert!(
        lines[0].contains("[switch.sflow]: flow export is not wired")
            && lines[0].contains("nothing changed"),
        "{out:?}"
    );
    assert_eq!(common::port_names(&control), ["a"], "nothing changed");
    assert!(daemon.terminate(Duration::from_secs(10)).is_some());
}
