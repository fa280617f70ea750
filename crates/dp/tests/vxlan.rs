//! VXLAN ports against each other and against Linux's own vxlan device.
//!
//! Without privileges: two ports on loopback addresses (127.0.0.1 ↔ 127.0.0.2) exchange
//! frames, learn, and keep the remote table's origins apart.
//!
//! With root (network namespaces as hosts; each host's underlay is a veth into a "fabric"
//! namespace holding a bridge):
//!
//! ```text
//!   vmA ──TAP── hostA: VxlanPort (pumped by the test) ─u0─┐
//!                                                          ├── fabric: br0
//!   vmB ──veth── hostB: br0 + vxlan100 (Linux) ─────u0─────┤
//!   vmC ──veth── hostC: br0 + vxlan100 (Linux) ─────u0─────┘   (three-host test)
//! ```
//!
//! The qswitch host runs the port and a TAP port in a thread that entered its namespace,
//! with a two-port "switch" loop between them (TAP rx → VXLAN tx, VXLAN rx → TAP tx): the
//! port's own remote table decides where unicast goes. Everything created is removed by
//! [`Lab`]'s `Drop`, also when a test panics. Without root or `ip`, tests print "skipped: ..."
//! and pass, unless QSWITCH_REQUIRE_PRIVILEGED=1.

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use qswitch_dp::packet::Pkt;
use qswitch_dp::port::tap::TapPort;
use qswitch_dp::port::vxlan::{Origin, VxlanConfig, VxlanDrop, VxlanGroups, VxlanPort};
use qswitch_dp::port::Port;
use qswitch_dp::stats::DropTally;
use qswitch_test_support::skip;
use qswitch_wire::vxlan as wire_vxlan;
use qswitch_wire::MacAddr;

const VNI: u32 = 100;

// ---------------------------------------------------------------------------------------
// Privileges, commands, namespaces
// ---------------------------------------------------------------------------------------

/// Whether the test can run: root and the tools it needs. Otherwise skips (prints
/// "skipped: ...", or fails under QSWITCH_REQUIRE_PRIVILEGED=1).
/// The socket groups of the ports these tests open outside a switch: one for the whole
/// test process, as a switch's vxlan driver keeps one for all its ports.
fn groups() -> &'static VxlanGroups {
    static GROUPS: std::sync::OnceLock<VxlanGroups> = std::sync::OnceLock::new();
    GROUPS.get_or_init(VxlanGroups::default)
}

fn can_run(tools: &[&str]) -> bool {
    if !skip::root_or_skip() {
        return false;
    }
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !tool(t)).collect();
    skip::require(
        missing.is_empty(),
        &format!("needs the tools {}", missing.join(", ")),
    )
}

fn tool(name: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs a command line (split on spaces); panics with its stderr if it fails.
fn run(cmd: &str) -> String {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn try_run(cmd: &str) -> bool {
    let args: Vec<&str> = cmd.split_whitespace().collect();
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The namespaces of one test; deleted (with everything in them) on drop.
struct Lab {
    tag: String,
    namespaces: Vec<String>,
}

impl Lab {
    fn new(test: &str) -> Lab {
        Lab {
            tag: format!("qsvx{test}{}", std::process::id() % 100_000),
            namespaces: Vec::new(),
        }
    }

    fn ns(&mut self, name: &str) -> String {
        let full = format!("{}-{name}", self.tag);
        try_run(&format!("ip netns del {full}"));
        run(&format!("ip netns add {full}"));
        self.namespaces.push(full.clone());
        run(&format!("ip -n {full} link set lo up"));
        if name.starts_with("vm") {
            // No IPv6 inside VMs: no router solicitations or MLD reports flooding while a
            // test counts frames.
            for k in ["all", "default"] {
                try_run(&format!(
                    "ip netns exec {full} sysctl -qw net.ipv6.conf.{k}.disable_ipv6=1"
                ));
            }
        }
        full
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for ns in self.namespaces.iter().rev() {
            try_run(&format!("ip netns del {ns}"));
        }
    }
}

fn ns_path(ns: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{ns}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

/// The underlay address of host `i`.
fn host_ip(fam: Family, i: u8) -> IpAddr {
    match fam {
        Family::V4 => IpAddr::V4(Ipv4Addr::new(10, 99, 0, i + 1)),
        Family::V6 => IpAddr::V6(Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, u16::from(i) + 1)),
    }
}

/// The overlay address of VM `i`.
fn vm_ip(i: u8) -> String {
    format!("10.200.0.{}", i + 1)
}

/// Creates the fabric namespace with a bridge and `hosts` host namespaces, each with
/// underlay veth `u0` (address [`host_ip`]) on the bridge. Transmit checksum offload is
/// turned off on the underlay so that captured frames carry their final checksums.
fn fabric(lab: &mut Lab, fam: Family, hosts: u8) -> Vec<String> {
    let f = lab.ns("fab");
    run(&format!("ip -n {f} link add br0 type bridge"));
    run(&format!("ip -n {f} link set br0 up"));
    let mut out = Vec::new();
    for i in 0..hosts {
        let h = lab.ns(&format!("h{i}"));
        run(&format!(
            "ip -n {h} link add u0 type veth peer name f{i} netns {f}"
        ));
        run(&format!("ip -n {f} link set f{i} master br0 up"));
        let (ip, extra) = match fam {
            Family::V4 => (format!("{}/24", host_ip(fam, i)), ""),
            Family::V6 => (format!("{}/64", host_ip(fam, i)), " nodad"),
        };
        run(&format!("ip -n {h} addr add {ip} dev u0{extra}"));
        run(&format!("ip -n {h} link set u0 up"));
        if tool("ethtool") {
            try_run(&format!("ip netns exec {h} ethtool -K u0 tx off"));
        }
        out.push(h);
    }
    out
}

/// Host `i` as Linux: vxlan100 (nolearning, dstport 4789) and a VM namespace on a bridge,
/// flooding to `peers` through all-zero FDB entries.
fn linux_host(lab: &mut Lab, host: &str, fam: Family, i: u8, peers: &[IpAddr]) -> String {
    let vm = lab.ns(&format!("vm{i}"));
    let local = host_ip(fam, i);
    run(&format!(
        "ip -n {host} link add vxlan100 type vxlan id {VNI} dstport 4789 local {local} nolearning"
    ));
    run(&format!("ip -n {host} link add br0 type bridge"));
    run(&format!("ip -n {host} link set vxlan100 master br0"));
    run(&format!(
        "ip -n {host} link add vh type veth peer name eth0 netns {vm}"
    ));
    run(&format!("ip -n {host} link set vh master br0"));
    for p in peers {
        run(&format!(
            "ip netns exec {host} bridge fdb append 00:00:00:00:00:00 dev vxlan100 dst {p}"
        ));
    }
    let mtu = match fam {
        Family::V4 => 1450,
        Family::V6 => 1430,
    };
    for dev in ["vxlan100", "br0", "vh"] {
        run(&format!("ip -n {host} link set {dev} up"));
    }
    run(&format!("ip -n {vm} addr add {}/24 dev eth0", vm_ip(i)));
    run(&format!("ip -n {vm} link set eth0 mtu {mtu} up"));
    vm
}

fn mac_of(ns: &str, dev: &str) -> MacAddr {
    let out = run(&format!("ip -n {ns} -o link show {dev}"));
    let at = out.find("link/ether ").expect("an Ethernet interface") + 11;
    out[at..at + 17].parse().expect("a MAC address")
}

fn ping(vm: &str, dst: &str, count: u32) -> bool {
    try_run(&format!(
        "ip netns exec {vm} ping -n -q -c {count} -i 0.2 -w 10 {dst}"
    ))
}

// ---------------------------------------------------------------------------------------
// The qswitch host: a VxlanPort and a TAP port with a loop between them
// ---------------------------------------------------------------------------------------

/// A thread in a host namespace moving frames TAP → VXLAN and VXLAN → TAP until dropped.
struct QswitchHost {
    port: Arc<VxlanPort>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl QswitchHost {
    /// Opens the port (`cfg`) and a TAP `qsvm` in `host`, moves the TAP into a new VM
    /// namespace with address [`vm_ip`]`(0)` and the port's inner MTU, and starts the loop.
    fn start(lab: &mut Lab, host: &str, cfg: VxlanConfig) -> (QswitchHost, String) {
        let vm = lab.ns("vm0");
        let (tx, rx) = mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let path = ns_path(host);
        let thread = std::thread::spawn(move || {
            qswitch_sys::netns::enter(&path).expect("enter the host namespace");
            let opened = VxlanPort::open("vx", &cfg, groups())
                .map_err(|e| format!("{e:#}"))
                .and_then(|p| {
                    TapPort::open("qsvm", 1)
                        .map(|t| (Arc::new(p), t))
                        .map_err(|e| format!("{e:#}"))
                });
            let (port, tap) = match opened {
                Ok(x) => x,
                Err(e) => {
                    tx.send(Err(e)).ok();
                    return;
                }
            };
            tx.send(Ok(port.clone())).ok();
            pump(&port, &tap, &stop2);
        });
        let port = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the host thread answers")
            .expect("open the VXLAN and TAP ports");
        run(&format!("ip -n {host} link set qsvm netns {vm}"));
        run(&format!("ip -n {vm} addr add {}/24 dev qsvm", vm_ip(0)));
        run(&format!(
            "ip -n {vm} link set qsvm mtu {} up",
            port.inner_mtu()
        ));
        (
            QswitchHost {
                port,
                stop,
                thread: Some(thread),
            },
            vm,
        )
    }
}

impl Drop for QswitchHost {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().ok();
        }
    }
}

fn pump(vx: &VxlanPort, tap: &TapPort, stop: &AtomicBool) {
    let start = Instant::now();
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let all: Vec<u8> = (0..32).collect();
    let mut drops = DropTally::default();
    while !stop.load(Ordering::Relaxed) {
        let now = start.elapsed().as_nanos() as u64;
        let n = tap.rx_burst(0, &mut pkts, now, &mut drops);
        if n > 0 {
            vx.tx_burst(0, &mut pkts, &all[..n], &mut drops);
        }
        let m = vx.rx_burst(0, &mut pkts, now, &mut drops);
        if m > 0 {
            // A switch that accepts every frame (the remote table learns from those).
            vx.rx_accepted(0, u32::MAX);
            tap.tx_burst(0, &mut pkts, &all[..m], &mut drops);
        }
        if n == 0 && m == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

// ---------------------------------------------------------------------------------------
// Capture (tcpdump in the fabric namespace)
// ---------------------------------------------------------------------------------------

struct Capture {
    child: Child,
    file: PathBuf,
}

impl Capture {
    fn start(ns: &str, dev: &str) -> Capture {
        let file = std::env::temp_dir().join(format!("{ns}-{dev}.pcap"));
        let mut child = Command::new("ip")
            .args([
                "netns", "exec", ns, "tcpdump", "-n", "-U", "-s", "0", "-i", dev,
            ])
            .args(["-w", file.to_str().unwrap(), "udp", "port", "4789"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("tcpdump");
        let mut line = String::new();
        BufReader::new(child.stderr.take().unwrap())
            .read_line(&mut line)
            .ok();
        assert!(line.contains("listening"), "tcpdump: {line}");
        Capture { child, file }
    }

    /// Stops the capture and returns the frames.
    fn frames(mut self) -> Vec<Vec<u8>> {
        std::thread::sleep(Duration::from_millis(200));
        try_run(&format!("kill -INT {}", self.child.id()));
        self.child.wait().ok();
        let data = std::fs::read(&self.file).expect("the capture file");
        parse_pcap(&data)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
        std::fs::remove_file(&self.file).ok();
    }
}

fn parse_pcap(data: &[u8]) -> Vec<Vec<u8>> {
    assert!(data.len() >= 24, "pcap header");
    let le = data[..4] == [0xd4, 0xc3, 0xb2, 0xa1] || data[..4] == [0x4d, 0x3c, 0xb2, 0xa1];
    let u32_at = |at: usize| {
        let b: [u8; 4] = data[at..at + 4].try_into().unwrap();
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    assert_eq!(u32_at(20), 1, "Ethernet link type");
    let mut at = 24;
    let mut out = Vec::new();
    while at + 16 <= data.len() {
        let len = u32_at(at + 8) as usize;
        at += 16;
        if at + len > data.len() {
            break;
        }
        out.push(data[at..at + len].to_vec());
        at += len;
    }
    out
}

/// An iperf3 server in a namespace, killed on drop.
struct Server(Child);

impl Server {
    fn start(ns: &str) -> Server {
        Server(
            Command::new("ip")
                .args(["netns", "exec", ns, "iperf3", "-s"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("iperf3 -s"),
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

fn cfg(fam: Family, i: u8, remotes: &[u8]) -> VxlanConfig {
    let mut c = VxlanConfig::new(VNI, host_ip(fam, i));
    c.remotes = remotes.iter().map(|&r| host_ip(fam, r)).collect();
    c
}

/// qswitch on host 0 and Linux on host 1: ping both ways, learning, counters, and what the
/// underlay carries.
fn interop(fam: Family) {
    if !can_run(&["ip", "bridge", "ping", "tcpdump", "iperf3"]) {
        return;
    }
    let tag = match fam {
        Family::V4 => "i4",
        Family::V6 => "i6",
    };
    let mut lab = Lab::new(tag);
    let hosts = fabric(&mut lab, fam, 2);
    let vm_b = linux_host(&mut lab, &hosts[1], fam, 1, &[host_ip(fam, 0)]);
    let (qs, vm_a) = QswitchHost::start(&mut lab, &hosts[0], cfg(fam, 0, &[1]));
    let port = &qs.port;
    assert_eq!(
        port.inner_mtu(),
        match fam {
            Family::V4 => 1450,
            Family::V6 => 1430,
        }
    );
    let cap = Capture::start(&lab.namespaces[0], "br0");

    assert!(ping(&vm_a, &vm_ip(1), 3), "vmA → vmB over qswitch ⇄ Linux");
    assert!(ping(&vm_b, &vm_ip(0), 3), "vmB → vmA over Linux ⇄ qswitch");
    // Full-size frames fit exactly (DF set inside: ping -M do).
    let size = port.inner_mtu() - 28;
    assert!(
        try_run(&format!(
            "ip netns exec {vm_a} ping -n -q -c 2 -i 0.2 -w 10 -M do -s {size} {}",
            vm_ip(1)
        )),
        "a {size}-byte ICMP payload (inner MTU) crosses"
    );

    let b = host_ip(fam, 1);
    let mac_b = mac_of(&vm_b, "eth0");
    let learned = port.entries();
    assert!(
        learned
            .iter()
            .any(|e| e.mac == mac_b && e.vtep == b && e.origin == Origin::Learned),
        "vmB's MAC learned behind host B: {learned:?}"
    );
    let st = port.stats();
    let tb = st.vtep(b).expect("counters of VTEP B");
    assert!(tb.rx_frames >= 6 && tb.tx_frames >= 6, "{st:?}");
    assert!(st.traffic.rx_bytes >= tb.rx_bytes && st.traffic.tx_frames >= tb.tx_frames);
    assert_eq!(st.vni, VNI);
    assert!(st.drops.iter().all(|(_, n)| *n == 0), "{st:?}");

    // The underlay, as seen on the fabric bridge.
    let a = host_ip(fam, 0);
    let frames = cap.frames();

    // TCP both ways: the TAP hands over TSO super-frames, which the port segments to the
    // inner MTU; nothing is dropped.
    let _server = Server::start(&vm_b);
    for reverse in ["", "-R"] {
        let ok = (0..20).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            try_run(&format!(
                "ip netns exec {vm_a} timeout 20 iperf3 -c {} -t 2 {reverse}",
                vm_ip(1)
            ))
        });
        assert!(ok, "iperf3 {reverse} between vmA and vmB");
    }
    let st = port.stats();
    assert!(st.drops.iter().all(|(_, n)| *n == 0), "{st:?}");
    assert!(
        st.traffic.tx_bytes > 10_000_000 && st.traffic.rx_bytes > 10_000_000,
        "{st:?}"
    );
    let src_ports = port.src_ports();
    let mut from_a = 0;
    let mut from_b = 0;
    let mut icmp_ports = std::collections::HashSet::new();
    for f in &frames {
        let d =
            wire_vxlan::decap(f).unwrap_or_else(|e| panic!("bad underlay frame ({e}): {f:02x?}"));
        assert_eq!(d.vni.get(), VNI);
        assert_eq!(d.dst_port, 4789);
        assert!(f[d.inner_offset - 8] & wire_vxlan::FLAG_I != 0, "I flag");
        if d.src == a {
            from_a += 1;
            assert_eq!(d.dst, b);
            assert!(src_ports.contains(&d.src_port), "source port from the pool");
            assert!(d.src_port >= wire_vxlan::SRC_PORT_MIN);
            // A checksum over both families (UDP_SEGMENT needs one; Linux sends zero over
            // IPv4 by default), verified by decap.
            assert!(d.udp_checksum);
            // ICMP from vmA to vmB: one flow, one source port.
            let inner = d.inner;
            if inner.len() > 34
                && inner[12..14] == [8, 0]
                && inner[23] == 1
                && inner[30..34] == [10, 200, 0, 2]
            {
                icmp_ports.insert(d.src_port);
            }
        } else {
            from_b += 1;
        }
    }
    assert!(
        from_a >= 6 && from_b >= 6,
        "{from_a} from A, {from_b} from B"
    );
    assert_eq!(
        icmp_ports.len(),
        1,
        "one flow keeps one source port: {icmp_ports:?}"
    );
    drop(qs);
}

#[test]
fn interop_with_linux_ipv4() {
    interop(Family::V4);
}

#[test]
fn interop_with_linux_ipv6() {
    interop(Family::V6);
}

/// Three hosts: broadcast reaches both Linux hosts; once learned, unicast to B goes only to B.
#[test]
fn learned_unicast_goes_to_one_vtep() {
    if !can_run(&["ip", "bridge", "ping"]) {
        return;
    }
    let fam = Family::V4;
    let mut lab = Lab::new("l3");
    let hosts = fabric(&mut lab, fam, 3);
    let (a, b, c) = (host_ip(fam, 0), host_ip(fam, 1), host_ip(fam, 2));
    let vm_b = linux_host(&mut lab, &hosts[1], fam, 1, &[a, c]);
    let vm_c = linux_host(&mut lab, &hosts[2], fam, 2, &[a, b]);
    let (qs, vm_a) = QswitchHost::start(&mut lab, &hosts[0], cfg(fam, 0, &[1, 2]));
    assert!(ping(&vm_a, &vm_ip(1), 2), "vmA → vmB");
    assert!(ping(&vm_a, &vm_ip(2), 2), "vmA → vmC");
    assert!(
        ping(&vm_b, &vm_ip(2), 2),
        "vmB → vmC (Linux ⇄ Linux, same fabric)"
    );

    let entries = qs.port.entries();
    for (vm, vtep) in [(&vm_b, b), (&vm_c, c)] {
        let mac = mac_of(vm, "eth0");
        assert!(
            entries.iter().any(|e| e.mac == mac && e.vtep == vtep),
            "{mac} behind {vtep}: {entries:?}"
        );
    }
    let before = qs.port.stats();
    assert!(ping(&vm_a, &vm_ip(1), 5), "vmA → vmB again");
    let after = qs.port.stats();
    let tx = |s: &qswitch_dp::port::vxlan::VxlanStats, v| s.vtep(v).unwrap().tx_frames;
    assert!(tx(&after, b) >= tx(&before, b) + 5, "{before:?} {after:?}");
    assert_eq!(
        tx(&after, c),
        tx(&before, c),
        "nothing for B went to C: {before:?} {after:?}"
    );
    drop(qs);
}

/// Receives on `port` until `want` frames came or 5 s passed.
fn receive(port: &VxlanPort, want: usize) -> Vec<Vec<u8>> {
    receive_for(port, want, Duration::from_secs(5))
}

/// Receives for 200 ms: what arrives when nothing should.
fn receive_late(port: &VxlanPort) -> Vec<Vec<u8>> {
    receive_for(port, usize::MAX, Duration::from_millis(200))
}

fn receive_for(port: &VxlanPort, want: usize, timeout: Duration) -> Vec<Vec<u8>> {
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let mut drops = DropTally::default();
    let mut got = Vec::new();
    let deadline = Instant::now() + timeout;
    let start = Instant::now();
    while got.len() < want && Instant::now() < deadline {
        let n = port.rx_burst(
            0,
            &mut pkts,
            start.elapsed().as_nanos() as u64 + 1,
            &mut drops,
        );
        // As a switch that accepts every frame: the remote table learns from them.
        port.rx_accepted(0, u32::MAX);
        got.extend(pkts[..n].iter().map(|p| p.frame().to_vec()));
        if n == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    got
}

fn inner_frame(src: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 0xaa]);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f
}

fn vxlan_payload(flags: u8, vni: u32, inner: &[u8]) -> Vec<u8> {
    let mut p = vec![flags, 0, 0, 0];
    p.extend_from_slice(&(vni << 8).to_be_bytes());
    p.extend_from_slice(inner);
    p
}

/// Runs `f` in a thread inside namespace `ns`.
fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = ns_path(ns);
    std::thread::spawn(move || {
        qswitch_sys::netns::enter(&path).expect("enter namespace");
        f()
    })
    .join()
    .expect("namespace thread")
}

/// Bad input is dropped and counted by reason, and forwarding goes on; too-big frames are
/// dropped on transmit, frames that fit leave whole.
#[test]
fn bad_input_is_counted_and_forwarding_goes_on() {
    if !can_run(&["ip"]) {
        return;
    }
    let fam = Family::V4;
    let mut lab = Lab::new("bad");
    let hosts = fabric(&mut lab, fam, 3);
    let (a, b) = (host_ip(fam, 0), host_ip(fam, 1));
    let mut config = cfg(fam, 0, &[1]);
    config.learning = false;
    let port = in_ns(&hosts[0], move || {
        VxlanPort::open("vx", &config, groups()).expect("open")
    });
    let to_a = SocketAddr::new(a, 4789);
    let good = inner_frame([2, 0, 0, 0, 0, 0xb], 60);
    // From B (in the list): short, I flag clear, unknown VNI, inner too short, then a good one.
    let good2 = good.clone();
    in_ns(&hosts[1], move || {
        let s = UdpSocket::bind(SocketAddr::new(b, 0)).unwrap();
        for p in [
            vec![8, 0, 0, 0],
            vxlan_payload(0, VNI, &good2),
            vxlan_payload(0x08, 999, &good2),
            vxlan_payload(0x08, VNI, &good2[..10]),
            vxlan_payload(0x08, VNI, &good2),
        ] {
            s.send_to(&p, to_a).unwrap();
        }
    });
    // From C (not in the list, learning off).
    let good3 = good.clone();
    let c = host_ip(fam, 2);
    in_ns(&hosts[2], move || {
        let s = UdpSocket::bind(SocketAddr::new(c, 0)).unwrap();
        s.send_to(&vxlan_payload(0x08, VNI, &good3), to_a).unwrap();
    });
    let got = receive(&port, 1);
    assert_eq!(got, vec![good.clone()], "only the good frame");
    // Late arrivals would show up here.
    assert!(receive_late(&port).is_empty());
    let st = port.stats();
    for (reason, n) in [
        (VxlanDrop::Short, 1),
        (VxlanDrop::IFlagClear, 1),
        (VxlanDrop::UnknownVni, 1),
        (VxlanDrop::InnerTooShort, 1),
        (VxlanDrop::UnknownVtep, 1),
    ] {
        assert_eq!(st.drop_count(reason), n, "{}: {st:?}", reason.name());
    }
    assert_eq!(st.vtep(b).unwrap().rx_frames, 1);
    assert!(st.vtep(c).is_none(), "no counters for a refused VTEP");
    assert!(
        port.entries().is_empty(),
        "nothing learned with learning off"
    );

    // Once C is in the flood list (as EVPN would put it), its frames are accepted.
    port.add_flood(c, Origin::Evpn);
    let good4 = good.clone();
    in_ns(&hosts[2], move || {
        let s = UdpSocket::bind(SocketAddr::new(c, 0)).unwrap();
        s.send_to(&vxlan_payload(0x08, VNI, &good4), to_a).unwrap();
    });
    assert_eq!(receive(&port, 1), vec![good.clone()]);
    assert!(port.remove_flood(c, Origin::Evpn));

    // Transmit: a frame that fits the 1500-byte underlay exactly goes out whole; one byte
    // more is a counted drop.
    let max = 1500 - 20 - 16;
    assert_eq!(port.underlay_mtu(), 1500);
    let listener = {
        let h = hosts[1].clone();
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            qswitch_sys::netns::enter(&ns_path(&h)).unwrap();
            let s = UdpSocket::bind(SocketAddr::new(b, 4789)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            tx.send(()).unwrap();
            let mut buf = vec![0u8; 4000];
            let mut lens = Vec::new();
            while let Ok((n, _)) = s.recv_from(&mut buf) {
                lens.push((n, buf[..8].to_vec()));
                if lens.len() == 1 {
                    s.set_read_timeout(Some(Duration::from_millis(300)))
                        .unwrap();
                }
            }
            lens
        });
        rx.recv().unwrap();
        t
    };
    let mut pkts: Vec<Pkt> = (0..2).map(|_| Pkt::new()).collect();
    pkts[0].fill(&inner_frame([2, 0, 0, 0, 0, 1], max + 1));
    pkts[1].fill(&inner_frame([2, 0, 0, 0, 0, 1], max));
    let mut drops = DropTally::default();
    let done = port.tx_burst(0, &mut pkts, &[0, 1], &mut drops);
    assert_eq!(done.packets, 1);
    let lens = listener.join().unwrap();
    assert_eq!(lens.len(), 1, "{lens:?}");
    assert_eq!(lens[0].0, 8 + max);
    assert_eq!(lens[0].1, vxlan_payload(0x08, VNI, &[]));
    assert_eq!(port.stats().drop_count(VxlanDrop::MtuExceeded), 1);
}

// ---------------------------------------------------------------------------------------
// Without privileges: loopback
// ---------------------------------------------------------------------------------------

fn loopback_pair(learning: bool) -> Option<(VxlanPort, VxlanPort, u16)> {
    loopback_pair_with(learning, None)
}

fn loopback_pair_with(
    learning: bool,
    udp_csum: Option<bool>,
) -> Option<(VxlanPort, VxlanPort, u16)> {
    // A port per test process so that concurrent runs do not collide.
    for attempt in 0..20u16 {
        let dstport = 40_000 + ((std::process::id() as u16).wrapping_add(attempt * 97) % 9_000);
        let mk = |local: [u8; 4], remote: [u8; 4]| {
            let mut c = VxlanConfig::new(VNI, IpAddr::V4(local.into()));
            c.remotes = vec![IpAddr::V4(remote.into())];
            c.dstport = dstport;
            c.learning = learning;
            c.udp_csum = udp_csum;
            VxlanPort::open("vx", &c, groups())
        };
        if let (Ok(x), Ok(y)) = (
            mk([127, 0, 0, 1], [127, 0, 0, 2]),
            mk([127, 0, 0, 2], [127, 0, 0, 1]),
        ) {
            return Some((x, y, dstport));
        }
    }
    None
}

#[test]
fn loopback_ports_switch_learn_and_keep_origins() {
    let (x, y, _) = loopback_pair(true).expect("two loopback ports");
    let lo1 = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));
    let lo2 = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mac_x = [2, 0, 0, 0, 0, 0x11];
    // X floods a frame to its one remote (Y); Y learns mac_x behind 127.0.0.1.
    let mut pkts: Vec<Pkt> = (0..1).map(|_| Pkt::new()).collect();
    let mut f = inner_frame(mac_x, 100);
    f[..6].fill(0xff);
    pkts[0].fill(&f);
    let mut drops = DropTally::default();
    assert_eq!(x.tx_burst(0, &mut pkts, &[0], &mut drops).packets, 1);
    assert_eq!(receive(&y, 1), vec![f]);
    let e = y.entries();
    assert_eq!(e.len(), 1);
    assert_eq!(
        (e[0].mac, e[0].vtep, e[0].origin),
        (MacAddr(mac_x), lo1, Origin::Learned)
    );
    assert_eq!(y.lookup(MacAddr(mac_x)), Some(lo1));

    // Origins: EVPN replaces learned, learned never replaces EVPN or static, static wins,
    // and a withdrawal removes only its own origin.
    let m = MacAddr([2, 0, 0, 0, 0, 0x22]);
    let other = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 9));
    assert!(y.add_mac(m, lo1, Origin::Learned));
    assert!(y.add_mac(m, other, Origin::Evpn));
    assert!(!y.add_mac(m, lo1, Origin::Learned));
    assert_eq!(y.lookup(m), Some(other));
    assert!(!y.remove_mac(m, Origin::Learned));
    assert!(y.add_mac(m, lo2, Origin::Static));
    assert!(!y.add_mac(m, other, Origin::Evpn));
    assert!(!y.remove_mac(m, Origin::Evpn));
    assert!(y.remove_mac(m, Origin::Static));
    assert_eq!(y.lookup(m), None);
    assert!(y.add_mac(m, other, Origin::Evpn));
    assert_eq!(y.remove_macs_by_origin(Origin::Evpn), 1);

    // The flood list keeps one VTEP per address with its origins.
    y.add_flood(other, Origin::Evpn);
    y.add_flood(lo1, Origin::Evpn);
    assert_eq!(
        y.flood_list(),
        vec![
            (lo1, vec![Origin::Evpn, Origin::Static]),
            (other, vec![Origin::Evpn])
        ]
    );
    assert_eq!(y.remove_flood_by_origin(Origin::Evpn), 2);
    assert_eq!(y.flood_list(), vec![(lo1, vec![Origin::Static])]);

    // Learned unicast from Y to mac_x goes to 127.0.0.1 only (X receives it).
    let g = inner_frame([2, 0, 0, 0, 0, 0x33], 80);
    let mut to_x = g.clone();
    to_x[..6].copy_from_slice(&mac_x);
    pkts[0].fill(&to_x);
    assert_eq!(y.tx_burst(0, &mut pkts, &[0], &mut drops).packets, 1);
    assert_eq!(receive(&x, 1), vec![to_x]);
    let st = y.stats();
    assert_eq!(st.vtep(lo1).unwrap().tx_frames, 1);
    assert_eq!(st.vtep(lo1).unwrap().rx_frames, 1);
    assert_eq!(st.traffic.rx_bytes, 100);
    assert_eq!(y.inner_mtu() + 50, y.underlay_mtu());
    assert_eq!(y.src_ports().len(), qswitch_dp::port::vxlan::SRC_PORTS);

    // Aging (default 300 s) on the switch clock: learned entries go, EVPN ones stay.
    assert!(y.add_mac(m, other, Origin::Evpn));
    let later = 301 * 1_000_000_000;
    assert_eq!(y.rx_burst(0, &mut pkts, later, &mut drops), 0);
    assert_eq!(y.lookup(MacAddr(mac_x)), None);
    let e = y.entries();
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!((e[0].mac, e[0].origin, e[0].age_ns), (m, Origin::Evpn, 0));
}

/// Ports of several VNIs share one (local, dstport): each receives its own VNI only, also
/// after another port of the group is closed.
#[test]
fn vnis_share_one_udp_port() {
    let lo = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
    let mut opened = None;
    for attempt in 0..20u16 {
        let dstport = 30_000 + ((std::process::id() as u16).wrapping_add(attempt * 89) % 9_000);
        let mk = |vni| {
            let mut c = VxlanConfig::new(vni, lo);
            c.dstport = dstport;
            VxlanPort::open("vx", &c, groups())
        };
        if let (Ok(a), Ok(b), Ok(c)) = (mk(100), mk(200), mk(300)) {
            opened = Some((a, b, c, dstport, mk(200)));
            break;
        }
    }
    let (p100, p200, p300, dstport, again) = opened.expect("three ports on one address");
    assert!(again.is_err(), "one port per VNI and address");
    let to = SocketAddr::new(lo, dstport);
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let frame = |vni: u32| inner_frame([2, 0, 0, 0, 1, vni as u8], 60);
    let send = |vni: u32, n: usize| {
        for _ in 0..n {
            s.send_to(&vxlan_payload(0x08, vni, &frame(vni)), to)
                .unwrap();
        }
    };
    send(100, 5);
    send(200, 7);
    send(300, 3);
    assert_eq!(receive(&p100, 5), vec![frame(100); 5]);
    assert_eq!(receive(&p200, 7), vec![frame(200); 7]);
    assert_eq!(receive(&p300, 3), vec![frame(300); 3]);
    // Closing the first port moves the last into its place; steering follows.
    drop(p100);
    send(200, 4);
    send(300, 6);
    assert_eq!(receive(&p200, 4), vec![frame(200); 4]);
    assert_eq!(receive(&p300, 6), vec![frame(300); 6]);
    for p in [&p200, &p300] {
        assert!(receive_late(p).is_empty());
        assert_eq!(p.stats().drop_count(VxlanDrop::UnknownVni), 0);
    }
    // An unknown VNI lands on one of them and is counted there.
    send(999, 1);
    let (a, b) = (receive_late(&p200), receive_late(&p300));
    assert!(a.is_empty() && b.is_empty());
    let unknown = p200.stats().drop_count(VxlanDrop::UnknownVni)
        + p300.stats().drop_count(VxlanDrop::UnknownVni);
    assert_eq!(unknown, 1);
}

/// A `type = "vxlan"` port from config in a (manual) switch: frames from a remote VTEP reach
/// an inject port and are learned in the switch's fdb as behind the VXLAN port; unicast back
/// goes out through the tunnel.
#[test]
fn config_port_in_a_switch() {
    use qswitch_api::{PortConfig, PortKind};
    let options = qswitch_dp::Options {
        topology: Some(qswitch_dp::control::placement::Topology::synthetic(1, 4, 1)),
        ..Default::default()
    };
    let sw = qswitch_dp::Switch::manual(&[0], &options).expect("manual switch");
    let (l4, l5) = (
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4)),
        IpAddr::V4(Ipv4Addr::new(127, 0, 0, 5)),
    );
    let mut added = None;
    for attempt in 0..20u16 {
        let dstport = 20_000 + ((std::process::id() as u16).wrapping_add(attempt * 83) % 9_000);
        let port = PortConfig::new(
            "vx",
            PortKind::Vxlan(qswitch_api::VxlanConfig {
                vni: 42,
                local: l4,
                remotes: vec![l5],
                dstport,
                learning: true,
                udp_csum: None,
            }),
        );
        let mut c = VxlanConfig::new(42, l5);
        c.remotes = vec![l4];
        c.dstport = dstport;
        if let (Ok(remote), Ok(_)) = (VxlanPort::open("remote", &c, groups()), sw.add_port(&port)) {
            added = Some(remote);
            break;
        }
    }
    let remote = added.expect("a VXLAN port in the switch and its peer");
    // `port list` says what MTU the VLAN's VMs need: the route's MTU (loopback's) less 50.
    let info = sw.ports().into_iter().find(|p| p.name == "vx").unwrap();
    assert_eq!(info.inner_mtu, Some(remote.inner_mtu()));
    assert!(remote.inner_mtu() > 60_000, "{}", remote.inner_mtu());
    let a = sw.add_inject_port("a", None).unwrap();
    let (mac_a, mac_r) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0x5]);

    // Remote → switch: a broadcast reaches port a.
    let mut pkts: Vec<Pkt> = (0..1).map(|_| Pkt::new()).collect();
    let mut bcast = inner_frame(mac_r, 60);
    bcast[..6].fill(0xff);
    pkts[0].fill(&bcast);
    let mut drops = DropTally::default();
    assert_eq!(remote.tx_burst(0, &mut pkts, &[0], &mut drops).packets, 1);
    let mut got = Vec::new();
    for i in 0..2000 {
        sw.poll_once(1_000 * (i + 1));
        got.extend(a.take_captured());
        if !got.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(got, vec![bcast]);
    let fdb = sw.fdb();
    assert!(
        fdb.iter()
            .any(|e| e.port == "vx" && e.mac == MacAddr(mac_r).to_string()),
        "{fdb:?}"
    );

    // Switch → remote: unicast to the learned MAC leaves through the tunnel.
    let mut uni = inner_frame(mac_a, 60);
    uni[..6].copy_from_slice(&mac_r);
    a.inject(&uni);
    sw.poll_once(10_000_000);
    assert_eq!(receive(&remote, 1), vec![uni]);
}

#[test]
fn one_flow_one_source_port() {
    use qswitch_dp::port::vxlan::flow_hash;
    // Two frames of one UDP flow (different payloads) hash alike; another flow differs.
    let udp = |sport: u16, payload: u8| {
        let mut f = vec![0u8; 14 + 20 + 8 + 4];
        f[12..14].copy_from_slice(&[8, 0]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&32u16.to_be_bytes());
        f[22] = 64;
        f[23] = 17;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        f[42..].fill(payload);
        f
    };
    assert_eq!(flow_hash(&udp(1000, 1)), flow_hash(&udp(1000, 2)));
    let distinct: std::collections::HashSet<u32> =
        (0..64).map(|p| flow_hash(&udp(1000 + p, 0)) % 16).collect();
    assert!(
        distinct.len() >= 8,
        "flows spread over source ports: {distinct:?}"
    );
}

/// A TSO frame as a TAP hands it over: Ethernet + IPv4 (DF) + TCP (ACK|PSH, 12 bytes of
/// timestamp option) + `n` bytes, with a partial checksum (`NEEDS_CSUM`) and `gso_size` `mss`.
fn tso_frame(n: usize, mss: u16) -> (Vec<u8>, qswitch_wire::virtio_net_hdr::VirtioNetHdr) {
    use qswitch_wire::virtio_net_hdr::{VirtioNetHdr, FLAG_NEEDS_CSUM, GSO_TCPV4};
    let mut f = vec![0u8; 66 + n];
    f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 0xb]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0xa]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((52 + n) as u16).to_be_bytes());
    f[20] = 0x40;
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 0, 0, 1]);
    f[30..34].copy_from_slice(&[10, 0, 0, 2]);
    let c = qswitch_wire::checksum::fold(qswitch_wire::checksum::sum16(&f[14..34], 0));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[34..36].copy_from_slice(&40000u16.to_be_bytes());
    f[36..38].copy_from_slice(&5201u16.to_be_bytes());
    f[38..42].copy_from_slice(&7u32.to_be_bytes());
    f[42..46].copy_from_slice(&99u32.to_be_bytes());
    f[46] = 8 << 4;
    f[47] = 0x18;
    f[48..50].copy_from_slice(&1024u16.to_be_bytes());
    f[54..66].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    for (i, b) in f[66..].iter_mut().enumerate() {
        *b = (i * 13 % 251) as u8;
    }
    let hdr = VirtioNetHdr {
        flags: FLAG_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 66,
        gso_size: mss,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    };
    let ph = qswitch_wire::checksum::pseudo_header_v4(
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        qswitch_wire::IpProtocol::Tcp,
        (32 + n) as u16,
    );
    f[50..52].copy_from_slice(&(!qswitch_wire::checksum::fold(ph)).to_be_bytes());
    (f, hdr)
}

/// Receives on `port` until `want` frames came or 5 s passed, with their virtio-net headers.
fn receive_with_hdr(
    port: &VxlanPort,
    want: usize,
) -> Vec<(Vec<u8>, qswitch_wire::virtio_net_hdr::VirtioNetHdr)> {
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let mut drops = DropTally::default();
    let mut got = Vec::new();
    qswitch_test_support::harness::wait_until(Duration::from_secs(5), || loop {
        let n = port.rx_burst(0, &mut pkts, 1, &mut drops);
        port.rx_accepted(0, u32::MAX);
        got.extend(pkts[..n].iter().map(|p| (p.frame().to_vec(), p.hdr)));
        if n == 0 || got.len() >= want {
            return got.len() >= want;
        }
    });
    got
}

/// Sends a TSO frame of `n` bytes of TCP payload in segments of `mss` through `x`, checks
/// that every segment left, and returns the frame and the number of segments.
fn send_tso(x: &VxlanPort, n: usize, mss: u16) -> (Vec<u8>, usize) {
    let (f, hdr) = tso_frame(n, mss);
    let mut pkts: Vec<Pkt> = (0..1).map(|_| Pkt::new()).collect();
    pkts[0].fill(&f);
    pkts[0].hdr = hdr;
    let mut drops = DropTally::default();
    let segs = n.div_ceil(usize::from(mss));
    assert_eq!(
        x.tx_burst(0, &mut pkts, &[0], &mut drops).packets as usize,
        segs
    );
    (f, segs)
}

/// A TSO frame leaves as one `UDP_SEGMENT` send of encapsulated segments, arrives (loopback
/// keeps GSO packets whole) as one `UDP_GRO` message, and is coalesced back into the same
/// super-frame: same bytes once its checksum is completed, same segment size.
#[test]
fn tso_frames_cross_as_one_gso_send_and_come_out_whole() {
    use qswitch_wire::virtio_net_hdr::{FLAG_NEEDS_CSUM, GSO_TCPV4};
    let (x, y, _) = loopback_pair(true).expect("two loopback ports");
    let (f, segs) = send_tso(&x, 20_000, 1398);
    let st = x.stats();
    assert_eq!((st.segmented, st.gso_sent), (1, 1), "{st:?}");

    let got = receive_with_hdr(&y, 1);
    assert_eq!(got.len(), 1, "one super-frame");
    let (frame, h) = &got[0];
    assert_eq!(h.gso_type, GSO_TCPV4);
    assert_eq!(h.flags, FLAG_NEEDS_CSUM);
    assert_eq!(
        (h.gso_size, h.hdr_len, h.csum_start, h.csum_offset),
        (1398, 66, 34, 16)
    );
    assert_eq!(frame.len(), f.len());
    // Complete both checksums and compare: the same frame (IPv4 id aside: both 0 here).
    let mut a = f.clone();
    let mut b = frame.clone();
    qswitch_wire::checksum::complete_partial(&mut a, 34, 16).unwrap();
    qswitch_wire::checksum::complete_partial(&mut b, 34, 16).unwrap();
    assert_eq!(a, b);
    let st = y.stats();
    assert_eq!(st.udp_gro, 1, "{st:?}");
    assert_eq!(
        (st.gro_frames, st.gro_segments),
        (1, segs as u64 - 1),
        "{st:?}"
    );
    assert_eq!(st.traffic.rx_frames as usize, segs, "counted per datagram");
    assert!(st.drops.iter().all(|(_, n)| *n == 0), "{st:?}");
}

/// A coalesced message queued while `UDP_GRO` was on and read after a second port joined the
/// address (which turns it off) comes without its segment size; its datagrams are still
/// told apart (each starts with the same VXLAN header, at the size the first one's inner IP
/// length gives) and the segments come out whole, not as one frame with the rest of them
/// as trailing bytes.
#[test]
fn a_coalesced_message_read_after_udp_gro_went_off_is_split() {
    use qswitch_wire::virtio_net_hdr::GSO_TCPV4;
    let (x, y, dstport) = loopback_pair(true).expect("two loopback ports");
    let (f, segs) = send_tso(&x, 20_000, 1398);
    // Queued at y as one message; now a second VNI joins y's address.
    std::thread::sleep(Duration::from_millis(50));
    let mut c = VxlanConfig::new(VNI + 1, IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)));
    c.dstport = dstport;
    let _second = VxlanPort::open("vx2", &c, groups()).expect("a second VNI on the address");
    let got = receive_with_hdr(&y, 1);
    assert_eq!(got.len(), 1, "one super-frame again");
    let (frame, h) = &got[0];
    assert_eq!((h.gso_type, h.gso_size), (GSO_TCPV4, 1398));
    assert_eq!(frame.len(), f.len());
    let st = y.stats();
    assert_eq!(st.traffic.rx_frames as usize, segs, "{st:?}");
    assert!(st.drops.iter().all(|(_, n)| *n == 0), "{st:?}");
}

/// With checksums off (`udp_csum = false`: zero over IPv4) the kernel refuses `UDP_SEGMENT`:
/// a TSO frame leaves as one `sendmmsg` of datagrams, which the receiver still coalesces.
#[test]
fn without_checksums_tso_frames_leave_as_datagrams() {
    let (x, y, _) = loopback_pair_with(true, Some(false)).expect("two loopback ports");
    let (f, hdr) = tso_frame(20_000, 1398);
    let mut pkts: Vec<Pkt> = (0..1).map(|_| Pkt::new()).collect();
    pkts[0].fill(&f);
    pkts[0].hdr = hdr;
    let mut drops = DropTally::default();
    let segs = 20_000usize.div_ceil(1398);
    assert_eq!(
        x.tx_burst(0, &mut pkts, &[0], &mut drops).packets as usize,
        segs
    );
    let st = x.stats();
    assert_eq!((st.segmented, st.gso_sent), (1, 0), "{st:?}");
    let mut payload = Vec::new();
    let mut frames = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while payload.len() < 20_000 && Instant::now() < deadline {
        for (frame, _) in receive_with_hdr(&y, 1) {
            payload.extend_from_slice(&frame[66..]);
            frames += 1;
        }
    }
    assert_eq!(payload, f[66..], "the payload, in order");
    let st = y.stats();
    assert_eq!(st.traffic.rx_frames as usize, segs);
    assert_eq!(st.gro_segments as usize, segs - frames, "{st:?}");
}

/// Bad datagrams inside one `UDP_GRO` message are dropped and counted one by one; the good
/// ones around them still come through (and coalesce).
#[test]
fn bad_datagrams_in_a_gro_message_are_counted_one_by_one() {
    use qswitch_sys::udp::{UdpOptions, UdpSocket as QUdp};
    let (_x, y, dstport) = loopback_pair(true).expect("two loopback ports");
    let (f, hdr) = tso_frame(3 * 1000, 1000);
    let mut segs = Vec::new();
    let mut scratch = vec![0u8; 4000];
    let mut full = f.clone();
    qswitch_wire::checksum::complete_partial(&mut full, 34, 16).unwrap();
    qswitch_wire::gso::segment(&full, &hdr, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
    assert_eq!(segs.len(), 3);
    let size = 8 + segs[0].len();
    // [seg 0] [I flag clear] [other VNI] [seg 1] [seg 2] [5 bytes: short]
    let mut data = Vec::new();
    data.extend(vxlan_payload(0x08, VNI, &segs[0]));
    data.extend(vxlan_payload(0x00, VNI, &segs[1]));
    data.extend(vxlan_payload(0x08, VNI + 1, &segs[1]));
    data.extend(vxlan_payload(0x08, VNI, &segs[1]));
    data.extend(vxlan_payload(0x08, VNI, &segs[2]));
    data.extend([0x08, 0, 0, 0, 0]);
    let s = QUdp::bind("127.0.0.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
    let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), dstport);
    assert_eq!(s.send_segments(to, &data, size as u16).unwrap(), data.len());
    let got = receive_with_hdr(&y, 1);
    let late = receive_late(&y);
    assert!(late.is_empty(), "{late:?}");
    assert_eq!(got.len(), 1, "seg 0..2 coalesced");
    assert_eq!(got[0].0.len(), f.len());
    let st = y.stats();
    assert_eq!(st.udp_gro, 1, "{st:?}");
    for (reason, n) in [
        (VxlanDrop::IFlagClear, 1),
        (VxlanDrop::UnknownVni, 1),
        (VxlanDrop::Short, 1),
    ] {
        assert_eq!(st.drop_count(reason), n, "{reason:?}: {st:?}");
    }
    assert_eq!((st.gro_frames, st.gro_segments), (1, 2));
}

// ---------------------------------------------------------------------------------------
// The underlay as an attacker (issue 27: F3, F4, F9, F11)
// ---------------------------------------------------------------------------------------

/// A manual switch with inject port `a` and a VXLAN port `vx` (VNI 42) listening on
/// `local`, flooding to `remotes`, with `learning`. Returns the switch, the port and its
/// UDP port.
fn switch_with_vxlan(
    local: Ipv4Addr,
    remotes: &[Ipv4Addr],
    learning: bool,
    base: u16,
) -> (
    qswitch_dp::Switch,
    Arc<qswitch_dp::port::inject::InjectPort>,
    Arc<VxlanPort>,
    u16,
) {
    let options = qswitch_dp::Options {
        topology: Some(qswitch_dp::control::placement::Topology::synthetic(1, 4, 1)),
        ..Default::default()
    };
    let sw = qswitch_dp::Switch::manual(&[0], &options).expect("manual switch");
    add_vxlan_and_a(sw, local, remotes, learning, base)
}

/// Adds `vx` and `a` (see [`switch_with_vxlan`]) to `sw`.
fn add_vxlan_and_a(
    sw: qswitch_dp::Switch,
    local: Ipv4Addr,
    remotes: &[Ipv4Addr],
    learning: bool,
    base: u16,
) -> (
    qswitch_dp::Switch,
    Arc<qswitch_dp::port::inject::InjectPort>,
    Arc<VxlanPort>,
    u16,
) {
    use qswitch_api::{PortConfig, PortKind};
    let mut dstport = None;
    for attempt in 0..20u16 {
        let port = base + ((std::process::id() as u16).wrapping_add(attempt * 79) % 5_000);
        let config = PortConfig::new(
            "vx",
            PortKind::Vxlan(qswitch_api::VxlanConfig {
                vni: 42,
                local: IpAddr::V4(local),
                remotes: remotes.iter().map(|&r| IpAddr::V4(r)).collect(),
                dstport: port,
                learning,
                udp_csum: None,
            }),
        );
        if sw.add_port(&config).is_ok() {
            dstport = Some(port);
            break;
        }
    }
    let dstport = dstport.expect("a VXLAN port in the switch");
    let a = sw.add_inject_port("a", None).unwrap();
    let vx = sw.vxlan_ports().remove(0).2;
    (sw, a, vx, dstport)
}

/// Sends one VXLAN datagram (VNI 42) from `from` (any loopback address) to `to`.
fn send_from(from: Ipv4Addr, to: SocketAddr, inner: &[u8]) {
    let s = UdpSocket::bind(SocketAddr::new(IpAddr::V4(from), 0)).unwrap();
    s.send_to(&vxlan_payload(0x08, 42, inner), to).unwrap();
}

/// Polls the switch until the VXLAN port has received `frames` datagrams in all (switched
/// or dropped), or 5 s passed; returns the clock it got to.
fn poll_until_received(sw: &qswitch_dp::Switch, vx: &VxlanPort, frames: u64, mut now: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        now += 1_000;
        sw.poll_once(now);
        let st = vx.stats();
        let dropped: u64 = st.drops.iter().map(|(_, n)| n).sum();
        if st.traffic.rx_frames + dropped >= frames || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// The port the switch's fdb has `mac` on (`fdb` lists the switch's entries first, then
/// remote-table rows the switch has not learned).
fn fdb_port_of(sw: &qswitch_dp::Switch, mac: MacAddr) -> Option<String> {
    sw.fdb()
        .into_iter()
        .find(|e| e.mac == mac.to_string())
        .map(|e| e.port)
}

/// Frame `src` → `dst`, untagged, EtherType 0x88b5.
fn frame_to(dst: [u8; 6], src: [u8; 6]) -> Vec<u8> {
    let mut f = inner_frame(src, 60);
    f[..6].copy_from_slice(&dst);
    f
}

/// F3: one datagram from an underlay address that is no configured remote, carrying a
/// local VM's MAC as inner source, does not move that MAC onto the VXLAN port: unicast to
/// the VM still reaches it. A frame from a configured remote (proof: the operator's or
/// EVPN's VTEP) still moves it, as a migration must. Checked to fail before the fix (the
/// MAC moved to `vx` and the ping went to the attacker).
#[test]
fn an_unknown_vtep_cannot_take_a_local_mac() {
    let (local, remote, attacker) = (
        Ipv4Addr::new(127, 0, 1, 1),
        Ipv4Addr::new(127, 0, 1, 2),
        Ipv4Addr::new(127, 0, 1, 66),
    );
    let (sw, a, vx, dstport) = switch_with_vxlan(local, &[remote], true, 21_000);
    let b = sw.add_inject_port("b", None).unwrap();
    let to = SocketAddr::new(IpAddr::V4(local), dstport);
    let (vm, peer) = ([2, 0, 0, 0, 0, 0xa], [2, 0, 0, 0, 0, 0xb]);
    // The VM speaks: learned on a.
    a.inject(&frame_to([0xff; 6], vm));
    let mut now = 1_000;
    sw.poll_once(now);
    assert_eq!(fdb_port_of(&sw, MacAddr(vm)).as_deref(), Some("a"));
    // The attacker claims the VM's MAC from the underlay.
    send_from(attacker, to, &frame_to([0xff; 6], vm));
    now = poll_until_received(&sw, &vx, 1, now);
    assert_eq!(
        fdb_port_of(&sw, MacAddr(vm)).as_deref(),
        Some("a"),
        "{:?}",
        sw.fdb()
    );
    let st = sw.stats();
    let vxs = st.ports.iter().find(|p| p.name == "vx").unwrap();
    assert_eq!(vxs.fdb.unwrap().moves_held, 1, "{vxs:?}");
    // Unicast to the VM still goes to the VM, not into the tunnel.
    a.take_captured();
    b.inject(&frame_to(vm, peer));
    now += 1_000;
    sw.poll_once(now);
    assert_eq!(a.take_captured(), vec![frame_to(vm, peer)]);
    // A frame from the configured remote is proof enough: the MAC moves (a migration).
    send_from(remote, to, &frame_to([0xff; 6], vm));
    poll_until_received(&sw, &vx, 2, now);
    assert_eq!(fdb_port_of(&sw, MacAddr(vm)).as_deref(), Some("vx"));
}

/// F3: with `learning = false` the switch's fdb learns nothing from the VXLAN port's
/// frames but the sources the control plane put behind their VTEP (static or EVPN
/// entries). Checked to fail before the fix (the fdb learned every source).
#[test]
fn with_learning_off_the_switch_learns_only_vouched_macs() {
    let (local, remote) = (Ipv4Addr::new(127, 0, 2, 1), Ipv4Addr::new(127, 0, 2, 2));
    let (sw, a, vx, dstport) = switch_with_vxlan(local, &[remote], false, 26_000);
    let to = SocketAddr::new(IpAddr::V4(local), dstport);
    let (stranger, known) = ([2, 0, 0, 0, 2, 1], [2, 0, 0, 0, 2, 2]);
    assert!(vx.add_mac(MacAddr(known), IpAddr::V4(remote), Origin::Static));
    send_from(remote, to, &frame_to([0xff; 6], stranger));
    send_from(remote, to, &frame_to([0xff; 6], known));
    poll_until_received(&sw, &vx, 2, 0);
    assert_eq!(a.take_captured().len(), 2, "both frames are switched");
    let fdb = sw.fdb();
    assert!(
        !fdb.iter().any(|e| e.mac == MacAddr(stranger).to_string()),
        "{fdb:?}"
    );
    assert!(
        fdb.iter()
            .any(|e| e.mac == MacAddr(known).to_string() && e.port == "vx"),
        "{fdb:?}"
    );
    assert!(vx.entries().iter().all(|e| e.origin == Origin::Static));
    // The vouched MAC is in the switch's own table (replies to it do not flood).
    assert_eq!(
        sw.stats()
            .ports
            .iter()
            .find(|p| p.name == "vx")
            .unwrap()
            .fdb
            .unwrap()
            .entries,
        1
    );
}

/// F4: the remote table learns only from frames the switch accepts (an inner-tagged frame
/// on the VXLAN port, dropped as `vlan_tagged`, re-points nothing), an unknown VTEP cannot
/// re-point a remote MAC, and a MAC flapping between two configured VTEPs stops moving
/// after [`MOVES_PER_SEC`] moves. Checked to fail before the fix (the tagged frame moved the
/// MAC to the attacker).
#[test]
fn the_remote_table_learns_only_what_the_switch_accepts() {
    let (local, r1, r2, attacker) = (
        Ipv4Addr::new(127, 0, 3, 1),
        Ipv4Addr::new(127, 0, 3, 2),
        Ipv4Addr::new(127, 0, 3, 3),
        Ipv4Addr::new(127, 0, 3, 66),
    );
    let (sw, _a, vx, dstport) = switch_with_vxlan(local, &[r1, r2], true, 31_000);
    let to = SocketAddr::new(IpAddr::V4(local), dstport);
    let rvm = [2, 0, 0, 0, 3, 1];
    send_from(r1, to, &frame_to([0xff; 6], rvm));
    let mut now = poll_until_received(&sw, &vx, 1, 0);
    assert_eq!(vx.lookup(MacAddr(rvm)), Some(IpAddr::V4(r1)));
    // An inner-tagged frame from the attacker: dropped by the switch, learns nothing.
    let mut tagged = frame_to([0xff; 6], rvm);
    tagged.splice(12..12, [0x81, 0x00, 0x00, 0x0a]);
    send_from(attacker, to, &tagged);
    now = poll_until_received(&sw, &vx, 2, now);
    let st = sw.stats();
    let p = st.ports.iter().find(|p| p.name == "vx").unwrap();
    assert_eq!(p.drops.get("vlan_tagged"), Some(&1), "{p:?}");
    assert_eq!(vx.lookup(MacAddr(rvm)), Some(IpAddr::V4(r1)));
    // Untagged from the attacker: accepted, but no proof to move the MAC.
    send_from(attacker, to, &frame_to([0xff; 6], rvm));
    now = poll_until_received(&sw, &vx, 3, now);
    assert_eq!(vx.lookup(MacAddr(rvm)), Some(IpAddr::V4(r1)));
    assert_eq!(vx.stats().moves_held, 1);
    // Between configured VTEPs it moves, but not endlessly within a second.
    for i in 0..10u64 {
        let from = if i % 2 == 0 { r2 } else { r1 };
        send_from(from, to, &frame_to([0xff; 6], rvm));
        now = poll_until_received(&sw, &vx, 4 + i, now);
    }
    let st = vx.stats();
    assert!(st.flaps > 0, "{st:?}");
}

/// F11: spoofed underlay sources and sprayed inner MACs are bounded: one counter (and one
/// metric series) for every VTEP that is not configured, the remote table held at
/// [`MAX_LEARNED`] learned MACs per VNI, and the switch's refusals counted per port in
/// `stats`. Checked to fail before the fix (a counter per source, 5000 learned MACs, no
/// refusal counter).
#[test]
fn spoofed_sources_and_sprayed_macs_are_bounded_and_counted() {
    use qswitch_dp::port::vxlan::MAX_LEARNED;
    let (local, remote) = (Ipv4Addr::new(127, 0, 4, 1), Ipv4Addr::new(127, 0, 4, 2));
    let (sw, _a, vx, dstport) = switch_with_vxlan(local, &[remote], true, 36_000);
    let to = SocketAddr::new(IpAddr::V4(local), dstport);
    // 200 spoofed sources, one frame each.
    for i in 0..200u32 {
        let from = Ipv4Addr::new(127, 1, (i / 250) as u8, (i % 250) as u8 + 1);
        let b = i.to_be_bytes();
        send_from(
            from,
            to,
            &frame_to([0xff; 6], [2, 9, b[0], b[1], b[2], b[3]]),
        );
    }
    let now = poll_until_received(&sw, &vx, 200, 0);
    let st = vx.stats();
    assert_eq!(st.traffic.rx_frames, 200, "{st:?}");
    assert!(st.vteps.is_empty(), "{:?}", st.vteps);
    assert_eq!(st.other_vteps.rx_frames, 200);
    // 5000 inner MACs from one sender, in batches the socket buffer holds.
    let s = UdpSocket::bind("127.0.4.9:0").unwrap();
    let spray = 5_000u32;
    let mut now = now;
    let mut sent = 0u32;
    while sent < spray {
        for i in sent..(sent + 500).min(spray) {
            let b = i.to_be_bytes();
            s.send_to(
                &vxlan_payload(
                    0x08,
                    42,
                    &frame_to([0xff; 6], [2, 8, b[0], b[1], b[2], b[3]]),
                ),
                to,
            )
            .unwrap();
        }
        sent = (sent + 500).min(spray);
        now = poll_until_received(&sw, &vx, 200 + u64::from(sent), now);
    }
    let st = vx.stats();
    assert_eq!(st.traffic.rx_frames, 200 + u64::from(spray), "{st:?}");
    assert_eq!(st.learned as usize, MAX_LEARNED, "{st:?}");
    assert_eq!(
        st.learn_refused,
        200 + u64::from(spray) - MAX_LEARNED as u64
    );
    let sst = sw.stats();
    let f = sst
        .ports
        .iter()
        .find(|p| p.name == "vx")
        .unwrap()
        .fdb
        .unwrap();
    assert_eq!(f.entries, f.limit);
    assert_eq!(
        f.limit_refused,
        200 + u64::from(spray) - u64::from(f.limit),
        "{f:?}"
    );
}

/// F9: a coalesced `UDP_GRO` message larger than a burst keeps the port "busy": after the
/// first burst took 32 of its 64 datagrams, `rx_arm` says sleeping is not safe (the socket
/// is empty, so epoll would not wake the worker for the rest). Checked to fail before the
/// fix (`rx_arm` said true and the other 32 waited for the next packet).
#[test]
fn a_coalesced_message_is_switched_completely_before_sleeping() {
    use qswitch_sys::udp::{UdpOptions, UdpSocket as QUdp, MAX_SEGMENTS};
    let (_x, y, dstport) = loopback_pair(true).expect("two loopback ports");
    let inner = inner_frame([2, 0, 0, 0, 9, 9], 60);
    let one = vxlan_payload(0x08, VNI, &inner);
    let data: Vec<u8> = one.repeat(MAX_SEGMENTS);
    let s = QUdp::bind("127.0.0.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
    let to = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2)), dstport);
    assert_eq!(
        s.send_segments(to, &data, one.len() as u16).unwrap(),
        data.len()
    );
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let mut drops = DropTally::default();
    let mut got = 0;
    qswitch_test_support::harness::wait_until(Duration::from_secs(5), || {
        got = y.rx_burst(0, &mut pkts, 1, &mut drops);
        got != 0
    });
    assert_eq!(got, 32);
    assert_eq!(y.stats().udp_gro, 1, "one coalesced message");
    assert!(!y.rx_arm(0), "datagrams of the message are still waiting");
    assert_eq!(y.rx_burst(0, &mut pkts, 2, &mut drops), MAX_SEGMENTS - 32);
    assert!(y.rx_arm(0), "nothing left: the worker may sleep");
}

/// F9 on a running switch: with `poll_spin = 0` (the worker sleeps as soon as a poll finds
/// nothing new), all 64 datagrams of one coalesced message reach the inject port at once,
/// not 32 now and the rest after the worker's longest sleep (1 s) or the next packet.
/// Checked to fail before the fix (32 of 64 within the bound).
#[test]
fn a_worker_without_spin_switches_a_whole_coalesced_message() {
    use qswitch_sys::udp::{UdpOptions, UdpSocket as QUdp, MAX_SEGMENTS};
    use qswitch_test_support::harness::wait_until;
    let cpu = qswitch_sys::thread::online_cpus().unwrap()[0];
    let options = qswitch_dp::Options {
        poll_spin: Duration::ZERO,
        ..Default::default()
    };
    let sw = qswitch_dp::Switch::start(&[cpu], &options).expect("a running switch");
    let local = Ipv4Addr::new(127, 0, 5, 1);
    let (sw, a, _vx, dstport) = add_vxlan_and_a(sw, local, &[], true, 41_000);
    let one = vxlan_payload(0x08, 42, &frame_to([0xff; 6], [2, 0, 0, 0, 5, 5]));
    let data: Vec<u8> = one.repeat(MAX_SEGMENTS);
    let s = QUdp::bind("127.0.5.2:0".parse().unwrap(), &UdpOptions::default()).unwrap();
    let to = SocketAddr::new(IpAddr::V4(local), dstport);
    assert_eq!(
        s.send_segments(to, &data, one.len() as u16).unwrap(),
        data.len()
    );
    let mut got = 0;
    let all = wait_until(Duration::from_millis(500), || {
        got += a.take_captured().len();
        got == MAX_SEGMENTS
    });
    sw.shutdown();
    assert!(all, "{got} of {MAX_SEGMENTS} frames within 500 ms");
}
