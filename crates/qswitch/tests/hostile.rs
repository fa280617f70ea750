//! Hostile local clients of the control socket (issue 15: F6's leaked connection counter,
//! F12's dripping clients), end to end through the `qswitch` binary. No root needed.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{first_cpu, port_names, request, DaemonChild, TempDir};

fn gen_config(control: &Path) -> String {
    format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n\
         [[port]]\nname = \"g1\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:01\"\n",
        first_cpu(),
        control.display()
    )
}

/// Asks for the port list through the CLI and fails if it takes a second or more.
fn cli_answers_quickly(control: &Path, when: &str) {
    let t = Instant::now();
    assert_eq!(port_names(control), ["g1"], "{when}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "{when}: port list took {:?}",
        t.elapsed()
    );
}

/// F12: 32 clients (as many as the socket serves at once) each dripping one byte of a
/// request every 4 s — every read arrives well within any per-read timeout — do not lock the
/// CLI out: it answers in under a second throughout, and the drippers are cut off at the
/// whole-request deadline (5 s), not kept alive by their drip.
#[test]
fn dripping_clients_do_not_lock_out_the_cli() {
    let dir = TempDir::new("drip");
    let control = dir.join("control.sock");
    let mut daemon = DaemonChild::start(dir.path(), "drip", &gen_config(&control), &control);
    let mut drippers: Vec<UnixStream> = (0..32)
        .map(|_| {
            let s = UnixStream::connect(&control).unwrap();
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            s
        })
        .collect();
    let start = Instant::now();
    let request = b"{\"request\":\"ping\"}\n";
    let mut sent = 0;
    let mut checks = 0;
    while start.elapsed() < Duration::from_secs(9) {
        // One byte each every 4 s (t = 0, 4, 8 s); errors mean the daemon cut them off.
        if start.elapsed() >= Duration::from_secs(4 * sent) {
            for s in &mut drippers {
                let _ = s.write_all(&request[sent as usize..sent as usize + 1]);
            }
            sent += 1;
        }
        cli_answers_quickly(&control, &format!("at {:?}", start.elapsed()));
        checks += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(checks >= 10);
    // Past the 5 s deadline, every dripper has been disconnected without an answer.
    for (k, s) in drippers.iter_mut().enumerate() {
        let mut b = [0u8; 256];
        match s.read(&mut b) {
            Ok(n) => assert!(
                n == 0 || b[..n].starts_with(b"{\"response\":\"error\""),
                "dripper {k} got {:?}",
                String::from_utf8_lossy(&b[..n])
            ),
            Err(e) => assert!(
                e.kind() == std::io::ErrorKind::ConnectionReset,
                "dripper {k} still connected after {:?}: {e}",
                start.elapsed()
            ),
        }
    }
    assert!(daemon.running());
}

/// F6's second half: connections that fail in every way a client can make them fail
/// (closing at once, mid-request, without reading the answer) never leak a slot: afterwards
/// all 32 slots can be held at once, the CLI still gets through (the oldest holder is
/// evicted), and once they are gone the socket serves normally.
#[test]
fn failed_connections_do_not_leak_slots() {
    let dir = TempDir::new("leak");
    let control = dir.join("control.sock");
    let mut daemon = DaemonChild::start(dir.path(), "leak", &gen_config(&control), &control);
    for k in 0..300 {
        let s = UnixStream::connect(&control).unwrap();
        match k % 3 {
            0 => {}
            1 => {
                let _ = (&s).write_all(b"{\"request\":\"port-");
            }
            _ => {
                let _ = (&s).write_all(b"{\"request\":\"stats\"}\n");
            }
        }
        drop(s);
    }
    let held: Vec<UnixStream> = (0..32)
        .map(|_| UnixStream::connect(&control).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    cli_answers_quickly(&control, "with 32 idle connections held");
    let pong = request(&control, b"{\"request\":\"ping\"}\n").unwrap();
    assert_eq!(pong["response"], "pong", "{pong}");
    drop(held);
    for k in 0..40 {
        cli_answers_quickly(&control, &format!("request {k} after the holders left"));
    }
    assert!(daemon.running());
}

/// Issue 15 point 6: vhost-user sockets are created 0660 whatever the daemon's umask (here
/// 000, which used to give 0777), in `[switch] vhost_group`, for configured ports and for
/// ports added later.
#[test]
fn vhost_sockets_are_0660_in_the_configured_group() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new("vhost-perm");
    let control = dir.join("control.sock");
    let sock = dir.join("a.sock");
    // Root may give a socket any group; anyone else, their own (the primary one here).
    let (group, gid) = if qswitch_sys::thread::is_root() {
        (
            "daemon".to_string(),
            qswitch_sys::thread::group_id("daemon").unwrap(),
        )
    } else {
        let gid = std::fs::metadata(dir.path()).unwrap().gid();
        (gid.to_string(), gid)
    };
    let text = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\nvhost_group = \"{group}\"\n\
         [[port]]\nname = \"a\"\ntype = \"vhost-user\"\nsocket = \"{}\"\n",
        first_cpu(),
        control.display(),
        sock.display()
    );
    let old = qswitch_sys::thread::set_umask(0);
    let _daemon = DaemonChild::start(dir.path(), "perm", &text, &control);
    qswitch_sys::thread::set_umask(old);
    let b = dir.join("b.sock");
    common::qs(
        &control,
        &[
            "port",
            "add",
            "b",
            "--type",
            "vhost-user",
            "--socket",
            &b.display().to_string(),
        ],
    )
    .assert_ok("port add b");
    for s in [&sock, &b] {
        let meta = std::fs::metadata(s).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o660, "{}", s.display());
        assert_eq!(meta.gid(), gid, "{}", s.display());
    }
}

/// Issue 27 F7: `control_group` members only read. As uid 65534 with the control group
/// alone, the CLI lists, shows stats and captures, but every change (`port add` of any
/// type, AF_XDP included, `port del`, `qos set`, `reload`) is refused in one line and
/// changes nothing. With `admin_group` the same user changes the switch, but a vhost-user
/// socket it names must be in `socket_dirs`: another service's live socket is neither
/// replaced nor (after `port del`) deleted, no directory is created outside those
/// directories, and `..` and symbolic links are refused.
#[test]
fn f7_control_group_reads_and_only_admins_change() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    if !common::root_or_skip()
        || !common::require(common::have_tool("setpriv", &["--version"]), "no setpriv")
    {
        return;
    }
    let dir = TempDir::new("f7-access");
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(dir.path(), 0o755);
    let run = dir.join("run");
    let private = dir.join("private");
    std::fs::create_dir(&run).unwrap();
    std::fs::create_dir(&private).unwrap();
    mode(&run, 0o755);
    mode(&private, 0o700);
    // uid 65534 runs a copy of the binary it can reach.
    let bin = dir.join("qswitch");
    std::fs::copy(common::QSWITCH, &bin).unwrap();
    let control = run.join("control.sock");
    let (readers, admins) = (64_101u32, 64_102u32);
    let text = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\ncontrol_group = \"{readers}\"\n\
         admin_group = \"{admins}\"\n\
         [[port]]\nname = \"g1\"\ntype = \"gen\"\nmac = \"02:00:00:00:00:01\"\n\
         generate = {{ dst = \"ff:ff:ff:ff:ff:ff\", size = 64, rate = 100 }}\n",
        first_cpu(),
        control.display()
    );
    let mut daemon = DaemonChild::start(dir.path(), "f7", &text, &control);
    // Another service's live socket in the socket directory.
    let victim = run.join("victim.sock");
    let service = UnixListener::bind(&victim).unwrap();
    let live = |p: &Path| UnixStream::connect(p).is_ok();
    let as_user = |groups: &[u32], args: &[&str]| {
        let groups: Vec<String> = groups.iter().map(u32::to_string).collect();
        let groups = if groups.is_empty() {
            "--clear-groups".to_string()
        } else {
            format!("--groups={}", groups.join(","))
        };
        common::run_timeout(
            std::process::Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", &groups, "--"])
                .arg(&bin)
                .arg("--control")
                .arg(&control)
                .args(args),
            Duration::from_secs(10),
        )
    };
    let s = |p: &Path| p.display().to_string();
    let vhost = |name: &str, socket: &str| {
        vec![
            "port".to_string(),
            "add".into(),
            name.into(),
            "--type".into(),
            "vhost-user".into(),
            "--socket".into(),
            socket.into(),
        ]
    };
    let strs = |v: &[String]| v.iter().map(String::as_str).collect::<Vec<_>>().join(" ");
    let refused = |out: &common::Out, what: &str, why: &str| {
        assert!(!out.ok(), "{what} was allowed: {out:?}");
        assert!(out.stderr.contains(why), "{what}: {}", out.stderr);
        assert_eq!(
            out.stderr.trim().lines().count(),
            1,
            "{what}: not one line: {}",
            out.stderr
        );
    };

    // A non-member cannot open the socket at all.
    assert!(!as_user(&[], &["port", "list"]).ok());

    // A reader: reads work ...
    let list = as_user(&[readers], &["port", "list"]);
    assert!(list.ok() && list.stdout.contains("g1"), "{list:?}");
    as_user(&[readers], &["stats", "--json"]).assert_ok("stats as a reader");
    as_user(&[readers], &["capture", "g1", "-c", "1"]).assert_ok("capture as a reader");
    // ... and every change is refused, in one line, changing nothing.
    let victim_add = vhost("v", &s(&victim));
    let private_add = vhost("p", &s(&private.join("made/p.sock")));
    let changes: Vec<Vec<String>> = vec![
        victim_add.clone(),
        private_add.clone(),
        ["port", "add", "nic", "--type", "afxdp", "--ifname", "lo"]
            .map(String::from)
            .to_vec(),
        ["port", "add", "x", "--type", "gen"]
            .map(String::from)
            .to_vec(),
        ["port", "del", "g1"].map(String::from).to_vec(),
        ["qos", "set", "g1", "--max", "1M"]
            .map(String::from)
            .to_vec(),
        ["reload"].map(String::from).to_vec(),
    ];
    for c in &changes {
        let args: Vec<&str> = c.iter().map(String::as_str).collect();
        refused(&as_user(&[readers], &args), &strs(c), "permission denied");
    }
    assert_eq!(port_names(&control), ["g1"]);
    assert!(
        live(&victim),
        "the reader replaced or removed another service's socket"
    );
    assert!(!private.join("made").exists());

    // An admin changes the switch ...
    let admin = [readers, admins];
    as_user(&admin, &["port", "add", "x", "--type", "gen"]).assert_ok("port add as an admin");
    as_user(&admin, &["port", "del", "x"]).assert_ok("port del as an admin");
    // ... but another service's live socket stays, ...
    let args: Vec<&str> = victim_add.iter().map(String::as_str).collect();
    refused(
        &as_user(&admin, &args),
        "port add on a live socket",
        "live socket",
    );
    assert!(live(&victim));
    // ... sockets outside socket_dirs, through `..` or a symbolic link are refused, and no
    // directory is made there.
    std::os::unix::fs::symlink(&private, run.join("link")).unwrap();
    for (path, why) in [
        (private.join("made/p.sock"), "outside [switch] socket_dirs"),
        (run.join("../private/made/p.sock"), "'..'"),
        (run.join("link/made/p.sock"), "symbolic link"),
    ] {
        let add = vhost("p", &s(&path));
        let args: Vec<&str> = add.iter().map(String::as_str).collect();
        refused(&as_user(&admin, &args), &s(&path), why);
    }
    assert!(!private.join("made").exists());
    assert_eq!(port_names(&control), ["g1"]);

    // In socket_dirs it works (a subdirectory is made there); a socket that replaced the
    // port's own while it ran is not the port's to delete.
    let mine = run.join("vms/v1.sock");
    let add = vhost("v1", &s(&mine));
    let args: Vec<&str> = add.iter().map(String::as_str).collect();
    as_user(&admin, &args).assert_ok("port add v1 in socket_dirs");
    assert!(live(&mine));
    std::fs::remove_file(&mine).unwrap();
    let other = UnixListener::bind(&mine).unwrap();
    as_user(&admin, &["port", "del", "v1"]).assert_ok("port del v1");
    assert!(
        live(&mine),
        "port del removed a socket qswitch did not create"
    );
    drop((other, service));
    assert!(daemon.running());
}

/// The `qs-capture` threads of process `pid` (one per running capture).
fn capture_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim() == "qs-capture")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Starts a capture of `port` on a raw connection and returns it with the first answer.
fn start_capture(control: &Path, port: &str) -> (UnixStream, serde_json::Value) {
    use std::io::BufRead;
    let s = UnixStream::connect(control).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    (&s).write_all(
        format!("{{\"request\":\"capture\",\"port\":\"{port}\",\"snaplen\":65535}}\n").as_bytes(),
    )
    .unwrap();
    let mut line = Vec::new();
    // One byte at a time: nothing past the first line is taken from the socket.
    let mut r = std::io::BufReader::with_capacity(1, &s);
    r.read_until(b'\n', &mut line).unwrap();
    let v = serde_json::from_slice(&line).unwrap_or(serde_json::Value::Null);
    (s, v)
}

/// Issue 27 F8 (captures): every capture's ring is bounded (at most 8 MiB of frame data,
/// reported when it starts), at most 8 run at once and the next is refused in one line;
/// clients that stop reading do not keep their captures: the one whose port is deleted
/// ends within a couple of seconds, the others when they have taken nothing for 10 s, and
/// then their threads are gone and captures start again.
#[test]
fn f8_captures_are_capped_bounded_and_end_with_their_port_or_a_stalled_client() {
    let dir = TempDir::new("f8-capture");
    let control = dir.join("control.sock");
    let mut text = format!(
        "[switch]\nworkers = \"{}\"\ncontrol = \"{}\"\n",
        first_cpu(),
        control.display()
    );
    for k in 0..10 {
        text.push_str(&format!(
            "[[port]]\nname = \"g{k}\"\ntype = \"gen\"\nmac = \"02:00:00:00:01:{k:02x}\"\n\
             generate = {{ dst = \"ff:ff:ff:ff:ff:ff\", size = 512, rate = 2000 }}\n"
        ));
    }
    let mut daemon = DaemonChild::start(dir.path(), "f8c", &text, &control);
    let pid = daemon.pid();
    // Eight clients that take the first answer and then nothing.
    let stalled: Vec<UnixStream> = (0..8)
        .map(|k| {
            let (s, v) = start_capture(&control, &format!("g{k}"));
            assert_eq!(v["response"], "capture-started", "g{k}: {v}");
            let bytes = v["ring_bytes"].as_u64().unwrap_or(u64::MAX);
            assert!(bytes > 0 && bytes <= 8 << 20, "g{k}: ring of {bytes} bytes");
            s
        })
        .collect();
    let (_s, refused) = start_capture(&control, "g8");
    assert_eq!(
        refused["response"], "error",
        "a ninth capture ran: {refused}"
    );
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(message.contains("too many captures"), "{message}");
    // (The refused request's thread ends right after its answer.)
    assert!(
        common::wait_until(Duration::from_secs(2), || capture_threads(pid) == 8),
        "{} capture threads, 8 expected",
        capture_threads(pid)
    );

    // g0's port goes while its client is not reading: that capture ends at once.
    let t = Instant::now();
    common::qs(&control, &["port", "del", "g0"]).assert_ok("port del g0");
    assert!(
        common::wait_until(Duration::from_secs(5), || capture_threads(pid) <= 7),
        "the capture of a deleted port is still running ({} threads)",
        capture_threads(pid)
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    // The rest end once their clients have taken nothing for 10 s.
    assert!(
        common::wait_until(Duration::from_secs(30), || capture_threads(pid) == 0),
        "captures of clients that stopped reading are still running ({} threads)",
        capture_threads(pid)
    );
    let (_s, again) = start_capture(&control, "g9");
    assert_eq!(again["response"], "capture-started", "{again}");
    drop(stalled);
    assert!(daemon.running());
}
