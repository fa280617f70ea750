//! File descriptor flags.

use std::io;
use std::os::fd::{AsFd, AsRawFd};

/// Sets `O_NONBLOCK` on `fd` (e.g. an eventfd received from another process).
pub fn set_nonblocking(fd: &impl AsFd) -> io::Result<()> {
    let raw = fd.as_fd().as_raw_fd();
    // SAFETY: F_GETFL on a borrowed, open fd reads its flags; no memory is passed.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL on a borrowed, open fd with an integer argument; no memory is passed.
    if unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads what is waiting on socket `fd` without consuming it (`recv(MSG_PEEK)`); blocks
/// like a read when nothing is there (unless the socket is non-blocking).
pub fn peek(fd: &impl AsFd, buf: &mut [u8]) -> io::Result<usize> {
    let raw = fd.as_fd().as_raw_fd();
    // SAFETY: recv writes at most `buf.len()` bytes into `buf`, which is valid and writable
    // for that length; the fd is borrowed and open.
    let n = unsafe { libc::recv(raw, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_leaves_the_data() {
        use std::io::{Read, Write};
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.write_all(b"hello").unwrap();
        let mut buf = [0u8; 5];
        assert_eq!(peek(&b, &mut buf).unwrap(), 5);
        let mut again = [0u8; 5];
        b.read_exact(&mut again).unwrap();
        assert_eq!(&again, b"hello");
    }

    #[test]
    fn sets_the_flag() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        set_nonblocking(&a).unwrap();
        let mut buf = [0u8; 1];
        let e = std::io::Read::read(&mut &a, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}
