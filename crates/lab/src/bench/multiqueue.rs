//! `multiqueue`: many small transfers through ports with 1 vs 4 queues (seed 004: a VM's
//! NIC with `queues=4` copied 1000 × 1 MB files about 20% faster, 1.5-2× elsewhere).
//!
//! Two namespaces joined by qswitch through multi-queue TAP ports (`queues = 1` or `4`, two
//! workers); `qswitch load files` sends 1 MB "files" from 8 threads, a new TCP connection per
//! file, so the kernel spreads the flows over the TAP's queues by hash and the switch's
//! workers share them. Reports files/s and the workers' busy %.
//!
//! No peer: the Linux bridge has no queues to configure. Guests (virtio-net with 1 vs 4
//! queue pairs) are the real thing; with QEMU in TCG mode here they would measure the
//! emulator, not the switch.

use super::txn::{self, TxnReport};
use super::{Bench, QswitchTopo, RemoveDir};
use crate::netns::{self, LabDaemon, Netns};

const NAMES: [&str; 2] = ["queues=1", "queues=4"];
const QUEUES: [u16; 2] = [1, 4];
const UNIT: &str = "files/s";
const PARALLEL: &str = "8";

fn setup(id: u32, workers: &str, queues: u16) -> anyhow::Result<QswitchTopo> {
    let n = id % 10_000;
    let (tap_a, tap_b) = (format!("qsmA{n}"), format!("qsmB{n}"));
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-mq-{id}")));
    let control = dir.0.join("control.sock");
    let text = crate::topology::config_queues(
        workers,
        &control.display().to_string(),
        &tap_a,
        &tap_b,
        queues,
    );
    let a = Netns::create(&format!("qsbench-mq-a-{id}"))?;
    let b = Netns::create(&format!("qsbench-mq-b-{id}"))?;
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

pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [("ip", "iproute2"), ("ss", "iproute2")] {
        netns::ensure_tool(tool, pkg)?;
    }
    let workers = crate::topology::worker_cpus(2)?;
    let (runs, seconds) = (b.args.runs, b.args.seconds);
    let order = super::schedule(b, "multiqueue", &NAMES)?;
    b.say(format_args!(
        "{runs} round(s) of {} and {}, {seconds} s each, {PARALLEL} parallel 1 MB transfers; \
         workers on CPUs {workers}",
        NAMES[0], NAMES[1]
    ));
    let mut results = Vec::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = NAMES[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<9}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let topo = setup(b.id, &workers, QUEUES[c])?;
        let r = txn::load_run(
            b,
            &topo,
            (name, round + 1, seq + 1),
            (None, None),
            &["files", "--size", "1048576", "--parallel", PARALLEL],
        )?;
        drop(topo);
        let busy = r
            .worker_busy_pct
            .as_ref()
            .map(|v| {
                v.iter()
                    .map(|b| format!("{b:.0}%"))
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_default();
        println!("{}  workers busy {busy}", txn::run_line(&r, UNIT));
        results.push(r);
    }
    let summary = txn::summarise(&NAMES, &results);
    let title = format!("multiqueue ({PARALLEL} x 1 MB transfers, {seconds} s, {runs} runs each)");
    txn::print_table("multiqueue", &title, UNIT, &summary, &[]);
    txn::warn_if_busy(&results);
    let mut advice = Vec::new();
    if let [one, four] = &summary[..] {
        if one.runs > 0 && four.runs > 0 && one.rate_median > 0.0 {
            let g = four.rate_median / one.rate_median;
            advice.push(format!(
                "4 queues vs 1: {:.2}x files/s ({:.1} vs {:.1}); the published result is \
                 1.2x (1.5-2x elsewhere)",
                g, four.rate_median, one.rate_median
            ));
        }
    }
    for a in &advice {
        println!("advice: {a}");
    }
    let svg = txn::svg("multiqueue", UNIT, &summary, &results);
    let report = TxnReport {
        scenario: "multiqueue".into(),
        unit: UNIT.into(),
        config: serde_json::json!({
            "runs": runs,
            "seconds": seconds,
            "parallel": PARALLEL,
            "file_bytes": 1 << 20,
            "queues": QUEUES,
            "workers": workers,
            "contenders": NAMES,
            "order": order.iter().map(|&(_, c)| NAMES[c]).collect::<Vec<_>>(),
            "qswitch_version": env!("CARGO_PKG_VERSION"),
        }),
        runs: results,
        summary,
        ratios: Vec::new(),
        advice,
    };
    super::write_results(&b.args.out, &report.scenario, &report, &svg)
}
