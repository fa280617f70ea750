//! `qswitch ct` and `qswitch sg`: the firewall's connections and security groups
//! (docs/firewall.md), and the daemon's side of their read requests (changes to groups go
//! through [`crate::state::Persist`], recorded before they are put in force).

use std::path::Path;

use anyhow::bail;
use clap::Subcommand;
use qswitch_api::client::call;
use qswitch_api::config::{GroupRule, SecurityGroupConfig};
use qswitch_api::policy::IpPrefix;
use qswitch_api::request::{CtEntry, CtPortStats, CtRuleHits, CtStatsReport, SecurityGroupInfo};
use qswitch_api::{Request, Response};
use qswitch_dp::firewall::Entry;
use qswitch_wire::flow::IpPair;

use crate::daemon::Daemon;

/// `ct list` without `--limit`.
pub const DEFAULT_LIMIT: usize = 100;
/// Most connections one `ct list` returns (one response line).
pub const MAX_LIMIT: usize = 100_000;

#[derive(Subcommand, Debug)]
pub enum CtCmd {
    /// List tracked connections.
    List {
        /// Only this port's.
        #[arg(long)]
        port: Option<String>,
        /// At most this many (default 100, at most 100000).
        #[arg(long)]
        limit: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// End tracked connections: of one port, or all.
    Flush {
        #[arg(long)]
        port: Option<String>,
    },
    /// Sessions switch-wide and per port, the limits, invalid and refused counts.
    Stats {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum SgCmd {
    /// List the security groups.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show one group's rules, address set and ports.
    Show {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Add a group (with no rules: add them with `sg rule add`).
    Add {
        name: String,
        /// Plain ACLs: nothing tracked, replies need rules of their own.
        #[arg(long)]
        stateless: bool,
    },
    /// Remove a group no port and no remote_group uses.
    Del { name: String },
    /// Add or remove a group's rules.
    #[command(subcommand)]
    Rule(RuleCmd),
    /// Set the addresses of the group's members on other hosts (for remote_group rules):
    /// "10.0.0.7,10.0.1.0/24", or none.
    Addresses {
        name: String,
        #[arg(long, value_name = "PREFIX,...")]
        set: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum RuleCmd {
    /// Append a rule to a group.
    Add {
        group: String,
        /// ingress (toward the port's VM) or egress.
        #[arg(long)]
        direction: String,
        /// ipv4 or ipv6 (default both).
        #[arg(long)]
        ethertype: Option<String>,
        /// tcp, udp, icmp, icmpv6, sctp, any or a number 0..=255.
        #[arg(long)]
        protocol: Option<String>,
        /// Destination ports and ranges: "80,443,8000-8080".
        #[arg(long)]
        ports: Option<String>,
        #[arg(long)]
        icmp_type: Option<i64>,
        #[arg(long)]
        icmp_code: Option<i64>,
        /// A CIDR.
        #[arg(long)]
        remote: Option<String>,
        /// The addresses of this group's members.
        #[arg(long)]
        remote_group: Option<String>,
    },
    /// Remove a group's rule by index (`sg show` numbers them).
    Del { group: String, index: usize },
}

/// The daemon's answer to `ct list`, `ct flush`, `ct stats` and `sg list`/`sg show`.
pub fn execute(req: Request, daemon: &Daemon) -> Response {
    match answer(req, daemon) {
        Ok(r) => r,
        Err(e) => Response::Error {
            message: crate::chain(&e),
        },
    }
}

fn answer(req: Request, daemon: &Daemon) -> anyhow::Result<Response> {
    let sw = &daemon.switch;
    let fw = sw.firewall();
    let zone = |port: &Option<String>| port.as_deref().map(|p| sw.port_zone(p)).transpose();
    Ok(match req {
        Request::CtList { port, limit } => {
            let zone = zone(&port)?;
            let limit = limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT);
            let now = sw.now();
            let names = sw.zone_names();
            let entries = fw
                .list(zone, limit, now)
                .iter()
                .map(|e| ct_entry(e, &names, &fw.rules(), now))
                .collect();
            let total = zone.map_or_else(|| fw.table_len(), |z| fw.sessions(z));
            Response::CtList { entries, total }
        }
        Request::CtFlush { port } => {
            let zone = zone(&port)?;
            Response::CtFlushed {
                removed: fw.flush(zone, sw.now()),
            }
        }
        Request::CtStats => Response::CtStats(Box::new(ct_stats(daemon))),
        Request::SgList { name } => {
            let ports = sw.port_configs();
            let rules = fw.rules();
            let mut hits: std::collections::HashMap<(&str, u16), u64> = Default::default();
            for r in (rules.ports.iter().flatten()).flat_map(|p| p.ingress.iter().chain(&p.egress))
            {
                if let Some(g) = rules.groups.get(usize::from(r.id.group)) {
                    *hits.entry((g.as_str(), r.id.index)).or_default() += r.hits.get();
                }
            }
            let groups: Vec<SecurityGroupInfo> = sw
                .security_groups()
                .into_iter()
                .filter(|g| name.as_ref().is_none_or(|n| *n == g.name))
                .map(|g| SecurityGroupInfo {
                    ports: (ports.iter())
                        .filter(|p| p.security_groups.contains(&g.name))
                        .map(|p| p.name.clone())
                        .collect(),
                    hits: (0..g.rules.len())
                        .map(|i| {
                            let i = u16::try_from(i).unwrap_or(u16::MAX);
                            hits.get(&(g.name.as_str(), i)).copied().unwrap_or(0)
                        })
                        .collect(),
                    group: g,
                })
                .collect();
            if let (Some(n), true) = (&name, groups.is_empty()) {
                bail!("security group '{n}' does not exist");
            }
            Response::SecurityGroups { groups }
        }
        other => bail!("not a firewall request: {other:?}"),
    })
}

/// `ct stats`, also the source of `/metrics`' firewall families
/// ([`crate::metrics::render_firewall`]).
pub fn ct_stats(daemon: &Daemon) -> CtStatsReport {
    let sw = &daemon.switch;
    let fw = sw.firewall();
    let st = fw.stats();
    let names = sw.zone_names();
    let traffic = sw.zone_traffic();
    let per_s = daemon.fw_new.lock().clone();
    let ports = st
        .zones
        .iter()
        .filter_map(|z| {
            let port = names.get(z.zone as usize).cloned().flatten()?;
            let t = traffic.get(z.zone as usize).copied().flatten();
            let t = t.unwrap_or_default();
            Some(CtPortStats {
                port,
                sessions: z.sessions,
                max_sessions: z.max_sessions,
                new: z.new,
                ct_invalid: z.ct_invalid,
                ct_limit: z.ct_limit,
                ct_fragment: z.ct_fragment,
                allowed_ingress: t.allowed_ingress,
                allowed_egress: t.allowed_egress,
                denied_ingress: t.denied_ingress,
                denied_egress: t.denied_egress,
                new_per_s: per_s.get(&z.zone).map_or(0, |&(_, r)| r),
            })
        })
        .collect();
    let rules = fw.rules();
    let rules = st
        .rules
        .iter()
        .filter_map(|h| {
            Some(CtRuleHits {
                port: names.get(h.zone as usize).cloned().flatten()?,
                group: rules.groups.get(usize::from(h.rule.group))?.clone(),
                index: h.rule.index,
                hits: h.hits,
            })
        })
        .collect();
    CtStatsReport {
        enabled: fw.active(),
        sessions: st.sessions,
        max_sessions: st.max_sessions,
        memory_bytes: st.memory_bytes as u64,
        ports,
        rules,
    }
}

fn endpoint(ip: std::net::IpAddr, port: u16, proto: u8) -> String {
    let addr = match ip {
        std::net::IpAddr::V4(a) => a.to_string(),
        std::net::IpAddr::V6(a) => format!("[{a}]"),
    };
    match proto {
        6 | 17 | 132 | 1 | 58 => format!("{addr}:{port}"),
        _ => addr,
    }
}

fn ct_entry(
    e: &Entry,
    names: &[Option<String>],
    rules: &qswitch_dp::firewall::RuleSet,
    now: u64,
) -> CtEntry {
    let (src, dst): (std::net::IpAddr, std::net::IpAddr) = match e.key.ips {
        IpPair::V4 { src, dst } => (src.into(), dst.into()),
        IpPair::V6 { src, dst } => (src.into(), dst.into()),
    };
    let p = e.key.proto;
    CtEntry {
        port: names
            .get(e.zone as usize)
            .cloned()
            .flatten()
            .unwrap_or_else(|| format!("zone {}", e.zone)),
        protocol: match p {
            6 => "tcp".into(),
            17 => "udp".into(),
            1 => "icmp".into(),
            58 => "icmpv6".into(),
            132 => "sctp".into(),
            n => n.to_string(),
        },
        src: endpoint(src, e.key.src, p),
        dst: endpoint(dst, e.key.dst, p),
        state: e.state.name().into(),
        expires_s: e.expires.saturating_sub(now) / 1_000_000_000,
        rule: rules.name(e.rule),
    }
}

fn expect<T>(r: Response, f: impl FnOnce(Response) -> Option<T>) -> anyhow::Result<T> {
    match r {
        Response::Error { message } => bail!("{message}"),
        r => f(r).ok_or_else(|| anyhow::anyhow!("unexpected reply")),
    }
}

fn ok(control: &Path, req: &Request) -> anyhow::Result<()> {
    expect(call(control, req)?, |r| {
        matches!(r, Response::Ok).then_some(())
    })
}

/// `qswitch ct ...`.
pub fn run_ct(control: &Path, cmd: CtCmd) -> anyhow::Result<()> {
    match cmd {
        CtCmd::List { port, limit, json } => {
            let r = call(control, &Request::CtList { port, limit })?;
            let (entries, total) = expect(r, |r| match r {
                Response::CtList { entries, total } => Some((entries, total)),
                _ => None,
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&entries)?);
                return Ok(());
            }
            println!(
                "{:<12} {:<6} {:<42} {:<42} {:<12} {:>8} RULE",
                "PORT", "PROTO", "SRC", "DST", "STATE", "EXPIRES"
            );
            for e in &entries {
                println!(
                    "{:<12} {:<6} {:<42} {:<42} {:<12} {:>7}s {}",
                    e.port, e.protocol, e.src, e.dst, e.state, e.expires_s, e.rule
                );
            }
            println!("{} of {total} connections", entries.len());
        }
        CtCmd::Flush { port } => {
            let r = call(control, &Request::CtFlush { port })?;
            let removed = expect(r, |r| match r {
                Response::CtFlushed { removed } => Some(removed),
                _ => None,
            })?;
            println!("{removed} connections ended");
        }
        CtCmd::Stats { json } => {
            let st = expect(call(control, &Request::CtStats)?, |r| match r {
                Response::CtStats(s) => Some(s),
                _ => None,
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
                return Ok(());
            }
            println!(
                "sessions {} of {} ({}; table {} MiB)",
                st.sessions,
                st.max_sessions,
                if st.enabled {
                    "firewall on"
                } else {
                    "no port filtered"
                },
                st.memory_bytes >> 20
            );
            if !st.ports.is_empty() {
                println!(
                    "{:<16} {:>9} {:>9} {:>12} {:>7} {:>10} {:>10} {:>11}",
                    "PORT", "SESSIONS", "LIMIT", "NEW", "NEW/S", "INVALID", "LIMITED", "FRAGMENTS"
                );
            }
            for p in &st.ports {
                let limit = p.max_sessions.map_or_else(|| "-".into(), |m| m.to_string());
                println!(
                    "{:<16} {:>9} {:>9} {:>12} {:>7} {:>10} {:>10} {:>11}",
                    p.port,
                    p.sessions,
                    limit,
                    p.new,
                    p.new_per_s,
                    p.ct_invalid,
                    p.ct_limit,
                    p.ct_fragment
                );
            }
            if !st.ports.is_empty() {
                println!(
                    "{:<16} {:>14} {:>14} {:>14} {:>14}",
                    "PORT", "IN ALLOWED", "IN DENIED", "OUT ALLOWED", "OUT DENIED"
                );
            }
            for p in &st.ports {
                println!(
                    "{:<16} {:>14} {:>14} {:>14} {:>14}",
                    p.port, p.allowed_ingress, p.denied_ingress, p.allowed_egress, p.denied_egress
                );
            }
            if !st.rules.is_empty() {
                println!("{:<16} {:<24} {:>12}", "PORT", "RULE", "HITS");
            }
            for r in &st.rules {
                let rule = format!("{}/{}", r.group, r.index);
                println!("{:<16} {:<24} {:>12}", r.port, rule, r.hits);
            }
        }
    }
    Ok(())
}

/// One rule as `sg show` prints it: as the config file's inline table.
fn rule_text(r: &GroupRule) -> String {
    match serde_json::to_value(r) {
        Ok(serde_json::Value::Object(keys)) => {
            let keys: Vec<String> = keys.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            format!("{{ {} }}", keys.join(", "))
        }
        _ => format!("{r:?}"),
    }
}

/// `qswitch sg ...`.
pub fn run_sg(control: &Path, cmd: SgCmd) -> anyhow::Result<()> {
    let groups = |name: Option<String>| -> anyhow::Result<Vec<SecurityGroupInfo>> {
        expect(call(control, &Request::SgList { name })?, |r| match r {
            Response::SecurityGroups { groups } => Some(groups),
            _ => None,
        })
    };
    match cmd {
        SgCmd::List { json } => {
            let gs = groups(None)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&gs)?);
                return Ok(());
            }
            println!("{:<20} {:>6} {:<10} PORTS", "GROUP", "RULES", "KIND");
            for g in &gs {
                let kind = if g.group.stateless {
                    "stateless"
                } else {
                    "stateful"
                };
                println!(
                    "{:<20} {:>6} {:<10} {}",
                    g.group.name,
                    g.group.rules.len(),
                    kind,
                    g.ports.join(",")
                );
            }
        }
        SgCmd::Show { name, json } => {
            let gs = groups(Some(name))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&gs)?);
                return Ok(());
            }
            for g in &gs {
                println!(
                    "group {}{}",
                    g.group.name,
                    if g.group.stateless {
                        " (stateless)"
                    } else {
                        ""
                    }
                );
                println!("ports: {}", g.ports.join(","));
                if !g.group.addresses.is_empty() {
                    let a: Vec<String> =
                        g.group.addresses.iter().map(ToString::to_string).collect();
                    println!("addresses: {}", a.join(","));
                }
                for (i, r) in g.group.rules.iter().enumerate() {
                    let hits = g.hits.get(i).copied().unwrap_or(0);
                    println!("  {i}: {} hits {hits}", rule_text(r));
                }
            }
        }
        SgCmd::Add { name, stateless } => {
            let group: SecurityGroupConfig =
                serde_json::from_value(serde_json::json!({ "name": name, "stateless": stateless }))
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
            ok(control, &Request::SgAdd { group })?;
        }
        SgCmd::Del { name } => ok(control, &Request::SgDel { name })?,
        SgCmd::Addresses { name, set } => {
            let addresses: Vec<IpPrefix> = if set.trim() == "none" {
                Vec::new()
            } else {
                qswitch_api::policy::parse_list(&set)
                    .map_err(|e: qswitch_api::policy::PolicyValueError| anyhow::anyhow!("{e}"))?
            };
            ok(
                control,
                &Request::SgAddresses {
                    group: name,
                    addresses,
                },
            )?;
        }
        SgCmd::Rule(RuleCmd::Del { group, index }) => {
            ok(control, &Request::SgRuleDel { group, index })?;
        }
        SgCmd::Rule(RuleCmd::Add {
            group,
            direction,
            ethertype,
            protocol,
            ports,
            icmp_type,
            icmp_code,
            remote,
            remote_group,
        }) => {
            // Read through the rule's own checks, so that a bad rule is refused here with
            // the config file's one-line message.
            let mut keys = serde_json::Map::new();
            keys.insert("direction".into(), direction.into());
            let mut put = |k: &str, v: Option<serde_json::Value>| {
                if let Some(v) = v {
                    keys.insert(k.into(), v);
                }
            };
            put("ethertype", ethertype.map(Into::into));
            put("protocol", protocol.map(Into::into));
            put("ports", ports.map(Into::into));
            put("icmp_type", icmp_type.map(Into::into));
            put("icmp_code", icmp_code.map(Into::into));
            put("remote", remote.map(Into::into));
            put("remote_group", remote_group.map(Into::into));
            let rule: GroupRule = serde_json::from_value(serde_json::Value::Object(keys))
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            ok(control, &Request::SgRuleAdd { group, rule })?;
        }
    }
    Ok(())
}
