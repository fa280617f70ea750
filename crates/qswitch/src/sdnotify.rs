//! systemd integration without a library: `sd_notify` and the control socket's group.
//!
//! `sd_notify` is one datagram ("READY=1") to the Unix socket named by `$NOTIFY_SOCKET` (a
//! path, or an abstract name when it starts with `@`). std's `UnixDatagram` does this in a few
//! lines and no unsafe code, so no crate (`sd-notify`, `libsystemd`) is pulled in for it.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;

use anyhow::{bail, Context};

/// Sends `state` (e.g. "READY=1") to systemd when `$NOTIFY_SOCKET` is set; does nothing
/// otherwise. Failures are logged, never fatal.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    if let Err(e) = send(&target.to_string_lossy(), state) {
        tracing::warn!(error = %e, "cannot notify systemd ({state})");
    } else {
        tracing::debug!("notified systemd: {state}");
    }
}

fn send(target: &str, state: &str) -> std::io::Result<()> {
    let addr = match target.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None => SocketAddr::from_pathname(target)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// Gives `group` (a name from /etc/group, or a number) read and write access to the control
/// socket at `path`: owner group `group`, mode 0660.
pub fn share_with_group(path: &Path, group: &str) -> anyhow::Result<()> {
    let gid = group_id(group)?;
    std::os::unix::fs::chown(path, None, Some(gid))
        .with_context(|| format!("cannot give {} to group {group}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("cannot set permissions on {}", path.display()))?;
    tracing::info!(socket = %path.display(), group, gid, "control socket shared with a group (0660)");
    Ok(())
}

/// The id of a group given by name or number.
pub fn group_id(group: &str) -> anyhow::Result<u32> {
    if let Ok(n) = group.parse::<u32>() {
        return Ok(n);
    }
    let text = std::fs::read_to_string("/etc/group").context("cannot read /etc/group")?;
    for line in text.lines() {
        let mut f = line.split(':');
        if f.next() == Some(group) {
            if let Some(gid) = f.nth(1).and_then(|g| g.parse().ok()) {
                return Ok(gid);
            }
        }
    }
    bail!("[switch] control_group: no group '{group}' in /etc/group")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_reaches_a_path_and_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("qs-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("n.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt;
        let name = format!("qs-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
            .unwrap();
        send(&format!("@{name}"), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
    }

    #[test]
    fn groups_by_name_and_number() {
        assert_eq!(group_id("0").unwrap(), 0);
        assert_eq!(group_id("root").unwrap(), 0);
        assert!(group_id("no-such-group-qs").is_err());
    }
}
