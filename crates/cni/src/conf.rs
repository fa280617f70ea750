//! What the runtime hands the plugin: the `CNI_*` environment and the network config on
//! stdin, checked into typed values. Unknown config keys are passed over (the spec has the
//! runtime pass every key through, and chained configs carry others' keys).

use std::collections::BTreeMap;
use std::path::PathBuf;

use qswitch_api::value::IfName;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{invalid_config, invalid_env, CniError, Code, Result};

/// The versions whose configs the plugin accepts, oldest first; its results are in the
/// config's version's format.
pub const SUPPORTED: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A spec version the plugin speaks (an index into [`SUPPORTED`], so they compare).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(usize);

impl Version {
    pub const V0_4_0: Version = Version(2);
    pub const V1_0_0: Version = Version(3);
    pub const V1_1_0: Version = Version(4);

    pub fn parse(s: &str) -> Option<Version> {
        SUPPORTED.iter().position(|&v| v == s).map(Version)
    }

    pub fn as_str(self) -> &'static str {
        SUPPORTED[self.0]
    }
}

/// `CNI_COMMAND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Status,
    Gc,
    Version,
}

impl Command {
    pub fn from_env() -> Result<Command> {
        let c = std::env::var("CNI_COMMAND").map_err(|_| {
            invalid_env("CNI_COMMAND is not set (expected ADD, DEL, CHECK, STATUS, GC or VERSION)")
        })?;
        Ok(match c.as_str() {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            "VERSION" => Command::Version,
            other => {
                return Err(invalid_env(format!(
                    "CNI_COMMAND={other:?} is not a CNI command (expected ADD, DEL, CHECK, \
                     STATUS, GC or VERSION)"
                )))
            }
        })
    }
}

/// The attachment parameters of ADD, DEL and CHECK.
#[derive(Debug, Clone)]
pub struct Attachment {
    pub container: String,
    /// `CNI_NETNS`; DEL may come without it.
    pub netns: Option<PathBuf>,
    pub ifname: IfName,
    /// `CNI_ARGS`, `K=V;K=V`.
    pub args: BTreeMap<String, String>,
}

impl Attachment {
    /// Reads `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`; `need_netns` for ADD
    /// and CHECK.
    pub fn from_env(need_netns: bool) -> Result<Attachment> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let container =
            var("CNI_CONTAINERID").ok_or_else(|| invalid_env("CNI_CONTAINERID is not set"))?;
        if !valid_container_id(&container) {
            return Err(invalid_env(format!(
                "CNI_CONTAINERID={container:?} is not a container id (an alphanumeric \
                 character, then alphanumerics, '_', '.' or '-')"
            )));
        }
        let netns = var("CNI_NETNS").map(PathBuf::from);
        if need_netns && netns.is_none() {
            return Err(invalid_env("CNI_NETNS is not set"));
        }
        let ifname = var("CNI_IFNAME").ok_or_else(|| invalid_env("CNI_IFNAME is not set"))?;
        let ifname = ifname
            .parse::<IfName>()
            .map_err(|e| invalid_env(format!("CNI_IFNAME: {e}")))?;
        let args = var("CNI_ARGS")
            .map(|a| parse_args(&a))
            .transpose()?
            .unwrap_or_default();
        Ok(Attachment {
            container,
            netns,
            ifname,
            args,
        })
    }
}

fn valid_container_id(id: &str) -> bool {
    let mut b = id.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && b.all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn parse_args(s: &str) -> Result<BTreeMap<String, String>> {
    s.split(';')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| invalid_env(format!("CNI_ARGS: {kv:?} is not KEY=VALUE")))
        })
        .collect()
}

/// How the plugin attaches the container.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// A veth pair: one end in the container's netns, the other a qswitch veth port.
    #[default]
    Veth,
    /// A vhost-user socket for a DPDK pod or a KubeVirt VM.
    VhostUser,
}

/// The network config (one plugin's entry of a conflist, as the runtime passes it).
#[derive(Debug, Clone, Deserialize)]
pub struct NetConf {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    /// The daemon's control socket (default `/run/qswitch/control.sock`).
    #[serde(default)]
    pub control: Option<PathBuf>,
    #[serde(default)]
    pub mode: Mode,
    /// Access VLAN of the port.
    #[serde(default)]
    pub vlan: Option<u16>,
    /// MTU of both veth ends.
    #[serde(default)]
    pub mtu: Option<u32>,
    /// The container interface's MAC (else `CNI_ARGS` `MAC=`, `runtimeConfig.mac`, or one
    /// derived from the attachment).
    #[serde(default)]
    pub mac: Option<String>,
    /// Allow only the interface's MAC and the IPAM addresses as sources on the port.
    #[serde(default)]
    pub port_security: bool,
    /// The port's `qos` (`min`, `max`, `weight`), as in qswitch.toml.
    #[serde(default)]
    pub qos: Option<Value>,
    /// veth: the kernel fast path (default true).
    #[serde(default)]
    pub fastpath: Option<bool>,
    /// vhost-user: the directory of the sockets (default `/run/qswitch/vhost-user`).
    #[serde(default)]
    pub socket_dir: Option<PathBuf>,
    /// vhost-user: queue pairs (default 1).
    #[serde(default)]
    pub queues: Option<u16>,
    /// vhost-user: `server` (qswitch listens, the default) or `client`.
    #[serde(default)]
    pub vhost_mode: Option<String>,
    #[serde(default)]
    pub ipam: Option<Ipam>,
    /// DNS settings passed into the result when IPAM returns none.
    #[serde(default)]
    pub dns: Option<Value>,
    #[serde(default, rename = "runtimeConfig")]
    pub runtime_config: Option<Value>,
    #[serde(default, rename = "prevResult")]
    pub prev_result: Option<Value>,
    #[serde(default, rename = "cni.dev/valid-attachments")]
    pub valid_attachments: Option<Vec<ValidAttachment>>,
}

/// The `ipam` section: only its `type` matters to the plugin.
#[derive(Debug, Clone, Deserialize)]
pub struct Ipam {
    #[serde(rename = "type")]
    pub kind: String,
}

/// One entry of `cni.dev/valid-attachments` (GC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ValidAttachment {
    #[serde(rename = "containerID")]
    pub container: String,
    pub ifname: String,
}

/// The config as read: typed, its version, and the raw bytes (what IPAM is given).
#[derive(Debug, Clone)]
pub struct Input {
    pub conf: NetConf,
    pub version: Version,
    pub raw: Vec<u8>,
}

impl Input {
    /// Checks stdin's config: JSON (else code 6), a version the plugin speaks (else 1), the
    /// keys' types and ranges (else 7).
    pub fn parse(raw: Vec<u8>) -> Result<Input> {
        let value: Value = serde_json::from_slice(&raw).map_err(|e| {
            CniError::new(
                Code::Decode,
                "network config is not JSON",
                format!("stdin: {e}"),
            )
        })?;
        let version = match value.get("cniVersion") {
            Some(Value::String(v)) => Version::parse(v).ok_or_else(|| {
                CniError::new(
                    Code::IncompatibleVersion,
                    "incompatible CNI version",
                    format!(
                        "cniVersion {v:?} is not supported (qswitch-cni speaks {})",
                        SUPPORTED.join(", ")
                    ),
                )
            })?,
            Some(v) => return Err(invalid_config(format!("cniVersion: {v} is not a string"))),
            None => return Err(invalid_config("cniVersion is missing")),
        };
        let conf: NetConf =
            serde_json::from_value(value).map_err(|e| invalid_config(e.to_string()))?;
        conf.check()?;
        Ok(Input { conf, version, raw })
    }
}

impl NetConf {
    fn check(&self) -> Result<()> {
        if self.name.is_empty() || self.kind.is_empty() {
            return Err(invalid_config("name and type must not be empty"));
        }
        if let Some(v) = self.vlan {
            if !(1..=4094).contains(&v) {
                return Err(invalid_config(format!("vlan {v} is out of range 1..=4094")));
            }
        }
        if let Some(m) = self.mtu {
            if !(68..=65535).contains(&m) {
                return Err(invalid_config(format!(
                    "mtu {m} is out of range 68..=65535"
                )));
            }
        }
        if let Some(m) = &self.mac {
            check_mac(m).map_err(invalid_config)?;
        }
        if let Some(m) = &self.vhost_mode {
            if m != "server" && m != "client" {
                return Err(invalid_config(format!(
                    "vhost_mode {m:?} is not server or client"
                )));
            }
        }
        if self.mode == Mode::Veth
            && (self.socket_dir.is_some() || self.vhost_mode.is_some() || self.queues.is_some())
        {
            return Err(invalid_config(
                "socket_dir, queues and vhost_mode apply to mode \"vhost-user\" only",
            ));
        }
        if self.mode == Mode::VhostUser && (self.mtu.is_some() || self.fastpath.is_some()) {
            return Err(invalid_config(
                "mtu and fastpath apply to mode \"veth\" only",
            ));
        }
        Ok(())
    }

    /// The control socket.
    pub fn control(&self) -> PathBuf {
        self.control
            .clone()
            .unwrap_or_else(|| PathBuf::from(qswitch_api::config::DEFAULT_CONTROL))
    }

    /// The container interface's MAC: config, `CNI_ARGS` `MAC=`, `runtimeConfig.mac`.
    pub fn mac(&self, att: &Attachment) -> Result<Option<String>> {
        let from_args = att.args.get("MAC").cloned();
        let from_rt = self
            .runtime_config
            .as_ref()
            .and_then(|r| r.get("mac"))
            .and_then(Value::as_str)
            .map(str::to_string);
        match self.mac.clone().or(from_args).or(from_rt) {
            Some(m) => check_mac(&m)
                .map(|()| Some(m.to_ascii_lowercase()))
                .map_err(invalid_config),
            None => Ok(None),
        }
    }
}

/// A unicast MAC in `aa:bb:cc:dd:ee:ff` form.
fn check_mac(m: &str) -> std::result::Result<(), String> {
    let mac: qswitch_api::value::MacAddress = m.parse().map_err(|e| format!("mac {m:?}: {e}"))?;
    if mac.0[0] & 1 != 0 || mac.0 == [0; 6] {
        return Err(format!("mac {m:?} is not a unicast address"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_and_unknown_ones_are_code_1() {
        assert!(Version::parse("0.3.0").unwrap() < Version::V0_4_0);
        assert_eq!(Version::parse("1.1.0"), Some(Version::V1_1_0));
        let e = Input::parse(br#"{"cniVersion":"0.2.0","name":"n","type":"qswitch-cni"}"#.to_vec())
            .unwrap_err();
        assert_eq!(e.code, Code::IncompatibleVersion);
        let e = Input::parse(b"{not json".to_vec()).unwrap_err();
        assert_eq!(e.code, Code::Decode);
    }

    #[test]
    fn malformed_fields_are_code_7() {
        for bad in [
            r#"{"cniVersion":"1.1.0","name":"n","type":"t","vlan":"ten"}"#,
            r#"{"cniVersion":"1.1.0","name":"n","type":"t","vlan":5000}"#,
            r#"{"cniVersion":"1.1.0","name":"n","type":"t","mode":"macvlan"}"#,
            r#"{"cniVersion":"1.1.0","name":"n","type":"t","mac":"01:00:00:00:00:01"}"#,
            r#"{"cniVersion":"1.1.0","type":"t"}"#,
            r#"{"cniVersion":1,"name":"n","type":"t"}"#,
            r#"{"cniVersion":"1.1.0","name":"n","type":"t","queues":2}"#,
        ] {
            let e = Input::parse(bad.as_bytes().to_vec()).unwrap_err();
            assert_eq!(e.code, Code::InvalidConfig, "{bad}: {e}");
        }
        let ok = Input::parse(
            br#"{"cniVersion":"0.3.1","name":"n","type":"t","vlan":10,"other":{"x":1}}"#.to_vec(),
        )
        .unwrap();
        assert_eq!(ok.conf.vlan, Some(10));
    }

    #[test]
    fn container_ids_and_args() {
        assert!(valid_container_id("cnitool-77383ca0a0715733ca6f"));
        assert!(!valid_container_id("-x"));
        assert!(!valid_container_id("a/b"));
        assert_eq!(
            parse_args("IgnoreUnknown=1;MAC=02:00:00:00:00:01").unwrap()["MAC"],
            "02:00:00:00:00:01"
        );
        assert_eq!(parse_args("x").unwrap_err().code, Code::InvalidEnv);
    }
}
