//! A real LLDP partner (Debian's lldpd) for the LLDP tests: a namespace this test creates
//! with lldpd on `eth0`, the other end of a veth pair whose root-namespace end is the
//! test's. lldpd's control socket and log are in the test's temp dir; it talks every second
//! (`tx-interval 1`, so its TTL is 4 s) under a system name the test knows. On drop lldpd is
//! stopped by PID, then the veth and the namespace are removed, also when a test fails.

use std::path::PathBuf;
use std::time::Duration;

use crate::harness::{sh_ok, wait_until, ChildGuard, LinkGuard, Netns, Out, TempDir};
use crate::skip::{have_tool, root_or_skip, skip};

const WAIT: Duration = Duration::from_secs(20);

/// Whether the test can run lldpd: root, `lldpd` and `lldpcli` (else skip, or fail under CI).
pub fn lldpd_or_skip() -> bool {
    if !root_or_skip() {
        return false;
    }
    for tool in ["lldpd", "lldpcli"] {
        if !have_tool(tool, &["-v"]) {
            skip(&format!("needs {tool} (Debian package lldpd)"));
            return false;
        }
    }
    true
}

/// lldpd in namespace `qs-lldp<tag>-<pid>` on `eth0`, peer of the test's `ifname`.
/// (Fields drop in order: lldpd, the veth, the namespace.)
pub struct Lldpd {
    lldpd: ChildGuard,
    _link: LinkGuard,
    pub ns: Netns,
    /// lldpd's control socket (`lldpcli -u`).
    pub ctl: String,
    /// The system name lldpd announces: `lldp-<tag>-<pid>`.
    pub name: String,
    /// lldpd's output.
    pub log: PathBuf,
}

impl Lldpd {
    /// Creates the veth pair `ifname` ↔ `eth0` (IPv6 off on both, both up; `eth0` gets
    /// `addr`, CIDR, when given: lldpd announces it as its management address) and starts
    /// lldpd on `eth0`; returns once lldpcli answers and the name and interval are set.
    pub fn start(dir: &TempDir, tag: &str, ifname: &str, addr: Option<&str>) -> Lldpd {
        let pid = std::process::id();
        let ns = Netns::new(&format!("qs-lldp{tag}-{pid}"));
        sh_ok(&[
            "ip", "link", "add", ifname, "type", "veth", "peer", "name", "eth0", "netns", &ns.name,
        ]);
        let link = LinkGuard(ifname.to_string());
        sh_ok(&[
            "sysctl",
            "-qw",
            &format!("net.ipv6.conf.{ifname}.disable_ipv6=1"),
        ]);
        ns.sysctl("net.ipv6.conf.eth0.disable_ipv6", "1");
        if let Some(addr) = addr {
            ns.ok(&["ip", "addr", "add", addr, "dev", "eth0"]);
        }
        ns.ok(&["ip", "link", "set", "dev", "eth0", "up"]);
        // Up before lldpd (or a daemon) takes it, so its first LLDPDU finds a carrier.
        sh_ok(&["ip", "link", "set", "dev", ifname, "up"]);
        let ctl = dir
            .join(&format!("lldpd-{tag}.ctl"))
            .to_str()
            .expect("utf-8 path")
            .to_string();
        let log = dir.join(&format!("lldpd-{tag}.log"));
        let lldpd = ns.spawn(
            &[
                "lldpd",
                "-d",
                "-u",
                &ctl,
                "-I",
                "eth0",
                "-S",
                "lldpd test peer",
            ],
            &log,
        );
        let peer = Lldpd {
            lldpd,
            _link: link,
            ns,
            ctl,
            name: format!("lldp-{tag}-{pid}"),
            log,
        };
        assert!(
            wait_until(WAIT, || peer.cli(&["show", "configuration"]).ok()),
            "lldpd did not start: {}",
            std::fs::read_to_string(&peer.log).unwrap_or_default()
        );
        assert!(peer
            .cli(&["configure", "system", "hostname", &peer.name])
            .ok());
        assert!(peer.cli(&["configure", "lldp", "tx-interval", "1"]).ok());
        peer
    }

    /// `lldpcli -u CTL args...` inside the namespace, bounded.
    pub fn cli(&self, args: &[&str]) -> Out {
        let mut all = vec!["lldpcli", "-u", &self.ctl];
        all.extend_from_slice(args);
        self.ns.run(&all)
    }

    /// `lldpcli -f keyvalue show neighbors`.
    pub fn neighbors(&self) -> String {
        self.cli(&["-f", "keyvalue", "show", "neighbors"]).stdout
    }

    /// Stops lldpd now (SIGTERM: it sends a shutdown LLDPDU; SIGKILL after 3 s).
    pub fn stop(&mut self) {
        self.lldpd.stop();
    }
}
