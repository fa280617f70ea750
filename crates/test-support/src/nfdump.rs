//! IPFIX collected by the operators' own tools (package nfdump): `nfcapd` on a loopback
//! port writing into a directory, read back with `nfdump`. The collector is a
//! [`ChildGuard`]: stopped by PID on drop, also when a test fails.

use std::net::UdpSocket;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::{signal, wait_until, ChildGuard};
use crate::skip::{have_tool, require};

/// One flow as `nfdump` prints it: (src, dst, sport, dport, proto, packets, bytes).
pub type Flow = (String, String, u16, u16, String, u64, u64);

/// Whether `nfcapd` and `nfdump` are installed (else skip, or fail under CI).
pub fn nfdump_or_skip() -> bool {
    require(
        have_tool("nfcapd", &["-V"]) && have_tool("nfdump", &["-V"]),
        "nfdump not installed (apt-get install nfdump)",
    )
}

/// nfcapd on 127.0.0.1:`port` writing into `dir`, scaling what it reads by `sampling` (its
/// `-s`: nfdump 1.7.1, Debian 12's, does not apply the sampling interval of our options
/// record, so the collector is told, as docs/visibility.md advises). Returns once it is
/// bound (when our own bind of the port fails).
pub fn nfcapd(dir: &Path, port: u16, sampling: u32) -> ChildGuard {
    std::fs::create_dir_all(dir).unwrap();
    let child = Command::new("nfcapd")
        .args(["-b", "127.0.0.1", "-p", &port.to_string()])
        .args(["-s", &sampling.to_string(), "-w"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nfcapd");
    let guard = ChildGuard::new(child);
    assert!(
        wait_until(Duration::from_secs(10), || UdpSocket::bind((
            "127.0.0.1",
            port
        ))
        .is_err()),
        "nfcapd did not bind 127.0.0.1:{port}"
    );
    guard
}

/// Waits until nfcapd has read everything sent to it, stops it (SIGTERM: it writes its
/// file out) and returns what `nfdump` reads from `dir`, one [`Flow`] per line.
pub fn collected(mut nfcapd: ChildGuard, port: u16, dir: &Path) -> Vec<Flow> {
    assert!(
        wait_until(Duration::from_secs(10), || rx_queue(port) == Some(0)),
        "nfcapd did not read what was sent"
    );
    signal(nfcapd.pid(), "TERM");
    assert!(
        nfcapd.wait_timeout(Duration::from_secs(10)).is_some(),
        "nfcapd did not stop"
    );
    let out = Command::new("nfdump")
        .arg("-R")
        .arg(dir)
        .args(["-q", "-N", "-o", "fmt:%sa|%da|%sp|%dp|%pr|%pkt|%byt"])
        .output()
        .expect("nfdump");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "nfdump: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .filter(|l| l.contains('|'))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            (
                c[0].to_string(),
                c[1].to_string(),
                c[2].parse().unwrap_or(0),
                c[3].parse().unwrap_or(0),
                c[4].to_string(),
                c[5].parse().unwrap_or_else(|_| panic!("packets in {l}")),
                c[6].parse().unwrap_or_else(|_| panic!("bytes in {l}")),
            )
        })
        .collect()
}

/// Bytes waiting in the receive queue of the UDP socket bound to 127.0.0.1:`port`.
pub fn rx_queue(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|l| {
        let c: Vec<&str> = l.split_whitespace().collect();
        (c.get(1) == Some(&local.as_str()))
            .then(|| u64::from_str_radix(c.get(4)?.split(':').nth(1)?, 16).ok())
            .flatten()
    })
}
