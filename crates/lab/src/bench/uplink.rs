//! `uplink`: a NIC as qswitch's uplink (issue 12). No NIC here: a veth pair stands in for the
//! wire, its far end in a "wire peer" namespace.
//!
//! ```text
//!   qswitch-MODE:  peer ns qsuP<n> ──veth── qsuU<n> ═ afxdp port (MODE) ═ qswitch ═ TAP qsuT<n> ── vm ns
//!   linux-bridge:  peer ns qsuP<n> ──veth── qsuU<n> ═ bridge qsuB<n> ═ qsuV<n> ──veth── vm ns
//! ```
//!
//! The qswitch daemon and the uplink's end of the veth are in the root namespace, with no
//! address on the uplink and nothing routed through it. For both contenders the wire peer's
//! checksum and segmentation offloads are off (`ethtool -K qsuP<n> tx off tso off gso off`), so
//! the switch sees wire-size frames as from a NIC (a veth would otherwise hand the bridge 64
//! KB super-frames), and GRO is off on the uplink end (the afxdp port docs say why).
//! Contenders: qswitch with the uplink in each mode it takes on a veth (native, packet; skb
//! is refused there, see `qswitch_dp::port::afxdp`) and the Linux
//! bridge, each with 1 and 4 TCP streams (iperf3 peer → vm), interleaved. Reports Gbit/s,
//! machine busy CPUs per Gbit/s and the idle CPU before each run (`idle_busy_cpus`), and each
//! mode's ratios to the bridge. And 64 B frames/s ([`pps`]): a DPDK testpmd generator (AF_XDP
//! transmit) on the peer's end of the veth (the first CPU), counted where the frames reach the
//! vm namespace; qswitch gets one worker, on the second CPU. Its idle window gives the daemon's
//! CPU with the uplink attached and nothing to do.

use serde::Serialize;

use super::{
    iperf_run_with, ratio_of, run_line, summarise, Bench, ContenderSummary, Ratio, Report, Topology,
};
use crate::netns::{self, LabDaemon, Link, Netns};
use crate::plot;

mod pps;

/// Modes of the qswitch contenders; the bridge is the last contender of each stream count.
const MODES: [&str; 2] = ["native", "packet"];
const STREAMS: [u32; 2] = [1, 4];

/// Contender names: `qswitch-native-1`, ..., `linux-bridge-1`, then the same with `-4`, then
/// the 64 B ones (`qswitch-native-64B`, ..., `linux-bridge-64B`).
fn names() -> Vec<String> {
    let group = |s: String| {
        MODES
            .iter()
            .map(|m| format!("qswitch-{m}-{s}"))
            .chain([format!("linux-bridge-{s}")])
            .collect::<Vec<_>>()
    };
    STREAMS
        .iter()
        .flat_map(|s| group(s.to_string()))
        .chain(group(format!("{}B", pps::FRAME)))
        .collect()
}

#[derive(Debug, Serialize)]
struct UplinkReport {
    #[serde(flatten)]
    report: Report,
    /// Each mode against the bridge at the same stream count.
    ratios: Vec<Ratio>,
    /// The mode `port list` reported per qswitch contender (e.g. `native-copy`).
    modes_in_use: Vec<(String, String)>,
    /// The 64 B runs, their medians and each mode's Mpps over the bridge's.
    pps_runs: Vec<pps::PpsRun>,
    pps_summary: Vec<pps::PpsSummary>,
    pps_ratios: Vec<PpsRatio>,
}

/// One mode's 64 B Mpps over the bridge's (medians).
#[derive(Debug, Serialize)]
struct PpsRatio {
    of: String,
    mpps: f64,
}

/// Field order is drop order: the daemon (or bridge) first, then the veths, then the
/// namespaces.
struct UplinkTopo {
    daemon: Option<LabDaemon>,
    _bridge: Option<Link>,
    _vm_veth: Option<Link>,
    _wire: Link,
    peer: Netns,
    vm: Netns,
    /// The peer's end of the veth, and the vm namespace's interface.
    peer_if: String,
    vm_if: String,
    _dir: Option<crate::topology::RemoveDir>,
}

impl Topology for UplinkTopo {
    fn client(&self) -> &Netns {
        &self.peer
    }
    fn server(&self) -> &Netns {
        &self.vm
    }
    fn server_addr(&self) -> &str {
        "10.97.0.2"
    }
    fn daemon(&self) -> Option<&LabDaemon> {
        self.daemon.as_ref()
    }
}

/// The wire: namespace `peer` with `qsuP<n>` (10.97.0.1/24, offloads off) ↔ `qsuU<n>` in the root
/// namespace (up, GRO off, no address); and the empty vm namespace.
fn wire(id: u32, tag: &str) -> anyhow::Result<(Link, Netns, Netns)> {
    let n = id % 10_000;
    let peer = Netns::create(&format!("qsbench-up-{tag}-p-{id}"))?;
    let vm = Netns::create(&format!("qsbench-up-{tag}-v-{id}"))?;
    let (up, w) = (format!("qsuU{n}"), format!("qsuP{n}"));
    let link = super::wire::wire(&peer, &up, &w)?;
    peer.exec(&["ip", "addr", "add", "10.97.0.1/24", "dev", &w])?;
    peer.exec(&["ip", "link", "set", &w, "up"])?;
    Ok((link, peer, vm))
}

fn setup_qswitch(id: u32, workers: &str, mode: &str) -> anyhow::Result<(UplinkTopo, String)> {
    let n = id % 10_000;
    let (wire, peer, vm) = wire(id, mode)?;
    let (up, tap) = (format!("qsuU{n}"), format!("qsuT{n}"));
    let dir =
        crate::topology::RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-uplink-{id}")));
    let control = dir.0.join("control.sock");
    let text = format!(
        "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"up\"\ntype = \"afxdp\"\nifname = \"{up}\"\nmode = \"{mode}\"\n\
         [[port]]\nname = \"vm\"\ntype = \"tap\"\nifname = \"{tap}\"\n",
        control.display()
    );
    let daemon = LabDaemon::start(&dir.0, &text)?;
    let topo = UplinkTopo {
        daemon: Some(daemon),
        _bridge: None,
        _vm_veth: None,
        _wire: wire,
        peer,
        vm,
        peer_if: format!("qsuP{n}"),
        vm_if: tap.clone(),
        _dir: Some(dir),
    };
    topo.vm.adopt(&tap, "10.97.0.2/24")?;
    let in_use = match qswitch_api::client::call(
        &topo.daemon.as_ref().expect("daemon").control,
        &qswitch_api::Request::PortList,
    )? {
        qswitch_api::Response::Ports { ports } => ports
            .into_iter()
            .find_map(|p| p.xdp_mode)
            .unwrap_or_default(),
        _ => String::new(),
    };
    Ok((topo, in_use))
}

fn setup_bridge(id: u32) -> anyhow::Result<UplinkTopo> {
    let n = id % 10_000;
    let (wire, peer, vm) = wire(id, "br")?;
    let bridge = Link::bridge(&format!("qsuB{n}"))?;
    wire.attach(&bridge)?;
    let vm_veth = Link::veth(&format!("qsuV{n}"), &format!("qsuW{n}"))?;
    vm_veth.attach(&bridge)?;
    vm.adopt(&format!("qsuW{n}"), "10.97.0.2/24")?;
    Ok(UplinkTopo {
        daemon: None,
        _bridge: Some(bridge),
        _vm_veth: Some(vm_veth),
        _wire: wire,
        peer,
        vm,
        peer_if: format!("qsuP{n}"),
        vm_if: format!("qsuW{n}"),
        _dir: None,
    })
}

pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("iperf3", "iperf3"),
        ("ethtool", "ethtool"),
        ("ping", "iputils-ping"),
        ("python3", "python3"),
        (pps::TESTPMD, "dpdk-dev"),
    ] {
        netns::ensure_tool(tool, pkg)?;
    }
    let (runs, seconds) = (b.args.runs, b.args.seconds);
    let workers = crate::topology::worker_cpus(2)?;
    // 64 B: the generator's lcores on the first CPU, qswitch's one worker on the second.
    let cpus = qswitch_sys::thread::online_cpus()?;
    let (gen_cpu, pps_worker) = match cpus.as_slice() {
        [a, b, ..] => (*a, b.to_string()),
        _ => anyhow::bail!("bench uplink needs two online CPUs; online: {cpus:?}"),
    };
    let names = names();
    let per = MODES.len() + 1;
    let tcp_contenders = per * STREAMS.len();
    let name_list: Vec<&str> = names.iter().map(String::as_str).collect();
    let order = super::schedule(b, "uplink", &name_list)?;
    b.say(format_args!(
        "{runs} round(s) of {} contenders, {seconds} s each; qswitch workers on CPUs {workers} \
         (64 B: generator on CPU {gen_cpu}, qswitch worker on CPU {pps_worker}; generator: {})",
        names.len(),
        pps::GENERATOR
    ));
    let mut results = Vec::new();
    let mut pps_results = Vec::new();
    let mut modes_in_use = Vec::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = &names[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<21}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let (mode, group) = (c % per, c / per);
        let topo = if mode < MODES.len() {
            let w = if c < tcp_contenders {
                &workers
            } else {
                &pps_worker
            };
            let (t, in_use) = setup_qswitch(b.id, w, MODES[mode])?;
            if round == 0 {
                modes_in_use.push((name.clone(), in_use));
            }
            t
        } else {
            setup_bridge(b.id)?
        };
        if c < tcp_contenders {
            let p = STREAMS[group].to_string();
            let r = iperf_run_with(b, &topo, (name, round + 1, seq + 1), &["-P", &p])?;
            drop(topo);
            println!("{}", run_line(&r));
            results.push(r);
        } else {
            let dir = crate::topology::RemoveDir(
                std::env::temp_dir().join(format!("qswitch-bench-uplink-pps-{}", b.id)),
            );
            std::fs::create_dir_all(&dir.0)?;
            let ends = pps::Ends {
                peer: &topo.peer,
                peer_if: &topo.peer_if,
                vm: &topo.vm,
                vm_if: &topo.vm_if,
                daemon_pid: topo.daemon.as_ref().and_then(LabDaemon::pid),
                gen_cpu,
                dir: &dir.0,
            };
            let r = pps::run(b, &ends, (name, round + 1, seq + 1))?;
            drop(topo);
            println!("{}", pps_line(&r));
            pps_results.push(r);
        }
    }
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (summary, _) = summarise(&name_refs[..tcp_contenders], &results);
    let mut ratios = Vec::new();
    for (i, s) in summary.iter().enumerate() {
        let bridge = &summary[(i / per) * per + MODES.len()];
        if i % per != MODES.len() && s.runs > 0 && bridge.runs > 0 {
            if let Some(r) = ratio_of(s, bridge) {
                ratios.push(r);
            }
        }
    }
    let pps_summary = pps::summarise(&name_refs[tcp_contenders..], &pps_results);
    let bridge = &pps_summary[MODES.len()];
    let pps_ratios: Vec<PpsRatio> = pps_summary[..MODES.len()]
        .iter()
        .filter(|s| s.runs > 0 && bridge.runs > 0 && bridge.mpps_median > 0.0)
        .map(|s| PpsRatio {
            of: format!("{} / {}", s.contender, bridge.contender),
            mpps: s.mpps_median / bridge.mpps_median,
        })
        .collect();
    let title = format!("uplink ({seconds} s, {runs} runs each)");
    super::wire::print_ran("uplink", &title, &summary, &[]);
    for r in &ratios {
        println!(
            "RESULT uplink {} gbps_ratio={:.3} cpu_per_gbps_ratio={:.3}",
            r.of.replace(' ', ""),
            r.gbps,
            r.cpu_per_gbps
        );
    }
    if !pps_results.is_empty() {
        print_pps_table(&pps_summary, &pps_ratios);
        println!("RESULT uplink pps_generator=\"{}\"", pps::GENERATOR);
    }
    for (c, m) in &modes_in_use {
        println!("RESULT uplink {c} mode_in_use={m}");
    }
    let idle: Vec<f64> = results
        .iter()
        .map(|r| r.idle_busy_cpus)
        .chain(pps_results.iter().map(|r| r.idle_busy_cpus))
        .collect();
    super::wire::print_idle("uplink", &idle, &results);
    super::warn_busy_before(
        "64 B run(s)",
        pps_results.iter().map(|r| (r.seq, r.idle_busy_cpus)),
    );
    let svg = svg(&title, &summary, &results, &pps_summary);
    let report = UplinkReport {
        report: Report {
            scenario: "uplink".into(),
            config: serde_json::json!({
                "runs": runs,
                "seconds": seconds,
                "contenders": names,
                "order": order.iter().map(|&(_, c)| names[c].clone()).collect::<Vec<_>>(),
                "qswitch_workers": workers,
                "pps_qswitch_workers": pps_worker,
                "pps_generator": format!("{}, lcores on CPU {gen_cpu}", pps::GENERATOR),
                "wire_peer_offloads": "tx off tso off gso off; uplink gro off",
                "qswitch_version": env!("CARGO_PKG_VERSION"),
                "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            }),
            runs: results,
            summary,
            ratio: None,
        },
        ratios,
        modes_in_use,
        pps_runs: pps_results,
        pps_summary,
        pps_ratios,
    };
    super::write_results(&b.args.out, "uplink", &report, &svg)
}

/// One line about a finished 64 B run.
fn pps_line(r: &pps::PpsRun) -> String {
    let idle = r
        .daemon_idle_cpu_pct
        .map(|p| format!("  daemon idle {p:.2}% CPU"))
        .unwrap_or_default();
    format!(
        " {:>6.3} Mpps (offered {:.3})  busy {:.2} CPUs (idle {:.2}){idle}",
        r.mpps, r.offered_mpps, r.busy_cpus, r.idle_busy_cpus
    )
}

/// The 64 B table and its `RESULT` lines.
fn print_pps_table(summary: &[pps::PpsSummary], ratios: &[PpsRatio]) {
    println!();
    println!(
        "{:<43}{:<28}{:<16}daemon idle CPU %",
        format!("{} B frames", pps::FRAME),
        "Mpps (median [min-max])",
        "offered Mpps"
    );
    for s in summary.iter().filter(|s| s.runs > 0) {
        let m = format!("{:.3} [{:.3}-{:.3}]", s.mpps_median, s.mpps_min, s.mpps_max);
        let idle = s
            .daemon_idle_cpu_pct_median
            .map(|p| format!("{p:.2}"))
            .unwrap_or_else(|| "-".into());
        println!(
            "  {:<41}{m:<28}{:<16.3}{idle}",
            s.contender, s.offered_mpps_median
        );
    }
    for r in ratios {
        println!("  {:<41} {:.2}", format!("ratio {}", r.of), r.mpps);
    }
    println!();
    for s in summary.iter().filter(|s| s.runs > 0) {
        let idle = s
            .daemon_idle_cpu_pct_median
            .map(|p| format!(" daemon_idle_cpu_pct={p:.3}"))
            .unwrap_or_default();
        println!(
            "RESULT uplink {} mpps={:.3} offered_mpps={:.3} busy_cpus={:.2}{idle}",
            s.contender, s.mpps_median, s.offered_mpps_median, s.busy_cpus_median
        );
    }
    for r in ratios {
        println!(
            "RESULT uplink {} mpps_ratio={:.3}",
            r.of.replace(' ', ""),
            r.mpps
        );
    }
}

/// Gbit/s and CPU per Gbit/s per stream count; then per-second Gbit/s of every run.
fn svg(
    title: &str,
    summary: &[ContenderSummary],
    runs: &[super::IperfRun],
    pps_summary: &[pps::PpsSummary],
) -> String {
    let per = MODES.len() + 1;
    let group = |k: usize, f: fn(&ContenderSummary) -> f64| {
        (
            format!("{} stream(s)", STREAMS[k]),
            summary[k * per..(k + 1) * per]
                .iter()
                .map(|s| {
                    (
                        s.contender.rsplit_once('-').map_or("", |x| x.0).to_string(),
                        f(s),
                    )
                })
                .collect::<Vec<_>>(),
        )
    };
    let ranges = |f: fn(&ContenderSummary) -> (f64, f64)| -> Vec<Vec<(f64, f64)>> {
        (0..STREAMS.len())
            .map(|k| summary[k * per..(k + 1) * per].iter().map(f).collect())
            .collect()
    };
    let gbps = plot::bar_chart_with_ranges(
        &format!("{title}: median Gbit/s (whiskers: min-max)"),
        "Gbit/s",
        &[group(0, |s| s.gbps_median), group(1, |s| s.gbps_median)],
        &ranges(|s| (s.gbps_min, s.gbps_max)),
    );
    let cpu = plot::bar_chart_with_ranges(
        "Cost: machine busy CPUs per Gbit/s (median, min-max; lower is better)",
        "busy CPUs per Gbit/s",
        &[
            group(0, |s| s.cpu_per_gbps_median),
            group(1, |s| s.cpu_per_gbps_median),
        ],
        &ranges(|s| (s.cpu_per_gbps_min, s.cpu_per_gbps_max)),
    );
    let series = super::gbps_per_run(runs);
    let lines = plot::line_chart(
        "iperf3 Gbit/s per second, every run",
        "seconds since the client started",
        "Gbit/s",
        &series,
        &[],
    );
    let label = |s: &pps::PpsSummary| s.contender.rsplit_once('-').map_or("", |x| x.0).to_string();
    let mpps = plot::bar_chart_with_ranges(
        &format!(
            "{} B frames from a testpmd generator in the peer namespace: median Mpps into the vm \
             namespace (whiskers: min-max)",
            pps::FRAME
        ),
        "Mpps",
        &[(
            format!("{} B", pps::FRAME),
            pps_summary
                .iter()
                .map(|s| (label(s), s.mpps_median))
                .collect(),
        )],
        &[pps_summary
            .iter()
            .map(|s| (s.mpps_min, s.mpps_max))
            .collect()],
    );
    plot::stack(&[gbps, cpu, mpps, lines])
}
