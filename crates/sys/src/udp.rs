//! UDP sockets for tunnel endpoints: batched receive and send (`recvmmsg`/`sendmmsg`), the
//! source address of every datagram, and the socket options a VTEP needs.
//!
//! * [`UdpSocket::bind`] opens a non-blocking, close-on-exec socket bound to one address and
//!   port with [`UdpOptions`]: path-MTU discovery set to "do" (`IP_MTU_DISCOVER` /
//!   `IPV6_MTU_DISCOVER` = `*_PMTUDISC_DO`: the kernel sets DF and refuses a datagram larger
//!   than the path MTU with `EMSGSIZE` instead of fragmenting it), the transmit UDP checksum
//!   on or off (`SO_NO_CHECK` over IPv4, `UDP_NO_CHECK6_TX` over IPv6), buffer sizes.
//! * [`UdpSocket::recv_batch`] receives up to [`MAX_BATCH`] datagrams in one `recvmmsg`,
//!   each into its caller's buffer, with length, source and a truncation flag.
//! * [`UdpSocket::send_batch`] sends up to [`MAX_BATCH`] datagrams, each a header slice and a
//!   body slice gathered by the kernel (no copy into one buffer), to its own destination, in
//!   one `sendmmsg`.
//! * [`UdpSocket::send_segments`] sends several datagrams of one size (the last may be
//!   shorter), laid out back to back in one buffer, to one destination in one `sendmsg` with a
//!   `UDP_SEGMENT` control message: the kernel carries them as one GSO packet as far as it
//!   can (through veth, or to a NIC with UDP segmentation offload) and cuts them there. The
//!   kernel refuses it on a socket without transmit checksums (`EINVAL`).
//! * [`UdpSocket::set_gro`] turns on `UDP_GRO`: the kernel may hand over several datagrams
//!   of one flow and one size in one receive, back to back, with their size in a `UDP_GRO`
//!   control message ([`RecvMeta::segment`]).
//! * [`route_mtu`] asks the kernel for the MTU of the route from a local address to a remote
//!   one (`IP_MTU` / `IPV6_MTU` on a connected socket).
//!
//! Checksums on receive are the kernel's: a wrong non-zero UDP checksum is dropped before
//! the socket sees it (`UdpInCsumErrors` in `/proc/net/snmp`), a zero one is accepted over
//! IPv4 and refused over IPv6 (RFC 8200), as RFC 7348 and RFC 6935 ask of a VTEP.
//!
//! # Limitations
//! No control messages other than `UDP_SEGMENT` and `UDP_GRO`; IPv4-mapped IPv6 addresses are
//! reported as IPv6.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, RawFd};

use crate::cvt;

/// Most datagrams one [`UdpSocket::recv_batch`] or [`UdpSocket::send_batch`] moves.
pub const MAX_BATCH: usize = 64;
/// Most datagrams one [`UdpSocket::send_segments`] sends (the kernel's `UDP_MAX_SEGMENTS`
/// is 64 before Linux 5.9 and 128 since).
pub const MAX_SEGMENTS: usize = 64;
/// Most bytes one [`UdpSocket::send_segments`] sends: the largest UDP payload over IPv4
/// (65535 less 20 bytes of IP and 8 of UDP header).
pub const MAX_SEGMENTS_LEN: usize = 65_507;
/// Most buffers one [`UdpSocket::send_segments_vectored`] gathers (the kernel's
/// `UIO_MAXIOV`).
pub const MAX_IOVECS: usize = 1024;

/// How a socket is set up by [`UdpSocket::bind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpOptions {
    /// Compute the UDP checksum on transmit. `false` sends zero (IPv4: `SO_NO_CHECK`; IPv6:
    /// `UDP_NO_CHECK6_TX`, which RFC 6935 allows only for tunnels and peers that accept it).
    pub tx_checksum: bool,
    /// `SO_RCVBUF` in bytes, if set (the kernel doubles it and caps it at `rmem_max`).
    pub rcvbuf: Option<usize>,
    /// `SO_SNDBUF` in bytes, if set.
    pub sndbuf: Option<usize>,
    /// `SO_REUSEPORT`: several sockets of this process share the address; which one gets a
    /// datagram is decided by the group's [`UdpSocket::attach_reuseport_filter`] program.
    pub reuseport: bool,
}

impl Default for UdpOptions {
    fn default() -> Self {
        UdpOptions {
            tx_checksum: true,
            rcvbuf: None,
            sndbuf: None,
            reuseport: false,
        }
    }
}

/// One classic BPF instruction (`struct sock_filter`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BpfInsn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

const _: () = assert!(size_of::<BpfInsn>() == size_of::<libc::sock_filter>());

/// Classic BPF opcodes used by reuseport programs.
pub mod bpf {
    /// `A = ntohl(*(u32 *)(data + k))` (`BPF_LD | BPF_W | BPF_ABS`).
    pub const LD_W_ABS: u16 = 0x20;
    /// `A >>= k` (`BPF_ALU | BPF_RSH | BPF_K`).
    pub const RSH_K: u16 = 0x74;
    /// `pc += (A == k) ? jt : jf` (`BPF_JMP | BPF_JEQ | BPF_K`).
    pub const JEQ_K: u16 = 0x15;
    /// `return k` (`BPF_RET | BPF_K`).
    pub const RET_K: u16 = 0x06;
}

/// What [`UdpSocket::recv_batch`] knows about one received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvMeta {
    /// Bytes written into the buffer.
    pub len: usize,
    /// The datagram was longer than the buffer (the rest is lost).
    pub truncated: bool,
    /// The sender.
    pub src: SocketAddr,
    /// With `UDP_GRO` on: the size of each of the several datagrams the buffer holds back
    /// to back (the last may be shorter); 0 when it holds one datagram.
    pub segment: usize,
}

impl Default for RecvMeta {
    fn default() -> Self {
        RecvMeta {
            len: 0,
            truncated: false,
            src: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
            segment: 0,
        }
    }
}

/// One datagram for [`UdpSocket::send_batch`]: `head` followed by `body`, to `dst`.
#[derive(Debug, Clone, Copy)]
pub struct Datagram<'a> {
    pub dst: SocketAddr,
    pub head: &'a [u8],
    pub body: &'a [u8],
}

/// A non-blocking UDP socket bound to one local address and port.
#[derive(Debug)]
pub struct UdpSocket {
    sock: std::net::UdpSocket,
}

fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a live c_int and its size is passed; the kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

fn getsockopt_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals; `len` says how much the kernel may write.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// `UDP_NO_CHECK6_TX` from `linux/udp.h` (not in every libc version).
const UDP_NO_CHECK6_TX: libc::c_int = 101;
/// `SO_ATTACH_REUSEPORT_CBPF` from `asm-generic/socket.h`.
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;
/// `UDP_SEGMENT` from `linux/udp.h` (not in the glibc flavour of the libc crate).
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` from `linux/udp.h`.
const UDP_GRO: libc::c_int = 104;
/// Room for one control message with an int (`CMSG_SPACE(sizeof(int))` = 24 on 64-bit),
/// as u64s for its alignment.
const CMSG_WORDS: usize = 4;

impl UdpSocket {
    /// Opens a socket bound to `addr` (port 0: the kernel picks one) with `opts`, non-blocking,
    /// with path-MTU discovery "do" (never fragment).
    pub fn bind(addr: SocketAddr, opts: &UdpOptions) -> io::Result<UdpSocket> {
        let family = match addr {
            SocketAddr::V4(_) => libc::AF_INET,
            SocketAddr::V6(_) => libc::AF_INET6,
        };
        // SAFETY: socket() takes no pointers; the result is checked before use.
        let raw = cvt(unsafe {
            libc::socket(
                family,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::IPPROTO_UDP,
            )
        })?;
        // SAFETY: `raw` is a descriptor socket() just returned, owned by nobody else.
        let owned = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        let sock = std::net::UdpSocket::from(owned);
        let fd = sock.as_raw_fd();
        if opts.reuseport {
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        }
        // SAFETY: all-zero bytes are a valid sockaddr_storage.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = to_storage(addr, &mut storage);
        // SAFETY: `storage` holds a sockaddr of `len` bytes; bind() only reads it.
        cvt(unsafe { libc::bind(fd, (&storage as *const libc::sockaddr_storage).cast(), len) })?;
        match addr {
            SocketAddr::V4(_) => {
                setsockopt_int(
                    fd,
                    libc::IPPROTO_IP,
                    libc::IP_MTU_DISCOVER,
                    libc::IP_PMTUDISC_DO,
                )?;
                setsockopt_int(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_NO_CHECK,
                    libc::c_int::from(!opts.tx_checksum),
                )?;
            }
            SocketAddr::V6(_) => {
                setsockopt_int(
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_MTU_DISCOVER,
                    libc::IPV6_PMTUDISC_DO,
                )?;
                setsockopt_int(
                    fd,
                    libc::IPPROTO_UDP,
                    UDP_NO_CHECK6_TX,
                    libc::c_int::from(!opts.tx_checksum),
                )?;
            }
        }
        if let Some(n) = opts.rcvbuf {
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, clamp_int(n))?;
        }
        if let Some(n) = opts.sndbuf {
            setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, clamp_int(n))?;
        }
        Ok(UdpSocket { sock })
    }

    /// Attaches a classic BPF program to this socket's `SO_REUSEPORT` group
    /// (`SO_ATTACH_REUSEPORT_CBPF`): run on each datagram with the data starting at the UDP
    /// payload, it returns the index of the group's socket that gets it (sockets are indexed
    /// in the order they joined; closing one moves the last into its place). An index out of
    /// range falls back to the kernel's hash.
    pub fn attach_reuseport_filter(&self, prog: &[BpfInsn]) -> io::Result<()> {
        let fprog = libc::sock_fprog {
            len: u16::try_from(prog.len())
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
            filter: prog.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `fprog` points at `prog.len()` instructions with the layout of
        // `sock_filter` (asserted above), alive for the call; the kernel copies them.
        cvt(unsafe {
            libc::setsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_ATTACH_REUSEPORT_CBPF,
                (&fprog as *const libc::sock_fprog).cast(),
                size_of::<libc::sock_fprog>() as libc::socklen_t,
            )
        })
        .map(drop)
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Whether the transmit checksum is off (`SO_NO_CHECK` / `UDP_NO_CHECK6_TX` set).
    pub fn tx_checksum_off(&self) -> io::Result<bool> {
        let fd = self.sock.as_raw_fd();
        let v = match self.sock.local_addr()? {
            SocketAddr::V4(_) => getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_NO_CHECK)?,
            SocketAddr::V6(_) => getsockopt_int(fd, libc::IPPROTO_UDP, UDP_NO_CHECK6_TX)?,
        };
        Ok(v != 0)
    }

    /// Receives up to `min(bufs.len(), meta.len(), MAX_BATCH)` datagrams without blocking,
    /// datagram `i` into `bufs[i]` with its facts in `meta[i]`. Returns how many; `Ok(0)` when
    /// none is waiting.
    pub fn recv_batch(&self, bufs: &mut [&mut [u8]], meta: &mut [RecvMeta]) -> io::Result<usize> {
        let n = bufs.len().min(meta.len()).min(MAX_BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero bytes are valid values of these plain C structs.
        let mut names: [libc::sockaddr_storage; MAX_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
        let mut controls = [[0u64; CMSG_WORDS]; MAX_BATCH];
        for i in 0..n {
            iovs[i] = libc::iovec {
                iov_base: bufs[i].as_mut_ptr().cast(),
                iov_len: bufs[i].len(),
            };
            let hdr = &mut msgs[i].msg_hdr;
            hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            hdr.msg_iov = &mut iovs[i];
            hdr.msg_iovlen = 1;
            hdr.msg_control = controls[i].as_mut_ptr().cast();
            hdr.msg_controllen = size_of::<[u64; CMSG_WORDS]>() as _;
        }
        // SAFETY: the first `n` headers point at live, exclusively borrowed buffers (`bufs`,
        // which outlive the call) and at `names`/`iovs`/`controls` on this stack frame, with
        // their true lengths; the kernel writes at most those lengths.
        let got = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(0),
                _ => Err(e),
            };
        }
        let got = got as usize;
        for i in 0..got {
            meta[i] = RecvMeta {
                len: (msgs[i].msg_len as usize).min(bufs[i].len()),
                truncated: msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0,
                src: from_storage(&names[i]).unwrap_or(RecvMeta::default().src),
                segment: gro_segment(&msgs[i].msg_hdr),
            };
        }
        Ok(got)
    }

    /// Turns `UDP_GRO` on or off (Linux 5.0 and later; an error otherwise): with it on, a
    /// receive may return several datagrams of one size, see [`RecvMeta::segment`].
    pub fn set_gro(&self, on: bool) -> io::Result<()> {
        setsockopt_int(
            self.sock.as_raw_fd(),
            libc::SOL_UDP,
            UDP_GRO,
            libc::c_int::from(on),
        )
    }

    /// Sends `data`, cut into datagrams of `segment` bytes (the last one the remainder), to
    /// `dst` in one `sendmsg` with `UDP_SEGMENT`, without blocking. `data` must be at most
    /// [`MAX_SEGMENTS_LEN`] bytes and [`MAX_SEGMENTS`] segments. Returns the bytes sent (all
    /// of them). Errors: `EMSGSIZE` when a datagram is larger than the path MTU, `EINVAL`
    /// when the kernel refuses segmentation on this socket (checksums off) or route,
    /// `WouldBlock` when the send buffer is full.
    pub fn send_segments(&self, dst: SocketAddr, data: &[u8], segment: u16) -> io::Result<usize> {
        self.send_segments_vectored(dst, &[io::IoSlice::new(data)], segment)
    }

    /// [`UdpSocket::send_segments`] with the data gathered from `bufs` (at most
    /// [`MAX_IOVECS`]) by the kernel: the datagrams are cut from their concatenation, so a
    /// datagram may span buffers (a header here, its payload elsewhere) without a copy.
    pub fn send_segments_vectored(
        &self,
        dst: SocketAddr,
        bufs: &[io::IoSlice<'_>],
        segment: u16,
    ) -> io::Result<usize> {
        if bufs.len() > MAX_IOVECS {
            return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
        }
        // SAFETY: all-zero bytes are a valid sockaddr_storage.
        let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let namelen = to_storage(dst, &mut name);
        let mut control = [0u64; CMSG_WORDS];
        // SAFETY: all-zero bytes are a valid msghdr.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = namelen;
        // IoSlice is guaranteed ABI-compatible with struct iovec on Unix; sendmsg only reads
        // through the pointer (the *mut is the C declaration's).
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len() as _;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE only computes a size.
        let space = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        debug_assert!(space <= size_of::<[u64; CMSG_WORDS]>());
        msg.msg_controllen = space as _;
        // SAFETY: `msg` has a control buffer of `space` bytes (at most `control`'s size), so
        // CMSG_FIRSTHDR returns a pointer into `control`, aligned for a cmsghdr (u64 words),
        // with room for the header and a u16 of data, which are written through it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_UDP;
            (*cmsg).cmsg_type = UDP_SEGMENT;
            (*cmsg).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<u16>(), segment);
        }
        // SAFETY: `msg` points at `name` and `control` on this stack frame and at `bufs` and
        // the buffers they describe (borrowed for the call; IoSlice has iovec's layout), with
        // their true lengths and at most UIO_MAXIOV of them; sendmsg only reads them.
        let sent = unsafe { libc::sendmsg(self.sock.as_raw_fd(), &msg, libc::MSG_DONTWAIT) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sent as usize)
    }

    /// Sends up to [`MAX_BATCH`] of `datagrams` without blocking, in order, and returns how
    /// many the kernel took. A datagram the kernel refuses is reported as the error of the
    /// call only when it is the first one (`EMSGSIZE` for one larger than the path MTU,
    /// `WouldBlock` when the send buffer is full); otherwise the count stops before it and
    /// the next call reports it.
    pub fn send_batch(&self, datagrams: &[Datagram<'_>]) -> io::Result<usize> {
        let n = datagrams.len().min(MAX_BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero bytes are valid values of these plain C structs.
        let mut names: [libc::sockaddr_storage; MAX_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut iovs: [[libc::iovec; 2]; MAX_BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msgs: [libc::mmsghdr; MAX_BATCH] = unsafe { std::mem::zeroed() };
        for (i, d) in datagrams[..n].iter().enumerate() {
            let namelen = to_storage(d.dst, &mut names[i]);
            iovs[i] = [
                libc::iovec {
                    iov_base: d.head.as_ptr() as *mut libc::c_void,
                    iov_len: d.head.len(),
                },
                libc::iovec {
                    iov_base: d.body.as_ptr() as *mut libc::c_void,
                    iov_len: d.body.len(),
                },
            ];
            let hdr = &mut msgs[i].msg_hdr;
            hdr.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            hdr.msg_namelen = namelen;
            hdr.msg_iov = iovs[i].as_mut_ptr();
            hdr.msg_iovlen = 2;
        }
        // SAFETY: the first `n` headers point at `names`/`iovs` on this stack frame and at the
        // callers' slices (borrowed for the call) with their true lengths; `sendmsg` only
        // reads through `iov_base` although the C type is not const.
        let sent = unsafe {
            libc::sendmmsg(
                self.sock.as_raw_fd(),
                msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(sent as usize)
    }
}

impl AsFd for UdpSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// The MTU of the route from `local` to `remote`, as the kernel sees it now (interface MTU,
/// or a route's `mtu`, or a learned path MTU).
pub fn route_mtu(local: IpAddr, remote: IpAddr) -> io::Result<u32> {
    let sock = std::net::UdpSocket::bind(SocketAddr::new(local, 0))?;
    sock.connect(SocketAddr::new(remote, 9))?;
    let fd = sock.as_raw_fd();
    let mtu = match local {
        IpAddr::V4(_) => getsockopt_int(fd, libc::IPPROTO_IP, libc::IP_MTU)?,
        IpAddr::V6(_) => getsockopt_int(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU)?,
    };
    u32::try_from(mtu).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
}

/// Whether `e` is `EMSGSIZE`: the datagram is larger than the path MTU (and would have to
/// be fragmented) or than a datagram can be.
pub fn is_too_big(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EMSGSIZE)
}

/// The segment size of a `UDP_GRO` control message in a received `hdr`; 0 without one.
fn gro_segment(hdr: &libc::msghdr) -> usize {
    if hdr.msg_control.is_null() || hdr.msg_flags & libc::MSG_CTRUNC != 0 {
        return 0;
    }
    // SAFETY: `hdr` was filled by recvmmsg: its control pointer and length describe the
    // buffer the kernel wrote its control messages into (alive with the caller's frame), so
    // CMSG_FIRSTHDR/CMSG_NXTHDR stay within it and each header they return is readable; the
    // int of a UDP_GRO message is read unaligned, within the message's length.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(hdr);
        while !cmsg.is_null() {
            let c = &*cmsg;
            if c.cmsg_level == libc::SOL_UDP
                && c.cmsg_type == UDP_GRO
                && c.cmsg_len as usize >= libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize
            {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::c_int>());
                return usize::try_from(v).unwrap_or(0);
            }
            cmsg = libc::CMSG_NXTHDR(hdr, cmsg);
        }
    }
    0
}

/// Whether `e`, from [`UdpSocket::send_segments`], is the kernel refusing segmentation for
/// this send: `EINVAL` (checksums off, or a segment larger than the route allows) or `EIO`
/// (a route through IPsec, which never segments).
pub fn is_gso_refused(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO))
}

/// Whether `e`, from [`UdpSocket::send_segments`], says segmentation cannot work on this
/// route at all (`EIO`).
pub fn is_gso_unsupported(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EIO)
}

fn clamp_int(n: usize) -> libc::c_int {
    libc::c_int::try_from(n).unwrap_or(libc::c_int::MAX)
}

fn from_storage(s: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET => {
            let mut sin = MaybeUninit::<libc::sockaddr_in>::zeroed();
            // SAFETY: a sockaddr_storage is at least as large as a sockaddr_in and the
            // family says the kernel wrote one; the destination is a local of that type.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (s as *const libc::sockaddr_storage).cast::<u8>(),
                    sin.as_mut_ptr().cast::<u8>(),
                    size_of::<libc::sockaddr_in>(),
                );
            }
            // SAFETY: fully initialised by the copy above (and zeroed before).
            let sin = unsafe { sin.assume_init() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            let mut sin6 = MaybeUninit::<libc::sockaddr_in6>::zeroed();
            // SAFETY: as for AF_INET, with a sockaddr_in6 (also no larger than the storage).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (s as *const libc::sockaddr_storage).cast::<u8>(),
                    sin6.as_mut_ptr().cast::<u8>(),
                    size_of::<libc::sockaddr_in6>(),
                );
            }
            // SAFETY: fully initialised by the copy above (and zeroed before).
            let sin6 = unsafe { sin6.assume_init() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Writes `addr` into `s` and returns its length.
fn to_storage(addr: SocketAddr, s: &mut libc::sockaddr_storage) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: the storage is larger than a sockaddr_in and exclusively borrowed.
            unsafe {
                std::ptr::write_unaligned((s as *mut libc::sockaddr_storage).cast(), sin);
            }
            size_of::<libc::sockaddr_in>() as libc::socklen_t
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: the storage is larger than a sockaddr_in6 and exclusively borrowed.
            unsafe {
                std::ptr::write_unaligned((s as *mut libc::sockaddr_storage).cast(), sin6);
            }
            size_of::<libc::sockaddr_in6>() as libc::socklen_t
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(local: &str) -> (UdpSocket, UdpSocket) {
        let ip: IpAddr = local.parse().unwrap();
        let a = UdpSocket::bind(SocketAddr::new(ip, 0), &UdpOptions::default()).unwrap();
        let b = UdpSocket::bind(SocketAddr::new(ip, 0), &UdpOptions::default()).unwrap();
        (a, b)
    }

    fn round_trip(local: &str) {
        let (a, b) = pair(local);
        let dst = b.local_addr().unwrap();
        let bodies: Vec<Vec<u8>> = (0..70u8).map(|i| vec![i; 10 + usize::from(i)]).collect();
        let head = [0xaa, 0xbb];
        let msgs: Vec<Datagram<'_>> = bodies
            .iter()
            .map(|b| Datagram {
                dst,
                head: &head,
                body: b,
            })
            .collect();
        let mut sent = 0;
        while sent < msgs.len() {
            sent += a.send_batch(&msgs[sent..]).unwrap();
        }
        assert_eq!(sent, 70);
        let mut store = vec![vec![0u8; 40]; MAX_BATCH];
        let mut meta = [RecvMeta::default(); MAX_BATCH];
        let mut got = Vec::new();
        for _ in 0..1000 {
            let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|v| &mut v[..]).collect();
            let n = b.recv_batch(&mut bufs, &mut meta).unwrap();
            for i in 0..n {
                assert_eq!(meta[i].src, a.local_addr().unwrap());
                got.push((bufs[i][..meta[i].len].to_vec(), meta[i].truncated));
            }
            if got.len() == 70 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got.len(), 70);
        for (i, (data, truncated)) in got.iter().enumerate() {
            let want = [&head[..], &bodies[i]].concat();
            assert_eq!(*truncated, want.len() > 40);
            assert_eq!(&data[..], &want[..want.len().min(40)]);
        }
        assert_eq!(
            b.recv_batch(&mut [&mut [0u8; 4][..]], &mut meta).unwrap(),
            0
        );
    }

    #[test]
    fn batches_over_ipv4() {
        round_trip("127.0.0.1");
    }

    #[test]
    fn batches_over_ipv6() {
        let have = std::net::UdpSocket::bind("[::1]:0").is_ok();
        if !qswitch_test_support::skip::require(have, "needs an IPv6 loopback address") {
            return;
        }
        round_trip("::1");
    }

    /// Two sockets share one port; a program sends datagrams starting with 1 to the second.
    #[test]
    fn reuseport_filter_picks_the_socket() {
        let opts = UdpOptions {
            reuseport: true,
            ..UdpOptions::default()
        };
        let a = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &opts).unwrap();
        let addr = a.local_addr().unwrap();
        let b = UdpSocket::bind(addr, &opts).unwrap();
        let prog = [
            BpfInsn {
                code: bpf::LD_W_ABS,
                jt: 0,
                jf: 0,
                k: 0,
            },
            BpfInsn {
                code: bpf::RSH_K,
                jt: 0,
                jf: 0,
                k: 24,
            },
            BpfInsn {
                code: bpf::JEQ_K,
                jt: 0,
                jf: 1,
                k: 1,
            },
            BpfInsn {
                code: bpf::RET_K,
                jt: 0,
                jf: 0,
                k: 1,
            },
            BpfInsn {
                code: bpf::RET_K,
                jt: 0,
                jf: 0,
                k: 0,
            },
        ];
        b.attach_reuseport_filter(&prog).unwrap();
        let s = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        let msgs: Vec<[u8; 4]> = (0..20u8).map(|i| [i % 2, i, 0, 0]).collect();
        let d: Vec<Datagram<'_>> = msgs
            .iter()
            .map(|m| Datagram {
                dst: addr,
                head: &[],
                body: m,
            })
            .collect();
        assert_eq!(s.send_batch(&d).unwrap(), 20);
        let mut meta = [RecvMeta::default(); MAX_BATCH];
        for (sock, first) in [(&a, 0u8), (&b, 1u8)] {
            let mut got = 0;
            for _ in 0..1000 {
                let mut store = [[0u8; 8]; 20];
                let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|v| &mut v[..]).collect();
                let n = sock.recv_batch(&mut bufs, &mut meta).unwrap();
                assert!(bufs[..n].iter().all(|b| b[0] == first));
                got += n;
                if got == 10 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(got, 10);
        }
    }

    /// Six datagrams (five of 100 bytes, one of 50) in one `UDP_SEGMENT` send: a `UDP_GRO`
    /// receiver gets them in one buffer with their size, another gets six datagrams.
    #[test]
    fn segments_and_gro() {
        let (a, gro) = pair("127.0.0.1");
        let plain =
            UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        gro.set_gro(true).unwrap();
        let data: Vec<u8> = (0..550u32).map(|i| (i / 100) as u8).collect();
        assert_eq!(
            a.send_segments(gro.local_addr().unwrap(), &data, 100)
                .unwrap(),
            550
        );
        // Gathered from buffers that do not line up with the datagrams.
        let (x, rest) = data.split_at(30);
        let (y, z) = rest.split_at(170);
        let bufs = [
            io::IoSlice::new(x),
            io::IoSlice::new(y),
            io::IoSlice::new(z),
        ];
        let to = plain.local_addr().unwrap();
        assert_eq!(a.send_segments_vectored(to, &bufs, 100).unwrap(), 550);
        let mut meta = [RecvMeta::default(); MAX_BATCH];
        let mut store = vec![vec![0u8; 2000]; 8];
        let mut wait = |sock: &UdpSocket, want: usize| {
            let mut got = Vec::new();
            for _ in 0..1000 {
                let mut bufs: Vec<&mut [u8]> = store.iter_mut().map(|v| &mut v[..]).collect();
                let n = sock.recv_batch(&mut bufs, &mut meta).unwrap();
                got.extend(
                    meta[..n]
                        .iter()
                        .zip(&bufs)
                        .map(|(m, b)| (b[..m.len].to_vec(), m.segment)),
                );
                if got.len() >= want {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            got
        };
        let one = wait(&gro, 1);
        assert_eq!(one, vec![(data.clone(), 100)]);
        let six = wait(&plain, 6);
        assert_eq!(six.len(), 6);
        for (i, (d, seg)) in six.iter().enumerate() {
            assert_eq!(*seg, 0);
            assert_eq!(d[..], data[i * 100..(i * 100 + 100).min(550)]);
        }
        // Checksums off: the kernel refuses segmentation.
        let off = UdpOptions {
            tx_checksum: false,
            ..UdpOptions::default()
        };
        let s = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &off).unwrap();
        let e = s
            .send_segments(gro.local_addr().unwrap(), &data, 100)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL));
    }

    #[test]
    fn options_and_mtu() {
        let off = UdpOptions {
            tx_checksum: false,
            ..UdpOptions::default()
        };
        let s = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &off).unwrap();
        assert!(s.tx_checksum_off().unwrap());
        let s = UdpSocket::bind("127.0.0.1:0".parse().unwrap(), &UdpOptions::default()).unwrap();
        assert!(!s.tx_checksum_off().unwrap());
        let mtu = route_mtu("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap()).unwrap();
        assert!(mtu >= 1280, "{mtu}");
        // Too big for the path: refused, not fragmented.
        let big = vec![0u8; mtu as usize];
        let dst = s.local_addr().unwrap();
        let e = s
            .send_batch(&[Datagram {
                dst,
                head: &[],
                body: &big,
            }])
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EMSGSIZE));
    }
}
