//! Transaction-rate runs for `affinity` and `multiqueue`: `qswitch load` (see
//! [`crate::load`]) between two namespaces, with the machine's busy CPUs and context
//! switches, and the qswitch workers' rates, sampled every second.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use super::{median, Bench, Topology};
use crate::netns::{self, LabDaemon};
use crate::plot::{self, Series};
use crate::procstat;
use crate::run::Run;

/// TCP port the load server listens on.
pub const PORT: u16 = 5300;

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct TxnSample {
    pub t_s: f64,
    /// Transactions (or files) completed in this second.
    pub rate: f64,
    pub busy_cpus: f64,
    /// Context switches per second, whole machine.
    pub ctx_switches_ps: f64,
    /// Context switches per second, qswitch workers only.
    pub worker_ctx_switches_ps: Option<f64>,
    pub worker_busy_pct: Option<Vec<f64>>,
}

/// What one run measured (the scenario part of a [`Run`]).
#[derive(Debug, Clone, Serialize)]
pub struct TxnMetrics {
    /// Per second, over the whole run.
    pub rate: f64,
    pub busy_cpus: f64,
    pub idle_busy_cpus: f64,
    pub ctx_switches_ps: f64,
    pub worker_ctx_switches_ps: Option<f64>,
    pub worker_busy_pct: Option<Vec<f64>>,
}

/// One run of one contender: [`TxnMetrics`] and a [`TxnSample`] per second.
pub type TxnRun = Run<TxnMetrics, TxnSample>;

/// Medians of one contender.
#[derive(Debug, Clone, Serialize)]
pub struct TxnSummary {
    pub contender: String,
    pub runs: usize,
    pub rate_median: f64,
    pub rate_min: f64,
    pub rate_max: f64,
    pub ctx_switches_ps_median: f64,
    pub worker_ctx_switches_ps_median: Option<f64>,
    pub busy_cpus_median: f64,
}

/// What `OUT/SCENARIO.json` holds.
#[derive(Debug, Serialize)]
pub struct TxnReport {
    pub scenario: String,
    /// What `rate` counts, e.g. "transactions/s".
    pub unit: String,
    pub config: serde_json::Value,
    pub runs: Vec<TxnRun>,
    pub summary: Vec<TxnSummary>,
    /// Median rates divided ([`ratios`]); empty where the scenario compares none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ratios: Vec<TxnRatio>,
    pub advice: Vec<String>,
}

/// One contender's median rate over another's.
#[derive(Debug, Clone, Serialize)]
pub struct TxnRatio {
    pub of: String,
    pub rate: f64,
}

/// `summary[a]` over `summary[b]` for each pair whose contenders both ran.
pub fn ratios(summary: &[TxnSummary], pairs: &[(usize, usize)]) -> Vec<TxnRatio> {
    pairs
        .iter()
        .filter_map(|&(a, b)| {
            let (a, b) = (summary.get(a)?, summary.get(b)?);
            (a.runs > 0 && b.runs > 0 && b.rate_median > 0.0).then(|| TxnRatio {
                of: format!("{} / {}", a.contender, b.contender),
                rate: a.rate_median / b.rate_median,
            })
        })
        .collect()
}

/// `taskset -c CPU` in front of `args` when `cpu` is given.
fn pinned(cpu: Option<usize>, args: Vec<String>) -> Vec<String> {
    match cpu {
        Some(c) => ["taskset".to_string(), "-c".into(), c.to_string()]
            .into_iter()
            .chain(args)
            .collect(),
        None => args,
    }
}

/// One `qswitch load` run over `topo`: the server (pinned to `server_cpu`), 1 s idle, then
/// the client (pinned to `client_cpu`) with `client_args` (e.g. `rr --size 64`) for the
/// bench's `--seconds`. Prints a dot per second.
pub fn load_run(
    b: &Bench,
    topo: &dyn Topology,
    (contender, round, seq): (&str, u32, usize),
    (server_cpu, client_cpu): (Option<usize>, Option<usize>),
    client_args: &[&str],
) -> anyhow::Result<TxnRun> {
    let exe = std::env::current_exe().context("cannot find the qswitch binary")?;
    let exe = exe.display().to_string();
    let addr = format!("{}:{PORT}", topo.server_addr());
    let server_args = pinned(
        server_cpu,
        vec![
            exe.clone(),
            "load".into(),
            "server".into(),
            "--listen".into(),
            addr.clone(),
        ],
    );
    let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let _server = topo.server().spawn(&server_args, Stdio::null())?;
    if let Err(e) = netns::wait_listening(topo.server(), PORT) {
        b.check()?;
        return Err(e);
    }
    let idle_from = procstat::cpu_jiffies();
    b.sleep(Duration::from_secs(1))?;
    let idle_busy_cpus = procstat::busy_cpus(idle_from, procstat::cpu_jiffies());

    let seconds = b.args.seconds;
    let mut args = vec![exe, "load".into()];
    args.extend(client_args.iter().map(|s| s.to_string()));
    args.extend([
        "--connect".into(),
        addr,
        "--seconds".into(),
        seconds.to_string(),
    ]);
    let args = pinned(client_cpu, args);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = topo.daemon().map(LabDaemon::stats).transpose()?;
    let m0 = procstat::read();
    let (cpu0, cs0) = (m0.jiffies(), m0.ctxt);
    let mut client = topo.client().spawn(&args, Stdio::piped())?;
    let t0 = Instant::now();
    let (mut prev_cpu, mut prev_cs, mut prev_stats) = (cpu0, cs0, first.clone());
    let mut ticks = Vec::new();
    for k in 1u32.. {
        b.check()?;
        let next = t0 + Duration::from_secs(u64::from(k));
        if client
            .wait_timeout(next.saturating_duration_since(Instant::now()))?
            .is_some()
        {
            break;
        }
        if t0.elapsed() > Duration::from_secs(u64::from(seconds) + 20) {
            bail!("the load client did not finish");
        }
        let m = procstat::read();
        let (cpu, cs) = (m.jiffies(), m.ctxt);
        let dt = 1.0;
        let rates = match (topo.daemon(), &prev_stats) {
            (Some(d), Some(prev)) => {
                let cur = d.stats()?;
                let r = qswitch_api::request::Rates::between(prev, &cur);
                prev_stats = Some(cur);
                Some(r)
            }
            _ => None,
        };
        ticks.push((
            procstat::busy_cpus(prev_cpu, cpu),
            cs.saturating_sub(prev_cs) as f64 / dt,
            rates,
        ));
        (prev_cpu, prev_cs) = (cpu, cs);
        print!(".");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    b.check()?;
    let elapsed = t0.elapsed().as_secs_f64();
    let busy_cpus = procstat::busy_cpus(cpu0, procstat::cpu_jiffies());
    let ctx_switches_ps = procstat::machine_ctxt().saturating_sub(cs0) as f64 / elapsed;
    let totals = match (topo.daemon(), &first) {
        (Some(d), Some(f)) => Some(qswitch_api::request::Rates::between(f, &d.stats()?)),
        _ => None,
    };
    let child = client.0.as_mut().context("no client")?;
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut s) = child.stdout.take() {
        s.read_to_string(&mut out)?;
    }
    if let Some(mut s) = child.stderr.take() {
        s.read_to_string(&mut err)?;
    }
    let json: serde_json::Value = serde_json::from_str(out.trim())
        .with_context(|| format!("the load client printed no result ({})", err.trim()))?;
    let total = json["total"].as_f64().unwrap_or(0.0);
    if total == 0.0 {
        bail!("{contender}: no transaction completed ({})", err.trim());
    }
    let per_second: Vec<f64> = json["per_second"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_f64()).collect())
        .unwrap_or_default();
    let samples = per_second
        .iter()
        .enumerate()
        .map(|(i, &rate)| {
            let tick = ticks.get(i);
            let r = tick.and_then(|t| t.2.as_ref());
            TxnSample {
                t_s: i as f64 + 1.0,
                rate,
                busy_cpus: tick.map_or(0.0, |t| t.0),
                ctx_switches_ps: tick.map_or(0.0, |t| t.1),
                worker_ctx_switches_ps: r
                    .map(|r| r.workers.iter().map(|w| w.ctx_switches_ps).sum()),
                worker_busy_pct: r.map(|r| r.workers.iter().map(|w| w.busy_pct).collect()),
            }
        })
        .collect();
    Ok(Run {
        contender: contender.to_string(),
        round,
        seq,
        metrics: TxnMetrics {
            rate: total / f64::from(seconds),
            busy_cpus,
            idle_busy_cpus,
            ctx_switches_ps,
            worker_ctx_switches_ps: totals
                .as_ref()
                .map(|t| t.workers.iter().map(|w| w.ctx_switches_ps).sum()),
            worker_busy_pct: totals
                .as_ref()
                .map(|t| t.workers.iter().map(|w| w.busy_pct).collect()),
        },
        samples,
    })
}

/// One line about a finished run.
pub fn run_line(r: &TxnRun, unit: &str) -> String {
    let mut s = format!(
        " {:>9.0} {unit}  busy {:.2} CPUs  {:>7.0} cs/s (machine)",
        r.rate, r.busy_cpus, r.ctx_switches_ps
    );
    if let Some(cs) = r.worker_ctx_switches_ps {
        s.push_str(&format!("  {cs:.0} cs/s (workers)"));
    }
    s
}

/// Per-contender medians in the order of `names`.
pub fn summarise(names: &[&str], runs: &[TxnRun]) -> Vec<TxnSummary> {
    names
        .iter()
        .map(|&name| {
            let mine: Vec<&TxnRun> = runs.iter().filter(|r| r.contender == name).collect();
            let v: Vec<f64> = mine.iter().map(|r| r.rate).collect();
            let w: Vec<f64> = mine
                .iter()
                .filter_map(|r| r.worker_ctx_switches_ps)
                .collect();
            TxnSummary {
                contender: name.to_string(),
                runs: mine.len(),
                rate_median: median(&v),
                rate_min: v.iter().copied().fold(f64::INFINITY, f64::min),
                rate_max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                ctx_switches_ps_median: median(
                    &mine.iter().map(|r| r.ctx_switches_ps).collect::<Vec<_>>(),
                ),
                worker_ctx_switches_ps_median: (!w.is_empty()).then(|| median(&w)),
                busy_cpus_median: median(&mine.iter().map(|r| r.busy_cpus).collect::<Vec<_>>()),
            }
        })
        .collect()
}

/// The table (with a row per ratio) and `RESULT` lines.
pub fn print_table(
    scenario: &str,
    title: &str,
    unit: &str,
    summary: &[TxnSummary],
    ratios: &[TxnRatio],
) {
    println!();
    println!("{title}");
    println!(
        "  {:<42}{:<28}{:>14}{:>14}",
        "",
        format!("{unit} (median [min-max])"),
        "cs/s machine",
        "cs/s workers"
    );
    for s in summary.iter().filter(|s| s.runs > 0) {
        let v = format!("{:.0} [{:.0}-{:.0}]", s.rate_median, s.rate_min, s.rate_max);
        let w = s
            .worker_ctx_switches_ps_median
            .map_or("-".to_string(), |w| format!("{w:.0}"));
        println!(
            "  {:<42}{v:<28}{:>14.0}{w:>14}",
            s.contender, s.ctx_switches_ps_median
        );
    }
    for r in ratios {
        println!("  {:<48}{:.2}", format!("ratio {}", r.of), r.rate);
    }
    println!();
    for s in summary.iter().filter(|s| s.runs > 0) {
        println!(
            "RESULT {scenario} {} rate={:.1} ctx_switches_ps={:.0}",
            s.contender.replace(' ', "_"),
            s.rate_median,
            s.ctx_switches_ps_median
        );
    }
    for r in ratios {
        println!(
            "RESULT {scenario} {} rate_ratio={:.3}",
            r.of.replace(" / ", "/").replace(' ', "_"),
            r.rate
        );
    }
}

/// Bars (median rate with ranges; context switches) and per-second lines.
pub fn svg(title: &str, unit: &str, summary: &[TxnSummary], runs: &[TxnRun]) -> String {
    let rate = plot::bar_chart_with_ranges(
        &format!("{title}: median {unit} (whiskers: min-max; higher is better)"),
        unit,
        &[(
            String::new(),
            summary
                .iter()
                .map(|s| (s.contender.clone(), s.rate_median))
                .collect(),
        )],
        &[summary.iter().map(|s| (s.rate_min, s.rate_max)).collect()],
    );
    let cs = plot::bar_chart(
        "Context switches per second, whole machine (median)",
        "switches/s",
        &[(
            String::new(),
            summary
                .iter()
                .map(|s| (s.contender.clone(), s.ctx_switches_ps_median))
                .collect(),
        )],
    );
    let series: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            name: format!("{} run {} (#{})", r.contender, r.round, r.seq),
            points: r.samples.iter().map(|s| (s.t_s, s.rate)).collect(),
        })
        .collect();
    let lines = plot::line_chart(
        &format!("{unit} per second, every run"),
        "seconds",
        unit,
        &series,
        &[],
    );
    plot::stack(&[rate, cs, lines])
}

/// Warns about runs that began on a busy machine.
pub fn warn_if_busy(runs: &[TxnRun]) {
    super::warn_busy_before("run(s)", runs.iter().map(|r| (r.seq, r.idle_busy_cpus)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_and_svg() {
        let run = |c: &str, rate: f64| Run {
            contender: c.into(),
            round: 1,
            seq: 1,
            metrics: TxnMetrics {
                rate,
                busy_cpus: 1.0,
                idle_busy_cpus: 0.0,
                ctx_switches_ps: 1000.0,
                worker_ctx_switches_ps: Some(10.0),
                worker_busy_pct: None,
            },
            samples: vec![TxnSample {
                t_s: 1.0,
                rate,
                busy_cpus: 1.0,
                ctx_switches_ps: 5.0,
                worker_ctx_switches_ps: None,
                worker_busy_pct: None,
            }],
        };
        let runs = [
            run("a", 10.0),
            run("a", 30.0),
            run("a", 20.0),
            run("b", 5.0),
        ];
        let s = summarise(&["a", "b"], &runs);
        assert_eq!(
            (s[0].rate_median, s[0].rate_min, s[0].rate_max),
            (20.0, 10.0, 30.0)
        );
        assert_eq!(s[0].worker_ctx_switches_ps_median, Some(10.0));
        let svg = svg("t", "tx/s", &s, &runs);
        assert!(svg.starts_with("<svg") && !svg.contains("NaN"));
    }

    #[test]
    fn taskset_prefix() {
        assert_eq!(
            pinned(Some(1), vec!["x".into()]),
            ["taskset", "-c", "1", "x"]
        );
        assert_eq!(pinned(None, vec!["x".into()]), ["x"]);
    }
}
