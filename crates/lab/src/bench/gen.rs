//! Benchmarks on internal gen ports (generating costs no syscall and no extra core, so what is
//! measured is the switch's workers):
//!
//! - `rss`: one generator port with two rx queues at full speed → switch → a sink port, with
//!   one worker and then with two (static placement: one queue per worker). Mpps and the
//!   ratio two / one: how well receive-side scaling spreads the work over cores.
//! - `placement`: two uplink-like ports sending to each other at full speed, two workers,
//!   (a) with overlapping operator CPU sets (both `cpus` = the first CPU, like two NICs left on
//!   their default base processor) and (b) with the default disjoint sets. Mpps and each
//!   worker's busy %.
//!
//! Contenders are interleaved and each run starts a fresh daemon. The sinks check sequence
//! numbers, so a run also shows that nothing was lost or reordered.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use qswitch_api::request::StatsReport;
use serde::Serialize;

use super::{first_line, interleave, median, Bench};
use crate::netns::LabDaemon;
use crate::plot::{self, Series};
use crate::run::Run;

/// Frame size of every generated frame.
const FRAME: u16 = 64;

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct GenSample {
    /// Seconds since the measurement began.
    pub t_s: f64,
    pub mpps: f64,
    pub worker_busy_pct: Vec<f64>,
    pub worker_cpu_pct: Vec<f64>,
}

/// What one run measured (the scenario part of a [`Run`]).
#[derive(Debug, Clone, Serialize)]
pub struct GenMetrics {
    /// Frames/s the sinks received over the run, in millions.
    pub mpps: f64,
    /// Mpps per CPU the workers actually got (their CPU time): on a busy machine, where the
    /// workers do not get whole cores, this shows the per-core cost that throughput hides.
    pub mpps_per_cpu: f64,
    /// Per worker: share of wall time in polls that moved frames, and CPU time.
    pub worker_busy_pct: Vec<f64>,
    pub worker_cpu_pct: Vec<f64>,
    pub lost: u64,
    pub reordered: u64,
    pub loadavg: String,
}

/// One run of one contender: [`GenMetrics`] and a [`GenSample`] per second.
pub type GenRun = Run<GenMetrics, GenSample>;

/// Medians over a contender's runs.
#[derive(Debug, Clone, Serialize)]
pub struct GenSummary {
    pub contender: String,
    pub mpps_median: f64,
    pub mpps_min: f64,
    pub mpps_max: f64,
    pub mpps_per_cpu_median: f64,
    pub worker_busy_pct_median: Vec<f64>,
    pub worker_cpu_pct_median: Vec<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GenReport {
    pub scenario: String,
    pub about: String,
    pub runs: u32,
    pub seconds: u32,
    pub frame_bytes: u16,
    pub cpus: Vec<usize>,
    pub loadavg_at_start: String,
    pub loadavg_at_end: String,
    pub summary: Vec<GenSummary>,
    /// Median Mpps of the second contender over the first.
    pub ratio: f64,
    /// Median Mpps per worker CPU of the second contender over the first (`rss`: 1.0 means a
    /// second worker costs nothing in efficiency; 2 × this is the scaling on idle cores).
    pub per_cpu_ratio: f64,
    /// `rss`: ratio ≥ 1.7 (two workers against one).
    pub acceptance: Option<String>,
    /// With four contenders or more: each later pair's median Mpps, second over first
    /// (`fw-scale`: the firewall off, 2 workers over 1).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub more_ratios: Vec<(String, f64)>,
    pub results: Vec<GenRun>,
}

/// A contender: its name and its config (given the control socket path).
pub(super) struct Contender {
    pub(super) name: &'static str,
    pub(super) config: Box<dyn Fn(&Path) -> String>,
}

/// The two CPUs the benchmarks use (the first two online).
pub(super) fn two_cpus() -> anyhow::Result<[usize; 2]> {
    let cpus = qswitch_sys::thread::online_cpus().context("cannot read the online CPUs")?;
    match cpus[..] {
        [a, b, ..] => Ok([a, b]),
        _ => anyhow::bail!("this benchmark needs two CPUs"),
    }
}

fn gen_port(name: &str, mac: &str, extra: &str, dst: &str, flows: u16) -> String {
    format!(
        "[[port]]\nname = \"{name}\"\ntype = \"gen\"\nmac = \"{mac}\"\n{extra}\
         generate = {{ dst = \"{dst}\", size = {FRAME}, rate = 0, flows = {flows} }}\n"
    )
}

pub(super) fn switch_section(workers: &str, control: &Path) -> String {
    format!(
        "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\nplacement = \"static\"\n",
        control.display()
    )
}

pub fn rss(b: &Bench) -> anyhow::Result<()> {
    let [c0, c1] = two_cpus()?;
    const SINK: &str = "02:00:00:00:00:02";
    let ports = format!(
        "[[port]]\nname = \"s\"\ntype = \"gen\"\nmac = \"{SINK}\"\n{}",
        gen_port("g", "02:00:00:00:00:01", "queues = 2\n", SINK, 16)
    );
    let (p1, p2) = (ports.clone(), ports);
    let contenders = vec![
        Contender {
            name: "1 worker",
            config: Box::new(move |c| format!("{}{p1}", switch_section(&c0.to_string(), c))),
        },
        Contender {
            name: "2 workers",
            config: Box::new(move |c| format!("{}{p2}", switch_section(&format!("{c0},{c1}"), c))),
        },
    ];
    let about = format!(
        "gen port g (2 rx queues, {FRAME} B, 16 flows, full speed) -> switch -> sink s; \
         1 worker on CPU {c0}, then 2 workers on CPUs {c0},{c1}"
    );
    run_scenario(b, "rss", &about, &contenders, &["s"], [c0, c1], Some(1.7))
}

pub fn placement(b: &Bench) -> anyhow::Result<()> {
    let [c0, c1] = two_cpus()?;
    const U1: &str = "02:00:00:00:00:11";
    const U2: &str = "02:00:00:00:00:12";
    let ports = move |set: Option<usize>| {
        let extra = set.map_or_else(String::new, |c| format!("cpus = \"{c}\"\n"));
        format!(
            "{}{}",
            gen_port("u1", U1, &extra, U2, 8),
            gen_port("u2", U2, &extra, U1, 8)
        )
    };
    let workers = format!("{c0},{c1}");
    let w2 = workers.clone();
    let contenders = vec![
        Contender {
            name: "overlapping sets",
            config: Box::new(move |c| {
                format!("{}{}", switch_section(&workers, c), ports(Some(c0)))
            }),
        },
        Contender {
            name: "disjoint sets",
            config: Box::new(move |c| format!("{}{}", switch_section(&w2, c), ports(None))),
        },
    ];
    let about = format!(
        "two uplink-like gen ports u1 <-> u2 ({FRAME} B, full speed), workers on CPUs {c0},{c1}: \
         both ports' cpus = \"{c0}\" (overlapping) vs the default disjoint sets"
    );
    run_scenario(
        b,
        "placement",
        &about,
        &contenders,
        &["u1", "u2"],
        [c0, c1],
        None,
    )
}

pub(super) fn run_scenario(
    b: &Bench,
    name: &str,
    about: &str,
    contenders: &[Contender],
    sinks: &[&str],
    cpus: [usize; 2],
    accept: Option<f64>,
) -> anyhow::Result<()> {
    let loadavg_at_start = first_line("/proc/loadavg");
    b.say(format_args!("{about}; load average {loadavg_at_start}"));
    let order = interleave(contenders.len(), b.args.runs);
    let mut results = Vec::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let contender = &contenders[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {round} {:<17}",
            seq + 1,
            order.len(),
            contender.name
        ));
        let dir = std::env::temp_dir().join(format!("qswitch-bench-{}-{seq}", b.id));
        let config = (contender.config)(&dir.join("c.sock"));
        let run = measure(b, &dir, &config, sinks);
        let _ = std::fs::remove_dir_all(&dir);
        let (mpps, busy, cpu, lost, reordered, samples) = run?;
        println!(
            " {mpps:6.2} Mpps  workers busy {}  cpu {}  lost {lost} reordered {reordered}",
            pcts(&busy),
            pcts(&cpu)
        );
        let cpu_total: f64 = cpu.iter().sum::<f64>() / 100.0;
        results.push(Run {
            contender: contender.name.to_string(),
            round,
            seq: seq + 1,
            metrics: GenMetrics {
                mpps,
                mpps_per_cpu: if cpu_total > 0.0 {
                    mpps / cpu_total
                } else {
                    0.0
                },
                worker_busy_pct: busy,
                worker_cpu_pct: cpu,
                lost,
                reordered,
                loadavg: first_line("/proc/loadavg"),
            },
            samples,
        });
    }
    let summary: Vec<GenSummary> = contenders
        .iter()
        .map(|c| summarise(c.name, &results))
        .collect();
    let ratio = match &summary[..] {
        [a, b, ..] if a.mpps_median > 0.0 => b.mpps_median / a.mpps_median,
        _ => 0.0,
    };
    let per_cpu_ratio = match &summary[..] {
        [a, b, ..] if a.mpps_per_cpu_median > 0.0 => b.mpps_per_cpu_median / a.mpps_per_cpu_median,
        _ => 0.0,
    };
    println!();
    println!(
        "{name} ({FRAME} B, {} s, {} runs each)   Mpps (median [min-max])   Mpps/CPU   workers busy %",
        b.args.seconds, b.args.runs
    );
    for s in &summary {
        println!(
            "  {:<22} {:6.2} [{:.2}-{:.2}]        {:6.2}     {}",
            s.contender,
            s.mpps_median,
            s.mpps_min,
            s.mpps_max,
            s.mpps_per_cpu_median,
            pcts(&s.worker_busy_pct_median)
        );
        println!(
            "RESULT {name} {} mpps={:.3}",
            s.contender.replace(' ', "-"),
            s.mpps_median
        );
    }
    println!(
        "  ratio {} / {}: {ratio:.2}",
        summary[1].contender, summary[0].contender
    );
    println!(
        "  ratio of Mpps per worker CPU: {per_cpu_ratio:.2} (the workers' CPU time; on a busy \
         machine they get less than whole cores)"
    );
    println!("RESULT {name} ratio={ratio:.3} per_cpu_ratio={per_cpu_ratio:.3}");
    let more_ratios: Vec<(String, f64)> = (summary.chunks_exact(2).skip(1))
        .filter(|p| p[0].mpps_median > 0.0)
        .map(|p| {
            let of = format!("{} / {}", p[1].contender, p[0].contender);
            let r = p[1].mpps_median / p[0].mpps_median;
            println!("  ratio {of}: {r:.2}");
            println!(
                "RESULT {name} ratio_{}={r:.3}",
                p[1].contender.replace(' ', "-")
            );
            (of, r)
        })
        .collect();
    let acceptance = accept.map(|min| {
        let verdict = if ratio >= min { "met" } else { "NOT met" };
        format!("ratio {ratio:.2} >= {min}: {verdict}")
    });
    if let Some(a) = &acceptance {
        println!("acceptance: {a} (needs a quiet machine; load average {loadavg_at_start})");
    }
    let broken: Vec<String> = results
        .iter()
        .filter(|r| r.lost > 0 || r.reordered > 0)
        .map(|r| format!("#{}", r.seq))
        .collect();
    if !broken.is_empty() {
        println!(
            "warning: runs {} lost or reordered frames",
            broken.join(" ")
        );
    }
    let svg = svg(name, &summary, &results);
    let report = GenReport {
        scenario: name.into(),
        about: about.into(),
        runs: b.args.runs,
        seconds: b.args.seconds,
        frame_bytes: FRAME,
        cpus: cpus.to_vec(),
        loadavg_at_start,
        loadavg_at_end: first_line("/proc/loadavg"),
        summary,
        ratio,
        per_cpu_ratio,
        acceptance,
        more_ratios,
        results,
    };
    super::write_results(&b.args.out, name, &report, &svg)
}

fn pcts(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.0}%"))
        .collect::<Vec<_>>()
        .join("/")
}

type Measured = (f64, Vec<f64>, Vec<f64>, u64, u64, Vec<GenSample>);

/// Starts the daemon, warms up for a second, then samples every second for the run's length.
fn measure(b: &Bench, dir: &Path, config: &str, sinks: &[&str]) -> anyhow::Result<Measured> {
    let mut d = LabDaemon::start(dir, config)?;
    b.sleep(Duration::from_secs(1))?;
    let first = d.stats()?;
    let mut prev = first.clone();
    let mut samples = Vec::new();
    for _ in 0..b.args.seconds {
        b.sleep(Duration::from_secs(1))?;
        print!(".");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        let cur = d.stats()?;
        let (mpps, busy, cpu) = rates(&prev, &cur, sinks);
        samples.push(GenSample {
            t_s: (cur.uptime_ms - first.uptime_ms) as f64 / 1000.0,
            mpps,
            worker_busy_pct: busy,
            worker_cpu_pct: cpu,
        });
        prev = cur;
    }
    d.stop();
    let (mpps, busy, cpu) = rates(&first, &prev, sinks);
    let (lost, reordered) = sink_totals(&prev, sinks, |s| (s.lost, s.reordered));
    Ok((mpps, busy, cpu, lost, reordered, samples))
}

fn sink_totals(
    r: &StatsReport,
    sinks: &[&str],
    f: impl Fn(&qswitch_api::request::SinkStats) -> (u64, u64),
) -> (u64, u64) {
    r.ports
        .iter()
        .filter(|p| sinks.contains(&p.name.as_str()))
        .filter_map(|p| p.sink.as_ref().map(&f))
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
}

/// Mpps into the sinks, and per worker busy % and CPU %, between two reports.
fn rates(a: &StatsReport, b: &StatsReport, sinks: &[&str]) -> (f64, Vec<f64>, Vec<f64>) {
    let dt_ns = (b.uptime_ms.saturating_sub(a.uptime_ms)).max(1) as f64 * 1e6;
    let rx = |r: &StatsReport| sink_totals(r, sinks, |s| (s.received, 0)).0;
    let mpps = rx(b).saturating_sub(rx(a)) as f64 / dt_ns * 1e3;
    let per_worker = |f: fn(&qswitch_api::request::WorkerStats) -> u64| {
        b.workers
            .iter()
            .map(|w| {
                let before = a.workers.iter().find(|x| x.id == w.id).map_or(0, f);
                f(w).saturating_sub(before) as f64 / dt_ns * 100.0
            })
            .collect::<Vec<f64>>()
    };
    (mpps, per_worker(|w| w.busy_ns), per_worker(|w| w.cpu_ns))
}

fn summarise(name: &str, runs: &[GenRun]) -> GenSummary {
    let mine: Vec<&GenRun> = runs.iter().filter(|r| r.contender == name).collect();
    let mpps: Vec<f64> = mine.iter().map(|r| r.mpps).collect();
    let workers = mine
        .iter()
        .map(|r| r.worker_busy_pct.len())
        .max()
        .unwrap_or(0);
    let per_worker = |f: fn(&GenRun) -> &Vec<f64>| {
        (0..workers)
            .map(|w| {
                let v: Vec<f64> = mine.iter().filter_map(|r| f(r).get(w).copied()).collect();
                median(&v)
            })
            .collect()
    };
    GenSummary {
        contender: name.to_string(),
        mpps_median: median(&mpps),
        mpps_min: if mpps.is_empty() {
            0.0
        } else {
            mpps.iter().copied().fold(f64::INFINITY, f64::min)
        },
        mpps_max: mpps.iter().copied().fold(0.0, f64::max),
        mpps_per_cpu_median: median(&mine.iter().map(|r| r.mpps_per_cpu).collect::<Vec<_>>()),
        worker_busy_pct_median: per_worker(|r| &r.worker_busy_pct),
        worker_cpu_pct_median: per_worker(|r| &r.worker_cpu_pct),
    }
}

/// Median Mpps with min-max whiskers, median busy % per worker, Mpps per second of every run.
fn svg(name: &str, summary: &[GenSummary], runs: &[GenRun]) -> String {
    let groups = vec![(
        name.to_string(),
        summary
            .iter()
            .map(|s| (s.contender.clone(), s.mpps_median))
            .collect(),
    )];
    let ranges = vec![summary.iter().map(|s| (s.mpps_min, s.mpps_max)).collect()];
    let mpps = plot::bar_chart_with_ranges(
        "Throughput: median Mpps into the sinks (whiskers: min-max over runs; higher is better)",
        "Mpps",
        &groups,
        &ranges,
    );
    let busy_groups: Vec<(String, Vec<(String, f64)>)> = summary
        .iter()
        .map(|s| {
            (
                s.contender.clone(),
                s.worker_busy_pct_median
                    .iter()
                    .enumerate()
                    .map(|(w, &b)| (format!("worker {w}"), b))
                    .collect(),
            )
        })
        .collect();
    let busy = plot::bar_chart(
        "Per-worker busy % (median; share of time in polls that moved frames)",
        "busy %",
        &busy_groups,
    );
    let series: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            name: format!("{} run {} (#{})", r.contender, r.round, r.seq),
            points: r.samples.iter().map(|s| (s.t_s, s.mpps)).collect(),
        })
        .collect();
    let per_second = plot::line_chart(
        "Mpps per second, every run (#: position in the interleaved order)",
        "seconds since the measurement began",
        "Mpps",
        &series,
        &[],
    );
    plot::stack(&[mpps, busy, per_second])
}
