//! The control protocol: one JSON [`Request`] per line from the CLI, one JSON [`Response`] per
//! line back from the daemon, over the Unix control socket (mode 0600).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::config::PortConfig;

/// Everything the CLI can ask of the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Is the daemon there? Answered with [`Response::Pong`].
    Ping,
    /// The ports and their queues.
    PortList,
    /// Add a port live.
    PortAdd { port: PortConfig },
    /// Remove a port live.
    PortDel { name: String },
    /// Change a port's VLAN trunk, port security and storm-control settings live; fields
    /// the update leaves out keep their value.
    PortSet {
        name: String,
        #[serde(default)]
        update: crate::policy::PolicyUpdate,
    },
    /// Enable a port that BPDU guard disabled (`bpdu_guard`); a port that is enabled stays so.
    PortEnable { name: String },
    /// The MAC learning table.
    Fdb,
    /// Counters, and rates over the last second.
    Stats,
    /// A port's receive-side indirection table (vRSS).
    Rss { port: String },
    /// Where every queue runs, its load, and why.
    Placement,
    /// Pin a port's rx queue to the worker on `cpu`; `cpu: null` removes the pin.
    PlacementPin {
        port: String,
        queue: u16,
        cpu: Option<usize>,
    },
    /// Switch between dynamic and static placement.
    PlacementMode { mode: crate::config::PlacementMode },
    /// Change a port's QoS settings (bits/s). Fields left out keep their value; `clear`
    /// first resets all of them (no guarantee, no limit, weight 1). Refused, changing
    /// nothing, when the guarantees toward the uplink would exceed its reservable share.
    QosSet {
        port: String,
        #[serde(default)]
        min: Option<u64>,
        #[serde(default)]
        max: Option<u64>,
        #[serde(default)]
        weight: Option<u32>,
        #[serde(default)]
        clear: bool,
    },
    /// QoS settings, allocations and measured rates of every port.
    QosShow,
    /// Re-read the config file and apply what changed in it (as SIGHUP does).
    Reload,
    /// The effective configuration (the file plus live changes) as TOML.
    ConfigDump,
    /// Capture frames on a port. A streaming request: the daemon answers
    /// [`Response::CaptureStarted`], then [`Response::CapturePackets`] lines (at least one a
    /// second), then [`Response::CaptureEnd`] once `count` frames were sent or the port went;
    /// the capture also stops when the client closes the connection.
    Capture(CaptureRequest),
    /// What the switch would do with `frame` (hex) arriving on `port`; changes nothing.
    Trace { port: String, frame: String },
    /// The mirror sessions and their counters.
    MirrorList,
    /// Add a mirror session live.
    MirrorAdd { mirror: crate::config::MirrorConfig },
    /// Remove a mirror session live.
    MirrorDel { name: String },
    /// Flow export, live: set the protocols given (the others keep theirs). Recorded in the
    /// state file; refused whole, changing nothing, when a collector cannot be reached.
    ExportSet {
        #[serde(default)]
        ipfix: Option<crate::config::IpfixConfig>,
        #[serde(default)]
        sflow: Option<crate::config::SflowConfig>,
    },
    /// Stop exporting with `protocol` ("ipfix" or "sflow"); recorded.
    ExportOff { protocol: String },
    /// What is exported and the exporter's counters.
    ExportShow,
    /// LLDP neighbours of every port with LLDP, or of `port` only.
    Lldp {
        #[serde(default)]
        port: Option<String>,
    },
    /// Bond ports: mode, members, link and LACP state; every bond when `name` is absent.
    BondShow {
        #[serde(default)]
        name: Option<String>,
    },
    /// Make `active` the active member of bond `name` (runtime state, as `port enable`).
    BondSet { name: String, active: String },
    /// Tracked connections, of one port or all, at most `limit` (default 100).
    CtList {
        #[serde(default)]
        port: Option<String>,
        #[serde(default)]
        limit: Option<usize>,
    },
    /// Ends the tracked connections of one port, or of all.
    CtFlush {
        #[serde(default)]
        port: Option<String>,
    },
    /// Connection-tracking counters: switch-wide and per port.
    CtStats,
    /// The security groups (`name`: only that one).
    SgList {
        #[serde(default)]
        name: Option<String>,
    },
    /// Adds a security group (its rules may come with it).
    SgAdd {
        group: crate::config::SecurityGroupConfig,
    },
    /// Removes a security group no port and no `remote_group` uses.
    SgDel { name: String },
    /// Appends a rule to a group.
    SgRuleAdd {
        group: String,
        rule: crate::config::GroupRule,
    },
    /// Removes a group's rule `index` (the later ones move up).
    SgRuleDel { group: String, index: usize },
    /// Sets the addresses of a group's members on other hosts (for `remote_group` rules).
    SgAddresses {
        group: String,
        addresses: Vec<crate::policy::IpPrefix>,
    },
}

/// What a request may do, for the control socket's privilege check: members of
/// `[switch] control_group` may make [`Access::Read`] requests only; [`Access::Admin`]
/// requests need root, the daemon's own user or `[switch] admin_group`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Looks, changes nothing (captures and traces included).
    Read,
    /// Changes the switch or its record, or names host resources (interfaces, sockets).
    Admin,
}

impl Request {
    /// Who may make this request. Every variant is listed (no wildcard), so a new request
    /// does not compile until it is classified here.
    pub fn access(&self) -> Access {
        match self {
            Request::Ping
            | Request::PortList
            | Request::Fdb
            | Request::Stats
            | Request::Rss { .. }
            | Request::Placement
            | Request::QosShow
            | Request::ConfigDump
            | Request::Capture(_)
            | Request::MirrorList
            | Request::Trace { .. }
            | Request::Lldp { .. }
            | Request::ExportShow
            | Request::BondShow { .. }
            | Request::CtList { .. }
            | Request::CtStats
            | Request::SgList { .. } => Access::Read,
            Request::PortAdd { .. }
            | Request::PortDel { .. }
            | Request::PortSet { .. }
            | Request::PortEnable { .. }
            | Request::PlacementPin { .. }
            | Request::PlacementMode { .. }
            | Request::QosSet { .. }
            | Request::MirrorAdd { .. }
            | Request::MirrorDel { .. }
            | Request::ExportSet { .. }
            | Request::ExportOff { .. }
            | Request::BondSet { .. }
            | Request::Reload
            | Request::CtFlush { .. }
            | Request::SgAdd { .. }
            | Request::SgDel { .. }
            | Request::SgRuleAdd { .. }
            | Request::SgRuleDel { .. }
            | Request::SgAddresses { .. } => Access::Admin,
        }
    }

    /// The request as the CLI spells it, for messages ("port add").
    pub fn verb(&self) -> &'static str {
        match self {
            Request::Ping => "ping",
            Request::PortList => "port list",
            Request::PortAdd { .. } => "port add",
            Request::PortDel { .. } => "port del",
            Request::PortSet { .. } => "port set",
            Request::PortEnable { .. } => "port enable",
            Request::Fdb => "fdb",
            Request::Stats => "stats",
            Request::Rss { .. } => "rss",
            Request::Placement => "placement",
            Request::PlacementPin { .. } => "placement pin",
            Request::PlacementMode { .. } => "placement mode",
            Request::QosSet { .. } => "qos set",
            Request::QosShow => "qos show",
            Request::Reload => "reload",
            Request::ConfigDump => "config dump",
            Request::Capture(_) => "capture",
            Request::Trace { .. } => "trace",
            Request::MirrorList => "mirror list",
            Request::MirrorAdd { .. } => "mirror add",
            Request::MirrorDel { .. } => "mirror del",
            Request::ExportSet { .. } => "export set",
            Request::ExportOff { .. } => "export off",
            Request::ExportShow => "export show",
            Request::Lldp { .. } => "lldp",
            Request::BondShow { .. } => "bond show",
            Request::BondSet { .. } => "bond set",
            Request::CtList { .. } => "ct list",
            Request::CtFlush { .. } => "ct flush",
            Request::CtStats => "ct stats",
            Request::SgList { name: None } => "sg list",
            Request::SgList { name: Some(_) } => "sg show",
            Request::SgAdd { .. } => "sg add",
            Request::SgDel { .. } => "sg del",
            Request::SgRuleAdd { .. } => "sg rule add",
            Request::SgRuleDel { .. } => "sg rule del",
            Request::SgAddresses { .. } => "sg addresses",
        }
    }
}

/// `qswitch lldp`: the LLDP agent of one port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LldpPort {
    pub port: String,
    /// The interface LLDP runs on (the port id sent).
    pub ifname: String,
    /// "rx" or "both".
    pub mode: String,
    /// LLDPDUs received and taken into the table.
    pub rx: u64,
    /// LLDPDUs sent.
    pub tx: u64,
    /// LLDPDUs dropped: malformed, too many neighbours, or the table busy.
    pub discarded: u64,
    /// Neighbours forgotten because their TTL ran out.
    pub aged_out: u64,
    pub neighbors: Vec<LldpNeighbor>,
}

/// One LLDP neighbour.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LldpNeighbor {
    /// A MAC address ("aa:bb:..") when the neighbour sends one, else its text.
    pub chassis_id: String,
    /// Likewise.
    pub port_id: String,
    pub system_name: Option<String>,
    pub port_description: Option<String>,
    pub system_description: Option<String>,
    pub management_address: Option<String>,
    /// The source MAC address of its LLDPDUs.
    pub source_mac: String,
    /// The TTL it announced, seconds.
    pub ttl: u16,
    /// Seconds until it is forgotten unless heard again.
    pub ttl_remaining_s: u64,
}

/// `qswitch capture`: what to capture and how much.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureRequest {
    pub port: String,
    /// Only this rx queue (sent frames are captured whatever the queue).
    #[serde(default)]
    pub queue: Option<u16>,
    #[serde(default)]
    pub direction: CaptureDirection,
    /// Stop after this many frames.
    #[serde(default)]
    pub count: Option<u64>,
    /// Bytes kept of each frame.
    pub snaplen: u32,
    /// Filter: EtherType (outer, or inner after one 802.1Q tag).
    #[serde(default)]
    pub ether_type: Option<u16>,
    /// Filter: source or destination MAC ("02:00:00:00:00:01").
    #[serde(default)]
    pub mac: Option<String>,
    /// Filter: 802.1Q VLAN id of tagged frames.
    #[serde(default)]
    pub vlan: Option<u16>,
}

/// Which frames of a port to capture.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaptureDirection {
    Rx,
    Tx,
    #[default]
    Both,
}

/// One captured frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapturedPacket {
    /// Unix time, nanoseconds.
    pub ts_ns: u64,
    /// "rx" (received from the port) or "tx" (sent to it).
    pub dir: String,
    /// Rx queue for received frames; the transmitting worker for sent ones.
    pub queue: u16,
    /// The frame's length on the port.
    pub orig_len: u32,
    /// Its first `snaplen` bytes, hex.
    pub data: String,
}

/// `qswitch trace`: what the switch would do with one frame, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceReport {
    /// Ingress port.
    pub port: String,
    /// The VLAN the frame is switched in (0: the untagged domain); when it is dropped before
    /// it has one (a VID the port does not carry, untagged on a trunk without a native
    /// VLAN), the port's access VLAN.
    pub vlan: u16,
    /// How the frame got its VLAN: "access" (untagged on an access port), "native"
    /// (untagged on a trunk: its native VLAN), "tagged" (802.1Q tag of a VLAN the trunk
    /// carries); absent when it is dropped before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_source: Option<String>,
    pub frame_len: usize,
    pub src: Option<String>,
    pub dst: Option<String>,
    pub ether_type: Option<String>,
    /// "unicast", "flood" or "drop".
    pub verdict: String,
    /// Why it is dropped (a drop-counter name), when it is.
    pub drop_reason: Option<String>,
    /// The pipeline stage that drops it ("classify", "vlan", "port_security",
    /// "link_local", "lookup", "storm_control", ...), when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_stage: Option<String>,
    /// Source learning: "new", "refresh", "known", "move", "refused: port limit",
    /// "refused: table full" (absent when the frame is dropped before learning).
    pub learn: Option<String>,
    /// Port security on the ingress: "pass", or the check that refuses the frame (e.g.
    /// "source MAC not in macs"); absent when the port checks nothing per frame or the
    /// frame is dropped before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<String>,
    /// The destination's fdb entry, when there is one.
    pub fdb: Option<TraceFdb>,
    /// Storm control, when the ingress port has limits and the frame would be flooded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm: Option<TraceStorm>,
    /// The ports the frame would be sent to, in order.
    pub egress: Vec<TraceEgress>,
    pub ingress_qos: TraceQos,
    /// The decision, step by step, as text.
    pub steps: Vec<String>,
}

/// An fdb entry as trace reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceFdb {
    pub port: String,
    pub age_ms: u64,
}

/// Storm control of the ingress port for a frame that would be flooded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceStorm {
    /// "broadcast", "multicast" or "unknown_unicast".
    pub class: String,
    /// The class's limit, frames per second (`None`: no limit for this class).
    pub limit_pps: Option<u64>,
    /// Frames its bucket holds now (`None`: no limit); one more is admitted when ≥ 1.
    pub tokens: Option<i64>,
    /// Whether the frame would pass.
    pub admit: bool,
}

/// One egress port of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceEgress {
    pub port: String,
    /// The VID the frame leaves tagged with (`None`: untagged).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tagged: Option<u16>,
    pub qos: TraceQos,
    /// For a vhost-user port: the receive queue (pair) vRSS would pick.
    pub rss: Option<TraceRss>,
    /// For a bond port: the member the frame leaves by now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

/// A port's QoS state at trace time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceQos {
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub weight: u32,
    /// Current allocation, bits/s (`None`: not shaped).
    pub alloc_bps: Option<u64>,
    /// Bytes in the port's token bucket (`None`: not shaped).
    pub tokens: Option<i64>,
}

/// The vRSS decision for a vhost-user destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRss {
    /// Queue pairs the guest enabled.
    pub enabled: Vec<u16>,
    /// Toeplitz hash of the flow (`None`: not IP, or fewer than two pairs).
    pub hash: Option<u32>,
    /// Indirection-table entry the hash selects (`hash & 127`).
    pub index: Option<usize>,
    pub queue: u16,
}

/// The daemon's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "response", rename_all = "kebab-case")]
pub enum Response {
    Ok,
    /// `bond show`.
    Bonds {
        bonds: Vec<crate::bond::BondInfo>,
    },
    /// The request failed and changed nothing.
    Error {
        message: String,
    },
    Pong {
        version: String,
        pid: u32,
    },
    /// `lldp`: the LLDP agents and their neighbours, by port.
    Lldp {
        ports: Vec<LldpPort>,
    },
    Ports {
        ports: Vec<PortInfo>,
    },
    Fdb {
        entries: Vec<FdbEntry>,
    },
    Stats(Box<StatsReport>),
    /// The enabled receive queues and the 128-entry indirection table over them.
    Rss {
        queues: Vec<u16>,
        table: Vec<u16>,
    },
    Placement(Box<PlacementReport>),
    Qos(Box<QosReport>),
    /// `reload`: what was changed, one line each (empty: nothing changed).
    Reloaded {
        changes: Vec<String>,
    },
    /// `config dump`: TOML that `run --config` accepts.
    Config {
        toml: String,
    },
    /// `export show`.
    Export(Box<ExportReport>),
    /// A capture started; packets follow.
    CaptureStarted {
        port: String,
        snaplen: u32,
        /// Ring slots (the capture's bound).
        slots: usize,
        /// Bytes of frame data the capture holds (its ring's two slot sets).
        #[serde(default)]
        ring_bytes: usize,
    },
    /// Captured frames, and the capture's counters so far.
    CapturePackets {
        packets: Vec<CapturedPacket>,
        captured: u64,
        /// Frames lost in the capture's own ring (full or busy); the data path is unaffected.
        dropped: u64,
    },
    /// The capture ended.
    CaptureEnd {
        captured: u64,
        dropped: u64,
        reason: String,
    },
    Trace(Box<TraceReport>),
    /// `mirror list`: the sessions and their counters.
    Mirrors {
        mirrors: Vec<MirrorInfo>,
    },
    /// `ct list`: connections, and how many the port (or switch) has in all.
    CtList {
        entries: Vec<CtEntry>,
        total: u32,
    },
    /// `ct flush`: connections ended.
    CtFlushed {
        removed: u32,
    },
    CtStats(Box<CtStatsReport>),
    /// `sg list`, `sg show`: the groups, with the ports that use each.
    SecurityGroups {
        groups: Vec<SecurityGroupInfo>,
    },
}

/// One tracked connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtEntry {
    /// The port whose filter tracks it (its zone).
    pub port: String,
    /// "tcp", "udp", "icmp", "icmpv6", "sctp" or the protocol number.
    pub protocol: String,
    /// Source and destination of its first packet: `10.0.0.5:40000`, `[fd00::5]:80`; for
    /// ICMP echo the identifier is the "port".
    pub src: String,
    pub dst: String,
    /// `SYN_SENT`, `ESTABLISHED`, `UNREPLIED`, `REPLIED`, ...
    pub state: String,
    /// Seconds until it expires without traffic.
    pub expires_s: u64,
    /// The rule that allows it, `group/index`.
    pub rule: String,
}

/// `ct stats`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtStatsReport {
    /// Whether a firewall runs (some port has security groups).
    pub enabled: bool,
    pub sessions: u32,
    pub max_sessions: u32,
    /// Bytes the table holds (all allocated at start).
    pub memory_bytes: u64,
    pub ports: Vec<CtPortStats>,
    /// Every rule of every filtered port, with its hits.
    #[serde(default)]
    pub rules: Vec<CtRuleHits>,
}

/// `ct stats` of one rule on one port: new connections and stateless frames it allowed
/// there (kept when other rules change; a changed rule starts again at zero).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtRuleHits {
    pub port: String,
    pub group: String,
    /// The rule's index in its group (`sg show` numbers them).
    pub index: u16,
    pub hits: u64,
}

/// `ct stats` of one port.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CtPortStats {
    pub port: String,
    pub sessions: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    /// Connections opened since start.
    pub new: u64,
    pub ct_invalid: u64,
    pub ct_limit: u64,
    pub ct_fragment: u64,
    /// Frames its filter allowed and denied since start, per direction (ingress: toward
    /// the port's VM; egress: from it). Denied are the drop reasons `fw_denied_ingress`
    /// and `fw_denied_egress`.
    #[serde(default)]
    pub allowed_ingress: u64,
    #[serde(default)]
    pub allowed_egress: u64,
    #[serde(default)]
    pub denied_ingress: u64,
    #[serde(default)]
    pub denied_egress: u64,
    /// Connections opened in the last second (the daemon's one-second sampler).
    #[serde(default)]
    pub new_per_s: u64,
}

/// A security group and the ports that use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityGroupInfo {
    pub group: crate::config::SecurityGroupConfig,
    /// Ports of this switch whose `security_groups` name it.
    pub ports: Vec<String>,
    /// Per rule (by index): new connections and stateless frames it allowed, summed over
    /// those ports (per port: `ct stats`). A rule keeps its count when others change.
    #[serde(default)]
    pub hits: Vec<u64>,
}

/// A mirror session as it runs: its settings and counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MirrorInfo {
    pub config: crate::config::MirrorConfig,
    /// Copies put into the session's queue.
    pub copies: u64,
    /// Copies lost: the session's queue was full, a frame was larger than a queue slot, or
    /// the output port or the collector's socket refused it.
    pub drops: u64,
    /// Copies the output port or the collector's socket took.
    pub sent: u64,
}

/// `qos show`: per port, its settings, current allocation and measured rates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QosReport {
    /// Allocator ticks so far (about one per 10 ms while a port is toward an uplink, else
    /// about one a second and one per settings or port change).
    pub ticks: u64,
    /// Completed one-second samples so far; `rate_bps` is from the latest one.
    pub seconds: u64,
    pub reservable: f64,
    pub ports: Vec<QosPort>,
}

/// One port in a [`QosReport`]. Rates are bits/s of L2 frames (TSO segments counted as the
/// frames they become on the wire).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QosPort {
    pub name: String,
    /// The uplink this port competes for (`None`: none in its VLAN, or it is an uplink).
    pub uplink: Option<String>,
    /// Set for uplinks: their capacity.
    pub capacity: Option<u64>,
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub weight: u32,
    /// Current allocation (`None`: not shaped).
    pub alloc_bps: Option<u64>,
    /// The allocator's demand estimate.
    pub demand_bps: u64,
    /// What the port sent into the switch over the last complete second (for an uplink:
    /// what the switch sent out of it).
    pub rate_bps: f64,
    /// Allocation at the end of that second.
    pub alloc_last_second: Option<u64>,
    /// Polls skipped because the port was out of tokens (back-pressure), in total.
    pub throttled: u64,
    /// The last (up to) 300 one-second rates, oldest first.
    pub history: Vec<f64>,
    /// A bond uplink: `[members carrying traffic, members]`; the allocator shares
    /// `capacity` × up / members (`None`: not a bond uplink).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bond_members_up: Option<[u32; 2]>,
}

/// `qswitch placement`: where each rx queue runs, how loaded it is, and why it is there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementReport {
    /// `dynamic` or `static`.
    pub mode: String,
    pub reserved_cpus: Vec<usize>,
    /// Every rx queue, by port then queue.
    pub queues: Vec<QueuePlacementInfo>,
    pub workers: Vec<WorkerPlacementInfo>,
    /// The CPU set each port ended up with.
    pub port_sets: Vec<PortSetInfo>,
    /// Overlapping operator sets, reserved CPUs in sets, sharing forced by too few CPUs, ...
    pub warnings: Vec<String>,
    /// The most recent queue moves, oldest first.
    pub moves: Vec<MoveInfo>,
    /// Queue moves since the switch started (`moves` keeps only the last ones).
    #[serde(default)]
    pub moves_total: u64,
}

/// One rx queue's placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuePlacementInfo {
    pub port: String,
    pub queue: u16,
    /// The worker and CPU polling it; none when no CPU is available.
    pub worker: Option<usize>,
    pub cpu: Option<usize>,
    /// The CPU the static placement rules give it.
    pub home_cpu: Option<usize>,
    /// Fraction of a core spent on its bursts over the last evaluation interval.
    pub load: f64,
    /// `home`, `pinned`, `coalesced`, `paired` or `spread`.
    pub state: String,
    /// Why it is there, in words: the rules behind the home CPU, or the move that took it away.
    pub why: String,
}

/// One worker's share of the placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerPlacementInfo {
    pub id: usize,
    pub cpu: usize,
    /// Fraction of the last evaluation interval spent on bursts.
    pub busy: f64,
    pub queues: usize,
}

/// A port's CPU set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortSetInfo {
    pub port: String,
    pub cpus: Vec<usize>,
    /// Whether the operator gave it (`cpus = ...`) or the default rules chose it.
    pub operator: bool,
}

/// A queue that moved between workers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoveInfo {
    /// Milliseconds since the switch started.
    pub at_ms: u64,
    pub port: String,
    pub queue: u16,
    pub from_cpu: Option<usize>,
    pub to_cpu: usize,
    pub reason: String,
}

/// One port as `port list` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ifname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// For TAP ports: whether qswitch created the interface (and so removes it on exit).
    pub created: bool,
    /// Offloads in effect, e.g. `["csum", "tso4", "tso6"]`; for vhost-user ports the
    /// negotiated virtio features.
    pub offloads: Vec<String>,
    /// vhost-user: the socket and who opens it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// vhost-user: whether a frontend is connected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connected: Option<bool>,
    /// vhost-user: queue pairs whose receive queue the guest has enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled_queues: Option<Vec<u16>>,
    /// vhost-user: whether dirty-page logging (live migration) is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dirty_log: Option<bool>,
    /// One entry per queue: which worker polls it.
    pub queues: Vec<QueueInfo>,
    /// afxdp: the data path in use (`native-zc`, `native-copy`, `skb` or `packet`), as OVS's
    /// `xdp-mode-in-use`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp_mode: Option<String>,
    /// vxlan: the largest IP packet a frame through the tunnel may carry (the underlay MTU
    /// less 50 bytes over IPv4, 70 over IPv6): the MTU for the VMs of its VLAN, unless the
    /// underlay's is raised. Larger frames are counted as `mtu_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inner_mtu: Option<u32>,
    /// afxdp: what the kernel's sockets dropped before qswitch saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<KernelDrops>,
    /// veth: whether the kernel fast path forwards for the port right now (`fastpath = true`
    /// and nothing in its policy that the workers must apply; see `qswitch_dp::port::veth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastpath: Option<bool>,
    /// VLANs carried tagged (a trunk); absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlans: Option<crate::policy::VlanSet>,
    /// Port security in effect; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<crate::policy::SecurityConfig>,
    /// Storm-control limits in effect; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storm: Option<crate::policy::StormConfig>,
    /// The CNI attachment that made the port; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<crate::config::PortOwner>,
    /// Link-local groups relayed from the port; absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_local_forward: Option<crate::policy::LinkLocalGroups>,
    /// Whether a BPDU from the port disables it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bpdu_guard: bool,
    /// Why the port is disabled (no frame received or sent), e.g. `bpdu_guard`, until
    /// `qswitch port enable`; absent: enabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<String>,
    /// veth, afxdp: the interface the port waits for: it did not exist when the daemon
    /// started, so the port is down (no queue, switches nothing) until it appears; absent:
    /// the port is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
}

/// An afxdp port's kernel-side drop counters, summed over its queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelDrops {
    /// Frames dropped for want of a fill buffer or rx ring space (packet mode: ring full).
    pub rx_dropped: u64,
    /// Invalid ring descriptors (0 unless something is broken).
    pub invalid_descs: u64,
}

/// Which worker polls a queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueInfo {
    pub queue: u16,
    pub worker: usize,
    pub cpu: usize,
}

/// One learned MAC address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FdbEntry {
    pub mac: String,
    /// VLAN id; 0 for untagged ports.
    pub vlan: u16,
    pub port: String,
    /// Milliseconds since the address was last seen.
    pub age_ms: u64,
    /// For a remote MAC behind a VXLAN port: the VTEP (underlay address) that has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vtep: Option<String>,
    /// For a remote MAC behind a VXLAN port: where the VTEP came from (`learned`, `static`,
    /// `evpn`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// Counters since start, plus per-second rates from the daemon's last two 1-second samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    pub uptime_ms: u64,
    /// CPU time of the whole daemon process since start, in nanoseconds.
    pub process_cpu_ns: u64,
    pub ports: Vec<PortStats>,
    pub workers: Vec<WorkerStats>,
    /// Rates over the most recent complete second (absent during the first second).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rates: Option<Rates>,
}

/// Counters of one port.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PortStats {
    pub name: String,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Drops by reason (rx and tx), only reasons with a non-zero count.
    pub drops: BTreeMap<String, u64>,
    pub queues: Vec<QueueStats>,
    /// For gen ports: what the sink saw.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sink: Option<SinkStats>,
    /// For vhost-user ports: guest errors seen (bad descriptor chains, rings stopped for a
    /// jumping avail index or an unwritable used ring).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_errors: Option<u64>,
    /// For vhost-user ports: pages marked in the dirty log (live migration; a page written
    /// twice counts twice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logged_pages: Option<u64>,
    /// For vhost-user ports: announcements injected after a migration (SEND_RARP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announces: Option<u64>,
    /// For gen ports: frames generated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generated: Option<u64>,
    /// For VXLAN ports: per-VNI and per-VTEP traffic, decapsulation drops by reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vxlan: Option<VxlanStats>,
    /// For TAP ports: software GRO toward the TAP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<TapStats>,
    /// For veth ports: what the kernel fast path forwarded (already in the totals above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fastpath: Option<FastPathStats>,
    /// The port's share of the MAC table and what the table refused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fdb: Option<PortFdbStats>,
    /// For bond ports: each member's state and counters (as `bond show`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bond: Option<crate::bond::BondInfo>,
}

/// A port's share of the MAC table (fdb) and the addresses refused to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortFdbStats {
    /// Addresses learned on the port now.
    pub entries: u32,
    /// Most addresses it may have (`security.mac_limit`, 4096 by default).
    pub limit: u32,
    /// Addresses not learned because the port was at its limit.
    pub limit_refused: u64,
    /// Moves of an address to the port refused because it was flapping between ports.
    pub flaps: u64,
    /// Moves to the port refused for lack of proof (a VXLAN frame from a VTEP that is
    /// neither configured nor EVPN's claiming an address live on another port).
    #[serde(default)]
    pub moves_held: u64,
}

/// A veth port's kernel fast path: frames it forwarded without the workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FastPathStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Frames the kernel path dropped: for a VXLAN port, encapsulated datagrams (or
    /// segments) larger than the underlay's MTU, as the port's own `mtu_exceeded`.
    #[serde(default)]
    pub drops: u64,
}

/// A TAP port's own counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TapStats {
    /// TSO super-frames written to the TAP, each built from in-order TCP segments of one
    /// flow (software GRO).
    pub gro_frames: u64,
    /// Segments merged into them.
    pub gro_segments: u64,
}

/// A VXLAN port's own counters (inner frames).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VxlanStats {
    pub vni: u32,
    /// The VNI's traffic, every VTEP together.
    pub traffic: VxlanTraffic,
    /// Per remote VTEP that is configured, static or EVPN's.
    pub vteps: Vec<VtepStats>,
    /// Every other VTEP's traffic together (learned VTEPs, unknown senders).
    #[serde(default)]
    pub other_vteps: VxlanTraffic,
    /// Learned remote MACs now (at most 4096 per VNI).
    #[serde(default)]
    pub learned: u64,
    /// Remote MACs not learned: the port's remote table had 4096 learned ones.
    #[serde(default)]
    pub learn_refused: u64,
    /// Moves of a live learned remote MAC to another VTEP refused: the frame came from a
    /// VTEP that is neither configured nor EVPN's.
    #[serde(default)]
    pub moves_held: u64,
    /// Moves of a learned remote MAC refused because it flapped between VTEPs.
    #[serde(default)]
    pub flaps: u64,
    /// Drops by reason (every reason the port counts, zero or not).
    pub drops: BTreeMap<String, u64>,
    /// TSO frames segmented in software before encapsulation.
    pub segmented: u64,
    /// Of those, frames sent with `UDP_SEGMENT`.
    #[serde(default)]
    pub gso_sent: u64,
    /// Received messages holding several datagrams (`UDP_GRO`).
    #[serde(default)]
    pub udp_gro: u64,
    /// TSO super-frames built from received TCP segments (software GRO).
    #[serde(default)]
    pub gro_frames: u64,
    /// Received TCP segments merged into them.
    #[serde(default)]
    pub gro_segments: u64,
}

/// Inner frames and bytes each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanTraffic {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
}

/// The traffic to and from one VTEP.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VtepStats {
    pub vtep: String,
    #[serde(flatten)]
    pub traffic: VxlanTraffic,
}

/// Counters of one rx queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub queue: u16,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub drops: BTreeMap<String, u64>,
}

/// What a gen port's sink validated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SinkStats {
    /// Frames carrying a valid qswitch gen trailer.
    pub received: u64,
    /// Frames without one (counted, not validated).
    pub foreign: u64,
    /// Sequence numbers skipped (frames that never arrived, so far).
    pub lost: u64,
    /// Frames that arrived with a lower sequence number than one already seen in their flow.
    pub reordered: u64,
}

/// Counters of one worker thread.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStats {
    pub id: usize,
    pub cpu: usize,
    pub tid: i32,
    /// The rx queues it polls, as `port/queue`.
    pub queues: Vec<String>,
    pub busy_polls: u64,
    pub idle_polls: u64,
    /// Nanoseconds in polls that moved at least one frame.
    pub busy_ns: u64,
    /// Nanoseconds polling without finding anything (spinning before sleeping).
    pub idle_ns: u64,
    pub sleeps: u64,
    pub wakeups: u64,
    /// Current adaptive spin window in microseconds (shrinks when the worker's CPU is
    /// contended).
    #[serde(default)]
    pub spin_us: f64,
    pub voluntary_ctx_switches: u64,
    pub involuntary_ctx_switches: u64,
    /// CPU time of the thread (user + system) in nanoseconds.
    pub cpu_ns: u64,
}

/// Per-second rates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Rates {
    /// Length of the interval the rates were measured over, in milliseconds (about 1000).
    pub interval_ms: u64,
    pub process_cpu_pct: f64,
    pub ports: Vec<PortRate>,
    pub workers: Vec<WorkerRate>,
}

/// Rates of one port.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PortRate {
    pub name: String,
    pub rx_pps: f64,
    pub rx_bps: f64,
    pub tx_pps: f64,
    pub tx_bps: f64,
    pub drops_ps: f64,
}

/// Rates of one worker.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerRate {
    pub id: usize,
    /// Share of wall time spent in polls that moved frames.
    pub busy_pct: f64,
    /// CPU time used by the thread, as a share of wall time.
    pub cpu_pct: f64,
    pub ctx_switches_ps: f64,
    pub wakeups_ps: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        for r in [
            Request::Ping,
            Request::PortList,
            Request::PortDel { name: "a".into() },
            Request::PortEnable { name: "a".into() },
            Request::PortAdd {
                port: PortConfig::tap("a", "qs-a".parse().unwrap()),
            },
            Request::Fdb,
            Request::Stats,
            Request::QosShow,
            Request::Reload,
            Request::ConfigDump,
            Request::PortSet {
                name: "vm1".into(),
                update: crate::policy::PolicyUpdate {
                    vlans: Some("10,20".parse().unwrap()),
                    macs: Some(vec!["52:54:00:12:34:56".parse().unwrap()]),
                    mac_limit: Some(None),
                    dhcp_guard: Some(true),
                    storm_multicast: Some(Some(10)),
                    link_local_forward: Some("stp".parse().unwrap()),
                    bpdu_guard: Some(true),
                    ..Default::default()
                },
            },
            Request::QosSet {
                port: "vm1".into(),
                min: Some(200_000_000),
                max: None,
                weight: Some(2),
                clear: false,
            },
            Request::CtList {
                port: Some("vm1".into()),
                limit: Some(10),
            },
            Request::CtFlush { port: None },
            Request::CtStats,
            Request::SgList { name: None },
            Request::SgDel { name: "web".into() },
            Request::SgRuleDel {
                group: "web".into(),
                index: 2,
            },
            Request::SgAddresses {
                group: "web".into(),
                addresses: vec!["10.0.0.7".parse().unwrap(), "fd00::/64".parse().unwrap()],
            },
        ] {
            let s = serde_json::to_string(&r).unwrap();
            assert!(!s.contains('\n'));
            assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        }
    }

    #[test]
    fn reads_and_changes_are_told_apart() {
        let read = |json: &str| serde_json::from_str::<Request>(json).unwrap().access();
        for r in [
            r#"{"request":"ping"}"#,
            r#"{"request":"port-list"}"#,
            r#"{"request":"stats"}"#,
            r#"{"request":"qos-show"}"#,
            r#"{"request":"placement"}"#,
            r#"{"request":"config-dump"}"#,
            r#"{"request":"capture","port":"a","snaplen":64}"#,
            r#"{"request":"trace","port":"a","frame":"00"}"#,
        ] {
            assert_eq!(read(r), Access::Read, "{r}");
        }
        for r in [
            r#"{"request":"port-add","port":{"name":"n","type":"afxdp","ifname":"eth0"}}"#,
            r#"{"request":"port-add","port":{"name":"g","type":"gen"}}"#,
            r#"{"request":"port-del","name":"x"}"#,
            r#"{"request":"qos-set","port":"vm1","min":1}"#,
            r#"{"request":"placement-mode","mode":"static"}"#,
            r#"{"request":"reload"}"#,
        ] {
            assert_eq!(read(r), Access::Admin, "{r}");
        }
        let del: Request = serde_json::from_str(r#"{"request":"port-del","name":"x"}"#).unwrap();
        assert_eq!(del.verb(), "port del");
    }

    #[test]
    fn wire_form_is_stable() {
        assert_eq!(
            serde_json::to_string(&Request::Ping).unwrap(),
            r#"{"request":"ping"}"#
        );
        let r: Request = serde_json::from_str(r#"{"request":"port-del","name":"x"}"#).unwrap();
        assert_eq!(r, Request::PortDel { name: "x".into() });
        assert!(serde_json::from_str::<Request>(r#"{"request":"port-del","nme":"x"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"request":"reboot"}"#).is_err());
        let r: Request =
            serde_json::from_str(r#"{"request":"qos-set","port":"vm1","min":100000000}"#).unwrap();
        assert_eq!(
            r,
            Request::QosSet {
                port: "vm1".into(),
                min: Some(100_000_000),
                max: None,
                weight: None,
                clear: false
            }
        );
        let s = serde_json::to_string(&Response::Error {
            message: "no".into(),
        })
        .unwrap();
        assert_eq!(s, r#"{"response":"error","message":"no"}"#);
    }

    #[test]
    fn security_group_requests_are_checked_as_they_are_read() {
        let add = r#"{"request":"sg-add","group":{"name":"web","rules":[
            {"direction":"ingress","protocol":"tcp","ports":"80,443","remote":"0.0.0.0/0"},
            {"direction":"egress"}]}}"#;
        let r: Request = serde_json::from_str(add).unwrap();
        assert_eq!(r.access(), Access::Admin);
        assert_eq!(r.verb(), "sg add");
        let back: Request = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        let rule = |rule: &str| {
            serde_json::from_str::<Request>(&format!(
                r#"{{"request":"sg-rule-add","group":"web","rule":{rule}}}"#
            ))
            .map_err(|e| e.to_string())
        };
        assert!(rule(r#"{"direction":"ingress","protocol":"udp","ports":53}"#).is_ok());
        for (bad, why) in [
            (
                r#"{"direction":"ingress","remote":"10.0.0.0/33"}"#,
                "remote",
            ),
            (
                r#"{"direction":"ingress","protocol":"tcp","ports":"90-80"}"#,
                "reversed",
            ),
            (
                r#"{"direction":"ingress","remote":"10.0.0.0/8","remote_group":"web"}"#,
                "exclusive",
            ),
            (r#"{"direction":"ingress","protocol":300}"#, "out of range"),
        ] {
            let e = rule(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        for (r, access) in [
            (r#"{"request":"ct-list"}"#, Access::Read),
            (r#"{"request":"ct-stats"}"#, Access::Read),
            (r#"{"request":"sg-list","name":"web"}"#, Access::Read),
            (r#"{"request":"ct-flush","port":"vm1"}"#, Access::Admin),
            (r#"{"request":"sg-del","name":"web"}"#, Access::Admin),
        ] {
            assert_eq!(
                serde_json::from_str::<Request>(r).unwrap().access(),
                access,
                "{r}"
            );
        }
    }
}

/// `qswitch export show`: what is exported and what the exporter counted since the daemon
/// started.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportReport {
    pub ipfix: Option<crate::config::IpfixConfig>,
    pub sflow: Option<crate::config::SflowConfig>,
    pub counters: ExportCounters,
}

/// The flow exporter's counters (also in `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportCounters {
    /// IPFIX flow records sent, messages sent, messages the kernel refused.
    pub ipfix_records: u64,
    pub ipfix_messages: u64,
    pub ipfix_send_errors: u64,
    /// IPFIX messages that carried the templates (the first, then every 10 s).
    pub ipfix_templates: u64,
    /// Flow records by end reason (evicted: a full cache set).
    pub ended_idle: u64,
    pub ended_active: u64,
    pub ended_forced: u64,
    pub ended_evicted: u64,
    /// Records and samples the workers dropped (their list for the exporter was full).
    pub records_dropped: u64,
    pub samples_dropped: u64,
    pub sflow_flow_samples: u64,
    pub sflow_counter_samples: u64,
    pub sflow_datagrams: u64,
    pub sflow_send_errors: u64,
}
