//! The HTTP server on `[switch] http`: `/metrics` (Prometheus), `/api/stats`, `/api/ports`,
//! `/api/placement`, `/api/series?since=MS` (JSON), and the dashboard at `/`.
//!
//! hyper (HTTP/1.1 only) on a single-threaded tokio runtime in one thread (`qs-http`): the
//! listening socket and every connection are driven by epoll, so an idle server costs no CPU
//! and a slow client costs a few kilobytes, not a thread. Limits: at most
//! [`MAX_CONNECTIONS`] connections at once (more get `503` and are closed), one request per
//! connection (`Connection: close`), a request head of at most [`MAX_HEAD`] bytes (hyper
//! answers a longer one with `431`) that must arrive within [`READ_TIMEOUT`], and
//! [`WRITE_TIMEOUT`] to take the response. Malformed requests get `400` from hyper. Only GET
//! and HEAD. Nothing here touches the workers: handlers read counters and the history, like
//! the control socket.

use std::convert::Infallible;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;

use crate::daemon::Daemon;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Largest request head (request line and headers); hyper's smallest buffer limit.
pub const MAX_HEAD: usize = 8192;
/// Time a client has to send its request head.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a client has to take the response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the server looks at the daemon's stop flag.
const STOP_CHECK: Duration = Duration::from_millis(100);

const DASHBOARD: &str = include_str!("dashboard.html");
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n\
    Content-Length: 5\r\nCache-Control: no-store\r\nConnection: close\r\n\r\nbusy\n";

/// Binds `addr` (before the switch starts, so a taken port is a start-up error).
pub fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on http {addr}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Serves until `term` is set.
pub fn serve(listener: TcpListener, daemon: &Arc<Daemon>, term: &AtomicBool) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("http: cannot start its runtime: {e}");
            return;
        }
    };
    rt.block_on(accept_loop(listener, daemon, term));
}

async fn accept_loop(listener: TcpListener, daemon: &Arc<Daemon>, term: &AtomicBool) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("http: {e}");
            return;
        }
    };
    let active = Arc::new(AtomicUsize::new(0));
    let mut stop_check = tokio::time::interval(STOP_CHECK);
    while !term.load(Ordering::Relaxed) {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning on the error.
                    tracing::debug!("http accept: {e}");
                    tokio::time::sleep(STOP_CHECK).await;
                    continue;
                }
            },
            _ = stop_check.tick() => continue,
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            tokio::spawn(async move {
                let mut s = stream;
                let _ = tokio::time::timeout(Duration::from_millis(100), s.write_all(BUSY)).await;
            });
            continue;
        }
        let (daemon, mine) = (daemon.clone(), active.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let response = respond(&daemon, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(READ_TIMEOUT)
                .max_buf_size(MAX_HEAD)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(READ_TIMEOUT + WRITE_TIMEOUT, conn).await {
                Ok(Err(e)) => tracing::debug!("http connection: {e}"),
                Err(_) => tracing::debug!("http connection: timed out"),
                Ok(Ok(())) => {}
            }
            mine.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// The value of `key` in a query string (no percent-decoding: our values are numbers).
pub fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// One response; hyper leaves out the body of an answer to HEAD.
fn respond(daemon: &Daemon, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            b"only GET and HEAD\n".to_vec(),
        );
    }
    let json = "application/json";
    let (status, kind, body): (StatusCode, &str, Vec<u8>) = match req.uri().path() {
        "/" | "/index.html" => (
            StatusCode::OK,
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
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text.into_bytes(),
            )
        }
        "/api/stats" => (StatusCode::OK, json, to_json(&daemon.stats())),
        "/api/ports" => (StatusCode::OK, json, to_json(&daemon.switch.ports())),
        "/api/placement" => (StatusCode::OK, json, to_json(&daemon.switch.placement())),
        "/api/series" => match query_param(req.uri().query().unwrap_or(""), "since")
            .map(str::parse::<u64>)
            .unwrap_or(Ok(0))
        {
            Ok(since) => {
                let h = daemon.history.lock();
                (StatusCode::OK, json, to_json(&h.since(since)))
            }
            Err(_) => (
                StatusCode::BAD_REQUEST,
                "text/plain",
                b"since must be milliseconds of uptime\n".to_vec(),
            ),
        },
        _ => (StatusCode::NOT_FOUND, "text/plain", b"not found\n".to_vec()),
    };
    reply(status, kind, body)
}

fn reply(status: StatusCode, kind: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static(kind));
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_params() {
        assert_eq!(query_param("a=1&since=20", "since"), Some("20"));
        assert_eq!(query_param("since", "since"), None);
        assert_eq!(query_param("", "since"), None);
    }
}
