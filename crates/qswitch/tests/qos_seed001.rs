//! The seed-001 port-QoS scenario (root): six iperf3 TCP senders through TAP ports share a
//! 1 Gbit/s uplink through seven steps of live `qos set` changes (`qswitch bench qos`). Alone
//! in its test binary, so no other test of this crate competes with it for the CPUs.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{run_timeout, TempDir, QSWITCH};
use serde_json::Value;

/// The seed-001 scenario (see `qswitch bench qos`): six TCP senders, 1 Gbit/s uplink, seven
/// steps; every guarantee ≥ 95% met, every limit within 102%, every port ≥ 90% of its
/// allocation, link ≥ 95% used; the over-reservation at step 6 refused.
#[test]
fn seed001_scenario() {
    if !common::root_or_skip() {
        return;
    }
    // A machine busy with other work (a parallel build) can starve the senders; the
    // scenario then gets one more try, and each attempt's result is printed.
    let secs = std::env::var("QSWITCH_QOS_SECS").unwrap_or_else(|_| "8".into());
    let mut last = String::new();
    for attempt in 1..=2 {
        let dir = TempDir::new(&format!("qos-seed001-{attempt}"));
        let out = run_timeout(
            Command::new(QSWITCH)
                .args(["bench", "qos", "--seconds", &secs, "--out"])
                .arg(dir.path())
                .env("RUST_BACKTRACE", "1"),
            Duration::from_secs(240),
        );
        eprintln!("attempt {attempt}:\n{}", out.stdout);
        out.assert_no_panic();
        let json: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("qos.json")).expect("qos.json written"),
        )
        .expect("qos.json parses");
        assert!(dir.join("qos.svg").exists() && dir.join("qos.csv").exists());
        for s in json["steps"].as_array().expect("steps") {
            eprintln!(
                "step {}: medians {} Mbit/s, expected {}, link {:.0}",
                s["label"],
                s["median_mbps"],
                s["expected_mbps"],
                s["link_mbps"].as_f64().unwrap_or(0.0)
            );
        }
        assert!(
            json["refused"].is_string(),
            "over-reservation not refused: {json}"
        );
        if json["pass"] == true {
            out.assert_ok("qswitch bench qos");
            return;
        }
        last = out.stdout;
    }
    panic!("the seed-001 criteria failed twice; last attempt: {last}");
}
