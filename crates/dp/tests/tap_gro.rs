//! Software GRO toward a TAP port: TCP segments handed to [`TapPort::tx_burst`] one by one
//! reach the kernel as one TSO super-frame, which its stack accepts; everything else passes
//! unchanged and in order.
//!
//! Needs root: the TAP is opened here, then moved into a namespace of its own, where a
//! Python AF_PACKET socket on it reports each frame the kernel received (and the TCP resets
//! the namespace's stack sent back). The namespace goes with the test (also on panic);
//! without root or `ip`/`python3`, tests print "skipped: ..." and pass, unless
//! QSWITCH_REQUIRE_PRIVILEGED=1.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use qswitch_dp::packet::Pkt;
use qswitch_dp::port::tap::TapPort;
use qswitch_dp::port::Port;
use qswitch_dp::stats::DropTally;
use qswitch_test_support::frames::{self, mac, TCP_ACK, TCP_PSH};
use qswitch_test_support::skip;
use qswitch_wire::virtio_net_hdr::{VirtioNetHdr, FLAG_NEEDS_CSUM, GSO_TCPV4};

fn can_run() -> bool {
    if !skip::root_or_skip() {
        return false;
    }
    let missing: Vec<&str> = ["ip", "python3"]
        .into_iter()
        .filter(|t| !skip::have_tool(t, &["-V"]) && !skip::have_tool(t, &["--version"]))
        .collect();
    skip::require(
        missing.is_empty(),
        &format!("needs the tools {}", missing.join(", ")),
    )
}

fn run(cmd: &str) {
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
}

/// A namespace holding the TAP (10.0.0.2, MAC 02:..:02; 10.0.0.1 is 02:..:01 statically),
/// deleted on drop.
struct Ns {
    name: String,
}

impl Ns {
    fn new(test: &str, tap: &TapPort) -> Ns {
        let name = format!("qsgro-{test}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        run(&format!("ip netns add {name}"));
        let ns = Ns { name };
        let (n, dev) = (&ns.name, tap.ifname());
        run(&format!("ip link set {dev} netns {n}"));
        run(&format!(
            "ip -n {n} link set {dev} address 02:00:00:00:00:02"
        ));
        run(&format!("ip -n {n} addr add 10.0.0.2/24 dev {dev}"));
        run(&format!("ip -n {n} link set {dev} up"));
        run(&format!(
            "ip -n {n} neigh replace 10.0.0.1 lladdr 02:00:00:00:00:01 dev {dev}"
        ));
        ns
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Prints "ready", then one line per frame: "in HEX" for each frame received from
/// 02:..:01 (until `count` of them), "rst" for each TCP reset sent; stops 0.5 s after the
/// last expected frame (10 s at most).
const CAPTURE: &str = r#"
import socket, sys, time, binascii
dev, count = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((dev, 0))
s.settimeout(0.1)
print("ready", flush=True)
seen, end, deadline = 0, None, time.time() + 10
while time.time() < deadline and (end is None or time.time() < end):
    try:
        data, addr = s.recvfrom(70000)
    except socket.timeout:
        continue
    if addr[2] == socket.PACKET_OUTGOING:
        if data[12:14] == b"\x08\x00" and data[23] == 6 and data[14 + 20 + 13] & 4:
            print("rst", flush=True)
    elif data[6:12] == bytes([2, 0, 0, 0, 0, 1]):
        print("in " + binascii.hexlify(data).decode(), flush=True)
        seen += 1
        if seen == count:
            end = time.time() + 0.5
"#;

struct Capture {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Capture {
    fn start(ns: &Ns, dev: &str, count: usize) -> Capture {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-c", CAPTURE, dev])
            .arg(count.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the capture");
        let out: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let cap = Capture { child, lines };
        let first = cap.lines.recv_timeout(Duration::from_secs(10));
        assert_eq!(first.as_deref(), Ok("ready"), "capture did not start");
        cap
    }

    /// The frames received and the resets sent, once the capture has ended.
    fn finish(mut self) -> (Vec<Vec<u8>>, usize) {
        let (mut got, mut rsts) = (Vec::new(), 0);
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(12)) {
            if l == "rst" {
                rsts += 1;
            } else if let Some(h) = l.strip_prefix("in ") {
                got.push(unhex(h));
            }
        }
        let _ = self.child.wait();
        (got, rsts)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len() / 2)
        .map(|i| u8::from_str_radix(&h[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// A TCP segment 10.0.0.1:`sport` → 10.0.0.2:5201 (IPv4 id `id`, DF), correct checksums.
fn tcp(sport: u16, seq: u32, flags: u8, payload: &[u8], id: u16) -> Vec<u8> {
    let mut l4 = frames::tcp_segment(seq, flags, payload);
    l4[0..2].copy_from_slice(&sport.to_be_bytes());
    frames::ipv4_frame(mac(2), mac(1), 6, id, l4, false)
}

fn payload(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed * 131 + i * 7) as u8).collect()
}

fn pkts_of(frames: &[(Vec<u8>, VirtioNetHdr)]) -> Vec<Pkt> {
    frames
        .iter()
        .map(|(f, h)| {
            let mut p = Pkt::new();
            p.fill(f);
            p.hdr = *h;
            p
        })
        .collect()
}

fn tap_name(test: &str) -> String {
    format!("qsg{test}{}", std::process::id() % 100_000)
}

#[test]
fn in_order_segments_reach_the_kernel_as_one_super_frame() {
    if !can_run() {
        return;
    }
    let dev = tap_name("a");
    let tap = TapPort::open(&dev, 1).expect("open the TAP");
    let ns = Ns::new("one", &tap);
    let cap = Capture::start(&ns, &dev, 1);

    let n = 8;
    let seg = 1000;
    let mut sent = Vec::new();
    let mut all = Vec::new();
    for k in 0..n {
        let p = payload(k, seg);
        let flags = if k == n - 1 {
            TCP_ACK | TCP_PSH
        } else {
            TCP_ACK
        };
        let f = tcp(40000, 1000 + (k * seg) as u32, flags, &p, 7 + k as u16);
        all.extend_from_slice(&p);
        sent.push((f, VirtioNetHdr::default()));
    }
    let mut pkts = pkts_of(&sent);
    let sel: Vec<u8> = (0..n as u8).collect();
    let mut drops = DropTally::default();
    let done = tap.tx_burst(0, &mut pkts, &sel, &mut drops);
    assert_eq!(done.packets, n as u32, "{drops:?}");
    let s = tap.stats();
    assert_eq!((s.gro_frames, s.gro_segments), (1, n as u64));

    let (got, rsts) = cap.finish();
    assert_eq!(got.len(), 1, "one super-frame: {:?}", lens(&got));
    let f = &got[0];
    assert_eq!(f.len(), 54 + n * seg);
    assert_eq!(&f[..14], &sent[0].0[..14], "Ethernet header");
    assert_eq!(
        u16::from_be_bytes([f[16], f[17]]) as usize,
        40 + n * seg,
        "IP length"
    );
    assert_eq!(f[34 + 13], TCP_ACK | TCP_PSH, "the last segment's flags");
    assert_eq!(
        &f[38..42],
        &1000u32.to_be_bytes(),
        "the first sequence number"
    );
    assert_eq!(&f[54..], &all[..], "payload");
    // The namespace's stack took it as one TCP segment (valid, no listener): one reset.
    assert_eq!(rsts, 1, "resets from the namespace");
}

fn lens(v: &[Vec<u8>]) -> Vec<usize> {
    v.iter().map(Vec::len).collect()
}

#[test]
fn other_flows_and_frames_pass_unchanged_and_in_order() {
    if !can_run() {
        return;
    }
    let dev = tap_name("b");
    let tap = TapPort::open(&dev, 1).expect("open the TAP");
    let ns = Ns::new("order", &tap);

    let none = VirtioNetHdr::default();
    let a = |k: u32| tcp(40000, 100 + k * 500, TCP_ACK, &payload(k as usize, 500), 1);
    let b = |k: u32| {
        tcp(
            40001,
            7000 + k * 400,
            TCP_ACK,
            &payload(9 + k as usize, 400),
            1,
        )
    };
    let udp = frames::ipv4_frame(
        mac(2),
        mac(1),
        17,
        3,
        frames::udp_datagram(5000, 9, &payload(3, 300)),
        false,
    );
    // A TSO frame as a guest sends it: GSO set, partial checksum; goes as is.
    let tso = frames::ipv4_frame(
        mac(2),
        mac(1),
        6,
        4,
        {
            let mut l4 = frames::tcp_segment(50_000, TCP_ACK, &payload(5, 1000));
            l4[0..2].copy_from_slice(&40002u16.to_be_bytes());
            l4
        },
        true,
    );
    let tso_hdr = VirtioNetHdr {
        flags: FLAG_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 54,
        gso_size: 500,
        csum_start: 34,
        csum_offset: 16,
        num_buffers: 0,
    };
    // Two segments of flow D in order, the second with a bad TCP checksum.
    let d1 = tcp(40003, 1, TCP_ACK, &payload(6, 300), 1);
    let mut d2 = tcp(40003, 301, TCP_ACK, &payload(7, 300), 1);
    d2[60] ^= 0xff;
    let l2 = frames::l2_frame(mac(2), mac(1), 42, 80);

    let input = vec![
        (a(0), none),   // 0 ┐ merged
        (a(1), none),   // 1 ┘
        (udp, none),    // 2
        (b(0), none),   // 3
        (a(2), none),   // 4   continues A, but after other frames: alone
        (b(1), none),   // 5 ┐ merged
        (b(2), none),   // 6 ┘
        (tso, tso_hdr), // 7   GSO already: as is
        (d1, none),     // 8   alone: its successor's checksum is wrong
        (d2, none),     // 9   as is (for the stack to drop)
        (l2, none),     // 10
    ];
    let expected: Vec<Vec<usize>> = vec![
        vec![0, 1],
        vec![2],
        vec![3],
        vec![4],
        vec![5, 6],
        vec![7],
        vec![8],
        vec![9],
        vec![10],
    ];
    let cap = Capture::start(&ns, &dev, expected.len());
    let mut pkts = pkts_of(&input);
    let sel: Vec<u8> = (0..input.len() as u8).collect();
    let mut drops = DropTally::default();
    let done = tap.tx_burst(0, &mut pkts, &sel, &mut drops);
    assert_eq!(done.packets as usize, input.len(), "{drops:?}");
    let s = tap.stats();
    assert_eq!((s.gro_frames, s.gro_segments), (2, 4));

    let (got, _) = cap.finish();
    assert_eq!(got.len(), expected.len(), "frames: {:?}", lens(&got));
    for (g, want) in got.iter().zip(&expected) {
        if let [one] = want[..] {
            assert_eq!(g, &input[one].0, "frame {one} unchanged, in its place");
        } else {
            let first = &input[want[0]].0;
            let body: Vec<u8> = want
                .iter()
                .flat_map(|&i| input[i].0[54..].to_vec())
                .collect();
            assert_eq!(&g[..16], &first[..16], "frames {want:?}: headers");
            assert_eq!(&g[34..38], &first[34..38], "frames {want:?}: ports");
            assert_eq!(&g[38..42], &first[38..42], "frames {want:?}: first seq");
            assert_eq!(&g[54..], &body[..], "frames {want:?}: payload");
        }
    }
}

#[test]
fn a_lone_segment_and_bad_frames_pass_through() {
    // Nothing here merges, and bad input must neither panic nor merge.
    if !can_run() {
        return;
    }
    let dev = tap_name("c");
    let tap = TapPort::open(&dev, 1).expect("open the TAP");
    let _ns = Ns::new("bad", &tap);
    let mut frames_in = vec![tcp(40000, 1, TCP_ACK, &payload(1, 100), 1)];
    // Truncations of a segment, and a segment whose IP length lies.
    let full = tcp(40000, 101, TCP_ACK, &payload(2, 100), 1);
    for cut in [0, 1, 13, 14, 33, 34, 53, 54, 60] {
        frames_in.push(full[..cut].to_vec());
    }
    let mut lying = full.clone();
    lying[16..18].copy_from_slice(&60_000u16.to_be_bytes());
    frames_in.push(lying);
    let input: Vec<_> = frames_in
        .into_iter()
        .map(|f| (f, VirtioNetHdr::default()))
        .collect();
    let mut pkts = pkts_of(&input);
    let sel: Vec<u8> = (0..input.len() as u8).collect();
    let mut drops = DropTally::default();
    tap.tx_burst(0, &mut pkts, &sel, &mut drops);
    assert_eq!(tap.stats().gro_frames, 0);
}
