//! AF_XDP uplinks end to end (root only). Each test builds its own world out of namespaces:
//!
//! ```text
//!   peer ns (the wire)          sw ns (qswitch runs here)              vm ns
//!   wU  10.201.n.1  ──veth──  uU ── afxdp port "up" ─┐
//!                                                     qswitch ── tap port "vm" ── qvN 10.201.n.2
//! ```
//!
//! The daemon itself runs inside the `sw` namespace (`ip netns exec`), so nothing touches the
//! root namespace; its TAP is moved into the `vm` namespace. For each mode (native, packet;
//! skb mode is refused on a veth, see `qswitch_dp::port::afxdp`): `port list` names the mode
//! in use, ping both ways, iperf3 TCP with 1 and 4 streams both ways, with the peer's
//! checksum offload off and GRO off on the uplink (see `qswitch_dp::port::afxdp`). `kill -9`
//! of qswitch leaves the veth to the kernel (no program, no promiscuity) and a restart
//! reattaches. Bad input (too many queues, a mode the driver refuses, skb
//! mode on a veth) is exit code 2 with one line and nothing attached; `port add` refuses the
//! same with one line (no such interface too); at start-up, an uplink whose interface does
//! not exist yet waits for it, down, and attaches when it appears (audit finding F6). A trunk
//! uplink keeps its VLANs apart and counts a VLAN it does not
//! carry as a drop, also when the wire's tags arrive out of band (audit finding F1). The
//! host-port recipe of docs/uplink.md: the "host" namespace's address moves from its NIC to
//! an internal TAP port, and the wire peer still reaches it. A vhost-user guest behind the
//! uplink: DPDK testpmd forwarding between a virtio-user port on qswitch's socket and a TAP
//! in a "guest" namespace, so that namespace's stack is the guest's; ping and iperf3 both
//! ways.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    have_tool, qs, qs_json, qswitch_bin, require, root_or_skip, run_timeout, wait_until,
    worker_cpus, ChildGuard, DaemonChild, Netns, Out, TempDir,
};
use serde_json::Value;

fn privileged() -> bool {
    root_or_skip()
        && require(have_tool("iperf3", &[]), "needs iperf3")
        && require(have_tool("ethtool", &[]), "needs ethtool")
        && require(have_tool("ip", &["-V"]), "needs the ip tool")
}

/// The namespaces and veth of one test; the daemon runs in `sw`. Drops the daemon first,
/// then the namespaces (which takes the veth and the TAP with them), then the temp dir.
struct World {
    daemon: Option<DaemonChild>,
    sw: Netns,
    peer: Netns,
    vm: Netns,
    n: u8,
    /// The daemon's `workers` (default: the first two online CPUs).
    workers: String,
    dir: TempDir,
}

impl World {
    /// Namespaces `qsup<pid>-<n>{s,p,v}` and a veth `uU` (sw) ↔ `wU` (peer), both up; the
    /// peer has 10.201.n.1/24.
    fn new(n: u8) -> World {
        let dir = TempDir::new(&format!("uplink{n}"));
        let pid = std::process::id() % 100_000;
        let ns = |c: char| Netns::new(&format!("qsup{pid}-{n}{c}"));
        let w = World {
            daemon: None,
            sw: ns('s'),
            peer: ns('p'),
            vm: ns('v'),
            n,
            workers: worker_cpus(2),
            dir,
        };
        for ns in [&w.sw, &w.peer, &w.vm] {
            ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
            ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
        }
        w.wire();
        w
    }

    /// The wire: a veth `uU` (sw) ↔ `wU` (peer), both up; the peer has 10.201.n.1/24.
    fn wire(&self) {
        common::sh_ok(&[
            "ip",
            "-n",
            &self.sw.name,
            "link",
            "add",
            "uU",
            "type",
            "veth",
            "peer",
            "name",
            "wU",
            "netns",
            &self.peer.name,
        ]);
        self.sw.ok(&["ip", "link", "set", "uU", "up"]);
        self.peer.ok(&[
            "ip",
            "addr",
            "add",
            &format!("10.201.{}.1/24", self.n),
            "dev",
            "wU",
        ]);
        self.peer.ok(&["ip", "link", "set", "wU", "up"]);
    }

    fn addr(&self, host: u8) -> String {
        format!("10.201.{}.{host}", self.n)
    }

    fn tap(&self) -> String {
        format!("qv{}", self.n)
    }

    /// Offloads as the port docs say for a veth standing in for a wire: the peer computes
    /// its checksums and sends wire-size frames; the uplink does not aggregate.
    fn offloads(&self) {
        self.peer.ok(&[
            "ethtool", "-K", "wU", "tx", "off", "tso", "off", "gso", "off",
        ]);
        self.sw.ok(&["ethtool", "-K", "uU", "gro", "off"]);
    }

    /// Starts the daemon in `sw` with `ports` (TOML `[[port]]` tables) and waits until it
    /// answers.
    fn start(&mut self, name: &str, ports: &str) {
        let (config, control) = self.write_config(name, ports);
        let mut d = spawn_in(
            &self.sw,
            &config,
            &control,
            &self.dir.join(&format!("{name}.log")),
        );
        d.wait_ready();
        self.daemon = Some(d);
    }

    fn write_config(&self, name: &str, ports: &str) -> (PathBuf, PathBuf) {
        let control = self.dir.join(&format!("{name}.sock"));
        let config = self.dir.join(&format!("{name}.toml"));
        // The namespace's own loopback: every test's daemon may use the same HTTP port.
        let text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nhttp = \"127.0.0.1:9479\"\n{ports}",
            self.workers,
            control.display()
        );
        std::fs::write(&config, text).unwrap();
        (config, control)
    }

    fn control(&self) -> PathBuf {
        self.daemon.as_ref().expect("daemon").control.clone()
    }

    /// The standard ports: the uplink in `mode` and the TAP.
    fn ports(&self, mode: &str) -> String {
        format!(
            "[[port]]\nname = \"up\"\ntype = \"afxdp\"\nifname = \"uU\"\nmode = \"{mode}\"\n\
             [[port]]\nname = \"vm\"\ntype = \"tap\"\nifname = \"{}\"\n",
            self.tap()
        )
    }

    /// Moves the daemon's TAP into `vm` with 10.201.n.2/24.
    fn attach_vm(&self) {
        let tap = self.tap();
        self.sw
            .ok(&["ip", "link", "set", "dev", &tap, "netns", &self.vm.name]);
        self.vm.ok(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", self.addr(2)),
            "dev",
            &tap,
        ]);
        self.vm.ok(&["ip", "link", "set", "dev", &tap, "up"]);
    }

    fn port_json(&self, name: &str) -> Value {
        let ports = qs_json(&self.control(), &["port", "list", "--json"]);
        ports
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no port {name}: {ports}"))
    }

    /// `ip -d link show uU` in `sw`.
    fn uplink_link(&self) -> String {
        self.sw.ok(&["ip", "-d", "link", "show", "uU"]).stdout
    }

    /// No program and no promiscuity left on the uplink (polled for a second: the kernel
    /// releases sockets of a killed process asynchronously).
    fn assert_clean(&self) {
        let mut link = String::new();
        assert!(
            wait_until(Duration::from_secs(2), || {
                link = self.uplink_link();
                !link.contains("xdp") && link.contains("promiscuity 0")
            }),
            "an XDP program or promiscuous mode is left: {link}"
        );
    }

    fn log(&self) -> String {
        self.daemon
            .as_ref()
            .map(DaemonChild::log_text)
            .unwrap_or_default()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            if std::thread::panicking() {
                eprintln!("daemon log:\n{}", d.log_text());
            }
            d.kill();
        }
    }
}

/// `ip netns exec NS qswitch run --config config` (ip execs qswitch: same pid).
fn spawn_in(ns: &Netns, config: &Path, control: &Path, log: &Path) -> DaemonChild {
    let err = std::fs::File::create(log).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", &ns.name])
        .arg(qswitch_bin())
        .args(["run", "--config"])
        .arg(config)
        .env("STATE_DIRECTORY", config.with_extension("state"))
        .env("QSWITCH_LOG", "info")
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap();
    DaemonChild {
        child: ChildGuard::new(child),
        control: control.to_path_buf(),
        log: log.to_path_buf(),
    }
}

fn ping(from: &Netns, to: &str) -> Out {
    from.run_for(
        &["ping", "-n", "-c", "3", "-i", "0.2", "-W", "2", to],
        Duration::from_secs(15),
    )
}

fn assert_ping(from: &Netns, to: &str, what: &str) {
    // The first frames may flood before qswitch has learned both MACs: allow one retry.
    let out = ping(from, to);
    if !out.ok() {
        let again = ping(from, to);
        assert!(again.ok(), "{what}: ping {to}: {out:?}\nthen: {again:?}");
    }
}

/// iperf3 TCP for 2 s from `client` to the server at `server_ip` (in `server`), `streams`
/// streams, `reverse`: the server sends. Returns Gbit/s received.
fn iperf(server: &Netns, server_ip: &str, client: &Netns, streams: u32, reverse: bool) -> f64 {
    let dir = TempDir::new("uplink-iperf");
    let _srv = server.spawn(
        &["iperf3", "-s", "-1", "-B", server_ip],
        &dir.join("server.log"),
    );
    assert!(server.wait_listening(5201), "iperf3 server did not start");
    let p = streams.to_string();
    let mut args = vec![
        "iperf3",
        "-c",
        server_ip,
        "-t",
        "2",
        "-P",
        &p,
        "-J",
        "--connect-timeout",
        "3000",
    ];
    if reverse {
        args.push("-R");
    }
    let out = client.run_for(&args, Duration::from_secs(20));
    assert!(out.ok(), "iperf3 {args:?}: {out:?}");
    let v: Value = serde_json::from_str(&out.stdout).expect("iperf3 JSON");
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0);
    bps / 1e9
}

/// Ping and iperf3 both ways through the uplink in `mode`; `port list` says `expect_mode`.
fn run_mode(n: u8, mode: &str, expect_mode: &str) {
    if !privileged() {
        return;
    }
    let t0 = Instant::now();
    let mut w = World::new(n);
    w.offloads();
    w.start(mode, &w.ports(mode));
    w.attach_vm();

    let up = w.port_json("up");
    assert_eq!(up["type"], "afxdp", "{up}");
    assert_eq!(up["xdp_mode"], expect_mode, "{up}");
    assert!(up["kernel"]["rx_dropped"].is_u64(), "{up}");
    let link = w.uplink_link();
    if mode == "packet" {
        assert!(!link.contains("xdp"), "{link}");
    } else {
        assert!(link.contains("prog/xdp"), "{link}");
    }
    assert!(link.contains("promiscuity 1"), "{link}");
    let table = qs(&w.control(), &["port", "list"]);
    assert!(
        table
            .stdout
            .contains(&format!("xdp mode in use: {expect_mode}")),
        "{table:?}"
    );

    assert_ping(&w.peer, &w.addr(2), "peer → vm");
    assert_ping(&w.vm, &w.addr(1), "vm → peer");
    let mut rates = Vec::new();
    for (streams, reverse) in [(1, false), (4, false), (1, true), (4, true)] {
        let g = iperf(&w.vm, &w.addr(2), &w.peer, streams, reverse);
        rates.push(format!(
            "{} {streams}: {g:.2}",
            if reverse { "vm→peer" } else { "peer→vm" }
        ));
        assert!(
            g > 0.05,
            "{mode}: {streams} stream(s), reverse {reverse}: {g} Gbit/s"
        );
    }
    // One TCP conversation, data one way and ACKs the other: the uplink's queue and the
    // TAP's start on different workers, and the balancer's pair rule puts them on one.
    let place = qs_json(&w.control(), &["placement", "--json"]);
    let paired = place["moves"].as_array().is_some_and(|m| {
        m.iter()
            .any(|m| m["reason"].as_str().is_some_and(|r| r.starts_with("pair")))
    });
    assert!(paired, "no pair move: {place}");
    // /metrics (fetched inside sw, where the daemon listens): the mode and kernel drops.
    let metrics = w
        .sw
        .ok(&[
            "python3",
            "-c",
            "import urllib.request as u; print(u.urlopen('http://127.0.0.1:9479/metrics', timeout=5).read().decode())",
        ])
        .stdout;
    let info =
        format!("qswitch_port_info{{port=\"up\",kind=\"afxdp\",xdp_mode=\"{expect_mode}\"}} 1");
    assert!(metrics.contains(&info), "{info}\n{metrics}");
    assert!(
        metrics.contains("qswitch_afxdp_kernel_drops_total{port=\"up\",reason=\"rx_dropped\"}"),
        "{metrics}"
    );
    let stats = w.daemon.as_ref().unwrap().stats();
    let oversize = common::drops(&stats, "up", "oversize");
    assert_eq!(oversize, 0, "oversize drops on the uplink: {stats}");
    // Wire-size segments from the peer reach the vm namespace coalesced (GRO toward TAP).
    let vm = common::port_stats(&stats, "vm");
    let (frames, segments) = (
        vm["tap"]["gro_frames"].as_u64().unwrap_or(0),
        vm["tap"]["gro_segments"].as_u64().unwrap_or(0),
    );
    assert!(
        frames > 0 && segments >= 2 * frames,
        "GRO toward the TAP: {frames} super-frames of {segments} segments: {vm}"
    );
    assert!(
        metrics.contains("qswitch_tap_offload_total{port=\"vm\",kind=\"gro_frames\"}"),
        "{metrics}"
    );
    eprintln!(
        "{mode} ({expect_mode}): {frames} GRO super-frames of {segments} segments toward the TAP"
    );
    eprintln!(
        "{mode} ({expect_mode}): Gbit/s {} ({:.1} s)",
        rates.join(", "),
        t0.elapsed().as_secs_f64()
    );
    assert!(!w.log().contains("panicked"), "{}", w.log());
}

#[test]
fn native_mode_end_to_end() {
    run_mode(1, "native", "native-copy");
}

#[test]
fn packet_mode_end_to_end() {
    run_mode(3, "packet", "packet");
}

/// `kill -9`: the kernel has the veth back (no program, no promiscuity, an address on it
/// answers); a restart reattaches and switches again.
#[test]
fn kill_9_gives_the_uplink_back_and_a_restart_reattaches() {
    if !privileged() {
        return;
    }
    let mut w = World::new(4);
    w.offloads();
    w.start("first", &w.ports("native"));
    w.attach_vm();
    assert_ping(&w.peer, &w.addr(2), "before kill");
    assert!(w.uplink_link().contains("prog/xdp"));

    let mut d = w.daemon.take().unwrap();
    common::signal(d.pid(), "KILL");
    assert!(d.child.wait_timeout(Duration::from_secs(5)).is_some());
    w.assert_clean();
    // The kernel's stack receives on the veth again.
    let host = format!("{}/24", w.addr(3));
    w.sw.ok(&["ip", "addr", "add", &host, "dev", "uU"]);
    assert_ping(&w.peer, &w.addr(3), "kernel after kill -9");
    w.sw.ok(&["ip", "addr", "del", &host, "dev", "uU"]);
    w.peer.ok(&["ip", "neigh", "flush", "dev", "wU"]);

    // The TAP went with the process; the restart creates it again in sw.
    assert!(wait_until(Duration::from_secs(5), || !w
        .vm
        .has_link(&w.tap())));
    w.start("second", &w.ports("native"));
    w.attach_vm();
    assert_eq!(w.port_json("up")["xdp_mode"], "native-copy");
    assert!(w.uplink_link().contains("prog/xdp"));
    assert_ping(&w.peer, &w.addr(2), "after restart");
    assert_ping(&w.vm, &w.addr(1), "after restart, vm → peer");
}

/// Runs the daemon in `sw` with `ports` and expects exit 2 with one line containing `needle`.
fn expect_exit_2(w: &World, case: &str, ports: &str, needle: &str) {
    let (config, control) = w.write_config(case, ports);
    let out = run_timeout(
        Command::new("ip")
            .args(["netns", "exec", &w.sw.name])
            .arg(qswitch_bin())
            .args(["run", "--config"])
            .arg(&config)
            .env("STATE_DIRECTORY", config.with_extension("state"))
            // Start-up notes (a fresh state directory) are info lines; the error is the one
            // line this checks.
            .env("QSWITCH_LOG", "warn"),
        Duration::from_secs(15),
    );
    out.assert_no_panic();
    assert_eq!(out.code, Some(2), "{case}: {out:?}");
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "{case}: want one stderr line: {out:?}");
    assert!(
        lines[0].starts_with("qswitch: port 'up': "),
        "{case}: {out:?}"
    );
    assert!(lines[0].contains(needle), "{case}: {out:?}");
    assert!(!control.exists(), "{case}: the control socket is left");
    eprintln!("{case}: {}", lines[0]);
}

#[test]
fn bad_input_exits_2_with_one_line_and_attaches_nothing() {
    if !privileged() {
        return;
    }
    let mut w = World::new(5);
    let up = |ifname: &str, extra: &str| {
        format!("[[port]]\nname = \"up\"\ntype = \"afxdp\"\nifname = \"{ifname}\"\n{extra}")
    };
    let queues =
        w.sw.ok(&["ls", "/sys/class/net/uU/queues"])
            .stdout
            .lines()
            .filter(|l| l.starts_with("rx-"))
            .count();
    expect_exit_2(
        &w,
        "queues",
        &up("uU", "queues = 64\n"),
        &format!("interface uU has {queues} rx queue(s); 64 requested"),
    );
    w.assert_clean();
    // A bridge has no native XDP.
    w.sw.ok(&["ip", "link", "add", "qbr", "type", "bridge"]);
    w.sw.ok(&["ip", "link", "set", "qbr", "up"]);
    expect_exit_2(
        &w,
        "refused",
        &up("qbr", "mode = \"native\"\n"),
        "interface qbr refused mode native",
    );
    let br = w.sw.ok(&["ip", "-d", "link", "show", "qbr"]).stdout;
    assert!(!br.contains("xdp") && br.contains("promiscuity 0"), "{br}");

    // `port add` refuses the same with one line and changes nothing; a good one works.
    w.start(
        "running",
        &format!(
            "[[port]]\nname = \"vm\"\ntype = \"tap\"\nifname = \"{}\"\n",
            w.tap()
        ),
    );
    let control = w.control();
    for (args, needle) in [
        (
            vec!["--ifname", "qsnope"],
            "interface qsnope does not exist",
        ),
        (
            vec!["--ifname", "qbr", "--mode", "native"],
            "interface qbr refused mode native",
        ),
        (vec!["--ifname", "uU", "--queues", "64"], "64 requested"),
        (vec!["--ifname", "uU", "--mode", "client"], "does not apply"),
        // Generic XDP would miss 802.1Q tags the veth holds out of band (audit F1).
        (
            vec!["--ifname", "uU", "--mode", "skb"],
            "cannot see an 802.1Q tag",
        ),
    ] {
        let mut a = vec!["port", "add", "up", "--type", "afxdp"];
        a.extend(args);
        let out = qs(&control, &a);
        assert_eq!(out.code, Some(1), "{a:?}: {out:?}");
        let lines = out.stderr_lines();
        assert_eq!(lines.len(), 1, "{a:?}: {out:?}");
        assert!(lines[0].contains(needle), "{a:?}: {out:?}");
    }
    w.assert_clean();
    let names: Vec<String> = common::port_names(&control);
    assert_eq!(names, ["vm"]);
    qs(
        &control,
        &[
            "port", "add", "up", "--type", "afxdp", "--ifname", "uU", "--mode", "native",
        ],
    )
    .assert_ok("port add afxdp");
    assert_eq!(w.port_json("up")["xdp_mode"], "native-copy");
    assert!(w.uplink_link().contains("xdp"));
    qs(&control, &["port", "del", "up"]).assert_ok("port del");
    w.assert_clean();
}

/// docs/uplink.md's host-port recipe: the "host" (namespace sw) has its address on its NIC
/// (uU); qswitch takes the NIC as an uplink and the address moves to an internal TAP port
/// with the NIC's MAC; the wire peer still reaches the host, and the host the peer.
#[test]
fn host_address_moves_to_an_internal_port() {
    if !privileged() {
        return;
    }
    let mut w = World::new(6);
    w.offloads();
    let host = format!("{}/24", w.addr(10));
    w.sw.ok(&["ip", "addr", "add", &host, "dev", "uU"]);
    assert_ping(&w.peer, &w.addr(10), "before: the host on its NIC");
    let mac = w.sw.mac("uU");

    w.start(
        "host",
        "[[port]]\nname = \"nic\"\ntype = \"afxdp\"\nifname = \"uU\"\n\
         [[port]]\nname = \"host\"\ntype = \"tap\"\nifname = \"mgmt\"\n",
    );
    // The recipe: the NIC's address and MAC go to the internal port.
    w.sw.ok(&["ip", "addr", "del", &host, "dev", "uU"]);
    w.sw.ok(&["ip", "link", "set", "dev", "mgmt", "address", &mac]);
    w.sw.ok(&["ip", "addr", "add", &host, "dev", "mgmt"]);
    w.sw.ok(&["ip", "link", "set", "dev", "mgmt", "up"]);

    assert_eq!(w.port_json("nic")["xdp_mode"], "native-copy");
    assert_ping(&w.peer, &w.addr(10), "after: the host on its internal port");
    assert_ping(&w.sw, &w.addr(1), "after: the host reaches the wire");
    let g = iperf(&w.sw, &w.addr(10), &w.peer, 1, false);
    assert!(g > 0.05, "{g} Gbit/s");
}

/// The wire peer's VLAN subinterfaces. This kernel has no 802.1Q module (`ip link add ...
/// type vlan` is refused), so the peer tags in userspace: this script, run in the peer
/// namespace, opens a TAP `t<VID>` per VID and an `AF_PACKET` socket on the wire. A frame
/// a TAP sends leaves the wire with an 802.1Q tag of its VID; a tagged frame the wire
/// receives (the kernel moves the tag to `PACKET_AUXDATA`; a tag left in the frame is read
/// too) goes, untagged, to the TAP of its VID; untagged and other frames are the peer
/// kernel's own. The TAPs are then moved into namespaces of their own, each standing for
/// one VLAN's host on the wire.
const TAGGER: &str = r#"
import fcntl, os, select, socket, struct, sys
SOL_PACKET, PACKET_AUXDATA, VLAN_VALID = 263, 8, 0x10
wire, vids = sys.argv[1], [int(v) for v in sys.argv[2:]]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.setsockopt(SOL_PACKET, PACKET_AUXDATA, 1)
s.bind((wire, 0))
taps = {}
for v in vids:
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", b"t%d" % v, 0x0002 | 0x1000))
    taps[fd] = v
by_vid = {v: fd for fd, v in taps.items()}
print("ready", flush=True)
while True:
    for f in select.select([s] + list(taps), [], [])[0]:
        if f is s:
            data, anc, _, addr = s.recvmsg(65536, socket.CMSG_SPACE(20))
            if addr[2] == socket.PACKET_OUTGOING:
                continue
            vid = None
            for level, kind, d in anc:
                if level == SOL_PACKET and kind == PACKET_AUXDATA and len(d) >= 20:
                    status, _, _, _, _, tci, _ = struct.unpack("IIIHHHH", d[:20])
                    if status & VLAN_VALID:
                        vid = tci & 0xFFF
            if vid is None and data[12:14] == b"\x81\x00":
                vid, data = int.from_bytes(data[14:16], "big") & 0xFFF, data[:12] + data[16:]
            if vid in by_vid:
                os.write(by_vid[vid], data)
        else:
            frame = os.read(f, 65536)
            s.send(frame[:12] + struct.pack("!HH", 0x8100, taps[f]) + frame[12:])
"#;

/// Sends `count` broadcast frames of EtherType 0x88B5 (local experimental) out of `ifname`.
const SEND_RAW: &str = r#"
import socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
src = bytes.fromhex(open("/sys/class/net/%s/address" % sys.argv[1]).read().strip().replace(":", ""))
for _ in range(int(sys.argv[2])):
    s.send(b"\xff" * 6 + src + b"\x88\xb5" + bytes(50))
"#;

fn assert_no_ping(from: &Netns, to: &str, what: &str) {
    let out = from.run_for(
        &["ping", "-n", "-c", "2", "-i", "0.2", "-W", "1", to],
        Duration::from_secs(10),
    );
    assert!(!out.ok(), "{what}: ping {to} got through: {out:?}");
}

/// A TAP named `ifname` (made in `from`) moved into `ns` with `addr`/24, up.
fn adopt_tap(from: &Netns, ifname: &str, ns: &Netns, addr: &str) {
    from.ok(&["ip", "link", "set", "dev", ifname, "netns", &ns.name]);
    ns.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
    ns.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
    ns.ok(&["ip", "addr", "add", &format!("{addr}/24"), "dev", ifname]);
    ns.ok(&["ip", "link", "set", "dev", ifname, "up"]);
}

/// A trunk uplink end to end, all in one subnet so that only the VLANs keep hosts apart:
///
/// ```text
///   wire peer (ns peer)                              qswitch (ns sw)
///   wU untagged      10.201.7.1  ─┐                  ┌─ tap vm  vlan 5   10.201.7.2  (ns vm)
///   t10 (ns p10) VLAN 10 .11 ─ tagger ─ wU ══ uU: afxdp "up", vlan 5, vlans "10,20"
///   t20 (ns p20) VLAN 20 .21 ─┘                      ├─ tap v10 vlan 10  10.201.7.12 (ns v10)
///   t30 (ns p30) VLAN 30 .31 ─┘                      └─ tap v20 vlan 20  10.201.7.22 (ns v20)
/// ```
///
/// Each access namespace reaches its own VLAN's peer and nothing else; the native VLAN is
/// untagged on the wire; what the peer sends in VLAN 30 (not carried) is counted on the
/// uplink as `vlan_not_allowed` and reaches no one.
#[test]
fn trunk_uplink_keeps_vlans_apart() {
    if !privileged() || !require(have_tool("python3", &["-V"]), "needs python3") {
        return;
    }
    let pid = std::process::id() % 100_000;
    // Declared before the world: dropped after the daemon and the tagger are gone.
    let ns = |c: &str| Netns::new(&format!("qsup{pid}-7{c}"));
    let (p10, p20, p30, v10, v20) = (ns("a"), ns("b"), ns("c"), ns("d"), ns("e"));
    let mut w = World::new(7);
    w.offloads();
    w.peer.ok(&["ip", "link", "set", "wU", "promisc", "on"]);
    let tagger_log = w.dir.join("tagger.log");
    let _tagger = w.peer.spawn(
        &["python3", "-u", "-c", TAGGER, "wU", "10", "20", "30"],
        &tagger_log,
    );
    assert!(
        wait_until(Duration::from_secs(10), || std::fs::read_to_string(
            &tagger_log
        )
        .unwrap_or_default()
        .contains("ready")),
        "the tagger did not start: {}",
        std::fs::read_to_string(&tagger_log).unwrap_or_default()
    );
    for (vid, p) in [(10, &p10), (20, &p20), (30, &p30)] {
        adopt_tap(&w.peer, &format!("t{vid}"), p, &w.addr(vid + 1));
    }

    let tap = w.tap();
    w.start(
        "trunk",
        &format!(
            "[[port]]\nname = \"up\"\ntype = \"afxdp\"\nifname = \"uU\"\nmode = \"native\"\n\
             vlan = 5\nvlans = \"10,20\"\n\
             [[port]]\nname = \"vm\"\ntype = \"tap\"\nifname = \"{tap}\"\nvlan = 5\n\
             [[port]]\nname = \"v10\"\ntype = \"tap\"\nifname = \"{tap}a\"\nvlan = 10\n\
             [[port]]\nname = \"v20\"\ntype = \"tap\"\nifname = \"{tap}b\"\nvlan = 20\n"
        ),
    );
    w.attach_vm();
    adopt_tap(&w.sw, &format!("{tap}a"), &v10, &w.addr(12));
    adopt_tap(&w.sw, &format!("{tap}b"), &v20, &w.addr(22));
    let up = w.port_json("up");
    assert_eq!(up["xdp_mode"], "native-copy", "{up}");

    // Within each VLAN, both ways; the native VLAN is the peer's untagged wU.
    assert_ping(&w.vm, &w.addr(1), "native: vm → peer (untagged)");
    assert_ping(&w.peer, &w.addr(2), "native: peer → vm");
    assert_ping(&v10, &w.addr(11), "VLAN 10: v10 → peer");
    assert_ping(&p10, &w.addr(12), "VLAN 10: peer → v10");
    assert_ping(&v20, &w.addr(21), "VLAN 20: v20 → peer");
    assert_ping(&p20, &w.addr(22), "VLAN 20: peer → v20");
    let g = iperf(&v10, &w.addr(12), &p10, 1, false);
    assert!(g > 0.01, "VLAN 10 iperf3: {g} Gbit/s");

    // Across VLANs: nothing (same subnet, so only the switch's VLANs stand in the way).
    for (from, to, what) in [
        (&v10, 21, "v10 → VLAN 20 peer"),
        (&v10, 1, "v10 → native peer"),
        (&v20, 11, "v20 → VLAN 10 peer"),
        (&w.vm, 11, "vm (native) → VLAN 10 peer"),
        (&w.vm, 21, "vm (native) → VLAN 20 peer"),
        (&w.peer, 12, "native peer → v10"),
        (&p10, 22, "VLAN 10 peer → v20"),
    ] {
        assert_no_ping(from, &w.addr(to), what);
    }

    // VLAN 30 is not carried: the uplink counts what the peer sends in it as a drop.
    let before = w.daemon.as_ref().unwrap().stats();
    p30.ok(&["python3", "-c", SEND_RAW, "t30", "20"]);
    assert_no_ping(&p30, &w.addr(2), "VLAN 30 peer → vm");
    let mut after = before.clone();
    assert!(
        wait_until(Duration::from_secs(3), || {
            after = w.daemon.as_ref().unwrap().stats();
            common::drops(&after, "up", "vlan_not_allowed")
                >= common::drops(&before, "up", "vlan_not_allowed") + 20
        }),
        "VLAN 30 frames not counted as vlan_not_allowed: before {before}\nafter {after}"
    );
    // Nothing in the switch was tagged wrongly on the way out.
    assert_eq!(common::drops(&after, "up", "vlan_tagged"), 0, "{after}");
    assert_eq!(common::drops(&after, "up", "runt"), 0, "{after}");
    eprintln!(
        "trunk: vlan_not_allowed on up {}, VLAN 10 iperf3 {g:.2} Gbit/s",
        common::drops(&after, "up", "vlan_not_allowed")
    );
    assert!(!w.log().contains("panicked"), "{}", w.log());
}

/// DPDK testpmd as a vhost-user guest: a virtio-user port on qswitch's vhost-user socket and
/// a `net_tap` port whose TAP is in the guest's namespace, `io` forwarding between them, so
/// the namespace's own stack is the guest's. Stopped, and its `/var/run/dpdk/<prefix>`
/// removed, on drop.
struct PmdGuest {
    child: ChildGuard,
    log: PathBuf,
    prefix: String,
}

impl PmdGuest {
    fn spawn(ns: &Netns, sock: &Path, tap: &str, cpu: usize, log: PathBuf) -> PmdGuest {
        let prefix = format!("qsw-up-{}", std::process::id());
        let out = std::fs::File::create(&log).expect("testpmd log");
        let err = out.try_clone().expect("testpmd log");
        let lcores = format!("0@{cpu},1@{cpu}");
        let virtio = format!("net_virtio_user0,path={}", sock.display());
        let net_tap = format!("net_tap0,iface={tap}");
        let child = ns
            .cmd(&[common::TESTPMD, "--no-huge", "-m", "1024", "--no-pci"])
            .args(["--iova-mode=va", "--file-prefix", &prefix])
            .args(["--lcores", &lcores, "--main-lcore", "0"])
            .args(["--vdev", &virtio, "--vdev", &net_tap, "--"])
            // --stats-period: runs until signalled instead of waiting for a key.
            .args([
                "--nb-cores=1",
                "--forward-mode=io",
                "--stats-period",
                "5",
                "-a",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start dpdk-testpmd");
        PmdGuest {
            child: ChildGuard::new(child),
            log,
            prefix,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for PmdGuest {
    fn drop(&mut self) {
        self.child.stop();
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

/// A vhost-user guest behind the uplink (native mode): testpmd ([`PmdGuest`]) on a vhost-user
/// port, its TAP in namespace `guest` with 10.201.8.3; ping both ways and iperf3 TCP (one
/// stream, each direction) between the wire peer and the guest. testpmd's lcores share the
/// first CPU; the qswitch worker has the second.
#[test]
fn vhost_user_guest_through_the_uplink() {
    if !privileged() {
        return;
    }
    let Some(worker) = common::testpmd_worker_cpu() else {
        return;
    };
    let t0 = Instant::now();
    let pid = std::process::id() % 100_000;
    let guest = Netns::new(&format!("qsup{pid}-8g"));
    let mut w = World::new(8);
    w.workers = worker.to_string();
    w.offloads();
    let sock = w.dir.join("guest.sock");
    w.start(
        "vhost",
        &format!(
            "[[port]]\nname = \"up\"\ntype = \"afxdp\"\nifname = \"uU\"\nmode = \"native\"\n\
             [[port]]\nname = \"guest\"\ntype = \"vhost-user\"\nsocket = \"{}\"\n\
             mode = \"server\"\n",
            sock.display()
        ),
    );
    assert!(
        wait_until(Duration::from_secs(5), || sock.exists()),
        "no vhost-user socket"
    );
    let tap = "qg8";
    let pmd = PmdGuest::spawn(
        &guest,
        &sock,
        tap,
        common::first_cpu(),
        w.dir.join("testpmd.log"),
    );
    let mut seen = Value::Null;
    let up = wait_until(Duration::from_secs(20), || {
        seen = w.port_json("guest");
        seen["connected"] == true
            && seen["enabled_queues"]
                .as_array()
                .is_some_and(|q| !q.is_empty())
            && guest.has_link(tap)
            && pmd.log_text().contains("forwards packets on")
    });
    assert!(up, "guest not up: {seen}\n{}", pmd.log_text());
    guest.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
    guest.ok(&[
        "ip",
        "addr",
        "add",
        &format!("{}/24", w.addr(3)),
        "dev",
        tap,
    ]);
    guest.ok(&["ip", "link", "set", "dev", tap, "up"]);

    // testpmd's ports come up a moment after it says it forwards: the first ping that
    // gets through (10 s at most) says the path is there; then the checks.
    let first = wait_until(Duration::from_secs(10), || {
        w.peer
            .run_for(
                &["ping", "-n", "-c", "1", "-W", "1", &w.addr(3)],
                Duration::from_secs(5),
            )
            .ok()
    });
    assert!(first, "the guest never answered: {}", pmd.log_text());
    assert_ping(&w.peer, &w.addr(3), "peer → guest");
    assert_ping(&guest, &w.addr(1), "guest → peer");
    let to_guest = iperf(&guest, &w.addr(3), &w.peer, 1, false);
    let from_guest = iperf(&guest, &w.addr(3), &w.peer, 1, true);
    assert!(
        to_guest > 0.01 && from_guest > 0.01,
        "iperf3 Gbit/s peer → guest {to_guest}, guest → peer {from_guest}\n{}",
        pmd.log_text()
    );
    let stats = w.daemon.as_ref().unwrap().stats();
    for p in stats["ports"].as_array().expect("ports") {
        assert_eq!(
            p["drops"]["bad_descriptor"].as_u64().unwrap_or(0),
            0,
            "{stats}"
        );
    }
    eprintln!(
        "vhost-user guest: Gbit/s peer → guest {to_guest:.2}, guest → peer {from_guest:.2} \
         ({:.1} s)",
        t0.elapsed().as_secs_f64()
    );
    assert!(!w.log().contains("panicked"), "{}", w.log());
    drop(pmd);
}

/// Attaches to the peer's `wU` egress a tc program that tags every frame the peer sends with
/// `vid` out of band (`bpf_skb_vlan_push`, as `tc ... action vlan push id N` does, which
/// this kernel lacks): the tag travels beside the frame, as from a NIC's receive VLAN
/// offload. Detached when the link is dropped.
fn peer_tags_out_of_band(w: &World, vid: i32) -> qswitch_sys::bpf::Link {
    use qswitch_sys::bpf::{self, Insn, ProgKind, TcHook, R0, R2, R3};
    let path = PathBuf::from(format!("/run/netns/{}", w.peer.name));
    std::thread::spawn(move || {
        qswitch_sys::netns::enter(&path).expect("enter the peer namespace");
        let insns = [
            Insn::mov_imm(R2, 0x0081), // htons(ETH_P_8021Q)
            Insn::mov_imm(R3, vid),
            Insn::call(bpf::FUNC_SKB_VLAN_PUSH),
            Insn::mov_imm(R0, bpf::TC_ACT_OK),
            Insn::exit(),
        ];
        let prog = bpf::Program::load(ProgKind::SchedCls, &insns, "qs_test_tag").unwrap();
        let idx = qswitch_sys::xdp::ifindex("wU").unwrap();
        bpf::tcx_attach(&prog, idx, TcHook::Egress).expect("attach the tagger")
    })
    .join()
    .unwrap()
}

/// Audit finding F1 end to end: the wire sends with its 802.1Q tags out of band. Trunk
/// `vlan = 5, vlans = "10"`: frames in VID 10 go to VLAN 10 and never to VLAN 5 (the native
/// VLAN); frames in VID 30 are dropped as `vlan_not_allowed` and reach no one. In native
/// and packet mode (skb mode is refused on a veth).
fn out_of_band_trunk(n: u8, mode: &str) {
    let pid = std::process::id() % 100_000;
    let v10 = Netns::new(&format!("qsup{pid}-{n}t"));
    let mut w = World::new(n);
    w.offloads();
    let tap = w.tap();
    w.start(
        "oob",
        &format!(
            "[[port]]\nname = \"up\"\ntype = \"afxdp\"\nifname = \"uU\"\nmode = \"{mode}\"\n\
             vlan = 5\nvlans = \"10\"\n\
             [[port]]\nname = \"vm\"\ntype = \"tap\"\nifname = \"{tap}\"\nvlan = 5\n\
             [[port]]\nname = \"v10\"\ntype = \"tap\"\nifname = \"{tap}a\"\nvlan = 10\n"
        ),
    );
    w.attach_vm();
    adopt_tap(&w.sw, &format!("{tap}a"), &v10, &w.addr(12));
    let stats = || w.daemon.as_ref().unwrap().stats();
    let tx = |s: &serde_json::Value, p: &str| common::counter(s, p, "tx_packets");

    for (vid, to_v10) in [(10, true), (30, false)] {
        let _tagger = peer_tags_out_of_band(&w, vid);
        let before = stats();
        w.peer.ok(&["python3", "-c", SEND_RAW, "wU", "20"]);
        let mut after = before.clone();
        let arrived = wait_until(Duration::from_secs(5), || {
            after = stats();
            if to_v10 {
                tx(&after, "v10") >= tx(&before, "v10") + 20
            } else {
                common::drops(&after, "up", "vlan_not_allowed")
                    >= common::drops(&before, "up", "vlan_not_allowed") + 20
            }
        });
        assert!(
            arrived,
            "{mode}: VID {vid}: not {}: before {before}\nafter {after}",
            if to_v10 {
                "switched to VLAN 10"
            } else {
                "dropped as vlan_not_allowed"
            }
        );
        // Nothing of it in the native VLAN (VLAN 5 has no other source of frames here).
        assert_eq!(
            tx(&after, "vm"),
            tx(&before, "vm"),
            "{mode}: VID {vid} reached the native VLAN: before {before}\nafter {after}"
        );
        if !to_v10 {
            assert_eq!(tx(&after, "v10"), tx(&before, "v10"), "{mode}: VID 30");
        }
    }
    assert!(!w.log().contains("panicked"), "{}", w.log());
}

#[test]
fn out_of_band_tags_are_classified_by_their_vid() {
    if !privileged() || !require(have_tool("python3", &["-V"]), "needs python3") {
        return;
    }
    out_of_band_trunk(2, "native");
    out_of_band_trunk(9, "packet");
}

/// Issue 27 F6, for a NIC whose driver loads late: an afxdp port whose interface does not
/// exist at start waits for it (down, shown in `port list`), the TAP port starts anyway; when
/// the interface appears the port attaches and switches.
#[test]
fn an_uplink_whose_interface_appears_after_start_attaches() {
    if !privileged() {
        return;
    }
    let mut w = World::new(9);
    w.sw.ok(&["ip", "link", "del", "uU"]);
    w.start("late", &w.ports("native"));
    let up = w.port_json("up");
    assert_eq!(up["waiting"], "uU", "{up}");
    assert_eq!(up["queues"], serde_json::json!([]), "{up}");
    assert!(w.port_json("vm")["waiting"].is_null());
    w.attach_vm();
    w.wire();
    assert!(
        wait_until(Duration::from_secs(10), || w.port_json("up")["waiting"]
            .is_null()),
        "the uplink still waits: {}",
        w.log()
    );
    assert_eq!(w.port_json("up")["xdp_mode"], "native-copy");
    assert_ping(&w.peer, &w.addr(2), "after the interface appeared");
    assert_ping(&w.vm, &w.addr(1), "after the interface appeared, vm → peer");
}
