//! Live changes survive a restart: port add/del, qos set, placement pin and mode are recorded
//! before they are acknowledged, and a `kill -9` at any moment leaves an acknowledged state.
//! Gen ports only: no root needed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{first_cpu, port_names, qs, qs_json, worker_cpus, DaemonChild, TempDir};
use qswitch_api::{PortConfig, Request, Response};
use serde_json::Value;

fn config(dir: &TempDir, control: &Path, workers: &str) -> String {
    format!(
        "[switch]\nworkers = \"{workers}\"\ncontrol = \"{}\"\nstate_dir = \"{}\"\n\
         [[port]]\nname = \"up\"\ntype = \"gen\"\ncapacity = \"1G\"\n\
         [[port]]\nname = \"g1\"\ntype = \"gen\"\n\
         generate = {{ dst = \"02:00:00:00:00:99\", size = 64, rate = 100, count = 0 }}\n",
        control.display(),
        dir.join("state").display()
    )
}

fn qos_of(control: &Path, port: &str) -> Value {
    let q = qs_json(control, &["qos", "show", "--json"]);
    q["ports"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["name"] == port).cloned())
        .unwrap_or_else(|| panic!("no port {port} in {q}"))
}

fn queue_state(control: &Path, port: &str, queue: u64) -> (String, Option<u64>) {
    let p = qs_json(control, &["placement", "--json"]);
    let q = p["queues"]
        .as_array()
        .and_then(|qs| {
            qs.iter()
                .find(|q| q["port"] == port && q["queue"].as_u64() == Some(queue))
                .cloned()
        })
        .unwrap_or_else(|| panic!("no queue {port}/{queue} in {p}"));
    (
        q["state"].as_str().unwrap_or("").to_string(),
        q["cpu"].as_u64(),
    )
}

#[test]
fn live_changes_survive_kill_9_and_dump_starts_the_same_switch() {
    let dir = TempDir::new("persist-kill9");
    let control = dir.join("control.sock");
    let text = config(&dir, &control, &worker_cpus(2));
    let mut d = DaemonChild::start(dir.path(), "a", &text, &control);
    let cpu = first_cpu().to_string();

    qs(
        &control,
        &["port", "add", "g2", "--type", "gen", "--queues", "2"],
    )
    .assert_ok("port add");
    qs(
        &control,
        &["qos", "set", "g1", "--min", "100M", "--weight", "3"],
    )
    .assert_ok("qos set");
    qs(&control, &["placement", "pin", "g1", "0", &cpu]).assert_ok("pin");
    qs(&control, &["placement", "mode", "static"]).assert_ok("mode");
    qs(&control, &["port", "add", "gone", "--type", "gen"]).assert_ok("port add gone");
    qs(&control, &["port", "del", "gone"]).assert_ok("port del gone");

    d.kill();
    // The socket file of a killed daemon stays; the next one replaces it (nobody listens).
    let mut d = DaemonChild::start(dir.path(), "a", &text, &control);
    let names: BTreeSet<String> = port_names(&control).into_iter().collect();
    assert_eq!(
        names,
        ["g1", "g2", "up"].map(String::from).into(),
        "{}",
        d.log_text()
    );
    let g1 = qos_of(&control, "g1");
    assert_eq!(g1["min"].as_u64(), Some(100_000_000), "{g1}");
    assert_eq!(g1["weight"].as_u64(), Some(3), "{g1}");
    let (state, on) = queue_state(&control, "g1", 0);
    assert_eq!(state, "pinned");
    assert_eq!(on, Some(first_cpu() as u64));
    let placement = qs_json(&control, &["placement", "--json"]);
    assert_eq!(placement["mode"], "static", "{placement}");

    // The dump is a config `run --config` accepts, and it starts the same switch.
    let dump = qs(&control, &["config", "dump"]);
    dump.assert_ok("config dump");
    assert!(
        dump.stdout.contains("[[port]]") && dump.stdout.contains("g2"),
        "{}",
        dump.stdout
    );
    assert!(d.terminate(Duration::from_secs(10)).is_some(), "SIGTERM");
    let parsed = qswitch_api::Config::from_toml(&dump.stdout).expect("dump parses");
    assert_eq!(parsed.ports.len(), 3);
    let control2 = dir.join("second.sock");
    let text2 = dump
        .stdout
        .replace(
            &control.display().to_string(),
            &control2.display().to_string(),
        )
        .replace(
            &dir.join("state").display().to_string(),
            &dir.join("state2").display().to_string(),
        );
    let _d2 = DaemonChild::start(dir.path(), "dumped", &text2, &control2);
    let names2: BTreeSet<String> = port_names(&control2).into_iter().collect();
    assert_eq!(names2, names);
    let g1 = qos_of(&control2, "g1");
    assert_eq!(g1["min"].as_u64(), Some(100_000_000), "{g1}");
    let placement = qs_json(&control2, &["placement", "--json"]);
    assert_eq!(placement["mode"], "static", "{placement}");

    // The file edited while the daemon is down: its edit wins for the port it touches (g1's
    // QoS); the live changes elsewhere stay (g2, static placement).
    let edited = text.replace(
        "[[port]]\nname = \"g1\"\ntype = \"gen\"\n",
        "[[port]]\nname = \"g1\"\ntype = \"gen\"\nqos = { min = \"50M\" }\n",
    );
    assert_ne!(edited, text);
    let _d3 = DaemonChild::start(dir.path(), "a", &edited, &control);
    let g1 = qos_of(&control, "g1");
    assert_eq!(g1["min"].as_u64(), Some(50_000_000), "{g1}");
    let names3: BTreeSet<String> = port_names(&control).into_iter().collect();
    assert_eq!(names3, names);
    let placement = qs_json(&control, &["placement", "--json"]);
    assert_eq!(placement["mode"], "static", "{placement}");
}

/// A live change the configuration file could not hold is refused, so it is never recorded
/// and the next start does not fail on it: the file's rule for uplinks (no two carry a VLAN
/// in common; the guarantees of the ports toward one fit its reservable share) holds for
/// `port add` and for `port set --vlans`, which can put more ports behind an uplink.
#[test]
fn live_changes_the_file_could_not_hold_are_refused_and_the_restart_works() {
    let dir = TempDir::new("persist-uplink-rule");
    let control = dir.join("control.sock");
    let text = config(&dir, &control, &worker_cpus(1));
    let mut d = DaemonChild::start(dir.path(), "u", &text, &control);
    qs(
        &control,
        &["port", "add", "v10", "--type", "gen", "--vlan", "10"],
    )
    .assert_ok("port add v10");
    // No uplink carries VLAN 10 yet: nothing to reserve against.
    qs(&control, &["qos", "set", "v10", "--min", "950M"]).assert_ok("qos set v10");
    assert!(qos_of(&control, "v10")["uplink"].is_null());
    // "up" (1G, reservable 0.9) carrying VLAN 10 would owe v10 950M: refused.
    let r = qs(&control, &["port", "set", "up", "--vlans", "10"]);
    assert!(!r.ok(), "{}", r.stdout);
    assert!(
        r.stderr
            .contains("the guarantees toward uplink 'up' would add up to 950M"),
        "{}",
        r.stderr
    );
    qs(&control, &["qos", "set", "v10", "--min", "700M"]).assert_ok("qos set v10 700M");
    qs(&control, &["port", "set", "up", "--vlans", "10"]).assert_ok("now it fits");
    assert_eq!(qos_of(&control, "v10")["uplink"], "up");
    // A second uplink of VLAN 10.
    let mut up2 = PortConfig::gen("up2");
    up2.vlan = Some(10.try_into().unwrap());
    up2.capacity = Some("1G".parse().unwrap());
    let r = qswitch_api::client::call(&control, &Request::PortAdd { port: up2 });
    assert!(
        matches!(&r, Err(e) if e.to_string().contains("'up' and 'up2' would both be uplinks (capacity) of VLAN 10")),
        "{r:?}"
    );
    d.kill();
    let _d = DaemonChild::start(dir.path(), "u", &text, &control);
    let names: BTreeSet<String> = port_names(&control).into_iter().collect();
    assert_eq!(names, ["g1", "up", "v10"].map(String::from).into());
    let v10 = qos_of(&control, "v10");
    assert_eq!(v10["uplink"], "up", "{v10}");
    assert_eq!(v10["min"].as_u64(), Some(700_000_000), "{v10}");
}

/// The switch as the test sees it: port names and their QoS weights.
type Model = BTreeMap<String, u64>;

#[derive(Debug, Clone)]
enum Op {
    Add(String),
    Del(String),
    Weight(String, u32),
}

impl Op {
    fn request(&self) -> Request {
        match self {
            Op::Add(n) => Request::PortAdd {
                port: PortConfig::gen(n),
            },
            Op::Del(n) => Request::PortDel { name: n.clone() },
            Op::Weight(n, w) => Request::QosSet {
                port: n.clone(),
                min: None,
                max: None,
                weight: Some(*w),
                clear: false,
            },
        }
    }

    fn apply(&self, m: &mut Model) {
        match self {
            Op::Add(n) => {
                m.insert(n.clone(), 1);
            }
            Op::Del(n) => {
                m.remove(n);
            }
            Op::Weight(n, w) => {
                m.insert(n.clone(), u64::from(*w));
            }
        }
    }
}

/// A small xorshift generator (no dependency, reproducible from the printed seed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn read_model(control: &Path) -> Model {
    let q = qs_json(control, &["qos", "show", "--json"]);
    q["ports"]
        .as_array()
        .expect("qos ports")
        .iter()
        .filter(|p| p["name"] != "up" && p["name"] != "g1")
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["weight"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn kill_9_during_a_burst_of_changes_leaves_an_acknowledged_state() {
    let dir = TempDir::new("persist-burst");
    let control = dir.join("control.sock");
    let text = config(&dir, &control, &worker_cpus(1));
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("seed {seed}");
    let mut rng = Rng(seed);
    let mut model = Model::new();
    let mut counter = 0u32;
    let mut acked_total = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut d = DaemonChild::start(dir.path(), "burst", &text, &control);
    for round in 0..10 {
        assert!(Instant::now() < deadline, "rounds took too long");
        // Ops for this round, generated from the model as it evolves.
        let mut ops = Vec::new();
        let mut m = model.clone();
        for _ in 0..400 {
            let names: Vec<String> = m.keys().cloned().collect();
            let op = if !names.is_empty() && rng.below(3) == 0 {
                let n = names[rng.below(names.len() as u64) as usize].clone();
                Op::Weight(n, 1 + rng.below(50) as u32)
            } else if names.len() > 12 || (!names.is_empty() && rng.below(4) == 0) {
                Op::Del(names[rng.below(names.len() as u64) as usize].clone())
            } else {
                counter += 1;
                Op::Add(format!("p{counter}"))
            };
            op.apply(&mut m);
            ops.push(op);
        }
        let acked = Arc::new(Mutex::new(0usize));
        let client = {
            let (acked, ops, control) = (acked.clone(), ops.clone(), control.clone());
            std::thread::spawn(move || {
                for op in &ops {
                    match qswitch_api::client::call(&control, &op.request()) {
                        Ok(Response::Ok) => *acked.lock().unwrap() += 1,
                        Ok(other) => panic!("{op:?}: {other:?}"),
                        Err(e) => {
                            // A refusal (not a lost connection) would be a test bug.
                            let msg = e.to_string();
                            assert!(
                                !msg.contains("does not exist") && !msg.contains("already"),
                                "{op:?}: {msg}"
                            );
                            return;
                        }
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(20 + rng.below(150)));
        d.kill();
        client.join().expect("client thread");
        let n = *acked.lock().unwrap();
        acked_total += n;
        let mut expected = model.clone();
        for op in &ops[..n] {
            op.apply(&mut expected);
        }
        let mut with_next = expected.clone();
        if let Some(op) = ops.get(n) {
            op.apply(&mut with_next);
        }
        d = DaemonChild::start(dir.path(), "burst", &text, &control);
        let seen = read_model(&control);
        assert!(
            seen == expected || seen == with_next,
            "round {round} (seed {seed}): {n} acknowledged; after restart {seen:?}, expected {expected:?} or {with_next:?}"
        );
        model = seen;
    }
    d.kill();
    eprintln!("{acked_total} changes acknowledged over 10 kills");
    assert!(acked_total > 10, "too few changes got through");
}

#[test]
fn concurrent_changes_are_all_recorded() {
    let dir = TempDir::new("persist-concurrent");
    let control = dir.join("control.sock");
    let text = config(&dir, &control, &worker_cpus(1));
    let mut d = DaemonChild::start(dir.path(), "c", &text, &control);
    // Four clients at once, each adding its own ports and setting their weights: a record
    // written out of order (or from a stale copy) would lose some after the restart.
    let clients: Vec<_> = (0..4)
        .map(|t| {
            let control = control.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    let name = format!("c{t}x{i}");
                    for op in [Op::Add(name.clone()), Op::Weight(name, 2 + i)] {
                        let r = qswitch_api::client::call(&control, &op.request());
                        assert!(matches!(r, Ok(Response::Ok)), "{op:?}: {r:?}");
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.join().expect("client");
    }
    let before = read_model(&control);
    assert_eq!(before.len(), 40);
    d.kill();
    let _d = DaemonChild::start(dir.path(), "c", &text, &control);
    assert_eq!(read_model(&control), before);
}

/// Starts the daemon on `config` and expects it to exit with one stderr line holding every
/// one of `needles`, within 15 s (not hang).
fn expect_start_refused(config: &Path, needles: &[&str]) {
    let out = common::run_timeout(
        std::process::Command::new(common::qswitch_bin())
            .args(["run", "--config"])
            .arg(config)
            .env("QSWITCH_LOG", "warn"),
        Duration::from_secs(15),
    );
    out.assert_no_panic();
    assert!(out.code.is_some(), "start-up hung: {out:?}");
    assert!(!out.ok(), "started: {out:?}");
    let lines = out.stderr_lines();
    assert_eq!(lines.len(), 1, "want one stderr line: {out:?}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} not in {out:?}");
    }
}

/// Audit finding F10: a FIFO at `state.json` made start-up hang forever without a word. The
/// file is opened without blocking and must be a regular file.
#[test]
fn a_fifo_as_the_state_file_is_refused_not_a_hang() {
    use std::os::unix::fs::DirBuilderExt;
    let dir = TempDir::new("persist-fifo");
    let control = dir.join("control.sock");
    let path = dir.join("qswitch.toml");
    std::fs::write(&path, config(&dir, &control, &worker_cpus(1))).unwrap();
    std::fs::DirBuilder::new()
        .mode(0o750)
        .create(dir.join("state"))
        .unwrap();
    common::sh_ok(&["mkfifo", dir.join("state/state.json").to_str().unwrap()]);
    expect_start_refused(&path, &["state.json", "FIFO", "not a regular file"]);
    assert!(!control.exists());
}

/// Audit finding F10: a state directory others can write to is refused, so that no one but
/// root (or the daemon's user) can plant a state file that adds ports at the next start.
#[test]
fn a_state_directory_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("persist-perm");
    let control = dir.join("control.sock");
    let path = dir.join("qswitch.toml");
    std::fs::write(&path, config(&dir, &control, &worker_cpus(1))).unwrap();
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    for (mode, who) in [
        (0o777, "everyone"),
        (0o1777, "everyone"),
        (0o770, "its group"),
    ] {
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(mode)).unwrap();
        expect_start_refused(&path, &["state directory", "writable by", who]);
        assert!(!control.exists());
    }
    if qswitch_sys::thread::is_root() {
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).unwrap();
        common::sh_ok(&["chown", "65534", state.to_str().unwrap()]);
        expect_start_refused(&path, &["state directory", "owned by uid 65534"]);
        common::sh_ok(&["chown", "0", state.to_str().unwrap()]);
    }
    // 0750, owned by us: starts.
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).unwrap();
    let text = config(&dir, &control, &worker_cpus(1));
    let _d = DaemonChild::start(dir.path(), "good", &text, &control);
    assert_eq!(port_names(&control), ["up", "g1"]);
}

/// The settings `config dump` gives each port equal what the daemon runs with: the policy
/// keys `port list` shows and the QoS settings `qos show` shows.
fn assert_dump_is_live(control: &Path, dump: &str) -> qswitch_api::Config {
    let parsed = qswitch_api::Config::from_toml(dump).expect("dump parses");
    let list = qs_json(control, &["port", "list", "--json"]);
    let listed = list.as_array().expect("port array");
    assert_eq!(parsed.ports.len(), listed.len(), "{dump}\n{list}");
    for p in &parsed.ports {
        let shown = listed
            .iter()
            .find(|l| l["name"] == p.name.as_str())
            .unwrap_or_else(|| panic!("{} in the dump, not running: {list}", p.name));
        let keys = [
            ("vlans", serde_json::to_value(&p.vlans).unwrap()),
            ("security", serde_json::to_value(&p.security).unwrap()),
            ("storm", serde_json::to_value(&p.storm).unwrap()),
            (
                "link_local_forward",
                serde_json::to_value(p.link_local_forward).unwrap(),
            ),
        ];
        for (key, value) in keys {
            assert_eq!(shown[key], value, "port {} key {key}: {dump}", p.name);
        }
        // `port list` leaves out a false bpdu_guard.
        let guard = shown["bpdu_guard"].as_bool().unwrap_or(false);
        assert_eq!(guard, p.bpdu_guard, "port {} bpdu_guard: {dump}", p.name);
        if p.capacity.is_none() {
            let q = qos_of(control, &p.name);
            let s = p.qos_settings();
            assert_eq!(q["min"].as_u64(), s.min, "{} min: {q}\n{dump}", p.name);
            assert_eq!(q["max"].as_u64(), s.max, "{} max: {q}\n{dump}", p.name);
            assert_eq!(
                q["weight"].as_u64(),
                Some(u64::from(s.weight)),
                "{} weight: {q}\n{dump}",
                p.name
            );
        }
    }
    parsed
}

/// One copy of a port's settings (issue 26): after a series of `port set`, `qos set` and
/// port changes, `config dump` and the state a restart starts from are exactly what runs;
/// a change the switch refuses, and one that cannot be recorded, change nothing (not the
/// switch, not the dump, not what a restart brings back).
#[test]
fn dump_and_restart_show_exactly_the_live_settings_and_failed_changes_change_nothing() {
    let dir = TempDir::new("persist-one-copy");
    let control = dir.join("control.sock");
    let text = config(&dir, &control, &first_cpu().to_string());
    let mut d = DaemonChild::start(dir.path(), "a", &text, &control);
    let ok = |args: &[&str]| {
        qs(&control, args).assert_ok(&args.join(" "));
    };
    ok(&["port", "add", "g2", "--type", "gen"]);
    ok(&[
        "port",
        "set",
        "g1",
        "--vlans",
        "10,20",
        "--macs",
        "02:00:00:00:00:01",
        "--storm-broadcast",
        "100",
        "--bpdu-guard",
        "on",
        "--link-local-forward",
        "lldp",
    ]);
    ok(&["qos", "set", "g1", "--min", "100M", "--weight", "3"]);
    ok(&[
        "port",
        "set",
        "g2",
        "--mac-limit",
        "5",
        "--dhcp-guard",
        "on",
    ]);
    ok(&["qos", "set", "g2", "--max", "200M"]);
    // Later changes to the same keys: the last one counts.
    ok(&[
        "port",
        "set",
        "g1",
        "--vlans",
        "none",
        "--storm-multicast",
        "50",
    ]);
    ok(&["qos", "set", "g2", "--clear", "--max", "300M"]);
    ok(&["port", "add", "gone", "--type", "gen"]);
    ok(&["qos", "set", "gone", "--min", "10M"]);
    ok(&["port", "del", "gone"]);

    let dump = qs(&control, &["config", "dump"]).stdout.clone();
    let parsed = assert_dump_is_live(&control, &dump);
    let port = |name: &str| parsed.ports.iter().find(|p| p.name == name).unwrap();
    let (g1, g2) = (port("g1"), port("g2"));
    assert!(g1.vlans.is_none(), "{dump}");
    assert_eq!(
        g1.storm.as_ref().map(|s| (s.broadcast, s.multicast)),
        Some((Some(100), Some(50)))
    );
    assert!(g1.bpdu_guard, "{dump}");
    assert_eq!(g1.qos_settings().min, Some(100_000_000), "{dump}");
    assert_eq!(g1.qos_settings().weight, 3, "{dump}");
    assert_eq!(
        g2.security.as_ref().and_then(|s| s.mac_limit),
        Some(5),
        "{dump}"
    );
    assert_eq!(g2.qos_settings().max, Some(300_000_000), "{dump}");
    assert!(!dump.contains("gone"), "{dump}");

    // Refused by the switch: nothing changes.
    for args in [
        &["qos", "set", "g2", "--min", "2G"][..],
        &["port", "set", "nope", "--vlans", "5"],
        &["port", "add", "g1", "--type", "gen"],
    ] {
        assert!(!qs(&control, args).ok(), "{args:?} accepted");
        assert_eq!(
            qs(&control, &["config", "dump"]).stdout,
            dump,
            "after {args:?}"
        );
    }

    // Not recordable (the state file's temporary name is taken by a directory): refused,
    // and nothing changes either.
    let blocker = dir
        .join("state")
        .join(format!(".state.json.{}.tmp", d.pid()));
    std::fs::create_dir(&blocker).unwrap();
    for args in [
        &["port", "set", "g1", "--vlans", "30"][..],
        &["qos", "set", "g2", "--max", "400M"],
        &["port", "add", "g3", "--type", "gen"],
        &["port", "del", "g2"],
    ] {
        let out = qs(&control, args);
        assert!(!out.ok(), "{args:?} accepted without a record");
        assert!(
            out.stderr.contains("cannot record") && out.stderr.contains("nothing changed"),
            "{args:?}: {out:?}"
        );
        assert_eq!(
            qs(&control, &["config", "dump"]).stdout,
            dump,
            "after {args:?}"
        );
    }
    assert_dump_is_live(&control, &dump);
    std::fs::remove_dir(&blocker).unwrap();

    // A restart (kill -9: no chance to write anything more) starts exactly that.
    d.kill();
    let _d = DaemonChild::start(dir.path(), "a", &text, &control);
    let again = qs(&control, &["config", "dump"]).stdout.clone();
    assert_eq!(again, dump);
    assert_dump_is_live(&control, &again);
}
