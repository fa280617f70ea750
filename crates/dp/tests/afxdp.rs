//! The AF_XDP uplink port on a real veth pair between two namespaces this test creates: a
//! "wire peer" namespace (`qa`) and the switch-side namespace (`qb`, opened as the port from a
//! thread that entered it). The peer sends and captures raw frames with an AF_PACKET socket
//! from a thread in its namespace. For each mode (native, packet): frames from the peer
//! arrive through `rx_burst` byte for byte (and wake an epoll on the rx fds), frames given to
//! `tx_burst` arrive at the peer byte for byte, a 64 KB TSO frame leaves as MSS-sized
//! segments with valid checksums, oversize frames are counted in both directions, and
//! dropping the port (or killing the process with SIGKILL) leaves no program and no
//! promiscuity behind. Jumbo frames pass up to the MTU. Bad input (no such
//! interface, too many queues, a refused mode, a program already attached) is one clear
//! error with nothing left attached. Generic XDP (skb mode) is refused on a veth: it cannot
//! see an 802.1Q tag the veth holds out of band; a frame tagged that way by the peer's tc
//! arrives tagged in every other mode.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use qswitch_dp::packet::Pkt;
use qswitch_dp::port::afxdp::{AfXdpError, AfXdpPort, Mode};
use qswitch_dp::port::Port;
use qswitch_dp::stats::{DropReason, DropTally};
use qswitch_sys::packet::{PacketOptions, PacketSocket};
use qswitch_wire::checksum;
use qswitch_wire::virtio_net_hdr::{FLAG_NEEDS_CSUM, GSO_TCPV4};
use qswitch_wire::IpProtocol;

const ETHERTYPE: [u8; 2] = [0x88, 0xb5]; // IEEE local experimental
const PEER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0a, 0x01];
const OUR_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x0b, 0x01];
const MSS: u16 = 1448;

fn privileged() -> bool {
    let missing = if !qswitch_sys::thread::is_root() {
        Some("needs root")
    } else if Command::new("ip").arg("-V").output().is_err() {
        Some("needs the ip tool")
    } else if Command::new("ethtool").arg("--version").output().is_err() {
        Some("needs the ethtool tool")
    } else {
        None
    };
    let Some(why) = missing else {
        return true;
    };
    assert!(
        std::env::var_os("QSWITCH_REQUIRE_PRIVILEGED").is_none(),
        "{why} (QSWITCH_REQUIRE_PRIVILEGED is set: a skip is a failure)"
    );
    eprintln!("skipped: {why}");
    false
}

fn ip(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces joined by a veth with two queues each way: `qa` in `peer`, `qb` in `sw`.
/// Deleting the namespaces (on drop, also when a test panics) deletes the veth.
struct Wire {
    peer: String,
    sw: String,
}

impl Wire {
    fn new(tag: &str) -> Wire {
        let id = std::process::id();
        let w = Wire {
            peer: format!("qsdx-p{tag}{id}"),
            sw: format!("qsdx-s{tag}{id}"),
        };
        ip(&["netns", "add", &w.peer]);
        ip(&["netns", "add", &w.sw]);
        ip(&[
            "link",
            "add",
            "qa",
            "netns",
            &w.peer,
            "address",
            "02:00:00:00:0a:01",
            "numtxqueues",
            "2",
            "numrxqueues",
            "2",
            "type",
            "veth",
            "peer",
            "name",
            "qb",
            "netns",
            &w.sw,
            "numtxqueues",
            "2",
            "numrxqueues",
            "2",
        ]);
        ip(&["-n", &w.peer, "link", "set", "qa", "up"]);
        ip(&["-n", &w.sw, "link", "set", "qb", "up"]);
        w
    }

    fn ns_path(ns: &str) -> PathBuf {
        PathBuf::from(format!("/run/netns/{ns}"))
    }

    /// Opens `ifname` of the switch namespace as a port, from a thread in that namespace.
    fn open(&self, ifname: &str, queues: Option<u16>, mode: Mode) -> Result<AfXdpPort, AfXdpError> {
        let path = Wire::ns_path(&self.sw);
        let ifname = ifname.to_string();
        std::thread::spawn(move || {
            qswitch_sys::netns::enter(&path).expect("enter the switch namespace");
            AfXdpPort::open("uplink", &ifname, queues, mode)
        })
        .join()
        .expect("open thread")
    }

    fn sw_link(&self, ifname: &str) -> String {
        ip(&["-n", &self.sw, "-d", "link", "show", ifname])
    }

    /// Nothing of ours on `ifname`: no XDP program, promiscuity 0. Polled for up to a second:
    /// a process another test forks (to run `ip`) holds copies of our fds until it execs,
    /// which can delay their release by that long.
    fn assert_clean(&self, ifname: &str) {
        let deadline = Instant::now() + Duration::from_secs(1);
        loop {
            let link = self.sw_link(ifname);
            if !link.contains("xdp") && link.contains("promiscuity 0") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "an XDP program or promiscuous mode is left: {link}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Sends `frames` from the peer's `qa`.
    fn peer_send(&self, frames: Vec<Vec<u8>>) {
        let path = Wire::ns_path(&self.peer);
        std::thread::spawn(move || {
            qswitch_sys::netns::enter(&path).unwrap();
            let s = open_peer_socket();
            for chunk in frames.chunks(16) {
                let refs: Vec<&[u8]> = chunk.iter().map(Vec::as_slice).collect();
                let mut sent = 0;
                let deadline = Instant::now() + Duration::from_secs(2);
                while sent < refs.len() && Instant::now() < deadline {
                    sent += s.tx.send(&refs[sent..]).unwrap();
                }
                assert_eq!(sent, refs.len(), "the peer could not send");
            }
        })
        .join()
        .unwrap();
    }

    /// Captures frames of our test ethertype (or IPv4 from OUR_MAC) arriving at the peer's
    /// `qa` until `count` have come or 3 s pass. Returns once the socket is open.
    fn peer_capture(&self, count: usize) -> JoinHandle<Vec<Vec<u8>>> {
        let path = Wire::ns_path(&self.peer);
        let (ready_tx, ready_rx) = mpsc::channel();
        let h = std::thread::spawn(move || {
            qswitch_sys::netns::enter(&path).unwrap();
            let mut s = open_peer_socket();
            ready_tx.send(()).unwrap();
            let mut got = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(3);
            while got.len() < count && Instant::now() < deadline {
                s.rx.recv(64, |f| {
                    let d = f.data;
                    if d.len() >= 14 && (d[12..14] == ETHERTYPE || d[6..12] == OUR_MAC) {
                        got.push(d.to_vec());
                    }
                });
                std::thread::sleep(Duration::from_millis(1));
            }
            got
        });
        ready_rx
            .recv_timeout(Duration::from_secs(3))
            .expect("peer capture ready");
        h
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        for ns in [&self.peer, &self.sw] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn open_peer_socket() -> PacketSocket {
    let idx = qswitch_sys::xdp::ifindex("qa").unwrap();
    PacketSocket::open(
        idx,
        PacketOptions {
            slot_size: 16384,
            slots: 256,
            promisc: false,
        },
    )
    .unwrap()
}

/// A test frame: `len` bytes, our ethertype, `marker` after it, then a pattern.
fn test_frame(dst: [u8; 6], src: [u8; 6], marker: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ETHERTYPE);
    f[14..18].copy_from_slice(&marker.to_be_bytes());
    for (i, b) in f[18..].iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(7).wrapping_add(marker) as u8;
    }
    f
}

fn marker(f: &[u8]) -> Option<u32> {
    (f.len() >= 18 && f[12..14] == ETHERTYPE)
        .then(|| u32::from_be_bytes(f[14..18].try_into().unwrap()))
}

/// Polls every rx queue of `port` until `want` frames with a marker arrived or 3 s pass.
fn receive(port: &AfXdpPort, want: usize, drops: &mut DropTally) -> BTreeMap<u32, Vec<u8>> {
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while got.len() < want && Instant::now() < deadline {
        for q in 0..port.queues() {
            let n = port.rx_burst(q, &mut pkts, 0, drops);
            for p in &pkts[..n] {
                if let Some(m) = marker(p.frame()) {
                    got.insert(m, p.frame().to_vec());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    got
}

/// Drains every queue, arms them, and returns whether all said sleeping is safe.
fn drain_and_arm(port: &AfXdpPort) -> bool {
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let mut drops = DropTally::default();
    for q in 0..port.queues() {
        while port.rx_burst(q, &mut pkts, 0, &mut drops) > 0 {}
    }
    (0..port.queues()).all(|q| port.rx_arm(q))
}

/// A TSO frame from OUR_MAC: IPv4/TCP 10.9.0.2:5000 → 10.9.0.1:5201, seq 1000, `n` bytes
/// of payload, gso_size MSS, partial checksum (pseudo-header only), as a guest hands it over.
fn tso_frame(n: usize) -> Pkt {
    let mut f = vec![0u8; 54 + n];
    f[0..6].copy_from_slice(&PEER_MAC);
    f[6..12].copy_from_slice(&OUR_MAC);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    f[14] = 0x45;
    f[16..18].copy_from_slice(&((40 + n) as u16).to_be_bytes());
    f[18..20].copy_from_slice(&0x1234u16.to_be_bytes());
    f[22] = 64;
    f[23] = 6;
    f[26..30].copy_from_slice(&[10, 9, 0, 2]);
    f[30..34].copy_from_slice(&[10, 9, 0, 1]);
    let c = checksum::fold(checksum::sum16(&f[14..34], 0));
    f[24..26].copy_from_slice(&c.to_be_bytes());
    f[34..36].copy_from_slice(&5000u16.to_be_bytes());
    f[36..38].copy_from_slice(&5201u16.to_be_bytes());
    f[38..42].copy_from_slice(&1000u32.to_be_bytes());
    f[46] = 5 << 4;
    f[47] = 0x18; // PSH ACK
    for (i, b) in f[54..].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let ph = checksum::pseudo_header_v4(
        Ipv4Addr::new(10, 9, 0, 2),
        Ipv4Addr::new(10, 9, 0, 1),
        IpProtocol::Tcp,
        (20 + n) as u16,
    );
    // A partial checksum holds the folded pseudo-header sum, not complemented.
    let partial = !checksum::fold(ph);
    f[50..52].copy_from_slice(&partial.to_be_bytes());
    let mut p = Pkt::new();
    p.fill(&f);
    p.hdr.gso_type = GSO_TCPV4;
    p.hdr.gso_size = MSS;
    p.hdr.hdr_len = 54;
    p.hdr.flags = FLAG_NEEDS_CSUM;
    p.hdr.csum_start = 34;
    p.hdr.csum_offset = 16;
    p
}

/// Checks the peer's capture of the TSO frame's segments: wire-sized, valid IPv4 and TCP
/// checksums, contiguous sequence numbers, the payload whole.
fn check_segments(segs: &[Vec<u8>], n: usize) {
    let want = n.div_ceil(usize::from(MSS));
    assert_eq!(segs.len(), want, "segments of a {n}-byte TSO frame");
    let mut payload = Vec::new();
    let mut seq = 1000u32;
    for s in segs {
        assert!(s.len() <= 1514, "segment of {} bytes", s.len());
        assert_eq!(
            checksum::fold(checksum::sum16(&s[14..34], 0)),
            0,
            "IPv4 checksum"
        );
        let ph = checksum::pseudo_header_v4(
            Ipv4Addr::new(10, 9, 0, 2),
            Ipv4Addr::new(10, 9, 0, 1),
            IpProtocol::Tcp,
            (s.len() - 34) as u16,
        );
        assert_eq!(
            checksum::fold(checksum::sum16(&s[34..], ph)),
            0,
            "TCP checksum"
        );
        assert_eq!(u32::from_be_bytes(s[38..42].try_into().unwrap()), seq);
        seq += (s.len() - 54) as u32;
        payload.extend_from_slice(&s[54..]);
    }
    assert_eq!(payload.len(), n);
    assert!(payload
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8));
}

/// Everything one mode must do on the veth.
fn run_mode(mode: Mode, tag: &str, expect_mode: &str) {
    let wire = Wire::new(tag);
    let port = wire.open("qb", None, mode).expect("open the port");
    assert_eq!(port.mode_in_use(), expect_mode);
    let expect_queues = if expect_mode == "packet" { 1 } else { 2 };
    assert_eq!(port.queues(), expect_queues, "one socket per veth rx queue");
    assert_eq!(port.mtu(), 1500);
    assert_eq!(
        port.numa_node(),
        None,
        "a veth has no device, so no NUMA node"
    );
    let link = wire.sw_link("qb");
    assert!(
        link.contains("promiscuity 1"),
        "promiscuous while open: {link}"
    );
    if expect_mode != "packet" {
        assert!(link.contains("prog/xdp"), "program attached: {link}");
    }

    // rx: the rx fds wake an epoll when frames arrive; the frames arrive byte for byte.
    let ep = qswitch_sys::epoll::Epoll::new().unwrap();
    for q in 0..port.queues() {
        ep.add(port.rx_fd(q).expect("rx fd"), u64::from(q)).unwrap();
    }
    let mut armed = false;
    for _ in 0..50 {
        if drain_and_arm(&port) {
            armed = true;
            break;
        }
    }
    assert!(armed, "rx_arm keeps reporting frames");
    let frames: Vec<Vec<u8>> = (0..40)
        .map(|i| test_frame(OUR_MAC, PEER_MAC, i, 60 + (i as usize * 37) % 1455))
        .collect();
    wire.peer_send(frames.clone());
    let mut ev = [qswitch_sys::epoll::Event::EMPTY; 4];
    let woke = ep.wait(&mut ev, 2000).unwrap();
    assert!(woke > 0, "no rx fd became readable");
    let mut drops = DropTally::default();
    let got = receive(&port, frames.len(), &mut drops);
    assert_eq!(got.len(), frames.len(), "frames received through rx_burst");
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(&got[&(i as u32)], f, "frame {i} bytes");
    }
    // A full-MTU frame (1514 bytes) is not oversize.
    wire.peer_send(vec![test_frame(OUR_MAC, PEER_MAC, 1000, 1514)]);
    assert_eq!(receive(&port, 1, &mut drops).len(), 1, "a 1514-byte frame");
    assert_eq!(drops.total(), 0);

    // tx: frames arrive at the peer byte for byte.
    let cap = wire.peer_capture(20);
    let mut pkts: Vec<Pkt> = (0..20)
        .map(|i| {
            let mut p = Pkt::new();
            p.fill(&test_frame(
                PEER_MAC,
                OUR_MAC,
                500 + i,
                60 + i as usize * 70,
            ));
            p
        })
        .collect();
    let sel: Vec<u8> = (0..20).collect();
    let done = port.tx_burst(1, &mut pkts, &sel, &mut drops);
    assert_eq!(done.packets, 20);
    let seen = cap.join().unwrap();
    assert_eq!(seen.len(), 20, "frames at the peer");
    for (i, s) in seen.iter().enumerate() {
        assert_eq!(s.as_slice(), pkts[i].frame(), "tx frame {i} bytes");
    }

    // TSO: a 64 KB super-frame leaves as MSS-sized segments with valid checksums.
    let n: usize = 64_000;
    let cap = wire.peer_capture(n.div_ceil(usize::from(MSS)));
    let mut tso = vec![tso_frame(n)];
    let done = port.tx_burst(0, &mut tso, &[0], &mut drops);
    assert_eq!(done.packets as usize, n.div_ceil(usize::from(MSS)));
    check_segments(&cap.join().unwrap(), n);
    assert_eq!(drops.total(), 0, "no drops so far");
    let k = port.kernel_stats();
    assert_eq!((k.rx_dropped, k.invalid_descs), (0, 0), "{k:?}");

    // tx oversize: counted, not sent (nor truncated).
    let mut big = vec![Pkt::new()];
    big[0].fill(&test_frame(PEER_MAC, OUR_MAC, 900, 1515));
    let done = port.tx_burst(0, &mut big, &[0], &mut drops);
    assert_eq!(done.packets, 0);
    let mut want = DropTally::default();
    want.count(DropReason::Oversize);
    assert_eq!(
        format!("{drops:?}"),
        format!("{want:?}"),
        "one oversize drop"
    );

    // rx oversize: raise both MTUs behind the port's back; a 1700-byte frame from the wire
    // is counted (the port keeps the MTU it opened with).
    ip(&["-n", &wire.sw, "link", "set", "qb", "mtu", "1700"]);
    ip(&["-n", &wire.peer, "link", "set", "qa", "mtu", "1700"]);
    let mut drops = DropTally::default();
    wire.peer_send(vec![test_frame(OUR_MAC, PEER_MAC, 2000, 1700)]);
    let deadline = Instant::now() + Duration::from_secs(3);
    while drops.total() == 0 && Instant::now() < deadline {
        receive(&port, 1, &mut drops);
    }
    let mut want = DropTally::default();
    want.count(DropReason::Oversize);
    assert_eq!(
        format!("{drops:?}"),
        format!("{want:?}"),
        "an oversize frame from the wire"
    );

    // A TCP SYN from the peer's own stack: checksum offload leaves it partial on the veth.
    // It must arrive with a complete checksum, or marked FLAG_NEEDS_CSUM. XDP carries no
    // checksum state, so for the XDP modes the peer computes its checksums itself, as a
    // real wire would deliver them (the packet mode gets the kernel's "partial" mark).
    if expect_mode != "packet" {
        let out = Command::new("ip")
            .args([
                "netns", "exec", &wire.peer, "ethtool", "-K", "qa", "tx", "off",
            ])
            .output()
            .expect("run ethtool");
        assert!(
            out.status.success(),
            "ethtool: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    ip(&["-n", &wire.peer, "addr", "add", "10.9.0.1/24", "dev", "qa"]);
    ip(&[
        "-n",
        &wire.peer,
        "neigh",
        "add",
        "10.9.0.2",
        "lladdr",
        "02:00:00:00:0b:01",
        "dev",
        "qa",
    ]);
    let path = Wire::ns_path(&wire.peer);
    let connect = std::thread::spawn(move || {
        qswitch_sys::netns::enter(&path).unwrap();
        let _ = std::net::TcpStream::connect_timeout(
            &"10.9.0.2:5201".parse().unwrap(),
            Duration::from_millis(1500),
        );
    });
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let mut syn = None;
    let deadline = Instant::now() + Duration::from_secs(3);
    while syn.is_none() && Instant::now() < deadline {
        for q in 0..port.queues() {
            let n = port.rx_burst(q, &mut pkts, 0, &mut drops);
            for p in &mut pkts[..n] {
                let f = p.frame();
                if f.len() >= 54 && f[12..14] == [8, 0] && f[23] == 6 {
                    if p.hdr.flags & FLAG_NEEDS_CSUM != 0 {
                        let (s, o) = (
                            usize::from(p.hdr.csum_start),
                            usize::from(p.hdr.csum_offset),
                        );
                        assert_eq!((s, o), (34, 16), "partial checksum offsets");
                        let len = p.len();
                        checksum::complete_partial(&mut p.frame_buf_mut()[..len], s, o).unwrap();
                    }
                    syn = Some(p.frame().to_vec());
                }
            }
        }
    }
    connect.join().unwrap();
    let syn = syn.expect("the peer's SYN");
    let ph = checksum::pseudo_header_v4(
        Ipv4Addr::new(10, 9, 0, 1),
        Ipv4Addr::new(10, 9, 0, 2),
        IpProtocol::Tcp,
        (syn.len() - 34) as u16,
    );
    assert_eq!(
        checksum::fold(checksum::sum16(&syn[34..], ph)),
        0,
        "the SYN's TCP checksum"
    );

    drop(port);
    wire.assert_clean("qb");
}

#[test]
fn native_mode() {
    if privileged() {
        // veth has native XDP but no zero-copy.
        run_mode(Mode::Native, "n", "native-copy");
    }
}

/// Generic XDP cannot see an 802.1Q tag a veth delivers out of band (audit finding F1):
/// refused, with the reason, leaving nothing attached.
#[test]
fn skb_mode_is_refused_on_a_veth() {
    if !privileged() {
        return;
    }
    let wire = Wire::new("g");
    let e = wire.open("qb", None, Mode::Skb).unwrap_err();
    assert!(
        matches!(e, AfXdpError::ModeRefused { mode: "skb", .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("802.1Q tag") && !msg.contains('\n'), "{msg}");
    wire.assert_clean("qb");
}

#[test]
fn packet_mode() {
    if privileged() {
        run_mode(Mode::Packet, "p", "packet");
    }
}

#[test]
fn auto_picks_native_on_veth_packet_on_a_bridge() {
    if !privileged() {
        return;
    }
    let wire = Wire::new("a");
    let port = wire.open("qb", None, Mode::Auto).unwrap();
    assert_eq!(port.mode_in_use(), "native-copy");
    drop(port);
    wire.assert_clean("qb");
    // A bridge has no native XDP, and generic XDP would miss tags it holds out of band.
    ip(&["-n", &wire.sw, "link", "add", "qd", "type", "bridge"]);
    ip(&["-n", &wire.sw, "link", "set", "qd", "up"]);
    let port = wire.open("qd", None, Mode::Auto).unwrap();
    assert_eq!(port.mode_in_use(), "packet");
    drop(port);
    wire.assert_clean("qd");
    // An MTU beyond what AF_XDP takes without multi-buffer: the packet mode.
    ip(&["-n", &wire.sw, "link", "set", "qd", "mtu", "9000"]);
    let port = wire.open("qd", None, Mode::Auto).unwrap();
    assert_eq!(port.mode_in_use(), "packet");
    assert_eq!(port.max_frame(), 9018);
    drop(port);
    wire.assert_clean("qd");
}

#[test]
fn bad_input_is_one_clear_error_and_leaves_nothing() {
    if !privileged() {
        return;
    }
    let wire = Wire::new("b");
    ip(&["-n", &wire.sw, "link", "add", "qd", "type", "bridge"]);
    ip(&["-n", &wire.sw, "link", "set", "qd", "up"]);

    let e = wire.open("qsnope", None, Mode::Auto).unwrap_err();
    assert!(matches!(e, AfXdpError::NoSuchInterface { .. }), "{e:?}");
    assert_eq!(e.to_string(), "interface qsnope does not exist");

    let e = wire.open("qb", Some(3), Mode::Native).unwrap_err();
    assert!(matches!(e, AfXdpError::TooManyQueues { .. }), "{e:?}");
    assert_eq!(e.to_string(), "interface qb has 2 rx queue(s); 3 requested");
    wire.assert_clean("qb");

    // A bridge refuses native XDP.
    let e = wire.open("qd", None, Mode::Native).unwrap_err();
    assert!(
        matches!(e, AfXdpError::ModeRefused { mode: "native", .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.starts_with("interface qd refused mode native: "),
        "{msg}"
    );
    assert!(!msg.contains('\n'), "{msg}");
    wire.assert_clean("qd");

    // An MTU too large for AF_XDP: native refused, with the reason.
    ip(&["-n", &wire.sw, "link", "set", "qd", "mtu", "9000"]);
    let e = wire.open("qd", None, Mode::Skb).unwrap_err();
    assert!(
        e.to_string().contains("MTU 9000 needs XDP multi-buffer"),
        "{e}"
    );
    wire.assert_clean("qd");

    // A program already attached (here by another port): the second open fails and takes
    // nothing from the first.
    let first = wire.open("qb", Some(1), Mode::Native).unwrap();
    for mode in [Mode::Native, Mode::Auto] {
        let e = wire.open("qb", None, mode).unwrap_err();
        assert!(
            matches!(e, AfXdpError::ProgramPresent { .. }),
            "{mode:?}: {e:?}"
        );
        let link = wire.sw_link("qb");
        assert!(link.contains("promiscuity 1"), "{link}");
        assert!(link.contains("prog/xdp"), "{link}");
    }
    assert_eq!(first.mode_in_use(), "native-copy");
    drop(first);
    wire.assert_clean("qb");
}

/// Sends one frame of `len` bytes each way through `port` and checks both arrive whole, and
/// that one byte more is an oversize drop on tx.
fn jumbo_round_trip(wire: &Wire, port: &AfXdpPort, len: usize) {
    let mut drops = DropTally::default();
    let f = test_frame(OUR_MAC, PEER_MAC, 7000, len);
    wire.peer_send(vec![f.clone()]);
    let got = receive(port, 1, &mut drops);
    assert_eq!(got.get(&7000), Some(&f), "a {len}-byte frame from the wire");
    let cap = wire.peer_capture(1);
    let mut pkts = vec![Pkt::new(), Pkt::new()];
    pkts[0].fill(&test_frame(PEER_MAC, OUR_MAC, 7001, len));
    pkts[1].fill(&test_frame(PEER_MAC, OUR_MAC, 7002, len + 1));
    let done = port.tx_burst(0, &mut pkts, &[0, 1], &mut drops);
    assert_eq!(done.packets, 1);
    let seen = cap.join().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].as_slice(),
        pkts[0].frame(),
        "a {len}-byte frame to the wire"
    );
    let mut want = DropTally::default();
    want.count(DropReason::Oversize);
    assert_eq!(format!("{drops:?}"), format!("{want:?}"));
}

#[test]
fn jumbo_frames_up_to_the_mtu() {
    if !privileged() {
        return;
    }
    let wire = Wire::new("j");
    // MTU 3000: AF_XDP with 4096-byte UMEM frames.
    ip(&["-n", &wire.sw, "link", "set", "qb", "mtu", "3000"]);
    ip(&["-n", &wire.peer, "link", "set", "qa", "mtu", "3000"]);
    let port = wire.open("qb", None, Mode::Native).unwrap();
    assert_eq!(port.mode_in_use(), "native-copy");
    jumbo_round_trip(&wire, &port, 3014);
    drop(port);
    wire.assert_clean("qb");
    // MTU 9000: beyond AF_XDP without multi-buffer; auto falls back to the packet mode.
    ip(&["-n", &wire.sw, "link", "set", "qb", "mtu", "9000"]);
    ip(&["-n", &wire.peer, "link", "set", "qa", "mtu", "9000"]);
    let port = wire.open("qb", None, Mode::Auto).unwrap();
    assert_eq!(port.mode_in_use(), "packet");
    jumbo_round_trip(&wire, &port, 9014);
    drop(port);
    wire.assert_clean("qb");
}

/// The child of [`kill_9_leaves_nothing_behind`]: opens the port in the namespace it is given,
/// says "ready" and waits to be killed. Run without its environment (as every other test
/// is), it has nothing to do and passes.
#[test]
fn crash_child() {
    let Some(ns) = std::env::var_os("QSDX_CRASH_NS") else {
        return;
    };
    qswitch_sys::netns::enter(&PathBuf::from("/run/netns").join(ns)).unwrap();
    let port = AfXdpPort::open("uplink", "qb", None, Mode::Native).unwrap();
    println!("ready {}", port.mode_in_use());
    std::thread::sleep(Duration::from_secs(20));
    drop(port);
}

#[test]
fn kill_9_leaves_nothing_behind() {
    if !privileged() {
        return;
    }
    use std::io::BufRead;
    let wire = Wire::new("k");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child", "--nocapture"])
        .env("QSDX_CRASH_NS", &wire.sw)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed on drop, also if an assertion below fails.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = child.stdout.take().unwrap();
    let mut child = Kill(child);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if line.starts_with("ready") {
                let _ = tx.send(line);
            }
        }
    });
    let ready = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the child opened the port");
    assert_eq!(ready, "ready native-copy");
    let link = wire.sw_link("qb");
    assert!(
        link.contains("prog/xdp") && link.contains("promiscuity 1"),
        "{link}"
    );
    child.0.kill().unwrap(); // SIGKILL
    child.0.wait().unwrap();
    // The kernel releases the link and the promiscuous hold with the process's fds.
    let mut link = String::new();
    let clean = qswitch_test_support::harness::wait_until(Duration::from_secs(3), || {
        link = wire.sw_link("qb");
        !link.contains("xdp") && link.contains("promiscuity 0")
    });
    assert!(clean, "left behind by a killed process: {link}");
    // A restart attaches again.
    let port = wire.open("qb", None, Mode::Native).unwrap();
    assert_eq!(port.mode_in_use(), "native-copy");
    drop(port);
    wire.assert_clean("qb");
}

/// A link that goes down and up again: the socket's error is taken in `rx_arm` (an untaken
/// one makes every epoll return at once, a busy loop), and frames flow again after.
fn down_and_up(mode: Mode, tag: &str) {
    let wire = Wire::new(tag);
    let port = wire.open("qb", None, mode).unwrap();
    let ep = qswitch_sys::epoll::Epoll::new().unwrap();
    for q in 0..port.queues() {
        ep.add(port.rx_fd(q).unwrap(), u64::from(q)).unwrap();
    }
    ip(&["-n", &wire.sw, "link", "set", "qb", "down"]);
    let mut ev = [qswitch_sys::epoll::Event::EMPTY; 4];
    let mut quiet = false;
    for _ in 0..20 {
        if drain_and_arm(&port) && ep.wait(&mut ev, 100).unwrap() == 0 {
            quiet = true;
            break;
        }
    }
    assert!(quiet, "the rx fds stay readable while the link is down");
    assert!(
        (0..port.queues()).all(|q| !port.rx_dead(q)),
        "down is not dead"
    );
    ip(&["-n", &wire.sw, "link", "set", "qb", "up"]);
    // veth needs both ends up; give the link a moment.
    std::thread::sleep(Duration::from_millis(100));
    let frames: Vec<Vec<u8>> = (0..4)
        .map(|i| test_frame(OUR_MAC, PEER_MAC, 3000 + i, 100))
        .collect();
    wire.peer_send(frames);
    let mut drops = DropTally::default();
    assert_eq!(
        receive(&port, 4, &mut drops).len(),
        4,
        "frames after the link came back"
    );
    drop(port);
    wire.assert_clean("qb");
}

#[test]
fn link_down_and_up_packet() {
    if privileged() {
        down_and_up(Mode::Packet, "dp");
    }
}

#[test]
fn link_down_and_up_native() {
    if privileged() {
        down_and_up(Mode::Native, "dn");
    }
}

/// The interface is deleted under the port: its queues report dead (so the worker stops
/// polling their fds), the fds go quiet, and dropping the port afterwards is fine.
fn deleted(mode: Mode, tag: &str) {
    let wire = Wire::new(tag);
    let port = wire.open("qb", None, mode).unwrap();
    let ep = qswitch_sys::epoll::Epoll::new().unwrap();
    for q in 0..port.queues() {
        ep.add(port.rx_fd(q).unwrap(), u64::from(q)).unwrap();
    }
    ip(&["-n", &wire.sw, "link", "del", "qb"]);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut ev = [qswitch_sys::epoll::Event::EMPTY; 4];
    loop {
        drain_and_arm(&port);
        if (0..port.queues()).all(|q| port.rx_dead(q)) && ep.wait(&mut ev, 100).unwrap() == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "queues not reported dead");
    }
    let mut pkts = vec![Pkt::new()];
    pkts[0].fill(&test_frame(PEER_MAC, OUR_MAC, 1, 60));
    let mut drops = DropTally::default();
    assert_eq!(port.tx_burst(0, &mut pkts, &[0], &mut drops).packets, 0);
    assert_eq!(drops.total(), 1, "{drops:?}");
    drop(port);
}

#[test]
fn interface_deleted_packet() {
    if privileged() {
        deleted(Mode::Packet, "xp");
    }
}

#[test]
fn interface_deleted_native() {
    if privileged() {
        deleted(Mode::Native, "xn");
    }
}

/// Attaches to the peer's `qa` egress a tc program that tags every frame with `vid` out of
/// band (`bpf_skb_vlan_push`, as `tc ... action vlan push` does: the tag travels beside the
/// frame, in `skb->vlan_tci`, and a veth hands it over like that). Detached when the link
/// is dropped.
fn peer_tags_out_of_band(wire: &Wire, vid: i32) -> qswitch_sys::bpf::Link {
    use qswitch_sys::bpf::{self, Insn, ProgKind, TcHook, R0, R2, R3};
    let path = Wire::ns_path(&wire.peer);
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
        let idx = qswitch_sys::xdp::ifindex("qa").unwrap();
        bpf::tcx_attach(&prog, idx, TcHook::Egress).expect("attach the tagger")
    })
    .join()
    .unwrap()
}

/// Sends `n` IPv4 UDP broadcasts from the peer's own stack (so through its tc egress).
fn peer_broadcast(wire: &Wire, n: usize) {
    let path = Wire::ns_path(&wire.peer);
    std::thread::spawn(move || {
        qswitch_sys::netns::enter(&path).unwrap();
        let s = std::net::UdpSocket::bind("10.99.0.1:0").unwrap();
        s.set_broadcast(true).unwrap();
        for _ in 0..n {
            s.send_to(b"qswitch-vlan-test", "10.99.0.255:9").unwrap();
        }
    })
    .join()
    .unwrap();
}

/// Audit finding F1: a frame whose 802.1Q tag the wire delivers out of band (a NIC's
/// receive VLAN offload; a veth whose peer pushed the tag in tc) reaches the switch with
/// its tag in every mode, or the mode is refused; never as an untagged frame.
fn out_of_band_tag(mode: Mode, tag: &str) -> Result<(), AfXdpError> {
    let wire = Wire::new(tag);
    ip(&["-n", &wire.peer, "addr", "add", "10.99.0.1/24", "dev", "qa"]);
    let _tagger = peer_tags_out_of_band(&wire, 10);
    let port = wire.open("qb", None, mode)?;
    let mut pkts: Vec<Pkt> = (0..32).map(|_| Pkt::new()).collect();
    let mut drops = DropTally::default();
    let (mut tagged, mut untagged) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(3);
    while tagged < 5 && Instant::now() < deadline {
        peer_broadcast(&wire, 1);
        std::thread::sleep(Duration::from_millis(20));
        for q in 0..port.queues() {
            let n = port.rx_burst(q, &mut pkts, 0, &mut drops);
            for p in &pkts[..n] {
                let f = p.frame();
                if f.len() < 18 || f[6..12] != PEER_MAC {
                    continue;
                }
                match (&f[12..14], &f[14..16], &f[16..18]) {
                    ([0x81, 0x00], [0x00, 0x0a], [0x08, 0x00]) => tagged += 1,
                    ([0x08, 0x00], _, _) => untagged += 1,
                    _ => {}
                }
            }
        }
    }
    assert_eq!(
        untagged, 0,
        "{mode:?}: frames tagged out of band arrived untagged"
    );
    assert!(
        tagged >= 5,
        "{mode:?}: only {tagged} frames arrived tagged (VID 10)"
    );
    drop(port);
    wire.assert_clean("qb");
    Ok(())
}

#[test]
fn out_of_band_tags_arrive_tagged_in_every_mode() {
    if !privileged() {
        return;
    }
    out_of_band_tag(Mode::Native, "vn").expect("native mode on a veth");
    out_of_band_tag(Mode::Packet, "vp").expect("packet mode");
    out_of_band_tag(Mode::Auto, "va").expect("auto mode");
    // Generic XDP runs before anything puts the tag back: refused on a veth, by name.
    let e = out_of_band_tag(Mode::Skb, "vs").unwrap_err();
    assert!(
        e.to_string().contains("out of band"),
        "skb mode on a veth: {e}"
    );
}
