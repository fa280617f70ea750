//! DPDK testpmd (virtio-user, no hugepages) through a vhost-user port of a `qswitch run`
//! daemon, root only: testpmd txonly → qswitch → gen sink at 64 B and 1518 B frames, and
//! gen → qswitch → testpmd rxonly with two queue pairs. testpmd's lcores share CPU 0, so the
//! qswitch worker gets the second online CPU to itself.

mod common;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{counter, qs_json, wait_until, ChildGuard, DaemonChild, TempDir, TESTPMD};
use serde_json::Value;

/// The second online CPU as the worker list, or `None` (with a skip notice) when the test
/// cannot run.
fn setup() -> Option<String> {
    common::testpmd_worker_cpu().map(|c| c.to_string())
}

/// A running testpmd with its output in a log file; on drop it is stopped and its
/// `/var/run/dpdk/<prefix>` directory removed.
struct Testpmd {
    child: ChildGuard,
    log: PathBuf,
    prefix: String,
}

impl Testpmd {
    /// Starts testpmd on one virtio-user port (`vdev` are the extra vdev arguments).
    fn spawn(dir: &TempDir, tag: &str, vdev: &str, app: &[&str]) -> Testpmd {
        let prefix = format!("qsw-it-{}-{tag}", std::process::id());
        let log = dir.join(&format!("testpmd-{tag}.log"));
        let out = File::create(&log).expect("testpmd log");
        let err = out.try_clone().expect("testpmd log");
        let child = Command::new(TESTPMD)
            .args(["--no-huge", "-m", "1024", "--no-pci", "--iova-mode=va"])
            .args([
                "--file-prefix",
                &prefix,
                "--lcores",
                "0@0,1@0",
                "--main-lcore",
                "0",
            ])
            .args(["--vdev", &format!("net_virtio_user0,{vdev}"), "--"])
            .args(["--nb-cores=1", "--stats-period", "1", "-a"])
            .args(app)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .expect("start dpdk-testpmd");
        Testpmd {
            child: ChildGuard::new(child),
            log,
            prefix,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGINT (testpmd prints its final statistics) and waits up to 15 s for the exit.
    fn finish(&mut self) -> String {
        common::signal(self.child.pid(), "INT");
        let st = self.child.wait_timeout(Duration::from_secs(15));
        let log = self.log_text();
        assert!(st.is_some(), "testpmd did not exit on SIGINT: {log}");
        log
    }
}

impl Drop for Testpmd {
    fn drop(&mut self) {
        self.child.stop();
        let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&self.prefix));
    }
}

/// The largest "RX-packets: N" in testpmd's output (its final statistics).
fn rx_packets(log: &str) -> u64 {
    log.split("RX-packets:")
        .skip(1)
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

fn config(dir: &TempDir, worker: &str, ports: &str) -> String {
    format!(
        "[switch]\nworkers = \"{worker}\"\ncontrol = \"{}\"\n{ports}",
        dir.join("control.sock").display()
    )
}

fn vhost_port(sock: &Path, mode: &str) -> String {
    format!(
        "[[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"{mode}\"\n\
         queues = 2\n",
        sock.display()
    )
}

/// The `port list --json` entry of `vm1`.
fn vm1(d: &DaemonChild) -> Value {
    let list = qs_json(&d.control, &["port", "list", "--json"]);
    let ports = list.as_array().expect("port list");
    ports
        .iter()
        .find(|p| p["name"] == "vm1")
        .cloned()
        .expect("vm1")
}

fn enabled(p: &Value) -> Vec<u64> {
    p["enabled_queues"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

#[test]
fn testpmd_txonly_through_qswitch_to_sink() {
    let Some(worker) = setup() else { return };
    let dir = TempDir::new("testpmd-tx");
    let sock = dir.join("vm1.sock");
    let ports = format!(
        "{}[[port]]\nname = \"sink\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\n",
        vhost_port(&sock, "server")
    );
    let d = DaemonChild::start(
        dir.path(),
        "qs",
        &config(&dir, &worker, &ports),
        &dir.join("control.sock"),
    );
    assert!(
        wait_until(Duration::from_secs(5), || sock.exists()),
        "no socket"
    );
    for (len, frame) in [(60, 64), (1514, 1518)] {
        let before = d.stats();
        let vdev = format!("path={},queues=2", sock.display());
        let txpkts = format!("--txpkts={len}");
        let app = ["--forward-mode=txonly", &txpkts, "--rxq=2", "--txq=2"];
        let mut pmd = Testpmd::spawn(&dir, &format!("tx{len}"), &vdev, &app);
        let connected = wait_until(Duration::from_secs(10), || {
            let p = vm1(&d);
            p["connected"] == true && enabled(&p) == [0, 1]
        });
        assert!(
            connected,
            "{frame} B: vm1 not up: {}\n{}",
            vm1(&d),
            pmd.log_text()
        );
        std::thread::sleep(Duration::from_secs(4));
        let log = pmd.finish();
        drop(pmd);
        // Let the last frames drain through the worker.
        std::thread::sleep(Duration::from_millis(300));
        let after = d.stats();
        let foreign = |s: &Value| common::port_stats(s, "sink")["sink"]["foreign"].as_u64();
        let sink = foreign(&after).unwrap_or(0) - foreign(&before).unwrap_or(0);
        let rx = counter(&after, "vm1", "rx_packets") - counter(&before, "vm1", "rx_packets");
        eprintln!("{frame} B: vm1 rx_packets +{rx}, sink foreign +{sink}");
        assert!(sink > 10_000, "{frame} B: sink saw {sink}: {after}\n{log}");
        assert!(rx >= sink, "{frame} B: vm1 rx {rx} < sink {sink}: {after}");
        for p in after["ports"].as_array().expect("ports") {
            assert!(
                p["drops"]["bad_descriptor"].as_u64().unwrap_or(0) == 0,
                "{after}"
            );
        }
    }
}

#[test]
fn gen_through_qswitch_to_testpmd_rxonly_two_queues() {
    let Some(worker) = setup() else { return };
    let dir = TempDir::new("testpmd-rx");
    let sock = dir.join("vm1.sock");
    let vdev = format!("path={},queues=2,server=1", sock.display());
    let app = ["--forward-mode=rxonly", "--rxq=2", "--txq=2"];
    // testpmd's server waits in start-up for qswitch to connect.
    let mut pmd = Testpmd::spawn(&dir, "rx", &vdev, &app);
    let listening = wait_until(Duration::from_secs(10), || sock.exists());
    assert!(listening, "testpmd made no socket: {}", pmd.log_text());
    let ports = format!(
        "{}[[port]]\nname = \"gen\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:01\"\n\
         generate = {{ dst = \"02:00:00:00:00:99\", size = 64, rate = 200000, flows = 8 }}\n",
        vhost_port(&sock, "client")
    );
    let d = DaemonChild::start(
        dir.path(),
        "qs",
        &config(&dir, &worker, &ports),
        &dir.join("control.sock"),
    );
    let mut seen = Value::Null;
    let up = wait_until(Duration::from_secs(15), || {
        seen = vm1(&d);
        seen["connected"] == true && enabled(&seen) == [0, 1]
    });
    assert!(
        up,
        "vm1 not up: {seen}\n{}\n{}",
        pmd.log_text(),
        d.log_text()
    );
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let still = vm1(&d);
    assert!(
        still["connected"] == true && enabled(&still) == [0, 1],
        "{still}"
    );
    let log = pmd.finish();
    let rx = rx_packets(&log);
    let stats = d.stats();
    eprintln!(
        "testpmd RX-packets {rx} in {:?}; gen generated {}, vm1 tx_packets {}",
        t0.elapsed(),
        counter(&stats, "gen", "generated"),
        counter(&stats, "vm1", "tx_packets")
    );
    assert!(rx > 100_000, "testpmd received {rx}: {log}\n{stats}");
    for p in stats["ports"].as_array().expect("ports") {
        assert!(
            p["drops"]["bad_descriptor"].as_u64().unwrap_or(0) == 0,
            "{stats}"
        );
    }
}
