//! Control subcommands: build a [`Request`], print the [`Response`].

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use clap::Subcommand;
use qswitch_api::request::{Rates, StatsReport};
use qswitch_api::{
    CpuList, IfName, PortConfig, PortKeys, PortName, PortType, Rate, Request, Response, SocketPath,
    UnicastMac, VlanId,
};

use qswitch_api::client::call;
use qswitch_api::policy::{
    parse_list, parse_or_none, IpPrefix, LinkLocalGroups, PolicyUpdate, PolicyValueError, VlanSet,
};

#[derive(Subcommand, Debug)]
pub enum PortCmd {
    /// List ports, their queues and the workers polling them.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Add a port to the running switch.
    Add {
        name: PortName,
        /// Port type (tap, gen, vhost-user, afxdp, vxlan or veth).
        #[arg(long = "type", value_name = "TYPE")]
        kind: PortType,
        /// TAP interface name (created if absent); afxdp: the NIC (must exist); veth: the
        /// root-namespace end of a veth pair (must exist).
        #[arg(long)]
        ifname: Option<IfName>,
        /// Queues (default 1; afxdp: every rx queue of the NIC).
        #[arg(long)]
        queues: Option<u16>,
        /// Access VLAN (1-4094).
        #[arg(long)]
        vlan: Option<VlanId>,
        /// vhost-user socket path.
        #[arg(long)]
        socket: Option<SocketPath>,
        /// vhost-user: server (qswitch listens) or client (qswitch connects); afxdp: auto,
        /// native, skb or packet.
        #[arg(long)]
        mode: Option<qswitch_api::ModeKey>,
        /// CPUs the port's queues may run on ("2-5", "0-14:2").
        #[arg(long)]
        cpus: Option<CpuList>,
        /// vxlan: the VNI.
        #[arg(long)]
        vni: Option<u32>,
        /// vxlan: the local underlay address.
        #[arg(long)]
        local: Option<std::net::IpAddr>,
        /// vxlan: a remote VTEP of the static flood list (repeatable).
        #[arg(long = "remote", value_name = "IP")]
        remotes: Vec<std::net::IpAddr>,
        /// vxlan: the UDP destination port (default 4789).
        #[arg(long)]
        dstport: Option<u16>,
        /// vxlan: do not learn remote MACs from received frames.
        #[arg(long)]
        no_learning: bool,
        /// veth: no kernel fast path (every frame through the workers).
        #[arg(long)]
        no_fastpath: bool,
        /// LLDP: rx, both (also transmit) or off (default: rx on uplinks, off elsewhere).
        #[arg(long, value_name = "rx|both|off")]
        lldp: Option<qswitch_api::config::LldpMode>,
    },
    /// Remove a port from the running switch.
    Del { name: String },
    /// Enable a port that BPDU guard disabled.
    Enable { name: String },
    /// Change a port's VLAN trunk, port security, storm control and link-local settings live
    /// (only what is given changes; `none` clears). The access VLAN (`vlan`) is fixed when the
    /// port is added.
    Set {
        name: String,
        /// VLANs carried tagged ("10,20,100-200"), or none.
        #[arg(long, value_name = "SET", value_parser = parse_vlans)]
        vlans: Option<VlanSet>,
        /// Allowed source MACs ("52:54:00:12:34:56,..."), or none (any).
        #[arg(long, value_name = "MAC,...", value_parser = parse_macs)]
        macs: Option<Macs>,
        /// Allowed source addresses ("10.0.0.5,fe80::/64"), or none (any).
        #[arg(long, value_name = "PREFIX,...", value_parser = parse_ips)]
        ips: Option<Ips>,
        /// Most MACs the port may have in the MAC table, or none (the default, 4096).
        #[arg(long, value_name = "N", value_parser = or_none::<u32>)]
        mac_limit: Option<OrNone<u32>>,
        /// Drop DHCP server messages from the port.
        #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
        dhcp_guard: Option<bool>,
        /// Drop IPv6 router advertisements and redirects from the port.
        #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
        ra_guard: Option<bool>,
        /// Most broadcast frames/s from the port, or none.
        #[arg(long, value_name = "PPS", value_parser = or_none::<u64>)]
        storm_broadcast: Option<OrNone<u64>>,
        /// Most multicast frames/s from the port, or none.
        #[arg(long, value_name = "PPS", value_parser = or_none::<u64>)]
        storm_multicast: Option<OrNone<u64>>,
        /// Most flooded unknown-unicast frames/s from the port, or none.
        #[arg(long, value_name = "PPS", value_parser = or_none::<u64>)]
        storm_unknown_unicast: Option<OrNone<u64>>,
        /// Link-local groups (01:80:C2:00:00:0X) relayed from the port ("stp,lldp", "0,14";
        /// never 1, PAUSE, or 2, LACP), or none.
        #[arg(long, value_name = "GROUPS", value_parser = parse_link_local)]
        link_local_forward: Option<LinkLocalGroups>,
        /// A BPDU from the port disables it (until `qswitch port enable`).
        #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
        bpdu_guard: Option<bool>,
        /// The port's security groups ("web,db"; each must exist), or "" or none: no
        /// groups, the port is not filtered.
        #[arg(long, value_name = "GROUP,...", value_parser = parse_groups)]
        security_groups: Option<Groups>,
    },
}

/// `--security-groups`: a comma-separated list of group names; "" or `none` is no group.
#[derive(Debug, Clone)]
pub struct Groups(Vec<String>);

fn parse_groups(s: &str) -> Result<Groups, String> {
    if s.trim().is_empty() || s.trim() == "none" {
        return Ok(Groups(Vec::new()));
    }
    let names: Vec<String> = s.split(',').map(|n| n.trim().to_string()).collect();
    if names.iter().any(String::is_empty) {
        return Err(format!("'{s}': an empty group name"));
    }
    Ok(Groups(names))
}

// clap takes `Vec<T>` as a repeated argument; these newtypes carry one comma-separated list.
#[derive(Debug, Clone)]
pub struct Macs(Vec<UnicastMac>);
#[derive(Debug, Clone)]
pub struct Ips(Vec<IpPrefix>);

/// A value or `none` (clap reads `Option<Option<T>>` as a flag with an optional value).
#[derive(Debug, Clone)]
pub struct OrNone<T>(Option<T>);

fn or_none<T: std::str::FromStr>(s: &str) -> Result<OrNone<T>, String>
where
    T::Err: std::fmt::Display,
{
    parse_or_none::<T>(s)
        .map(OrNone)
        .map_err(|e: T::Err| e.to_string())
}

fn parse_vlans(s: &str) -> Result<VlanSet, String> {
    let s = if s.trim() == "none" { "" } else { s };
    s.parse().map_err(|e: PolicyValueError| e.to_string())
}

fn parse_link_local(s: &str) -> Result<LinkLocalGroups, String> {
    s.parse().map_err(|e: PolicyValueError| e.to_string())
}

fn parse_macs(s: &str) -> Result<Macs, String> {
    parse_list(s)
        .map(Macs)
        .map_err(|e: qswitch_api::value::MacError| e.to_string())
}

fn parse_ips(s: &str) -> Result<Ips, String> {
    parse_list(s)
        .map(Ips)
        .map_err(|e: PolicyValueError| e.to_string())
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("'{s}' is not on or off")),
    }
}

/// `port list`'s second line for a port with a trunk, port security or storm control:
/// `trunk 10,20; security macs:1 ips:2 limit:4 dhcp-guard ra-guard; storm bcast:100/s`.
fn policy_line(p: &qswitch_api::request::PortInfo) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(v) = &p.vlans {
        parts.push(format!("trunk {v}"));
    }
    if let Some(s) = &p.security {
        let mut w = vec!["security".to_string()];
        if !s.macs.is_empty() {
            let macs: Vec<String> = s.macs.iter().map(ToString::to_string).collect();
            w.push(format!("macs:{}", macs.join(",")));
        }
        if !s.ips.is_empty() {
            let ips: Vec<String> = s.ips.iter().map(ToString::to_string).collect();
            w.push(format!("ips:{}", ips.join(",")));
        }
        if let Some(l) = s.mac_limit {
            w.push(format!("mac-limit:{l}"));
        }
        if s.dhcp_guard {
            w.push("dhcp-guard".into());
        }
        if s.ra_guard {
            w.push("ra-guard".into());
        }
        parts.push(w.join(" "));
    }
    if let Some(st) = &p.storm {
        let mut w = vec!["storm".to_string()];
        for (k, v) in [
            ("bcast", st.broadcast),
            ("mcast", st.multicast),
            ("unk-ucast", st.unknown_unicast),
        ] {
            if let Some(v) = v {
                w.push(format!("{k}:{v}/s"));
            }
        }
        parts.push(w.join(" "));
    }
    if let Some(g) = &p.link_local_forward {
        parts.push(format!("link-local-forward {g}"));
    }
    if p.bpdu_guard {
        parts.push("bpdu-guard".into());
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

pub fn port(control: &Path, cmd: PortCmd) -> anyhow::Result<()> {
    match cmd {
        PortCmd::List { json } => {
            let Response::Ports { ports } = call(control, &Request::PortList)? else {
                bail!("unexpected reply");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&ports)?);
                return Ok(());
            }
            println!(
                "{:<12} {:<10} {:<24} {:>4} {:<22} FEATURES/OFFLOADS",
                "NAME", "TYPE", "IFNAME/MAC/SOCKET", "VLAN", "QUEUES (q:worker@cpu)"
            );
            for p in ports {
                let queues: Vec<String> = p
                    .queues
                    .iter()
                    .map(|q| format!("{}:{}@{}", q.queue, q.worker, q.cpu))
                    .collect();
                let policy = policy_line(&p);
                let id = p.ifname.or(p.mac).or(p.socket).unwrap_or_default();

                println!(
                    "{:<12} {:<10} {:<24} {:>4} {:<22} {}",
                    p.name,
                    p.kind,
                    id,
                    p.vlan.map(|v| v.to_string()).unwrap_or_else(|| "-".into()),
                    queues.join(" "),
                    p.offloads.join(",")
                );
                if let Some(m) = &p.xdp_mode {
                    let k = p.kernel.unwrap_or_default();
                    println!(
                        "{:<12} xdp mode in use: {m}, kernel drops: rx {} invalid {}",
                        "", k.rx_dropped, k.invalid_descs
                    );
                }
                if let Some(on) = p.fastpath {
                    println!(
                        "{:<12} kernel fast path: {}",
                        "",
                        if on {
                            "on (known unicast to other veth ports bypasses the workers)"
                        } else {
                            "off (every frame through the workers)"
                        }
                    );
                }
                if let Some(mtu) = p.inner_mtu {
                    println!(
                        "{:<12} inner MTU {mtu}: the MTU for this VLAN's VMs (or raise the underlay's); larger frames count as mtu_exceeded",
                        ""
                    );
                }
                if let Some(policy) = policy {
                    println!("{:<12} {policy}", "");
                }
                if let Some(o) = &p.owner {
                    println!(
                        "{:<12} cni: network {}, container {}, ifname {}",
                        "", o.cni, o.container, o.ifname
                    );
                }
                if let Some(ifname) = &p.waiting {
                    println!(
                        "{:<12} down: waiting for interface {ifname} (it did not exist at start)",
                        ""
                    );
                }
                if let Some(why) = &p.disabled {
                    println!(
                        "{:<12} DISABLED by {why}: nothing received or sent (qswitch port enable {})",
                        "", p.name
                    );
                }
                if let Some(connected) = p.connected {
                    let enabled = p.enabled_queues.unwrap_or_default();
                    let enabled: Vec<String> = enabled.iter().map(u16::to_string).collect();
                    println!(
                        "{:<12} {} mode, {}, enabled queue pairs: [{}], dirty log: {}",
                        "",
                        p.mode.unwrap_or_default(),
                        if connected {
                            "connected"
                        } else {
                            "not connected"
                        },
                        enabled.join(","),
                        if p.dirty_log == Some(true) {
                            "on"
                        } else {
                            "off"
                        }
                    );
                }
            }
        }
        PortCmd::Add {
            name,
            kind,
            ifname,
            queues,
            vlan,
            socket,
            mode,
            cpus,
            vni,
            local,
            remotes,
            dstport,
            no_learning,
            no_fastpath,
            lldp,
        } => {
            // The same keys as a [[port]] table, so the same checks and errors.
            let port = PortConfig::try_from(PortKeys {
                ifname,
                queues,
                vlan,
                socket,
                mode,
                cpus,
                vni,
                local,
                remotes: (!remotes.is_empty()).then_some(remotes),
                dstport,
                learning: no_learning.then_some(false),
                fastpath: no_fastpath.then_some(false),
                lldp,
                ..PortKeys::new(name, kind)
            })?;
            call(control, &Request::PortAdd { port })?;
        }
        PortCmd::Del { name } => {
            call(control, &Request::PortDel { name })?;
        }
        PortCmd::Enable { name } => {
            call(control, &Request::PortEnable { name })?;
        }
        PortCmd::Set {
            name,
            vlans,
            macs,
            ips,
            mac_limit,
            dhcp_guard,
            ra_guard,
            storm_broadcast,
            storm_multicast,
            storm_unknown_unicast,
            link_local_forward,
            bpdu_guard,
            security_groups,
        } => {
            let update = PolicyUpdate {
                vlans,
                macs: macs.map(|m| m.0),
                ips: ips.map(|i| i.0),
                mac_limit: mac_limit.map(|v| v.0),
                dhcp_guard,
                ra_guard,
                storm_broadcast: storm_broadcast.map(|v| v.0),
                storm_multicast: storm_multicast.map(|v| v.0),
                storm_unknown_unicast: storm_unknown_unicast.map(|v| v.0),
                link_local_forward,
                bpdu_guard,
                security_groups: security_groups.map(|g| g.0),
            };
            if update.is_empty() {
                bail!("nothing to change: give at least one of --vlans, --macs, --ips, --mac-limit, --dhcp-guard, --ra-guard, --storm-*, --link-local-forward, --bpdu-guard, --security-groups");
            }
            call(control, &Request::PortSet { name, update })?;
        }
    }
    Ok(())
}

/// `qswitch lldp [PORT] [--json]`: the LLDP neighbours of each port with LLDP.
pub fn lldp(control: &Path, port: Option<String>, json: bool) -> anyhow::Result<()> {
    let Response::Lldp { ports } = call(control, &Request::Lldp { port })? else {
        bail!("unexpected reply");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&ports)?);
        return Ok(());
    }
    if ports.is_empty() {
        println!("no port runs LLDP (lldp = \"rx\" or \"both\"; rx is the default on uplinks)");
        return Ok(());
    }
    for p in &ports {
        println!(
            "{} ({}, lldp {}): {} neighbour(s); LLDPDUs rx {}, tx {}, discarded {}, aged out {}",
            p.port,
            p.ifname,
            p.mode,
            p.neighbors.len(),
            p.rx,
            p.tx,
            p.discarded,
            p.aged_out
        );
        if p.neighbors.is_empty() {
            continue;
        }
        println!(
            "  {:<20} {:<18} {:<20} {:<16} {:<18} {:>7}",
            "CHASSIS", "PORT ID", "SYSTEM NAME", "PORT DESCR", "MGMT ADDRESS", "TTL(s)"
        );
        // A neighbour chooses its strings: control characters (terminal escapes) are
        // printed escaped, never sent to the operator's terminal.
        let text = |s: Option<&str>| match s {
            Some(s) => s.chars().flat_map(char::escape_debug).collect::<String>(),
            None => "-".to_string(),
        };
        for n in &p.neighbors {
            println!(
                "  {:<20} {:<18} {:<20} {:<16} {:<18} {:>7}",
                text(Some(&n.chassis_id)),
                text(Some(&n.port_id)),
                text(n.system_name.as_deref()),
                text(n.port_description.as_deref()),
                text(n.management_address.as_deref()),
                n.ttl_remaining_s
            );
        }
    }
    Ok(())
}

pub fn fdb(control: &Path, json: bool) -> anyhow::Result<()> {
    let Response::Fdb { entries } = call(control, &Request::Fdb)? else {
        bail!("unexpected reply");
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&entries)?);
        return Ok(());
    }
    println!(
        "{:<18} {:>5} {:<12} {:>8} {:<16} ORIGIN",
        "MAC", "VLAN", "PORT", "AGE(s)", "VTEP"
    );
    for e in entries {
        println!(
            "{:<18} {:>5} {:<12} {:>8.1} {:<16} {}",
            e.mac,
            e.vlan,
            e.port,
            e.age_ms as f64 / 1000.0,
            e.vtep.as_deref().unwrap_or("-"),
            e.origin.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

fn get_stats(control: &Path) -> anyhow::Result<StatsReport> {
    match call(control, &Request::Stats)? {
        Response::Stats(s) => Ok(*s),
        _ => bail!("unexpected reply"),
    }
}

pub fn stats(control: &Path, json: bool, watch: bool, workers: bool) -> anyhow::Result<()> {
    if !watch {
        let s = get_stats(control)?;
        if json {
            println!("{}", serde_json::to_string_pretty(&s)?);
        } else {
            print_totals(&s);
        }
        return Ok(());
    }
    let mut prev = get_stats(control)?;
    let mut header_every = 0;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let cur = get_stats(control)?;
        let rates = qswitch_api::request::Rates::between(&prev, &cur);
        if json {
            println!("{}", serde_json::to_string(&rates)?);
        } else if workers {
            if header_every == 0 {
                println!("{}", worker_header());
            }
            header_every = (header_every + 1) % 4;
            for line in worker_lines(&prev, &cur, &rates) {
                println!("{line}");
            }
        } else {
            if header_every == 0 {
                println!("{}", rate_header(&cur));
            }
            header_every = (header_every + 1) % 20;
            println!("{}", rate_line(&cur, &rates));
        }
        prev = cur;
    }
}

fn print_totals(s: &StatsReport) {
    println!(
        "uptime {:.1} s, process CPU {:.2} s",
        s.uptime_ms as f64 / 1000.0,
        s.process_cpu_ns as f64 / 1e9
    );
    println!(
        "{:<12} {:>12} {:>14} {:>12} {:>14}  DROPS",
        "PORT", "RX_PKTS", "RX_BYTES", "TX_PKTS", "TX_BYTES"
    );
    for p in &s.ports {
        let drops: Vec<String> = p.drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
        println!(
            "{:<12} {:>12} {:>14} {:>12} {:>14}  {}",
            p.name,
            p.rx_packets,
            p.rx_bytes,
            p.tx_packets,
            p.tx_bytes,
            drops.join(" ")
        );
        if let Some(sink) = &p.sink {
            println!(
                "{:<12} sink: received {} lost {} reordered {} foreign {}; generated {}",
                "",
                sink.received,
                sink.lost,
                sink.reordered,
                sink.foreign,
                p.generated.unwrap_or(0)
            );
        }
    }
    println!(
        "{:<8} {:>4} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}  QUEUES",
        "WORKER", "CPU", "BUSY_POLLS", "IDLE_POLLS", "SLEEPS", "WAKEUPS", "VOL_CS", "INVOL_CS"
    );
    for w in &s.workers {
        println!(
            "{:<8} {:>4} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10}  {}",
            w.id,
            w.cpu,
            w.busy_polls,
            w.idle_polls,
            w.sleeps,
            w.wakeups,
            w.voluntary_ctx_switches,
            w.involuntary_ctx_switches,
            w.queues.join(" ")
        );
    }
    if let Some(r) = &s.rates {
        println!("last second: {}", rate_line(s, r));
    }
}

/// Column header for [`worker_lines`].
pub fn worker_header() -> String {
    format!(
        "{:>6} {:>6} {:>4} {:>6} {:>6} {:>9} {:>9} {:>9} {:>8}  QUEUES",
        "time", "WORKER", "CPU", "BUSY%", "CPU%", "SLEEPS/s", "WAKEUPS/s", "CS/s", "SPIN_us"
    )
}

/// One row per worker for the second between `prev` and `cur`.
pub fn worker_lines(prev: &StatsReport, cur: &StatsReport, r: &Rates) -> Vec<String> {
    let dt = cur.uptime_ms.saturating_sub(prev.uptime_ms).max(1) as f64 / 1000.0;
    cur.workers
        .iter()
        .map(|w| {
            let sleeps = prev
                .workers
                .iter()
                .find(|o| o.id == w.id)
                .map_or(0, |o| w.sleeps.saturating_sub(o.sleeps));
            let rate = r
                .workers
                .iter()
                .find(|x| x.id == w.id)
                .cloned()
                .unwrap_or_default();
            format!(
                "{:>6.0} {:>6} {:>4} {:>6.1} {:>6.1} {:>9.0} {:>9.0} {:>9.0} {:>8.1}  {}",
                cur.uptime_ms as f64 / 1000.0,
                w.id,
                w.cpu,
                rate.busy_pct,
                rate.cpu_pct,
                sleeps as f64 / dt,
                rate.wakeups_ps,
                rate.ctx_switches_ps,
                w.spin_us,
                w.queues.join(" ")
            )
        })
        .collect()
}

/// Column header for [`rate_line`].
pub fn rate_header(s: &StatsReport) -> String {
    let mut h = String::from("  time ");
    for p in &s.ports {
        h.push_str(&format!("| {:>16} ", format!("{} rx/tx Gb/s", p.name)));
    }
    for w in &s.workers {
        h.push_str(&format!("| w{} busy% cpu% cs/s ", w.id));
    }
    h
}

/// One line of per-second rates: Gbit/s per port, busy %, CPU % and context switches/s per
/// worker.
pub fn rate_line(s: &StatsReport, r: &Rates) -> String {
    let mut line = format!("{:>6.0} ", s.uptime_ms as f64 / 1000.0);
    for p in &r.ports {
        line.push_str(&format!(
            "| {:>7.2} {:>7.2}  ",
            p.rx_bps / 1e9,
            p.tx_bps / 1e9
        ));
    }
    for w in &r.workers {
        line.push_str(&format!(
            "| {:>8.1} {:>4.0} {:>5.0} ",
            w.busy_pct, w.cpu_pct, w.ctx_switches_ps
        ));
    }
    line
}

#[derive(Subcommand, Debug)]
pub enum QosCmd {
    /// Change a port's guarantee, limit or weight (live, within one allocator tick). Rates
    /// are bits/s of L2 frames with k/M/G suffixes, e.g. 200M.
    Set {
        port: String,
        /// Minimum guarantee (0 removes it).
        #[arg(long, value_parser = parse_rate_arg)]
        min: Option<u64>,
        /// Maximum limit.
        #[arg(long, value_parser = parse_rate_arg)]
        max: Option<u64>,
        /// Weight (1-1000) in the share of what the guarantees leave.
        #[arg(long)]
        weight: Option<u32>,
        /// Reset guarantee, limit and weight first (then apply the other options).
        #[arg(long)]
        clear: bool,
    },
    /// Settings, current allocation and measured rate per port.
    Show {
        #[arg(long)]
        json: bool,
    },
}

fn parse_rate_arg(s: &str) -> Result<u64, qswitch_api::value::RateError> {
    s.parse::<Rate>().map(Rate::bps)
}

fn rate(r: Option<u64>) -> String {
    r.map_or_else(|| "-".into(), qswitch_api::config::format_rate)
}

pub fn qos(control: &Path, cmd: QosCmd) -> anyhow::Result<()> {
    match cmd {
        QosCmd::Set {
            port,
            min,
            max,
            weight,
            clear,
        } => {
            call(
                control,
                &Request::QosSet {
                    port,
                    min,
                    max,
                    weight,
                    clear,
                },
            )?;
        }
        QosCmd::Show { json } => {
            let Response::Qos(r) = call(control, &Request::QosShow)? else {
                bail!("unexpected reply");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(());
            }
            println!(
                "{:<12} {:<10} {:>8} {:>8} {:>6} {:>9} {:>10}",
                "PORT", "UPLINK", "MIN", "MAX", "WEIGHT", "ALLOC", "RATE(1s)"
            );
            for p in &r.ports {
                let uplink = match (&p.uplink, p.capacity) {
                    (_, Some(c)) => match p.bond_members_up {
                        // A bond: the capacity the allocator shares and the members up.
                        Some([up, n]) => format!(
                            "cap {} ({up}/{n} up)",
                            qswitch_api::config::format_rate(
                                qswitch_dp::control::qos::bond_capacity(c, up, n)
                            )
                        ),
                        None => format!("cap {}", qswitch_api::config::format_rate(c)),
                    },
                    (Some(u), _) => u.clone(),
                    _ => "-".into(),
                };
                println!(
                    "{:<12} {:<10} {:>8} {:>8} {:>6} {:>9} {:>9.1}M",
                    p.name,
                    uplink,
                    rate(p.min),
                    rate(p.max),
                    p.weight,
                    rate(p.alloc_bps),
                    p.rate_bps / 1e6
                );
            }
            println!("reservable: {} of each uplink's capacity", r.reservable);
        }
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum MirrorCmd {
    /// Start a mirror session live (recorded like `port add`): copies of the sources' frames
    /// to a local port (`--output`) or to a collector as ERSPAN type II (`--erspan`).
    Add {
        name: String,
        /// Source ports, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        sources: Vec<String>,
        /// rx (frames the port sends into the switch), tx (frames it is sent) or both.
        #[arg(long, default_value = "both")]
        direction: qswitch_api::config::MirrorDirection,
        /// Only these VLANs, e.g. 10,20,100-200.
        #[arg(long)]
        vlans: Option<String>,
        /// The local port that receives the copies.
        #[arg(long, conflicts_with = "erspan")]
        output: Option<String>,
        /// The collector's IPv4 address (ERSPAN type II over GRE).
        #[arg(long, requires = "session")]
        erspan: Option<std::net::IpAddr>,
        /// The ERSPAN session id (0-1023).
        #[arg(long)]
        session: Option<u16>,
        /// The GRE packets' source address.
        #[arg(long, requires = "erspan")]
        src: Option<std::net::IpAddr>,
        /// The GRE packets' TTL.
        #[arg(long, requires = "erspan")]
        ttl: Option<u8>,
    },
    /// Stop a mirror session.
    Del { name: String },
    /// The sessions and their counters.
    List {
        #[arg(long)]
        json: bool,
    },
}

pub fn mirror(control: &Path, cmd: MirrorCmd) -> anyhow::Result<()> {
    use qswitch_api::config::{MirrorConfig, MirrorRemote, RemoteKind};
    match cmd {
        MirrorCmd::Add {
            name,
            sources,
            direction,
            vlans,
            output,
            erspan,
            session,
            src,
            ttl,
        } => {
            let vlans = match vlans {
                Some(v) => Some(VlanSet::try_from(v).map_err(|e| anyhow::anyhow!("--vlans: {e}"))?),
                None => None,
            };
            let remote = erspan.map(|dst| MirrorRemote {
                kind: RemoteKind::Erspan,
                dst,
                session: session.unwrap_or_default(),
                src,
                ttl,
            });
            let mirror = MirrorConfig {
                name,
                sources,
                direction,
                vlans,
                output,
                remote,
            };
            call(control, &Request::MirrorAdd { mirror })?;
        }
        MirrorCmd::Del { name } => {
            call(control, &Request::MirrorDel { name })?;
        }
        MirrorCmd::List { json } => {
            let Response::Mirrors { mirrors } = call(control, &Request::MirrorList)? else {
                bail!("unexpected reply");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&mirrors)?);
                return Ok(());
            }
            println!(
                "{:<12} {:<5} {:<24} {:<24} {:>10} {:>10} {:>10}",
                "MIRROR", "DIR", "SOURCES", "OUTPUT", "COPIES", "SENT", "DROPS"
            );
            for m in &mirrors {
                let c = &m.config;
                let mut out = match (&c.output, &c.remote) {
                    (Some(o), _) => o.clone(),
                    (None, Some(r)) => format!("erspan {} #{}", r.dst, r.session),
                    _ => "-".into(),
                };
                if let Some(v) = &c.vlans {
                    out.push_str(&format!(" vlans {}", String::from(v.clone())));
                }
                println!(
                    "{:<12} {:<5} {:<24} {:<24} {:>10} {:>10} {:>10}",
                    c.name,
                    c.direction.to_string(),
                    c.sources.join(","),
                    out,
                    m.copies,
                    m.sent,
                    m.drops
                );
            }
        }
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum BondCmd {
    /// Mode, members, link and LACP state of each member, partner, active member, buckets.
    Show {
        /// One bond (default: every bond).
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Make MEMBER the active member (active-backup; balance-slb's broadcast receiver).
    Set {
        name: String,
        #[arg(long, value_name = "MEMBER")]
        active: String,
    },
}

pub fn bond(control: &Path, cmd: BondCmd) -> anyhow::Result<()> {
    match cmd {
        BondCmd::Set { name, active } => {
            call(control, &Request::BondSet { name, active })?;
        }
        BondCmd::Show { name, json } => {
            let Response::Bonds { bonds } = call(control, &Request::BondShow { name })? else {
                bail!("unexpected reply");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&bonds)?);
                return Ok(());
            }
            for b in &bonds {
                println!(
                    "bond {}: mode {}, lacp {} ({}), active member {}",
                    b.name,
                    b.mode,
                    b.lacp,
                    b.lacp_rate,
                    b.active.as_deref().unwrap_or("none")
                );
                println!(
                    "  {:<16} {:<7} {:<8} {:>7} {:>10} {:>10} {:>8} {:>8} {:>6}  LACP",
                    "MEMBER",
                    "CARRIER",
                    "ENABLED",
                    "BUCKETS",
                    "RX",
                    "TX",
                    "LACP_RX",
                    "LACP_TX",
                    "RARP"
                );
                for m in &b.members {
                    let lacp = m.lacp_state.as_ref().map_or_else(
                        || "-".to_string(),
                        |l| {
                            format!(
                                "{} {} partner {} key {} port {} state {:#04x}{}",
                                l.rx,
                                l.mux,
                                l.partner_system,
                                l.partner_key,
                                l.partner_port,
                                l.partner_state,
                                if l.partner_in_sync { " in sync" } else { "" }
                            )
                        },
                    );
                    println!(
                        "  {:<16} {:<7} {:<8} {:>7} {:>10} {:>10} {:>8} {:>8} {:>6}  {}",
                        m.name,
                        if m.carrier { "up" } else { "down" },
                        if m.enabled { "yes" } else { "no" },
                        m.buckets,
                        m.rx_packets,
                        m.tx_packets,
                        m.lacp_rx,
                        m.lacp_tx,
                        m.rarp_tx,
                        lacp
                    );
                }
            }
        }
    }
    Ok(())
}

#[derive(Subcommand, Debug)]
pub enum ExportCmd {
    /// IPFIX (RFC 7011) flow records to a collector over UDP.
    #[command(subcommand)]
    Ipfix(IpfixCmd),
    /// sFlow v5 flow and counter samples to a collector over UDP.
    #[command(subcommand)]
    Sflow(SflowCmd),
    /// Stop exporting with one protocol.
    Off {
        #[arg(value_parser = ["ipfix", "sflow"])]
        protocol: String,
    },
    /// What is exported and what the exporter counted.
    Show {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum IpfixCmd {
    /// Export to this collector from now on (recorded; flows in the caches are flushed).
    Set {
        /// IP address and UDP port, e.g. 192.0.2.9:4739.
        #[arg(long)]
        collector: String,
        /// Account 1 in N frames.
        #[arg(long, default_value_t = 1)]
        sampling: u32,
        /// Seconds: a longer flow is reported and starts over.
        #[arg(long, default_value_t = 60)]
        active_timeout: u32,
        /// Seconds without a frame: the flow ends.
        #[arg(long, default_value_t = 15)]
        idle_timeout: u32,
    },
}

#[derive(Subcommand, Debug)]
pub enum SflowCmd {
    /// Export to this collector from now on (recorded).
    Set {
        /// IP address and UDP port, e.g. 192.0.2.9:6343.
        #[arg(long)]
        collector: String,
        /// Sample 1 in N frames, on average.
        #[arg(long)]
        sampling: u32,
        /// Seconds between counter samples (0: none).
        #[arg(long, default_value_t = 20)]
        polling: u32,
    },
}

/// A `[switch.ipfix]`/`[switch.sflow]` table from the command line, checked as the config
/// file's is (the same one-line errors).
fn export_table<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> anyhow::Result<T> {
    serde_json::from_value(v).map_err(|e| anyhow::anyhow!("{e}"))
}

pub fn export(control: &Path, cmd: ExportCmd) -> anyhow::Result<()> {
    let req = match cmd {
        ExportCmd::Ipfix(IpfixCmd::Set {
            collector,
            sampling,
            active_timeout,
            idle_timeout,
        }) => Request::ExportSet {
            ipfix: Some(export_table(serde_json::json!({
                "collector": collector,
                "sampling": sampling,
                "active_timeout": active_timeout,
                "idle_timeout": idle_timeout,
            }))?),
            sflow: None,
        },
        ExportCmd::Sflow(SflowCmd::Set {
            collector,
            sampling,
            polling,
        }) => Request::ExportSet {
            ipfix: None,
            sflow: Some(export_table(serde_json::json!({
                "collector": collector,
                "sampling": sampling,
                "polling": polling,
            }))?),
        },
        ExportCmd::Off { protocol } => Request::ExportOff { protocol },
        ExportCmd::Show { json } => {
            let Response::Export(r) = call(control, &Request::ExportShow)? else {
                bail!("unexpected reply");
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
                return Ok(());
            }
            match &r.ipfix {
                Some(i) => println!(
                    "ipfix  to {}  sampling 1 in {}  active {} s  idle {} s",
                    i.collector, i.sampling, i.active_timeout, i.idle_timeout
                ),
                None => println!("ipfix  off"),
            }
            match &r.sflow {
                Some(s) => println!(
                    "sflow  to {}  sampling 1 in {}  polling {} s",
                    s.collector, s.sampling, s.polling
                ),
                None => println!("sflow  off"),
            }
            let c = &r.counters;
            println!(
                "ipfix  records {}  messages {}  send errors {}  ended: idle {} active {} forced {} evicted {}  dropped {}",
                c.ipfix_records,
                c.ipfix_messages,
                c.ipfix_send_errors,
                c.ended_idle,
                c.ended_active,
                c.ended_forced,
                c.ended_evicted,
                c.records_dropped
            );
            println!(
                "sflow  flow samples {}  counter samples {}  datagrams {}  send errors {}  dropped {}",
                c.sflow_flow_samples,
                c.sflow_counter_samples,
                c.sflow_datagrams,
                c.sflow_send_errors,
                c.samples_dropped
            );
            return Ok(());
        }
    };
    call(control, &req)?;
    Ok(())
}
