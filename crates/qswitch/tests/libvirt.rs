//! libvirt guests on qswitch (root only; issue #16): Debian's libvirt and QEMU, driven
//! through `virsh`, attach guests defined with `<interface type='vhostuser'>` to qswitch's
//! vhost-user ports, in both socket modes and with two queue pairs.
//!
//! One test, `two_domains_both_socket_modes_multiqueue`:
//! - qswitch runs with two vhost-user ports offering 2 queue pairs: `vma` in mode server (the
//!   domain's interface has `mode='client'`) and `vmb` in mode client (`mode='server'`: QEMU
//!   listens).
//! - A libvirtd of the test's own (below) gets two TCG domains, the test guests of
//!   `qswitch_test_support::guest` (Debian kernel + busybox initramfs, direct kernel boot,
//!   256 MiB of shared memfd memory, `<driver queues='2'/>`): `virsh define` + `virsh start`.
//! - Both ports show connected with pair 0 enabled; each guest enables its second pair
//!   (`ethtool -L eth0 combined 2`) and `qswitch port list --json` shows pairs [0, 1]; the
//!   guests ping each other through qswitch both ways (5 echoes each, all answered).
//! - `virsh destroy` + `virsh undefine` of both: their QEMUs are gone, `virsh list --all` is
//!   empty, both ports show disconnected with no pair enabled, and qswitch still answers.
//!
//! Traffic stays between the two guests and qswitch: no host interface, no libvirt network
//! (the private config below defines none, so libvirt's `default` network never starts).
//!
//! # The libvirtd, and what was chosen
//! - **A private libvirtd** (`/usr/sbin/libvirtd`, started by hand: test machines have no
//!   systemd as PID 1; Debian 12 has no split `virtqemud`). It runs in a mount namespace of
//!   its own (`unshare --mount`) where `/etc/libvirt`, `/run/libvirt`, `/var/lib/libvirt`,
//!   `/var/cache/libvirt` and `/var/log/libvirt` are bind mounts of directories in the test's
//!   temp dir, and it listens in that temp dir (`unix_sock_dir`; the test uses
//!   `virsh -c 'qemu:///system?socket=...'`). So the host's libvirt configuration and state are
//!   not touched (no domain definitions, no networks autostarted, no capability cache), and a
//!   system libvirtd, if one runs, is not in the way. The only trace on the host is the empty
//!   mount points `mkdir -p` creates when missing. The daemon is stopped (SIGTERM, then
//!   SIGKILL) on drop, after `virsh destroy` + `undefine` of whatever domain is still there;
//!   a libvirtd left by a test process that was SIGKILLed is killed by the next run
//!   (the first `TempDir` of a test process reaps, see `qswitch_test_support::reap_orphans`).
//! - **QEMU runs as libvirt's default user, `libvirt-qemu`**, not root, so that the test checks
//!   the permissions docs/libvirt.md describes: qswitch's server socket is 0660 in group
//!   `libvirt-qemu` (`[switch] vhost_group`), QEMU's own server socket is in a directory owned
//!   by `libvirt-qemu`, and the guests' control sockets are chowned to it.
//! - **`dynamic_ownership = 0`**: libvirt would otherwise chown the guest kernel and initramfs
//!   (world-readable, and shared with the other guest tests) to `libvirt-qemu` while a domain
//!   runs. **`security_driver = "none"`**: whether AppArmor confines QEMU depends on the
//!   machine, not on qswitch (docs/libvirt.md gives the AppArmor rule). **`namespaces = []`,
//!   `cgroup_controllers = []`**: no private /dev and no cgroups for QEMU (test machines are
//!   often containers). **`stdio_handler = "file"`**: QEMU's log without virtlogd.
//! - **`<domain type='qemu'>` (TCG)**: where /dev/kvm exists here it is a software hypervisor
//!   under which stock kernels do not boot. QEMU 7.2 under TCG segfaults when a vhost-user
//!   virtio-net device uses MSI-X (in `msix_set_vector_notifiers`, from `vhost_net_start`),
//!   and libvirt gives a multi-queue NIC `vectors=2N+2`: a `<qemu:override>` sets the device's
//!   `vectors` to 0 (INTx), as `guest.rs` does for its own TCG guests. Under KVM it is not
//!   needed.
//!
//! The libvirt packages (`libvirt-daemon-system`, `libvirt-clients`,
//! `libvirt-daemon-driver-qemu`) are installed with apt when missing (`.ci/run` installs them
//! too); the test skips (fails with `QSWITCH_REQUIRE_PRIVILEGED=1`) when that is impossible.

mod common;
use qswitch_test_support::guest;

use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use common::{request, run_timeout, worker_cpus, ChildGuard, DaemonChild, TempDir};
use guest::{Accel, Guest, GuestConfig};
use serde_json::Value;

/// Queue pairs the ports offer and the domains' interfaces ask for.
const QUEUES: u16 = 2;
/// Guest memory.
const MEM_MIB: u32 = 256;
/// Bound on a guest boot (from `virsh start` to the guest's ready line; TCG).
const BOOT: Duration = Duration::from_secs(90);
/// Bound on a short guest command.
const T: Duration = Duration::from_secs(20);
/// Bound on one `virsh` command.
const VIRSH_T: Duration = Duration::from_secs(60);
/// Bound on libvirtd answering after its start (it probes QEMU's capabilities first: an
/// empty cache in the private dirs, a few seconds).
const LIBVIRTD_UP: Duration = Duration::from_secs(120);
/// Bound on apt-get installing the libvirt packages.
const APT_T: Duration = Duration::from_secs(600);

const LIBVIRTD: &str = "/usr/sbin/libvirtd";
/// The Debian packages the test needs (QEMU itself comes with the guest assets).
const PACKAGES: [&str; 3] = [
    "libvirt-daemon-system",
    "libvirt-clients",
    "libvirt-daemon-driver-qemu",
];
/// The user libvirt runs QEMU as (Debian's default, created by libvirt-daemon-system).
const QEMU_USER: &str = "libvirt-qemu";

/// The host directories the private libvirtd sees as its own (bind mounts of `<dir>/<key>`).
const PRIVATE_DIRS: [(&str, &str); 5] = [
    ("etc", "/etc/libvirt"),
    ("run", "/run/libvirt"),
    ("lib", "/var/lib/libvirt"),
    ("cache", "/var/cache/libvirt"),
    ("log", "/var/log/libvirt"),
];

/// The tag of the test's temp dir (`/tmp/qswitch-it-<pid>-libvirt`).
const TAG: &str = "libvirt";

// ---------------------------------------------------------------------------------------
// Bounded commands that never panic (also usable in Drop).

/// Runs `cmd` (stdin closed, stdout and stderr to files in `dir`), killing it after
/// `timeout`. Errors when it cannot start or does not finish in time.
fn run_bounded(cmd: &mut Command, dir: &Path, timeout: Duration) -> Result<(ExitStatus, String)> {
    let desc = format!("{cmd:?}");
    let path = dir.join(format!(
        "cmd-{}.out",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    let out = File::create(&path).with_context(|| format!("create {}", path.display()))?;
    let child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .with_context(|| format!("start {desc}"))?;
    let mut guard = ChildGuard::new(child);
    let status = guard.wait_timeout(timeout);
    drop(guard); // kills it if still running
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let _ = std::fs::remove_file(&path);
    match status {
        Some(st) => Ok((st, text)),
        None => bail!("{desc} did not finish within {timeout:?}; output:\n{text}"),
    }
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn read_lossy(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

/// True while process `pid` exists and is not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.rsplit_once(')')?.1.split_whitespace().next()?.to_string();
            Some(state != "Z")
        })
        .unwrap_or(false)
}

/// Text for an XML attribute or element.
fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('\'', "&apos;")
        .replace('"', "&quot;")
}

// ---------------------------------------------------------------------------------------
// Packages, the QEMU user.

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.stdout == b"install ok installed")
}

fn libvirt_ready() -> bool {
    PACKAGES.iter().all(|p| installed(p))
        && Path::new(LIBVIRTD).is_file()
        && common::have_tool("virsh", &["--version"])
        && user_ids(QEMU_USER).is_some()
}

/// Installs the libvirt packages when missing (no recommends: no default network, dnsmasq,
/// firewall tools). Their postinst starts libvirtd only under systemd. False, after a skip
/// notice, when that fails.
fn libvirt_or_skip() -> bool {
    if libvirt_ready() {
        return true;
    }
    let install = || {
        run_timeout(
            Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends"])
                .args(["-o", "DPkg::Lock::Timeout=300"])
                .args(PACKAGES)
                .env("DEBIAN_FRONTEND", "noninteractive"),
            APT_T,
        )
    };
    eprintln!("installing {}", PACKAGES.join(" "));
    let mut out = install();
    if !out.ok() {
        let _ = run_timeout(
            Command::new("apt-get")
                .args(["update", "-qq", "-o", "DPkg::Lock::Timeout=300"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            APT_T,
        );
        out = install();
    }
    if !out.ok() || !libvirt_ready() {
        common::skip(&format!(
            "libvirt unavailable: apt-get install {} failed: {}",
            PACKAGES.join(" "),
            tail(&format!("{}{}", out.stdout, out.stderr), 10)
        ));
        return false;
    }
    true
}

/// The uid and gid of `user`, from the passwd database.
fn user_ids(user: &str) -> Option<(u32, u32)> {
    let out = Command::new("getent")
        .args(["passwd", user])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    let f: Vec<&str> = line.trim().split(':').collect();
    Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?))
}

// ---------------------------------------------------------------------------------------
// The private libvirtd.

/// A libvirtd of the test's own in a private mount namespace (see the module doc). Drop
/// destroys and undefines the domains still listed in `domains`, kills their QEMUs if they
/// are still there, and stops the daemon.
struct Libvirtd {
    child: ChildGuard,
    /// The root of the private dirs (`etc`, `run`, `lib`, `cache`, `log`, `sock`).
    dir: PathBuf,
    uri: String,
    /// Domains defined by the test and not undefined yet.
    domains: Vec<String>,
}

/// `libvirtd.conf`: listen in `dir/sock` only, no authentication (the sockets are root's,
/// 0700), warnings and errors to `dir/libvirtd.log`.
fn libvirtd_conf(dir: &Path) -> String {
    format!(
        "unix_sock_dir = \"{}\"\n\
         unix_sock_rw_perms = \"0700\"\n\
         auth_unix_ro = \"none\"\n\
         auth_unix_rw = \"none\"\n\
         log_outputs = \"3:file:{}\"\n",
        dir.join("sock").display(),
        dir.join("libvirtd.log").display()
    )
}

/// `qemu.conf` (the reasons are in the module doc; QEMU runs as libvirt's default user).
const QEMU_CONF: &str = "\
dynamic_ownership = 0
remember_owner = 0
security_driver = \"none\"
namespaces = [ ]
cgroup_controllers = [ ]
stdio_handler = \"file\"
";

/// Run by `unshare --mount` with the private root as `$1`: the bind mounts, then libvirtd.
const START_SCRIPT: &str = r#"
d=$1; shift
while [ $# -gt 0 ]; do
    mkdir -p "$d/$1" "$2"
    mount --bind "$d/$1" "$2"
    shift 2
done
exec /usr/sbin/libvirtd --pid-file "$d/libvirtd.pid"
"#;

impl Libvirtd {
    /// Starts libvirtd with its private dirs under `dir` and waits until `virsh` gets an
    /// answer from it.
    fn start(dir: &Path) -> Result<Libvirtd> {
        for (key, _) in PRIVATE_DIRS {
            std::fs::create_dir_all(dir.join(key))?;
        }
        std::fs::create_dir_all(dir.join("sock"))?;
        std::fs::write(dir.join("etc/libvirtd.conf"), libvirtd_conf(dir))?;
        std::fs::write(dir.join("etc/qemu.conf"), QEMU_CONF)?;
        let out = File::create(dir.join("libvirtd.out"))?;
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-ec",
            START_SCRIPT,
        ])
        .arg("sh")
        .arg(dir);
        for (key, host) in PRIVATE_DIRS {
            cmd.args([key, host]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start unshare ... libvirtd")?;
        let mut lv = Libvirtd {
            child: ChildGuard::new(child),
            dir: dir.to_path_buf(),
            uri: format!(
                "qemu:///system?socket={}",
                dir.join("sock/libvirt-sock").display()
            ),
            domains: Vec::new(),
        };
        let t0 = Instant::now();
        let deadline = t0 + LIBVIRTD_UP;
        loop {
            if let Some(st) = lv.child.try_wait() {
                bail!("libvirtd exited during start-up ({st}){}", lv.evidence());
            }
            if lv.dir.join("sock/libvirt-sock").exists() {
                // It answers once it probed QEMU; bounded by what is left of LIBVIRTD_UP.
                let left = deadline.saturating_duration_since(Instant::now());
                let (st, out) = lv.virsh_raw(&["version"], left.max(Duration::from_secs(1)))?;
                if st.success() {
                    eprintln!(
                        "libvirtd {} up in {:.1?}: {}",
                        lv.child.pid(),
                        t0.elapsed(),
                        out.lines()
                            .filter(|l| !l.trim().is_empty())
                            .collect::<Vec<_>>()
                            .join("; ")
                    );
                    return Ok(lv);
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "libvirtd did not answer within {LIBVIRTD_UP:?}{}",
                    lv.evidence()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `virsh -c URI args...`, bounded: its exit status and output.
    fn virsh_raw(&self, args: &[&str], timeout: Duration) -> Result<(ExitStatus, String)> {
        run_bounded(
            Command::new("virsh")
                .args(["-q", "-c", &self.uri])
                .args(args),
            &self.dir,
            timeout,
        )
    }

    /// `virsh -c URI args...`, failing unless it succeeds; returns its output.
    fn virsh(&self, args: &[&str]) -> Result<String> {
        let (st, out) = self.virsh_raw(args, VIRSH_T)?;
        ensure!(
            st.success(),
            "virsh {} failed ({st}):\n{out}",
            args.join(" ")
        );
        Ok(out)
    }

    fn define(&mut self, xml_file: &Path, name: &str) -> Result<()> {
        self.virsh(&["define", &xml_file.display().to_string()])?;
        self.domains.push(name.to_string());
        Ok(())
    }

    fn undefine(&mut self, name: &str) -> Result<()> {
        self.virsh(&["undefine", name])?;
        self.domains.retain(|d| d != name);
        Ok(())
    }

    /// libvirt's log of domain `name` (its QEMU command line and stderr).
    fn qemu_log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("log/qemu/{name}.log"))
    }

    /// The pid of domain `name`'s QEMU while it runs (libvirt's pid file).
    fn qemu_pid(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir.join(format!("run/qemu/{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// What libvirtd said, for failure messages.
    fn evidence(&self) -> String {
        format!(
            "\n--- libvirtd output ---\n{}\n--- libvirtd log (tail) ---\n{}",
            tail(&read_lossy(&self.dir.join("libvirtd.out")), 20),
            tail(&read_lossy(&self.dir.join("libvirtd.log")), 30)
        )
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        for name in std::mem::take(&mut self.domains) {
            let pid = self.qemu_pid(&name);
            let _ = self.virsh_raw(&["destroy", &name], VIRSH_T);
            let _ = self.virsh_raw(&["undefine", &name], VIRSH_T);
            if let Some(pid) = pid.filter(|&p| alive(p)) {
                eprintln!("killing QEMU {pid} of domain {name}");
                common::signal(pid, "KILL");
            }
        }
        self.child.stop();
    }
}

// ---------------------------------------------------------------------------------------
// The domains.

/// qswitch's side of a vhost-user socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QsMode {
    /// qswitch listens; the domain's interface has `mode='client'`.
    Server,
    /// QEMU listens (`mode='server'`); qswitch connects.
    Client,
}

/// One guest: its qswitch port, socket and addresses.
struct Spec {
    /// Domain name and guest hostname.
    name: &'static str,
    port: &'static str,
    mode: QsMode,
    mac: &'static str,
    ip: &'static str,
}

const SPECS: [Spec; 2] = [
    Spec {
        name: "qslv-a",
        port: "vma",
        mode: QsMode::Server,
        mac: "52:54:00:1b:0e:01",
        ip: "10.202.0.1",
    },
    Spec {
        name: "qslv-b",
        port: "vmb",
        mode: QsMode::Client,
        mac: "52:54:00:1b:0e:02",
        ip: "10.202.0.2",
    },
];

/// The domain definition of a test guest: TCG, shared memfd memory, direct kernel boot of
/// the guest assets, a vhost-user interface with [`QUEUES`] pairs on `socket`, ttyS0 to the
/// guest's console file and ttyS1 to its control socket (docs/libvirt.md shows this XML).
fn domain_xml(spec: &Spec, cfg: &GuestConfig, g: &Guest, socket: &Path) -> Result<String> {
    let (kernel, initrd) = guest::assets().ok_or_else(|| anyhow!("no guest assets"))?;
    let p = |p: &Path| xml(&p.display().to_string());
    let source = match spec.mode {
        QsMode::Server => format!(
            "<source type='unix' path='{}' mode='client'>\n        \
             <reconnect enabled='yes' timeout='1'/>\n      </source>",
            p(socket)
        ),
        QsMode::Client => format!("<source type='unix' path='{}' mode='server'/>", p(socket)),
    };
    Ok(format!(
        "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>{name}</name>
  <memory unit='MiB'>{MEM_MIB}</memory>
  <vcpu>1</vcpu>
  <memoryBacking>
    <source type='memfd'/>
    <access mode='shared'/>
  </memoryBacking>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>{cmdline}</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <interface type='vhostuser'>
      <mac address='{mac}'/>
      {source}
      <model type='virtio'/>
      <driver queues='{QUEUES}'/>
      <alias name='ua-net0'/>
    </interface>
    <serial type='file'>
      <source path='{console}'/>
      <target port='0'/>
    </serial>
    <serial type='unix'>
      <source mode='connect' path='{control}'/>
      <target port='1'/>
    </serial>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
  <qemu:override>
    <qemu:device alias='ua-net0'>
      <qemu:frontend>
        <qemu:property name='vectors' type='unsigned' value='0'/>
      </qemu:frontend>
    </qemu:device>
  </qemu:override>
</domain>
",
        name = xml(spec.name),
        kernel = p(&kernel),
        initrd = p(&initrd),
        cmdline = xml(&cfg.kernel_cmdline()),
        mac = xml(spec.mac),
        console = p(&g.console_path()),
        control = p(&g.control_socket()),
    ))
}

// ---------------------------------------------------------------------------------------
// The lab.

/// qswitch, the libvirtd and the guests. Drops the guests' control channels first, then the
/// libvirtd (with whatever domain is left), then qswitch and the temp dir.
struct Lab {
    guests: Vec<Guest>,
    libvirt: Libvirtd,
    daemon: DaemonChild,
    control: PathBuf,
    dir: TempDir,
    /// uid and gid of the QEMU user.
    qemu_ids: (u32, u32),
}

impl Lab {
    fn new() -> Result<Lab> {
        let (uid, gid) = user_ids(QEMU_USER).ok_or_else(|| anyhow!("no user {QEMU_USER}"))?;
        let dir = TempDir::new(TAG);
        // QEMU (as libvirt-qemu) must reach the sockets in here.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        // QEMU creates its own server socket: a directory it can write.
        let qemu_dir = dir.join("qemu");
        std::fs::create_dir(&qemu_dir)?;
        std::os::unix::fs::chown(&qemu_dir, Some(uid), Some(gid))?;
        std::fs::set_permissions(&qemu_dir, std::fs::Permissions::from_mode(0o750))?;

        let control = dir.join("control.sock");
        let mut text = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nvhost_group = \"{QEMU_USER}\"\n",
            worker_cpus(usize::MAX),
            control.display()
        );
        for s in &SPECS {
            let mode = match s.mode {
                QsMode::Server => "server",
                QsMode::Client => "client",
            };
            let _ = write!(
                text,
                "[[port]]\nname = \"{}\"\ntype = \"vhost-user\"\nsocket = \"{}\"\n\
                 mode = \"{mode}\"\nqueues = {QUEUES}\n",
                s.port,
                socket_path(&dir, s).display(),
            );
        }
        let config = dir.join("qswitch.toml");
        std::fs::write(&config, &text)?;
        let mut daemon = DaemonChild::spawn_logging(
            &config,
            &control,
            &dir.join("qswitch.log"),
            "info,qswitch_dp::port::vhost_user=debug",
        );
        daemon.wait_ready();

        let libvirt = Libvirtd::start(&dir.join("libvirt"))?;
        Ok(Lab {
            guests: Vec::new(),
            libvirt,
            daemon,
            control,
            dir,
            qemu_ids: (uid, gid),
        })
    }

    /// Defines and starts the two domains and waits until both guests are up.
    fn start_domains(&mut self) -> Result<()> {
        let (uid, gid) = self.qemu_ids;
        let t0 = Instant::now();
        for s in &SPECS {
            let cfg = GuestConfig {
                name: s.name.into(),
                mac: s.mac.into(),
                ip_cidr: format!("{}/24", s.ip),
                accel: Accel::Tcg,
                // No `qs.queues`: the guest starts with one pair enabled, as Linux does on
                // one vCPU; the test enables the second.
                queues: 1,
                ..GuestConfig::default()
            };
            let mut g = Guest::external(&cfg)?;
            g.set_qemu_log(&self.libvirt.qemu_log(s.name));
            let ctl = g.control_socket();
            if let Some(parent) = ctl.parent() {
                std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755))?;
            }
            std::os::unix::fs::chown(&ctl, Some(uid), Some(gid))?;
            let xml = domain_xml(s, &cfg, &g, &socket_path(&self.dir, s))?;
            let file = self.dir.join(&format!("{}.xml", s.name));
            std::fs::write(&file, xml)?;
            self.libvirt.define(&file, s.name)?;
            self.libvirt
                .virsh(&["start", s.name])
                .with_context(|| format!("qswitch log:\n{}", tail(&self.daemon.log_text(), 20)))?;
            // libvirt returns once QEMU runs, and QEMU dialled the control socket before.
            g.accept(Duration::from_secs(20))?;
            self.guests.push(g);
        }
        let mut boot = Vec::new();
        for g in &mut self.guests {
            let t = g.wait_ready(BOOT)?;
            boot.push(format!("{} {t:.1?}", g.name()));
        }
        eprintln!(
            "2 domains defined, started and booted in {:.1?} ({})",
            t0.elapsed(),
            boot.join(", ")
        );
        Ok(())
    }

    /// `qswitch port list --json`, the vhost-user ports.
    fn ports(&self) -> Result<Vec<Value>> {
        let out = common::qs(&self.control, &["port", "list", "--json"]);
        ensure!(out.ok(), "qswitch port list --json: {out:?}");
        let v: Value = serde_json::from_str(&out.stdout).context("port list JSON")?;
        Ok(v.as_array()
            .ok_or_else(|| anyhow!("port list is not an array: {v}"))?
            .iter()
            .filter(|p| p["type"] == "vhost-user")
            .cloned()
            .collect())
    }

    /// Waits until `pred` holds for both vhost-user ports; returns them.
    fn wait_ports(&self, timeout: Duration, pred: impl Fn(&Value) -> bool) -> Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        loop {
            let ports = self.ports()?;
            if ports.len() == SPECS.len() && ports.iter().all(&pred) {
                return Ok(ports);
            }
            if Instant::now() >= deadline {
                bail!(
                    "vhost-user ports not as expected within {timeout:?}: {}",
                    serde_json::to_string_pretty(&ports).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// What qswitch, libvirt and the guests say, for failure messages.
    fn evidence(&mut self) -> String {
        let mut s = String::from("\n===== evidence =====\n");
        match request(&self.control, b"{\"request\":\"port-list\"}\n") {
            Ok(v) => {
                let _ = writeln!(
                    s,
                    "--- qswitch port list ---\n{}",
                    serde_json::to_string_pretty(&v).unwrap_or_default()
                );
            }
            Err(e) => {
                let _ = writeln!(s, "--- qswitch port list: {e}");
            }
        }
        let _ = writeln!(
            s,
            "--- qswitch log (tail) ---\n{}",
            tail(&self.daemon.log_text(), 40)
        );
        let _ = match self.libvirt.virsh_raw(&["list", "--all"], VIRSH_T) {
            Ok((_, out)) => writeln!(s, "--- virsh list --all ---\n{out}"),
            Err(e) => writeln!(s, "--- virsh list --all: {e:#}"),
        };
        s.push_str(&self.libvirt.evidence());
        for g in &mut self.guests {
            let name = g.name().to_string();
            let cmd = "ethtool -l eth0 | tail -n 5; ethtool -S eth0; ip neigh";
            let _ = match g.run(cmd, Duration::from_secs(10)) {
                Ok((_, out)) => writeln!(s, "\n--- guest {name}: eth0 ---\n{out}"),
                Err(e) => writeln!(s, "\n--- guest {name}: {e:#}"),
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

/// Where port `s`'s socket is: qswitch's in the temp dir, QEMU's in the `qemu` dir it owns.
fn socket_path(dir: &TempDir, s: &Spec) -> PathBuf {
    match s.mode {
        QsMode::Server => dir.join(&format!("{}.sock", s.port)),
        QsMode::Client => dir.join(&format!("qemu/{}.sock", s.port)),
    }
}

/// `enabled_queues` of a port.
fn enabled(p: &Value) -> Vec<u64> {
    p["enabled_queues"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// Ping from `g` to `ip`: first until one echo is answered (ARP, link coming up), then 5
/// echoes that must all be answered (one retry, reported, absorbs a reply lost to a busy
/// machine).
fn ping(g: &mut Guest, ip: &str) -> Result<String> {
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
        out.contains(" 5 packets received") && out.contains(" 0% packet loss"),
        "{}: ping {ip}:\n{out}",
        g.name()
    );
    Ok(out
        .lines()
        .find(|l| l.contains("min/avg/max"))
        .unwrap_or("")
        .to_string())
}

// ---------------------------------------------------------------------------------------

#[test]
fn two_domains_both_socket_modes_multiqueue() {
    if !common::root_or_skip() || guest::assets().is_none() || !libvirt_or_skip() {
        return;
    }
    let t0 = Instant::now();
    let mut lab = Lab::new().unwrap_or_else(|e| panic!("{e:#}"));
    let r = lab.start_domains();
    lab.check(r);
    let r = attached(&mut lab);
    lab.check(r);
    let r = destroyed(&mut lab);
    lab.check(r);
    drop(lab);
    eprintln!("done in {:.1?}", t0.elapsed());
}

/// Both domains attached: ports connected, the second pair enabled by the guests, ping.
fn attached(lab: &mut Lab) -> Result<()> {
    let ports = lab.wait_ports(Duration::from_secs(20), |p| {
        p["connected"] == true && enabled(p) == [0]
    })?;
    for (p, s) in ports.iter().zip(&SPECS) {
        ensure!(p["name"] == s.port, "port order: {p}");
        let mode = match s.mode {
            QsMode::Server => "server",
            QsMode::Client => "client",
        };
        ensure!(p["mode"] == mode, "{}: mode: {p}", s.port);
        ensure!(
            p["queues"].as_array().map(Vec::len) == Some(usize::from(QUEUES)),
            "{}: queues: {p}",
            s.port
        );
        ensure!(
            p["offloads"]
                .as_array()
                .is_some_and(|o| o.iter().any(|f| f == "mq")),
            "{}: multi-queue (mq) not negotiated: {p}",
            s.port
        );
    }

    for g in &mut lab.guests {
        g.run_ok(&format!("ethtool -L eth0 combined {QUEUES}"), T)?;
        let out = g.run_ok("ethtool -l eth0", T)?;
        let current = out.split("Current hardware settings:").nth(1).unwrap_or("");
        ensure!(
            current.lines().any(|l| {
                l.starts_with("Combined:") && l.trim_end().ends_with(&QUEUES.to_string())
            }),
            "{}: ethtool -l after -L combined {QUEUES}:\n{out}",
            g.name()
        );
    }
    let ports = lab.wait_ports(Duration::from_secs(10), |p| {
        p["connected"] == true && enabled(p) == [0, 1]
    })?;
    for p in &ports {
        eprintln!(
            "{}: {} mode, connected, enabled queue pairs {:?}",
            p["name"].as_str().unwrap_or("?"),
            p["mode"].as_str().unwrap_or("?"),
            enabled(p)
        );
    }

    let (ip_a, ip_b) = (SPECS[0].ip, SPECS[1].ip);
    let ab = ping(&mut lab.guests[0], ip_b)?;
    let ba = ping(&mut lab.guests[1], ip_a)?;
    eprintln!("ping a -> b: {ab}\nping b -> a: {ba}");
    Ok(())
}

/// `virsh destroy` + `undefine`: QEMUs gone, ports disconnected, qswitch still up.
fn destroyed(lab: &mut Lab) -> Result<()> {
    for s in &SPECS {
        let pid = lab
            .libvirt
            .qemu_pid(s.name)
            .ok_or_else(|| anyhow!("{}: no QEMU pid file", s.name))?;
        ensure!(alive(pid), "{}: QEMU {pid} not running", s.name);
        lab.libvirt.virsh(&["destroy", s.name])?;
        lab.libvirt.undefine(s.name)?;
        // destroy returns once QEMU is gone; bounded anyway.
        ensure!(
            common::wait_until(Duration::from_secs(10), || !alive(pid)),
            "{}: QEMU {pid} still running after virsh destroy",
            s.name
        );
    }
    let left = lab.libvirt.virsh(&["list", "--all", "--name"])?;
    ensure!(left.trim().is_empty(), "domains left: {left}");
    lab.wait_ports(Duration::from_secs(10), |p| {
        p["connected"] == false && enabled(p).is_empty()
    })?;
    ensure!(lab.daemon.running(), "qswitch exited");
    let v = request(&lab.control, b"{\"request\":\"ping\"}\n")?;
    ensure!(v["response"] == "pong", "qswitch ping: {v}");
    // The guests' control channels are closed: QEMU is gone.
    lab.guests.clear();
    eprintln!("both domains destroyed and undefined; ports disconnected; qswitch up");
    Ok(())
}
