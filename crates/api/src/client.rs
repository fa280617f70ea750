//! The client side of the control socket: one request, one reply, used by the CLI, the demo,
//! the benchmarks and the tests.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Request, Response};

/// Why a [`call`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("no qswitch daemon is listening on {} (start one with `qswitch run --config FILE`, or pass --control PATH)", .0.display())]
    NotListening(PathBuf),
    #[error("permission denied on {} (the control socket is root-only)", .0.display())]
    PermissionDenied(PathBuf),
    #[error("cannot connect to {}: {error}", .path.display())]
    Connect {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot send the request")]
    Send(#[source] std::io::Error),
    #[error("no reply from the daemon")]
    Receive(#[source] std::io::Error),
    #[error("the daemon closed the connection without replying")]
    Closed,
    #[error("unreadable reply from the daemon")]
    Unreadable(#[source] serde_json::Error),
    /// The daemon answered [`Response::Error`].
    #[error("{0}")]
    Daemon(String),
}

/// Sends one request and returns the daemon's response; a [`Response::Error`] becomes
/// [`CallError::Daemon`].
pub fn call(control: &Path, req: &Request) -> Result<Response, CallError> {
    let stream = UnixStream::connect(control).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            CallError::NotListening(control.to_path_buf())
        }
        std::io::ErrorKind::PermissionDenied => CallError::PermissionDenied(control.to_path_buf()),
        _ => CallError::Connect {
            path: control.to_path_buf(),
            error: e,
        },
    })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(CallError::Send)?;
    stream
        .set_write_timeout(Some(Duration::from_secs(5)))
        .map_err(CallError::Send)?;
    let mut line = serde_json::to_vec(req).map_err(CallError::Unreadable)?;
    line.push(b'\n');
    (&stream).write_all(&line).map_err(CallError::Send)?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .map_err(CallError::Receive)?;
    if reply.is_empty() {
        return Err(CallError::Closed);
    }
    match serde_json::from_str::<Response>(&reply).map_err(CallError::Unreadable)? {
        Response::Error { message } => Err(CallError::Daemon(message)),
        r => Ok(r),
    }
}
