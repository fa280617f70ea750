//! The HTTP server on `[switch] http`: `/metrics` parsed by prometheus_client's reference
//! parser with every counter family counting, the JSON API, bad and slow clients, and the
//! dashboard in headless Chromium. Nothing here needs root: the daemons use gen ports only.
//!
//! Needs `python3` with `prometheus_client` (pip) and, for the browser test, Debian's
//! `chromium`; `.ci/run` installs both. Without chromium the browser test is skipped, or fails
//! under `QSWITCH_REQUIRE_PRIVILEGED=1` (set by CI). `QSWITCH_DASHBOARD_SHOT=PATH` saves the browser
//! test's screenshot there (how docs/dashboard.png is made).

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A free port on loopback (bound, then released for the daemon).
fn free_addr() -> SocketAddr {
    qswitch_test_support::free_tcp_addr()
}

/// A sink, a generator sending to it, and a lonely generator in VLAN 7 whose floods have
/// nowhere to go (counted as `no_destination` drops).
fn config(control: &Path, http: SocketAddr, rate: u32) -> String {
    format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nhttp = \"{http}\"\n\
         [[port]]\nname = \"sink\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\n\
         [[port]]\nname = \"src\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:01\"\n\
         generate = {{ dst = \"02:00:00:00:00:02\", size = 1000, rate = {rate} }}\n\
         [[port]]\nname = \"lonely\"\ntype = \"gen\"\nvlan = 7\nmac = \"02:00:00:00:00:07\"\n\
         generate = {{ dst = \"02:00:00:00:00:99\", size = 64, rate = 100 }}\n",
        worker_cpus(2),
        control.display()
    )
}

/// [`config`] with QoS: the sink is an uplink of 100 Mbit/s, and src has a 20M guarantee
/// and a 60M limit toward it; lonely (VLAN 7, no uplink there) has a 300M limit only.
fn qos_config(control: &Path, http: SocketAddr, rate: u32) -> String {
    config(control, http, rate)
        .replace(
            "name = \"sink\"\ntype = \"gen\"\n",
            "name = \"sink\"\ntype = \"gen\"\ncapacity = \"100M\"\n",
        )
        .replace(
            "name = \"src\"\ntype = \"gen\"\n",
            "name = \"src\"\ntype = \"gen\"\nqos = { min = \"20M\", max = \"60M\" }\n",
        )
        .replace(
            "name = \"lonely\"\ntype = \"gen\"\n",
            "name = \"lonely\"\ntype = \"gen\"\nqos = { max = \"300M\" }\n",
        )
}

/// One HTTP/1.1 exchange; returns (status, body).
fn get_raw(addr: SocketAddr, request: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).expect("send");
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let text = String::from_utf8_lossy(&reply).to_string();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    get_raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").as_bytes(),
    )
}

/// The series API's newest point, after waiting for at least `n` points.
fn wait_points(addr: SocketAddr, n: usize) -> Value {
    let mut last = Value::Null;
    assert!(
        wait_until(Duration::from_secs(15), || {
            let (status, body) = get(addr, "/api/series");
            last = serde_json::from_str(&body).unwrap_or(Value::Null);
            status == 200 && last["points"].as_array().map_or(0, Vec::len) >= n
        }),
        "fewer than {n} points: {last}"
    );
    last
}

/// Counter families that no test here can make non-zero, and why.
const NEVER_COUNTED: &[(&str, &str)] = &[
    (
        "qswitch_vhost_guest_errors",
        "vhost-user ports only; counted by tests/vhost_guest.rs, which needs QEMU",
    ),
    (
        "qswitch_vhost_logged_pages",
        "needs a live migration of a vhost-user guest; counted by tests/migration.rs (QEMU)",
    ),
    (
        "qswitch_vhost_announces",
        "needs a migrated guest without GUEST_ANNOUNCE; counted by tests/migration.rs (QEMU)",
    ),
    (
        "qswitch_vxlan_rx_packets",
        "vxlan ports only; counted by crates/dp/tests/vxlan.rs and tests/evpn.rs (namespaces)",
    ),
    (
        "qswitch_vxlan_tx_packets",
        "vxlan ports only; counted by crates/dp/tests/vxlan.rs and tests/evpn.rs (namespaces)",
    ),
    (
        "qswitch_vxlan_rx_bytes",
        "vxlan ports only; counted by crates/dp/tests/vxlan.rs and tests/evpn.rs (namespaces)",
    ),
    (
        "qswitch_vxlan_tx_bytes",
        "vxlan ports only; counted by crates/dp/tests/vxlan.rs and tests/evpn.rs (namespaces)",
    ),
    (
        "qswitch_vxlan_drops",
        "vxlan ports only; counted by crates/dp/tests/vxlan.rs and tests/evpn.rs (namespaces)",
    ),
    (
        "qswitch_vxlan_offload",
        "vxlan ports only; counted by crates/dp/tests/vxlan.rs (tso_frames_cross_as_one_gso_send_and_come_out_whole)",
    ),
    (
        "qswitch_vxlan_learn_refused",
        "vxlan ports under attack only; counted by crates/dp/tests/vxlan.rs \
         (spoofed_sources_and_sprayed_macs_are_bounded_and_counted and the F3/F4 tests)",
    ),
    (
        "qswitch_port_fdb_refused",
        "needs a port over its MAC limit, a flapping or a held MAC; counted by \
         crates/dp/tests/vxlan.rs (spoofed_sources_and_sprayed_macs_are_bounded_and_counted) \
         and the metrics unit test",
    ),
    (
        "qswitch_tap_offload",
        "TAP ports only; counted by crates/dp/tests/tap_gro.rs and tests/uplink.rs (namespaces)",
    ),
    (
        "qswitch_afxdp_kernel_drops",
        "afxdp ports only; tests/uplink.rs has them",
    ),
    (
        "qswitch_sink_lost_frames",
        "needs frames lost between generator and sink; a healthy gen→gen path loses none",
    ),
    (
        "qswitch_sink_reordered_frames",
        "needs reordering, which one worker per queue never does",
    ),
    (
        "qswitch_placement_moves",
        "needs a queue move, which dynamic placement may or may not make within the test; \
         tests/placement.rs moves queues",
    ),
];

#[test]
fn metrics_parse_and_every_counter_counts() {
    let dir = TempDir::new("http-metrics");
    let control = dir.join("control.sock");
    let addr = free_addr();
    let _daemon = DaemonChild::start(dir.path(), "m", &config(&control, addr, 5000), &control);
    wait_points(addr, 2);

    let (status, text) = get(addr, "/metrics");
    assert_eq!(status, 200, "{text}");
    let file = dir.join("metrics.txt");
    std::fs::write(&file, &text).unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/prom_parse.py");
    let out = run_timeout(Command::new("python3").arg(script).arg(&file), CMD_TIMEOUT);
    assert!(
        out.ok(),
        "prometheus_client could not parse /metrics ({:?}): {}\n{text}",
        out.code,
        out.stderr
    );
    let families: BTreeMap<String, Value> = serde_json::from_str(&out.stdout).unwrap();

    // No sample without its family's TYPE line.
    for (name, fam) in &families {
        assert!(
            fam["type"] == "counter" || fam["type"] == "gauge",
            "{name}: {fam}"
        );
    }
    // Every family the code declares is there, with its type; counters end in _total.
    let mut counters = 0;
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let mut parts = line.split(' ').skip(2);
        let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
        let base = name.strip_suffix("_total").unwrap_or(name);
        assert!(name.starts_with("qswitch_"), "{line}");
        assert_eq!(kind == "counter", name.ends_with("_total"), "{line}");
        let fam = families
            .get(base)
            .unwrap_or_else(|| panic!("parser did not see {base}: {families:?}"));
        assert_eq!(fam["type"], kind, "{base}");
        if kind != "counter" {
            continue;
        }
        counters += 1;
        let max = fam["max"].as_f64().unwrap_or(0.0);
        match NEVER_COUNTED.iter().find(|(n, _)| *n == base) {
            Some(_) => {}
            None => assert!(max > 0.0, "counter {name} never counted: {fam}\n{text}"),
        }
    }
    assert!(counters >= 15, "{counters} counter families");
    for (n, _) in NEVER_COUNTED {
        assert!(families.contains_key(*n), "stale exception {n}");
    }

    // Labels as documented.
    assert_eq!(
        families["qswitch_port_rx_packets"]["labels"],
        serde_json::json!(["port", "queue"])
    );
    assert_eq!(
        families["qswitch_port_drops"]["labels"],
        serde_json::json!(["port", "reason"])
    );
    assert!(text.contains("qswitch_port_drops_total{port=\"lonely\",reason=\"no_destination\"}"));
    assert_eq!(
        families["qswitch_port_rx_queue_drops"]["labels"],
        serde_json::json!(["port", "queue", "reason"])
    );
    assert_eq!(
        families["qswitch_worker_context_switches"]["labels"],
        serde_json::json!(["cpu", "kind", "worker"])
    );
}

#[test]
fn json_api_and_bad_clients() {
    let dir = TempDir::new("http-api");
    let control = dir.join("control.sock");
    let addr = free_addr();
    let mut daemon = DaemonChild::start(dir.path(), "a", &config(&control, addr, 2000), &control);
    let series = wait_points(addr, 2);
    assert_eq!(series["capacity"], 900);
    let p = series["points"].as_array().unwrap().last().unwrap().clone();
    let src = p["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "src")
        .unwrap();
    assert!(src["rx_bps"].as_f64().unwrap() > 1e6, "{p}");
    assert_eq!(src["queues"][0]["queue"], 0);
    assert!(p["workers"][0]["busy_pct"].is_number());
    assert!(series["qos"].is_null(), "no QoS configured");

    // since= returns only newer points.
    let last = series["last_t_ms"].as_u64().unwrap();
    let (status, body) = get(addr, &format!("/api/series?since={last}"));
    assert_eq!(status, 200);
    let newer: Value = serde_json::from_str(&body).unwrap();
    assert!(newer["points"].as_array().unwrap().len() <= 1, "{newer}");
    assert_eq!(get(addr, "/api/series?since=x").0, 400);

    let (status, body) = get(addr, "/api/stats");
    assert_eq!(status, 200);
    let stats: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(stats["ports"].as_array().unwrap().len(), 3);
    let (status, body) = get(addr, "/api/ports");
    assert_eq!(status, 200);
    assert!(body.contains("\"queues\""), "{body}");
    let (status, body) = get(addr, "/api/placement");
    assert_eq!(status, 200);
    let placement: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(placement["mode"], "dynamic", "{placement}");
    assert!(placement["moves_total"].is_u64(), "{placement}");
    let (status, body) = get(addr, "/");
    assert_eq!(status, 200);
    assert!(body.contains("<title>qswitch</title>") && !body.contains("src=\"http"));
    assert_eq!(get(addr, "/nope").0, 404);
    assert_eq!(get_raw(addr, b"POST /metrics HTTP/1.1\r\n\r\n").0, 405);
    let (status, body) = get_raw(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!((status, body.as_str()), (200, ""));

    // Malformed requests get 400, an oversized head 431 (Request Header Fields Too Large),
    // and nothing else happens.
    for (bad, status) in [
        (&b"garbage\r\n\r\n"[..], 400),
        (b"GET\r\n\r\n", 400),
        (b"GET /metrics HTTP/9\r\n\r\n", 400),
        (b"\xff\xfe\x00\r\n\r\n", 400),
        (&[b'A'; 20_000][..], 431),
    ] {
        assert_eq!(
            get_raw(addr, bad).0,
            status,
            "{:?}",
            String::from_utf8_lossy(&bad[..bad.len().min(40)])
        );
    }

    // Slow clients: more idle connections than the server serves at once. The extra ones get
    // 503 at once; the idle ones are dropped after the read timeout, and then all is well.
    let t0 = Instant::now();
    let idle: Vec<TcpStream> = (0..40)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let (status, _) = get(addr, "/metrics");
    assert!(status == 503 || status == 200, "{status}");
    assert!(
        wait_until(Duration::from_secs(10), || get(addr, "/metrics").0 == 200),
        "server did not recover from idle clients"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    drop(idle);

    // The datapath did not notice: frames keep flowing, the daemon is alive.
    let before = counter(&daemon.stats(), "sink", "tx_packets");
    assert!(wait_until(Duration::from_secs(5), || {
        counter(&daemon.stats(), "sink", "tx_packets") > before
    }));
    assert!(daemon.running());

    // `stats --watch` and its per-worker view: a row per second (per worker).
    for (args, needle) in [
        (&["stats", "--watch"][..], "src rx/tx Gb/s"),
        (&["stats", "--watch", "--workers"][..], "SLEEPS/s"),
    ] {
        let log = dir.join("watch.out");
        let child = Command::new(QSWITCH)
            .arg("--control")
            .arg(&control)
            .args(args)
            .stdout(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut child = ChildGuard::new(child);
        std::thread::sleep(Duration::from_millis(2600));
        child.stop();
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains(needle), "{text}");
        let rows = if args.len() == 3 { 2 * 2 } else { 2 };
        assert!(lines.len() > rows, "{text}");
        assert!(lines[1..].iter().all(|l| !l.contains(needle)), "{text}");
    }
    let st = daemon.terminate(Duration::from_secs(10));
    assert!(st.is_some_and(|s| s.success()), "{}", daemon.log_text());
}

/// The series carries the QoS table (settings vs allocations) for the dashboard: every port
/// with a setting, as `qos show` lists them (issue 32: a limit without an uplink is one), and
/// a per-second allocation gauge per shaped port.
#[test]
fn qos_settings_and_allocations_reach_the_series() {
    let dir = TempDir::new("http-qos");
    let control = dir.join("control.sock");
    let addr = free_addr();
    let cfg = qos_config(&control, addr, 20_000);
    let mut daemon = DaemonChild::start(dir.path(), "q", &cfg, &control);
    let series = wait_points(addr, 2);
    let rows = series["qos"]
        .as_array()
        .unwrap_or_else(|| panic!("no qos rows: {series}"));
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["port"] == name)
            .unwrap_or_else(|| panic!("no QoS row for {name}: {rows:?}"))
    };
    assert_eq!(rows.len(), 3, "sink (uplink), src and lonely: {rows:?}");
    let src = row("src");
    assert_eq!(src["uplink"], "sink");
    assert_eq!(src["min_bps"], 2e7);
    assert_eq!(src["max_bps"], 6e7);
    let alloc = src["alloc_bps"].as_f64().unwrap();
    assert!(alloc > 0.0 && alloc <= 6e7, "{alloc}");
    assert_eq!(row("sink")["capacity_bps"], 1e8);
    let lonely = row("lonely");
    assert!(lonely["uplink"].is_null(), "{lonely}");
    assert_eq!(lonely["max_bps"], 3e8);
    assert_eq!(lonely["min_bps"], 0.0);
    // What `qos show` lists with a setting, the panel lists.
    let out = Command::new(QSWITCH)
        .arg("--control")
        .arg(&control)
        .args(["qos", "show"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("lonely") && l.contains("300M")),
        "{text}"
    );
    let p = series["points"].as_array().unwrap().last().unwrap();
    assert!(
        p["gauges"]["qos.src.alloc_bps"].as_f64().is_some(),
        "allocation gauge on the point: {p}"
    );
    assert!(daemon.terminate(Duration::from_secs(10)).is_some());
}

#[test]
fn http_address_in_use_is_a_clear_error() {
    let dir = TempDir::new("http-busy");
    let control = dir.join("control.sock");
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let cfg = dir.join("c.toml");
    std::fs::write(&cfg, config(&control, addr, 10)).unwrap();
    let out = run_timeout(
        Command::new(QSWITCH)
            .args(["run", "--config"])
            .arg(&cfg)
            .env("STATE_DIRECTORY", cfg.with_extension("state")),
        CMD_TIMEOUT,
    );
    out.assert_no_panic();
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains(&format!("cannot listen on http {addr}")),
        "{out:?}"
    );
    std::fs::write(
        &cfg,
        format!(
            "[switch]\nhttp = \"localhost\"\ncontrol = \"{}\"\n",
            control.display()
        ),
    )
    .unwrap();
    let out = run_timeout(
        Command::new(QSWITCH)
            .args(["run", "--config"])
            .arg(&cfg)
            .env("STATE_DIRECTORY", cfg.with_extension("state")),
        CMD_TIMEOUT,
    );
    assert_eq!(out.code, Some(2), "{out:?}");
    assert!(out.stderr.contains("http = \"localhost\""), "{out:?}");
}

/// Headless Chromium with a throw-away profile; returns (stdout, stderr).
fn chromium(profile: &Path, args: &[&str], url: &str) -> (String, String) {
    let out = run_timeout(
        Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--enable-logging=stderr",
                "--v=0",
                "--window-size=1400,1000",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .args(args)
            .arg(url),
        Duration::from_secs(60),
    );
    assert!(out.ok(), "chromium failed: {out:?}");
    (out.stdout, out.stderr)
}

/// The `points` of the dashboard's polyline for `series`.
fn polyline(dom: &str, series: &str) -> String {
    let key = format!("data-series=\"{series}\"");
    let tag_start = dom[..dom
        .find(&key)
        .unwrap_or_else(|| panic!("no series {series}: {dom}"))]
        .rfind("<polyline")
        .unwrap();
    let tag = &dom[tag_start..];
    let tag = &tag[..tag.find('>').unwrap()];
    let p = tag.find("points=\"").unwrap() + 8;
    tag[p..p + tag[p..].find('"').unwrap()].to_string()
}

/// The number in the first `<td class="...CLASS">` after `<tr data-port="PORT">`.
fn cell(dom: &str, port: &str, class: &str) -> f64 {
    let row = &dom[dom
        .find(&format!("data-port=\"{port}\""))
        .expect("port row")..];
    let c = &row[row.find(class).expect("cell")..];
    let v = &c[c.find('>').unwrap() + 1..];
    v[..v.find('<').unwrap()].parse().expect("number")
}

#[test]
fn dashboard_in_headless_chromium() {
    if !require(
        have_tool("chromium", &[]),
        "chromium not installed (apt-get install chromium)",
    ) {
        return;
    }
    let dir = TempDir::new("http-browser");
    let control = dir.join("control.sock");
    let addr = free_addr();
    let _daemon = DaemonChild::start(
        dir.path(),
        "b",
        &qos_config(&control, addr, 20_000),
        &control,
    );
    wait_points(addr, 3);
    let url = format!("http://{addr}/?window=60");
    let budget = "--virtual-time-budget=3000";

    let (dom1, err1) = chromium(&dir.join("p1"), &[budget, "--dump-dom"], &url);
    std::thread::sleep(Duration::from_secs(2));
    let shot = std::env::var("QSWITCH_DASHBOARD_SHOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.join("dashboard.png"));
    let shot_arg = format!("--screenshot={}", shot.display());
    let (_, err2) = chromium(&dir.join("p2"), &[budget, &shot_arg], &url);
    let (dom3, err3) = chromium(&dir.join("p3"), &[budget, "--dump-dom"], &url);

    // Loaded, live, no errors in the page or on the console.
    for (dom, err) in [(&dom1, &err1), (&dom3, &err3), (&String::new(), &err2)] {
        let console: Vec<&str> = err.lines().filter(|l| l.contains(":CONSOLE")).collect();
        assert!(console.is_empty(), "console output: {console:?}");
        if !dom.is_empty() {
            assert!(
                dom.contains("<div id=\"errors\"></div>"),
                "page errors: {dom}"
            );
            assert!(dom.contains(">live<"), "not live: {dom}");
            assert!(dom.contains("guarantee Mbit/s"), "QoS table missing: {dom}");
            // qosCells: a limit without an uplink is a row (issue 32).
            assert!(
                dom.contains("<tr data-qos-port=\"lonely\"><td>lonely</td><td>-</td><td class=\"num\">-</td><td class=\"num\">300</td>"),
                "lonely's limit missing from the QoS panel: {dom}"
            );
            assert!(dom.contains("<td>cap 100M</td>"), "uplink capacity: {dom}");
            assert!(dom.contains("worker 0"), "{dom}");
        }
    }
    // The charts move with the traffic: src offers 20k frames/s of 1000 B (160 Mbit/s) and is
    // shaped to its 60M limit toward the 100M uplink (sink); the sink's line has new points
    // in the later snapshot.
    let mbps = cell(&dom3, "sink", "port-tx-mbps");
    assert!(mbps > 10.0, "sink tx {mbps} Mbit/s");
    assert!(cell(&dom3, "src", "port-rx-mbps") > 10.0);
    let (l1, l3) = (polyline(&dom1, "sink tx"), polyline(&dom3, "sink tx"));
    assert!(
        !l3.is_empty() && l1 != l3,
        "chart did not move: {l1} / {l3}"
    );
    let png = std::fs::read(&shot).expect("screenshot");
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{}",
        png.len()
    );
}

/// F9: 16 connections that never finish their request (and reconnect as soon as the server
/// drops them) do not keep a legitimate /metrics client out: it gets 200 within 2 s, every
/// time. The slow connections are evicted for it.
#[test]
fn never_finishing_clients_do_not_starve_metrics() {
    let dir = TempDir::new("http-slowloris");
    let control = dir.join("control.sock");
    let addr = free_addr();
    let mut daemon = DaemonChild::start(dir.path(), "s", &config(&control, addr, 100), &control);
    assert_eq!(get(addr, "/metrics").0, 200);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attacker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let open = || {
                let mut s = TcpStream::connect(addr).ok()?;
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: ").ok()?;
                s.set_nonblocking(true).ok()?;
                Some(s)
            };
            let mut conns: Vec<TcpStream> = (0..16).filter_map(|_| open()).collect();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Replace every connection the server closed: the crowd stays at 16.
                conns.retain(|s| {
                    let mut b = [0u8; 64];
                    matches!((&*s).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                });
                while conns.len() < 16 {
                    match open() {
                        Some(s) => conns.push(s),
                        None => break,
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    for k in 0..10 {
        let t = Instant::now();
        let (status, body) = get(addr, "/metrics");
        assert_eq!(status, 200, "scrape {k}");
        assert!(body.contains("qswitch_"), "scrape {k}");
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "scrape {k} took {:?}",
            t.elapsed()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    attacker.join().unwrap();
    assert!(daemon.running());
}

/// F9: DNS rebinding. A request naming another host (`Host: attacker.example`) gets 421;
/// IP literals, `localhost` on loopback and the names in `http_hosts` are served. A
/// non-loopback bind is logged as a warning.
#[test]
fn foreign_host_header_is_refused() {
    let dir = TempDir::new("http-host");
    let control = dir.join("control.sock");
    let addr = free_addr();
    let mut daemon = DaemonChild::start(dir.path(), "h", &config(&control, addr, 100), &control);
    let with_host = |a: SocketAddr, host: &str| {
        get_raw(
            a,
            format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes(),
        )
        .0
    };
    assert_eq!(with_host(addr, "attacker.example"), 421);
    assert_eq!(
        with_host(addr, &format!("attacker.example:{}", addr.port())),
        421
    );
    assert_eq!(with_host(addr, &format!("localhost:{}", addr.port())), 200);
    assert_eq!(with_host(addr, &addr.to_string()), 200);
    assert_eq!(get_raw(addr, b"GET /metrics HTTP/1.0\r\n\r\n").0, 200);
    assert!(!daemon.log_text().contains("not a loopback address"));
    daemon.terminate(Duration::from_secs(10));

    // On every address, with an allow-list: the listed name is served, others are not.
    let port = free_addr().port();
    let any: SocketAddr = format!("0.0.0.0:{port}").parse().unwrap();
    let local: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let text = config(&control, any, 100).replace(
        "[switch]\n",
        "[switch]\nhttp_hosts = [\"switch.example\"]\n",
    );
    let mut daemon = DaemonChild::start(dir.path(), "h2", &text, &control);
    assert_eq!(with_host(local, "switch.example"), 200);
    assert_eq!(with_host(local, "SWITCH.example.:80"), 200);
    assert_eq!(with_host(local, "attacker.example"), 421);
    assert!(
        daemon.log_text().contains("not a loopback address"),
        "{}",
        daemon.log_text()
    );
    assert!(daemon.running());
}

/// Issue 27 F8 (history): five gen ports of 256 queues (1 280, beyond the 1 024 a point
/// lists): every point lists at most 1 024 queues and counts the rest, the history says
/// what it holds and its budget, and `limit` pages through the points with `more`.
#[test]
fn series_is_bounded_in_bytes_and_paged() {
    let dir = TempDir::new("http-series-bound");
    let control = dir.join("control.sock");
    let addr = free_addr();
    let mut text = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nhttp = \"{addr}\"\n",
        worker_cpus(2),
        control.display()
    );
    for k in 0..5 {
        text.push_str(&format!(
            "[[port]]\nname = \"wide{k}\"\ntype = \"gen\"\nqueues = 256\n\
             mac = \"02:00:00:00:02:{k:02x}\"\n"
        ));
    }
    let mut daemon = DaemonChild::start(dir.path(), "wide", &text, &control);
    let series = wait_points(addr, 3);
    let max = series["max_bytes"].as_u64().expect("max_bytes");
    let held = series["bytes"].as_u64().expect("bytes");
    assert!(
        held > 0 && held <= max && max <= 64 << 20,
        "{held} of {max}"
    );
    for p in series["points"].as_array().unwrap() {
        let listed: usize = p["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["queues"].as_array().map_or(0, Vec::len))
            .sum();
        assert_eq!(listed, 1024, "queues listed in one point");
        assert_eq!(p["queues_omitted"], 5 * 256 - 1024);
    }
    // Pages of one point, each continuing where the last ended.
    let (status, body) = get(addr, "/api/series?since=0&limit=1");
    assert_eq!(status, 200);
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(first["points"].as_array().unwrap().len(), 1);
    assert_eq!(first["more"], true, "{}", first["last_t_ms"]);
    let t1 = first["last_t_ms"].as_u64().unwrap();
    assert_eq!(first["points"][0]["t_ms"], t1);
    let (_, body) = get(addr, &format!("/api/series?since={t1}&limit=1"));
    let second: Value = serde_json::from_str(&body).unwrap();
    assert!(second["points"][0]["t_ms"].as_u64().unwrap() > t1);
    assert_eq!(get(addr, "/api/series?limit=x").0, 400);
    assert!(daemon.running());
}
