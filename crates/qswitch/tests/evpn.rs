//! EVPN through FRR end to end (root only): three namespace-hosts on a shared fabric bridge,
//! each with a `qswitch run` daemon (a VXLAN port with `learning = false`, a TAP port into a
//! VM namespace, `[switch] evpn = true`) and its own zebra + bgpd (iBGP full mesh,
//! `advertise-all-vni`). Every host's `qswitch fdb` must hold the other VMs' MACs with their
//! VTEP and origin `evpn`, VMs ping each other from EVPN routes alone, and deleting a port
//! withdraws its MAC everywhere. FRR is installed with apt-get when missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{qs, qs_json, root_or_skip, sh, wait_until, worker_cpus, ChildGuard, Netns, TempDir};

const ZEBRA: &str = "/usr/lib/frr/zebra";
const BGPD: &str = "/usr/lib/frr/bgpd";
const HOSTS: usize = 3;
const VNI: u32 = 100;

fn ensure_frr() {
    if Path::new(BGPD).exists() && Path::new(ZEBRA).exists() {
        return;
    }
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q", "frr"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok && Path::new(BGPD).exists(),
        "cannot install frr (apt-get install frr)"
    );
}

fn underlay(i: usize) -> String {
    format!("10.77.0.{}", i + 1)
}

/// One namespace-host: its namespaces, daemons and files. Field order is drop order:
/// daemons first, then the namespaces.
struct Host {
    frr: Vec<ChildGuard>,
    qswitch: ChildGuard,
    control: PathBuf,
    dir: PathBuf,
    tap: String,
    vm: Netns,
    host: Netns,
}

fn frr_config(i: usize) -> String {
    let me = underlay(i);
    let mut c = format!(
        "frr defaults datacenter\nhostname h{i}\n!\nrouter bgp 65000\n bgp router-id {me}\n \
         no bgp default ipv4-unicast\n"
    );
    let peers: Vec<String> = (0..HOSTS).filter(|&j| j != i).map(underlay).collect();
    for p in &peers {
        c.push_str(&format!(
            " neighbor {p} remote-as 65000\n neighbor {p} timers connect 1\n"
        ));
    }
    c.push_str(" address-family l2vpn evpn\n");
    for p in &peers {
        c.push_str(&format!("  neighbor {p} activate\n"));
    }
    c.push_str("  advertise-all-vni\n exit-address-family\n!\n");
    c
}

impl Host {
    fn new(tmp: &TempDir, tag: &str, i: usize) -> Host {
        let pid = std::process::id() % 100_000;
        let host = Netns::new(&format!("qsev{pid}-h{i}{tag}"));
        let vm = Netns::new(&format!("qsev{pid}-v{i}{tag}"));
        let dir = tmp.join(&format!("h{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        // Underlay: a veth into the fabric namespace's bridge.
        let up = format!("qsevu{i}{pid}");
        sh(&["ip", "link", "del", &up]);
        let out = sh(&[
            "ip", "link", "add", &up, "type", "veth", "peer", "name", "uplink", "netns", &host.name,
        ]);
        assert!(out.ok(), "veth: {}", out.stderr);
        host.ok(&[
            "ip",
            "addr",
            "add",
            &format!("{}/24", underlay(i)),
            "dev",
            "uplink",
        ]);
        host.ok(&["ip", "link", "set", "uplink", "up"]);
        let tap = format!("qsevt{i}{pid}");
        let control = dir.join("control.sock");
        let config = format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\nevpn = true\n\
             [[port]]\nname = \"vx\"\ntype = \"vxlan\"\nvni = {VNI}\nlocal = \"{}\"\nlearning = false\n\
             [[port]]\nname = \"vm\"\ntype = \"tap\"\nifname = \"{tap}\"\n",
            worker_cpus(1),
            control.display(),
            dir.join("state").display(),
            underlay(i)
        );
        std::fs::write(dir.join("qswitch.toml"), config).unwrap();
        let qswitch = host.spawn(
            &[
                common::QSWITCH,
                "run",
                "--config",
                dir.join("qswitch.toml").to_str().unwrap(),
            ],
            &dir.join("qswitch.log"),
        );
        let mut h = Host {
            frr: Vec::new(),
            qswitch,
            control,
            dir,
            tap,
            vm,
            host,
        };
        assert!(
            wait_until(Duration::from_secs(10), || qs(
                &h.control,
                &["port", "list"]
            )
            .ok()),
            "qswitch on h{i} did not start: {}",
            h.log("qswitch.log")
        );
        h.host
            .ok(&["ip", "link", "set", &h.tap, "netns", &h.vm.name]);
        h.vm.ok(&[
            "ip",
            "addr",
            "add",
            &format!("10.78.0.{}/24", i + 1),
            "dev",
            &h.tap,
        ]);
        h.vm.ok(&["ip", "link", "set", &h.tap, "up"]);
        h.start_frr(i);
        h
    }

    fn start_frr(&mut self, i: usize) {
        let d = self.dir.display().to_string();
        // The daemons drop to the frr user: let it write its pid files and sockets here.
        for p in [&self.dir, self.dir.parent().unwrap()] {
            sh(&["chmod", "0777", p.to_str().unwrap()]);
        }
        std::fs::write(self.dir.join("zebra.conf"), "hostname z\n").unwrap();
        std::fs::write(self.dir.join("bgpd.conf"), frr_config(i)).unwrap();
        let common = |name: &str| {
            vec![
                "-f".to_string(),
                format!("{d}/{name}.conf"),
                "-i".to_string(),
                format!("{d}/{name}.pid"),
                "-z".to_string(),
                format!("{d}/zserv.api"),
                "--vty_socket".to_string(),
                d.clone(),
            ]
        };
        let mut zebra = vec![ZEBRA.to_string()];
        zebra.extend(common("zebra"));
        let zebra: Vec<&str> = zebra.iter().map(String::as_str).collect();
        self.frr
            .push(self.host.spawn(&zebra, &self.dir.join("zebra.log")));
        assert!(
            wait_until(Duration::from_secs(10), || self
                .dir
                .join("zserv.api")
                .exists()),
            "zebra on h{i} did not start: {}",
            self.log("zebra.log")
        );
        let mut bgpd = vec![BGPD.to_string()];
        bgpd.extend(common("bgpd"));
        let bgpd: Vec<&str> = bgpd.iter().map(String::as_str).collect();
        self.frr
            .push(self.host.spawn(&bgpd, &self.dir.join("bgpd.log")));
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    fn vm_mac(&self) -> String {
        self.vm.mac(&self.tap)
    }

    /// `qswitch fdb --json` rows: (mac, vtep, origin).
    fn fdb(&self) -> Vec<(String, Option<String>, Option<String>)> {
        let v = qs_json(&self.control, &["fdb", "--json"]);
        v.as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                let s = |k: &str| e.get(k).and_then(|x| x.as_str()).map(String::from);
                (s("mac").unwrap_or_default(), s("vtep"), s("origin"))
            })
            .collect()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        for f in &mut self.frr {
            f.stop();
        }
        self.qswitch.stop();
        for d in ["qsbr100", "qsvx100", "qsdum100"] {
            let _ = self.host.run(&["ip", "link", "del", d]);
        }
    }
}

#[test]
fn three_hosts_exchange_macs_through_frr() {
    if !root_or_skip() {
        return;
    }
    ensure_frr();
    let tmp = TempDir::new("evpn");
    let pid = std::process::id() % 100_000;
    let fabric = Netns::new(&format!("qsev{pid}-fab"));
    fabric.ok(&["ip", "link", "add", "fab", "type", "bridge"]);
    fabric.ok(&["ip", "link", "set", "fab", "up"]);
    let mut hosts: Vec<Host> = Vec::new();
    for i in 0..HOSTS {
        let h = Host::new(&tmp, "", i);
        // The veth's root-namespace end goes into the fabric.
        let up = format!("qsevu{i}{pid}");
        sh(&["ip", "link", "set", &up, "netns", &fabric.name]);
        fabric.ok(&["ip", "link", "set", &up, "master", "fab"]);
        fabric.ok(&["ip", "link", "set", &up, "up"]);
        hosts.push(h);
    }
    let frr_started = Instant::now();
    let macs: Vec<String> = hosts.iter().map(Host::vm_mac).collect();
    // Each VM says something, so its host's switch learns its MAC (and advertises it).
    for (i, h) in hosts.iter().enumerate() {
        let _ = h.vm.run_for(
            &[
                "ping",
                "-c",
                "1",
                "-W",
                "1",
                &format!("10.78.0.{}", (i + 1) % HOSTS + 1),
            ],
            Duration::from_secs(3),
        );
    }
    let start = Instant::now();
    let converged = wait_until(Duration::from_secs(30), || {
        hosts.iter().enumerate().all(|(i, h)| {
            let fdb = h.fdb();
            (0..HOSTS).filter(|&j| j != i).all(|j| {
                fdb.iter().any(|(m, vtep, origin)| {
                    *m == macs[j]
                        && vtep.as_deref() == Some(underlay(j).as_str())
                        && origin.as_deref() == Some("evpn")
                })
            })
        })
    });
    let took = start.elapsed();
    let since_frr = frr_started.elapsed();
    if !converged {
        for (i, h) in hosts.iter().enumerate() {
            eprintln!(
                "h{i} fdb: {:?}\nshadow: {}\nbgpd: {}\nzebra: {}\nqswitch: {}",
                h.fdb(),
                h.host
                    .run(&["bridge", "fdb", "show", "dev", "qsvx100"])
                    .stdout,
                h.log("bgpd.log"),
                h.log("zebra.log"),
                h.log("qswitch.log")
            );
        }
        panic!("EVPN did not converge in 30 s");
    }
    eprintln!(
        "evpn: every host has the other VMs' MACs {took:?} after the VMs spoke, \
         {since_frr:?} after the last FRR started"
    );
    // Ping from EVPN routes alone (learning = false on every VXLAN port). The pings before
    // convergence left failed neighbour entries in the VMs: start from a clean cache. The
    // MACs above converge first; the flood lists (type-3 routes) the ARP requests need may
    // follow a moment later, so a pair gets three tries.
    for h in &hosts {
        h.vm.run_for(&["ip", "neigh", "flush", "all"], Duration::from_secs(3));
    }
    for (i, h) in hosts.iter().enumerate() {
        for j in 0..HOSTS {
            if i == j {
                continue;
            }
            let ping = || {
                h.vm.run_for(
                    &[
                        "ping",
                        "-c",
                        "2",
                        "-i",
                        "0.2",
                        "-W",
                        "2",
                        &format!("10.78.0.{}", j + 1),
                    ],
                    Duration::from_secs(10),
                )
            };
            let mut out = ping();
            for _ in 0..2 {
                if out.ok() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(1));
                out = ping();
            }
            assert!(out.ok(), "vm{i} -> vm{j}: {}", out.stdout);
        }
    }
    // Only the VMs' MACs are advertised (nothing of the shadow devices).
    for (i, h) in hosts.iter().enumerate() {
        for (m, _, o) in h.fdb() {
            if o.as_deref() == Some("evpn") {
                assert!(macs.contains(&m), "h{i}: unexpected EVPN MAC {m}");
            }
        }
    }
    let text = qs(&hosts[0].control, &["fdb"]);
    eprintln!("{}", text.stdout);
    // Deleting host 2's VM port withdraws its MAC on the others.
    let out = qs(&hosts[2].control, &["port", "del", "vm"]);
    assert!(out.ok(), "port del: {}", out.stderr);
    let start = Instant::now();
    let withdrawn = wait_until(Duration::from_secs(10), || {
        hosts[..2].iter().all(|h| {
            !h.fdb()
                .iter()
                .any(|(m, _, o)| *m == macs[2] && o.as_deref() == Some("evpn"))
        })
    });
    let took = start.elapsed();
    assert!(
        withdrawn,
        "vm2's MAC not withdrawn in 10 s: h0 {:?}, h2 shadow {}",
        hosts[0].fdb(),
        hosts[2]
            .host
            .run(&["bridge", "fdb", "show", "dev", "qsdum100"])
            .stdout
    );
    eprintln!("evpn: port delete withdrawn everywhere after {took:?}");
    drop(hosts);
    drop(fabric);
}

/// F5 (issue 27): the shadow's MACs go over rtnetlink, one by one: a zero and a group MAC
/// are refused and reported, the valid MACs around them are installed all the same (before,
/// `bridge fdb replace 00:00:00:00:00:00` failed and aborted the round, so nothing after
/// it was ever advertised), withdrawn ones go, and what zebra would install on the vxlan
/// device (remote MACs, the flood list) is read back. Checked to fail before the fix.
#[test]
fn kernel_shadow_applies_each_mac_on_its_own() {
    use qswitch::evpn::{KernelShadow, Shadow};
    use qswitch_wire::MacAddr;
    use std::collections::BTreeSet;
    if !root_or_skip() {
        return;
    }
    let ns = Netns::new(&format!("qsevk{}", std::process::id() % 100_000));
    let path = PathBuf::from(format!("/run/netns/{}", ns.name));
    let mac = |s: &str| s.parse::<MacAddr>().unwrap();
    let (zero, group) = (mac("00:00:00:00:00:00"), mac("01:00:5e:00:00:01"));
    let (a, b, c) = (
        mac("02:00:00:00:00:0a"),
        mac("02:00:00:00:00:0b"),
        mac("02:00:00:00:00:0c"),
    );
    let (failed, after, remote) = std::thread::spawn(move || {
        qswitch_sys::netns::enter(&path).expect("enter the namespace");
        let mut shadow =
            KernelShadow::create(100, "10.77.9.1".parse().unwrap(), 4789).expect("shadow");
        let failed: Vec<MacAddr> = shadow
            .set_local_macs(&BTreeSet::from([zero, group, a, b, c]))
            .into_iter()
            .map(|(m, _)| m)
            .collect();
        // b withdrawn, the bad ones still asked for: they fail again, nothing else does.
        let again = shadow.set_local_macs(&BTreeSet::from([zero, a, c]));
        assert_eq!(again.len(), 1, "{again:?}");
        let after = bridge_macs("qsdum100");
        // What zebra installs: a remote MAC and a flood-list VTEP on the vxlan device.
        for args in [
            "fdb append 00:00:00:00:00:00 dev qsvx100 dst 10.77.9.2",
            "fdb add 02:00:00:00:00:b2 dev qsvx100 dst 10.77.9.3",
        ] {
            let st = Command::new("bridge")
                .args(args.split(' '))
                .status()
                .unwrap();
            assert!(st.success(), "bridge {args}");
        }
        let remote = shadow.remote().expect("remote over netlink");
        shadow.remove();
        (failed, after, remote)
    })
    .join()
    .unwrap();
    assert_eq!(failed, vec![zero, group]);
    assert_eq!(after, BTreeSet::from([a, c]));
    assert_eq!(remote.flood, BTreeSet::from(["10.77.9.2".parse().unwrap()]));
    assert_eq!(
        remote.macs.get(&mac("02:00:00:00:00:b2")),
        Some(&"10.77.9.3".parse().unwrap())
    );
    drop(ns);
}

/// The static entries qswitch put on `dev` (`bridge -j fdb show dev DEV`).
fn bridge_macs(dev: &str) -> std::collections::BTreeSet<qswitch_wire::MacAddr> {
    let out = Command::new("bridge")
        .args(["-j", "fdb", "show", "dev", dev])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v.as_array()
        .into_iter()
        .flatten()
        .filter(|e| e.get("state").and_then(|s| s.as_str()) == Some("static"))
        .filter_map(|e| e.get("mac")?.as_str()?.parse().ok())
        .collect()
}
