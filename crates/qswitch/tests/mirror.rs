//! Mirror sessions end to end (root only, issue 32): namespaces joined to a `qswitch run`
//! daemon by veth pairs this test creates, a monitoring namespace on the session's output
//! port counting copies with tcpdump, a collector namespace decoding ERSPAN with tshark.
//!
//! Every test has its own number `n`: its namespaces are `qsmi<pid>-<n><port>`, its veth
//! ends `qm<n><port><pid>`, its subnet 10.203.<n>.0/24 (the collector's link
//! 10.204.<n>.0/30).

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{
    counter, drops, have_tool, qs, qs_json, require, root_or_skip, sh_ok, wait_until, worker_cpus,
    ChildGuard, DaemonChild, LinkGuard, Netns, TempDir,
};
use serde_json::Value;

struct Lab {
    daemon: DaemonChild,
    /// Per port: name, namespace (none: a TAP left down, never read).
    ports: Vec<(char, Option<Netns>)>,
    _links: Vec<LinkGuard>,
    n: u8,
    dir: TempDir,
}

fn ifname(n: u8, port: char) -> String {
    format!("qm{n}{port}{}", std::process::id() % 100_000)
}

impl Lab {
    /// Ports `(name, vlan, tap)`: a veth pair with its other end `eth0` in a namespace at
    /// 10.203.n.(i+1), or a TAP nobody brings up; then `extra` (the `[[mirror]]` tables).
    fn new(n: u8, specs: &[(char, Option<u16>, bool)], extra: &str) -> Lab {
        let dir = TempDir::new(&format!("mirror{n}"));
        let control = dir.join("control.sock");
        let pid = std::process::id();
        let mut text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n",
            worker_cpus(2),
            control.display()
        );
        let mut ports = Vec::new();
        let mut links = Vec::new();
        for (i, &(name, vlan, tap)) in specs.iter().enumerate() {
            let ifn = ifname(n, name);
            let kind = if tap { "tap" } else { "veth" };
            text.push_str(&format!(
                "[[port]]\nname = \"{name}\"\ntype = \"{kind}\"\nifname = \"{ifn}\"\n"
            ));
            if let Some(v) = vlan {
                text.push_str(&format!("vlan = {v}\n"));
            }
            if tap {
                ports.push((name, None));
                continue;
            }
            let ns = Netns::new(&format!("qsmi{pid}-{n}{name}"));
            sh_ok(&[
                "ip", "link", "add", &ifn, "type", "veth", "peer", "name", "eth0", "netns",
                &ns.name,
            ]);
            links.push(LinkGuard(ifn.clone()));
            ns.ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1"]);
            let addr = format!("10.203.{n}.{}/24", i + 1);
            ns.ok(&["ip", "addr", "add", &addr, "dev", "eth0"]);
            ns.ok(&["ip", "link", "set", "eth0", "up"]);
            ports.push((name, Some(ns)));
        }
        text.push_str(extra);
        let daemon = DaemonChild::start(dir.path(), "qswitch", &text, &control);
        Lab {
            daemon,
            ports,
            _links: links,
            n,
            dir,
        }
    }

    fn ns(&self, name: char) -> &Netns {
        let p = self.ports.iter().find(|p| p.0 == name).expect("port");
        p.1.as_ref().expect("a veth port")
    }

    fn ip(&self, name: char) -> String {
        let i = self.ports.iter().position(|p| p.0 == name).expect("port");
        format!("10.203.{}.{}", self.n, i + 1)
    }

    /// `count` pings from `from` to `to`; whether every echo was answered.
    fn ping(&self, from: char, to: char, count: u32) -> bool {
        let out = self.ns(from).run_for(
            &[
                "ping",
                "-n",
                "-c",
                &count.to_string(),
                "-i",
                "0.05",
                "-W",
                "1",
                &self.ip(to),
            ],
            Duration::from_secs(10 + u64::from(count)),
        );
        out.ok() && out.stdout.contains(" 0% packet loss")
    }

    /// `count` UDP datagrams from `from` to `to`'s port 9999 (bash's /dev/udp).
    fn udp(&self, from: char, to: char, count: u32) {
        let script = format!(
            "for i in $(seq {count}); do echo mirror-$i > /dev/udp/{}/9999; done",
            self.ip(to)
        );
        self.ns(from).ok(&["bash", "-c", &script]);
    }

    fn mirrors(&self) -> Value {
        qs_json(&self.daemon.control, &["mirror", "list", "--json"])
    }

    /// The session's (copies, sent, drops).
    fn session(&self, name: &str) -> (u64, u64, u64) {
        let list = self.mirrors();
        let m = (list.as_array().unwrap().iter())
            .find(|m| m["config"]["name"] == name)
            .unwrap_or_else(|| panic!("no mirror {name}: {list}"));
        let f = |k: &str| m[k].as_u64().unwrap();
        (f("copies"), f("sent"), f("drops"))
    }

    /// Waits until the session has sent everything it copied (its queue is empty).
    fn settle(&self, name: &str) {
        assert!(
            wait_until(Duration::from_secs(5), || {
                let (c, s, d) = self.session(name);
                c == s + d
            }),
            "mirror {name} did not settle: {:?}",
            self.session(name)
        );
    }
}

/// tcpdump writing what `ns`'s `eth0` receives to a pcap file, ready when returned.
struct Dump {
    guard: ChildGuard,
    file: PathBuf,
    log: PathBuf,
}

impl Dump {
    fn start(ns: &Netns, dir: &TempDir, tag: &str) -> Dump {
        let file = dir.join(&format!("{tag}.pcap"));
        let log = dir.join(&format!("{tag}.log"));
        let f = file.display().to_string();
        let guard = ns.spawn(
            &["tcpdump", "-i", "eth0", "-n", "-U", "-Q", "in", "-w", &f],
            &log,
        );
        assert!(
            wait_until(Duration::from_secs(10), || {
                std::fs::read_to_string(&log).is_ok_and(|l| l.contains("listening on"))
            }),
            "tcpdump did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        Dump { guard, file, log }
    }

    /// Frames of the capture so far that match the tcpdump `filter`.
    fn count(&self, filter: &str) -> usize {
        let f = self.file.display().to_string();
        let out = sh_ok(&["tcpdump", "-r", &f, "-n", filter]);
        out.stdout.lines().count()
    }
}

impl Drop for Dump {
    fn drop(&mut self) {
        self.guard.stop();
        let _ = std::fs::remove_file(&self.log);
    }
}

const ECHO: &str = "icmp[icmptype] == icmp-echo or icmp[icmptype] == icmp-echoreply";
const UDP: &str = "udp dst port 9999";

fn tools() -> bool {
    root_or_skip()
        && require(
            have_tool("tcpdump", &["--version"]),
            "tcpdump is not installed",
        )
}

/// SPAN: two source ports, both directions, to a local output port. Each frame of a ping
/// and a UDP stream from `a` to `b` is seen twice (received from `a`, delivered to `b`), and
/// the output port gets those copies and nothing else; what it sends is dropped and counted.
#[test]
fn span_copies_both_directions_of_two_sources() {
    if !tools() {
        return;
    }
    let lab = Lab::new(
        1,
        &[('a', None, false), ('b', None, false), ('m', None, false)],
        "[[mirror]]\nname = \"span\"\nsources = [\"a\", \"b\"]\ndirection = \"both\"\noutput = \"m\"\n",
    );
    // Warm the neighbour caches, then count from a clean slate.
    assert!(
        lab.ping('a', 'b', 1) || lab.ping('a', 'b', 1),
        "{}",
        lab.daemon.log_text()
    );
    lab.settle("span");
    let dump = Dump::start(lab.ns('m'), &lab.dir, "span");
    let (echo0, udp0) = (dump.count(ECHO), dump.count(UDP));
    assert!(
        lab.ping('a', 'b', 5),
        "ping a -> b\n{}",
        lab.daemon.log_text()
    );
    lab.udp('a', 'b', 10);
    lab.settle("span");
    // 5 requests and 5 replies, each copied from a's rx and b's tx (or b's rx and a's tx).
    assert!(
        wait_until(Duration::from_secs(5), || dump.count(ECHO) - echo0 == 20
            && dump.count(UDP) - udp0 == 20),
        "echo {} udp {} (expected 20 and 20)",
        dump.count(ECHO) - echo0,
        dump.count(UDP) - udp0
    );
    // The output port was sent the copies and nothing else, and is in no flood domain.
    let (copies, sent, lost) = lab.session("span");
    assert_eq!(lost, 0);
    assert_eq!(copies, sent);
    let stats = lab.daemon.stats();
    assert_eq!(counter(&stats, "m", "tx_packets"), sent, "{stats}");
    // What the monitoring side sends is dropped and counted.
    // (m has an address, 10.203.1.3, since the start: it never used it.)
    assert!(!lab.ping('m', 'a', 2), "the output port reached a source");
    assert!(
        wait_until(Duration::from_secs(5), || drops(
            &lab.daemon.stats(),
            "m",
            "mirror_output"
        ) >= 2),
        "{}",
        lab.daemon.stats()
    );
    // A port a session uses cannot go; the session can, and then the port.
    let out = qs(&lab.daemon.control, &["port", "del", "a"]);
    assert!(
        !out.ok() && out.stderr.contains("mirror 'span'"),
        "{}",
        out.stderr
    );
    qs(&lab.daemon.control, &["mirror", "del", "span"]).assert_ok("mirror del");
    assert_eq!(lab.mirrors(), serde_json::json!([]));
    assert!(lab.ping('m', 'a', 2), "m is an ordinary port again");
}

/// The VLAN filter: sources in VLANs 10 and 20 (access ports, no tags needed), a session
/// that keeps VLAN 10 only.
#[test]
fn vlan_filter_keeps_only_its_vlans() {
    if !tools() {
        return;
    }
    let lab = Lab::new(
        2,
        &[
            ('a', Some(10), false),
            ('b', Some(10), false),
            ('c', Some(20), false),
            ('d', Some(20), false),
            ('m', None, false),
        ],
        "",
    );
    // Added live this time, through the CLI.
    qs(
        &lab.daemon.control,
        &[
            "mirror",
            "add",
            "v10",
            "--sources",
            "a,c",
            "--vlans",
            "10",
            "--output",
            "m",
        ],
    )
    .assert_ok("mirror add");
    assert!(lab.ping('a', 'b', 1) || lab.ping('a', 'b', 1));
    assert!(lab.ping('c', 'd', 1) || lab.ping('c', 'd', 1));
    lab.settle("v10");
    let dump = Dump::start(lab.ns('m'), &lab.dir, "vlan");
    let echo0 = dump.count(ECHO);
    assert!(lab.ping('a', 'b', 4));
    assert!(lab.ping('c', 'd', 4));
    lab.settle("v10");
    // a's 4 requests (rx) and 4 replies (tx); nothing of c's.
    assert!(
        wait_until(Duration::from_secs(5), || dump.count(ECHO) - echo0 == 8),
        "echo {} (expected 8)",
        dump.count(ECHO) - echo0
    );
    let src = lab.ip('c');
    assert_eq!(dump.count(&format!("host {src}")), 0, "VLAN 20 leaked");
    // The session is recorded: `config dump` has it.
    let dump_text = qs(&lab.daemon.control, &["config", "dump"]);
    assert!(
        dump_text.stdout.contains("[[mirror]]"),
        "{}",
        dump_text.stdout
    );
    assert!(
        dump_text.stdout.contains("name = \"v10\""),
        "{}",
        dump_text.stdout
    );
    // ... and survives a restart.
    let mut lab = lab;
    assert!(lab.daemon.terminate(Duration::from_secs(10)).is_some());
    let config = lab.dir.join("qswitch.toml");
    let (control, log) = (lab.daemon.control.clone(), lab.dir.join("restart.log"));
    lab.daemon = DaemonChild::spawn(&config, &control, &log);
    lab.daemon.wait_ready();
    let (copies, _, _) = lab.session("v10");
    assert_eq!(copies, 0, "a new session after the restart");
}

/// A destination that takes nothing (a TAP output port that is down): the session's drops
/// count up, and the sources keep switching as before.
#[test]
fn a_dead_output_costs_the_sources_nothing() {
    if !tools() {
        return;
    }
    let lab = Lab::new(
        3,
        &[('a', None, false), ('b', None, false), ('t', None, true)],
        "[[mirror]]\nname = \"dead\"\nsources = [\"a\"]\noutput = \"t\"\n",
    );
    // The TAP qswitch made, set down: the kernel refuses every write to it.
    sh_ok(&["ip", "link", "set", &ifname(3, 't'), "down"]);
    assert!(lab.ping('a', 'b', 1) || lab.ping('a', 'b', 1));
    lab.settle("dead");
    let (c0, s0, d0) = lab.session("dead");
    assert!(lab.ping('a', 'b', 10), "{}", lab.daemon.log_text());
    lab.udp('a', 'b', 50);
    lab.settle("dead");
    let (c1, s1, d1) = lab.session("dead");
    let copies = c1 - c0;
    assert!(copies >= 70, "copies {copies}");
    assert_eq!(
        (s1 - s0, d1 - d0),
        (0, copies),
        "nothing reaches a TAP that is down"
    );
    let stats = lab.daemon.stats();
    assert!(counter(&stats, "a", "rx_packets") >= 61, "{stats}");
    // /metrics is not configured here; the per-session counters are in `mirror list`.
}

/// ERSPAN: copies of a source's frames reach a collector namespace as GRE/ERSPAN type II,
/// and tshark decodes the session id and the inner ICMP frames.
#[test]
fn erspan_reaches_a_collector_and_tshark_decodes_it() {
    if !tools()
        || !require(
            have_tool("tshark", &["--version"]),
            "tshark is not installed",
        )
    {
        return;
    }
    let n = 4u8;
    let pid = std::process::id();
    // The collector: a namespace on a veth pair whose other end stays in the host, where
    // the daemon's raw socket sends from.
    let col = Netns::new(&format!("qsmi{pid}-{n}col"));
    let host_end = format!("qmc{n}{}", pid % 100_000);
    sh_ok(&[
        "ip", "link", "add", &host_end, "type", "veth", "peer", "name", "eth0", "netns", &col.name,
    ]);
    let _link = LinkGuard(host_end.clone());
    sh_ok(&[
        "ip",
        "addr",
        "add",
        &format!("10.204.{n}.1/30"),
        "dev",
        &host_end,
    ]);
    sh_ok(&["ip", "link", "set", &host_end, "up"]);
    col.ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1"]);
    col.ok(&[
        "ip",
        "addr",
        "add",
        &format!("10.204.{n}.2/30"),
        "dev",
        "eth0",
    ]);
    col.ok(&["ip", "link", "set", "eth0", "up"]);
    let lab = Lab::new(
        n,
        &[('a', None, false), ('b', None, false)],
        &format!(
            "[[mirror]]\nname = \"remote\"\nsources = [\"a\"]\ndirection = \"rx\"\n\
             remote = {{ type = \"erspan\", dst = \"10.204.{n}.2\", session = 77, src = \"10.204.{n}.1\" }}\n"
        ),
    );
    let pcap = lab.dir.join("erspan.pcap").display().to_string();
    let log = lab.dir.join("tshark.log");
    let mut tshark = col.spawn(
        &["tshark", "-i", "eth0", "-f", "ip proto 47", "-w", &pcap],
        &log,
    );
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(20), || text().contains("Capturing on")),
        "tshark did not start: {}",
        text()
    );
    assert!(lab.ping('a', 'b', 1) || lab.ping('a', 'b', 1));
    assert!(lab.ping('a', 'b', 5));
    lab.settle("remote");
    let (copies, sent, lost) = lab.session("remote");
    assert_eq!(lost, 0);
    assert_eq!(copies, sent);
    // Stopped (SIGTERM: tshark closes its file whole), then the file is decoded.
    let pcap_has = |n: usize| {
        let out = common::run_timeout(
            std::process::Command::new("tshark").args(["-r", &pcap, "-Y", "erspan"]),
            Duration::from_secs(60),
        );
        out.stdout.lines().count() >= n
    };
    let _ = wait_until(Duration::from_secs(5), || pcap_has(sent as usize));
    tshark.stop();
    let out = common::run_timeout(
        std::process::Command::new("tshark").args([
            "-r",
            &pcap,
            "-n",
            "-Y",
            "erspan && icmp.type == 8",
            "-T",
            "fields",
            "-e",
            "erspan.spanid",
            "-e",
            "ip.src",
            "-e",
            "eth.src",
        ]),
        Duration::from_secs(60),
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    // The 5 requests of the second ping at least (and the warm-up's when tshark was ready).
    assert!(
        lines.len() >= 5,
        "tshark decoded:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    // Each line: the session id, the outer and inner source addresses, the outer and inner
    // source MACs: the inner frame is a's.
    let (a_ip, a_mac) = (lab.ip('a'), lab.ns('a').mac("eth0"));
    for line in &lines {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f[0], "77", "{line}");
        assert!(
            f[1].split(',').any(|a| a == a_ip),
            "inner frame not from a: {line}"
        );
        assert!(
            f[2].split(',').any(|m| m == a_mac),
            "inner frame not from a: {line}"
        );
    }
    let _ = &lab.ports;
}

/// Bad sessions are refused with one line, naming what is wrong; a reload applies the
/// file's `[[mirror]]` tables.
#[test]
fn bad_sessions_are_refused_with_one_line() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(
        5,
        &[('a', None, false), ('b', None, false), ('m', None, false)],
        "",
    );
    for (args, want) in [
        (
            vec!["--sources", "x", "--output", "m"],
            "unknown source port 'x'",
        ),
        (
            vec!["--sources", "a", "--output", "a"],
            "output port 'a' is also a source",
        ),
        (
            vec!["--sources", "a", "--output", "z"],
            "unknown output port 'z'",
        ),
        (
            vec![
                "--sources",
                "a",
                "--erspan",
                "10.0.0.1",
                "--session",
                "5000",
            ],
            "bad session id 5000",
        ),
        (
            vec!["--sources", "a", "--erspan", "224.0.0.1", "--session", "5"],
            "bad remote address 224.0.0.1",
        ),
    ] {
        let mut full = vec!["mirror", "add", "bad"];
        full.extend(args);
        let out = qs(&lab.daemon.control, &full);
        assert!(!out.ok(), "{full:?} was accepted");
        assert!(out.stderr.contains(want), "{full:?}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    }
    assert_eq!(lab.mirrors(), serde_json::json!([]));
    // A reload applies the file's [[mirror]] tables: added, then removed.
    let config = lab.dir.join("qswitch.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let table = "[[mirror]]\nname = \"r\"\nsources = [\"a\"]\noutput = \"m\"\n";
    std::fs::write(&config, format!("{text}{table}")).unwrap();
    let out = qs(&lab.daemon.control, &["reload"]);
    assert!(
        out.ok() && out.stdout.contains("mirror r: added"),
        "{out:?}"
    );
    assert_eq!(lab.session("r"), (0, 0, 0));
    std::fs::write(&config, &text).unwrap();
    let out = qs(&lab.daemon.control, &["reload"]);
    assert!(
        out.ok() && out.stdout.contains("mirror r: removed"),
        "{out:?}"
    );
    assert_eq!(lab.mirrors(), serde_json::json!([]));
}
