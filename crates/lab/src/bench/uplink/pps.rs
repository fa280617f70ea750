//! The 64 B part of `bench uplink`: frames per second from a generator in the wire peer's
//! namespace, counted where they arrive in the vm namespace.
//!
//! The generator is DPDK's testpmd (`--forward-mode=txonly --txpkts=64`, one UDP flow to the
//! vm interface's MAC and address, port 9, the discard port: a socket bound there and never
//! read, so the vm's stack drops each frame at the full socket) on a `net_af_xdp` port (an
//! AF_XDP socket on queue 0 of the peer's end of the veth), its two lcores on the first CPU;
//! qswitch's single worker has the second CPU. This kernel has no pktgen module. AF_XDP's
//! transmit on a veth is the kernel's copy mode (one skb per frame, straight to the driver,
//! no qdisc), which costs the sending CPU less per frame than the `net_af_packet` port (TX
//! ring, `qdisc_bypass=1`) this bench used first: measured on the 2-CPU VM, offered frames
//! per CPU-second of the generator's CPU rose from 1.3–1.4 M to 1.9 M with qswitch native and
//! from 0.80 M to 0.93–0.96 M with the bridge, whose forwarding runs on that CPU too. A larger
//! `--burst` or `--txd` changed nothing measurable. The generator and the veth's receive side
//! share the first CPU in both contenders, so `offered_mpps` is what that CPU could send
//! while also doing the contender's part of the receive. Counted from the kernel's interface counters (`/proc/PID/net/dev` of a
//! `sleep` in each namespace, so no process starts while the frames flow): `offered_mpps`
//! is what the generator got onto the veth (the peer end's `tx_packets`), `mpps` what
//! reached the vm namespace (its interface's `rx_packets`: the TAP qswitch writes, or the
//! veth from the bridge). Before the traffic, with the topology up and idle, the daemon's
//! own CPU (all its threads' run time from `/proc/PID/task/*/schedstat`) over
//! [`IDLE_S`] seconds: the idle cost of an attached uplink.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Serialize;

use super::super::{median, Bench};
use crate::netns::{ChildGuard, Netns};
use crate::procstat;
use crate::run::Run;

/// Frame size (without the FCS) of every generated frame.
pub const FRAME: u32 = 64;
/// Seconds of the idle measurement before the traffic.
pub const IDLE_S: u64 = 2;
/// Unmeasured seconds of traffic before the measured window.
const WARMUP_S: u64 = 1;
/// DPDK's testpmd (Debian's `dpdk` package).
pub const TESTPMD: &str = "dpdk-testpmd";
/// What generates the frames (bench output and JSON).
pub const GENERATOR: &str =
    "dpdk-testpmd txonly, 64 B UDP, one flow, net_af_xdp (AF_XDP copy-mode tx) on the peer veth";

/// One second of a run.
#[derive(Debug, Clone, Serialize)]
pub struct PpsSample {
    /// End of the second, in seconds since the measured window began.
    pub t_s: f64,
    pub mpps: f64,
    pub offered_mpps: f64,
    /// Machine busy CPUs in this second.
    pub busy_cpus: f64,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct PpsMetrics {
    /// Frames/s received by the vm namespace's interface, in millions.
    pub mpps: f64,
    /// Frames/s the generator put on the veth (the peer end's tx), in millions.
    pub offered_mpps: f64,
    /// Machine busy CPUs over the measured window (generator included).
    pub busy_cpus: f64,
    /// Machine busy CPUs over the idle window before the traffic, topology up.
    pub idle_busy_cpus: f64,
    /// qswitch only: the daemon's CPU % (all threads) over the idle window.
    pub daemon_idle_cpu_pct: Option<f64>,
    pub loadavg: String,
}

/// One run of one contender.
pub type PpsRun = Run<PpsMetrics, PpsSample>;

/// Medians (and ranges) of one contender's runs.
#[derive(Debug, Clone, Serialize)]
pub struct PpsSummary {
    pub contender: String,
    pub runs: usize,
    pub mpps_median: f64,
    pub mpps_min: f64,
    pub mpps_max: f64,
    pub offered_mpps_median: f64,
    pub busy_cpus_median: f64,
    /// Median of the per-run daemon idle CPU %, qswitch only.
    pub daemon_idle_cpu_pct_median: Option<f64>,
    pub daemon_idle_cpu_pct_max: Option<f64>,
}

/// The two ends of a topology, as the generator and the counters need them.
pub struct Ends<'a> {
    pub peer: &'a Netns,
    /// The peer's end of the veth (the generator's interface).
    pub peer_if: &'a str,
    pub vm: &'a Netns,
    /// The vm namespace's interface (TAP or veth).
    pub vm_if: &'a str,
    /// The qswitch daemon, if in the path.
    pub daemon_pid: Option<u32>,
    /// The CPU of the generator's lcores.
    pub gen_cpu: usize,
    /// For the generator's log.
    pub dir: &'a Path,
}

/// One 64 B run over `ends`: idle window, generator up, warm-up, `seconds` measured.
pub fn run(
    b: &Bench,
    ends: &Ends,
    (contender, round, seq): (&str, u32, usize),
) -> anyhow::Result<PpsRun> {
    let seconds = u64::from(b.args.seconds);
    // One ping from the vm side: both switches learn the vm's MAC, so the generator's frames
    // are known unicast, not floods.
    let mut pinged = false;
    for _ in 0..3 {
        if ends
            .vm
            .exec(&["ping", "-n", "-c", "1", "-W", "2", "10.97.0.1"])
            .is_ok()
        {
            pinged = true;
            break;
        }
    }
    if !pinged {
        bail!("{contender}: the vm namespace cannot ping the wire peer");
    }
    let mac_out = ends
        .vm
        .exec(&["cat", &format!("/sys/class/net/{}/address", ends.vm_if)])?;
    let vm_mac = String::from_utf8_lossy(&mac_out.stdout).trim().to_string();
    let peer_probe = ends.peer.spawn(&["sleep", "3600"], Stdio::null())?;
    // The vm's probe is also the frames' sink: port 9 (discard) bound and never read, its
    // receive buffer at the minimum, so the vm's stack drops each frame at the full socket.
    let vm_probe = ends
        .vm
        .spawn(&["python3", "-c", DISCARD_SINK], Stdio::null())?;
    let pid = |g: &ChildGuard| g.0.as_ref().map(std::process::Child::id).unwrap_or(0);
    let (peer_pid, vm_pid) = (pid(&peer_probe), pid(&vm_probe));
    // `ip netns exec` has entered the namespace once the interface is visible (and the sink
    // is ready once its port is bound).
    let visible = || {
        counters(peer_pid, ends.peer_if).is_ok()
            && counters(vm_pid, ends.vm_if).is_ok()
            && discard_bound(vm_pid)
    };
    let t = Instant::now();
    while !visible() {
        if t.elapsed() > Duration::from_secs(5) {
            bail!("{contender}: cannot read the interface counters in the namespaces");
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    // Idle: the topology up, no traffic.
    let cpu0 = procstat::cpu_jiffies();
    let d0 = ends.daemon_pid.map(process_cpu_ns).transpose()?;
    let w0 = Instant::now();
    b.sleep(Duration::from_secs(IDLE_S))?;
    let idle_busy_cpus = procstat::busy_cpus(cpu0, procstat::cpu_jiffies());
    let daemon_idle_cpu_pct = match (ends.daemon_pid, d0) {
        (Some(p), Some(d0)) => {
            let ns = process_cpu_ns(p)?.saturating_sub(d0);
            Some(ns as f64 / w0.elapsed().as_nanos() as f64 * 100.0)
        }
        _ => None,
    };

    let prefix = format!("qsbench-up-{}-{seq}", b.id);
    let log = ends.dir.join(format!("testpmd-{seq}.log"));
    let _gen = Generator::start(ends, &vm_mac, &prefix, &log)?;
    // Up once frames leave the peer's interface (testpmd takes a few seconds to start).
    let (_, tx0) = counters(peer_pid, ends.peer_if)?;
    let t = Instant::now();
    loop {
        b.check()?;
        if counters(peer_pid, ends.peer_if)?.1 > tx0 + 1000 {
            break;
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!(
                "{contender}: the generator sent nothing in 30 s; its log ({}):\n{}",
                log.display(),
                tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    b.sleep(Duration::from_secs(WARMUP_S))?;

    let read = || -> anyhow::Result<(u64, u64)> {
        Ok((
            counters(vm_pid, ends.vm_if)?.0,
            counters(peer_pid, ends.peer_if)?.1,
        ))
    };
    let start = read()?;
    let cpu_from = procstat::cpu_jiffies();
    let t0 = Instant::now();
    let (mut prev, mut prev_cpu, mut prev_t) = (start, cpu_from, t0);
    let mut samples = Vec::new();
    for k in 1..=seconds {
        b.sleep((t0 + Duration::from_secs(k)).saturating_duration_since(Instant::now()))?;
        let (now, cpu, at) = (read()?, procstat::cpu_jiffies(), Instant::now());
        let dt = at.duration_since(prev_t).as_secs_f64();
        samples.push(PpsSample {
            t_s: at.duration_since(t0).as_secs_f64(),
            mpps: now.0.saturating_sub(prev.0) as f64 / dt / 1e6,
            offered_mpps: now.1.saturating_sub(prev.1) as f64 / dt / 1e6,
            busy_cpus: procstat::busy_cpus(prev_cpu, cpu),
        });
        (prev, prev_cpu, prev_t) = (now, cpu, at);
        print!(".");
        let _ = std::io::Write::flush(&mut std::io::stdout());
    }
    let wall = prev_t.duration_since(t0).as_secs_f64();
    let busy_cpus = procstat::busy_cpus(cpu_from, prev_cpu);
    let mpps = prev.0.saturating_sub(start.0) as f64 / wall / 1e6;
    let offered_mpps = prev.1.saturating_sub(start.1) as f64 / wall / 1e6;
    if mpps <= 0.0 {
        bail!(
            "{contender}: nothing reached the vm namespace (offered {offered_mpps:.3} Mpps); \
             generator log:\n{}",
            tail(&log)
        );
    }
    Ok(Run {
        contender: contender.to_string(),
        round,
        seq,
        metrics: PpsMetrics {
            mpps,
            offered_mpps,
            busy_cpus,
            idle_busy_cpus,
            daemon_idle_cpu_pct,
            loadavg: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .trim()
                .to_string(),
        },
        samples,
    })
}

/// testpmd in the peer namespace, stopped (SIGTERM: it stops forwarding and exits) and its
/// runtime directory removed on drop.
struct Generator {
    child: ChildGuard,
    prefix: String,
}

impl Generator {
    fn start(ends: &Ends, vm_mac: &str, prefix: &str, log: &Path) -> anyhow::Result<Generator> {
        let out = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let cpu = ends.gen_cpu;
        let lcores = format!("0@{cpu},1@{cpu}");
        // One AF_XDP socket on the veth's only queue. The PMD attaches libxdp's default
        // program to the peer's veth (frames to the peer go to the socket, which txonly
        // ignores); it goes when testpmd exits, or with the namespace.
        let vdev = format!(
            "net_af_xdp0,iface={},start_queue=0,queue_count=1",
            ends.peer_if
        );
        let peer = format!("0,{vm_mac}");
        let child = Command::new("ip")
            .args(["netns", "exec", &ends.peer.name, TESTPMD])
            .args(["--no-huge", "-m", "1024", "--no-pci", "--iova-mode=va"])
            .args([
                "--file-prefix",
                prefix,
                "--lcores",
                &lcores,
                "--main-lcore",
                "0",
            ])
            .args(["--vdev", &vdev, "--"])
            // --stats-period: runs until signalled instead of waiting for a key on stdin.
            .args(["--nb-cores=1", "--forward-mode=txonly", "--txpkts=64"])
            // To the vm's own address, UDP port 9 ([`DISCARD_SINK`]): the receiving stack
            // takes its cached local route and drops the frame at the full socket; an
            // address it has no route for, or a closed port, would cost a route lookup and an
            // ICMP error attempt each.
            .args(["--eth-peer", &peer, "--tx-ip", "10.97.0.1,10.97.0.2"])
            .args(["--tx-udp", "9,9", "--stats-period", "10", "-a"])
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("cannot start {TESTPMD}"))?;
        Ok(Generator {
            child: ChildGuard(Some(child)),
            prefix: prefix.to_string(),
        })
    }
}

impl Drop for Generator {
    fn drop(&mut self) {
        self.child.stop();
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

/// The last lines of a log.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// (rx_packets, tx_packets) of `ifname` in the namespace of process `pid`.
fn counters(pid: u32, ifname: &str) -> anyhow::Result<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
        .with_context(|| format!("no /proc/{pid}/net/dev"))?;
    parse_net_dev(&text, ifname).with_context(|| format!("no {ifname} in /proc/{pid}/net/dev"))
}

/// The vm namespace's sink: a UDP socket bound to port 9 that never reads, with the smallest
/// receive buffer. Without it, each frame to a closed port makes the vm's stack attempt an
/// ICMP port unreachable, and since Linux 6.12 the per-destination rate limit comes before
/// the host-wide one, so every attempt pays a route and xfrm lookup first: measured on the
/// 2-CPU VM (kernel 6.18), `__icmp_send` and what it calls were ~43 % of qswitch's worker
/// (the bridge pays the same on the generator's CPU): a cost of the sink, not of a switch.
const DISCARD_SINK: &str = "import socket, time\n\
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 0)\n\
s.bind(('0.0.0.0', 9))\n\
time.sleep(3600)\n";

/// Whether a UDP socket is bound to local port 9 in the namespace of `pid`.
fn discard_bound(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/net/udp"))
        .is_ok_and(|t| t.lines().skip(1).any(is_port_9))
}

/// Whether a `/proc/net/udp` line's local address has port 9 (`00000000:0009`).
fn is_port_9(line: &str) -> bool {
    line.split_whitespace()
        .nth(1)
        .and_then(|a| a.rsplit_once(':'))
        .is_some_and(|(_, port)| port == "0009")
}

/// (rx_packets, tx_packets) of `ifname` from `/proc/net/dev` text.
fn parse_net_dev(text: &str, ifname: &str) -> Option<(u64, u64)> {
    text.lines().find_map(|l| {
        let (name, rest) = l.split_once(':')?;
        if name.trim() != ifname {
            return None;
        }
        let f: Vec<u64> = rest
            .split_whitespace()
            .map(|x| x.parse().ok())
            .collect::<Option<_>>()?;
        Some((*f.get(1)?, *f.get(9)?))
    })
}

/// Run time (ns) of all threads of process `pid`, from `/proc/PID/task/*/schedstat`.
fn process_cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/task"))
        .with_context(|| format!("the daemon (pid {pid}) is gone"))?;
    Ok(dir
        .flatten()
        .filter_map(|e| {
            let text = std::fs::read_to_string(e.path().join("schedstat")).ok()?;
            text.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum())
}

/// Per-contender medians, in the order of `names`.
pub fn summarise(names: &[&str], runs: &[PpsRun]) -> Vec<PpsSummary> {
    names
        .iter()
        .map(|&name| {
            let mine: Vec<&PpsRun> = runs.iter().filter(|r| r.contender == name).collect();
            let m: Vec<f64> = mine.iter().map(|r| r.mpps).collect();
            let idle: Vec<f64> = mine.iter().filter_map(|r| r.daemon_idle_cpu_pct).collect();
            let of = |f: fn(&PpsRun) -> f64| median(&mine.iter().map(|r| f(r)).collect::<Vec<_>>());
            PpsSummary {
                contender: name.to_string(),
                runs: mine.len(),
                mpps_median: median(&m),
                mpps_min: m.iter().copied().fold(f64::INFINITY, f64::min),
                mpps_max: m.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                offered_mpps_median: of(|r| r.offered_mpps),
                busy_cpus_median: of(|r| r.busy_cpus),
                daemon_idle_cpu_pct_median: (!idle.is_empty()).then(|| median(&idle)),
                daemon_idle_cpu_pct_max: idle.iter().copied().reduce(f64::max),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_dev_fields() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
                    face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
                    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n\
                    qsuT12: 6400 100 0 0 0 0 0 0 1280 20 0 0 0 0 0 0\n";
        assert_eq!(parse_net_dev(text, "qsuT12"), Some((100, 20)));
        assert_eq!(parse_net_dev(text, "lo"), Some((0, 0)));
        assert_eq!(parse_net_dev(text, "qsuT1"), None);
    }

    #[test]
    fn udp_port_9_is_found_in_proc_net_udp() {
        let bound = "  123: 00000000:0009 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0";
        let other = "  124: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4243 2 0000000000000000 0";
        let remote_9 = "  125: 0100007F:8000 0200610A:0009 01 00000000:00000000 00:00000000 00000000     0        0 4244 2 0000000000000000 0";
        assert!(is_port_9(bound));
        assert!(!is_port_9(other));
        assert!(!is_port_9(remote_9));
        assert!(!is_port_9(""));
    }
}
