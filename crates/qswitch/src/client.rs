//! The CLI side of the control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use qswitch_api::{Request, Response};

/// Sends one request and returns the daemon's response; a [`Response::Error`] becomes `Err`.
pub fn call(control: &Path, req: &Request) -> anyhow::Result<Response> {
    let stream = UnixStream::connect(control).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => anyhow!(
            "no qswitch daemon is listening on {} (start one with `qswitch run --config FILE`, or pass --control PATH)",
            control.display()
        ),
        std::io::ErrorKind::PermissionDenied => {
            anyhow!("permission denied on {} (the control socket is root-only)", control.display())
        }
        _ => anyhow!("cannot connect to {}: {e}", control.display()),
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    (&stream)
        .write_all(&line)
        .context("cannot send the request")?;
    let mut reply = String::new();
    BufReader::new(&stream)
        .read_line(&mut reply)
        .context("no reply from the daemon")?;
    if reply.is_empty() {
        bail!("the daemon closed the connection without replying");
    }
    match serde_json::from_str::<Response>(&reply).context("unreadable reply from the daemon")? {
        Response::Error { message } => Err(anyhow!(message)),
        r => Ok(r),
    }
}
