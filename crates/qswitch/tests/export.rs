//! Flow export from the running daemon (issue 32, root only): two namespaces joined by veth
//! pairs to a `qswitch run` daemon (the kernel fast path off, so every frame crosses a
//! worker), real traffic between them (iperf3 TCP, a counted UDP stream from python3), and
//! the operators' own collectors: `nfcapd` + `nfdump` (package nfdump) for IPFIX, and for
//! sFlow the datagrams received on loopback decoded by `tshark`.
//!
//! Neighbours are static and IPv6 is off in the namespaces, so every frame the switch
//! forwards is one of the test's IPv4 packets: the flows' packet counts add up to the ports'
//! `tx_packets`. Every test has its own number `n`: namespaces `qsex<pid>-<n><port>`, veth
//! ends `qx<n><port><pid>`, subnet 10.204.<n>.0/24, collector port 31000 + pid % 10000 + n.
//! nfcapd and the daemon are stopped by PID (guards), also on failure.

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::nfdump::{collected, nfcapd, nfdump_or_skip, Flow};
use common::tshark::{sflow_fields, sflow_pcap};
use common::{
    counter, have_tool, qs_json, require, root_or_skip, sh_ok, wait_until, worker_cpus,
    DaemonChild, LinkGuard, Netns, TempDir,
};
use serde_json::Value;

struct Lab {
    daemon: DaemonChild,
    /// Namespaces of ports a and b.
    ns: Vec<Netns>,
    _links: Vec<LinkGuard>,
    n: u8,
    dir: TempDir,
}

impl Lab {
    fn new(n: u8, switch: &str) -> Lab {
        let dir = TempDir::new(&format!("export{n}"));
        let control = dir.join("control.sock");
        let pid = std::process::id();
        let mut text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\n{switch}",
            worker_cpus(2),
            control.display(),
            dir.join("state").display()
        );
        let (mut ns, mut links) = (Vec::new(), Vec::new());
        for (i, p) in ['a', 'b'].into_iter().enumerate() {
            let space = Netns::new(&format!("qsex{pid}-{n}{p}"));
            let ifn = format!("qx{n}{p}{}", pid % 100_000);
            text.push_str(&format!(
                "[[port]]\nname = \"{p}\"\ntype = \"veth\"\nifname = \"{ifn}\"\nfastpath = false\n"
            ));
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
                &space.name,
            ]);
            links.push(LinkGuard(ifn));
            space.ok(&["sysctl", "-qw", "net.ipv6.conf.eth0.disable_ipv6=1"]);
            space.ok(&[
                "ip",
                "addr",
                "add",
                &format!("10.204.{n}.{}/24", i + 1),
                "dev",
                "eth0",
            ]);
            space.ok(&["ip", "link", "set", "eth0", "up"]);
            ns.push(space);
        }
        // Static neighbours: no ARP, so every forwarded frame is the test's IP traffic.
        for (i, j) in [(0, 1), (1, 0)] {
            let mac = ns[j].mac("eth0");
            ns[i].ok(&[
                "ip",
                "neigh",
                "replace",
                &format!("10.204.{n}.{}", j + 1),
                "lladdr",
                &mac,
                "dev",
                "eth0",
                "nud",
                "permanent",
            ]);
        }
        let daemon = DaemonChild::start(dir.path(), "qswitch", &text, &control);
        Lab {
            daemon,
            ns,
            _links: links,
            n,
            dir,
        }
    }

    fn ip(&self, i: usize) -> String {
        format!("10.204.{}.{}", self.n, i + 1)
    }

    fn control(&self) -> std::path::PathBuf {
        self.dir.join("control.sock")
    }

    /// `count` UDP datagrams of `len` payload bytes from a (port `sport`) to b:9999.
    fn udp_stream(&self, sport: u16, count: u32, len: usize) {
        let script = format!(
            "import socket,time\n\
             s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.bind(('{}',{sport}))\n\
             for i in range({count}):\n    s.sendto(b'x'*{len},('{}',9999))\n    \
             time.sleep(0.0005) if i%50==49 else None\n",
            self.ip(0),
            self.ip(1)
        );
        self.ns[0].ok(&["python3", "-c", &script]);
    }

    /// An iperf3 TCP run from a to b, `secs` seconds.
    fn iperf3_tcp(&self, secs: u32) {
        let log = self.dir.join("iperf3-server.log");
        let _server = self.ns[1].spawn(&["iperf3", "-s", "-1", "-p", "5201"], &log);
        assert!(self.ns[1].wait_listening(5201), "iperf3 server");
        self.ns[0].ok(&[
            "iperf3",
            "-c",
            &self.ip(1),
            "-p",
            "5201",
            "-t",
            &secs.to_string(),
        ]);
    }

    /// `qswitch stats`, once two readings a second apart agree (the traffic is over).
    fn settled_stats(&self) -> Value {
        let mut last = qs_json(&self.control(), &["stats", "--json"]);
        assert!(
            wait_until(Duration::from_secs(15), || {
                std::thread::sleep(Duration::from_millis(500));
                let now = qs_json(&self.control(), &["stats", "--json"]);
                let same = ["a", "b"].iter().all(|p| {
                    counter(&now, p, "tx_packets") == counter(&last, p, "tx_packets")
                        && counter(&now, p, "rx_packets") == counter(&last, p, "rx_packets")
                });
                last = now;
                same
            }),
            "traffic did not settle"
        );
        last
    }
}

fn tools() -> bool {
    root_or_skip()
        && nfdump_or_skip()
        && require(have_tool("iperf3", &["-v"]), "iperf3 not installed")
        && require(have_tool("python3", &["-V"]), "python3 not installed")
        && require(have_tool("tshark", &["-v"]), "tshark not installed")
}

fn collector_port(n: u8) -> u16 {
    31_000 + (std::process::id() % 10_000) as u16 + u16::from(n)
}

/// The packets and bytes of the flows from `src`:`sport` to `dst`:`dport` over `proto`.
fn sum(
    flows: &[Flow],
    src: &str,
    dst: &str,
    sport: Option<u16>,
    dport: u16,
    proto: &str,
) -> (u64, u64) {
    flows
        .iter()
        .filter(|f| {
            f.0 == src
                && f.1 == dst
                && sport.is_none_or(|p| f.2 == p)
                && f.3 == dport
                && f.4 == proto
        })
        .fold((0, 0), |(p, b), f| (p + f.5, b + f.6))
}

/// Sampling 1: nfdump shows the iperf3 TCP run (both directions) and the UDP stream with
/// their exact packet and IP byte counts, and every forwarded frame is in some flow.
#[test]
fn ipfix_flows_of_real_traffic_in_nfdump() {
    if !tools() {
        return;
    }
    let n = 1;
    let port = collector_port(n);
    let dir = TempDir::new("export-nf1");
    let collector = nfcapd(&dir.join("flows"), port, 1);
    let mut lab = Lab::new(
        n,
        &format!(
            "[switch.ipfix]\ncollector = \"127.0.0.1:{port}\"\nsampling = 1\n\
             active_timeout = 60\nidle_timeout = 15\n"
        ),
    );
    lab.iperf3_tcp(2);
    lab.udp_stream(40_001, 1000, 1000);
    let stats = lab.settled_stats();
    // Stopping flushes every cache (end reason "forced end") to the collector.
    assert!(lab.daemon.terminate(Duration::from_secs(20)).is_some());
    let flows = collected(collector, port, &dir.join("flows"));
    let (a, b) = (lab.ip(0), lab.ip(1));
    assert_eq!(
        sum(&flows, &a, &b, Some(40_001), 9999, "17"),
        (1000, 1000 * (1000 + 8 + 20)),
        "{flows:?}"
    );
    let (to_server, _) = sum(&flows, &a, &b, None, 5201, "6");
    let from_server: u64 = flows
        .iter()
        .filter(|f| f.0 == b && f.2 == 5201 && f.4 == "6")
        .map(|f| f.5)
        .sum();
    assert!(to_server > 100 && from_server > 10, "{flows:?}");
    let frames: u64 = flows.iter().map(|f| f.5).sum();
    let tx = counter(&stats, "a", "tx_packets") + counter(&stats, "b", "tx_packets");
    assert_eq!(frames, tx, "every forwarded frame in a flow: {flows:?}");
}

/// Sampling 10: the UDP stream's count, scaled by the collector, is within a few samples of
/// what was sent; and a reload to sampling 1 takes effect live.
#[test]
fn ipfix_sampling_scales() {
    if !tools() {
        return;
    }
    let n = 2;
    let port = collector_port(n);
    let dir = TempDir::new("export-nf2");
    let collector = nfcapd(&dir.join("flows"), port, 10);
    let mut lab = Lab::new(
        n,
        &format!("[switch.ipfix]\ncollector = \"127.0.0.1:{port}\"\nsampling = 10\n"),
    );
    lab.udp_stream(40_002, 3000, 200);
    lab.settled_stats();
    assert!(lab.daemon.terminate(Duration::from_secs(20)).is_some());
    let flows = collected(collector, port, &dir.join("flows"));
    let (p, b) = sum(&flows, &lab.ip(0), &lab.ip(1), Some(40_002), 9999, "17");
    assert!((2950..=3050).contains(&p), "scaled packets {p}: {flows:?}");
    assert_eq!(b, p * 228, "{flows:?}");
}

/// sFlow at 1 in 1: tshark finds a flow sample for every datagram of the UDP stream (in
/// port a, out port b, the addresses and ports from the first 128 bytes), and the counter
/// samples of port a taken after the traffic agree with `qswitch stats`.
#[test]
fn sflow_flow_and_counter_samples_in_tshark() {
    if !tools() {
        return;
    }
    let n = 3;
    let port = collector_port(n);
    let sock = UdpSocket::bind(("127.0.0.1", port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let lab = Lab::new(
        n,
        &format!("[switch.sflow]\ncollector = \"127.0.0.1:{port}\"\nsampling = 1\npolling = 1\n"),
    );
    let mut got: Vec<Vec<u8>> = Vec::new();
    let mut buf = vec![0u8; 65536];
    let mut recv = |got: &mut Vec<Vec<u8>>, for_: Duration| {
        let end = std::time::Instant::now() + for_;
        while std::time::Instant::now() < end {
            if let Ok(len) = sock.recv(&mut buf) {
                got.push(buf[..len].to_vec());
            }
        }
    };
    lab.udp_stream(40_003, 200, 300);
    let stats = lab.settled_stats();
    // Two polling intervals after the traffic settled: a counter sample of the final counts.
    recv(&mut got, Duration::from_millis(2500));
    let file = lab.dir.join("sflow.pcap");
    sflow_pcap(&file, &got);
    let flows = sflow_fields(
        lab.dir.path(),
        &file,
        "sflow",
        &[
            "sflow.flow_sample.input_interface",
            "sflow.flow_sample.output_interface_value",
            "sflow.flow_sample.sampling_rate",
            "udp.srcport",
        ],
    );
    let stream: usize = flows
        .iter()
        .map(|l| {
            let c: Vec<&str> = l.split('|').collect();
            let (ins, outs, ports): (Vec<&str>, Vec<&str>, Vec<&str>) = (
                c[0].split(',').collect(),
                c[1].split(',').collect(),
                c[3].split(',').collect(),
            );
            // udp.srcport lists the outer (6343's sender) first, then each sample's.
            ports
                .iter()
                .skip(1)
                .zip(ins.iter().zip(outs.iter()))
                .filter(|(p, (i, o))| **p == "40003" && **i == "1" && **o == "2")
                .count()
        })
        .sum();
    assert_eq!(stream, 200, "{flows:?}");
    let counters = sflow_fields(
        lab.dir.path(),
        &file,
        "sflow",
        &[
            "sflow_245.ifindex",
            "sflow_245.ifinoct",
            "sflow_245.ifinpkt",
        ],
    );
    let last_a = counters
        .iter()
        .flat_map(|l| {
            let c: Vec<Vec<&str>> = l.split('|').map(|f| f.split(',').collect()).collect();
            (0..c[0].len())
                .filter(|&i| c[0][i] == "1")
                .map(|i| (c[1][i].to_string(), c[2][i].to_string()))
                .collect::<Vec<_>>()
        })
        .last()
        .expect("a counter sample of port a");
    assert_eq!(
        last_a,
        (
            counter(&stats, "a", "rx_bytes").to_string(),
            counter(&stats, "a", "rx_packets").to_string()
        ),
        "{counters:?}"
    );
}

/// A collector that restarts (and so forgets the templates) reads the flows again once the
/// exporter re-sends them (every 10 s, also with no flow to report).
#[test]
fn ipfix_template_survives_a_collector_restart() {
    if !tools() {
        return;
    }
    let n = 4;
    let port = collector_port(n);
    let dir = TempDir::new("export-nf4");
    let first = nfcapd(&dir.join("1"), port, 1);
    let mut lab = Lab::new(
        n,
        &format!("[switch.ipfix]\ncollector = \"127.0.0.1:{port}\"\n"),
    );
    lab.udp_stream(40_004, 100, 100);
    lab.settled_stats();
    let templates = |lab: &Lab| {
        qs_json(&lab.control(), &["export", "show", "--json"])["counters"]["ipfix_templates"]
            .as_u64()
            .unwrap()
    };
    // The first collector goes; a new one on the same port knows no template.
    common::signal(first.pid(), "TERM");
    drop(first);
    let second = nfcapd(&dir.join("2"), port, 1);
    let before = templates(&lab);
    // Within a template interval (10 s) the templates go out again.
    assert!(
        wait_until(Duration::from_secs(15), || templates(&lab) > before),
        "no template refresh"
    );
    lab.udp_stream(40_005, 300, 100);
    lab.settled_stats();
    assert!(lab.daemon.terminate(Duration::from_secs(20)).is_some());
    let flows = collected(second, port, &dir.join("2"));
    assert_eq!(
        sum(&flows, &lab.ip(0), &lab.ip(1), Some(40_005), 9999, "17"),
        (300, 300 * 128),
        "{flows:?}"
    );
}
