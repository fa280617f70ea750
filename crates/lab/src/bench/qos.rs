//! `qswitch bench qos`: the seed-001 port-QoS scenario (Hyper-V's 7 steps), reproduced.
//!
//! ```text
//!  netns host1 ─ TAP ─┐
//!  netns host2 ─ TAP ─┤
//!  netns vm1   ─ TAP ─┤   qswitch (1 worker)   ┌─ TAP (uplink, capacity 1G) ─ netns rx
//!  netns vm2   ─ TAP ─┼──────────────────────▶─┤                               6 iperf3 -s
//!  netns vm3   ─ TAP ─┤                        └
//!  netns vm4   ─ TAP ─┘   one iperf3 TCP stream per sender, for the whole run
//! ```
//!
//! The steps change settings live (`qos set`) while the streams run: (1) no QoS; (2) max
//! 100M on host1 and host2; (3)–(6) min 100M, 200M, 300M, 400M on vm1 and vm2; (7) min 150M
//! on all six (host limits removed). At step 6 a guarantee that would lift the sum above 90%
//! of the uplink is tried and must be refused.
//!
//! Every port's rate is sampled each second (qswitch's own metering: L2 bits/s, TSO segments
//! counted as the frames they become). A step passes on the medians of its samples after its
//! first second: every guarantee ≥ 95% met, every limit within 102%, every port ≥ 90% of its
//! allocation a_i by the rule (all senders greedy), and the link used ≥ 95%.
//!
//! Writes `OUT/qos.json` (steps, medians, expected, checks), `OUT/qos.csv` (one row per
//! second) and `OUT/qos.svg` (Mbit/s per port over time, steps marked). Fails when a
//! criterion fails.

use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use qswitch_api::request::QosReport;
use qswitch_api::{Request, Response};
use qswitch_dp::control::qos::alloc::{allocate, Claim};
use serde::Serialize;

use super::{median, Bench, RemoveDir};
use crate::netns::{self, ChildGuard, LabDaemon, Netns};
use crate::plot::{self, Series};
use crate::procstat;

/// The senders, in the seed's order.
pub const SENDERS: [&str; 6] = ["host1", "host2", "vm1", "vm2", "vm3", "vm4"];
/// Uplink capacity, bits/s.
pub const CAPACITY: u64 = 1_000_000_000;
const M: u64 = 1_000_000;

/// One `qos set`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Set {
    pub port: &'static str,
    pub min: Option<u64>,
    pub max: Option<u64>,
    pub clear: bool,
}

fn set(port: &'static str, min: Option<u64>, max: Option<u64>, clear: bool) -> Set {
    Set {
        port,
        min,
        max,
        clear,
    }
}

/// The steps: (label, settings changes in order).
pub fn steps() -> Vec<(&'static str, Vec<Set>)> {
    let mins = |m: u64| {
        vec![
            set("vm1", Some(m * M), None, false),
            set("vm2", Some(m * M), None, false),
        ]
    };
    let mut last = vec![
        set("vm1", Some(150 * M), None, true),
        set("vm2", Some(150 * M), None, true),
    ];
    for p in ["host1", "host2", "vm3", "vm4"] {
        last.push(set(p, Some(150 * M), None, true));
    }
    vec![
        (
            "1 no QoS",
            SENDERS.iter().map(|p| set(p, None, None, true)).collect(),
        ),
        (
            "2 max 100M host1,2",
            vec![
                set("host1", None, Some(100 * M), false),
                set("host2", None, Some(100 * M), false),
            ],
        ),
        ("3 min 100M vm1,2", mins(100)),
        ("4 min 200M vm1,2", mins(200)),
        ("5 min 300M vm1,2", mins(300)),
        ("6 min 400M vm1,2", mins(400)),
        ("7 min 150M all", last),
    ]
}

/// Settings of every sender after applying `sets` to `cur`.
fn apply(cur: &mut [(Option<u64>, Option<u64>); 6], sets: &[Set]) {
    for s in sets {
        let i = SENDERS.iter().position(|p| *p == s.port).unwrap_or(0);
        if s.clear {
            cur[i] = (None, None);
        }
        if s.min.is_some() {
            cur[i].0 = s.min;
        }
        if s.max.is_some() {
            cur[i].1 = s.max;
        }
    }
}

/// a_i by the rule for greedy senders.
fn expected(cur: &[(Option<u64>, Option<u64>); 6]) -> Vec<f64> {
    let claims: Vec<Claim> = cur
        .iter()
        .map(|(min, max)| Claim {
            demand: f64::INFINITY,
            min: min.unwrap_or(0) as f64,
            max: max.map_or(f64::INFINITY, |m| m as f64),
            weight: 1.0,
        })
        .collect();
    let mut out = vec![0.0; claims.len()];
    allocate(CAPACITY as f64, &claims, &mut out, &mut Vec::new());
    out
}

/// One second of the run.
#[derive(Debug, Clone, Serialize)]
pub struct QosSample {
    /// Seconds since the first step began (end of the sampled second).
    pub t_s: f64,
    /// 1-based step.
    pub step: usize,
    /// Whether the sample counts for its step (taken after the step's first second).
    pub counted: bool,
    /// Mbit/s per sender, in [`SENDERS`] order.
    pub mbps: Vec<f64>,
    /// Allocation per sender, Mbit/s.
    pub alloc_mbps: Vec<f64>,
}

/// One step's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct StepResult {
    pub step: usize,
    pub label: String,
    pub samples: usize,
    /// Per sender: (min, max) settings in Mbit/s.
    pub min_mbps: Vec<Option<f64>>,
    pub max_mbps: Vec<Option<f64>>,
    /// a_i by the rule, Mbit/s.
    pub expected_mbps: Vec<f64>,
    /// Median per sender, Mbit/s.
    pub median_mbps: Vec<f64>,
    /// Median of the per-second sums, Mbit/s.
    pub link_mbps: f64,
    pub failures: Vec<String>,
}

/// What `qos.json` holds.
#[derive(Debug, Serialize)]
pub struct QosResult {
    pub scenario: &'static str,
    pub seconds_per_step: u32,
    pub capacity_mbps: f64,
    pub senders: Vec<&'static str>,
    pub steps: Vec<StepResult>,
    /// The over-reservation attempt at step 6: refused, with this message.
    pub refused: Option<String>,
    /// iperf3 retransmits per sender over the whole run.
    pub retransmits: Vec<Option<u64>>,
    /// CPU the qswitch process used over the steps, in CPUs (1.0 = one core busy).
    pub qswitch_cpus: f64,
    /// Machine busy CPUs over the steps (everything, also other processes).
    pub machine_busy_cpus: f64,
    pub samples: Vec<QosSample>,
    pub pass: bool,
}

/// Field order is drop order: the clients and servers stop, then the daemon, then the
/// namespaces go.
struct Lab {
    clients: Vec<ChildGuard>,
    _servers: Vec<ChildGuard>,
    daemon: LabDaemon,
    senders: Vec<Netns>,
    rx: Netns,
    _dir: RemoveDir,
}

const RX_ADDR: &str = "10.97.0.100";

fn config(control: &str, workers: &str, n: u32) -> String {
    let mut s = format!(
        "[switch]\nworkers = \"{workers}\"\ncontrol = \"{control}\"\nreservable = 0.9\n\n\
         [[port]]\nname = \"uplink\"\ntype = \"tap\"\nifname = \"qsq{n}up\"\ncapacity = \"1G\"\n"
    );
    for (i, p) in SENDERS.iter().enumerate() {
        s.push_str(&format!(
            "\n[[port]]\nname = \"{p}\"\ntype = \"tap\"\nifname = \"qsq{n}s{i}\"\n"
        ));
    }
    s
}

fn setup(b: &Bench) -> anyhow::Result<Lab> {
    let id = b.id;
    let n = id % 10_000;
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-qos-{id}")));
    let control = dir.0.join("control.sock");
    // One worker, on the last CPU: the senders and the receiver share the rest.
    let cpus = qswitch_sys::thread::online_cpus()?;
    let workers = cpus.last().context("no online CPUs")?.to_string();
    let rx = Netns::create(&format!("qsq-rx-{id}"))?;
    let mut senders = Vec::new();
    for p in SENDERS {
        senders.push(Netns::create(&format!("qsq-{p}-{id}"))?);
    }
    let daemon = LabDaemon::start(&dir.0, &config(&control.display().to_string(), &workers, n))?;
    let mut lab = Lab {
        clients: Vec::new(),
        _servers: Vec::new(),
        daemon,
        senders,
        rx,
        _dir: dir,
    };
    lab.rx
        .adopt(&format!("qsq{n}up"), &format!("{RX_ADDR}/24"))?;
    for (i, ns) in lab.senders.iter().enumerate() {
        ns.adopt(&format!("qsq{n}s{i}"), &format!("10.97.0.{}/24", i + 1))?;
    }
    for i in 0..SENDERS.len() {
        let port = (5201 + i).to_string();
        lab._servers.push(
            lab.rx
                .spawn(&["iperf3", "-s", "-p", &port, "-B", RX_ADDR], Stdio::null())?,
        );
    }
    for i in 0..SENDERS.len() {
        netns::wait_listening(&lab.rx, 5201 + i as u16)?;
    }
    Ok(lab)
}

fn qos_show(d: &LabDaemon) -> anyhow::Result<QosReport> {
    match qswitch_api::client::call(&d.control, &Request::QosShow)? {
        Response::Qos(r) => Ok(*r),
        _ => bail!("unexpected reply to qos show"),
    }
}

fn qos_set(d: &LabDaemon, s: &Set) -> anyhow::Result<()> {
    qswitch_api::client::call(
        &d.control,
        &Request::QosSet {
            port: s.port.to_string(),
            min: s.min,
            max: s.max,
            weight: None,
            clear: s.clear,
        },
    )
    .with_context(|| format!("qos set {}", s.port))?;
    Ok(())
}

/// Runs the scenario and writes its results to `b.args.out`.
pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [("ip", "iproute2"), ("ss", "iproute2"), ("iperf3", "iperf3")] {
        netns::ensure_tool(tool, pkg)?;
    }
    let secs = b.args.seconds.max(4);
    let steps = steps();
    b.say(format_args!(
        "7 steps of {secs} s, 6 TCP senders sharing a 1 Gbit/s uplink; sampling every second"
    ));
    let mut lab = setup(b)?;
    let total = secs * steps.len() as u32 + 4;
    for (i, ns) in lab.senders.iter().enumerate() {
        let (port, t) = ((5201 + i).to_string(), total.to_string());
        let args = [
            "iperf3",
            "-c",
            RX_ADDR,
            "-p",
            &port,
            "-t",
            &t,
            "-J",
            "--connect-timeout",
            "3000",
        ];
        lab.clients.push(ns.spawn(&args, Stdio::piped())?);
    }
    // Drain the clients' stdout (their JSON comes at the end).
    let mut outs = Vec::new();
    for c in &mut lab.clients {
        let out = c.0.as_mut().and_then(|c| c.stdout.take());
        outs.push(std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut o) = out {
                let _ = o.read_to_end(&mut v);
            }
            v
        }));
    }
    b.sleep(Duration::from_secs(1))?;

    let cpu0 = (lab.daemon.stats()?.process_cpu_ns, procstat::cpu_jiffies());
    let mut cur = [(None, None); 6];
    let mut samples: Vec<QosSample> = Vec::new();
    let mut bounds = Vec::new();
    let mut refused = None;
    let t0 = Instant::now();
    let mut seen = qos_show(&lab.daemon)?.seconds;
    for (k, (label, sets)) in steps.iter().enumerate() {
        let start = t0.elapsed().as_secs_f64();
        bounds.push(start);
        for s in sets {
            qos_set(&lab.daemon, s)?;
        }
        apply(&mut cur, sets);
        if k == 5 {
            // 800M reserved on a 900M reservable: 200M more must be refused.
            let over = set("vm3", Some(200 * M), None, false);
            refused = match qos_set(&lab.daemon, &over) {
                Ok(()) => None,
                Err(e) => Some(format!("{:#}", e)),
            };
            let r = qos_show(&lab.daemon)?;
            let vm3 = r.ports.iter().find(|p| p.name == "vm3");
            if refused.is_none() || vm3.is_some_and(|p| p.min.is_some()) {
                refused = None;
                b.say("qos set vm3 --min 200M was NOT refused at step 6");
            }
        }
        b.say_start(format_args!("step {label:<20}"));
        let end = start + f64::from(secs);
        while t0.elapsed().as_secs_f64() < end {
            b.sleep(Duration::from_millis(200))?;
            let r = qos_show(&lab.daemon)?;
            if r.seconds == seen {
                continue;
            }
            seen = r.seconds;
            let t = t0.elapsed().as_secs_f64();
            let pick = |f: &dyn Fn(&qswitch_api::request::QosPort) -> f64| -> Vec<f64> {
                SENDERS
                    .iter()
                    .map(|n| r.ports.iter().find(|p| p.name == *n).map_or(0.0, f))
                    .collect()
            };
            samples.push(QosSample {
                t_s: t,
                step: k + 1,
                // The sampled second (ending ≤ 0.25 s before t) lies after the first second.
                counted: t - 1.25 >= start + 1.0,
                mbps: pick(&|p| p.rate_bps / 1e6),
                alloc_mbps: pick(&|p| p.alloc_last_second.unwrap_or(0) as f64 / 1e6),
            });
            print!(".");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        }
        let st: Vec<&QosSample> = samples
            .iter()
            .filter(|s| s.step == k + 1 && s.counted)
            .collect();
        let med: Vec<f64> = (0..6)
            .map(|i| median(&st.iter().map(|s| s.mbps[i]).collect::<Vec<_>>()))
            .collect();
        println!(
            " {}",
            SENDERS
                .iter()
                .zip(&med)
                .map(|(n, m)| format!("{n} {m:.0}"))
                .collect::<Vec<_>>()
                .join("  ")
        );
    }
    let wall = t0.elapsed().as_secs_f64();
    let qswitch_cpus =
        lab.daemon.stats()?.process_cpu_ns.saturating_sub(cpu0.0) as f64 / 1e9 / wall;
    let machine_busy_cpus = procstat::busy_cpus(cpu0.1, procstat::cpu_jiffies());
    for c in &mut lab.clients {
        let _ = c.wait_timeout(Duration::from_secs(8));
        c.stop();
    }
    let retransmits: Vec<Option<u64>> = outs
        .into_iter()
        .map(|h| {
            let v = h.join().unwrap_or_default();
            serde_json::from_slice::<serde_json::Value>(&v)
                .ok()
                .and_then(|j| j["end"]["sum_sent"]["retransmits"].as_u64())
        })
        .collect();
    drop(lab);

    let mut result = evaluate(secs, &steps, samples, refused, retransmits);
    result.qswitch_cpus = qswitch_cpus;
    result.machine_busy_cpus = machine_busy_cpus;
    b.say(format_args!(
        "qswitch used {qswitch_cpus:.2} CPUs; the machine was {machine_busy_cpus:.2} CPUs busy"
    ));
    write(b, &result, &bounds, &steps)?;
    for s in &result.steps {
        for f in &s.failures {
            b.say(format_args!("FAIL step {}: {f}", s.label));
        }
    }
    println!(
        "RESULT qos pass={} refused={} link_mbps={:?}",
        result.pass,
        result.refused.is_some(),
        result
            .steps
            .iter()
            .map(|s| s.link_mbps.round())
            .collect::<Vec<_>>()
    );
    if !result.pass {
        bail!("the qos scenario failed its criteria (see above)");
    }
    Ok(())
}

/// Applies the pass criteria to the samples of each step.
pub fn evaluate(
    secs: u32,
    steps: &[(&'static str, Vec<Set>)],
    samples: Vec<QosSample>,
    refused: Option<String>,
    retransmits: Vec<Option<u64>>,
) -> QosResult {
    let mut cur = [(None, None); 6];
    let mut out = Vec::new();
    let mbps = |v: Option<u64>| v.map(|x| x as f64 / 1e6);
    for (k, (label, sets)) in steps.iter().enumerate() {
        apply(&mut cur, sets);
        let exp: Vec<f64> = expected(&cur).iter().map(|a| a / 1e6).collect();
        let st: Vec<&QosSample> = samples
            .iter()
            .filter(|s| s.step == k + 1 && s.counted)
            .collect();
        let med: Vec<f64> = (0..6)
            .map(|i| median(&st.iter().map(|s| s.mbps[i]).collect::<Vec<_>>()))
            .collect();
        let link = median(&st.iter().map(|s| s.mbps.iter().sum()).collect::<Vec<_>>());
        let mut failures = Vec::new();
        if st.len() < 3 {
            failures.push(format!("only {} samples", st.len()));
        }
        for i in 0..6 {
            let (n, m) = (SENDERS[i], med[i]);
            if let Some(min) = mbps(cur[i].0) {
                if m < 0.95 * min {
                    failures.push(format!(
                        "{n}: {m:.1} Mbit/s < 95% of its guarantee {min:.0}"
                    ));
                }
            }
            if let Some(max) = mbps(cur[i].1) {
                if m > 1.02 * max {
                    failures.push(format!("{n}: {m:.1} Mbit/s > 102% of its limit {max:.0}"));
                }
            }
            if m < 0.90 * exp[i] {
                failures.push(format!(
                    "{n}: {m:.1} Mbit/s < 90% of its allocation {:.1}",
                    exp[i]
                ));
            }
        }
        let cap = CAPACITY as f64 / 1e6;
        if link < 0.95 * cap {
            failures.push(format!("link {link:.1} Mbit/s < 95% of {cap:.0}"));
        }
        out.push(StepResult {
            step: k + 1,
            label: label.to_string(),
            samples: st.len(),
            min_mbps: cur.iter().map(|c| mbps(c.0)).collect(),
            max_mbps: cur.iter().map(|c| mbps(c.1)).collect(),
            expected_mbps: exp,
            median_mbps: med,
            link_mbps: link,
            failures,
        });
    }
    let pass = refused.is_some() && out.iter().all(|s| s.failures.is_empty());
    QosResult {
        scenario: "qos",
        seconds_per_step: secs,
        capacity_mbps: CAPACITY as f64 / 1e6,
        senders: SENDERS.to_vec(),
        steps: out,
        refused,
        retransmits,
        qswitch_cpus: 0.0,
        machine_busy_cpus: 0.0,
        samples,
        pass,
    }
}

fn write(
    b: &Bench,
    r: &QosResult,
    bounds: &[f64],
    steps: &[(&'static str, Vec<Set>)],
) -> anyhow::Result<()> {
    let out = &b.args.out;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut csv = String::from("t_s,step");
    for n in SENDERS {
        csv.push_str(&format!(",{n}_mbps"));
    }
    for n in SENDERS {
        csv.push_str(&format!(",{n}_alloc_mbps"));
    }
    csv.push('\n');
    for s in &r.samples {
        csv.push_str(&format!("{:.2},{}", s.t_s, s.step));
        for v in s.mbps.iter().chain(&s.alloc_mbps) {
            csv.push_str(&format!(",{v:.2}"));
        }
        csv.push('\n');
    }
    let series: Vec<Series> = SENDERS
        .iter()
        .enumerate()
        .map(|(i, n)| Series {
            name: n.to_string(),
            points: r.samples.iter().map(|s| (s.t_s, s.mbps[i])).collect(),
        })
        .chain(std::iter::once(Series {
            name: "link".into(),
            points: r
                .samples
                .iter()
                .map(|s| (s.t_s, s.mbps.iter().sum()))
                .collect(),
        }))
        .collect();
    // Short marker labels: the steps are 10 s (≈ 75 px) apart.
    const SHORT: [&str; 7] = [
        "1", "2 max100", "3 min100", "4 min200", "5 min300", "6 min400", "7 all150",
    ];
    let markers: Vec<(f64, String)> = bounds
        .iter()
        .zip(steps)
        .enumerate()
        .map(|(i, (&t, (l, _)))| (t, SHORT.get(i).map_or(*l, |s| *s).to_string()))
        .collect();
    let svg = plot::line_chart(
        "qswitch port QoS, seed-001 steps: 6 TCP senders, 1G uplink (steps: max on host1,2; min on vm1,2; min on all)",
        "time (s)",
        "Mbit/s (L2)",
        &series,
        &markers,
    );
    for (name, body) in [
        ("qos.json", serde_json::to_string_pretty(r)? + "\n"),
        ("qos.csv", csv),
        ("qos.svg", svg),
    ] {
        let p = out.join(name);
        std::fs::write(&p, body).with_context(|| format!("cannot write {}", p.display()))?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples at exactly a_i pass; a starved unreserved port, a missed guarantee and a
    /// broken limit each fail their step with a message naming the port.
    #[test]
    fn criteria() {
        let steps = steps();
        let mut cur = [(None, None); 6];
        let mut samples = Vec::new();
        for (k, (_, sets)) in steps.iter().enumerate() {
            apply(&mut cur, sets);
            let exp: Vec<f64> = expected(&cur).iter().map(|a| a / 1e6).collect();
            for s in 0..6 {
                let mut mbps = exp.clone();
                match k {
                    // Step 4: vm3 starved as in seed 001.
                    3 => mbps[4] = 90.0,
                    // Step 5: vm1's guarantee missed.
                    4 => mbps[2] = 280.0,
                    // Step 2: host1 over its limit.
                    1 => mbps[0] = 103.0,
                    _ => {}
                }
                samples.push(QosSample {
                    t_s: (k * 6 + s) as f64,
                    step: k + 1,
                    counted: s > 0,
                    mbps,
                    alloc_mbps: exp.clone(),
                });
            }
        }
        let r = evaluate(6, &steps, samples, Some("refused".into()), vec![None; 6]);
        assert!(!r.pass);
        let fails = |i: usize| r.steps[i].failures.join("; ");
        assert!(fails(0).is_empty() && fails(2).is_empty() && fails(6).is_empty());
        assert!(fails(1).contains("host1: 103.0 Mbit/s > 102% of its limit 100"));
        assert!(fails(3).contains("vm3: 90.0 Mbit/s < 90% of its allocation 200.0"));
        assert!(fails(4).contains("vm1: 280.0 Mbit/s < 95% of its guarantee 300"));
        assert_eq!(
            r.steps[5].expected_mbps,
            [50.0, 50.0, 400.0, 400.0, 50.0, 50.0]
        );
        assert_eq!(r.steps[5].samples, 5);
        // Without the refusal the run fails too.
        let r = evaluate(6, &steps, Vec::new(), None, Vec::new());
        assert!(!r.pass && r.steps[0].failures[0].contains("only 0 samples"));
    }
}
