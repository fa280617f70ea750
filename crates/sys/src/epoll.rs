//! Level-triggered `EPOLLIN` readiness with `u64` tokens.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::cvt;

/// An epoll instance. Every registered fd has level-triggered `EPOLLIN` interest.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

/// One readiness event as filled in by [`Epoll::wait`].
#[derive(Clone, Copy)]
#[repr(transparent)]
pub struct Event(libc::epoll_event);

impl Event {
    /// An event with no flags and token 0, to initialise buffers for [`Epoll::wait`].
    pub const EMPTY: Event = Event(libc::epoll_event { events: 0, u64: 0 });

    /// The token given to [`Epoll::add`] for the ready fd.
    pub fn token(&self) -> u64 {
        self.0.u64
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Copy out: `epoll_event` is packed on x86_64, fields cannot be borrowed.
        let (events, token) = (self.0.events, self.0.u64);
        f.debug_struct("Event")
            .field("events", &format_args!("{events:#x}"))
            .field("token", &token)
            .finish()
    }
}

impl Epoll {
    /// A new epoll instance (`EPOLL_CLOEXEC`).
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1() has no memory-safety preconditions.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by epoll_create1() and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Epoll { fd })
    }

    /// Registers `fd` for level-triggered `EPOLLIN`; [`Event::token`] returns `token`.
    /// `EEXIST` if already registered.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: epoll_ctl reads one `epoll_event` through the pointer, which points to
        // the live local `ev`. An invalid `fd` only makes the kernel return EBADF.
        cvt(unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd,
                std::ptr::from_mut(&mut ev),
            )
        })?;
        Ok(())
    }

    /// Unregisters `fd`. `ENOENT` (not registered) and `EBADF` (already closed; closing
    /// an fd unregisters it) are errors the caller may ignore.
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        // SAFETY: EPOLL_CTL_DEL ignores the event pointer (null is allowed since Linux
        // 2.6.9). An invalid `fd` only makes the kernel return EBADF.
        cvt(unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        })?;
        Ok(())
    }

    /// Waits up to `timeout_ms` milliseconds (-1 = forever, 0 = poll) for readiness and
    /// fills the front of `events`; returns how many were filled. `EINTR` returns
    /// `Ok(0)`. An empty `events` is an `EINVAL` error.
    pub fn wait(&self, events: &mut [Event], timeout_ms: i32) -> io::Result<usize> {
        let max = libc::c_int::try_from(events.len()).unwrap_or(libc::c_int::MAX);
        // SAFETY: `Event` is `repr(transparent)` over `epoll_event`, so the slice is `max`
        // (<= events.len()) valid, exclusively borrowed `epoll_event`s for the kernel to
        // write.
        let ret = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr().cast::<libc::epoll_event>(),
                max,
                timeout_ms,
            )
        };
        match cvt(ret) {
            // Non-negative and at most `max`, so it fits.
            Ok(n) => Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for Epoll {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eventfd::EventFd;
    use std::time::{Duration, Instant};

    #[test]
    fn eventfd_wakes_waiter() {
        let ep = Epoll::new().unwrap();
        let efd = EventFd::new().unwrap();
        ep.add(efd.as_raw_fd(), 42).unwrap();
        let mut events = [Event::EMPTY; 4];

        // Nothing pending: a zero timeout returns at once with no events.
        assert_eq!(ep.wait(&mut events, 0).unwrap(), 0);

        // Another thread wakes us while we sleep with no timeout.
        std::thread::scope(|s| {
            let efd = &efd;
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                efd.notify().unwrap();
            });
            let start = Instant::now();
            let n = ep.wait(&mut events, 5_000).unwrap();
            assert_eq!(n, 1);
            assert_eq!(events[0].token(), 42);
            assert!(start.elapsed() < Duration::from_secs(4));
        });

        // Level-triggered: still ready until drained.
        assert_eq!(ep.wait(&mut events, 0).unwrap(), 1);
        assert_eq!(efd.drain().unwrap(), 1);
        assert_eq!(ep.wait(&mut events, 0).unwrap(), 0);

        ep.delete(efd.as_raw_fd()).unwrap();
        let err = ep.delete(efd.as_raw_fd()).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        efd.notify().unwrap();
        assert_eq!(ep.wait(&mut events, 0).unwrap(), 0);
    }

    #[test]
    fn add_errors_keep_os_error() {
        let ep = Epoll::new().unwrap();
        let efd = EventFd::new().unwrap();
        ep.add(efd.as_raw_fd(), 1).unwrap();
        let err = ep.add(efd.as_raw_fd(), 2).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EEXIST));
        let err = ep.add(-1, 3).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EBADF));
    }

    #[test]
    fn event_debug_and_empty() {
        assert_eq!(Event::EMPTY.token(), 0);
        assert!(format!("{:?}", Event::EMPTY).contains("token: 0"));
    }
}
