//! vhost-user ports with real guests (root only): small QEMU/Linux guests (`common_guest`)
//! whose virtio-net NICs are vhost-user ports of a `qswitch run` daemon.
//!
//! - Two guests, two queue pairs offered: ping both ways, iperf3 with 1 and 4 streams, the
//!   guests enable their second pair live (`ethtool -L`) and `port list` shows it, iperf3
//!   again; the negotiated features show in `port list`.
//! - A guest and a TAP port moved into a namespace: ping and iperf3 both ways (TSO and
//!   checksum offloads between virtio and TAP).
//! - Reconnect, with qswitch as the socket's server (QEMU `reconnect=1`) and as its client
//!   (QEMU `server=on`): the daemon is SIGKILLed while the guests ping and restarted on the
//!   same config; traffic must be back within 5 s with no action in the guests.
//! - A guest behind a security group, set live (docs/firewall.md): ingress default deny, an
//!   allowed TCP port reachable from the namespace, replies to the guest's egress pass.
//!
//! Each test has its own number `n`: subnet 10.201.n.0/24 (guest i has .i+1, the namespace
//! .100), guest MACs 52:54:00:c9:0n:0i, guests `vg<n>a`, `vg<n>b`, namespace `qsvg<pid>-<n>`,
//! TAP `qvg<n>-<pid>`, and a temp dir with the config, the control and vhost-user sockets and
//! the daemon logs. The tests of this file take a lock, so that they never share the CPUs
//! with one another (guests run under TCG where there is no KVM: 0.1-0.6 Gbit/s, so the
//! throughput asserted is only "> 0"; the numbers are printed).

mod common;
use qswitch_test_support::guest as common_guest;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use common::{request, worker_cpus, ChildGuard, DaemonChild, Netns, TempDir};
use common_guest::{Guest, GuestConfig, SocketMode};
use serde_json::Value;

/// Bound on a guest boot (several QEMUs under TCG share the CPUs).
const BOOT: Duration = Duration::from_secs(90);
/// Bound on a short guest command.
const T: Duration = Duration::from_secs(20);
/// Bound on a guest command running iperf3 for a few seconds.
const IPERF_T: Duration = Duration::from_secs(45);
/// The acceptance bound on traffic coming back after a daemon restart.
const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// The tests of this file run one at a time whatever the test harness's thread count.
static SERIAL: Mutex<()> = Mutex::new(());

/// Root, guest assets, and the file's lock; None (after a skip notice) when not possible.
fn setup() -> Option<std::sync::MutexGuard<'static, ()>> {
    if !common::root_or_skip() {
        return None;
    }
    common_guest::assets()?;
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// qswitch's side of the vhost-user sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QsMode {
    /// qswitch listens, QEMU connects with `reconnect=1`.
    Server,
    /// QEMU listens (`server=on,wait=off`), qswitch connects.
    Client,
}

impl QsMode {
    fn as_str(self) -> &'static str {
        match self {
            QsMode::Server => "server",
            QsMode::Client => "client",
        }
    }

    /// QEMU's side of the socket.
    fn qemu(self) -> SocketMode {
        match self {
            QsMode::Server => SocketMode::Client,
            QsMode::Client => SocketMode::Server,
        }
    }
}

struct LabSpec {
    n: u8,
    mode: QsMode,
    /// Queue pairs qswitch offers and QEMU sets up per port.
    queues: u16,
    guests: usize,
    /// A TAP port moved into a namespace of the test.
    tap: bool,
}

/// A daemon with one vhost-user port per guest (`vm1`, `vm2`, ...) and optionally a TAP port
/// (`tap`) in a namespace. Drops the guests first, then the daemon, the namespace and the
/// temp dir.
struct Lab {
    guests: Vec<Guest>,
    daemon: DaemonChild,
    ns: Option<Netns>,
    n: u8,
    config: PathBuf,
    control: PathBuf,
    restarts: u32,
    dir: TempDir,
}

fn port_name(i: usize) -> String {
    format!("vm{}", i + 1)
}

fn tap_ifname(n: u8) -> String {
    format!("qvg{n}-{}", std::process::id() % 100_000)
}

/// Starts `qswitch run --config config` (stderr to `log`) without waiting for it, with the
/// vhost-user protocol in the log (debug level).
fn spawn_daemon(config: &Path, control: &Path, log: &Path) -> DaemonChild {
    DaemonChild::spawn_logging(
        config,
        control,
        log,
        "info,qswitch_dp::port::vhost_user=debug",
    )
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Lab {
    fn new(spec: &LabSpec) -> Result<Lab> {
        let n = spec.n;
        let dir = TempDir::new(&format!("vg{n}"));
        let control = dir.join("control.sock");
        let pid = std::process::id();
        // The namespace first, so that a failing start-up still removes it.
        let ns = spec.tap.then(|| Netns::new(&format!("qsvg{pid}-{n}")));
        let mut text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n",
            worker_cpus(usize::MAX),
            control.display()
        );
        for i in 0..spec.guests {
            let _ = write!(
                text,
                "[[port]]\nname = \"{}\"\ntype = \"vhost-user\"\nsocket = \"{}\"\n\
                 mode = \"{}\"\nqueues = {}\n",
                port_name(i),
                dir.join(&format!("{}.sock", port_name(i))).display(),
                spec.mode.as_str(),
                spec.queues
            );
        }
        if spec.tap {
            let _ = write!(
                text,
                "[[port]]\nname = \"tap\"\ntype = \"tap\"\nifname = \"{}\"\n",
                tap_ifname(n)
            );
        }
        let config = dir.join("qswitch.toml");
        std::fs::write(&config, &text).expect("write config");
        let mut daemon = spawn_daemon(&config, &control, &dir.join("qswitch.log"));
        daemon.wait_ready();
        if let Some(ns) = &ns {
            ns.adopt(&tap_ifname(n), &format!("10.201.{n}.100/24"), false);
        }
        let t0 = Instant::now();
        let mut guests = Vec::new();
        for i in 0..spec.guests {
            guests.push(Guest::start(GuestConfig {
                name: format!("vg{n}{}", (b'a' + i as u8) as char),
                vhost_socket: dir.join(&format!("{}.sock", port_name(i))),
                socket_mode: spec.mode.qemu(),
                queues: spec.queues,
                mac: format!("52:54:00:c9:{n:02x}:{:02x}", i + 1),
                ip_cidr: format!("10.201.{n}.{}/24", i + 1),
                // The harness has the guest enable every pair at boot (qs.queues=N); the
                // later qs.queues=1 overrides that: the guests start with one pair, as
                // Linux does on a 1-vCPU guest, and the tests enable the others.
                cmdline: vec!["qs.queues=1".into()],
                ..GuestConfig::default()
            })?);
        }
        let mut boot = Vec::new();
        for g in &mut guests {
            let t = g
                .wait_ready(BOOT)
                .with_context(|| format!("daemon log:\n{}", tail(&daemon.log_text(), 30)))?;
            boot.push(format!("{} {t:.1?}", g.name()));
        }
        eprintln!(
            "[{n}] {} guest(s) booted in {:.1?} ({}; {:?})",
            guests.len(),
            t0.elapsed(),
            boot.join(", "),
            guests.first().map(Guest::accel)
        );
        let mut lab = Lab {
            guests,
            daemon,
            ns,
            n,
            config,
            control,
            restarts: 0,
            dir,
        };
        // Every frontend connected with its first pair enabled (the guest drivers are up).
        if let Err(e) = lab.wait_vhost(Duration::from_secs(20), |p| {
            p["connected"] == true && enabled(p) == [0]
        }) {
            bail!(
                "{e:#}\n(a port connected with no pair enabled: the SET_VRING_ENABLE \
                 requests were refused or lost; the daemon log has the protocol)\n{}",
                lab.evidence()
            );
        }
        Ok(lab)
    }

    fn ip(&self, i: usize) -> String {
        format!("10.201.{}.{}", self.n, i + 1)
    }

    fn ns_ip(&self) -> String {
        format!("10.201.{}.100", self.n)
    }

    fn ns(&self) -> &Netns {
        self.ns.as_ref().expect("a lab with a namespace")
    }

    /// `port list` (the daemon's JSON reply).
    fn ports(&self) -> Result<Vec<Value>> {
        let v = request(&self.control, b"{\"request\":\"port-list\"}\n")?;
        v["ports"]
            .as_array()
            .cloned()
            .ok_or_else(|| anyhow!("bad port-list reply: {v}"))
    }

    fn port(&self, name: &str) -> Result<Value> {
        self.ports()?
            .into_iter()
            .find(|p| p["name"] == name)
            .ok_or_else(|| anyhow!("no port {name}"))
    }

    /// Waits until `pred` holds for every vhost-user port; returns them.
    fn wait_vhost(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        let mut last: Result<Vec<Value>> = Err(anyhow!("not asked yet"));
        loop {
            if let Ok(ports) = &last {
                let vhost: Vec<Value> = ports
                    .iter()
                    .filter(|p| p["type"] == "vhost-user")
                    .cloned()
                    .collect();
                if vhost.iter().all(&pred) {
                    return Ok(vhost);
                }
            }
            if Instant::now() >= deadline {
                let last = match last {
                    Ok(p) => serde_json::to_string_pretty(&p).unwrap_or_default(),
                    Err(e) => format!("{e:#}"),
                };
                bail!(
                    "vhost-user ports not as expected within {timeout:?}; last port list: {last}"
                );
            }
            std::thread::sleep(Duration::from_millis(50));
            last = self.ports();
        }
    }

    /// SIGKILL for the daemon (reaped).
    fn kill_daemon(&mut self) {
        self.daemon.kill();
    }

    /// Starts a new daemon on the same config (without waiting); returns when it started.
    fn restart(&mut self) -> Instant {
        self.restarts += 1;
        let log = self
            .dir
            .join(&format!("qswitch-restart{}.log", self.restarts));
        let t0 = Instant::now();
        self.daemon = spawn_daemon(&self.config, &self.control, &log);
        t0
    }

    /// What the switch and the guests say, for failure messages.
    fn evidence(&mut self) -> String {
        let mut s = String::from("\n===== evidence =====\n");
        for req in ["port-list", "stats"] {
            let line = format!("{{\"request\":\"{req}\"}}\n");
            let _ = match request(&self.control, line.as_bytes()) {
                Ok(v) => writeln!(
                    s,
                    "--- qswitch {req} ---\n{}",
                    serde_json::to_string_pretty(&v).unwrap_or_default()
                ),
                Err(e) => writeln!(s, "--- qswitch {req}: {e}"),
            };
        }
        let _ = writeln!(
            s,
            "--- qswitch log (tail) ---\n{}",
            tail(&self.daemon.log_text(), 40)
        );
        for g in &mut self.guests {
            let name = g.name().to_string();
            let cmd = "cat /sys/class/net/eth0/carrier /sys/class/net/eth0/operstate; \
                       ethtool -l eth0 | tail -n 5; ethtool -S eth0; \
                       cd /sys/class/net/eth0/statistics && grep -H . *; ip neigh";
            let _ = match g.run(cmd, Duration::from_secs(10)) {
                Ok((_, out)) => writeln!(s, "--- guest {name}: eth0 ---\n{out}"),
                Err(e) => writeln!(s, "--- guest {name}: {e:#}"),
            };
            let _ = writeln!(s, "{}", g.logs());
        }
        s
    }

    /// Panics with `r`'s error and the evidence.
    fn check(&mut self, r: Result<()>) {
        if let Err(e) = r {
            let ev = self.evidence();
            panic!("{e:#}{ev}");
        }
    }
}

/// `enabled_queues` of a port.
fn enabled(p: &Value) -> Vec<u64> {
    p["enabled_queues"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// `offloads` of a port.
fn offloads(p: &Value) -> Vec<String> {
    p["offloads"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|o| o.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The average RTT in ms from a ping summary (busybox or iputils).
fn ping_avg_ms(out: &str) -> Option<f64> {
    let line = out.lines().find(|l| l.contains("min/avg/max"))?;
    line.split('=')
        .nth(1)?
        .trim()
        .split('/')
        .nth(1)?
        .parse()
        .ok()
}

/// Ping from `g` to `ip`: first until one echo is answered (ARP, link coming up), then 5
/// echoes that must all be answered (one retry, reported, absorbs a reply lost to a busy
/// machine). Returns the average RTT in ms.
fn ping(g: &mut Guest, ip: &str) -> Result<f64> {
    g.run_ok(
        &format!(
            "for i in $(seq 1 20); do ping -c 1 -W 1 {ip} >/dev/null 2>&1 && exit 0; done; exit 1"
        ),
        Duration::from_secs(40),
    )
    .with_context(|| format!("{}: no echo reply from {ip} in 20 tries", g.name()))?;
    let cmd = format!("ping -c 5 -i 0.2 -W 2 {ip}");
    let mut out = g.run(&cmd, T)?.1;
    if !out.contains(" 0% packet loss") {
        eprintln!(
            "{}: ping {ip} lost replies, retrying once:\n{out}",
            g.name()
        );
        out = g.run(&cmd, T)?.1;
    }
    ensure!(
        out.contains(" 0% packet loss"),
        "{}: ping {ip}:\n{out}",
        g.name()
    );
    ping_avg_ms(&out).ok_or_else(|| anyhow!("no RTT in {out}"))
}

/// Starts an iperf3 server in `g` (kept running) and waits until it listens.
fn iperf_server(g: &mut Guest) -> Result<()> {
    g.run_ok(
        "iperf3 -s -D --logfile /tmp/iperf3-server.log\n\
         i=0; until netstat -ltn | grep -q ':5201 '; do\n\
         i=$((i+1)); [ $i -lt 100 ] || exit 1; usleep 50000; done",
        T,
    )
    .map(drop)
}

/// An iperf3 result.
#[derive(Debug)]
struct Iperf {
    gbps: f64,
    /// Retransmits of the sending side.
    retransmits: u64,
    /// Bytes sent.
    bytes: u64,
}

impl Iperf {
    /// Retransmitted segments per segment sent (MSS 1448).
    fn retrans_ratio(&self) -> f64 {
        self.retransmits as f64 / (self.bytes as f64 / 1448.0).max(1.0)
    }
}

impl std::fmt::Display for Iperf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.3} Gbit/s, {} retransmits ({:.3}% of ~{} segments)",
            self.gbps,
            self.retransmits,
            self.retrans_ratio() * 100.0,
            self.bytes / 1448
        )
    }
}

/// Parses iperf3's `-J` output.
fn parse_iperf(out: &str) -> Result<Iperf> {
    let start = out.find('{').ok_or_else(|| anyhow!("no JSON"))?;
    let v: Value = serde_json::from_str(&out[start..]).context("iperf3 JSON")?;
    if let Some(e) = v.get("error") {
        bail!("iperf3 error: {e}");
    }
    let end = &v["end"];
    Ok(Iperf {
        gbps: end["sum_received"]["bits_per_second"]
            .as_f64()
            .ok_or_else(|| anyhow!("no sum_received"))?
            / 1e9,
        retransmits: end["sum_sent"]["retransmits"].as_u64().unwrap_or(0),
        bytes: end["sum_sent"]["bytes"].as_u64().unwrap_or(0),
    })
}

/// Runs an iperf3 TCP client in `g` against `ip` (`extra`: e.g. "-R"); one retry, reported.
fn iperf(g: &mut Guest, ip: &str, secs: u32, streams: u32, extra: &str) -> Result<Iperf> {
    let cmd =
        format!("iperf3 -c {ip} -t {secs} -P {streams} -i 0 -J --connect-timeout 3000 {extra}");
    let mut last = anyhow!("not run");
    for attempt in 0..2 {
        if attempt > 0 {
            eprintln!("{}: `{cmd}` failed, retrying once: {last:#}", g.name());
            std::thread::sleep(Duration::from_secs(1));
        }
        let (rc, out) = g.run(&cmd, IPERF_T)?;
        match parse_iperf(&out) {
            Ok(r) if rc == 0 => return Ok(r),
            Ok(_) => last = anyhow!("exit {rc}: {}", tail(&out, 20)),
            Err(e) => last = e.context(format!("exit {rc}: {}", tail(&out, 20))),
        }
    }
    Err(last.context(format!("{}: {cmd}", g.name())))
}

/// A `ethtool -S eth0` counter of `g`.
fn nic_counter(g: &mut Guest, name: &str) -> Result<u64> {
    let out = g.run_ok("ethtool -S eth0", T)?;
    out.lines()
        .find_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            (k == name).then(|| v.trim().parse().ok()).flatten()
        })
        .ok_or_else(|| anyhow!("no {name} in\n{out}"))
}

#[test]
fn two_guests_multiqueue_ping_iperf3() {
    let Some(_serial) = setup() else { return };
    let t0 = Instant::now();
    let mut lab = Lab::new(&LabSpec {
        n: 1,
        mode: QsMode::Server,
        queues: 2,
        guests: 2,
        tap: false,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let r = two_guests_body(&mut lab);
    lab.check(r);
    drop(lab);
    eprintln!("[1] done in {:.1?}", t0.elapsed());
}

fn two_guests_body(lab: &mut Lab) -> Result<()> {
    let (ip_a, ip_b) = (lab.ip(0), lab.ip(1));

    // Negotiated features (the guests are Linux virtio-net drivers: they take every offload
    // qswitch offers that QEMU passes on).
    for name in ["vm1", "vm2"] {
        let p = lab.port(name)?;
        let o = offloads(&p);
        eprintln!("[1] {name}: offloads {}", o.join(","));
        for f in [
            "version_1",
            "mrg_rxbuf",
            "event_idx",
            "csum",
            "guest_csum",
            "host_tso4",
            "host_tso6",
            "guest_tso4",
            "guest_tso6",
            "mq",
        ] {
            ensure!(o.iter().any(|x| x == f), "{name}: {f} not negotiated: {p}");
        }
        ensure!(p["mode"] == "server" && p["connected"] == true, "{p}");
        ensure!(
            enabled(&p) == [0],
            "{name}: enabled_queues before ethtool -L: {p}"
        );
    }

    let rtt_ab = ping(&mut lab.guests[0], &ip_b)?;
    let rtt_ba = ping(&mut lab.guests[1], &ip_a)?;
    eprintln!("[1] ping a -> b avg {rtt_ab:.2} ms, b -> a avg {rtt_ba:.2} ms");

    iperf_server(&mut lab.guests[1])?;
    let one = iperf(&mut lab.guests[0], &ip_b, 3, 1, "")?;
    eprintln!("[1] iperf3 a -> b, 1 stream, 1 pair: {one}");
    ensure!(one.gbps > 0.0, "1 stream: {one}");
    let four = iperf(&mut lab.guests[0], &ip_b, 3, 4, "")?;
    eprintln!("[1] iperf3 a -> b, 4 streams, 1 pair: {four}");
    ensure!(four.gbps > 0.0, "4 streams: {four}");

    // The guests enable their second pair: qswitch sees SET_VRING_ENABLE for it.
    for g in &mut lab.guests {
        g.run_ok("ethtool -L eth0 combined 2", T)?;
        let out = g.run_ok("ethtool -l eth0", T)?;
        let current = out.split("Current hardware settings:").nth(1).unwrap_or("");
        ensure!(
            current
                .lines()
                .any(|l| l.starts_with("Combined:") && l.trim_end().ends_with('2')),
            "{}: ethtool -l after -L combined 2:\n{out}",
            g.name()
        );
    }
    let ports = lab.wait_vhost(Duration::from_secs(10), |p| enabled(p) == [0, 1])?;
    for p in &ports {
        eprintln!("[1] {}: enabled_queues {:?}", p["name"], enabled(p));
        ensure!(p["connected"] == true, "{p}");
    }
    let rx1_before = nic_counter(&mut lab.guests[1], "rx_queue_1_packets")?;
    let four2 = iperf(&mut lab.guests[0], &ip_b, 3, 4, "")?;
    eprintln!("[1] iperf3 a -> b, 4 streams, 2 pairs: {four2}");
    ensure!(four2.gbps > 0.0, "4 streams, 2 pairs: {four2}");
    let rx0 = nic_counter(&mut lab.guests[1], "rx_queue_0_packets")?;
    let rx1 = nic_counter(&mut lab.guests[1], "rx_queue_1_packets")? - rx1_before;
    eprintln!(
        "[1] b's receive queues: rx_queue_0_packets {rx0} (total), rx_queue_1_packets +{rx1}"
    );
    // Still pinging after the change, both ways.
    ping(&mut lab.guests[0], &ip_b)?;
    ping(&mut lab.guests[1], &ip_a)?;
    let stats = request(&lab.control, b"{\"request\":\"stats\"}\n")?;
    for p in stats["ports"].as_array().into_iter().flatten() {
        eprintln!("[1] {}: drops {}", p["name"], p["drops"]);
    }
    no_guest_errors(lab)
}

/// The daemons of the lab (also the killed ones) logged no guest error (a broken ring, a
/// bad chain) and no panic.
fn no_guest_errors(lab: &Lab) -> Result<()> {
    let mut bad = Vec::new();
    for e in std::fs::read_dir(lab.dir.path())?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("qswitch") && name.ends_with(".log") {
            let log = std::fs::read_to_string(e.path()).unwrap_or_default();
            bad.extend(
                log.lines()
                    .filter(|l| l.contains("guest error") || l.contains("panicked"))
                    .map(|l| format!("{name}: {l}")),
            );
        }
    }
    ensure!(bad.is_empty(), "daemon logs:\n{}", bad.join("\n"));
    Ok(())
}

#[test]
fn guest_and_tap_namespace() {
    let Some(_serial) = setup() else { return };
    let t0 = Instant::now();
    let mut lab = Lab::new(&LabSpec {
        n: 2,
        mode: QsMode::Server,
        queues: 1,
        guests: 1,
        tap: true,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let mut server = None;
    let r = tap_body(&mut lab, &mut server);
    drop(server);
    lab.check(r);
    drop(lab);
    eprintln!("[2] done in {:.1?}", t0.elapsed());
}

fn tap_body(lab: &mut Lab, server: &mut Option<ChildGuard>) -> Result<()> {
    let (ip_g, ip_ns) = (lab.ip(0), lab.ns_ip());
    for name in ["vm1", "tap"] {
        eprintln!(
            "[2] {name}: offloads {}",
            offloads(&lab.port(name)?).join(",")
        );
    }
    let rtt = ping(&mut lab.guests[0], &ip_ns)?;
    let out = lab.ns().run_for(
        &["ping", "-n", "-c", "5", "-i", "0.2", "-W", "2", &ip_g],
        Duration::from_secs(20),
    );
    ensure!(
        out.ok() && out.stdout.contains(" 0% packet loss"),
        "namespace -> guest ping: {out:?}"
    );
    let rtt_ns = ping_avg_ms(&out.stdout).unwrap_or(f64::NAN);
    eprintln!("[2] ping guest -> ns avg {rtt:.2} ms, ns -> guest avg {rtt_ns:.2} ms");

    let log = lab.dir.join("iperf3-server.log");
    *server = Some(lab.ns().spawn(&["iperf3", "-s", "-B", &ip_ns], &log));
    ensure!(lab.ns().wait_listening(5201), "iperf3 server did not start");
    // Guest -> namespace: the guest's TSO frames (host_tso4) leave through the TAP.
    let up = iperf(&mut lab.guests[0], &ip_ns, 3, 1, "")?;
    eprintln!("[2] iperf3 guest -> ns: {up}");
    // Namespace -> guest: the kernel's GSO frames from the TAP go to the guest (guest_tso4).
    let down = iperf(&mut lab.guests[0], &ip_ns, 3, 1, "-R")?;
    eprintln!("[2] iperf3 ns -> guest: {down}");
    for (what, r) in [("guest -> ns", &up), ("ns -> guest", &down)] {
        ensure!(r.gbps > 0.0, "{what}: {r}");
        // Not absurd: a switch that mangled offloaded frames (bad checksums, wrong segment
        // sizes) shows as mass retransmission or a stalled connection.
        ensure!(
            r.retrans_ratio() < 0.05,
            "{what}: too many retransmits: {r}"
        );
    }
    let stats = request(&lab.control, b"{\"request\":\"stats\"}\n")?;
    for p in stats["ports"].as_array().into_iter().flatten() {
        eprintln!("[2] {}: drops {}", p["name"], p["drops"]);
    }
    no_guest_errors(lab)
}

/// qswitch listens, QEMU reconnects every second; the guests use two queue pairs, which
/// must come back too.
#[test]
fn reconnect_qswitch_server() {
    reconnect(3, QsMode::Server, 2);
}

/// QEMU listens, the restarted qswitch connects; one queue pair (the default).
#[test]
fn reconnect_qswitch_client() {
    reconnect(4, QsMode::Client, 1);
}

fn reconnect(n: u8, mode: QsMode, pairs: u16) {
    let Some(_serial) = setup() else { return };
    let t0 = Instant::now();
    let mut lab = Lab::new(&LabSpec {
        n,
        mode,
        queues: pairs,
        guests: 2,
        tap: false,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let r = reconnect_body(&mut lab, mode, pairs);
    lab.check(r);
    drop(lab);
    eprintln!("[{n}] done in {:.1?}", t0.elapsed());
}

/// When (since `t0`) every vhost-user port is connected, and has `pairs` pairs enabled.
fn watch_ports(
    control: PathBuf,
    t0: Instant,
    pairs: usize,
    timeout: Duration,
) -> (Option<Duration>, Option<Duration>) {
    let (mut connected, mut enabled_at) = (None, None);
    while t0.elapsed() < timeout && enabled_at.is_none() {
        if let Ok(v) = request(&control, b"{\"request\":\"port-list\"}\n") {
            let ports = v["ports"].as_array().cloned().unwrap_or_default();
            let vhost = ports.iter().filter(|p| p["type"] == "vhost-user");
            if connected.is_none() && vhost.clone().all(|p| p["connected"] == true) {
                connected = Some(t0.elapsed());
            }
            if vhost.clone().all(|p| enabled(p).len() == pairs) {
                enabled_at = Some(t0.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    (connected, enabled_at)
}

fn reconnect_body(lab: &mut Lab, mode: QsMode, pairs: u16) -> Result<()> {
    let n = lab.n;
    let (ip_a, ip_b) = (lab.ip(0), lab.ip(1));
    if pairs > 1 {
        for g in &mut lab.guests {
            g.run_ok(&format!("ethtool -L eth0 combined {pairs}"), T)?;
        }
    }
    let all: Vec<u64> = (0..u64::from(pairs)).collect();
    let before = lab.wait_vhost(Duration::from_secs(10), |p| enabled(p) == all)?;
    let rtt = ping(&mut lab.guests[0], &ip_b)?;
    eprintln!(
        "[{n}] qswitch {}, {pairs} pair(s): ping a -> b avg {rtt:.2} ms",
        mode.as_str()
    );
    iperf_server(&mut lab.guests[1])?;

    // Traffic across the restart: a ping every 0.2 s from a to b.
    lab.guests[0].run_ok(
        &format!("ping -i 0.2 -w 120 {ip_b} >/tmp/bg.log 2>&1 &\necho $! >/tmp/bg.pid"),
        T,
    )?;
    std::thread::sleep(Duration::from_secs(1));

    lab.kill_daemon();
    let sock_after_kill = lab.dir.join("vm1.sock").exists();
    let t0 = lab.restart();
    let watcher = {
        let control = lab.control.clone();
        let pairs = usize::from(pairs);
        std::thread::spawn(move || watch_ports(control, t0, pairs, Duration::from_secs(30)))
    };
    // No action in the guests but this probe: a's first answered echo since the restart.
    let probe = lab.guests[0].run(
        &format!(
            "i=0; until ping -c 1 -W 1 {ip_b} >/dev/null 2>&1; do \
             i=$((i+1)); usleep 50000; done; echo failed=$i"
        ),
        Duration::from_secs(30),
    );
    let t_ping = t0.elapsed();
    let (t_conn, t_enabled) = watcher.join().map_err(|_| anyhow!("watcher panicked"))?;
    lab.daemon.wait_ready();
    let fmt =
        |d: Option<Duration>| d.map_or("never".into(), |d| format!("{:.2}s", d.as_secs_f64()));
    let timings = format!(
        "both ports connected {}, {pairs} pair(s) enabled on both {} after the restart",
        fmt(t_conn),
        fmt(t_enabled)
    );
    let probe =
        probe.with_context(|| format!("no echo reply within 30 s of the restart; {timings}"))?;
    ensure!(probe.0 == 0, "probe: {probe:?}");
    eprintln!(
        "[{n}] qswitch {} reconnect after SIGKILL + restart: first echo reply {:.2}s after the \
         restart ({} failed probes); {timings} (socket file left by the killed daemon: \
         {sock_after_kill})",
        mode.as_str(),
        t_ping.as_secs_f64(),
        probe.1.trim().trim_start_matches("failed="),
    );

    // The background ping: stop it, show its loss across the outage.
    let out = lab.guests[0].run_ok(
        "kill -INT $(cat /tmp/bg.pid); sleep 1; tail -n 3 /tmp/bg.log",
        T,
    )?;
    let summary = out
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or("no summary");
    eprintln!("[{n}] background ping (0.2 s interval) across the restart: {summary}");

    // The same features and pairs as before, both ways, and bulk traffic over the
    // re-established rings.
    let after = lab.wait_vhost(Duration::from_secs(5), |p| enabled(p) == all)?;
    for (b, a) in before.iter().zip(&after) {
        ensure!(
            offloads(b) == offloads(a),
            "{}: features changed across the restart: {:?} -> {:?}",
            b["name"],
            offloads(b),
            offloads(a)
        );
    }
    ping(&mut lab.guests[0], &ip_b)?;
    ping(&mut lab.guests[1], &ip_a)?;
    let r = iperf(&mut lab.guests[0], &ip_b, 2, pairs.into(), "")?;
    eprintln!("[{n}] iperf3 a -> b after the restart, {pairs} stream(s): {r}");
    ensure!(r.gbps > 0.0, "{r}");
    no_guest_errors(lab)?;
    ensure!(
        t_ping < RECONNECT_MAX,
        "traffic back only {t_ping:.2?} after the restart (bound {RECONNECT_MAX:?}); {timings}"
    );
    Ok(())
}

/// Connects to argv[1]:argv[2] (3 s): `ok`, `timeout` or `refused`.
const CONNECT: &str = "
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print('ok')
except (socket.timeout, TimeoutError):
    print('timeout')
except ConnectionRefusedError:
    print('refused')
";

/// A guest behind a vhost-user port with a security group (docs/firewall.md), set live:
/// `sg add`, `sg rule add` (TCP 8080 in, everything out), `port set --security-groups`.
/// From the namespace (outside the group), the allowed port is reachable and another port
/// with a listener is not, nor does ping get an answer (ingress default deny); the guest's
/// own ping to the namespace gets its replies (egress, stateful).
#[test]
fn guest_behind_a_security_group() {
    let Some(_serial) = setup() else { return };
    let t0 = Instant::now();
    let mut lab = Lab::new(&LabSpec {
        n: 5,
        mode: QsMode::Server,
        queues: 1,
        guests: 1,
        tap: true,
    })
    .unwrap_or_else(|e| panic!("{e:#}"));
    let r = firewall_body(&mut lab);
    lab.check(r);
    drop(lab);
    eprintln!("[5] done in {:.1?}", t0.elapsed());
}

fn firewall_body(lab: &mut Lab) -> Result<()> {
    let (ip_g, ip_ns) = (lab.ip(0), lab.ns_ip());
    let control = lab.control.clone();
    common::add_security_group(
        &control,
        "web",
        &[
            &[
                "--direction",
                "ingress",
                "--protocol",
                "tcp",
                "--ports",
                "8080",
            ],
            &["--direction", "egress"],
        ],
        &["vm1"],
    )
    .map_err(anyhow::Error::msg)?;
    lab.guests[0].run_ok(
        "iperf3 -s -D -p 8080 --logfile /tmp/i8080.log; iperf3 -s -D -p 9090 --logfile /tmp/i9090.log\n\
         i=0; until netstat -ltn | grep -q ':8080 ' && netstat -ltn | grep -q ':9090 '; do\n\
         i=$((i+1)); [ $i -gt 100 ] && exit 1; sleep 0.1; done",
        T,
    )?;
    // Egress: the guest's echo requests open connections; their replies pass.
    ping(&mut lab.guests[0], &ip_ns)?;
    let connect = |lab: &Lab, port: &str| {
        let out = lab.ns().run_for(
            &["python3", "-c", CONNECT, &ip_g, port],
            Duration::from_secs(20),
        );
        out.stdout.trim().to_string()
    };
    ensure!(connect(lab, "8080") == "ok", "TCP 8080 is allowed in");
    ensure!(
        connect(lab, "9090") == "timeout",
        "TCP 9090: no rule lets it in"
    );
    let out = lab.ns().run_for(
        &["ping", "-n", "-c", "2", "-i", "0.2", "-W", "1", &ip_g],
        Duration::from_secs(10),
    );
    ensure!(!out.ok(), "no rule lets ICMP in: {out:?}");
    let stats = request(&lab.control, b"{\"request\":\"stats\"}\n")?;
    let denied = common::drops(&stats, "vm1", "fw_denied_ingress");
    ensure!(denied > 0, "fw_denied_ingress of vm1: {denied}");
    let ct = common::qs_json(&control, &["ct", "stats", "--json"]);
    ensure!(
        ct["ports"][0]["port"] == "vm1" && ct["ports"][0]["allowed_egress"].as_u64() > Some(0),
        "ct stats: {ct}"
    );
    no_guest_errors(lab)
}
