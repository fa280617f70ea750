//! Rules of the code's structure that a newcomer relies on (issue 26), checked on the
//! source, and the one that needs the daemon: a panicking thread stops it.
//!
//! - Every thread of the product crates (`qswitch-dp`, `qswitch-sys`, the `qswitch`
//!   library and binary) is started by `qswitch_sys::thread::spawn`.
//! - `qswitch-dp` keeps no process-wide state: no `static` items (a switch's state is its
//!   own; two switches in one process share nothing).
//! - `qswitch-dp`'s modules import each other without a circle, and the hot path (what runs
//!   per frame: every module outside `control/`) imports nothing of the control side (what
//!   runs per change: `control/`).
//! - `qswitch trace` runs the engine's decision; each pipeline stage has its module.
//!
//! The source checks read each file up to its unit tests (`#[cfg(test)]` followed by
//! `mod tests`, at the end of every file that has them); tests may start threads and keep
//! statics.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{first_cpu, ChildGuard, DaemonChild, TempDir, QSWITCH};

/// The workspace's `crates` directory.
fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("crates/")
        .to_path_buf()
}

/// Every `.rs` file under `dir`, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// A file's product code: its text up to its unit tests, without comments (line comments
/// and doc comments; the code has no block comments).
fn product_code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .map(|l| match l.find("//") {
            // Not inside a string on the lines that matter here.
            Some(i) if !l[..i].contains('"') => &l[..i],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn rel(path: &Path) -> String {
    path.strip_prefix(crates())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// Every thread of the product crates is started by the one spawn helper
/// (`qswitch_sys::thread::spawn`: named, confined, its panic reported), directly or through
/// the switch's `spawn` / `Switch::spawn`.
#[test]
fn every_thread_starts_through_the_spawn_helper() {
    let helper = crates().join("sys/src/thread.rs");
    let mut found = Vec::new();
    for krate in ["dp", "sys", "qswitch"] {
        for f in rust_files(&crates().join(krate).join("src")) {
            if f == helper {
                continue;
            }
            for (n, line) in product_code(&f).lines().enumerate() {
                let l = line
                    .replace(' ', "")
                    .replace("qswitch_sys::thread::spawn(", "")
                    .replace("crate::thread::spawn(", "");
                if ["thread::spawn(", "thread::Builder", "thread::scope("]
                    .iter()
                    .any(|p| l.contains(p))
                {
                    found.push(format!("{}:{}: {}", rel(&f), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "threads started around qswitch_sys::thread::spawn:\n{}",
        found.join("\n")
    );
}

/// `qswitch-dp` keeps no process-wide state: no `static` item outside its tests. The one
/// exception is a `thread_local!` that holds per-thread state only: the vhost-user call
/// slot (a thread's id and call-write sequence, and the switches' lists it joined; each
/// switch's watchdog reads its own list).
#[test]
fn dp_has_no_static_items() {
    const ALLOWED: &[(&str, &str)] = &[("dp/src/port/vhost_user/reactor.rs", "CALL_SLOT")];
    let mut found = Vec::new();
    for f in rust_files(&crates().join("dp/src")) {
        let code = product_code(&f);
        for (n, line) in code.lines().enumerate() {
            let t = line.trim_start();
            let item = t
                .strip_prefix("pub ")
                .or_else(|| t.strip_prefix("pub(crate) "))
                .unwrap_or(t);
            let Some(rest) = item.strip_prefix("static ") else {
                continue;
            };
            let name = rest
                .trim_start_matches("mut ")
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .next()
                .unwrap_or("");
            if !ALLOWED.contains(&(rel(&f).as_str(), name)) {
                found.push(format!("{}:{}: {}", rel(&f), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "statics in qswitch-dp:\n{}",
        found.join("\n")
    );
}

/// The module graph of a crate's `src`: module path (`port::veth`) → the modules it names
/// (`crate::x::y`, `super::x`, and a child `x::` from its parent). A name the crate root
/// re-exports (`pub use x::y::{A, B};` in `lib.rs`: `crate::A`) counts as naming `x::y`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut mods = BTreeMap::new();
    for f in rust_files(src) {
        let r = f.strip_prefix(src).expect("under src").with_extension("");
        let mut parts: Vec<String> = r.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
            parts.pop();
        }
        mods.insert(parts.join("::"), f);
    }
    // The longest known module that prefixes `path`.
    let resolve = |path: &str| -> Option<String> {
        let segs: Vec<&str> = path.split("::").collect();
        (1..=segs.len())
            .rev()
            .map(|i| segs[..i].join("::"))
            .find(|m| mods.contains_key(m))
    };
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect::<String>()
            .trim_end_matches(':')
            .to_string()
    };
    // The crate root's re-exports: name → the module that defines it.
    let mut reexports: BTreeMap<String, String> = BTreeMap::new();
    if let Some(lib) = mods.get("") {
        for line in product_code(lib).lines() {
            let Some(rest) = line.trim().strip_prefix("pub use ") else {
                continue;
            };
            let rest = rest.trim_end_matches(';');
            let (from, names) = match rest.split_once("::{") {
                Some((from, names)) => (from, names.trim_end_matches('}').split(',').collect()),
                None => match rest.rsplit_once("::") {
                    Some((from, name)) => (from, vec![name]),
                    None => continue,
                },
            };
            if let Some(m) = resolve(from) {
                for name in names {
                    let name = name.trim();
                    let name = name.rsplit(" as ").next().unwrap_or(name);
                    reexports.insert(name.to_string(), m.clone());
                }
            }
        }
    }
    let resolve = |path: &str| -> Option<String> {
        resolve(path).or_else(|| {
            let first = path.split("::").next().unwrap_or(path);
            reexports.get(first).cloned()
        })
    };
    let mut graph = BTreeMap::new();
    for (m, f) in &mods {
        let code = product_code(f);
        let mut to = BTreeSet::new();
        let parent: Vec<&str> = if m.is_empty() {
            Vec::new()
        } else {
            let mut p: Vec<&str> = m.split("::").collect();
            p.pop();
            p
        };
        for (i, _) in code.match_indices("crate::") {
            let after = &code[i + 7..];
            let path = ident(after);
            // `crate::a::{b, c::d}`: each item of the group.
            if after[path.len()..].starts_with("::{") {
                let group = &after[path.len() + 3..];
                let group = &group[..group.find('}').unwrap_or(group.len())];
                for item in group.split(',') {
                    let item = ident(item.trim());
                    to.extend(resolve(&format!("{path}::{item}")));
                }
            }
            to.extend(resolve(&path));
        }
        for (i, _) in code.match_indices("super::") {
            if code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path = ident(&code[i + 7..]);
            let base = parent.join("::");
            to.extend(resolve(&if base.is_empty() {
                path
            } else {
                format!("{base}::{path}")
            }));
        }
        let depth = if m.is_empty() {
            0
        } else {
            m.split("::").count()
        };
        for child in mods.keys() {
            let is_child = (m.is_empty() || child.starts_with(&format!("{m}::")))
                && !child.is_empty()
                && child.split("::").count() == depth + 1;
            if !is_child {
                continue;
            }
            let name = child.rsplit("::").next().unwrap_or(child);
            let named = code.match_indices(&format!("{name}::")).any(|(i, _)| {
                !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':')
            });
            if named {
                to.insert(child.clone());
            }
        }
        to.remove(m);
        graph.insert(m.clone(), to);
    }
    graph
}

/// The circles among sibling modules: an edge `a::x → b::y` counts between the children
/// of the deepest module both are in (`a → b`); a module naming its own parent or child
/// does not count (that is how a module and its parts are written).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, tos) in graph {
        for b in tos {
            let (x, y): (Vec<&str>, Vec<&str>) = (a.split("::").collect(), b.split("::").collect());
            let common = x.iter().zip(&y).take_while(|(p, q)| p == q).count();
            if common == x.len() || common == y.len() {
                continue;
            }
            edges
                .entry(x[..=common].join("::"))
                .or_default()
                .insert(y[..=common].join("::"));
        }
    }
    // Strongly connected components (Tarjan), those of more than one module.
    struct T<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        for w in t.edges.get(v).into_iter().flatten() {
            if !t.index.contains_key(w.as_str()) {
                visit(t, w);
                let lw = t.low[w.as_str()];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.stack.contains(&w.as_str()) {
                let iw = t.index[w.as_str()];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out.sort();
    t.out
}

/// `qswitch-dp`'s modules import each other without a circle: each one can be read (and
/// tested) after the ones it imports, never together with them.
#[test]
fn dp_has_no_import_circle() {
    let graph = module_graph(&crates().join("dp/src"));
    assert!(graph.contains_key("port::veth"), "{:?}", graph.keys());
    let found = circles(&graph);
    assert!(found.is_empty(), "import circles in qswitch-dp: {found:?}");
}

/// `qswitch-dp` has two rooms: the hot path (what runs per frame: the engine, the worker
/// loop, the port table, the ports, the fdb ...; every module outside `control/`) and the
/// control side (what runs per change: `control/`, the switch handle, placement, balance,
/// the QoS allocator). The hot path imports nothing of the control side; the control side
/// builds what the workers read and publishes it.
#[test]
fn dp_hot_path_does_not_import_the_control_side() {
    let graph = module_graph(&crates().join("dp/src"));
    let control = |m: &str| m == "control" || m.starts_with("control::");
    for m in [
        "control::switch",
        "control::placement",
        "control::balance",
        "control::qos",
    ] {
        assert!(
            graph.contains_key(m),
            "{m} is not on the control side: {:?}",
            graph.keys()
        );
    }
    for m in ["engine", "worker", "table", "port", "fdb", "packet", "qos"] {
        assert!(
            graph.contains_key(m),
            "{m} is not on the hot path: {:?}",
            graph.keys()
        );
    }
    let mut found = Vec::new();
    for (m, tos) in &graph {
        // The crate root declares both rooms and re-exports the switch.
        if m.is_empty() || control(m) {
            continue;
        }
        for to in tos.iter().filter(|t| control(t)) {
            found.push(format!("{m} -> {to}"));
        }
    }
    assert!(
        found.is_empty(),
        "hot-path modules of qswitch-dp import the control side:\n{}",
        found.join("\n")
    );
}

/// The import checks see what they look for: a root re-export (`crate::Switch`) counts as
/// naming its module, and a circle through one is found.
#[test]
fn reexports_are_followed() {
    let dir = TempDir::new("structure");
    std::fs::create_dir_all(dir.join("control")).unwrap();
    let write = |f: &str, text: &str| std::fs::write(dir.join(f), text).unwrap();
    write(
        "lib.rs",
        "pub mod control;\npub mod engine;\npub use control::switch::{Options, Switch};\n",
    );
    write("control/mod.rs", "pub mod switch;\n");
    write("control/switch.rs", "use crate::engine::Forwarder;\n");
    write(
        "engine.rs",
        "pub struct Forwarder;\nfn f(_: &crate::Switch) {}\n",
    );
    let graph = module_graph(dir.path());
    assert!(graph["engine"].contains("control::switch"), "{graph:?}");
    assert_eq!(circles(&graph), vec![vec!["control", "engine"]]);
}

/// `qswitch trace` runs the engine's decision (`Forwarder::decide` with a recorder as its
/// tracer), not a copy of it: trace.rs calls none of the stages' rules itself, and every
/// stage of the pipeline has its module in `crates/dp/src/pipeline/` or is the ports' (rx,
/// tx) or the forwarder's (learn, lookup; `vlan_tag` is `pipeline/vlan.rs`).
#[test]
fn trace_runs_the_engines_decision() {
    let dp = crates().join("dp/src");
    let trace = product_code(&dp.join("trace.rs"));
    assert!(
        trace.contains(".decide("),
        "trace.rs does not run Forwarder::decide"
    );
    for rule in [
        "l2::classify(",
        "ingress_vlan(",
        "security_check(",
        "link_local::verdict(",
        "storm_admit(",
        ".flood(",
    ] {
        assert!(
            !trace.contains(rule),
            "trace.rs applies `{rule}` itself: the engine's stages decide (crates/dp/src/pipeline)"
        );
    }
    let stats = product_code(&dp.join("stats.rs"));
    let stages = &stats[stats.find("stages! {").expect("the stages! list")..];
    let stages = &stages[..stages.find("\n}").expect("end of the list")];
    for line in stages.lines().filter(|l| l.contains("=>")) {
        let name = line.split('"').nth(1).expect("a stage's name");
        let module = match name {
            // The ports' own; learn and lookup are the forwarder's (engine.rs: they keep
            // its per-burst caches).
            "rx" | "tx" | "learn" | "lookup" => continue,
            "port_security" => "security",
            "storm_control" => "storm",
            "vlan_tag" => "vlan",
            // One module for the firewall's two places (a port's egress rules on the way in,
            // the destination's ingress rules on the way out).
            "firewall_in" | "firewall_out" => "firewall",
            n => n,
        };
        assert!(
            dp.join("pipeline").join(format!("{module}.rs")).exists(),
            "stage {name} has no module crates/dp/src/pipeline/{module}.rs"
        );
    }
}

/// The circle check finds a circle (the check of the check).
#[test]
fn circles_are_found() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b::x"]),
        ("b::x", vec!["c"]),
        ("c", vec!["a", "c::d"]),
        ("c::d", vec!["c"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(circles(&g), vec![vec!["a", "b", "c"]]);
}

/// A panic in the vhost-user driver's thread (`qs-vhost`) stops the daemon within a second:
/// exit code 1 and a message naming the thread. The panic is injected with the test-only
/// `QSWITCH_TEST_PANIC=qs-vhost` (read once when the event loop starts; it panics at the
/// first frontend connection).
#[test]
fn a_panic_in_the_vhost_user_thread_stops_the_daemon() {
    let dir = TempDir::new("vhost_panic");
    let control = dir.join("control.sock");
    let sock = dir.join("a.sock");
    let config = dir.join("panic.toml");
    std::fs::write(
        &config,
        format!(
            "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
             [[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"{}\"\n",
            first_cpu(),
            control.display(),
            sock.display()
        ),
    )
    .unwrap();
    let log = dir.join("panic.log");
    let child = Command::new(QSWITCH)
        .args(["run", "--config"])
        .arg(&config)
        .env("QSWITCH_TEST_PANIC", "qs-vhost")
        .env("STATE_DIRECTORY", config.with_extension("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap())
        .spawn()
        .expect("start qswitch run");
    let mut d = DaemonChild {
        child: ChildGuard::new(child),
        control,
        log,
    };
    d.wait_ready();
    let t = Instant::now();
    let _frontend = UnixStream::connect(&sock).expect("connect to the vhost-user socket");
    let status = d
        .child
        .wait_timeout(Duration::from_secs(5))
        .unwrap_or_else(|| panic!("still running 5 s after the panic: {}", d.log_text()));
    let took = t.elapsed();
    let log = d.log_text();
    eprintln!("the daemon stopped {took:?} after the panic");
    assert_eq!(status.code(), Some(1), "{status}: {log}");
    assert!(
        log.contains("qswitch: thread 'qs-vhost' panicked: QSWITCH_TEST_PANIC"),
        "{log}"
    );
    assert!(
        took < Duration::from_secs(1),
        "exited {took:?} after the panic: {log}"
    );
}
