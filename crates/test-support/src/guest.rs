//! QEMU test guests for the qswitch integration tests: small Linux guests (Debian's kernel,
//! a busybox initramfs with iperf3 and ethtool, built by `tests/guest/build.sh`) with one
//! virtio-net NIC, normally on a vhost-user socket served or dialled by qswitch.
//!
//! `use qswitch_test_support::guest;`. Self-contained
//! (std + anyhow). A typical test:
//!
//! ```text
//! let Some((kernel, initrd)) = guest::assets() else { return }; // skips (or fails in CI)
//! let mut a = Guest::boot(GuestConfig {
//!     name: "a".into(),
//!     vhost_socket: dir.join("a.sock"),
//!     socket_mode: SocketMode::Server, // QEMU listens, qswitch connects
//!     ip_cidr: "10.0.0.1/24".into(),
//!     ..GuestConfig::default()
//! })?;
//! let (rc, out) = a.run("ping -c 3 -W 2 10.0.0.2", Duration::from_secs(20))?;
//! ```
//!
//! The guest's control channel is its second serial port (ttyS1, raw, no echo), connected to
//! a Unix socket this module listens on; ttyS0 (the kernel console) goes to a log file whose
//! tail is part of every boot error. QEMU is killed and reaped on drop and every wait is
//! bounded. Guests run under KVM only where the host CPU has hardware virtualisation
//! (vmx/svm) and `/dev/kvm` opens, else under TCG (about 5-10 s to boot, 0.2-0.6 Gbit/s):
//! `QS_GUEST_ACCEL=kvm|tcg` overrides the choice. Assets live in `$QS_GUEST_DIR` or
//! `/var/cache/qswitch-guest`.
//!
//! [`Guest::external`] drives a guest whose QEMU another program (libvirt) starts with the
//! same kernel, command line and serial ports.

use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::skip::{is_root, skip};

/// The QEMU binary guests run under.
pub const QEMU: &str = "qemu-system-x86_64";

/// Default cache of the guest assets (overridden by `$QS_GUEST_DIR`).
pub const DEFAULT_ASSET_DIR: &str = "/var/cache/qswitch-guest";

/// Bound on `tests/guest/build.sh` (a first build downloads ~70 MB and takes ~20-60 s).
const BUILD_TIMEOUT: Duration = Duration::from_secs(1200);

/// Bound on QEMU connecting to the control socket after it was started.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// Extra time over a command's own timeout for the guest to report its end.
const RUN_GRACE: Duration = Duration::from_secs(5);

/// Which side of the vhost-user socket QEMU takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketMode {
    /// QEMU listens (`server=on,wait=off`) and qswitch connects. QEMU does not start the
    /// guest until the backend has connected.
    Server,
    /// QEMU connects (`reconnect=1`: retries every second, also after qswitch restarts).
    Client,
}

/// The accelerator QEMU uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// KVM when the host has hardware virtualisation and `/dev/kvm`, else TCG
    /// (`QS_GUEST_ACCEL=kvm|tcg` overrides).
    Auto,
    Kvm,
    Tcg,
}

impl Accel {
    /// `Auto` made concrete.
    pub fn resolve(self) -> Accel {
        match self {
            Accel::Auto => match std::env::var("QS_GUEST_ACCEL").as_deref() {
                Ok("kvm") => Accel::Kvm,
                Ok("tcg") => Accel::Tcg,
                _ if kvm_usable() => Accel::Kvm,
                _ => Accel::Tcg,
            },
            a => a,
        }
    }
}

/// True when the host CPU has vmx or svm and `/dev/kvm` opens. (Where /dev/kvm is a
/// software nested hypervisor without those flags, stock guest kernels do not boot.)
pub fn kvm_usable() -> bool {
    let hw = std::fs::read_to_string("/proc/cpuinfo")
        .map(|s| {
            s.lines()
                .filter(|l| l.starts_with("flags"))
                .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
        })
        .unwrap_or(false);
    hw && OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// The guest's network backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Netdev {
    /// vhost-user on [`GuestConfig::vhost_socket`] as [`GuestConfig::socket_mode`] says, with
    /// [`GuestConfig::queues`] queue pairs (the default).
    VhostUser,
    /// QEMU's user-mode network (`restrict=on`: nothing leaves the host). For harness tests.
    User,
    /// Any other QEMU netdev: the text after `-netdev ` without `id=`, e.g.
    /// `dgram,local.type=unix,local.path=a,remote.type=unix,remote.path=b`.
    Custom(String),
}

impl Netdev {
    /// Two netdevs wired to each other by datagram Unix sockets under `dir` (no ordering
    /// needed between the two QEMUs; frames sent before the peer is up are dropped).
    pub fn dgram_pair(dir: &Path) -> (Netdev, Netdev) {
        let a = qemu_escape(&dir.join("dgram-a.sock"));
        let b = qemu_escape(&dir.join("dgram-b.sock"));
        let nd = |l: &str, r: &str| {
            Netdev::Custom(format!(
                "dgram,local.type=unix,local.path={l},remote.type=unix,remote.path={r}"
            ))
        };
        (nd(&a, &b), nd(&b, &a))
    }
}

/// What to boot. Build it with struct update syntax over [`GuestConfig::default`].
#[derive(Clone, Debug)]
pub struct GuestConfig {
    /// Short name: hostname, QEMU `-name`, temp dir and MAC derivation.
    pub name: String,
    /// The vhost-user socket (for [`Netdev::VhostUser`]).
    pub vhost_socket: PathBuf,
    pub socket_mode: SocketMode,
    /// Queue pairs (vhost-user `queues=`, virtio-net `mq=on` when > 1, and the guest sets
    /// `ethtool -L eth0 combined N`).
    pub queues: u16,
    /// MAC of eth0; empty: 52:54:00 plus three bytes derived from `name`.
    pub mac: String,
    /// Address of eth0, e.g. "10.0.0.1/24"; empty: none.
    pub ip_cidr: String,
    pub mem_mb: u32,
    pub accel: Accel,
    /// vCPUs.
    pub smp: u16,
    pub netdev: Netdev,
    /// More kernel parameters, e.g. `qs.role=server` (the guest exports every `qs.KEY=V` to
    /// commands as `QS_KEY`).
    pub cmdline: Vec<String>,
    /// Bound on the boot (QEMU start to `__QS_READY__`); None: 60 s under TCG, 30 s under
    /// KVM.
    pub ready_timeout: Option<Duration>,
    /// More QEMU arguments, appended (e.g. `-qmp ...`, `-incoming ...` for migration).
    pub qemu_args: Vec<String>,
}

impl Default for GuestConfig {
    fn default() -> GuestConfig {
        GuestConfig {
            name: "guest".into(),
            vhost_socket: PathBuf::new(),
            socket_mode: SocketMode::Server,
            queues: 1,
            mac: String::new(),
            ip_cidr: String::new(),
            mem_mb: 512,
            accel: Accel::Auto,
            smp: 1,
            netdev: Netdev::VhostUser,
            cmdline: Vec::new(),
            ready_timeout: None,
            qemu_args: Vec::new(),
        }
    }
}

impl GuestConfig {
    /// The MAC eth0 gets.
    pub fn mac(&self) -> String {
        if !self.mac.is_empty() {
            return self.mac.clone();
        }
        // FNV-1a of the name.
        let h = self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!(
            "52:54:00:{:02x}:{:02x}:{:02x}",
            (h >> 16) as u8,
            (h >> 8) as u8,
            h as u8
        )
    }

    /// The guest kernel's command line: the console on ttyS0, the `qs.*` parameters the
    /// guest's /init reads (name, address, queue pairs), then [`GuestConfig::cmdline`].
    pub fn kernel_cmdline(&self) -> String {
        let mut append = format!("console=ttyS0 quiet panic=-1 qs.name={}", self.name);
        if !self.ip_cidr.is_empty() {
            let _ = write!(append, " qs.ip={}", self.ip_cidr);
        }
        if self.queues > 1 {
            let _ = write!(append, " qs.queues={}", self.queues);
        }
        for p in &self.cmdline {
            let _ = write!(append, " {p}");
        }
        append
    }
}

/// A running guest. QEMU is killed and reaped, and its temp dir removed, on drop.
pub struct Guest {
    name: String,
    accel: Accel,
    child: Option<Child>,
    /// The control socket's listener until QEMU connected.
    listener: Option<UnixListener>,
    ctl: Option<UnixStream>,
    /// Bytes read from the control channel and not consumed yet.
    buf: Vec<u8>,
    seq: u64,
    dir: PathBuf,
    /// QEMU's own output: `dir/qemu.log`, or what [`Guest::set_qemu_log`] named.
    qemu_log: PathBuf,
    /// Removed on drop (QEMU's own vhost-user server socket).
    remove_on_drop: Option<PathBuf>,
    started: Instant,
    boot_time: Option<Duration>,
}

impl Guest {
    /// Starts QEMU and waits for the guest to report `__QS_READY__` (network configured).
    pub fn boot(cfg: GuestConfig) -> Result<Guest> {
        let timeout = cfg.ready_timeout;
        let mut g = Guest::start(cfg)?;
        let timeout = timeout.unwrap_or(match g.accel {
            Accel::Kvm => Duration::from_secs(30),
            _ => Duration::from_secs(60),
        });
        g.wait_ready(timeout)?;
        Ok(g)
    }

    /// Starts QEMU and takes its control connection, without waiting for the guest: boot
    /// several guests in parallel with `start` then [`Guest::wait_ready`] on each.
    pub fn start(cfg: GuestConfig) -> Result<Guest> {
        let (kernel, initrd) =
            assets().ok_or_else(|| anyhow!("guest assets unavailable (see the skip notice)"))?;
        if cfg.netdev == Netdev::VhostUser && cfg.vhost_socket.as_os_str().is_empty() {
            bail!("{}: Netdev::VhostUser needs vhost_socket", cfg.name);
        }
        let mut g = Guest::listening(&cfg)?;
        let args = qemu_args(&cfg, g.accel, &kernel, &initrd, &g.dir, &g.control_socket());
        if cfg.netdev == Netdev::VhostUser && cfg.socket_mode == SocketMode::Server {
            g.remove_on_drop = Some(cfg.vhost_socket.clone());
        }
        let log = std::fs::File::create(&g.qemu_log)?;
        g.started = Instant::now();
        let child = Command::new(QEMU)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {QEMU}"))?;
        g.child = Some(child);
        // QEMU creates its chardevs (and so dials us) before its netdevs and the guest.
        g.accept(CONNECT_TIMEOUT)?;
        Ok(g)
    }

    /// A guest whose QEMU another program starts, e.g. libvirt (`tests/libvirt.rs`): makes the
    /// guest's temp dir and listens on [`Guest::control_socket`]. That program then starts
    /// QEMU on the [`assets`] with [`GuestConfig::kernel_cmdline`], the first serial port
    /// (ttyS0) written to [`Guest::console_path`] and the second (ttyS1) connected to the
    /// control socket; then [`Guest::accept`] and [`Guest::wait_ready`] (timed from this
    /// call). Of `cfg` only the name and the accelerator are used here; the caller builds
    /// QEMU's configuration from it ([`GuestConfig::kernel_cmdline`], [`GuestConfig::mac`]).
    /// The other program owns QEMU: dropping the guest closes the control connection and
    /// removes the temp dir but kills nothing, and [`Guest::pid`] is None.
    pub fn external(cfg: &GuestConfig) -> Result<Guest> {
        Guest::listening(cfg)
    }

    /// A guest with its temp dir made and its control socket listening, QEMU not started.
    fn listening(cfg: &GuestConfig) -> Result<Guest> {
        static REAPED: Once = Once::new();
        REAPED.call_once(reap_orphans);
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "qswitch-guest-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            cfg.name
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let mut g = Guest {
            name: cfg.name.clone(),
            accel: cfg.accel.resolve(),
            child: None,
            listener: None,
            ctl: None,
            buf: Vec::new(),
            seq: 0,
            qemu_log: dir.join("qemu.log"),
            dir,
            remove_on_drop: None,
            started: Instant::now(),
            boot_time: None,
        };
        let ctl_path = g.control_socket();
        let listener = UnixListener::bind(&ctl_path)
            .with_context(|| format!("bind {}", ctl_path.display()))?;
        listener.set_nonblocking(true)?;
        g.listener = Some(listener);
        Ok(g)
    }

    /// Waits (at most `timeout`) for QEMU to connect to the control socket, then stops
    /// listening. Fails early when a QEMU this module started exits. Done by
    /// [`Guest::start`]; for [`Guest::external`] guests, call it once QEMU was started.
    pub fn accept(&mut self, timeout: Duration) -> Result<()> {
        let Some(listener) = self.listener.take() else {
            bail!("{}: the control channel was accepted already", self.name);
        };
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => return Err(e).context("accept the control connection"),
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                bail!(
                    "{}: QEMU exited ({st}) before connecting its control channel\n{}",
                    self.name,
                    self.logs()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{}: QEMU did not connect its control channel in {timeout:?}\n{}",
                    self.name,
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        drop(listener);
        let _ = std::fs::remove_file(self.control_socket());
        stream.set_nonblocking(false)?;
        self.ctl = Some(stream);
        Ok(())
    }

    /// The Unix socket QEMU's second serial port (ttyS1, the control channel) connects to;
    /// it exists until [`Guest::accept`] took the connection.
    pub fn control_socket(&self) -> PathBuf {
        self.dir.join("ctl.sock")
    }

    /// The file the kernel console (ttyS0) goes to.
    pub fn console_path(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// Where [`Guest::qemu_log`] reads QEMU's output (an [`Guest::external`] guest's QEMU
    /// logs where its starter says, e.g. libvirt's per-domain log).
    pub fn set_qemu_log(&mut self, path: &Path) {
        self.qemu_log = path.to_path_buf();
    }

    /// Waits (at most `timeout` since QEMU started) for `__QS_READY__`; returns the boot time.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Duration> {
        if let Some(t) = self.boot_time {
            return Ok(t);
        }
        let deadline = self.started + timeout;
        let mut fails = Vec::new();
        loop {
            while let Some(line) = self.take_line() {
                if let Some(f) = line.strip_prefix("__QS_FAIL__ ") {
                    fails.push(f.to_string());
                } else if line.starts_with("__QS_READY__") {
                    let t = self.started.elapsed();
                    if !fails.is_empty() {
                        bail!(
                            "{}: guest setup failed: {}\n{}",
                            self.name,
                            fails.join("; "),
                            self.logs()
                        );
                    }
                    self.boot_time = Some(t);
                    return Ok(t);
                }
            }
            if let Err(e) = self.fill(deadline) {
                bail!(
                    "{}: not ready after {:.1?} ({e:#})\n{}",
                    self.name,
                    self.started.elapsed(),
                    self.logs()
                );
            }
        }
    }

    /// Runs `cmd` (a `sh` script: several lines, pipes, quotes are fine) in the guest with
    /// stdin from /dev/null; returns its exit code and its stdout+stderr. Errors when the
    /// channel fails or the command did not finish within `timeout` (the guest then kills
    /// its session). Background processes it starts must redirect their output.
    pub fn run(&mut self, cmd: &str, timeout: Duration) -> Result<(i32, String)> {
        if cmd.len() > 16 * 1024 {
            bail!("{}: command longer than 16 KiB", self.name);
        }
        if self.boot_time.is_none() {
            bail!("{}: run() before the guest is ready", self.name);
        }
        self.seq += 1;
        let seq = self.seq;
        let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        let line = format!(
            "__QS_CMD__ {seq} {} {}\n",
            secs.max(1),
            base64(cmd.as_bytes())
        );
        let t0 = Instant::now();
        self.ctl
            .as_mut()
            .ok_or_else(|| anyhow!("guest is killed"))?
            .write_all(line.as_bytes())
            .with_context(|| format!("{}: write to the control channel", self.name))?;
        let start = format!("__QS_START__ {seq}\n").into_bytes();
        let done = format!("\n__QS_DONE__ {seq} ").into_bytes();
        let deadline = t0 + timeout + RUN_GRACE;
        let mut started = false;
        loop {
            if !started {
                if let Some(i) = find(&self.buf, &start) {
                    self.buf.drain(..i + start.len());
                    started = true;
                }
            }
            if started {
                if let Some(i) = find(&self.buf, &done) {
                    let rest = &self.buf[i + done.len()..];
                    if let Some(nl) = rest.iter().position(|&b| b == b'\n') {
                        let rc: i32 = std::str::from_utf8(&rest[..nl])
                            .ok()
                            .and_then(|s| s.trim().parse().ok())
                            .ok_or_else(|| anyhow!("{}: bad end marker", self.name))?;
                        let out = String::from_utf8_lossy(&self.buf[..i]).into_owned();
                        self.buf.drain(..i + done.len() + nl + 1);
                        if t0.elapsed() >= timeout && (rc == 143 || rc == 137) {
                            bail!(
                                "{}: `{cmd}` timed out after {timeout:?}; output:\n{out}",
                                self.name
                            );
                        }
                        return Ok((rc, out));
                    }
                }
            }
            if let Err(e) = self.fill(deadline) {
                let partial = String::from_utf8_lossy(&self.buf).into_owned();
                bail!(
                    "{}: `{cmd}`: no result within {timeout:?} (+{RUN_GRACE:?}): {e:#}; \
                     output so far:\n{partial}",
                    self.name
                );
            }
        }
    }

    /// Takes over a guest migrated from `src` into this QEMU (started with `-incoming`):
    /// commands continue the source's numbering on this QEMU's control channel.
    pub fn adopt_migrated(&mut self, src: &Guest) {
        self.boot_time = src.boot_time;
        self.seq = src.seq;
    }

    /// [`Guest::run`], failing unless the exit code is 0; returns the output.
    pub fn run_ok(&mut self, cmd: &str, timeout: Duration) -> Result<String> {
        let (rc, out) = self.run(cmd, timeout)?;
        if rc != 0 {
            bail!("{}: `{cmd}` exited with {rc}; output:\n{out}", self.name);
        }
        Ok(out)
    }

    /// Kills QEMU now and reaps it (idempotent); only closes the control channel of an
    /// [`Guest::external`] guest. Later [`Guest::run`] calls fail.
    pub fn kill(&mut self) {
        self.ctl = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            // SIGKILL cannot be ignored; still bound the wait.
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if let Some(p) = self.remove_on_drop.take() {
            let _ = std::fs::remove_file(p);
        }
    }

    /// True while QEMU runs (always false for an [`Guest::external`] guest).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The accelerator in use.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// QEMU's pid (None once killed).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Time from QEMU's start to `__QS_READY__` (None before).
    pub fn boot_time(&self) -> Option<Duration> {
        self.boot_time
    }

    /// The kernel console (ttyS0) so far.
    pub fn console(&self) -> String {
        read_lossy(&self.console_path())
    }

    /// QEMU's own stdout/stderr so far.
    pub fn qemu_log(&self) -> String {
        read_lossy(&self.qemu_log)
    }

    /// The tails of the console and of QEMU's log, for error messages.
    pub fn logs(&self) -> String {
        format!(
            "--- {} console (tail) ---\n{}\n--- {} QEMU log (tail) ---\n{}",
            self.name,
            tail(&self.console(), 40),
            self.name,
            tail(&self.qemu_log(), 20)
        )
    }

    /// Removes and returns the first complete line in the buffer.
    fn take_line(&mut self) -> Option<String> {
        let nl = self.buf.iter().position(|&b| b == b'\n')?;
        let line = String::from_utf8_lossy(&self.buf[..nl])
            .trim_end()
            .to_string();
        self.buf.drain(..=nl);
        Some(line)
    }

    /// Reads what the control channel has (waiting until `deadline` for at least a byte).
    fn fill(&mut self, deadline: Instant) -> Result<()> {
        let now = Instant::now();
        if now >= deadline {
            bail!("timed out");
        }
        let ctl = self
            .ctl
            .as_mut()
            .ok_or_else(|| anyhow!("guest is killed"))?;
        ctl.set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))))?;
        let mut b = [0u8; 16 * 1024];
        match ctl.read(&mut b) {
            Ok(0) => bail!("control channel closed (QEMU exited?)"),
            Ok(n) => {
                self.buf.extend_from_slice(&b[..n]);
                Ok(())
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                bail!("timed out")
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e).context("read the control channel"),
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        self.kill();
        if std::env::var_os("QS_GUEST_KEEP").is_some() {
            eprintln!("{}: kept {}", self.name, self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// QEMU's command line for `cfg`.
fn qemu_args(
    cfg: &GuestConfig,
    accel: Accel,
    kernel: &Path,
    initrd: &Path,
    dir: &Path,
    ctl: &Path,
) -> Vec<String> {
    let kvm = accel == Accel::Kvm;
    let append = cfg.kernel_cmdline();
    let mut a: Vec<String> = vec![
        "-name".into(),
        cfg.name.clone(),
        "-accel".into(),
        if kvm { "kvm" } else { "tcg" }.into(),
    ];
    if kvm {
        a.extend(["-cpu".into(), "host".into()]);
    }
    a.extend(
        [
            "-m",
            &format!("{}M", cfg.mem_mb),
            "-smp",
            &cfg.smp.to_string(),
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            // vhost-user needs guest memory the backend can map.
            "-object",
            &format!("memory-backend-memfd,id=mem,size={}M,share=on", cfg.mem_mb),
            "-numa",
            "node,memdev=mem",
            "-kernel",
            &qemu_path(kernel),
            "-initrd",
            &qemu_path(initrd),
            "-append",
            &append,
            "-serial",
            &format!("file:{}", qemu_escape(&dir.join("console.log"))),
            "-chardev",
            &format!("socket,id=ctl,path={}", qemu_escape(ctl)),
            "-serial",
            "chardev:ctl",
        ]
        .map(String::from),
    );
    let queues = cfg.queues.max(1);
    let mut device = format!("virtio-net-pci,netdev=n0,mac={}", cfg.mac());
    match &cfg.netdev {
        Netdev::VhostUser => {
            let side = match cfg.socket_mode {
                SocketMode::Server => "server=on,wait=off",
                SocketMode::Client => "reconnect=1",
            };
            a.push("-chardev".into());
            a.push(format!(
                "socket,id=vu,path={},{side}",
                qemu_escape(&cfg.vhost_socket)
            ));
            a.push("-netdev".into());
            a.push(format!("vhost-user,id=n0,chardev=vu,queues={queues}"));
            if queues > 1 {
                device.push_str(",mq=on");
            }
        }
        Netdev::User => {
            a.push("-netdev".into());
            a.push("user,id=n0,restrict=on".into());
        }
        Netdev::Custom(s) => {
            a.push("-netdev".into());
            a.push(format!("{s},id=n0"));
        }
    }
    // QEMU 7.2 under TCG crashes with vhost-user and MSI-X: INTx there.
    let vectors = if kvm { 2 * u32::from(queues) + 2 } else { 0 };
    let _ = write!(device, ",vectors={vectors}");
    a.push("-device".into());
    a.push(device);
    a.extend(cfg.qemu_args.iter().cloned());
    a
}

/// The test process that made `arg` when it is a path under one of our guest temp dirs
/// (`.../qswitch-guest-<pid>-<n>-<name>...`).
fn owner_of(arg: &str) -> Option<u32> {
    let rest = &arg[arg.find("qswitch-guest-")? + "qswitch-guest-".len()..];
    let digits = rest.split('-').next()?;
    digits.parse().ok()
}

/// Kills the QEMUs, and removes the temp dirs, that guests of test processes which died
/// without dropping them (SIGKILL) left behind. Only processes whose command line names a
/// guest temp dir of a process that no longer exists are touched.
fn reap_orphans() {
    crate::harness::reap_orphans("qswitch-guest-", owner_of, |args| {
        args.first().is_some_and(|a| a.ends_with(QEMU))
    });
}

/// `p` for a QEMU `key=value` option (commas doubled).
fn qemu_escape(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// `p` as a plain QEMU argument.
fn qemu_path(p: &Path) -> String {
    p.display().to_string()
}

/// The guest kernel and initramfs, building them with `tests/guest/build.sh` when missing or
/// stale (once per test process; build.sh itself serialises concurrent builds on a lock
/// file in the asset dir). None, after printing "skipped: ...", when they cannot be had
/// because a Debian package (QEMU, the kernel, ...) cannot be installed or downloaded, or
/// when not root and the build fails. Panics on any other build failure.
pub fn assets() -> Option<(PathBuf, PathBuf)> {
    static ASSETS: OnceLock<Option<(PathBuf, PathBuf)>> = OnceLock::new();
    let a = ASSETS.get_or_init(build_assets).clone();
    if a.is_none() {
        skip("no guest assets (QEMU or the guest packages unavailable)");
    }
    a
}

fn build_assets() -> Option<(PathBuf, PathBuf)> {
    let dir = std::env::var_os("QS_GUEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ASSET_DIR));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/guest/build.sh");
    let log_path =
        std::env::temp_dir().join(format!("qswitch-guest-build-{}.log", std::process::id()));
    let t0 = Instant::now();
    let status = (|| -> Result<Option<i32>> {
        let log = std::fs::File::create(&log_path)?;
        let mut child = Command::new("bash")
            .arg(&script)
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {}", script.display()))?;
        let deadline = Instant::now() + BUILD_TIMEOUT;
        loop {
            if let Some(st) = child.try_wait()? {
                return Ok(st.code());
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("{} took over {BUILD_TIMEOUT:?}", script.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })();
    let log = read_lossy(&log_path);
    let _ = std::fs::remove_file(&log_path);
    eprint!("{log}");
    let code = match status {
        Ok(c) => c,
        Err(e) => panic!("guest asset build failed: {e:#}\n{log}"),
    };
    match code {
        Some(0) => {
            let kernel = dir.join("vmlinux");
            let initrd = dir.join("initramfs.cpio.gz");
            assert!(
                kernel.is_file() && initrd.is_file(),
                "build.sh succeeded but {} or {} is missing",
                kernel.display(),
                initrd.display()
            );
            eprintln!(
                "guest assets ready in {:.1?}: {} {}",
                t0.elapsed(),
                kernel.display(),
                initrd.display()
            );
            Some((kernel, initrd))
        }
        Some(77) => {
            eprintln!("guest assets: a Debian package could not be installed or downloaded");
            None
        }
        c if !is_root() => {
            eprintln!("guest assets: build.sh failed ({c:?}) and not root");
            None
        }
        c => panic!("guest asset build failed (exit {c:?}):\n{log}"),
    }
}

fn read_lossy(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Standard base64 with padding.
fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(T[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
