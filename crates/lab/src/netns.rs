//! Network namespaces, child processes and tools, for the demo and the benchmarks. Everything
//! made here is undone on drop (also on error and Ctrl-C), so nothing outlives a run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use qswitch_api::{Request, Response};

/// Runs a command to completion; fails with its stderr when it fails.
pub fn run(args: &[&str]) -> anyhow::Result<Output> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {}", args[0]))?;
    if !out.status.success() {
        bail!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// A network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: &str) -> anyhow::Result<Netns> {
        let _ = Command::new("ip")
            .args(["netns", "del", name])
            .stderr(Stdio::null())
            .status();
        run(&["ip", "netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
        };
        ns.exec(&["ip", "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Runs a command inside the namespace to completion.
    pub fn exec(&self, args: &[&str]) -> anyhow::Result<Output> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Starts a command inside the namespace; it is killed when the guard drops.
    pub fn spawn(&self, args: &[&str], stdout: Stdio) -> anyhow::Result<ChildGuard> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {} in {}", args[0], self.name))?;
        Ok(ChildGuard(Some(child)))
    }

    /// Moves interface `ifname` into this namespace and gives it `addr` (CIDR).
    pub fn adopt(&self, ifname: &str, addr: &str) -> anyhow::Result<()> {
        run(&["ip", "link", "set", ifname, "netns", &self.name])?;
        self.exec(&["ip", "addr", "add", addr, "dev", ifname])?;
        self.exec(&["ip", "link", "set", ifname, "up"])?;
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// A child process killed (SIGTERM, then SIGKILL after 3 s) and reaped on drop.
pub struct ChildGuard(pub Option<Child>);

impl ChildGuard {
    /// Waits for the child to exit by itself, up to `timeout`.
    pub fn wait_timeout(
        &mut self,
        timeout: Duration,
    ) -> anyhow::Result<Option<std::process::ExitStatus>> {
        let Some(child) = self.0.as_mut() else {
            return Ok(None);
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = child.try_wait()? {
                return Ok(Some(st));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Takes the child's whole stdout after it has exited.
    pub fn output(mut self) -> anyhow::Result<Output> {
        let child = self.0.take().context("no child")?;
        Ok(child.wait_with_output()?)
    }

    /// Stops the child: SIGTERM, then SIGKILL if it is still there after 3 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
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

/// Whether `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs Debian `package` with apt-get unless `tool` is already there.
pub fn ensure_tool(tool: &str, package: &str) -> anyhow::Result<()> {
    if have(tool) {
        return Ok(());
    }
    eprintln!("installing {package} (for {tool}) with apt-get ...");
    ensure_package(package)?;
    if !have(tool) {
        bail!("{tool} is still missing after installing {package}");
    }
    Ok(())
}

/// Installs Debian `package` with apt-get (after `apt-get update` if the first try fails).
pub fn ensure_package(package: &str) -> anyhow::Result<()> {
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdout(Stdio::null())
            .status()
    };
    if !install().is_ok_and(|s| s.success()) {
        let _ = Command::new("apt-get")
            .args(["update", "-qq"])
            .stdout(Stdio::null())
            .status();
        if !install().is_ok_and(|s| s.success()) {
            bail!("cannot install {package}; install it by hand (apt-get install {package})");
        }
    }
    Ok(())
}

/// Fails unless running as root.
pub fn require_root(what: &str) -> anyhow::Result<()> {
    if !qswitch_sys::thread::is_root() {
        bail!("{what} needs root (it creates network namespaces and TAP devices)");
    }
    Ok(())
}

/// A `qswitch run` child on a generated config, stopped (SIGTERM) on drop.
/// The `qswitch` binary the lab starts as the switch (`qswitch run`): `$QSWITCH_DAEMON` when
/// set, else this binary. Pointing it at another build measures that build's data path under
/// this build's harness, so a before/after comparison runs one load, one topology and one
/// report (bench/README.md, "Before and after").
pub fn daemon_exe() -> anyhow::Result<std::path::PathBuf> {
    match std::env::var_os("QSWITCH_DAEMON") {
        Some(p) if !p.is_empty() => {
            let p = std::path::PathBuf::from(p);
            if !p.is_file() {
                bail!("QSWITCH_DAEMON={} is not a file", p.display());
            }
            Ok(p)
        }
        _ => std::env::current_exe().context("cannot find the qswitch binary"),
    }
}

pub struct LabDaemon {
    pub control: PathBuf,
    child: ChildGuard,
}

impl LabDaemon {
    /// Writes `config_text` next to the control socket path and starts the daemon; returns when
    /// the control socket answers.
    pub fn start(dir: &Path, config_text: &str) -> anyhow::Result<LabDaemon> {
        LabDaemon::start_within(dir, config_text, Duration::from_secs(10))
    }

    /// [`LabDaemon::start`], waiting up to `timeout` for the control socket (a daemon with
    /// thousands of ports takes longer to start).
    pub fn start_within(
        dir: &Path,
        config_text: &str,
        timeout: Duration,
    ) -> anyhow::Result<LabDaemon> {
        std::fs::create_dir_all(dir)?;
        let config = dir.join("qswitch.toml");
        std::fs::write(&config, config_text)?;
        let parsed = qswitch_api::Config::from_toml(config_text)?;
        let control = parsed.switch.control.clone();
        let exe = daemon_exe()?;
        let child = Command::new(exe)
            .args(["run", "--config"])
            .arg(&config)
            // Live changes stay with the scenario, not in the host's /var/lib/qswitch.
            .env("STATE_DIRECTORY", dir.join("state"))
            .env(
                "QSWITCH_LOG",
                std::env::var("QSWITCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .spawn()
            .context("cannot start qswitch run")?;
        let mut d = LabDaemon {
            control,
            child: ChildGuard(Some(child)),
        };
        let deadline = Instant::now() + timeout;
        loop {
            if qswitch_api::client::call(&d.control, &Request::Ping).is_ok() {
                return Ok(d);
            }
            if let Some(st) = d.child.wait_timeout(Duration::from_millis(50))? {
                bail!("qswitch run exited during start-up ({st})");
            }
            if Instant::now() > deadline {
                bail!(
                    "qswitch run did not answer on {} within {} s",
                    d.control.display(),
                    timeout.as_secs()
                );
            }
        }
    }

    /// Current stats.
    pub fn stats(&self) -> anyhow::Result<qswitch_api::request::StatsReport> {
        match qswitch_api::client::call(&self.control, &Request::Stats)? {
            Response::Stats(s) => Ok(*s),
            _ => bail!("unexpected reply"),
        }
    }

    /// The daemon's process id (`None` once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.0.as_ref().map(std::process::Child::id)
    }

    /// Stops the daemon (SIGTERM) and waits for it.
    pub fn stop(&mut self) {
        self.child.stop();
    }
}

/// Waits until something listens on TCP `port` inside `ns` (up to 5 s).
pub fn wait_listening(ns: &Netns, port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let needle = format!(":{port} ");
    while Instant::now() < deadline {
        if let Ok(out) = ns.exec(&["ss", "-ltnH"]) {
            if String::from_utf8_lossy(&out.stdout).contains(&needle) {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("nothing listens on port {port} in {}", ns.name)
}

/// A network interface in the root namespace, deleted (`ip link del`) on drop. Deleting one
/// end of a veth pair deletes both ends, wherever the other one is.
pub struct Link {
    pub name: String,
}

impl Link {
    /// Creates a Linux bridge and sets it up.
    pub fn bridge(name: &str) -> anyhow::Result<Link> {
        let _ = Command::new("ip")
            .args(["link", "del", name])
            .stderr(Stdio::null())
            .status();
        run(&["ip", "link", "add", "name", name, "type", "bridge"])?;
        let link = Link {
            name: name.to_string(),
        };
        run(&["ip", "link", "set", name, "up"])?;
        Ok(link)
    }

    /// Creates the veth pair `name` ↔ `peer`; the guard owns `name` and so the pair. Move
    /// `peer` into a namespace with [`Netns::adopt`].
    pub fn veth(name: &str, peer: &str) -> anyhow::Result<Link> {
        let _ = Command::new("ip")
            .args(["link", "del", name])
            .stderr(Stdio::null())
            .status();
        run(&[
            "ip", "link", "add", name, "type", "veth", "peer", "name", peer,
        ])?;
        Ok(Link {
            name: name.to_string(),
        })
    }

    /// Enslaves this interface to `bridge` and sets it up.
    pub fn attach(&self, bridge: &Link) -> anyhow::Result<()> {
        run(&["ip", "link", "set", &self.name, "master", &bridge.name])?;
        run(&["ip", "link", "set", &self.name, "up"])?;
        Ok(())
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Starts an iperf3 TCP client in `ns` toward `addr` for `seconds` with `streams` parallel
/// streams, printing its result as JSON (`-J`) when it ends.
pub fn iperf3_client(
    ns: &Netns,
    addr: &str,
    seconds: u32,
    streams: u32,
) -> anyhow::Result<ChildGuard> {
    iperf3_client_with(ns, addr, seconds, streams, &[])
}

/// [`iperf3_client`] with extra iperf3 arguments (e.g. `-M 100`).
pub fn iperf3_client_with(
    ns: &Netns,
    addr: &str,
    seconds: u32,
    streams: u32,
    extra: &[&str],
) -> anyhow::Result<ChildGuard> {
    let (secs, p) = (seconds.to_string(), streams.to_string());
    let mut args = vec![
        "iperf3",
        "-c",
        addr,
        "-t",
        &secs,
        "-P",
        &p,
        "-J",
        "--connect-timeout",
        "3000",
    ];
    args.extend_from_slice(extra);
    ns.spawn(&args, Stdio::piped())
}

/// What an iperf3 `-J` result says overall: Gbit/s received and the sender's retransmits.
/// An error iperf3 reports becomes `Err`.
pub fn iperf3_summary(json: &serde_json::Value) -> anyhow::Result<(f64, u64)> {
    if let Some(e) = json.get("error").and_then(|e| e.as_str()) {
        bail!("iperf3: {e}");
    }
    let gbps = json["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap_or(0.0)
        / 1e9;
    let retransmits = json["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
    Ok((gbps, retransmits))
}
