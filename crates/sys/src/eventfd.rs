//! A counter fd used to wake a worker sleeping in [`crate::epoll::Epoll::wait`].

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::cvt;

/// Non-blocking, close-on-exec eventfd used to wake a sleeping worker. It is readable
/// (`EPOLLIN`) while notifications are pending.
#[derive(Debug)]
pub struct EventFd {
    file: File,
}

impl EventFd {
    /// A new eventfd with counter 0 (`EFD_NONBLOCK | EFD_CLOEXEC`).
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd() has no memory-safety preconditions.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by eventfd() and is owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(EventFd { file })
    }

    /// Adds 1 to the counter, making the fd readable. Never blocks: if the counter is
    /// saturated a wake-up is pending anyway, and that is `Ok`.
    pub fn notify(&self) -> io::Result<()> {
        match (&self.file).write(&1u64.to_ne_bytes()) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reads and resets the counter: the number of notifications since the last drain,
    /// 0 when nothing is pending.
    pub fn drain(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        match (&self.file).read(&mut buf) {
            Ok(8) => Ok(u64::from_ne_bytes(buf)),
            Ok(n) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("eventfd read returned {n} bytes"),
            )),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Whether `fd` is an eventfd (its `/proc/self/fd` link reads `anon_inode:[eventfd]`).
/// Used to refuse anything else (pipes, sockets, files) as a vhost-user kick or call fd.
pub fn is_eventfd(fd: &impl AsFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_fd().as_raw_fd()))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[eventfd]")
}

/// Reads and resets the counter of an eventfd someone else also holds (a frontend's kick
/// fd) without ever blocking: `preadv2(RWF_NOWAIT)`, which the eventfd honours whatever
/// the (shared, peer-controlled) `O_NONBLOCK` flag says (Linux 5.12 and later; older
/// kernels get a plain `read`). 0 when nothing is pending.
pub fn drain_nowait(fd: &impl AsFd) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: one iovec pointing at the live local `buf` (8 bytes, writable); the fd is
    // borrowed and open; offset -1 = the current position (eventfds have none).
    let n = unsafe { libc::preadv2(fd.as_fd().as_raw_fd(), &iov, 1, -1, libc::RWF_NOWAIT) };
    if n == 8 {
        return Ok(u64::from_ne_bytes(buf));
    }
    let e = io::Error::last_os_error();
    if n < 0 && e.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // Kernels before 5.12 do not honour RWF_NOWAIT on eventfds: a plain read, which
        // blocks if the peer cleared O_NONBLOCK (better than never draining the kick).
        // SAFETY: reads at most 8 bytes into the live local `buf`; the fd is borrowed.
        let n = unsafe { libc::read(fd.as_fd().as_raw_fd(), buf.as_mut_ptr().cast(), 8) };
        return match n {
            8 => Ok(u64::from_ne_bytes(buf)),
            _ => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
                e => Err(e),
            },
        };
    }
    match e.kind() {
        io::ErrorKind::WouldBlock => Ok(0),
        _ if n >= 0 => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("eventfd read returned {n} bytes"),
        )),
        _ => Err(e),
    }
}

/// Adds 1 to the counter of an eventfd someone else also holds (a frontend's call fd).
/// The kernel offers no non-blocking write that the peer cannot turn off: this blocks if the
/// peer pushed the counter to its maximum and cleared `O_NONBLOCK`. The wait is
/// interruptible, so a watchdog can end it with [`crate::interrupt::interrupt`]; the error
/// is then `Interrupted`. A saturated counter with `O_NONBLOCK` set is `Ok` (a
/// notification is pending anyway).
pub fn signal_foreign(fd: &impl AsFd) -> io::Result<()> {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from the live local `one`; the fd is borrowed and open. One
    // write(2), no retry on EINTR.
    let n = unsafe { libc::write(fd.as_fd().as_raw_fd(), one.as_ptr().cast(), one.len()) };
    if n >= 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.kind() {
        io::ErrorKind::WouldBlock => Ok(()),
        _ => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_drains() {
        let efd = EventFd::new().unwrap();
        assert_eq!(efd.drain().unwrap(), 0);
        efd.notify().unwrap();
        efd.notify().unwrap();
        efd.notify().unwrap();
        assert_eq!(efd.drain().unwrap(), 3);
        assert_eq!(efd.drain().unwrap(), 0);
    }

    #[test]
    fn foreign_eventfds() {
        let efd = EventFd::new().unwrap();
        assert!(is_eventfd(&efd));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(!is_eventfd(&a));
        // A blocking eventfd (as a peer may leave it): the read still does not block.
        // SAFETY: eventfd() with no flags returns a new fd owned by nothing else.
        let blocking = File::from(unsafe { OwnedFd::from_raw_fd(libc::eventfd(0, 0)) });
        assert_eq!(drain_nowait(&blocking).unwrap(), 0);
        signal_foreign(&blocking).unwrap();
        signal_foreign(&blocking).unwrap();
        assert_eq!(drain_nowait(&blocking).unwrap(), 2);
        assert_eq!(drain_nowait(&blocking).unwrap(), 0);
    }

    #[test]
    fn is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<EventFd>();
    }
}
