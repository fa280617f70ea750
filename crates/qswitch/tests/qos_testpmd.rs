//! A minimum guarantee on a vhost-user port fed by DPDK testpmd (virtio-user, txonly, as fast
//! as it can) holds while a gen port floods toward the same uplink. Root only; installs
//! `dpdk-dev` when `dpdk-testpmd` is missing (as `testpmd.rs` does), skipped if that fails
//! (a failure under `QSWITCH_REQUIRE_PRIVILEGED=1`).

mod common;

use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{qs, qs_json, wait_until, ChildGuard, DaemonChild, TempDir, TESTPMD};
use serde_json::Value;

/// Median of the last 3 one-second rates of `name`, Mbit/s.
fn mbps(show: &Value, name: &str) -> f64 {
    let p = show["ports"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("no {name}: {show}"));
    let mut h: Vec<f64> = p["history"]
        .as_array()
        .expect("history")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let mut last = h.split_off(h.len().saturating_sub(3));
    last.sort_by(f64::total_cmp);
    last.get(last.len() / 2).copied().unwrap_or(0.0) / 1e6
}

#[test]
fn testpmd_guarantee_holds_while_gen_floods() {
    let Some(worker) = common::testpmd_worker_cpu() else {
        return;
    };
    let dir = TempDir::new("qos-testpmd");
    let sock = dir.join("vm1.sock");
    let control = dir.join("control.sock");
    let text = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"up\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:10\"\ncapacity = \"500M\"\n\
         [[port]]\nname = \"flood\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\n\
         generate = {{ dst = \"02:00:00:00:00:10\", size = 1514, rate = 0 }}\n\
         [[port]]\nname = \"vm1\"\ntype = \"vhost-user\"\nsocket = \"{}\"\nmode = \"server\"\n\
         qos = {{ min = \"300M\" }}\n",
        worker,
        control.display(),
        sock.display()
    );
    let _d = DaemonChild::start(dir.path(), "qs", &text, &control);
    assert!(
        wait_until(Duration::from_secs(5), || sock.exists()),
        "no socket"
    );
    let prefix = format!("qsw-qos-{}", std::process::id());
    let log = dir.join("testpmd.log");
    let out = File::create(&log).expect("log");
    let mut pmd = ChildGuard::new(
        Command::new(TESTPMD)
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
                &format!("net_virtio_user0,path={}", sock.display()),
            ])
            .args([
                "--",
                "--nb-cores=1",
                // Without a stats period testpmd's main lcore spins on its prompt and
                // starves the forwarding lcore that shares CPU 0 with it.
                "--stats-period",
                "1",
                "-a",
                "--forward-mode=txonly",
                "--txpkts=1514",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::from(out.try_clone().expect("log")))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("start dpdk-testpmd"),
    );
    // Up to 20 s for the guarantee to show: testpmd's start-up and a busy machine.
    let mut r = (0.0, 0.0);
    let ok = wait_until(Duration::from_secs(20), || {
        std::thread::sleep(Duration::from_millis(500));
        let show = qs_json(&control, &["qos", "show", "--json"]);
        r = (mbps(&show, "vm1"), mbps(&show, "flood"));
        r.0 >= 0.95 * 300.0 && r.1 >= 0.9 * 200.0 && r.0 + r.1 <= 1.02 * 500.0
    });
    let table = qs(&control, &["qos", "show"]).stdout;
    if !ok {
        eprintln!(
            "{}\n{}",
            qs(&control, &["port", "list"]).stdout,
            qs(&control, &["stats"]).stdout
        );
    }
    pmd.stop();
    let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&prefix));
    eprintln!(
        "testpmd vm1 (min 300M) {:.1} Mbit/s, gen flood {:.1} Mbit/s\n{table}",
        r.0, r.1
    );
    assert!(
        ok,
        "vm1 {:.1} flood {:.1}: {}",
        r.0,
        r.1,
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}
