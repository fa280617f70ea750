//! `bypass`: what the switch's per-packet work costs. (Seed 002: through the vSwitch, 9.4
//! Gbit/s took 100% of a vCPU against 55% with passthrough; with MSS 100, 1.4 Gbit/s at 70%
//! CPU: the per-packet cost, not the link, limits you.)
//!
//! iperf3 TCP between two namespaces, through qswitch (two TAP ports) and through the Linux
//! bridge (veth), first with the default MSS, then with `-M 100` (small segments). Reports
//! Gbit/s, machine busy CPUs per Gbit/s and, for qswitch, frames per second through the
//! switch. No passthrough here (no NICs to pass through); the kernel bridge is the cheapest
//! in-kernel path and stands in as the reference. OVS-DPDK is compared in `pvp`.

use serde::Serialize;

use super::{
    iperf_run_with, median, print_table, ratio_of, run_line, setup_bridge, setup_qswitch,
    summarise, warn_if_busy, Bench, ContenderSummary, IperfRun, Ratio, Report, Topology,
};
use crate::netns;
use crate::plot;

const NAMES: [&str; 4] = [
    "qswitch",
    "linux-bridge",
    "qswitch-mss100",
    "linux-bridge-mss100",
];

/// What `OUT/bypass.json` holds: the usual report plus the small-segment ratio and frame
/// rates.
#[derive(Debug, Serialize)]
struct BypassReport {
    #[serde(flatten)]
    report: Report,
    ratio_mss100: Option<Ratio>,
    /// Median frames per second through qswitch (port b tx), default MSS and MSS 100. With
    /// TSO a frame can carry many segments.
    qswitch_frames_per_s: [f64; 2],
}

pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [("ip", "iproute2"), ("ss", "iproute2"), ("iperf3", "iperf3")] {
        netns::ensure_tool(tool, pkg)?;
    }
    let (runs, seconds, streams) = (b.args.runs, b.args.seconds, b.args.streams);
    let workers = crate::topology::worker_cpus(2)?;
    let order = super::schedule(b, "bypass", &NAMES)?;
    b.say(format_args!(
        "{runs} round(s) of {} contenders, {seconds} s each, {streams} stream(s); qswitch \
         workers on CPUs {workers}",
        NAMES.len()
    ));
    let mut results = Vec::new();
    let mut fps: [Vec<f64>; 2] = [vec![], vec![]];
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = NAMES[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<21}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let topo: Box<dyn Topology> = match c % 2 {
            0 => Box::new(setup_qswitch(b.id, &workers)?),
            _ => Box::new(setup_bridge(b.id)?),
        };
        let extra: &[&str] = if c >= 2 { &["-M", "100"] } else { &[] };
        let tx = |t: &dyn Topology| -> anyhow::Result<Option<u64>> {
            Ok(match t.daemon() {
                Some(d) => Some(d.stats()?.ports.iter().map(|p| p.tx_packets).sum()),
                None => None,
            })
        };
        let before = tx(topo.as_ref())?;
        let r = iperf_run_with(b, topo.as_ref(), (name, round + 1, seq + 1), extra)?;
        if let (Some(a), Some(z)) = (before, tx(topo.as_ref())?) {
            fps[c / 2].push(z.saturating_sub(a) as f64 / f64::from(seconds));
        }
        drop(topo);
        println!("{}", run_line(&r));
        results.push(r);
    }
    let (summary, ratio) = summarise(&NAMES, &results);
    let ratio_mss100 = ratio_of(&summary[2], &summary[3]);
    let title = format!("bypass ({streams} stream(s), {seconds} s, {runs} runs each)");
    let both: Vec<Ratio> = ratio.iter().chain(&ratio_mss100).cloned().collect();
    print_table("bypass", &title, &summary, &both);
    let fps = [median(&fps[0]), median(&fps[1])];
    println!(
        "RESULT bypass qswitch frames_per_s={:.0} frames_per_s_mss100={:.0}",
        fps[0], fps[1]
    );
    warn_if_busy(&results);
    let svg = svg(&title, &summary, &results);
    let report = BypassReport {
        report: Report {
            scenario: "bypass".into(),
            config: serde_json::json!({
                "runs": runs,
                "seconds": seconds,
                "streams": streams,
                "contenders": NAMES,
                "order": order.iter().map(|&(_, c)| NAMES[c]).collect::<Vec<_>>(),
                "qswitch_workers": workers,
                "qswitch_version": env!("CARGO_PKG_VERSION"),
                "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            }),
            runs: results,
            summary,
            ratio,
        },
        ratio_mss100,
        qswitch_frames_per_s: fps,
    };
    super::write_results(&b.args.out, "bypass", &report, &svg)
}

/// Gbit/s and CPU per Gbit/s, grouped by MSS; then per-second Gbit/s of every run.
fn svg(title: &str, summary: &[ContenderSummary], runs: &[IperfRun]) -> String {
    let group = |label: &str, range: std::ops::Range<usize>, f: fn(&ContenderSummary) -> f64| {
        (
            label.to_string(),
            summary[range]
                .iter()
                .map(|s| (s.contender.replace("-mss100", ""), f(s)))
                .collect::<Vec<_>>(),
        )
    };
    let ranges = |f: fn(&ContenderSummary) -> (f64, f64)| -> Vec<Vec<(f64, f64)>> {
        vec![
            summary[0..2].iter().map(f).collect(),
            summary[2..4].iter().map(f).collect(),
        ]
    };
    let gbps = plot::bar_chart_with_ranges(
        &format!("{title}: median Gbit/s (whiskers: min-max)"),
        "Gbit/s",
        &[
            group("default MSS", 0..2, |s| s.gbps_median),
            group("MSS 100", 2..4, |s| s.gbps_median),
        ],
        &ranges(|s| (s.gbps_min, s.gbps_max)),
    );
    let cpu = plot::bar_chart_with_ranges(
        "Cost: machine busy CPUs per Gbit/s (median, min-max; lower is better)",
        "busy CPUs per Gbit/s",
        &[
            group("default MSS", 0..2, |s| s.cpu_per_gbps_median),
            group("MSS 100", 2..4, |s| s.cpu_per_gbps_median),
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
    plot::stack(&[gbps, cpu, lines])
}
