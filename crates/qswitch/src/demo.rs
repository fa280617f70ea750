//! `qswitch demo`: the main job on the embedded default config.
//!
//! ```text
//!   netns qsdemo-a-PID                qswitch (child process)              netns qsdemo-b-PID
//!   10.99.0.1 ── TAP qsdA<n> ──▶ port a ─ workers ─ port b ──▶ TAP qsdB<n> ── 10.99.0.2
//!   ping, iperf3 -c                                                       iperf3 -s
//! ```
//!
//! It pings across, runs iperf3 TCP for `seconds` while printing the switch's per-second
//! rates, prints a summary, and removes everything it made (also on Ctrl-C).

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use qswitch_lab::netns::{self, LabDaemon, Netns};
use qswitch_lab::procstat;
use qswitch_lab::topology::{config, worker_cpus, RemoveDir};

pub fn run(seconds: u32, streams: u32) -> anyhow::Result<()> {
    netns::require_root("qswitch demo")?;
    for (tool, pkg) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ] {
        netns::ensure_tool(tool, pkg)?;
    }
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupted.clone())?;
    }
    let id = std::process::id();
    let dir = std::env::temp_dir().join(format!("qswitch-demo-{id}"));
    let _dir_guard = RemoveDir(dir.clone());
    let (tap_a, tap_b) = (
        format!("qsdA{}", id % 100_000),
        format!("qsdB{}", id % 100_000),
    );
    let control = dir.join("control.sock");
    let workers = worker_cpus(2)?;
    let text = config(&workers, &control.display().to_string(), &tap_a, &tap_b);

    println!("== qswitch demo: workers on CPUs {workers}, TAPs {tap_a} and {tap_b}");
    // Namespaces first: locals drop in reverse, so the switch stops before they go.
    let ns_a = Netns::create(&format!("qsdemo-a-{id}"))?;
    let ns_b = Netns::create(&format!("qsdemo-b-{id}"))?;
    let mut daemon = LabDaemon::start(&dir, &text)?;
    let result = (|| {
        ns_a.adopt(&tap_a, "10.99.0.1/24")?;
        ns_b.adopt(&tap_b, "10.99.0.2/24")?;
        traffic(&daemon, &ns_a, &ns_b, seconds, streams, &interrupted)
    })();
    daemon.stop();
    result?;
    println!("== cleaned up (namespaces, TAPs, qswitch)");
    Ok(())
}

fn traffic(
    daemon: &LabDaemon,
    ns_a: &Netns,
    ns_b: &Netns,
    seconds: u32,
    streams: u32,
    interrupted: &AtomicBool,
) -> anyhow::Result<()> {
    println!("== ping 10.99.0.1 -> 10.99.0.2");
    let ping = ns_a.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", "10.99.0.2"])?;
    let ping_out = String::from_utf8_lossy(&ping.stdout);
    for line in ping_out
        .lines()
        .filter(|l| l.contains("packets transmitted") || l.starts_with("rtt"))
    {
        println!("   {line}");
    }

    println!("== iperf3 TCP, {streams} stream(s), {seconds} s, 10.99.0.1 -> 10.99.0.2");
    let _server = ns_b.spawn(&["iperf3", "-s", "-1", "-B", "10.99.0.2"], Stdio::null())?;
    netns::wait_listening(ns_b, 5201)?;
    let mut client = netns::iperf3_client(ns_a, "10.99.0.2", seconds, streams)?;
    let start_stats = daemon.stats()?;
    let cpu_before = procstat::cpu_jiffies();
    let started = Instant::now();
    let mut prev = start_stats.clone();
    let mut printed_header = false;
    loop {
        if interrupted.load(Ordering::Relaxed) {
            bail!("interrupted; cleaned up");
        }
        if client.wait_timeout(Duration::from_secs(1))?.is_some() {
            break;
        }
        if started.elapsed() > Duration::from_secs(u64::from(seconds) + 20) {
            bail!("iperf3 did not finish");
        }
        let cur = daemon.stats()?;
        let rates = qswitch_api::request::Rates::between(&prev, &cur);
        if !printed_header {
            println!("{}", qswitch::cli::rate_header(&cur));
            printed_header = true;
        }
        println!("{}", qswitch::cli::rate_line(&cur, &rates));
        prev = cur;
    }
    let busy_cpus = procstat::busy_cpus(cpu_before, procstat::cpu_jiffies());
    let end_stats = daemon.stats()?;
    let out = client.output()?;
    let json: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("iperf3 printed no JSON result")?;
    let (gbps, retr) = netns::iperf3_summary(&json)?;
    let total = qswitch_api::request::Rates::between(&start_stats, &end_stats);
    let cs: f64 = total.workers.iter().map(|w| w.ctx_switches_ps).sum();
    let busy: Vec<String> = total
        .workers
        .iter()
        .map(|w| format!("w{} {:.0}%", w.id, w.busy_pct))
        .collect();
    let drops: u64 = end_stats.ports.iter().flat_map(|p| p.drops.values()).sum();
    // Which port dropped what, so that a drop is explained where it is shown.
    let why: Vec<String> = end_stats
        .ports
        .iter()
        .flat_map(|p| {
            p.drops
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(move |(r, n)| format!("{} {r}: {n}", p.name))
        })
        .collect();

    println!("== summary");
    println!("   iperf3 received     {gbps:.2} Gbit/s ({retr} retransmits)");
    println!(
        "   qswitch worker busy {} ; context switches {:.0}/s",
        busy.join(", "),
        cs
    );
    println!(
        "   qswitch process CPU {:.0}% ; machine busy {:.2} CPUs ({:.2} CPU per Gbit/s)",
        total.process_cpu_pct,
        busy_cpus,
        if gbps > 0.0 { busy_cpus / gbps } else { 0.0 }
    );
    if why.is_empty() {
        println!("   drops               {drops}");
    } else {
        println!("   drops               {drops} ({})", why.join(", "));
    }
    Ok(())
}
