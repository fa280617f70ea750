//! Bounded command runs, a `qswitch run` child, raw control-socket requests, network
//! namespaces and temp dirs. Everything here cleans up after itself on drop (also when a test
//! panics), and no wait is unbounded.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::skip::{cpus_or_skip, online_cpus, root_or_skip, skip};

/// The qswitch binary under test: `target/PROFILE/qswitch`, next to the `deps/` directory
/// of the running test binary (cargo builds a package's binaries before its integration
/// tests; `CARGO_BIN_EXE_qswitch` exists only inside the qswitch package).
pub fn qswitch_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/PROFILE/deps/TEST");
        let bin = profile_dir.join("qswitch");
        assert!(
            bin.is_file(),
            "{} missing: build qswitch first",
            bin.display()
        );
        bin
    })
}

/// Default bound on one command run.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(30);

/// DPDK's testpmd, installed from Debian's `dpdk-dev` when missing.
pub const TESTPMD: &str = "dpdk-testpmd";

/// For the testpmd tests: the second online CPU (the qswitch worker's; testpmd's lcores
/// share the first), or `None` with a skip notice when they cannot run: not root, fewer
/// than two CPUs, or no testpmd even after `apt-get install dpdk-dev`.
pub fn testpmd_worker_cpu() -> Option<usize> {
    if !root_or_skip() || !cpus_or_skip(2) {
        return None;
    }
    let cpus = online_cpus();
    let have = || {
        Command::new(TESTPMD)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    };
    if !have() {
        let out = run_timeout(
            Command::new("apt-get")
                .args(["install", "-y", "dpdk-dev"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            Duration::from_secs(300),
        );
        if !out.ok() || !have() {
            skip(&format!(
                "{TESTPMD} missing and apt-get install dpdk-dev failed: {out:?}"
            ));
            return None;
        }
    }
    Some(cpus[1])
}

/// The lowest-numbered online CPU.
pub fn first_cpu() -> usize {
    online_cpus()[0]
}

/// The first (at most) `max` online CPUs as a CPU list, e.g. "0-1".
pub fn worker_cpus(max: usize) -> String {
    let cpus = online_cpus();
    cpus.iter()
        .take(max)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits for a condition: polls `f` until it returns true or `timeout` passes, and returns
/// the last result. The one polling loop of the tests: the first polls come quickly (1 ms
/// apart, doubling up to 20 ms), so a condition that holds soon is seen soon and a long wait
/// costs little CPU. Tests wait for what they need with this (or [`wait_for`]), never for a
/// fixed time.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        if f() {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// [`wait_until`], failing the test with "timed out after TIMEOUT waiting for WHAT".
#[track_caller]
pub fn wait_for(what: &str, timeout: Duration, f: impl FnMut() -> bool) {
    assert!(
        wait_until(timeout, f),
        "timed out after {timeout:?} waiting for {what}"
    );
}

/// A directory under the system temp dir, unique to this process and `tag`, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// `/tmp/qswitch-it-<pid>-<tag>`. The first one a test process makes also reaps what
    /// SIGKILLed test processes left behind ([`reap_orphans`] with [`temp_dir_owner`]): the
    /// daemons, QEMUs, libvirtds and testpmds whose command lines name their dirs, and the
    /// dirs.
    pub fn new(tag: &str) -> TempDir {
        static REAPED: std::sync::Once = std::sync::Once::new();
        REAPED.call_once(|| reap_orphans("qswitch-it-", temp_dir_owner, |_| true));
        let path = std::env::temp_dir().join(format!("qswitch-it-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create temp dir");
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct Out {
    /// Exit code; `None` when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// Stderr lines that are not empty.
    pub fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Panics (with everything the command printed) unless it exited 0.
    pub fn assert_ok(&self, what: &str) -> &Out {
        assert!(self.ok(), "{what} failed: {self:?}");
        self
    }

    /// Asserts that nothing looks like a Rust panic.
    pub fn assert_no_panic(&self) -> &Out {
        for text in [&self.stdout, &self.stderr] {
            assert!(!text.contains("panicked"), "panic: {self:?}");
            assert!(!text.contains("stack backtrace"), "backtrace: {self:?}");
            assert!(!text.contains("RUST_BACKTRACE"), "panic hint: {self:?}");
        }
        self
    }
}

/// Runs `cmd` to completion (stdin closed, stdout and stderr captured), killing it and
/// panicking if it takes longer than `timeout`.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Out {
    let desc = format!("{cmd:?}");
    let mut child = ChildGuard::new(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {desc}: {e}")),
    );
    let c = child.0.as_mut().expect("child");
    let mut so = c.stdout.take().expect("stdout");
    let mut se = c.stderr.take().expect("stderr");
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = so.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = se.read_to_end(&mut s);
        String::from_utf8_lossy(&s).into_owned()
    });
    let Some(status) = child.wait_timeout(timeout) else {
        drop(child);
        panic!("{desc} did not finish within {timeout:?}");
    };
    Out {
        code: status.code(),
        stdout: t_out.join().unwrap_or_default(),
        stderr: t_err.join().unwrap_or_default(),
    }
}

/// Runs a command given as words, bounded by [`CMD_TIMEOUT`].
pub fn sh(args: &[&str]) -> Out {
    run_timeout(Command::new(args[0]).args(&args[1..]), CMD_TIMEOUT)
}

/// Runs a command given as words and panics unless it succeeds.
pub fn sh_ok(args: &[&str]) -> Out {
    let out = sh(args);
    out.assert_ok(&args.join(" "));
    out
}

/// Whether interface `ifname` exists in the root network namespace.
pub fn link_exists(ifname: &str) -> bool {
    sh(&["ip", "link", "show", "dev", ifname]).ok()
}

/// The test process whose [`TempDir`] `arg` names (`…/qswitch-it-<pid>-<tag>…`).
pub fn temp_dir_owner(arg: &str) -> Option<u32> {
    let rest = &arg[arg.find("qswitch-it-")? + "qswitch-it-".len()..];
    rest.split('-').next()?.parse().ok()
}

/// What test processes killed without cleaning up (SIGKILL) left behind: kills the
/// processes `kill_it` accepts whose command line `owner_of` attributes (through any
/// argument, e.g. a path under the test's temp dir) to a process that no longer exists,
/// then removes the temp dirs named `dir_prefix…` that `owner_of` attributes to one.
/// Nothing of a live process is touched.
pub fn reap_orphans(
    dir_prefix: &str,
    owner_of: impl Fn(&str) -> Option<u32>,
    kill_it: impl Fn(&[String]) -> bool,
) {
    let dead = |owner: u32| !std::path::Path::new(&format!("/proc/{owner}")).exists();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if !kill_it(&args) {
                continue;
            }
            if let Some(owner) = args.iter().find_map(|a| owner_of(a)) {
                if dead(owner) {
                    eprintln!(
                        "killing {pid} ({}) left by dead test process {owner}",
                        args[0]
                    );
                    signal(pid, "KILL");
                }
            }
        }
    }
    if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(dir_prefix) && owner_of(&name).is_some_and(dead) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}

/// Sends `sig` (e.g. "TERM") to `pid` with kill(1).
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// A child process, stopped on drop: SIGTERM, then SIGKILL after 3 s, then reaped.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    pub fn new(child: Child) -> ChildGuard {
        ChildGuard(Some(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.as_ref().map(Child::id).unwrap_or(0)
    }

    /// The exit status if the child has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.0.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for the child to exit by itself.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the child (if still running) and reaps it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            signal(child.id(), "TERM");
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs the qswitch CLI against `control`, bounded in time.
pub fn qs(control: &Path, args: &[&str]) -> Out {
    run_timeout(
        Command::new(qswitch_bin())
            .arg("--control")
            .arg(control)
            .args(args)
            .env("RUST_BACKTRACE", "1"),
        CMD_TIMEOUT,
    )
}

/// Runs the qswitch CLI with `--json`-style output: asserts success and parses stdout.
pub fn qs_json(control: &Path, args: &[&str]) -> Value {
    let out = qs(control, args);
    out.assert_ok(&format!("qswitch {}", args.join(" ")));
    serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("qswitch {} printed no JSON ({e}): {out:?}", args.join(" ")))
}

/// Makes security group `name` live over `control`: `sg add NAME`, then `sg rule add NAME
/// RULE...` for each of `rules` (e.g. `&["--direction", "egress"]`), then `port set PORT
/// --security-groups NAME` for each of `ports`. The first command that fails stops it: its
/// arguments and output are the error.
pub fn add_security_group(
    control: &Path,
    name: &str,
    rules: &[&[&str]],
    ports: &[&str],
) -> Result<(), String> {
    let steps = std::iter::once(vec!["sg", "add", name])
        .chain(
            rules
                .iter()
                .map(|r| [&["sg", "rule", "add", name][..], r].concat()),
        )
        .chain(
            ports
                .iter()
                .map(|p| vec!["port", "set", p, "--security-groups", name]),
        );
    for args in steps {
        let out = qs(control, &args);
        if !out.ok() {
            return Err(format!("qswitch {}: {out:?}", args.join(" ")));
        }
    }
    Ok(())
}

/// Port names from `port list --json`, in order.
pub fn port_names(control: &Path) -> Vec<String> {
    qs_json(control, &["port", "list", "--json"])
        .as_array()
        .expect("port list is an array")
        .iter()
        .map(|p| p["name"].as_str().expect("port name").to_string())
        .collect()
}

/// One port's entry in a `stats --json` report.
pub fn port_stats<'a>(stats: &'a Value, port: &str) -> &'a Value {
    stats["ports"]
        .as_array()
        .expect("stats.ports")
        .iter()
        .find(|p| p["name"] == port)
        .unwrap_or_else(|| panic!("no port {port} in stats: {stats}"))
}

/// A numeric counter of one port in a `stats --json` report (0 when absent).
pub fn counter(stats: &Value, port: &str, field: &str) -> u64 {
    port_stats(stats, port)[field].as_u64().unwrap_or(0)
}

/// A drop counter of one port in a `stats --json` report (0 when absent).
pub fn drops(stats: &Value, port: &str, reason: &str) -> u64 {
    port_stats(stats, port)["drops"][reason]
        .as_u64()
        .unwrap_or(0)
}

/// Sends one raw line on the control socket and reads one JSON line back (5 s bounds).
pub fn request(control: &Path, line: &[u8]) -> std::io::Result<Value> {
    let stream = UnixStream::connect(control)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    (&stream).write_all(line)?;
    let mut reply = String::new();
    BufReader::new(&stream).read_line(&mut reply)?;
    serde_json::from_str(&reply).map_err(|e| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{e}: {reply:?}"))
    })
}

/// A `qswitch run` child with its stderr in a file; stopped (SIGTERM, then SIGKILL) on drop.
pub struct DaemonChild {
    pub child: ChildGuard,
    pub control: PathBuf,
    pub log: PathBuf,
}

impl DaemonChild {
    /// Starts `qswitch run --config config` without waiting for it.
    pub fn spawn(config: &Path, control: &Path, log: &Path) -> DaemonChild {
        DaemonChild::spawn_logging(config, control, log, "info")
    }

    /// Like [`DaemonChild::spawn`], with `filter` as the daemon's `QSWITCH_LOG`.
    pub fn spawn_logging(config: &Path, control: &Path, log: &Path, filter: &str) -> DaemonChild {
        let err = File::create(log).expect("daemon log file");
        let child = Command::new(qswitch_bin())
            .args(["run", "--config"])
            .arg(config)
            .env("QSWITCH_LOG", filter)
            .env("RUST_BACKTRACE", "1")
            // Live changes are recorded next to the config (`[switch] state_dir` wins), never
            // in the host's /var/lib/qswitch.
            .env("STATE_DIRECTORY", config.with_extension("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start qswitch run");
        DaemonChild {
            child: ChildGuard::new(child),
            control: control.to_path_buf(),
            log: log.to_path_buf(),
        }
    }

    /// Writes `config_text` to `dir/name.toml`, starts the daemon and waits (10 s at most)
    /// until its control socket answers a ping.
    pub fn start(dir: &Path, name: &str, config_text: &str, control: &Path) -> DaemonChild {
        let config = dir.join(format!("{name}.toml"));
        std::fs::write(&config, config_text).expect("write config");
        let mut d = DaemonChild::spawn(&config, control, &dir.join(format!("{name}.log")));
        d.wait_ready();
        d
    }

    /// Waits until the daemon answers a ping (10 s at most); panics with its log if not.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(v) = request(&self.control, b"{\"request\":\"ping\"}\n") {
                if v["response"] == "pong" {
                    assert_eq!(
                        v["pid"].as_u64(),
                        Some(u64::from(self.pid())),
                        "a foreign daemon"
                    );
                    return;
                }
            }
            if let Some(st) = self.child.try_wait() {
                panic!(
                    "qswitch run exited during start-up ({st}): {}",
                    self.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "qswitch run did not answer within 10 s: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.pid()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.0.is_some() && self.child.try_wait().is_none()
    }

    /// What the daemon wrote to stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `sig` to the daemon.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// SIGTERM, then waits up to `timeout` for the exit; `None` if it is still running.
    pub fn terminate(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.signal("TERM");
        self.child.wait_timeout(timeout)
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(c) = self.child.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.child.0 = None;
    }

    /// `qswitch stats --json` against this daemon.
    pub fn stats(&self) -> Value {
        qs_json(&self.control, &["stats", "--json"])
    }
}

/// A network namespace created by a test; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(name: &str) -> Netns {
        assert!(name != "qa" && name != "qb", "not our namespace");
        let _ = sh(&["ip", "netns", "del", name]);
        sh_ok(&["ip", "netns", "add", name]);
        let ns = Netns {
            name: name.to_string(),
        };
        ns.ok(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// `ip netns exec NAME args...` as a command.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(args);
        c
    }

    /// Runs a command inside the namespace, bounded by `timeout`.
    pub fn run_for(&self, args: &[&str], timeout: Duration) -> Out {
        run_timeout(&mut self.cmd(args), timeout)
    }

    /// Runs a command inside the namespace, bounded by [`CMD_TIMEOUT`].
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_for(args, CMD_TIMEOUT)
    }

    /// Runs a command inside the namespace and panics unless it succeeds.
    pub fn ok(&self, args: &[&str]) -> Out {
        let out = self.run(args);
        out.assert_ok(&format!("[{}] {}", self.name, args.join(" ")));
        out
    }

    /// Starts a long-running command inside the namespace with stdout and stderr in `log`;
    /// it is stopped when the guard drops.
    pub fn spawn(&self, args: &[&str], log: &Path) -> ChildGuard {
        let out = File::create(log).expect("log file");
        let err = out.try_clone().expect("log file");
        let child = self
            .cmd(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {args:?} in {}: {e}", self.name));
        ChildGuard::new(child)
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.ok(&["sysctl", "-qw", &format!("{key}={value}")]);
    }

    /// Moves `ifname` from the root namespace into this one, optionally turns IPv6 off on it
    /// (so the kernel sends nothing on its own), gives it `addr` (CIDR) and sets it up.
    pub fn adopt(&self, ifname: &str, addr: &str, ipv6: bool) {
        sh_ok(&["ip", "link", "set", "dev", ifname, "netns", &self.name]);
        if !ipv6 {
            self.sysctl(&format!("net.ipv6.conf.{ifname}.disable_ipv6"), "1");
        }
        self.ok(&["ip", "addr", "add", addr, "dev", ifname]);
        self.ok(&["ip", "link", "set", "dev", ifname, "up"]);
    }

    /// The MAC address of `ifname` inside the namespace.
    pub fn mac(&self, ifname: &str) -> String {
        self.ok(&["cat", &format!("/sys/class/net/{ifname}/address")])
            .stdout
            .trim()
            .to_string()
    }

    /// Whether `ifname` exists inside the namespace.
    pub fn has_link(&self, ifname: &str) -> bool {
        self.run(&["ip", "link", "show", "dev", ifname]).ok()
    }

    /// Waits (5 s at most) until something listens on TCP `port` inside the namespace.
    pub fn wait_listening(&self, port: u16) -> bool {
        let needle = format!(":{port} ");
        wait_until(Duration::from_secs(5), || {
            self.run(&["ss", "-Hltn"]).stdout.contains(&needle)
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes interface `0` in the root namespace on drop (for interfaces a test made itself).
pub struct LinkGuard(pub String);

impl Drop for LinkGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", "dev", &self.0])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A loopback TCP address nobody listens on, for a daemon the test starts.
///
/// `bind("127.0.0.1:0")` hands out a port from the ephemeral range, which the client side of
/// every connection made by tests running beside this one also draws from: between the
/// probe and the daemon's bind, an outgoing connection can take the port (CI saw
/// "Address already in use" that way). These ports come from below the ephemeral range
/// (20000–32767), start at a place that depends on the process id, never repeat within a
/// process, and are checked free before they are handed out.
pub fn free_tcp_addr() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_768;
    let start = (std::process::id().wrapping_mul(2_654_435_761)) % SPAN;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = LOW + (start + n * 7) % SPAN;
        let addr: std::net::SocketAddr = ([127, 0, 0, 1], port as u16).into();
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!(
        "no free loopback TCP port between {LOW} and {}",
        LOW + SPAN - 1
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_dir_owner_reads_the_pid_of_our_dirs_only() {
        assert_eq!(
            temp_dir_owner("/tmp/qswitch-it-4242-libvirt/x.sock"),
            Some(4242)
        );
        assert_eq!(temp_dir_owner("path=/tmp/qswitch-it-7-a,server=1"), Some(7));
        assert_eq!(temp_dir_owner("/tmp/qswitch-it-x-1"), None);
        assert_eq!(temp_dir_owner("/tmp/qswitch-guest-5-1"), None);
    }

    #[test]
    fn orphans_of_a_dead_test_process_are_reaped_and_nothing_else() {
        // A pid that no longer runs: a child that has exited and been waited for.
        let mut gone = Command::new("true").spawn().expect("spawn true");
        let dead = gone.id();
        gone.wait().expect("wait for true");
        let tmp = std::env::temp_dir();
        let orphan_dir = tmp.join(format!("qswitch-it-{dead}-reaptest"));
        let live_dir = tmp.join(format!("qswitch-it-{}-reaptest", std::process::id()));
        for d in [&orphan_dir, &live_dir] {
            std::fs::create_dir_all(d).unwrap();
        }
        // A shell blocked in its builtin `read` on a pipe we hold: no grandchild (a `sleep`
        // child outlived its killed shell and held the test's output open), and it ends when
        // the pipe closes. Its last argument names the dir, as a daemon's socket path would.
        let sleeper = |dir: &Path| {
            let child = Command::new("sh")
                .args(["-c", "read x", "sh"])
                .arg(dir)
                .stdin(Stdio::piped())
                .spawn()
                .expect("spawn sh");
            // spawn returns once the exec began (vfork), before the kernel has set the new
            // command line up: until it has, /proc shows an empty one (CI saw the reaper miss
            // the orphan that way, on a loaded machine).
            let cmdline = format!("/proc/{}/cmdline", child.id());
            let named = wait_until(Duration::from_secs(5), || {
                std::fs::read(&cmdline).is_ok_and(|c| c.ends_with(b"-reaptest\0"))
            });
            assert!(named, "sh never showed its command line");
            child
        };
        let mut orphan = sleeper(&orphan_dir);
        let mut live = sleeper(&live_dir);
        reap_orphans("qswitch-it-", temp_dir_owner, |args| {
            args.iter().any(|a| a.ends_with("-reaptest"))
        });
        let deadline = Instant::now() + Duration::from_secs(5);
        while orphan.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let reaped = orphan.try_wait().unwrap();
        let untouched = live.try_wait().unwrap().is_none();
        let _ = live.kill();
        let _ = live.wait();
        let _ = orphan.kill();
        let _ = orphan.wait();
        let _ = std::fs::remove_dir_all(&live_dir);
        assert!(reaped.is_some(), "the orphan still runs");
        assert!(untouched, "a live test process's child was killed");
        assert!(!orphan_dir.exists(), "the orphan's dir is still there");
    }
}
