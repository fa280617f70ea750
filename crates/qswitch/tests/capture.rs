//! `qswitch capture` and `qswitch trace` end to end, on gen ports (no root needed): pcapng
//! files and `-w -` read back by tcpdump, frame counts against the port counters, the
//! capture's own drops at full rate, and trace verdicts.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    counter, first_cpu, have_tool, qs, request, require, run_timeout, wait_until, ChildGuard,
    DaemonChild, TempDir, QSWITCH,
};

const SINK2: &str = "[[port]]\nname = \"g2\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\n";
const SINK3: &str = "[[port]]\nname = \"g3\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:03\"\n";

/// The full-rate test saturates both CPUs; run alongside it, the low-rate test's capture
/// thread can be preempted while it holds its ring, and the worker then counts frames as
/// capture drops (by design: it never waits), so `-c 200` of 200 frames would never end.
/// The two tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn tcpdump_or_skip() -> bool {
    require(
        have_tool("tcpdump", &["--version"]),
        "needs tcpdump (apt-get install tcpdump)",
    )
}

fn start(dir: &TempDir, ports: &str) -> DaemonChild {
    let control = dir.join("c.sock");
    let text = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nfdb_aging = 60\n{ports}",
        first_cpu(),
        control.display()
    );
    DaemonChild::start(dir.path(), "qs", &text, &control)
}

/// Adds a generator port `name` (MAC ..:0`n`) sending `count` frames (0: for ever) to
/// `dst` at `rate` frames/s.
fn add_generator(d: &DaemonChild, name: &str, n: u8, dst: &str, rate: u64, count: u64) {
    let line = format!(
        "{{\"request\":\"port-add\",\"port\":{{\"name\":\"{name}\",\"type\":\"gen\",\
         \"mac\":\"02:00:00:00:00:0{n}\",\"generate\":{{\"dst\":\"{dst}\",\"size\":64,\
         \"rate\":{rate},\"count\":{count}}}}}}}\n"
    );
    let v = request(&d.control, line.as_bytes()).expect("port-add");
    assert_eq!(v["response"], "ok", "{v}");
}

/// Starts `qswitch capture args` in the background and waits until the daemon has
/// attached the tap.
fn spawn_capture(d: &DaemonChild, args: &[&str]) -> ChildGuard {
    let before = d.log_text().matches("capture started").count();
    let child = Command::new(QSWITCH)
        .arg("--control")
        .arg(&d.control)
        .arg("capture")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qswitch capture");
    let g = ChildGuard::new(child);
    assert!(
        wait_until(Duration::from_secs(10), || d
            .log_text()
            .matches("capture started")
            .count()
            > before),
        "the capture did not start: {}",
        d.log_text()
    );
    g
}

fn tcpdump_lines(file: &std::path::Path) -> Vec<String> {
    let out = run_timeout(
        Command::new("tcpdump").args(["-nn", "-e", "-r"]).arg(file),
        Duration::from_secs(20),
    );
    out.assert_ok("tcpdump -r");
    out.stdout.lines().map(str::to_string).collect()
}

#[test]
fn capture_to_file_matches_the_port_counters_and_trace_explains() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !tcpdump_or_skip() {
        return;
    }
    let dir = TempDir::new("capture-low");
    let mut d = start(&dir, &format!("{SINK2}{SINK3}"));
    let file = dir.join("g2.pcapng");
    let file_s = file.display().to_string();
    // The capture is attached before any traffic: it must see every frame the port sends.
    let mut cap = spawn_capture(&d, &["g2", "--direction", "tx", "-c", "200", "-w", &file_s]);
    add_generator(&d, "g1", 1, "02:00:00:00:00:02", 1000, 200);
    let Some(st) = cap.wait_timeout(Duration::from_secs(20)) else {
        let stats = qs(&d.control, &["stats", "--json"]).stdout;
        panic!(
            "capture -c 200 did not end by itself; stats: {stats}\ndaemon log:\n{}",
            d.log_text()
        );
    };
    assert!(st.success(), "capture failed: {st}");
    let lines = tcpdump_lines(&file);
    assert_eq!(lines.len(), 200, "{lines:?}");
    assert!(
        lines[0].contains("02:00:00:00:00:01 > 02:00:00:00:00:02"),
        "{}",
        lines[0]
    );
    let stats = d.stats();
    assert_eq!(counter(&stats, "g1", "generated"), 200, "{stats}");
    assert_eq!(counter(&stats, "g2", "tx_packets"), 200, "{stats}");
    assert_eq!(counter(&stats, "g3", "tx_packets"), 200, "{stats}");

    // `-w -` into tcpdump, and the text form, on a steady low-rate stream.
    add_generator(&d, "g4", 4, "02:00:00:00:00:03", 200, 0);
    let out = run_timeout(
        Command::new("sh").arg("-c").arg(format!(
            "{QSWITCH} --control {} capture g3 --direction tx -c 20 --mac 02:00:00:00:00:04 -w - \
             | tcpdump -nn -e -r -",
            d.control.display()
        )),
        Duration::from_secs(30),
    );
    out.assert_ok("capture -w - | tcpdump -r -");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 20, "{out:?}");
    assert!(
        lines.iter().all(|l| l.contains("02:00:00:00:00:04 >")),
        "{out:?}"
    );
    let out = qs(
        &d.control,
        &["capture", "g4", "--direction", "rx", "-c", "5"],
    );
    out.assert_ok("capture (text)");
    assert_eq!(out.stdout.lines().count(), 5, "{out:?}");
    assert!(
        out.stdout
            .contains(" rx q0 02:00:00:00:00:04 > 02:00:00:00:00:03"),
        "{out:?}"
    );
    assert!(out.stderr.contains("5 frames written"), "{out:?}");

    // Trace: a known MAC is unicast to its port, an unknown one floods the VLAN minus the
    // ingress.
    let out = qs(
        &d.control,
        &[
            "trace",
            "--port",
            "g2",
            "--src",
            "02:00:00:00:00:02",
            "--dst",
            "02:00:00:00:00:01",
        ],
    );
    out.assert_ok("trace known");
    assert!(out.stdout.contains("verdict: unicast -> g1"), "{out:?}");
    let out = qs(
        &d.control,
        &[
            "trace",
            "--port",
            "g2",
            "--src",
            "02:00:00:00:00:02",
            "--dst",
            "02:00:00:00:00:77",
            "--ip",
            "10.0.0.1",
            "10.0.0.2",
            "--proto",
            "udp",
            "--json",
        ],
    );
    out.assert_ok("trace unknown");
    let t: serde_json::Value = serde_json::from_str(&out.stdout).expect("trace --json");
    assert_eq!(t["verdict"], "flood", "{t}");
    let mut egress: Vec<&str> = t["egress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["port"].as_str().unwrap())
        .collect();
    egress.sort_unstable();
    assert_eq!(egress, ["g1", "g3", "g4"], "{t}");
    assert_eq!(t["learn"], "new", "{t}");
    // Tracing learned nothing.
    let fdb = qs(&d.control, &["fdb", "--json"]);
    assert!(!fdb.stdout.contains("02:00:00:00:00:02"), "{fdb:?}");
    let out = qs(&d.control, &["trace", "--port", "nope", "--frame", "00"]);
    assert!(!out.ok() && out.stderr.contains("nope"), "{out:?}");
    d.terminate(Duration::from_secs(10));
}

/// Trace on trunks, port security and storm control, through the CLI (text and JSON).
#[test]
fn trace_shows_vlans_security_and_storm() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("trace-policy");
    let ports =
        "[[port]]\nname = \"t\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\nvlans = \"10,20\"\n\
                 [[port]]\nname = \"a10\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:03\"\nvlan = 10\n\
                 [[port]]\nname = \"s\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:04\"\nvlan = 10\n\
                 security = { macs = [\"02:00:00:00:00:04\"] }\nstorm = { broadcast = 100 }\n";
    let mut d = start(&dir, ports);
    let trace = |args: &[&str]| {
        let mut a = vec!["trace"];
        a.extend_from_slice(args);
        let out = qs(&d.control, &a);
        out.assert_ok("trace");
        out.stdout
    };
    // Tagged 10 on the trunk: VLAN 10, flooded untagged to the access ports.
    let out = trace(&[
        "--port",
        "t",
        "--src",
        "02:00:00:00:00:09",
        "--dst",
        "02:00:00:00:00:77",
        "--vlan",
        "10",
    ]);
    assert!(out.contains("VLAN 10: tagged"), "{out}");
    assert!(out.contains("verdict: flood -> a10, s"), "{out}");
    // From the access port: tagged 10 on the trunk.
    let out = trace(&[
        "--port",
        "a10",
        "--src",
        "02:00:00:00:00:09",
        "--dst",
        "02:00:00:00:00:77",
    ]);
    assert!(out.contains("verdict: flood -> s, t (tagged 10)"), "{out}");
    // A VID the trunk does not carry; untagged on a trunk without a native VLAN.
    for vlan in [Some("30"), None] {
        let mut a = vec![
            "--port",
            "t",
            "--src",
            "02:00:00:00:00:09",
            "--dst",
            "02:00:00:00:00:77",
            "--json",
        ];
        a.extend(vlan.iter().flat_map(|v| ["--vlan", v]));
        let t: serde_json::Value = serde_json::from_str(&trace(&a)).expect("trace --json");
        assert_eq!(t["drop_reason"], "vlan_not_allowed", "{t}");
        assert!(t.get("vlan_source").is_none(), "{t}");
    }
    // Port security: a foreign source MAC is refused, the port's own passes, and the
    // broadcast it sends meets the storm limit (bucket full: 32 frames).
    let t: serde_json::Value = serde_json::from_str(&trace(&[
        "--port",
        "s",
        "--src",
        "02:00:00:00:00:05",
        "--dst",
        "ff:ff:ff:ff:ff:ff",
        "--json",
    ]))
    .unwrap();
    assert_eq!(t["drop_reason"], "src_mac_not_allowed", "{t}");
    assert_eq!(t["security"], "source MAC not in macs", "{t}");
    let t: serde_json::Value = serde_json::from_str(&trace(&[
        "--port",
        "s",
        "--src",
        "02:00:00:00:00:04",
        "--dst",
        "ff:ff:ff:ff:ff:ff",
        "--json",
    ]))
    .unwrap();
    assert_eq!(
        (&t["verdict"], &t["security"]),
        (&"flood".into(), &"pass".into()),
        "{t}"
    );
    assert_eq!(t["vlan_source"], "access", "{t}");
    assert_eq!(t["storm"]["class"], "broadcast", "{t}");
    assert_eq!(t["storm"]["limit_pps"], 100, "{t}");
    assert_eq!(t["storm"]["tokens"], 32, "{t}");
    assert_eq!(t["storm"]["admit"], true, "{t}");
    let egress: Vec<(&str, Option<u64>)> = t["egress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["port"].as_str().unwrap(), e["tagged"].as_u64()))
        .collect();
    assert_eq!(egress, [("a10", None), ("t", Some(10))], "{t}");
    d.terminate(Duration::from_secs(10));
}

#[test]
fn at_full_rate_the_capture_drops_in_its_own_ring() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    if !tcpdump_or_skip() {
        return;
    }
    let dir = TempDir::new("capture-full");
    let d = start(&dir, SINK2);
    add_generator(&d, "g1", 1, "02:00:00:00:00:02", 0, 0);
    assert!(wait_until(Duration::from_secs(10), || counter(
        &d.stats(),
        "g2",
        "tx_packets"
    ) > 0));
    let before = counter(&d.stats(), "g2", "tx_packets");
    let file = dir.join("full.pcapng");
    let out = qs(
        &d.control,
        &[
            "capture",
            "g2",
            "-c",
            "3000",
            "-w",
            &file.display().to_string(),
        ],
    );
    out.assert_ok("capture at full rate");
    let after = counter(&d.stats(), "g2", "tx_packets");
    let dropped: u64 = out
        .stderr
        .split("dropped ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no drop count: {out:?}"));
    eprintln!(
        "{}; data path: {} frames during the capture",
        out.stderr.trim(),
        after - before
    );
    assert!(dropped > 0, "the ring never filled at full rate: {out:?}");
    assert!(
        after > before + 3000,
        "the data path kept forwarding: {before} -> {after}"
    );
    assert_eq!(tcpdump_lines(&file).len(), 3000);
}
