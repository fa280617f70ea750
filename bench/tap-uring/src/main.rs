//! Writes 1 M 64-byte frames (UDP to the broadcast address, which the namespace's stack
//! receives and drops: no socket) into a TAP, one `write(2)` each against batches of 32
//! `IORING_OP_WRITE`s per `io_uring_enter`, three rounds, and prints ns per frame. The TAP
//! is moved into a namespace of its own (`qsurt-<pid>`, deleted at the end), so nothing
//! reaches the host's stack. Pin it to a CPU (`taskset -c 1`) for steadier figures.

use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::Instant;

use io_uring::{opcode, types, IoUring};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_NO_PI: i16 = 0x1000;
const IFF_VNET_HDR: i16 = 0x4000;
const FRAMES: usize = 1_000_000;
const BATCH: usize = 32;

#[repr(C)]
struct IfReq {
    name: [u8; 16],
    flags: i16,
    pad: [u8; 22],
}

fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().is_ok_and(|s| s.success());
    assert!(ok, "ip {}", args.join(" "));
}

/// A 12-byte virtio-net header (no offloads) and a 60-byte UDP/IPv4 broadcast frame.
fn frame() -> Vec<u8> {
    let mut f = vec![0u8; 12 + 60];
    let e = &mut f[12..];
    e[..6].copy_from_slice(&[0xff; 6]);
    e[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    e[12..14].copy_from_slice(&[0x08, 0x00]);
    let mut h = [0x45u8, 0, 0, 46, 0, 0, 0, 0, 64, 17, 0, 0, 10, 9, 9, 2, 255, 255, 255, 255];
    let mut s: u32 = h.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    h[10..12].copy_from_slice(&(!(s as u16)).to_be_bytes());
    e[14..34].copy_from_slice(&h);
    e[34..42].copy_from_slice(&[0x30, 0x39, 0, 9, 0, 26, 0, 0]);
    f
}

fn main() {
    let ns = format!("qsurt-{}", std::process::id());
    let ifname = format!("qsurt{}", std::process::id() % 100_000);
    let tap = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("open /dev/net/tun (root?)");
    let fd = tap.as_raw_fd();
    let mut req = IfReq {
        name: [0; 16],
        flags: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR,
        pad: [0; 22],
    };
    req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    // SAFETY: TUNSETIFF reads and writes one `struct ifreq`, which `IfReq` lays out.
    let r = unsafe { libc::ioctl(fd, TUNSETIFF, &mut req) };
    assert_eq!(r, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
    ip(&["netns", "add", &ns]);
    ip(&["link", "set", &ifname, "netns", &ns]);
    ip(&["-n", &ns, "addr", "add", "10.9.9.1/24", "dev", &ifname]);
    ip(&["-n", &ns, "link", "set", &ifname, "up"]);

    let one = frame();
    let bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| one.clone()).collect();
    let mut ring = IoUring::new(2 * BATCH as u32).expect("io_uring_setup");
    for round in 1..=3 {
        let t = Instant::now();
        for _ in 0..FRAMES {
            // SAFETY: `one` is valid for reads of its length.
            let r = unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
            assert_eq!(r, one.len() as isize, "write");
        }
        let write_ns = t.elapsed().as_nanos() as f64 / FRAMES as f64;
        let t = Instant::now();
        let mut done = 0;
        while done < FRAMES {
            {
                let mut sq = ring.submission();
                for b in &bufs {
                    let e = opcode::Write::new(types::Fd(fd), b.as_ptr(), b.len() as u32).build();
                    // SAFETY: `bufs` outlives the operation: every completion is reaped
                    // below before the next batch and before `bufs` is dropped.
                    unsafe { sq.push(&e).expect("submission queue full") };
                }
            }
            ring.submit_and_wait(BATCH).expect("io_uring_enter");
            for c in ring.completion() {
                assert_eq!(c.result(), one.len() as i32, "io_uring write");
                done += 1;
            }
        }
        let uring_ns = t.elapsed().as_nanos() as f64 / FRAMES as f64;
        println!(
            "round {round}: write(2) {write_ns:.0} ns/frame, io_uring x{BATCH} {uring_ns:.0} ns/frame"
        );
    }
    ip(&["netns", "del", &ns]);
}
