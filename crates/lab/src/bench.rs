//! `qswitch bench SCENARIO`: qswitch measured next to a peer on the same machine, in the same
//! run, written as `OUT/SCENARIO.json` (config, every run with per-second samples, summary) and
//! `OUT/SCENARIO.svg`, with a table and `RESULT` lines on stdout.
//!
//! # Scenarios
//! - `tap-tcp`: iperf3 TCP from one network namespace to another, (a) through qswitch (two TAP
//!   ports, the demo config) and (b) through the Linux bridge (two veth pairs).
//! - `pvp`: vhost-user to vhost-user with one switch core, 64 B and 1518 B frames, qswitch
//!   next to OVS-DPDK, driven by one in-process virtio-net generator/sink (see [`pvp`]).
//! - `rss`, `placement`: gen ports only, one worker vs two, overlapping vs disjoint CPU sets
//!   (see [`gen`]).
//!
//! # Method
//! Contenders are interleaved (A B, B A, A B ...) so that neither always runs first or on a
//! machine warmed up by the other, and each run gets a freshly set-up topology that is torn
//! down afterwards (an idle qswitch must not eat CPU during a bridge run). Results are medians
//! over runs with min–max ranges. Each run also records the machine's busy CPUs for 1 s before
//! the traffic (`idle_busy_cpus`): high values there mean something else was running.
//!
//! # Adding a scenario
//! Write `fn(&Bench) -> anyhow::Result<()>` and add it to [`SCENARIOS`]. Shared pieces:
//! [`Bench`] (arguments, Ctrl-C, progress), [`Topology`] and [`iperf_run`] (one iperf3 run
//! between two namespaces with per-second samples), [`interleave`], [`summarise`],
//! [`print_table`], [`warn_if_busy`], [`write_results`], [`median`].

use std::fmt::Display;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use qswitch_api::request::Rates;
use qswitch_api::{Request, Response};
use serde::Serialize;

use crate::netns::{self, LabDaemon, Link, Netns};
use crate::plot::{self, Series};
use crate::procstat;
use crate::run::Run;

mod affinity;
mod bond;
mod bypass;
mod cni;
mod fw;
mod gen;
mod multiqueue;
mod overlay;
mod pvp;
mod qos;
mod qsload;
mod scale;
mod soak;
mod txn;
mod uplink;
mod wire;

/// Arguments of `qswitch bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Scenario to run (tap-tcp, pvp, qos, rss, placement, bypass, affinity, multiqueue,
    /// uplink, soak, overlay, scale, cni, bond, fw-scale).
    pub scenario: String,
    /// Runs per contender.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Seconds of traffic per run (qos: per step).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub seconds: u32,
    /// Parallel TCP streams.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=128))]
    pub streams: u32,
    /// tap-tcp: queues per TAP port of the qswitch contender (`queues` in its config; the
    /// kernel spreads the streams over them by flow hash, the workers share them).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub queues: u16,
    /// Directory for the JSON and SVG results.
    #[arg(long, default_value = "bench/out", value_name = "DIR")]
    pub out: PathBuf,
    /// Run only the contenders whose name contains one of these comma-separated parts
    /// (`qswitch`, `native-1,bridge-1`), for quick iterations; ratios only between contenders
    /// that ran. pvp: contenders' exact names (`qswitch,qswitch-fw`). Not for qos, rss, placement, soak, scale.
    #[arg(long, value_name = "NAME")]
    pub only: Option<String>,
    /// pvp: the load. `dpdk`: a DPDK virtio-user program (bench/dpdk-load/qsload.c, built
    /// with the machine's dpdk-dev), a third party to both switches; `own`: qswitch's own
    /// virtio frontend.
    #[arg(long, value_enum, default_value_t = Load::Dpdk)]
    pub load: Load,
    /// scale: the port counts to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "10,100,1000",
        value_name = "N,..."
    )]
    pub ports: Vec<usize>,
    /// pvp (DPDK load): the UDP flows the load cycles through, frame after frame (qsload
    /// `--flows`; without it, qsload's 4). fw-scale: the connections (default 10000).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65535), value_name = "N")]
    pub flows: Option<u32>,
    /// pvp: also the firewall's contenders, interleaved with the others: qswitch-fw (both
    /// ports in a stateful security group of 50 rules, only the last matching the load) and
    /// ovs-dpdk-ct (OVS-DPDK with a `ct(commit)` flow table). fw-scale: nothing (it always
    /// measures both).
    #[arg(long)]
    pub firewall: bool,
    /// pvp (DPDK load, with --firewall): every frame a new flow (qsload `--new-flows`): new
    /// connections per second; 64 B with one pool only, connection tables sized for it.
    #[arg(long, conflicts_with = "flows")]
    pub new_flows: bool,
    /// pvp (with --firewall): the connection tables' size (qswitch's `max_sessions`, OVS's
    /// `ct-set-maxconns`); default 1 Mi, 16 Mi with --new-flows.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    pub max_sessions: Option<u32>,
    /// pvp (with --firewall): qswitch's `udp_unreplied` in seconds (how long a UDP
    /// connection no reply has come for lives); default its own 30 s, as OVS's. Shorter
    /// makes qswitch expire connections during a run of --new-flows (OVS keeps its 30 s).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..), value_name = "S")]
    pub udp_unreplied: Option<u32>,
}

/// The load of `bench pvp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Load {
    /// A DPDK virtio-user program generating and sinking in one loop (qsload).
    Dpdk,
    /// qswitch's own virtio frontend (`qswitch-virtio-driver`).
    Own,
}

/// A named benchmark.
struct Scenario {
    name: &'static str,
    about: &'static str,
    run: fn(&Bench) -> anyhow::Result<()>,
    /// Whether it has contenders for `--only` to choose from.
    only: bool,
}

/// Every scenario `qswitch bench` knows.
const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "tap-tcp",
        about: "iperf3 TCP netns -> netns: qswitch (TAP ports) vs Linux bridge (veth)",
        run: tap_tcp,
        only: true,
    },
    Scenario {
        name: "qos",
        about: "seed-001 port QoS: 7 steps of guarantees and limits, 6 TCP senders, 1G uplink",
        run: qos::run,
        only: false,
    },
    Scenario {
        name: "pvp",
        about: "vhost-user -> vhost-user, one switch core: qswitch vs OVS-DPDK (NORMAL)",
        run: pvp::run,
        only: true,
    },
    Scenario {
        name: "rss",
        about: "gen -> switch -> sink, 2 rx queues: 1 worker vs 2 workers (Mpps, ratio)",
        run: gen::rss,
        only: false,
    },
    Scenario {
        name: "placement",
        about: "two uplink-like gen ports: overlapping vs disjoint CPU sets (Mpps, busy %)",
        run: gen::placement,
        only: false,
    },
    Scenario {
        name: "bypass",
        about: "per-packet cost: iperf3 bulk and MSS 100 through qswitch vs Linux bridge, CPU per Gbit/s",
        run: bypass::run,
        only: true,
    },
    Scenario {
        name: "affinity",
        about: "TCP request/response with the worker on the endpoints' CPU vs another CPU; context switches",
        run: affinity::run,
        only: true,
    },
    Scenario {
        name: "soak",
        about: "leak hunt: gen + vhost-user load with ports added/removed every 2 s; RSS, fds, counters (issue 15)",
        run: soak::run,
        only: false,
    },
    Scenario {
        name: "overlay",
        about: "iperf3 TCP VM netns -> VM netns across two namespace-hosts: qswitch VXLAN (TAP and veth ports) vs Linux bridge + vxlan",
        run: overlay::run,
        only: true,
    },
    Scenario {
        name: "scale",
        about: "N idle vhost-user ports, no frontend: daemon CPU %, threads, port add time",
        run: scale::run,
        only: false,
    },
    Scenario {
        name: "multiqueue",
        about: "many 1 MB transfers through TAP ports with 1 vs 4 queues",
        run: multiqueue::run,
        only: true,
    },
    Scenario {
        name: "uplink",
        about: "peer netns -> veth -> afxdp uplink (native, packet) -> TAP netns vs Linux bridge; TCP 1 and 4 streams, 64 B Mpps",
        run: uplink::run,
        only: true,
    },
    Scenario {
        name: "fw-scale",
        about: "two gen ports answering each other's flows through the firewall (50-rule group, stateful): 1 vs 2 workers, firewall on and off",
        run: fw::scale,
        only: false,
    },
    Scenario {
        name: "cni",
        about: "pod -> pod iperf3 TCP, pods attached with cnitool: qswitch-cni (veth) vs the reference bridge plugin; 1 and 4 streams",
        run: cni::run,
        only: true,
    },
    Scenario {
        name: "bond",
        about: "peer netns bridge -> two veths -> balance-slb bond of two afxdp members -> TAP netns per stream vs one afxdp member; TCP 1 and 4 streams, per-member spread",
        run: bond::run,
        only: true,
    },
];

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let Some(scenario) = SCENARIOS.iter().find(|s| s.name == args.scenario) else {
        let known: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        bail!(
            "unknown scenario '{}'; known: {}",
            args.scenario,
            known.join(", ")
        );
    };
    if let (Some(o), false) = (&args.only, scenario.only) {
        bail!(
            "--only {o}: bench {} has no contenders to choose from (it compares settings of \
             qswitch alone)",
            scenario.name
        );
    }
    if args.queues != 1 && scenario.name != "tap-tcp" {
        bail!(
            "--queues {}: only bench tap-tcp sets TAP queues (multiqueue compares 1 and 4 itself)",
            args.queues
        );
    }
    if scenario.name != "pvp" {
        let pvp_only = [
            (
                "--flows",
                args.flows.is_some() && scenario.name != "fw-scale",
            ),
            ("--new-flows", args.new_flows),
            ("--max-sessions", args.max_sessions.is_some()),
            ("--udp-unreplied", args.udp_unreplied.is_some()),
            ("--firewall", args.firewall && scenario.name != "fw-scale"),
        ];
        if let Some((opt, _)) = pvp_only.iter().find(|(_, set)| *set) {
            bail!("{opt}: only bench pvp takes it");
        }
    } else if let Some(o) = args.only.as_deref() {
        pvp::check_only(o)?;
    }
    if scenario.name == "pvp" && (args.flows.is_some() || args.new_flows) && args.load != Load::Dpdk
    {
        bail!("--flows and --new-flows need the DPDK load (--load dpdk)");
    } else if args.max_sessions.is_some() && !args.firewall {
        bail!("--max-sessions: only with --firewall (it sizes the firewall contenders' tables)");
    } else if args.udp_unreplied.is_some() && !args.firewall {
        bail!("--udp-unreplied: only with --firewall (it sets qswitch-fw's UDP timeout)");
    }
    netns::require_root(&format!("qswitch bench {}", scenario.name))?;
    let bench = Bench::new(args)?;
    bench.say(format_args!("{}: {}", scenario.name, scenario.about));
    let result = (scenario.run)(&bench);
    if result.is_err() {
        println!(); // end a progress line
                    // Ctrl-C reaches the children too; their failure is not the news.
        bench.check()?;
    }
    result
}

/// What every scenario gets: its arguments, the Ctrl-C flag, and progress output.
pub struct Bench {
    pub args: BenchArgs,
    /// Process id: makes names of namespaces, interfaces and files unique.
    pub id: u32,
    interrupted: Arc<AtomicBool>,
    started: Instant,
}

impl Bench {
    fn new(args: BenchArgs) -> anyhow::Result<Bench> {
        let interrupted = Arc::new(AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            signal_hook::flag::register(sig, interrupted.clone())?;
        }
        Ok(Bench {
            args,
            id: std::process::id(),
            interrupted,
            started: Instant::now(),
        })
    }

    /// Fails once Ctrl-C (or SIGTERM) arrived; the guards then clean up on the way out.
    pub fn check(&self) -> anyhow::Result<()> {
        if self.interrupted.load(Ordering::Relaxed) {
            bail!("interrupted; cleaned up");
        }
        Ok(())
    }

    /// Sleeps, but returns early with an error on Ctrl-C.
    pub fn sleep(&self, d: Duration) -> anyhow::Result<()> {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.check()?;
            std::thread::sleep(
                until
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(50)),
            );
        }
        self.check()
    }

    /// Prints a progress line, prefixed with the time since the start.
    pub fn say(&self, msg: impl Display) {
        println!("[{:>4.0}s] {msg}", self.started.elapsed().as_secs_f64());
    }

    /// Like [`Bench::say`] without the newline (a run's result follows on the same line).
    pub fn say_start(&self, msg: impl Display) {
        print!("[{:>4.0}s] {msg}", self.started.elapsed().as_secs_f64());
        let _ = std::io::stdout().flush();
    }
}

/// One second of a run. Qswitch fields are `None` for other contenders.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// End of the second, in seconds since the iperf3 client started.
    pub t_s: f64,
    /// iperf3 interval throughput (all streams).
    pub gbps: f64,
    pub retransmits: Option<u64>,
    /// Machine busy CPUs in this second.
    pub busy_cpus: Option<f64>,
    /// Busy % per qswitch worker (share of wall time in polls that moved frames).
    pub worker_busy_pct: Option<Vec<f64>>,
    /// CPU % per qswitch worker thread.
    pub worker_cpu_pct: Option<Vec<f64>>,
    /// Context switches per second, all qswitch workers.
    pub ctx_switches_ps: Option<f64>,
}

/// What one run measured (the scenario part of a [`Run`]).
#[derive(Debug, Clone, Serialize)]
pub struct IperfMetrics {
    /// iperf3 `end.sum_received.bits_per_second` / 1e9.
    pub gbps: f64,
    pub retransmits: u64,
    /// Machine busy CPUs over the traffic (from /proc/stat).
    pub busy_cpus: f64,
    /// Machine busy CPUs in the second before the traffic, topology up.
    pub idle_busy_cpus: f64,
    pub cpu_per_gbps: f64,
    /// Over the whole run, qswitch only: busy % per worker, context switches/s.
    pub worker_busy_pct: Option<Vec<f64>>,
    pub ctx_switches_ps: Option<f64>,
}

impl Sample {
    /// One second of an iperf3 run: its interval's end, Gbit/s and retransmits (all streams),
    /// and `tick` when the second was sampled: the machine's busy CPUs and, with a daemon in
    /// the path, its rates over the second.
    fn new(
        t_s: f64,
        gbps: f64,
        retransmits: Option<u64>,
        tick: Option<(f64, Option<&Rates>)>,
    ) -> Sample {
        let rates = tick.and_then(|t| t.1);
        Sample {
            t_s,
            gbps,
            retransmits,
            busy_cpus: tick.map(|t| t.0),
            worker_busy_pct: rates.map(|r| r.workers.iter().map(|w| w.busy_pct).collect()),
            worker_cpu_pct: rates.map(|r| r.workers.iter().map(|w| w.cpu_pct).collect()),
            ctx_switches_ps: rates.map(|r| r.workers.iter().map(|w| w.ctx_switches_ps).sum()),
        }
    }
}

impl IperfMetrics {
    /// A run's figures; `totals`: the daemon's rates over the whole run, with a daemon in the
    /// path.
    fn new(
        gbps: f64,
        retransmits: u64,
        busy_cpus: f64,
        idle_busy_cpus: f64,
        totals: Option<&Rates>,
    ) -> IperfMetrics {
        IperfMetrics {
            gbps,
            retransmits,
            busy_cpus,
            idle_busy_cpus,
            cpu_per_gbps: busy_cpus / gbps,
            worker_busy_pct: totals.map(|t| t.workers.iter().map(|w| w.busy_pct).collect()),
            ctx_switches_ps: totals.map(|t| t.workers.iter().map(|w| w.ctx_switches_ps).sum()),
        }
    }
}

/// One run of one contender: [`IperfMetrics`] and a [`Sample`] per second.
pub type IperfRun = Run<IperfMetrics, Sample>;

/// Medians (and ranges) of one contender's runs.
#[derive(Debug, Clone, Serialize)]
pub struct ContenderSummary {
    pub contender: String,
    pub runs: usize,
    pub gbps_median: f64,
    pub gbps_min: f64,
    pub gbps_max: f64,
    pub cpu_per_gbps_median: f64,
    pub cpu_per_gbps_min: f64,
    pub cpu_per_gbps_max: f64,
    pub retransmits_median: f64,
}

/// First contender's medians over the second's.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub of: String,
    pub gbps: f64,
    pub cpu_per_gbps: f64,
}

/// What `OUT/SCENARIO.json` holds.
#[derive(Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub config: serde_json::Value,
    pub runs: Vec<IperfRun>,
    pub summary: Vec<ContenderSummary>,
    pub ratio: Option<Ratio>,
}

/// Median of `v` (mean of the middle two for an even count); 0 for an empty slice.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The order of runs as (0-based round, contender index): forwards in even rounds, backwards
/// in odd ones (A B, B A, A B ...).
pub fn interleave(contenders: usize, rounds: u32) -> Vec<(u32, usize)> {
    (0..rounds)
        .flat_map(|r| {
            let order: Vec<usize> = if r % 2 == 0 {
                (0..contenders).collect()
            } else {
                (0..contenders).rev().collect()
            };
            order.into_iter().map(move |c| (r, c))
        })
        .collect()
}

/// The run order ([`interleave`]) of the contenders `--only` selects: those whose name
/// contains one of its comma-separated parts (`--only native-1,bridge-1`); all of them
/// without it. An error names the scenario's contenders when it selects none.
pub fn schedule(b: &Bench, scenario: &str, names: &[&str]) -> anyhow::Result<Vec<(u32, usize)>> {
    let order = select(
        interleave(names.len(), b.args.runs),
        names,
        b.args.only.as_deref(),
    );
    if order.is_empty() && b.args.runs > 0 {
        anyhow::bail!(
            "--only {}: no {scenario} contender's name contains it; the contenders are {}",
            b.args.only.as_deref().unwrap_or_default(),
            names.join(", ")
        );
    }
    Ok(order)
}

fn select(order: Vec<(u32, usize)>, names: &[&str], only: Option<&str>) -> Vec<(u32, usize)> {
    order
        .into_iter()
        .filter(|&(_, c)| {
            only.is_none_or(|o| {
                o.split(',')
                    .any(|part| !part.is_empty() && names[c].contains(part))
            })
        })
        .collect()
}

/// Per-contender medians, in the order of `names` (a contender `--only` left out has a row
/// with `runs: 0`); and the ratio of the first two when both ran.
pub fn summarise(names: &[&str], runs: &[IperfRun]) -> (Vec<ContenderSummary>, Option<Ratio>) {
    let summary: Vec<ContenderSummary> = names
        .iter()
        .map(|&name| {
            let mine: Vec<&IperfRun> = runs.iter().filter(|r| r.contender == name).collect();
            let g: Vec<f64> = mine.iter().map(|r| r.gbps).collect();
            let c: Vec<f64> = mine.iter().map(|r| r.cpu_per_gbps).collect();
            let retr: Vec<f64> = mine.iter().map(|r| r.retransmits as f64).collect();
            let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            ContenderSummary {
                contender: name.to_string(),
                runs: mine.len(),
                gbps_median: median(&g),
                gbps_min: min(&g),
                gbps_max: max(&g),
                cpu_per_gbps_median: median(&c),
                cpu_per_gbps_min: min(&c),
                cpu_per_gbps_max: max(&c),
                retransmits_median: median(&retr),
            }
        })
        .collect();
    let ratio = match summary.as_slice() {
        [a, b, ..] => ratio_of(a, b),
        _ => None,
    };
    (summary, ratio)
}

/// `a` against `b` (medians divided), when both ran and `b`'s medians can divide.
pub fn ratio_of(a: &ContenderSummary, b: &ContenderSummary) -> Option<Ratio> {
    (a.runs > 0 && b.runs > 0 && b.gbps_median > 0.0 && b.cpu_per_gbps_median > 0.0).then(|| {
        Ratio {
            of: format!("{} / {}", a.contender, b.contender),
            gbps: a.gbps_median / b.gbps_median,
            cpu_per_gbps: a.cpu_per_gbps_median / b.cpu_per_gbps_median,
        }
    })
}

/// The final table, then one `RESULT scenario contender key=value ...` line per contender
/// (and one for the ratio), for scripts.
pub fn print_table(scenario: &str, title: &str, summary: &[ContenderSummary], ratios: &[Ratio]) {
    println!();
    println!(
        "{title:<43}{:<28}CPU per Gbit/s",
        "Gbit/s (median [min-max])"
    );
    for s in summary.iter().filter(|s| s.runs > 0) {
        let g = format!("{:.1} [{:.1}-{:.1}]", s.gbps_median, s.gbps_min, s.gbps_max);
        println!("  {:<41}{g:<28}{:.2}", s.contender, s.cpu_per_gbps_median);
    }
    for r in ratios {
        println!(
            "  {:<41}{:<28.2}{:.2}",
            format!("ratio {}", r.of),
            r.gbps,
            r.cpu_per_gbps
        );
    }
    println!();
    for s in summary.iter().filter(|s| s.runs > 0) {
        println!(
            "RESULT {scenario} {} gbps={:.2} cpu_per_gbps={:.3}",
            s.contender, s.gbps_median, s.cpu_per_gbps_median
        );
    }
    for r in ratios {
        println!(
            "RESULT {scenario} {} gbps_ratio={:.3} cpu_per_gbps_ratio={:.3}",
            r.of.replace(' ', ""),
            r.gbps,
            r.cpu_per_gbps
        );
    }
}

/// Warns about runs that began on a busy machine (more than half a CPU busy in the idle
/// second before the traffic).
pub fn warn_if_busy(runs: &[IperfRun]) {
    warn_busy_before("run(s)", runs.iter().map(|r| (r.seq, r.idle_busy_cpus)));
}

/// The warning of [`warn_if_busy`] for any kind of run: `runs` are (position in the
/// interleaved order, busy CPUs in the idle second before it); `what` names them.
pub fn warn_busy_before(what: &str, runs: impl IntoIterator<Item = (usize, f64)>) {
    let busy: Vec<String> = runs
        .into_iter()
        .filter(|&(_, idle_busy)| idle_busy > 0.5)
        .map(|(seq, _)| format!("#{seq}"))
        .collect();
    if !busy.is_empty() {
        println!(
            "warning: the machine was busy before {what} {} (> 0.5 CPUs busy while idle): other \
             work competed with the measurement; rerun on a quiet machine before quoting these",
            busy.join(" ")
        );
    }
}

/// One line per iperf3 run (Gbit/s each second), named by contender, round and position in
/// the interleaved order.
pub fn gbps_per_run<'a>(runs: impl IntoIterator<Item = &'a IperfRun>) -> Vec<Series> {
    runs.into_iter()
        .map(|r| Series {
            name: format!("{} run {} (#{})", r.contender, r.round, r.seq),
            points: r.samples.iter().map(|s| (s.t_s, s.gbps)).collect(),
        })
        .collect()
}

/// Writes `out/NAME.json` (the report, pretty-printed) and `out/NAME.svg`, and prints their
/// paths; every scenario ends with this.
pub fn write_results(
    out: &Path,
    name: &str,
    report: &impl serde::Serialize,
    svg: &str,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let json = out.join(format!("{name}.json"));
    let svg_path = out.join(format!("{name}.svg"));
    std::fs::write(&json, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("cannot write {}", json.display()))?;
    std::fs::write(&svg_path, svg)
        .with_context(|| format!("cannot write {}", svg_path.display()))?;
    println!("wrote {}", json.display());
    println!("wrote {}", svg_path.display());
    Ok(())
}

/// Two namespaces connected somehow; dropping it tears everything down.
pub trait Topology {
    /// Where the iperf3 client runs.
    fn client(&self) -> &Netns;
    /// Where the iperf3 server runs.
    fn server(&self) -> &Netns;
    /// The server's address.
    fn server_addr(&self) -> &str;
    /// The qswitch daemon in the path, if any (for per-second worker stats).
    fn daemon(&self) -> Option<&LabDaemon> {
        None
    }
}

/// One iperf3 TCP run client → server over `topo`: 1 s idle baseline, then `seconds` of
/// traffic with `streams` streams, sampling machine CPU (and the daemon's rates) every second.
/// Prints a dot per second.
pub fn iperf_run(
    b: &Bench,
    topo: &dyn Topology,
    who: (&str, u32, usize),
) -> anyhow::Result<IperfRun> {
    iperf_run_with(b, topo, who, &[])
}

/// [`iperf_run`] with extra iperf3 client arguments (e.g. `-M 100`).
pub fn iperf_run_with(
    b: &Bench,
    topo: &dyn Topology,
    (contender, round, seq): (&str, u32, usize),
    extra: &[&str],
) -> anyhow::Result<IperfRun> {
    let (seconds, streams) = (b.args.seconds, b.args.streams);
    let addr = topo.server_addr();
    let _server = topo
        .server()
        .spawn(&["iperf3", "-s", "-1", "-B", addr], Stdio::null())?;
    if let Err(e) = netns::wait_listening(topo.server(), 5201) {
        b.check()?; // Ctrl-C also stops the server: say so rather than "nothing listens"
        return Err(e);
    }
    let idle_from = procstat::cpu_jiffies();
    b.sleep(Duration::from_secs(1))?;
    let idle_busy_cpus = procstat::busy_cpus(idle_from, procstat::cpu_jiffies());

    let first_stats = topo.daemon().map(LabDaemon::stats).transpose()?;
    let mut client = netns::iperf3_client_with(topo.client(), addr, seconds, streams, extra)?;
    let cpu_from = procstat::cpu_jiffies();
    let t0 = Instant::now();
    // Drain the pipes while iperf3 runs, so a long JSON cannot block it.
    let child = client.0.as_mut().context("no iperf3 child")?;
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );

    let mut ticks: Vec<(f64, Option<Rates>)> = Vec::new();
    let (mut prev_cpu, mut prev_stats) = (cpu_from, first_stats.clone());
    let limit = Duration::from_secs(u64::from(seconds) + 20);
    for k in 1u32.. {
        b.check()?;
        let next = t0 + Duration::from_secs(u64::from(k));
        if client
            .wait_timeout(next.saturating_duration_since(Instant::now()))?
            .is_some()
        {
            break;
        }
        if t0.elapsed() > limit {
            bail!("iperf3 did not finish within {} s", limit.as_secs());
        }
        let cpu = procstat::cpu_jiffies();
        let busy = procstat::busy_cpus(prev_cpu, cpu);
        prev_cpu = cpu;
        let rates = match (topo.daemon(), &prev_stats) {
            (Some(d), Some(prev)) => {
                let cur = d.stats()?;
                let r = qswitch_api::request::Rates::between(prev, &cur);
                prev_stats = Some(cur);
                Some(r)
            }
            _ => None,
        };
        ticks.push((busy, rates));
        print!(".");
        let _ = std::io::stdout().flush();
    }
    b.check()?;
    let busy_cpus = procstat::busy_cpus(cpu_from, procstat::cpu_jiffies());
    let totals = match (topo.daemon(), &first_stats) {
        (Some(d), Some(first)) => Some(qswitch_api::request::Rates::between(first, &d.stats()?)),
        _ => None,
    };
    let out = stdout.join().unwrap_or_default();
    let err = String::from_utf8_lossy(&stderr.join().unwrap_or_default())
        .trim()
        .to_string();
    let json: serde_json::Value = serde_json::from_slice(&out)
        .with_context(|| format!("iperf3 printed no JSON result (stderr: {err})"))?;
    let (gbps, retransmits) =
        netns::iperf3_summary(&json).with_context(|| format!("contender {contender}"))?;
    if gbps <= 0.0 {
        bail!("iperf3 ({contender}) measured no traffic");
    }
    let samples = json["intervals"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, iv)| {
            let sum = &iv["sum"];
            Sample::new(
                sum["end"].as_f64().unwrap_or(i as f64 + 1.0),
                sum["bits_per_second"].as_f64().unwrap_or(0.0) / 1e9,
                sum["retransmits"].as_u64(),
                ticks.get(i).map(|t| (t.0, t.1.as_ref())),
            )
        })
        .collect();
    Ok(Run {
        contender: contender.to_string(),
        round,
        seq,
        metrics: IperfMetrics::new(
            gbps,
            retransmits,
            busy_cpus,
            idle_busy_cpus,
            totals.as_ref(),
        ),
        samples,
    })
}

/// One line about a finished run (continues the line [`Bench::say_start`] began).
fn run_line(r: &IperfRun) -> String {
    let mut s = format!(
        " {:>6.2} Gbit/s  retr {:<5} busy {:.2} CPUs (idle {:.2})  {:.3} CPU per Gbit/s",
        r.gbps, r.retransmits, r.busy_cpus, r.idle_busy_cpus, r.cpu_per_gbps
    );
    if let (Some(busy), Some(cs)) = (&r.worker_busy_pct, r.ctx_switches_ps) {
        let b: Vec<String> = busy.iter().map(|b| format!("{b:.0}%")).collect();
        s.push_str(&format!("  workers busy {} {cs:.0} cs/s", b.join("/")));
    }
    s
}

pub use crate::topology::RemoveDir;

// ---------------------------------------------------------------------------------------------
// tap-tcp

/// Two namespaces joined by qswitch: TAP `qsbA<n>` ↔ port a ↔ workers ↔ port b ↔ TAP `qsbB<n>`.
/// Field order is drop order: the daemon stops before its namespaces go.
struct QswitchTopo {
    daemon: LabDaemon,
    a: Netns,
    b: Netns,
    _dir: RemoveDir,
}

impl Topology for QswitchTopo {
    fn client(&self) -> &Netns {
        &self.a
    }
    fn server(&self) -> &Netns {
        &self.b
    }
    fn server_addr(&self) -> &str {
        "10.98.0.2"
    }
    fn daemon(&self) -> Option<&LabDaemon> {
        Some(&self.daemon)
    }
}

fn setup_qswitch(id: u32, workers: &str) -> anyhow::Result<QswitchTopo> {
    setup_qswitch_queues(id, workers, 1)
}

/// [`setup_qswitch`] with `queues` queues per TAP port.
fn setup_qswitch_queues(id: u32, workers: &str, queues: u16) -> anyhow::Result<QswitchTopo> {
    let n = id % 10_000;
    let (tap_a, tap_b) = (format!("qsbA{n}"), format!("qsbB{n}"));
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-{id}")));
    let control = dir.0.join("control.sock");
    let text = crate::topology::config_queues(
        workers,
        &control.display().to_string(),
        &tap_a,
        &tap_b,
        queues,
    );
    let a = Netns::create(&format!("qsbench-qs-a-{id}"))?;
    let b = Netns::create(&format!("qsbench-qs-b-{id}"))?;
    let daemon = LabDaemon::start(&dir.0, &text)?;
    let topo = QswitchTopo {
        daemon,
        a,
        b,
        _dir: dir,
    };
    topo.a.adopt(&tap_a, "10.98.0.1/24")?;
    topo.b.adopt(&tap_b, "10.98.0.2/24")?;
    Ok(topo)
}

/// Two namespaces joined by the Linux bridge `qsbr<n>` in the root namespace, through veth
/// pairs `qsvA<n>`↔`qspA<n>` and `qsvB<n>`↔`qspB<n>`.
struct BridgeTopo {
    _veth_a: Link,
    _veth_b: Link,
    _bridge: Link,
    a: Netns,
    b: Netns,
}

impl Topology for BridgeTopo {
    fn client(&self) -> &Netns {
        &self.a
    }
    fn server(&self) -> &Netns {
        &self.b
    }
    fn server_addr(&self) -> &str {
        "10.98.1.2"
    }
}

fn setup_bridge(id: u32) -> anyhow::Result<BridgeTopo> {
    let n = id % 10_000;
    let a = Netns::create(&format!("qsbench-br-a-{id}"))?;
    let b = Netns::create(&format!("qsbench-br-b-{id}"))?;
    let bridge = Link::bridge(&format!("qsbr{n}"))?;
    let veth_a = Link::veth(&format!("qsvA{n}"), &format!("qspA{n}"))?;
    let veth_b = Link::veth(&format!("qsvB{n}"), &format!("qspB{n}"))?;
    for (veth, ns, peer, addr) in [
        (&veth_a, &a, format!("qspA{n}"), "10.98.1.1/24"),
        (&veth_b, &b, format!("qspB{n}"), "10.98.1.2/24"),
    ] {
        veth.attach(&bridge)?;
        ns.adopt(&peer, addr)?;
    }
    Ok(BridgeTopo {
        _veth_a: veth_a,
        _veth_b: veth_b,
        _bridge: bridge,
        a,
        b,
    })
}

/// Two namespaces joined by qswitch's veth ports: veth pairs `qsvA<n>`↔`qspA<n>` and
/// `qsvB<n>`↔`qspB<n>` whose root-namespace ends are the daemon's ports `a` and `b`, with
/// the kernel fast path (see `qswitch_dp::port::veth`). Field order is drop order.
struct VethTopo {
    daemon: LabDaemon,
    _veth_a: Link,
    _veth_b: Link,
    a: Netns,
    b: Netns,
    _dir: RemoveDir,
}

impl Topology for VethTopo {
    fn client(&self) -> &Netns {
        &self.a
    }
    fn server(&self) -> &Netns {
        &self.b
    }
    fn server_addr(&self) -> &str {
        "10.98.4.2"
    }
    fn daemon(&self) -> Option<&LabDaemon> {
        Some(&self.daemon)
    }
}

/// Two namespaces `qsbench-TAG-a/b-ID`, each holding one end of a veth pair
/// (`qspA<n>`, `qspB<n>`, addresses 10.98.SUBNET.1 and .2) whose other end (`qsvA<n>`,
/// `qsvB<n>`) stays in the root namespace, down, for the caller to use.
struct VethPairs {
    veths: [Link; 2],
    a: Netns,
    b: Netns,
}

fn veth_pairs(id: u32, tag: &str, subnet: u8) -> anyhow::Result<VethPairs> {
    let n = id % 10_000;
    let a = Netns::create(&format!("qsbench-{tag}-a-{id}"))?;
    let b = Netns::create(&format!("qsbench-{tag}-b-{id}"))?;
    let veth_a = Link::veth(&format!("qsvA{n}"), &format!("qspA{n}"))?;
    let veth_b = Link::veth(&format!("qsvB{n}"), &format!("qspB{n}"))?;
    a.adopt(&format!("qspA{n}"), &format!("10.98.{subnet}.1/24"))?;
    b.adopt(&format!("qspB{n}"), &format!("10.98.{subnet}.2/24"))?;
    Ok(VethPairs {
        veths: [veth_a, veth_b],
        a,
        b,
    })
}

fn setup_veth(id: u32, workers: &str) -> anyhow::Result<VethTopo> {
    let VethPairs {
        veths: [veth_a, veth_b],
        a,
        b,
    } = veth_pairs(id, "ve", 4)?;
    let (va, vb) = (&veth_a.name, &veth_b.name);
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-{id}")));
    let control = dir.0.join("control.sock");
    let text = format!(
        "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"a\"\ntype = \"veth\"\nifname = \"{va}\"\n\
         [[port]]\nname = \"b\"\ntype = \"veth\"\nifname = \"{vb}\"\n",
        control.display()
    );
    let daemon = LabDaemon::start(&dir.0, &text)?;
    Ok(VethTopo {
        daemon,
        _veth_a: veth_a,
        _veth_b: veth_b,
        a,
        b,
        _dir: dir,
    })
}

/// Two namespaces joined by `qswitch load relay` (no switch at all, see [`crate::load`]):
/// TAP `qsbA<n>` ↔ the relay's one thread ↔ TAP `qsbB<n>`. The reference for what any
/// userspace switch with TAP ports can do here. Field order is drop order: the relay stops
/// (and its TAPs go) before the namespaces.
struct RelayTopo {
    _relay: netns::ChildGuard,
    a: Netns,
    b: Netns,
}

impl Topology for RelayTopo {
    fn client(&self) -> &Netns {
        &self.a
    }
    fn server(&self) -> &Netns {
        &self.b
    }
    fn server_addr(&self) -> &str {
        "10.98.2.2"
    }
}

/// Starts the relay between TAPs `qsbA<n>` and `qsbB<n>` (its thread pinned to `cpu` when
/// given) and moves them into two new namespaces.
fn setup_relay(id: u32, cpu: Option<usize>) -> anyhow::Result<RelayTopo> {
    let n = id % 10_000;
    let (tap_a, tap_b) = (format!("qsbA{n}"), format!("qsbB{n}"));
    let a = Netns::create(&format!("qsbench-rl-a-{id}"))?;
    let b = Netns::create(&format!("qsbench-rl-b-{id}"))?;
    let exe = std::env::current_exe().context("cannot find the qswitch binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["load", "relay", "--tap", &tap_a, "--tap", &tap_b])
        .stdin(Stdio::null());
    if let Some(c) = cpu {
        cmd.args(["--cpu", &c.to_string()]);
    }
    let mut relay = netns::ChildGuard(Some(
        cmd.spawn().context("cannot start qswitch load relay")?,
    ));
    let deadline = Instant::now() + Duration::from_secs(5);
    while ![&tap_a, &tap_b]
        .iter()
        .all(|t| Path::new("/sys/class/net").join(t).exists())
    {
        if let Some(st) = relay.wait_timeout(Duration::from_millis(20))? {
            bail!("qswitch load relay exited during start-up ({st})");
        }
        if Instant::now() > deadline {
            bail!("qswitch load relay did not create {tap_a} and {tap_b} within 5 s");
        }
    }
    let topo = RelayTopo {
        _relay: relay,
        a,
        b,
    };
    topo.a.adopt(&tap_a, "10.98.2.1/24")?;
    topo.b.adopt(&tap_b, "10.98.2.2/24")?;
    Ok(topo)
}

/// Two namespaces joined by veth pairs `qsvA<n>`↔`qspA<n>` and `qsvB<n>`↔`qspB<n>` whose
/// root-namespace ends hand every frame straight to each other: a tc `mirred` redirect on
/// each end's ingress, no bridge, no lookup, no learning. The least forwarding the kernel
/// can do between two namespaces, so the reference for what any switch can do here.
struct RedirectTopo {
    _veth_a: Link,
    _veth_b: Link,
    a: Netns,
    b: Netns,
}

impl Topology for RedirectTopo {
    fn client(&self) -> &Netns {
        &self.a
    }
    fn server(&self) -> &Netns {
        &self.b
    }
    fn server_addr(&self) -> &str {
        "10.98.3.2"
    }
}

fn setup_redirect(id: u32) -> anyhow::Result<RedirectTopo> {
    let VethPairs {
        veths: [veth_a, veth_b],
        a,
        b,
    } = veth_pairs(id, "rd", 3)?;
    let (va, vb) = (&veth_a.name, &veth_b.name);
    for (from, to) in [(va, vb), (vb, va)] {
        netns::run(&["tc", "qdisc", "add", "dev", from, "clsact"])?;
        netns::run(&[
            "tc", "filter", "add", "dev", from, "ingress", "protocol", "all", "u32", "match",
            "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", to,
        ])?;
        netns::run(&["ip", "link", "set", from, "up"])?;
    }
    Ok(RedirectTopo {
        _veth_a: veth_a,
        _veth_b: veth_b,
        a,
        b,
    })
}

/// What qswitch reports of its first port (its offloads and queues, for the record).
fn first_port(d: &LabDaemon) -> Option<qswitch_api::request::PortInfo> {
    match qswitch_api::client::call(&d.control, &Request::PortList).ok()? {
        Response::Ports { ports } => ports.into_iter().next(),
        _ => None,
    }
}

/// A file's first line, trimmed ("" if unreadable).
fn first_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .trim()
        .to_string()
}

fn tap_tcp(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [("ip", "iproute2"), ("ss", "iproute2"), ("iperf3", "iperf3")] {
        netns::ensure_tool(tool, pkg)?;
    }
    // The first two are the comparison; the next two are references that bound it (see
    // RelayTopo and RedirectTopo): the most a userspace relay between two TAPs does, and the
    // most the kernel's least forwarding does; the last is qswitch with veth ports instead
    // of TAPs (VethTopo), whose fast path is the kernel's.
    const NAMES: [&str; 5] = [
        "qswitch",
        "linux-bridge",
        "tap-relay",
        "tc-redirect",
        "qswitch-veth",
    ];
    let (runs, seconds, streams) = (b.args.runs, b.args.seconds, b.args.streams);
    let queues = b.args.queues;
    let workers = crate::topology::worker_cpus(2)?;
    let order = schedule(b, "tap-tcp", &NAMES)?;
    let s = if streams == 1 { "" } else { "s" };
    b.say(format_args!(
        "{runs} round(s) of {} and {}, {seconds} s each, {streams} stream{s}; qswitch workers on CPUs {workers}, {queues} queue(s) per TAP",
        NAMES[0], NAMES[1]
    ));
    let nf = first_line("/proc/sys/net/bridge/bridge-nf-call-iptables");
    if nf == "1" {
        b.say("note: br_netfilter is loaded and bridge-nf-call-iptables=1: bridged frames pass netfilter hooks");
    }
    let mut config = serde_json::json!({
        "runs": runs,
        "seconds": seconds,
        "streams": streams,
        "queues": queues,
        "contenders": NAMES,
        "order": order.iter().map(|&(_, c)| NAMES[c]).collect::<Vec<_>>(),
        "qswitch_workers": workers,
        "qswitch_version": env!("CARGO_PKG_VERSION"),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": first_line("/proc/sys/kernel/osrelease"),
        "loadavg_at_start": first_line("/proc/loadavg"),
        "bridge_nf_call_iptables": nf,
        "iperf3": netns::run(&["iperf3", "--version"])
            .map(|o| String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or("").to_string())
            .unwrap_or_default(),
        "started_unix_s": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    });

    let mut results = Vec::new();
    let mut offloads = None;
    let mut port_queues = None;
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = NAMES[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<13}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let topo: Box<dyn Topology> = match c {
            0 => Box::new(setup_qswitch_queues(b.id, &workers, queues)?),
            1 => Box::new(setup_bridge(b.id)?),
            2 => Box::new(setup_relay(b.id, None)?),
            3 => Box::new(setup_redirect(b.id)?),
            _ => Box::new(setup_veth(b.id, &workers)?),
        };
        if let (None, Some(p)) = (&offloads, topo.daemon().and_then(first_port)) {
            port_queues = Some(p.queues.len());
            offloads = Some(p.offloads);
        }
        let r = iperf_run(b, topo.as_ref(), (name, round + 1, seq + 1))?;
        drop(topo);
        println!("{}", run_line(&r));
        results.push(r);
    }
    config["qswitch_port_offloads"] = serde_json::json!(offloads);
    config["qswitch_port_queues"] = serde_json::json!(port_queues);

    let (summary, ratio) = summarise(&NAMES, &results);
    let q = if queues == 1 {
        String::new()
    } else {
        format!(", {queues} queues per TAP")
    };
    let title = format!("tap-tcp ({streams} stream{s}{q}, {seconds} s, {runs} runs each)");
    // qswitch against the relay (what its switching costs on top of the TAPs' I/O), each
    // reference against the bridge, and qswitch's veth ports (kernel fast path) against it.
    let references: Vec<Ratio> = [(0, 2), (2, 1), (3, 1), (4, 1)]
        .iter()
        .filter_map(|&(x, y)| ratio_of(&summary[x], &summary[y]))
        .collect();
    let all: Vec<Ratio> = ratio.iter().chain(&references).cloned().collect();
    print_table("tap-tcp", &title, &summary, &all);
    warn_if_busy(&results);
    let svg = tap_tcp_svg(&title, &summary, &results);
    let report = TapTcpReport {
        report: Report {
            scenario: "tap-tcp".into(),
            config,
            runs: results,
            summary,
            ratio,
        },
        references,
    };
    write_results(&b.args.out, "tap-tcp", &report, &svg)
}

/// What `OUT/tap-tcp.json` holds: the usual report, plus the ratios to the references.
#[derive(Debug, Serialize)]
struct TapTcpReport {
    #[serde(flatten)]
    report: Report,
    /// qswitch / tap-relay, tap-relay / linux-bridge, tc-redirect / linux-bridge,
    /// qswitch-veth / linux-bridge (those whose contenders both ran).
    references: Vec<Ratio>,
}

/// Medians with min–max whiskers (Gbit/s, CPU per Gbit/s), then per-second Gbit/s of every run.
fn tap_tcp_svg(title: &str, summary: &[ContenderSummary], runs: &[IperfRun]) -> String {
    let bars = |f: fn(&ContenderSummary) -> (f64, f64, f64)| {
        let group: Vec<(String, f64)> = summary
            .iter()
            .map(|s| (s.contender.clone(), f(s).0))
            .collect();
        let ranges: Vec<(f64, f64)> = summary.iter().map(|s| (f(s).1, f(s).2)).collect();
        (vec![(title.to_string(), group)], vec![ranges])
    };
    let (g, r) = bars(|s| (s.gbps_median, s.gbps_min, s.gbps_max));
    let gbps = plot::bar_chart_with_ranges(
        "Throughput: median Gbit/s (whiskers: min-max over runs; higher is better)",
        "Gbit/s",
        &g,
        &r,
    );
    let (g, r) = bars(|s| {
        (
            s.cpu_per_gbps_median,
            s.cpu_per_gbps_min,
            s.cpu_per_gbps_max,
        )
    });
    let cpu = plot::bar_chart_with_ranges(
        "Cost: machine busy CPUs per Gbit/s (median, min-max; lower is better)",
        "busy CPUs per Gbit/s",
        &g,
        &r,
    );
    let mut sorted: Vec<&IperfRun> = runs.iter().collect();
    sorted.sort_by_key(|r| {
        (
            summary.iter().position(|s| s.contender == r.contender),
            r.round,
        )
    });
    let series = gbps_per_run(sorted);
    let per_second = plot::line_chart(
        "iperf3 Gbit/s per second, every run (#: position in the interleaved order)",
        "seconds since the client started",
        "Gbit/s",
        &series,
        &[],
    );
    plot::stack(&[gbps, cpu, per_second])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn only_selects_by_name_parts_and_keeps_the_order() {
        let names = ["qswitch-native-1", "qswitch-skb-1", "linux-bridge-1"];
        let all = interleave(3, 2);
        assert_eq!(select(all.clone(), &names, None), all);
        let pick = |only| -> Vec<usize> {
            select(all.clone(), &names, Some(only))
                .into_iter()
                .map(|x| x.1)
                .collect()
        };
        assert_eq!(pick("native,bridge"), [0, 2, 2, 0]);
        assert_eq!(pick("skb"), [1, 1]);
        assert!(pick("ovs").is_empty());
        assert!(pick(",").is_empty());
    }

    #[test]
    fn interleave_alternates() {
        let o: Vec<usize> = interleave(2, 3).into_iter().map(|x| x.1).collect();
        assert_eq!(o, [0, 1, 1, 0, 0, 1]);
        assert_eq!(interleave(2, 2).last(), Some(&(1, 0)));
    }

    #[test]
    fn summary_and_ratio() {
        let run = |c: &str, gbps: f64, cpu: f64| Run {
            contender: c.into(),
            round: 1,
            seq: 1,
            metrics: IperfMetrics {
                gbps,
                retransmits: 0,
                busy_cpus: cpu * gbps,
                idle_busy_cpus: 0.0,
                cpu_per_gbps: cpu,
                worker_busy_pct: None,
                ctx_switches_ps: None,
            },
            samples: vec![],
        };
        let runs = [
            run("q", 10.0, 0.2),
            run("q", 12.0, 0.1),
            run("q", 8.0, 0.3),
            run("b", 20.0, 0.1),
        ];
        let (s, r) = summarise(&["q", "b"], &runs);
        assert_eq!(
            (s[0].gbps_median, s[0].gbps_min, s[0].gbps_max),
            (10.0, 8.0, 12.0)
        );
        let r = r.unwrap();
        assert_eq!((r.gbps, r.cpu_per_gbps, r.of.as_str()), (0.5, 2.0, "q / b"));
        let svg = tap_tcp_svg("t", &s, &runs);
        assert!(svg.starts_with("<svg") && svg.contains("q run 1") && !svg.contains("NaN"));
    }
}
