//! Open vSwitch's userspace datapath (`datapath_type=netdev`, no kernel module) as a real
//! LACP partner: a namespace this test creates with its own ovsdb-server and ovs-vswitchd,
//! bonding `p0` and `p1`, the other ends of two veth pairs the test keeps. Everything is
//! stopped by PID and removed on drop, also when a test fails.

use std::time::Duration;

use crate::harness::{run_timeout, sh_ok, wait_until, ChildGuard, LinkGuard, Netns, TempDir};
use crate::skip::{have_tool, root_or_skip, skip};

const WAIT: Duration = Duration::from_secs(20);

/// Whether the test can run Open vSwitch: root and its tools (else skip, or fail under CI).
pub fn ovs_or_skip() -> bool {
    if !root_or_skip() {
        return false;
    }
    for tool in [
        "ovs-vswitchd",
        "ovsdb-server",
        "ovsdb-tool",
        "ovs-vsctl",
        "ovs-appctl",
    ] {
        if !have_tool(tool, &["--version"]) {
            skip(&format!("needs {tool} (Debian package openvswitch-switch)"));
            return false;
        }
    }
    true
}

/// Open vSwitch in namespace `qs-lacp-<pid>-<tag>`, bonding p0 and p1; the test's ends
/// of the two veth pairs are `ours`. (Fields drop in order: ovs-vswitchd, ovsdb-server, the
/// veths, the namespace, the directory.)
pub struct Ovs {
    pub vswitchd: ChildGuard,
    _ovsdb: ChildGuard,
    _links: Vec<LinkGuard>,
    _ns: Netns,
    pub dir: TempDir,
    /// The test's ends of the veth pairs to p0 and p1 (down until the test sets them up).
    pub ours: Vec<String>,
}

impl Ovs {
    /// Starts ovsdb-server and ovs-vswitchd (run, log, db and sysconf directories in a temp
    /// dir of their own) and adds `br0` (`datapath_type=netdev`) with `bond0` of p0 and p1,
    /// `bond_mode=balance-tcp lacp=ovs_lacp other_config:lacp-time=fast`.
    pub fn start(tag: &str, ovs_lacp: &str) -> Ovs {
        let pid = std::process::id();
        let dir = TempDir::new(&format!("lacp-{tag}"));
        let ns = Netns::new(&format!("qs-lacp-{pid}-{tag}"));
        let mut links = Vec::new();
        let mut ours = Vec::new();
        for i in 0..2 {
            let name = format!("ql{}{tag}{i}", pid % 100_000);
            sh_ok(&[
                "ip",
                "link",
                "add",
                &name,
                "type",
                "veth",
                "peer",
                "name",
                &format!("p{i}"),
                "netns",
                &ns.name,
            ]);
            links.push(LinkGuard(name.clone()));
            ns.sysctl(&format!("net.ipv6.conf.p{i}.disable_ipv6"), "1");
            ns.ok(&["ip", "link", "set", "dev", &format!("p{i}"), "up"]);
            sh_ok(&[
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{name}.disable_ipv6=1"),
            ]);
            ours.push(name);
        }
        let d = dir.path().to_str().expect("utf-8 temp dir").to_string();
        let db = format!("{d}/conf.db");
        sh_ok(&[
            "ovsdb-tool",
            "create",
            &db,
            "/usr/share/openvswitch/vswitch.ovsschema",
        ]);
        let env = [
            format!("OVS_RUNDIR={d}"),
            format!("OVS_LOGDIR={d}"),
            format!("OVS_DBDIR={d}"),
            format!("OVS_SYSCONFDIR={d}"),
        ];
        let spawn = |args: &[String], log: &str| {
            let mut all: Vec<&str> = vec!["env"];
            all.extend(env.iter().map(String::as_str));
            all.extend(args.iter().map(String::as_str));
            ns.spawn(&all, &dir.join(log))
        };
        let ovsdb = spawn(
            &[
                "ovsdb-server".into(),
                db,
                format!("--remote=punix:{d}/db.sock"),
                format!("--pidfile={d}/ovsdb-server.pid"),
                format!("--unixctl={d}/ovsdb-server.ctl"),
                format!("--log-file={d}/ovsdb-server.log"),
            ],
            "ovsdb-server.out",
        );
        let sock = dir.join("db.sock");
        assert!(
            wait_until(WAIT, || sock.exists()),
            "ovsdb-server did not start"
        );
        let vswitchd = spawn(
            &[
                "ovs-vswitchd".into(),
                format!("unix:{d}/db.sock"),
                format!("--pidfile={d}/vswitchd.pid"),
                format!("--unixctl={d}/vswitchd.ctl"),
                format!("--log-file={d}/vswitchd.log"),
            ],
            "vswitchd.out",
        );
        let ovs = Ovs {
            vswitchd,
            _ovsdb: ovsdb,
            _links: links,
            _ns: ns,
            dir,
            ours,
        };
        ovs.vsctl(&["--no-wait", "init"]);
        let ctl = ovs.dir.join("vswitchd.ctl");
        assert!(
            wait_until(WAIT, || ctl.exists()),
            "ovs-vswitchd did not start"
        );
        ovs.vsctl(&[
            "add-br",
            "br0",
            "--",
            "set",
            "bridge",
            "br0",
            "datapath_type=netdev",
            "--",
            "add-bond",
            "br0",
            "bond0",
            "p0",
            "p1",
            "bond_mode=balance-tcp",
            &format!("lacp={ovs_lacp}"),
            "other_config:lacp-time=fast",
        ]);
        ovs
    }

    /// `ovs-vsctl` against this ovsdb; panics (with the log's tail) unless it succeeds.
    pub fn vsctl(&self, args: &[&str]) {
        let db = format!("--db=unix:{}", self.dir.join("db.sock").display());
        let mut all = vec![db.as_str(), "--timeout=10"];
        all.extend_from_slice(args);
        let out = run_timeout(
            std::process::Command::new("ovs-vsctl").args(&all),
            Duration::from_secs(15),
        );
        assert!(
            out.ok(),
            "ovs-vsctl {args:?}: {}\n{}",
            out.stderr,
            self.log()
        );
    }

    /// `ovs-appctl -t vswitchd.ctl args...`: its output.
    pub fn appctl(&self, args: &[&str]) -> String {
        let ctl = self.dir.join("vswitchd.ctl");
        let mut cmd = std::process::Command::new("ovs-appctl");
        cmd.arg("-t").arg(&ctl).args(args);
        run_timeout(&mut cmd, Duration::from_secs(10)).stdout
    }

    /// The last 30 lines of ovs-vswitchd's log.
    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("vswitchd.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Whether `lacp/show` has both members current, with `partner` as their partner in
    /// sync, collecting and distributing.
    pub fn formed_with(&self, partner: impl std::fmt::Display) -> bool {
        let show = self.appctl(&["lacp/show", "bond0"]);
        let sections: Vec<&str> = show.split("\nmember: ").skip(1).collect();
        sections.len() == 2
            && sections.iter().all(|s| {
                let partner_line = format!("partner sys_id: {partner}");
                let state = s
                    .lines()
                    .find(|l| l.trim_start().starts_with("partner state:"))
                    .unwrap_or("");
                s.lines().next().is_some_and(|l| l.contains("current"))
                    && s.contains(&partner_line)
                    && s.contains("may_enable: true")
                    && ["synchronized", "collecting", "distributing"]
                        .iter()
                        .all(|w| state.contains(w))
            })
    }
}
