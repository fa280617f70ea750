//! Interrupting a thread stuck in a blocking system call.
//!
//! [`install`] gives [`SIGNAL`] an empty handler without `SA_RESTART`; [`interrupt`] sends it
//! to one thread (`tgkill`). An interruptible wait in that thread (a `write` to a full
//! eventfd, for one) then fails with `EINTR` instead of waiting on. A thread that is not
//! blocked just runs the empty handler.

use std::io;
use std::sync::Once;

use crate::cvt;

static INSTALL: Once = Once::new();

/// The signal used: `SIGRTMIN + 3` (glibc keeps the first two real-time signals).
pub fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 3
}

extern "C" fn nothing(_sig: libc::c_int) {}

/// Installs the empty handler (once per process).
pub fn install() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is valid (empty mask, no flags); sigaction() reads the
        // live local. The handler does nothing, so it is async-signal-safe.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = nothing as *const () as usize;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(signal(), &act, std::ptr::null_mut());
        }
    });
}

/// Interrupts thread `tid` of this process ([`install`] must have run).
pub fn interrupt(tid: i32) -> io::Result<()> {
    // SAFETY: tgkill has no memory arguments; a stale tid only makes it fail with ESRCH.
    cvt(unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, signal()) } as libc::c_int)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicI32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn interrupts_a_blocked_write() {
        install();
        // SAFETY: eventfd() with no flags (blocking) returns a new fd.
        let fd = unsafe { libc::eventfd(0, 0) };
        assert!(fd >= 0);
        let full = (u64::MAX - 1).to_ne_bytes();
        // SAFETY: 8 bytes from a live local to our eventfd.
        assert_eq!(unsafe { libc::write(fd, full.as_ptr().cast(), 8) }, 8);
        let tid = Arc::new(AtomicI32::new(0));
        let t = {
            let tid = tid.clone();
            std::thread::spawn(move || {
                tid.store(crate::thread::gettid(), Ordering::SeqCst);
                let one = 1u64.to_ne_bytes();
                // SAFETY: as above; this write blocks (counter saturated, blocking fd).
                let r = unsafe { libc::write(fd, one.as_ptr().cast(), 8) };
                (r, io::Error::last_os_error().kind())
            })
        };
        while tid.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_millis(50));
        interrupt(tid.load(Ordering::SeqCst)).unwrap();
        let (r, kind) = t.join().unwrap();
        assert_eq!((r, kind), (-1, io::ErrorKind::Interrupted));
        // SAFETY: closes the fd created above, used by nothing else now.
        unsafe { libc::close(fd) };
    }
}
