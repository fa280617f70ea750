//! The HTTP server on `[switch] http`: `/metrics` (Prometheus), `/api/stats`, `/api/ports`,
//! `/api/placement`, `/api/series?since=MS&limit=N` (JSON; a page of at most N points and
//! 4 MiB, `more` when the next `since` has more), and the dashboard at `/`.
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
//!
//! Hostile clients (issue 15, F9): when every slot is taken, or a client (by IP address)
//! already holds [`MAX_PER_CLIENT`] connections, a new connection evicts the oldest one that
//! has not finished sending its request head (the slowest), so a crowd of slow or idle
//! connections cannot keep a legitimate scraper out; only when all are mid-response does a
//! newcomer get `503`. A slot is held by a guard owned by the connection's task, so an
//! aborted or failed task frees it. The `Host` header must name the server (see
//! [`HostPolicy`]): anything else gets `421`, which defeats DNS rebinding (a page of
//! `attacker.example` whose name later resolves to this address). Binding a non-loopback
//! address logs a warning: nothing here authenticates.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;

use crate::daemon::Daemon;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 16;
/// Connections one client (IP address) may hold at once.
pub const MAX_PER_CLIENT: usize = 8;
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

/// The bound listener and the `Host` names it answers to.
pub struct Listener {
    tcp: TcpListener,
    hosts: HostPolicy,
}

/// Binds `addr` (before the switch starts, so a taken port is a start-up error). `hosts` is
/// `[switch] http_hosts`: extra names the server answers to. Warns when the address is not
/// loopback.
pub fn bind(addr: SocketAddr, hosts: &[String]) -> anyhow::Result<Listener> {
    let l = TcpListener::bind(addr).with_context(|| format!("cannot listen on http {addr}"))?;
    l.set_nonblocking(true)?;
    if !addr.ip().is_loopback() {
        tracing::warn!(
            "http on {addr}, which is not a loopback address: anyone who can reach it reads \
             the switch's ports, counters and placement (the server has no authentication)"
        );
    }
    Ok(Listener {
        tcp: l,
        hosts: HostPolicy::new(addr.ip(), hosts),
    })
}

/// Which `Host` headers are served: any IP literal (DNS rebinding needs a name), `localhost`
/// when the server listens on loopback (or on every address), and the names configured in
/// `[switch] http_hosts`. A request without `Host` (HTTP/1.0 tools) is served: browsers
/// always send one. Ports are ignored; names compare case-insensitively, without a
/// trailing dot.
#[derive(Debug, Clone)]
pub struct HostPolicy {
    names: Vec<String>,
}

impl HostPolicy {
    pub fn new(bind: IpAddr, extra: &[String]) -> HostPolicy {
        let mut names: Vec<String> = extra.iter().map(|h| normalize(h)).collect();
        if bind.is_loopback() || bind.is_unspecified() {
            names.push("localhost".into());
        }
        HostPolicy { names }
    }

    /// Whether a request with this `Host` value is served.
    pub fn allows(&self, host: Option<&[u8]>) -> bool {
        let Some(host) = host else {
            return true;
        };
        let Ok(host) = std::str::from_utf8(host) else {
            return false;
        };
        // "[v6]:port", "[v6]", "v4:port", "v4", "name:port", "name".
        let name = if let Some(rest) = host.strip_prefix('[') {
            match rest.split_once(']') {
                Some((ip, _)) => return ip.parse::<std::net::Ipv6Addr>().is_ok(),
                None => return false,
            }
        } else {
            host.rsplit_once(':').map_or(host, |(h, _)| h)
        };
        if name.parse::<std::net::Ipv4Addr>().is_ok() {
            return true;
        }
        let name = normalize(name);
        self.names.contains(&name)
    }
}

fn normalize(host: &str) -> String {
    host.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// Serves until `term` is set.
pub fn serve(listener: Listener, daemon: &Arc<Daemon>, term: &AtomicBool) {
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

/// One connection's slot.
struct Slot {
    id: u64,
    client: IpAddr,
    accepted: Instant,
    /// The request head has arrived: the connection is only being answered.
    answered: Arc<AtomicBool>,
    abort: Option<tokio::task::AbortHandle>,
}

/// The connections being served.
#[derive(Default)]
struct Slots(Mutex<Vec<Slot>>);

/// Frees its slot when the connection's task ends in any way (finished, failed, aborted).
struct SlotGuard {
    slots: Arc<Slots>,
    id: u64,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let mut v = self.slots.0.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|s| s.id != self.id);
    }
}

impl Slots {
    /// Makes room for a connection from `client`: evicts the slowest connection if the
    /// client or the server is at its limit. False if there is no room (everyone is being
    /// answered).
    fn make_room(&self, client: IpAddr) -> bool {
        let mut v = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = v.iter().filter(|s| s.client == client).count();
        let victim = if mine >= MAX_PER_CLIENT {
            oldest_unanswered(&v, Some(client))
        } else if v.len() >= MAX_CONNECTIONS {
            oldest_unanswered(&v, None)
        } else {
            return true;
        };
        let Some(i) = victim else {
            return false;
        };
        let slot = v.swap_remove(i);
        tracing::debug!(client = %slot.client, "http: full; dropping the slowest connection");
        if let Some(a) = slot.abort {
            a.abort();
        }
        true
    }
}

fn oldest_unanswered(v: &[Slot], client: Option<IpAddr>) -> Option<usize> {
    v.iter()
        .enumerate()
        .filter(|(_, s)| client.is_none_or(|c| s.client == c))
        .filter(|(_, s)| !s.answered.load(Ordering::Relaxed))
        .min_by_key(|(_, s)| s.accepted)
        .map(|(i, _)| i)
}

async fn accept_loop(listener: Listener, daemon: &Arc<Daemon>, term: &AtomicBool) {
    let hosts = Arc::new(listener.hosts);
    let listener = match tokio::net::TcpListener::from_std(listener.tcp) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("http: {e}");
            return;
        }
    };
    let slots = Arc::new(Slots::default());
    let mut next_id = 0u64;
    let mut stop_check = tokio::time::interval(STOP_CHECK);
    while !term.load(Ordering::Relaxed) {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning on the error.
                    tracing::debug!("http accept: {e}");
                    tokio::time::sleep(STOP_CHECK).await;
                    continue;
                }
            },
            _ = stop_check.tick() => continue,
        };
        if !slots.make_room(peer.ip()) {
            tokio::spawn(async move {
                let mut s = stream;
                let _ = tokio::time::timeout(Duration::from_millis(100), s.write_all(BUSY)).await;
            });
            continue;
        }
        next_id += 1;
        let id = next_id;
        let answered = Arc::new(AtomicBool::new(false));
        let guard = SlotGuard {
            slots: slots.clone(),
            id,
        };
        let (daemon, hosts, flag) = (daemon.clone(), hosts.clone(), answered.clone());
        let task = tokio::spawn(async move {
            let _guard = guard;
            let service = hyper::service::service_fn(move |req| {
                flag.store(true, Ordering::Relaxed);
                let response = if hosts.allows(req.headers().get(HOST).map(HeaderValue::as_bytes)) {
                    respond(&daemon, &req)
                } else {
                    reply(
                        StatusCode::MISDIRECTED_REQUEST,
                        "text/plain",
                        b"unknown Host; add it to [switch] http_hosts\n".to_vec(),
                    )
                };
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
        });
        // The task has not run yet (one thread): its slot is in place before it can end.
        slots
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Slot {
                id,
                client: peer.ip(),
                accepted: Instant::now(),
                answered,
                abort: Some(task.abort_handle()),
            });
        // Let the connections' tasks run before the next accept: an accept that is ready at
        // once does not yield (tokio's budget allows a long run of them), so a crowd that
        // reconnects as fast as it is evicted could otherwise evict, one by one, a newcomer
        // whose whole request is already waiting in its socket, before its task ever read
        // it (and marked it answered).
        tokio::task::yield_now().await;
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
            let mut text = crate::metrics::render(
                &daemon.switch.stats(),
                &daemon.switch.ports(),
                &daemon.switch.placement(),
            );
            text.push_str(&crate::metrics::render_mirrors(&daemon.switch.mirrors()));
            text.push_str(&daemon.export.metrics());
            text.push_str(&crate::metrics::render_lldp(
                &daemon.switch.lldp(None).unwrap_or_default(),
            ));
            text.push_str(&crate::metrics::render_firewall(
                &crate::firewall_cli::ct_stats(daemon),
            ));
            (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text.into_bytes(),
            )
        }
        "/api/stats" => (StatusCode::OK, json, to_json(&daemon.stats())),
        "/api/ports" => (StatusCode::OK, json, to_json(&daemon.switch.ports())),
        "/api/placement" => (StatusCode::OK, json, to_json(&daemon.switch.placement())),
        "/api/series" => {
            let query = req.uri().query().unwrap_or("");
            let since = query_param(query, "since").map_or(Ok(0), str::parse::<u64>);
            let limit = query_param(query, "limit")
                .map_or(Ok(crate::series::CAPACITY), str::parse::<usize>);
            match (since, limit) {
                (Ok(since), Ok(limit)) => {
                    let h = daemon.history.lock();
                    (StatusCode::OK, json, to_json(&h.since(since, limit)))
                }
                _ => (
                    StatusCode::BAD_REQUEST,
                    "text/plain",
                    b"since must be milliseconds of uptime, limit a number of points\n".to_vec(),
                ),
            }
        }
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

/// The dashboard's QoS table (`qos` of `/api/series`): every port that has a setting, as
/// `qos show` lists them: a guarantee, a limit or a weight (with or without an uplink to
/// compete for), an uplink's capacity, or a port that competes for an uplink (it gets an
/// allocation). Empty: "no QoS configured".
pub fn qos_rows(report: &qswitch_api::request::QosReport) -> Vec<crate::series::QosRow> {
    report
        .ports
        .iter()
        .filter(|p| {
            p.min.is_some()
                || p.max.is_some()
                || p.weight != 1
                || p.capacity.is_some()
                || p.uplink.is_some()
        })
        .map(|p| crate::series::QosRow {
            port: p.name.clone(),
            min_bps: p.min.unwrap_or(0) as f64,
            max_bps: p.max.unwrap_or(0) as f64,
            alloc_bps: p.alloc_bps.unwrap_or(0) as f64,
            uplink: p.uplink.clone(),
            capacity_bps: p.capacity.unwrap_or(0) as f64,
            weight: p.weight,
        })
        .collect()
}

fn to_json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}").into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_policy() {
        let lo = HostPolicy::new("127.0.0.1".parse().unwrap(), &[]);
        for ok in [
            None,
            Some("127.0.0.1:9470"),
            Some("localhost:9470"),
            Some("LOCALHOST."),
            Some("[::1]:9470"),
            Some("10.1.2.3"),
        ] {
            assert!(lo.allows(ok.map(str::as_bytes)), "{ok:?}");
        }
        for bad in [
            "attacker.example",
            "attacker.example:9470",
            "localhost.attacker.example",
            "[bad",
        ] {
            assert!(!lo.allows(Some(bad.as_bytes())), "{bad}");
        }
        let public = HostPolicy::new("192.0.2.1".parse().unwrap(), &["Switch.Example".into()]);
        assert!(!public.allows(Some(b"localhost")));
        assert!(public.allows(Some(b"switch.example:80")));
        assert!(public.allows(Some(b"192.0.2.1:80")));
        assert!(!public.allows(Some(b"attacker.example")));
    }

    fn qos_port(name: &str) -> qswitch_api::request::QosPort {
        qswitch_api::request::QosPort {
            name: name.into(),
            uplink: None,
            capacity: None,
            min: None,
            max: None,
            weight: 1,
            alloc_bps: None,
            demand_bps: 0,
            rate_bps: 0.0,
            alloc_last_second: None,
            throttled: 0,
            history: Vec::new(),
            bond_members_up: None,
        }
    }

    /// Issue 32 item 5: a port with only `max = "300M"` and no uplink is a QoS setting (the
    /// CLI lists it); so are an uplink's capacity, a weight and competing for an uplink. A
    /// port with nothing set is not a row.
    #[test]
    fn qos_rows_list_every_port_with_a_setting() {
        let report = |ports| qswitch_api::request::QosReport {
            ticks: 0,
            seconds: 0,
            reservable: 0.9,
            ports,
        };
        assert!(qos_rows(&report(vec![qos_port("plain")])).is_empty());
        let capped = qswitch_api::request::QosPort {
            max: Some(300_000_000),
            alloc_bps: Some(300_000_000),
            ..qos_port("capped")
        };
        let rows = qos_rows(&report(vec![qos_port("plain"), capped]));
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].port, "capped");
        assert_eq!(rows[0].max_bps, 3e8);
        assert_eq!(rows[0].uplink, None);
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[0]["max_bps"], 3e8);
        assert!(json[0]["uplink"].is_null());

        let up = qswitch_api::request::QosPort {
            capacity: Some(1_000_000_000),
            ..qos_port("up")
        };
        let toward = qswitch_api::request::QosPort {
            uplink: Some("up".into()),
            ..qos_port("toward")
        };
        let heavy = qswitch_api::request::QosPort {
            weight: 3,
            ..qos_port("heavy")
        };
        let names: Vec<String> = qos_rows(&report(vec![up, toward, heavy, qos_port("plain")]))
            .into_iter()
            .map(|r| r.port)
            .collect();
        assert_eq!(names, ["up", "toward", "heavy"]);
    }

    #[test]
    fn query_params() {
        assert_eq!(query_param("a=1&since=20", "since"), Some("20"));
        assert_eq!(query_param("since", "since"), None);
        assert_eq!(query_param("", "since"), None);
    }
}
