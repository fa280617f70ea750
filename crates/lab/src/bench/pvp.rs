//! `qswitch bench pvp`: vhost-user port to vhost-user port through one switch core, qswitch
//! next to OVS-DPDK (Debian `openvswitch-switch-dpdk`, NORMAL action, i.e. MAC learning).
//!
//! ```text
//!   CPU 0: load generator (this process, one thread)     CPU 1: the switch's one worker / PMD
//!   virtio-net frontend A ── vhost-user ──▶ port a ─ MAC lookup ─ port b ── vhost-user ──▶ frontend B
//!   send_burst on A  ◀────────────── one poll loop ──────────────▶  recv on B
//! ```
//!
//! The load is, by default (`--load dpdk`), [`qsload`](super::qsload): a DPDK program with
//! two virtio-user ports, generating on A and sinking B in one loop on CPU 0 — a third party
//! to both switches, as the guests users run (DPDK applications, or any virtio driver) are.
//! One qsload process per (switch, frame size): it attaches, lets the switch learn both
//! stations, warms up 2 s and measures `--seconds`; the switch's CPU is read every 250 ms
//! and taken over the measured window. Every frame size runs under both of qsload's load
//! shapes: one mbuf pool of 8191 (what this bench always used) and a transmit and a receive
//! pool of 16383 each (a guest with more buffers in flight; issue 30 found qswitch's 1518 B
//! lead over OVS-DPDK turned into a deficit there), so no comparison quotes one shape alone. The idle measurement then has no frontend attached.
//!
//! With `--load own` the generator is `qswitch_virtio_driver` (what QEMU and a guest's
//! virtio-net driver do, in one process, no VM). It transmits on A and receives on B in one
//! loop on one core
//! ([`poll_loop_between`]), RFC 2544 frame sizes 64 and 1518 bytes (60 and 1514 without the
//! FCS), IPv4/UDP, unicast to B's MAC once the switch has learnt both MACs (one frame B→A and
//! one A→B first), so both switches do a MAC lookup rather than flood.
//!
//! - qswitch: `qswitch run` with `workers = "1"` and two vhost-user ports in server mode; the
//!   generator connects.
//! - OVS-DPDK: `ovs-vswitchd-dpdk` with its own `ovsdb-server`, everything in a private run
//!   directory (`OVS_RUNDIR`/`OVS_DBDIR`/`OVS_LOGDIR`), `pmd-cpu-mask` = CPU 1, DPDK without
//!   hugepages; a netdev bridge with two `dpdkvhostuserclient` ports whose server sockets
//!   the generator listens on. OVS connects (and retries every second).
//! - testpmd-io: DPDK's `dpdk-testpmd` with two `net_vhost` ports (server sockets the load
//!   connects to) in `io` forwarding on CPU 1: no lookup, no learning, the same DPDK vhost
//!   library as OVS. The floor of "a switch that does nothing", and the steadiness reference:
//!   a switch's run-to-run spread is compared with testpmd's in the same run.
//!
//! Each (round, contender) gets a fresh switch, connects the generator, measures the
//! switch's CPU while idle (both ports connected, no traffic, [`IDLE_S`] s), then runs both
//! frame sizes for `--seconds` each. Contenders are interleaved per round. If OVS-DPDK
//! cannot run (package missing, EAL failure) only qswitch runs and the reason is printed and
//! recorded; likewise testpmd.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context};
use qswitch_virtio_driver::{poll_loop_between, Driver, DriverOptions, LoadSpec, LoadStats};
use serde::Serialize;

use super::{first_line, interleave, median, qsload, Bench, Load, RemoveDir};
use crate::netns::{self, ChildGuard, LabDaemon};
use crate::plot::{self, Series};
use crate::procstat;
use crate::run::Run;

/// CPU of the load generator.
const GEN_CPU: usize = 0;
/// CPU of the switch's one worker / PMD.
const SWITCH_CPU: usize = 1;
/// Seconds of idle measurement per setup.
const IDLE_S: u64 = 3;
/// (RFC 2544 frame size with FCS, bytes we send without it).
const SIZES: [(u32, usize); 2] = [(64, 60), (1518, 1514)];
const CONTENDERS: [&str; 5] = [
    "qswitch",
    "ovs-dpdk",
    "testpmd-io",
    "qswitch-fw",
    "ovs-dpdk-ct",
];
/// The ratios of medians the table prints, (numerator, denominator) in [`CONTENDERS`]:
/// qswitch over each peer; with `--firewall` the firewall's cost on qswitch, qswitch-fw
/// over OVS-DPDK's `ct()` table, and that table's cost on OVS-DPDK.
const RATIOS: [(usize, usize); 5] = [(0, 1), (0, 2), (3, 0), (3, 4), (4, 1)];
/// Refuses an `--only` list that names a contender pvp does not have.
pub(crate) fn check_only(only: &str) -> anyhow::Result<()> {
    match only.split(',').find(|n| !CONTENDERS.contains(n)) {
        Some(bad) => bail!(
            "--only {only}: pvp has no contender '{bad}' (it has {})",
            CONTENDERS.join(", ")
        ),
        None => Ok(()),
    }
}

/// Whether `--only`'s comma-separated list names contender `name` (exactly).
fn only_has(only: &str, name: &str) -> bool {
    only.split(',').any(|o| o == name)
}

/// The contenders only `--firewall` runs.
const FIREWALL: [usize; 2] = [3, 4];

/// A measured case: (frame size, the load's mbuf pools: 1 or 2, see [`qsload::POOLS`]; 0
/// under `--load own`).
type Case = (u32, u32);

fn case_label((size, pools): Case) -> String {
    match pools {
        0 => format!("{size} B"),
        1 => format!("{size} B 1 pool"),
        n => format!("{size} B {n} pools"),
    }
}

/// The cases of `items`, once each, in the order of [`SIZES`], then pools.
fn cases<T>(items: &[T], case: impl Fn(&T) -> Case) -> Vec<Case> {
    let mut v: Vec<Case> = items.iter().map(case).collect();
    v.sort_by_key(|&(size, pools)| (SIZES.iter().position(|s| s.0 == size), pools));
    v.dedup();
    v
}
/// The one case `--new-flows` measures: 64 B, one pool.
const NEW_FLOWS_CASE: Case = (64, 1);
const TESTPMD: &str = "dpdk-testpmd";
const MAC_A: [u8; 6] = [0x02, 0x51, 0x50, 0x56, 0x50, 0x0a];
const MAC_B: [u8; 6] = [0x02, 0x51, 0x50, 0x56, 0x50, 0x0b];

const OVS_VSWITCHD: &str = "/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk";
const OVS_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
const OVS_PACKAGE: &str = "openvswitch-switch-dpdk";
/// The TAP device of the netdev datapath's local port.
const OVS_DP_TAP: &str = "ovs-netdev";

// ---------------------------------------------------------------------------------------------
// Results

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct PvpSample {
    /// End of the second, since the traffic started.
    pub t_s: f64,
    pub mpps_tx: f64,
    pub mpps_rx: f64,
    /// CPU % of the whole switch process in this second (100 = one core).
    pub switch_cpu_pct: f64,
}

/// What one run (one contender, one frame size, one round) measured.
#[derive(Debug, Clone, Serialize)]
pub struct PvpMetrics {
    /// RFC 2544 frame size (with FCS): 64 or 1518.
    pub frame_size: u32,
    /// Bytes sent per frame (without FCS).
    pub frame_len: usize,
    /// The DPDK load's mbuf pools (1: one of 8191, 2: transmit and receive of 16383 each;
    /// [`qsload::POOLS`]); 0 under `--load own`.
    pub load_pools: u32,
    pub tx_pkts: u64,
    pub rx_pkts: u64,
    /// Sent and received per second of traffic (frames received in the final 100 ms
    /// drain are counted, the drain's time is not).
    pub mpps_tx: f64,
    pub mpps_rx: f64,
    /// Received Mpps × frame size (with FCS) × 8.
    pub gbps_rx: f64,
    /// Sent but not received, % of sent.
    pub loss_pct: f64,
    /// Bursts the generator cut short because A's tx ring was full (the switch fell
    /// behind); few means the generator, not the switch, set the rate.
    pub tx_ring_full: u64,
    /// Frames that reached the sender's own port A during the run (flooding; should be 0
    /// with learnt unicast; at most A's ring size, 256, since A does not poll).
    pub flooded_to_sender: u64,
    /// Whole switch process CPU over the traffic, % of one core.
    pub switch_cpu_pct: f64,
    /// The worker / PMD thread's CPU over the traffic, % of one core.
    pub worker_cpu_pct: f64,
    /// Received Mpps per CPU-second of the switch process.
    pub mpps_per_cpu_s: f64,
    /// Machine busy CPUs over the traffic (from /proc/stat, 0..=CPUs).
    pub busy_cpus: f64,
    /// This process (the generator, mostly) over the traffic, % of one core.
    pub generator_cpu_pct: f64,
    /// Machine busy CPUs over the traffic minus the switch and this process: other work
    /// competing with the measurement (should be near 0).
    pub other_busy_cpus: f64,
    /// This setup's idle measurement (both ports connected, no traffic).
    pub idle_cpu_pct: f64,
    pub idle_worker_cpu_pct: f64,
    /// Machine busy CPUs while idle minus the switch's: other work on the machine.
    pub idle_other_busy_cpus: f64,
    /// The firewall's contenders: what their connection tables did in this run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ct: Option<CtRun>,
}

/// One run of one contender: [`PvpMetrics`] and a [`PvpSample`] per second.
pub type PvpRun = Run<PvpMetrics, PvpSample>;

/// Medians (and ranges) of one contender at one frame size and load shape.
#[derive(Debug, Clone, Serialize)]
pub struct PvpSummary {
    pub frame_size: u32,
    pub load_pools: u32,
    pub contender: String,
    pub runs: usize,
    pub mpps_median: f64,
    pub mpps_min: f64,
    pub mpps_max: f64,
    pub mpps_tx_median: f64,
    pub gbps_median: f64,
    pub loss_pct_median: f64,
    pub switch_cpu_pct_median: f64,
    pub mpps_per_cpu_s_median: f64,
    pub mpps_per_cpu_s_min: f64,
    pub mpps_per_cpu_s_max: f64,
    pub idle_cpu_pct_median: f64,
    pub idle_cpu_pct_min: f64,
    pub idle_cpu_pct_max: f64,
    /// Run-to-run spread: (max - min) / median of the Mpps, %.
    pub spread_pct: f64,
}

/// qswitch's medians over a peer's (OVS-DPDK, testpmd-io) at one frame size and load shape.
#[derive(Debug, Clone, Serialize)]
pub struct PvpRatio {
    pub frame_size: u32,
    pub load_pools: u32,
    pub of: String,
    pub mpps: f64,
    pub mpps_per_cpu_s: f64,
}

/// What `OUT/pvp.json` holds.
#[derive(Debug, Serialize)]
pub struct PvpReport {
    pub scenario: String,
    pub config: serde_json::Value,
    /// Why OVS-DPDK did not run (or stopped running), if it did not.
    pub ovs_skipped: Option<String>,
    /// Why testpmd-io did not run (or stopped running), if it did not.
    pub testpmd_skipped: Option<String>,
    /// With `--firewall`: why qswitch-fw and ovs-dpdk-ct did not run, if they did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firewall_skipped: Option<serde_json::Value>,
    pub runs: Vec<PvpRun>,
    pub summary: Vec<PvpSummary>,
    pub ratio: Vec<PvpRatio>,
}

// ---------------------------------------------------------------------------------------------
// The scenario

pub fn run(b: &Bench) -> anyhow::Result<()> {
    let online = qswitch_sys::thread::online_cpus()?;
    if !online.contains(&GEN_CPU) || !online.contains(&SWITCH_CPU) {
        bail!("pvp needs CPUs {GEN_CPU} (generator) and {SWITCH_CPU} (switch); online: {online:?}");
    }
    let (runs, seconds) = (b.args.runs, b.args.seconds);
    let loadavg_at_start = first_line("/proc/loadavg");
    let started_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Why a peer (index 1: OVS-DPDK, 2: testpmd-io, 3, 4: the firewall's) does not run.
    let mut skipped: [Option<String>; 5] = Default::default();
    let fw = fw_settings(b);
    for c in FIREWALL {
        if fw.is_none() {
            skipped[c] = Some("needs --firewall".into());
        }
    }
    let ovs_wanted = |c: usize| {
        skipped[c].is_none()
            && b.args
                .only
                .as_deref()
                .is_none_or(|o| only_has(o, CONTENDERS[c]))
    };
    let ovs_ok = if ovs_wanted(1) || ovs_wanted(4) {
        ovs_check(b).err().map(|e| format!("{e:#}"))
    } else {
        None
    };
    skipped[1] = match b.args.only.as_deref() {
        Some(o) if !only_has(o, CONTENDERS[1]) => Some(format!("--only {o}")),
        _ => ovs_ok.clone(),
    };
    if skipped[4].is_none() {
        skipped[4] = match b.args.only.as_deref() {
            Some(o) if !only_has(o, CONTENDERS[4]) => Some(format!("--only {o}")),
            _ => ovs_ok,
        };
    }
    skipped[2] = match b.args.only.as_deref() {
        Some(o) if !only_has(o, CONTENDERS[2]) => Some(format!("--only {o}")),
        _ => testpmd_check().err().map(|e| format!("{e:#}")),
    };
    let ovs_version = (skipped[1].is_none() || skipped[4].is_none()).then(ovs_version);
    let ovs_skipped = &skipped[1];
    if let Some(why) = &skipped[2] {
        b.say(format_args!("testpmd-io skipped: {why}"));
    }
    match ovs_skipped {
        Some(why) => b.say(format_args!("OVS-DPDK skipped: {why}")),
        None => b.say(format_args!(
            "OVS-DPDK: {}",
            ovs_version.as_deref().unwrap_or_default()
        )),
    }
    let order = interleave(CONTENDERS.len(), runs);
    b.say(format_args!(
        "{runs} round(s), {seconds} s per frame size, idle {IDLE_S} s per setup; generator on CPU \
         {GEN_CPU}, switch worker/PMD on CPU {SWITCH_CPU}; load average {loadavg_at_start}"
    ));
    // The DPDK load is built once; its directory goes at the end.
    let qsload_dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-qsload-{}", b.id)));
    let qsload_bin = match b.args.load {
        Load::Dpdk => {
            let bin = qsload::build(&qsload_dir.0)?;
            b.say(format_args!(
                "load: qsload (DPDK {} virtio-user, gen + sink in one loop on CPU {GEN_CPU}, \
                 {}s warm-up before each measured window)",
                dpdk_version(),
                qsload::WARMUP_S
            ));
            Some(bin)
        }
        Load::Own => {
            b.say(format_args!("load: qswitch's own virtio frontend"));
            None
        }
    };

    let mut results: Vec<PvpRun> = Vec::new();
    let mut drivers = serde_json::Map::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = CONTENDERS[c];
        let prefix = format!(
            "[{:>2}/{}] round {} {name:<9}",
            seq + 1,
            order.len(),
            round + 1
        );
        if skipped[c].is_some() || b.args.only.as_deref().is_some_and(|o| !only_has(o, name)) {
            continue;
        }
        b.say_start(format_args!("{prefix} "));
        let t0 = Instant::now();
        let setup = match c {
            0 => QswitchSwitch::start(b.id, seq).map(|s| Box::new(s) as Box<dyn Switch>),
            1 => OvsSwitch::start(b, seq).map(|s| Box::new(s) as Box<dyn Switch>),
            3 => QswitchSwitch::start_fw(b.id, seq, fw.as_ref())
                .map(|s| Box::new(s) as Box<dyn Switch>),
            4 => OvsSwitch::start(b, seq)
                .and_then(|s| s.ct_table(fw.as_ref()))
                .map(|s| Box::new(s) as Box<dyn Switch>),
            _ => TestpmdSwitch::start(b, seq).map(|s| Box::new(s) as Box<dyn Switch>),
        };
        // The generator attaches (OVS connects to it) and the switch learns both MACs.
        // Bindings drop in reverse order: the generator disconnects before the switch stops.
        // The DPDK load attaches per frame size instead (one qsload process each).
        let attached = setup.and_then(|sw| match qsload_bin {
            Some(_) => Ok((sw, None, serde_json::json!("qsload"))),
            None => {
                let (gen, info) = Gen::start(b, sw.attach(), sw.sockets())?;
                Ok((sw, Some(gen), info))
            }
        });
        let (sw, gen, info) = match attached {
            Ok(x) => x,
            Err(e) if c > 0 => {
                b.check()?;
                println!();
                let why = format!("{e:#}");
                b.say(format_args!(
                    "{name} failed: {why}; skipping it from here on"
                ));
                skipped[c] = Some(format!("failed in round {}: {why}", round + 1));
                continue;
            }
            Err(e) => return Err(e),
        };
        drivers.entry(name).or_insert(info);
        let up_s = t0.elapsed().as_secs_f64();

        // Idle: both ports connected (with the DPDK load: not connected), no traffic.
        let (cpu0, mach0, w0) = (sw.cpu()?, procstat::cpu_jiffies(), Instant::now());
        b.sleep(Duration::from_secs(IDLE_S))?;
        let (cpu1, mach1, dt) = (
            sw.cpu()?,
            procstat::cpu_jiffies(),
            w0.elapsed().as_secs_f64(),
        );
        let idle = cpu1.since(&cpu0, dt);
        let idle_other = (procstat::busy_cpus(mach0, mach1) - idle.0 / 100.0).max(0.0);
        println!(
            "up in {up_s:.1} s; idle {IDLE_S} s: switch CPU {:.1}% (worker {:.1}%), other busy \
             CPUs {idle_other:.2}",
            idle.0, idle.1
        );

        // Every frame size under every load shape, in reverse order in odd rounds.
        let pools: &[u32] = if qsload_bin.is_some() {
            &qsload::POOLS
        } else {
            &[0]
        };
        let mut runs_here: Vec<(u32, usize, u32)> = (SIZES.iter())
            .flat_map(|&(size, len)| pools.iter().map(move |&p| (size, len, p)))
            .filter(|&(size, _, p)| !b.args.new_flows || (size, p) == NEW_FLOWS_CASE)
            .collect();
        if round % 2 == 1 {
            runs_here.reverse();
        }
        for (size, len, pools) in runs_here {
            b.say_start(format_args!("{prefix} {:>14} ", case_label((size, pools))));
            let mut r = match (&gen, &qsload_bin) {
                (Some(gen), _) => traffic(b, sw.as_ref(), gen, (size, len), seconds)?,
                (None, Some(bin)) => {
                    match traffic_dpdk(b, sw.as_ref(), bin, (size, len, pools), seconds) {
                        Ok(r) => r,
                        Err(e) if c > 0 => {
                            println!();
                            b.say(format_args!("{name} under the DPDK load failed: {e:#}"));
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
                (None, None) => unreachable!("a load is chosen"),
            };
            r.contender = name.to_string();
            r.load_pools = pools;
            r.round = round + 1;
            r.seq = seq + 1;
            (r.idle_cpu_pct, r.idle_worker_cpu_pct) = idle;
            r.idle_other_busy_cpus = idle_other;
            if let Some(ct) = &r.ct {
                print!("  ct: {}", ct_line(ct));
            }
            println!("{}", run_line(&r));
            results.push(r);
        }
        drop(gen); // the generator disconnects before the switch stops
        drop(sw);
    }

    let active: Vec<&str> = CONTENDERS
        .iter()
        .copied()
        .filter(|&c| results.iter().any(|r| r.contender == c))
        .collect();
    let (summary, ratio) = summarise(&active, &results);
    let title = format!("pvp ({seconds} s per run, {runs} runs each, one switch core)");
    print_table(&title, &summary, &ratio);
    for (c, why) in skipped.iter().enumerate().skip(1) {
        if fw.is_none() && FIREWALL.contains(&c) {
            continue;
        }
        if let Some(why) = why {
            println!("note: {} skipped: {why}", CONTENDERS[c]);
        }
    }
    warn_if_busy(&results, &loadavg_at_start);
    let svg = pvp_svg(&summary, &results);
    let config = serde_json::json!({
        "runs": runs,
        "seconds": seconds,
        "idle_seconds": IDLE_S,
        "contenders": CONTENDERS.iter().enumerate()
            .filter(|(c, _)| fw.is_some() || !FIREWALL.contains(c))
            .map(|(_, n)| *n).collect::<Vec<_>>(),
        "flows": match (b.args.new_flows, b.args.flows) {
            (true, _) => serde_json::json!("new: every frame a new 5-tuple (qsload --new-flows)"),
            (false, Some(n)) => serde_json::json!(n),
            (false, None) => serde_json::json!(4),
        },
        "firewall": fw.as_ref().map(|f| serde_json::json!({
            "qswitch": f.qswitch_toml("/tmp/qswitch-bench-pvp-ID"),
            "ovs_flows": OVS_CT_FLOWS,
            "ovs_ct_maxconns": f.max_sessions,
        })),
        "order": order.iter().filter(|&&(_, c)| fw.is_some() || !FIREWALL.contains(&c)).map(|&(_, c)| CONTENDERS[c]).collect::<Vec<_>>(),
        "frame_sizes": SIZES.iter().map(|s| s.0).collect::<Vec<_>>(),
        "load_pools": match b.args.load {
            Load::Own => vec![0],
            Load::Dpdk => qsload::POOLS.to_vec(),
        },
        "frame": "IPv4/UDP 198.18.0.1:1024 -> 198.18.0.2:9, unicast A -> B after learning",
        "generator_cpu": GEN_CPU,
        "switch_cpu": SWITCH_CPU,
        "load": b.args.load,
        "generator": match b.args.load {
            Load::Own => "qswitch-virtio-driver poll_loop_between, 1 queue pair, 256 entries, bursts of 32, no calls".to_string(),
            Load::Dpdk => format!("qsload (bench/dpdk-load/qsload.c): DPDK {} net_virtio_user, 1 queue pair each, 1024 entries, bursts of 32, tx and rx in one loop on one lcore, {} s warm-up; mbufs from one pool of 8191 (load_pools 1) or a transmit and a receive pool of 16383 each (load_pools 2); its CPU counted as 100% of CPU {GEN_CPU} (it polls)", dpdk_version(), qsload::WARMUP_S),
        },
        "generator_drivers": drivers,
        "generator_ceiling": "not measured (needs a trivial vhost-user loopback back-end); see tx_ring_full per run",
        "qswitch_config": qswitch_config(Path::new("/tmp/qswitch-bench-pvp-ID")),
        "qswitch_version": env!("CARGO_PKG_VERSION"),
        "ovs_version": ovs_version,
        "ovs_dpdk_extra": dpdk_extra("PREFIX"),
        "ovs_pmd_cpu_mask": pmd_mask(),
        "testpmd": testpmd_args(Path::new("/tmp/qswitch-bench-pvp-ID"), "PREFIX").join(" "),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": first_line("/proc/sys/kernel/osrelease"),
        "loadavg_at_start": loadavg_at_start,
        "loadavg_at_end": first_line("/proc/loadavg"),
        "started_unix_s": started_unix_s,
    });
    let [_, ovs_skipped, testpmd_skipped, qswitch_fw_skipped, ovs_ct_skipped] = skipped;
    let report = PvpReport {
        scenario: "pvp".into(),
        config,
        ovs_skipped,
        testpmd_skipped,
        firewall_skipped: fw.is_some().then(|| {
            serde_json::json!({ "qswitch-fw": qswitch_fw_skipped, "ovs-dpdk-ct": ovs_ct_skipped })
        }),
        runs: results,
        summary,
        ratio,
    };
    super::write_results(&b.args.out, "pvp", &report, &svg)
}

/// CPU readings at one moment of a run.
struct Snap {
    sw: CpuSnap,
    machine: (u64, u64),
    /// This process's CPU time.
    own_ns: u64,
    t: Instant,
}

impl Snap {
    fn take(sw: &dyn Switch) -> anyhow::Result<Snap> {
        Ok(Snap {
            sw: sw.cpu()?,
            machine: procstat::cpu_jiffies(),
            own_ns: qswitch_sys::thread::process_cpu_ns(),
            t: Instant::now(),
        })
    }
}

/// One traffic run of `seconds` at one frame size, with per-second samples; prints a dot
/// per second.
fn traffic(
    b: &Bench,
    sw: &dyn Switch,
    gen: &Gen,
    (size, len): (u32, usize),
    seconds: u32,
) -> anyhow::Result<PvpRun> {
    // CPU is measured from the first frame to the end of the last second (drain included);
    // the learning probes before and the flood check after are not part of it.
    let mut first: Option<Snap> = None;
    let mut last: Option<Snap> = None;
    let mut samples = Vec::new();
    let mut t_s = 0.0;
    let mut on_event = |st: Option<&LoadStats>| -> anyhow::Result<()> {
        let snap = Snap::take(sw)?;
        let Some(st) = st else {
            first = Some(snap);
            return Ok(());
        };
        let prev = last.as_ref().or(first.as_ref()).context("no start event")?;
        let pct = snap.sw.since(&prev.sw, (snap.t - prev.t).as_secs_f64()).0;
        let secs = st.elapsed.as_secs_f64().max(1e-9);
        t_s += st.elapsed.as_secs_f64();
        samples.push(PvpSample {
            t_s,
            mpps_tx: st.tx_pkts as f64 / secs / 1e6,
            mpps_rx: st.rx_pkts as f64 / secs / 1e6,
            switch_cpu_pct: pct,
        });
        last = Some(snap);
        print!(".");
        let _ = std::io::stdout().flush();
        Ok(())
    };
    let done = gen.run(b, len, seconds, &mut on_event)?;
    let (Some(first), Some(last)) = (first, last) else {
        bail!("load generator: no traffic");
    };
    let wall = (last.t - first.t).as_secs_f64();
    let (cpu_pct, worker_pct) = last.sw.since(&first.sw, wall);
    let busy_cpus = procstat::busy_cpus(first.machine, last.machine);
    let generator_cpu_pct =
        last.own_ns.saturating_sub(first.own_ns) as f64 / 1e9 / wall.max(1e-9) * 100.0;
    let st = done.total;
    let moved = Moved {
        tx_pkts: st.tx_pkts,
        rx_pkts: st.rx_pkts,
        secs: st.elapsed.as_secs_f64(),
        tx_ring_full: st.tx_ring_full,
        flooded: done.flooded,
    };
    let cpu = CpuOver {
        cpu_pct,
        worker_pct,
        wall,
        busy_cpus,
        generator_cpu_pct,
    };
    Ok(Run {
        contender: String::new(),
        round: 0,
        seq: 0,
        metrics: metrics((size, len), &moved, &cpu),
        samples,
    })
}

/// One run of the DPDK load (a qsload process) at one frame size. The switch's CPU is read
/// every 250 ms while qsload runs; the measured window is its last `seconds` seconds (qsload
/// measures after attaching and a warm-up, and exits right after the window), so the CPU
/// figures are those of the readings nearest to that window.
fn traffic_dpdk(
    b: &Bench,
    sw: &dyn Switch,
    bin: &Path,
    (size, len, pools): (u32, usize, u32),
    seconds: u32,
) -> anyhow::Result<PvpRun> {
    let (a, s) = sw.sockets();
    let sockets = qsload::Sockets {
        gen: &a,
        sink: &s,
        server: matches!(sw.attach(), Attach::Accept),
    };
    let flows = match (b.args.new_flows, b.args.flows) {
        (true, _) => qsload::Flows::New,
        (false, Some(n)) => qsload::Flows::Cycle(n),
        (false, None) => qsload::Flows::Default,
    };
    let ct0 = sw.ct()?;
    let mut snaps: Vec<Snap> = vec![Snap::take(sw)?];
    let out = qsload::run_flows(
        b,
        bin,
        &sockets,
        GEN_CPU,
        (len, pools, flows),
        seconds,
        || {
            snaps.push(Snap::take(sw)?);
            Ok(())
        },
    )?;
    let end = Snap::take(sw)?;
    let ct = match (ct0, sw.ct()?) {
        (Some(before), Some(after)) => Some(after.since(&before, out.flows_sent)),
        _ => None,
    };
    let window = Duration::from_secs_f64(out.seconds.max(0.001));
    let nearest = |t: Instant| {
        snaps
            .iter()
            .min_by_key(|sn| if sn.t > t { sn.t - t } else { t - sn.t })
            .expect("one reading at least")
    };
    let first = nearest(end.t.checked_sub(window).unwrap_or(end.t));
    let wall = (end.t - first.t).as_secs_f64().max(1e-9);
    let (cpu_pct, worker_pct) = end.sw.since(&first.sw, wall);
    let busy_cpus = procstat::busy_cpus(first.machine, end.machine);
    let generator_cpu_pct = 100.0;
    let samples = (out.per_second.iter().enumerate())
        .map(|(i, &n)| {
            let t_end = first.t + Duration::from_secs(i as u64 + 1);
            let (s0, s1) = (nearest(t_end - Duration::from_secs(1)), nearest(t_end));
            let dt = (s1.t - s0.t).as_secs_f64();
            PvpSample {
                t_s: (i + 1) as f64,
                mpps_tx: out.tx_mpps,
                mpps_rx: n as f64 / 1e6,
                switch_cpu_pct: if dt > 0.0 {
                    s1.sw.since(&s0.sw, dt).0
                } else {
                    0.0
                },
            }
        })
        .collect::<Vec<_>>();
    print!("{}", ".".repeat(samples.len()));
    let moved = Moved {
        tx_pkts: out.sent,
        rx_pkts: out.received,
        secs: out.seconds,
        tx_ring_full: out.tx_ring_full_bursts,
        flooded: 0,
    };
    let cpu = CpuOver {
        cpu_pct,
        worker_pct,
        wall,
        busy_cpus,
        generator_cpu_pct,
    };
    let mut metrics = metrics((size, len), &moved, &cpu);
    metrics.ct = ct;
    Ok(Run {
        contender: String::new(),
        round: 0,
        seq: 0,
        metrics,
        samples,
    })
}

/// What a run moved: frames each way over the measured `secs`.
struct Moved {
    tx_pkts: u64,
    rx_pkts: u64,
    secs: f64,
    tx_ring_full: u64,
    flooded: u64,
}

/// CPU over a run's `wall` seconds: the switch (% of a core), its worker, the machine's busy
/// CPUs, the load generator (% of a core).
struct CpuOver {
    cpu_pct: f64,
    worker_pct: f64,
    wall: f64,
    busy_cpus: f64,
    generator_cpu_pct: f64,
}

/// A run's metrics from what it moved and the CPU it took (idle fields filled by the caller).
fn metrics((size, len): (u32, usize), m: &Moved, c: &CpuOver) -> PvpMetrics {
    let secs = m.secs.max(1e-9);
    let mpps_rx = m.rx_pkts as f64 / secs / 1e6;
    let cpu_s = c.cpu_pct / 100.0 * c.wall;
    PvpMetrics {
        frame_size: size,
        frame_len: len,
        load_pools: 0,
        tx_pkts: m.tx_pkts,
        rx_pkts: m.rx_pkts,
        mpps_tx: m.tx_pkts as f64 / secs / 1e6,
        mpps_rx,
        gbps_rx: mpps_rx * f64::from(size) * 8.0 / 1e3,
        loss_pct: loss_pct(m.tx_pkts, m.rx_pkts),
        tx_ring_full: m.tx_ring_full,
        flooded_to_sender: m.flooded,
        switch_cpu_pct: c.cpu_pct,
        worker_cpu_pct: c.worker_pct,
        mpps_per_cpu_s: if cpu_s > 0.0 {
            m.rx_pkts as f64 / 1e6 / cpu_s
        } else {
            0.0
        },
        busy_cpus: c.busy_cpus,
        generator_cpu_pct: c.generator_cpu_pct,
        other_busy_cpus: (c.busy_cpus - (c.cpu_pct + c.generator_cpu_pct) / 100.0).max(0.0),
        idle_cpu_pct: 0.0,
        idle_worker_cpu_pct: 0.0,
        idle_other_busy_cpus: 0.0,
        ct: None,
    }
}

/// The DPDK version pkg-config reports ("?" if none).
fn dpdk_version() -> String {
    Command::new("pkg-config")
        .args(["--modversion", "libdpdk"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

fn loss_pct(tx: u64, rx: u64) -> f64 {
    if tx == 0 {
        return 0.0;
    }
    (tx.saturating_sub(rx)) as f64 / tx as f64 * 100.0
}

/// The rest of a run's progress line.
fn run_line(r: &PvpRun) -> String {
    let mut s = format!(
        " {:>6.3} Mpps rx ({:.3} tx, {:.2}% lost)  switch CPU {:.0}% (worker {:.0}%)  {:.2} Mpps \
         per CPU-s  generator {:.0}%  other busy CPUs {:.2}",
        r.mpps_rx,
        r.mpps_tx,
        r.loss_pct,
        r.switch_cpu_pct,
        r.worker_cpu_pct,
        r.mpps_per_cpu_s,
        r.generator_cpu_pct,
        r.other_busy_cpus
    );
    if r.flooded_to_sender > 0 {
        s.push_str(&format!(
            "  ({} frames flooded back to A!)",
            r.flooded_to_sender
        ));
    }
    s
}

/// Per (case, contender) medians, in the order of the cases and `names`; and qswitch over
/// each peer per case when both ran.
fn summarise(names: &[&str], runs: &[PvpRun]) -> (Vec<PvpSummary>, Vec<PvpRatio>) {
    let min = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = |v: &[f64]| v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut summary = Vec::new();
    let mut ratio = Vec::new();
    for (size, pools) in cases(runs, |r| (r.frame_size, r.load_pools)) {
        let mine: Vec<PvpSummary> = names
            .iter()
            .filter_map(|&name| {
                let rs: Vec<&PvpRun> = runs
                    .iter()
                    .filter(|r| {
                        r.contender == name && r.frame_size == size && r.load_pools == pools
                    })
                    .collect();
                if rs.is_empty() {
                    return None;
                }
                let f = |g: fn(&PvpRun) -> f64| rs.iter().map(|r| g(r)).collect::<Vec<f64>>();
                let (mpps, per_cpu, idle) = (
                    f(|r| r.mpps_rx),
                    f(|r| r.mpps_per_cpu_s),
                    f(|r| r.idle_cpu_pct),
                );
                Some(PvpSummary {
                    frame_size: size,
                    load_pools: pools,
                    contender: name.to_string(),
                    runs: rs.len(),
                    mpps_median: median(&mpps),
                    mpps_min: min(&mpps),
                    mpps_max: max(&mpps),
                    mpps_tx_median: median(&f(|r| r.mpps_tx)),
                    gbps_median: median(&f(|r| r.gbps_rx)),
                    loss_pct_median: median(&f(|r| r.loss_pct)),
                    switch_cpu_pct_median: median(&f(|r| r.switch_cpu_pct)),
                    mpps_per_cpu_s_median: median(&per_cpu),
                    mpps_per_cpu_s_min: min(&per_cpu),
                    mpps_per_cpu_s_max: max(&per_cpu),
                    idle_cpu_pct_median: median(&idle),
                    idle_cpu_pct_min: min(&idle),
                    idle_cpu_pct_max: max(&idle),
                    spread_pct: spread_pct(&mpps),
                })
            })
            .collect();
        for (num, den) in RATIOS {
            let q = mine.iter().find(|s| s.contender == CONTENDERS[num]);
            let o = mine.iter().find(|s| s.contender == CONTENDERS[den]);
            if let (Some(q), Some(o)) = (q, o) {
                // Only where both moved frames: a side that moved none failed to measure
                // (its runs say so), and 0× or ∞ would read as a result.
                let moved = |s: &PvpSummary| s.mpps_median > 0.0 && s.mpps_per_cpu_s_median > 0.0;
                if moved(q) && moved(o) {
                    ratio.push(PvpRatio {
                        frame_size: size,
                        load_pools: pools,
                        of: format!("{} / {}", q.contender, o.contender),
                        mpps: q.mpps_median / o.mpps_median,
                        mpps_per_cpu_s: q.mpps_per_cpu_s_median / o.mpps_per_cpu_s_median,
                    });
                }
            }
        }
        summary.extend(mine);
    }
    (summary, ratio)
}

/// The final table, then `RESULT pvp CONTENDER size=N key=value ...` lines for scripts.
fn print_table(title: &str, summary: &[PvpSummary], ratio: &[PvpRatio]) {
    println!();
    println!("{title}");
    println!(
        "  {:<15}{:<27}{:<28}{:>7}{:>12}{:>16}{:>10}",
        "size, load",
        "contender",
        "Mpps rx (median [min-max])",
        "lost %",
        "switch CPU",
        "Mpps per CPU-s",
        "idle CPU"
    );
    for case in cases(summary, |s| (s.frame_size, s.load_pools)) {
        let label = case_label(case);
        let of_case = |s: &&PvpSummary| (s.frame_size, s.load_pools) == case;
        for s in summary.iter().filter(of_case) {
            let m = format!("{:.2} [{:.2}-{:.2}]", s.mpps_median, s.mpps_min, s.mpps_max);
            println!(
                "  {:<15}{:<27}{m:<28}{:>7.2}{:>11.0}%{:>16.2}{:>9.1}%",
                label,
                s.contender,
                s.loss_pct_median,
                s.switch_cpu_pct_median,
                s.mpps_per_cpu_s_median,
                s.idle_cpu_pct_median
            );
        }
        let spreads: Vec<String> = (summary.iter().filter(of_case))
            .map(|s| format!("{} {:.1}%", s.contender, s.spread_pct))
            .collect();
        println!(
            "  {:<15}{:<27}{}",
            label,
            "spread (max-min)/median",
            spreads.join(", ")
        );
        for r in ratio
            .iter()
            .filter(|r| (r.frame_size, r.load_pools) == case)
        {
            println!(
                "  {:<15}{:<27}{:<28.2}{:>7}{:>12}{:>16.2}",
                label,
                format!("ratio {}", r.of),
                r.mpps,
                "",
                "",
                r.mpps_per_cpu_s
            );
        }
    }
    println!();
    for s in summary {
        println!(
            "RESULT pvp {} size={} pools={} mpps={:.3} mpps_tx={:.3} loss_pct={:.3} cpu_pct={:.1} \
             mpps_per_cpu_s={:.3} idle_cpu_pct={:.1} spread_pct={:.1} runs={}",
            s.contender,
            s.frame_size,
            s.load_pools,
            s.mpps_median,
            s.mpps_tx_median,
            s.loss_pct_median,
            s.switch_cpu_pct_median,
            s.mpps_per_cpu_s_median,
            s.idle_cpu_pct_median,
            s.spread_pct,
            s.runs
        );
    }
    for r in ratio {
        println!(
            "RESULT pvp {} size={} pools={} mpps_ratio={:.3} mpps_per_cpu_s_ratio={:.3}",
            r.of.replace(' ', ""),
            r.frame_size,
            r.load_pools,
            r.mpps,
            r.mpps_per_cpu_s
        );
    }
}

/// Run-to-run spread of `v`: (max - min) / median, % (0 for fewer than two values).
fn spread_pct(v: &[f64]) -> f64 {
    let m = median(v);
    if v.len() < 2 || m <= 0.0 {
        return 0.0;
    }
    let (lo, hi) = v
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    (hi - lo) / m * 100.0
}

/// Warns about runs during which other work kept the machine busy.
fn warn_if_busy(runs: &[PvpRun], loadavg: &str) {
    let busy: Vec<String> = runs
        .iter()
        .filter(|r| r.idle_other_busy_cpus > 0.3 || r.other_busy_cpus > 0.3)
        .map(|r| {
            format!(
                "#{} {} ({:.2} idle, {:.2} under load)",
                r.seq,
                case_label((r.frame_size, r.load_pools)),
                r.idle_other_busy_cpus,
                r.other_busy_cpus
            )
        })
        .collect();
    if !busy.is_empty() {
        println!(
            "warning: other work kept more than 0.3 CPUs busy (besides the switch and the \
             generator) during run(s) {} (load average at start {loadavg}): it competed with \
             the measurement; rerun on a quiet machine before quoting these",
            busy.join(", ")
        );
    }
}

/// Median Mpps with whiskers per frame size; switch CPU idle and under load; Mpps per
/// CPU-second; Mpps per second of every run, one panel per frame size.
fn pvp_svg(summary: &[PvpSummary], runs: &[PvpRun]) -> String {
    type Groups = Vec<(String, Vec<(String, f64)>)>;
    let by_size = |f: fn(&PvpSummary) -> (f64, f64, f64)| {
        let mut groups: Groups = Vec::new();
        let mut ranges: Vec<Vec<(f64, f64)>> = Vec::new();
        for case in cases(summary, |s| (s.frame_size, s.load_pools)) {
            let mine: Vec<&PvpSummary> = (summary.iter())
                .filter(|s| (s.frame_size, s.load_pools) == case)
                .collect();
            groups.push((
                case_label(case),
                mine.iter().map(|s| (s.contender.clone(), f(s).0)).collect(),
            ));
            ranges.push(mine.iter().map(|s| (f(s).1, f(s).2)).collect());
        }
        (groups, ranges)
    };
    let (g, r) = by_size(|s| (s.mpps_median, s.mpps_min, s.mpps_max));
    let mpps = plot::bar_chart_with_ranges(
        "Throughput: median Mpps received (whiskers: min-max; higher is better)",
        "Mpps",
        &g,
        &r,
    );
    // CPU: idle, then under load per frame size.
    let mut groups: Groups = Vec::new();
    let mut ranges: Vec<Vec<(f64, f64)>> = Vec::new();
    let all_cases = cases(summary, |s| (s.frame_size, s.load_pools));
    let first: Vec<&PvpSummary> = summary
        .iter()
        .filter(|s| Some(&(s.frame_size, s.load_pools)) == all_cases.first())
        .collect();
    groups.push((
        format!("idle ({IDLE_S} s, ports connected)"),
        first
            .iter()
            .map(|s| (s.contender.clone(), s.idle_cpu_pct_median))
            .collect(),
    ));
    ranges.push(
        first
            .iter()
            .map(|s| (s.idle_cpu_pct_min, s.idle_cpu_pct_max))
            .collect(),
    );
    for &case in &all_cases {
        groups.push((
            format!("{} load", case_label(case)),
            summary
                .iter()
                .filter(|s| (s.frame_size, s.load_pools) == case)
                .map(|s| (s.contender.clone(), s.switch_cpu_pct_median))
                .collect(),
        ));
        ranges.push(Vec::new());
    }
    let cpu = plot::bar_chart_with_ranges(
        "Switch process CPU % (100 = one core; median, idle with min-max)",
        "CPU %",
        &groups,
        &ranges,
    );
    let (g, r) = by_size(|s| {
        (
            s.mpps_per_cpu_s_median,
            s.mpps_per_cpu_s_min,
            s.mpps_per_cpu_s_max,
        )
    });
    let eff = plot::bar_chart_with_ranges(
        "Efficiency: Mpps per switch CPU-second (median, min-max; higher is better)",
        "Mpps per CPU-second",
        &g,
        &r,
    );
    let mut charts = vec![mpps, cpu, eff];
    for case in cases(runs, |r| (r.frame_size, r.load_pools)) {
        let mut mine: Vec<&PvpRun> = (runs.iter())
            .filter(|r| (r.frame_size, r.load_pools) == case)
            .collect();
        if mine.is_empty() {
            continue;
        }
        mine.sort_by_key(|r| (CONTENDERS.iter().position(|c| *c == r.contender), r.round));
        let series: Vec<Series> = mine
            .iter()
            .map(|r| Series {
                name: format!("{} run {} (#{})", r.contender, r.round, r.seq),
                points: r.samples.iter().map(|s| (s.t_s, s.mpps_rx)).collect(),
            })
            .collect();
        charts.push(plot::line_chart(
            &format!(
                "{}: Mpps received per second, every run (#: setup order)",
                case_label(case)
            ),
            "seconds since the traffic started",
            "Mpps",
            &series,
            &[],
        ));
    }
    plot::stack(&charts)
}

// ---------------------------------------------------------------------------------------------
// The firewall's contenders (`--firewall`)

/// OVS-DPDK's stateful table (issue 31): untracked IP goes through conntrack, a new
/// connection is committed, an established one passes; ARP and other non-IP frames NORMAL.
/// A one-way UDP flow stays `+new` in OVS's conntrack (as in Linux's: a UDP connection is
/// established once a reply is seen), so every frame of the load takes the `ct(commit)` flow
/// (the flows' counters in each run's `ct` show it; `+est` counts nothing).
const OVS_CT_FLOWS: &str = "table=0,priority=100,ip,ct_state=-trk,actions=ct(table=1)\n\
table=0,priority=0,actions=NORMAL\n\
table=1,priority=100,ip,ct_state=+trk+new,actions=ct(commit),NORMAL\n\
table=1,priority=100,ip,ct_state=+trk+est,actions=NORMAL\n\
table=1,priority=0,actions=drop\n";

/// The firewall contenders' table sizes and timeouts.
struct FwSettings {
    /// qswitch's `max_sessions` and OVS's `ct-set-maxconns`.
    max_sessions: u32,
    /// qswitch's `udp_unreplied` (None: its default, 30 s like OVS's).
    udp_unreplied: Option<u32>,
}

/// With `--firewall`: 1 Mi entries for a cycling load; with `--new-flows` 16 Mi (1.7 GiB in
/// qswitch), so that neither table is full within a run of a few seconds at a couple of
/// million new connections per second (a 5 s run and its 2 s warm-up at 2 Mpps make 14 M),
/// each switch with its default UDP timeout (30 s: nothing expires within a run), unless
/// `--udp-unreplied` shortens qswitch's (then it expires connections as it takes new ones).
fn fw_settings(b: &Bench) -> Option<FwSettings> {
    b.args.firewall.then(|| FwSettings {
        max_sessions: b.args.max_sessions.unwrap_or(if b.args.new_flows {
            1 << 24
        } else {
            1 << 20
        }),
        udp_unreplied: b.args.udp_unreplied,
    })
}

impl FwSettings {
    /// qswitch-fw's config: the plain contender's, both ports in the group, `[firewall]`.
    fn qswitch_toml(&self, dir: &str) -> String {
        let plain = qswitch_config(Path::new(dir));
        let mut s = plain.replace(
            "mode = \"server\"\n",
            &format!(
                "mode = \"server\"\nsecurity_groups = [\"{}\"]\n",
                super::fw::GROUP
            ),
        );
        s += &format!("\n[firewall]\nmax_sessions = {}\n", self.max_sessions);
        if let Some(t) = self.udp_unreplied {
            s += &format!("udp_unreplied = {t}\n");
        }
        s += "\n";
        s += &super::fw::group(
            r#"{ direction = "ingress", protocol = "udp", ports = "9", remote = "10.0.0.0/8" }"#,
        );
        s
    }
}

/// A connection table's counters at one moment.
#[derive(Debug, Clone)]
struct CtSnap {
    /// Entries in the table (qswitch: one per filtered port a connection crosses).
    sessions: u64,
    /// qswitch: connections opened, the most of any port (each connection opens one in
    /// each port's zone).
    new: Option<u64>,
    /// qswitch: new connections refused over `max_sessions` (`ct_limit`), all ports.
    refused: Option<u64>,
    /// OVS: each flow's packet count (the flow's match, `n_packets`).
    ovs_flows: Option<Vec<(String, u64)>>,
}

/// What a firewall contender's connection table did in one run (warm-up included).
#[derive(Debug, Clone, Serialize)]
pub struct CtRun {
    /// Entries at the end of the run.
    pub sessions_after: u64,
    /// Connections opened during the run (qswitch's `new`; OVS: its connection count's
    /// growth, which no connection leaves within a run: UDP's first timeout is 30 s).
    pub new: Option<u64>,
    /// qswitch: new connections refused over `max_sessions`.
    pub refused: Option<u64>,
    /// The distinct flows the load sent (qsload's `flows_sent`).
    pub flows_sent: u64,
    /// OVS: packets per flow during the run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ovs_flow_packets: Option<Vec<(String, u64)>>,
}

impl CtSnap {
    fn since(&self, before: &CtSnap, flows_sent: u64) -> CtRun {
        let delta = |a: Option<u64>, b: Option<u64>| a.map(|a| a.saturating_sub(b.unwrap_or(0)));
        let flows = self.ovs_flows.as_ref().map(|after| {
            after
                .iter()
                .map(|(m, n)| {
                    let was = (before.ovs_flows.iter().flatten())
                        .find(|(bm, _)| bm == m)
                        .map_or(0, |b| b.1);
                    (m.clone(), n.saturating_sub(was))
                })
                .collect::<Vec<_>>()
        });
        let new = match &flows {
            Some(_) => Some(self.sessions.saturating_sub(before.sessions)),
            None => delta(self.new, before.new),
        };
        CtRun {
            sessions_after: self.sessions,
            new,
            refused: delta(self.refused, before.refused),
            flows_sent,
            ovs_flow_packets: flows,
        }
    }
}

/// A run's connection counts, for its progress line.
fn ct_line(c: &CtRun) -> String {
    let mut s = format!("{} sessions", c.sessions_after);
    if let Some(n) = c.new {
        s += &format!(", {n} new");
    }
    if let Some(r) = c.refused.filter(|&r| r > 0) {
        s += &format!(", {r} refused");
    }
    s
}

/// `ovs-ofctl dump-flows` lines as (match, n_packets).
fn parse_ovs_flows(dump: &str) -> Vec<(String, u64)> {
    dump.lines()
        .filter_map(|l| {
            let n = l
                .split("n_packets=")
                .nth(1)?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            let table = l.split("table=").nth(1)?.split(',').next()?;
            let rest = l.split("priority=").nth(1)?;
            let key = rest.split(" actions=").next()?;
            Some((format!("table={table},priority={key}"), n))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Frames

/// An IPv4/UDP frame of `len` bytes (without FCS) from `src` to `dst`.
fn udp_frame(len: usize, src: [u8; 6], dst: [u8; 6]) -> Vec<u8> {
    let len = len.max(60);
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((len - 14) as u16).to_be_bytes());
    ip[8] = 64; // TTL
    ip[9] = 17; // UDP
    ip[12..16].copy_from_slice(&[198, 18, 0, 1]);
    ip[16..20].copy_from_slice(&[198, 18, 0, 2]);
    let sum = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum::<u32>();
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = !((sum & 0xffff) + (sum >> 16)) as u16;
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    let udp = &mut f[34..42];
    udp[0..2].copy_from_slice(&1024u16.to_be_bytes());
    udp[2..4].copy_from_slice(&9u16.to_be_bytes()); // discard
    udp[4..6].copy_from_slice(&((len - 34) as u16).to_be_bytes());
    f
}

// ---------------------------------------------------------------------------------------------
// The generator thread

/// How the generator reaches the switch's two ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attach {
    /// The switch listens (qswitch, server mode); the generator connects.
    Connect,
    /// The generator listens; the switch connects (OVS `dpdkvhostuserclient`).
    Accept,
}

enum Cmd {
    Run { len: usize, seconds: u32 },
    Quit,
}

enum Ev {
    Ready(serde_json::Value),
    Started,
    Second(LoadStats),
    Done(GenDone),
    Failed(anyhow::Error),
}

struct GenDone {
    total: LoadStats,
    flooded: u64,
}

/// The load generator: one thread pinned to [`GEN_CPU`] owning both drivers. Dropping it
/// stops the thread (the drivers disconnect).
struct Gen {
    cmd: mpsc::Sender<Cmd>,
    ev: mpsc::Receiver<Ev>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long OVS gets to connect to each generator socket (it retries every second).
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the probes get to cross the switch, per direction.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

impl Gen {
    /// Starts the thread, attaches to both ports and has the switch learn both MACs.
    /// Returns the negotiated features (for the record).
    fn start(
        b: &Bench,
        attach: Attach,
        (sock_a, sock_b): (PathBuf, PathBuf),
    ) -> anyhow::Result<(Gen, serde_json::Value)> {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (ev_tx, ev_rx) = mpsc::channel::<Ev>();
        let stop = Arc::new(AtomicBool::new(false));
        let flags = (stop.clone(), b.interrupted.clone());
        let thread = std::thread::Builder::new()
            .name("pvp-gen".into())
            .spawn(move || generator(attach, (sock_a, sock_b), flags, cmd_rx, ev_tx))
            .context("cannot start the generator thread")?;
        let gen = Gen {
            cmd: cmd_tx,
            ev: ev_rx,
            stop,
            thread: Some(thread),
        };
        let limit = 2 * ACCEPT_TIMEOUT + 2 * PROBE_TIMEOUT + Duration::from_secs(5);
        match gen.next(b, limit, "attach")? {
            Ev::Ready(info) => Ok((gen, info)),
            Ev::Failed(e) => Err(e.context("load generator")),
            _ => bail!("load generator: unexpected event"),
        }
    }

    /// The next event, waiting up to `limit` (and failing on Ctrl-C).
    fn next(&self, b: &Bench, limit: Duration, what: &str) -> anyhow::Result<Ev> {
        let deadline = Instant::now() + limit;
        loop {
            b.check()?;
            match self.ev.recv_timeout(Duration::from_millis(50)) {
                Ok(ev) => return Ok(ev),
                Err(RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
                Err(RecvTimeoutError::Timeout) => {
                    bail!(
                        "load generator: no answer to {what} within {} s",
                        limit.as_secs()
                    )
                }
                Err(RecvTimeoutError::Disconnected) => bail!("load generator thread died"),
            }
        }
    }

    /// Sends `len`-byte frames A → B for `seconds`, calling `event` with None just before
    /// the first frame and with every second's counts after it.
    fn run(
        &self,
        b: &Bench,
        len: usize,
        seconds: u32,
        event: &mut dyn FnMut(Option<&LoadStats>) -> anyhow::Result<()>,
    ) -> anyhow::Result<GenDone> {
        self.cmd
            .send(Cmd::Run { len, seconds })
            .map_err(|_| anyhow!("load generator thread died"))?;
        let limit = PROBE_TIMEOUT * 2 + Duration::from_secs(5);
        loop {
            match self.next(b, limit, "a run")? {
                Ev::Started => event(None)?,
                Ev::Second(st) => event(Some(&st))?,
                Ev::Done(d) => return Ok(d),
                Ev::Failed(e) => return Err(e.context("load generator")),
                Ev::Ready(_) => bail!("load generator: unexpected event"),
            }
        }
    }
}

impl Drop for Gen {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.cmd.send(Cmd::Quit);
        if let Some(t) = self.thread.take() {
            // Bounded: the thread checks `stop` at least every second (accept: every 2 ms).
            let deadline = Instant::now() + Duration::from_secs(5);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// Stop flags the generator thread watches: its own, and Ctrl-C.
type Flags = (Arc<AtomicBool>, Arc<AtomicBool>);

fn stopped(flags: &Flags) -> bool {
    flags.0.load(Ordering::Relaxed) || flags.1.load(Ordering::Relaxed)
}

/// The generator thread's body.
fn generator(
    attach: Attach,
    socks: (PathBuf, PathBuf),
    flags: Flags,
    cmd: mpsc::Receiver<Cmd>,
    ev: mpsc::Sender<Ev>,
) {
    let setup = || -> anyhow::Result<(Driver, Driver, serde_json::Value)> {
        qswitch_sys::thread::pin_current_thread(GEN_CPU)
            .with_context(|| format!("cannot pin the generator to CPU {GEN_CPU}"))?;
        let opts = DriverOptions {
            request_calls: false,
            ..DriverOptions::default()
        };
        let open = |path: &Path| -> anyhow::Result<Driver> {
            let d = match attach {
                Attach::Connect => Driver::connect(path, opts.clone()),
                Attach::Accept => accept(path, &opts, &flags),
            };
            d.with_context(|| format!("cannot attach to {}", path.display()))
        };
        let mut a = open(&socks.0)?;
        let mut b = open(&socks.1)?;
        learn(&mut a, &mut b, &flags)?;
        let info = serde_json::json!({
            "features": format!("{:#x}", a.features()),
            "protocol_features": format!("{:#x}", a.protocol_features()),
            "hdr_len": a.hdr_len(),
            "queue_size": a.queue_size(),
        });
        Ok((a, b, info))
    };
    let (mut a, mut b) = match setup() {
        Ok((a, b, info)) => {
            let _ = ev.send(Ev::Ready(info));
            (a, b)
        }
        Err(e) => {
            let _ = ev.send(Ev::Failed(e));
            return;
        }
    };
    while let Ok(Cmd::Run { len, seconds }) = cmd.recv() {
        let out = match traffic_loop(&mut a, &mut b, len, seconds, &flags, &ev) {
            Ok(done) => Ev::Done(done),
            Err(e) => Ev::Failed(e),
        };
        if ev.send(out).is_err() {
            break;
        }
    }
}

/// [`Driver::accept`] in 200 ms slices, so that Ctrl-C is seen.
fn accept(
    path: &Path,
    opts: &DriverOptions,
    flags: &Flags,
) -> Result<Driver, qswitch_virtio_driver::Error> {
    let deadline = Instant::now() + ACCEPT_TIMEOUT;
    loop {
        match Driver::accept(path, opts.clone(), Duration::from_millis(200)) {
            Err(qswitch_virtio_driver::Error::Timeout(_))
                if Instant::now() < deadline && !stopped(flags) => {}
            Err(qswitch_virtio_driver::Error::Timeout(_)) if !stopped(flags) => {
                return Err(qswitch_virtio_driver::Error::Timeout(format!(
                    "the switch did not connect to {} within {} s",
                    path.display(),
                    ACCEPT_TIMEOUT.as_secs()
                )))
            }
            other => return other,
        }
    }
}

/// Sends one frame B→A, then one A→B, each until one crosses: the switch then knows both
/// MACs, and the path works.
fn learn(a: &mut Driver, b: &mut Driver, flags: &Flags) -> anyhow::Result<()> {
    probe(b, a, udp_frame(60, MAC_B, MAC_A), MAC_B, flags).context("B -> A")?;
    probe(a, b, udp_frame(60, MAC_A, MAC_B), MAC_A, flags).context("A -> B")?;
    Ok(())
}

/// Sends `frame` on `tx` every 100 ms until a frame from `src` arrives on `rx`.
fn probe(
    tx: &mut Driver,
    rx: &mut Driver,
    frame: Vec<u8>,
    src: [u8; 6],
    flags: &Flags,
) -> anyhow::Result<()> {
    let hdr = vec![0u8; tx.hdr_len()];
    let off = rx.hdr_len();
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut buf = Vec::new();
    while Instant::now() < deadline {
        if stopped(flags) {
            bail!("stopped");
        }
        tx.send(0, &hdr, &frame)?;
        let until = Instant::now() + Duration::from_millis(100);
        while Instant::now() < until {
            match rx.recv(0, &mut buf)? {
                Some(_) if buf.get(off + 6..off + 12) == Some(&src[..]) => return Ok(()),
                Some(_) => {}
                None => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    }
    bail!(
        "no frame crossed the switch within {} s",
        PROBE_TIMEOUT.as_secs()
    )
}

/// Receives and drops whatever is pending on `d`, until nothing has come for 20 ms.
fn drain(d: &mut Driver) -> anyhow::Result<u64> {
    let mut n = 0;
    let mut quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(20) {
        let (k, _) = d.recv_discard(0, 256)?;
        if k > 0 {
            n += k;
            quiet = Instant::now();
        }
        d.tx_in_flight(0)?;
    }
    Ok(n)
}

/// One run: learn again, then A→B in 1-second slices (a sample each), a 100 ms drain at
/// the end, and count what reached A.
fn traffic_loop(
    a: &mut Driver,
    b: &mut Driver,
    len: usize,
    seconds: u32,
    flags: &Flags,
    ev: &mpsc::Sender<Ev>,
) -> anyhow::Result<GenDone> {
    learn(a, b, flags)?;
    drain(a)?;
    drain(b)?;
    let frame = udp_frame(len, MAC_A, MAC_B);
    let hdr = vec![0u8; a.hdr_len()];
    let mut total = LoadStats::default();
    let _ = ev.send(Ev::Started);
    for s in 0..seconds {
        if stopped(flags) {
            bail!("stopped");
        }
        let mut spec = LoadSpec::new(&hdr, &frame, Duration::from_secs(1));
        if s + 1 == seconds {
            spec.drain = Duration::from_millis(100);
        }
        let st = poll_loop_between(a, b, &spec)?;
        total.tx_pkts += st.tx_pkts;
        total.rx_pkts += st.rx_pkts;
        total.rx_bytes += st.rx_bytes;
        total.tx_ring_full += st.tx_ring_full;
        total.elapsed += st.elapsed;
        let _ = ev.send(Ev::Second(st));
    }
    let flooded = drain(a)?;
    Ok(GenDone { total, flooded })
}

// ---------------------------------------------------------------------------------------------
// The switches

/// CPU time of a switch process and of its one worker / PMD thread, in seconds.
#[derive(Clone, Debug)]
struct CpuSnap {
    process_s: f64,
    worker_s: f64,
}

impl CpuSnap {
    /// (process %, worker %) of one core since `earlier`, over `wall_s` seconds.
    fn since(&self, earlier: &CpuSnap, wall_s: f64) -> (f64, f64) {
        let pct = |d: f64| (d / wall_s.max(1e-9) * 100.0).max(0.0);
        (
            pct(self.process_s - earlier.process_s),
            pct(self.worker_s - earlier.worker_s),
        )
    }
}

/// A switch with two ports the generator can attach to; dropping it stops it and removes
/// everything it made.
trait Switch {
    fn attach(&self) -> Attach;
    /// Socket paths of ports A and B.
    fn sockets(&self) -> (PathBuf, PathBuf);
    fn cpu(&self) -> anyhow::Result<CpuSnap>;
    /// The connection table's counters (the firewall's contenders; None for the others).
    fn ct(&self) -> anyhow::Result<Option<CtSnap>> {
        Ok(None)
    }
}

/// `qswitch run` with one worker on [`SWITCH_CPU`] and two vhost-user ports in server mode.
/// Field order is drop order: the daemon stops before its directory goes.
struct QswitchSwitch {
    daemon: LabDaemon,
    dir: RemoveDir,
    /// qswitch-fw: its ports are filtered (`ct stats` has something to say).
    fw: bool,
}

/// Environment variable: TOML appended to the qswitch contender's config (after its two
/// ports), `{dir}` replaced by its run directory: a feature's cost measured as "the same
/// switch with and without it" (`bench/before-after.sh BIN BIN:FILE ...`), e.g. a
/// `[switch.ipfix]` table or a `[[mirror]]` session of port `a`.
pub const EXTRA_ENV: &str = "QSWITCH_BENCH_EXTRA";

fn qswitch_config(dir: &Path) -> String {
    let extra = std::env::var(EXTRA_ENV).unwrap_or_default();
    format!(
        "[switch]\nworkers = \"{SWITCH_CPU}\"\ncontrol = \"{d}/control.sock\"\n\n\
         [[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"{d}/a.sock\"\nmode = \"server\"\n\n\
         [[port]]\nname = \"b\"\ntype = \"vhost-user\"\nsocket = \"{d}/b.sock\"\nmode = \"server\"\n{extra}",
        d = dir.display(),
        extra = extra.replace("{dir}", &dir.display().to_string()),
    )
}

impl QswitchSwitch {
    fn start(id: u32, seq: usize) -> anyhow::Result<QswitchSwitch> {
        let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-pvp-{id}-{seq}")));
        let _ = std::fs::remove_dir_all(&dir.0);
        let daemon = LabDaemon::start(&dir.0, &qswitch_config(&dir.0))?;
        Ok(QswitchSwitch {
            daemon,
            dir,
            fw: false,
        })
    }

    /// qswitch-fw: both ports in the benchmark's security group.
    fn start_fw(id: u32, seq: usize, fw: Option<&FwSettings>) -> anyhow::Result<QswitchSwitch> {
        let fw = fw.context("qswitch-fw needs --firewall")?;
        let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-pvp-{id}-{seq}")));
        let _ = std::fs::remove_dir_all(&dir.0);
        let config = fw.qswitch_toml(&dir.0.display().to_string());
        let daemon = LabDaemon::start(&dir.0, &config)?;
        Ok(QswitchSwitch {
            daemon,
            dir,
            fw: true,
        })
    }
}

impl Switch for QswitchSwitch {
    fn attach(&self) -> Attach {
        Attach::Connect
    }
    fn sockets(&self) -> (PathBuf, PathBuf) {
        (self.dir.0.join("a.sock"), self.dir.0.join("b.sock"))
    }
    fn cpu(&self) -> anyhow::Result<CpuSnap> {
        let s = self.daemon.stats()?;
        Ok(CpuSnap {
            process_s: s.process_cpu_ns as f64 / 1e9,
            worker_s: s.workers.iter().map(|w| w.cpu_ns).sum::<u64>() as f64 / 1e9,
        })
    }
    fn ct(&self) -> anyhow::Result<Option<CtSnap>> {
        if !self.fw {
            return Ok(None);
        }
        let r = super::fw::ct_stats(&self.daemon.control)?;
        let sum = |f: fn(&qswitch_api::request::CtPortStats) -> u64| r.ports.iter().map(f).sum();
        Ok(Some(CtSnap {
            sessions: u64::from(r.sessions),
            new: r.ports.iter().map(|p| p.new).max(),
            refused: Some(sum(|p| p.ct_limit)),
            ovs_flows: None,
        }))
    }
}

/// Whether OVS-DPDK can be tried: its binaries (installing the package if needed).
fn ovs_check(b: &Bench) -> anyhow::Result<()> {
    if !Path::new(OVS_VSWITCHD).exists() {
        b.say(format_args!(
            "{OVS_VSWITCHD} is missing: installing {OVS_PACKAGE}"
        ));
        netns::ensure_tool(OVS_VSWITCHD, OVS_PACKAGE)
            .with_context(|| format!("OVS-DPDK ({OVS_PACKAGE}) is not available"))?;
    }
    for tool in ["ovsdb-tool", "ovsdb-server", "ovs-vsctl"] {
        if !netns::have(tool) {
            bail!("{tool} is missing (package openvswitch-switch)");
        }
    }
    if !Path::new(OVS_SCHEMA).exists() {
        bail!("{OVS_SCHEMA} is missing (package openvswitch-common)");
    }
    Ok(())
}

/// `ovs-vswitchd-dpdk --version`: "ovs-vswitchd-dpdk (Open vSwitch) 3.1.0, DPDK 22.11.x".
fn ovs_version() -> String {
    netns::run(&[OVS_VSWITCHD, "--version"])
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

fn dpdk_extra(prefix: &str) -> String {
    format!("--no-huge --legacy-mem -m 2048 --iova-mode=va --no-pci --file-prefix {prefix}")
}

fn pmd_mask() -> String {
    format!("{:#x}", 1u64 << SWITCH_CPU)
}

/// OVS-DPDK in a private run directory: `ovsdb-server`, `ovs-vswitchd-dpdk` with one PMD on
/// [`SWITCH_CPU`], a netdev bridge with two `dpdkvhostuserclient` ports. Dropping it stops
/// both daemons and removes the bridge's TAP, the datapath's TAP (if this run created it),
/// the DPDK runtime directory and the run directory.
struct OvsSwitch {
    vswitchd: ChildGuard,
    ovsdb: ChildGuard,
    pid: u32,
    dir: PathBuf,
    bridge: String,
    prefix: String,
    remove_dp_tap: bool,
    clk_tck: f64,
    /// ovs-dpdk-ct: the `ct()` table replaced NORMAL.
    ct: bool,
}

/// Runs `cmd` with the private OVS environment, waiting at most `timeout`.
fn ovs_cmd(dir: &Path, args: &[&str], timeout: Duration) -> anyhow::Result<String> {
    let mut child = Command::new(args[0])
        .args(&args[1..])
        .envs(ovs_env(dir))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", args[0]))?;
    let deadline = Instant::now() + timeout;
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("`{}` did not finish within {timeout:?}", args.join(" "));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn ovs_env(dir: &Path) -> Vec<(&'static str, PathBuf)> {
    ["OVS_RUNDIR", "OVS_DBDIR", "OVS_LOGDIR", "OVS_SYSCONFDIR"]
        .into_iter()
        .map(|k| (k, dir.to_path_buf()))
        .collect()
}

fn link_exists(name: &str) -> bool {
    Path::new("/sys/class/net").join(name).exists()
}

impl OvsSwitch {
    fn start(b: &Bench, seq: usize) -> anyhow::Result<OvsSwitch> {
        let id = b.id;
        let dir = std::env::temp_dir().join(format!("qswitch-bench-pvp-{id}-{seq}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let d = dir.display().to_string();
        let db_sock = format!("unix:{d}/db.sock");
        let remove_dp_tap = !link_exists(OVS_DP_TAP);
        let mut ovs = OvsSwitch {
            vswitchd: ChildGuard(None),
            ovsdb: ChildGuard(None),
            pid: 0,
            bridge: format!("qspvp{}", id % 100_000),
            prefix: format!("qspvp{id}-{seq}"),
            dir,
            remove_dp_tap,
            clk_tck: clk_tck(),
            ct: false,
        };
        let dir = ovs.dir.clone();
        let t = Duration::from_secs(10);
        ovs_cmd(
            &dir,
            &["ovsdb-tool", "create", &format!("{d}/conf.db"), OVS_SCHEMA],
            t,
        )?;
        let spawn = |args: Vec<String>, log: &str| -> anyhow::Result<ChildGuard> {
            let out = std::fs::File::create(dir.join(log))?;
            let child = Command::new(&args[0])
                .args(&args[1..])
                .envs(ovs_env(&dir))
                .stdin(Stdio::null())
                .stdout(out.try_clone()?)
                .stderr(out)
                .spawn()
                .with_context(|| format!("cannot start {}", args[0]))?;
            Ok(ChildGuard(Some(child)))
        };
        ovs.ovsdb = spawn(
            vec![
                "ovsdb-server".into(),
                format!("{d}/conf.db"),
                format!("--remote=punix:{d}/db.sock"),
                format!("--pidfile={d}/ovsdb-server.pid"),
                format!("--unixctl={d}/ovsdb-server.ctl"),
                format!("--log-file={d}/ovsdb-server.log"),
                "-vconsole:off".into(),
            ],
            "ovsdb-server.out",
        )?;
        let vsctl = |args: &[&str], timeout: Duration| {
            let db = format!("--db={db_sock}");
            let to = format!("--timeout={}", timeout.as_secs().max(1));
            let mut full = vec!["ovs-vsctl", &db, &to];
            full.extend_from_slice(args);
            ovs_cmd(&dir, &full, timeout + Duration::from_secs(2))
        };
        // The database answers once its socket is there.
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Err(e) = vsctl(&["--no-wait", "init"], Duration::from_secs(1)) {
            b.check()?;
            if let Some(st) = ovs.ovsdb.wait_timeout(Duration::from_millis(100))? {
                bail!(
                    "ovsdb-server exited ({st}): {}",
                    log_tail(&dir, "ovsdb-server.log")
                );
            }
            if Instant::now() > deadline {
                return Err(e.context("ovsdb-server did not answer within 10 s"));
            }
        }
        let extra = format!("other_config:dpdk-extra={}", dpdk_extra(&ovs.prefix));
        let mask = format!("other_config:pmd-cpu-mask={}", pmd_mask());
        vsctl(
            &[
                "--no-wait",
                "set",
                "Open_vSwitch",
                ".",
                "other_config:dpdk-init=true",
                &extra,
                &mask,
            ],
            t,
        )?;
        ovs.vswitchd = spawn(
            vec![
                OVS_VSWITCHD.into(),
                db_sock.clone(),
                format!("--pidfile={d}/ovs-vswitchd.pid"),
                format!("--unixctl={d}/ovs-vswitchd.ctl"),
                format!("--log-file={d}/ovs-vswitchd.log"),
                "-vconsole:off".into(),
            ],
            "ovs-vswitchd.out",
        )?;
        ovs.pid = ovs.vswitchd.0.as_ref().map_or(0, |c| c.id());
        // DPDK's EAL comes up (or the daemon dies).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            b.check()?;
            if let Some(st) = ovs.vswitchd.wait_timeout(Duration::from_millis(200))? {
                bail!(
                    "ovs-vswitchd-dpdk exited during start-up ({st}): {}",
                    log_tail(&dir, "ovs-vswitchd.log")
                );
            }
            let init = vsctl(
                &["get", "Open_vSwitch", ".", "dpdk_initialized"],
                Duration::from_secs(2),
            );
            if matches!(init.as_deref(), Ok("true")) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "DPDK did not initialise within 30 s: {}",
                    log_tail(&dir, "ovs-vswitchd.log")
                );
            }
        }
        let br = ovs.bridge.clone();
        let opt_a = format!("options:vhost-server-path={d}/a.sock");
        let opt_b = format!("options:vhost-server-path={d}/b.sock");
        vsctl(
            &[
                "add-br",
                &br,
                "--",
                "set",
                "bridge",
                &br,
                "datapath_type=netdev",
                "--",
                "add-port",
                &br,
                "a",
                "--",
                "set",
                "Interface",
                "a",
                "type=dpdkvhostuserclient",
                &opt_a,
                "--",
                "add-port",
                &br,
                "b",
                "--",
                "set",
                "Interface",
                "b",
                "type=dpdkvhostuserclient",
                &opt_b,
            ],
            Duration::from_secs(15),
        )
        .map_err(|e| e.context(log_tail(&dir, "ovs-vswitchd.log")))?;
        // ovs-vswitchd starts its PMD thread after the transaction that added the ports
        // has committed; on a busy machine that can be a moment after ovs-vsctl returns.
        let deadline = Instant::now() + Duration::from_secs(10);
        while ovs.pmd_tid().is_none() {
            if Instant::now() > deadline {
                bail!("no PMD thread in ovs-vswitchd within 10 s of adding the ports");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(ovs)
    }

    /// ovs-dpdk-ct: [`OVS_CT_FLOWS`] instead of NORMAL, conntrack sized by `fw`.
    fn ct_table(mut self, fw: Option<&FwSettings>) -> anyhow::Result<OvsSwitch> {
        let fw = fw.context("ovs-dpdk-ct needs --firewall")?;
        let t = Duration::from_secs(10);
        let file = self.dir.join("ct.flows");
        std::fs::write(&file, OVS_CT_FLOWS)?;
        let file = file.display().to_string();
        ovs_cmd(&self.dir, &["ovs-ofctl", "del-flows", &self.bridge], t)?;
        ovs_cmd(
            &self.dir,
            &["ovs-ofctl", "add-flows", &self.bridge, &file],
            t,
        )?;
        self.appctl(&["dpctl/ct-set-maxconns", &fw.max_sessions.to_string()])?;
        self.ct = true;
        Ok(self)
    }

    /// `ovs-appctl` to this vswitchd.
    fn appctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let ctl = self.dir.join("ovs-vswitchd.ctl").display().to_string();
        let mut full = vec!["ovs-appctl", "-t", &ctl];
        full.extend_from_slice(args);
        ovs_cmd(&self.dir, &full, Duration::from_secs(10))
    }

    /// The PMD thread's id (the thread whose name starts with "pmd").
    fn pmd_tid(&self) -> Option<u32> {
        thread_named(self.pid, "pmd")
    }
}

/// `utime + stime` (fields 14 and 15) of a `/proc/.../stat` file, in clock ticks.
fn stat_ticks(path: &str) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    parse_stat_ticks(&stat).with_context(|| format!("cannot parse {path}"))
}

fn parse_stat_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may hold spaces and parentheses: count after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let mut f = rest.split_ascii_whitespace().skip(11);
    Some(f.next()?.parse::<u64>().ok()? + f.next()?.parse::<u64>().ok()?)
}

/// The last error-ish lines of an OVS log in `dir` (EAL, ERR, EMER, WARN), on one line.
fn log_tail(dir: &Path, log: &str) -> String {
    let text = std::fs::read_to_string(dir.join(log)).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.contains("EAL") || l.contains("|ERR|") || l.contains("|EMER|") || l.contains("|WARN|")
        })
        .collect();
    let tail = &lines[lines.len().saturating_sub(4)..];
    if tail.is_empty() {
        format!("(nothing in {log})")
    } else {
        format!("{log}: {}", tail.join(" / "))
    }
}

impl Switch for OvsSwitch {
    fn attach(&self) -> Attach {
        Attach::Accept
    }
    fn sockets(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("a.sock"), self.dir.join("b.sock"))
    }
    fn cpu(&self) -> anyhow::Result<CpuSnap> {
        cpu_of(self.pid, self.pmd_tid(), self.clk_tck)
    }
    fn ct(&self) -> anyhow::Result<Option<CtSnap>> {
        if !self.ct {
            return Ok(None);
        }
        let n = self.appctl(&["dpctl/ct-get-nconns"])?;
        let dump = ovs_cmd(
            &self.dir,
            &["ovs-ofctl", "dump-flows", &self.bridge],
            Duration::from_secs(10),
        )?;
        Ok(Some(CtSnap {
            sessions: n
                .trim()
                .parse()
                .with_context(|| format!("ct-get-nconns: {n}"))?,
            new: None,
            refused: None,
            ovs_flows: Some(parse_ovs_flows(&dump)),
        }))
    }
}

/// The CPU of process `pid` and of its thread `worker` (0 without one), from `/proc`.
fn cpu_of(pid: u32, worker: Option<u32>, clk_tck: f64) -> anyhow::Result<CpuSnap> {
    let process = stat_ticks(&format!("/proc/{pid}/stat"))?;
    let worker = match worker {
        Some(tid) => stat_ticks(&format!("/proc/{pid}/task/{tid}/stat"))?,
        None => 0,
    };
    Ok(CpuSnap {
        process_s: process as f64 / clk_tck,
        worker_s: worker as f64 / clk_tck,
    })
}

/// The first thread of `pid` whose name starts with `prefix`.
fn thread_named(pid: u32, prefix: &str) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    tasks.flatten().find_map(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
        if comm.starts_with(prefix) {
            t.file_name().to_str()?.parse().ok()
        } else {
            None
        }
    })
}

/// `getconf CLK_TCK` (100 if it cannot be read).
fn clk_tck() -> f64 {
    netns::run(&["getconf", "CLK_TCK"])
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

impl Drop for OvsSwitch {
    fn drop(&mut self) {
        self.vswitchd.stop();
        self.ovsdb.stop();
        let mut links = vec![self.bridge.clone()];
        if self.remove_dp_tap {
            links.push(OVS_DP_TAP.to_string());
        }
        for l in links.iter().filter(|l| link_exists(l)) {
            let _ = Command::new("ip")
                .args(["link", "del", l])
                .stderr(Stdio::null())
                .status();
        }
        for runtime in ["/var/run/dpdk", "/run/dpdk"] {
            let _ = std::fs::remove_dir_all(Path::new(runtime).join(&self.prefix));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether testpmd can run: `dpdk-testpmd` (Debian's `dpdk-dev`) on the PATH.
fn testpmd_check() -> anyhow::Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(TESTPMD).is_file()));
    if !found {
        bail!("{TESTPMD} is not installed (Debian package dpdk-dev)");
    }
    Ok(())
}

/// testpmd's command line: main lcore on the load's CPU (it sleeps there, waking once a
/// second), the one forwarding lcore on [`SWITCH_CPU`], two `net_vhost` server ports, `io`
/// forwarding with the same rings and bursts as the load.
fn testpmd_args(dir: &Path, prefix: &str) -> Vec<String> {
    let d = dir.display();
    [
        TESTPMD.to_string(),
        format!("-l{GEN_CPU},{SWITCH_CPU}"),
        format!("--main-lcore={GEN_CPU}"),
        "--no-huge".into(),
        "-m1024".into(),
        "--no-pci".into(),
        "--iova-mode=va".into(),
        format!("--file-prefix={prefix}"),
        format!("--vdev=net_vhost0,iface={d}/a.sock,queues=1"),
        format!("--vdev=net_vhost1,iface={d}/b.sock,queues=1"),
        "--".into(),
        "--forward-mode=io".into(),
        "--nb-cores=1".into(),
        "--rxd=1024".into(),
        "--txd=1024".into(),
        "--burst=32".into(),
        "--total-num-mbufs=16384".into(),
        "--auto-start".into(),
        // Non-interactive testpmd waits on stdin unless it prints statistics periodically.
        "--stats-period=3600".into(),
    ]
    .into_iter()
    .collect()
}

/// DPDK testpmd forwarding between two vhost-user server ports (`io`: no lookup). Dropping
/// it stops testpmd and removes its DPDK runtime directory and the run directory.
struct TestpmdSwitch {
    child: ChildGuard,
    pid: u32,
    dir: PathBuf,
    prefix: String,
    clk_tck: f64,
}

impl TestpmdSwitch {
    fn start(b: &Bench, seq: usize) -> anyhow::Result<TestpmdSwitch> {
        let dir = std::env::temp_dir().join(format!("qswitch-bench-pvp-{}-{seq}", b.id));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let prefix = format!("qstpm{}-{seq}", b.id);
        let args = testpmd_args(&dir, &prefix);
        let out = std::fs::File::create(dir.join("testpmd.out"))?;
        let child = Command::new(&args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("cannot start {TESTPMD}"))?;
        let mut t = TestpmdSwitch {
            pid: child.id(),
            child: ChildGuard(Some(child)),
            dir,
            prefix,
            clk_tck: clk_tck(),
        };
        // Up when both server sockets exist (or testpmd died); the load may connect from
        // then on. Its output is block-buffered: nothing to wait for there.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            b.check()?;
            if let Some(st) = t.child.wait_timeout(Duration::from_millis(100))? {
                bail!("{TESTPMD} exited during start-up ({st}): {}", t.log_tail());
            }
            let (a, s) = t.sockets();
            if a.exists() && s.exists() {
                break;
            }
            if Instant::now() > deadline {
                bail!("{TESTPMD} made no sockets within 30 s: {}", t.log_tail());
            }
        }
        Ok(t)
    }

    /// The last lines of testpmd's output, on one line.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("testpmd.out")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        lines[lines.len().saturating_sub(4)..].join(" / ")
    }
}

impl Switch for TestpmdSwitch {
    fn attach(&self) -> Attach {
        Attach::Connect
    }
    fn sockets(&self) -> (PathBuf, PathBuf) {
        (self.dir.join("a.sock"), self.dir.join("b.sock"))
    }
    fn cpu(&self) -> anyhow::Result<CpuSnap> {
        // DPDK names the forwarding lcore's thread `lcore-worker-N` (`rte-worker-N` later).
        let worker =
            thread_named(self.pid, "lcore-worker").or_else(|| thread_named(self.pid, "rte-worker"));
        cpu_of(self.pid, worker, self.clk_tck)
    }
}

impl Drop for TestpmdSwitch {
    fn drop(&mut self) {
        self.child.stop();
        for runtime in ["/var/run/dpdk", "/run/dpdk"] {
            let _ = std::fs::remove_dir_all(Path::new(runtime).join(&self.prefix));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_frame_is_valid() {
        for len in [60, 1514] {
            let f = udp_frame(len, MAC_A, MAC_B);
            assert_eq!(f.len(), len);
            assert_eq!((&f[0..6], &f[6..12]), (&MAC_B[..], &MAC_A[..]));
            assert_eq!(
                usize::from(u16::from_be_bytes([f[16], f[17]])),
                len - 14,
                "IP total length"
            );
            // The IPv4 header sums to 0xffff with its checksum.
            let sum: u32 = f[14..34]
                .chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum();
            let folded = (sum & 0xffff) + (sum >> 16);
            assert_eq!((folded & 0xffff) + (folded >> 16), 0xffff);
        }
    }

    #[test]
    fn ovs_flows_parse_and_firewall_ratios() {
        let dump = " cookie=0x0, duration=3.1s, table=1, n_packets=91336, n_bytes=5480160, \
                    priority=100,ct_state=+new+trk,ip actions=ct(commit),NORMAL\n\
                    NXST_FLOW reply (xid=0x4):\n";
        assert_eq!(
            parse_ovs_flows(dump),
            vec![(
                "table=1,priority=100,ct_state=+new+trk,ip".to_string(),
                91336
            )]
        );
        let runs = [
            run("qswitch", 64, 10.0, 100.0, 0.0),
            run("ovs-dpdk", 64, 5.0, 100.0, 100.0),
            run("qswitch-fw", 64, 8.0, 100.0, 0.0),
            run("ovs-dpdk-ct", 64, 2.0, 100.0, 100.0),
        ];
        let (_, r) = summarise(&CONTENDERS, &runs);
        let of: Vec<(&str, f64)> = r.iter().map(|r| (r.of.as_str(), r.mpps)).collect();
        assert_eq!(
            of,
            [
                ("qswitch / ovs-dpdk", 2.0),
                ("qswitch-fw / qswitch", 0.8),
                ("qswitch-fw / ovs-dpdk-ct", 4.0),
                ("ovs-dpdk-ct / ovs-dpdk", 0.4)
            ]
        );
    }

    #[test]
    fn qswitch_fw_config_parses_with_both_ports_in_the_group() {
        let fw = FwSettings {
            max_sessions: 1 << 24,
            udp_unreplied: Some(2),
        };
        let c = qswitch_api::Config::from_toml(&fw.qswitch_toml("/tmp/x")).expect("config");
        assert!(c.ports.iter().all(|p| p.security_groups == ["bench"]));
        assert_eq!(c.security_groups[0].rules.len(), 51);
    }

    #[test]
    fn stat_ticks_parse() {
        let line = "42 (pmd c01 (x)) R 1 2 3 4 5 6 7 8 9 10 150 25 0 0 20 0";
        assert_eq!(parse_stat_ticks(line), Some(175));
        assert_eq!(parse_stat_ticks("garbage"), None);
    }

    fn run(c: &str, size: u32, mpps: f64, cpu: f64, idle: f64) -> PvpRun {
        Run {
            contender: c.into(),
            round: 1,
            seq: 1,
            metrics: PvpMetrics {
                frame_size: size,
                frame_len: size as usize - 4,
                load_pools: 1,
                tx_pkts: 100,
                rx_pkts: 90,
                mpps_tx: mpps * 1.1,
                mpps_rx: mpps,
                gbps_rx: 0.0,
                loss_pct: loss_pct(100, 90),
                tx_ring_full: 0,
                flooded_to_sender: 0,
                switch_cpu_pct: cpu,
                worker_cpu_pct: cpu,
                mpps_per_cpu_s: mpps / (cpu / 100.0),
                busy_cpus: 1.0,
                generator_cpu_pct: 100.0,
                other_busy_cpus: 0.0,
                idle_cpu_pct: idle,
                idle_worker_cpu_pct: idle,
                idle_other_busy_cpus: 0.0,
                ct: None,
            },
            samples: vec![PvpSample {
                t_s: 1.0,
                mpps_tx: mpps,
                mpps_rx: mpps,
                switch_cpu_pct: f64::NAN,
            }],
        }
    }

    #[test]
    fn summary_ratio_and_svg() {
        let runs = [
            run("qswitch", 64, 4.0, 100.0, 0.0),
            run("qswitch", 64, 6.0, 100.0, 1.0),
            run("qswitch", 64, 5.0, 100.0, 0.5),
            run("ovs-dpdk", 64, 10.0, 100.0, 100.0),
            run("qswitch", 1518, 2.0, 50.0, 0.0),
            run("testpmd-io", 1518, 4.0, 100.0, 100.0),
        ];
        let (s, r) = summarise(&CONTENDERS, &runs);
        assert_eq!(s.len(), 4);
        // (6 - 4) / 5: the spread the table compares with testpmd's.
        assert!((s[0].spread_pct - 40.0).abs() < 1e-9);
        assert_eq!(s[1].spread_pct, 0.0);
        assert_eq!(
            (s[0].mpps_median, s[0].mpps_min, s[0].mpps_max),
            (5.0, 4.0, 6.0)
        );
        assert_eq!(s[0].idle_cpu_pct_median, 0.5);
        assert!((s[0].loss_pct_median - 10.0).abs() < 1e-9);
        assert_eq!(s[2].mpps_per_cpu_s_median, 4.0);
        // A ratio only where both ran, one per peer.
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].frame_size, r[0].mpps, r[0].of.as_str()),
            (64, 0.5, "qswitch / ovs-dpdk")
        );
        assert_eq!(
            (r[1].frame_size, r[1].mpps, r[1].of.as_str()),
            (1518, 0.5, "qswitch / testpmd-io")
        );
        let svg = pvp_svg(&s, &runs);
        assert!(svg.starts_with("<svg") && svg.contains("ovs-dpdk run 1") && !svg.contains("NaN"));
    }
}
