//! veth ports end to end (root only): namespaces joined by veth pairs this test creates, a
//! `qswitch run` daemon on their root-namespace ends, ping and iperf3 between them. What the
//! kernel fast path forwards shows in each port's `fastpath` counters; what it leaves to the
//! workers shows in the ports' queue counters.
//!
//! Every test has its own number `n`: its namespaces are `qsvt<pid>-<n><port>`, its veth
//! ends `qv<n><port><pid>`, its subnet 10.201.<n>.0/24.

mod common;

use std::time::Duration;

use common::{
    counter, qs, qs_json, root_or_skip, sh_ok, wait_until, worker_cpus, ChildGuard, DaemonChild,
    LinkGuard, Netns, TempDir, QSWITCH,
};
use serde_json::Value;

/// One port: a veth pair (root end given to qswitch, other end in a namespace), or a TAP.
#[derive(Clone, Copy)]
struct Spec {
    name: char,
    vlan: Option<u16>,
    tap: bool,
    fastpath: bool,
}

fn veth(name: char) -> Spec {
    Spec {
        name,
        vlan: None,
        tap: false,
        fastpath: true,
    }
}

struct Lab {
    daemon: DaemonChild,
    /// Per port: name, root-side ifname, namespace.
    ports: Vec<(char, String, Netns)>,
    _links: Vec<LinkGuard>,
    n: u8,
    dir: TempDir,
    config: String,
}

fn ifname(n: u8, port: char) -> String {
    format!("qv{n}{port}{}", std::process::id() % 100_000)
}

impl Lab {
    fn new(n: u8, specs: &[Spec]) -> Lab {
        Lab::with(n, specs, "")
    }

    /// [`Lab::new`] with more `[switch]` keys.
    fn with(n: u8, specs: &[Spec], switch: &str) -> Lab {
        let dir = TempDir::new(&format!("veth{n}"));
        let control = dir.join("control.sock");
        let pid = std::process::id();
        let mut text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n{switch}",
            worker_cpus(2),
            control.display()
        );
        let mut namespaces = Vec::new();
        let mut links = Vec::new();
        for (i, s) in specs.iter().enumerate() {
            let ns = Netns::new(&format!("qsvt{pid}-{n}{}", s.name));
            let ifn = ifname(n, s.name);
            let kind = if s.tap { "tap" } else { "veth" };
            text.push_str(&format!(
                "[[port]]\nname = \"{}\"\ntype = \"{kind}\"\nifname = \"{ifn}\"\n",
                s.name
            ));
            if let Some(v) = s.vlan {
                text.push_str(&format!("vlan = {v}\n"));
            }
            if !s.tap {
                text.push_str(&format!("fastpath = {}\n", s.fastpath));
                sh_ok(&[
                    "ip", "link", "add", &ifn, "type", "veth", "peer", "name", "eth0", "netns",
                    &ns.name,
                ]);
                links.push(LinkGuard(ifn.clone()));
                ns.ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1"]);
                ns.ok(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.201.{n}.{}/24", i + 1),
                    "dev",
                    "eth0",
                ]);
                ns.ok(&["ip", "link", "set", "eth0", "up"]);
            }
            namespaces.push(ns);
        }
        let daemon = DaemonChild::start(dir.path(), "qswitch", &text, &control);
        let mut ports = Vec::new();
        for ((s, ns), i) in specs.iter().zip(namespaces).zip(1..) {
            let ifn = ifname(n, s.name);
            if s.tap {
                ns.adopt(&ifn, &format!("10.201.{n}.{i}/24"), false);
            }
            ports.push((s.name, ifn, ns));
        }
        Lab {
            daemon,
            ports,
            _links: links,
            n,
            dir,
            config: text,
        }
    }

    fn ns(&self, name: char) -> &Netns {
        &self.ports.iter().find(|p| p.0 == name).expect("port").2
    }

    fn ip(&self, name: char) -> String {
        let i = self.ports.iter().position(|p| p.0 == name).expect("port");
        format!("10.201.{}.{}", self.n, i + 1)
    }

    /// Pings `count` times from `from` to `to`; whether every echo was answered.
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

    fn assert_ping(&self, from: char, to: char) {
        // One retry absorbs a reply lost on a machine shared with busy processes.
        assert!(
            self.ping(from, to, 3) || self.ping(from, to, 3),
            "ping {from} -> {to} failed\n{}",
            self.daemon.log_text()
        );
    }

    fn stats(&self) -> Value {
        self.daemon.stats()
    }

    /// What the fast path forwarded for `port`: (rx packets, tx packets).
    fn fast(&self, port: char) -> (u64, u64) {
        let s = self.stats();
        let p = common::port_stats(&s, &port.to_string()).clone();
        (
            p["fastpath"]["rx_packets"].as_u64().unwrap_or(0),
            p["fastpath"]["tx_packets"].as_u64().unwrap_or(0),
        )
    }

    /// Frames the workers received from `port` (its slow path).
    fn slow_rx(&self, port: char) -> u64 {
        let s = self.stats();
        common::port_stats(&s, &port.to_string())["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["rx_packets"].as_u64().unwrap())
            .sum()
    }

    /// `port list --json`'s `fastpath` of `port`.
    fn fast_on(&self, port: char) -> Option<bool> {
        let list = qs_json(&self.daemon.control, &["port", "list", "--json"]);
        list.as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == port.to_string())
            .and_then(|p| p["fastpath"].as_bool())
    }
}

#[test]
fn known_unicast_between_veth_ports_bypasses_the_workers() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(
        1,
        &[
            veth('a'),
            veth('b'),
            Spec {
                fastpath: false,
                ..veth('c')
            },
        ],
    );
    assert_eq!(lab.fast_on('a'), Some(true));
    assert_eq!(lab.fast_on('c'), Some(false));
    // ARP and the first echo teach the switch both MACs through the slow path.
    lab.assert_ping('a', 'b');
    lab.assert_ping('a', 'c');
    lab.assert_ping('b', 'c');
    // The next sync (100 ms) puts a's and b's addresses into the fast path.
    let synced = wait_until(Duration::from_secs(3), || {
        lab.ping('a', 'b', 1);
        lab.fast('a').0 > 0
    });
    assert!(synced, "no frame took the fast path: {}", lab.stats());
    let (slow_a, slow_b, slow_c) = (lab.slow_rx('a'), lab.slow_rx('b'), lab.slow_rx('c'));
    let (fast_a, fast_b) = (lab.fast('a'), lab.fast('b'));
    assert!(lab.ping('a', 'b', 20), "ping a -> b");
    // Every echo and reply of those 20 went through the kernel: a's and b's fast path
    // counters moved by at least 20 each way, and neither port's slow path by more than
    // a stray ARP refresh.
    let (fa, fb) = (lab.fast('a'), lab.fast('b'));
    assert!(
        fa.0 >= fast_a.0 + 20 && fa.1 >= fast_a.1 + 20,
        "{fa:?} {fast_a:?}"
    );
    assert!(
        fb.0 >= fast_b.0 + 20 && fb.1 >= fast_b.1 + 20,
        "{fb:?} {fast_b:?}"
    );
    assert!(lab.slow_rx('a') <= slow_a + 2, "a's slow path moved");
    assert!(lab.slow_rx('b') <= slow_b + 2, "b's slow path moved");
    // c has no fast path: its frames all go through the workers, and still arrive.
    assert!(lab.ping('a', 'c', 5), "ping a -> c");
    assert!(
        lab.slow_rx('c') >= slow_c + 5,
        "c's echo replies went through the workers"
    );
    assert_eq!(lab.fast('c'), (0, 0));
    // The port totals include the fast path.
    let s = lab.stats();
    assert!(counter(&s, "a", "rx_packets") >= fa.0 + slow_a);
    // qswitch fdb knows every address, learnt through the slow path.
    let fdb = qs(&lab.daemon.control, &["fdb"]).stdout;
    for p in ["a", "b", "c"] {
        assert!(
            fdb.lines().any(|l| l.split_whitespace().nth(2) == Some(p)),
            "{p} missing from\n{fdb}"
        );
    }

    // TCP: nearly all of it in the kernel.
    let _server = lab.ns('b').spawn(
        &["iperf3", "-s", "-1", "-B", &lab.ip('b')],
        &lab.dir.join("iperf3-s.log"),
    );
    assert!(lab.ns('b').wait_listening(5201), "iperf3 server");
    let out = lab.ns('a').run_for(
        &["iperf3", "-c", &lab.ip('b'), "-t", "2", "-J"],
        Duration::from_secs(20),
    );
    assert!(out.ok(), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let received = v["end"]["sum_received"]["bytes"].as_u64().unwrap();
    assert!(received > 1_000_000, "{v}");
    let s = lab.stats();
    let a = common::port_stats(&s, "a");
    let fast_bytes = a["fastpath"]["rx_bytes"].as_u64().unwrap();
    assert!(
        fast_bytes >= received * 9 / 10,
        "{fast_bytes} of {received} bytes through the fast path: {s}"
    );
}

#[test]
fn ports_the_workers_must_see_leave_the_fast_path() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(2, &[veth('a'), veth('b')]);
    lab.assert_ping('a', 'b');
    assert!(wait_until(Duration::from_secs(3), || {
        lab.ping('a', 'b', 1);
        lab.fast('a').0 > 0
    }));
    let control = &lab.daemon.control;
    // A limit on b: the workers must meter what b receives and sends.
    qs(control, &["qos", "set", "b", "--max", "1G"]).assert_ok("qos set");
    assert!(wait_until(Duration::from_secs(2), || lab.fast_on('b') == Some(false)));
    // Let a sync pass, then nothing more takes the fast path either way.
    std::thread::sleep(Duration::from_millis(300));
    let (fast_a, slow_b) = (lab.fast('a'), lab.slow_rx('b'));
    assert!(lab.ping('a', 'b', 10), "ping with b off the fast path");
    assert_eq!(lab.fast('a'), fast_a, "a's frames to b took the fast path");
    assert!(
        lab.slow_rx('b') >= slow_b + 10,
        "b's replies not seen by the workers"
    );
    qs(control, &["qos", "set", "b", "--clear"]).assert_ok("qos clear");
    assert!(wait_until(Duration::from_secs(2), || lab.fast_on('b') == Some(true)));

    // Port security on a: its frames must be checked one by one.
    qs(
        control,
        &["port", "set", "a", "--ips", &format!("{}/32", lab.ip('a'))],
    )
    .assert_ok("port set");
    assert!(wait_until(Duration::from_secs(2), || lab.fast_on('a') == Some(false)));
    lab.assert_ping('a', 'b');
    qs(control, &["port", "set", "a", "--ips", "none"]).assert_ok("port set");
    assert!(wait_until(Duration::from_secs(2), || lab.fast_on('a') == Some(true)));

    // A capture sees every frame of its port while it runs.
    let cap = lab.dir.join("a.pcapng");
    let mut child = ChildGuard::new(
        std::process::Command::new(QSWITCH)
            .arg("--control")
            .arg(control)
            .args(["capture", "a", "--direction", "rx", "-c", "5", "-w"])
            .arg(&cap)
            .spawn()
            .unwrap(),
    );
    assert!(wait_until(Duration::from_secs(3), || lab.fast_on('a') == Some(false)));
    std::thread::sleep(Duration::from_millis(200));
    assert!(lab.ping('a', 'b', 5), "ping while capturing");
    let status = child.wait_timeout(Duration::from_secs(10));
    assert!(status.is_some_and(|s| s.success()), "capture: {status:?}");
    assert!(std::fs::metadata(&cap).unwrap().len() > 100);
    assert!(wait_until(Duration::from_secs(3), || lab.fast_on('a') == Some(true)));
}

#[test]
fn vlans_and_other_port_kinds() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(
        3,
        &[
            Spec {
                vlan: Some(10),
                ..veth('a')
            },
            Spec {
                vlan: Some(20),
                ..veth('b')
            },
            Spec {
                vlan: Some(10),
                tap: true,
                ..veth('c')
            },
            Spec {
                vlan: Some(20),
                ..veth('d')
            },
        ],
    );
    // A veth port and a TAP port in one VLAN: through the slow path.
    lab.assert_ping('a', 'c');
    // Two veth ports in VLAN 20: the fast path keys on the VLAN too.
    lab.assert_ping('b', 'd');
    assert!(wait_until(Duration::from_secs(3), || {
        lab.ping('b', 'd', 1);
        lab.fast('b').0 > 0
    }));
    // Across VLANs, nothing: neither the switch nor the fast path joins them.
    assert!(!lab.ping('a', 'b', 2), "VLAN 10 reached VLAN 20");
    assert!(!lab.ping('c', 'd', 2), "VLAN 10 reached VLAN 20");
    assert_eq!(lab.fast('a').1, 0, "a got frames through the fast path");
}

#[test]
fn kill_9_hands_the_veth_back_to_the_kernel_and_a_restart_takes_it_again() {
    if !root_or_skip() {
        return;
    }
    let mut lab = Lab::new(4, &[veth('a'), veth('b')]);
    lab.assert_ping('a', 'b');
    let ifa = lab.ports[0].1.clone();
    let index = std::fs::read_to_string(format!("/sys/class/net/{ifa}/ifindex")).unwrap();
    let tap = format!("qsv{}", index.trim());
    assert!(common::link_exists(&tap), "slow path TAP {tap}");
    // The TAP's programs are classic tc filters (no grace period to wait for: docs/veth.md),
    // which go with the TAP; the root end's is a tcx link, which goes with the process.
    for (hook, name) in [("ingress", "qs_veth_out"), ("egress", "qs_veth_guard")] {
        let filters = sh_ok(&["tc", "filter", "show", "dev", &tap, hook]).stdout;
        assert!(filters.contains(name), "{hook} of {tap}: {filters}");
    }
    lab.daemon.kill();
    // The TAP went with the process, and so did the programs: the root end carries the
    // namespace's frames to the host's stack again.
    assert!(wait_until(Duration::from_secs(3), || !common::link_exists(
        &tap
    )));
    // qswitch left it sealed (no ARP, no addresses: see the next test): open it by hand.
    sh_ok(&["ip", "link", "set", "dev", &ifa, "arp", "on"]);
    sh_ok(&["ip", "addr", "add", "10.201.4.254/24", "dev", &ifa]);
    assert!(
        lab.ns('a')
            .run(&["ping", "-n", "-c", "2", "-W", "1", "10.201.4.254"])
            .ok(),
        "a program was left on {ifa}"
    );
    sh_ok(&["ip", "addr", "del", "10.201.4.254/24", "dev", &ifa]);
    // A restart attaches again.
    let control = lab.dir.join("control.sock");
    let _ = std::fs::remove_file(&control);
    lab.daemon = DaemonChild::start(lab.dir.path(), "qswitch2", &lab.config, &control);
    lab.assert_ping('a', 'b');
}

#[test]
fn an_interface_that_is_not_a_veth_is_refused_and_nothing_is_left() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(5, &[veth('a')]);
    let control = &lab.daemon.control;
    let missing = qs(
        control,
        &[
            "port",
            "add",
            "x",
            "--type",
            "veth",
            "--ifname",
            "qvnothere0",
        ],
    );
    assert!(!missing.ok());
    assert!(
        missing.stderr.contains("qvnothere0 does not exist"),
        "{missing:?}"
    );
    let lo = qs(
        control,
        &["port", "add", "x", "--type", "veth", "--ifname", "lo"],
    );
    assert!(!lo.ok());
    assert!(lo.stderr.contains("not a veth"), "{lo:?}");
    // Nothing half-made: no port, no slow path TAP for lo.
    let list = qs_json(control, &["port", "list", "--json"]);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert!(!common::link_exists("qsv1"));
    // The slow path TAP takes only what comes from the veth: the host's own frames (here,
    // ARP from an address someone put on the TAP) never reach the switch as a's.
    let index =
        std::fs::read_to_string(format!("/sys/class/net/{}/ifindex", lab.ports[0].1)).unwrap();
    let tap = format!("qsv{}", index.trim());
    assert!(common::link_exists(&tap));
    let before = lab.slow_rx('a');
    sh_ok(&["ip", "addr", "add", "10.201.5.250/24", "dev", &tap]);
    let ping = common::run_timeout(
        std::process::Command::new("ping").args(["-n", "-c", "2", "-W", "1", "10.201.5.1"]),
        Duration::from_secs(10),
    );
    assert!(
        !ping.ok(),
        "the host reached a through the slow path: {ping:?}"
    );
    assert_eq!(
        lab.slow_rx('a'),
        before,
        "the host's frames reached the switch"
    );
    // A veth port goes with its slow path TAP, and comes back without the fast path when
    // asked.
    qs(control, &["port", "del", "a"]).assert_ok("port del");
    assert!(!common::link_exists(&tap), "{tap} left behind");
    qs(
        control,
        &[
            "port",
            "add",
            "a",
            "--type",
            "veth",
            "--ifname",
            &lab.ports[0].1,
            "--no-fastpath",
        ],
    )
    .assert_ok("port add");
    let list = qs_json(control, &["port", "list", "--json"]);
    assert_eq!(list[0]["fastpath"], false, "{list}");
}

#[test]
fn addresses_busy_on_the_fast_path_do_not_age_out() {
    if !root_or_skip() {
        return;
    }
    // Two-second aging: a's and b's addresses would be gone twice over in 5 s if the
    // switch did not hear of the frames the kernel forwards.
    let lab = Lab::with(6, &[veth('a'), veth('b')], "fdb_aging = 2\n");
    lab.assert_ping('a', 'b');
    assert!(wait_until(Duration::from_secs(3), || {
        lab.ping('a', 'b', 1);
        lab.fast('a').0 > 0
    }));
    let slow = (lab.slow_rx('a'), lab.slow_rx('b'));
    // 5 s of echoes every 50 ms, all through the kernel.
    assert!(lab.ping('a', 'b', 100), "ping a -> b");
    let fdb = qs(&lab.daemon.control, &["fdb"]).stdout;
    for p in ["a", "b"] {
        assert!(
            fdb.lines().any(|l| l.split_whitespace().nth(2) == Some(p)),
            "{p} aged out\n{fdb}"
        );
    }
    // Had they aged out, the echoes would have been flooded through the workers.
    let now = (lab.slow_rx('a'), lab.slow_rx('b'));
    assert!(
        now.0 <= slow.0 + 4 && now.1 <= slow.1 + 4,
        "slow path moved: {slow:?} -> {now:?}"
    );
}

/// The link-local address the kernel would give an interface with MAC `mac` (EUI-64).
fn eui64_link_local(mac: &str) -> std::net::Ipv6Addr {
    let m: Vec<u8> = mac
        .trim()
        .split(':')
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    std::net::Ipv6Addr::new(
        0xfe80,
        0,
        0,
        0,
        u16::from_be_bytes([m[0] ^ 2, m[1]]),
        u16::from_be_bytes([m[2], 0xff]),
        u16::from_be_bytes([0xfe, m[3]]),
        u16::from_be_bytes([m[4], m[5]]),
    )
}

/// Whether a TCP connection from namespace `ns` (out of its `eth0`) to `[addr]:port` is
/// accepted within 2 s.
fn tenant_connects(ns: &str, addr: std::net::Ipv6Addr, port: u16) -> bool {
    let path = std::path::PathBuf::from(format!("/run/netns/{ns}"));
    std::thread::spawn(move || {
        qswitch_sys::netns::enter(&path).expect("enter the tenant's namespace");
        let scope = qswitch_sys::xdp::ifindex("eth0").expect("eth0");
        let to = std::net::SocketAddrV6::new(addr, port, 0, scope);
        std::net::TcpStream::connect_timeout(&to.into(), Duration::from_secs(2)).is_ok()
    })
    .join()
    .expect("connect thread")
}

/// Audit finding F2: after `port del`, a stop or a `kill -9`, the tenant's namespace reached
/// the host's own IPv6 link-local address on the veth's root end and connected to a host
/// service listening on `[::]:PORT`. The root end now never has an address or a link-local
/// (address generation off from the moment qswitch takes it) and is down when the port goes;
/// after a crash it stays up but still has nothing the tenant could reach. The last step
/// shows the door is real: with address generation back on, the same connection succeeds.
#[test]
fn the_root_end_of_a_veth_is_no_door_into_the_host() {
    if !root_or_skip() {
        return;
    }
    let mut lab = Lab::new(9, &[veth('a'), veth('b')]);
    let ifa = lab.ports[0].1.clone();
    let ns = lab.ns('a').name.clone();
    let ns = ns.as_str();
    // The tenant speaks IPv6 (the lab turns it off).
    lab.ns('a')
        .ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=0"]);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let a = lab
                .ns('a')
                .ok(&["ip", "-6", "addr", "show", "dev", "eth0"])
                .stdout;
            a.contains("fe80") && !a.contains("tentative")
        }),
        "the tenant's link-local"
    );
    // A host service on every address.
    let listener = std::net::TcpListener::bind("[::]:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let mac = std::fs::read_to_string(format!("/sys/class/net/{ifa}/address")).unwrap();
    let ll = eui64_link_local(&mac);
    let sealed = |what: &str| {
        let link = sh_ok(&["ip", "-d", "link", "show", "dev", &ifa]).stdout;
        assert!(link.contains("addrgenmode none"), "{what}: {link}");
        let addrs = sh_ok(&["ip", "addr", "show", "dev", &ifa]).stdout;
        assert!(
            !addrs.contains("inet"),
            "{what}: an address on the root end: {addrs}"
        );
        assert!(
            !tenant_connects(ns, ll, port),
            "{what}: the tenant reached the host"
        );
    };
    let is_up = || {
        sh_ok(&["ip", "-o", "link", "show", "dev", &ifa])
            .stdout
            .contains(",UP")
    };
    lab.assert_ping('a', 'b');
    sealed("running");

    // port del: down, and nothing to reach even if someone sets it up.
    qs(&lab.daemon.control, &["port", "del", "a"]).assert_ok("port del");
    assert!(!is_up(), "the root end is up after port del");
    sealed("after port del");
    sh_ok(&["ip", "link", "set", "dev", &ifa, "up"]);
    sealed("after port del, set up by hand");

    // A stop (SIGTERM): down.
    qs(
        &lab.daemon.control,
        &["port", "add", "a", "--type", "veth", "--ifname", &ifa],
    )
    .assert_ok("port add");
    lab.assert_ping('a', 'b');
    assert!(lab.daemon.terminate(Duration::from_secs(15)).is_some());
    assert!(!is_up(), "the root end is up after a stop");
    sealed("after a stop");

    // kill -9: left up, still nothing to reach.
    let control = lab.dir.join("control.sock");
    let _ = std::fs::remove_file(&control);
    lab.daemon = DaemonChild::start(lab.dir.path(), "qswitch2", &lab.config, &control);
    lab.assert_ping('a', 'b');
    lab.daemon.kill();
    assert!(is_up());
    sealed("after kill -9");

    // The door the seal closes: address generation on again, a link-local, a connection.
    sh_ok(&[
        "ip",
        "link",
        "set",
        "dev",
        &ifa,
        "addrgenmode",
        "eui64",
        "arp",
        "on",
    ]);
    sh_ok(&["ip", "link", "set", "dev", &ifa, "down"]);
    sh_ok(&["ip", "link", "set", "dev", &ifa, "up"]);
    assert!(
        wait_until(Duration::from_secs(10), || tenant_connects(ns, ll, port)),
        "the tenant never reached the host through an unsealed root end: the test proves nothing"
    );
}

/// The tenant's end of a veth pair in `ns`: `ifn` in the root namespace, `eth0` with
/// `addr` in `ns`, up.
fn tenant_link(ns: &Netns, ifn: &str, addr: &str) {
    sh_ok(&[
        "ip", "link", "add", ifn, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
    ]);
    ns.ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1"]);
    ns.ok(&["ip", "addr", "add", addr, "dev", "eth0"]);
    ns.ok(&["ip", "link", "set", "eth0", "up"]);
}

/// `port list --json`'s entry of `port`.
fn port_entry(lab: &Lab, port: char) -> Value {
    let list = qs_json(&lab.daemon.control, &["port", "list", "--json"]);
    list.as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == port.to_string())
        .cloned()
        .unwrap_or(Value::Null)
}

/// Issue 27 F6: a tenant deleted the interface of a veth port added live, and the next start
/// exited 1 with no port up. Now the port waits for its interface, down, shown in
/// `port list`; the other ports start and switch; when the interface is back the port opens
/// (on the kernel's link notification) and switches too.
#[test]
fn a_port_whose_interface_is_missing_at_start_waits_for_it() {
    if !root_or_skip() {
        return;
    }
    let mut lab = Lab::new(10, &[veth('a'), veth('b')]);
    let control = lab.dir.join("control.sock");
    let ns = Netns::new(&format!("qsvt{}-10c", std::process::id()));
    let ifc = ifname(10, 'c');
    tenant_link(&ns, &ifc, "10.201.10.3/24");
    lab._links.push(LinkGuard(ifc.clone()));
    lab.ports.push(('c', ifc.clone(), ns));
    qs(
        &control,
        &["port", "add", "c", "--type", "veth", "--ifname", &ifc],
    )
    .assert_ok("port add c");
    lab.assert_ping('a', 'c');
    // The tenant deletes its end, and the pair goes.
    lab.ns('c').ok(&["ip", "link", "del", "eth0"]);
    assert!(wait_until(Duration::from_secs(5), || !common::link_exists(
        &ifc
    )));
    // A live `port add` of a missing interface still fails, with the reason.
    let out = qs(
        &control,
        &["port", "add", "d", "--type", "veth", "--ifname", "qvnone0"],
    );
    assert!(
        !out.ok() && out.stderr.contains("does not exist"),
        "{}",
        out.stderr
    );
    // The restart (same config, so the same recorded state) comes up.
    assert!(lab.daemon.terminate(Duration::from_secs(10)).is_some());
    let _ = std::fs::remove_file(&control);
    lab.daemon = DaemonChild::start(lab.dir.path(), "qswitch", &lab.config, &control);
    lab.assert_ping('a', 'b');
    let c = port_entry(&lab, 'c');
    assert_eq!(c["waiting"], ifc.as_str(), "{c}");
    assert_eq!(c["queues"], serde_json::json!([]), "{c}");
    let text = qs(&control, &["port", "list"]);
    assert!(
        text.stdout
            .contains(&format!("down: waiting for interface {ifc}")),
        "{}",
        text.stdout
    );
    // The interface comes back: the port opens and switches.
    tenant_link(lab.ns('c'), &ifc, "10.201.10.3/24");
    assert!(
        wait_until(Duration::from_secs(10), || port_entry(&lab, 'c')["waiting"]
            .is_null()),
        "port c still waiting: {}",
        lab.daemon.log_text()
    );
    lab.assert_ping('a', 'c');
    assert!(lab.daemon.running());
}

/// veth ports beside a VXLAN port, across a veth underlay to a Linux bridge + vxlan peer
/// (namespaces `qsvo<pid>-*`): a qswitch in host namespace `h` (VXLAN port `vx`, veth ports
/// `a` and `b` into VM namespaces), the peer host `p` with VM `r`. Local unicast between the
/// veth ports takes the kernel fast path; TCP to the remote VM works and, once the switch
/// knows both ends, is encapsulated and decapsulated in the kernel (docs/overlay.md, "veth
/// ports across hosts"); a remote MAC that ages out goes back to the workers.
#[test]
fn veth_ports_reach_a_linux_vxlan_peer_through_the_vxlan_port() {
    if !root_or_skip() {
        return;
    }
    let pid = std::process::id() % 100_000;
    let ns = |tag: &str| Netns::new(&format!("qsvo{pid}-{tag}"));
    // Declared before the daemon, so dropped after it.
    let (h, p, va, vb, vr) = (ns("h"), ns("p"), ns("va"), ns("vb"), ns("vr"));
    let dir = TempDir::new("veth-overlay");
    // Underlay 10.202.0.0/24; the VMs' network 10.203.0.0/24 at the overlay's MTU.
    h.ok(&[
        "ip", "link", "add", "ul", "type", "veth", "peer", "name", "ul", "netns", &p.name,
    ]);
    for (host, addr) in [(&h, "10.202.0.1/24"), (&p, "10.202.0.2/24")] {
        host.ok(&["ip", "addr", "add", addr, "dev", "ul"]);
        host.ok(&["ip", "link", "set", "ul", "up"]);
    }
    let vm = |host: &Netns, root_end: &str, vm: &Netns, addr: &str| {
        host.ok(&[
            "ip", "link", "add", root_end, "type", "veth", "peer", "name", "eth0", "netns",
            &vm.name,
        ]);
        vm.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
        vm.ok(&["ip", "addr", "add", addr, "dev", "eth0"]);
        vm.ok(&["ip", "link", "set", "eth0", "mtu", "1450", "up"]);
    };
    vm(&h, "qa", &va, "10.203.0.1/24");
    vm(&h, "qb", &vb, "10.203.0.2/24");
    vm(&p, "vmp", &vr, "10.203.0.3/24");
    p.ok(&["ip", "link", "add", "br0", "type", "bridge"]);
    p.ok(&[
        "ip",
        "link",
        "add",
        "vx0",
        "type",
        "vxlan",
        "id",
        "100",
        "local",
        "10.202.0.2",
        "remote",
        "10.202.0.1",
        "dstport",
        "4789",
    ]);
    for d in ["vx0", "vmp"] {
        p.ok(&["ip", "link", "set", d, "master", "br0"]);
    }
    for d in ["vx0", "vmp", "br0"] {
        p.ok(&["ip", "link", "set", d, "up"]);
    }
    // Linux's vxlan leaves the inner TCP checksum to the underlay's offload, which a veth
    // hands on unfilled: a UDP socket (qswitch's VXLAN port) would get the bytes without it
    // (docs/overlay.md, "A Linux vxlan peer over a veth underlay"). A NIC fills it in; here
    // the device does.
    p.ok(&["ethtool", "-K", "vx0", "tx", "off"]);
    let control = dir.join("control.sock");
    let config = dir.join("qswitch.toml");
    std::fs::write(
        &config,
        format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\nfdb_aging = 3\n\
             [[port]]\nname = \"vx\"\ntype = \"vxlan\"\nvni = 100\nlocal = \"10.202.0.1\"\nremotes = [\"10.202.0.2\"]\n\
             [[port]]\nname = \"a\"\ntype = \"veth\"\nifname = \"qa\"\nfastpath = true\n\
             [[port]]\nname = \"b\"\ntype = \"veth\"\nifname = \"qb\"\nfastpath = true\n",
            worker_cpus(1),
            control.display(),
            dir.join("state").display()
        ),
    )
    .unwrap();
    let log = dir.join("qswitch.log");
    let _daemon = h.spawn(
        &[QSWITCH, "run", "--config", config.to_str().unwrap()],
        &log,
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(10), || qs(&control, &["port", "list"])
            .ok()),
        "qswitch did not start: {}",
        log_text()
    );
    let ping = |from: &Netns, to: &str| {
        let out = from.run_for(
            &["ping", "-n", "-c", "3", "-i", "0.05", "-W", "1", to],
            Duration::from_secs(10),
        );
        out.ok() && out.stdout.contains(" 0% packet loss")
    };
    let stats = || qs_json(&control, &["stats", "--json"]);
    let fast = |s: &Value, port: &str| {
        let f = &common::port_stats(s, port)["fastpath"];
        (
            f["rx_bytes"].as_u64().unwrap_or(0),
            f["tx_bytes"].as_u64().unwrap_or(0),
        )
    };
    // Local unicast: the fast path, beside the VXLAN port.
    assert!(
        wait_until(Duration::from_secs(5), || {
            ping(&va, "10.203.0.2");
            fast(&stats(), "a").0 > 0
        }),
        "a -> b never took the fast path: {}",
        log_text()
    );
    // Across the overlay.
    assert!(
        wait_until(Duration::from_secs(5), || ping(&va, "10.203.0.3")),
        "a -> r across the overlay: {}",
        log_text()
    );
    let before = stats();
    let _server = vr.spawn(
        &["iperf3", "-s", "-1", "-B", "10.203.0.3"],
        &dir.join("iperf3-s.log"),
    );
    assert!(vr.wait_listening(5201), "iperf3 server");
    let out = va.run_for(
        &["iperf3", "-c", "10.203.0.3", "-t", "2", "-J"],
        Duration::from_secs(20),
    );
    assert!(out.ok(), "{out:?}");
    let v: Value = serde_json::from_str(&out.stdout).unwrap();
    let received = v["end"]["sum_received"]["bytes"].as_u64().unwrap();
    assert!(received > 1_000_000, "{v}");
    let after = stats();
    let vx_tx = counter(&after, "vx", "tx_bytes") - counter(&before, "vx", "tx_bytes");
    assert!(
        vx_tx >= received * 9 / 10,
        "{vx_tx} bytes out of the VXLAN port for {received} received: {after}"
    );
    // Most of it in the kernel both ways (docs/overlay.md, "veth ports across hosts"): a's
    // frames encapsulated by its fast path program, r's decapsulated on the underlay; and
    // Linux's vxlan device took the former as VNI 100 (it hands vmp nothing else).
    let (fa0, fa1) = (fast(&before, "a"), fast(&after, "a"));
    let (fx0, fx1) = (fast(&before, "vx"), fast(&after, "vx"));
    assert!(
        fa1.0 - fa0.0 >= received / 2 && fx1.1 - fx0.1 >= received / 2,
        "a {fa0:?} -> {fa1:?}, vx {fx0:?} -> {fx1:?} for {received}: not in the kernel"
    );
    assert!(
        fa1.1 > fa0.1 && fx1.0 > fx0.0,
        "a {fa0:?} -> {fa1:?}, vx {fx0:?} -> {fx1:?}: nothing decapsulated in the kernel"
    );
    // A remote MAC that ages out goes back to the workers: the next frame to it is unknown
    // unicast (flooded by the switch), and its answer is learnt from the socket again.
    let r_mac = vr.mac("eth0");
    // (`fdb` also lists the VXLAN port's remote table, which ages on its own clock: the
    // switch's entry is gone once no entry of the MAC is younger than `fdb_aging`.)
    let fdb_live = |mac: &str| {
        let f = qs_json(&control, &["fdb", "--json"]);
        f.as_array().is_some_and(|a| {
            a.iter().any(|e| {
                e["mac"].as_str() == Some(mac) && e["age_ms"].as_u64().unwrap_or(0) <= 3000
            })
        })
    };
    assert!(
        wait_until(Duration::from_secs(15), || !fdb_live(&r_mac)),
        "{r_mac} never aged out"
    );
    let slow_a = |s: &Value| -> u64 {
        common::port_stats(s, "a")["queues"]
            .as_array()
            .unwrap()
            .iter()
            .map(|q| q["rx_packets"].as_u64().unwrap())
            .sum()
    };
    let quiet = stats();
    assert!(ping(&va, "10.203.0.3"), "a -> r after aging");
    let relearnt = stats();
    assert!(
        slow_a(&relearnt) > slow_a(&quiet),
        "a's frames to an aged-out MAC did not reach the workers"
    );
    // Once the switch knows it again, the kernel path takes over again.
    assert!(
        wait_until(Duration::from_secs(5), || {
            ping(&va, "10.203.0.3");
            fast(&stats(), "vx").1 > fast(&relearnt, "vx").1
        }),
        "the kernel path did not come back: {}",
        log_text()
    );
}
