//! The control socket: a Unix stream socket (mode 0600) carrying one JSON request line and
//! one JSON response line per connection. Requests are handled one at a time on the control
//! thread; a failed request changes nothing.
//!
//! One thread (`qs-control`) and one epoll set serve the listener and every connection, all
//! non-blocking, in [`MAX_CLIENTS`] fixed slots: a client costs a slot and a small buffer,
//! never a thread. A client has [`REQUEST_DEADLINE`] from connecting to send its whole
//! request line (not per read: dripping a byte at a time does not extend it) and
//! [`REPLY_DEADLINE`] to take the answer. When all slots are taken, a new client evicts the
//! oldest one still sending its request (the slowest), so a crowd of slow clients cannot
//! lock the CLI out. The slot is the connection (dropping it closes the socket), so there
//! is no counter to leak, and a panic while executing a request becomes an error response.
//!
//! # Who may do what
//! Each connection's peer credentials (`SO_PEERCRED`, `SO_PEERGROUPS`) are read when it is
//! accepted. [`Request::access`] classifies every request as read or admin; admin requests
//! are served to root, the daemon's own user and members of `[switch] admin_group` only,
//! so a `control_group` member reads (lists, stats, captures, traces) and changes nothing.
//! A vhost-user socket that a `port add` names must lie in `[switch] socket_dirs` (default:
//! the control socket's directory), with no `..` and no symbolic link on the way, whoever
//! asks ([`Policy::check`]). See docs/security.md.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use qswitch_api::request::Access;
use qswitch_api::{Request, Response};
use qswitch_sys::epoll::{Epoll, Event};
use qswitch_sys::fd::PeerCred;

use crate::daemon::Daemon;

/// Longest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;
/// Most control connections served at once.
const MAX_CLIENTS: usize = 32;

/// The bound socket; the file is removed on drop.
pub struct Socket {
    listener: UnixListener,
    path: PathBuf,
    policy: Policy,
}

/// Who may do what over the control socket (see the module docs).
#[derive(Debug, Clone)]
pub struct Policy {
    /// The daemon's effective user: it and root may make every request.
    pub owner: u32,
    /// `[switch] admin_group`: its members may make every request too.
    pub admin_gid: Option<u32>,
    /// Where a vhost-user socket named by a request may be.
    pub socket_dirs: Vec<PathBuf>,
}

impl Policy {
    /// Whether `cred` may make admin requests. Unknown credentials may not.
    fn admin(&self, cred: Option<&PeerCred>) -> bool {
        cred.is_some_and(|c| {
            c.uid == 0
                || c.uid == self.owner
                || self
                    .admin_gid
                    .is_some_and(|g| c.gid == g || c.groups.contains(&g))
        })
    }

    /// Refuses, with a one-line reason, a request the peer may not make or one that names a
    /// socket outside [`Policy::socket_dirs`].
    pub fn check(&self, cred: Option<&PeerCred>, req: &Request) -> Result<(), String> {
        if req.access() == Access::Admin && !self.admin(cred) {
            let who = cred.map_or_else(|| "unknown peer".to_string(), |c| format!("uid {}", c.uid));
            return Err(format!(
                "permission denied: '{}' changes the switch; it needs root, qswitch's user or \
                 [switch] admin_group ({who} may only read)",
                req.verb()
            ));
        }
        if let Request::PortAdd { port } = req {
            if let Some(socket) = port.socket() {
                check_socket_path(socket.as_path(), &self.socket_dirs)?;
            }
        }
        Ok(())
    }
}

/// A vhost-user socket path a request names must be absolute, without `.` or `..`, below one
/// of `dirs`, with real directories (no symbolic links) between that directory and it, and
/// itself absent or a socket (not a link).
pub fn check_socket_path(path: &Path, dirs: &[PathBuf]) -> Result<(), String> {
    use std::path::Component;
    let shown = path.display();
    let text = path.as_os_str().as_encoded_bytes();
    let dots = text
        .split(|&b| b == b'/')
        .any(|seg| seg == b"." || seg == b"..");
    if !path.is_absolute() || dots {
        return Err(format!(
            "socket {shown}: must be an absolute path without '.' or '..'"
        ));
    }
    let Some(dir) = dirs
        .iter()
        .find(|d| path.starts_with(d) && path != d.as_path())
    else {
        let allowed: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "socket {shown} is outside [switch] socket_dirs ({})",
            allowed.join(", ")
        ));
    };
    let below = path.strip_prefix(dir).unwrap_or(path);
    let mut at = dir.clone();
    let parts: Vec<Component> = below.components().collect();
    for (i, part) in parts.iter().enumerate() {
        at.push(part);
        let last = i + 1 == parts.len();
        match std::fs::symlink_metadata(&at) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(format!("socket {shown}: {}: {e}", at.display())),
            Ok(m) if m.file_type().is_symlink() => {
                return Err(format!(
                    "socket {shown}: {} is a symbolic link; refusing to follow it",
                    at.display()
                ))
            }
            Ok(m) if !last && !m.is_dir() => {
                return Err(format!(
                    "socket {shown}: {} is not a directory",
                    at.display()
                ))
            }
            Ok(m) if last && !m.file_type().is_socket() => {
                return Err(format!(
                    "socket {shown} exists and is not a socket; refusing to replace it"
                ))
            }
            Ok(_) => {}
        }
    }
    Ok(())
}

impl Socket {
    /// Binds `path` with mode 0600 (the socket is created under a 0177 umask, so it is never
    /// reachable by others, not even briefly). A stale socket file (nobody listening) is
    /// replaced; a live one is an error; anything that is not a socket is left alone and is an
    /// error.
    pub fn bind(path: &Path) -> anyhow::Result<Socket> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                bail!(
                    "{} exists and is not a socket; refusing to replace it",
                    path.display()
                );
            }
            if UnixStream::connect(path).is_ok() {
                bail!("another qswitch is already listening on {}", path.display());
            }
            std::fs::remove_file(path)
                .with_context(|| format!("cannot remove stale socket {}", path.display()))?;
        }
        let old = qswitch_sys::thread::set_umask(0o177);
        let bound = UnixListener::bind(path);
        qswitch_sys::thread::set_umask(old);
        let listener =
            bound.with_context(|| format!("cannot bind control socket {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("cannot set permissions on {}", path.display()))?;
        listener.set_nonblocking(true)?;
        Ok(Socket {
            listener,
            path: path.to_path_buf(),
            policy: Policy {
                owner: qswitch_sys::thread::euid(),
                admin_gid: None,
                socket_dirs: path.parent().map(Path::to_path_buf).into_iter().collect(),
            },
        })
    }

    /// Serves under `policy` (by default: admin requests from the daemon's user and root
    /// only, sockets in the control socket's directory).
    pub fn with_policy(mut self, policy: Policy) -> Socket {
        self.policy = policy;
        self
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serves requests until `stop` is set: one thread, one epoll set, every connection
/// non-blocking (see the module docs).
pub fn serve(socket: Socket, daemon: &Arc<Daemon>, stop: &AtomicBool) {
    let epoll = match Epoll::new().and_then(|e| e.add(socket.listener.as_raw_fd(), 0).map(|()| e)) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "control socket cannot be polled; stopping");
            stop.store(true, Ordering::Relaxed);
            return;
        }
    };
    let mut conns = Conns::new(MAX_CLIENTS);
    let mut events = [Event::EMPTY; MAX_CLIENTS + 1];
    while !stop.load(Ordering::Relaxed) {
        // Pending output is retried every few milliseconds (responses nearly always fit in
        // the socket buffer at once); otherwise wake for the next deadline or the stop flag.
        let timeout = if conns.writing() { 5 } else { 200 };
        let n = epoll.wait(&mut events, timeout).unwrap_or(0);
        let mut accept = false;
        for ev in &events[..n] {
            match ev.token() {
                0 => accept = true,
                t => conns.readable(
                    usize::try_from(t - 1).unwrap_or(usize::MAX),
                    &epoll,
                    daemon,
                    &socket.policy,
                ),
            }
        }
        conns.flush_and_expire(Instant::now());
        // Accepting last: a slot freed above is never confused with the one it becomes.
        if accept {
            while let Ok((stream, _)) = socket.listener.accept() {
                conns.accept(stream, &epoll, Instant::now());
            }
        }
    }
}

/// Time a client has from connecting to sending its whole request line.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Time a client has to take its response.
pub const REPLY_DEADLINE: Duration = Duration::from_secs(5);

/// One connection: reading its request line, then writing its response.
struct Conn {
    stream: UnixStream,
    /// The request line so far; then the response.
    buf: Vec<u8>,
    /// Response bytes already written (`Some` once the request is answered).
    written: Option<usize>,
    accepted: Instant,
    deadline: Instant,
    /// Who connected (`None`: unknown, so only read requests are served).
    cred: Option<PeerCred>,
}

/// The connections, in a fixed number of slots. A connection lives in its slot and nowhere
/// else, so freeing the slot and closing the socket are the same act (dropping the `Conn`):
/// no counter to leak.
struct Conns {
    slots: Vec<Option<Conn>>,
}

impl Conns {
    fn new(n: usize) -> Conns {
        Conns {
            slots: (0..n).map(|_| None).collect(),
        }
    }

    fn writing(&self) -> bool {
        self.slots.iter().flatten().any(|c| c.written.is_some())
    }

    /// Takes a new connection. When every slot is taken, the slowest client goes: the one
    /// connected longest that has not finished its request (a client that already has its
    /// answer is only waiting for the kernel to take it). If none is evictable, the new
    /// client is told to try again.
    fn accept(&mut self, stream: UnixStream, epoll: &Epoll, now: Instant) {
        let slot = match self.slots.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let victim = self
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(i, c)| c.as_ref().map(|c| (i, c)))
                    .filter(|(_, c)| c.written.is_none())
                    .min_by_key(|(_, c)| c.accepted)
                    .map(|(i, _)| i);
                match victim {
                    Some(i) => {
                        tracing::debug!("control: too many connections; dropping the slowest");
                        self.slots[i] = None;
                        i
                    }
                    None => {
                        let _ = stream.set_nonblocking(true);
                        let _ = reply(&stream, &busy());
                        return;
                    }
                }
            }
        };
        if stream.set_nonblocking(true).is_err()
            || epoll.add(stream.as_raw_fd(), slot as u64 + 1).is_err()
        {
            return;
        }
        let cred = qswitch_sys::fd::peer_cred(&stream).ok();
        self.slots[slot] = Some(Conn {
            stream,
            buf: Vec::new(),
            written: None,
            accepted: now,
            deadline: now + REQUEST_DEADLINE,
            cred,
        });
    }

    /// Reads what slot `i`'s client sent; answers once the line (or EOF) is there.
    fn readable(&mut self, i: usize, epoll: &Epoll, daemon: &Arc<Daemon>, policy: &Policy) {
        let Some(Some(c)) = self.slots.get_mut(i) else {
            return;
        };
        if c.written.is_some() {
            return;
        }
        let mut chunk = [0u8; 4096];
        let request = loop {
            match (&c.stream).read(&mut chunk) {
                Ok(0) => break Some(Ok(())),
                Ok(n) => {
                    c.buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = c.buf.iter().position(|&b| b == b'\n') {
                        c.buf.truncate(end);
                        break Some(Ok(()));
                    }
                    if c.buf.len() as u64 > MAX_REQUEST {
                        break Some(Err(format!("request longer than {MAX_REQUEST} bytes")));
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break None,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.slots[i] = None;
                    return;
                }
            }
        };
        let Some(request) = request else {
            return;
        };
        let response = match request {
            Err(message) => Response::Error {
                message: format!("bad request: {message}"),
            },
            Ok(()) => match serde_json::from_slice::<Request>(c.buf.trim_ascii_end())
                .map_err(|e| format!("bad request: {e}"))
                .and_then(|req| policy.check(c.cred.as_ref(), &req).map(|()| req))
            {
                // Streaming: a capture owns its connection, on a thread of its own, until it
                // ends (at most one capture per port runs at a time).
                Ok(Request::Capture(req)) => {
                    let _ = epoll.delete(c.stream.as_raw_fd());
                    if let Some(c) = self.slots[i].take() {
                        let daemon = daemon.clone();
                        let _ = c.stream.set_nonblocking(false);
                        let d = daemon.clone();
                        let started = d.switch.spawn("qs-capture", move || {
                            if let Err(e) = crate::capture::serve(&c.stream, &daemon, req) {
                                tracing::debug!(error = %e, "capture client went away");
                            }
                        });
                        if let Err(e) = started {
                            tracing::warn!(error = %e, "cannot start a capture thread");
                        }
                    }
                    return;
                }
                Ok(req) => execute_guarded(req, daemon),
                Err(message) => Response::Error { message },
            },
        };
        // Whatever else the client sends is not read: stop watching it (level-triggered, it
        // would wake this thread until the response is taken).
        let _ = epoll.delete(c.stream.as_raw_fd());
        c.buf = serde_json::to_vec(&response).unwrap_or_default();
        c.buf.push(b'\n');
        c.written = Some(0);
        c.deadline = Instant::now() + REPLY_DEADLINE;
        self.flush(i);
    }

    /// Writes what it can of slot `i`'s response; frees the slot when done or broken.
    fn flush(&mut self, i: usize) {
        let Some(c) = self.slots[i].as_mut() else {
            return;
        };
        let Some(mut done) = c.written else {
            return;
        };
        while done < c.buf.len() {
            match (&c.stream).write(&c.buf[done..]) {
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    c.written = Some(done);
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.slots[i] = None;
    }

    /// Retries pending responses and drops the connections past their deadline.
    fn flush_and_expire(&mut self, now: Instant) {
        for i in 0..self.slots.len() {
            self.flush(i);
            if self.slots[i].as_ref().is_some_and(|c| now >= c.deadline) {
                tracing::debug!("control: a client missed its deadline; dropped");
                self.slots[i] = None;
            }
        }
    }
}

fn busy() -> Response {
    Response::Error {
        message: "too many control connections; try again".into(),
    }
}

/// [`execute`], with a panic turned into an error response: one bad request handler must
/// not take the control socket down.
fn execute_guarded(req: Request, daemon: &Daemon) -> Response {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| execute(req, daemon))).unwrap_or_else(
        |_| Response::Error {
            message: "internal error while handling the request (see the daemon log)".into(),
        },
    )
}

fn reply(stream: &UnixStream, response: &Response) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(response).unwrap_or_default();
    out.push(b'\n');
    (&*stream).write_all(&out)
}

/// Carries out one request.
pub fn execute(req: Request, daemon: &Daemon) -> Response {
    let sw = &daemon.switch;
    match req {
        Request::Ping => Response::Pong {
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
        },
        Request::PortList => Response::Ports { ports: sw.ports() },
        Request::Fdb => Response::Fdb { entries: sw.fdb() },
        Request::Stats => Response::Stats(Box::new(daemon.stats())),
        Request::Placement => Response::Placement(Box::new(sw.placement())),
        Request::QosShow => Response::Qos(Box::new(sw.qos_show())),
        Request::MirrorList => Response::Mirrors {
            mirrors: sw.mirrors(),
        },
        Request::ConfigDump => daemon.dump(),
        Request::ExportShow => {
            let (ipfix, sflow) = daemon.export.config();
            Response::Export(Box::new(qswitch_api::request::ExportReport {
                ipfix,
                sflow,
                counters: daemon.export.counters(),
            }))
        }
        change @ (Request::ExportSet { .. } | Request::ExportOff { .. }) => {
            daemon.export_change(change)
        }
        Request::Trace { port, frame } => crate::capture::trace(daemon, &port, &frame),
        Request::Lldp { port } => match sw.lldp(port.as_deref()) {
            Ok(ports) => Response::Lldp { ports },
            Err(e) => Response::Error {
                message: error_chain(&e),
            },
        },
        Request::Capture(_) => Response::Error {
            message: "capture is a streaming request (use the control socket)".into(),
        },
        // Changes are applied and recorded under the persistence mutex (see `state`).
        change @ (Request::Reload
        | Request::PortAdd { .. }
        | Request::PortDel { .. }
        | Request::PlacementPin { .. }
        | Request::PlacementMode { .. }
        | Request::QosSet { .. }
        | Request::MirrorAdd { .. }
        | Request::MirrorDel { .. }
        | Request::PortSet { .. }
        | Request::SgAdd { .. }
        | Request::SgDel { .. }
        | Request::SgRuleAdd { .. }
        | Request::SgRuleDel { .. }
        | Request::SgAddresses { .. }) => daemon.change(change),
        // The firewall's connections and groups, read; a flush is runtime state.
        fw @ (Request::CtList { .. }
        | Request::CtFlush { .. }
        | Request::CtStats
        | Request::SgList { .. }) => crate::firewall_cli::execute(fw, daemon),
        Request::BondShow { name } => match sw.bonds(name.as_deref()) {
            Ok(bonds) => Response::Bonds { bonds },
            Err(e) => Response::Error {
                message: error_chain(&e),
            },
        },
        // Runtime state, not a setting: nothing to record.
        Request::BondSet { name, active } => match sw.set_bond_active(&name, &active) {
            Ok(()) => Response::Ok,
            Err(e) => Response::Error {
                message: error_chain(&e),
            },
        },
        // Runtime state, not a setting: nothing to record.
        Request::PortEnable { name } => match sw.enable_port(&name) {
            Ok(_) => Response::Ok,
            Err(e) => Response::Error {
                message: error_chain(&e),
            },
        },
        Request::Rss { port } => match sw.reta(&port) {
            Ok(r) => Response::Rss {
                queues: r.queues().to_vec(),
                table: r.table().to_vec(),
            },
            Err(e) => Response::Error {
                message: error_chain(&e),
            },
        },
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_stay_in_their_directories() {
        let base = std::env::temp_dir().join(format!("qs-ctl-paths-{}", std::process::id()));
        let run = base.join("run");
        let private = base.join("private");
        std::fs::create_dir_all(run.join("sub")).unwrap();
        std::fs::create_dir_all(&private).unwrap();
        std::os::unix::fs::symlink(&private, run.join("link")).unwrap();
        std::fs::write(run.join("file"), b"").unwrap();
        let dirs = [run.clone()];
        let ok = |p: PathBuf| check_socket_path(&p, &dirs);
        assert!(ok(run.join("vm.sock")).is_ok());
        assert!(ok(run.join("sub/vm.sock")).is_ok());
        assert!(ok(run.join("new/deeper/vm.sock")).is_ok());
        for (p, why) in [
            (private.join("vm.sock"), "outside"),
            (run.clone(), "outside"),
            (PathBuf::from("vm.sock"), "absolute"),
            (run.join("../private/vm.sock"), "'..'"),
            (run.join("./vm.sock"), "'..'"),
            (run.join("link/vm.sock"), "symbolic link"),
            (run.join("link"), "symbolic link"),
            (run.join("file"), "not a socket"),
            (run.join("file/vm.sock"), "not a directory"),
        ] {
            let e = ok(p.clone()).unwrap_err();
            assert!(e.contains(why), "{}: {e}", p.display());
            assert!(!e.contains('\n'));
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn only_admins_change() {
        let policy = Policy {
            owner: 1000,
            admin_gid: Some(50),
            socket_dirs: vec![PathBuf::from("/run/qswitch")],
        };
        let cred = |uid, gid, groups: &[u32]| PeerCred {
            pid: 1,
            uid,
            gid,
            groups: groups.to_vec(),
        };
        let del = Request::PortDel { name: "a".into() };
        let list = Request::PortList;
        for admin in [
            cred(0, 0, &[]),
            cred(1000, 1000, &[]),
            cred(7, 50, &[]),
            cred(7, 7, &[3, 50]),
        ] {
            assert!(policy.check(Some(&admin), &del).is_ok(), "{admin:?}");
        }
        for reader in [cred(7, 7, &[3]), cred(65534, 65534, &[])] {
            assert!(policy.check(Some(&reader), &list).is_ok());
            let e = policy.check(Some(&reader), &del).unwrap_err();
            assert!(e.starts_with("permission denied: 'port del'"), "{e}");
        }
        assert!(policy.check(None, &del).is_err());
        assert!(policy.check(None, &list).is_ok());
    }
}
