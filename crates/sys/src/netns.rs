//! Network namespaces: move the calling thread into one.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use crate::cvt;

/// Moves the calling thread (only it) into the network namespace at `path` (e.g.
/// `/run/netns/NAME` or `/proc/PID/ns/net`). Sockets it creates afterwards, and interface
/// names it resolves, belong to that namespace. Needs `CAP_SYS_ADMIN`.
pub fn enter(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    // SAFETY: setns() on a descriptor we own for the duration of the call; it changes only
    // this thread's namespace and touches no memory of ours.
    cvt(unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) }).map(drop)
}
