//! The vhost-user message layer: sequences of messages with file descriptors attached, sent
//! to a server-mode vhost-user port of a running switch, as a hostile frontend would.
//!
//! Each input is read as messages: request code, which fds to attach (a memfd of a few
//! pages, an eventfd, a pipe end), a body length and the body; the header (request, flags
//! = version 1 with need-reply picked by the input, size) is built from them, so the
//! fuzzer spends its time on bodies and sequences rather than on framing. After each input
//! the connection is dropped and the switch must still answer its control plane (a
//! deadlock or a panic in the reactor or the worker fails the run).
#![no_main]

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use qswitch_api::{PortConfig, VhostMode};
use qswitch_dp::{Options, Switch};
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::sock_ctrl_msg::ScmSocket;

struct Rig {
    sw: Switch,
    sock: PathBuf,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("qswitch-fuzz-vhost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("v.sock");
        let sw = Switch::start(&[0], &Options::default()).unwrap();
        let cfg = PortConfig::vhost_user(
            "v",
            sock.as_path().try_into().unwrap(),
            VhostMode::Server,
        );
        sw.add_port(&cfg).unwrap();
        Rig { sw, sock }
    })
}

fn memfd(pages: u64) -> OwnedFd {
    let fd = rustix::fs::memfd_create("fuzz", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, pages * 4096).unwrap();
    fd
}

fn drain(s: &mut UnixStream) {
    let mut b = [0u8; 4096];
    while matches!(s.read(&mut b), Ok(n) if n > 0) {}
}

fuzz_target!(|data: &[u8]| {
    let rig = rig();
    let Ok(mut s) = UnixStream::connect(&rig.sock) else {
        return;
    };
    s.set_nonblocking(true).unwrap();
    let mut rest = data;
    let mut sent = 0;
    while rest.len() >= 4 && sent < 32 {
        let (req, fds, flags, len) = (rest[0] % 48, rest[1], rest[2], usize::from(rest[3]));
        rest = &rest[4..];
        let body = &rest[..len.min(rest.len())];
        rest = &rest[body.len()..];
        let mut msg = Vec::with_capacity(12 + body.len());
        msg.extend_from_slice(&u32::from(req).to_ne_bytes());
        // Version 1; bit 3 = need reply.
        msg.extend_from_slice(&(0x1 | u32::from(flags & 0x8)).to_ne_bytes());
        msg.extend_from_slice(&(body.len() as u32).to_ne_bytes());
        msg.extend_from_slice(body);
        let mut owned: Vec<OwnedFd> = Vec::new();
        let mut events: Vec<EventFd> = Vec::new();
        if fds & 1 != 0 {
            owned.push(memfd(u64::from(fds >> 4) + 1));
        }
        if fds & 2 != 0 {
            events.push(EventFd::new(libc_nonblock()).unwrap());
        }
        if fds & 4 != 0 {
            let (r, w) = std::io::pipe().unwrap();
            owned.push(r.into());
            owned.push(w.into());
        }
        let raw: Vec<RawFd> = owned
            .iter()
            .map(AsRawFd::as_raw_fd)
            .chain(events.iter().map(AsRawFd::as_raw_fd))
            .collect();
        let ok = if raw.is_empty() {
            s.write_all(&msg).is_ok()
        } else {
            s.send_with_fds(&[&msg[..]], &raw).is_ok()
        };
        if !ok {
            break;
        }
        sent += 1;
        drain(&mut s);
    }
    std::thread::sleep(Duration::from_micros(200));
    drain(&mut s);
    drop(s);
    // The control plane still answers (no lock held forever by the message handler).
    assert_eq!(rig.sw.ports().len(), 1);
});

/// `EFD_NONBLOCK`, as the eventfd flags QEMU uses.
fn libc_nonblock() -> i32 {
    0o4000
}
