//! The exporter: flow export's control side (issue 32, docs/visibility.md).
//!
//! One thread (`qs-export`) wakes every [`TICK`] while something is exported (with nothing
//! configured it sleeps until [`Export::configure`] or [`Export::wake`]): it takes the flow records and sFlow
//! samples the workers left in their slots ([`qswitch_dp::export::tap`]), expires the
//! workers' flow caches once a second (idle and active timeouts), encodes IPFIX messages
//! (templates again every 10 s) and sFlow datagrams, and sends them over UDP to the
//! collectors; every `polling` seconds it adds one sFlow counter sample per port from the
//! switch's port counters. [`Export::configure`] opens the sockets first (an address this
//! host cannot send to is a one-line error and nothing changes), then swaps the tap the
//! workers feed and flushes the old one (its flows end with *forced end*).
//!
//! Counted ([`ExportCounters`], in `/metrics` and `qswitch export show`): records sent,
//! records ended by reason, records and samples dropped (a worker's full list), datagrams
//! and send errors per protocol.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;
use qswitch_api::config::{IpfixConfig, SflowConfig};
use qswitch_dp::export::tap::Sample;
use qswitch_dp::export::{
    CacheConfig, ExportTap, FlowRecord, FlowSample, IfCounters, IpfixEncoder, SflowEncoder,
    TapConfig,
};
use qswitch_dp::Switch;

/// How often the exporter takes what the workers hold.
pub const TICK: Duration = Duration::from_millis(100);
/// Flows each worker's cache holds (about 100 bytes each).
pub const CACHE_FLOWS: usize = 16_384;
/// The IPFIX observation domain.
const DOMAIN: u32 = 1;

pub use qswitch_api::request::ExportCounters;

struct Ipfix {
    cfg: IpfixConfig,
    sock: UdpSocket,
    enc: IpfixEncoder,
}

struct Sflow {
    cfg: SflowConfig,
    sock: UdpSocket,
    enc: SflowEncoder,
    next_poll: Instant,
}

#[derive(Default)]
struct State {
    ipfix: Option<Ipfix>,
    sflow: Option<Sflow>,
    counters: ExportCounters,
    next_expire: Option<Instant>,
}

/// The exporter's state, shared by its thread and the control side.
#[derive(Default)]
pub struct Export {
    state: Mutex<State>,
    /// Signalled when the configuration changes or the daemon stops ([`Export::wake`]): the
    /// thread sleeps on it while nothing is exported.
    changed: parking_lot::Condvar,
}

/// A UDP socket connected to `collector` (so that an address this host cannot send to
/// fails here, not silently later).
fn connect(table: &str, collector: SocketAddr) -> anyhow::Result<UdpSocket> {
    let any: IpAddr = match collector {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let sock = UdpSocket::bind((any, 0))
        .and_then(|s| s.connect(collector).map(|()| s))
        .with_context(|| {
            format!("[switch.{table}] collector = \"{collector}\": this host cannot send to it")
        })?;
    sock.set_nonblocking(true)
        .context("cannot make the export socket non-blocking")?;
    Ok(sock)
}

/// Whether this host can send to the collectors `ipfix` and `sflow` name (`qswitch run`
/// and `--check` ask before anything starts).
pub fn check(ipfix: Option<IpfixConfig>, sflow: Option<SflowConfig>) -> anyhow::Result<()> {
    if let Some(c) = ipfix {
        connect("ipfix", c.collector)?;
    }
    if let Some(c) = sflow {
        connect("sflow", c.collector)?;
    }
    Ok(())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Export {
    /// What is exported now.
    pub fn config(&self) -> (Option<IpfixConfig>, Option<SflowConfig>) {
        let st = self.state.lock();
        (
            st.ipfix.as_ref().map(|i| i.cfg),
            st.sflow.as_ref().map(|s| s.cfg),
        )
    }

    pub fn counters(&self) -> ExportCounters {
        self.state.lock().counters
    }

    /// Exports as `ipfix` and `sflow` say from now on (`None`: not that protocol). An
    /// unchanged protocol keeps its socket, encoder and the flows in the caches.
    pub fn configure(
        &self,
        sw: &Switch,
        ipfix: Option<IpfixConfig>,
        sflow: Option<SflowConfig>,
    ) -> anyhow::Result<()> {
        let mut st = self.state.lock();
        let same_ipfix = st.ipfix.as_ref().map(|i| i.cfg) == ipfix;
        let same_sflow = st.sflow.as_ref().map(|s| s.cfg) == sflow;
        if same_ipfix && same_sflow {
            return Ok(());
        }
        // Everything that can fail first: nothing changes unless all of it works.
        let new_ipfix = match ipfix.filter(|_| !same_ipfix) {
            Some(cfg) => Some(Ipfix {
                cfg,
                sock: connect("ipfix", cfg.collector)?,
                enc: IpfixEncoder::new(
                    DOMAIN,
                    cfg.sampling,
                    qswitch_dp::export::ipfix::DEFAULT_MAX_LEN,
                ),
            }),
            None => None,
        };
        let new_sflow = match sflow.filter(|_| !same_sflow) {
            Some(cfg) => {
                let sock = connect("sflow", cfg.collector)?;
                let agent = sock
                    .local_addr()
                    .map_or(Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
                Some(Sflow {
                    cfg,
                    sock,
                    enc: SflowEncoder::new(agent, 0, 1400),
                    next_poll: Instant::now(),
                })
            }
            None => None,
        };
        // The workers' caches hold IPFIX flows: a changed IPFIX setting starts new caches
        // (the old flows are flushed to the old collector with end reason "forced end").
        let tap = TapConfig {
            ipfix: ipfix.map(|c| CacheConfig {
                capacity: CACHE_FLOWS,
                sampling: c.sampling,
                active_timeout_ms: u64::from(c.active_timeout) * 1000,
                idle_timeout_ms: u64::from(c.idle_timeout) * 1000,
            }),
            sflow: sflow.map(|c| c.sampling),
        };
        let old = sw.set_export(Some(tap));
        if let Some(old) = old {
            self.drain(&mut st, sw, &old, true);
        }
        if !same_ipfix {
            st.ipfix = new_ipfix;
        }
        if !same_sflow {
            st.sflow = new_sflow;
        }
        self.changed.notify_all();
        let what: Vec<String> = [
            ipfix.map(|c| format!("ipfix to {} (1 in {})", c.collector, c.sampling)),
            sflow.map(|c| format!("sflow to {} (1 in {})", c.collector, c.sampling)),
        ]
        .into_iter()
        .flatten()
        .collect();
        if what.is_empty() {
            tracing::info!("flow export off");
        } else {
            tracing::info!("flow export: {}", what.join(", "));
        }
        Ok(())
    }

    /// One round: what the workers hold, sent (the exporter thread calls it every
    /// [`TICK`]).
    pub fn tick(&self, sw: &Switch) {
        let mut st = self.state.lock();
        let Some(tap) = sw.export_tap() else {
            return;
        };
        let now = Instant::now();
        let expire = st.next_expire.is_none_or(|t| now >= t);
        if expire {
            st.next_expire = Some(now + Duration::from_secs(1));
        }
        self.drain_inner(&mut st, sw, &tap, expire, false);
        if let Some(sf) = st.sflow.as_mut() {
            if sf.cfg.polling > 0 && now >= sf.next_poll {
                sf.next_poll = now + Duration::from_secs(u64::from(sf.cfg.polling));
                let counters = if_counters(sw);
                let uptime = (sw.now() / 1_000_000) as u32;
                let n = counters.len() as u64;
                let (sent, errors) = send_all(&sf.sock, sf.enc.encode(&[], &counters, uptime));
                st.counters.sflow_counter_samples += n;
                st.counters.sflow_datagrams += sent;
                st.counters.sflow_send_errors += errors;
            }
        }
    }

    /// Stops exporting: the caches flushed and sent, the sockets closed.
    pub fn stop(&self, sw: &Switch) {
        let _ = self.configure(sw, None, None);
    }

    fn drain(&self, st: &mut State, sw: &Switch, tap: &Arc<ExportTap>, flush: bool) {
        self.drain_inner(st, sw, tap, false, flush)
    }

    fn drain_inner(
        &self,
        st: &mut State,
        sw: &Switch,
        tap: &Arc<ExportTap>,
        expire: bool,
        flush: bool,
    ) {
        let now_sw_ms = sw.now() / 1_000_000;
        let unix = unix_ms();
        let mut records: Vec<FlowRecord> = Vec::new();
        let mut samples: Vec<Sample> = Vec::new();
        let mut dropped = (0u64, 0u64);
        for slot in tap.slots() {
            let mut s = slot.lock();
            // Swapped for an empty list of the same capacity (the worker never allocates),
            // only when there is something to take.
            if !s.records.is_empty() {
                let cap = s.records.capacity();
                records.append(&mut std::mem::replace(
                    &mut s.records,
                    Vec::with_capacity(cap),
                ));
            }
            if !s.samples.is_empty() {
                let cap = s.samples.capacity();
                samples.append(&mut std::mem::replace(
                    &mut s.samples,
                    Vec::with_capacity(cap),
                ));
            }
            if let Some(c) = s.cache.as_mut() {
                if flush {
                    c.flush(&mut records);
                } else if expire {
                    c.expire(now_sw_ms, &mut records);
                }
            }
            dropped.0 += std::mem::take(&mut s.dropped_records);
            dropped.1 += std::mem::take(&mut s.dropped_samples);
        }
        st.counters.records_dropped += dropped.0;
        st.counters.samples_dropped += dropped.1;
        // Switch clock to Unix time.
        let offset = unix.saturating_sub(now_sw_ms);
        for r in &mut records {
            r.start_ms += offset;
            r.end_ms += offset;
            match r.end_reason {
                qswitch_dp::export::EndReason::IdleTimeout => st.counters.ended_idle += 1,
                qswitch_dp::export::EndReason::ActiveTimeout => st.counters.ended_active += 1,
                qswitch_dp::export::EndReason::ForcedEnd => st.counters.ended_forced += 1,
                qswitch_dp::export::EndReason::LackOfResources => st.counters.ended_evicted += 1,
            }
        }
        if let Some(ip) = st.ipfix.as_mut() {
            // Also with no records: the templates when they are due.
            let templates = ip.enc.template_sends();
            let msgs = ip.enc.encode(&records, unix);
            st.counters.ipfix_templates += ip.enc.template_sends() - templates;
            let (sent, errors) = send_all(&ip.sock, msgs);
            st.counters.ipfix_records += records.len() as u64;
            st.counters.ipfix_messages += sent;
            st.counters.ipfix_send_errors += errors;
        }
        if let Some(sf) = st.sflow.as_mut() {
            if !samples.is_empty() {
                let flows: Vec<FlowSample<'_>> = samples
                    .iter()
                    .map(|s| FlowSample {
                        source: s.input,
                        input: s.input,
                        output: s.output,
                        sampling_rate: s.rate,
                        sample_pool: s.pool,
                        drops: s.drops,
                        frame: &s.header[..usize::from(s.header_len)],
                        frame_len: Some(s.frame_len),
                    })
                    .collect();
                let uptime = (now_sw_ms) as u32;
                let (sent, errors) = send_all(&sf.sock, sf.enc.encode(&flows, &[], uptime));
                st.counters.sflow_flow_samples += flows.len() as u64;
                st.counters.sflow_datagrams += sent;
                st.counters.sflow_send_errors += errors;
            }
        }
    }

    /// The `/metrics` families of flow export (none while it never ran).
    pub fn metrics(&self) -> String {
        let c = self.counters();
        if self.config() == (None, None) && c == ExportCounters::default() {
            return String::new();
        }
        let mut o = String::new();
        let fam = |o: &mut String, name: &str, help: &str, rows: &[(&str, u64)]| {
            o.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for (labels, v) in rows {
                if labels.is_empty() {
                    o.push_str(&format!("{name} {v}\n"));
                } else {
                    o.push_str(&format!("{name}{{{labels}}} {v}\n"));
                }
            }
        };
        fam(
            &mut o,
            "qswitch_export_records_total",
            "IPFIX flow records sent.",
            &[("", c.ipfix_records)],
        );
        fam(
            &mut o,
            "qswitch_export_flows_ended_total",
            "IPFIX flow records by end reason (evicted: a full cache set).",
            &[
                ("reason=\"idle\"", c.ended_idle),
                ("reason=\"active\"", c.ended_active),
                ("reason=\"forced\"", c.ended_forced),
                ("reason=\"evicted\"", c.ended_evicted),
            ],
        );
        fam(
            &mut o,
            "qswitch_export_sflow_samples_total",
            "sFlow samples sent, by kind.",
            &[
                ("kind=\"flow\"", c.sflow_flow_samples),
                ("kind=\"counter\"", c.sflow_counter_samples),
            ],
        );
        fam(
            &mut o,
            "qswitch_export_drops_total",
            "Flow records and sFlow samples dropped because a worker's list for the exporter was full.",
            &[
                ("kind=\"record\"", c.records_dropped),
                ("kind=\"sample\"", c.samples_dropped),
            ],
        );
        fam(
            &mut o,
            "qswitch_export_datagrams_total",
            "UDP datagrams sent to the collectors, by protocol.",
            &[
                ("protocol=\"ipfix\"", c.ipfix_messages),
                ("protocol=\"sflow\"", c.sflow_datagrams),
            ],
        );
        fam(
            &mut o,
            "qswitch_export_send_errors_total",
            "UDP datagrams the kernel refused (collector unreachable, buffer full), by protocol.",
            &[
                ("protocol=\"ipfix\"", c.ipfix_send_errors),
                ("protocol=\"sflow\"", c.sflow_send_errors),
            ],
        );
        o
    }
}

/// Sends each datagram; returns (sent, failed).
fn send_all(sock: &UdpSocket, datagrams: Vec<Vec<u8>>) -> (u64, u64) {
    let (mut sent, mut errors) = (0, 0);
    for d in datagrams {
        match sock.send(&d) {
            Ok(_) => sent += 1,
            Err(_) => errors += 1,
        }
    }
    (sent, errors)
}

/// Every port's counters as sFlow generic interface counters, from `qswitch stats`.
/// qswitch does not count unicast, multicast and broadcast apart: every frame is in the
/// unicast counters; every drop of the port (rx and tx) is in `in_discards`.
fn if_counters(sw: &Switch) -> Vec<IfCounters> {
    let ids: std::collections::HashMap<String, u32> = sw.export_if_indexes().into_iter().collect();
    sw.stats()
        .ports
        .iter()
        .filter_map(|p| {
            Some(IfCounters {
                if_index: *ids.get(&p.name)?,
                speed: 0,
                up: true,
                in_octets: p.rx_bytes,
                in_ucast: p.rx_packets as u32,
                in_discards: p.drops.values().sum::<u64>() as u32,
                out_octets: p.tx_bytes,
                out_ucast: p.tx_packets as u32,
                ..IfCounters::default()
            })
        })
        .collect()
}

/// The exporter thread's loop, until `term` or the switch stops; flushes at the end.
pub fn run(export: &Export, sw: &Switch, term: &std::sync::atomic::AtomicBool) {
    use std::sync::atomic::Ordering;
    let ending = || term.load(Ordering::Relaxed) || sw.stopping();
    while !ending() {
        export.tick(sw);
        let mut st = export.state.lock();
        if st.ipfix.is_some() || st.sflow.is_some() {
            drop(st);
            std::thread::sleep(TICK);
            continue;
        }
        // Nothing exported: no tick to run until a configuration or the end wakes it (both
        // change what is looked at under the lock, so no wake-up is missed).
        while st.ipfix.is_none() && st.sflow.is_none() && !ending() {
            export.changed.wait(&mut st);
        }
    }
    export.stop(sw);
}

impl Export {
    /// Wakes the exporter thread: the daemon calls it after setting its `term` flag, so a
    /// thread sleeping with nothing to export sees the end.
    pub fn wake(&self) {
        let _st = self.state.lock();
        self.changed.notify_all();
    }
}
