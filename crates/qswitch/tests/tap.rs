//! TAP ports end to end (root only): a `qswitch run` daemon whose TAPs are moved into network
//! namespaces this test creates, with ping, iperf3 and raw frames between them.
//!
//! Every test has its own number `n`: its namespaces are `qsit<pid>-<n><port>`, its TAPs
//! `qt<n><port><pid>`, its subnet 10.200.<n>.0/24, its files under a temp dir of its own.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{
    counter, drops, link_exists, port_names, qs, qs_json, root_or_skip, sh, wait_until,
    worker_cpus, ChildGuard, DaemonChild, LinkGuard, Netns, TempDir,
};
use serde_json::Value;

/// One port of a [`Lab`].
#[derive(Clone, Copy)]
struct PortSpec {
    name: char,
    vlan: Option<u16>,
    /// Move the TAP into a namespace of its own (else it stays in the root namespace).
    netns: bool,
}

fn port(name: char) -> PortSpec {
    PortSpec {
        name,
        vlan: None,
        netns: true,
    }
}

/// A daemon with TAP ports, each (optionally) moved into its own namespace with address
/// 10.200.n.(i+1)/24. Drops the daemon first, then the namespaces, then the temp dir.
struct Lab {
    daemon: DaemonChild,
    /// Per port: (port name, ifname, namespace if moved).
    ports: Vec<(String, String, Option<Netns>)>,
    n: u8,
    dir: TempDir,
}

fn ifname(n: u8, port: char) -> String {
    format!("qt{n}{port}{}", std::process::id() % 100_000)
}

impl Lab {
    fn new(n: u8, specs: &[PortSpec], ipv6: bool) -> Lab {
        let dir = TempDir::new(&format!("tap{n}"));
        let control = dir.join("control.sock");
        let mut text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n",
            worker_cpus(2),
            control.display()
        );
        for s in specs {
            text.push_str(&format!(
                "[[port]]\nname = \"{}\"\ntype = \"tap\"\nifname = \"{}\"\n",
                s.name,
                ifname(n, s.name)
            ));
            if let Some(v) = s.vlan {
                text.push_str(&format!("vlan = {v}\n"));
            }
        }
        let pid = std::process::id();
        // Namespaces first, so that a failing start-up still removes them.
        let mut namespaces: Vec<Option<Netns>> = specs
            .iter()
            .map(|s| {
                s.netns
                    .then(|| Netns::new(&format!("qsit{pid}-{n}{}", s.name)))
            })
            .collect();
        let daemon = DaemonChild::start(dir.path(), "qswitch", &text, &control);
        let mut ports = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let ifn = ifname(n, s.name);
            let ns = namespaces[i].take();
            if let Some(ns) = &ns {
                ns.adopt(&ifn, &format!("10.200.{n}.{}/24", i + 1), ipv6);
            }
            ports.push((s.name.to_string(), ifn, ns));
        }
        Lab {
            daemon,
            ports,
            n,
            dir,
        }
    }

    fn control(&self) -> PathBuf {
        self.daemon.control.clone()
    }

    /// The namespace of port `name`.
    fn ns(&self, name: char) -> &Netns {
        self.ports
            .iter()
            .find(|(p, _, _)| p.starts_with(name))
            .and_then(|(_, _, ns)| ns.as_ref())
            .expect("port with a namespace")
    }

    fn ifname(&self, name: char) -> String {
        ifname(self.n, name)
    }

    /// The address of the `i`-th port (0-based).
    fn ip(&self, name: char) -> String {
        let i = self
            .ports
            .iter()
            .position(|(p, _, _)| p.starts_with(name))
            .expect("port");
        format!("10.200.{}.{}", self.n, i + 1)
    }

    fn stats(&self) -> Value {
        self.daemon.stats()
    }

    /// `ping -c count` from port `from`'s namespace to port `to`'s address.
    fn ping(&self, from: char, to: char, count: u32, interval: &str) -> common::Out {
        let c = count.to_string();
        let bound = Duration::from_secs(10 + u64::from(count));
        self.ns(from).run_for(
            &[
                "ping",
                "-n",
                "-c",
                &c,
                "-i",
                interval,
                "-W",
                "2",
                &self.ip(to),
            ],
            bound,
        )
    }

    /// Ping works: 3 echoes, all answered. One retry (reported on stderr) absorbs a reply
    /// lost to a machine shared with other busy processes; a switch that does not forward
    /// fails both.
    fn assert_ping(&self, from: char, to: char) {
        let mut out = self.ping(from, to, 3, "0.2");
        if !out.stdout.contains(" 0% packet loss") {
            eprintln!("ping {from} -> {to} lost replies, retrying once: {out:?}");
            out = self.ping(from, to, 3, "0.2");
        }
        assert!(
            out.ok() && out.stdout.contains(" 0% packet loss"),
            "ping {from} -> {to} failed: {out:?}\n{}",
            self.daemon.log_text()
        );
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Starts `iperf3 -s` in port `on`'s namespace and waits until it listens.
    fn iperf_server(&self, on: char) -> ChildGuard {
        let ns = self.ns(on);
        let server = ns.spawn(
            &["iperf3", "-s", "-B", &self.ip(on)],
            &self.log("iperf3-server.log"),
        );
        assert!(ns.wait_listening(5201), "iperf3 server did not start");
        server
    }

    /// Starts an iperf3 TCP client from `from` to `to` (JSON result in the returned file).
    fn iperf_client(
        &self,
        from: char,
        to: char,
        secs: u32,
        streams: u32,
        tag: &str,
    ) -> (ChildGuard, PathBuf) {
        let log = self.log(&format!("iperf3-{tag}.json"));
        let (t, p) = (secs.to_string(), streams.to_string());
        let child = self.ns(from).spawn(
            &[
                "iperf3",
                "-c",
                &self.ip(to),
                "-t",
                &t,
                "-P",
                &p,
                "-J",
                "--connect-timeout",
                "3000",
            ],
            &log,
        );
        (child, log)
    }
}

/// Waits for an iperf3 client (at most `secs` + 20 s) and returns its received Gbit/s.
fn iperf_result(mut client: ChildGuard, log: &std::path::Path, secs: u32) -> f64 {
    let status = client.wait_timeout(Duration::from_secs(u64::from(secs) + 20));
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("iperf3 did not finish: {text}"));
    let json: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("iperf3 JSON ({e}): {text}"));
    assert!(
        json.get("error").is_none(),
        "iperf3 error: {}",
        json["error"]
    );
    assert!(status.success(), "iperf3 exited with {status}: {text}");
    json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9
}

/// The packet loss in percent from ping's summary line.
fn ping_loss(out: &str) -> f64 {
    out.lines()
        .find(|l| l.contains("packet loss"))
        .and_then(|l| l.split(',').find(|f| f.contains("packet loss")))
        .and_then(|f| f.trim().split('%').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no ping summary in {out:?}"))
}

#[test]
fn two_namespaces_ping_arp_and_fdb() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(11, &[port('a'), port('b')], false);
    lab.assert_ping('a', 'b');
    lab.assert_ping('b', 'a');

    let (mac_a, mac_b) = (
        lab.ns('a').mac(&lab.ifname('a')),
        lab.ns('b').mac(&lab.ifname('b')),
    );
    // ARP resolved on both sides.
    let neigh = lab
        .ns('a')
        .ok(&["ip", "neigh", "show", &lab.ip('b')])
        .stdout;
    assert!(
        neigh.contains(&format!("lladdr {mac_b}")),
        "a's neighbour table: {neigh:?}"
    );
    let neigh = lab
        .ns('b')
        .ok(&["ip", "neigh", "show", &lab.ip('a')])
        .stdout;
    assert!(
        neigh.contains(&format!("lladdr {mac_a}")),
        "b's neighbour table: {neigh:?}"
    );

    // The switch learned both stations on the right ports.
    let fdb = qs_json(&lab.control(), &["fdb", "--json"]);
    let entries = fdb.as_array().expect("fdb array");
    for (mac, port) in [(&mac_a, "a"), (&mac_b, "b")] {
        let e = entries
            .iter()
            .find(|e| e["mac"] == mac.as_str())
            .unwrap_or_else(|| panic!("{mac} not learned: {fdb}"));
        assert_eq!(e["port"], port, "{fdb}");
        assert_eq!(e["vlan"], 0, "{fdb}");
        assert!(e["age_ms"].as_u64().is_some_and(|a| a < 60_000), "{fdb}");
    }
    // Ports: both TAPs were created by qswitch, with offloads.
    let ports = qs_json(&lab.control(), &["port", "list", "--json"]);
    for p in ports.as_array().unwrap() {
        assert_eq!(p["type"], "tap");
        assert_eq!(p["created"], true, "{p}");
        assert!(
            p["offloads"].as_array().is_some_and(|o| !o.is_empty()),
            "{p}"
        );
    }
    let stats = lab.stats();
    for p in ["a", "b"] {
        assert!(counter(&stats, p, "rx_packets") >= 4, "{stats}");
        assert!(counter(&stats, p, "tx_packets") >= 4, "{stats}");
    }

    // b's interface set down: the kernel refuses writes to it (EIO), counted as link_down,
    // not as a generic tx_error.
    lab.ns('b')
        .ok(&["ip", "link", "set", &lab.ifname('b'), "down"]);
    let _ = lab
        .ns('a')
        .run(&["ping", "-c", "2", "-i", "0.2", "-W", "1", &lab.ip('b')]);
    let stats = lab.stats();
    assert!(drops(&stats, "b", "link_down") >= 1, "{stats}");
    assert_eq!(drops(&stats, "b", "tx_error"), 0, "{stats}");
}

#[test]
fn broadcast_floods_and_unicast_does_not() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(12, &[port('a'), port('b'), port('c')], false);
    for p in ['b', 'c'] {
        lab.ns(p)
            .sysctl("net.ipv4.icmp_echo_ignore_broadcasts", "0");
    }
    let before = lab.stats();
    let bcast = format!("10.200.{}.255", lab.n);
    let out = lab.ns('a').run_for(
        &[
            "ping", "-n", "-b", "-c", "4", "-i", "0.2", "-W", "1", &bcast,
        ],
        Duration::from_secs(15),
    );
    let after = lab.stats();
    eprintln!("ping -b: {}", out.stdout);
    for p in ['b', 'c'] {
        let ip = lab.ip(p);
        assert!(
            out.stdout.contains(&format!("from {ip}")),
            "no reply from {ip}: {out:?}"
        );
        let delta = counter(&after, &p.to_string(), "tx_packets")
            - counter(&before, &p.to_string(), "tx_packets");
        assert!(
            delta >= 4,
            "port {p} got {delta} frames of 4 broadcasts: {after}"
        );
    }

    // Unicast between two learned stations stays off the third port.
    lab.assert_ping('a', 'b');
    let before = lab.stats();
    let out = lab.ping('a', 'b', 200, "0.005");
    let after = lab.stats();
    assert!(out.ok() && ping_loss(&out.stdout) == 0.0, "{out:?}");
    let d = |p: &str, f: &str| counter(&after, p, f) - counter(&before, p, f);
    eprintln!(
        "unicast: a rx {} b tx {} b rx {} a tx {} c tx {}",
        d("a", "rx_packets"),
        d("b", "tx_packets"),
        d("b", "rx_packets"),
        d("a", "tx_packets"),
        d("c", "tx_packets")
    );
    assert!(
        d("b", "tx_packets") >= 200 && d("a", "tx_packets") >= 200,
        "{after}"
    );
    assert_eq!(
        d("c", "tx_packets"),
        0,
        "unicast a<->b leaked to c: before {before} after {after}"
    );
}

#[test]
fn vlans_isolate() {
    if !root_or_skip() {
        return;
    }
    let v = |name, vlan| PortSpec {
        name,
        vlan: Some(vlan),
        netns: true,
    };
    let lab = Lab::new(13, &[v('a', 10), v('b', 10), v('c', 20)], false);
    lab.assert_ping('a', 'b');
    let out = lab.ping('a', 'c', 2, "0.3");
    assert!(
        !out.ok() && out.stdout.contains(" 0 received"),
        "a reached c across VLANs: {out:?}"
    );
    let out = lab.ping('c', 'a', 2, "0.3");
    assert!(
        !out.ok() && out.stdout.contains(" 0 received"),
        "c reached a across VLANs: {out:?}"
    );
    let stats = lab.stats();
    // c is alone in VLAN 20: nothing from a (or b) may ever have been sent to it.
    assert_eq!(counter(&stats, "c", "tx_packets"), 0, "{stats}");
    assert!(
        counter(&stats, "c", "rx_packets") > 0,
        "c's ARP requests were not received: {stats}"
    );
    let fdb = qs_json(&lab.control(), &["fdb", "--json"]);
    let mac_a = lab.ns('a').mac(&lab.ifname('a'));
    let mac_c = lab.ns('c').mac(&lab.ifname('c'));
    let entries = fdb.as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["mac"] == mac_a.as_str() && e["vlan"] == 10 && e["port"] == "a"),
        "{fdb}"
    );
    assert!(
        entries
            .iter()
            .any(|e| e["mac"] == mac_c.as_str() && e["vlan"] == 20 && e["port"] == "c"),
        "{fdb}"
    );
    let ports = qs_json(&lab.control(), &["port", "list", "--json"]);
    let vlans: Vec<_> = ports
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["vlan"].as_u64())
        .collect();
    assert_eq!(vlans, [Some(10), Some(10), Some(20)]);
}

#[test]
fn iperf3_tcp_one_and_four_streams() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(14, &[port('a'), port('b')], false);
    lab.assert_ping('a', 'b');
    let _server = lab.iperf_server('b');
    for streams in [1, 4] {
        let (client, log) = lab.iperf_client('a', 'b', 3, streams, &format!("p{streams}"));
        let gbps = iperf_result(client, &log, 3);
        eprintln!("iperf3 TCP, {streams} stream(s): {gbps:.2} Gbit/s");
        assert!(
            gbps > 0.5,
            "{streams} stream(s): {gbps:.2} Gbit/s is below the 0.5 Gbit/s floor"
        );
    }
    let stats = lab.stats();
    eprintln!(
        "drops a: {} b: {}",
        common::port_stats(&stats, "a")["drops"],
        common::port_stats(&stats, "b")["drops"]
    );
    assert!(lab
        .daemon
        .log_text()
        .lines()
        .all(|l| !l.contains("panicked")));
}

#[test]
fn live_port_add_del_under_traffic() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(15, &[port('a'), port('b')], false);
    let control = lab.control();
    let tap_c = lab.ifname('c');
    // In case an add succeeds and the test fails before the del.
    let _c_guard = LinkGuard(tap_c.clone());
    lab.assert_ping('a', 'b');
    let _server = lab.iperf_server('b');
    let (client, log) = lab.iperf_client('a', 'b', 5, 2, "live");
    let ping = lab.ns('a').spawn(
        &[
            "ping",
            "-n",
            "-c",
            "200",
            "-i",
            "0.02",
            "-W",
            "1",
            &lab.ip('b'),
        ],
        &lab.log("ping-live.log"),
    );
    std::thread::sleep(Duration::from_millis(300));
    for round in 0..5 {
        qs(
            &control,
            &["port", "add", "c", "--type", "tap", "--ifname", &tap_c],
        )
        .assert_ok("port add c");
        assert!(
            link_exists(&tap_c),
            "round {round}: {tap_c} missing after port add"
        );
        assert_eq!(port_names(&control), ["a", "b", "c"], "round {round}");
        let ports = qs_json(&control, &["port", "list", "--json"]);
        assert_eq!(ports[2]["ifname"], tap_c.as_str());
        assert_eq!(ports[2]["created"], true);
        std::thread::sleep(Duration::from_millis(200));
        qs(&control, &["port", "del", "c"]).assert_ok("port del c");
        assert!(
            wait_until(Duration::from_secs(3), || !link_exists(&tap_c)),
            "round {round}: {tap_c} still there after port del"
        );
        assert_eq!(port_names(&control), ["a", "b"], "round {round}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let gbps = iperf_result(client, &log, 5);
    let mut ping = ping;
    let st = ping.wait_timeout(Duration::from_secs(15));
    let text = std::fs::read_to_string(lab.log("ping-live.log")).unwrap_or_default();
    assert!(st.is_some(), "ping did not finish: {text}");
    let loss = ping_loss(&text);
    eprintln!("during 5 add/del rounds: iperf3 {gbps:.2} Gbit/s, ping loss {loss}%");
    assert!(gbps > 0.0, "no iperf3 throughput");
    assert!(
        loss <= 1.0,
        "ping loss {loss}% while ports came and went: {text}"
    );
    assert!(!link_exists(&tap_c));
    lab.assert_ping('a', 'b');
}

/// Sends malformed frames from inside a namespace on a raw AF_PACKET socket; prints JSON
/// {category: {"sent": n, "refused": n, "errors": {errno: n}}}.
const INJECT: &str = r#"
import errno, json, random, socket, sys, time
ifname, peer = sys.argv[1], bytes.fromhex(sys.argv[2].replace(':', ''))
me = bytes.fromhex(open('/sys/class/net/%s/address' % ifname).read().strip().replace(':', ''))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((ifname, 0))
res = {}
n = 0
def send(cat, frame):
    global n
    r = res.setdefault(cat, {'sent': 0, 'refused': 0, 'errors': {}})
    try:
        s.send(frame)
        r['sent'] += 1
    except OSError as e:
        r['refused'] += 1
        name = errno.errorcode.get(e.errno, str(e.errno))
        r['errors'][name] = r['errors'].get(name, 0) + 1
    n += 1
    if n % 64 == 0:
        time.sleep(0.002)
ipv4 = b'\x08\x00' + bytes(46)
for length in range(1, 14):
    send('runt', (peer + me + b'\x08\x00')[:length])
for extra in range(0, 4):
    send('truncated_vlan_tag', peer + me + b'\x81\x00' + bytes(extra))
for i in range(50):
    send('multicast_src', peer + bytes([0x01, 0x00, 0x5e, 0, 0, i]) + ipv4)
    send('broadcast_src', b'\xff' * 6 + b'\xff' * 6 + ipv4)
    send('vlan_tagged', peer + me + b'\x81\x00\x00\x0a' + ipv4)
    send('vlan_tagged_bcast', b'\xff' * 6 + me + b'\x81\x00\x00\x14' + b'\x08\x06' + bytes(28))
    send('priority_tagged', peer + me + b'\x81\x00\x60\x00' + ipv4)
rng = random.Random(4242)
for i in range(2000):
    send('garbage', bytes(rng.getrandbits(8) for _ in range(rng.randint(14, 1514))))
print(json.dumps(res))
"#;

#[test]
fn malformed_frames_are_counted_and_survived() {
    if !root_or_skip() {
        return;
    }
    let mut lab = Lab::new(16, &[port('a'), port('b')], false);
    lab.assert_ping('a', 'b');
    let mac_b = lab.ns('b').mac(&lab.ifname('b'));
    let before = lab.stats();
    let out = lab.ns('a').run_for(
        &["python3", "-c", INJECT, &lab.ifname('a'), &mac_b],
        Duration::from_secs(60),
    );
    out.assert_ok("frame injection");
    let sent: Value = serde_json::from_str(out.stdout.trim()).expect("injector JSON");
    eprintln!("injected: {sent}");
    // Let the switch drain the TAP queue.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        lab.daemon.running(),
        "daemon gone: {}",
        lab.daemon.log_text()
    );
    let stats = lab.stats();
    let a = common::port_stats(&stats, "a");
    eprintln!("port a: rx {} drops {}", a["rx_packets"], a["drops"]);
    eprintln!(
        "port b: tx {} drops {}",
        common::port_stats(&stats, "b")["tx_packets"],
        common::port_stats(&stats, "b")["drops"]
    );
    let rx = counter(&stats, "a", "rx_packets") - counter(&before, "a", "rx_packets");
    // Most of what was sent (the TAP's own queue may drop a few under load).
    assert!(rx > 1500, "only {rx} frames received from a");
    let sent_of = |cat: &str| sent[cat]["sent"].as_u64().unwrap_or(0);
    assert_eq!(sent_of("multicast_src"), 50, "{sent}");
    assert_eq!(sent_of("vlan_tagged"), 50, "{sent}");
    assert!(drops(&stats, "a", "bad_src_mac") >= 100, "{stats}");
    assert!(drops(&stats, "a", "vlan_tagged") >= 100, "{stats}");
    if sent_of("truncated_vlan_tag") > 0 {
        assert!(
            drops(&stats, "a", "runt") > 0,
            "truncated tags not counted as runts: {stats}"
        );
    }
    let fdb = qs_json(&lab.control(), &["fdb", "--json"]);
    eprintln!(
        "fdb entries after garbage: {}",
        fdb.as_array().map_or(0, Vec::len)
    );
    // The switch still switches.
    lab.assert_ping('a', 'b');
    lab.assert_ping('b', 'a');
    assert!(lab.daemon.running(), "{}", lab.daemon.log_text());
    let log = lab.daemon.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn sigterm_removes_created_taps_and_keeps_persistent_ones() {
    if !root_or_skip() {
        return;
    }
    let pid = std::process::id() % 100_000;
    let persistent = format!("qt17p{pid}");
    let _persistent_guard = LinkGuard(persistent.clone());
    common::sh_ok(&["ip", "tuntap", "add", "dev", &persistent, "mode", "tap"]);
    let local = PortSpec {
        name: 'c',
        vlan: None,
        netns: false,
    };
    let mut lab = Lab::new(17, &[port('a'), port('b'), local], false);
    let control = lab.control();
    qs(
        &control,
        &["port", "add", "p", "--type", "tap", "--ifname", &persistent],
    )
    .assert_ok("port add p");
    let ports = qs_json(&control, &["port", "list", "--json"]);
    assert_eq!(ports[3]["name"], "p");
    assert_eq!(ports[3]["created"], false, "{ports}");
    lab.assert_ping('a', 'b');
    let tap_c = lab.ifname('c');
    assert!(link_exists(&tap_c));
    let (tap_a, tap_b) = (lab.ifname('a'), lab.ifname('b'));
    assert!(lab.ns('a').has_link(&tap_a) && lab.ns('b').has_link(&tap_b));

    let t = Instant::now();
    let status = lab.daemon.terminate(Duration::from_secs(5));
    let status = status
        .unwrap_or_else(|| panic!("still running 5 s after SIGTERM: {}", lab.daemon.log_text()));
    eprintln!("stopped in {:?}", t.elapsed());
    assert_eq!(status.code(), Some(0), "{}", lab.daemon.log_text());
    assert!(!control.exists(), "control socket left behind");
    assert!(
        wait_until(Duration::from_secs(3), || !link_exists(&tap_c)),
        "{tap_c} survived the daemon"
    );
    assert!(
        wait_until(Duration::from_secs(3), || !lab.ns('a').has_link(&tap_a)),
        "{tap_a} survived"
    );
    assert!(
        wait_until(Duration::from_secs(3), || !lab.ns('b').has_link(&tap_b)),
        "{tap_b} survived"
    );
    assert!(
        link_exists(&persistent),
        "the persistent TAP {persistent} was removed"
    );
}

/// utime + stime of `pid` in clock ticks, from /proc/PID/stat.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the ")" that ends the command name: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn clock_ticks_per_sec() -> u64 {
    sh(&["getconf", "CLK_TCK"])
        .stdout
        .trim()
        .parse()
        .unwrap_or(100)
}

#[test]
fn idle_cpu_is_low() {
    if !root_or_skip() {
        return;
    }
    // IPv6 stays on: the kernels may send what they send on their own.
    let lab = Lab::new(18, &[port('a'), port('b')], true);
    lab.assert_ping('a', 'b');
    std::thread::sleep(Duration::from_secs(1));
    let pid = lab.daemon.pid();
    let hz = clock_ticks_per_sec();
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(5));
    let (secs, c1) = (t0.elapsed().as_secs_f64(), cpu_ticks(pid));
    let pct = (c1 - c0) as f64 / hz as f64 / secs * 100.0;
    eprintln!("idle CPU: {pct:.2}%");
    assert!(pct < 5.0, "idle daemon used {pct:.2}% CPU");
    assert_eq!(port_names(&lab.control()), ["a", "b"]);
}
