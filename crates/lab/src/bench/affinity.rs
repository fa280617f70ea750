//! `affinity`: does it matter which CPU the switch's worker runs on, relative to the
//! processes talking through it? (Seed 003: the same request/response workload pinned to one
//! CPU or spread over two; across CPUs, context switches rose 10-50× and throughput fell.)
//!
//! One TCP connection of 64-byte request/response transactions (`qswitch load rr`, like
//! `ab -c 1`) between two namespaces, client and server pinned to the first CPU:
//! - `qswitch same-cpu`: the one worker on that CPU too;
//! - `qswitch cross-cpu`: the one worker on the second CPU;
//! - `bridge same-cpu` / `bridge cross-cpu`: the Linux bridge, client and server on one CPU
//!   or on two (the seed's own comparison, with the kernel doing the switching);
//! - `tap-relay same-cpu`: `qswitch load relay` between two TAPs, its thread on that CPU too:
//!   the reference for any userspace switch with TAP ports (no lookup, only the TAP I/O and
//!   the thread's wake-ups);
//! - `tc-redirect same-cpu`: veths whose root ends hand frames straight to each other (tc
//!   `mirred`): the reference for the least forwarding the kernel does;
//! - `qswitch-veth same-cpu`: qswitch with veth ports (kernel fast path) instead of TAPs,
//!   its worker on that CPU.
//!
//! Reports transactions/s and context switches/s (machine and qswitch workers) and prints
//! placement advice from the qswitch pair.

use super::txn::{self, TxnReport};
use super::{
    setup_bridge, setup_qswitch, setup_redirect, setup_relay, setup_veth, Bench, Topology,
};
use crate::netns;

const NAMES: [&str; 7] = [
    "qswitch same-cpu",
    "qswitch cross-cpu",
    "bridge same-cpu",
    "bridge cross-cpu",
    "tap-relay same-cpu",
    "tc-redirect same-cpu",
    "qswitch-veth same-cpu",
];
/// The ratios printed: each same-CPU contender against the bridge on one CPU.
const RATIOS: [(usize, usize); 4] = [(0, 2), (4, 2), (5, 2), (6, 2)];
const UNIT: &str = "transactions/s";

pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ss", "iproute2"),
        ("taskset", "util-linux"),
    ] {
        netns::ensure_tool(tool, pkg)?;
    }
    let cpus = qswitch_sys::thread::online_cpus()?;
    let [near, far, ..] = cpus[..] else {
        anyhow::bail!("affinity needs at least two online CPUs");
    };
    let (runs, seconds) = (b.args.runs, b.args.seconds);
    let order = super::schedule(b, "affinity", &NAMES)?;
    b.say(format_args!(
        "{runs} round(s) of {} contenders, {seconds} s each; endpoints on CPU {near}, \
         the other CPU is {far}",
        NAMES.len()
    ));
    let mut results = Vec::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = NAMES[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<18}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let (topo, cpus): (Box<dyn Topology>, _) = match c {
            0 => (
                Box::new(setup_qswitch(b.id, &near.to_string())?),
                (near, near),
            ),
            1 => (
                Box::new(setup_qswitch(b.id, &far.to_string())?),
                (near, near),
            ),
            2 => (Box::new(setup_bridge(b.id)?), (near, near)),
            3 => (Box::new(setup_bridge(b.id)?), (far, near)),
            4 => (Box::new(setup_relay(b.id, Some(near))?), (near, near)),
            5 => (Box::new(setup_redirect(b.id)?), (near, near)),
            _ => (Box::new(setup_veth(b.id, &near.to_string())?), (near, near)),
        };
        let r = txn::load_run(
            b,
            topo.as_ref(),
            (name, round + 1, seq + 1),
            (Some(cpus.0), Some(cpus.1)),
            &["rr", "--size", "64"],
        )?;
        drop(topo);
        println!("{}", txn::run_line(&r, UNIT));
        results.push(r);
    }
    let summary = txn::summarise(&NAMES, &results);
    let title = format!("affinity (64 B request/response, {seconds} s, {runs} runs each)");
    let ratios = txn::ratios(&summary, &RATIOS);
    txn::print_table("affinity", &title, UNIT, &summary, &ratios);
    txn::warn_if_busy(&results);
    let advice = advice(&summary);
    for a in &advice {
        println!("advice: {a}");
    }
    let svg = txn::svg("affinity", UNIT, &summary, &results);
    let report = TxnReport {
        scenario: "affinity".into(),
        unit: UNIT.into(),
        config: serde_json::json!({
            "runs": runs,
            "seconds": seconds,
            "endpoint_cpu": near,
            "other_cpu": far,
            "request_bytes": 64,
            "contenders": NAMES,
            "order": order.iter().map(|&(_, c)| NAMES[c]).collect::<Vec<_>>(),
            "qswitch_version": env!("CARGO_PKG_VERSION"),
            "cpus": cpus.len(),
        }),
        runs: results,
        summary,
        ratios,
        advice,
    };
    super::write_results(&b.args.out, &report.scenario, &report, &svg)
}

/// What the qswitch pair says about where to put the worker.
fn advice(s: &[txn::TxnSummary]) -> Vec<String> {
    let (Some(same), Some(cross)) = (s.first(), s.get(1)) else {
        return vec![];
    };
    if same.rate_median <= 0.0 || cross.rate_median <= 0.0 {
        return vec![];
    }
    let gain = same.rate_median / cross.rate_median;
    let per_txn = |s: &txn::TxnSummary| s.ctx_switches_ps_median / s.rate_median;
    let mut v = vec![format!(
        "worker on the endpoints' CPU: {:.0} vs {:.0} transactions/s on another CPU ({:+.0}%); \
         context switches per transaction {:.1} vs {:.1}",
        same.rate_median,
        cross.rate_median,
        (gain - 1.0) * 100.0,
        per_txn(same),
        per_txn(cross),
    )];
    v.push(if gain > 1.05 {
        "for latency-bound request/response traffic, give the worker the CPU the endpoints \
         (vCPUs) run on, or keep them on the same core's siblings"
            .into()
    } else if gain < 0.95 {
        "keep the worker off the endpoints' CPU: sharing it costs more than the cross-CPU \
         wake-ups (the poll loop competes with the endpoints)"
            .into()
    } else {
        "placement made no measurable difference here (within 5%)".into()
    });
    v
}
