//! The daemon's TOML configuration: parsed strictly (unknown keys are errors) and validated
//! before anything starts. Every error is one line that names the problem.
//!
//! ```toml
//! [switch]
//! workers = "0-1"                  # CPUs for datapath workers: "0-3", "2-14:2", "1,3"
//! control = "/run/qswitch/control.sock"
//! fdb_aging = 300                  # seconds a learned MAC lives without traffic
//! reserved_cpus = "0"              # CPUs no queue is placed on (default: none)
//! placement = "dynamic"            # or "static": no moves by load
//!
//! [[port]]
//! name = "a"
//! type = "tap"
//! ifname = "qs-a"                  # created, or attached if a persistent TAP exists
//! queues = 2                       # IFF_MULTI_QUEUE
//! vlan = 10                        # optional access VLAN
//! cpus = "0-1"                     # optional CPU set for the port's queues
//!
//! [[port]]
//! name = "g"
//! type = "gen"                     # internal generator/sink
//! mac = "02:00:00:00:00:01"
//! generate = { dst = "02:00:00:00:00:02", size = 64, rate = 0, flows = 4, count = 0 }
//!
//! # QoS (see `qswitch_dp::qos`)
//! [switch]
//! reservable = 0.9                 # share of an uplink's capacity guarantees may reserve
//!
//! [[port]]
//! name = "up"
//! type = "tap"
//! ifname = "qs-up"
//! capacity = "1G"                  # an uplink: the ports of its VLAN share this rate
//!
//! [[port]]
//! name = "vm1"
//! type = "tap"
//! ifname = "qs-vm1"
//! qos = { min = "200M", max = "1G", weight = 2 }
//! ```
//! Rates are bits per second of L2 frames (Ethernet header counted, FCS not) with an
//! optional k/M/G/T suffix (powers of 1000): "150M", "1.5G", "800000".

use std::collections::HashSet;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cpulist::{CpuList, CpuListError};

/// Where the control socket lives unless the config says otherwise.
pub const DEFAULT_CONTROL: &str = "/run/qswitch/control.sock";
/// Most queues a port may have (the kernel's TAP limit).
pub const MAX_QUEUES: u16 = 256;
/// Most queue pairs a vhost-user port offers.
pub const MAX_VHOST_PAIRS: u16 = 16;
/// Longest Linux interface name.
pub const MAX_IFNAME: usize = 15;
/// Smallest frame a gen port builds: Ethernet + IPv4 + UDP + the 16-byte sequence trailer.
pub const GEN_MIN_SIZE: u16 = 60;
/// Largest frame a gen port builds (a jumbo frame without FCS).
pub const GEN_MAX_SIZE: u16 = 9018;

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub switch: SwitchConfig,
    #[serde(default, rename = "port")]
    pub ports: Vec<PortConfig>,
}

/// `[switch]`: switch-wide settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConfig {
    /// CPUs for datapath workers, one pinned worker per CPU.
    #[serde(default = "default_workers")]
    pub workers: String,
    /// The control socket's path.
    #[serde(default = "default_control")]
    pub control: PathBuf,
    /// Seconds a learned MAC address lives without being seen.
    #[serde(default = "default_fdb_aging")]
    pub fdb_aging: u64,
    /// Microseconds a worker keeps polling after its last frame before it sleeps
    /// (0..=10000). Longer keeps latency and context switches down under bursty load;
    /// shorter leaves more CPU to other processes on small machines.
    #[serde(default = "default_poll_spin_us")]
    pub poll_spin_us: u64,
    /// CPUs no queue is ever placed on (a CPU list); none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_cpus: Option<String>,
    /// How queues are placed on workers: `dynamic` (by measured load) or `static`.
    #[serde(default)]
    pub placement: PlacementMode,
    /// The share (0 < r <= 1) of an uplink's capacity that minimum guarantees may reserve
    /// in total; changes beyond it are refused.
    #[serde(default = "default_reservable")]
    pub reservable: f64,
    /// Address of the HTTP server (`/metrics`, `/api/...`, the dashboard at `/`), e.g.
    /// "127.0.0.1:9470". Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<String>,
}

/// Default `[switch] reservable`.
pub const DEFAULT_RESERVABLE: f64 = 0.9;

fn default_reservable() -> f64 {
    DEFAULT_RESERVABLE
}

/// `[switch] placement`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementMode {
    /// Every ~second, queues are coalesced onto fewer workers at low load and spread at
    /// high load.
    #[default]
    Dynamic,
    /// Queues stay where the placement rules put them (and where an operator pins them).
    Static,
}

impl fmt::Display for PlacementMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PlacementMode::Dynamic => "dynamic",
            PlacementMode::Static => "static",
        })
    }
}

impl FromStr for PlacementMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dynamic" => Ok(PlacementMode::Dynamic),
            "static" => Ok(PlacementMode::Static),
            other => Err(format!(
                "unknown placement mode '{other}' (expected dynamic or static)"
            )),
        }
    }
}

fn default_poll_spin_us() -> u64 {
    50
}

fn default_workers() -> String {
    "0".to_string()
}
fn default_control() -> PathBuf {
    PathBuf::from(DEFAULT_CONTROL)
}
fn default_fdb_aging() -> u64 {
    300
}

impl Default for SwitchConfig {
    fn default() -> Self {
        SwitchConfig {
            workers: default_workers(),
            control: default_control(),
            fdb_aging: default_fdb_aging(),
            poll_spin_us: default_poll_spin_us(),
            reserved_cpus: None,
            placement: PlacementMode::default(),
            reservable: default_reservable(),
            http: None,
        }
    }
}

/// The kinds of port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortType {
    /// A kernel TAP interface (namespaces, containers, the host stack).
    Tap,
    /// An internal frame generator and sink, for tests and benchmarks.
    Gen,
    /// A vhost-user socket: QEMU/KVM guests, Cloud Hypervisor, DPDK virtio-user.
    VhostUser,
}

/// Who opens a vhost-user socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VhostMode {
    /// qswitch listens; the frontend connects (QEMU `-chardev socket,...,reconnect=1`).
    Server,
    /// qswitch connects to the frontend's socket (QEMU `server=on`) and reconnects.
    Client,
}

impl FromStr for VhostMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "server" => Ok(VhostMode::Server),
            "client" => Ok(VhostMode::Client),
            other => Err(format!(
                "unknown mode '{other}' (expected server or client)"
            )),
        }
    }
}

impl fmt::Display for PortType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortType::Tap => "tap",
            PortType::Gen => "gen",
            PortType::VhostUser => "vhost-user",
        })
    }
}

impl FromStr for PortType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tap" => Ok(PortType::Tap),
            "gen" => Ok(PortType::Gen),
            "vhost-user" => Ok(PortType::VhostUser),
            other => Err(format!(
                "unknown port type '{other}' (expected tap, gen or vhost-user)"
            )),
        }
    }
}

/// `[[port]]`: one port. Keys that do not apply to the port's type are rejected by
/// [`PortConfig::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortConfig {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: PortType,
    /// TAP: interface name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    /// vhost-user: the socket path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
    /// vhost-user: who opens the socket (default: server).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<VhostMode>,
    /// Number of queues (TAP: IFF_MULTI_QUEUE queues; gen: generator/sink queues;
    /// vhost-user: queue pairs offered, 1..=16).
    #[serde(default = "default_queues")]
    pub queues: u16,
    /// Access VLAN (1..=4094); untagged when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// gen: the port's own MAC address (the source of what it generates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// gen: what to generate; a gen port without it only sinks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<GenConfig>,
    /// CPUs the port's queues may run on (a CPU list, `"2-14:2"`); by default each port
    /// gets a set disjoint from the other ports' wherever the workers allow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<String>,
    /// Port QoS: guarantee, limit and weight of what this port sends toward its VLAN's uplink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosConfig>,
    /// Makes the port an uplink with this capacity (bits/s, e.g. "1G"): the other ports of
    /// its VLAN share it by the QoS rule. At most one uplink per VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<String>,
}

/// `qos = { min = "200M", max = "1G", weight = 2 }` of a port. Every key is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosConfig {
    /// Minimum guarantee, bits/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<String>,
    /// Maximum limit, bits/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<String>,
    /// Relative share of the capacity guarantees leave (1..=1000, default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
}

/// Largest QoS weight.
pub const MAX_WEIGHT: u32 = 1000;

/// Parsed QoS settings of a port: bits/s, `None` = no guarantee / no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosSettings {
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub weight: u32,
}

impl Default for QosSettings {
    fn default() -> Self {
        QosSettings {
            min: None,
            max: None,
            weight: 1,
        }
    }
}

impl QosSettings {
    /// Checks the settings on their own; the message names the key.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_WEIGHT).contains(&self.weight) {
            return Err(format!(
                "qos weight = {} is out of range 1..={MAX_WEIGHT}",
                self.weight
            ));
        }
        if self.max == Some(0) {
            return Err("qos max must be above 0 (leave it out for no limit)".into());
        }
        if let (Some(min), Some(max)) = (self.min, self.max) {
            if min > max {
                return Err(format!(
                    "qos min {} is above max {}",
                    format_rate(min),
                    format_rate(max)
                ));
            }
        }
        Ok(())
    }
}

impl QosConfig {
    /// Parses the rates.
    pub fn settings(&self) -> Result<QosSettings, String> {
        let rate = |key: &str, v: &Option<String>| {
            v.as_deref()
                .map(|s| parse_rate(s).map_err(|m| format!("qos {key}: {m}")))
                .transpose()
        };
        let s = QosSettings {
            min: rate("min", &self.min)?.filter(|&m| m > 0),
            max: rate("max", &self.max)?,
            weight: self.weight.unwrap_or(1),
        };
        s.check()?;
        Ok(s)
    }
}

/// Parses a rate in bits/s: a number with an optional k, M, G or T suffix (powers of 1000),
/// e.g. "150M", "1.5G", "800000".
pub fn parse_rate(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1e3),
        Some((i, 'M')) => (&t[..i], 1e6),
        Some((i, 'G')) => (&t[..i], 1e9),
        Some((i, 'T')) => (&t[..i], 1e12),
        _ => (t, 1.0),
    };
    let bad = || {
        format!("'{s}' is not a rate (a number of bits/s with an optional k, M, G or T suffix, e.g. \"200M\")")
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bps = v * mult;
    if !bps.is_finite() || bps > 1e15 {
        return Err(format!("'{s}' is above the largest rate, 1000T"));
    }
    Ok(bps.round() as u64)
}

/// Formats bits/s with a k/M/G suffix ("150M", "1.5G").
pub fn format_rate(bps: u64) -> String {
    let v = bps as f64;
    let (d, suffix) = if bps >= 1_000_000_000 {
        (1e9, "G")
    } else if bps >= 1_000_000 {
        (1e6, "M")
    } else if bps >= 1000 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let x = v / d;
    if (x - x.round()).abs() < 1e-9 {
        format!("{}{suffix}", x.round())
    } else {
        let n = format!("{x:.3}");
        format!("{}{suffix}", n.trim_end_matches('0').trim_end_matches('.'))
    }
}

fn default_queues() -> u16 {
    1
}

/// `generate = { ... }` of a gen port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenConfig {
    /// Destination MAC of the generated frames.
    pub dst: String,
    /// Frame size in bytes without FCS (60..=9018).
    #[serde(default = "default_gen_size")]
    pub size: u16,
    /// Frames per second over the whole port; 0 = as fast as possible.
    #[serde(default)]
    pub rate: u64,
    /// Number of distinct UDP flows (source ports) to cycle through.
    #[serde(default = "default_flows")]
    pub flows: u16,
    /// Frames to send in total; 0 = unlimited.
    #[serde(default)]
    pub count: u64,
}

fn default_gen_size() -> u16 {
    GEN_MIN_SIZE
}
fn default_flows() -> u16 {
    1
}

/// A configuration that failed to load or validate. The message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("config line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("[switch] workers = \"{value}\": {source}")]
    Workers {
        value: String,
        #[source]
        source: CpuListError,
    },
    #[error("[switch] workers: CPU {cpu} is not present (online CPUs: {online})")]
    CpuNotPresent { cpu: usize, online: String },
    #[error("[switch] fdb_aging must be at least 1 second")]
    FdbAging,
    #[error("[switch] poll_spin_us = {0} is out of range 0..=10000")]
    PollSpin(u64),
    #[error("[switch] http = \"{0}\": expected an IP address and port, e.g. \"127.0.0.1:9470\"")]
    Http(String),
    #[error("[switch] control must be an absolute path, got '{0}'")]
    Control(String),
    #[error("[switch] reserved_cpus = \"{value}\": {source}")]
    Reserved {
        value: String,
        #[source]
        source: CpuListError,
    },
    #[error("[switch] reservable = {0} is out of range (0, 1]")]
    Reservable(String),
    #[error("{0}")]
    Qos(String),
    #[error("port '{name}': {message}")]
    Port { name: String, message: String },
    #[error("duplicate port name '{0}'")]
    DuplicateName(String),
    #[error("duplicate socket '{socket}' (ports '{first}' and '{second}')")]
    DuplicateSocket {
        socket: String,
        first: String,
        second: String,
    },
    #[error("duplicate ifname '{ifname}' (ports '{first}' and '{second}')")]
    DuplicateIfname {
        ifname: String,
        first: String,
        second: String,
    },
}

impl Config {
    /// Parses TOML text. Unknown keys and wrong types are errors naming the line.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| {
                text.as_bytes()[..s.start.min(text.len())]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            });
            ConfigError::Syntax {
                line: line.unwrap_or(1),
                message: e.message().replace('\n', " ").trim().to_string(),
            }
        })
    }

    /// Reads and parses a file.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Config::from_toml(&text)
    }

    /// Checks everything that can be checked before starting, against the machine's online
    /// CPUs. Returns the worker CPUs.
    pub fn validate(&self, online: &[usize]) -> Result<CpuList, ConfigError> {
        let workers = self.switch.workers_list()?;
        if let Some(&cpu) = workers.cpus().iter().find(|c| !online.contains(c)) {
            let online = CpuList::from_cpus(online.iter().copied())
                .map(|l| l.to_string())
                .unwrap_or_default();
            return Err(ConfigError::CpuNotPresent { cpu, online });
        }
        if self.switch.fdb_aging == 0 {
            return Err(ConfigError::FdbAging);
        }
        if self.switch.poll_spin_us > 10_000 {
            return Err(ConfigError::PollSpin(self.switch.poll_spin_us));
        }
        self.switch.reserved_list()?;
        if !self.switch.control.is_absolute() {
            return Err(ConfigError::Control(
                self.switch.control.display().to_string(),
            ));
        }
        self.switch.http_addr()?;
        let mut names = HashSet::new();
        for p in &self.ports {
            p.validate()?;
            if !names.insert(p.name.as_str()) {
                return Err(ConfigError::DuplicateName(p.name.clone()));
            }
        }
        check_ifnames(&self.ports)?;
        if !(self.switch.reservable > 0.0 && self.switch.reservable <= 1.0) {
            return Err(ConfigError::Reservable(self.switch.reservable.to_string()));
        }
        check_qos(&self.ports, self.switch.reservable)?;
        Ok(workers)
    }
}

impl SwitchConfig {
    /// The HTTP server's address, if configured.
    pub fn http_addr(&self) -> Result<Option<std::net::SocketAddr>, ConfigError> {
        self.http
            .as_deref()
            .map(|a| a.parse().map_err(|_| ConfigError::Http(a.to_string())))
            .transpose()
    }

    /// The worker CPUs as a parsed list.
    pub fn workers_list(&self) -> Result<CpuList, ConfigError> {
        self.workers.parse().map_err(|source| ConfigError::Workers {
            value: self.workers.clone(),
            source,
        })
    }

    /// The reserved CPUs (empty when none are).
    pub fn reserved_list(&self) -> Result<Vec<usize>, ConfigError> {
        match &self.reserved_cpus {
            None => Ok(Vec::new()),
            Some(v) => v
                .parse::<CpuList>()
                .map(|l| l.cpus().to_vec())
                .map_err(|source| ConfigError::Reserved {
                    value: v.clone(),
                    source,
                }),
        }
    }
}

/// Fails if two ports name the same TAP interface.
pub fn check_ifnames(ports: &[PortConfig]) -> Result<(), ConfigError> {
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for p in ports {
        if let Some(ifname) = p.ifname.as_deref() {
            if let Some((_, first)) = seen.iter().find(|(i, _)| *i == ifname) {
                return Err(ConfigError::DuplicateIfname {
                    ifname: ifname.to_string(),
                    first: first.to_string(),
                    second: p.name.clone(),
                });
            }
            seen.push((ifname, &p.name));
        }
    }
    let mut sockets: Vec<(&std::path::Path, &str)> = Vec::new();
    for p in ports {
        if let Some(s) = p.socket.as_deref() {
            if let Some((_, first)) = sockets.iter().find(|(x, _)| *x == s) {
                return Err(ConfigError::DuplicateSocket {
                    socket: s.display().to_string(),
                    first: first.to_string(),
                    second: p.name.clone(),
                });
            }
            sockets.push((s, &p.name));
        }
    }
    Ok(())
}

impl PortConfig {
    /// A TAP port with defaults.
    pub fn tap(name: &str, ifname: &str) -> PortConfig {
        PortConfig {
            name: name.to_string(),
            kind: PortType::Tap,
            ifname: Some(ifname.to_string()),
            queues: 1,
            vlan: None,
            mac: None,
            generate: None,
            socket: None,
            mode: None,
            cpus: None,
            qos: None,
            capacity: None,
        }
    }

    /// A vhost-user port with defaults.
    pub fn vhost_user(name: &str, socket: &std::path::Path, mode: VhostMode) -> PortConfig {
        PortConfig {
            name: name.to_string(),
            kind: PortType::VhostUser,
            ifname: None,
            queues: 1,
            vlan: None,
            mac: None,
            generate: None,
            socket: Some(socket.to_path_buf()),
            mode: Some(mode),
            cpus: None,
            qos: None,
            capacity: None,
        }
    }

    /// A gen port that only sinks.
    pub fn gen(name: &str) -> PortConfig {
        PortConfig {
            name: name.to_string(),
            kind: PortType::Gen,
            ifname: None,
            queues: 1,
            vlan: None,
            mac: None,
            generate: None,
            socket: None,
            mode: None,
            cpus: None,
            qos: None,
            capacity: None,
        }
    }

    /// Validates one port on its own (used for the config file and for live `port add`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let err = |message: String| ConfigError::Port {
            name: self.name.clone(),
            message,
        };
        if self.name.is_empty()
            || self.name.len() > 32
            || !self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(ConfigError::Port {
                name: self.name.clone(),
                message: "name must be 1..=32 characters of [A-Za-z0-9._-]".into(),
            });
        }
        if self.queues == 0 || self.queues > MAX_QUEUES {
            return Err(err(format!(
                "queues = {} is out of range 1..={MAX_QUEUES}",
                self.queues
            )));
        }
        if let Some(v) = self.vlan {
            if !(1..=4094).contains(&v) {
                return Err(err(format!("vlan = {v} is out of range 1..=4094")));
            }
        }
        self.cpu_set()?;
        self.qos_settings()?;
        self.capacity_bps()?;
        match self.kind {
            PortType::Tap => {
                let ifname = self
                    .ifname
                    .as_deref()
                    .ok_or_else(|| err("type tap needs ifname".into()))?;
                if ifname.is_empty()
                    || ifname.len() > MAX_IFNAME
                    || ifname
                        .bytes()
                        .any(|b| b == b'/' || b.is_ascii_whitespace() || b == b':')
                    || ifname == "."
                    || ifname == ".."
                {
                    return Err(err(format!(
                        "ifname '{ifname}' is not a valid interface name (1..={MAX_IFNAME} characters, no '/', ':' or spaces)"
                    )));
                }
                if self.mac.is_some() {
                    return Err(err("key 'mac' does not apply to type tap".into()));
                }
                if self.generate.is_some() {
                    return Err(err("key 'generate' does not apply to type tap".into()));
                }
                self.refuse_vhost_keys()?;
            }
            PortType::VhostUser => {
                let socket = self
                    .socket
                    .as_ref()
                    .ok_or_else(|| err("type vhost-user needs socket".into()))?;
                if socket.as_os_str().is_empty() || socket.as_os_str().len() > 107 {
                    return Err(err("socket path must be 1..=107 bytes".into()));
                }
                if self.queues > MAX_VHOST_PAIRS {
                    return Err(err(format!(
                        "queues = {} is out of range 1..={MAX_VHOST_PAIRS} for vhost-user",
                        self.queues
                    )));
                }
                for (key, set) in [
                    ("ifname", self.ifname.is_some()),
                    ("mac", self.mac.is_some()),
                    ("generate", self.generate.is_some()),
                ] {
                    if set {
                        return Err(err(format!(
                            "key '{key}' does not apply to type vhost-user"
                        )));
                    }
                }
            }
            PortType::Gen => {
                if self.ifname.is_some() {
                    return Err(err("key 'ifname' does not apply to type gen".into()));
                }
                self.refuse_vhost_keys()?;
                if let Some(mac) = &self.mac {
                    parse_unicast_mac(mac).map_err(|m| err(format!("mac: {m}")))?;
                }
                if let Some(g) = &self.generate {
                    parse_mac(&g.dst).map_err(|m| err(format!("generate.dst: {m}")))?;
                    if !(GEN_MIN_SIZE..=GEN_MAX_SIZE).contains(&g.size) {
                        return Err(err(format!(
                            "generate.size = {} is out of range {GEN_MIN_SIZE}..={GEN_MAX_SIZE}",
                            g.size
                        )));
                    }
                    if g.flows == 0 {
                        return Err(err("generate.flows must be at least 1".into()));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Fails if a VLAN has two uplinks, or if the guarantees of a VLAN's ports add up to more
/// than `reservable` × its uplink's capacity.
pub fn check_qos(ports: &[PortConfig], reservable: f64) -> Result<(), ConfigError> {
    let mut uplinks: Vec<(u16, &str, u64)> = Vec::new();
    for p in ports {
        if let Some(c) = p.capacity_bps()? {
            let vlan = p.vlan.unwrap_or(0);
            if let Some((_, first, _)) = uplinks.iter().find(|u| u.0 == vlan) {
                return Err(ConfigError::Qos(format!(
                    "ports '{first}' and '{}' are both uplinks (capacity) of VLAN {vlan}; at most one per VLAN",
                    p.name
                )));
            }
            uplinks.push((vlan, &p.name, c));
        }
    }
    for (vlan, up, cap) in uplinks {
        let sum: u64 = ports
            .iter()
            .filter(|p| p.vlan.unwrap_or(0) == vlan && p.capacity.is_none())
            .map(|p| p.qos_settings().map(|s| s.min.unwrap_or(0)))
            .sum::<Result<u64, _>>()?;
        let limit = (reservable * cap as f64) as u64;
        if sum > limit {
            return Err(ConfigError::Qos(format!(
                "the guarantees toward uplink '{up}' add up to {}, above reservable {reservable} x capacity {} = {}",
                format_rate(sum),
                format_rate(cap),
                format_rate(limit)
            )));
        }
    }
    Ok(())
}

impl PortConfig {
    /// The port's CPU set, if it has one.
    pub fn cpu_set(&self) -> Result<Option<Vec<usize>>, ConfigError> {
        self.cpus
            .as_deref()
            .map(|v| {
                v.parse::<CpuList>()
                    .map(|l| l.cpus().to_vec())
                    .map_err(|e| ConfigError::Port {
                        name: self.name.clone(),
                        message: format!("cpus = \"{v}\": {e}"),
                    })
            })
            .transpose()
    }

    /// The port's parsed QoS settings (defaults when it has no `qos`).
    pub fn qos_settings(&self) -> Result<QosSettings, ConfigError> {
        self.qos
            .as_ref()
            .map(QosConfig::settings)
            .transpose()
            .map(Option::unwrap_or_default)
            .map_err(|message| ConfigError::Port {
                name: self.name.clone(),
                message,
            })
    }

    /// The uplink capacity in bits/s, if the port is an uplink.
    pub fn capacity_bps(&self) -> Result<Option<u64>, ConfigError> {
        let Some(c) = self.capacity.as_deref() else {
            return Ok(None);
        };
        let err = |message: String| ConfigError::Port {
            name: self.name.clone(),
            message,
        };
        let bps = parse_rate(c).map_err(|m| err(format!("capacity: {m}")))?;
        if bps == 0 {
            return Err(err("capacity must be above 0".into()));
        }
        if self.qos.is_some() {
            return Err(err(
                "an uplink (capacity) takes no qos; its ports share its capacity".into(),
            ));
        }
        Ok(Some(bps))
    }

    fn refuse_vhost_keys(&self) -> Result<(), ConfigError> {
        for (key, set) in [
            ("socket", self.socket.is_some()),
            ("mode", self.mode.is_some()),
        ] {
            if set {
                return Err(ConfigError::Port {
                    name: self.name.clone(),
                    message: format!("key '{key}' does not apply to type {}", self.kind),
                });
            }
        }
        Ok(())
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<[u8; 6], String> {
    let mut out = [0u8; 6];
    let mut parts = s.split(':');
    for b in out.iter_mut() {
        let p = parts
            .next()
            .ok_or_else(|| format!("'{s}' is not a MAC address"))?;
        if p.len() != 2 {
            return Err(format!("'{s}' is not a MAC address"));
        }
        *b = u8::from_str_radix(p, 16).map_err(|_| format!("'{s}' is not a MAC address"))?;
    }
    if parts.next().is_some() {
        return Err(format!("'{s}' is not a MAC address"));
    }
    Ok(out)
}

/// Parses a MAC address that may be a frame's source (not multicast or broadcast).
pub fn parse_unicast_mac(s: &str) -> Result<[u8; 6], String> {
    let m = parse_mac(s)?;
    if m[0] & 1 != 0 {
        return Err(format!("'{s}' is a multicast address"));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONLINE: &[usize] = &[0, 1];

    fn check(text: &str) -> Result<CpuList, ConfigError> {
        Config::from_toml(text)?.validate(ONLINE)
    }

    #[test]
    fn issue_example_is_valid() {
        let text = r#"
[switch]
workers = "0-1"
control = "/run/qswitch/control.sock"
[[port]]
name = "a"
type = "tap"
ifname = "qs-a"
queues = 2
vlan = 10
"#;
        let cfg = Config::from_toml(text).unwrap();
        assert_eq!(cfg.validate(ONLINE).unwrap().cpus(), &[0, 1]);
        assert_eq!(cfg.ports[0].queues, 2);
        assert_eq!(cfg.ports[0].vlan, Some(10));
        assert_eq!(cfg.switch.fdb_aging, 300);
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let e = check("[switch]\nworkers = \"0\"\nwrokers = \"1\"\n").unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("config line 3:"), "{s}");
        assert!(s.contains("wrokers"), "{s}");
        assert!(!s.contains('\n'));
        let e = check("[[port]]\nname='a'\ntype='tap'\nifname='x'\ncolour='red'\n").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn http_address() {
        let cfg = Config::from_toml("[switch]\nhttp = \"127.0.0.1:9470\"\n").unwrap();
        cfg.validate(ONLINE).unwrap();
        assert_eq!(
            cfg.switch.http_addr().unwrap(),
            Some("127.0.0.1:9470".parse().unwrap())
        );
        assert_eq!(Config::default().switch.http_addr().unwrap(), None);
        assert!(check("[switch]\nhttp = \"[::1]:80\"\n").is_ok());
        for bad in ["localhost:9470", "127.0.0.1", "127.0.0.1:99999", ""] {
            let e = check(&format!("[switch]\nhttp = \"{bad}\"\n")).unwrap_err();
            assert_eq!(e, ConfigError::Http(bad.into()));
            assert!(
                e.to_string().contains("expected an IP address and port"),
                "{e}"
            );
        }
    }

    #[test]
    fn bad_cpu_lists() {
        let e = check("[switch]\nworkers = \"1-0\"\n").unwrap_err();
        assert!(matches!(e, ConfigError::Workers { .. }), "{e}");
        let e = check("[switch]\nworkers = \"0-3\"\n").unwrap_err();
        assert_eq!(
            e,
            ConfigError::CpuNotPresent {
                cpu: 2,
                online: "0-1".into()
            }
        );
        assert!(e.to_string().contains("CPU 2 is not present"));
    }

    #[test]
    fn duplicates() {
        let e = check(
            "[[port]]\nname='a'\ntype='tap'\nifname='x'\n[[port]]\nname='a'\ntype='tap'\nifname='y'\n",
        )
        .unwrap_err();
        assert_eq!(e, ConfigError::DuplicateName("a".into()));
        let e = check(
            "[[port]]\nname='a'\ntype='tap'\nifname='x'\n[[port]]\nname='b'\ntype='tap'\nifname='x'\n",
        )
        .unwrap_err();
        assert!(matches!(e, ConfigError::DuplicateIfname { .. }), "{e}");
    }

    #[test]
    fn queue_and_vlan_ranges() {
        for q in [0, 257] {
            let e = check(&format!(
                "[[port]]\nname='a'\ntype='tap'\nifname='x'\nqueues={q}\n"
            ))
            .unwrap_err();
            assert!(e.to_string().contains("queues"), "{e}");
        }
        let e = check("[[port]]\nname='a'\ntype='tap'\nifname='x'\nvlan=4095\n").unwrap_err();
        assert!(e.to_string().contains("vlan"), "{e}");
        let e = check("[[port]]\nname='a'\ntype='tap'\nifname='x'\nqueues=-1\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    }

    #[test]
    fn type_specific_keys() {
        let e = check("[[port]]\nname='a'\ntype='tap'\n").unwrap_err();
        assert!(e.to_string().contains("needs ifname"), "{e}");
        let e = check("[[port]]\nname='a'\ntype='gen'\nifname='x'\n").unwrap_err();
        assert!(e.to_string().contains("does not apply"), "{e}");
        let e = check("[[port]]\nname='a'\ntype='vxlan'\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
        let e =
            check("[[port]]\nname='a'\ntype='tap'\nifname='this-name-is-too-long'\n").unwrap_err();
        assert!(e.to_string().contains("not a valid interface name"), "{e}");
        let e =
            check("[[port]]\nname='g'\ntype='gen'\ngenerate={dst='ff:ff:ff:ff:ff:ff', size=20}\n")
                .unwrap_err();
        assert!(e.to_string().contains("generate.size"), "{e}");
        let e = check("[[port]]\nname='g'\ntype='gen'\nmac='01:00:5e:00:00:01'\n").unwrap_err();
        assert!(e.to_string().contains("multicast"), "{e}");
    }

    #[test]
    fn gen_port_parses() {
        let cfg = Config::from_toml(
            "[[port]]\nname='g'\ntype='gen'\nqueues=2\nmac='02:00:00:00:00:01'\ngenerate={dst='02:00:00:00:00:02', size=64, rate=1000, flows=4}\n",
        )
        .unwrap();
        cfg.validate(ONLINE).unwrap();
        let g = cfg.ports[0].generate.as_ref().unwrap();
        assert_eq!((g.size, g.rate, g.flows, g.count), (64, 1000, 4, 0));
    }

    #[test]
    fn rates_parse_and_format() {
        assert_eq!(parse_rate("200M"), Ok(200_000_000));
        assert_eq!(parse_rate("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_rate("64k"), Ok(64_000));
        assert_eq!(parse_rate("800000"), Ok(800_000));
        assert_eq!(parse_rate(" 1T "), Ok(1_000_000_000_000));
        for bad in ["", "M", "1.2.3M", "-5M", "1X", "1e9", "10 M", "1Mbit"] {
            assert!(
                parse_rate(bad).unwrap_err().contains("is not a rate"),
                "{bad}"
            );
        }
        assert!(parse_rate("2000T").unwrap_err().contains("largest"));
        assert_eq!(format_rate(150_000_000), "150M");
        assert_eq!(format_rate(1_500_000_000), "1.5G");
        assert_eq!(format_rate(900_000_000), "900M");
        assert_eq!(format_rate(999), "999");
    }

    #[test]
    fn qos_keys_validate() {
        let ok = check(
            "[switch]\nreservable = 0.8\n[[port]]\nname='up'\ntype='tap'\nifname='u'\ncapacity='1G'\n\
             [[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={min='400M', max='1G', weight=2}\n\
             [[port]]\nname='b'\ntype='tap'\nifname='b'\nqos={min='400M'}\n",
        );
        assert!(ok.is_ok(), "{ok:?}");
        let cfg = Config::from_toml(
            "[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={min='400M', max='1G', weight=2}\n",
        )
        .unwrap();
        assert_eq!(
            cfg.ports[0].qos_settings().unwrap(),
            QosSettings {
                min: Some(400_000_000),
                max: Some(1_000_000_000),
                weight: 2
            }
        );
        for (text, needle) in [
            ("[switch]\nreservable = 0.7\n[[port]]\nname='up'\ntype='tap'\nifname='u'\ncapacity='1G'\n[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={min='400M'}\n[[port]]\nname='b'\ntype='tap'\nifname='b'\nqos={min='400M'}\n", "add up to 800M, above reservable 0.7 x capacity 1G = 700M"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={weight=0}\n", "weight = 0 is out of range"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={max='0'}\n", "max must be above 0"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={min='2G', max='1G'}\n", "min 2G is above max 1G"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={max='fast'}\n", "qos max: 'fast' is not a rate"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='0'\n", "capacity must be above 0"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1G'\nqos={max='1G'}\n", "takes no qos"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1G'\n[[port]]\nname='b'\ntype='tap'\nifname='b'\ncapacity='1G'\n", "both uplinks"),
            ("[switch]\nreservable = 0\n", "reservable = 0 is out of range"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={mni='1G'}\n", "mni"),
        ] {
            let e = check(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
            assert!(!e.contains('\n'));
        }
        // Uplinks of different VLANs are independent.
        check("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1G'\n[[port]]\nname='b'\ntype='tap'\nifname='b'\nvlan=5\ncapacity='1G'\n").unwrap();
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(
            parse_mac("02:00:00:00:00:ff").unwrap(),
            [2, 0, 0, 0, 0, 0xff]
        );
        assert!(parse_mac("02:00:00:00:00").is_err());
        assert!(parse_mac("02:00:00:00:00:00:00").is_err());
        assert!(parse_mac("2:00:00:00:00:00").is_err());
        assert!(parse_mac("zz:00:00:00:00:00").is_err());
    }

    #[test]
    fn placement_keys() {
        let cfg = Config::from_toml(
            "[switch]\nworkers='0-1'\nreserved_cpus='0'\nplacement='static'\n[[port]]\nname='a'\ntype='tap'\nifname='x'\ncpus='0-1:1'\n",
        )
        .unwrap();
        cfg.validate(ONLINE).unwrap();
        assert_eq!(cfg.switch.reserved_list().unwrap(), vec![0]);
        assert_eq!(cfg.switch.placement, PlacementMode::Static);
        assert_eq!(cfg.ports[0].cpu_set().unwrap(), Some(vec![0, 1]));
        let e = check("[switch]\nreserved_cpus='x'\n").unwrap_err();
        assert!(e.to_string().starts_with("[switch] reserved_cpus"), "{e}");
        let e = check("[[port]]\nname='a'\ntype='tap'\nifname='x'\ncpus='3-1'\n").unwrap_err();
        assert!(e.to_string().contains("cpus = \"3-1\""), "{e}");
        let e = check("[switch]\nplacement='wild'\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    }
}
