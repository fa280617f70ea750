//! The firewall end to end (root only): a `qswitch run` daemon whose ports (TAP, or veth
//! with its fast path on) are in network namespaces this test creates, with real TCP, UDP
//! and ICMP between them (python3 sockets, ping).
//!
//! Every test has its own number `n`: its namespaces are `qsfw<pid>-<n><port>`, its
//! interfaces `qf<n><port><pid>`, its subnet 10.202.<n>.0/24. Port `a` is in group `web`
//! (TCP 8080 and UDP 5353 in, everything out); port `b` has no group.

mod common;

use std::time::Duration;

use common::{
    drops, have_tool, qs, qs_json, require, root_or_skip, sh_ok, wait_until, worker_cpus,
    ChildGuard, DaemonChild, LinkGuard, Netns, TempDir,
};

const GROUP: &str = r#"
[[security_group]]
name = "web"
rules = [
  { direction = "ingress", protocol = "tcp", ports = "8080" },
  { direction = "egress" },
  { direction = "ingress", protocol = "udp", ports = "5353" },
]
"#;

/// A TCP server on `port` that answers "hi" and then echoes until the peer closes.
const SERVER: &str = "
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', int(sys.argv[1])))
s.listen(64)
def serve(c):
    c.sendall(b'hi')
    while True:
        d = c.recv(100)
        if not d:
            break
        c.sendall(d)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
";

/// Connects to argv[1]:argv[2] (2 s) and prints what the server says first, or `timeout`.
const CLIENT: &str = "
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
    print(s.recv(2).decode())
except (socket.timeout, TimeoutError):
    print('timeout')
except ConnectionRefusedError:
    print('refused')
";

/// Sends a UDP datagram to argv[1]:argv[2] on a connected socket: `refused` when the ICMP
/// port-unreachable comes back, `timeout` when nothing does.
const UDP: &str = "
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
s.connect((sys.argv[1], int(sys.argv[2])))
s.send(b'x')
try:
    s.recv(10)
    print('data')
except ConnectionRefusedError:
    print('refused')
except (socket.timeout, TimeoutError):
    print('timeout')
";

/// A UDP server on argv[1] that sends every datagram back.
const UDP_ECHO: &str = "
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(('0.0.0.0', int(sys.argv[1])))
while True:
    d, peer = s.recvfrom(2048)
    s.sendto(d or b'x', peer)
";

/// Opens argv[3] connections to argv[1]:argv[2] and holds them; then one more, which must
/// time out; then the first still echoes. Prints `held N`, the last one's fate, `echo ok`.
const LIMIT: &str = "
import socket, sys
ip, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for _ in range(n):
    c = socket.create_connection((ip, port), timeout=2)
    c.recv(2)
    held.append(c)
print('held', len(held))
try:
    socket.create_connection((ip, port), timeout=2)
    print('extra open')
except (socket.timeout, TimeoutError):
    print('extra timeout')
held[0].sendall(b'ping')
print('echo ok' if held[0].recv(4) == b'ping' else 'echo bad')
";

struct Lab {
    daemon: DaemonChild,
    /// Per port: its namespace.
    ns: Vec<Netns>,
    _links: Vec<LinkGuard>,
    n: u8,
    dir: TempDir,
    /// The daemon's `[switch] http`, for `/metrics`.
    http: std::net::SocketAddr,
}

fn ifname(n: u8, port: char) -> String {
    format!("qf{n}{port}{}", std::process::id() % 100_000)
}

impl Lab {
    /// Ports `a` (group web, with `a_keys`) and `b`, of kind `kind` (tap or veth).
    fn new(n: u8, kind: &str, a_keys: &str) -> Lab {
        Lab::build(n, kind, &format!("security_groups = [\"web\"]\n{a_keys}\n"))
    }

    /// Ports `a` (with the keys `a_table`) and `b`, of kind `kind` (tap or veth).
    fn build(n: u8, kind: &str, a_table: &str) -> Lab {
        let dir = TempDir::new(&format!("fw{n}"));
        let control = dir.join("control.sock");
        let pid = std::process::id();
        let http = qswitch_test_support::free_tcp_addr();
        let mut text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nhttp = \"{http}\"\n{GROUP}",
            worker_cpus(2),
            control.display()
        );
        let mut ns = Vec::new();
        let mut links = Vec::new();
        for (i, name) in ['a', 'b'].into_iter().enumerate() {
            let netns = Netns::new(&format!("qsfw{pid}-{n}{name}"));
            let ifn = ifname(n, name);
            text.push_str(&format!(
                "[[port]]\nname = \"{name}\"\ntype = \"{kind}\"\nifname = \"{ifn}\"\n"
            ));
            if name == 'a' {
                text.push_str(a_table);
            }
            if kind == "veth" {
                text.push_str("fastpath = true\n");
                sh_ok(&[
                    "ip",
                    "link",
                    "add",
                    &ifn,
                    "type",
                    "veth",
                    "peer",
                    "name",
                    "eth0",
                    "netns",
                    &netns.name,
                ]);
                links.push(LinkGuard(ifn.clone()));
                netns.sysctl("net.ipv6.conf.eth0.disable_ipv6", "1");
                netns.ok(&[
                    "ip",
                    "addr",
                    "add",
                    &format!("10.202.{n}.{}/24", i + 1),
                    "dev",
                    "eth0",
                ]);
                netns.ok(&["ip", "link", "set", "eth0", "up"]);
            }
            ns.push(netns);
        }
        let daemon = DaemonChild::start(dir.path(), "qswitch", &text, &control);
        if kind == "tap" {
            for (i, name) in ['a', 'b'].into_iter().enumerate() {
                ns[i].adopt(&ifname(n, name), &format!("10.202.{n}.{}/24", i + 1), false);
            }
        }
        Lab {
            daemon,
            ns,
            _links: links,
            n,
            dir,
            http,
        }
    }

    fn ns(&self, port: char) -> &Netns {
        &self.ns[if port == 'a' { 0 } else { 1 }]
    }

    fn ip(&self, port: char) -> String {
        format!("10.202.{}.{}", self.n, if port == 'a' { 1 } else { 2 })
    }

    fn python(&self, on: char, script: &str, args: &[&str]) -> String {
        let mut argv = vec!["python3", "-c", script];
        argv.extend_from_slice(args);
        let out = self.ns(on).run_for(&argv, Duration::from_secs(20));
        assert!(out.ok(), "python3 in {on}: {out:?}");
        out.stdout.trim().to_string()
    }

    fn server(&self, on: char, port: u16) -> ChildGuard {
        let p = port.to_string();
        let log = self.dir.join(&format!("server-{on}-{port}.log"));
        let child = self.ns(on).spawn(&["python3", "-c", SERVER, &p], &log);
        assert!(
            self.ns(on).wait_listening(port),
            "server on {port} did not start"
        );
        child
    }

    fn udp_server(&self, on: char, port: u16) -> ChildGuard {
        let p = port.to_string();
        let log = self.dir.join(&format!("udp-{on}-{port}.log"));
        let child = self.ns(on).spawn(&["python3", "-c", UDP_ECHO, &p], &log);
        let needle = format!(":{port} ");
        assert!(
            wait_until(Duration::from_secs(5), || {
                self.ns(on).run(&["ss", "-Huln"]).stdout.contains(&needle)
            }),
            "UDP server on {port} did not start"
        );
        child
    }

    fn connect(&self, from: char, to: char, port: u16) -> String {
        self.python(from, CLIENT, &[&self.ip(to), &port.to_string()])
    }

    fn ping(&self, from: char, to: char) -> bool {
        self.ns(from)
            .run_for(
                &[
                    "ping",
                    "-n",
                    "-c",
                    "2",
                    "-i",
                    "0.2",
                    "-W",
                    "1",
                    &self.ip(to),
                ],
                Duration::from_secs(10),
            )
            .ok()
    }

    /// `port list --json`'s `fastpath` of `port` (veth ports: whether it is on).
    fn fast_on(&self, port: char) -> Option<bool> {
        let list = qs_json(&self.daemon.control, &["port", "list", "--json"]);
        list.as_array()?
            .iter()
            .find(|p| p["name"] == port.to_string())
            .and_then(|p| p["fastpath"].as_bool())
    }

    /// `/metrics`' frames that `port`'s filter allowed or denied in `direction`.
    fn frames(&self, port: &str, direction: &str, verdict: &str) -> Option<u64> {
        self.scrape_line(&format!(
            "qswitch_firewall_frames_total{{port=\"{port}\",direction=\"{direction}\",verdict=\"{verdict}\"}}"
        ))
    }

    fn drops(&self, port: &str, reason: &str) -> u64 {
        drops(&self.daemon.stats(), port, reason)
    }

    /// The value of `family{port="<port>"}` in a scrape of `/metrics`, if it is there.
    fn metric(&self, family: &str, port: &str) -> Option<u64> {
        self.scrape_line(&format!("{family}{{port=\"{port}\"}}"))
    }

    /// The value of the sample `series` (name and labels) in a scrape of `/metrics`.
    fn scrape_line(&self, series: &str) -> Option<u64> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect_timeout(&self.http, Duration::from_secs(5))
            .expect("connect to /metrics");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!(
            "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.http
        );
        s.write_all(req.as_bytes()).expect("send");
        let mut text = String::new();
        let _ = s.read_to_string(&mut text);
        let prefix = format!("{series} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    }
}

/// Ingress default deny, an allowed TCP port opens, replies to egress connections (TCP and
/// ping) pass, and an ICMP port-unreachable for an allowed UDP flow passes as related.
fn default_deny_and_state(n: u8, kind: &str) {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(n, kind, "");
    let _open = lab.server('a', 8080);
    let _closed = lab.server('a', 9090);
    let _out = lab.server('b', 7070);
    // ARP is not the firewall's: b learns a's address whatever the rules.
    assert_eq!(lab.connect('b', 'a', 8080), "hi", "web/0 lets TCP 8080 in");
    assert_eq!(lab.connect('b', 'a', 9090), "timeout", "no rule for 9090");
    assert!(lab.drops("a", "fw_denied_ingress") > 0);
    assert!(!lab.ping('b', 'a'), "no rule lets ICMP in");
    // Egress: everything, and the replies come back.
    assert!(lab.ping('a', 'b'), "a's echo requests and their replies");
    assert_eq!(
        lab.connect('a', 'b', 7070),
        "hi",
        "a reply to an egress connection"
    );
    // UDP to a closed port of b: b's ICMP port-unreachable is related to a's flow.
    assert_eq!(lab.python('a', UDP, &[&lab.ip('b'), "7071"]), "refused");
    assert_eq!(lab.drops("a", "ct_invalid"), 0, "{}", lab.daemon.log_text());
    // /metrics: the connections a's rules opened (8080 in; ping, 7070, 7071 out), none
    // invalid; b has no groups and no firewall families.
    let new = lab.metric("qswitch_firewall_new_sessions_total", "a");
    assert!(new.is_some_and(|n| n >= 4), "new sessions of a: {new:?}");
    assert_eq!(
        lab.metric("qswitch_firewall_ct_invalid_total", "a"),
        Some(0)
    );
    assert_eq!(lab.metric("qswitch_firewall_ct_limit_total", "a"), Some(0));
    assert!(lab.metric("qswitch_firewall_sessions", "a").is_some());
    assert_eq!(lab.metric("qswitch_firewall_sessions", "b"), None);
    // web/0 (TCP 8080 in) opened the one connection b made to a.
    let hits =
        lab.scrape_line("qswitch_firewall_rule_hits_total{port=\"a\",group=\"web\",index=\"0\"}");
    assert_eq!(hits, Some(1), "hits of web/0 on a");
    let control = &lab.daemon.control;
    let show = qs_json(control, &["sg", "show", "web", "--json"]);
    assert_eq!(show[0]["hits"][0], 1, "sg show: hits of web/0: {show}");
    let egress = show[0]["hits"][1].as_u64();
    assert!(
        egress.is_some_and(|n| n >= 3),
        "web/1 opened a's connections out: {show}"
    );
    // A rule added to the group recompiles it: web/0 keeps its count, the new rule is 0.
    let add = [
        "sg",
        "rule",
        "add",
        "web",
        "--direction",
        "ingress",
        "--protocol",
        "sctp",
    ];
    qs(control, &add).assert_ok("sg rule add");
    let show = qs_json(control, &["sg", "show", "web", "--json"]);
    assert_eq!(
        show[0]["hits"],
        serde_json::json!([1, show[0]["hits"][1], 0, 0]),
        "{show}"
    );
    // Frames per direction and verdict: a's filter let frames in (8080, replies) and out,
    // and refused some in (9090, ping); the denied are the drop reason's count.
    for dir in ["ingress", "egress"] {
        let allowed = lab.frames("a", dir, "allowed");
        assert!(allowed.is_some_and(|n| n > 0), "{dir} allowed: {allowed:?}");
    }
    let denied = lab.frames("a", "ingress", "denied");
    assert!(denied.is_some_and(|n| n > 0), "ingress denied: {denied:?}");
    assert!(denied <= Some(lab.drops("a", "fw_denied_ingress")));
    assert_eq!(lab.frames("a", "egress", "denied"), Some(0));
    let ct = qs_json(&lab.daemon.control, &["ct", "stats", "--json"]);
    let a = &ct["ports"][0];
    assert_eq!(a["port"], "a", "{ct}");
    assert!(a["allowed_ingress"].as_u64() > Some(0), "{ct}");
    assert!(a["allowed_egress"].as_u64() > Some(0), "{ct}");
    assert!(a["denied_ingress"].as_u64() > Some(0), "{ct}");
}

/// A veth port's groups set and removed live (`port set --security-groups`): with groups,
/// it leaves the kernel fast path at once and a flow its rules do not allow is really
/// dropped; without them it is back on the fast path and the flow passes.
#[test]
fn veth_groups_set_live_leave_and_rejoin_the_fast_path() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::build(5, "veth", "");
    let control = lab.daemon.control.clone();
    let _open = lab.server('a', 8080);
    let _closed = lab.server('a', 9090);
    assert_eq!(lab.connect('b', 'a', 9090), "hi", "no groups: not filtered");
    assert_eq!(lab.fast_on('a'), Some(true));

    qs(&control, &["port", "set", "a", "--security-groups", "web"]).assert_ok("port set");
    // At once: the change syncs the fast path's map before it answers.
    assert_eq!(
        lab.fast_on('a'),
        Some(false),
        "a with groups left the fast path"
    );
    assert_eq!(lab.connect('b', 'a', 9090), "timeout", "no rule for 9090");
    assert!(lab.drops("a", "fw_denied_ingress") > 0);
    assert_eq!(lab.connect('b', 'a', 8080), "hi", "web/0 lets TCP 8080 in");

    // An unknown group: one line, nothing changes.
    let out = qs(
        &control,
        &["port", "set", "a", "--security-groups", "web,nope"],
    );
    assert!(!out.ok(), "{out:?}");
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{out:?}");
    assert!(
        lines[0].contains("unknown security group 'nope'"),
        "{out:?}"
    );
    assert_eq!(lab.connect('b', 'a', 9090), "timeout", "still filtered");

    qs(&control, &["port", "set", "a", "--security-groups", ""]).assert_ok("port set ''");
    assert_eq!(lab.fast_on('a'), Some(true), "back on the fast path");
    assert_eq!(lab.connect('b', 'a', 9090), "hi", "no groups: not filtered");
}

#[test]
fn tap_default_deny_allowed_port_replies_and_related_icmp() {
    default_deny_and_state(1, "tap");
}

#[test]
fn veth_with_groups_leaves_the_fast_path_and_is_filtered() {
    default_deny_and_state(2, "veth");
}

#[test]
fn session_limit_refuses_new_connections_and_keeps_existing_ones() {
    if !root_or_skip() {
        return;
    }
    let lab = Lab::new(3, "tap", "max_sessions = 3");
    let _server = lab.server('a', 8080);
    let out = lab.python('b', LIMIT, &[&lab.ip('a'), "8080", "3"]);
    assert_eq!(
        out,
        "held 3\nextra timeout\necho ok",
        "{}",
        lab.daemon.log_text()
    );
    assert!(
        lab.drops("a", "ct_limit") > 0,
        "the refused connection is counted"
    );
    let limit = lab.metric("qswitch_firewall_ct_limit_total", "a");
    assert!(
        limit.is_some_and(|n| n > 0),
        "ct_limit in /metrics: {limit:?}"
    );
}

/// The port scanner's view from outside the group: `nmap -sS` and `nmap -sU` from b against
/// a, which listens on TCP 8080 and 9090 and UDP 5353 and 6000 and whose group lets only
/// TCP 8080 and UDP 5353 in. nmap sees 8080/tcp and 5353/udp open (the echo server
/// answers its probe), 9090/tcp filtered (no RST comes back), 6000/udp not open (no
/// answer at all: `open|filtered`).
#[test]
fn nmap_sees_only_the_allowed_ports() {
    if !root_or_skip() || !require(have_tool("nmap", &["-V"]), "nmap is not installed") {
        return;
    }
    let lab = Lab::new(4, "tap", "");
    let _tcp = [lab.server('a', 8080), lab.server('a', 9090)];
    let _udp = [lab.udp_server('a', 5353), lab.udp_server('a', 6000)];
    let scan = |kind: &str, ports: &str| {
        let out = lab.ns('b').run_for(
            &[
                "nmap",
                kind,
                "-Pn",
                "-n",
                "--max-retries",
                "1",
                "--host-timeout",
                "60s",
                "-p",
                ports,
                "-oG",
                "-",
                &lab.ip('a'),
            ],
            Duration::from_secs(90),
        );
        assert!(out.ok(), "nmap {kind}: {out:?}");
        out.stdout
    };
    let tcp = scan("-sS", "8080,9090");
    assert!(tcp.contains("8080/open/tcp"), "{tcp}");
    assert!(tcp.contains("9090/filtered/tcp"), "{tcp}");
    let udp = scan("-sU", "5353,6000");
    assert!(udp.contains("5353/open/udp"), "{udp}");
    assert!(udp.contains("6000/open|filtered/udp"), "{udp}");
    assert!(lab.drops("a", "fw_denied_ingress") > 0);
    assert_eq!(lab.drops("a", "ct_invalid"), 0, "{}", lab.daemon.log_text());
}
