//! Live migration support of vhost-user ports, with no privileges: `qswitch-virtio-driver`
//! (and the vhost crate's `Frontend`) play QEMU.
//!
//! - The dirty log: with LOG_ALL and a log base set, every page the switch writes (frames in
//!   receive buffers, used elements, the used index) is marked, and nothing else is (pages of
//!   the used rings aside, whose flags and event index the switch also writes).
//! - GET_VRING_BASE returns the next avail index and stops the ring: no write after it.
//! - SEND_RARP: the MAC moves to the port at once in the forwarding table.
//! - Bad input: a log too small for guest memory, SET_LOG_BASE without an fd, a log before
//!   any memory table, memory slots beyond the limit: refused, no crash, other ports fine.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qswitch_api::request::{PortInfo, PortStats};
use qswitch_api::{PortConfig, VhostMode};
use qswitch_dp::{Options, Switch};
use qswitch_virtio_driver::vhost::vhost_user::message::VhostUserProtocolFeatures;
use qswitch_virtio_driver::vhost::vhost_user::{Frontend, VhostUserFrontend};
use qswitch_virtio_driver::vhost::{
    VhostBackend, VhostUserDirtyLogRegion, VhostUserMemoryRegionInfo,
};
use qswitch_virtio_driver::vm_memory::{Bytes, GuestAddress};
use qswitch_virtio_driver::{Driver, DriverOptions, NetHdr};

const WAIT: Duration = Duration::from_secs(10);
const BCAST: [u8; 6] = [0xff; 6];
const PAGE: u64 = 4096;
const LOG_ALL: u64 = 1 << 26;
const LOG_SHMFD: u64 = 0x2;
const RARP: u64 = 0x4;
const MQ: u64 = 0x1;
const REPLY_ACK: u64 = 0x8;
const CONFIGURE_MEM_SLOTS: u64 = 0x8000;

fn mac(last: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0, last]
}

struct TestDir(PathBuf);

impl TestDir {
    fn new(test: &str) -> TestDir {
        let dir = std::env::temp_dir().join(format!("qswitch-mig-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TestDir(dir)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn switch() -> Switch {
    let cpus = qswitch_sys::thread::online_cpus().unwrap();
    Switch::start(&cpus[..1], &Options::default()).unwrap()
}

fn add_server(sw: &Switch, dir: &TestDir, name: &str) -> PathBuf {
    let sock = dir.0.join(format!("{name}.sock"));
    let p = PortConfig::vhost_user(name, sock.as_path().try_into().unwrap(), VhostMode::Server);
    sw.add_port(&p).unwrap();
    sock
}

fn opts() -> DriverOptions {
    DriverOptions {
        mem_size: 4 << 20,
        protocol_features: MQ | REPLY_ACK | LOG_SHMFD | RARP | CONFIGURE_MEM_SLOTS,
        ..DriverOptions::default()
    }
}

fn connect(sock: &Path) -> Driver {
    Driver::connect(sock, opts()).unwrap_or_else(|e| panic!("connect: {e}"))
}

#[track_caller]
fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    qswitch_test_support::harness::wait_for(what, WAIT, cond)
}

fn port_info(sw: &Switch, name: &str) -> PortInfo {
    sw.ports().into_iter().find(|p| p.name == name).unwrap()
}

fn port_stats(sw: &Switch, name: &str) -> PortStats {
    sw.stats()
        .ports
        .into_iter()
        .find(|p| p.name == name)
        .unwrap()
}

fn frame(dst: [u8; 6], src: [u8; 6], seq: u8, len: usize) -> Vec<u8> {
    let mut f = vec![seq; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f
}

fn send(d: &mut Driver, f: &[u8]) {
    let hdr = NetHdr::default().to_bytes()[..d.hdr_len()].to_vec();
    let deadline = Instant::now() + WAIT;
    while !d.send(0, &hdr, f).unwrap() {
        assert!(Instant::now() < deadline, "tx ring full");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Whether a frame from `src` arrives within `t`.
fn got_from(d: &mut Driver, src: [u8; 6], t: Duration) -> bool {
    let hl = d.hdr_len();
    let deadline = Instant::now() + t;
    let mut buf = Vec::new();
    while Instant::now() < deadline {
        while d.recv(0, &mut buf).unwrap().is_some() {
            if buf.len() >= hl + 12 && buf[hl + 6..hl + 12] == src {
                return true;
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

/// A log file (a sealable memfd, as QEMU's) of `len` bytes.
fn log_file(len: u64) -> std::fs::File {
    let f = qswitch_sys::guestmap::memfd("qswitch-test-log", true).unwrap();
    f.set_len(len).unwrap();
    f
}

fn read_log(f: &std::fs::File, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    std::os::unix::fs::FileExt::read_exact_at(f, &mut b, 0).unwrap();
    b
}

fn snapshot(d: &Driver) -> Vec<u8> {
    let mut b = vec![0u8; d.mem_size() as usize];
    d.mem().read_slice(&mut b, GuestAddress(0)).unwrap();
    b
}

fn fdb_port(sw: &Switch, m: [u8; 6]) -> Option<String> {
    let s = m.map(|b| format!("{b:02x}")).join(":");
    sw.fdb().into_iter().find(|e| e.mac == s).map(|e| e.port)
}

/// Turns logging on for `d`: LOG_ALL, then a log covering its memory.
fn start_logging(d: &mut Driver) -> (std::fs::File, usize) {
    let len = (d.mem_size().div_ceil(PAGE)).div_ceil(8) as usize;
    let f = log_file(len as u64);
    let feats = d.features() | LOG_ALL;
    d.frontend().set_features(feats).unwrap();
    d.frontend()
        .set_log_base(
            0,
            Some(VhostUserDirtyLogRegion {
                mmap_size: len as u64,
                mmap_offset: 0,
                mmap_handle: f.as_raw_fd(),
            }),
        )
        .unwrap();
    (f, len)
}

#[test]
fn dirty_log_marks_exactly_the_pages_written() {
    log_marks_exactly("log_exact", false);
}

/// The same with long unicast frames (those a one-copy path, issue 30 item 3, would copy
/// from p2's transmit buffers straight into p1's receive buffers: they must be marked all
/// the same).
#[test]
fn dirty_log_marks_exactly_the_pages_long_unicast_frames_write() {
    log_marks_exactly("log_one_copy", true);
}

fn log_marks_exactly(name: &str, unicast: bool) {
    let dir = TestDir::new(name);
    let sw = switch();
    let s1 = add_server(&sw, &dir, "p1");
    let s2 = add_server(&sw, &dir, "p2");
    let mut d1 = connect(&s1);
    let mut d2 = connect(&s2);
    assert_eq!(port_info(&sw, "p1").dirty_log, Some(false));
    assert!(d1.offered_features() & LOG_ALL != 0, "LOG_ALL offered");
    assert!(d1.protocol_features() & LOG_SHMFD != 0, "LOG_SHMFD offered");
    let (log, len) = start_logging(&mut d1);
    wait_until("logging on", || {
        port_info(&sw, "p1").dirty_log == Some(true)
    });
    assert_eq!(port_info(&sw, "p2").dirty_log, Some(false));
    if unicast {
        // p1's MAC learned, so p2's frames to it are unicast.
        send(&mut d1, &frame(BCAST, mac(1), 0, 60));
        assert!(got_from(&mut d2, mac(1), WAIT));
    }
    // Let the workers settle (they may arm the rings, writing the used rings' event index).
    std::thread::sleep(Duration::from_millis(100));
    let before = snapshot(&d1);
    let log_before = read_log(&log, len);
    const N: u8 = 20;
    let (dst, min) = if unicast { (mac(1), 300) } else { (BCAST, 60) };
    for i in 0..N {
        send(&mut d2, &frame(dst, mac(2), i, min + 90 * usize::from(i)));
    }
    wait_until("frames delivered to p1", || {
        port_stats(&sw, "p1").tx_packets >= u64::from(N)
    });
    std::thread::sleep(Duration::from_millis(50));
    let after = snapshot(&d1);
    let bits = read_log(&log, len);
    let marked = |p: usize| bits[p / 8] & (1 << (p % 8)) != 0;
    let pages = before.len().div_ceil(PAGE as usize);
    let changed: Vec<usize> = (0..pages)
        .filter(|&p| {
            let r = p * PAGE as usize..((p + 1) * PAGE as usize).min(before.len());
            before[r.clone()] != after[r]
        })
        .collect();
    assert!(!changed.is_empty(), "the switch wrote into p1's memory");
    for &p in &changed {
        assert!(marked(p), "page {p} written but not marked");
    }
    // The used rings (flags, elements, index, avail_event) may be marked without changing.
    let mut rings = Vec::new();
    for vr in 0..2u16 {
        let raw = d1.raw(vr);
        let used = raw.used_ring();
        let end = used + 6 + 8 * u64::from(raw.size());
        rings.extend((used / PAGE)..=(end / PAGE));
    }
    let extra: Vec<usize> = (0..pages)
        .filter(|&p| marked(p) && !changed.contains(&p) && !rings.contains(&(p as u64)))
        .filter(|&p| log_before[p / 8] & (1 << (p % 8)) == 0)
        .collect();
    assert!(
        extra.is_empty(),
        "pages marked but never written: {extra:?}"
    );
    let logged = port_stats(&sw, "p1").logged_pages.unwrap();
    assert!(logged >= changed.len() as u64, "logged_pages {logged}");
    eprintln!(
        "{} pages changed, {} marked, {logged} page marks counted",
        changed.len(),
        bits.iter().map(|b| b.count_ones()).sum::<u32>()
    );
    // Logging off: LOG_ALL cleared.
    let feats = d1.features() & !LOG_ALL;
    d1.frontend().set_features(feats).unwrap();
    wait_until("logging off", || {
        port_info(&sw, "p1").dirty_log == Some(false)
    });
    assert!(got_from(&mut d1, mac(2), WAIT));
}

#[test]
fn get_vring_base_stops_the_ring_and_returns_the_avail_index() {
    let dir = TestDir::new("vring_base");
    let sw = switch();
    let s1 = add_server(&sw, &dir, "p1");
    let s2 = add_server(&sw, &dir, "p2");
    let mut d1 = connect(&s1);
    let mut d2 = connect(&s2);
    for i in 0..5 {
        send(&mut d1, &frame(BCAST, mac(1), i, 100));
    }
    wait_until("p1 frames switched", || {
        port_stats(&sw, "p1").rx_packets >= 5
    });
    assert_eq!(
        d1.get_vring_base(1).unwrap(),
        5,
        "transmitq: 5 chains consumed"
    );
    // The receive ring: stopped after GET_VRING_BASE, nothing written into it afterwards.
    let base = d1.get_vring_base(0).unwrap();
    let used_at = d1.raw(0).used_ring();
    let mut idx = [0u8; 2];
    d1.mem()
        .read_slice(&mut idx, GuestAddress(used_at + 2))
        .unwrap();
    let used_before = u16::from_le_bytes(idx);
    assert_eq!(
        u32::from(used_before),
        base,
        "every consumed buffer was used"
    );
    for i in 0..10 {
        send(&mut d2, &frame(BCAST, mac(2), i, 100));
    }
    wait_until("p2 frames switched", || {
        port_stats(&sw, "p2").rx_packets >= 10
    });
    std::thread::sleep(Duration::from_millis(50));
    d1.mem()
        .read_slice(&mut idx, GuestAddress(used_at + 2))
        .unwrap();
    assert_eq!(
        u16::from_le_bytes(idx),
        used_before,
        "no write after GET_VRING_BASE"
    );
}

#[test]
fn send_rarp_moves_the_mac_at_once() {
    let dir = TestDir::new("rarp");
    let sw = switch();
    let s1 = add_server(&sw, &dir, "p1");
    let s2 = add_server(&sw, &dir, "p2");
    let s3 = add_server(&sw, &dir, "p3");
    let mut d1 = connect(&s1);
    let mut d2 = connect(&s2);
    let mut d3 = connect(&s3);
    let guest = mac(7);
    send(&mut d1, &frame(BCAST, guest, 1, 100));
    wait_until("guest learned on p1", || {
        fdb_port(&sw, guest).as_deref() == Some("p1")
    });
    // The destination's frontend announces the guest on p2.
    let mut m = Vec::new();
    m.extend_from_slice(&19u32.to_le_bytes());
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&8u32.to_le_bytes());
    m.extend_from_slice(&guest);
    m.extend_from_slice(&[0, 0]);
    d2.send_raw_message(&m).unwrap();
    wait_until("guest moved to p2", || {
        fdb_port(&sw, guest).as_deref() == Some("p2")
    });
    assert!(got_from(&mut d3, guest, WAIT), "the RARP was flooded");
    assert_eq!(port_stats(&sw, "p2").announces, Some(1));
    // The connection is still in step.
    send(&mut d2, &frame(BCAST, mac(2), 2, 100));
    assert!(got_from(&mut d3, mac(2), WAIT));
}

/// A raw frontend that negotiates LOG_SHMFD but sets no memory table.
fn raw_frontend(sock: &Path) -> Frontend {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut fe = Frontend::from_stream(s, 2);
    fe.set_owner().unwrap();
    let f = fe.get_features().unwrap();
    fe.set_features(f & (1 << 30 | 1 << 32)).unwrap();
    let _ = fe.get_protocol_features().unwrap();
    fe.set_protocol_features(VhostUserProtocolFeatures::LOG_SHMFD)
        .unwrap();
    fe
}

fn alive(sw: &Switch, a: &mut Driver, b: &mut Driver, ma: [u8; 6], seq: u8) {
    let _ = sw;
    send(a, &frame(BCAST, ma, seq, 100));
    assert!(got_from(b, ma, WAIT), "other ports keep working");
}

#[test]
fn bad_logs_and_slots_are_refused() {
    let dir = TestDir::new("bad");
    let sw = switch();
    let s1 = add_server(&sw, &dir, "p1");
    let s2 = add_server(&sw, &dir, "p2");
    let s3 = add_server(&sw, &dir, "p3");
    let mut d2 = connect(&s2);
    let mut d3 = connect(&s3);

    // A log too small for the guest memory: refused (the connection ends).
    let mut d1 = connect(&s1);
    let f = log_file(4096);
    let r = d1.frontend().set_log_base(
        0,
        Some(VhostUserDirtyLogRegion {
            mmap_size: 1,
            mmap_offset: 0,
            mmap_handle: f.as_raw_fd(),
        }),
    );
    assert!(r.is_err(), "a 1-byte log for 4 MiB refused");
    assert_eq!(port_info(&sw, "p1").dirty_log, Some(false));
    alive(&sw, &mut d2, &mut d3, mac(2), 1);
    d1.close();

    // SET_LOG_BASE without an fd.
    let mut d1 = connect(&s1);
    let mut m = Vec::new();
    m.extend_from_slice(&6u32.to_le_bytes()); // SET_LOG_BASE
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&16u32.to_le_bytes());
    m.extend_from_slice(&4096u64.to_le_bytes());
    m.extend_from_slice(&0u64.to_le_bytes());
    d1.send_raw_message(&m).unwrap();
    let r = d1.read_raw(WAIT).unwrap_or_default();
    assert!(r.is_empty(), "no reply, the connection ends: {r:?}");
    assert_eq!(port_info(&sw, "p1").dirty_log, Some(false));
    alive(&sw, &mut d3, &mut d2, mac(3), 2);
    d1.close();

    // A log before any memory table.
    wait_until("p1 free", || port_info(&sw, "p1").connected == Some(false));
    let fe = raw_frontend(&s1);
    let f = log_file(4096);
    let r = fe.set_log_base(
        0,
        Some(VhostUserDirtyLogRegion {
            mmap_size: 4096,
            mmap_offset: 0,
            mmap_handle: f.as_raw_fd(),
        }),
    );
    assert!(r.is_err(), "log before memory table refused");
    drop(fe);
    alive(&sw, &mut d2, &mut d3, mac(2), 3);

    // Memory slots: 32, one taken by the driver's memory; the 33rd is refused.
    wait_until("p1 free", || port_info(&sw, "p1").connected == Some(false));
    let mut d1 = connect(&s1);
    assert_eq!(d1.frontend().get_max_mem_slots().unwrap(), 32);
    let region = |i: u64, fd: i32| VhostUserMemoryRegionInfo {
        guest_phys_addr: (1 << 30) + i * PAGE * 4,
        memory_size: PAGE * 4,
        userspace_addr: (1 << 40) + i * PAGE * 4,
        mmap_offset: 0,
        mmap_handle: fd,
    };
    let mut files = Vec::new();
    let mut refused = None;
    for i in 0..40u64 {
        let f = log_file(PAGE * 4);
        let r = d1.frontend().add_mem_region(&region(i, f.as_raw_fd()));
        files.push(f);
        if r.is_err() {
            refused = Some(i);
            break;
        }
    }
    assert_eq!(refused, Some(31), "slot 33 refused");
    // An exact repeat of a region (QEMU's second queue pair adds the RAM again) is accepted
    // and takes no slot; one that overlaps differently is refused.
    let again = log_file(PAGE * 4);
    d1.frontend()
        .add_mem_region(&region(5, again.as_raw_fd()))
        .expect("the same region again is accepted");
    let overlapping = VhostUserMemoryRegionInfo {
        guest_phys_addr: (1 << 30) + 5 * PAGE * 4 + PAGE,
        ..region(40, again.as_raw_fd())
    };
    assert!(d1.frontend().add_mem_region(&overlapping).is_err());
    // Removing one frees a slot (removing it again, as the other queue pairs do, is fine);
    // the port still switches.
    d1.frontend().remove_mem_region(&region(0, -1)).unwrap();
    d1.frontend().remove_mem_region(&region(0, -1)).unwrap();
    let f = log_file(PAGE * 4);
    d1.frontend()
        .add_mem_region(&region(45, f.as_raw_fd()))
        .expect("the freed slot is usable");
    alive(&sw, &mut d1, &mut d2, mac(1), 4);
    alive(&sw, &mut d2, &mut d3, mac(2), 5);
}
