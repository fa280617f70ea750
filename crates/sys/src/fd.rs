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

/// Clears `O_NONBLOCK` on the open fd `raw` (what a hostile vhost-user frontend does to an
/// eventfd it shares with qswitch; for tests, with fds of types that do not implement
/// `AsFd`). A closed fd is `EBADF`.
pub fn clear_nonblocking(raw: std::os::fd::RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL reads the flags of fd `raw`; no memory is passed (a bad fd is EBADF).
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: F_SETFL with an integer argument; no memory is passed.
    if unsafe { libc::fcntl(raw, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
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

/// Bytes waiting to be read on socket `fd` (`FIONREAD`), over all queued messages.
pub fn readable_bytes(fd: &impl AsFd) -> io::Result<usize> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which points to the live local.
    if unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::FIONREAD, &mut n) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Who is at the other end of a Unix socket: the peer's credentials when it connected
/// (`SO_PEERCRED`) and its supplementary groups (`SO_PEERGROUPS`, Linux 4.13+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The credentials of the peer of Unix socket `fd` (see [`PeerCred`]).
pub fn peer_cred(fd: &impl AsFd) -> io::Result<PeerCred> {
    let raw = fd.as_fd().as_raw_fd();
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes into `cred`, a live, writable ucred of
    // exactly that size; `len` is a live, writable socklen_t.
    let rc = unsafe {
        libc::getsockopt(
            raw,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            std::ptr::addr_of_mut!(cred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0u32; 64];
    loop {
        let mut len = (groups.len() * 4) as libc::socklen_t;
        // SAFETY: SO_PEERGROUPS writes at most `len` bytes into `groups`, which is valid and
        // writable for `groups.len()` u32s (`len` bytes); `len` is a live socklen_t.
        let rc = unsafe {
            libc::getsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc == 0 {
            groups.truncate(len as usize / 4);
            break;
        }
        let e = io::Error::last_os_error();
        // ERANGE: `len` now holds the size needed (at most NGROUPS_MAX, 65536 groups).
        if e.raw_os_error() == Some(libc::ERANGE) && (len as usize) / 4 > groups.len() {
            groups.resize((len as usize).div_ceil(4).min(1 << 16), 0);
            continue;
        }
        return Err(e);
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
        groups,
    })
}

/// Connects a non-blocking, close-on-exec Unix stream socket to `path`. Never blocks: a
/// listener whose backlog is full gives `WouldBlock` instead of a wait.
pub fn connect_unix_nonblocking(
    path: &std::path::Path,
) -> io::Result<std::os::unix::net::UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid (family 0, empty path).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long or contains NUL",
        ));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = s as libc::c_char;
    }
    // SAFETY: socket() has no memory preconditions.
    let fd = crate::cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: `fd` was just returned by socket() and is owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: connect reads `len` (<= size_of::<sockaddr_un>()) bytes of the live local
    // `addr`.
    crate::cvt(unsafe {
        libc::connect(
            fd,
            std::ptr::from_ref(&addr).cast::<libc::sockaddr>(),
            len as libc::socklen_t,
        )
    })?;
    Ok(std::os::unix::net::UnixStream::from(owned))
}

/// Opens `path` for reading without blocking (`O_NONBLOCK`, so that a FIFO or a device
/// planted there cannot hang the caller) and without following a symlink in its last
/// component, and checks (`fstat` on the open file) that it is a regular file: anything
/// else is an `InvalidData` error naming what it is. The returned file blocks again.
pub fn open_regular(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                io::Error::new(io::ErrorKind::InvalidData, "is a symbolic link")
            } else {
                e
            }
        })?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        let what = if t.is_fifo() {
            "a FIFO"
        } else if t.is_dir() {
            "a directory"
        } else if t.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("is {what}, not a regular file"),
        ));
    }
    clear_nonblocking(f.as_raw_fd())?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_credentials_are_our_own() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let c = peer_cred(&a).unwrap();
        assert_eq!(c.pid, std::process::id() as i32);
        assert_eq!(c.uid, crate::thread::euid());
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("Groups:")).unwrap();
        let mut want: Vec<u32> = line[7..]
            .split_whitespace()
            .map(|g| g.parse().unwrap())
            .collect();
        let mut got = c.groups.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want);
    }

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
    fn nonblocking_connect_and_readable_bytes() {
        use std::io::Write;
        let dir = std::env::temp_dir().join(format!("qs-fd-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s");
        let _ = std::fs::remove_file(&path);
        assert!(connect_unix_nonblocking(&path).is_err());
        let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let mut c = connect_unix_nonblocking(&path).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(readable_bytes(&s).unwrap(), 0);
        c.write_all(b"abc").unwrap();
        c.write_all(b"de").unwrap();
        assert_eq!(readable_bytes(&s).unwrap(), 5);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sets_the_flag() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        set_nonblocking(&a).unwrap();
        let mut buf = [0u8; 1];
        let e = std::io::Read::read(&mut &a, &mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }

    #[test]
    fn open_regular_refuses_what_is_not_a_regular_file() {
        let dir = std::env::temp_dir().join(format!("qsys-regular-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(open_regular(&file).is_ok());
        let e = open_regular(&dir).unwrap_err();
        assert_eq!(e.to_string(), "is a directory, not a regular file");
        std::os::unix::fs::symlink(&file, dir.join("l")).unwrap();
        let e = open_regular(&dir.join("l")).unwrap_err();
        assert_eq!(e.to_string(), "is a symbolic link");
        assert_eq!(
            open_regular(&dir.join("none")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
