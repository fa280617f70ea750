//! rtnetlink, the few messages qswitch sends: an interface's IPv6 address generation mode,
//! its addresses (listed and deleted), a `clsact` qdisc and direct-action `bpf` filters on it
//! (a veth port's slow path TAP, [`crate::bpf::tc_attach_classic`]); and link notifications
//! ([`LinkWatch`]).
//!
//! Why by hand and not `netlink-packet-route` + `netlink-sys`: five fixed-layout messages
//! (a header, `ifinfomsg`/`ifaddrmsg`/`tcmsg`, a few attributes) are shorter to write and to
//! read than the crates' type tree, and bring no dependencies; the socket needs `unsafe`
//! (`sendto`/`recv` on raw bytes) either way, which belongs here.
//!
//! A [`Rtnl`] socket works in the network namespace of the thread that opened it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::{cvt, owned};

const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const RTM_NEWQDISC: u16 = 36;
const RTM_NEWTFILTER: u16 = 44;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_FD: u16 = 6;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_FLAGS: u16 = 8;
const TCA_BPF_FLAG_ACT_DIRECT: u32 = 1;
/// `TC_H_CLSACT` (= `TC_H_INGRESS`), and the minor numbers of its two hooks.
const TC_H_CLSACT: u32 = 0xffff_fff1;
const TC_H_MIN_INGRESS: u32 = 0xfff2;
const TC_H_MIN_EGRESS: u32 = 0xfff3;
const RTM_SETLINK: u16 = 19;
const RTM_GETADDR: u16 = 22;
const RTM_DELADDR: u16 = 21;
const IFLA_AF_SPEC: u16 = 26;
const IFLA_INET6_ADDR_GEN_MODE: u16 = 8;
const IN6_ADDR_GEN_MODE_NONE: u8 = 1;
const NLA_F_NESTED: u16 = 1 << 15;
/// `sizeof(struct ifinfomsg)`, `sizeof(struct ifaddrmsg)`.
const IFINFOMSG_LEN: usize = 16;
const IFADDRMSG_LEN: usize = 8;

/// An rtnetlink socket.
#[derive(Debug)]
pub struct Rtnl {
    fd: OwnedFd,
    seq: u32,
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Appends attribute `ty` with `data` to `msg` (padded to 4 bytes).
fn attr(msg: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    msg.extend_from_slice(&(len as u16).to_ne_bytes());
    msg.extend_from_slice(&ty.to_ne_bytes());
    msg.extend_from_slice(data);
    msg.resize(align4(msg.len()), 0);
}

/// The messages in `buf`: (type, the payload after the header).
fn messages(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let ty = u16::from_ne_bytes([buf[4], buf[5]]);
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let payload = &buf[NLMSG_HDRLEN..len];
        buf = &buf[align4(len).min(buf.len())..];
        Some((ty, payload))
    })
}

/// The error of an `NLMSG_ERROR` payload (`None`: an ACK).
fn nlmsg_error(payload: &[u8]) -> Option<io::Error> {
    let code = i32::from_ne_bytes(payload.get(..4)?.try_into().ok()?);
    (code != 0).then(|| io::Error::from_raw_os_error(-code))
}

impl Rtnl {
    /// Opens a `NETLINK_ROUTE` socket.
    pub fn open() -> io::Result<Rtnl> {
        // SAFETY: socket() has no memory-safety preconditions.
        let fd = owned(cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        })?);
        // SAFETY: an all-zero sockaddr_nl is a valid value.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: `sa` is a live sockaddr_nl and the length passed is its size.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        })?;
        Ok(Rtnl { fd, seq: 0 })
    }

    /// A message of type `ty` with `flags`, `body` after the header.
    fn message(&mut self, ty: u16, flags: u16, body: &[u8]) -> Vec<u8> {
        self.seq = self.seq.wrapping_add(1);
        let mut m = Vec::with_capacity(NLMSG_HDRLEN + body.len());
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        m.extend_from_slice(&self.seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(body);
        m
    }

    fn send(&self, msg: &[u8]) -> io::Result<()> {
        // SAFETY: `msg` is a live buffer of `msg.len()` bytes; no address (the kernel).
        let n = unsafe { libc::send(self.fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: `buf` is a live, exclusively borrowed buffer of `buf.len()` bytes.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }

    /// Sends a request and waits for its ACK (or error).
    fn request(&mut self, ty: u16, body: &[u8]) -> io::Result<()> {
        self.request_with(ty, 0, body)
    }

    /// [`Rtnl::request`] with more `flags` than `NLM_F_REQUEST | NLM_F_ACK`.
    fn request_with(&mut self, ty: u16, flags: u16, body: &[u8]) -> io::Result<()> {
        let m = self.message(ty, NLM_F_ACK | flags, body);
        self.send(&m)?;
        let mut buf = vec![0u8; 16384];
        loop {
            let n = self.recv(&mut buf)?;
            for (t, payload) in messages(&buf[..n]) {
                if t == NLMSG_ERROR {
                    return nlmsg_error(payload).map_or(Ok(()), Err);
                }
            }
        }
    }

    /// Sends a dump request and collects the payloads of the answers of type `want`.
    fn dump(&mut self, ty: u16, body: &[u8], want: u16) -> io::Result<Vec<Vec<u8>>> {
        let m = self.message(ty, NLM_F_DUMP, body);
        self.send(&m)?;
        let mut buf = vec![0u8; 65536];
        let mut out = Vec::new();
        loop {
            let n = self.recv(&mut buf)?;
            for (t, payload) in messages(&buf[..n]) {
                match t {
                    NLMSG_DONE => return Ok(out),
                    NLMSG_ERROR => {
                        if let Some(e) = nlmsg_error(payload) {
                            return Err(e);
                        }
                    }
                    t if t == want => out.push(payload.to_vec()),
                    _ => {}
                }
            }
        }
    }

    /// Sets interface `ifindex`'s IPv6 address generation mode to none
    /// (`IFLA_INET6_ADDR_GEN_MODE` = `IN6_ADDR_GEN_MODE_NONE`, as `ip link set IF addrgenmode
    /// none`): the kernel makes no link-local (nor any other) address on it. Works where
    /// `/proc/sys` is read-only. `EAFNOSUPPORT` where the interface has no IPv6.
    pub fn set_addr_gen_mode_none(&mut self, ifindex: u32) -> io::Result<()> {
        let mut body = ifinfomsg(ifindex);
        let mut inet6 = Vec::new();
        attr(
            &mut inet6,
            IFLA_INET6_ADDR_GEN_MODE,
            &[IN6_ADDR_GEN_MODE_NONE],
        );
        let mut spec = Vec::new();
        attr(&mut spec, libc::AF_INET6 as u16 | NLA_F_NESTED, &inet6);
        attr(&mut body, IFLA_AF_SPEC | NLA_F_NESTED, &spec);
        self.request(RTM_SETLINK, &body)
    }

    /// The addresses of interface `ifindex` with global scope, IPv4 first, each family in
    /// the kernel's order (the first is the interface's primary address).
    pub fn global_addresses(&mut self, ifindex: u32) -> io::Result<Vec<std::net::IpAddr>> {
        const IFA_ADDRESS: u16 = 1;
        const IFA_LOCAL: u16 = 2;
        const RT_SCOPE_UNIVERSE: u8 = 0;
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for a in self.dump(RTM_GETADDR, &[0u8; IFADDRMSG_LEN], libc::RTM_NEWADDR)? {
            let (Some(head), Some(index)) = (a.get(..4), a.get(4..8)) else {
                continue;
            };
            if u32::from_ne_bytes(index.try_into().unwrap_or_default()) != ifindex
                || head[3] != RT_SCOPE_UNIVERSE
            {
                continue;
            }
            let fam = i32::from(head[0]);
            // Attributes: IFA_LOCAL is the address on point-to-point links, else IFA_ADDRESS.
            let (mut address, mut local) = (None, None);
            let mut rest = a.get(IFADDRMSG_LEN..).unwrap_or_default();
            while rest.len() >= 4 {
                let len = usize::from(u16::from_ne_bytes([rest[0], rest[1]]));
                let ty = u16::from_ne_bytes([rest[2], rest[3]]);
                if len < 4 || len > rest.len() {
                    break;
                }
                let value = &rest[4..len];
                match ty {
                    IFA_ADDRESS => address = Some(value),
                    IFA_LOCAL => local = Some(value),
                    _ => {}
                }
                rest = rest.get(align4(len)..).unwrap_or_default();
            }
            match (fam, local.or(address)) {
                (libc::AF_INET, Some(b)) if b.len() == 4 => {
                    v4.push(std::net::IpAddr::from([b[0], b[1], b[2], b[3]]))
                }
                (libc::AF_INET6, Some(b)) if b.len() == 16 => {
                    let o: [u8; 16] = b.try_into().unwrap_or_default();
                    v6.push(std::net::IpAddr::from(o))
                }
                _ => {}
            }
        }
        v4.extend(v6);
        Ok(v4)
    }

    /// Deletes every address (IPv4 and IPv6, link-local included) on interface `ifindex`;
    /// returns how many there were.
    pub fn flush_addresses(&mut self, ifindex: u32) -> io::Result<usize> {
        let mut n = 0;
        for a in self.dump(RTM_GETADDR, &[0u8; IFADDRMSG_LEN], libc::RTM_NEWADDR)? {
            let Some(index) = a.get(4..8) else { continue };
            if u32::from_ne_bytes(index.try_into().unwrap_or_default()) != ifindex {
                continue;
            }
            // The dumped message (ifaddrmsg and its address attributes) names the address.
            match self.request(RTM_DELADDR, &a) {
                Ok(()) => n += 1,
                Err(e) if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(n)
    }
}

impl Rtnl {
    /// Adds a `clsact` qdisc to interface `ifindex` (as `tc qdisc add dev IF clsact`);
    /// `EEXIST` if it has one.
    pub fn add_clsact(&mut self, ifindex: u32) -> io::Result<()> {
        let mut body = tcmsg(ifindex, TC_H_CLSACT & 0xffff_0000, TC_H_CLSACT, 0);
        attr(&mut body, TCA_KIND, b"clsact\0");
        self.request_with(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, &body)
    }

    /// Adds BPF program `prog_fd` named `name`, in direct-action mode, as a filter on the
    /// `clsact` qdisc of interface `ifindex`, at its ingress hook or (`ingress = false`) its
    /// egress hook, for every protocol, at priority 1 (as `tc filter add dev IF ingress prio
    /// 1 bpf da fd PROG`). The filter holds the program.
    pub fn add_bpf_filter(
        &mut self,
        ifindex: u32,
        ingress: bool,
        prog_fd: u32,
        name: &str,
    ) -> io::Result<()> {
        let minor = if ingress {
            TC_H_MIN_INGRESS
        } else {
            TC_H_MIN_EGRESS
        };
        let parent = (TC_H_CLSACT & 0xffff_0000) | minor;
        // tcm_info: priority above, protocol (ETH_P_ALL, network order) below.
        let info = 1 << 16 | u32::from((libc::ETH_P_ALL as u16).to_be());
        let mut body = tcmsg(ifindex, 0, parent, info);
        attr(&mut body, TCA_KIND, b"bpf\0");
        let mut opts = Vec::new();
        attr(&mut opts, TCA_BPF_FD, &prog_fd.to_ne_bytes());
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        attr(&mut opts, TCA_BPF_NAME, &n);
        attr(
            &mut opts,
            TCA_BPF_FLAGS,
            &TCA_BPF_FLAG_ACT_DIRECT.to_ne_bytes(),
        );
        attr(&mut body, TCA_OPTIONS, &opts);
        self.request_with(RTM_NEWTFILTER, NLM_F_CREATE | NLM_F_EXCL, &body)
    }
}

/// A `struct tcmsg` (family, padding, ifindex, handle, parent, info).
fn tcmsg(ifindex: u32, handle: u32, parent: u32, info: u32) -> Vec<u8> {
    let mut m = vec![0u8; 4];
    for v in [ifindex, handle, parent, info] {
        m.extend_from_slice(&v.to_ne_bytes());
    }
    m
}

/// A socket subscribed to the kernel's link notifications (`RTNLGRP_LINK`): it becomes
/// readable when an interface appears, changes or goes, in the network namespace of the
/// thread that opened it. The daemon waits on it for the interfaces of ports that are
/// waiting for theirs.
#[derive(Debug)]
pub struct LinkWatch {
    fd: OwnedFd,
}

impl LinkWatch {
    /// Opens a `NETLINK_ROUTE` socket bound to the link multicast group.
    pub fn open() -> io::Result<LinkWatch> {
        // SAFETY: socket() has no memory-safety preconditions.
        let fd = owned(cvt(unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_ROUTE,
            )
        })?);
        // SAFETY: an all-zero sockaddr_nl is a valid value.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: `sa` is a live sockaddr_nl and the length passed is its size.
        cvt(unsafe {
            libc::bind(
                fd.as_raw_fd(),
                std::ptr::addr_of!(sa).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        })?;
        Ok(LinkWatch { fd })
    }

    /// Waits up to `timeout` for link notifications and reads all that are queued. Returns
    /// whether an interface appeared or changed (`RTM_NEWLINK`); a notification lost to a
    /// full socket buffer (`ENOBUFS`) counts as one, since it may have been that.
    pub fn wait(&self, timeout: std::time::Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one live pollfd and the count passed is 1.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        let mut buf = vec![0u8; 16384];
        let mut new = false;
        loop {
            // SAFETY: `buf` is a live, exclusively borrowed buffer of `buf.len()` bytes.
            let n =
                unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    Some(libc::EAGAIN) => return Ok(new),
                    Some(libc::EINTR) => continue,
                    Some(libc::ENOBUFS) => {
                        new = true;
                        continue;
                    }
                    _ => return Err(e),
                }
            }
            new |= messages(&buf[..n as usize]).any(|(t, _)| t == libc::RTM_NEWLINK);
        }
    }
}

/// A `struct ifinfomsg` for `ifindex` (family unspecified, no flag change).
fn ifinfomsg(ifindex: u32) -> Vec<u8> {
    let mut m = vec![0u8; IFINFOMSG_LEN];
    m[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes in `buf`: (type without flags, payload).
    fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
        std::iter::from_fn(move || {
            if buf.len() < 4 {
                return None;
            }
            let len = usize::from(u16::from_ne_bytes([buf[0], buf[1]]));
            let ty = u16::from_ne_bytes([buf[2], buf[3]]) & !NLA_F_NESTED;
            if len < 4 || len > buf.len() {
                return None;
            }
            let data = &buf[4..len];
            buf = &buf[align4(len).min(buf.len())..];
            Some((ty, data))
        })
    }

    #[test]
    fn loopback_has_no_global_address() {
        // Host scope (127.0.0.1, ::1) is not global: nothing to announce.
        let mut r = Rtnl::open().unwrap();
        let got = r.global_addresses(1).unwrap();
        assert!(got.iter().all(|a| !a.is_loopback()), "{got:?}");
    }

    #[test]
    fn attributes_round_trip() {
        let mut m = Vec::new();
        attr(&mut m, IFLA_INET6_ADDR_GEN_MODE, b"qs-a\0");
        attr(&mut m, IFLA_AF_SPEC | NLA_F_NESTED, &[1, 2, 3, 4]);
        let got: Vec<_> = attrs(&m).collect();
        assert_eq!(
            got,
            [
                (IFLA_INET6_ADDR_GEN_MODE, &b"qs-a\0"[..]),
                (IFLA_AF_SPEC, &[1, 2, 3, 4][..])
            ]
        );
        // Truncated or nonsense lengths end the walk, never panic.
        assert_eq!(attrs(&m[..5]).count(), 0);
        assert_eq!(attrs(&[0xff, 0xff, 0, 0]).count(), 0);
        assert_eq!(messages(&[0u8; 7]).count(), 0);
    }

    #[test]
    fn an_unknown_interface_has_nothing_to_flush() {
        if !crate::thread::is_root() {
            return;
        }
        let mut r = Rtnl::open().unwrap();
        assert_eq!(r.flush_addresses(0x7fff_fff0).unwrap(), 0);
    }
}
