//! Network interface queries and link state.
//!
//! Queries read `/sys/class/net`, which shows the interfaces of the network namespace
//! sysfs was mounted in (normally the caller's).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use crate::{cvt, IfReq};

/// `/sys/class/net/<ifname>`, or `None` for names that cannot be interfaces (empty, `.`,
/// `..`, too long, or containing `/` or NUL), which would otherwise escape the directory.
fn sys_path(ifname: &str) -> Option<PathBuf> {
    let bad = ifname.is_empty()
        || ifname == "."
        || ifname == ".."
        || ifname.len() >= libc::IFNAMSIZ
        || ifname.contains(['/', '\0']);
    (!bad).then(|| PathBuf::from("/sys/class/net").join(ifname))
}

/// Whether interface `ifname` exists (`/sys/class/net/<ifname>`).
pub fn exists(ifname: &str) -> bool {
    sys_path(ifname).is_some_and(|p| p.exists())
}

/// Whether `ifname` is a TAP (not TUN) interface: `/sys/class/net/<ifname>/tun_flags`
/// exists and has `IFF_TAP` set.
pub fn is_tap(ifname: &str) -> bool {
    let Some(path) = sys_path(ifname) else {
        return false;
    };
    let Ok(text) = std::fs::read_to_string(path.join("tun_flags")) else {
        return false;
    };
    let text = text.trim();
    let hex = text.strip_prefix("0x").unwrap_or(text);
    u32::from_str_radix(hex, 16).is_ok_and(|flags| flags & libc::IFF_TAP as u32 != 0)
}

/// Sets (`on`) or clears interface flag `flag` on `ifname` via `SIOCGIFFLAGS` /
/// `SIOCSIFFLAGS`.
fn set_flag(ifname: &str, flag: libc::c_short, on: bool) -> io::Result<()> {
    let mut req = IfReq::new(ifname, 0)?;
    // SAFETY: socket() has no memory-safety preconditions.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: SIOCGIFFLAGS writes `ifr_flags` of one `struct ifreq`; `req` is a live,
    // exclusively borrowed value of that size.
    cvt(unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFFLAGS as libc::Ioctl,
            std::ptr::from_mut(&mut req),
        )
    })?;
    let flags = if on {
        req.flags | flag
    } else {
        req.flags & !flag
    };
    if flags == req.flags {
        return Ok(());
    }
    req.flags = flags;
    // SAFETY: SIOCSIFFLAGS reads one `struct ifreq`; `req` is a live value of that size.
    cvt(unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCSIFFLAGS as libc::Ioctl,
            std::ptr::from_mut(&mut req),
        )
    })?;
    Ok(())
}

/// Makes interface `ifname` no door into the host's own stack: IPv6 address generation off
/// (no link-local, now or later: [`crate::rtnl::Rtnl::set_addr_gen_mode_none`]), every
/// address on it deleted, and `IFF_NOARP` (the host answers no ARP through it, so a peer
/// cannot learn its MAC to reach the host's IPv4 addresses). For an interface that only
/// carries frames for a switch (a veth's root end). An interface without IPv6 skips that
/// step.
pub fn seal(ifname: &str) -> io::Result<()> {
    let ifindex = crate::xdp::ifindex(ifname)?;
    let mut rtnl = crate::rtnl::Rtnl::open()?;
    match rtnl.set_addr_gen_mode_none(ifindex) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {}
        Err(e) => return Err(e),
    }
    rtnl.flush_addresses(ifindex)?;
    set_flag(ifname, libc::IFF_NOARP as libc::c_short, true)
}

/// Sets (`up = true`) or clears `IFF_UP` on `ifname` via `SIOCGIFFLAGS` /
/// `SIOCSIFFLAGS`. Needs `CAP_NET_ADMIN`; `ENODEV` if there is no such interface.
pub fn set_up(ifname: &str, up: bool) -> io::Result<()> {
    set_flag(ifname, libc::IFF_UP as libc::c_short, up)
}

/// The interface that holds IPv4 address `addr` (its name and ifindex), `None` if none does
/// or only a loopback one (`getifaddrs`).
pub fn holding_ipv4(addr: std::net::Ipv4Addr) -> io::Result<Option<(String, u32)>> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid out-pointer; on success the kernel's list is ours to read
    // and to free with `freeifaddrs` (below, once).
    cvt(unsafe { libc::getifaddrs(&mut list) })?;
    let mut found = None;
    let mut at = list;
    while !at.is_null() {
        // SAFETY: `at` is a node of the list `getifaddrs` returned, not yet freed; its
        // `ifa_addr` is null or points to a sockaddr of the family it names, and
        // `ifa_name` to a NUL-terminated string, both living as long as the list.
        let (name, v4, flags) = unsafe {
            let ifa = &*at;
            at = ifa.ifa_next;
            let v4 = (!ifa.ifa_addr.is_null()
                && i32::from((*ifa.ifa_addr).sa_family) == libc::AF_INET)
                .then(|| {
                    let sin = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))
                });
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name)
                .to_string_lossy()
                .into_owned();
            (name, v4, ifa.ifa_flags)
        };
        if v4 == Some(addr) && flags & libc::IFF_LOOPBACK as u32 == 0 {
            found = Some(name);
            break;
        }
    }
    // SAFETY: `list` came from a successful `getifaddrs` and is freed once, after the last
    // use of its nodes.
    unsafe { libc::freeifaddrs(list) };
    match found {
        Some(name) => {
            let ifindex = crate::xdp::ifindex(&name)?;
            Ok(Some((name, ifindex)))
        }
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback() {
        assert!(exists("lo"));
        assert!(!is_tap("lo"));
        assert!(!exists("qsys-no-such"));
        assert!(!is_tap("qsys-no-such"));
    }

    #[test]
    fn rejects_path_like_names() {
        for name in ["", ".", "..", "../net", "lo/", "a\0"] {
            assert!(!exists(name), "{name:?}");
            assert!(!is_tap(name), "{name:?}");
        }
    }

    #[test]
    fn set_up_errors() {
        let err = set_up("qsys-no-such", true).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENODEV));
        let err = set_up("sixteen-chars-xx", true).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn only_a_non_loopback_interface_holds_an_address() {
        // 127.0.0.1 is on lo alone; 192.0.2.77 (TEST-NET-1) on nothing.
        assert_eq!(holding_ipv4(std::net::Ipv4Addr::LOCALHOST).unwrap(), None);
        assert_eq!(
            holding_ipv4(std::net::Ipv4Addr::new(192, 0, 2, 77)).unwrap(),
            None
        );
    }

    #[test]
    fn loopback_up_is_noop() {
        // lo is up; asking for up again changes nothing and needs no privilege.
        set_up("lo", true).unwrap();
    }
}
