//! The open-file limit (`RLIMIT_NOFILE`): every port holds descriptors (an idle vhost-user
//! server port three: its listening socket and two eventfds), and the soft limit a service
//! starts with (1024 under systemd) is below what a thousand ports need. The hard limit is
//! the ceiling an unprivileged process may raise its soft limit to.

use std::io;

use crate::cvt;

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
