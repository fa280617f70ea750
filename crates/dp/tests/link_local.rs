//! Link-local frames (01:80:C2:00:00:00–0F) end to end, on real ports (root): two TAP ports
//! moved into namespaces this test creates, and a vhost-user port whose guest is played in
//! this process by `qswitch-virtio-driver`.
//!
//! - Each of the 16 groups (BPDU, PAUSE, LACP, EAPOL, LLDP among them) sent from a TAP port,
//!   then from the guest, reaches no other port, and the sender's counters say why.
//! - A group named by the sender's `link_local_forward` is relayed to both other ports.
//! - A BPDU from a port with `bpdu_guard` disables it (`port list` says so, nothing reaches
//!   it) and `enable_port` restores it.
//!
//! The rules themselves are tested on the manual engine (`policy.rs`); a frame behind the
//! test frames on the same queue (a broadcast "end" marker) shows when the switch has taken
//! them all, so no test waits a fixed time.

use std::path::Path;
use std::time::{Duration, Instant};

use qswitch_api::policy::PolicyUpdate;
use qswitch_api::{PortConfig, VhostMode};
use qswitch_dp::{Options, Switch};
use qswitch_test_support::{root_or_skip, wait_until, Netns, TempDir};
use qswitch_virtio_driver::{Driver, DriverOptions, NetHdr};

const WAIT: Duration = Duration::from_secs(10);
/// The source MACs of what the TAP port `a` and the guest `v` send.
const A_SRC: [u8; 6] = [2, 0, 0, 0, 0xaa, 1];
const V_SRC: [u8; 6] = [2, 0, 0, 0, 0xaa, 2];
const END_TYPE: u16 = 0x88b5;

/// Sends the frames given in hex on a raw socket on `ifname`.
const SEND: &str = r#"
import binascii, socket, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((sys.argv[1], 0))
for h in sys.argv[2:]:
    s.send(binascii.unhexlify(h))
"#;

/// Prints "ready", then "ll N" for each frame from `src` to link-local group N, and "end"
/// at the broadcast end marker from `src` (then exits; 10 s at most).
const SNIFF: &str = r#"
import binascii, socket, sys, time
dev, src = sys.argv[1], binascii.unhexlify(sys.argv[2])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((dev, 0))
s.settimeout(0.1)
print("ready", flush=True)
deadline = time.time() + 10
while time.time() < deadline:
    try:
        data, addr = s.recvfrom(70000)
    except socket.timeout:
        continue
    if addr[2] == socket.PACKET_OUTGOING or data[6:12] != src:
        continue
    if data[0:5] == b"\x01\x80\xc2\x00\x00" and data[5] < 16:
        print("ll %d" % data[5], flush=True)
    elif data[0:6] == b"\xff" * 6 and data[12:14] == b"\x88\xb5":
        print("end", flush=True)
        break
"#;

/// A frame to group 01:80:C2:00:00:0`g` from `src`, with that group's EtherType.
fn link_local(g: u8, src: [u8; 6]) -> Vec<u8> {
    let ether_type: u16 = match g {
        0x1 => 0x8808,
        0x2 => 0x8809,
        0x3 => 0x888e,
        0xe => 0x88cc,
        // A BPDU is 802.3 with LLC: a length.
        _ => 39,
    };
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&[0x01, 0x80, 0xc2, 0, 0, g]);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&ether_type.to_be_bytes());
    f
}

/// The broadcast that follows the test frames of a round.
fn end(src: [u8; 6]) -> Vec<u8> {
    let mut f = vec![0u8; 60];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&END_TYPE.to_be_bytes());
    f[14..17].copy_from_slice(b"END");
    f
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

struct Lab {
    sw: Switch,
    dir: TempDir,
    a: Netns,
    b: Netns,
    ifa: String,
    ifb: String,
    v: Driver,
}

impl Lab {
    fn new() -> Lab {
        let dir = TempDir::new("link-local");
        let pid = std::process::id();
        let (ifa, ifb) = (format!("qll{pid}a"), format!("qll{pid}b"));
        let a = Netns::new(&format!("qsll{pid}-a"));
        let b = Netns::new(&format!("qsll{pid}-b"));
        let cpus = qswitch_sys::thread::online_cpus().unwrap();
        let sw = Switch::start(&cpus[..1], &Options::default()).unwrap();
        sw.add_port(&PortConfig::tap("a", ifa.parse().unwrap()))
            .unwrap();
        sw.add_port(&PortConfig::tap("b", ifb.parse().unwrap()))
            .unwrap();
        a.adopt(&ifa, "10.201.0.1/24", false);
        b.adopt(&ifb, "10.201.0.2/24", false);
        let sock = dir.join("v.sock");
        let cfg =
            PortConfig::vhost_user("v", sock.as_path().try_into().unwrap(), VhostMode::Server);
        sw.add_port(&cfg).unwrap();
        let opts = DriverOptions {
            mem_size: 8 << 20,
            ..DriverOptions::default()
        };
        let v = Driver::connect(&sock, opts).unwrap();
        assert!(
            wait_until(WAIT, || port(&sw, "v").connected == Some(true)),
            "the guest did not connect"
        );
        Lab {
            sw,
            dir,
            a,
            b,
            ifa,
            ifb,
            v,
        }
    }

    /// Sends `frames` and then the end marker from the TAP port `a` (from inside its
    /// namespace) or from the guest; returns the link-local groups from `src` that reached
    /// `b` and the guest, once both have seen the marker.
    fn round(&mut self, from_guest: bool, groups: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let src = if from_guest { V_SRC } else { A_SRC };
        let mut frames: Vec<Vec<u8>> = groups.iter().map(|&g| link_local(g, src)).collect();
        frames.push(end(src));
        let log = self.dir.join("sniff.log");
        let mut sniffer = self
            .b
            .spawn(&["python3", "-c", SNIFF, &self.ifb, &hex(&src)], &log);
        let read = |log: &Path| std::fs::read_to_string(log).unwrap_or_default();
        assert!(
            wait_until(WAIT, || read(&log).contains("ready")),
            "sniffer: {}",
            read(&log)
        );
        if from_guest {
            self.guest_sends(&frames);
        } else {
            let args: Vec<String> = frames.iter().map(|f| hex(f)).collect();
            let mut cmd = vec!["python3", "-c", SEND, &self.ifa];
            cmd.extend(args.iter().map(String::as_str));
            self.a.run_for(&cmd, WAIT).assert_ok("send from a");
        }
        assert!(
            sniffer
                .wait_timeout(WAIT + Duration::from_secs(5))
                .is_some(),
            "sniffer did not finish"
        );
        let text = read(&log);
        assert!(
            text.contains("end"),
            "b never saw the end marker: {text}\n{:?}",
            self.sw.stats().ports
        );
        let at_b = text
            .lines()
            .filter_map(|l| l.strip_prefix("ll "))
            .map(|g| g.parse().unwrap())
            .collect();
        let at_v = if from_guest {
            Vec::new()
        } else {
            self.guest_receives(src)
        };
        (at_b, at_v)
    }

    fn guest_sends(&mut self, frames: &[Vec<u8>]) {
        let hdr = plain_hdr(&self.v);
        for f in frames {
            let deadline = Instant::now() + WAIT;
            while !self.v.send(0, &hdr, f).unwrap() {
                assert!(Instant::now() < deadline, "the guest's tx ring stays full");
                std::thread::yield_now();
            }
        }
    }

    /// The link-local groups from `src` the guest receives up to `src`'s end marker.
    fn guest_receives(&mut self, src: [u8; 6]) -> Vec<u8> {
        let hl = self.v.hdr_len();
        let mut buf = Vec::new();
        let mut groups = Vec::new();
        let mut ended = false;
        let got = wait_until(WAIT, || {
            while !ended && self.v.recv(0, &mut buf).unwrap().is_some() {
                let f = &buf[hl..];
                if f.len() < 14 || f[6..12] != src {
                    continue;
                }
                if f[..5] == [0x01, 0x80, 0xc2, 0, 0] && f[5] < 16 {
                    groups.push(f[5]);
                } else if f[..6] == [0xff; 6] && f[12..14] == END_TYPE.to_be_bytes() {
                    ended = true;
                }
            }
            ended
        });
        assert!(got, "the guest never got the end marker");
        groups
    }

    fn drops(&self, port: &str, reason: &str) -> u64 {
        let st = self.sw.stats();
        let p = st.ports.iter().find(|p| p.name == port).unwrap();
        p.drops.get(reason).copied().unwrap_or(0)
    }

    fn update(&self, port: &str, u: PolicyUpdate) {
        self.sw.update_port_policy(port, &u).unwrap();
    }
}

fn port(sw: &Switch, name: &str) -> qswitch_api::request::PortInfo {
    sw.ports().into_iter().find(|p| p.name == name).unwrap()
}

fn plain_hdr(d: &Driver) -> Vec<u8> {
    NetHdr::default().to_bytes()[..d.hdr_len()].to_vec()
}

#[test]
fn link_local_frames_from_tap_and_guest_reach_no_other_port() {
    if !root_or_skip() {
        return;
    }
    let mut lab = Lab::new();
    let all: Vec<u8> = (0..16).collect();
    let expect = [
        ("bpdu", 1),
        ("pause", 1),
        ("slow_protocols", 1),
        ("eapol", 1),
        ("lldp", 1),
        ("link_local", 11),
    ];

    // From a TAP port, then from the guest: nothing relayed, every frame counted.
    let (at_b, at_v) = lab.round(false, &all);
    assert!(at_b.is_empty() && at_v.is_empty(), "{at_b:?} {at_v:?}");
    let (at_b, _) = lab.round(true, &all);
    assert!(at_b.is_empty(), "{at_b:?}");
    for port in ["a", "v"] {
        for (reason, n) in expect {
            assert_eq!(lab.drops(port, reason), n, "{port}: {reason}");
        }
    }

    // Groups a's link_local_forward names are relayed from a, the others still not.
    lab.update(
        "a",
        PolicyUpdate {
            link_local_forward: Some("stp,lldp".parse().unwrap()),
            ..Default::default()
        },
    );
    let (at_b, at_v) = lab.round(false, &[0x0, 0x1, 0x2, 0x3, 0xe]);
    assert_eq!((at_b, at_v), (vec![0x0, 0xe], vec![0x0, 0xe]));

    // BPDU guard on the guest's port: its BPDU disables the port.
    lab.update(
        "v",
        PolicyUpdate {
            bpdu_guard: Some(true),
            ..Default::default()
        },
    );
    lab.guest_sends(&[link_local(0x0, V_SRC), end(V_SRC)]);
    assert!(
        wait_until(WAIT, || lab.drops("v", "port_disabled") == 1),
        "the frame behind the BPDU was not dropped with the port: {:?}",
        lab.sw.stats().ports
    );
    assert_eq!(lab.drops("v", "bpdu_guard"), 1);
    assert_eq!(port(&lab.sw, "v").disabled.as_deref(), Some("bpdu_guard"));
    // Nothing comes to it either.
    let before = lab.drops("v", "port_disabled");
    let args = [hex(&end(A_SRC))];
    lab.a
        .run_for(&["python3", "-c", SEND, &lab.ifa, &args[0]], WAIT)
        .assert_ok("send from a");
    assert!(
        wait_until(WAIT, || lab.drops("v", "port_disabled") > before),
        "a's broadcast was not refused at the disabled port"
    );
    let mut buf = Vec::new();
    assert!(
        lab.v.recv(0, &mut buf).unwrap().is_none(),
        "a disabled port received a frame"
    );

    // Enabled again: the guest gets a's frames.
    assert!(lab.sw.enable_port("v").unwrap());
    assert_eq!(port(&lab.sw, "v").disabled, None);
    let (_, at_v) = lab.round(false, &[0x0]);
    assert_eq!(
        at_v,
        vec![0x0],
        "relayed (a forwards stp) to the enabled guest"
    );
    lab.sw.shutdown();
}
