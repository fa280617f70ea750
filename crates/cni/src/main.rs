//! `qswitch-cni`: a CNI plugin (spec 1.1.0; configs 0.3.0 to 1.1.0) that attaches containers
//! to a running qswitch through its control socket.
//!
//! ```json
//! { "cniVersion": "1.1.0", "name": "tenant-a", "type": "qswitch-cni",
//!   "control": "/run/qswitch/control.sock", "mode": "veth",
//!   "vlan": 10, "mtu": 1500, "port_security": true,
//!   "qos": { "min": "100M", "max": "1G" },
//!   "ipam": { "type": "host-local", "ranges": [[{ "subnet": "10.10.0.0/24" }]] } }
//! ```
//!
//! - ADD, `mode = "veth"` (the default): the IPAM plugin's ADD; a veth pair whose container
//!   end is `CNI_IFNAME` in `CNI_NETNS` (MAC and MTU set), brought up with the addresses and
//!   routes IPAM returned; a qswitch veth port on the host end, with the VLAN, QoS and (with
//!   `port_security`) the MAC and addresses as its only allowed sources.
//! - ADD, `mode = "vhost-user"`: the IPAM plugin's ADD and a qswitch vhost-user port whose
//!   socket is `<socket_dir>/<port>.sock` (`interfaces[].socketPath` in a 1.1.0 result).
//! - DEL undoes all of it, idempotently; CHECK compares with `prevResult`; STATUS asks the
//!   daemon; GC removes the network's ports whose attachments are not valid any more.
//!
//! Errors are the spec's error result on stdout (codes in [`error::Code`]) and exit status 1.
//! docs/kubernetes.md is the operator's guide.
//!
//! # Modules
//! - [`conf`]: environment and network config, checked.
//! - [`ops`]: the commands.
//! - [`ipam`]: delegation to the IPAM plugin.
//! - [`link`]: veth, addresses and routes through iproute2.
//! - [`error`]: the error result.

#![forbid(unsafe_code)]

mod conf;
mod error;
mod ipam;
mod link;
mod ops;

use std::io::Read;

use conf::{Command, Input, SUPPORTED};
use error::{CniError, Code};

fn main() {
    let (version, outcome) = run();
    match outcome {
        Ok(Some(out)) => println!("{out}"),
        Ok(None) => {}
        Err(e) => {
            println!("{}", e.to_json(version));
            eprintln!("qswitch-cni: {e}");
            std::process::exit(1);
        }
    }
}

/// The command's output, and the version to report an error in.
fn run() -> (&'static str, Result<Option<String>, CniError>) {
    let mut version = "1.1.0";
    let out = (|| {
        let command = Command::from_env()?;
        let mut raw = Vec::new();
        std::io::stdin().read_to_end(&mut raw).map_err(|e| {
            CniError::new(Code::Io, "cannot read the network config", e.to_string())
        })?;
        if command == Command::Version {
            return Ok(Some(version_result(&raw)));
        }
        let input = Input::parse(raw)?;
        version = input.version.as_str();
        Ok(match command {
            Command::Add => Some(ops::add(&input)?.to_string()),
            Command::Del => ops::del(&input).map(|()| None)?,
            Command::Check => ops::check(&input).map(|()| None)?,
            Command::Status => ops::status(&input).map(|()| None)?,
            Command::Gc => ops::gc(&input).map(|()| None)?,
            Command::Version => unreachable!("answered above"),
        })
    })();
    (version, out)
}

/// VERSION: the versions the plugin speaks, with the `cniVersion` it was asked in.
fn version_result(raw: &[u8]) -> String {
    let asked = serde_json::from_slice::<serde_json::Value>(raw)
        .ok()
        .and_then(|v| v["cniVersion"].as_str().map(str::to_string))
        .unwrap_or_else(|| "1.1.0".into());
    serde_json::json!({ "cniVersion": asked, "supportedVersions": SUPPORTED }).to_string()
}
