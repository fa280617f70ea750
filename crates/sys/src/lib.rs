//! Thin, safe wrappers over the Linux system interfaces qswitch needs.
//!
//! This is the only crate in qswitch that contains `unsafe`. Every public function is
//! safe; each `unsafe` block carries a `// SAFETY:` comment naming the invariant that
//! makes it sound. Where std offers a safe equivalent it is used instead (`File` for
//! read/write on owned descriptors, `std::fs` for `/sys` and `/proc`). Errors are
//! [`std::io::Error`]s that keep the OS error code.
//!
//! # Modules
//!
//! - [`tap`]: open queues of a (multi-queue, vnet-header) TAP interface; offloads,
//!   persistence, non-blocking read/write/writev.
//! - [`netif`]: interface existence, up/down, "is this a TAP" (via `/sys/class/net` and
//!   `SIOCGIFFLAGS`/`SIOCSIFFLAGS`).
//! - [`cpu`]: cache prefetch hints for the data path.
//! - [`epoll`]: level-triggered `EPOLLIN` readiness with `u64` tokens.
//! - [`guest`]: a mapped guest memory region for the vhost-user data path: bounds-checked
//!   copies, ring-index atomics, prefetch hints.
//! - [`dirty_log`]: the vhost-user dirty-page log (live migration): one atomic bit per
//!   guest page.
//! - [`guestmap`]: mapping a vhost-user frontend's memory so that shrinking it cannot kill
//!   the process: `F_SEAL_SHRINK` seals, and a `SIGBUS` handler that turns a fault in guest
//!   memory into zero pages and an event.
//! - [`eventfd`]: a non-blocking eventfd to wake a worker sleeping in `epoll`; reading and
//!   signalling a frontend's eventfds without trusting their (shared) `O_NONBLOCK` flag.
//! - [`interrupt`]: interrupting a thread stuck in a system call (a signal with an empty
//!   handler and no `SA_RESTART`).
//! - [`netns`]: move the calling thread into a network namespace.
//! - [`bpf`]: `bpf(2)` without a toolchain: maps, programs from hand-written instructions,
//!   tcx links.
//! - [`xdp`]: AF_XDP sockets (UMEM and rings) and the XDP redirect program, loaded and
//!   attached through `bpf(2)` from hand-written instructions.
//! - [`udp`]: UDP sockets for tunnel endpoints: `recvmmsg`/`sendmmsg` batches with source
//!   addresses, never-fragment, transmit checksum on/off, route MTU.
//! - [`packet`]: AF_PACKET sockets (a `TPACKET_V2` receive ring, `sendmmsg` with
//!   `PACKET_QDISC_BYPASS`) and promiscuous mode held by a socket.
//! - [`rlimit`]: the open-file limit (`RLIMIT_NOFILE`): read it, raise the soft limit to
//!   the hard one.
//! - [`rtnl`]: rtnetlink: an interface's IPv6 address generation mode, flushing its
//!   addresses.
//! - [`thread`]: CPU pinning, online CPU list, thread id, per-thread context switches and
//!   CPU time, process CPU time, effective-uid check.
//! - [`fd`]: descriptor flags, `MSG_PEEK`, non-blocking Unix connect, and a Unix socket
//!   peer's credentials and groups (`SO_PEERCRED`, `SO_PEERGROUPS`).
//! - [`anon`]: an anonymous mapping whose pages go back to the kernel when it is dropped.
//!
//! # Limitations
//!
//! - Linux only.
//! - `/sys/class/net` reflects the network namespace sysfs was mounted in (normally the
//!   caller's), so [`netif::exists`] / [`netif::is_tap`] do not see an interface that was
//!   moved to another namespace, even though its TAP queues keep working.
//! - [`thread::thread_cpu_ns`] has clock-tick resolution (usually 10 ms).
//! - [`thread::online_cpus`] lists online CPUs, not the CPUs this process may run on
//!   (a cpuset may be narrower); pinning to a CPU outside it fails with `EINVAL`.
//! - Creating or configuring TAP interfaces and changing link state need
//!   `CAP_NET_ADMIN`.

pub mod anon;
pub mod bpf;
pub mod cpu;
pub mod dirty_log;
pub mod epoll;
pub mod eventfd;
pub mod fd;
pub mod guest;
pub mod guestmap;
pub mod interrupt;
pub mod netif;
pub mod netns;
pub mod packet;
pub mod placed;
pub mod rlimit;
pub mod rtnl;
pub mod tap;
pub mod thread;
pub mod udp;
pub mod xdp;

use std::io;

/// Turns a C-style `-1` return into the current `errno` as an [`io::Error`].
/// Takes ownership of `fd`, which a successful syscall that creates a descriptor has just
/// returned.
fn owned(fd: libc::c_int) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: `fd` was just returned by a successful syscall that creates a new descriptor,
    // and nothing else owns it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// `struct ifreq` as used by the flag ioctls: name plus a `short` at the start of the
/// union. Padded to the size of the kernel's `struct ifreq` so the kernel never reads or
/// writes past it.
#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; IFREQ_UNION_LEN - std::mem::size_of::<libc::c_short>()],
}

/// Size of the union in `struct ifreq` (its largest member is `struct ifmap`).
const IFREQ_UNION_LEN: usize = std::mem::size_of::<libc::ifreq>() - libc::IFNAMSIZ;

const _: () = assert!(std::mem::size_of::<IfReq>() == std::mem::size_of::<libc::ifreq>());

impl IfReq {
    /// An `ifreq` naming `ifname` with `flags`. Names longer than `IFNAMSIZ - 1` bytes or
    /// containing NUL are `InvalidInput`.
    fn new(ifname: &str, flags: libc::c_short) -> io::Result<IfReq> {
        let bytes = ifname.as_bytes();
        if bytes.len() >= libc::IFNAMSIZ || bytes.contains(&0) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "interface name {ifname:?} must be at most {} bytes without NUL",
                    libc::IFNAMSIZ - 1
                ),
            ));
        }
        let mut req = IfReq {
            name: [0; libc::IFNAMSIZ],
            flags,
            _pad: [0; IFREQ_UNION_LEN - std::mem::size_of::<libc::c_short>()],
        };
        for (dst, &src) in req.name.iter_mut().zip(bytes) {
            *dst = src as libc::c_char;
        }
        Ok(req)
    }

    /// The (NUL-terminated) name the kernel left in the request.
    fn name(&self) -> String {
        let bytes: Vec<u8> = self
            .name
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}
