//! The systemd unit (packaging/qswitch.service): `systemd-analyze verify` accepts it, and the
//! daemon started the way the unit starts it (its ExecStart, as a non-root user with only the
//! unit's capabilities, `$NOTIFY_SOCKET` pointing at a datagram socket this test listens on)
//! sends READY=1 once its ports are up, serves a `control_group` member, and says STOPPING=1.
//!
//! PID 1 here is not systemd, so the sandboxing options (ProtectSystem=, DeviceAllow=, ...) are
//! verified but not enforced; the user, groups and capabilities are (setpriv).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    have_tool, link_exists, port_names, require, root_or_skip, run_timeout, worker_cpus,
    ChildGuard, TempDir, QSWITCH,
};

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/qswitch.service")
}

fn unit() -> String {
    std::fs::read_to_string(unit_path()).expect("packaging/qswitch.service")
}

/// The value of `key=` in the unit (the last one).
fn unit_value(key: &str) -> String {
    unit()
        .lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .next_back()
        .unwrap_or_else(|| panic!("no {key}= in the unit"))
        .to_string()
}

#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    if !require(
        have_tool("systemd-analyze", &["--version"]),
        "systemd-analyze is not installed (apt-get install systemd)",
    ) {
        return;
    }
    // verify checks that ExecStart's binary exists: point it at the one under test.
    let dir = TempDir::new("sd-verify");
    let copy = dir.join("qswitch.service");
    let bin = std::fs::canonicalize(QSWITCH).unwrap();
    std::fs::write(
        &copy,
        unit().replace("/usr/bin/qswitch", &bin.display().to_string()),
    )
    .unwrap();
    let out = run_timeout(
        Command::new("systemd-analyze").arg("verify").arg(&copy),
        Duration::from_secs(30),
    );
    assert!(
        out.ok() && out.stderr.trim().is_empty(),
        "systemd-analyze verify: {}{}",
        out.stdout,
        out.stderr
    );
    for want in [
        "Type=notify",
        "Restart=on-failure",
        "RuntimeDirectory=qswitch",
        "StateDirectory=qswitch",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
    ] {
        assert!(unit().lines().any(|l| l == want), "{want} missing");
    }
}

fn cap_bit(name: &str) -> u32 {
    match name {
        "CAP_NET_ADMIN" => 12,
        "CAP_NET_RAW" => 13,
        "CAP_IPC_LOCK" => 14,
        "CAP_SYS_ADMIN" => 21,
        "CAP_SYS_NICE" => 23,
        "CAP_BPF" => 39,
        other => panic!("the test does not know {other}"),
    }
}

fn status_field(pid: u32, field: &str) -> String {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn started_like_the_unit_it_notifies_ready_with_ports_up_and_shares_the_socket() {
    if !root_or_skip() || !require(have_tool("setpriv", &["--version"]), "no setpriv") {
        return;
    }
    let dir = TempDir::new("sd-run");
    // The daemon runs as nobody: its directories are nobody's (as systemd makes
    // RuntimeDirectory= and StateDirectory= the service user's).
    let nobody = 65534;
    let run = dir.join("run");
    let state = dir.join("state");
    for d in [&run, &state] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(nobody), Some(nobody)).unwrap();
    }
    let bin = dir.join("qswitch");
    std::fs::copy(QSWITCH, &bin).unwrap();
    let control = run.join("control.sock");
    let vhost = run.join("vm1.sock");
    let tap = format!("qsd{}", std::process::id() % 100_000);
    let config = dir.join("qswitch.toml");
    std::fs::write(
        &config,
        format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\ncontrol_group = \"adm\"\n\
             [[port]]\nname = \"tap1\"\ntype = \"tap\"\nifname = \"{tap}\"\n\
             [[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n",
            worker_cpus(1),
            control.display(),
            state.display(),
            vhost.display()
        ),
    )
    .unwrap();
    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    std::fs::set_permissions(&notify_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();

    // ExecStart with this test's binary and config, under the unit's user and capabilities.
    let exec = unit_value("ExecStart")
        .replace("/usr/bin/qswitch", &bin.display().to_string())
        .replace("/etc/qswitch/qswitch.toml", &config.display().to_string());
    let caps: Vec<String> = unit_value("AmbientCapabilities")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        unit_value("CapabilityBoundingSet")
            .split_whitespace()
            .collect::<Vec<_>>(),
        caps
    );
    let setpriv_caps = format!(
        "-all,{}",
        caps.iter()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect::<Vec<_>>()
            .join(",")
    );
    let log = dir.join("daemon.log");
    let child = Command::new("setpriv")
        .args([
            "--reuid=nobody",
            "--regid=nogroup",
            "--groups=adm",
            &format!("--inh-caps={setpriv_caps}"),
            &format!("--ambient-caps={setpriv_caps}"),
            &format!("--bounding-set={setpriv_caps}"),
            "--no-new-privs",
            "--",
        ])
        .args(exec.split_whitespace())
        .env("NOTIFY_SOCKET", &notify_path)
        .env("QSWITCH_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("setpriv");
    let mut child = ChildGuard::new(child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    let mut buf = [0u8; 256];
    let n = notify
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no READY=1 ({e}): {}", log_text()));
    assert_eq!(&buf[..n], b"READY=1", "{}", log_text());
    // At READY=1 the ports are up: the TAP exists, the vhost-user socket listens.
    assert!(link_exists(&tap), "{}", log_text());
    assert!(vhost.exists(), "{}", log_text());
    let mut names = port_names(&control);
    names.sort();
    assert_eq!(names, ["tap1", "vm1"]);

    // The process: nobody, with exactly the unit's capabilities.
    let pid = child.pid();
    assert!(status_field(pid, "Uid").starts_with("65534"));
    let want: u64 = caps.iter().map(|c| 1u64 << cap_bit(c)).sum();
    let eff = u64::from_str_radix(&status_field(pid, "CapEff"), 16).unwrap();
    assert_eq!(eff, want, "CapEff {eff:x}, the unit's set {want:x}");

    // control_group: 0660, group adm; a member (another user than the daemon's) uses the
    // CLI, a non-member cannot.
    let meta = std::fs::metadata(&control).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o660);
    assert_eq!(meta.gid(), 4, "group adm");
    let cli_as = |groups: &str| {
        run_timeout(
            Command::new("setpriv")
                .args(["--reuid=4242", "--regid=4242", groups, "--"])
                .arg(&bin)
                .arg("--control")
                .arg(&control)
                .args(["port", "list"]),
            Duration::from_secs(10),
        )
    };
    let member = cli_as("--groups=adm");
    assert!(member.ok(), "{}", member.stderr);
    assert!(member.stdout.contains("vm1"), "{}", member.stdout);
    let other = cli_as("--clear-groups");
    assert!(!other.ok(), "a non-member used the control socket");

    // The state is recorded in the state directory (the unit gives it as $STATE_DIRECTORY).
    assert!(state.join("state.json").exists());

    // SIGTERM: STOPPING=1, exit 0, TAP gone.
    common::signal(pid, "TERM");
    let n = notify.recv(&mut buf).expect("STOPPING=1");
    assert_eq!(&buf[..n], b"STOPPING=1");
    let st = child.wait_timeout(Duration::from_secs(15)).expect("exit");
    assert!(st.success(), "{st}: {}", log_text());
    assert!(!link_exists(&tap));
}
