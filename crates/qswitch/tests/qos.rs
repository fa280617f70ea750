//! Port QoS end to end: `qos set`/`qos show` and admission control against a daemon with gen
//! ports (no root), weights sharing spare capacity, config checks. The seed-001 scenario is
//! in `qos_seed001.rs` (its own test binary, so nothing else runs beside it).

mod common;

use std::process::Command;
use std::time::Duration;

use common::{first_cpu, qs, qs_json, run_timeout, wait_until, DaemonChild, TempDir, QSWITCH};
use serde_json::Value;

const UPLINK_MAC: &str = "02:00:00:00:00:10";

/// Three flooding gen senders (1514-byte frames toward the uplink) and a gen uplink.
fn gen_config(control: &std::path::Path, capacity: &str, sender_qos: [&str; 3]) -> String {
    let mut s = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\n\
         [[port]]\nname = \"up\"\ntype = \"gen\"\nmac = \"{UPLINK_MAC}\"\ncapacity = \"{capacity}\"\n\
         generate = {{ dst = \"02:00:00:00:00:01\", size = 60, rate = 100 }}\n",
        first_cpu(),
        control.display()
    );
    for (i, q) in sender_qos.iter().enumerate() {
        s.push_str(&format!(
            "\n[[port]]\nname = \"s{}\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:0{}\"\n\
             generate = {{ dst = \"{UPLINK_MAC}\", size = 1514, rate = 0 }}\n{q}\n",
            i + 1,
            i + 1
        ));
    }
    s
}

fn port<'a>(show: &'a Value, name: &str) -> &'a Value {
    show["ports"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no port {name} in {show}"))
}

/// Median of the last `n` one-second rates of `name`, Mbit/s.
fn recent_mbps(show: &Value, name: &str, n: usize) -> f64 {
    let h: Vec<f64> = port(show, name)["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let mut last: Vec<f64> = h[h.len().saturating_sub(n)..].to_vec();
    last.sort_by(f64::total_cmp);
    last[last.len() / 2] / 1e6
}

/// Waits until the daemon has completed `n` more one-second samples.
fn wait_seconds(control: &std::path::Path, n: u64) -> Value {
    let seconds = |s: &Value| s["seconds"].as_u64().unwrap_or(0);
    let start = seconds(&qs_json(control, &["qos", "show", "--json"]));
    let mut last = Value::Null;
    let done = wait_until(Duration::from_secs(2 * n + 4), || {
        last = qs_json(control, &["qos", "show", "--json"]);
        seconds(&last) >= start + n
    });
    assert!(done, "the allocator did not complete {n} seconds");
    last
}

/// Waits `n` seconds, then up to 15 more until the medians of the last `n` one-second rates
/// of s1..s3 satisfy `ok` (a busy machine may need a moment); returns them and the report.
fn settle(control: &std::path::Path, n: usize, ok: &dyn Fn(&[f64]) -> bool) -> (Vec<f64>, Value) {
    let mut show = wait_seconds(control, n as u64 + 1);
    for _ in 0..15 {
        let r: Vec<f64> = ["s1", "s2", "s3"]
            .iter()
            .map(|p| recent_mbps(&show, p, n))
            .collect();
        if ok(&r) {
            return (r, show);
        }
        show = wait_seconds(control, 1);
    }
    let r = ["s1", "s2", "s3"]
        .iter()
        .map(|p| recent_mbps(&show, p, n))
        .collect();
    (r, show)
}

#[test]
fn weights_share_spare_capacity_and_settings_apply_live() {
    let dir = TempDir::new("qos-weights");
    let control = dir.join("control.sock");
    let text = gen_config(
        &control,
        "700M",
        [
            "qos = { weight = 1 }",
            "qos = { weight = 2 }",
            "qos = { weight = 4 }",
        ],
    );
    let d = DaemonChild::start(dir.path(), "qos", &text, &control);
    let weights_ok = |r: &[f64]| {
        let sum: f64 = r.iter().sum();
        (r[1] / r[0] - 2.0).abs() <= 0.1
            && (r[2] / r[0] - 4.0).abs() <= 0.2
            && (0.95 * 700.0..=1.02 * 700.0).contains(&sum)
    };
    let (r, _) = settle(&control, 3, &weights_ok);
    eprintln!("weights 1:2:4 on 700M: {r:?} Mbit/s");
    assert!(weights_ok(&r), "{r:?}");
    // Floods are throttled by back-pressure, not dropped.
    let stats = d.stats();
    for p in stats["ports"].as_array().expect("ports") {
        assert!(p["drops"].get("tx_full").is_none(), "{p}");
    }

    // A guarantee and a limit, live: s1 gets its 400M floor, s3 is capped at 100M, s2
    // takes the rest.
    qs(&control, &["qos", "set", "s1", "--min", "400M"]).assert_ok("qos set s1");
    qs(&control, &["qos", "set", "s3", "--max", "100M"]).assert_ok("qos set s3");
    let live_ok = |r: &[f64]| {
        r[0] >= 0.95 * 400.0 && r[2] <= 1.02 * 100.0 && r[2] >= 0.9 * 100.0 && r[1] >= 0.9 * 200.0
    };
    let (r, show) = settle(&control, 2, &live_ok);
    eprintln!("s1 min 400M, s3 max 100M: {r:?} Mbit/s");
    assert!(live_ok(&r), "{r:?}");
    assert_eq!(port(&show, "s1")["min"], 400_000_000u64);
    assert_eq!(port(&show, "s3")["max"], 100_000_000u64);
    assert_eq!(port(&show, "s2")["uplink"], "up");
    assert_eq!(port(&show, "up")["capacity"], 700_000_000u64);

    // The table form names every port.
    let out = qs(&control, &["qos", "show"]);
    out.assert_ok("qos show");
    for n in ["up", "s1", "s2", "s3", "cap 700M", "400M"] {
        assert!(out.stdout.contains(n), "{n}: {}", out.stdout);
    }
}

#[test]
fn admission_control_refuses_and_changes_nothing() {
    let dir = TempDir::new("qos-admit");
    let control = dir.join("control.sock");
    let text = gen_config(&control, "1G", ["qos = { min = \"300M\" }", "", ""]);
    let _d = DaemonChild::start(dir.path(), "qos", &text, &control);
    qs(&control, &["qos", "set", "s2", "--min", "600M"]).assert_ok("600M fits (900M total)");
    let before = qs_json(&control, &["qos", "show", "--json"]);
    let refuse = |args: &[&str], needle: &str| {
        let out = qs(&control, args);
        assert_eq!(out.code, Some(1), "{args:?}: {out:?}");
        let lines = out.stderr_lines();
        assert_eq!(lines.len(), 1, "{out:?}");
        assert!(lines[0].contains(needle), "{needle}: {out:?}");
    };
    refuse(
        &["qos", "set", "s3", "--min", "1M"],
        "would add up to 901M, above reservable 0.9 x capacity 1G = 900M",
    );
    refuse(&["qos", "set", "s1", "--min", "301M"], "nothing changed");
    refuse(
        &["qos", "set", "s1", "--max", "100M"],
        "min 300M is above max 100M",
    );
    refuse(
        &["qos", "set", "s1", "--weight", "0"],
        "weight = 0 is out of range",
    );
    refuse(&["qos", "set", "up", "--min", "1M"], "is an uplink");
    refuse(&["qos", "set", "nope", "--min", "1M"], "does not exist");
    let out = qs(&control, &["qos", "set", "s1", "--min", "lots"]);
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("is not a rate"), "{out:?}");
    let after = qs_json(&control, &["qos", "show", "--json"]);
    for n in ["s1", "s2", "s3"] {
        for k in ["min", "max", "weight"] {
            assert_eq!(port(&before, n)[k], port(&after, n)[k], "{n}.{k}");
        }
    }
    // Lowering one guarantee makes room for another; --clear resets.
    qs(&control, &["qos", "set", "s2", "--min", "0"]).assert_ok("min 0");
    qs(
        &control,
        &["qos", "set", "s3", "--min", "500M", "--weight", "3"],
    )
    .assert_ok("s3");
    qs(&control, &["qos", "set", "s1", "--clear"]).assert_ok("clear");
    let show = qs_json(&control, &["qos", "show", "--json"]);
    assert_eq!(port(&show, "s1")["min"], Value::Null);
    assert_eq!(port(&show, "s1")["weight"], 1);
    assert_eq!(port(&show, "s3")["min"], 500_000_000u64);
    assert_eq!(port(&show, "s3")["weight"], 3);
}

#[test]
fn qos_config_errors_are_one_line() {
    let dir = TempDir::new("qos-config");
    let control = dir.join("control.sock");
    for (case, text, needle) in [
        (
            "over",
            gen_config(
                &control,
                "1G",
                ["qos = { min = \"500M\" }", "qos = { min = \"500M\" }", ""],
            ),
            "add up to 1G, above reservable 0.9",
        ),
        (
            "badrate",
            gen_config(&control, "1Q", ["", "", ""]),
            "capacity: '1Q' is not a rate",
        ),
        (
            "minmax",
            gen_config(
                &control,
                "1G",
                ["qos = { min = \"200M\", max = \"100M\" }", "", ""],
            ),
            "min 200M is above max 100M",
        ),
        (
            "unknown",
            gen_config(&control, "1G", ["qos = { minimum = \"200M\" }", "", ""]),
            "minimum",
        ),
        (
            "reservable",
            gen_config(&control, "1G", ["", "", ""])
                .replace("[switch]\n", "[switch]\nreservable = 1.5\n"),
            "reservable = 1.5 is out of range",
        ),
    ] {
        let path = dir.join(&format!("{case}.toml"));
        std::fs::write(&path, text).expect("write config");
        let out = run_timeout(
            Command::new(QSWITCH)
                .args(["run", "--config"])
                .arg(&path)
                .env("STATE_DIRECTORY", path.with_extension("state")),
            Duration::from_secs(10),
        );
        assert_eq!(out.code, Some(2), "{case}: {out:?}");
        let lines = out.stderr_lines();
        assert_eq!(lines.len(), 1, "{case}: {out:?}");
        assert!(lines[0].contains(needle), "{case}: {needle}: {out:?}");
    }
}
