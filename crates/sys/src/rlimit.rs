//! The open-file limit (`RLIMIT_NOFILE`): every port holds descriptors (an idle vhost-user
//! server port one, its listening socket), and the soft limit a service starts with (1024
//! under systemd) is below what a thousand ports need. The hard limit is the ceiling an
//! unprivileged process may raise its soft limit to.

use std::io;

use crate::cvt;

/// Descriptors a port holds at the least: an idle vhost-user server port, its listening
/// socket (its kick epolls and inject eventfd come with its first frontend; a connected
/// port, or a multi-queue TAP port, holds more).
pub const FDS_PER_PORT: u64 = 1;
/// Descriptors the daemon holds besides its ports (control and HTTP sockets, epolls,
/// workers' eventfds, the state file, clients).
pub const FDS_BASE: u64 = 256;

/// The open-file limit `ports` idle ports need at the least (`qswitch run` refuses to start
/// below it).
pub fn nofile_for_ports(ports: u64) -> u64 {
    FDS_BASE + FDS_PER_PORT * ports
}

/// The soft and hard `RLIMIT_NOFILE` of this process (`u64::MAX`: unlimited).
pub fn nofile() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable `struct rlimit` for the duration of the call.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) })?;
    Ok((lim.rlim_cur, lim.rlim_max))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (never lowers it) and returns the
/// soft and hard limits now in force. Only `select(2)` cares about descriptors above 1023,
/// and qswitch uses epoll.
pub fn raise_nofile() -> io::Result<(u64, u64)> {
    let (soft, hard) = nofile()?;
    if soft >= hard {
        return Ok((soft, hard));
    }
    let lim = libc::rlimit {
        rlim_cur: hard,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid `struct rlimit` read by the call; it only asks for the soft
    // limit to be set to the hard limit, which the kernel allows any process.
    cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    nofile()
}

/// Raises the soft and hard `RLIMIT_NOFILE` to at least `need` (never lowers either) and
/// returns the limits now in force. Raising the hard limit takes `CAP_SYS_RESOURCE` (up to
/// `fs.nr_open`): for a privileged parent (a benchmark) whose children need more
/// descriptors than its hard limit allows; they inherit the limits.
pub fn raise_nofile_to(need: u64) -> io::Result<(u64, u64)> {
    let (soft, hard) = nofile()?;
    if soft >= need {
        return Ok((soft, hard));
    }
    let lim = libc::rlimit {
        rlim_cur: need,
        rlim_max: hard.max(need),
    };
    // SAFETY: `lim` is a valid `struct rlimit` read by the call; the kernel refuses (EPERM)
    // a hard limit above the current one without CAP_SYS_RESOURCE, and changes nothing then.
    cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) })?;
    nofile()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raising_reaches_the_hard_limit_and_never_lowers() {
        let (soft, hard) = nofile().unwrap();
        assert!(soft <= hard);
        let (now, hard_now) = raise_nofile().unwrap();
        assert_eq!((now, hard_now), (hard, hard));
        assert_eq!(raise_nofile().unwrap(), (hard, hard));
    }
}
