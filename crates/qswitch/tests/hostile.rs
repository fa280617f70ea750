//! Hostile local clients of the control socket (issue 15: F6's leaked connection counter,
//! F12's dripping clients), end to end through the `qswitch` binary. No root needed.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{first_cpu, port_names, request, Daemon, TempDir};

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
    let mut daemon = Daemon::start(dir.path(), "drip", &gen_config(&control), &control);
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
    let mut daemon = Daemon::start(dir.path(), "leak", &gen_config(&control), &control);
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
    let _daemon = Daemon::start(dir.path(), "perm", &text, &control);
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
