//! AF_XDP on a real veth pair between two namespaces this test creates: the redirect program
//! steers the peer's frames into the socket (native and generic XDP), frames sent on the
//! socket reach the peer, and dropping the link gives the interface back to the kernel.

use std::process::Command;
use std::time::{Duration, Instant};

use qswitch_sys::xdp::{self, AttachMode, BindMode, Program, Socket, XskMap};

const OUR_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x77];

fn require_root() -> bool {
    if qswitch_sys::thread::is_root() {
        return true;
    }
    assert!(
        std::env::var_os("QSWITCH_REQUIRE_PRIVILEGED").is_none(),
        "needs root (QSWITCH_REQUIRE_PRIVILEGED is set: a skip is a failure)"
    );
    eprintln!("skipped: needs root");
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

/// Two namespaces joined by a veth: `peer` (10.77.0.1/24 on `a`) and `sw` (`b`, no address).
struct Wire {
    peer: String,
    sw: String,
}

impl Wire {
    fn new(tag: &str) -> Wire {
        let id = std::process::id();
        let w = Wire {
            peer: format!("qsx-p{tag}{id}"),
            sw: format!("qsx-s{tag}{id}"),
        };
        ip(&["netns", "add", &w.peer]);
        ip(&["netns", "add", &w.sw]);
        // One queue each way: veth delivers on the rx queue matching the sender's tx queue,
        // and the socket listens on queue 0 only.
        ip(&[
            "link",
            "add",
            "qsxa",
            "netns",
            &w.peer,
            "numtxqueues",
            "1",
            "numrxqueues",
            "1",
            "type",
            "veth",
            "peer",
            "name",
            "qsxb",
            "netns",
            &w.sw,
            "numtxqueues",
            "1",
            "numrxqueues",
            "1",
        ]);
        ip(&["-n", &w.peer, "addr", "add", "10.77.0.1/24", "dev", "qsxa"]);
        ip(&["-n", &w.peer, "link", "set", "qsxa", "up"]);
        ip(&["-n", &w.sw, "link", "set", "qsxb", "up"]);
        w
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        for ns in [&self.peer, &self.sw] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// An ARP reply to `req` (an ARP request frame) claiming its target IP for [`OUR_MAC`].
fn arp_reply(req: &[u8]) -> Vec<u8> {
    let mut r = vec![0u8; 60];
    r[0..6].copy_from_slice(&req[6..12]);
    r[6..12].copy_from_slice(&OUR_MAC);
    r[12..14].copy_from_slice(&[0x08, 0x06]);
    r[14..22].copy_from_slice(&[0, 1, 8, 0, 6, 4, 0, 2]);
    r[22..28].copy_from_slice(&OUR_MAC);
    r[28..32].copy_from_slice(&req[38..42]); // sender IP = the asked-for IP
    r[32..38].copy_from_slice(&req[22..28]);
    r[38..42].copy_from_slice(&req[28..32]);
    r
}

fn run(mode: AttachMode, tag: &str) {
    let wire = Wire::new(tag);
    let sw = wire.sw.clone();
    // Keep the peer asking for 10.77.0.2 while the socket listens.
    let mut ping = Command::new("ip")
        .args([
            "netns", "exec", &wire.peer, "ping", "-c", "8", "-i", "0.5", "-W", "1",
        ])
        .arg("10.77.0.2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ping");
    let got = std::thread::spawn(move || {
        qswitch_sys::netns::enter(std::path::Path::new(&format!("/run/netns/{sw}"))).unwrap();
        let idx = xdp::ifindex("qsxb").unwrap();
        let map = XskMap::new(1).unwrap();
        let prog = Program::redirect(&map).unwrap();
        let link = xdp::attach(&prog, idx, mode).unwrap();
        let mut sock = Socket::new(idx, 0, 64, BindMode::Copy).unwrap();
        map.set(0, &sock).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut request = None;
        while request.is_none() && Instant::now() < deadline {
            sock.recv(16, |f| {
                if f.len() >= 42 && f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1] {
                    request = Some(f.to_vec());
                }
            });
            std::thread::sleep(Duration::from_millis(5));
        }
        let request = request.unwrap_or_else(|| {
            panic!(
                "no ARP request from the peer through AF_XDP; socket {:?}; link {}",
                sock.stats(),
                ip(&["-d", "-s", "link", "show", "qsxb"])
            )
        });
        let reply = arp_reply(&request);
        assert_eq!(sock.send([reply.as_slice()]), 1);
        std::thread::sleep(Duration::from_millis(200));
        let stats = sock.stats().unwrap();
        drop(sock);
        drop(link);
        let attached = ip(&["-d", "link", "show", "qsxb"]);
        (stats, attached)
    })
    .join()
    .unwrap();
    let _ = ping.kill();
    let _ = ping.wait();
    let neigh = ip(&["-n", &wire.peer, "neigh", "show", "10.77.0.2"]);
    assert!(
        neigh.contains("02:00:00:00:00:77"),
        "the peer learned our MAC from the reply sent through AF_XDP: {neigh:?}"
    );
    assert_eq!(got.0.rx_invalid_descs + got.0.tx_invalid_descs, 0);
    assert!(
        !got.1.contains("prog/xdp"),
        "dropping the link detaches the program: {}",
        got.1
    );
}

#[test]
fn native_xdp_on_veth() {
    if require_root() {
        run(AttachMode::Native, "n");
    }
}

#[test]
fn generic_xdp_on_veth() {
    if require_root() {
        run(AttachMode::Generic, "g");
    }
}
