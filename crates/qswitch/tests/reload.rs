//! Reload (SIGHUP and `qswitch reload`): only what changed in the file is applied; traffic
//! between untouched ports goes on without loss or stall; an invalid file changes nothing and
//! says why in one line. Gen ports only: no root needed.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{counter, port_names, port_stats, qs, qs_json, worker_cpus, DaemonChild, TempDir};
use serde_json::Value;

const FRAMES: u64 = 8000;

fn config(dir: &TempDir, control: &Path, q_min: &str, extra: &str) -> String {
    format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\n\
         [[port]]\nname = \"sink\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:02\"\n\
         [[port]]\nname = \"src\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:01\"\n\
         generate = {{ dst = \"02:00:00:00:00:02\", size = 64, rate = 2000, count = {FRAMES} }}\n\
         [[port]]\nname = \"up\"\ntype = \"gen\"\ncapacity = \"1G\"\n\
         [[port]]\nname = \"q\"\ntype = \"gen\"\nqos = {{ min = \"{q_min}\" }}\n{extra}",
        worker_cpus(2),
        control.display(),
        dir.join("state").display()
    )
}

fn received(control: &Path) -> (u64, Value) {
    let stats = qs_json(control, &["stats", "--json"]);
    let r = port_stats(&stats, "sink")["sink"]["received"]
        .as_u64()
        .unwrap_or(0);
    (r, stats)
}

fn q_min(control: &Path) -> Option<u64> {
    let q = qs_json(control, &["qos", "show", "--json"]);
    q["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == "q"))
        .and_then(|p| p["min"].as_u64())
}

#[test]
fn sighup_applies_only_the_differences_and_untouched_traffic_flows() {
    let dir = TempDir::new("reload");
    let control = dir.join("control.sock");
    let d = DaemonChild::start(
        dir.path(),
        "r",
        &config(&dir, &control, "100M", ""),
        &control,
    );
    let file = dir.join("r.toml");
    assert!(
        common::wait_until(Duration::from_secs(5), || received(&control).0 > 500),
        "no traffic: {}",
        d.log_text()
    );

    // Change q's QoS and add a port, then SIGHUP, while src -> sink runs.
    let new_port = "[[port]]\nname = \"new\"\ntype = \"gen\"\n";
    std::fs::write(&file, config(&dir, &control, "200M", new_port)).unwrap();
    let mut last = received(&control).0;
    d.signal("HUP");
    let start = Instant::now();
    let mut stalls = 0;
    while start.elapsed() < Duration::from_millis(1500) {
        std::thread::sleep(Duration::from_millis(250));
        let (now, _) = received(&control);
        if now == last && now < FRAMES {
            stalls += 1;
        }
        last = now;
    }
    assert_eq!(stalls, 0, "the sink stalled during the reload");
    assert!(port_names(&control).contains(&"new".to_string()));
    assert_eq!(q_min(&control), Some(200_000_000));
    let log = d.log_text();
    assert!(log.contains("reload: port q: qos set"), "{log}");
    assert!(log.contains("reload: port new: added"), "{log}");
    for untouched in ["src", "sink", "up"] {
        assert!(
            !log.contains(&format!("reload: port {untouched}")),
            "{untouched} touched: {log}"
        );
    }

    // An invalid file: nothing changes, and the reply says where, in one line.
    let good = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        good.replace("capacity = \"1G\"", "capacity = \"1Q\""),
    )
    .unwrap();
    let out = qs(&control, &["reload"]);
    assert!(!out.ok(), "invalid file accepted: {}", out.stdout);
    let err = out.stderr.trim();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("line") && err.contains("capacity") && err.contains("nothing changed"),
        "{err}"
    );
    d.signal("HUP");
    assert!(
        common::wait_until(Duration::from_secs(5), || d
            .log_text()
            .contains("reload failed: config line")),
        "{}",
        d.log_text()
    );
    let mut names = port_names(&control);
    names.sort();
    assert_eq!(names, ["new", "q", "sink", "src", "up"]);
    assert_eq!(q_min(&control), Some(200_000_000));

    // `qswitch reload` prints what it changed.
    std::fs::write(&file, config(&dir, &control, "200M", "")).unwrap();
    let out = qs(&control, &["reload"]);
    out.assert_ok("reload");
    assert_eq!(out.stdout.trim(), "port new: removed");
    let out = qs(&control, &["reload"]);
    out.assert_ok("reload");
    assert_eq!(out.stdout.trim(), "nothing changed");

    // Every frame of the generator arrived, in order, across all of it.
    assert!(
        common::wait_until(Duration::from_secs(15), || received(&control).0 >= FRAMES),
        "{}",
        received(&control).1
    );
    let (_, stats) = received(&control);
    assert_eq!(counter(&stats, "src", "generated"), FRAMES, "{stats}");
    let sink = &port_stats(&stats, "sink")["sink"];
    assert_eq!(sink["received"].as_u64(), Some(FRAMES), "{stats}");
    assert_eq!(sink["lost"].as_u64(), Some(0), "{stats}");
    assert_eq!(sink["reordered"].as_u64(), Some(0), "{stats}");
}
