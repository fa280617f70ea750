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
    fn is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<EventFd>();
    }
}
