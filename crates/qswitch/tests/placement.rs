//! Placement end to end through the `qswitch` binary with gen ports (no root needed): operator
//! sets and overlap warnings, low-load coalescing with the freed worker asleep, high-load
//! spreading, and queue moves that lose and reorder nothing.
//!
//! Every test needs two CPUs and is skipped (with a notice; a failure under
//! `QSWITCH_REQUIRE_PRIVILEGED=1`) on a one-CPU machine.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{counter, qs, qs_json, request, wait_until, DaemonChild, TempDir};
use serde_json::Value;

/// Two online CPUs, or `None` (after [`common::skip`]) when there are fewer.
fn two_cpus() -> Option<[usize; 2]> {
    if !common::cpus_or_skip(2) {
        return None;
    }
    let cpus = common::online_cpus();
    Some([cpus[0], cpus[1]])
}

const SINK: &str = "[[port]]\nname = \"s\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:09\"\n";

/// A generator port `name` sending to the sink at `rate` frames/s (0: as fast as it can).
fn generator(name: &str, n: u8, rate: u64, extra: &str) -> String {
    format!(
        "[[port]]\nname = \"{name}\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:0{n}\"\n{extra}\
         generate = {{ dst = \"02:00:00:00:00:09\", size = 64, rate = {rate}, flows = 8 }}\n"
    )
}

fn start(dir: &TempDir, cpus: [usize; 2], switch_extra: &str, ports: &str) -> DaemonChild {
    let control = dir.join("c.sock");
    let text = format!(
        "[switch]\nworkers = \"{},{}\"\ncontrol = \"{}\"\n{switch_extra}\n{SINK}{ports}",
        cpus[0],
        cpus[1],
        control.display()
    );
    DaemonChild::start(dir.path(), "qs", &text, &control)
}

fn placement(control: &Path) -> Value {
    qs_json(control, &["placement", "--json"])
}

/// The worker of `port`'s rx queue `queue`.
fn worker_of(p: &Value, port: &str, queue: u64) -> Option<u64> {
    p["queues"]
        .as_array()?
        .iter()
        .find(|q| q["port"] == port && q["queue"] == queue)?["worker"]
        .as_u64()
}

/// The workers that have queues.
fn workers_in_use(p: &Value) -> Vec<u64> {
    let mut w: Vec<u64> = p["queues"]
        .as_array()
        .expect("placement.queues")
        .iter()
        .filter_map(|q| q["worker"].as_u64())
        .collect();
    w.sort_unstable();
    w.dedup();
    w
}

fn worker_cpu_ns(control: &Path, worker: u64) -> u64 {
    let s = qs_json(control, &["stats", "--json"]);
    s["workers"]
        .as_array()
        .expect("stats.workers")
        .iter()
        .find(|w| w["id"] == worker)
        .and_then(|w| w["cpu_ns"].as_u64())
        .expect("worker cpu_ns")
}

/// The sink port `s`: (received, lost, reordered), and what `generator` generated.
fn sink_of(control: &Path, generator: &str) -> (u64, u64, u64, u64) {
    let s = qs_json(control, &["stats", "--json"]);
    let k = &common::port_stats(&s, "s")["sink"];
    (
        k["received"].as_u64().unwrap_or(0),
        k["lost"].as_u64().unwrap_or(0),
        k["reordered"].as_u64().unwrap_or(0),
        counter(&s, generator, "generated"),
    )
}

#[test]
fn operator_sets_overlap_is_flagged_and_static_mode_stays_home() {
    let Some(cpus) = two_cpus() else { return };
    let dir = TempDir::new("plc-sets");
    let ports = format!(
        "{}{}",
        generator("a", 1, 1000, &format!("cpus = \"{}\"\n", cpus[0])),
        generator("b", 2, 1000, &format!("cpus = \"{}\"\n", cpus[0]))
    );
    let d = start(&dir, cpus, "placement = \"static\"", &ports);
    let p = placement(&d.control);
    assert_eq!(p["mode"], "static", "{p}");
    for port in ["a", "b"] {
        let q = p["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["port"] == port)
            .unwrap_or_else(|| panic!("no queue of {port}: {p}"));
        assert_eq!(q["cpu"].as_u64(), Some(cpus[0] as u64), "{p}");
        assert!(q["why"].as_str().unwrap().contains("operator's set"), "{p}");
    }
    let warnings = p["warnings"].to_string();
    assert!(warnings.contains("overlapping CPU sets"), "{p}");
    // Static: nothing moves, however long we wait (the balancer runs every 0.5 s).
    std::thread::sleep(Duration::from_millis(2000));
    let p = placement(&d.control);
    assert_eq!(workers_in_use(&p).len(), 1, "{p}");
    assert!(p["moves"].as_array().unwrap().is_empty(), "{p}");
    // The text form shows the warning and the reasons.
    let out = qs(&d.control, &["placement", "--explain"]);
    out.assert_ok("placement --explain");
    assert!(out.stdout.contains("warning: ports a and b"), "{out:?}");
    assert!(out.stdout.contains("why: operator's set"), "{out:?}");
    // Pin errors are one clear line.
    let out = qs(
        &d.control,
        &["placement", "pin", "a", "5", &cpus[1].to_string()],
    );
    assert_eq!(out.code, Some(1), "{out:?}");
    assert!(out.stderr.contains("has no rx queue 5"), "{out:?}");
    let out = qs(&d.control, &["placement", "pin", "a", "0", "4095"]);
    assert!(out.stderr.contains("no worker runs on CPU 4095"), "{out:?}");
}

#[test]
fn low_load_coalesces_onto_one_worker_and_the_other_sleeps() {
    let Some(cpus) = two_cpus() else { return };
    let dir = TempDir::new("plc-low");
    let ports = format!(
        "{}{}",
        generator("a", 1, 2000, ""),
        generator("b", 2, 2000, "")
    );
    let d = start(&dir, cpus, "", &ports);
    // Default sets are disjoint: one queue per worker to begin with.
    let p = placement(&d.control);
    assert_eq!(workers_in_use(&p).len(), 2, "{p}");
    let mut last = p;
    let coalesced = wait_until(Duration::from_secs(10), || {
        last = placement(&d.control);
        workers_in_use(&last).len() == 1
    });
    assert!(coalesced, "queues did not coalesce within 10 s: {last}");
    let busy = workers_in_use(&last)[0];
    let idle = 1 - busy;
    assert!(last["queues"].to_string().contains("coalesced"), "{last}");
    // The freed worker sleeps: under 1% of a CPU over 2 s.
    let t0 = Instant::now();
    let c0 = worker_cpu_ns(&d.control, idle);
    std::thread::sleep(Duration::from_secs(2));
    let c1 = worker_cpu_ns(&d.control, idle);
    let share = (c1 - c0) as f64 / t0.elapsed().as_nanos() as f64;
    eprintln!("freed worker {idle}: {:.3}% CPU", share * 100.0);
    assert!(share < 0.01, "freed worker used {:.2}% CPU", share * 100.0);
    // Still coalesced, and nothing lost on the way.
    assert_eq!(workers_in_use(&placement(&d.control)), vec![busy]);
    let (received, lost, reordered, _) = sink_of(&d.control, "a");
    assert!(received > 0);
    assert_eq!((lost, reordered), (0, 0));
}

#[test]
fn high_load_spreads_within_2_s() {
    let Some(cpus) = two_cpus() else { return };
    let dir = TempDir::new("plc-high");
    let ports = format!("{}{}", generator("a", 1, 0, ""), generator("b", 2, 0, ""));
    let d = start(&dir, cpus, "", &ports);
    let p = placement(&d.control);
    let wa = worker_of(&p, "a", 0).expect("a/0 placed");
    let cpu_a = p["workers"][wa as usize]["cpu"].as_u64().unwrap();
    // Force both queues onto one worker, let it run hot for a while, then let go.
    qs(
        &d.control,
        &["placement", "pin", "b", "0", &cpu_a.to_string()],
    )
    .assert_ok("pin");
    assert_eq!(workers_in_use(&placement(&d.control)), vec![wa]);
    std::thread::sleep(Duration::from_millis(1500));
    let p = placement(&d.control);
    assert!(
        p["workers"][wa as usize]["busy"].as_f64().unwrap() > 0.8,
        "the shared worker is not hot: {p}"
    );
    let t0 = Instant::now();
    qs(&d.control, &["placement", "unpin", "b", "0"]).assert_ok("unpin");
    let mut last = Value::Null;
    let spread = wait_until(Duration::from_secs(5), || {
        last = placement(&d.control);
        workers_in_use(&last).len() == 2
    });
    let took = t0.elapsed();
    eprintln!("spread after {} ms", took.as_millis());
    assert!(spread, "queues did not spread within 5 s: {last}");
    assert!(
        took <= Duration::from_secs(2),
        "spreading took {took:?}: {last}"
    );
    assert!(last["moves"].to_string().contains("spread"), "{last}");
    let (received, lost, reordered, _) = sink_of(&d.control, "a");
    assert!(received > 0);
    assert_eq!((lost, reordered), (0, 0));
}

#[test]
fn a_hundred_forced_moves_lose_and_reorder_nothing() {
    let Some(cpus) = two_cpus() else { return };
    let dir = TempDir::new("plc-moves");
    // One generator with two queues at full speed (bursts of 32: a sloppy hand-off would
    // show); the moves take queue 0 back and forth. Static mode, so only the forced moves
    // happen.
    let g = "[[port]]\nname = \"g\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:01\"\nqueues = 2\n\
             generate = { dst = \"02:00:00:00:00:09\", size = 64, rate = 0, flows = 8 }\n";
    let d = start(&dir, cpus, "placement = \"static\"", g);
    let mut moved = 0;
    for i in 0..100 {
        let cpu = cpus[(i + 1) % 2];
        let line =
            format!("{{\"request\":\"placement-pin\",\"port\":\"g\",\"queue\":0,\"cpu\":{cpu}}}\n");
        let v = request(&d.control, line.as_bytes()).expect("pin request");
        assert_eq!(v["response"], "ok", "move {i}: {v}");
        let p = placement(&d.control);
        let w = worker_of(&p, "g", 0).expect("g/0 placed");
        assert_eq!(
            p["workers"][w as usize]["cpu"].as_u64(),
            Some(cpu as u64),
            "{p}"
        );
        moved += 1;
    }
    let (received, lost, reordered, generated) = sink_of(&d.control, "g");
    eprintln!(
        "{moved} moves: generated {generated}, received {received}, lost {lost}, \
         reordered {reordered}"
    );
    assert!(
        received > 100_000,
        "too little traffic to show anything: {received}"
    );
    assert_eq!((lost, reordered), (0, 0));
}
