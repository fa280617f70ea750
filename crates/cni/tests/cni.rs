//! qswitch-cni end to end (root only): a `qswitch run` daemon, network namespaces, the
//! reference plugins of Debian's containernetworking-plugins (host-local, tuning) and the CNI
//! project's `cnitool`, or the plugin run directly as a runtime runs it (environment and
//! stdin) where cnitool has no way to say it (other versions, GC's valid attachments).
//!
//! Every test has its own number `n`: its network is `qscni<pid>-<n>`, its namespaces
//! `qscni<pid>-<n><x>`, its subnet 10.202.<n>.0/24; the IPAM store is in its temp dir.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use qswitch_test_support::{
    counter, port_names, qs_json, require, root_or_skip, run_timeout, wait_until, DaemonChild,
    Netns, Out, TempDir,
};
use serde_json::{json, Value};

const PLUGIN: &str = env!("CARGO_BIN_EXE_qswitch-cni");
/// Where Debian's containernetworking-plugins puts the reference plugins.
const REFERENCE: &str = "/usr/lib/cni";

/// Root, cnitool, host-local, tuning; else skip (or fail in CI).
fn can_run() -> bool {
    root_or_skip()
        && require(
            Path::new(REFERENCE).join("host-local").is_file()
                && Path::new(REFERENCE).join("tuning").is_file(),
            "no /usr/lib/cni/host-local (apt-get install containernetworking-plugins)",
        )
        && require(
            Command::new("cnitool")
                .arg("--help")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok(),
            "no cnitool (go install github.com/containernetworking/cni/cnitool@v1.3.1)",
        )
}

/// A daemon, a CNI_PATH (the plugin, then the reference plugins) and a network config dir.
struct Lab {
    n: u8,
    dir: TempDir,
    daemon: Option<DaemonChild>,
    daemon_text: String,
    control: PathBuf,
    cni_path: String,
    netconf: PathBuf,
    ipam_dir: PathBuf,
    namespaces: Vec<Netns>,
}

impl Lab {
    fn new(n: u8, extra_ports: &str) -> Lab {
        Lab::with(n, &qswitch_test_support::worker_cpus(1), extra_ports)
    }

    /// [`Lab::new`] with the daemon's workers on `workers`.
    fn with(n: u8, workers: &str, extra_ports: &str) -> Lab {
        let dir = TempDir::new(&format!("cni{n}"));
        let control = dir.join("control.sock");
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(PLUGIN, bin.join("qswitch-cni")).unwrap();
        let netconf = dir.join("net.d");
        std::fs::create_dir_all(&netconf).unwrap();
        let daemon_text = format!(
            "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\n{extra_ports}",
            control.display()
        );
        let daemon = DaemonChild::start(dir.path(), "qswitch", &daemon_text, &control);
        Lab {
            n,
            ipam_dir: dir.join("ipam"),
            cni_path: format!("{}:{REFERENCE}", bin.display()),
            dir,
            daemon: Some(daemon),
            daemon_text,
            control,
            netconf,
            namespaces: Vec::new(),
        }
    }

    fn network(&self) -> String {
        format!("qscni{}-{}", std::process::id(), self.n)
    }

    /// Our plugin's entry: `extra` keys merged over the defaults.
    fn plugin(&self, extra: Value) -> Value {
        let mut p = json!({
            "type": "qswitch-cni",
            "control": self.control,
            "ipam": {
                "type": "host-local",
                "dataDir": self.ipam_dir,
                "ranges": [[{ "subnet": format!("10.202.{}.0/24", self.n) }]]
            }
        });
        for (k, v) in extra.as_object().expect("object") {
            p[k] = v.clone();
        }
        p
    }

    /// Writes a conflist for cnitool.
    fn conflist(&self, version: &str, plugins: Vec<Value>) {
        let list = json!({ "cniVersion": version, "name": self.network(), "plugins": plugins });
        std::fs::write(
            self.netconf.join(format!("{}.conflist", self.network())),
            list.to_string(),
        )
        .unwrap();
    }

    fn netns(&mut self, tag: impl std::fmt::Display) -> PathBuf {
        let ns = Netns::new(&format!("{}{tag}", self.network()));
        let path = PathBuf::from("/run/netns").join(&ns.name);
        self.namespaces.push(ns);
        path
    }

    fn ns(&self, i: usize) -> &Netns {
        &self.namespaces[i]
    }

    fn cnitool(&self, args: &[&str]) -> Out {
        run_timeout(
            Command::new("cnitool")
                .args(args)
                .env("CNI_PATH", &self.cni_path)
                .env("NETCONFPATH", &self.netconf),
            Duration::from_secs(60),
        )
    }

    /// Runs the plugin as a runtime does: `CNI_*` from `env`, `conf` on stdin.
    fn exec(&self, env: &[(&str, &str)], conf: &Value) -> (Option<i32>, Value, String) {
        let mut cmd = Command::new(PLUGIN);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("CNI_PATH", &self.cni_path)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run qswitch-cni");
        // A plugin that refuses its environment exits without reading stdin.
        let _ = child
            .stdin
            .take()
            .unwrap()
            .write_all(conf.to_string().as_bytes());
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let v = serde_json::from_str(&stdout).unwrap_or(Value::Null);
        (
            out.status.code(),
            v,
            format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
        )
    }

    /// `CNI_COMMAND` and the attachment of container `id` in `netns`.
    fn env<'a>(command: &'a str, id: &'a str, netns: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", id),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
        ]
    }

    /// The plugin's config for a direct run: `version`, the network's name.
    fn conf(&self, version: &str, extra: Value) -> Value {
        let mut c = self.plugin(extra);
        c["cniVersion"] = json!(version);
        c["name"] = json!(self.network());
        c
    }

    fn ports(&self) -> Vec<Value> {
        qs_json(&self.control, &["port", "list", "--json"])
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// host-local's leases: the files of the network's store but its lock and bookmark.
    fn leases(&self) -> Vec<String> {
        std::fs::read_dir(self.ipam_dir.join(self.network()))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|f| f != "lock" && !f.starts_with("last_reserved_ip"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Host links the plugin made (`qsc…`) that still exist.
    fn host_links(&self) -> Vec<String> {
        std::fs::read_dir("/sys/class/net")
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .filter(|n| n.starts_with("qsc"))
            .filter(|n| {
                // Only this lab's: their ports are (or were) in this daemon.
                self.ports().iter().any(|p| p["ifname"] == n.as_str()) || self.made(n)
            })
            .collect()
    }

    fn made(&self, link: &str) -> bool {
        std::fs::read_to_string(self.dir.join("links"))
            .unwrap_or_default()
            .lines()
            .any(|l| l == link)
    }

    /// Notes a host link the plugin made, so the checks (and the cleanup) know it.
    fn note(&self, result: &Value) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("links"))
            .unwrap();
        for i in result["interfaces"].as_array().into_iter().flatten() {
            if i.get("sandbox").is_none_or(|s| s.as_str() == Some("")) {
                writeln!(f, "{}", i["name"].as_str().unwrap_or_default()).unwrap();
            }
        }
    }

    fn restart_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.terminate(Duration::from_secs(10));
        }
        self.daemon = Some(DaemonChild::start(
            self.dir.path(),
            "qswitch",
            &self.daemon_text,
            &self.control,
        ));
    }

    fn stop_daemon(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            d.terminate(Duration::from_secs(10));
        }
    }

    /// The first address (without its length) of `eth0` in namespace `i`.
    fn addr(&self, i: usize) -> String {
        let out = self
            .ns(i)
            .ok(&["ip", "-j", "-4", "addr", "show", "dev", "eth0"]);
        let v: Value = serde_json::from_str(&out.stdout).unwrap();
        v[0]["addr_info"][0]["local"]
            .as_str()
            .expect("an IPv4 address")
            .to_string()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Whatever a failed test left: the plugin's host veths (their container ends go with
        // them, and with the namespaces).
        for l in std::fs::read_to_string(self.dir.join("links"))
            .unwrap_or_default()
            .lines()
        {
            let _ = Command::new("ip")
                .args(["link", "del", "dev", l])
                .stderr(Stdio::null())
                .status();
        }
        for f in std::fs::read_dir("/var/lib/cni/results")
            .into_iter()
            .flatten()
            .flatten()
        {
            if f.file_name().to_string_lossy().starts_with(&self.network()) {
                let _ = std::fs::remove_file(f.path());
            }
        }
    }
}

/// Nothing of the network left: no ports, no host veths, no leases.
fn assert_clean(lab: &Lab) {
    let owned: Vec<Value> = lab
        .ports()
        .into_iter()
        .filter(|p| p["owner"]["cni"] == lab.network().as_str())
        .collect();
    assert!(owned.is_empty(), "ports left: {owned:?}");
    assert!(
        lab.host_links().is_empty(),
        "links left: {:?}",
        lab.host_links()
    );
    assert!(lab.leases().is_empty(), "leases left: {:?}", lab.leases());
}

#[test]
fn cnitool_two_pods_ping_tcp_check_status_del() {
    if !can_run() {
        return;
    }
    let mut lab = Lab::new(1, "");
    lab.conflist(
        "1.1.0",
        vec![
            lab.plugin(json!({ "vlan": 10, "mtu": 1400, "port_security": true,
                                "qos": { "max": "5G" } })),
        ],
    );
    let net = lab.network();
    let mut results = Vec::new();
    for tag in ['a', 'b'] {
        let ns = lab.netns(tag);
        let out = lab.cnitool(&["add", &net, ns.to_str().unwrap()]);
        assert!(out.ok(), "cnitool add: {out:?}");
        let r: Value = serde_json::from_str(&out.stdout).expect("result JSON");
        lab.note(&r);
        assert_eq!(r["cniVersion"], "1.1.0", "{r}");
        assert_eq!(r["interfaces"][1]["name"], "eth0", "{r}");
        assert_eq!(r["interfaces"][1]["sandbox"], ns.to_str().unwrap(), "{r}");
        assert_eq!(r["interfaces"][1]["mtu"], 1400, "{r}");
        assert_eq!(r["ips"][0]["interface"], 1, "{r}");
        results.push(r);
    }
    // The ports: one per pod, with the VLAN, QoS, the pod's MAC and address as the only
    // allowed sources, and the attachment as owner.
    let ports = lab.ports();
    assert_eq!(ports.len(), 2, "{ports:?}");
    for (p, r) in ports.iter().zip(&results) {
        assert_eq!(p["type"], "veth");
        assert_eq!(p["vlan"], 10);
        assert_eq!(p["owner"]["cni"], net.as_str());
        assert_eq!(p["owner"]["ifname"], "eth0");
        assert_eq!(p["security"]["macs"][0], r["interfaces"][1]["mac"], "{p}");
        let addr = r["ips"][0]["address"].as_str().unwrap();
        let host = format!("{}/32", addr.split('/').next().unwrap());
        assert_eq!(p["security"]["ips"][0], host.as_str(), "{p}");
    }
    let text = qswitch_test_support::qs(&lab.control, &["port", "list"]);
    assert!(
        text.stdout.contains(&format!("cni: network {net}")),
        "{}",
        text.stdout
    );
    // Traffic through qswitch: ping, then a TCP stream.
    let b = lab.addr(1);
    let ping = lab
        .ns(0)
        .run(&["ping", "-c", "3", "-i", "0.2", "-W", "2", &b]);
    assert!(ping.ok(), "ping {b}: {ping:?}");
    let tcp = tcp_stream(&lab, &b);
    assert!(tcp.ok(), "TCP: {tcp:?}");
    let stats = lab.daemon.as_ref().unwrap().stats();
    let names = port_names(&lab.control);
    let through: u64 = names
        .iter()
        .map(|p| counter(&stats, p, "rx_packets") + counter(&stats, p, "fastpath_rx_packets"))
        .sum();
    assert!(through > 0, "nothing through qswitch: {stats}");
    for tag in ['a', 'b'] {
        let ns = format!("/run/netns/{net}{tag}");
        let out = lab.cnitool(&["check", &net, &ns]);
        assert!(out.ok(), "cnitool check: {out:?}");
    }
    let st = lab.cnitool(&["status", &net, "/run/netns/none"]);
    assert!(st.ok(), "cnitool status: {st:?}");
    // CHECK notices a pod that lost its address.
    lab.ns(0).ok(&["ip", "addr", "flush", "dev", "eth0"]);
    let out = lab.cnitool(&["check", &net, &format!("/run/netns/{net}a")]);
    assert!(!out.ok() && out.stderr.contains("lacks address"), "{out:?}");
    for tag in ['a', 'b'] {
        let ns = format!("/run/netns/{net}{tag}");
        let out = lab.cnitool(&["del", &net, &ns]);
        assert!(out.ok(), "cnitool del: {out:?}");
        // DEL again: nothing there, still fine.
        let out = lab.cnitool(&["del", &net, &ns]);
        assert!(out.ok(), "cnitool del again: {out:?}");
    }
    assert_clean(&lab);
    for i in 0..2 {
        let links = lab.ns(i).ok(&["ip", "-o", "link"]).stdout;
        assert!(
            !links.contains("eth0"),
            "eth0 left in the namespace: {links}"
        );
    }
}

/// A bounded TCP stream from namespace 0 to `addr` in namespace 1: iperf3 for 2 s.
fn tcp_stream(lab: &Lab, addr: &str) -> Out {
    let log = lab.dir.join("iperf3-server.log");
    let _server = lab.ns(1).spawn(&["iperf3", "-s", "-1", "-B", addr], &log);
    let port_open = wait_until(Duration::from_secs(5), || {
        lab.ns(1)
            .run(&["ss", "-Hltn", "sport", "= :5201"])
            .stdout
            .contains("5201")
    });
    assert!(port_open, "iperf3 server did not listen");
    lab.ns(0)
        .run_for(&["iperf3", "-c", addr, "-t", "2"], Duration::from_secs(30))
}

#[test]
fn chained_tuning_gets_our_result() {
    if !can_run() {
        return;
    }
    let mut lab = Lab::new(2, "");
    // Debian's tuning (1.1.1) speaks up to 1.0.0.
    lab.conflist(
        "1.0.0",
        vec![
            lab.plugin(json!({})),
            json!({ "type": "tuning", "sysctl": { "net.ipv4.conf.eth0.arp_ignore": "1" } }),
        ],
    );
    let net = lab.network();
    let ns = lab.netns('a');
    let out = lab.cnitool(&["add", &net, ns.to_str().unwrap()]);
    assert!(out.ok(), "cnitool add: {out:?}");
    let r: Value = serde_json::from_str(&out.stdout).expect("result JSON");
    lab.note(&r);
    // tuning's result is the prevResult it got, so ours came through it...
    assert_eq!(r["interfaces"][1]["name"], "eth0", "{r}");
    assert!(
        r["interfaces"][0]["name"]
            .as_str()
            .unwrap()
            .starts_with("qsc"),
        "{r}"
    );
    // ...and it applied its sysctl to our interface.
    let v = lab
        .ns(0)
        .ok(&["sysctl", "-n", "net.ipv4.conf.eth0.arp_ignore"]);
    assert_eq!(v.stdout.trim(), "1");
    let out = lab.cnitool(&["check", &net, ns.to_str().unwrap()]);
    assert!(out.ok(), "cnitool check: {out:?}");
    let out = lab.cnitool(&["del", &net, ns.to_str().unwrap()]);
    assert!(out.ok(), "cnitool del: {out:?}");
    assert_clean(&lab);
}

#[test]
fn every_version_add_check_del_and_errors() {
    if !can_run() {
        return;
    }
    let mut lab = Lab::new(3, "");
    for (i, version) in ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
        .iter()
        .enumerate()
    {
        let ns = lab.netns(i);
        let ns = ns.to_str().unwrap().to_string();
        let id = format!("c{}-{i}", std::process::id());
        let conf = lab.conf(version, json!({}));
        let (code, r, log) = lab.exec(&Lab::env("ADD", &id, &ns), &conf);
        assert_eq!(code, Some(0), "{version} ADD: {log}");
        lab.note(&r);
        assert_eq!(r["cniVersion"], *version, "{r}");
        let ip = &r["ips"][0];
        // 0.3.x and 0.4.0 results carry the address family, 1.x ones do not.
        if version.starts_with('0') {
            assert_eq!(ip["version"], "4", "{version}: {r}");
        } else {
            assert!(ip.get("version").is_none(), "{version}: {r}");
        }
        let mut with_prev = conf.clone();
        with_prev["prevResult"] = r.clone();
        let (code, _, log) = lab.exec(&Lab::env("CHECK", &id, &ns), &with_prev);
        if *version < "0.4.0" {
            assert_eq!(
                code,
                Some(1),
                "{version}: CHECK is not in this version: {log}"
            );
            let v: Value = serde_json::from_str(log.lines().next().unwrap()).unwrap();
            assert_eq!(v["code"], 1, "{log}");
        } else {
            assert_eq!(code, Some(0), "{version} CHECK: {log}");
        }
        let del_conf = if *version >= "0.4.0" {
            &with_prev
        } else {
            &conf
        };
        let (code, _, log) = lab.exec(&Lab::env("DEL", &id, &ns), del_conf);
        assert_eq!(code, Some(0), "{version} DEL: {log}");
    }
    assert_clean(&lab);
    // VERSION lists them all.
    let (code, v, _) = lab.exec(
        &[("CNI_COMMAND", "VERSION")],
        &json!({"cniVersion": "1.0.0"}),
    );
    assert_eq!(code, Some(0));
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
    // Errors, with the spec's codes.
    let ns = lab.namespaces[0].name.clone();
    let ns = format!("/run/netns/{ns}");
    let add = Lab::env("ADD", "cx", &ns);
    for (conf, code, what) in [
        (lab.conf("0.2.0", json!({})), 1, "an unknown version"),
        (lab.conf("2.0.0", json!({})), 1, "a future version"),
        (
            lab.conf("1.1.0", json!({ "vlan": "ten" })),
            7,
            "vlan of the wrong type",
        ),
        (
            lab.conf("1.1.0", json!({ "vlan": 4095 })),
            7,
            "vlan out of range",
        ),
        (
            lab.conf("1.1.0", json!({ "mode": "macvlan" })),
            7,
            "an unknown mode",
        ),
        (
            lab.conf("1.1.0", json!({ "qos": { "max": "lots" } })),
            7,
            "a bad rate",
        ),
    ] {
        let (c, v, log) = lab.exec(&add, &conf);
        assert_eq!(c, Some(1), "{what}: {log}");
        assert_eq!(v["code"], code, "{what}: {log}");
        assert!(
            !v["details"].as_str().unwrap_or_default().is_empty(),
            "{what}: {log}"
        );
    }
    let (_, v, log) = lab.exec(&[("CNI_COMMAND", "ADD")], &lab.conf("1.1.0", json!({})));
    assert_eq!(v["code"], 4, "no CNI_CONTAINERID: {log}");
    assert!(
        v["details"].as_str().unwrap().contains("CNI_CONTAINERID"),
        "{log}"
    );
    let (_, v, log) = lab.exec(&[("CNI_COMMAND", "FROB")], &json!({}));
    assert_eq!(v["code"], 4, "{log}");
    let mut bad = Command::new(PLUGIN);
    bad.env("CNI_COMMAND", "ADD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = bad.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"{not json").unwrap();
    let out = child.wait_with_output().unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], 6, "{v}");
    // The veth config's mtu would go nowhere on a vhost-user port.
    let (_, v, log) = lab.exec(
        &add,
        &lab.conf("1.1.0", json!({"mode": "vhost-user", "mtu": 9000})),
    );
    assert_eq!(v["code"], 7, "{log}");
    assert_clean(&lab);
}

#[test]
fn daemon_down_restarted_and_gc() {
    if !can_run() {
        return;
    }
    let mut lab = Lab::new(4, "");
    let a = lab.netns('a').to_str().unwrap().to_string();
    let b = lab.netns('b').to_str().unwrap().to_string();
    let conf = lab.conf("1.1.0", json!({}));
    let pid = std::process::id();
    let (ida, idb) = (format!("ca{pid}"), format!("cb{pid}"));
    // The daemon down: ADD says "try again later" and leaves nothing behind.
    lab.stop_daemon();
    let (code, v, log) = lab.exec(&Lab::env("ADD", &ida, &a), &conf);
    assert_eq!((code, v["code"].as_u64()), (Some(1), Some(11)), "{log}");
    assert!(
        v["msg"].as_str().unwrap().contains("try again later"),
        "{log}"
    );
    assert!(lab.leases().is_empty(), "{:?}", lab.leases());
    let (code, v, log) = lab.exec(&[("CNI_COMMAND", "STATUS")], &conf);
    assert_eq!((code, v["code"].as_u64()), (Some(1), Some(50)), "{log}");
    lab.restart_daemon();
    let (code, _, log) = lab.exec(&[("CNI_COMMAND", "STATUS")], &conf);
    assert_eq!(code, Some(0), "{log}");
    for (id, ns) in [(&ida, &a), (&idb, &b)] {
        let (code, r, log) = lab.exec(&Lab::env("ADD", id, ns), &conf);
        assert_eq!(code, Some(0), "ADD: {log}");
        lab.note(&r);
    }
    // A repeated ADD for an attachment that is there: refused, no second port.
    let (code, v, log) = lab.exec(&Lab::env("ADD", &ida, &a), &conf);
    assert_eq!((code, v["code"].as_u64()), (Some(1), Some(100)), "{log}");
    assert_eq!(lab.ports().len(), 2);
    // Restarted between ADD and DEL: the ports came back from the state dir, owner and all.
    lab.restart_daemon();
    let ports = lab.ports();
    assert_eq!(ports.len(), 2, "{ports:?}");
    let owners: BTreeSet<String> = ports
        .iter()
        .map(|p| p["owner"]["container"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(owners, BTreeSet::from([ida.clone(), idb.clone()]));
    let dump = qswitch_test_support::qs(&lab.control, &["config", "dump"]);
    assert!(
        dump.stdout.contains(&format!("container = \"{ida}\"")),
        "{}",
        dump.stdout
    );
    // GC with only a valid: b's port, veth and lease go; a stays.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([{ "containerID": ida, "ifname": "eth0" }]);
    let (code, _, log) = lab.exec(&[("CNI_COMMAND", "GC")], &gc);
    assert_eq!(code, Some(0), "GC: {log}");
    let ports = lab.ports();
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["owner"]["container"], ida.as_str());
    assert_eq!(lab.leases().len(), 1, "{:?}", lab.leases());
    let bl = lab.ns(1).run(&["ip", "link", "show", "eth0"]);
    assert!(!bl.ok(), "b's eth0 survived GC: {bl:?}");
    let (code, _, log) = lab.exec(&Lab::env("DEL", &ida, &a), &conf);
    assert_eq!(code, Some(0), "DEL: {log}");
    assert_clean(&lab);
}

#[test]
fn vhost_user_port_passes_testpmd_traffic() {
    if !can_run() {
        return;
    }
    let Some(worker) = qswitch_test_support::testpmd_worker_cpu() else {
        return;
    };
    let mut lab = Lab::with(
        5,
        &worker.to_string(),
        "[[port]]\nname = \"sink\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\n",
    );
    let sockets = lab.dir.join("vhost");
    let conf = lab.conf(
        "1.1.0",
        json!({ "mode": "vhost-user", "socket_dir": sockets, "queues": 2 }),
    );
    let ns = lab.netns('a').to_str().unwrap().to_string();
    let id = format!("vm{}", std::process::id());
    let (code, r, log) = lab.exec(&Lab::env("ADD", &id, &ns), &conf);
    assert_eq!(code, Some(0), "ADD: {log}");
    let socket = r["interfaces"][0]["socketPath"]
        .as_str()
        .expect("socketPath")
        .to_string();
    assert!(socket.starts_with(sockets.to_str().unwrap()), "{r}");
    assert!(wait_until(Duration::from_secs(5), || Path::new(&socket).exists()));
    let port = lab
        .ports()
        .into_iter()
        .find(|p| p["type"] == "vhost-user")
        .expect("port");
    let name = port["name"].as_str().unwrap().to_string();
    // testpmd as the pod's DPDK application: virtio-user on the socket, txonly.
    let prefix = format!("qsw-cni-{}", std::process::id());
    let log = lab.dir.join("testpmd.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(qswitch_test_support::TESTPMD)
        .args(["--no-huge", "-m", "1024", "--no-pci", "--iova-mode=va"])
        .args([
            "--file-prefix",
            &prefix,
            "--lcores",
            "0@0,1@0",
            "--main-lcore",
            "0",
        ])
        .args([
            "--vdev",
            &format!("net_virtio_user0,path={socket},queues=2"),
            "--",
        ])
        // --stats-period: testpmd runs until SIGINT instead of reading Enter from stdin.
        .args([
            "--nb-cores=1",
            "--stats-period",
            "1",
            "-a",
            "--forward-mode=txonly",
            "--rxq=2",
            "--txq=2",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .expect("start dpdk-testpmd");
    let mut pmd = qswitch_test_support::ChildGuard::new(child);
    let daemon = lab.daemon.as_ref().unwrap();
    let sink = |s: &Value| {
        qswitch_test_support::port_stats(s, "sink")["sink"]["foreign"]
            .as_u64()
            .unwrap_or(0)
    };
    let passed = wait_until(Duration::from_secs(20), || sink(&daemon.stats()) > 10_000);
    let stats = daemon.stats();
    pmd.stop();
    let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&prefix));
    assert!(
        passed,
        "testpmd's frames did not reach the sink: {} {stats}\n{}",
        counter(&stats, &name, "rx_packets"),
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let mut with_prev = conf.clone();
    with_prev["prevResult"] = r.clone();
    let (code, _, log) = lab.exec(&Lab::env("CHECK", &id, &ns), &with_prev);
    assert_eq!(code, Some(0), "CHECK: {log}");
    let (code, _, log) = lab.exec(&Lab::env("DEL", &id, &ns), &with_prev);
    assert_eq!(code, Some(0), "DEL: {log}");
    assert!(!Path::new(&socket).exists(), "{socket} left");
    assert_clean(&lab);
}

/// ADD latency: 100 sequential ADDs (veth, host-local, port security) of containers in one
/// namespace each, median and p99. A measurement, not a check: run it on a quiet machine with
/// `cargo test --release -p qswitch-cni --test cni -- --ignored --nocapture add_latency`.
#[test]
#[ignore]
fn add_latency() {
    if !can_run() {
        return;
    }
    let mut lab = Lab::new(6, "");
    let conf = lab.conf("1.1.0", json!({ "port_security": true }));
    let mut times = Vec::new();
    let mut added = Vec::new();
    for i in 0..100u32 {
        let ns = lab.netns(format!("l{i}"));
        let ns = ns.to_str().unwrap().to_string();
        let id = format!("lat{}-{i}", std::process::id());
        let t = Instant::now();
        let (code, r, log) = lab.exec(&Lab::env("ADD", &id, &ns), &conf);
        times.push(t.elapsed());
        assert_eq!(code, Some(0), "ADD {i}: {log}");
        lab.note(&r);
        added.push((id, ns));
    }
    for (id, ns) in &added {
        let (code, _, log) = lab.exec(&Lab::env("DEL", id, ns), &conf);
        assert_eq!(code, Some(0), "DEL: {log}");
    }
    times.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "ADD latency over {} ADDs: median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        times.len(),
        ms(times[times.len() / 2]),
        ms(times[times.len() * 99 / 100]),
        ms(times[times.len() - 1])
    );
    assert_clean(&lab);
}

/// DHCP as the IPAM (the reference `dhcp` plugin and its daemon, dnsmasq as the server in a
/// namespace behind a veth port of the same qswitch): the pod's interface and port come
/// first, the lease through qswitch, then the address; port security ends up with the
/// leased address.
#[test]
fn dhcp_ipam_leases_through_qswitch() {
    if !can_run()
        || !require(
            qswitch_test_support::have_tool("dnsmasq", &["--version"]),
            "no dnsmasq (apt-get install dnsmasq-base)",
        )
    {
        return;
    }
    let pid = std::process::id();
    let srv_link = format!("qsd{}", pid % 100_000);
    let srv = Netns::new(&format!("qscni{pid}-7srv"));
    qswitch_test_support::sh_ok(&[
        "ip", "link", "add", &srv_link, "type", "veth", "peer", "name", "eth0", "netns", &srv.name,
    ]);
    let _srv_link = qswitch_test_support::LinkGuard(srv_link.clone());
    srv.ok(&["ip", "addr", "add", "10.202.7.1/24", "dev", "eth0"]);
    srv.ok(&["ip", "link", "set", "eth0", "up"]);
    let mut lab = Lab::new(
        7,
        &format!("[[port]]\nname = \"dhcpd\"\ntype = \"veth\"\nifname = \"{srv_link}\"\n"),
    );
    let leases = lab.dir.join("dnsmasq.leases");
    let _dnsmasq = srv.spawn(
        &[
            "dnsmasq",
            "--no-daemon",
            "--conf-file=/dev/null",
            "--port=0",
            "--user=root",
            "--interface=eth0",
            "--bind-interfaces",
            "--dhcp-range=10.202.7.50,10.202.7.60,255.255.255.0,10m",
            &format!("--dhcp-leasefile={}", leases.display()),
            "--pid-file=",
        ],
        &lab.dir.join("dnsmasq.log"),
    );
    let sock = lab.dir.join("dhcp.sock");
    let daemon = Command::new(Path::new(REFERENCE).join("dhcp"))
        .args(["daemon", "-socketpath"])
        .arg(&sock)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            std::fs::File::create(lab.dir.join("dhcp-daemon.log")).unwrap(),
        ))
        .spawn()
        .expect("start the CNI dhcp daemon");
    let _dhcp_daemon = qswitch_test_support::ChildGuard::new(daemon);
    assert!(
        wait_until(Duration::from_secs(10), || sock.exists()),
        "no dhcp daemon socket"
    );
    let conf = lab.conf(
        "1.0.0",
        json!({ "port_security": true,
                "ipam": { "type": "dhcp", "daemonSocketPath": sock } }),
    );
    let ns = lab.netns('a').to_str().unwrap().to_string();
    let id = format!("dh{pid}");
    let (code, r, log) = lab.exec(&Lab::env("ADD", &id, &ns), &conf);
    lab.note(&r);
    assert_eq!(
        code,
        Some(0),
        "ADD: {log}\n{}",
        std::fs::read_to_string(lab.dir.join("dhcp-daemon.log")).unwrap_or_default()
    );
    let addr = r["ips"][0]["address"]
        .as_str()
        .expect("an address")
        .to_string();
    assert!(
        addr.starts_with("10.202.7.5") || addr.starts_with("10.202.7.60"),
        "{r}"
    );
    let ping = lab
        .ns(0)
        .run(&["ping", "-c", "2", "-i", "0.2", "-W", "2", "10.202.7.1"]);
    assert!(ping.ok(), "ping the DHCP server: {ping:?}");
    let port = lab
        .ports()
        .into_iter()
        .find(|p| p["owner"]["container"] == id.as_str())
        .expect("the pod's port");
    let host = format!("{}/32", addr.split('/').next().unwrap());
    assert_eq!(port["security"]["ips"], json!([host]), "{port}");
    let (code, _, log) = lab.exec(&Lab::env("DEL", &id, &ns), &conf);
    assert_eq!(code, Some(0), "DEL: {log}");
    assert_clean(&lab);
}

/// The reference `static` IPAM: IPv4 and IPv6 addresses with gateways and routes, set in the
/// namespace as the result says; port security takes both addresses and the link-local
/// prefix.
#[test]
fn static_ipam_addresses_and_routes_v4_v6() {
    if !can_run() {
        return;
    }
    let mut lab = Lab::new(8, "");
    let conf = lab.conf(
        "1.1.0",
        json!({ "port_security": true, "mtu": 1400,
                "ipam": { "type": "static",
                          "addresses": [
                              { "address": "10.202.8.5/24", "gateway": "10.202.8.1" },
                              { "address": "fd00:202:8::5/64", "gateway": "fd00:202:8::1" } ],
                          "routes": [ { "dst": "0.0.0.0/0" }, { "dst": "fd00:99::/64" } ],
                          "dns": { "nameservers": ["10.202.8.53"] } } }),
    );
    let ns = lab.netns('a').to_str().unwrap().to_string();
    let id = format!("st{}", std::process::id());
    let (code, r, log) = lab.exec(&Lab::env("ADD", &id, &ns), &conf);
    lab.note(&r);
    assert_eq!(code, Some(0), "ADD: {log}");
    assert_eq!(r["ips"].as_array().map(Vec::len), Some(2), "{r}");
    assert_eq!(r["dns"]["nameservers"][0], "10.202.8.53", "{r}");
    let routes4 = lab
        .ns(0)
        .ok(&["ip", "-4", "route", "show", "default"])
        .stdout;
    assert!(routes4.contains("via 10.202.8.1 dev eth0"), "{routes4}");
    let routes6 = lab
        .ns(0)
        .ok(&["ip", "-6", "route", "show", "fd00:99::/64"])
        .stdout;
    assert!(routes6.contains("via fd00:202:8::1 dev eth0"), "{routes6}");
    let addrs = lab
        .ns(0)
        .ok(&["ip", "-o", "addr", "show", "dev", "eth0"])
        .stdout;
    // Usable at once: no duplicate address detection to wait for.
    let global = addrs.lines().find(|l| l.contains("fd00:202:8::5/64"));
    assert!(global.is_some_and(|l| !l.contains("tentative")), "{addrs}");
    assert!(lab
        .ns(0)
        .ok(&["ip", "link", "show", "eth0"])
        .stdout
        .contains("mtu 1400"));
    let port = lab.ports().into_iter().next().expect("the port");
    assert_eq!(
        port["security"]["ips"],
        json!(["10.202.8.5/32", "fd00:202:8::5/128", "fe80::/64"]),
        "{port}"
    );
    let mut with_prev = conf.clone();
    with_prev["prevResult"] = r.clone();
    let (code, _, log) = lab.exec(&Lab::env("CHECK", &id, &ns), &with_prev);
    assert_eq!(code, Some(0), "CHECK: {log}");
    let (code, _, log) = lab.exec(&Lab::env("DEL", &id, &ns), &with_prev);
    assert_eq!(code, Some(0), "DEL: {log}");
    assert_clean(&lab);
}
