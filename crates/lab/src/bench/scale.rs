//! `scale`: what many idle ports cost. For each N in `--ports` (10, 100, 1000), a daemon with
//! one worker and N vhost-user server ports that no frontend ever connects to:
//! - its own CPU % over `--seconds` of idleness after 10 s to settle: one sample per second
//!   (the CPU time of all its threads, in nanoseconds from /proc/PID/task/TID/schedstat),
//!   reported as the median of the samples with their min and max (issue 30's statistic),
//!   with the whole window's mean and the share of each thread;
//! - its start-up time (until the control socket answers) and resident memory;
//! - its thread count (it must not grow with N);
//! - the time of `port add` at N: the control request's round trip, median of 5 (each adds
//!   one more vhost-user port, so the last runs at N + 4).
//!
//! Acceptance (issue 10): < 1% of a CPU at 1000 ports, threads independent of N, port add at
//! 1000 within 2× of its time at 10. Issue 30: median of the 1-s samples over 60 s
//! (`--ports 1000,10000 --seconds 60`) ≤ 0.5 % at 1000 ports and ≤ 1 % at 10 000, each
//! printed against its target. A switch holds up to 16 384 ports; the daemon raises its own
//! open-file limit (one descriptor per idle port, see `qswitch_sys::rlimit::nofile_for_ports`;
//! the bench refuses in one line an N the hard limit cannot hold) and the sockets go in one directory
//! under the temporary directory (short paths, whatever N). The daemon's own CPU time is counted, not the machine's,
//! so other load slows the measurement down without counting in it (it still perturbs the
//! port add times).

use std::time::{Duration, Instant};

use anyhow::Context;
use qswitch_api::{PortConfig, Request, Response, VhostMode};
use serde::Serialize;

use super::{median, Bench};
use crate::netns::LabDaemon;
use crate::plot::{self, Series};
use crate::run::Run;
use crate::topology::RemoveDir;

/// Port adds timed per N.
const ADDS: usize = 5;
/// Seconds before measuring: start-up work (opening N sockets) is not idleness.
const SETTLE: Duration = Duration::from_secs(10);
/// How long the daemon may take to answer on its control socket, per 1000 ports (at least
/// 10 s): it opens and listens on every port's socket first.
const START_PER_1000: Duration = Duration::from_secs(15);

/// What one N measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleMetrics {
    pub ports: usize,
    /// The daemon's CPU, % of one CPU: the median of the 1-s samples of the idle window.
    pub idle_cpu_pct: f64,
    /// The smallest and largest 1-s sample.
    pub idle_cpu_pct_min: f64,
    pub idle_cpu_pct_max: f64,
    /// The whole idle window's CPU time over its length.
    pub idle_cpu_pct_mean: f64,
    /// From spawning the daemon until its control socket answered, s.
    pub start_s: f64,
    /// Per thread (by name) over the idle window, % of one CPU.
    pub thread_cpu_pct: Vec<(String, f64)>,
    /// Per thread over the idle window: CPU clock ticks (utime + stime) and context
    /// switches (voluntary + involuntary, from /proc/PID/task/TID/status). The switches
    /// count the thread's wake-ups, which other load on the machine does not change; the
    /// ticks it does perturb.
    pub thread_idle: Vec<ThreadIdle>,
    pub threads: usize,
    pub port_add_ms_median: f64,
    pub port_add_ms: Vec<f64>,
    pub rss_kib: u64,
}

/// One thread over the idle window.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadIdle {
    pub name: String,
    pub ticks: u64,
    pub ctx_switches: u64,
}

/// One second of idleness: the daemon's CPU %.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub cpu_pct: f64,
}

pub type ScaleRun = Run<ScaleMetrics, Sample>;

#[derive(Debug, Serialize)]
struct Report {
    scenario: String,
    config: serde_json::Value,
    runs: Vec<ScaleRun>,
    /// Per N: medians over runs.
    summary: Vec<Summary>,
}

#[derive(Debug, Clone, Serialize)]
struct Summary {
    ports: usize,
    /// Median over runs of each run's median 1-s sample.
    idle_cpu_pct: f64,
    /// The smallest and largest 1-s sample of any run.
    idle_cpu_pct_min: f64,
    idle_cpu_pct_max: f64,
    threads: usize,
    port_add_ms: f64,
}

pub fn run(b: &Bench) -> anyhow::Result<()> {
    let counts = b.args.ports.clone();
    anyhow::ensure!(!counts.is_empty(), "--ports needs at least one count");
    let (runs, seconds) = (b.args.runs, b.args.seconds);
    let worker = crate::topology::worker_cpus(1)?;
    let hz = clock_ticks();
    b.say(format_args!(
        "{runs} round(s) of {counts:?} idle vhost-user ports, {seconds} s idle each, {ADDS} port adds; \
         worker on CPU {worker}"
    ));
    let mut results = Vec::new();
    for round in 0..runs {
        for &n in &counts {
            b.check()?;
            b.say_start(format_args!("round {} {n:>5} ports ", round + 1));
            let r = measure(b, n, &worker, hz, (round + 1, results.len() + 1))?;
            println!(
                "cpu {:.2}% [{:.2}-{:.2}] (median [min-max] of 1-s samples; mean {:.2}%)  \
                 threads {}  port add {:.1} ms  start {:.1} s  rss {} MiB",
                r.idle_cpu_pct,
                r.idle_cpu_pct_min,
                r.idle_cpu_pct_max,
                r.idle_cpu_pct_mean,
                r.threads,
                r.port_add_ms_median,
                r.start_s,
                r.rss_kib / 1024
            );
            for t in &r.thread_idle {
                println!(
                    "    {:<16} {:>5} ticks {:>7} context switches",
                    t.name, t.ticks, t.ctx_switches
                );
            }
            results.push(r);
        }
    }
    let summary: Vec<Summary> = counts
        .iter()
        .map(|&n| {
            let mine: Vec<&ScaleRun> = results.iter().filter(|r| r.ports == n).collect();
            let m =
                |f: fn(&ScaleRun) -> f64| median(&mine.iter().map(|r| f(r)).collect::<Vec<_>>());
            Summary {
                ports: n,
                idle_cpu_pct: m(|r| r.idle_cpu_pct),
                idle_cpu_pct_min: mine
                    .iter()
                    .map(|r| r.idle_cpu_pct_min)
                    .fold(f64::INFINITY, f64::min),
                idle_cpu_pct_max: mine.iter().map(|r| r.idle_cpu_pct_max).fold(0.0, f64::max),
                threads: mine.iter().map(|r| r.threads).max().unwrap_or(0),
                port_add_ms: m(|r| r.port_add_ms_median),
            }
        })
        .collect();
    println!();
    println!(
        "{:>7}  {:>12}  {:>13}  {:>8}  {:>13}",
        "ports", "idle CPU %", "[min-max]", "threads", "port add ms"
    );
    for s in &summary {
        println!(
            "{:>7}  {:>12.2}  {:>13}  {:>8}  {:>13.2}",
            s.ports,
            s.idle_cpu_pct,
            format!("[{:.2}-{:.2}]", s.idle_cpu_pct_min, s.idle_cpu_pct_max),
            s.threads,
            s.port_add_ms
        );
    }
    println!();
    for s in &summary {
        println!(
            "RESULT scale ports={} idle_cpu_pct={:.3} idle_cpu_pct_min={:.3} \
             idle_cpu_pct_max={:.3} threads={} port_add_ms={:.3}",
            s.ports,
            s.idle_cpu_pct,
            s.idle_cpu_pct_min,
            s.idle_cpu_pct_max,
            s.threads,
            s.port_add_ms
        );
    }
    for s in &summary {
        if let Some(target) = target_pct(s.ports) {
            let met = if s.idle_cpu_pct <= target {
                "met"
            } else {
                "NOT met"
            };
            println!(
                "issue 30: {} ports, median {:.2} % of a CPU, target <= {target} %: {met}",
                s.ports, s.idle_cpu_pct
            );
        }
    }
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "note: port add times are wall-clock and suffer from other load (loadavg {}); CPU % is \
         the daemon's own",
        loadavg
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let svg = svg(&summary, &results);
    let report = Report {
        scenario: "scale".into(),
        config: serde_json::json!({
            "runs": runs,
            "seconds": seconds,
            "settle_s": SETTLE.as_secs(),
            "cpu_statistic": "median of 1-s samples (schedstat CPU ns of every thread)",
            "ports": counts,
            "port_adds": ADDS,
            "worker_cpu": worker,
            "qswitch_version": env!("CARGO_PKG_VERSION"),
            "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
            "loadavg_at_end": loadavg.trim(),
        }),
        runs: results,
        summary,
    };
    super::write_results(&b.args.out, "scale", &report, &svg)
}

/// One daemon with `n` ports: idle CPU, threads, port adds.
fn measure(
    b: &Bench,
    n: usize,
    worker: &str,
    hz: f64,
    (round, seq): (u32, usize),
) -> anyhow::Result<ScaleRun> {
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-scale-{}", b.id)));
    let _ = std::fs::remove_dir_all(&dir.0);
    let control = dir.0.join("control.sock");
    let mut text = format!(
        "[switch]\nworkers = \"{worker}\"\ncontrol = \"{}\"\n",
        control.display()
    );
    for i in 0..n {
        text += &format!(
            "[[port]]\nname = \"p{i}\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n",
            dir.0.join(format!("p{i}.sock")).display()
        );
    }
    // The daemon inherits this process's limits and raises its soft limit to the hard one,
    // which may be too low for N ports (`qswitch run`'s rule: one descriptor an idle port,
    // 256 besides). Raise the soft limit here, and the hard one where allowed
    // (CAP_SYS_RESOURCE); refuse in one line when even the hard limit is too low.
    let need = qswitch_sys::rlimit::nofile_for_ports((n + ADDS) as u64);
    let (soft, hard) = qswitch_sys::rlimit::raise_nofile_to(need)
        .or_else(|_| qswitch_sys::rlimit::raise_nofile())
        .context("cannot raise RLIMIT_NOFILE")?;
    if soft < need {
        anyhow::bail!(
            "{n} ports need {need} open files, but RLIMIT_NOFILE is {soft} (hard limit {hard}; \
             raising it takes CAP_SYS_RESOURCE)"
        );
    }
    let started = Instant::now();
    let start_timeout = (START_PER_1000 * (n / 1000) as u32).max(Duration::from_secs(10));
    let mut daemon = LabDaemon::start_within(&dir.0, &text, start_timeout)
        .with_context(|| format!("starting a daemon with {n} vhost-user ports"))?;
    let start_s = started.elapsed().as_secs_f64();
    let pid = daemon.pid().context("the daemon has no pid")?;
    b.sleep(SETTLE)?;
    let threads_before = thread_times(pid);
    let t0 = Instant::now();
    let mut last = (process_cpu_ns(pid, hz)?, t0);
    let first = last.0;
    let mut samples = Vec::new();
    for _ in 0..b.args.seconds {
        b.sleep(Duration::from_secs(1))?;
        let now = (process_cpu_ns(pid, hz)?, Instant::now());
        samples.push(Sample {
            t_s: now.1.duration_since(t0).as_secs_f64(),
            cpu_pct: pct_ns(now.0.saturating_sub(last.0), now.1.duration_since(last.1)),
        });
        last = now;
    }
    let wall = last.1.duration_since(t0);
    let idle_cpu_pct_mean = pct_ns(last.0.saturating_sub(first), wall);
    let per_second: Vec<f64> = samples.iter().map(|s| s.cpu_pct).collect();
    let idle_cpu_pct = median(&per_second);
    let idle_cpu_pct_min = per_second.iter().copied().fold(f64::INFINITY, f64::min);
    let idle_cpu_pct_max = per_second.iter().copied().fold(0.0, f64::max);
    let threads_after = thread_times(pid);
    let delta = |tid: &str, now: (u64, u64)| {
        let before = threads_before
            .iter()
            .find(|(id, _, _)| id == tid)
            .map_or((0, 0), |x| x.2);
        (
            now.0.saturating_sub(before.0),
            now.1.saturating_sub(before.1),
        )
    };
    let thread_cpu_pct = threads_after
        .iter()
        .map(|(tid, name, t)| (name.clone(), pct(delta(tid, *t).0, hz, wall)))
        .collect();
    let thread_idle = threads_after
        .iter()
        .map(|(tid, name, t)| {
            let (ticks, ctx_switches) = delta(tid, *t);
            ThreadIdle {
                name: name.clone(),
                ticks,
                ctx_switches,
            }
        })
        .collect();
    let threads = threads_after.len();
    let rss_kib = rss_kib(pid);
    let mut port_add_ms = Vec::new();
    for k in 0..ADDS {
        b.check()?;
        let socket = dir.0.join(format!("extra{k}.sock"));
        let socket = socket
            .display()
            .to_string()
            .parse()
            .map_err(|e| anyhow::anyhow!("socket path: {e}"))?;
        let port = PortConfig::vhost_user(&format!("extra{k}"), socket, VhostMode::Server);
        let start = Instant::now();
        let reply = qswitch_api::client::call(&daemon.control, &Request::PortAdd { port })?;
        port_add_ms.push(start.elapsed().as_secs_f64() * 1e3);
        if let Response::Error { message, .. } = &reply {
            anyhow::bail!("port add at {n} ports failed: {message}");
        }
    }
    daemon.stop();
    Ok(Run {
        contender: format!("{n} ports"),
        round,
        seq,
        metrics: ScaleMetrics {
            ports: n,
            idle_cpu_pct,
            idle_cpu_pct_min,
            idle_cpu_pct_max,
            idle_cpu_pct_mean,
            start_s,
            thread_cpu_pct,
            thread_idle,
            threads,
            port_add_ms_median: median(&port_add_ms),
            port_add_ms,
            rss_kib,
        },
        samples,
    })
}

/// Issue 30's target for `ports` idle ports, % of a CPU (median of the 1-s samples), if it
/// sets one: 0.5 at 1000 ports, 1 at 10 000.
fn target_pct(ports: usize) -> Option<f64> {
    match ports {
        1000 => Some(0.5),
        10_000 => Some(1.0),
        _ => None,
    }
}

fn pct(ticks: u64, hz: f64, wall: Duration) -> f64 {
    ticks as f64 / hz / wall.as_secs_f64().max(1e-9) * 100.0
}

/// utime + stime (clock ticks) from a `/proc/.../stat` line.
fn stat_ticks(text: &str) -> Option<u64> {
    // The command name may hold spaces: fields count from after its closing parenthesis.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn pct_ns(ns: u64, wall: Duration) -> f64 {
    ns as f64 / 1e9 / wall.as_secs_f64().max(1e-9) * 100.0
}

/// The CPU time of all the daemon's threads, ns: the first field of each
/// `/proc/PID/task/TID/schedstat` (nanosecond resolution: a 1-s sample in clock ticks would
/// move in steps of 1 %, twice the 0.5 % it is held to). Without schedstat (a kernel built
/// without it), utime + stime from `/proc/PID/stat` in ticks.
fn process_cpu_ns(pid: u32, hz: f64) -> anyhow::Result<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("the daemon (pid {pid}) is gone"))?;
    let mut sum = 0u64;
    for t in tasks.flatten() {
        match std::fs::read_to_string(t.path().join("schedstat")) {
            Ok(text) => sum += schedstat_ns(&text).context("cannot parse schedstat")?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && t.path().exists() => {
                let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .with_context(|| format!("the daemon (pid {pid}) is gone"))?;
                let ticks = stat_ticks(&text).context("cannot parse /proc/PID/stat")?;
                return Ok((ticks as f64 / hz * 1e9) as u64);
            }
            // A thread that ended between the listing and the read.
            Err(_) => {}
        }
    }
    Ok(sum)
}

/// The first field of a schedstat line: time spent on the CPU, ns.
fn schedstat_ns(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// Per thread: (tid, name, (utime + stime, context switches)).
fn thread_times(pid: u32) -> Vec<(String, String, (u64, u64))> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut v: Vec<(String, String, (u64, u64))> = dir
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            let name = std::fs::read_to_string(p.join("comm")).ok()?;
            let t = stat_ticks(&std::fs::read_to_string(p.join("stat")).ok()?)?;
            let cs = ctx_switches(&std::fs::read_to_string(p.join("status")).ok()?);
            Some((
                e.file_name().to_string_lossy().into_owned(),
                name.trim().to_string(),
                (t, cs),
            ))
        })
        .collect();
    v.sort();
    v
}

/// voluntary + nonvoluntary context switches from a `/proc/.../status` text.
fn ctx_switches(status: &str) -> u64 {
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
        })
        .filter_map(|v| v.trim().parse::<u64>().ok())
        .sum()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, Linux's value, if that fails).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// Bars per N: idle CPU %, threads, port add ms; then CPU % per second of every run.
fn svg(summary: &[Summary], runs: &[ScaleRun]) -> String {
    let group = |title: &str, f: fn(&Summary) -> f64| {
        vec![(
            title.to_string(),
            summary
                .iter()
                .map(|s| (format!("{} ports", s.ports), f(s)))
                .collect::<Vec<_>>(),
        )]
    };
    let cpu = plot::bar_chart(
        "Idle daemon CPU, % of one CPU (median of 1-s samples; targets 0.5% at 1000 ports, 1% at 10 000)",
        "% of a CPU",
        &group("idle CPU %", |s| s.idle_cpu_pct),
    );
    let threads = plot::bar_chart(
        "Threads (must not grow with the port count)",
        "threads",
        &group("threads", |s| s.threads as f64),
    );
    let add = plot::bar_chart(
        "port add: control request round trip, ms (median of 5; target at 1000 <= 2x at 10)",
        "ms",
        &group("port add ms", |s| s.port_add_ms),
    );
    let series: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            name: format!("{} run {}", r.contender, r.round),
            points: r.samples.iter().map(|s| (s.t_s, s.cpu_pct)).collect(),
        })
        .collect();
    let per_second = plot::line_chart(
        "Idle daemon CPU % per second, every run",
        "seconds",
        "% of a CPU",
        &series,
        &[],
    );
    plot::stack(&[cpu, threads, add, per_second])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_the_name() {
        let line = "42 (qs worker) S 1 42 42 0 -1 4194560 100 0 0 0 17 5 0 0 20 0 6 0";
        assert_eq!(stat_ticks(line), Some(22));
    }

    #[test]
    fn schedstat_first_field_is_cpu_ns() {
        assert_eq!(schedstat_ns("37143548 1204 17\n"), Some(37_143_548));
        assert_eq!(schedstat_ns(""), None);
    }

    #[test]
    fn context_switches_add_both_kinds() {
        let status =
            "Name:\tqs-qos\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t3\n";
        assert_eq!(ctx_switches(status), 123);
    }

    #[test]
    fn svg_has_every_count() {
        let s = |ports, cpu| Summary {
            ports,
            idle_cpu_pct: cpu,
            idle_cpu_pct_min: cpu,
            idle_cpu_pct_max: cpu,
            threads: 6,
            port_add_ms: 1.0,
        };
        let svg = svg(&[s(10, 0.1), s(1000, 0.5)], &[]);
        assert!(svg.starts_with("<svg") && svg.contains("1000 ports") && !svg.contains("NaN"));
    }
}
