//! `qswitch bench overlay`: VM namespace ↔ VM namespace across two namespace-hosts joined by
//! a veth underlay, (a) through a qswitch per host (TAP port + VXLAN port, VNI 100), (b)
//! through a Linux bridge + vxlan device per host, and (c) as (a) with the VMs on veth ports
//! (the container's case: the kernel fast path, which encapsulates and decapsulates known
//! unicast across hosts itself); iperf3 TCP, interleaved runs. The ratios printed: (a) / (b) and (c) / (b).
//!
//! ```text
//!   vmA ── TAP/veth ── [host A: qswitch | br+vxlan] ══ veth 10.97.0.1 ↔ 10.97.0.2 ══ [host B] ── vmB
//! ```

use std::process::{Command, Stdio};

use super::{
    print_table, run_line, summarise, warn_if_busy, write_results, Bench, Report, Topology,
};
use crate::netns::{self, ChildGuard, Netns};
use crate::topology::RemoveDir;

const NAMES: [&str; 3] = ["qswitch-vxlan", "linux-vxlan", "qswitch-vxlan-veth"];

/// Field order is drop order: daemons, then namespaces.
struct OverlayTopo {
    _daemons: Vec<ChildGuard>,
    vm_a: Netns,
    vm_b: Netns,
    _hosts: Vec<Netns>,
    _dir: Option<RemoveDir>,
}

impl Topology for OverlayTopo {
    fn client(&self) -> &Netns {
        &self.vm_a
    }
    fn server(&self) -> &Netns {
        &self.vm_b
    }
    fn server_addr(&self) -> &str {
        "10.96.0.2"
    }
}

fn underlay(id: u32) -> anyhow::Result<(Netns, Netns)> {
    let n = id % 10_000;
    let ha = Netns::create(&format!("qsbench-ov-ha-{id}"))?;
    let hb = Netns::create(&format!("qsbench-ov-hb-{id}"))?;
    let (ua, ub) = (format!("qsovA{n}"), format!("qsovB{n}"));
    netns::run(&[
        "ip", "link", "add", &ua, "type", "veth", "peer", "name", &ub,
    ])?;
    ha.adopt(&ua, "10.97.0.1/24")?;
    hb.adopt(&ub, "10.97.0.2/24")?;
    Ok((ha, hb))
}

fn vm_in(host: &Netns, ifname: &str, vm: &Netns, addr: &str) -> anyhow::Result<()> {
    host.exec(&["ip", "link", "set", ifname, "netns", &vm.name])?;
    vm.exec(&["ip", "addr", "add", addr, "dev", ifname])?;
    vm.exec(&["ip", "link", "set", ifname, "up"])?;
    // The guest MTU the overlay can carry (50 bytes of IPv4 + UDP + VXLAN).
    vm.exec(&["ip", "link", "set", ifname, "mtu", "1450"])?;
    Ok(())
}

/// A qswitch per host; the VMs on TAP ports, or with `veth` on veth ports (fast path on).
fn setup_qswitch(id: u32, workers: &str, veth: bool) -> anyhow::Result<OverlayTopo> {
    let (ha, hb) = underlay(id)?;
    let vm_a = Netns::create(&format!("qsbench-ov-va-{id}"))?;
    let vm_b = Netns::create(&format!("qsbench-ov-vb-{id}"))?;
    let dir = RemoveDir(std::env::temp_dir().join(format!("qswitch-bench-ov-{id}")));
    std::fs::create_dir_all(&dir.0)?;
    let exe = crate::netns::daemon_exe()?;
    let mut daemons = Vec::new();
    for (i, (host, local, remote)) in [
        (&ha, "10.97.0.1", "10.97.0.2"),
        (&hb, "10.97.0.2", "10.97.0.1"),
    ]
    .into_iter()
    .enumerate()
    {
        let control = dir.0.join(format!("control{i}.sock"));
        let config = dir.0.join(format!("qswitch{i}.toml"));
        // The VM's end is `qsovt{i}` either way ([`vm_in`] moves it into the VM).
        let vm_port = if veth {
            host.exec(&[
                "ip",
                "link",
                "add",
                &format!("qsovp{i}"),
                "type",
                "veth",
                "peer",
                "name",
                &format!("qsovt{i}"),
            ])?;
            format!("type = \"veth\"\nifname = \"qsovp{i}\"\nfastpath = true\n")
        } else {
            format!("type = \"tap\"\nifname = \"qsovt{i}\"\n")
        };
        std::fs::write(
            &config,
            format!(
                "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\n\
                 [[port]]\nname = \"vx\"\ntype = \"vxlan\"\nvni = 100\nlocal = \"{local}\"\nremotes = [\"{remote}\"]\n\
                 [[port]]\nname = \"vm\"\n{vm_port}",
                control.display()
            ),
        )?;
        let child = Command::new("ip")
            .args(["netns", "exec", &host.name])
            .arg(&exe)
            .args(["run", "--config"])
            .arg(&config)
            .env("STATE_DIRECTORY", config.with_extension("state"))
            .env("QSWITCH_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        daemons.push(ChildGuard(Some(child)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while qswitch_api::client::call(&control, &qswitch_api::Request::Ping).is_err() {
            if std::time::Instant::now() > deadline {
                anyhow::bail!("qswitch in {} did not start", host.name);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    vm_in(&ha, "qsovt0", &vm_a, "10.96.0.1/24")?;
    vm_in(&hb, "qsovt1", &vm_b, "10.96.0.2/24")?;
    Ok(OverlayTopo {
        _daemons: daemons,
        vm_a,
        vm_b,
        _hosts: vec![ha, hb],
        _dir: Some(dir),
    })
}

fn setup_linux(id: u32) -> anyhow::Result<OverlayTopo> {
    let (ha, hb) = underlay(id)?;
    let vm_a = Netns::create(&format!("qsbench-ov-va-{id}"))?;
    let vm_b = Netns::create(&format!("qsbench-ov-vb-{id}"))?;
    for (i, (host, local, remote)) in [
        (&ha, "10.97.0.1", "10.97.0.2"),
        (&hb, "10.97.0.2", "10.97.0.1"),
    ]
    .into_iter()
    .enumerate()
    {
        let x = |args: &[&str]| host.exec(args).map(|_| ());
        x(&["ip", "link", "add", "br0", "type", "bridge"])?;
        x(&[
            "ip", "link", "add", "vx0", "type", "vxlan", "id", "100", "local", local, "remote",
            remote, "dstport", "4789",
        ])?;
        let vm = format!("qsovv{i}");
        x(&[
            "ip", "link", "add", "vmp", "type", "veth", "peer", "name", &vm,
        ])?;
        for d in ["vx0", "vmp"] {
            x(&["ip", "link", "set", d, "master", "br0"])?;
        }
        for d in ["vx0", "vmp", "br0"] {
            x(&["ip", "link", "set", d, "up"])?;
        }
    }
    vm_in(&ha, "qsovv0", &vm_a, "10.96.0.1/24")?;
    vm_in(&hb, "qsovv1", &vm_b, "10.96.0.2/24")?;
    Ok(OverlayTopo {
        _daemons: Vec::new(),
        vm_a,
        vm_b,
        _hosts: vec![ha, hb],
        _dir: None,
    })
}

pub fn run(b: &Bench) -> anyhow::Result<()> {
    for (tool, pkg) in [("ip", "iproute2"), ("ss", "iproute2"), ("iperf3", "iperf3")] {
        netns::ensure_tool(tool, pkg)?;
    }
    let (runs, seconds, streams) = (b.args.runs, b.args.seconds, b.args.streams);
    let workers = crate::topology::worker_cpus(1)?;
    let order = super::schedule(b, "overlay", &NAMES)?;
    b.say(format_args!(
        "{runs} round(s) of {}, {seconds} s each, {streams} stream(s); qswitch workers on CPUs {workers}",
        NAMES.join(", ")
    ));
    let config = serde_json::json!({
        "runs": runs,
        "seconds": seconds,
        "streams": streams,
        "contenders": NAMES,
        "order": order.iter().map(|&(_, c)| NAMES[c]).collect::<Vec<_>>(),
        "qswitch_workers": workers,
        "vni": 100,
        "underlay": "veth between two host namespaces, IPv4, dstport 4789",
        "guest_mtu": 1450,
    });
    let mut results = Vec::new();
    for (seq, &(round, c)) in order.iter().enumerate() {
        b.check()?;
        let name = NAMES[c];
        b.say_start(format_args!(
            "[{:>2}/{}] round {} {name:<14}",
            seq + 1,
            order.len(),
            round + 1
        ));
        let topo = match c {
            0 => setup_qswitch(b.id, &workers, false)?,
            1 => setup_linux(b.id)?,
            _ => setup_qswitch(b.id, &workers, true)?,
        };
        let r = super::iperf_run(b, &topo, (name, round + 1, seq + 1))?;
        drop(topo);
        println!("{}", run_line(&r));
        results.push(r);
    }
    let (summary, ratio) = summarise(&NAMES, &results);
    let title = format!("overlay ({streams} stream(s), {seconds} s, {runs} runs each)");
    // The TAP ratio is the report's `ratio` (as before the veth contender); the veth one is
    // printed beside it (the summary has its medians).
    let veth_ratio = super::ratio_of(&summary[2], &summary[1]);
    let ratios: Vec<_> = ratio.iter().chain(veth_ratio.iter()).cloned().collect();
    print_table("overlay", &title, &summary, &ratios);
    warn_if_busy(&results);
    let svg = super::tap_tcp_svg(&title, &summary, &results);
    let report = Report {
        scenario: "overlay".into(),
        config,
        runs: results,
        summary,
        ratio,
    };
    write_results(&b.args.out, "overlay", &report, &svg)
}
