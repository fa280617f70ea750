//! `qswitch load` on loopback (no privileges), and a short run of the `bypass`, `affinity`,
//! `multiqueue`, `tap-tcp` (two queues per TAP, and its references), `uplink`, `pvp` (its three
//! contenders, both load shapes; and with `--firewall`, its two more under `--new-flows` and
//! `--flows`), `fw-scale`, `cni` and `bond` bench scenarios (root): each writes its JSON with
//! per-second records and a summary, and an SVG, and leaves no namespace (nor DPDK runtime
//! directory) behind. Timings are never asserted.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use serde_json::Value;

/// The pvp tests each start OVS-DPDK, testpmd and the DPDK load pinned to CPUs 0 and 1: one
/// at a time (the test harness runs tests of this file on two threads).
static PVP: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pvp_alone() -> std::sync::MutexGuard<'static, ()> {
    PVP.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn load_generator_on_loopback() {
    let addr = qswitch_test_support::free_tcp_addr();
    let server = Command::new(QSWITCH)
        .args(["load", "server", "--listen", &addr.to_string()])
        .spawn()
        .unwrap();
    let _server = ChildGuard::new(server);
    assert!(wait_until(Duration::from_secs(5), || {
        std::net::TcpStream::connect(addr).is_ok()
    }));
    for args in [
        &["rr", "--size", "64"][..],
        &["files", "--size", "100000", "--parallel", "2"][..],
    ] {
        let out = run_timeout(
            Command::new(QSWITCH).arg("load").args(args).args([
                "--connect",
                &addr.to_string(),
                "--seconds",
                "1",
            ]),
            CMD_TIMEOUT,
        );
        out.assert_ok("load client");
        let v: Value = serde_json::from_str(out.stdout.trim()).unwrap();
        assert!(v["total"].as_u64().unwrap() > 0, "{v}");
        assert_eq!(v["per_second"].as_array().unwrap().len(), 1);
    }
    let out = run_timeout(
        Command::new(QSWITCH).args(["load", "rr", "--connect", "127.0.0.1:1", "--seconds", "1"]),
        CMD_TIMEOUT,
    );
    out.assert_no_panic();
    assert_eq!(out.code, Some(1), "{out:?}");
    // The relay wants two TAPs: one line saying so, before it opens anything.
    let out = run_timeout(
        Command::new(QSWITCH).args(["load", "relay", "--tap", "qsrelay-x"]),
        CMD_TIMEOUT,
    );
    out.assert_no_panic();
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr.contains("exactly two --tap interfaces, got 1"),
        "{out:?}"
    );
}

/// The network namespaces whose name ends in `-PID` (what a bench run as `pid` made).
fn namespaces_of(pid: u32) -> Vec<String> {
    namespaces()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.ends_with(&format!("-{pid}")))
        })
        .map(String::from)
        .collect()
}

fn namespaces() -> String {
    sh(&["ip", "netns", "list"]).stdout
}

/// A finished `qswitch bench` run: what it printed, its JSON report and SVG, and its pid
/// (the suffix of the namespaces and interfaces it made).
struct BenchRun {
    stdout: String,
    json: Value,
    svg: String,
    pid: u32,
}

/// Runs `qswitch bench ARGS --out OUT` (`ARGS[0]` the scenario; its stdout in
/// `OUT/SCENARIO.out`) for up to `timeout`, and checks what every run must do: exit 0
/// without a panic, and write `OUT/SCENARIO.json` and an SVG `OUT/SCENARIO.svg`.
fn run_bench(args: &[&str], out: &Path, timeout: Duration) -> BenchRun {
    let scenario = args[0];
    std::fs::create_dir_all(out).unwrap();
    let log = out.join(format!("{scenario}.out"));
    let child = Command::new(QSWITCH)
        .arg("bench")
        .args(args)
        .arg("--out")
        .arg(out)
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child = ChildGuard::new(child);
    let pid = child.pid();
    let status = child.wait_timeout(timeout);
    let stdout = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.is_some_and(|s| s.success()),
        "{scenario}: {status:?} {stdout}"
    );
    assert!(!stdout.contains("panicked"), "{stdout}");
    let text = std::fs::read_to_string(out.join(format!("{scenario}.json"))).unwrap();
    let json: Value = serde_json::from_str(&text).unwrap();
    let svg = std::fs::read_to_string(out.join(format!("{scenario}.svg"))).unwrap();
    assert!(svg.starts_with("<svg"), "{scenario}");
    BenchRun {
        stdout,
        json,
        svg,
        pid,
    }
}

#[test]
fn bypass_affinity_multiqueue_tap_tcp_write_results() {
    if !root_or_skip() || !cpus_or_skip(2) {
        return;
    }
    let dir = TempDir::new("bench-scen");
    for (scenario, contenders, extra) in [
        ("bypass", 4, &[][..]),
        ("affinity", 7, &[]),
        ("multiqueue", 2, &[]),
        ("tap-tcp", 5, &["--queues", "2", "--streams", "2"]),
    ] {
        let args = [&[scenario, "--runs", "1", "--seconds", "2"][..], extra].concat();
        let BenchRun {
            stdout,
            json,
            svg,
            pid,
        } = run_bench(&args, dir.path(), Duration::from_secs(180));
        assert!(stdout.contains(&format!("RESULT {scenario} ")), "{stdout}");
        let runs = json["runs"].as_array().unwrap();
        assert_eq!(runs.len(), contenders, "{scenario}");
        assert!(
            runs.iter()
                .all(|r| !r["samples"].as_array().unwrap().is_empty()),
            "{scenario}"
        );
        assert_eq!(json["summary"].as_array().unwrap().len(), contenders);
        assert!(!svg.contains("NaN"), "{scenario}");
        let left = namespaces_of(pid);
        assert!(left.is_empty(), "{scenario} left namespaces {left:?}");
    }
    // tap-tcp's qswitch contender ran with two queues per TAP.
    let tap_tcp: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tap-tcp.json")).unwrap()).unwrap();
    assert_eq!(tap_tcp["config"]["queues"], 2, "{}", tap_tcp["config"]);
    assert_eq!(
        tap_tcp["config"]["qswitch_port_queues"], 2,
        "the daemon's TAP port: {}",
        tap_tcp["config"]
    );
    // The references ran and are compared: qswitch / tap-relay, tap-relay and tc-redirect /
    // the bridge; in affinity, each same-CPU contender / the bridge on one CPU.
    let of = |v: &Value, key: &str| -> Vec<String> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["of"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        of(&tap_tcp, "references"),
        [
            "qswitch / tap-relay",
            "tap-relay / linux-bridge",
            "tc-redirect / linux-bridge",
            "qswitch-veth / linux-bridge"
        ]
    );
    let affinity: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("affinity.json")).unwrap()).unwrap();
    assert_eq!(
        affinity["advice"].as_array().unwrap().len(),
        2,
        "{affinity}"
    );
    assert_eq!(
        of(&affinity, "ratios"),
        [
            "qswitch same-cpu / bridge same-cpu",
            "tap-relay same-cpu / bridge same-cpu",
            "tc-redirect same-cpu / bridge same-cpu",
            "qswitch-veth same-cpu / bridge same-cpu"
        ]
    );
}

/// `bench uplink`, native and bridge only, one short round: the TCP runs (1 and 4 streams) and
/// the 64 B runs with the testpmd generator, which says what it is and what it offered.
#[test]
fn uplink_native_and_bridge_write_results() {
    if !root_or_skip() || !cpus_or_skip(2) {
        return;
    }
    let dir = TempDir::new("bench-uplink");
    let BenchRun {
        stdout, json, pid, ..
    } = run_bench(
        &[
            "uplink",
            "--runs",
            "1",
            "--seconds",
            "2",
            "--only",
            "native-,bridge-",
        ],
        dir.path(),
        Duration::from_secs(240),
    );
    assert!(
        stdout.contains("RESULT uplink qswitch-native-64B mpps="),
        "{stdout}"
    );
    assert!(stdout.contains("RESULT uplink pps_generator="), "{stdout}");
    assert_eq!(json["runs"].as_array().unwrap().len(), 4, "{json}");
    let pps = json["pps_runs"].as_array().unwrap();
    assert_eq!(pps.len(), 2, "{json}");
    for r in pps {
        assert!(r["offered_mpps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["mpps"].as_f64().unwrap() > 0.0, "{r}");
        assert!(!r["samples"].as_array().unwrap().is_empty(), "{r}");
    }
    assert!(
        json["config"]["pps_generator"]
            .as_str()
            .unwrap()
            .contains("net_af_xdp"),
        "{json}"
    );
    assert_eq!(json["pps_ratios"].as_array().unwrap().len(), 1, "{json}");
    let left = namespaces_of(pid);
    assert!(left.is_empty(), "left namespaces {left:?}");
    let dpdk: Vec<String> = std::fs::read_dir("/var/run/dpdk")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("qsbench-up-{pid}-")))
                .collect()
        })
        .unwrap_or_default();
    assert!(dpdk.is_empty(), "left DPDK runtime dirs {dpdk:?}");
}

/// `bench bond`, one short round: a balance-slb bond of two afxdp members against one member,
/// 1 and 4 streams, the ratios, each bond run's member shares (4 VM MACs spread over both
/// members), and nothing left behind (namespaces, veths, the run's directory).
#[test]
fn bond_writes_results() {
    if !root_or_skip() || !cpus_or_skip(2) {
        return;
    }
    let dir = TempDir::new("bench-bond");
    let BenchRun {
        stdout, json, pid, ..
    } = run_bench(
        &["bond", "--runs", "1", "--seconds", "1"],
        dir.path(),
        Duration::from_secs(180),
    );
    for s in [1, 4] {
        assert!(
            stdout.contains(&format!(
                "RESULT bond bond-2-{s}/one-member-{s} gbps_ratio="
            )),
            "{stdout}"
        );
    }
    assert!(
        stdout.contains("RESULT bond bond-2-4 member_rx_share="),
        "{stdout}"
    );
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{json}");
    assert!(runs
        .iter()
        .all(|r| !r["samples"].as_array().unwrap().is_empty()));
    for s in json["spreads"].as_array().unwrap() {
        let (name, members) = (
            s["contender"].as_str().unwrap(),
            s["members"].as_array().unwrap(),
        );
        let streams = if name.ends_with("-4") { 4 } else { 1 };
        assert_eq!(s["stream_gbps"].as_array().unwrap().len(), streams, "{s}");
        match name {
            "bond-2-4" => {
                assert_eq!(members.len(), 2, "{s}");
                // Four VM MACs, two per member: each member carries some of the traffic.
                assert!(
                    members
                        .iter()
                        .all(|m| m["rx_packets"].as_u64().unwrap() > 0),
                    "{s}"
                );
            }
            "bond-2-1" => assert_eq!(members.len(), 2, "{s}"),
            _ => assert!(members.is_empty(), "{s}"),
        }
    }
    let left = namespaces_of(pid);
    assert!(left.is_empty(), "left namespaces {left:?}");
    let n = pid % 10_000;
    for m in 0..2 {
        let veth = format!("/sys/class/net/qsbdU{m}{n}");
        assert!(
            !std::path::Path::new(&veth).exists(),
            "left the veth {veth}"
        );
    }
}

/// `bench pvp`, one short round with the defaults: every contender (qswitch, OVS-DPDK,
/// testpmd io between the same two vhost-user sockets) under both load shapes (`pools` 1 and
/// 2), and qswitch's ratio to testpmd io printed beside its ratio to OVS-DPDK. The figures
/// are not looked at (a loaded machine); only that each contender and ratio is there.
#[test]
fn pvp_compares_with_ovs_and_testpmd_io_under_both_loads() {
    if !root_or_skip() || !cpus_or_skip(2) {
        return;
    }
    let _alone = pvp_alone();
    let dir = TempDir::new("bench-pvp");
    let BenchRun {
        stdout, json, pid, ..
    } = run_bench(
        &["pvp", "--runs", "1", "--seconds", "1"],
        dir.path(),
        Duration::from_secs(900),
    );
    assert!(
        !stdout.contains("skipped"),
        "every contender runs: {stdout}"
    );
    let summary = json["summary"].as_array().unwrap();
    for contender in ["qswitch", "ovs-dpdk", "testpmd-io"] {
        for size in [64, 1518] {
            for pools in [1, 2] {
                let line = format!("RESULT pvp {contender} size={size} pools={pools} mpps=");
                assert!(stdout.contains(&line), "{line}: {stdout}");
                assert!(
                    summary.iter().any(|s| s["contender"] == contender
                        && s["frame_size"] == size
                        && s["load_pools"] == pools),
                    "{contender} {size} B {pools} pool(s): {json}"
                );
            }
        }
    }
    // A ratio to each peer that moved frames, in the table and the RESULT lines.
    for s in summary.iter().filter(|s| s["contender"] != "qswitch") {
        let moved = s["mpps_median"].as_f64().unwrap() > 0.0
            && s["mpps_per_cpu_s_median"].as_f64().unwrap() > 0.0;
        let of = format!("qswitch / {}", s["contender"].as_str().unwrap());
        let ratio = json["ratio"].as_array().unwrap().iter().any(|r| {
            r["of"] == of.as_str()
                && r["frame_size"] == s["frame_size"]
                && r["load_pools"] == s["load_pools"]
        });
        assert_eq!(ratio, moved, "{of}: {s} {json}");
    }
    for r in json["ratio"].as_array().unwrap() {
        let of = r["of"].as_str().unwrap();
        assert!(stdout.contains(&format!("ratio {of}")), "{of}: {stdout}");
    }
    let dpdk: Vec<String> = std::fs::read_dir("/var/run/dpdk")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.contains(&pid.to_string()))
                .collect()
        })
        .unwrap_or_default();
    assert!(dpdk.is_empty(), "left DPDK runtime dirs {dpdk:?}");
}

/// `bench pvp --firewall --new-flows`, one short round: the five contenders (qswitch-fw
/// and ovs-dpdk-ct beside the three) at 64 B, one pool, every frame a new connection; the
/// firewall contenders' connection counts in each run's `ct`, the firewall's ratios where
/// both sides moved frames. Then `--flows 10000` for qswitch-fw alone: 10 000 connections,
/// one entry each (both ports' zones share it). Figures are not looked at.
#[test]
fn pvp_firewall_contenders_new_flows_and_flows() {
    if !root_or_skip() || !cpus_or_skip(2) {
        return;
    }
    let _alone = pvp_alone();
    let dir = TempDir::new("bench-pvp-fw");
    let run = |extra: &[&str], name: &str| {
        let args = [
            &["pvp", "--firewall", "--runs", "1", "--seconds", "1"][..],
            extra,
        ]
        .concat();
        run_bench(&args, &dir.join(name), Duration::from_secs(600))
    };

    let BenchRun {
        stdout, json, pid, ..
    } = run(&["--new-flows"], "new");
    assert!(
        !stdout.contains("skipped"),
        "every contender runs: {stdout}"
    );
    let contenders = [
        "qswitch",
        "ovs-dpdk",
        "testpmd-io",
        "qswitch-fw",
        "ovs-dpdk-ct",
    ];
    for c in contenders {
        let line = format!("RESULT pvp {c} size=64 pools=1 mpps=");
        assert!(stdout.contains(&line), "{line}: {stdout}");
    }
    assert!(
        !stdout.contains("size=1518"),
        "--new-flows: 64 B only: {stdout}"
    );
    for r in json["runs"].as_array().unwrap() {
        let fw = r["contender"] == "qswitch-fw" || r["contender"] == "ovs-dpdk-ct";
        assert_eq!(r["ct"].is_object(), fw, "{r}");
        if fw {
            assert!(r["ct"]["flows_sent"].as_u64().unwrap() > 0, "{r}");
        }
    }
    let summary = json["summary"].as_array().unwrap();
    let moved = |c: &str| {
        summary
            .iter()
            .any(|s| s["contender"] == c && s["mpps_median"].as_f64().unwrap() > 0.0)
    };
    for (a, b) in [
        ("qswitch-fw", "qswitch"),
        ("qswitch-fw", "ovs-dpdk-ct"),
        ("ovs-dpdk-ct", "ovs-dpdk"),
    ] {
        let of = format!("{a} / {b}");
        let there = json["ratio"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["of"] == of.as_str());
        assert_eq!(there, moved(a) && moved(b), "{of}: {json}");
    }
    assert!(namespaces_of(pid).is_empty());

    let BenchRun { stdout, json, .. } = run(&["--flows", "10000", "--only", "qswitch-fw"], "flows");
    assert!(
        stdout.contains("RESULT pvp qswitch-fw size=1518 pools=2"),
        "{stdout}"
    );
    let first = &json["runs"][0]["ct"];
    assert_eq!(first["flows_sent"], 10000, "{json}");
    assert_eq!(first["refused"], 0, "{json}");
    assert_eq!(
        first["sessions_after"], 10000,
        "one entry per connection, both ports' zones in it: {json}"
    );
}

/// `bench fw-scale`, one short round with 1000 connections: the firewall on and off, 1 and 2
/// workers, both ratios and the acceptance line; the firewall passes every frame both ways
/// (nothing lost).
#[test]
fn fw_scale_writes_results() {
    if !root_or_skip() || !cpus_or_skip(2) {
        return;
    }
    let dir = TempDir::new("bench-fw-scale");
    let BenchRun { stdout, json, .. } = run_bench(
        &[
            "fw-scale",
            "--runs",
            "1",
            "--seconds",
            "1",
            "--flows",
            "1000",
        ],
        dir.path(),
        Duration::from_secs(120),
    );
    for c in [
        "fw-1-worker",
        "fw-2-workers",
        "off-1-worker",
        "off-2-workers",
    ] {
        assert!(
            stdout.contains(&format!("RESULT fw-scale {c} mpps=")),
            "{stdout}"
        );
    }
    assert!(stdout.contains("RESULT fw-scale ratio="), "{stdout}");
    assert!(
        stdout.contains("RESULT fw-scale ratio_off-2-workers="),
        "{stdout}"
    );
    assert!(stdout.contains("acceptance: ratio"), "{stdout}");
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 4, "{json}");
    for r in results {
        assert!(r["mpps"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["lost"], 0, "{r}");
    }
    assert_eq!(json["more_ratios"].as_array().unwrap().len(), 1, "{json}");
}

/// `bench cni`, one short round: pods attached with cnitool to qswitch-cni and to the
/// reference bridge plugin, 1 and 4 streams, the ratios, and nothing left behind (namespaces,
/// the bridge plugin's bridge, host-local's store is in the run's directory).
#[test]
fn cni_writes_results() {
    let plugin = std::path::Path::new(QSWITCH).with_file_name("qswitch-cni");
    if !root_or_skip()
        || !cpus_or_skip(2)
        || !require(
            plugin.is_file(),
            "no qswitch-cni beside qswitch (cargo build --release -p qswitch-cni)",
        )
        || !require(
            have_tool("cnitool", &["--help"]),
            "no cnitool (go install github.com/containernetworking/cni/cnitool@v1.3.1)",
        )
    {
        return;
    }
    let dir = TempDir::new("bench-cni");
    let BenchRun {
        stdout, json, pid, ..
    } = run_bench(
        &["cni", "--runs", "1", "--seconds", "1"],
        dir.path(),
        Duration::from_secs(180),
    );
    for s in [1, 4] {
        assert!(
            stdout.contains(&format!(
                "RESULT cni qswitch-cni-{s}/bridge-cni-{s} gbps_ratio="
            )),
            "{stdout}"
        );
    }
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4, "{json}");
    assert!(runs
        .iter()
        .all(|r| !r["samples"].as_array().unwrap().is_empty()));
    let left = namespaces_of(pid);
    assert!(left.is_empty(), "left namespaces {left:?}");
    let bridge = format!("/sys/class/net/qsbc{}", pid % 10_000);
    assert!(
        !std::path::Path::new(&bridge).exists(),
        "left the bridge {bridge}"
    );
}
