//! `cni`: pod-to-pod TCP through qswitch's CNI plugin vs the reference `bridge` CNI plugin
//! (issue 29).
//!
//! ```text
//!   qswitch-cni:  pod a ──veth── qsc… ═ veth port (kernel fast path) ═ qswitch ═ qsc… ──veth── pod b
//!   bridge-cni:   pod a ──veth── veth… ═ Linux bridge qsbc<n> ═ veth… ──veth── pod b
//! ```
//!
//! Per run, two new network namespaces ("pods") are attached with `cnitool add` — as a
//! container runtime would — to a network of `qswitch-cni` (`mode = "veth"`, one daemon with
//! two workers) or of Debian's reference `bridge` plugin (its own bridge, no gateway, no
//! masquerade); both with `host-local` IPAM in a data directory of the run. Then iperf3 from
//! pod a to pod b, 1 and 4 streams, contenders interleaved; `cnitool del` on the way out.
//! CNI_PATH is the directory of `qswitch-cni` (beside this `qswitch`, else `/usr/lib/cni`)
//! and `/usr/lib/cni`. Reports Gbit/s, machine CPU per Gbit/s and qswitch-cni / bridge-cni
//! at each stream count.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde::Serialize;
use serde_json::{json, Value};

use super::{
    iperf_run_with, print_table, ratio_of, run_line, summarise, warn_if_busy, Bench, Ratio,
    RemoveDir, Report, Topology,
};
use crate::netns::{self, LabDaemon, Link, Netns};

/// Where Debian's containernetworking-plugins puts the reference plugins.
const REFERENCE: &str = "/usr/lib/cni";
const KINDS: [&str; 2] = ["qswitch-cni", "bridge-cni"];
const STREAMS: [u32; 2] = [1, 4];
/// What CI installs (`.ci/run`).
const CNITOOL: &str = "go install github.com/containernetworking/cni/cnitool@v1.3.1";

/// `qswitch-cni-1`, `bridge-cni-1`, `qswitch-cni-4`, `bridge-cni-4`.
fn names() -> Vec<String> {
    STREAMS
        .iter()
        .flat_map(|s| KINDS.iter().map(move |k| format!("{k}-{s}")))
        .collect()
}

/// `qswitch-cni`: beside this executable (a cargo build), else where the .deb puts it.
fn plugin_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find the qswitch binary")?;
    [exe.parent().map(Path::to_path_buf), Some(REFERENCE.into())]
        .into_iter()
        .flatten()
        .find(|d| d.join("qswitch-cni").is_file())
        .with_context(|| {
            format!(
                "no qswitch-cni beside {} nor in {REFERENCE} (cargo build --release -p qswitch-cni)",
                exe.display()
            )
        })
}

/// The pods attached to one network with cnitool; `cnitool del` for each on drop.
struct Attached {
    net: String,
    netconf: PathBuf,
    cni_path: String,
    netns: Vec<PathBuf>,
}

impl Attached {
    fn cnitool(&self, cmd: &str, netns: &Path) -> anyhow::Result<std::process::Output> {
        let out = Command::new("cnitool")
            .args([cmd, &self.net])
            .arg(netns)
            .env("NETCONFPATH", &self.netconf)
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_IFNAME", "eth0")
            .stdin(Stdio::null())
            .output()
            .context("cannot run cnitool")?;
        if !out.status.success() {
            bail!(
                "cnitool {cmd} {} {}: {}{}",
                self.net,
                netns.display(),
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(out)
    }

    /// `cnitool add`; the pod's first address (without its prefix length).
    fn add(&mut self, ns: &Netns) -> anyhow::Result<String> {
        let path = Path::new("/run/netns").join(&ns.name);
        self.netns.push(path.clone());
        let out = self.cnitool("add", &path)?;
        let r: Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("cnitool add {}: no JSON result", self.net))?;
        let addr = r["ips"][0]["address"]
            .as_str()
            .with_context(|| format!("cnitool add {}: no address in {r}", self.net))?;
        Ok(addr.split('/').next().unwrap_or(addr).to_string())
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        for ns in std::mem::take(&mut self.netns).iter().rev() {
            if let Err(e) = self.cnitool("del", ns) {
                eprintln!("warning: {e:#}");
            }
        }
    }
}

/// Two pods on one CNI network. Field order is drop order: the pods are detached (the
/// daemon still answering), then the daemon stops, the bridge goes, the namespaces go, the
/// directory (configs, IPAM store, daemon state) goes.
struct CniTopo {
    _attached: Attached,
    daemon: Option<LabDaemon>,
    _bridge: Option<Link>,
    a: Netns,
    b: Netns,
    server_addr: String,
    _dir: RemoveDir,
}

impl Topology for CniTopo {
    fn client(&self) -> &Netns {
        &self.a
    }
    fn server(&self) -> &Netns {
        &self.b
    }
    fn server_addr(&self) -> &str {
        &self.server_addr
    }
    fn daemon(&self) -> Option<&LabDaemon> {
        self.daemon.as_ref()
    }
}

/// Kind 0 (qswitch-cni, a daemon with `workers`) or 1 (the bridge plugin): the network's
/// config, two namespaces, both attached.
fn setup(id: u32, kind: usize, workers: &str, plugins: &Path) -> anyhow::Result<CniTopo> {
    let n = id % 10_000;
    let tag = ["qc", "bc"][kind];
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-cni-{tag}-{id}")));
    let netconf = dir.0.join("net.d");
    std::fs::create_dir_all(&netconf)?;
    let net = format!("qsbench-{tag}-{id}");
    let ipam = json!({
        "type": "host-local",
        "dataDir": dir.0.join("ipam"),
        "ranges": [[{ "subnet": format!("10.98.{}.0/24", 6 + kind) }]]
    });
    let (plugin, daemon, bridge) = if kind == 0 {
        let control = dir.0.join("control.sock");
        let text = format!(
            "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\n",
            control.display()
        );
        let daemon = LabDaemon::start(&dir.0, &text)?;
        let p = json!({ "type": "qswitch-cni", "control": control, "mode": "veth", "ipam": ipam });
        (p, Some(daemon), None)
    } else {
        let name = format!("qsbc{n}");
        let _ = Command::new("ip")
            .args(["link", "del", &name])
            .stderr(Stdio::null())
            .status();
        // The plugin makes the bridge; the guard deletes it (DEL leaves it).
        let p = json!({ "type": "bridge", "bridge": name, "ipam": ipam });
        (p, None, Some(Link { name }))
    };
    let list = json!({ "cniVersion": "1.0.0", "name": net, "plugins": [plugin] });
    std::fs::write(
        netconf.join(format!("10-{net}.conflist")),
        serde_json::to_vec_pretty(&list)?,
    )?;
    let a = Netns::create(&format!("qsbench-{tag}-a-{id}"))?;
    let b = Netns::create(&format!("qsbench-{tag}-b-{id}"))?;
    let mut attached = Attached {
        net,
        netconf,
        cni_path: format!("{}:{REFERENCE}", plugins.display()),
        netns: Vec::new(),
    };
    let r = attached.add(&a).and_then(|_| attached.add(&b));
    let topo = CniTopo {
        _attached: attached,
        daemon,
        _bridge: bridge,
        a,
        b,
        server_addr: String::new(),
        _dir: dir,
    };
    Ok(CniTopo {
        server_addr: r?,
        ..topo
    })
}

/// What `OUT/cni.json` holds: the usual report, plus qswitch-cni / bridge-cni per stream
/// count.
#[derive(Debug, Serialize)]
struct CniReport {
    #[serde(flatten)]
    report: Report,
    ratios: Vec<Ratio>,
}

pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [("ip", "iproute2"), ("ss", "iproute2"), ("iperf3", "iperf3")] {
        netns::ensure_tool(tool, pkg)?;
    }
    if !Path::new(REFERENCE).join("bridge").is_file() {
        // Not on the PATH, so ensure_tool cannot see it: the package by hand.
        eprintln!(
            "installing containernetworking-plugins (for {REFERENCE}/bridge) with apt-get ..."
        );
        netns::ensure_package("containernetworking-plugins")?;
        if !Path::new(REFERENCE).join("bridge").is_file() {
            bail!("no {REFERENCE}/bridge after installing containernetworking-plugins");
        }
    }
    if !netns::have("cnitool") {
        bail!("no cnitool on the PATH; install it with `GOBIN=/usr/local/bin {CNITOOL}`");
    }
    let plugins = plugin_dir()?;
    let (runs, seconds) = (b.args.runs, b.args.seconds);
    let workers = crate::topology::worker_cpus(2)?;
    let names = names();
    let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let order = super::schedule(b, "cni", &name_refs)?;
    b.say(format_args!(
        "{runs} round(s) of {}, {seconds} s each; qswitch workers on CPUs {workers}; plugins \
         from {} and {REFERENCE}",
        names.join(", "),
        plugins.display()
    ));
    let mut results = Vec::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = &names[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<13}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let (kind, group) = (c % KINDS.len(), c / KINDS.len());
        let topo = setup(b.id, kind, &workers, &plugins)?;
        let p = STREAMS[group].to_string();
        let r = iperf_run_with(b, &topo, (name, round + 1, seq + 1), &["-P", &p])?;
        drop(topo);
        println!("{}", run_line(&r));
        results.push(r);
    }
    let (summary, _) = summarise(&name_refs, &results);
    let ratios: Vec<Ratio> = summary
        .chunks(KINDS.len())
        .filter(|g| g.iter().all(|s| s.runs > 0))
        .filter_map(|g| ratio_of(&g[0], &g[1]))
        .collect();
    let title = format!("cni (pod to pod, {seconds} s, {runs} runs each)");
    print_table("cni", &title, &summary, &ratios);
    warn_if_busy(&results);
    let svg = super::tap_tcp_svg(&title, &summary, &results);
    let report = CniReport {
        report: Report {
            scenario: "cni".into(),
            config: json!({
                "runs": runs,
                "seconds": seconds,
                "streams": STREAMS,
                "contenders": names,
                "order": order.iter().map(|&(_, c)| names[c].clone()).collect::<Vec<_>>(),
                "qswitch_workers": workers,
                "cni_path": format!("{}:{REFERENCE}", plugins.display()),
                "qswitch_version": env!("CARGO_PKG_VERSION"),
                "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
                "loadavg_at_start": super::first_line("/proc/loadavg"),
                "bridge_nf_call_iptables": super::first_line("/proc/sys/net/bridge/bridge-nf-call-iptables"),
            }),
            runs: results,
            summary,
            ratio: None,
        },
        ratios,
    };
    super::write_results(&b.args.out, "cni", &report, &svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_alternate_kinds_per_stream_count() {
        assert_eq!(
            names(),
            [
                "qswitch-cni-1",
                "bridge-cni-1",
                "qswitch-cni-4",
                "bridge-cni-4"
            ]
        );
    }
}
