//! Live migration of a QEMU guest between two vhost-user ports of one daemon (root only),
//! as QEMU's own vhost-user tests do it: the source QEMU on port `p1`, the destination QEMU
//! started with `-incoming unix:...` on port `p2` (guest memory `memory-backend-memfd,
//! share=on` on both), a TAP port in a namespace. The namespace pings the guest every 10 ms
//! during the move (namespace → guest: the harder direction, since frames for the guest
//! follow the forwarding table, which must move the guest's MAC to `p2` at once, by the
//! guest's own announcement or by qswitch's RARP for VHOST_USER_SEND_RARP); `migrate` over
//! QMP. Asserted: the migration completes, the guest answers pings from its new port, the
//! forwarding table moves the MAC p1 → p2, p1 logged dirty pages, and the pings lost stay
//! within a bound (printed: lost pings and the longest gap).

mod common;
use qswitch_test_support::guest as common_guest;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use common::{counter, qs_json, wait_until, DaemonChild, Netns, TempDir};
use common_guest::{Guest, GuestConfig, SocketMode};
use serde_json::Value;

const BOOT: Duration = Duration::from_secs(120);
const T: Duration = Duration::from_secs(20);
/// Bound on one migration (128 MiB of guest memory over a local socket, under TCG).
const MIGRATE: Duration = Duration::from_secs(120);
/// The bound asserted on the longest gap in the pings (the goal is under 1 s; TCG pauses
/// the guest longer than KVM would in the final stop-and-copy phase).
const GAP_MAX: Duration = Duration::from_secs(5);
const GUEST_MAC: &str = "52:54:00:c9:e1:01";
const GUEST_IP: &str = "10.214.1.1";
const NS_IP: &str = "10.214.1.100";

/// A QMP connection.
struct Qmp {
    r: BufReader<UnixStream>,
    w: UnixStream,
}

impl Qmp {
    fn connect(path: &Path) -> Result<Qmp> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e).context(format!("QMP {}", path.display())),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut q = Qmp {
            r: BufReader::new(s.try_clone()?),
            w: s,
        };
        let mut greeting = String::new();
        q.r.read_line(&mut greeting)?;
        q.exec("qmp_capabilities", Value::Null)?;
        Ok(q)
    }

    fn exec(&mut self, cmd: &str, args: Value) -> Result<Value> {
        let mut msg = serde_json::json!({ "execute": cmd });
        if !args.is_null() {
            msg["arguments"] = args;
        }
        writeln!(self.w, "{msg}")?;
        loop {
            let mut line = String::new();
            if self.r.read_line(&mut line)? == 0 {
                bail!("QMP closed during {cmd}");
            }
            let v: Value = serde_json::from_str(&line)?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                bail!("QMP {cmd}: {e}");
            }
        }
    }
}

/// Waits until the destination QEMU listens for the migration stream on `mig`.
fn wait_incoming(mig: &Path) -> Result<()> {
    if !wait_until(Duration::from_secs(30), || mig.exists()) {
        bail!("the destination QEMU does not listen on {}", mig.display());
    }
    Ok(())
}

fn fdb_port(control: &Path) -> Option<String> {
    let fdb = qs_json(control, &["fdb", "--json"]);
    fdb.as_array()?
        .iter()
        .find(|e| e["mac"] == GUEST_MAC)
        .and_then(|e| e["port"].as_str().map(String::from))
}

fn dirty_log_on(control: &Path, port: &str) -> bool {
    qs_json(control, &["port", "list", "--json"])
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["name"] == port && p["dirty_log"] == true)
}

/// (received seqs with their timestamps) from `ping -D` output.
fn parse_ping(text: &str) -> Vec<(u64, f64)> {
    text.lines()
        .filter_map(|l| {
            let ts = l
                .strip_prefix('[')?
                .split(']')
                .next()?
                .parse::<f64>()
                .ok()?;
            let seq = l
                .split("icmp_seq=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()?;
            Some((seq, ts))
        })
        .collect()
}

fn guest_cfg(name: &str, sock: &Path, extra: Vec<String>) -> GuestConfig {
    GuestConfig {
        name: name.into(),
        vhost_socket: sock.to_path_buf(),
        socket_mode: SocketMode::Client,
        mac: GUEST_MAC.into(),
        ip_cidr: format!("{GUEST_IP}/24"),
        mem_mb: 128,
        ready_timeout: Some(BOOT),
        qemu_args: extra,
        ..GuestConfig::default()
    }
}

/// The tests of this file run one at a time (guests under TCG share the CPUs).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The guest negotiates VIRTIO_NET_F_GUEST_ANNOUNCE and announces itself after the move.
#[test]
fn guest_migrates_between_ports_and_keeps_connectivity() {
    scenario(1, true);
}

/// Without GUEST_ANNOUNCE (`guest_announce=off`), QEMU sends VHOST_USER_SEND_RARP on the
/// destination and qswitch injects the RARP: the MAC moves all the same.
#[test]
fn guest_without_announce_is_found_by_rarp() {
    scenario(2, false);
}

fn scenario(tag: u8, announce: bool) {
    if !common::root_or_skip() || common_guest::assets().is_none() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new(&format!("migrate{tag}"));
    let pid = std::process::id();
    let ns = Netns::new(&format!("qsmig{pid}-{tag}"));
    let tap = format!("qmig{tag}-{}", pid % 100_000);
    let control = dir.join("control.sock");
    let config = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"p1\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n\
         [[port]]\nname = \"p2\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n\
         [[port]]\nname = \"tap\"\ntype = \"tap\"\nifname = \"{tap}\"\n",
        common::worker_cpus(1),
        control.display(),
        dir.join("p1.sock").display(),
        dir.join("p2.sock").display(),
    );
    std::fs::write(dir.join("qswitch.toml"), &config).unwrap();
    let mut daemon = DaemonChild::spawn_logging(
        &dir.join("qswitch.toml"),
        &control,
        &dir.join("qswitch.log"),
        "info,qswitch_dp::port::vhost_user=debug",
    );
    daemon.wait_ready();
    ns.adopt(&tap, &format!("{NS_IP}/24"), false);
    if let Err(e) = run(&dir, &control, &ns, announce) {
        panic!(
            "{e:#}\n--- qswitch log (tail) ---\n{}",
            daemon
                .log_text()
                .lines()
                .rev()
                .take(60)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

fn run(dir: &TempDir, control: &Path, ns: &Netns, announce: bool) -> Result<()> {
    let qmp_src = dir.join("qmp-src.sock");
    let qmp_dst = dir.join("qmp-dst.sock");
    let mig = dir.join("mig.sock");
    let qmp_arg = |p: &Path| {
        let mut a = vec![
            "-qmp".to_string(),
            format!("unix:{},server=on,wait=off", p.display()),
        ];
        if !announce {
            a.extend(["-global".into(), "virtio-net-pci.guest_announce=off".into()]);
        }
        a
    };
    let mut src = Guest::boot(guest_cfg("mga", &dir.join("p1.sock"), qmp_arg(&qmp_src)))?;
    eprintln!(
        "source guest booted in {:.1?} ({:?})",
        src.boot_time().unwrap_or_default(),
        src.accel()
    );
    let mut extra = qmp_arg(&qmp_dst);
    extra.extend(["-incoming".to_string(), format!("unix:{}", mig.display())]);
    let mut dst = Guest::start(guest_cfg("mgb", &dir.join("p2.sock"), extra))?;

    // Connectivity before the move; the MAC is on p1.
    src.run_ok(&format!("ping -c 2 -W 2 {NS_IP}"), T)?;
    if !wait_until(T, || fdb_port(control).as_deref() == Some("p1")) {
        bail!("guest MAC not learned on p1");
    }
    let ping_log = dir.join("ping.log");
    let mut ping = ns.spawn(
        &[
            "stdbuf", "-oL", "ping", "-D", "-n", "-i", "0.01", "-W", "1", GUEST_IP,
        ],
        &ping_log,
    );
    std::thread::sleep(Duration::from_secs(2));

    wait_incoming(&mig)?;
    let mut qmp = Qmp::connect(&qmp_src)?;
    let _qmp_dst = Qmp::connect(&qmp_dst)?;
    let t0 = Instant::now();
    qmp.exec(
        "migrate",
        serde_json::json!({ "uri": format!("unix:{}", mig.display()) }),
    )?;
    let mut saw_logging = false;
    let status = loop {
        let st = qmp.exec("query-migrate", Value::Null)?;
        let s = st["status"].as_str().unwrap_or("").to_string();
        if !saw_logging && dirty_log_on(control, "p1") {
            saw_logging = true;
        }
        if s == "completed" || s == "failed" || s == "cancelled" {
            eprintln!("migration {s} in {:.1?}: {st}", t0.elapsed());
            break s;
        }
        if t0.elapsed() > MIGRATE {
            bail!("migration not done within {MIGRATE:?}: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if status != "completed" {
        bail!("migration {status}\n{}\n{}", src.logs(), dst.logs());
    }
    let moved_at = Instant::now();
    let mut moved = None;
    while moved_at.elapsed() < Duration::from_secs(10) {
        if fdb_port(control).as_deref() == Some("p2") {
            moved = Some(moved_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let moved = moved.ok_or_else(|| anyhow!("the fdb did not move the guest's MAC to p2"))?;
    std::thread::sleep(Duration::from_secs(3));
    ping.stop();
    src.kill();
    dst.adopt_migrated(&src);
    dst.run_ok(&format!("ping -c 3 -W 2 {NS_IP}"), T)
        .context("the migrated guest reaches the namespace")?;

    let text = std::fs::read_to_string(&ping_log)?;
    let got = parse_ping(&text);
    if got.len() < 10 {
        bail!("too few ping replies:\n{text}");
    }
    let first = got.first().map(|g| g.0).unwrap_or(0);
    let last = got.last().map(|g| g.0).unwrap_or(0);
    let lost = (last - first + 1).saturating_sub(got.len() as u64);
    let gap = got
        .windows(2)
        .map(|w| w[1].1 - w[0].1)
        .fold(0.0f64, f64::max);
    let stats = qs_json(control, &["stats", "--json"]);
    let logged = counter(&stats, "p1", "logged_pages");
    let announces = counter(&stats, "p2", "announces");
    eprintln!(
        "migration p1 -> p2: {lost} of {} pings lost (10 ms apart), longest gap {:.0} ms, \
         fdb moved {moved:.1?} after completion, {logged} page marks logged on p1, \
         {announces} RARP(s) injected on p2, logging seen on: {saw_logging}",
        last - first + 1,
        gap * 1000.0
    );
    if !announce && announces == 0 {
        bail!("no RARP injected on p2 for a guest without GUEST_ANNOUNCE");
    }
    if logged == 0 {
        bail!("no dirty pages logged on p1");
    }
    if gap > GAP_MAX.as_secs_f64() {
        bail!("longest ping gap {gap:.2} s over {GAP_MAX:?}");
    }
    Ok(())
}

/// Runs `migrate` on the QMP socket `qmp` to `mig` and waits for completion.
fn migrate(qmp: &Path, mig: &Path) -> Result<Duration> {
    wait_incoming(mig)?;
    let mut q = Qmp::connect(qmp)?;
    let t0 = Instant::now();
    q.exec(
        "migrate",
        serde_json::json!({ "uri": format!("unix:{}", mig.display()) }),
    )?;
    loop {
        let st = q.exec("query-migrate", Value::Null)?;
        match st["status"].as_str().unwrap_or("") {
            "completed" => return Ok(t0.elapsed()),
            "failed" | "cancelled" => bail!("migration failed: {st}"),
            _ if t0.elapsed() > MIGRATE => bail!("migration not done within {MIGRATE:?}: {st}"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Five migrations back and forth (p1 → p2 → p1 …) while the guest sends a TCP stream
/// (iperf3) to the namespace: the connection survives all of them.
#[test]
fn five_migrations_back_and_forth_keep_a_tcp_connection() {
    if !common::root_or_skip() || common_guest::assets().is_none() {
        return;
    }
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("migrate5");
    let pid = std::process::id();
    let ns = Netns::new(&format!("qsmig{pid}-5"));
    let tap = format!("qmig5-{}", pid % 100_000);
    let control = dir.join("control.sock");
    let config = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"p1\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n\
         [[port]]\nname = \"p2\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n\
         [[port]]\nname = \"tap\"\ntype = \"tap\"\nifname = \"{tap}\"\n",
        common::worker_cpus(1),
        control.display(),
        dir.join("p1.sock").display(),
        dir.join("p2.sock").display(),
    );
    std::fs::write(dir.join("qswitch.toml"), &config).unwrap();
    let mut daemon = DaemonChild::spawn_logging(
        &dir.join("qswitch.toml"),
        &control,
        &dir.join("qswitch.log"),
        "info",
    );
    daemon.wait_ready();
    ns.adopt(&tap, &format!("{NS_IP}/24"), false);
    let _server = ns.spawn(&["iperf3", "-s", "-1"], &dir.join("iperf3-server.log"));
    if let Err(e) = five(&dir, &control) {
        panic!(
            "{e:#}\n--- iperf3 server ---\n{}\n--- qswitch log ---\n{}",
            std::fs::read_to_string(dir.join("iperf3-server.log")).unwrap_or_default(),
            daemon.log_text()
        );
    }
}

fn five(dir: &TempDir, control: &Path) -> Result<()> {
    let qmp = |i: usize| dir.join(&format!("qmp{i}.sock"));
    let sock = |i: usize| {
        dir.join(if i.is_multiple_of(2) {
            "p1.sock"
        } else {
            "p2.sock"
        })
    };
    let qmp_arg = |i: usize| {
        vec![
            "-qmp".to_string(),
            format!("unix:{},server=on,wait=off", qmp(i).display()),
        ]
    };
    let mut cur = Guest::boot(guest_cfg("m5a", &sock(0), qmp_arg(0)))?;
    cur.run_ok(&format!("ping -c 2 -W 2 {NS_IP}"), T)?;
    cur.run_ok(
        &format!("(iperf3 -c {NS_IP} -t 40 -i 5 > /tmp/iperf.log 2>&1 &)"),
        T,
    )?;
    std::thread::sleep(Duration::from_secs(3));
    let mut times = Vec::new();
    for i in 1..=5 {
        let mig = dir.join(&format!("mig{i}.sock"));
        let mut extra = qmp_arg(i);
        extra.extend(["-incoming".to_string(), format!("unix:{}", mig.display())]);
        let mut next = Guest::start(guest_cfg(&format!("m5{i}"), &sock(i), extra))?;
        let took = migrate(&qmp(i - 1), &mig)?;
        let port = if i.is_multiple_of(2) { "p1" } else { "p2" };
        if !wait_until(Duration::from_secs(10), || {
            fdb_port(control).as_deref() == Some(port)
        }) {
            bail!("migration {i}: the fdb did not move the MAC to {port}");
        }
        cur.kill();
        next.adopt_migrated(&cur);
        cur = next;
        times.push(format!("{took:.1?}"));
        std::thread::sleep(Duration::from_secs(2));
    }
    let out = cur.run_ok(
        "pidof iperf3 >/dev/null || echo ENDED_EARLY; \
         while pidof iperf3 >/dev/null; do sleep 1; done; cat /tmp/iperf.log",
        Duration::from_secs(60),
    )?;
    eprintln!("5 migrations ({}); iperf3:\n{out}", times.join(", "));
    if out.contains("ENDED_EARLY") || !out.contains("sender") || out.contains("error") {
        bail!("the TCP stream did not survive the migrations:\n{out}");
    }
    Ok(())
}
