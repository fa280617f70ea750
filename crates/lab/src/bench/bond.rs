//! `bond`: does a bond of two AF_XDP members carry more than one member (issue 28: "a bond of
//! two AF_XDP members with 4 TCP streams ≥ 1.0× one member")? No NICs here: two veth pairs
//! stand in for two NICs and their cables; their far ends are ports of a Linux bridge in a
//! peer namespace (the "physical switch", learning each VM's MAC on the member it came by).
//!
//! ```text
//!   bond-2:      peer ns: bridge qsbdB<n> ─┬─ qsbdP0<n> ──veth── qsbdU0<n> ═╗ bond "up"
//!                10.95.0.1, iperf3 clients └─ qsbdP1<n> ──veth── qsbdU1<n> ═╝ balance-slb ═ qswitch
//!                                                                   ═ TAP qsbd<n>t1..tS ── vm ns 1..S
//!   one-member:  the same with one veth pair and a plain afxdp port "up" on qsbdU0<n>
//! ```
//!
//! Both members are afxdp in native mode (as `bench uplink` runs it on a veth), GRO off on
//! the root ends, checksum and segmentation offloads off on the peer's ends and its bridge
//! (wire-size frames, as from a NIC). Each stream has its own VM namespace behind its own TAP
//! port with a fixed MAC `02:51:62:00:00:<k>`, its own iperf3 server, and one iperf3 client in
//! the peer namespace (traffic peer → VMs, as a download through the uplink). balance-slb
//! sends each VM MAC by one member (hash bucket), the bridge learns it there and sends that
//! VM's traffic back by it; the fixed MACs hash alternately to the two members with the
//! bond's hash today, so 4 streams split 2 + 2 (the per-member frame counts `bond show`
//! reports before and after each run say whether they did). Contenders, interleaved per
//! round: `bond-2-S` and `one-member-S` for S = 1 and the `--streams` count (4 unless given).

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use qswitch_api::bond::BondMemberInfo;
use qswitch_api::{Request, Response};
use serde::Serialize;

use super::wire::{offloads_off, print_idle, print_ran, wire};
use super::{
    ratio_of, run_line, summarise, Bench, ContenderSummary, IperfMetrics, IperfRun, Ratio, Report,
    Sample,
};
use crate::netns::{self, ChildGuard, LabDaemon, Link, Netns};
use crate::plot;
use crate::procstat;
use crate::run::Run;
use crate::topology::RemoveDir;

/// The contenders of each stream count: members of the uplink (2: a bond; 1: a plain port).
const LINKS: [(&str, usize); 2] = [("bond-2", 2), ("one-member", 1)];
/// The peer's address (on its bridge); VM `k` (1-based) has `10.95.0.(10 + k)`.
const PEER_ADDR: &str = "10.95.0.1";
/// At most this many streams (VM namespaces).
const MAX_STREAMS: u32 = 16;

/// The two stream counts: 1 and `--streams` (4 when left at its default of 1).
fn stream_counts(b: &Bench) -> anyhow::Result<[u32; 2]> {
    let s = b.args.streams;
    if s > MAX_STREAMS {
        bail!("--streams {s}: bench bond runs one VM namespace per stream, at most {MAX_STREAMS}");
    }
    Ok([1, if s > 1 { s } else { 4 }])
}

/// `bond-2-1`, `one-member-1`, `bond-2-4`, `one-member-4`.
fn names(counts: &[u32; 2]) -> Vec<String> {
    counts
        .iter()
        .flat_map(|s| LINKS.iter().map(move |(l, _)| format!("{l}-{s}")))
        .collect()
}

fn vm_addr(k: usize) -> String {
    format!("10.95.0.{}", 10 + k)
}

/// VM `k`'s MAC (1-based). With the bond's FNV-1a hash of the source MAC, k odd lands on the
/// second member and k even on the first (checked by the per-member counts of each run).
fn vm_mac(k: usize) -> String {
    format!("02:51:62:00:00:{k:02x}")
}

/// A member's share of the bond's frames over one run.
#[derive(Debug, Clone, Serialize)]
struct MemberShare {
    member: String,
    rx_packets: u64,
    tx_packets: u64,
    rx_dropped: u64,
    /// Of the frames all members received (sent) in the run.
    rx_share: f64,
    tx_share: f64,
}

/// How one run's traffic spread: per stream (VM) and, for a bond, per member.
#[derive(Debug, Clone, Serialize)]
struct Spread {
    contender: String,
    round: u32,
    seq: usize,
    /// Gbit/s received by each VM, in VM order.
    stream_gbps: Vec<f64>,
    /// Empty for `one-member` (one plain afxdp port).
    members: Vec<MemberShare>,
}

#[derive(Debug, Serialize)]
struct BondReport {
    #[serde(flatten)]
    report: Report,
    /// bond-2 over one-member at each stream count.
    ratios: Vec<Ratio>,
    spreads: Vec<Spread>,
}

/// Field order is drop order: the daemon, then the veths, then the namespaces and files.
struct BondTopo {
    daemon: LabDaemon,
    _wires: Vec<Link>,
    peer: Netns,
    vms: Vec<Netns>,
    /// Whether port `up` is a bond.
    bond: bool,
    _dir: RemoveDir,
}

fn setup(id: u32, workers: &str, links: usize, streams: usize) -> anyhow::Result<BondTopo> {
    let n = id % 10_000;
    let tag = format!("m{links}");
    let peer = Netns::create(&format!("qsbench-bond-{tag}-p-{id}"))?;
    let vms = (1..=streams)
        .map(|k| Netns::create(&format!("qsbench-bond-{tag}-v{k}-{id}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let br = format!("qsbdB{n}");
    peer.exec(&["ip", "link", "add", "name", &br, "type", "bridge"])?;
    let mut wires = Vec::new();
    let mut members = Vec::new();
    for m in 0..links {
        let (up, w) = (format!("qsbdU{m}{n}"), format!("qsbdP{m}{n}"));
        wires.push(wire(&peer, &up, &w)?);
        peer.exec(&["ip", "link", "set", &w, "master", &br])?;
        peer.exec(&["ip", "link", "set", &w, "up"])?;
        members.push(up);
    }
    offloads_off(&peer, &br)?;
    peer.exec(&["ip", "addr", "add", &format!("{PEER_ADDR}/24"), "dev", &br])?;
    peer.exec(&["ip", "link", "set", &br, "up"])?;

    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-bond-{id}")));
    let control = dir.0.join("control.sock");
    let uplink = if links > 1 {
        let list: Vec<String> = members
            .iter()
            .map(|m| format!("{{ type = \"afxdp\", ifname = \"{m}\", mode = \"native\" }}"))
            .collect();
        format!(
            "[[port]]\nname = \"up\"\ntype = \"bond\"\nmode = \"balance-slb\"\nmembers = [ {} ]\n",
            list.join(", ")
        )
    } else {
        format!(
            "[[port]]\nname = \"up\"\ntype = \"afxdp\"\nifname = \"{}\"\nmode = \"native\"\n",
            members[0]
        )
    };
    let taps: String = (1..=streams)
        .map(|k| format!("[[port]]\nname = \"vm{k}\"\ntype = \"tap\"\nifname = \"qsbd{n}t{k}\"\n"))
        .collect();
    let text = format!(
        "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\n{uplink}{taps}",
        control.display()
    );
    let daemon = LabDaemon::start(&dir.0, &text)?;
    let topo = BondTopo {
        daemon,
        _wires: wires,
        peer,
        vms,
        bond: links > 1,
        _dir: dir,
    };
    for (i, vm) in topo.vms.iter().enumerate() {
        let tap = format!("qsbd{n}t{}", i + 1);
        netns::run(&["ip", "link", "set", &tap, "address", &vm_mac(i + 1)])?;
        vm.adopt(&tap, &format!("{}/24", vm_addr(i + 1)))?;
    }
    Ok(topo)
}

/// Waits until the peer reaches every VM (the bond's members up, the bridge has learned
/// each VM's MAC on its member), up to 10 s.
fn wait_reachable(b: &Bench, topo: &BondTopo) -> anyhow::Result<()> {
    for k in 1..=topo.vms.len() {
        let addr = vm_addr(k);
        let deadline = Instant::now() + Duration::from_secs(10);
        while topo
            .peer
            .exec(&["ping", "-c", "1", "-W", "1", &addr])
            .is_err()
        {
            b.check()?;
            if Instant::now() > deadline {
                bail!("the peer namespace cannot reach {addr} through qswitch within 10 s");
            }
        }
    }
    Ok(())
}

/// The bond's members as `bond show` reports them.
fn bond_members(d: &LabDaemon) -> anyhow::Result<Vec<BondMemberInfo>> {
    match qswitch_api::client::call(
        &d.control,
        &Request::BondShow {
            name: Some("up".into()),
        },
    )? {
        Response::Bonds { mut bonds } if !bonds.is_empty() => Ok(bonds.remove(0).members),
        _ => bail!("unexpected reply to bond show"),
    }
}

/// Each member's frames between two `bond show`s and its share of all members'.
fn shares(before: &[BondMemberInfo], after: &[BondMemberInfo]) -> Vec<MemberShare> {
    let delta: Vec<(String, u64, u64, u64)> = after
        .iter()
        .map(|a| {
            let b = before.iter().find(|b| b.name == a.name);
            let d = |f: fn(&BondMemberInfo) -> u64| f(a).saturating_sub(b.map_or(0, f));
            (
                a.name.clone(),
                d(|m| m.rx_packets),
                d(|m| m.tx_packets),
                d(|m| m.rx_dropped),
            )
        })
        .collect();
    let (rx, tx): (u64, u64) = delta.iter().fold((0, 0), |(r, t), d| (r + d.1, t + d.2));
    let share = |n: u64, of: u64| if of == 0 { 0.0 } else { n as f64 / of as f64 };
    delta
        .into_iter()
        .map(|(member, r, t, dropped)| MemberShare {
            member,
            rx_packets: r,
            tx_packets: t,
            rx_dropped: dropped,
            rx_share: share(r, rx),
            tx_share: share(t, tx),
        })
        .collect()
}

/// One run: an iperf3 server in each VM namespace, one client per VM in the peer namespace,
/// all at once for `--seconds`; 1 s idle baseline first, machine CPU and the daemon's rates
/// every second, the bond's member counters before and after. Prints a dot per second.
fn run_once(
    b: &Bench,
    topo: &BondTopo,
    (contender, round, seq): (&str, u32, usize),
) -> anyhow::Result<(IperfRun, Spread)> {
    let seconds = b.args.seconds;
    let mut servers: Vec<ChildGuard> = Vec::new();
    for (i, vm) in topo.vms.iter().enumerate() {
        servers.push(vm.spawn(
            &["iperf3", "-s", "-1", "-B", &vm_addr(i + 1)],
            Stdio::null(),
        )?);
    }
    for vm in &topo.vms {
        if let Err(e) = netns::wait_listening(vm, 5201) {
            b.check()?; // Ctrl-C also stops the servers: say so rather than "nothing listens"
            return Err(e);
        }
    }
    let idle_from = procstat::cpu_jiffies();
    b.sleep(Duration::from_secs(1))?;
    let idle_busy_cpus = procstat::busy_cpus(idle_from, procstat::cpu_jiffies());

    let first_stats = topo.daemon.stats()?;
    let first_bond = if topo.bond {
        bond_members(&topo.daemon)?
    } else {
        Vec::new()
    };
    let mut clients = Vec::new();
    let mut outs = Vec::new();
    for k in 1..=topo.vms.len() {
        let mut c = netns::iperf3_client(&topo.peer, &vm_addr(k), seconds, 1)?;
        let out = c.0.as_mut().and_then(|c| c.stdout.take());
        outs.push(std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut o) = out {
                let _ = o.read_to_end(&mut v);
            }
            v
        }));
        clients.push(c);
    }
    let cpu_from = procstat::cpu_jiffies();
    let t0 = Instant::now();
    let mut ticks = Vec::new();
    let (mut prev_cpu, mut prev_stats) = (cpu_from, first_stats.clone());
    let limit = Duration::from_secs(u64::from(seconds) + 20);
    for k in 1u32.. {
        b.check()?;
        let next = t0 + Duration::from_secs(u64::from(k));
        let mut done = true;
        for c in &mut clients {
            if c.wait_timeout(next.saturating_duration_since(Instant::now()))?
                .is_none()
            {
                done = false;
            }
        }
        if done {
            break;
        }
        if t0.elapsed() > limit {
            bail!("iperf3 did not finish within {} s", limit.as_secs());
        }
        let cpu = procstat::cpu_jiffies();
        let busy = procstat::busy_cpus(prev_cpu, cpu);
        prev_cpu = cpu;
        let cur = topo.daemon.stats()?;
        let rates = qswitch_api::request::Rates::between(&prev_stats, &cur);
        prev_stats = cur;
        ticks.push((busy, rates));
        print!(".");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    b.check()?;
    let busy_cpus = procstat::busy_cpus(cpu_from, procstat::cpu_jiffies());
    let totals = qswitch_api::request::Rates::between(&first_stats, &topo.daemon.stats()?);
    let members = if topo.bond {
        shares(&first_bond, &bond_members(&topo.daemon)?)
    } else {
        Vec::new()
    };

    let mut jsons = Vec::new();
    for (k, (out, c)) in outs.into_iter().zip(clients).enumerate() {
        drop(c);
        let out = out.join().unwrap_or_default();
        let json: serde_json::Value = serde_json::from_slice(&out)
            .with_context(|| format!("iperf3 toward VM {} printed no JSON result", k + 1))?;
        jsons.push(json);
    }
    let mut stream_gbps = Vec::new();
    let (mut gbps, mut retransmits) = (0.0, 0);
    for j in &jsons {
        let (g, r) = netns::iperf3_summary(j).with_context(|| format!("contender {contender}"))?;
        stream_gbps.push(g);
        gbps += g;
        retransmits += r;
    }
    if gbps <= 0.0 {
        bail!("iperf3 ({contender}) measured no traffic");
    }
    let intervals = |j: &serde_json::Value| j["intervals"].as_array().map_or(0, Vec::len);
    let count = jsons.iter().map(intervals).min().unwrap_or(0);
    let samples = (0..count)
        .map(|i| {
            let sum = |f: &str| -> Option<f64> {
                jsons
                    .iter()
                    .map(|j| j["intervals"][i]["sum"][f].as_f64())
                    .sum()
            };
            Sample::new(
                jsons[0]["intervals"][i]["sum"]["end"]
                    .as_f64()
                    .unwrap_or(i as f64 + 1.0),
                sum("bits_per_second").unwrap_or(0.0) / 1e9,
                sum("retransmits").map(|r| r as u64),
                ticks.get(i).map(|t| (t.0, Some(&t.1))),
            )
        })
        .collect();
    drop(servers);
    let run = Run {
        contender: contender.to_string(),
        round,
        seq,
        metrics: IperfMetrics::new(gbps, retransmits, busy_cpus, idle_busy_cpus, Some(&totals)),
        samples,
    };
    let spread = Spread {
        contender: contender.to_string(),
        round,
        seq,
        stream_gbps,
        members,
    };
    Ok((run, spread))
}

/// `  streams 2.1/1.9/2.0/2.2 Gbit/s  members rx 50%/50% tx 50%/50%`
fn spread_line(s: &Spread) -> String {
    let g: Vec<String> = s.stream_gbps.iter().map(|g| format!("{g:.2}")).collect();
    let mut line = format!("  streams {} Gbit/s", g.join("/"));
    if !s.members.is_empty() {
        let pct = |f: fn(&MemberShare) -> f64| {
            s.members
                .iter()
                .map(|m| format!("{:.0}%", f(m) * 100.0))
                .collect::<Vec<_>>()
                .join("/")
        };
        line.push_str(&format!(
            "  members rx {} tx {}",
            pct(|m| m.rx_share),
            pct(|m| m.tx_share)
        ));
    }
    line
}

/// Each bond contender's member shares over all its runs (frames summed, then divided).
fn member_totals(contender: &str, spreads: &[Spread]) -> Vec<MemberShare> {
    let mine: Vec<&Spread> = spreads
        .iter()
        .filter(|s| s.contender == contender)
        .collect();
    let Some(first) = mine.first() else {
        return Vec::new();
    };
    let sum = |i: usize, f: fn(&MemberShare) -> u64| -> u64 {
        mine.iter().filter_map(|s| s.members.get(i)).map(f).sum()
    };
    let n = first.members.len();
    let rx: u64 = (0..n).map(|i| sum(i, |m| m.rx_packets)).sum();
    let tx: u64 = (0..n).map(|i| sum(i, |m| m.tx_packets)).sum();
    let share = |a: u64, of: u64| if of == 0 { 0.0 } else { a as f64 / of as f64 };
    (0..n)
        .map(|i| {
            let (r, t) = (sum(i, |m| m.rx_packets), sum(i, |m| m.tx_packets));
            MemberShare {
                member: first.members[i].member.clone(),
                rx_packets: r,
                tx_packets: t,
                rx_dropped: sum(i, |m| m.rx_dropped),
                rx_share: share(r, rx),
                tx_share: share(t, tx),
            }
        })
        .collect()
}

pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("iperf3", "iperf3"),
        ("ethtool", "ethtool"),
        ("ping", "iputils-ping"),
    ] {
        netns::ensure_tool(tool, pkg)?;
    }
    let (runs, seconds) = (b.args.runs, b.args.seconds);
    let counts = stream_counts(b)?;
    let workers = crate::topology::worker_cpus(2)?;
    let names = names(&counts);
    let name_list: Vec<&str> = names.iter().map(String::as_str).collect();
    let order = super::schedule(b, "bond", &name_list)?;
    b.say(format_args!(
        "{runs} round(s) of {} contenders, {seconds} s each; qswitch workers on CPUs {workers}; \
         one VM namespace (own MAC) per stream, peer netns -> Linux bridge -> veth(s) -> \
         afxdp native -> qswitch -> TAPs",
        names.len()
    ));
    let mut results = Vec::new();
    let mut spreads = Vec::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = &names[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<15}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let (links, streams) = (LINKS[c % LINKS.len()].1, counts[c / LINKS.len()]);
        let topo = setup(b.id, &workers, links, streams as usize)?;
        wait_reachable(b, &topo)?;
        let (r, s) = run_once(b, &topo, (name, round + 1, seq + 1))?;
        drop(topo);
        println!("{}{}", run_line(&r), spread_line(&s));
        results.push(r);
        spreads.push(s);
    }
    let (summary, _) = summarise(&name_list, &results);
    let ratios: Vec<Ratio> = summary
        .chunks(LINKS.len())
        .filter_map(|pair| ratio_of(&pair[0], &pair[1]))
        .collect();
    let title = format!("bond ({seconds} s, {runs} runs each)");
    let ran = print_ran("bond", &title, &summary, &ratios);
    for s in ran.iter().filter(|s| s.contender.starts_with("bond-")) {
        let m = member_totals(&s.contender, &spreads);
        let list = |f: fn(&MemberShare) -> f64| {
            m.iter()
                .map(|m| format!("{:.3}", f(m)))
                .collect::<Vec<_>>()
                .join(",")
        };
        println!(
            "RESULT bond {} member_rx_share={} member_tx_share={}",
            s.contender,
            list(|m| m.rx_share),
            list(|m| m.tx_share)
        );
    }
    let idle: Vec<f64> = results.iter().map(|r| r.idle_busy_cpus).collect();
    print_idle("bond", &idle, &results);
    let svg = svg(&title, &counts, &summary, &results, &spreads);
    let report = BondReport {
        report: Report {
            scenario: "bond".into(),
            config: serde_json::json!({
                "runs": runs,
                "seconds": seconds,
                "stream_counts": counts,
                "contenders": names,
                "order": order.iter().map(|&(_, c)| names[c].clone()).collect::<Vec<_>>(),
                "qswitch_workers": workers,
                "bond": "balance-slb, two afxdp members in native mode on veths",
                "peer": "Linux bridge in a namespace, one port per member; iperf3 clients on its address",
                "direction": "peer -> VMs, one stream per VM namespace (own TAP port, own MAC)",
                "vm_macs": (1..=counts[1] as usize).map(vm_mac).collect::<Vec<_>>(),
                "wire_peer_offloads": "tx off tso off gso off on the peer's ends and bridge; gro off on the members",
                "qswitch_version": env!("CARGO_PKG_VERSION"),
                "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            }),
            runs: results,
            summary,
            ratio: None,
        },
        ratios,
        spreads,
    };
    super::write_results(&b.args.out, "bond", &report, &svg)
}

/// Gbit/s and CPU per Gbit/s per stream count; each bond run's member shares; per-second
/// Gbit/s of every run.
fn svg(
    title: &str,
    counts: &[u32; 2],
    summary: &[ContenderSummary],
    runs: &[IperfRun],
    spreads: &[Spread],
) -> String {
    let per = LINKS.len();
    let label = |s: &ContenderSummary| s.contender.rsplit_once('-').map_or("", |x| x.0).to_string();
    let groups = |f: fn(&ContenderSummary) -> f64| -> Vec<(String, Vec<(String, f64)>)> {
        (0..counts.len())
            .map(|k| {
                (
                    format!("{} stream(s)", counts[k]),
                    summary[k * per..(k + 1) * per]
                        .iter()
                        .map(|s| (label(s), f(s)))
                        .collect(),
                )
            })
            .collect()
    };
    let ranges = |f: fn(&ContenderSummary) -> (f64, f64)| -> Vec<Vec<(f64, f64)>> {
        (0..counts.len())
            .map(|k| summary[k * per..(k + 1) * per].iter().map(f).collect())
            .collect()
    };
    let gbps = plot::bar_chart_with_ranges(
        &format!("{title}: median Gbit/s, all streams (whiskers: min-max)"),
        "Gbit/s",
        &groups(|s| s.gbps_median),
        &ranges(|s| (s.gbps_min, s.gbps_max)),
    );
    let cpu = plot::bar_chart_with_ranges(
        "Cost: machine busy CPUs per Gbit/s (median, min-max; lower is better)",
        "busy CPUs per Gbit/s",
        &groups(|s| s.cpu_per_gbps_median),
        &ranges(|s| (s.cpu_per_gbps_min, s.cpu_per_gbps_max)),
    );
    let share_groups: Vec<(String, Vec<(String, f64)>)> = spreads
        .iter()
        .filter(|s| !s.members.is_empty())
        .map(|s| {
            (
                format!("{} run {}", s.contender, s.round),
                s.members
                    .iter()
                    .enumerate()
                    .map(|(i, m)| (format!("member {i} rx"), m.rx_share * 100.0))
                    .collect(),
            )
        })
        .collect();
    let lines = plot::line_chart(
        "iperf3 Gbit/s per second (all streams), every run",
        "seconds since the clients started",
        "Gbit/s",
        &super::gbps_per_run(runs),
        &[],
    );
    let mut charts = vec![gbps, cpu];
    if !share_groups.is_empty() {
        charts.push(plot::bar_chart(
            "Frames received per bond member, % of the bond's (balance-slb by VM MAC)",
            "% of frames",
            &share_groups,
        ));
    }
    charts.push(lines);
    plot::stack(&charts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(name: &str, rx: u64, tx: u64) -> BondMemberInfo {
        BondMemberInfo {
            name: name.into(),
            carrier: true,
            enabled: true,
            buckets: 128,
            rx_packets: rx,
            tx_packets: tx,
            rx_dropped: 0,
            lacp_rx: 0,
            lacp_tx: 0,
            rarp_tx: 0,
            lacp_state: None,
        }
    }

    #[test]
    fn shares_are_of_the_run_not_of_the_counters() {
        let before = [member("a", 100, 10), member("b", 0, 0)];
        let after = [member("a", 400, 40), member("b", 100, 0)];
        let s = shares(&before, &after);
        assert_eq!((s[0].rx_packets, s[1].rx_packets), (300, 100));
        assert!((s[0].rx_share - 0.75).abs() < 1e-9);
        assert!((s[1].tx_share - 0.0).abs() < 1e-9);
        assert!((s[0].tx_share - 1.0).abs() < 1e-9);
    }

    #[test]
    fn names_pair_each_stream_count() {
        assert_eq!(
            names(&[1, 4]),
            ["bond-2-1", "one-member-1", "bond-2-4", "one-member-4"]
        );
        assert_eq!(vm_mac(10), "02:51:62:00:00:0a");
    }
}
