//! TAP interface queues (`/dev/net/tun` with `IFF_TAP | IFF_NO_PI`).
//!
//! Each [`TapQueue`] owns one file descriptor. With `multi_queue`, opening the same name
//! again attaches another queue; the kernel spreads received frames over the queues.
//! A non-persistent interface disappears when its last queue is closed.

use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::{cvt, IfReq};

/// Length of the virtio-net header (`struct virtio_net_hdr_mrg_rxbuf`) that precedes
/// every frame read or written when [`TapOptions::vnet_hdr`] is set.
pub const VNET_HDR_LEN: usize = 12;

/// `TUNSETOFFLOAD`: the reader accepts frames with partial checksums.
pub const TUN_F_CSUM: u32 = 0x01;
/// `TUNSETOFFLOAD`: the reader accepts TSO over IPv4.
pub const TUN_F_TSO4: u32 = 0x02;
/// `TUNSETOFFLOAD`: the reader accepts TSO over IPv6.
pub const TUN_F_TSO6: u32 = 0x04;
/// `TUNSETOFFLOAD`: the reader accepts TSO with ECN bits.
pub const TUN_F_TSO_ECN: u32 = 0x08;

/// How to open a TAP queue.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TapOptions {
    /// `IFF_MULTI_QUEUE`: allow several queues (fds) on one interface. All queues of an
    /// interface must agree on this.
    pub multi_queue: bool,
    /// `IFF_VNET_HDR`: each frame is preceded by a [`VNET_HDR_LEN`]-byte virtio-net header.
    pub vnet_hdr: bool,
}

/// One queue (one fd) of a TAP interface.
///
/// Reads and writes go through `&self`: the kernel serialises them per fd, so the queue
/// is `Send + Sync`. The fd is non-blocking and close-on-exec.
#[derive(Debug)]
pub struct TapQueue {
    file: File,
    name: String,
}

impl TapQueue {
    /// Opens `/dev/net/tun` and attaches to TAP `ifname` (creating the interface if
    /// absent) with `IFF_TAP | IFF_NO_PI`, plus `IFF_MULTI_QUEUE` / `IFF_VNET_HDR` per
    /// `opts`. The fd is `O_NONBLOCK` and `FD_CLOEXEC`. With `vnet_hdr`, the header size
    /// is set to [`VNET_HDR_LEN`] (`TUNSETVNETHDRSZ`).
    ///
    /// An empty name lets the kernel pick one (`tap%d`); see [`TapQueue::name`]. A name
    /// longer than 15 bytes (or containing NUL) is an `InvalidInput` error.
    pub fn open(ifname: &str, opts: TapOptions) -> io::Result<TapQueue> {
        let mut flags = libc::IFF_TAP | libc::IFF_NO_PI;
        if opts.multi_queue {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        if opts.vnet_hdr {
            flags |= libc::IFF_VNET_HDR;
        }
        // All flags above fit in the 16-bit `ifr_flags` (largest is 0x4000).
        let mut req = IfReq::new(ifname, flags as libc::c_short)?;
        // std always opens with O_CLOEXEC.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open("/dev/net/tun")?;
        // SAFETY: `file` is an open fd; TUNSETIFF reads and writes back one `struct
        // ifreq`, and `req` is a live, exclusively borrowed value of exactly that size.
        cvt(unsafe {
            libc::ioctl(
                file.as_raw_fd(),
                libc::TUNSETIFF,
                std::ptr::from_mut(&mut req),
            )
        })?;
        let queue = TapQueue {
            file,
            name: req.name(),
        };
        if opts.vnet_hdr {
            let len = VNET_HDR_LEN as libc::c_int;
            // SAFETY: TUNSETVNETHDRSZ reads one `int` through the pointer, which points to
            // the live local `len`.
            cvt(unsafe {
                libc::ioctl(
                    queue.file.as_raw_fd(),
                    libc::TUNSETVNETHDRSZ,
                    std::ptr::from_ref(&len),
                )
            })?;
        }
        Ok(queue)
    }

    /// The interface name as the kernel returned it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Tells the kernel which offloads this reader accepts (`TUNSETOFFLOAD`, a mask of
    /// `TUN_F_*`). Offloads other than `TUN_F_CSUM` need `vnet_hdr`.
    pub fn set_offload(&self, flags: u32) -> io::Result<()> {
        // SAFETY: TUNSETOFFLOAD takes its argument by value, no memory is accessed
        // through it; the fd is owned by `self` and open.
        cvt(unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETOFFLOAD,
                libc::c_ulong::from(flags),
            )
        })?;
        Ok(())
    }

    /// Makes the interface outlive its queues (`TUNSETPERSIST`), or not.
    pub fn set_persist(&self, persist: bool) -> io::Result<()> {
        // SAFETY: TUNSETPERSIST takes its argument by value, no memory is accessed
        // through it; the fd is owned by `self` and open.
        cvt(unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                libc::TUNSETPERSIST,
                libc::c_ulong::from(persist),
            )
        })?;
        Ok(())
    }

    /// Reads one frame (with its vnet header if enabled). `ErrorKind::WouldBlock` when
    /// none is pending. A frame longer than `buf` is truncated.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes one frame (with its vnet header if enabled).
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        (&self.file).write(buf)
    }

    /// Writes one frame gathered from `bufs` in a single `writev`.
    pub fn writev(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&self.file).write_vectored(bufs)
    }
}

impl AsRawFd for TapQueue {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for TapQueue {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Whether `e`, from a write to a TAP queue, is the kernel refusing it because the
/// interface is down (`EIO`: not up yet, or set down).
pub fn is_link_down(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netif;
    use qswitch_test_support::root_or_skip;
    use std::process::Command;
    use std::time::{Duration, Instant};

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn queue_is_send_sync() {
        assert_send_sync::<TapQueue>();
    }

    #[test]
    fn long_name_is_invalid_input() {
        let opts = TapOptions::default();
        let err = TapQueue::open("sixteen-chars-xx", opts).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = TapQueue::open("a\0b", opts).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    /// 60-byte broadcast ARP request (who-has 10.255.0.2 tell 10.255.0.1).
    fn arp_frame() -> [u8; 60] {
        let mut f = [0u8; 60];
        f[0..6].copy_from_slice(&[0xff; 6]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
        f[22..28].copy_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
        f[28..32].copy_from_slice(&[10, 255, 0, 1]);
        f[38..42].copy_from_slice(&[10, 255, 0, 2]);
        f
    }

    fn wait_gone(name: &str) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while netif::exists(name) {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    #[test]
    fn multi_queue_vnet_tap() {
        if !root_or_skip() {
            return;
        }
        let name = format!("qsys-t{}", std::process::id());
        let opts = TapOptions {
            multi_queue: true,
            vnet_hdr: true,
        };
        let q0 = TapQueue::open(&name, opts).unwrap();
        let q1 = TapQueue::open(&name, opts).unwrap();
        assert_eq!(q0.name(), name);
        assert_eq!(q1.name(), name);
        assert!(netif::exists(&name));
        assert!(netif::is_tap(&name));
        assert_ne!(q0.as_raw_fd(), q1.as_raw_fd());
        // O_NONBLOCK and O_CLOEXEC are set (fdinfo "flags:" is octal).
        let info =
            std::fs::read_to_string(format!("/proc/self/fdinfo/{}", q0.as_raw_fd())).unwrap();
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .map(|v| i64::from_str_radix(v.trim(), 8).unwrap())
            .unwrap();
        assert_ne!(flags & i64::from(libc::O_NONBLOCK), 0);
        assert_ne!(flags & i64::from(libc::O_CLOEXEC), 0);

        for q in [&q0, &q1] {
            q.set_offload(TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6).unwrap();
        }
        netif::set_up(&name, true).unwrap();
        let flags = std::fs::read_to_string(format!("/sys/class/net/{name}/flags")).unwrap();
        let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap();
        assert_ne!(flags & 1, 0, "IFF_UP not set");

        // Nothing was sent to the interface by us; drain whatever the kernel may have
        // sent (e.g. IPv6 router solicitations) until the queue is empty.
        let mut buf = [0u8; 2048];
        for q in [&q0, &q1] {
            let mut n = 0;
            loop {
                match q.read(&mut buf) {
                    Ok(_) => n += 1,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("read: {e}"),
                }
                assert!(n < 1000, "queue never empties");
            }
        }

        let mut frame = vec![0u8; VNET_HDR_LEN];
        frame.extend_from_slice(&arp_frame());
        assert_eq!(q0.write(&frame).unwrap(), frame.len());
        let arp = arp_frame();
        let hdr = [0u8; VNET_HDR_LEN];
        let n = q1
            .writev(&[IoSlice::new(&hdr), IoSlice::new(&arp)])
            .unwrap();
        assert_eq!(n, VNET_HDR_LEN + arp.len());

        netif::set_up(&name, false).unwrap();
        drop(q0);
        assert!(netif::exists(&name), "gone while a queue is still open");
        drop(q1);
        assert!(
            wait_gone(&name),
            "non-persistent TAP {name} survived its queues"
        );
    }

    #[test]
    fn persist_keeps_interface() {
        if !root_or_skip() {
            return;
        }
        let name = format!("qsys-p{}", std::process::id());
        let q = TapQueue::open(&name, TapOptions::default()).unwrap();
        q.set_persist(true).unwrap();
        drop(q);
        assert!(netif::exists(&name));
        let q = TapQueue::open(&name, TapOptions::default()).unwrap();
        q.set_persist(false).unwrap();
        drop(q);
        assert!(wait_gone(&name));
    }

    /// Deletes the network namespace (and so anything left in it) on drop.
    struct NetnsGuard(String);

    impl NetnsGuard {
        fn new(name: &str) -> NetnsGuard {
            // A leftover from an earlier, killed run: remove it quietly.
            let _ = Command::new("ip").args(["netns", "del", name]).output();
            run(&["ip", "netns", "add", name]);
            NetnsGuard(name.to_owned())
        }
    }

    impl Drop for NetnsGuard {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    fn run(args: &[&str]) {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(
            out.status.success(),
            "{args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn round_trip_after_move_to_netns() {
        if !root_or_skip() {
            return;
        }
        let pid = std::process::id();
        let ns = NetnsGuard::new(&format!("qsys-ns{pid}"));
        let name = format!("qsys-r{pid}");
        // Declared after the guard: the queue closes (deleting the TAP) before the
        // namespace is removed, also on panic.
        let q = TapQueue::open(
            &name,
            TapOptions {
                multi_queue: false,
                vnet_hdr: true,
            },
        )
        .unwrap();
        run(&["ip", "link", "set", &name, "netns", &ns.0]);
        assert!(!netif::exists(&name), "still visible in our namespace");
        run(&[
            "ip", "netns", "exec", &ns.0, "ip", "link", "set", &name, "up",
        ]);

        const MARKER: &[u8] = b"qswitch-sys-netns-test";
        let script = format!(
            "import socket\n\
             s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
             s.bind(('{name}', 0))\n\
             f = b'\\xff' * 6 + b'\\x02\\x00\\x00\\x00\\x00\\x02' + b'\\x88\\xb5' + {marker:?}.encode()\n\
             s.send(f.ljust(60, b'\\x00'))\n",
            marker = std::str::from_utf8(MARKER).unwrap()
        );
        run(&["ip", "netns", "exec", &ns.0, "python3", "-c", &script]);

        let deadline = Instant::now() + Duration::from_secs(2);
        let mut buf = [0u8; 2048];
        let found = loop {
            match q.read(&mut buf) {
                Ok(n) => {
                    let frame = &buf[VNET_HDR_LEN..n];
                    if frame.len() >= 14 + MARKER.len()
                        && frame[..6] == [0xff; 6]
                        && frame[12..14] == [0x88, 0xb5]
                        && frame[14..14 + MARKER.len()] == *MARKER
                    {
                        break true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("read: {e}"),
            }
        };
        assert!(found, "frame sent inside {} never reached the TAP fd", ns.0);
        drop(q);
    }
}
