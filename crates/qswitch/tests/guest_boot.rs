//! The QEMU test guests themselves, without qswitch (root only): the assets build, the boot,
//! the control channel, the tools in the initramfs, traffic between two guests wired back to
//! back by QEMU datagram sockets, and QEMU's side of the vhost-user command line up to its
//! first protocol message. Guests use the same shared memfd memory setup as vhost-user
//! guests.

use qswitch_test_support::guest as common_guest;

use std::io::{ErrorKind, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common_guest::{Guest, GuestConfig, Netdev, SocketMode};
use qswitch_test_support::root_or_skip;

const T: Duration = Duration::from_secs(20);

/// A temp dir of this test, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("qswitch-gb-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn one_guest_control_channel_and_tools() {
    if !root_or_skip() || common_guest::assets().is_none() {
        return;
    }
    let mut g = Guest::boot(GuestConfig {
        name: "qsgb1".into(),
        ip_cidr: "10.0.0.1/24".into(),
        netdev: Netdev::User,
        cmdline: vec!["qs.role=solo".into()],
        ..GuestConfig::default()
    })
    .expect("boot");
    eprintln!(
        "guest {} booted in {:.1?} ({:?})",
        g.name(),
        g.boot_time().unwrap(),
        g.accel()
    );

    let out = g.run_ok("ip addr show dev eth0", T).unwrap();
    assert!(out.contains("inet 10.0.0.1/24"), "{out}");
    assert!(out.contains("state UP") || out.contains(",UP"), "{out}");
    let out = g.run_ok("ethtool -l eth0", T).unwrap();
    assert!(out.contains("Combined"), "{out}");
    let out = g.run_ok("ethtool -i eth0", T).unwrap();
    assert!(out.contains("driver: virtio_net"), "{out}");
    let out = g.run_ok("iperf3 --version", T).unwrap();
    assert!(out.starts_with("iperf 3"), "{out}");
    assert_eq!(g.run_ok("hostname", T).unwrap(), "qsgb1\n");

    // Exit codes, stderr, quoting, several lines, kernel command line variables.
    assert_eq!(g.run("exit 3", T).unwrap(), (3, String::new()));
    assert_eq!(
        g.run("echo oops >&2; false", T).unwrap(),
        (1, "oops\n".into())
    );
    let (rc, out) = g
        .run(
            "printf '%s|' \"a'b\" 'c\"d' '$HOME' '\\\\n'\necho\necho \"$QS_ROLE\"",
            T,
        )
        .unwrap();
    assert_eq!((rc, out.as_str()), (0, "a'b|c\"d|$HOME|\\\\n|\nsolo\n"));
    let (rc, out) = g.run("seq 1 20000", T).unwrap();
    assert_eq!(rc, 0);
    assert_eq!(out.lines().count(), 20000);
    assert_eq!(out.lines().last(), Some("20000"));
    // Stdin is /dev/null: a command reading it does not eat the channel.
    assert_eq!(g.run("cat; echo end", T).unwrap(), (0, "end\n".into()));

    // A command over its timeout fails and is killed; the channel stays in step.
    let t0 = Instant::now();
    let err = g
        .run("echo begun; sleep 60", Duration::from_secs(2))
        .unwrap_err();
    assert!(format!("{err:#}").contains("timed out"), "{err:#}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(g.run("echo after", T).unwrap(), (0, "after\n".into()));
    let out = g.run_ok("ps", T).unwrap();
    assert!(!out.contains("sleep 60"), "{out}");

    g.kill();
    assert!(!g.is_running());
    assert!(g.run("true", T).is_err());
}

#[test]
fn two_guests_ping_and_iperf3() {
    if !root_or_skip() || common_guest::assets().is_none() {
        return;
    }
    let dir = Dir::new("pair");
    let (na, nb) = Netdev::dgram_pair(&dir.0);
    let cfg = |name: &str, ip: &str, netdev| GuestConfig {
        name: name.into(),
        ip_cidr: ip.into(),
        netdev,
        ..GuestConfig::default()
    };
    let t0 = Instant::now();
    // Both boot at once.
    let mut a = Guest::start(cfg("qsgba", "10.0.0.1/24", na)).expect("start a");
    let mut b = Guest::start(cfg("qsgbb", "10.0.0.2/24", nb)).expect("start b");
    let ta = a.wait_ready(Duration::from_secs(90)).expect("a ready");
    let tb = b.wait_ready(Duration::from_secs(90)).expect("b ready");
    eprintln!(
        "two guests booted in {:.1?} (a {ta:.1?}, b {tb:.1?})",
        t0.elapsed()
    );

    let out = a.run_ok("ping -c 3 -W 5 10.0.0.2", T).unwrap();
    assert!(out.contains("3 packets received"), "{out}");
    let out = b.run_ok("ping -c 1 -W 5 10.0.0.1", T).unwrap();
    assert!(out.contains("1 packets received"), "{out}");

    b.run_ok("iperf3 -s -1 -D", T).unwrap();
    let out = a
        .run_ok(
            "for i in 1 2 3 4 5; do iperf3 -c 10.0.0.2 -t 3 -f m && exit 0; sleep 1; done; exit 1",
            Duration::from_secs(60),
        )
        .unwrap();
    eprintln!("{out}");
    let receiver = out
        .lines()
        .find(|l| l.trim_end().ends_with("receiver"))
        .unwrap_or_else(|| panic!("no receiver line: {out}"));
    let mbits: f64 = receiver
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|w| w[1] == "Mbits/sec")
        .and_then(|w| w[0].parse().ok())
        .unwrap_or_else(|| panic!("no rate in {receiver}"));
    eprintln!("iperf3 a -> b: {mbits} Mbit/s");
    assert!(mbits > 1.0, "{receiver}");
    let out = b.run_ok("ethtool -S eth0", T).unwrap();
    eprintln!("{out}");
}

/// QEMU accepts the vhost-user command line the harness builds (shared memfd memory, either
/// socket mode, two queue pairs) and opens the protocol with VHOST_USER_GET_FEATURES. No
/// backend answers, so the guest itself does not boot here.
#[test]
fn vhost_user_frontend_opens_the_protocol() {
    if !root_or_skip() || common_guest::assets().is_none() {
        return;
    }
    for (i, mode) in [SocketMode::Server, SocketMode::Client]
        .into_iter()
        .enumerate()
    {
        let dir = Dir::new(&format!("vu{i}"));
        let sock = dir.0.join("vu.sock");
        let listener = (mode == SocketMode::Client).then(|| {
            let l = UnixListener::bind(&sock).expect("bind");
            l.set_nonblocking(true).unwrap();
            l
        });
        let g = Guest::start(GuestConfig {
            name: format!("qsgbvu{i}"),
            vhost_socket: sock.clone(),
            socket_mode: mode,
            queues: 2,
            ip_cidr: "10.0.0.1/24".into(),
            ..GuestConfig::default()
        })
        .expect("start");
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut s = loop {
            let r = match &listener {
                None => UnixStream::connect(&sock),
                Some(l) => l.accept().map(|(s, _)| s),
            };
            match r {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    assert!(
                        matches!(
                            e.kind(),
                            ErrorKind::WouldBlock
                                | ErrorKind::NotFound
                                | ErrorKind::ConnectionRefused
                        ),
                        "{mode:?}: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{mode:?}: no vhost-user connection: {e}\n{}", g.logs()),
            }
        };
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hdr = [0u8; 12];
        s.read_exact(&mut hdr)
            .unwrap_or_else(|e| panic!("{mode:?}: read: {e}\n{}", g.logs()));
        let word = |i: usize| u32::from_le_bytes(hdr[i..i + 4].try_into().unwrap());
        assert_eq!(word(0), 1, "{mode:?}: request is not GET_FEATURES: {hdr:?}");
        assert_eq!(word(4) & 3, 1, "{mode:?}: flags: {hdr:?}");
        assert_eq!(word(8), 0, "{mode:?}: size: {hdr:?}");
        eprintln!("{mode:?}: QEMU sent VHOST_USER_GET_FEATURES");
        drop(g);
        if mode == SocketMode::Server {
            assert!(!sock.exists(), "QEMU's server socket left behind");
        }
    }
}
