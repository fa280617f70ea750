//! The HTTP server on `[switch] http`: `/metrics` (Prometheus), `/api/stats`, `/api/ports`,
//! `/api/placement`, `/api/series?since=MS` (JSON), and the dashboard at `/`.
//!
//! Deliberately small: a std `TcpListener` polled by one thread (`qs-http`), one short-lived
//! thread per connection, at most [`MAX_CONNECTIONS`] at once (more get `503` and are
//! closed), one request per connection (`Connection: close`), a request head of at most
//! [`MAX_HEAD`] bytes that must arrive within [`READ_TIMEOUT`]. Only GET and HEAD. Nothing
//! here touches the workers: handlers read counters and the history, like the control socket.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::daemon::Daemon;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Largest request head (request line and headers).
pub const MAX_HEAD: usize = 8192;
/// Time a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a client has to take the response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

const DASHBOARD: &str = include_str!("dashboard.html");

/// Binds `addr` (before the switch starts, so a taken port is a start-up error).
pub fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on http {addr}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Accepts until `term` is set.
pub fn serve(listener: TcpListener, daemon: &Arc<Daemon>, term: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    while !term.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
                if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    active.fetch_sub(1, Ordering::AcqRel);
                    let mut s = stream;
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = respond(&mut s, false, 503, "text/plain", b"busy\n");
                    continue;
                }
                let (daemon, mine) = (daemon.clone(), active.clone());
                let spawned = std::thread::Builder::new()
                    .name("qs-http-conn".into())
                    .spawn(move || {
                        let mut s = stream;
                        handle(&mut s, &daemon);
                        mine.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    active.fetch_sub(1, Ordering::AcqRel);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::debug!("http accept: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// A parsed request line.
#[derive(Debug, PartialEq, Eq)]
pub struct Head<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
}

/// Parses the request line of `head` (`METHOD TARGET HTTP/1.x`).
pub fn parse_head(head: &str) -> Option<Head<'_>> {
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return None;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Some(Head {
        method,
        path,
        query,
    })
}

/// The value of `key` in a query string (no percent-decoding: our values are numbers).
pub fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// Reads the request head: up to the blank line, [`MAX_HEAD`] bytes, [`READ_TIMEOUT`].
fn read_head(s: &mut TcpStream) -> Option<String> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        s.set_read_timeout(Some(left)).ok()?;
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return String::from_utf8(buf).ok();
        }
        if buf.len() > MAX_HEAD {
            return None;
        }
    }
}

fn handle(s: &mut TcpStream, daemon: &Daemon) {
    let Some(text) = read_head(s) else {
        let _ = respond(s, false, 400, "text/plain", b"bad request\n");
        return;
    };
    let Some(head) = parse_head(&text) else {
        let _ = respond(s, false, 400, "text/plain", b"bad request\n");
        return;
    };
    let head_only = head.method == "HEAD";
    if head.method != "GET" && !head_only {
        let _ = respond(s, false, 405, "text/plain", b"only GET and HEAD\n");
        return;
    }
    let json = "application/json";
    let (status, kind, body): (u16, &str, Vec<u8>) = match head.path {
        "/" | "/index.html" => (
            200,
            "text/html; charset=utf-8",
            DASHBOARD.as_bytes().to_vec(),
        ),
        "/metrics" => {
            let text = crate::metrics::render(
                &daemon.switch.stats(),
                &daemon.switch.ports(),
                &daemon.switch.placement(),
            );
            (
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                text.into_bytes(),
            )
        }
        "/api/stats" => (200, json, to_json(&daemon.stats())),
        "/api/ports" => (200, json, to_json(&daemon.switch.ports())),
        "/api/placement" => (200, json, to_json(&daemon.switch.placement())),
        "/api/series" => match query_param(head.query, "since")
            .map(str::parse::<u64>)
            .unwrap_or(Ok(0))
        {
            Ok(since) => {
                let h = daemon.history.lock();
                (200, json, to_json(&h.since(since)))
            }
            Err(_) => (
                400,
                "text/plain",
                b"since must be milliseconds of uptime\n".to_vec(),
            ),
        },
        _ => (404, "text/plain", b"not found\n".to_vec()),
    };
    let _ = respond(s, head_only, status, kind, &body);
}

fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes())
}

fn respond(
    s: &mut TcpStream,
    head_only: bool,
    status: u16,
    kind: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        _ => "Service Unavailable",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
         Cache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    if !head_only {
        s.write_all(body)?;
    }
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_lines() {
        assert_eq!(
            parse_head("GET /api/series?since=5 HTTP/1.1\r\nHost: x"),
            Some(Head {
                method: "GET",
                path: "/api/series",
                query: "since=5"
            })
        );
        for bad in [
            "",
            "GET",
            "GET /",
            "GET x HTTP/1.1",
            "GET / HTTP/2",
            "GET / HTTP/1.1 x",
            "\u{0}",
        ] {
            assert_eq!(parse_head(bad), None, "{bad:?}");
        }
        assert_eq!(query_param("a=1&since=20", "since"), Some("20"));
        assert_eq!(query_param("since", "since"), None);
    }
}
