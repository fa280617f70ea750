//! The control socket: a Unix stream socket (mode 0600) carrying one JSON request line and
//! one JSON response line per connection. Requests are handled one at a time on the control
//! thread; a failed request changes nothing.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use qswitch_api::{Request, Response};
use qswitch_sys::epoll::{Epoll, Event};

use crate::daemon::Daemon;

/// Longest request line accepted.
const MAX_REQUEST: u64 = 64 * 1024;
/// Most control connections served at once.
const MAX_CLIENTS: usize = 32;

/// The bound socket; the file is removed on drop.
pub struct Socket {
    listener: UnixListener,
    path: PathBuf,
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
        })
    }
}

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Serves requests until `stop` is set.
pub fn serve(socket: Socket, daemon: &Daemon, stop: &AtomicBool) {
    let epoll = match Epoll::new().and_then(|e| e.add(socket.listener.as_raw_fd(), 0).map(|()| e)) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(error = %e, "control socket cannot be polled; stopping");
            stop.store(true, Ordering::Relaxed);
            return;
        }
    };
    let mut events = [Event::EMPTY; 4];
    let active = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|scope| {
        while !stop.load(Ordering::Relaxed) {
            if epoll.wait(&mut events, 200).unwrap_or(0) == 0 {
                continue;
            }
            while let Ok((stream, _)) = socket.listener.accept() {
                // One thread per connection, so a client that says nothing stalls nobody.
                if active.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                    active.fetch_sub(1, Ordering::AcqRel);
                    let _ = reply(&stream, &busy());
                    continue;
                }
                let active = active.clone();
                let spawned = std::thread::Builder::new()
                    .name("qs-control-conn".into())
                    .spawn_scoped(scope, move || {
                        if let Err(e) = handle(stream, daemon) {
                            tracing::debug!(error = %e, "control connection failed");
                        }
                        active.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    tracing::warn!("cannot start a control connection thread");
                }
            }
        }
    });
}

fn busy() -> Response {
    Response::Error {
        message: "too many control connections; try again".into(),
    }
}

fn handle(stream: UnixStream, daemon: &Daemon) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut line = Vec::new();
    let read = BufReader::new((&stream).take(MAX_REQUEST)).read_until(b'\n', &mut line);
    let response = match read {
        Err(e) => Response::Error {
            message: format!("bad request: {e}"),
        },
        Ok(_) => match serde_json::from_slice::<Request>(line.trim_ascii_end()) {
            Ok(req) => execute(req, daemon),
            Err(e) => Response::Error {
                message: format!("bad request: {e}"),
            },
        },
    };
    reply(&stream, &response)
}

fn reply(stream: &UnixStream, response: &Response) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(response).unwrap_or_default();
    out.push(b'\n');
    (&*stream).write_all(&out)
}

/// Carries out one request.
pub fn execute(req: Request, daemon: &Daemon) -> Response {
    let sw = &daemon.switch;
    let result = match req {
        Request::Ping => {
            return Response::Pong {
                version: env!("CARGO_PKG_VERSION").into(),
                pid: std::process::id(),
            }
        }
        Request::PortList => return Response::Ports { ports: sw.ports() },
        Request::Fdb => return Response::Fdb { entries: sw.fdb() },
        Request::Stats => return Response::Stats(Box::new(daemon.stats())),
        Request::PortAdd { port } => sw.add_port(&port).map(|_| ()),
        Request::PortDel { name } => sw.del_port(&name),
        Request::PortSet { name, update } => sw.update_port_policy(&name, &update).map(drop),
        Request::Placement => return Response::Placement(Box::new(sw.placement())),
        Request::PlacementPin { port, queue, cpu } => sw.pin(&port, queue, cpu),
        Request::PlacementMode { mode } => {
            sw.set_placement_mode(mode);
            Ok(())
        }
        Request::QosShow => return Response::Qos(Box::new(sw.qos_show())),
        Request::QosSet {
            port,
            min,
            max,
            weight,
            clear,
        } => sw
            .qos_set(
                &port,
                &qswitch_dp::qos::QosUpdate {
                    min,
                    max,
                    weight,
                    clear,
                },
            )
            .map(|_| ()),
        Request::Rss { port } => {
            return match sw.reta(&port) {
                Ok(r) => Response::Rss {
                    queues: r.queues().to_vec(),
                    table: r.table().to_vec(),
                },
                Err(e) => Response::Error {
                    message: error_chain(&e),
                },
            }
        }
    };
    match result {
        Ok(()) => Response::Ok,
        Err(e) => Response::Error {
            message: error_chain(&e),
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
