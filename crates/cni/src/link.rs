//! Links, addresses and routes, through iproute2's `ip` (which the .deb depends on already).
//!
//! Why `ip` and not a netlink crate: an ADD needs a handful of link operations, which `ip`
//! batches into one process per namespace (`ip -batch -`), with error messages operators
//! know; `rtnetlink` would bring tokio and a dozen crates into a program that runs for
//! milliseconds, and hand-written netlink would be code to keep. Entering the container's
//! namespace is `qswitch_sys::netns::enter` on a thread of its own: the `ip` it starts
//! inherits that thread's namespace, and the plugin's other threads stay where they are.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::error::{CniError, Code, Result};

/// What `ip` said when it failed.
fn ip_error(what: &str, stderr: &[u8]) -> CniError {
    CniError::new(
        Code::Failed,
        what,
        String::from_utf8_lossy(stderr).trim().to_string(),
    )
}

/// Runs `ip ARGS` (in `netns` when given); stdout on success.
pub fn ip(netns: Option<&Path>, args: &[&str]) -> Result<String> {
    let run = || Command::new("ip").args(args).stdin(Stdio::null()).output();
    let out = in_netns(netns, run)?.map_err(|e| io_error("cannot run ip", e))?;
    if !out.status.success() {
        return Err(ip_error(
            &format!("ip {} failed", args.join(" ")),
            &out.stderr,
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `ip -batch -` with `script` (one command a line) in `netns` when given; stops at the
/// first command that fails.
pub fn batch(netns: Option<&Path>, what: &str, script: &str) -> Result<()> {
    let run = || -> std::io::Result<std::process::Output> {
        let mut child = Command::new("ip")
            .args(["-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(script.as_bytes())?;
        child.wait_with_output()
    };
    let out = in_netns(netns, run)?.map_err(|e| io_error("cannot run ip", e))?;
    if !out.status.success() {
        return Err(ip_error(what, &out.stderr));
    }
    Ok(())
}

fn io_error(what: &str, e: std::io::Error) -> CniError {
    CniError::new(Code::Io, what, e.to_string())
}

/// Runs `f` on a thread that has entered `netns` (or here, without one).
fn in_netns<T: Send>(netns: Option<&Path>, f: impl FnOnce() -> T + Send) -> Result<T> {
    let Some(ns) = netns else {
        return Ok(f());
    };
    std::thread::scope(|s| {
        s.spawn(|| {
            qswitch_sys::netns::enter(ns).map_err(|e| {
                CniError::new(
                    Code::UnknownContainer,
                    "cannot enter the container's network namespace",
                    format!("{}: {e}", ns.display()),
                )
            })?;
            Ok(f())
        })
        .join()
        .expect("netns thread does not panic")
    })
}

/// Whether interface `name` exists (in `netns` when given).
pub fn exists(netns: Option<&Path>, name: &str) -> Result<bool> {
    match netns {
        None => Ok(Path::new("/sys/class/net").join(name).exists()),
        // The index lookup on the namespace's thread: no `ip` process to start.
        Some(_) => Ok(in_netns(netns, || qswitch_sys::xdp::ifindex(name))?.is_ok()),
    }
}

/// A root-namespace interface's MAC address.
pub fn host_mac(name: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/sys/class/net").join(name).join("address"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Deletes a root-namespace link; a missing one is fine.
pub fn delete(name: &str) -> Result<()> {
    if !exists(None, name)? {
        return Ok(());
    }
    match ip(None, &["link", "del", "dev", name]) {
        Err(e) if e.details.contains("Cannot find device") => Ok(()),
        r => r.map(drop),
    }
}

/// One interface of `ip -j addr show`: its MAC, MTU and addresses (`a.b.c.d/len`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkState {
    pub mac: String,
    pub mtu: u32,
    pub up: bool,
    pub addrs: Vec<String>,
}

/// The state of `name` in `netns`, or `None` when there is no such interface.
pub fn state(netns: Option<&Path>, name: &str) -> Result<Option<LinkState>> {
    let out = match ip(netns, &["-j", "addr", "show", "dev", name]) {
        Ok(o) => o,
        Err(e) if e.details.contains("does not exist") || e.details.contains("Cannot find") => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let v: serde_json::Value = serde_json::from_str(&out)
        .map_err(|e| CniError::new(Code::Failed, "unreadable ip -j output", e.to_string()))?;
    let Some(l) = v.as_array().and_then(|a| a.first()) else {
        return Ok(None);
    };
    let addrs = l["addr_info"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| Some(format!("{}/{}", i["local"].as_str()?, i["prefixlen"])))
                .collect()
        })
        .unwrap_or_default();
    Ok(Some(LinkState {
        mac: l["address"].as_str().unwrap_or_default().to_string(),
        mtu: l["mtu"].as_u64().unwrap_or_default() as u32,
        up: l["flags"]
            .as_array()
            .is_some_and(|f| f.iter().any(|x| x == "UP")),
        addrs,
    }))
}
