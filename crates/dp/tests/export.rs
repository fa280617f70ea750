//! Flow export against the operators' own decoders (issue 32): the flow cache and the IPFIX
//! encoder fed real frame bytes (a TCP and a UDP flow, over IPv4 and IPv6), the messages
//! sent over UDP on loopback to `nfcapd` (package nfdump) and read back with `nfdump -r`;
//! sFlow datagrams written into a pcap and decoded by `tshark` (package tshark).
//!
//! Each test starts its own collector in its own temporary directory and stops it by PID
//! (also on failure: `ChildGuard`, `TempDir`). Needs `nfcapd`, `nfdump` and `tshark`;
//! `.ci/run` installs them (a missing one fails under CI, as every tool does).

use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use qswitch_dp::export::{
    CacheConfig, FlowCache, FlowRecord, FlowSample, IfCounters, IpfixEncoder, SflowEncoder,
};
use qswitch_test_support::nfdump::{collected, nfcapd, nfdump_or_skip};
use qswitch_test_support::tshark::{sflow_fields, sflow_pcap};
use qswitch_test_support::{have_tool, require, TempDir};

const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];
const V4_A: [u8; 4] = [192, 0, 2, 10];
const V4_B: [u8; 4] = [198, 51, 100, 20];

fn v6(last: u8) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[0] = 0xfd;
    a[15] = last;
    a
}

/// An Ethernet frame: IPv4 or IPv6 (by the address length), TCP (`Some(flags)`) or UDP,
/// `payload` bytes after the L4 header.
fn frame(
    src: &[u8],
    dst: &[u8],
    sport: u16,
    dport: u16,
    tcp: Option<u8>,
    payload: usize,
) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&sport.to_be_bytes());
    l4.extend_from_slice(&dport.to_be_bytes());
    match tcp {
        Some(flags) => {
            l4.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        }
        None => {
            l4.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        }
    }
    l4.resize(l4.len() + payload, 0x5a);
    let proto = if tcp.is_some() { 6 } else { 17 };
    let mut f = Vec::new();
    f.extend_from_slice(&MAC_B);
    f.extend_from_slice(&MAC_A);
    if src.len() == 4 {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
        f.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    } else {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        f.extend_from_slice(&[proto, 64]);
    }
    f.extend_from_slice(src);
    f.extend_from_slice(dst);
    f.extend_from_slice(&l4);
    f
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One flow offered `n` frames: (source, destination, ports, TCP?, payload bytes).
struct Flow {
    src: Vec<u8>,
    dst: Vec<u8>,
    ports: (u16, u16),
    tcp: bool,
    payload: usize,
    n: u64,
}

impl Flow {
    /// IP octets of one frame.
    fn octets(&self) -> u64 {
        let ip = if self.src.len() == 4 { 20 } else { 40 };
        ip + if self.tcp { 20 } else { 8 } + self.payload as u64
    }
}

fn flows() -> Vec<Flow> {
    vec![
        Flow {
            src: V4_A.to_vec(),
            dst: V4_B.to_vec(),
            ports: (40001, 5201),
            tcp: true,
            payload: 1000,
            n: 200,
        },
        Flow {
            src: V4_B.to_vec(),
            dst: V4_A.to_vec(),
            ports: (40002, 53),
            tcp: false,
            payload: 100,
            n: 300,
        },
        Flow {
            src: v6(1).to_vec(),
            dst: v6(2).to_vec(),
            ports: (40003, 443),
            tcp: true,
            payload: 500,
            n: 400,
        },
        Flow {
            src: v6(2).to_vec(),
            dst: v6(1).to_vec(),
            ports: (40004, 4789),
            tcp: false,
            payload: 50,
            n: 500,
        },
    ]
}

/// Feeds `flows` interleaved (as a switch sees them) into a cache sampling 1 in `sampling`,
/// then flushes it.
fn records(flows: &[Flow], sampling: u32, t0: u64) -> Vec<FlowRecord> {
    let mut cache = FlowCache::new(CacheConfig {
        capacity: 1024,
        sampling,
        active_timeout_ms: 60_000,
        idle_timeout_ms: 15_000,
    });
    let frames: Vec<Vec<u8>> = flows
        .iter()
        .map(|f| {
            frame(
                &f.src,
                &f.dst,
                f.ports.0,
                f.ports.1,
                f.tcp.then_some(0x18),
                f.payload,
            )
        })
        .collect();
    let mut out = Vec::new();
    let most = flows.iter().map(|f| f.n).max().unwrap();
    for i in 0..most {
        for (f, bytes) in flows.iter().zip(&frames) {
            if i < f.n {
                cache.observe(bytes, 1, 2, t0 + i, &mut out);
            }
        }
    }
    cache.flush(&mut out);
    out
}

fn send(sock: &UdpSocket, to: SocketAddr, msgs: &[Vec<u8>]) {
    for m in msgs {
        assert_eq!(sock.send_to(m, to).unwrap(), m.len());
    }
}

fn ip_text(a: &[u8]) -> String {
    if a.len() == 4 {
        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(a).unwrap()).to_string()
    } else {
        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(a).unwrap()).to_string()
    }
}

/// Sampling 1 shows each flow's exact addresses, ports, protocol, packets and IP bytes;
/// sampling 10 shows the counts scaled by 10.
#[test]
fn nfdump_reads_our_flows() {
    if !nfdump_or_skip() {
        return;
    }
    let dir = TempDir::new("export-nfdump");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    for sampling in [1u32, 10] {
        let port = free_udp_port();
        let flowdir = dir.join(&format!("s{sampling}"));
        let collector = nfcapd(&flowdir, port, sampling);
        let to: SocketAddr = ([127, 0, 0, 1], port).into();
        let fl = flows();
        let t0 = now_ms() - 5_000;
        let mut enc = IpfixEncoder::new(42, sampling, 1400);
        let recs = records(&fl, sampling, t0);
        assert_eq!(recs.len(), fl.len());
        let msgs = enc.encode(&recs, now_ms());
        send(&sock, to, &msgs);
        let got = collected(collector, port, &flowdir);
        assert_eq!(got.len(), fl.len(), "sampling {sampling}: {got:?}");
        // Systematic sampling over the interleaved frames: each flow gets about 1 in N
        // of its frames; the collector multiplies what it reads by N.
        let offered: u64 = fl.iter().map(|f| f.n).sum();
        let total: u64 = got.iter().map(|r| r.5).sum();
        assert_eq!(
            total,
            offered / u64::from(sampling) * u64::from(sampling),
            "scaled total, sampling {sampling}: {got:?}"
        );
        for f in &fl {
            let row = got
                .iter()
                .find(|r| r.2 == f.ports.0)
                .unwrap_or_else(|| panic!("no flow from port {}: {got:?}", f.ports.0));
            assert_eq!(row.0, ip_text(&f.src), "{row:?}");
            assert_eq!(row.1, ip_text(&f.dst), "{row:?}");
            assert_eq!(row.3, f.ports.1, "{row:?}");
            assert_eq!(row.4, if f.tcp { "6" } else { "17" }, "{row:?}");
            if sampling == 1 {
                assert_eq!(row.5, f.n, "packets: {row:?}");
            } else {
                assert_eq!(row.5 % u64::from(sampling), 0, "scaled: {row:?}");
                // (How a flow's share comes out depends on how the flows interleave:
                // systematic sampling; the total above is exact.)
            }
            assert_eq!(row.6, row.5 * f.octets(), "bytes: {row:?}");
        }
    }
}

/// A collector that restarts has forgotten the templates: what is sent before they are
/// sent again is lost; once the template interval has passed they go out again and the
/// flows that follow are read.
#[test]
fn templates_survive_a_collector_restart() {
    if !nfdump_or_skip() {
        return;
    }
    let dir = TempDir::new("export-restart");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = free_udp_port();
    let to: SocketAddr = ([127, 0, 0, 1], port).into();
    let fl = flows();
    let mut enc = IpfixEncoder::new(7, 1, 1400);
    enc.template_interval_ms = 1_000;
    let t = now_ms();

    let first = nfcapd(&dir.join("1"), port, 1);
    send(&sock, to, &enc.encode(&records(&fl[..1], 1, t - 3_000), t));
    assert_eq!(collected(first, port, &dir.join("1")).len(), 1);

    let second = nfcapd(&dir.join("2"), port, 1);
    // Within the interval: data only, which the new collector cannot read.
    let lost = enc.encode(&records(&fl[1..2], 1, t - 2_000), t + 100);
    send(&sock, to, &lost);
    // After it: templates again, then the data.
    send(
        &sock,
        to,
        &enc.encode(&records(&fl[2..], 1, t - 1_000), t + 1_100),
    );
    let got = collected(second, port, &dir.join("2"));
    let mut ports: Vec<u16> = got.iter().map(|r| r.2).collect();
    ports.sort();
    assert_eq!(ports, [40003, 40004], "{got:?}");
}

/// tshark decodes our sFlow datagrams: flow samples (rate, pool, in and out port, the
/// sampled frame's addresses and ports from its first 128 bytes) and counter samples
/// (generic interface counters).
#[test]
fn tshark_decodes_our_sflow() {
    if !require(
        have_tool("tshark", &["--version"]),
        "tshark not installed (apt-get install tshark)",
    ) {
        return;
    }
    let dir = TempDir::new("export-sflow");
    let tcp = frame(&V4_A, &V4_B, 40001, 5201, Some(0x18), 1400);
    let udp6 = frame(&v6(1), &v6(2), 40004, 4789, None, 60);
    let flows = [
        FlowSample {
            frame_len: None,
            source: 3,
            input: 3,
            output: 4,
            sampling_rate: 1000,
            sample_pool: 5000,
            drops: 0,
            frame: &tcp,
        },
        FlowSample {
            frame_len: None,
            source: 4,
            input: 4,
            output: 3,
            sampling_rate: 1000,
            sample_pool: 7000,
            drops: 0,
            frame: &udp6,
        },
    ];
    let counters = [
        IfCounters {
            if_index: 3,
            speed: 10_000_000_000,
            up: true,
            in_octets: 123_456_789,
            in_ucast: 4242,
            out_octets: 987_654,
            out_ucast: 17,
            ..Default::default()
        },
        IfCounters {
            if_index: 4,
            up: true,
            in_octets: 5,
            in_ucast: 1,
            ..Default::default()
        },
    ];
    let mut enc = SflowEncoder::new("192.0.2.1".parse().unwrap(), 0, 1400);
    let dgs = enc.encode(&flows, &counters, 60_000);
    let file = dir.join("sflow.pcap");
    sflow_pcap(&file, &dgs);
    let fields = |filter: &str, names: &[&str]| sflow_fields(dir.path(), &file, filter, names);
    let agent = fields(
        "sflow",
        &[
            "sflow_245.agent",
            "sflow_245.numsamples",
            "sflow_245.sysuptime",
        ],
    );
    assert!(
        !agent.is_empty() && agent[0].starts_with("192.0.2.1|4|"),
        "{agent:?}"
    );
    let f = fields(
        "sflow",
        &[
            "sflow.flow_sample.sampling_rate",
            "sflow.flow_sample.sample_pool",
            "sflow.flow_sample.input_interface",
            "sflow.flow_sample.output_interface_value",
            "sflow_245.header.frame_length",
            "ip.src",
            "ipv6.src",
            "tcp.srcport",
            "udp.srcport",
        ],
    );
    let line = &f[0];
    for want in [
        "1000,1000|5000,7000|3,4|4,3",
        &format!("{},{}", tcp.len(), udp6.len()),
        "192.0.2.10",
        "fd00::1",
        "40001",
        "40004",
    ] {
        assert!(line.contains(want), "{want} not in {line}");
    }
    let c = fields(
        "sflow",
        &[
            "sflow_245.ifindex",
            "sflow_245.ifspeed",
            "sflow_245.ifinoct",
            "sflow_245.ifoutoct",
            "sflow_245.ifinpkt",
            "sflow_245.ifoutpkt",
            "sflow_245.ifoper_status",
        ],
    );
    let line = &c[0];
    // ifIndex, ifSpeed, in/out octets, in/out packets, oper status, for ports 3 and 4.
    let want = "3,4|10000000000,0|123456789,5|987654,0|4242,1|17,0|1,1";
    assert!(line.starts_with(want), "{want} not in {line}");
}

/// 300 flows take several messages (each within 1400 bytes) over several exports: nfdump
/// reads every flow. Its sequence check counts flow records only, while RFC 7011 §3.1
/// counts every data record, the sampling options record too: so nfdump reports exactly one
/// "failure", at the message after the one that carried the templates, and none after.
#[test]
fn many_flows_span_messages_in_sequence() {
    if !nfdump_or_skip() {
        return;
    }
    let dir = TempDir::new("export-seq");
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = free_udp_port();
    let to: SocketAddr = ([127, 0, 0, 1], port).into();
    let collector = nfcapd(dir.path(), port, 1);
    let mut enc = IpfixEncoder::new(9, 1, 1400);
    let t = now_ms();
    let mut messages = 0;
    for round in 0..3u16 {
        let fl: Vec<Flow> = (0..100u16)
            .map(|i| Flow {
                src: if i % 2 == 0 {
                    V4_A.to_vec()
                } else {
                    v6(1).to_vec()
                },
                dst: if i % 2 == 0 {
                    V4_B.to_vec()
                } else {
                    v6(2).to_vec()
                },
                ports: (10_000 + round * 100 + i, 80),
                tcp: i % 3 == 0,
                payload: 10,
                n: 1 + u64::from(i % 5),
            })
            .collect();
        let msgs = enc.encode(&records(&fl, 1, t - 2_000), t);
        assert!(msgs.iter().all(|m| m.len() <= 1400));
        messages += msgs.len();
        send(&sock, to, &msgs);
    }
    assert!(messages >= 6, "{messages}");
    let got = collected(collector, port, dir.path());
    assert_eq!(got.len(), 300);
    let stat = Command::new("nfdump")
        .arg("-R")
        .arg(dir.path())
        .arg("-I")
        .output()
        .expect("nfdump -I");
    let text = String::from_utf8_lossy(&stat.stdout);
    assert!(text.contains("Sequence failures: 1\n"), "{text}");
    assert!(text.contains("Flows: 300"), "{text}");
}
