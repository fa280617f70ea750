//! The daemon's TOML configuration, parsed into typed values: a port is one of the
//! [`PortKind`]s, a rate is a [`Rate`], a MAC address a [`MacAddress`], and a value that does not
//! parse is an error that names its line and key. What is left to check after parsing (names,
//! interfaces and sockets used twice, guarantees beyond an uplink's reservable share, CPUs that
//! are not online) is [`Config::validate`]. Every error is one line.
//!
//! ```toml
//! [switch]
//! workers = "0-1"                  # CPUs for datapath workers: "0-3", "2-14:2", "1,3"
//! control = "/run/qswitch/control.sock"
//! fdb_aging = 300                  # seconds a learned MAC lives without traffic
//! reserved_cpus = "0"              # CPUs no queue is placed on (default: none)
//! placement = "dynamic"            # or "static": no moves by load
//! reservable = 0.9                 # QoS: share of an uplink's capacity guarantees may reserve
//! state_dir = "/var/lib/qswitch"   # live changes are recorded here (state.json)
//! control_group = "qswitch"        # control socket 0660 owned by this group (default: 0600); read only
//! admin_group = "qswitch-admin"    # may also change the switch (default: root and qswitch's user)
//! socket_dirs = ["/run/qswitch"]   # where live vhost-user ports' sockets may be (default: control's dir)
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
//! [[port]]
//! name = "up"
//! type = "tap"
//! ifname = "qs-up"
//! capacity = "1G"                  # an uplink: the ports of the VLANs it carries share this rate
//!
//! [[port]]
//! name = "vm1"
//! type = "tap"
//! ifname = "qs-vm1"
//! qos = { min = "200M", max = "1G", weight = 2 }
//!
//! # VLAN trunks, port security, storm control (see `qswitch_dp::policy`), on any port
//! [[port]]
//! name = "vm2"
//! type = "tap"
//! ifname = "qs-vm2"
//! vlan = 10                        # native VLAN (untagged)
//! vlans = "20,30,100-200"          # carried tagged (802.1Q)
//! security = { macs = ["52:54:00:12:34:56"], ips = ["10.0.0.5", "fe80::/64"], mac_limit = 4, dhcp_guard = true, ra_guard = true }
//! storm = { broadcast = 1000, multicast = 5000, unknown_unicast = 1000 }   # frames/s
//! link_local_forward = "stp"       # 01:80:C2:00:00:0X groups relayed from the port (never 1, 2)
//! bpdu_guard = true                # a BPDU from the port disables it until `port enable`
//!
//! # VXLAN (RFC 7348; see `qswitch_dp::port::vxlan`)
//! [[port]]
//! name = "vx100"
//! type = "vxlan"
//! vni = 100
//! local = "192.0.2.1"              # underlay source address (IPv4 or IPv6)
//! remotes = ["192.0.2.2", "192.0.2.3"]  # flood list: head-end replication
//! dstport = 4789                   # default 4789 (Linux's own default is 8472)
//! learning = true                  # remote MAC -> VTEP from received frames (false: only
//!                                  # static/EVPN MACs, from their VTEPs; docs/overlay.md)
//! vlan = 100                       # the switch VLAN this VNI carries
//! # udp_csum = false               # default on (UDP_SEGMENT needs it); off: zero over IPv4
//!
//! [[port]]
//! name = "nic"
//! type = "afxdp"                   # a NIC as an uplink (docs/uplink.md)
//! ifname = "eth1"
//! queues = 2                       # default: every rx queue of the NIC
//! mode = "auto"                    # or native, skb, packet; `port list` shows the one in use
//! vlan = 20
//! lldp = "both"                    # LLDP: rx (default on uplinks), both (also transmit), off
//! ```
//! Rates are bits/s of L2 frames (Ethernet header counted, FCS not) with an
//! optional k/M/G/T suffix (powers of 1000): "150M", "1.5G", "800000".
//!
//! # Design
//! A `[[port]]` table is read as [`PortKeys`]: every key any port kind has, each typed and
//! optional, with unknown keys refused. Reading it directly from the TOML (not through serde's
//! internally tagged enums, which buffer the table and lose the positions, nor `flatten`,
//! which loses `deny_unknown_fields`) keeps the line and key of every bad value. It then
//! becomes a [`PortConfig`] (common keys plus a [`PortKind`] with the kind's own keys), and a
//! key that does not apply to the port's type is an error. The CLI's `port add` flags build the
//! same [`PortKeys`], so they give the same errors. A new port kind (AF_XDP, VXLAN) is a
//! [`PortType`] and a [`PortKind`] variant, its keys in [`PortKeys`] (and in its list of
//! kind-specific keys), and one arm in each direction of the conversion.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::cpulist::CpuList;
pub use crate::policy::{IpPrefix, LinkLocalGroups, SecurityConfig, StormConfig, VlanSet};
pub use crate::value::{
    format_rate, FdbAging, HttpAddr, IfName, MacAddress, PollSpinUs, PortName, Rate, Reservable,
    SocketPath, UnicastMac, VlanId, Weight, MAX_IFNAME,
};

/// Where the control socket lives unless the config says otherwise.
pub const DEFAULT_CONTROL: &str = "/run/qswitch/control.sock";
/// Where live changes are recorded unless `[switch] state_dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/qswitch";
/// Most queues a port may have (the kernel's TAP limit).
pub const MAX_QUEUES: u16 = 256;
/// Most queue pairs a vhost-user port offers.
pub const MAX_VHOST_PAIRS: u16 = 16;
/// Smallest frame a gen port builds: Ethernet + IPv4 + UDP + the 16-byte sequence trailer.
pub const GEN_MIN_SIZE: u16 = 60;
/// Largest frame a gen port builds (a jumbo frame without FCS).
pub const GEN_MAX_SIZE: u16 = 9018;
/// Largest QoS weight.
pub const MAX_WEIGHT: u32 = Weight::MAX;
/// Default `[switch] reservable`.
pub const DEFAULT_RESERVABLE: f64 = Reservable::DEFAULT.get();

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub switch: SwitchConfig,
    #[serde(default, rename = "port")]
    pub ports: Vec<PortConfig>,
    /// `[firewall]`: connection-tracking limits and timeouts (docs/firewall.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firewall: Option<FirewallConfig>,
    /// `[[security_group]]`: the firewall's groups of rules (docs/firewall.md).
    #[serde(
        default,
        rename = "security_group",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub security_groups: Vec<SecurityGroupConfig>,
    /// `[[mirror]]`: port mirroring sessions (docs/visibility.md).
    #[serde(default, rename = "mirror", skip_serializing_if = "Vec::is_empty")]
    pub mirrors: Vec<MirrorConfig>,
}

/// `[[mirror]]`: one mirroring session. Copies of the frames of `sources` (the way
/// `direction` says, of the VLANs `vlans` says) go to a local port, `output`, or to a
/// collector, `remote` (docs/visibility.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorConfig {
    pub name: String,
    /// The ports whose frames are copied.
    pub sources: Vec<String>,
    #[serde(default)]
    pub direction: MirrorDirection,
    /// Only frames of these VLANs (a tagged frame's VID, else the port's native VLAN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlans: Option<VlanSet>,
    /// A local port that receives the copies (SPAN) and nothing else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// A collector the copies are sent to, encapsulated (ERSPAN).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote: Option<MirrorRemote>,
}

/// Which frames of a source port a mirror session copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MirrorDirection {
    /// Frames the port sends into the switch.
    Rx,
    /// Frames the switch delivers to the port.
    Tx,
    #[default]
    Both,
}

impl MirrorDirection {
    pub fn rx(self) -> bool {
        self != MirrorDirection::Tx
    }
    pub fn tx(self) -> bool {
        self != MirrorDirection::Rx
    }
}

impl fmt::Display for MirrorDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MirrorDirection::Rx => "rx",
            MirrorDirection::Tx => "tx",
            MirrorDirection::Both => "both",
        })
    }
}

impl FromStr for MirrorDirection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "rx" => Ok(MirrorDirection::Rx),
            "tx" => Ok(MirrorDirection::Tx),
            "both" => Ok(MirrorDirection::Both),
            _ => Err(format!("direction must be rx, tx or both, got '{s}'")),
        }
    }
}

/// A remote mirror session's collector: `{ type = "erspan", dst = "192.0.2.9", session = 5 }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MirrorRemote {
    /// The encapsulation: `"erspan"` (ERSPAN type II over GRE).
    #[serde(rename = "type")]
    pub kind: RemoteKind,
    /// The collector's IPv4 address.
    pub dst: IpAddr,
    /// The ERSPAN session id, 0..=1023.
    pub session: u16,
    /// The source address of the GRE packets (default: the host's route to `dst`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src: Option<IpAddr>,
    /// The outer TTL (default: the host's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u8>,
}

/// A remote mirror session's encapsulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RemoteKind {
    Erspan,
}

/// Largest ERSPAN session id.
pub const MAX_ERSPAN_SESSION: u16 = 1023;

impl MirrorConfig {
    /// Checks the session against the ports `ports` (names) and the sessions `others` (the
    /// rest of the switch's): a one-line reason when it cannot run.
    pub fn problem<'a>(
        &self,
        ports: &[&str],
        others: impl Iterator<Item = &'a MirrorConfig> + Clone,
    ) -> Result<(), String> {
        if self.name.is_empty() || self.name.len() > 64 || self.name.chars().any(|c| c.is_control())
        {
            return Err(format!("bad mirror name '{}'", self.name.escape_debug()));
        }
        let m = &self.name;
        if others.clone().any(|o| o.name == *m) {
            return Err(format!("duplicate mirror name '{m}'"));
        }
        if self.sources.is_empty() {
            return Err(format!("mirror '{m}': no sources"));
        }
        for s in &self.sources {
            if !ports.contains(&s.as_str()) {
                return Err(format!("mirror '{m}': unknown source port '{s}'"));
            }
            if let Some(o) = others
                .clone()
                .find(|o| o.output.as_deref() == Some(s.as_str()))
            {
                return Err(format!(
                    "mirror '{m}': source port '{s}' is the output of mirror '{}'",
                    o.name
                ));
            }
        }
        if let Some(v) = &self.vlans {
            if v.is_empty() {
                return Err(format!("mirror '{m}': vlans is empty"));
            }
        }
        match (&self.output, &self.remote) {
            (Some(_), Some(_)) => Err(format!("mirror '{m}': both output and remote; choose one")),
            (None, None) => Err(format!("mirror '{m}': no output or remote")),
            (Some(o), None) => {
                if !ports.contains(&o.as_str()) {
                    return Err(format!("mirror '{m}': unknown output port '{o}'"));
                }
                if self.sources.contains(o) {
                    return Err(format!("mirror '{m}': output port '{o}' is also a source"));
                }
                if let Some(x) = others.clone().find(|x| x.sources.contains(o)) {
                    return Err(format!(
                        "mirror '{m}': output port '{o}' is a source of mirror '{}'",
                        x.name
                    ));
                }
                Ok(())
            }
            (None, Some(r)) => {
                if r.session > MAX_ERSPAN_SESSION {
                    return Err(format!(
                        "mirror '{m}': bad session id {} (0..={MAX_ERSPAN_SESSION})",
                        r.session
                    ));
                }
                let usable = |a: &IpAddr| match a {
                    IpAddr::V4(a) => !(a.is_unspecified() || a.is_broadcast() || a.is_multicast()),
                    IpAddr::V6(_) => false,
                };
                if !usable(&r.dst) {
                    return Err(format!(
                        "mirror '{m}': bad remote address {} (a unicast IPv4 address)",
                        r.dst
                    ));
                }
                if let Some(src) = r.src.as_ref().filter(|a| !usable(a)) {
                    return Err(format!(
                        "mirror '{m}': bad remote src {src} (a unicast IPv4 address)"
                    ));
                }
                if r.ttl == Some(0) {
                    return Err(format!("mirror '{m}': remote ttl must be at least 1"));
                }
                Ok(())
            }
        }
    }
}

/// `[switch]`: switch-wide settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchConfig {
    /// CPUs for datapath workers, one pinned worker per CPU.
    #[serde(default = "default_workers")]
    pub workers: CpuList,
    /// The control socket's path (absolute).
    #[serde(default = "default_control")]
    pub control: PathBuf,
    /// Seconds a learned MAC address lives without being seen.
    #[serde(default = "default_fdb_aging")]
    pub fdb_aging: FdbAging,
    /// Microseconds a worker keeps polling after its last frame before it sleeps
    /// (0..=10000). Longer keeps latency and context switches down under bursty load;
    /// shorter leaves more CPU to other processes on small machines.
    #[serde(default = "default_poll_spin_us")]
    pub poll_spin_us: PollSpinUs,
    /// CPUs no queue is ever placed on; none by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_cpus: Option<CpuList>,
    /// How queues are placed on workers: `dynamic` (by measured load) or `static`.
    #[serde(default)]
    pub placement: PlacementMode,
    /// The share (0 < r <= 1) of an uplink's capacity that minimum guarantees may reserve
    /// in total; changes beyond it are refused.
    #[serde(default)]
    pub reservable: Reservable,
    /// Address of the HTTP server (`/metrics`, `/api/...`, the dashboard at `/`), e.g.
    /// "127.0.0.1:9470". Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpAddr>,
    /// Where live changes are recorded (`state.json`) so they survive a restart; default
    /// [`DEFAULT_STATE_DIR`] (or systemd's `$STATE_DIRECTORY`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// A group (name or number) that may use the control socket: it is then created 0660
    /// owned by that group instead of 0600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_group: Option<String>,
    /// Host names the HTTP server answers to besides IP addresses (and `localhost` on a
    /// loopback address); a request naming another host gets 421 (DNS rebinding).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http_hosts: Vec<String>,
    /// The group (name or number) given the vhost-user sockets the switch creates, which
    /// are mode 0660; the daemon's own group when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost_group: Option<String>,
    /// EVPN through FRR: mirror every VXLAN port into a kernel shadow bridge that zebra
    /// watches (local MACs out as type-2 routes, remote MACs and flood lists in); see
    /// docs/overlay.md.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub evpn: bool,
    /// A group (name or number) whose members may change the switch over the control
    /// socket (`port add`, `qos set`, ...), as root and the daemon's own user may.
    /// `control_group` members only read (list, stats, capture, trace). The control socket
    /// is given this group when `control_group` is absent; with both, admins must also be
    /// in `control_group` to reach the socket. See docs/security.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_group: Option<String>,
    /// Directories in which a port added over the control socket may name a vhost-user
    /// socket (absolute, no `..`); default: the control socket's directory. Ports in the
    /// config file are not confined.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub socket_dirs: Vec<PathBuf>,
    /// `[switch.ipfix]`: flow export to an IPFIX collector (see docs/visibility.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipfix: Option<IpfixConfig>,
    /// `[switch.sflow]`: sFlow v5 export to a collector (see docs/visibility.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sflow: Option<SflowConfig>,
}

fn default_workers() -> CpuList {
    CpuList::single(0)
}
fn default_control() -> PathBuf {
    PathBuf::from(DEFAULT_CONTROL)
}
fn default_fdb_aging() -> FdbAging {
    FdbAging::DEFAULT
}
fn default_poll_spin_us() -> PollSpinUs {
    PollSpinUs::DEFAULT
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
            reservable: Reservable::default(),
            http: None,
            state_dir: None,
            control_group: None,
            http_hosts: Vec::new(),
            vhost_group: None,
            evpn: false,
            admin_group: None,
            socket_dirs: Vec::new(),
            ipfix: None,
            sflow: None,
        }
    }
}

impl SwitchConfig {
    /// The directories a live port's vhost-user socket must be in: `socket_dirs`, or the
    /// control socket's directory when none are given.
    pub fn socket_dir_list(&self) -> Vec<PathBuf> {
        if !self.socket_dirs.is_empty() {
            return self.socket_dirs.clone();
        }
        self.control
            .parent()
            .map(|d| vec![d.to_path_buf()])
            .unwrap_or_default()
    }

    /// The reserved CPUs (empty when none are).
    pub fn reserved_list(&self) -> Vec<usize> {
        self.reserved_cpus
            .as_ref()
            .map_or_else(Vec::new, |l| l.cpus().to_vec())
    }
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

/// The kinds of port: the `type` key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortType {
    /// A kernel TAP interface (namespaces, containers, the host stack).
    Tap,
    /// An internal frame generator and sink, for tests and benchmarks.
    Gen,
    /// A vhost-user socket: QEMU/KVM guests, Cloud Hypervisor, DPDK virtio-user.
    VhostUser,
    /// A VXLAN tunnel endpoint (RFC 7348): one VNI to remote VTEPs over an IP underlay.
    Vxlan,
    /// A kernel interface (a NIC) as an uplink through AF_XDP, or AF_PACKET as the fallback.
    Afxdp,
    /// The root-namespace end of a veth pair (a container's or namespace's interface), with
    /// a kernel fast path for known unicast between veth ports.
    Veth,
    /// A port made of member ports (NIC teaming): active-backup, balance-slb or
    /// balance-tcp, with LACP (see docs/teaming.md).
    Bond,
}

impl fmt::Display for PortType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortType::Tap => "tap",
            PortType::Gen => "gen",
            PortType::VhostUser => "vhost-user",
            PortType::Vxlan => "vxlan",
            PortType::Afxdp => "afxdp",
            PortType::Veth => "veth",
            PortType::Bond => "bond",
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
            "vxlan" => Ok(PortType::Vxlan),
            "afxdp" => Ok(PortType::Afxdp),
            "veth" => Ok(PortType::Veth),
            "bond" => Ok(PortType::Bond),
            other => Err(format!(
                "unknown port type '{other}' (expected tap, gen, vhost-user, vxlan, afxdp, veth \
                 or bond)"
            )),
        }
    }
}

/// Who opens a vhost-user socket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VhostMode {
    /// qswitch listens; the frontend connects (QEMU `-chardev socket,...,reconnect=1`).
    #[default]
    Server,
    /// qswitch connects to the frontend's socket (QEMU `server=on`) and reconnects.
    Client,
}

impl fmt::Display for VhostMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            VhostMode::Server => "server",
            VhostMode::Client => "client",
        })
    }
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

/// The data path of an afxdp port (see `qswitch_dp::port::afxdp`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum XdpMode {
    /// Native XDP (zero-copy, then copy), generic XDP, AF_PACKET: the first that works.
    #[default]
    Auto,
    /// XDP in the driver only.
    Native,
    /// Generic XDP (on the skb) only.
    Skb,
    /// AF_PACKET only.
    Packet,
}

impl fmt::Display for XdpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            XdpMode::Auto => "auto",
            XdpMode::Native => "native",
            XdpMode::Skb => "skb",
            XdpMode::Packet => "packet",
        })
    }
}

/// The values of the `mode` key, which two port types have: vhost-user's
/// (`server`, `client`) and afxdp's (`auto`, `native`, `skb`, `packet`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeKey {
    Server,
    Client,
    Auto,
    Native,
    Skb,
    Packet,
    ActiveBackup,
    BalanceSlb,
    BalanceTcp,
}

impl ModeKey {
    fn bond(self) -> Option<BondMode> {
        match self {
            ModeKey::ActiveBackup => Some(BondMode::ActiveBackup),
            ModeKey::BalanceSlb => Some(BondMode::BalanceSlb),
            ModeKey::BalanceTcp => Some(BondMode::BalanceTcp),
            _ => None,
        }
    }

    fn vhost(self) -> Option<VhostMode> {
        match self {
            ModeKey::Server => Some(VhostMode::Server),
            ModeKey::Client => Some(VhostMode::Client),
            _ => None,
        }
    }

    fn xdp(self) -> Option<XdpMode> {
        match self {
            ModeKey::Auto => Some(XdpMode::Auto),
            ModeKey::Native => Some(XdpMode::Native),
            ModeKey::Skb => Some(XdpMode::Skb),
            ModeKey::Packet => Some(XdpMode::Packet),
            _ => None,
        }
    }
}

impl From<VhostMode> for ModeKey {
    fn from(m: VhostMode) -> ModeKey {
        match m {
            VhostMode::Server => ModeKey::Server,
            VhostMode::Client => ModeKey::Client,
        }
    }
}

impl From<BondMode> for ModeKey {
    fn from(m: BondMode) -> ModeKey {
        match m {
            BondMode::ActiveBackup => ModeKey::ActiveBackup,
            BondMode::BalanceSlb => ModeKey::BalanceSlb,
            BondMode::BalanceTcp => ModeKey::BalanceTcp,
        }
    }
}

impl From<XdpMode> for ModeKey {
    fn from(m: XdpMode) -> ModeKey {
        match m {
            XdpMode::Auto => ModeKey::Auto,
            XdpMode::Native => ModeKey::Native,
            XdpMode::Skb => ModeKey::Skb,
            XdpMode::Packet => ModeKey::Packet,
        }
    }
}

impl fmt::Display for ModeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.vhost(), self.xdp(), self.bond()) {
            (Some(v), _, _) => v.fmt(f),
            (_, Some(x), _) => x.fmt(f),
            (_, _, Some(b)) => b.fmt(f),
            _ => unreachable!("every mode is one of the three"),
        }
    }
}

impl FromStr for ModeKey {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "server" => Ok(ModeKey::Server),
            "client" => Ok(ModeKey::Client),
            "auto" => Ok(ModeKey::Auto),
            "native" => Ok(ModeKey::Native),
            "skb" => Ok(ModeKey::Skb),
            "packet" => Ok(ModeKey::Packet),
            "active-backup" => Ok(ModeKey::ActiveBackup),
            "balance-slb" => Ok(ModeKey::BalanceSlb),
            "balance-tcp" => Ok(ModeKey::BalanceTcp),
            other => Err(format!(
                "unknown mode '{other}' (vhost-user: server or client; afxdp: auto, native, \
                 skb or packet; bond: active-backup, balance-slb or balance-tcp)"
            )),
        }
    }
}

/// `[[port]]`: one port. Read from and written as [`PortKeys`], so a deserialized
/// `PortConfig` has passed [`PortConfig::validate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "PortKeys", into = "PortKeys")]
pub struct PortConfig {
    /// 1..=32 characters of `[A-Za-z0-9._-]` (see [`PortName`]).
    pub name: String,
    /// Number of queues (TAP: IFF_MULTI_QUEUE queues; gen: generator/sink queues;
    /// vhost-user: queue pairs offered, 1..=16).
    pub queues: u16,
    /// Access VLAN; untagged when absent.
    pub vlan: Option<VlanId>,
    /// CPUs the port's queues may run on; by default each port gets a set disjoint from the
    /// other ports' wherever the workers allow.
    pub cpus: Option<CpuList>,
    /// Port QoS: guarantee, limit and weight of what this port sends toward its uplink (the
    /// uplink it has a VLAN in common with).
    pub qos: Option<QosConfig>,
    /// Makes the port an uplink with this capacity: the ports it has a VLAN in common with
    /// (its native VLAN and those it carries tagged) share it by the QoS rule. No two uplinks
    /// carry a VLAN in common; an uplink takes no `qos`.
    pub capacity: Option<Rate>,
    /// VLANs the port carries tagged (a trunk); `vlan` stays its native (untagged) VLAN, and
    /// a trunk without `vlan` takes no untagged frames.
    pub vlans: Option<VlanSet>,
    /// Port security: allowed source MACs and IPs, MAC limit, DHCP and RA guards (boxed:
    /// most ports have none, and a config travels in control requests).
    pub security: Option<Box<SecurityConfig>>,
    /// Storm control: frames/s of broadcast, multicast and unknown unicast.
    pub storm: Option<Box<StormConfig>>,
    /// Who made the port, when an orchestrator did (`qswitch-cni`): shown in `port list`,
    /// kept across restarts like every other key (boxed: most ports have none).
    pub owner: Option<Box<PortOwner>>,
    /// IEEE 802.1D link-local groups (01:80:C2:00:00:0X) relayed from the port, as Linux's
    /// `group_fwd_mask`; the others are never relayed (`qswitch_dp::link_local`).
    pub link_local_forward: Option<LinkLocalGroups>,
    /// A BPDU (01:80:C2:00:00:00) from the port disables it until `qswitch port enable`.
    pub bpdu_guard: bool,
    /// The kind of port and its own keys.
    pub kind: PortKind,
    /// Names of the `[[security_group]]`s that filter the port; empty: not filtered.
    pub security_groups: Vec<String>,
    /// Most tracked connections of the port (default: only the switch-wide limit).
    pub max_sessions: Option<u32>,
    /// LLDP on the port (`qswitch_dp::lldp`); `None`: the default, [`LldpMode::Rx`] on an
    /// uplink (afxdp, or a port with `capacity`), off elsewhere ([`PortConfig::lldp_mode`]).
    pub lldp: Option<LldpMode>,
}

/// `lldp = "rx" | "both" | "off"`: what a port does with IEEE 802.1AB LLDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LldpMode {
    /// Neither receive nor transmit.
    Off,
    /// Receive: neighbours are kept and shown (`qswitch lldp`).
    Rx,
    /// Receive, and transmit this switch's LLDPDUs every 30 s.
    Both,
}

impl fmt::Display for LldpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LldpMode::Off => "off",
            LldpMode::Rx => "rx",
            LldpMode::Both => "both",
        })
    }
}

impl FromStr for LldpMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(LldpMode::Off),
            "rx" => Ok(LldpMode::Rx),
            "both" => Ok(LldpMode::Both),
            other => Err(format!(
                "unknown lldp mode '{other}' (expected rx, both or off)"
            )),
        }
    }
}

/// `owner = { cni = "NETWORK", container = "ID", ifname = "eth0" }`: the CNI attachment a
/// port belongs to. `qswitch-cni` sets it on the ports it adds and finds them again by it
/// (CHECK, DEL, GC); the switch only keeps and shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortOwner {
    /// The CNI network's `name`.
    pub cni: String,
    /// `CNI_CONTAINERID`.
    pub container: String,
    /// `CNI_IFNAME`: the interface's name in the container.
    pub ifname: String,
}

/// A port's kind, with the keys only that kind has.
#[derive(Debug, Clone, PartialEq)]
pub enum PortKind {
    /// `type = "tap"`.
    Tap(TapConfig),
    /// `type = "vhost-user"`.
    VhostUser(VhostUserConfig),
    /// `type = "gen"`.
    Gen(GenPortConfig),
    /// `type = "vxlan"`.
    Vxlan(VxlanConfig),
    /// `type = "afxdp"`.
    AfXdp(AfXdpConfig),
    /// `type = "veth"`.
    Veth(VethConfig),
    /// `type = "bond"`.
    Bond(BondConfig),
}

/// How a bond spreads traffic over its members (the `mode` key of a bond).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BondMode {
    /// One member carries everything; the next takes over when it fails.
    #[default]
    ActiveBackup,
    /// Flows spread by source MAC and VLAN; switch-independent (no LAG on the switch).
    BalanceSlb,
    /// Flows spread by L2-L4 hash; needs LACP.
    BalanceTcp,
}

impl fmt::Display for BondMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BondMode::ActiveBackup => "active-backup",
            BondMode::BalanceSlb => "balance-slb",
            BondMode::BalanceTcp => "balance-tcp",
        })
    }
}

/// A bond's `lacp` key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LacpMode {
    /// No LACP: members carry traffic while their carrier is up.
    #[default]
    Off,
    /// Sends LACPDUs whether the partner does or not.
    Active,
    /// Answers a partner's LACPDUs only (two passive sides never form).
    Passive,
}

impl fmt::Display for LacpMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LacpMode::Off => "off",
            LacpMode::Active => "active",
            LacpMode::Passive => "passive",
        })
    }
}

/// A bond's `lacp_rate` key: how often the partner is asked to send LACPDUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LacpRate {
    /// Every 30 s (timeout 90 s).
    #[default]
    Slow,
    /// Every second (timeout 3 s).
    Fast,
}

impl fmt::Display for LacpRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LacpRate::Slow => "slow",
            LacpRate::Fast => "fast",
        })
    }
}

/// One member of a bond, `{ type = "afxdp", ifname = "eth1" }`: its own port type (afxdp,
/// tap or veth) and that type's keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BondMember {
    #[serde(rename = "type")]
    pub kind: PortType,
    pub ifname: IfName,
    /// afxdp: the data path (default auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ModeKey>,
    /// afxdp: AF_XDP sockets (default every NIC queue); tap, veth: queues (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    /// veth: the kernel fast path (default false in a bond: frames must pass the bond).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastpath: Option<bool>,
}

impl BondMember {
    /// The member as a port of its own type (named after its interface), or why it cannot be
    /// one.
    pub fn port(&self) -> Result<PortConfig, PortError> {
        let ty = self.kind;
        if !matches!(ty, PortType::Afxdp | PortType::Tap | PortType::Veth) {
            return Err(PortError::MemberType(ty));
        }
        let mut k = PortKeys::new(PortName::unchecked(self.ifname.to_string()), ty);
        k.ifname = Some(self.ifname.clone());
        k.mode = self.mode;
        k.queues = self.queues;
        k.fastpath = match ty {
            PortType::Veth => Some(self.fastpath.unwrap_or(false)),
            _ => self.fastpath,
        };
        let queues = k.queues.unwrap_or_else(default_queues);
        check_queues(queues, ty)?;
        let kind = k.take_kind()?;
        let mut p = PortConfig::new(&self.ifname.to_string(), kind);
        p.queues = queues;
        Ok(p)
    }
}

/// The keys of a bond port (see docs/teaming.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BondConfig {
    pub mode: BondMode,
    pub lacp: LacpMode,
    pub lacp_rate: LacpRate,
    /// In order: in active-backup the first is the primary.
    pub members: Vec<BondMember>,
    /// Milliseconds a member's carrier must stay up before it carries traffic (default 0).
    pub updelay: u32,
    /// Milliseconds a member's carrier must stay down before it stops (default 0).
    pub downdelay: u32,
    /// With LACP on and no partner answering: carry traffic active-backup rather than none
    /// (default false).
    pub lacp_fallback: bool,
}

/// The keys of a veth port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VethConfig {
    /// The root-namespace end of an existing veth pair (the other end is the namespace's or
    /// container's interface).
    pub ifname: IfName,
    /// Forward known unicast between veth ports in the kernel (default true); see
    /// `qswitch_dp::port::veth`.
    pub fastpath: bool,
}

/// The keys of an afxdp port. Its [`PortConfig::queues`] is the number of queues in use,
/// which the switch sets when it opens the interface; `queues` here is what was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfXdpConfig {
    /// The kernel interface (NIC) to attach to; it must exist.
    pub ifname: IfName,
    /// AF_XDP sockets, one per NIC rx queue: at most the NIC's queue count, which is the
    /// default (`None`).
    pub queues: Option<u16>,
    /// The data path (default: auto).
    pub mode: XdpMode,
}

/// The keys of a VXLAN port. The VLAN the VNI carries is the port's `vlan`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanConfig {
    /// The VNI, 0..=16777215.
    pub vni: u32,
    /// The local underlay address: outer source, and where the port listens.
    pub local: IpAddr,
    /// The static flood list (head-end replication of broadcast, multicast and unknown
    /// unicast); same address family as `local`.
    pub remotes: Vec<IpAddr>,
    /// UDP destination port (default 4789, the IANA port; Linux's own default is 8472).
    pub dstport: u16,
    /// Learn remote MAC → VTEP from received frames (default true; only frames from `remotes`
    /// or EVPN VTEPs move a MAC the switch knows elsewhere). When false, frames from VTEPs not
    /// in `remotes` (or known through EVPN) are dropped, and the switch learns only MACs that
    /// static or EVPN entries put behind the sending VTEP.
    pub learning: bool,
    /// UDP checksum on transmit; default on over both families (the kernel refuses
    /// `UDP_SEGMENT`, the batched send of TSO frames, without it). Off: zero over IPv4 (as
    /// Linux's vxlan sends by default), TSO frames sent as single datagrams.
    pub udp_csum: Option<bool>,
}

impl VxlanConfig {
    /// `vni` over `local`: no remotes, port [`VXLAN_PORT`], learning on, default checksums.
    pub fn new(vni: u32, local: IpAddr) -> VxlanConfig {
        VxlanConfig {
            vni,
            local,
            remotes: Vec::new(),
            dstport: VXLAN_PORT,
            learning: true,
            udp_csum: None,
        }
    }
}

/// The default VXLAN UDP port (IANA).
pub const VXLAN_PORT: u16 = 4789;
/// The largest VNI.
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// The keys of a TAP port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapConfig {
    /// The interface: created, or attached to if a persistent TAP of that name exists.
    pub ifname: IfName,
}

/// The keys of a vhost-user port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostUserConfig {
    /// The socket path.
    pub socket: SocketPath,
    /// Who opens the socket (default: server).
    pub mode: VhostMode,
}

/// The keys of a gen port.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GenPortConfig {
    /// The port's own MAC address (the source of what it generates); derived from the name
    /// when absent.
    pub mac: Option<UnicastMac>,
    /// What to generate; a gen port without it only sinks.
    pub generate: Option<GenConfig>,
}

impl PortKind {
    /// The `type` key.
    pub fn port_type(&self) -> PortType {
        match self {
            PortKind::Tap(_) => PortType::Tap,
            PortKind::VhostUser(_) => PortType::VhostUser,
            PortKind::Gen(_) => PortType::Gen,
            PortKind::Vxlan(_) => PortType::Vxlan,
            PortKind::AfXdp(_) => PortType::Afxdp,
            PortKind::Veth(_) => PortType::Veth,
            PortKind::Bond(_) => PortType::Bond,
        }
    }
}

impl fmt::Display for PortKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.port_type().fmt(f)
    }
}

/// `generate = { ... }` of a gen port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenConfig {
    /// Destination MAC of the generated frames (may be broadcast or multicast).
    pub dst: MacAddress,
    /// Frame size in bytes without FCS (60..=9018).
    #[serde(default = "default_gen_size")]
    pub size: u16,
    /// Frames per second over the whole port; 0 = as fast as possible.
    #[serde(default)]
    pub rate: u64,
    /// Number of distinct UDP flows (source ports) to cycle through (at least 1).
    #[serde(default = "default_flows")]
    pub flows: u16,
    /// Frames to send in total; 0 = unlimited.
    #[serde(default)]
    pub count: u64,
    /// The frames' IPv4 addresses and which UDP port the flows vary (default: from
    /// 198.18.<port id> to 198.19.0.1, flows in the source port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<GenIp>,
}

/// `ip = { src = "10.9.0.1", dst = "10.9.0.2", reply = false }` of a gen port's `generate`:
/// two gen ports with mirrored addresses, one of them `reply = true`, send the two directions
/// of the same UDP connections (what a stateful firewall tracks as one connection each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenIp {
    pub src: std::net::Ipv4Addr,
    pub dst: std::net::Ipv4Addr,
    /// The replies: from UDP port 5001 to the flow's port (1024 + flow), where the other
    /// direction goes from the flow's port to 5001.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reply: bool,
}

fn default_gen_size() -> u16 {
    GEN_MIN_SIZE
}
fn default_flows() -> u16 {
    1
}

/// `qos = { min = "200M", max = "1G", weight = 2 }` of a port. Every key is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosConfig {
    /// Minimum guarantee; "0" is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<Rate>,
    /// Maximum limit (above 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<Rate>,
    /// Relative share of the capacity guarantees leave (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<Weight>,
}

impl QosConfig {
    /// The settings as the datapath keeps them.
    pub fn settings(&self) -> QosSettings {
        QosSettings {
            min: self.min.map(Rate::bps).filter(|&m| m > 0),
            max: self.max.map(Rate::bps),
            weight: self.weight.map_or(1, Weight::get),
        }
    }
}

/// A port's QoS settings as the datapath keeps and changes them: bits/s, `None` = no
/// guarantee / no limit.
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

/// QoS settings that do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QosError {
    #[error("qos weight = {0} is out of range 1..={MAX_WEIGHT}")]
    Weight(u32),
    #[error("qos max must be above 0 (leave it out for no limit)")]
    ZeroMax,
    #[error("qos min {} is above max {}", format_rate(*.min), format_rate(*.max))]
    MinAboveMax { min: u64, max: u64 },
}

impl QosSettings {
    /// The settings as a port's `qos` table (`None` for the defaults), the inverse of
    /// [`QosConfig::settings`].
    pub fn to_config(self) -> Option<QosConfig> {
        if self == QosSettings::default() {
            return None;
        }
        Some(QosConfig {
            min: self.min.map(Rate::from_bps),
            max: self.max.map(Rate::from_bps),
            weight: (self.weight != 1)
                .then(|| Weight::try_from(self.weight).ok())
                .flatten(),
        })
    }

    /// Checks the settings on their own (a live change builds them from plain numbers).
    pub fn check(&self) -> Result<(), QosError> {
        if Weight::try_from(self.weight).is_err() {
            return Err(QosError::Weight(self.weight));
        }
        if self.max == Some(0) {
            return Err(QosError::ZeroMax);
        }
        if let (Some(min), Some(max)) = (self.min, self.max) {
            if min > max {
                return Err(QosError::MinAboveMax { min, max });
            }
        }
        Ok(())
    }
}

/// Why a port's keys do not make a port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    #[error("lldp needs a kernel interface (afxdp, tap, veth, or a bond's members), not type {0}")]
    Lldp(PortType),
    #[error("type {kind} needs {key}")]
    Missing { kind: PortType, key: &'static str },
    #[error("key '{key}' does not apply to type {kind}")]
    NotApplicable { kind: PortType, key: &'static str },
    #[error(
        "name must be 1..={} characters of [A-Za-z0-9._-]",
        crate::value::MAX_PORT_NAME
    )]
    Name,
    #[error("mode '{mode}' does not apply to type {kind} (expected {expected})")]
    Mode {
        mode: ModeKey,
        kind: PortType,
        expected: &'static str,
    },
    #[error("queues = {queues} is out of range 1..={max} for type {kind}")]
    Queues {
        queues: u16,
        max: u16,
        kind: PortType,
    },
    #[error("generate.size = {0} is out of range {GEN_MIN_SIZE}..={GEN_MAX_SIZE}")]
    GenSize(u16),
    #[error("generate.flows must be at least 1")]
    GenFlows,
    #[error("vni = {0} is out of range 0..={MAX_VNI}")]
    Vni(u32),
    #[error("remote {remote} is not of the address family of local {local}")]
    VxlanFamily { local: IpAddr, remote: IpAddr },
    #[error("dstport must not be 0")]
    ZeroDstport,
    #[error("capacity must be above 0")]
    ZeroCapacity,
    #[error("an uplink (capacity) takes no qos; its ports share its capacity")]
    UplinkQos,
    #[error(transparent)]
    Qos(#[from] QosError),
    #[error(transparent)]
    Range(#[from] crate::value::RangeError),
    #[error("max_sessions must be at least 1")]
    MaxSessions,
    #[error("a bond needs at least one member")]
    NoMembers,
    #[error("a bond member is of type afxdp, tap or veth, not {0}")]
    MemberType(PortType),
    #[error("mode balance-tcp needs lacp = \"active\" or \"passive\"")]
    TcpNeedsLacp,
    #[error("interface '{0}' is a member twice")]
    MemberTwice(String),
    #[error("bond member '{ifname}': {problem}")]
    Member {
        ifname: String,
        problem: Box<PortError>,
    },
}

/// Every key a `[[port]]` table may have, typed, with unknown keys refused: the form a port
/// has in the config file, in the control protocol's `port-add` and on the CLI. Which keys
/// apply depends on `type`; `PortConfig::try_from` sorts them into a [`PortKind`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortKeys {
    pub name: PortName,
    #[serde(rename = "type")]
    pub kind: PortType,
    /// tap, afxdp, veth: the interface name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ifname: Option<IfName>,
    /// vhost-user: the socket path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<SocketPath>,
    /// vhost-user: who opens the socket (default: server); afxdp: the data path (default:
    /// auto).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ModeKey>,
    /// Default 1; afxdp: the NIC's rx queue count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<VlanId>,
    /// gen: the port's own MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<UnicastMac>,
    /// gen: what to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generate: Option<GenConfig>,
    /// vxlan: the VNI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vni: Option<u32>,
    /// vxlan: the local underlay address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local: Option<IpAddr>,
    /// vxlan: the static flood list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remotes: Option<Vec<IpAddr>>,
    /// vxlan: the UDP destination port (default 4789).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dstport: Option<u16>,
    /// vxlan: learn remote MACs (default true; false: the switch learns only MACs that static
    /// or EVPN entries put behind the sending VTEP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub learning: Option<bool>,
    /// vxlan: UDP checksum on transmit (default on; see [`VxlanConfig::udp_csum`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_csum: Option<bool>,
    /// veth: the kernel fast path (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastpath: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<CpuList>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<QosConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Rate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlans: Option<VlanSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<SecurityConfig>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm: Option<StormConfig>,
    /// The CNI attachment that made the port (see [`PortOwner`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<PortOwner>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_local_forward: Option<LinkLocalGroups>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpdu_guard: Option<bool>,
    /// The security groups that filter the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_groups: Option<Vec<String>>,
    /// Most tracked connections of the port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// LLDP: rx, both or off (default: rx on uplinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lldp: Option<LldpMode>,
    /// bond: LACP off, active or passive (default off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lacp: Option<LacpMode>,
    /// bond: LACP rate asked of the partner (default slow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lacp_rate: Option<LacpRate>,
    /// bond: carry traffic active-backup when no LACP partner answers (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lacp_fallback: Option<bool>,
    /// bond: its member ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<Vec<BondMember>>,
    /// bond: ms a member's carrier stays up before it carries traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updelay: Option<u32>,
    /// bond: ms a member's carrier stays down before it stops carrying traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downdelay: Option<u32>,
}

fn default_queues() -> u16 {
    1
}

/// Fails if a port of type `t` cannot have `queues` queues.
fn check_queues(queues: u16, t: PortType) -> Result<(), PortError> {
    let max = match t {
        PortType::VhostUser => MAX_VHOST_PAIRS,
        PortType::Tap | PortType::Gen | PortType::Afxdp | PortType::Veth => MAX_QUEUES,
        PortType::Vxlan => 1,
        // The sum of its members' (set when the bond opens); not a key of its own.
        PortType::Bond => u16::MAX,
    };
    if queues == 0 || queues > max {
        return Err(PortError::Queues {
            queues,
            max,
            kind: t,
        });
    }
    Ok(())
}

impl PortKeys {
    /// A port of type `kind` with no optional keys.
    pub fn new(name: PortName, kind: PortType) -> PortKeys {
        PortKeys {
            name,
            kind,
            ifname: None,
            socket: None,
            mode: None,
            queues: None,
            vlan: None,
            mac: None,
            generate: None,
            vni: None,
            local: None,
            remotes: None,
            dstport: None,
            learning: None,
            udp_csum: None,
            fastpath: None,
            cpus: None,
            qos: None,
            capacity: None,
            vlans: None,
            security: None,
            storm: None,
            owner: None,
            link_local_forward: None,
            bpdu_guard: None,
            security_groups: None,
            max_sessions: None,
            lldp: None,
            lacp: None,
            lacp_rate: None,
            lacp_fallback: None,
            members: None,
            updelay: None,
            downdelay: None,
        }
    }
}

impl PortKeys {
    /// The first kind-specific key that is set, by name. The kind's own keys are taken out
    /// first, so what is left does not apply to the port's type.
    fn kind_key_left(&self) -> Option<&'static str> {
        [
            ("ifname", self.ifname.is_some()),
            ("socket", self.socket.is_some()),
            ("mode", self.mode.is_some()),
            ("mac", self.mac.is_some()),
            ("generate", self.generate.is_some()),
            ("vni", self.vni.is_some()),
            ("local", self.local.is_some()),
            ("remotes", self.remotes.is_some()),
            ("dstport", self.dstport.is_some()),
            ("learning", self.learning.is_some()),
            ("udp_csum", self.udp_csum.is_some()),
            ("fastpath", self.fastpath.is_some()),
            ("lacp", self.lacp.is_some()),
            ("lacp_rate", self.lacp_rate.is_some()),
            ("lacp_fallback", self.lacp_fallback.is_some()),
            ("members", self.members.is_some()),
            ("updelay", self.updelay.is_some()),
            ("downdelay", self.downdelay.is_some()),
        ]
        .into_iter()
        .find_map(|(key, set)| set.then_some(key))
    }

    /// Takes the keys of the port's type out into its [`PortKind`].
    fn take_kind(&mut self) -> Result<PortKind, PortError> {
        let t = self.kind;
        let missing = |key| PortError::Missing { kind: t, key };
        let kind = match t {
            PortType::Tap => PortKind::Tap(TapConfig {
                ifname: self.ifname.take().ok_or_else(|| missing("ifname"))?,
            }),
            PortType::VhostUser => PortKind::VhostUser(VhostUserConfig {
                socket: self.socket.take().ok_or_else(|| missing("socket"))?,
                mode: match self.mode.take() {
                    None => VhostMode::default(),
                    Some(m) => m.vhost().ok_or(PortError::Mode {
                        mode: m,
                        kind: t,
                        expected: "server or client",
                    })?,
                },
            }),
            PortType::Afxdp => PortKind::AfXdp(AfXdpConfig {
                ifname: self.ifname.take().ok_or_else(|| missing("ifname"))?,
                queues: self.queues,
                mode: match self.mode.take() {
                    None => XdpMode::default(),
                    Some(m) => m.xdp().ok_or(PortError::Mode {
                        mode: m,
                        kind: t,
                        expected: "auto, native, skb or packet",
                    })?,
                },
            }),
            PortType::Veth => PortKind::Veth(VethConfig {
                ifname: self.ifname.take().ok_or_else(|| missing("ifname"))?,
                fastpath: self.fastpath.take().unwrap_or(true),
            }),
            PortType::Gen => PortKind::Gen(GenPortConfig {
                mac: self.mac.take(),
                generate: self.generate.take(),
            }),
            PortType::Vxlan => PortKind::Vxlan(VxlanConfig {
                vni: self.vni.take().ok_or_else(|| missing("vni"))?,
                local: self.local.take().ok_or_else(|| missing("local"))?,
                remotes: self.remotes.take().unwrap_or_default(),
                dstport: self.dstport.take().unwrap_or(VXLAN_PORT),
                learning: self.learning.take().unwrap_or(true),
                udp_csum: self.udp_csum.take(),
            }),
            PortType::Bond => PortKind::Bond(BondConfig {
                mode: match self.mode.take() {
                    None => BondMode::default(),
                    Some(m) => m.bond().ok_or(PortError::Mode {
                        mode: m,
                        kind: t,
                        expected: "active-backup, balance-slb or balance-tcp",
                    })?,
                },
                lacp: self.lacp.take().unwrap_or_default(),
                lacp_rate: self.lacp_rate.take().unwrap_or_default(),
                lacp_fallback: self.lacp_fallback.take().unwrap_or(false),
                members: self.members.take().unwrap_or_default(),
                updelay: self.updelay.take().unwrap_or(0),
                downdelay: self.downdelay.take().unwrap_or(0),
            }),
        };
        match self.kind_key_left() {
            Some(key) => Err(PortError::NotApplicable { kind: t, key }),
            None => Ok(kind),
        }
    }
}

impl TryFrom<PortKeys> for PortConfig {
    type Error = ConfigError;

    fn try_from(mut k: PortKeys) -> Result<PortConfig, ConfigError> {
        let queues = k.queues.unwrap_or_else(default_queues);
        if k.kind == PortType::Bond && k.queues.is_some() {
            return Err(ConfigError::Port {
                name: k.name.to_string(),
                problem: PortError::NotApplicable {
                    kind: PortType::Bond,
                    key: "queues (a bond's queues are its members')",
                },
            });
        }
        let kind = check_queues(queues, k.kind)
            .and_then(|()| k.take_kind())
            .map_err(|problem| ConfigError::Port {
                name: k.name.to_string(),
                problem,
            })?;
        let port = PortConfig {
            name: k.name.into(),
            queues,
            vlan: k.vlan,
            cpus: k.cpus,
            qos: k.qos,
            capacity: k.capacity,
            vlans: k.vlans,
            security: k.security.map(Box::new),
            storm: k.storm.map(Box::new),
            owner: k.owner.map(Box::new),
            link_local_forward: k.link_local_forward.filter(|g| !g.is_empty()),
            bpdu_guard: k.bpdu_guard.unwrap_or(false),
            kind,
            security_groups: k.security_groups.unwrap_or_default(),
            max_sessions: k.max_sessions,
            lldp: k.lldp,
        };
        port.validate()?;
        Ok(port)
    }
}

impl From<PortConfig> for PortKeys {
    fn from(p: PortConfig) -> PortKeys {
        let mut k = PortKeys::new(
            // A name that does not parse cannot come back from the file, but a PortConfig
            // built in code may carry one: keep it as it is (it is refused on the way in).
            PortName::unchecked(p.name),
            p.kind.port_type(),
        );
        k.queues = Some(p.queues);
        k.vlan = p.vlan;
        k.cpus = p.cpus;
        k.qos = p.qos;
        k.capacity = p.capacity;
        k.vlans = p.vlans;
        k.security = p.security.map(|s| *s);
        k.storm = p.storm.map(|s| *s);
        k.owner = p.owner.map(|o| *o);
        k.link_local_forward = p.link_local_forward.filter(|g| !g.is_empty());
        k.bpdu_guard = p.bpdu_guard.then_some(true);
        k.security_groups = (!p.security_groups.is_empty()).then_some(p.security_groups);
        k.max_sessions = p.max_sessions;
        k.lldp = p.lldp;
        match p.kind {
            PortKind::Tap(t) => k.ifname = Some(t.ifname),
            PortKind::Veth(v) => {
                k.ifname = Some(v.ifname);
                k.fastpath = Some(v.fastpath);
            }
            PortKind::VhostUser(v) => {
                k.socket = Some(v.socket);
                k.mode = Some(v.mode.into());
            }
            PortKind::AfXdp(a) => {
                k.ifname = Some(a.ifname);
                k.queues = a.queues;
                k.mode = Some(a.mode.into());
            }
            PortKind::Gen(g) => {
                k.mac = g.mac;
                k.generate = g.generate;
            }
            PortKind::Vxlan(v) => {
                k.vni = Some(v.vni);
                k.local = Some(v.local);
                k.remotes = Some(v.remotes);
                k.dstport = Some(v.dstport);
                k.learning = Some(v.learning);
                k.udp_csum = v.udp_csum;
            }
            PortKind::Bond(b) => {
                k.queues = None;
                k.mode = Some(b.mode.into());
                k.lacp = Some(b.lacp);
                k.lacp_rate = Some(b.lacp_rate);
                k.lacp_fallback = b.lacp_fallback.then_some(true);
                k.members = Some(b.members);
                k.updelay = (b.updelay != 0).then_some(b.updelay);
                k.downdelay = (b.downdelay != 0).then_some(b.downdelay);
            }
        }
        k
    }
}

impl PortConfig {
    /// A port of `kind` with one queue and no optional keys.
    pub fn new(name: &str, kind: PortKind) -> PortConfig {
        PortConfig {
            name: name.to_string(),
            queues: 1,
            vlan: None,
            cpus: None,
            qos: None,
            capacity: None,
            vlans: None,
            security: None,
            storm: None,
            owner: None,
            link_local_forward: None,
            bpdu_guard: false,
            kind,
            security_groups: Vec::new(),
            max_sessions: None,
            lldp: None,
        }
    }

    /// A TAP port with defaults.
    pub fn tap(name: &str, ifname: IfName) -> PortConfig {
        PortConfig::new(name, PortKind::Tap(TapConfig { ifname }))
    }

    /// An afxdp port with defaults (every NIC queue, mode auto).
    pub fn afxdp(name: &str, ifname: IfName, mode: XdpMode) -> PortConfig {
        PortConfig::new(
            name,
            PortKind::AfXdp(AfXdpConfig {
                ifname,
                queues: None,
                mode,
            }),
        )
    }

    /// A vhost-user port with defaults.
    pub fn vhost_user(name: &str, socket: SocketPath, mode: VhostMode) -> PortConfig {
        PortConfig::new(name, PortKind::VhostUser(VhostUserConfig { socket, mode }))
    }

    /// A gen port that only sinks.
    pub fn gen(name: &str) -> PortConfig {
        PortConfig::new(name, PortKind::Gen(GenPortConfig::default()))
    }

    /// Checks what the types alone do not: the name, the queue count for the port's kind, a
    /// gen port's frame size and flows, and that the QoS keys fit together. A port read from
    /// a file or the control socket has passed this already; [`PortConfig::new`] and the
    /// other constructors have not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.problem().map_err(|problem| ConfigError::Port {
            name: self.name.clone(),
            problem,
        })
    }

    fn problem(&self) -> Result<(), PortError> {
        PortName::try_from(self.name.clone()).map_err(|_| PortError::Name)?;
        if self.max_sessions == Some(0) {
            return Err(PortError::MaxSessions);
        }
        check_queues(self.queues, self.kind.port_type())?;
        if let PortKind::Gen(GenPortConfig {
            generate: Some(g), ..
        }) = &self.kind
        {
            if !(GEN_MIN_SIZE..=GEN_MAX_SIZE).contains(&g.size) {
                return Err(PortError::GenSize(g.size));
            }
            if g.flows == 0 {
                return Err(PortError::GenFlows);
            }
        }
        if let PortKind::Vxlan(v) = &self.kind {
            if v.vni > MAX_VNI {
                return Err(PortError::Vni(v.vni));
            }
            if let Some(&remote) = v.remotes.iter().find(|r| r.is_ipv4() != v.local.is_ipv4()) {
                return Err(PortError::VxlanFamily {
                    local: v.local,
                    remote,
                });
            }
            if v.dstport == 0 {
                return Err(PortError::ZeroDstport);
            }
        }
        if let PortKind::Bond(b) = &self.kind {
            if b.members.is_empty() {
                return Err(PortError::NoMembers);
            }
            if b.mode == BondMode::BalanceTcp && b.lacp == LacpMode::Off {
                return Err(PortError::TcpNeedsLacp);
            }
            for (i, m) in b.members.iter().enumerate() {
                m.port().map_err(|problem| match problem {
                    PortError::MemberType(_) => problem,
                    _ => PortError::Member {
                        ifname: m.ifname.to_string(),
                        problem: Box::new(problem),
                    },
                })?;
                if b.members[..i].iter().any(|o| o.ifname == m.ifname) {
                    return Err(PortError::MemberTwice(m.ifname.to_string()));
                }
            }
        }
        if let Some(c) = self.capacity {
            if c.bps() == 0 {
                return Err(PortError::ZeroCapacity);
            }
            if self.qos.is_some() {
                return Err(PortError::UplinkQos);
            }
        }
        self.qos_settings().check()?;
        if matches!(self.lldp, Some(LldpMode::Rx | LldpMode::Both))
            && self.lldp_ifname().is_none()
            && !matches!(self.kind, PortKind::Bond(_))
        {
            return Err(PortError::Lldp(self.kind.port_type()));
        }
        Ok(())
    }

    /// The interface LLDP runs on: afxdp, tap and veth ports have one (it is the port id
    /// LLDP sends); vhost-user, vxlan, gen and bond ports have none (a bond runs one agent
    /// per member, on the member's interface: [`PortConfig::lldp_mode`] applies to each).
    pub fn lldp_ifname(&self) -> Option<&str> {
        match &self.kind {
            PortKind::AfXdp(a) => Some(a.ifname.as_str()),
            PortKind::Tap(t) => Some(t.ifname.as_str()),
            PortKind::Veth(v) => Some(v.ifname.as_str()),
            PortKind::VhostUser(_) | PortKind::Vxlan(_) | PortKind::Gen(_) | PortKind::Bond(_) => {
                None
            }
        }
    }

    /// What LLDP does on the port: `lldp` if set, else [`LldpMode::Rx`] on an uplink (an
    /// afxdp port, a bond (it applies to each member), or a tap or veth port with
    /// `capacity`) and [`LldpMode::Off`] elsewhere.
    pub fn lldp_mode(&self) -> LldpMode {
        match self.lldp {
            Some(m) => m,
            None if matches!(self.kind, PortKind::Bond(_)) => LldpMode::Rx,
            None if self.lldp_ifname().is_none() => LldpMode::Off,
            None if matches!(self.kind, PortKind::AfXdp(_)) || self.capacity.is_some() => {
                LldpMode::Rx
            }
            None => LldpMode::Off,
        }
    }

    /// The port's CPU set, if it has one.
    pub fn cpu_set(&self) -> Option<Vec<usize>> {
        self.cpus.as_ref().map(|l| l.cpus().to_vec())
    }

    /// The port's QoS settings (defaults when it has no `qos`).
    pub fn qos_settings(&self) -> QosSettings {
        self.qos
            .as_ref()
            .map_or_else(QosSettings::default, QosConfig::settings)
    }

    /// The uplink capacity in bits/s, if the port is an uplink.
    pub fn capacity_bps(&self) -> Option<u64> {
        self.capacity.map(Rate::bps)
    }

    /// The VLAN id; 0 when untagged.
    pub fn vlan_id(&self) -> u16 {
        self.vlan.map_or(0, VlanId::get)
    }

    /// The VLANs the port carries (as the switch compiles its policy).
    pub fn carried(&self) -> crate::policy::Carried<'_> {
        crate::policy::Carried::of(self.vlan.map(VlanId::get), self.vlans.as_ref())
    }

    /// A TAP, afxdp or veth port's interface name.
    pub fn ifname(&self) -> Option<&IfName> {
        match &self.kind {
            PortKind::Tap(t) => Some(&t.ifname),
            PortKind::AfXdp(a) => Some(&a.ifname),
            PortKind::Veth(v) => Some(&v.ifname),
            _ => None,
        }
    }

    /// Every interface the port uses: its own (TAP, afxdp, veth) or its members' (bond).
    pub fn ifnames(&self) -> Vec<&IfName> {
        match &self.kind {
            PortKind::Bond(b) => b.members.iter().map(|m| &m.ifname).collect(),
            _ => self.ifname().into_iter().collect(),
        }
    }

    /// A bond port's keys.
    pub fn bond(&self) -> Option<&BondConfig> {
        match &self.kind {
            PortKind::Bond(b) => Some(b),
            _ => None,
        }
    }

    /// A vhost-user port's socket.
    pub fn socket(&self) -> Option<&SocketPath> {
        match &self.kind {
            PortKind::VhostUser(v) => Some(&v.socket),
            _ => None,
        }
    }

    /// A vhost-user port's mode.
    pub fn vhost_mode(&self) -> Option<VhostMode> {
        match &self.kind {
            PortKind::VhostUser(v) => Some(v.mode),
            _ => None,
        }
    }
}

/// A configuration that failed to load or validate. The message is one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {reason}")]
    Read { path: String, reason: String },
    /// The text does not parse: bad TOML, an unknown key, a value of the wrong type or out of
    /// its range. `message` starts with the key when the position names one.
    #[error("config line {line}: {message}")]
    Syntax { line: usize, message: String },
    #[error("[switch] workers: CPU {cpu} is not present (online CPUs: {online})")]
    CpuNotPresent { cpu: usize, online: String },
    #[error("[switch] control must be an absolute path, got '{0}'")]
    Control(String),
    #[error("[switch] socket_dirs: '{0}' must be an absolute path without '..'")]
    SocketDir(String),
    /// A VLAN with two uplinks, or guarantees beyond an uplink's reservable share.
    #[error("{0}")]
    Qos(String),
    #[error("port '{name}': {problem}")]
    Port { name: String, problem: PortError },
    /// A `[[port]]` table whose keys do not make a port of its type.
    #[error("config line {line}: port '{name}': {problem}")]
    PortAt {
        line: usize,
        name: String,
        problem: PortError,
    },
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
    #[error("port '{port}': unknown security group '{group}'")]
    UnknownGroup { port: String, group: String },
    #[error("security group '{group}' rule {rule}: unknown remote_group '{remote}'")]
    UnknownRemoteGroup {
        group: String,
        rule: usize,
        remote: String,
    },
    #[error("security group '{group}': {rules} rules, at most {MAX_GROUP_RULES}")]
    TooManyRules { group: String, rules: usize },
    #[error("duplicate security group name '{0}'")]
    DuplicateGroup(String),
    #[error("[firewall] max_sessions must be at least 1")]
    MaxSessions,
    /// A `[[mirror]]` table that cannot run (unknown port, output also a source, ...).
    #[error("{0}")]
    Mirror(String),
}

/// The file as it is read: ports keep their position for errors about the table as a whole.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    switch: SwitchConfig,
    #[serde(default)]
    port: Vec<toml::Spanned<PortKeys>>,
    #[serde(default)]
    firewall: Option<FirewallConfig>,
    #[serde(default)]
    security_group: Vec<SecurityGroupConfig>,
    #[serde(default)]
    mirror: Vec<MirrorConfig>,
}

impl Config {
    /// Parses TOML text. Unknown keys, values of the wrong type, values that do not parse
    /// and keys that do not apply to a port's type are errors naming the line (and the key).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let file: ConfigFile = toml::from_str(text).map_err(|e| syntax_error(text, &e))?;
        let ports = file
            .port
            .into_iter()
            .map(|p| {
                let line = line_of(text, p.span().start);
                PortConfig::try_from(p.into_inner()).map_err(|e| match e {
                    ConfigError::Port { name, problem } => ConfigError::PortAt {
                        line,
                        name,
                        problem,
                    },
                    other => other,
                })
            })
            .collect::<Result<_, _>>()?;
        let config = Config {
            switch: file.switch,
            ports,
            firewall: file.firewall,
            security_groups: file.security_group,
            mirrors: file.mirror,
        };
        config.check_security_groups()?;
        config.check_mirrors()?;
        Ok(config)
    }

    /// The configuration as TOML text that [`Config::from_toml`] reads back equal.
    pub fn to_toml(&self) -> Result<String, toml::ser::Error> {
        let mut s = self.switch_toml()?;
        for p in &self.ports {
            s.push('\n');
            s.push_str(&port_toml(p)?);
        }
        Ok(s)
    }

    /// The `[switch]` table as TOML: the first part of [`Config::to_toml`].
    pub fn switch_toml(&self) -> Result<String, toml::ser::Error> {
        #[derive(Serialize)]
        struct Switch<'a> {
            switch: &'a SwitchConfig,
        }
        let mut s = toml::to_string(&Switch {
            switch: &self.switch,
        })?;
        // The firewall's tables belong to the head of the file too: a caller that renders
        // the ports one by one (the state file) keeps them.
        s.push_str(&self.firewall_toml()?);
        s.push_str(&self.mirror_toml()?);
        Ok(s)
    }

    /// The `[[mirror]]` tables as TOML (empty when there are none).
    fn mirror_toml(&self) -> Result<String, toml::ser::Error> {
        #[derive(Serialize)]
        struct Mirrors<'a> {
            mirror: &'a [MirrorConfig],
        }
        if self.mirrors.is_empty() {
            return Ok(String::new());
        }
        Ok(format!(
            "\n{}",
            toml::to_string(&Mirrors {
                mirror: &self.mirrors
            })?
        ))
    }

    /// Checks the mirror sessions against the ports and each other ([`MirrorConfig::problem`]).
    pub fn check_mirrors(&self) -> Result<(), ConfigError> {
        let ports: Vec<&str> = self.ports.iter().map(|p| p.name.as_str()).collect();
        for (i, m) in self.mirrors.iter().enumerate() {
            let others = self.mirrors.iter().take(i);
            m.problem(&ports, others).map_err(ConfigError::Mirror)?;
        }
        Ok(())
    }

    /// Reads and parses a file.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Config::from_toml(&text)
    }

    /// Checks what parsing cannot see: the workers against the machine's online CPUs, the
    /// control path, names, interfaces and sockets used twice, and QoS admission (one uplink
    /// per VLAN, guarantees within its reservable share: [`check_qos`]). Returns the worker
    /// CPUs.
    pub fn validate(&self, online: &[usize]) -> Result<CpuList, ConfigError> {
        let workers = &self.switch.workers;
        if let Some(&cpu) = workers.cpus().iter().find(|c| !online.contains(c)) {
            let online = CpuList::from_cpus(online.iter().copied())
                .map_or_else(|| "none".to_string(), |l| l.to_string());
            return Err(ConfigError::CpuNotPresent { cpu, online });
        }
        if !self.switch.control.is_absolute() {
            return Err(ConfigError::Control(
                self.switch.control.display().to_string(),
            ));
        }
        for d in &self.switch.socket_dirs {
            let dotdot = d.components().any(|c| c == std::path::Component::ParentDir);
            if !d.is_absolute() || dotdot {
                return Err(ConfigError::SocketDir(d.display().to_string()));
            }
        }
        let mut names = HashSet::new();
        for p in &self.ports {
            p.validate()?;
            if !names.insert(p.name.as_str()) {
                return Err(ConfigError::DuplicateName(p.name.clone()));
            }
        }
        check_ifnames(&self.ports)?;
        check_qos(&self.ports, self.switch.reservable.get())?;
        self.check_security_groups()?;
        self.check_mirrors()?;
        Ok(workers.clone())
    }
}

/// A TOML error as one line: its line number, and the key when the error is about a value.
fn syntax_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let start = e.span().map(|s| s.start.min(text.len()));
    let mut message = e.message().replace('\n', " ").trim().to_string();
    if let Some(key) = start.and_then(|s| key_of_value_at(text, s)) {
        let leaf = key.rsplit('.').next().unwrap_or(&key);
        // Range errors of a key's own type name it already ("vlan = 4095 is out of ...").
        if !message.starts_with(&format!("{leaf} =")) {
            message = format!("{key}: {message}");
        }
    }
    ConfigError::Syntax {
        line: start.map_or(1, |s| line_of(text, s)),
        message,
    }
}

/// 1-based line number of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The dotted key whose value starts at `offset`, when it does: `capacity` for
/// `capacity = "1Q"`, `qos.max` for `qos = { min = "1M", max = "x" }`. Bare keys only.
fn key_of_value_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let mut line = before[before.rfind('\n').map_or(0, |i| i + 1)..].trim_end();
    // An element of an array value (`macs = ["x", "y"]`) is named by the array's key.
    if let Some(i) = line.rfind('[') {
        if !line[i..].contains(']') {
            line = line[..i].trim_end();
        }
    }
    let line = line.strip_suffix('=')?;
    let mut path = Vec::new();
    for segment in line.split('{') {
        let pair = segment.rsplit(',').next()?;
        let key = pair.split('=').next()?.trim();
        let bare = |k: &str| {
            !k.is_empty()
                && k.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
        };
        if !bare(key) {
            return None;
        }
        path.push(key);
    }
    Some(path.join("."))
}

/// Fails if two ports name the same TAP interface or the same vhost-user socket. Hashed, so
/// that a configuration of 10 000 ports is checked in O(ports), not O(ports²).
pub fn check_ifnames(ports: &[PortConfig]) -> Result<(), ConfigError> {
    let mut seen: std::collections::HashMap<&IfName, &str> = Default::default();
    for p in ports {
        for ifname in p.ifnames() {
            if let Some(first) = seen.insert(ifname, &p.name) {
                return Err(ConfigError::DuplicateIfname {
                    ifname: ifname.to_string(),
                    first: first.to_string(),
                    second: p.name.clone(),
                });
            }
        }
    }
    let mut sockets: std::collections::HashMap<&SocketPath, &str> = Default::default();
    for p in ports {
        if let Some(s) = p.socket() {
            if let Some(first) = sockets.insert(s, &p.name) {
                return Err(ConfigError::DuplicateSocket {
                    socket: s.to_string(),
                    first: first.to_string(),
                    second: p.name.clone(),
                });
            }
        }
    }
    Ok(())
}

/// A port as the QoS admission rule ([`uplink_violation`]) sees it.
#[derive(Debug, Clone, Copy)]
pub struct QosMember<'a> {
    pub name: &'a str,
    pub carried: crate::policy::Carried<'a>,
    /// Uplink capacity in bits/s; `None` for any other port.
    pub capacity: Option<u64>,
    /// Its guarantee in bits/s (0: none).
    pub min: u64,
}

/// What breaks the QoS admission rule ([`uplink_violation`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UplinkViolation<'a> {
    /// Two uplinks carry `vlan`.
    SharedVlan {
        first: &'a str,
        second: &'a str,
        vlan: u16,
    },
    /// The guarantees toward `uplink` add up to `sum`, above `limit` (reservable × capacity).
    Overbooked {
        uplink: &'a str,
        sum: u64,
        capacity: u64,
        limit: u64,
    },
}

/// The QoS admission rule, for the configuration file ([`check_qos`]) and for live changes
/// alike: no two uplinks carry a VLAN in common, and the guarantees of the ports toward an
/// uplink (those it has a VLAN in common with, [`crate::policy::Carried`]) add up to at most
/// `reservable` × its capacity. The first violation, in port order.
pub fn uplink_violation<'a>(
    ports: &[QosMember<'a>],
    reservable: f64,
) -> Option<UplinkViolation<'a>> {
    let uplinks: Vec<(&QosMember<'a>, u64)> = ports
        .iter()
        .filter_map(|p| p.capacity.map(|c| (p, c)))
        .collect();
    for (k, &(up, capacity)) in uplinks.iter().enumerate() {
        if let Some((first, vlan)) = uplinks[..k]
            .iter()
            .find_map(|(o, _)| o.carried.common(&up.carried).map(|v| (o.name, v)))
        {
            return Some(UplinkViolation::SharedVlan {
                first,
                second: up.name,
                vlan,
            });
        }
        let sum: u64 = ports
            .iter()
            .filter(|p| p.capacity.is_none() && p.carried.common(&up.carried).is_some())
            .map(|p| p.min)
            .sum();
        let limit = (reservable * capacity as f64) as u64;
        if sum > limit {
            return Some(UplinkViolation::Overbooked {
                uplink: up.name,
                sum,
                capacity,
                limit,
            });
        }
    }
    None
}

/// Fails if the ports break the QoS admission rule ([`uplink_violation`]).
pub fn check_qos(ports: &[PortConfig], reservable: f64) -> Result<(), ConfigError> {
    let members: Vec<QosMember<'_>> = ports
        .iter()
        .map(|p| QosMember {
            name: &p.name,
            carried: p.carried(),
            capacity: p.capacity_bps(),
            min: p.qos_settings().min.unwrap_or(0),
        })
        .collect();
    match uplink_violation(&members, reservable) {
        None => Ok(()),
        Some(UplinkViolation::SharedVlan { first, second, vlan }) => Err(ConfigError::Qos(format!(
            "ports '{first}' and '{second}' are both uplinks (capacity) of VLAN {vlan}; at most one per VLAN"
        ))),
        Some(UplinkViolation::Overbooked {
            uplink,
            sum,
            capacity,
            limit,
        }) => Err(ConfigError::Qos(format!(
            "the guarantees toward uplink '{uplink}' add up to {}, above reservable {reservable} x capacity {} = {}",
            format_rate(sum),
            format_rate(capacity),
            format_rate(limit)
        ))),
    }
}

/// One port as a `[[port]]` table (with its sub-tables), as [`Config::to_toml`] writes it:
/// the whole file is the `[switch]` table followed by these, so a caller that keeps them can
/// render a thousand-port configuration without serializing the ports that did not change.
pub fn port_toml(port: &PortConfig) -> Result<String, toml::ser::Error> {
    #[derive(Serialize)]
    struct One<'a> {
        port: [&'a PortConfig; 1],
    }
    toml::to_string(&One { port: [port] })
}

/// `[switch.ipfix]`: flow records to an IPFIX (RFC 7011) collector over UDP.
///
/// ```toml
/// [switch.ipfix]
/// collector = "192.0.2.9:4739"
/// sampling = 1          # account 1 in N frames
/// active_timeout = 60   # seconds: a longer flow is reported and starts over
/// idle_timeout = 15     # seconds without a frame: the flow ends
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "IpfixFile")]
pub struct IpfixConfig {
    pub collector: std::net::SocketAddr,
    pub sampling: u32,
    pub active_timeout: u32,
    pub idle_timeout: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IpfixFile {
    collector: String,
    #[serde(default = "one")]
    sampling: u32,
    #[serde(default = "sixty")]
    active_timeout: u32,
    #[serde(default = "fifteen")]
    idle_timeout: u32,
}

fn one() -> u32 {
    1
}
fn sixty() -> u32 {
    60
}
fn fifteen() -> u32 {
    15
}
fn twenty() -> u32 {
    20
}

/// `[switch.sflow]`: sFlow v5 datagrams (flow samples and per-port counter samples) to a
/// collector over UDP.
///
/// ```toml
/// [switch.sflow]
/// collector = "192.0.2.9:6343"
/// sampling = 1000       # 1 in N frames, on average
/// polling = 20          # seconds between counter samples (0: none)
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SflowFile")]
pub struct SflowConfig {
    pub collector: std::net::SocketAddr,
    pub sampling: u32,
    pub polling: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SflowFile {
    collector: String,
    sampling: u32,
    #[serde(default = "twenty")]
    polling: u32,
}

/// A collector address: an IP address (not unspecified) and a UDP port (not 0).
pub fn parse_collector(table: &str, s: &str) -> Result<std::net::SocketAddr, String> {
    match s.parse::<std::net::SocketAddr>() {
        Ok(a) if a.port() != 0 && !a.ip().is_unspecified() && !a.ip().is_multicast() => Ok(a),
        _ => Err(format!(
            "[switch.{table}] collector = \"{s}\": expected a unicast IP address and UDP \
             port, e.g. \"192.0.2.9:{}\"",
            if table == "sflow" { 6343 } else { 4739 }
        )),
    }
}

fn check_sampling(table: &str, n: u32) -> Result<u32, String> {
    if n == 0 {
        return Err(format!(
            "[switch.{table}] sampling = 0: must be at least 1 (1 in N frames)"
        ));
    }
    Ok(n)
}

impl TryFrom<IpfixFile> for IpfixConfig {
    type Error = String;
    fn try_from(f: IpfixFile) -> Result<Self, String> {
        let collector = parse_collector("ipfix", &f.collector)?;
        let sampling = check_sampling("ipfix", f.sampling)?;
        if f.active_timeout == 0 || f.idle_timeout == 0 {
            return Err(format!(
                "[switch.ipfix] active_timeout = {} and idle_timeout = {} must both be \
                 at least 1 second",
                f.active_timeout, f.idle_timeout
            ));
        }
        if f.idle_timeout > f.active_timeout {
            return Err(format!(
                "[switch.ipfix] idle_timeout = {} is above active_timeout = {}: a flow \
                 would be reported before it could go idle",
                f.idle_timeout, f.active_timeout
            ));
        }
        Ok(IpfixConfig {
            collector,
            sampling,
            active_timeout: f.active_timeout,
            idle_timeout: f.idle_timeout,
        })
    }
}

impl TryFrom<SflowFile> for SflowConfig {
    type Error = String;
    fn try_from(f: SflowFile) -> Result<Self, String> {
        Ok(SflowConfig {
            collector: parse_collector("sflow", &f.collector)?,
            sampling: check_sampling("sflow", f.sampling)?,
            polling: f.polling,
        })
    }
}

// ---- The firewall: security groups and connection-tracking settings (docs/firewall.md) ----

/// Most rules one security group may have.
pub const MAX_GROUP_RULES: usize = 4096;

/// `[firewall]`: switch-wide connection-tracking settings. Every key is optional; timeouts
/// are in seconds and default to Linux's (`qswitch_dp::firewall::Timeouts`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirewallConfig {
    /// Most tracked connections on the whole switch: the table is this big from the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// A TCP connection while its handshake is under way (SYN sent or received).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_handshake: Option<u32>,
    /// An established TCP connection with no traffic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_established: Option<u32>,
    /// A TCP connection closing (a FIN seen, not yet both acknowledged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_closing: Option<u32>,
    /// TIME_WAIT: both FINs acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_time_wait: Option<u32>,
    /// After a RST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_close: Option<u32>,
    /// A UDP (or other datagram protocol) flow seen one way only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_unreplied: Option<u32>,
    /// A UDP flow with replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub udp_replied: Option<u32>,
    /// An ICMP or ICMPv6 echo exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp: Option<u32>,
    /// Any other protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other: Option<u32>,
}

/// `[[security_group]]`: a named set of rules that allow traffic to or from the ports that
/// list the group in `security_groups`. What no rule of a port's groups allows is denied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityGroupConfig {
    /// 1..=32 characters of `[A-Za-z0-9._-]`.
    #[serde(deserialize_with = "group_name")]
    pub name: String,
    /// The rules are plain ACLs: no connection is tracked, replies need rules of their own.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stateless: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<GroupRule>,
    /// Addresses of members on other hosts: `remote_group` rules naming this group match
    /// them as well as the `security.ips` of this switch's member ports (set live with
    /// `qswitch sg addresses`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpPrefix>,
}

fn group_name<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    PortName::try_from(s.clone())
        .map(|_| s.clone())
        .map_err(|_| serde::de::Error::custom(GroupRuleError::GroupName(s)))
}

/// Which way a rule allows traffic, seen from the port's VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleDirection {
    /// Toward the port's VM (the switch sends it out of the port).
    Ingress,
    /// From the port's VM (the switch receives it on the port).
    Egress,
}

impl fmt::Display for RuleDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RuleDirection::Ingress => "ingress",
            RuleDirection::Egress => "egress",
        })
    }
}

/// `ethertype` of a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleEthertype {
    Ipv4,
    Ipv6,
}

/// `protocol` of a rule: a name or an IP protocol number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RuleProtocol {
    Any,
    Tcp,
    Udp,
    Icmp,
    Icmpv6,
    Sctp,
    Number(u8),
}

impl RuleProtocol {
    /// The IP protocol number; `None` for any.
    pub fn number(self) -> Option<u8> {
        match self {
            RuleProtocol::Any => None,
            RuleProtocol::Tcp => Some(6),
            RuleProtocol::Udp => Some(17),
            RuleProtocol::Icmp => Some(1),
            RuleProtocol::Icmpv6 => Some(58),
            RuleProtocol::Sctp => Some(132),
            RuleProtocol::Number(n) => Some(n),
        }
    }

    fn has_ports(self) -> bool {
        matches!(self.number(), Some(6 | 17 | 132))
    }

    fn is_icmp(self) -> bool {
        matches!(self.number(), Some(1 | 58))
    }
}

/// `ports`: destination ports and inclusive ranges, e.g. `"80,443,8000-8080"` or `22`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PortRanges(pub Vec<(u16, u16)>);

impl PortRanges {
    /// Whether `port` is in one of the ranges.
    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|&(lo, hi)| (lo..=hi).contains(&port))
    }
}

impl FromStr for PortRanges {
    type Err = GroupRuleError;
    fn from_str(s: &str) -> Result<Self, GroupRuleError> {
        let bad = || GroupRuleError::Ports(s.to_string());
        let mut ranges = Vec::new();
        for part in s.split(',') {
            let part = part.trim();
            let (lo, hi) = part.split_once('-').unwrap_or((part, part));
            let lo: u16 = lo.trim().parse().map_err(|_| bad())?;
            let hi: u16 = hi.trim().parse().map_err(|_| bad())?;
            if lo > hi {
                return Err(GroupRuleError::PortsReversed {
                    ports: s.to_string(),
                    lo,
                    hi,
                });
            }
            ranges.push((lo, hi));
        }
        Ok(PortRanges(ranges))
    }
}

impl fmt::Display for PortRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

/// `remote` or `remote_group` of a rule: the addresses at the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleRemote {
    /// A CIDR prefix.
    Prefix(IpPrefix),
    /// The addresses of the ports in this group (their `security.ips`).
    Group(String),
}

/// One rule of a security group: it allows what matches every key it has. Read from and
/// written as its keys, so a deserialized rule has been checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RuleKeys", into = "RuleKeys")]
pub struct GroupRule {
    pub direction: RuleDirection,
    /// `None`: IPv4 and IPv6.
    pub ethertype: Option<RuleEthertype>,
    pub protocol: RuleProtocol,
    /// Destination ports (tcp, udp, sctp only); `None`: every port.
    pub ports: Option<PortRanges>,
    /// ICMP type and code (icmp, icmpv6 only); `None`: any.
    pub icmp_type: Option<u8>,
    pub icmp_code: Option<u8>,
    /// `None`: any address.
    pub remote: Option<RuleRemote>,
}

/// A rule that does not make sense. One line each.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupRuleError {
    #[error("security group name '{0}': a name must be 1..=32 characters of [A-Za-z0-9._-]")]
    GroupName(String),
    #[error("protocol '{0}' is not tcp, udp, icmp, icmpv6, sctp, any or a number 0..=255")]
    Protocol(String),
    #[error("protocol number {0} is out of range 0..=255")]
    ProtocolNumber(i64),
    #[error("ports '{0}' is not a list of ports and ranges like \"22,80,8000-8080\"")]
    Ports(String),
    #[error("ports '{ports}': range {lo}-{hi} is reversed")]
    PortsReversed { ports: String, lo: u16, hi: u16 },
    #[error("ports need protocol tcp, udp or sctp")]
    PortsProtocol,
    #[error("{key} = {value} is out of range 0..=255")]
    IcmpRange { key: &'static str, value: i64 },
    #[error("icmp_type and icmp_code need protocol icmp or icmpv6")]
    IcmpProtocol,
    #[error("icmp_code needs icmp_type")]
    IcmpCode,
    #[error("remote: {0}")]
    Cidr(String),
    #[error("remote and remote_group are exclusive: give one")]
    RemoteBoth,
    #[error("remote {remote} is not of ethertype {ethertype}")]
    RemoteFamily {
        remote: IpPrefix,
        ethertype: &'static str,
    },
    #[error("protocol {protocol} does not go with ethertype {ethertype}")]
    ProtocolFamily {
        protocol: &'static str,
        ethertype: &'static str,
    },
}

/// The keys of a rule as the file has them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleKeys {
    direction: RuleDirection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ethertype: Option<RuleEthertype>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    protocol: Option<NameOrNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ports: Option<NameOrNumber>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    icmp_type: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    icmp_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remote: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    remote_group: Option<String>,
}

/// `protocol = "tcp"` or `protocol = 6`; `ports = "80,443"` or `ports = 22`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum NameOrNumber {
    Number(i64),
    Name(String),
}

fn byte(key: &'static str, value: Option<i64>) -> Result<Option<u8>, GroupRuleError> {
    value
        .map(|v| u8::try_from(v).map_err(|_| GroupRuleError::IcmpRange { key, value: v }))
        .transpose()
}

impl TryFrom<RuleKeys> for GroupRule {
    type Error = GroupRuleError;

    fn try_from(k: RuleKeys) -> Result<GroupRule, GroupRuleError> {
        let protocol = match k.protocol {
            None => RuleProtocol::Any,
            Some(NameOrNumber::Number(n)) => RuleProtocol::Number(
                u8::try_from(n).map_err(|_| GroupRuleError::ProtocolNumber(n))?,
            ),
            Some(NameOrNumber::Name(name)) => match name.as_str() {
                "any" => RuleProtocol::Any,
                "tcp" => RuleProtocol::Tcp,
                "udp" => RuleProtocol::Udp,
                "icmp" => RuleProtocol::Icmp,
                "icmpv6" => RuleProtocol::Icmpv6,
                "sctp" => RuleProtocol::Sctp,
                n => match n.parse::<i64>() {
                    Ok(n) => RuleProtocol::Number(
                        u8::try_from(n).map_err(|_| GroupRuleError::ProtocolNumber(n))?,
                    ),
                    Err(_) => return Err(GroupRuleError::Protocol(name)),
                },
            },
        };
        let ports = match k.ports {
            None => None,
            Some(NameOrNumber::Number(n)) => {
                let p = u16::try_from(n).map_err(|_| GroupRuleError::Ports(n.to_string()))?;
                Some(PortRanges(vec![(p, p)]))
            }
            Some(NameOrNumber::Name(s)) => Some(s.parse()?),
        };
        if ports.is_some() && !protocol.has_ports() {
            return Err(GroupRuleError::PortsProtocol);
        }
        let icmp_type = byte("icmp_type", k.icmp_type)?;
        let icmp_code = byte("icmp_code", k.icmp_code)?;
        if (icmp_type.is_some() || icmp_code.is_some()) && !protocol.is_icmp() {
            return Err(GroupRuleError::IcmpProtocol);
        }
        if icmp_code.is_some() && icmp_type.is_none() {
            return Err(GroupRuleError::IcmpCode);
        }
        let family = |e: RuleEthertype| match e {
            RuleEthertype::Ipv4 => "ipv4",
            RuleEthertype::Ipv6 => "ipv6",
        };
        match (protocol, k.ethertype) {
            (RuleProtocol::Icmp, Some(e @ RuleEthertype::Ipv6))
            | (RuleProtocol::Icmpv6, Some(e @ RuleEthertype::Ipv4)) => {
                return Err(GroupRuleError::ProtocolFamily {
                    protocol: if protocol == RuleProtocol::Icmp {
                        "icmp"
                    } else {
                        "icmpv6"
                    },
                    ethertype: family(e),
                })
            }
            _ => {}
        }
        let remote = match (k.remote, k.remote_group) {
            (Some(_), Some(_)) => return Err(GroupRuleError::RemoteBoth),
            (Some(cidr), None) => {
                let p: IpPrefix = cidr.parse().map_err(|e: crate::policy::PolicyValueError| {
                    GroupRuleError::Cidr(e.to_string())
                })?;
                if let Some(e) = k.ethertype {
                    if p.addr.is_ipv4() != (e == RuleEthertype::Ipv4) {
                        return Err(GroupRuleError::RemoteFamily {
                            remote: p,
                            ethertype: family(e),
                        });
                    }
                }
                Some(RuleRemote::Prefix(p))
            }
            (None, Some(g)) => Some(RuleRemote::Group(g)),
            (None, None) => None,
        };
        Ok(GroupRule {
            direction: k.direction,
            ethertype: k.ethertype,
            protocol,
            ports,
            icmp_type,
            icmp_code,
            remote,
        })
    }
}

impl From<GroupRule> for RuleKeys {
    fn from(r: GroupRule) -> RuleKeys {
        let protocol = match r.protocol {
            RuleProtocol::Any => None,
            RuleProtocol::Tcp => Some(NameOrNumber::Name("tcp".into())),
            RuleProtocol::Udp => Some(NameOrNumber::Name("udp".into())),
            RuleProtocol::Icmp => Some(NameOrNumber::Name("icmp".into())),
            RuleProtocol::Icmpv6 => Some(NameOrNumber::Name("icmpv6".into())),
            RuleProtocol::Sctp => Some(NameOrNumber::Name("sctp".into())),
            RuleProtocol::Number(n) => Some(NameOrNumber::Number(n.into())),
        };
        let (remote, remote_group) = match r.remote {
            None => (None, None),
            Some(RuleRemote::Prefix(p)) => (Some(p.to_string()), None),
            Some(RuleRemote::Group(g)) => (None, Some(g)),
        };
        RuleKeys {
            direction: r.direction,
            ethertype: r.ethertype,
            protocol,
            ports: r.ports.map(|p| NameOrNumber::Name(p.to_string())),
            icmp_type: r.icmp_type.map(i64::from),
            icmp_code: r.icmp_code.map(i64::from),
            remote,
            remote_group,
        }
    }
}

impl Config {
    /// Checks the security groups as a whole: names used twice, a port or a rule naming a
    /// group that does not exist, limits of zero.
    pub fn check_security_groups(&self) -> Result<(), ConfigError> {
        if self.firewall.and_then(|f| f.max_sessions) == Some(0) {
            return Err(ConfigError::MaxSessions);
        }
        let mut names = HashSet::new();
        for g in &self.security_groups {
            if !names.insert(g.name.as_str()) {
                return Err(ConfigError::DuplicateGroup(g.name.clone()));
            }
        }
        for g in &self.security_groups {
            if g.rules.len() > MAX_GROUP_RULES {
                return Err(ConfigError::TooManyRules {
                    group: g.name.clone(),
                    rules: g.rules.len(),
                });
            }
            for (i, r) in g.rules.iter().enumerate() {
                if let Some(RuleRemote::Group(remote)) = &r.remote {
                    if !names.contains(remote.as_str()) {
                        return Err(ConfigError::UnknownRemoteGroup {
                            group: g.name.clone(),
                            rule: i,
                            remote: remote.clone(),
                        });
                    }
                }
            }
        }
        for p in &self.ports {
            if let Some(group) = p
                .security_groups
                .iter()
                .find(|g| !names.contains(g.as_str()))
            {
                return Err(ConfigError::UnknownGroup {
                    port: p.name.clone(),
                    group: group.clone(),
                });
            }
        }
        Ok(())
    }

    /// `[firewall]` and the `[[security_group]]` tables as TOML (empty when there are none).
    fn firewall_toml(&self) -> Result<String, toml::ser::Error> {
        #[derive(Serialize)]
        struct Firewall<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            firewall: Option<&'a FirewallConfig>,
            #[serde(skip_serializing_if = "<[_]>::is_empty")]
            security_group: &'a [SecurityGroupConfig],
        }
        if self.firewall.is_none() && self.security_groups.is_empty() {
            return Ok(String::new());
        }
        let body = toml::to_string(&Firewall {
            firewall: self.firewall.as_ref(),
            security_group: &self.security_groups,
        })?;
        Ok(format!("\n{body}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONLINE: &[usize] = &[0, 1];

    fn check(text: &str) -> Result<CpuList, ConfigError> {
        Config::from_toml(text)?.validate(ONLINE)
    }

    fn err(text: &str) -> String {
        let e = check(text).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    }

    #[test]
    fn policy_keys_parse_dump_and_name_line_and_key() {
        let text = r#"
[[port]]
name = "t"
type = "tap"
ifname = "t"
vlan = 10
vlans = "20,30,100-200"
security = { macs = ["52:54:00:12:34:56"], ips = ["10.0.0.5", "2001:db8::/64"], mac_limit = 4, dhcp_guard = true, ra_guard = true }
storm = { broadcast = 1000, multicast = 5000, unknown_unicast = 100 }
link_local_forward = "stp,lldp"
bpdu_guard = true
"#;
        let cfg = Config::from_toml(text).unwrap();
        let p = &cfg.ports[0];
        assert_eq!(p.link_local_forward.unwrap().mask(), (1 << 0) | (1 << 14));
        assert!(p.bpdu_guard);
        assert_eq!(p.vlans.as_ref().unwrap().to_string(), "20,30,100-200");
        let sec = p.security.as_ref().unwrap();
        assert_eq!(sec.macs.len(), 1);
        assert_eq!(sec.ips[1].to_string(), "2001:db8::/64");
        assert_eq!(sec.mac_limit, Some(4));
        assert!(sec.dhcp_guard && sec.ra_guard);
        assert_eq!(p.storm.as_ref().unwrap().unknown_unicast, Some(100));
        let dumped = cfg.to_toml().unwrap();
        assert_eq!(Config::from_toml(&dumped).unwrap(), cfg);

        let port = "[[port]]\nname='a'\ntype='gen'\n";
        for (keys, needle) in [
            (
                "vlans = '10,4095'",
                "line 4: vlans: VLAN ID 4095 is out of range 1..=4094",
            ),
            ("vlans = '10-x'", "line 4: vlans: 'x' is not a VLAN ID"),
            (
                "vlans = '20-10'",
                "line 4: vlans: VLAN range 20-10 is empty",
            ),
            ("security = { macs = ['zz'] }", "line 4: security.macs:"),
            (
                "link_local_forward = 'stp,1'",
                "line 4: link_local_forward: link-local group 1 (01:80:c2:00:00:01, PAUSE) is never relayed",
            ),
            (
                "link_local_forward = 'lacp'",
                "line 4: link_local_forward: 'lacp' is not a link-local group",
            ),
            ("bpdu_guard = 1", "line 4: bpdu_guard:"),
            (
                "security = { macs = ['52:54:00:00:00:01', 'ff:ff:ff:ff:ff:ff'] }",
                "line 4: security.macs:",
            ),
            (
                "security = { ips = ['10.0.0.0/33'] }",
                "line 4: security.ips: '10.0.0.0/33': /33 is not a prefix length",
            ),
            (
                "security = { ips = ['10.0.0.1', 'x'] }",
                "line 4: security.ips: 'x' is not an IP address",
            ),
            (
                "security = { mac_limit = -1 }",
                "line 4: security.mac_limit:",
            ),
            ("security = { dhcp_gaurd = true }", "dhcp_gaurd"),
            ("storm = { broadcast = 'lots' }", "line 4: storm.broadcast:"),
            ("storm = { unicast = 10 }", "unicast"),
        ] {
            let e = err(&format!("{port}{keys}\n"));
            assert!(e.contains(needle), "{keys}: {e}");
        }
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
        assert_eq!(cfg.ports[0].vlan_id(), 10);
        assert_eq!(cfg.ports[0].ifname().unwrap().as_str(), "qs-a");
        assert_eq!(cfg.switch.fdb_aging.get(), 300);
        assert_eq!(cfg.switch.poll_spin_us.get(), 50);
        assert_eq!(cfg.switch.reservable.get(), DEFAULT_RESERVABLE);
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let e = err("[switch]\nworkers = \"0\"\nwrokers = \"1\"\n");
        assert!(e.starts_with("config line 3:"), "{e}");
        assert!(e.contains("wrokers"), "{e}");
        let e = err("[[port]]\nname='a'\ntype='tap'\nifname='x'\ncolour='red'\n");
        assert!(e.starts_with("config line 5:"), "{e}");
        assert!(e.contains("colour"), "{e}");
        let e = err("[[port]]\nname='a'\ntype='tap'\nifname='x'\nqos={min='1M', mni='1G'}\n");
        assert!(e.starts_with("config line 5:") && e.contains("mni"), "{e}");
    }

    /// Every bad value names its line and key; a port's table-level problems name the line of
    /// its `[[port]]` header and the port.
    #[test]
    fn errors_name_line_and_key() {
        let ok_tap = "[[port]]\nname='t'\ntype='tap'\nifname='qs-t'\n\n";
        for (text, want) in [
            (
                "[[port]]\nname='g'\ntype='gen'\nmac='zz'\n".to_string(),
                "config line 4: mac: 'zz' is not a MAC address (six hex bytes, e.g. \"02:00:00:00:00:01\")",
            ),
            (
                format!("{ok_tap}[[port]]\nname='b'\ntype='tap'\n"),
                "config line 6: port 'b': type tap needs ifname",
            ),
            (
                format!("{ok_tap}[[port]]\nname='b'\ntype='gen'\nsocket='/s'\n"),
                "config line 6: port 'b': key 'socket' does not apply to type gen",
            ),
            (
                "[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos = { min = \"1M\", max = \"x\" }\n".into(),
                "config line 5: qos.max: 'x' is not a rate (a number of bits/s with an optional k, M, G or T suffix, e.g. \"200M\")",
            ),
            (
                "[[port]]\nname='g'\ntype='gen'\ngenerate = { dst = 'zz' }\n".into(),
                "config line 4: generate.dst: 'zz' is not a MAC address (six hex bytes, e.g. \"02:00:00:00:00:01\")",
            ),
            (
                "[[port]]\nname='a'\ntype='tap'\nifname='a'\nvlan = 4095\n".into(),
                "config line 5: vlan = 4095 is out of range 1..=4094",
            ),
            (
                "[[port]]\nname='a'\ntype='tap'\nifname='a'\nqueues = 'two'\n".into(),
                "config line 5: queues: invalid type: string \"two\", expected u16",
            ),
            (
                "[switch]\nworkers = \"1-0\"\n".into(),
                "config line 2: workers: bad CPU range '1-0': the first CPU is above the last",
            ),
            (
                "[switch]\npoll_spin_us = 20000\n".into(),
                "config line 2: poll_spin_us = 20000 is out of range 0..=10000",
            ),
            (
                "[switch]\nfdb_aging = 0\n".into(),
                "config line 2: fdb_aging = 0 is out of range 1..=31536000",
            ),
            (
                "[switch]\nhttp = \"localhost\"\n".into(),
                "config line 2: http = \"localhost\": expected an IP address and port, e.g. \"127.0.0.1:9470\"",
            ),
            (
                "[[port]]\nname='bad name'\ntype='gen'\n".into(),
                "config line 2: name: port name 'bad name': a name must be 1..=32 characters of [A-Za-z0-9._-]",
            ),
            (
                "[[port]]\nname='a'\ntype='geneve'\n".into(),
                "config line 3: type: unknown variant `geneve`, expected one of `tap`, `gen`, `vhost-user`, `vxlan`, `afxdp`, `veth`, `bond`",
            ),
            (
                "[[port]]\nname='v'\ntype='vhost-user'\nsocket='/s'\nqueues=17\n".into(),
                "config line 1: port 'v': queues = 17 is out of range 1..=16 for type vhost-user",
            ),
        ] {
            assert_eq!(err(&text), want, "{text}");
        }
        assert_eq!(
            check(
                "[[port]]\nname='a'\ntype='tap'\n\n[[port]]\nname='b'\ntype='gen'\nmode='client'\n"
            )
            .unwrap_err(),
            ConfigError::PortAt {
                line: 1,
                name: "a".into(),
                problem: PortError::Missing {
                    kind: PortType::Tap,
                    key: "ifname"
                }
            }
        );
    }

    #[test]
    fn http_address() {
        let cfg = Config::from_toml("[switch]\nhttp = \"127.0.0.1:9470\"\n").unwrap();
        cfg.validate(ONLINE).unwrap();
        assert_eq!(
            cfg.switch.http.map(HttpAddr::get),
            Some("127.0.0.1:9470".parse().unwrap())
        );
        assert_eq!(Config::default().switch.http, None);
        assert!(check("[switch]\nhttp = \"[::1]:80\"\n").is_ok());
        for bad in ["localhost:9470", "127.0.0.1", "127.0.0.1:99999", ""] {
            let e = err(&format!("[switch]\nhttp = \"{bad}\"\n"));
            assert!(e.contains("expected an IP address and port"), "{e}");
            assert!(e.contains(&format!("http = \"{bad}\"")), "{e}");
        }
    }

    #[test]
    fn bad_cpu_lists() {
        let e = check("[switch]\nworkers = \"1-0\"\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { line: 2, .. }), "{e}");
        let e = check("[switch]\nworkers = \"0-3\"\n").unwrap_err();
        assert_eq!(
            e,
            ConfigError::CpuNotPresent {
                cpu: 2,
                online: "0-1".into()
            }
        );
        assert!(e.to_string().contains("CPU 2 is not present"));
        let e = check("[switch]\ncontrol = \"relative.sock\"\n").unwrap_err();
        assert_eq!(e, ConfigError::Control("relative.sock".into()));
        for bad in ["run/vm", "/run/../etc"] {
            let e = check(&format!("[switch]\nsocket_dirs = [\"{bad}\"]\n")).unwrap_err();
            assert_eq!(e, ConfigError::SocketDir(bad.into()));
        }
        let c = Config::from_toml("[switch]\ncontrol = \"/run/q/c.sock\"\n").unwrap();
        assert_eq!(c.switch.socket_dir_list(), [PathBuf::from("/run/q")]);
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
        let e = check(
            "[[port]]\nname='a'\ntype='vhost-user'\nsocket='/s'\n[[port]]\nname='b'\ntype='vhost-user'\nsocket='/s'\nmode='client'\n",
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "duplicate socket '/s' (ports 'a' and 'b')");
    }

    #[test]
    fn queue_and_vlan_ranges() {
        for q in [0, 257] {
            let e = err(&format!(
                "[[port]]\nname='a'\ntype='tap'\nifname='x'\nqueues={q}\n"
            ));
            assert!(
                e.contains(&format!("queues = {q} is out of range 1..=256")),
                "{e}"
            );
        }
        let e = err("[[port]]\nname='a'\ntype='tap'\nifname='x'\nvlan=4095\n");
        assert!(e.contains("vlan"), "{e}");
        let e = check("[[port]]\nname='a'\ntype='tap'\nifname='x'\nqueues=-1\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    }

    #[test]
    fn type_specific_keys() {
        assert!(err("[[port]]\nname='a'\ntype='tap'\n").contains("needs ifname"));
        assert!(err("[[port]]\nname='a'\ntype='vhost-user'\n").contains("needs socket"));
        let e = err("[[port]]\nname='a'\ntype='gen'\nifname='x'\n");
        assert!(e.contains("key 'ifname' does not apply to type gen"), "{e}");
        let e = err("[[port]]\nname='a'\ntype='tap'\nifname='x'\nmac='02:00:00:00:00:01'\n");
        assert!(e.contains("key 'mac' does not apply to type tap"), "{e}");
        let e = err("[[port]]\nname='a'\ntype='vhost-user'\nsocket='/s'\ngenerate={dst='ff:ff:ff:ff:ff:ff'}\n");
        assert!(
            e.contains("key 'generate' does not apply to type vhost-user"),
            "{e}"
        );
        let e = check("[[port]]\nname='a'\ntype='geneve'\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
        let e = err("[[port]]\nname='a'\ntype='tap'\nifname='this-name-is-too-long'\n");
        assert!(e.contains("not a valid interface name"), "{e}");
        let e =
            err("[[port]]\nname='g'\ntype='gen'\ngenerate={dst='ff:ff:ff:ff:ff:ff', size=20}\n");
        assert!(e.contains("generate.size"), "{e}");
        let e =
            err("[[port]]\nname='g'\ntype='gen'\ngenerate={dst='ff:ff:ff:ff:ff:ff', flows=0}\n");
        assert!(e.contains("generate.flows must be at least 1"), "{e}");
        let e = err("[[port]]\nname='g'\ntype='gen'\nmac='01:00:5e:00:00:01'\n");
        assert!(
            e.contains("mac: '01:00:5e:00:00:01' is a multicast address"),
            "{e}"
        );
        let e = err("[[port]]\nname='v'\ntype='vhost-user'\nsocket=''\n");
        assert!(
            e.contains("socket: socket path must be 1..=107 bytes, got 0"),
            "{e}"
        );
    }

    #[test]
    fn gen_port_parses() {
        let cfg = Config::from_toml(
            "[[port]]\nname='g'\ntype='gen'\nqueues=2\nmac='02:00:00:00:00:01'\ngenerate={dst='02:00:00:00:00:02', size=64, rate=1000, flows=4}\n",
        )
        .unwrap();
        cfg.validate(ONLINE).unwrap();
        let PortKind::Gen(g) = &cfg.ports[0].kind else {
            panic!("not a gen port: {:?}", cfg.ports[0]);
        };
        assert_eq!(g.mac.map(|m| m.get().octets()), Some([2, 0, 0, 0, 0, 1]));
        let g = g.generate.as_ref().unwrap();
        assert_eq!(g.dst.octets(), [2, 0, 0, 0, 0, 2]);
        assert_eq!((g.size, g.rate, g.flows, g.count), (64, 1000, 4, 0));
    }

    #[test]
    fn vhost_user_mode_defaults_to_server() {
        let cfg =
            Config::from_toml("[[port]]\nname='v'\ntype='vhost-user'\nsocket='/s'\nqueues=16\n")
                .unwrap();
        assert_eq!(cfg.ports[0].vhost_mode(), Some(VhostMode::Server));
        assert_eq!(
            cfg.ports[0].socket().unwrap().as_path(),
            std::path::Path::new("/s")
        );
        assert_eq!(cfg.ports[0].kind.to_string(), "vhost-user");
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
            cfg.ports[0].qos_settings(),
            QosSettings {
                min: Some(400_000_000),
                max: Some(1_000_000_000),
                weight: 2
            }
        );
        let cfg = Config::from_toml("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={min='0'}\n")
            .unwrap();
        assert_eq!(cfg.ports[0].qos_settings(), QosSettings::default());
        for (text, needle) in [
            ("[switch]\nreservable = 0.7\n[[port]]\nname='up'\ntype='tap'\nifname='u'\ncapacity='1G'\n[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={min='400M'}\n[[port]]\nname='b'\ntype='tap'\nifname='b'\nqos={min='400M'}\n", "add up to 800M, above reservable 0.7 x capacity 1G = 700M"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={weight=0}\n", "weight = 0 is out of range"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={max='0'}\n", "max must be above 0"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={min='2G', max='1G'}\n", "min 2G is above max 1G"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={max='fast'}\n", "qos.max: 'fast' is not a rate"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1Q'\n", "capacity: '1Q' is not a rate"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='0'\n", "capacity must be above 0"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1G'\nqos={max='1G'}\n", "takes no qos"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1G'\n[[port]]\nname='b'\ntype='tap'\nifname='b'\ncapacity='1G'\n", "both uplinks"),
            // A trunk uplink serves the ports of the VLANs it carries tagged, too.
            ("[[port]]\nname='up'\ntype='tap'\nifname='u'\ncapacity='1G'\nvlan=5\nvlans='10,20'\n[[port]]\nname='a'\ntype='tap'\nifname='a'\nvlan=10\nqos={min='500M'}\n[[port]]\nname='b'\ntype='tap'\nifname='b'\nvlan=20\nqos={min='500M'}\n", "the guarantees toward uplink 'up' add up to 1G"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1G'\nvlan=5\nvlans='10,20'\n[[port]]\nname='b'\ntype='tap'\nifname='b'\ncapacity='1G'\nvlan=20\n", "'a' and 'b' are both uplinks (capacity) of VLAN 20"),
            ("[switch]\nreservable = 0\n", "reservable = 0 is out of range"),
            ("[switch]\nreservable = 1.5\n", "reservable = 1.5 is out of range"),
            ("[[port]]\nname='a'\ntype='tap'\nifname='a'\nqos={mni='1G'}\n", "mni"),
        ] {
            let e = err(text);
            assert!(e.contains(needle), "{needle}: {e}");
        }
        // Uplinks of different VLANs are independent.
        check("[[port]]\nname='a'\ntype='tap'\nifname='a'\ncapacity='1G'\n[[port]]\nname='b'\ntype='tap'\nifname='b'\nvlan=5\ncapacity='1G'\n").unwrap();
        // reservable = 1 is an integer in TOML.
        assert_eq!(
            Config::from_toml("[switch]\nreservable = 1\n")
                .unwrap()
                .switch
                .reservable
                .get(),
            1.0
        );
    }

    #[test]
    fn placement_keys() {
        let cfg = Config::from_toml(
            "[switch]\nworkers='0-1'\nreserved_cpus='0'\nplacement='static'\n[[port]]\nname='a'\ntype='tap'\nifname='x'\ncpus='0-1:1'\n",
        )
        .unwrap();
        cfg.validate(ONLINE).unwrap();
        assert_eq!(cfg.switch.reserved_list(), vec![0]);
        assert_eq!(
            Config::default().switch.reserved_list(),
            Vec::<usize>::new()
        );
        assert_eq!(cfg.switch.placement, PlacementMode::Static);
        assert_eq!(cfg.ports[0].cpu_set(), Some(vec![0, 1]));
        let e = err("[switch]\nreserved_cpus='x'\n");
        assert!(
            e.contains("line 2: reserved_cpus: bad CPU list item 'x'"),
            "{e}"
        );
        let e = err("[[port]]\nname='a'\ntype='tap'\nifname='x'\ncpus='3-1'\n");
        assert!(e.contains("line 5: cpus: bad CPU range '3-1'"), "{e}");
        let e = check("[switch]\nplacement='wild'\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
    }

    /// A port built in code is checked where it is used (`Switch::add_port`, `port add`).
    #[test]
    fn ports_built_in_code_validate() {
        let mut p = PortConfig::gen("g");
        p.validate().unwrap();
        p.queues = 0;
        assert!(p.validate().unwrap_err().to_string().contains("queues = 0"));
        let mut p = PortConfig::gen("no spaces");
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("name must be"));
        p.name = "ok".into();
        p.qos = Some(QosConfig {
            weight: None,
            min: Some("2G".parse().unwrap()),
            max: Some("1G".parse().unwrap()),
        });
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("min 2G is above max 1G"));
        // The control protocol's JSON goes through the same checks as the file.
        let json = r#"{"name":"a","type":"tap","queues":1}"#;
        let e = serde_json::from_str::<PortConfig>(json).unwrap_err();
        assert!(
            e.to_string().contains("port 'a': type tap needs ifname"),
            "{e}"
        );
        let json = r#"{"name":"a","type":"tap","ifname":"qs-a","colour":"red"}"#;
        assert!(serde_json::from_str::<PortConfig>(json).is_err());
    }

    #[test]
    fn veth_port_keys() {
        let cfg = Config::from_toml("[[port]]\nname='c1'\ntype='veth'\nifname='qs-c1'\n").unwrap();
        assert_eq!(
            cfg.ports[0].kind,
            PortKind::Veth(VethConfig {
                ifname: "qs-c1".parse().unwrap(),
                fastpath: true,
            })
        );
        assert_eq!(cfg.ports[0].ifname().map(|i| i.as_str()), Some("qs-c1"));
        assert_eq!(Config::from_toml(&cfg.to_toml().unwrap()).unwrap(), cfg);
        let off = Config::from_toml(
            "[[port]]\nname='c1'\ntype='veth'\nifname='qs-c1'\nfastpath=false\nqueues=2\n",
        )
        .unwrap();
        assert!(matches!(&off.ports[0].kind, PortKind::Veth(v) if !v.fastpath));
        assert_eq!(off.ports[0].queues, 2);
        let e = Config::from_toml("[[port]]\nname='c1'\ntype='veth'\n").unwrap_err();
        assert!(e.to_string().contains("type veth needs ifname"), "{e}");
        let e = Config::from_toml("[[port]]\nname='t'\ntype='tap'\nifname='t'\nfastpath=true\n")
            .unwrap_err();
        assert!(e.to_string().contains("fastpath"), "{e}");
    }

    #[test]
    fn owner_round_trips() {
        let text = "[[port]]\nname='cni-1'\ntype='veth'\nifname='qc1'\n\
                    owner = { cni = 'tenant-a', container = 'abc', ifname = 'eth0' }\n";
        let cfg = Config::from_toml(text).unwrap();
        let owner = cfg.ports[0].owner.as_deref().expect("owner");
        assert_eq!(
            (
                owner.cni.as_str(),
                owner.container.as_str(),
                owner.ifname.as_str()
            ),
            ("tenant-a", "abc", "eth0")
        );
        assert_eq!(Config::from_toml(&cfg.to_toml().unwrap()).unwrap(), cfg);
        let json = serde_json::to_string(&cfg.ports[0]).unwrap();
        assert!(json.contains(r#""owner":{"cni":"tenant-a""#), "{json}");
        assert_eq!(
            serde_json::from_str::<PortConfig>(&json).unwrap(),
            cfg.ports[0]
        );
        let e = Config::from_toml(&text.replace("ifname = 'eth0'", "ifnam = 'eth0'")).unwrap_err();
        assert!(e.to_string().contains("ifnam"), "{e}");
    }

    #[test]
    fn afxdp_port_keys() {
        let cfg = Config::from_toml("[[port]]\nname='up'\ntype='afxdp'\nifname='eth1'\n").unwrap();
        assert_eq!(
            cfg.ports[0].kind,
            PortKind::AfXdp(AfXdpConfig {
                ifname: "eth1".parse().unwrap(),
                queues: None,
                mode: XdpMode::Auto,
            })
        );
        assert_eq!(cfg.ports[0].ifname().map(|i| i.as_str()), Some("eth1"));
        let dumped = cfg.to_toml().unwrap();
        assert!(!dumped.contains("queues"), "{dumped}");
        assert_eq!(Config::from_toml(&dumped).unwrap(), cfg);

        let cfg = Config::from_toml(
            "[[port]]\nname='up'\ntype='afxdp'\nifname='eth1'\nqueues=4\nmode='skb'\n",
        )
        .unwrap();
        assert_eq!(cfg.ports[0].queues, 4);
        let PortKind::AfXdp(a) = &cfg.ports[0].kind else {
            panic!("{cfg:?}")
        };
        assert_eq!((a.queues, a.mode), (Some(4), XdpMode::Skb));
        let json = serde_json::to_string(&cfg.ports[0]).unwrap();
        assert_eq!(
            serde_json::from_str::<PortConfig>(&json).unwrap(),
            cfg.ports[0]
        );

        for (text, want) in [
            (
                "[[port]]\nname='up'\ntype='afxdp'\n",
                "config line 1: port 'up': type afxdp needs ifname",
            ),
            (
                "[[port]]\nname='up'\ntype='afxdp'\nifname='e'\nmode='fast'\n",
                "config line 5: mode: unknown variant `fast`",
            ),
            (
                "[[port]]\nname='up'\ntype='afxdp'\nifname='e'\nmode='server'\n",
                "config line 1: port 'up': mode 'server' does not apply to type afxdp \
                 (expected auto, native, skb or packet)",
            ),
            (
                "[[port]]\nname='v'\ntype='vhost-user'\nsocket='/s'\nmode='native'\n",
                "config line 1: port 'v': mode 'native' does not apply to type vhost-user \
                 (expected server or client)",
            ),
            (
                "[[port]]\nname='up'\ntype='afxdp'\nifname='e'\nqueues=0\n",
                "config line 1: port 'up': queues = 0 is out of range 1..=256 for type afxdp",
            ),
            (
                "[[port]]\nname='up'\ntype='afxdp'\nifname='e'\nsocket='/s'\n",
                "config line 1: port 'up': key 'socket' does not apply to type afxdp",
            ),
            (
                "[[port]]\nname='up'\ntype='afxdp'\nifname='e'\n[[port]]\nname='t'\ntype='tap'\nifname='e'\n",
                "duplicate ifname 'e' (ports 'up' and 't')",
            ),
        ] {
            let e = err(text);
            assert!(e.starts_with(want) || e.contains(want), "{e}\nwant: {want}");
        }
        let e = "turbo".parse::<ModeKey>().unwrap_err();
        assert!(e.contains("auto, native, skb or packet"), "{e}");
    }

    /// The ```toml block of this module's documentation.
    #[test]
    fn module_doc_example_parses() {
        let src = include_str!("config.rs");
        let start = src.find("//! ```toml\n").expect("example") + 12;
        let end = start + src[start..].find("//! ```").expect("end");
        let text: String = src[start..end]
            .lines()
            .map(|l| l.strip_prefix("//!").unwrap_or(l).trim_start_matches(' '))
            .collect::<Vec<_>>()
            .join("\n");
        let cfg = Config::from_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        cfg.validate(ONLINE).unwrap();
        assert_eq!(cfg.ports.len(), 7);
        assert!(cfg.ports[4].vlans.is_some() && cfg.ports[4].security.is_some());
    }

    /// The ```toml blocks of README.md.
    fn readme_examples() -> Vec<String> {
        let readme = include_str!("../../../README.md");
        let mut blocks = Vec::new();
        let mut rest = readme;
        while let Some(i) = rest.find("```toml\n") {
            let body = &rest[i + 8..];
            let end = body.find("```").expect("closed code block");
            blocks.push(body[..end].to_string());
            rest = &body[end + 3..];
        }
        blocks
    }

    /// `qswitch demo`'s embedded config with its placeholders filled in.
    fn demo_config() -> String {
        include_str!("../../lab/src/demo.toml")
            .replace("{workers}", "0-1")
            .replace("{control}", "/tmp/qswitch-demo/control.sock")
            .replace("{tap_a}", "qsdA1")
            .replace("{tap_b}", "qsdB1")
    }

    /// Every key there is, with values that differ from the defaults.
    const EVERY_KEY: &str = r#"
[switch]
workers = "0,1"
control = "/run/q/c.sock"
fdb_aging = 60
poll_spin_us = 0
reserved_cpus = "1"
placement = "static"
reservable = 0.55
http = "[::1]:9470"

[[port]]
name = "up"
type = "tap"
ifname = "qs-up"
queues = 256
vlan = 4094
cpus = "0-1:1"
capacity = "1.234567G"

[[port]]
name = "vm.1"
type = "vhost-user"
socket = "/run/q/vm1.sock"
mode = "client"
queues = 16
vlan = 4094
qos = { min = "0", max = "123456789", weight = 1000 }
vlans = "1,7,100-4094"
security = { macs = ["02:00:00:00:00:0a"], ips = ["0.0.0.0/0", "fe80::/10"], mac_limit = 0, dhcp_guard = true, ra_guard = true }
storm = { broadcast = 0, multicast = 9223372036854775807, unknown_unicast = 1 }

[[port]]
name = "g_2"
type = "gen"
mac = "0A:00:00:00:00:01"
generate = { dst = "ff:ff:ff:ff:ff:ff", size = 9018, rate = 9223372036854775807, flows = 65535, count = 1 }

[[port]]
name = "sink"
type = "gen"

[[port]]
name = "vx6"
type = "vxlan"
vni = 16777215
local = "fd00::1"
remotes = ["fd00::2", "fd00::3"]
dstport = 8472
learning = false
udp_csum = false
vlan = 7

[[port]]
name = "nic0"
type = "afxdp"
ifname = "eth0"
queues = 8
mode = "native"
vlan = 10
capacity = "10G"
"#;

    #[test]
    fn vxlan_ports() {
        let base = "[[port]]\nname='vx'\ntype='vxlan'\n";
        let cfg = Config::from_toml(&format!("{base}vni=100\nlocal='192.0.2.1'\n")).unwrap();
        assert_eq!(
            cfg.ports[0].kind,
            PortKind::Vxlan(VxlanConfig {
                vni: 100,
                local: "192.0.2.1".parse().unwrap(),
                remotes: vec![],
                dstport: VXLAN_PORT,
                learning: true,
                udp_csum: None,
            })
        );
        for (keys, want) in [
            ("local='192.0.2.1'\n", "type vxlan needs vni"),
            ("vni=1\n", "type vxlan needs local"),
            (
                "vni=16777216\nlocal='192.0.2.1'\n",
                "vni = 16777216 is out of range",
            ),
            (
                "vni=1\nlocal='192.0.2.1'\nremotes=['fd00::1']\n",
                "remote fd00::1 is not of the address family of local 192.0.2.1",
            ),
            (
                "vni=1\nlocal='192.0.2.1'\ndstport=0\n",
                "dstport must not be 0",
            ),
            (
                "vni=1\nlocal='192.0.2.1'\nqueues=2\n",
                "queues = 2 is out of range 1..=1",
            ),
            (
                "vni=1\nlocal='192.0.2.1'\nifname='x'\n",
                "key 'ifname' does not apply",
            ),
            ("vni=1\nlocal='nope'\n", "local"),
        ] {
            let e = err(&format!("{base}{keys}"));
            assert!(e.contains(want), "{keys}: {e}");
        }
        let e = err("[[port]]\nname='t'\ntype='tap'\nifname='x'\nvni=1\n");
        assert!(e.contains("key 'vni' does not apply to type tap"), "{e}");
    }

    #[test]
    fn every_example_parses_and_validates() {
        let examples = readme_examples();
        assert_eq!(examples.len(), 3, "README.md's config examples");
        for text in examples
            .iter()
            .map(String::as_str)
            .chain([demo_config().as_str(), EVERY_KEY])
        {
            let cfg = Config::from_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
            cfg.validate(ONLINE)
                .unwrap_or_else(|e| panic!("{e}\n{text}"));
        }
    }

    /// What `qswitch config dump` will print reads back as the same configuration.
    #[test]
    fn round_trip_through_toml() {
        let mut texts = readme_examples();
        texts.push(demo_config());
        texts.push(EVERY_KEY.to_string());
        texts.push(String::new());
        for text in texts {
            let cfg = Config::from_toml(&text).unwrap();
            let dumped = cfg.to_toml().unwrap();
            let again = Config::from_toml(&dumped).unwrap_or_else(|e| panic!("{e}\n{dumped}"));
            assert_eq!(again, cfg, "{dumped}");
            assert_eq!(again.to_toml().unwrap(), dumped);
        }
        let cfg = Config::from_toml(EVERY_KEY).unwrap();
        let dumped = cfg.to_toml().unwrap();
        for needle in [
            "capacity = \"1234.567M\"",
            "mac = \"0a:00:00:00:00:01\"",
            "mode = \"client\"",
            "mode = \"native\"",
            "http = \"[::1]:9470\"",
        ] {
            assert!(dumped.contains(needle), "{needle}\n{dumped}");
        }
        for p in &cfg.ports {
            let json = serde_json::to_string(p).unwrap();
            assert_eq!(&serde_json::from_str::<PortConfig>(&json).unwrap(), p);
        }
    }

    #[test]
    fn lldp_key_defaults_to_rx_on_uplinks_and_needs_an_interface() {
        let port = |keys: &str| {
            Config::from_toml(&format!(
                "[switch]\nworkers = \"0\"\n[[port]]\nname = \"p\"\n{keys}\n"
            ))
            .map(|c| c.ports[0].clone())
        };
        let nic = port("type = \"afxdp\"\nifname = \"eth1\"").unwrap();
        assert_eq!((nic.lldp, nic.lldp_mode()), (None, LldpMode::Rx));
        let tap = port("type = \"tap\"\nifname = \"t0\"").unwrap();
        assert_eq!(tap.lldp_mode(), LldpMode::Off);
        let up = port("type = \"tap\"\nifname = \"t0\"\ncapacity = \"1G\"").unwrap();
        assert_eq!(up.lldp_mode(), LldpMode::Rx);
        let both = port("type = \"veth\"\nifname = \"v0\"\nlldp = \"both\"").unwrap();
        assert_eq!(both.lldp_mode(), LldpMode::Both);
        let off = port("type = \"afxdp\"\nifname = \"eth1\"\nlldp = \"off\"").unwrap();
        assert_eq!(off.lldp_mode(), LldpMode::Off);
        // A bond is an uplink: rx on each member by default, both allowed.
        let members = "members = [ { type = \"veth\", ifname = \"m0\" } ]";
        let bond = port(&format!("type = \"bond\"\n{members}")).unwrap();
        assert_eq!((bond.lldp_ifname(), bond.lldp_mode()), (None, LldpMode::Rx));
        let bond = port(&format!("type = \"bond\"\n{members}\nlldp = \"both\"")).unwrap();
        assert_eq!(bond.lldp_mode(), LldpMode::Both);
        // Dumped and read back with the key.
        let cfg = Config {
            ports: vec![both.clone()],
            ..Config::from_toml("[switch]\nworkers = \"0\"\n").unwrap()
        };
        let dumped = cfg.to_toml().unwrap();
        assert!(dumped.contains("lldp = \"both\""), "{dumped}");
        assert_eq!(Config::from_toml(&dumped).unwrap().ports[0], both);
        let e = port("type = \"gen\"\nlldp = \"rx\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lldp needs a kernel interface"), "{e}");
        assert!(!e.contains('\n'));
        let e = port("type = \"tap\"\nifname = \"t0\"\nlldp = \"tx\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("lldp"), "{e}");
    }

    mod prop {
        use proptest::prelude::*;

        use super::super::*;

        fn rate() -> impl Strategy<Value = Option<Rate>> {
            proptest::option::of((0..=crate::value::MAX_RATE).prop_map(Rate::from_bps))
        }

        fn port() -> impl Strategy<Value = PortConfig> {
            let kind = prop_oneof![
                "[a-z][a-z0-9]{0,14}".prop_map(|i| PortKind::Tap(TapConfig {
                    ifname: i.parse().unwrap()
                })),
                ("[a-z][a-z0-9]{0,14}", any::<bool>()).prop_map(|(i, fastpath)| {
                    PortKind::Veth(VethConfig {
                        ifname: i.parse().unwrap(),
                        fastpath,
                    })
                }),
                ("/[a-z]{1,40}", any::<bool>()).prop_map(|(s, client)| {
                    PortKind::VhostUser(VhostUserConfig {
                        socket: s.parse().unwrap(),
                        mode: if client {
                            VhostMode::Client
                        } else {
                            VhostMode::Server
                        },
                    })
                }),
                (
                    "[a-z][a-z0-9]{0,14}",
                    proptest::option::of(1..=256u16),
                    0..4u8
                )
                    .prop_map(|(i, queues, m)| PortKind::AfXdp(AfXdpConfig {
                        ifname: i.parse().unwrap(),
                        queues,
                        mode: [
                            XdpMode::Auto,
                            XdpMode::Native,
                            XdpMode::Skb,
                            XdpMode::Packet
                        ][usize::from(m)],
                    })),
                (proptest::option::of(any::<[u8; 6]>()), any::<bool>()).prop_map(|(mac, g)| {
                    PortKind::Gen(GenPortConfig {
                        mac: mac.and_then(|mut m| {
                            m[0] &= 0xfe;
                            UnicastMac::try_from(MacAddress(m)).ok()
                        }),
                        generate: g.then_some(GenConfig {
                            dst: MacAddress([0xff; 6]),
                            size: 64,
                            rate: 7,
                            flows: 3,
                            count: 0,
                            ip: None,
                        }),
                    })
                }),
            ];
            (
                "[A-Za-z0-9._-]{1,32}",
                1..=16u16,
                proptest::option::of(1..=4094u16),
                proptest::option::of(proptest::collection::vec(0..64usize, 1..5)),
                rate(),
                kind,
            )
                .prop_map(|(name, queues, vlan, cpus, capacity, kind)| PortConfig {
                    name,
                    // An afxdp port's queue count before it is opened is the one asked for.
                    queues: match &kind {
                        PortKind::AfXdp(a) => a.queues.unwrap_or(1),
                        _ => queues,
                    },
                    vlan: vlan.map(|v| VlanId::try_from(v).unwrap()),
                    cpus: cpus.and_then(CpuList::from_cpus),
                    qos: None,
                    capacity: capacity.filter(|c| c.bps() > 0),
                    vlans: None,
                    security: None,
                    storm: None,
                    owner: None,
                    link_local_forward: None,
                    bpdu_guard: false,
                    kind,
                    security_groups: Vec::new(),
                    max_sessions: None,
                    lldp: None,
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// Edits of a full config (the fuzz target's property, on stable): no panic, a
            /// one-line error, or a config that dumps and parses back equal.
            #[test]
            fn edited_text_errs_in_one_line_or_round_trips(
                edits in proptest::collection::vec(
                    (any::<prop::sample::Index>(), 0..3u8, "[a-z0-9 =.:'\"{},\\[\\]\n_-]{0,3}"),
                    1..4,
                ),
            ) {
                let mut text = super::EVERY_KEY.to_string();
                for (at, op, s) in edits {
                    let mut i = at.index(text.len() + 1);
                    while !text.is_char_boundary(i) {
                        i -= 1;
                    }
                    match op {
                        0 => text.insert_str(i, &s),
                        1 => {
                            let end = (i + s.len().max(1)).min(text.len());
                            if text.is_char_boundary(end) {
                                text.replace_range(i..end, &s);
                            }
                        }
                        _ => {
                            let end = (i + 1 + s.len()).min(text.len());
                            if text.is_char_boundary(end) {
                                text.replace_range(i..end, "");
                            }
                        }
                    }
                }
                match Config::from_toml(&text) {
                    Ok(cfg) => {
                        if let Err(e) = cfg.validate(&[0, 1]) {
                            prop_assert!(!e.to_string().contains('\n'));
                        }
                        let dumped = cfg.to_toml().unwrap();
                        prop_assert_eq!(Config::from_toml(&dumped).unwrap(), cfg);
                    }
                    Err(e) => prop_assert!(!e.to_string().contains('\n'), "{}", e),
                }
            }

            #[test]
            fn any_port_round_trips(ports in proptest::collection::vec(port(), 0..4), max in rate()) {
                let mut cfg = Config { ports, ..Config::default() };
                if let Some(p) = cfg.ports.first_mut() {
                    if p.capacity.is_none() {
                        p.qos = Some(QosConfig {
                            min: None,
                            max: max.filter(|m| m.bps() > 0),
                            weight: Some(Weight::try_from(3).unwrap()),
                        });
                    }
                }
                let dumped = cfg.to_toml().unwrap();
                prop_assert_eq!(Config::from_toml(&dumped).unwrap(), cfg);
            }
        }
    }
}

#[cfg(test)]
mod export_tests {
    use super::*;

    fn parse(extra: &str) -> Result<Config, String> {
        Config::from_toml(&format!("[switch]\nworkers = \"0\"\n{extra}")).map_err(|e| e.to_string())
    }

    #[test]
    fn ipfix_and_sflow_tables() {
        let c = parse(
            "[switch.ipfix]\ncollector = \"192.0.2.9:4739\"\nsampling = 10\n\
             active_timeout = 30\nidle_timeout = 5\n\
             [switch.sflow]\ncollector = \"[2001:db8::9]:6343\"\nsampling = 1000\n",
        )
        .unwrap();
        let i = c.switch.ipfix.unwrap();
        assert_eq!(i.collector, "192.0.2.9:4739".parse().unwrap());
        assert_eq!((i.sampling, i.active_timeout, i.idle_timeout), (10, 30, 5));
        let s = c.switch.sflow.unwrap();
        assert_eq!((s.sampling, s.polling), (1000, 20));
        assert_eq!(Config::from_toml(&c.to_toml().unwrap()).unwrap(), c);
        let defaults = parse("[switch.ipfix]\ncollector = \"127.0.0.1:4739\"\n").unwrap();
        let d = defaults.switch.ipfix.unwrap();
        assert_eq!((d.sampling, d.active_timeout, d.idle_timeout), (1, 60, 15));
    }

    #[test]
    fn bad_export_settings_are_one_line_errors() {
        for (text, want) in [
            (
                "[switch.ipfix]\ncollector = \"192.0.2.9:4739\"\nsampling = 0\n",
                "sampling = 0: must be at least 1",
            ),
            (
                "[switch.sflow]\ncollector = \"192.0.2.9:6343\"\nsampling = 0\n",
                "[switch.sflow] sampling = 0",
            ),
            (
                "[switch.ipfix]\ncollector = \"collector.example:4739\"\n",
                "collector = \"collector.example:4739\": expected a unicast IP address",
            ),
            ("[switch.ipfix]\ncollector = \"192.0.2.9\"\n", "expected a unicast IP"),
            ("[switch.ipfix]\ncollector = \"0.0.0.0:4739\"\n", "expected a unicast IP"),
            ("[switch.sflow]\ncollector = \"192.0.2.9:0\"\nsampling = 1\n", "e.g. \"192.0.2.9:6343\""),
            (
                "[switch.ipfix]\ncollector = \"192.0.2.9:4739\"\nidle_timeout = 0\n",
                "must both be at least 1 second",
            ),
            (
                "[switch.ipfix]\ncollector = \"192.0.2.9:4739\"\nactive_timeout = 10\nidle_timeout = 30\n",
                "idle_timeout = 30 is above active_timeout = 10",
            ),
            ("[switch.ipfix]\ncollector = \"192.0.2.9:4739\"\nsampels = 3\n", "unknown field"),
            ("[switch.sflow]\ncollector = \"192.0.2.9:6343\"\n", "missing field `sampling`"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}

#[cfg(test)]
mod security_group_tests {
    use super::*;

    const PORT: &str = r#"
[[port]]
name = "vm1"
type = "tap"
ifname = "vm1"
security = { ips = ["10.0.0.5"] }
security_groups = ["web"]
max_sessions = 1000
"#;

    fn group(rules: &str) -> String {
        format!("[[security_group]]\nname = \"web\"\nrules = [\n{rules}\n]\n{PORT}")
    }

    fn err(text: &str) -> String {
        let e = Config::from_toml(text)
            .and_then(|c| c.validate(&[0, 1]).map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    }

    #[test]
    fn address_sets_parse_and_round_trip() {
        let text = group(r#"{ direction = "egress" },"#).replace(
            "rules = [",
            "addresses = [\"10.0.0.7\", \"fd00::/64\"]\nrules = [",
        );
        let c = Config::from_toml(&text).unwrap();
        assert_eq!(c.security_groups[0].addresses.len(), 2);
        assert_eq!(Config::from_toml(&c.to_toml().unwrap()).unwrap(), c);
        let e = err(&text.replace("10.0.0.7", "10.0.0.300"));
        assert!(e.contains("10.0.0.300"), "{e}");
    }

    #[test]
    fn the_issue_example_parses_and_round_trips() {
        let text = group(
            r#"{ direction = "ingress", protocol = "tcp", ports = "80,443", remote = "0.0.0.0/0" },
  { direction = "ingress", protocol = "icmp", remote_group = "web" },
  { direction = "ingress", protocol = 132, ports = 9000 },
  { direction = "ingress", protocol = "icmpv6", icmp_type = 128, icmp_code = 0 },
  { direction = "ingress", ethertype = "ipv6", protocol = "udp", ports = "1000-2000, 53" },
  { direction = "egress" },"#,
        ) + "[firewall]\nmax_sessions = 100000\nudp_unreplied = 10\n";
        let c = Config::from_toml(&text).unwrap();
        c.validate(&[0, 1]).unwrap();
        let g = &c.security_groups[0];
        assert_eq!(g.rules.len(), 6);
        assert_eq!(g.rules[0].protocol, RuleProtocol::Tcp);
        assert_eq!(
            g.rules[0].ports,
            Some(PortRanges(vec![(80, 80), (443, 443)]))
        );
        assert_eq!(
            g.rules[1].remote,
            Some(RuleRemote::Group("web".to_string()))
        );
        assert_eq!(g.rules[2].protocol.number(), Some(132));
        assert_eq!(
            g.rules[4].ports.as_ref().unwrap().0,
            vec![(1000, 2000), (53, 53)]
        );
        assert!(g.rules[4].ports.as_ref().unwrap().contains(1500));
        assert_eq!(g.rules[5].protocol, RuleProtocol::Any);
        assert_eq!(c.ports[0].security_groups, vec!["web".to_string()]);
        assert_eq!(c.ports[0].max_sessions, Some(1000));
        assert_eq!(c.firewall.unwrap().udp_unreplied, Some(10));
        // What the state file and `config dump` write reads back equal.
        let back = Config::from_toml(&c.to_toml().unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn unknown_group() {
        let text = PORT.replace("[\"web\"]", "[\"db\"]");
        let text = format!("[[security_group]]\nname = \"web\"\n{text}");
        assert_eq!(err(&text), "port 'vm1': unknown security group 'db'");
        let e = err(&group(r#"{ direction = "ingress", remote_group = "db" },"#));
        assert_eq!(e, "security group 'web' rule 0: unknown remote_group 'db'");
        let e = err(&format!(
            "[[security_group]]\nname = \"web\"\n[[security_group]]\nname = \"web\"\n{PORT}"
        ));
        assert_eq!(e, "duplicate security group name 'web'");
    }

    #[test]
    fn bad_cidr() {
        let e = err(&group(
            r#"{ direction = "ingress", remote = "10.0.0.0/33" },"#,
        ));
        assert!(
            e.starts_with("config line ") && e.contains("remote: '10.0.0.0/33'"),
            "{e}"
        );
        let e = err(&group(r#"{ direction = "ingress", remote = "10.0.0.x" },"#));
        assert!(e.contains("remote: '10.0.0.x' is not an IP address"), "{e}");
        let e = err(&group(
            r#"{ direction = "ingress", ethertype = "ipv6", remote = "10.0.0.0/8" },"#,
        ));
        assert!(
            e.contains("remote 10.0.0.0/8 is not of ethertype ipv6"),
            "{e}"
        );
    }

    #[test]
    fn port_range_reversed() {
        let e = err(&group(
            r#"{ direction = "ingress", protocol = "tcp", ports = "22,90-80" },"#,
        ));
        assert!(
            e.contains("ports '22,90-80': range 90-80 is reversed"),
            "{e}"
        );
        let e = err(&group(
            r#"{ direction = "ingress", protocol = "tcp", ports = "http" },"#,
        ));
        assert!(e.contains("ports 'http' is not a list"), "{e}");
        let e = err(&group(r#"{ direction = "ingress", ports = "80" },"#));
        assert!(e.contains("ports need protocol tcp, udp or sctp"), "{e}");
    }

    #[test]
    fn remote_and_remote_group_together() {
        let e = err(&group(
            r#"{ direction = "ingress", remote = "10.0.0.0/8", remote_group = "web" },"#,
        ));
        assert!(e.contains("remote and remote_group are exclusive"), "{e}");
    }

    #[test]
    fn protocol_number_out_of_range() {
        let e = err(&group(r#"{ direction = "ingress", protocol = 256 },"#));
        assert!(
            e.contains("protocol number 256 is out of range 0..=255"),
            "{e}"
        );
        let e = err(&group(r#"{ direction = "ingress", protocol = "-1" },"#));
        assert!(e.contains("protocol number -1 is out of range"), "{e}");
        let e = err(&group(r#"{ direction = "ingress", protocol = "gre" },"#));
        assert!(e.contains("protocol 'gre' is not tcp"), "{e}");
    }

    #[test]
    fn other_rule_errors() {
        let e = err(&group(
            r#"{ direction = "ingress", protocol = "tcp", icmp_type = 8 },"#,
        ));
        assert!(
            e.contains("icmp_type and icmp_code need protocol icmp"),
            "{e}"
        );
        let e = err(&group(
            r#"{ direction = "ingress", protocol = "icmp", icmp_type = 300 },"#,
        ));
        assert!(e.contains("icmp_type = 300 is out of range"), "{e}");
        let e = err(&group(
            r#"{ direction = "ingress", protocol = "icmp", icmp_code = 0 },"#,
        ));
        assert!(e.contains("icmp_code needs icmp_type"), "{e}");
        let e = err(&group(
            r#"{ direction = "ingress", protocol = "icmp", ethertype = "ipv6" },"#,
        ));
        assert!(
            e.contains("protocol icmp does not go with ethertype ipv6"),
            "{e}"
        );
        let e = err(&group(r#"{ direction = "sideways" },"#));
        assert!(e.starts_with("config line "), "{e}");
        let e = err(&group(r#"{ direction = "ingress", port = 80 },"#));
        assert!(e.contains("unknown field"), "{e}");
        let e = err(&PORT.replace("max_sessions = 1000", "max_sessions = 0"));
        assert!(e.contains("max_sessions must be at least 1"), "{e}");
        let e = err(&format!(
            "[[security_group]]\nname = \"we b\"\n{}",
            PORT.replace("[\"web\"]", "[]")
        ));
        assert!(e.contains("security group name 'we b'"), "{e}");
    }
}

#[cfg(test)]
mod mirror_tests {
    use super::*;

    const PORTS: &str = "[[port]]\nname = \"a\"\ntype = \"gen\"\n[[port]]\nname = \"b\"\ntype = \"gen\"\n[[port]]\nname = \"m\"\ntype = \"gen\"\n";

    fn parse(mirror: &str) -> Result<Config, String> {
        Config::from_toml(&format!("{PORTS}[[mirror]]\n{mirror}")).map_err(|e| e.to_string())
    }

    #[test]
    fn sessions_parse_and_dump_back() {
        let c = parse(
            "name = \"ids\"\nsources = [\"a\", \"b\"]\ndirection = \"rx\"\nvlans = \"10,20\"\noutput = \"m\"\n",
        )
        .unwrap();
        let m = &c.mirrors[0];
        assert_eq!(m.direction, MirrorDirection::Rx);
        assert!(m.vlans.as_ref().unwrap().contains(20));
        let remote = parse(
            "name = \"r\"\nsources = [\"a\"]\nremote = { type = \"erspan\", dst = \"192.0.2.9\", session = 5, ttl = 8 }\n",
        )
        .unwrap();
        assert_eq!(remote.mirrors[0].direction, MirrorDirection::Both);
        for c in [c, remote] {
            let text = c.to_toml().unwrap();
            assert_eq!(Config::from_toml(&text).unwrap(), c, "{text}");
        }
    }

    #[test]
    fn bad_sessions_are_one_line_errors() {
        for (m, want) in [
            ("name = \"x\"\nsources = [\"z\"]\noutput = \"m\"\n", "unknown source port 'z'"),
            ("name = \"x\"\nsources = [\"a\"]\noutput = \"a\"\n", "output port 'a' is also a source"),
            ("name = \"x\"\nsources = [\"a\"]\noutput = \"q\"\n", "unknown output port 'q'"),
            (
                "name = \"x\"\nsources = [\"a\"]\noutput = \"m\"\nremote = { type = \"erspan\", dst = \"192.0.2.9\", session = 5 }\n",
                "both output and remote",
            ),
            ("name = \"x\"\nsources = [\"a\"]\n", "no output or remote"),
            (
                "name = \"x\"\nsources = [\"a\"]\nremote = { type = \"erspan\", dst = \"192.0.2.9\", session = 1024 }\n",
                "bad session id 1024",
            ),
            (
                "name = \"x\"\nsources = [\"a\"]\nremote = { type = \"erspan\", dst = \"2001:db8::1\", session = 1 }\n",
                "bad remote address 2001:db8::1",
            ),
            (
                "name = \"x\"\nsources = [\"a\"]\nremote = { type = \"erspan\", dst = \"192.0.2\", session = 1 }\n",
                "invalid IP address syntax",
            ),
            ("name = \"x\"\nsources = [\"a\"]\ndirection = \"up\"\noutput = \"m\"\n", "direction"),
        ] {
            let e = parse(m).unwrap_err();
            assert!(e.contains(want), "{m}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        // A source of one session cannot be the output of another, nor the other way round.
        let two = format!(
            "{PORTS}[[mirror]]\nname = \"x\"\nsources = [\"a\"]\noutput = \"m\"\n[[mirror]]\nname = \"y\"\nsources = [\"m\"]\noutput = \"b\"\n"
        );
        let e = Config::from_toml(&two).unwrap_err().to_string();
        assert!(
            e.contains("source port 'm' is the output of mirror 'x'"),
            "{e}"
        );
    }
}

#[cfg(test)]
mod bond_tests {
    use super::*;

    fn parse(port: &str) -> Result<Config, String> {
        let c = Config::from_toml(&format!("[switch]\nworkers = \"0\"\n{port}"))
            .map_err(|e| e.to_string())?;
        check_ifnames(&c.ports).map_err(|e| e.to_string())?;
        Ok(c)
    }

    const BOND: &str = r#"
[[port]]
name = "uplink"
type = "bond"
mode = "balance-tcp"
lacp = "active"
lacp_rate = "fast"
members = [ { type = "afxdp", ifname = "eth1", mode = "packet" }, { type = "veth", ifname = "eth2" } ]
"#;

    #[test]
    fn a_bond_parses_and_round_trips() {
        let c = parse(BOND).unwrap();
        let b = c.ports[0].bond().unwrap();
        assert_eq!(
            (b.mode, b.lacp, b.lacp_rate),
            (BondMode::BalanceTcp, LacpMode::Active, LacpRate::Fast)
        );
        assert_eq!(b.members.len(), 2);
        assert_eq!(
            b.members[1].port().unwrap().ifname().unwrap().as_str(),
            "eth2"
        );
        assert_eq!(
            c.ports[0]
                .ifnames()
                .iter()
                .map(|i| i.as_str())
                .collect::<Vec<_>>(),
            ["eth1", "eth2"]
        );
        let text = toml::to_string(&c.ports[0]).unwrap();
        let back: PortConfig = toml::from_str(&text).unwrap();
        assert_eq!(back, c.ports[0], "{text}");
        let d = parse("[[port]]\nname='b'\ntype='bond'\nmembers=[{type='tap', ifname='t0'}]\n")
            .unwrap();
        let b = d.ports[0].bond().unwrap();
        assert_eq!(
            (b.mode, b.lacp, b.lacp_rate, b.updelay, b.lacp_fallback),
            (
                BondMode::ActiveBackup,
                LacpMode::Off,
                LacpRate::Slow,
                0,
                false
            )
        );
    }

    #[test]
    fn bad_bonds_are_one_line_errors() {
        let cases = [
            (
                BOND.replace("lacp = \"active\"", "lacp = \"off\""),
                "mode balance-tcp needs lacp",
            ),
            (
                "[[port]]\nname='b'\ntype='bond'\nmembers=[]\n".to_string(),
                "a bond needs at least one member",
            ),
            (
                "[[port]]\nname='b'\ntype='bond'\n".to_string(),
                "a bond needs at least one member",
            ),
            (
                BOND.replace("type = \"veth\"", "type = \"bond\""),
                "a bond member is of type afxdp, tap or veth, not bond",
            ),
            (
                BOND.replace("eth2", "eth1"),
                "interface 'eth1' is a member twice",
            ),
            (
                format!("{BOND}[[port]]\nname='x'\ntype='tap'\nifname='eth2'\n"),
                "duplicate ifname 'eth2' (ports 'uplink' and 'x')",
            ),
            (
                BOND.replace("mode = \"balance-tcp\"", "mode = \"server\""),
                "mode 'server' does not apply to type bond",
            ),
            (
                BOND.replace("mode = \"packet\"", "mode = \"balance-slb\""),
                "bond member 'eth1': mode 'balance-slb' does not apply to type afxdp",
            ),
            (
                "[[port]]\nname='b'\ntype='bond'\nqueues=2\nmembers=[{type='tap', ifname='t0'}]\n"
                    .to_string(),
                "queues",
            ),
            (
                "[[port]]\nname='b'\ntype='tap'\nifname='t'\nlacp='active'\n".to_string(),
                "key 'lacp' does not apply to type tap",
            ),
        ];
        for (text, want) in cases {
            let e = parse(&text).unwrap_err();
            assert!(e.contains(want), "{e}\nwanted: {want}\n{text}");
            assert!(!e.contains('\n'), "one line: {e}");
        }
    }
}
