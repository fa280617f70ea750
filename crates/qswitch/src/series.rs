//! The last 15 minutes, one point per second: per-port and per-queue rates and drops,
//! per-worker busy %, CPU %, sleeps and context switches per second, placement changes, and
//! room for what other subsystems feed in (QoS allocations, named gauges).
//!
//! The daemon's 1-second sampler calls [`History::push`] with two consecutive
//! [`StatsReport`]s; the HTTP server reads. A ring of at most [`CAPACITY`] points and at most
//! [`HISTORY_BYTES`] (the points' size as JSON): the oldest points go when a new one comes,
//! so memory stays bounded however long the daemon runs and however many ports and queues
//! it has. A point lists at most [`MAX_QUEUE_POINTS`] queues (the ports' rates are always
//! there; `queues_omitted` counts the rest), and [`History::since`] answers in pages of at
//! most [`PAGE_BYTES`] (issue 27 F8: 300 ports of 256 queues grew the history by 2.4 MB a
//! second, and one `/api/series` answer was 145 MB).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use qswitch_api::request::StatsReport;
use serde::Serialize;

/// Points kept: 15 minutes of 1-second samples (fewer when they exceed [`HISTORY_BYTES`]).
pub const CAPACITY: usize = 900;
/// Most bytes the points take (as JSON, which is also about what they take in memory).
pub const HISTORY_BYTES: usize = 32 << 20;
/// Most per-queue entries in one point.
pub const MAX_QUEUE_POINTS: usize = 1024;
/// Most bytes of points in one answer of [`History::since`] (at least one point is given).
pub const PAGE_BYTES: usize = 4 << 20;
/// Placement changes kept.
pub const EVENT_CAPACITY: usize = 200;

/// One second.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Point {
    /// Daemon uptime at the end of the second, in milliseconds (the series' clock).
    pub t_ms: u64,
    /// Wall-clock time at the end of the second (Unix milliseconds), for display.
    pub unix_ms: u64,
    pub process_cpu_pct: f64,
    /// Shared with the point before when no port moved a frame ([`History::push_quiet`]).
    #[serde(serialize_with = "shared_ports")]
    pub ports: Arc<Vec<PortPoint>>,
    pub workers: Vec<WorkerPoint>,
    /// Named values fed by other subsystems for this second (e.g. `qos.<port>.alloc_bps`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub gauges: BTreeMap<String, f64>,
    /// Queues left out of the ports' `queues` beyond [`MAX_QUEUE_POINTS`].
    #[serde(skip_serializing_if = "is_zero")]
    pub queues_omitted: usize,
    /// The point's size as JSON.
    #[serde(skip)]
    pub bytes: usize,
    /// What `ports` takes of it.
    #[serde(skip)]
    pub ports_bytes: usize,
}

fn shared_ports<S: serde::Serializer>(p: &Arc<Vec<PortPoint>>, s: S) -> Result<S::Ok, S::Error> {
    p.as_slice().serialize(s)
}

/// The size of `v` as JSON.
fn json_bytes(v: &impl Serialize) -> usize {
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, v);
    count.0
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A writer that only counts.
struct Count(usize);

impl std::io::Write for Count {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0 += b.len();
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Rates of one port over one second.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PortPoint {
    pub name: String,
    pub rx_bps: f64,
    pub tx_bps: f64,
    pub rx_pps: f64,
    pub tx_pps: f64,
    pub drops_ps: f64,
    pub queues: Vec<QueuePoint>,
}

/// Rates of one rx queue over one second.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QueuePoint {
    pub queue: u16,
    pub rx_pps: f64,
    pub rx_bps: f64,
    pub drops_ps: f64,
}

/// One worker over one second.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WorkerPoint {
    pub id: usize,
    pub cpu: usize,
    pub busy_pct: f64,
    pub cpu_pct: f64,
    pub sleeps_ps: f64,
    pub wakeups_ps: f64,
    pub ctx_switches_ps: f64,
}

/// A queue moved from one worker to another (or appeared, or went).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlacementEvent {
    pub t_ms: u64,
    pub unix_ms: u64,
    /// `port/queue`.
    pub queue: String,
    /// Worker before (`None`: the queue is new).
    pub from: Option<usize>,
    /// Worker after (`None`: the queue went away).
    pub to: Option<usize>,
}

/// QoS settings next to what the switch allocated, one row per port. Fed by the QoS
/// subsystem through [`History::set_qos`]; `None` (the default) means "no QoS configured".
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct QosRow {
    pub port: String,
    /// Guaranteed minimum, bits per second (0: none).
    pub min_bps: f64,
    /// Limit, bits per second (0: none).
    pub max_bps: f64,
    /// What the allocator currently grants, bits per second (0: not shaped).
    pub alloc_bps: f64,
    /// The uplink the port competes for (`None`: none in its VLAN, or it is an uplink).
    pub uplink: Option<String>,
    /// Set for uplinks: their capacity, bits per second (0: not an uplink).
    pub capacity_bps: f64,
    /// Relative share of what the guarantees leave (1 unless set).
    pub weight: u32,
}

/// The ring of points plus what other subsystems fed in.
#[derive(Debug, Default)]
pub struct History {
    points: VecDeque<Point>,
    events: VecDeque<PlacementEvent>,
    /// Gauges to stamp onto every following point until changed or cleared.
    gauges: BTreeMap<String, f64>,
    qos: Option<Vec<QosRow>>,
    /// Queue → worker at the last push.
    owners: BTreeMap<String, usize>,
    /// Sum of the points' `bytes`.
    bytes: usize,
}

/// What `/api/series` returns.
#[derive(Debug, Serialize)]
pub struct SeriesView<'a> {
    pub interval_ms: u64,
    pub capacity: usize,
    /// The `t_ms` of the last point given; when none is given, of the newest point (0
    /// before the first). Ask again with `since` = this for what follows.
    pub last_t_ms: u64,
    /// More points follow `last_t_ms` than this answer holds (it is a page).
    pub more: bool,
    /// What the history holds now, as JSON, and the most it may.
    pub bytes: usize,
    pub max_bytes: usize,
    pub points: Vec<&'a Point>,
    pub placement_events: Vec<&'a PlacementEvent>,
    pub qos: Option<&'a [QosRow]>,
}

// set_gauge, clear_gauge and set_qos are the feed points for the QoS and dynamic placement
// subsystems, which are built on other branches.
#[allow(dead_code)]
impl History {
    pub fn new() -> History {
        History::default()
    }

    /// Adds the second between `prev` and `cur`; `unix_ms` is the wall clock now.
    pub fn push(&mut self, prev: &StatsReport, cur: &StatsReport, unix_ms: u64) {
        let mut point = point(prev, cur);
        point.unix_ms = unix_ms;
        point.gauges = self.gauges.clone();
        point.bytes = json_bytes(&point);
        point.ports_bytes = json_bytes(&*point.ports);
        self.track_placement(cur, point.t_ms, unix_ms);
        self.add(point);
    }

    /// [`History::push`] for a second in which no port moved a frame and the ports and
    /// placement stayed as they were (the daemon's sampler knows: see
    /// [`qswitch_dp::Switch::activity`]), while the last point's port rates were zero:
    /// `cur` may leave its ports and the workers' queue lists out
    /// ([`qswitch_dp::Switch::stats_quiet`]). The point shares the last point's ports, so
    /// it costs nothing per port.
    pub fn push_quiet(&mut self, prev: &StatsReport, cur: &StatsReport, unix_ms: u64) {
        let Some(last) = self.points.back() else {
            return self.push(prev, cur, unix_ms);
        };
        let (ports, ports_bytes) = (last.ports.clone(), last.ports_bytes);
        let omitted = last.queues_omitted;
        let prev = StatsReport {
            uptime_ms: prev.uptime_ms,
            process_cpu_ns: prev.process_cpu_ns,
            ports: Vec::new(),
            workers: prev.workers.clone(),
            rates: None,
        };
        let cur = StatsReport {
            ports: Vec::new(),
            workers: cur.workers.clone(),
            rates: None,
            ..*cur
        };
        let mut point = point(&prev, &cur);
        point.unix_ms = unix_ms;
        point.gauges = self.gauges.clone();
        point.queues_omitted = omitted;
        // "[]" is in the count already.
        point.bytes = json_bytes(&point) + ports_bytes.saturating_sub(2);
        point.ports = ports;
        point.ports_bytes = ports_bytes;
        self.add(point);
    }

    fn add(&mut self, point: Point) {
        self.bytes += point.bytes;
        self.points.push_back(point);
        while self.points.len() > CAPACITY || (self.bytes > HISTORY_BYTES && self.points.len() > 1)
        {
            if let Some(old) = self.points.pop_front() {
                self.bytes -= old.bytes;
            }
        }
    }

    /// What the points take, as JSON.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Sets a named gauge stamped onto every following point (e.g. a QoS allocation).
    pub fn set_gauge(&mut self, name: &str, value: f64) {
        self.gauges.insert(name.to_string(), value);
    }

    /// Stops stamping a gauge.
    pub fn clear_gauge(&mut self, name: &str) {
        self.gauges.remove(name);
    }

    /// The QoS table (settings and allocations); `None` when QoS is not configured.
    pub fn set_qos(&mut self, rows: Option<Vec<QosRow>>) {
        self.qos = rows;
    }

    /// Points newer than `since_ms` (uptime), oldest first, at most `limit` of them and
    /// [`PAGE_BYTES`] (always one at least, when there is one), with every placement event
    /// newer than it.
    pub fn since(&self, since_ms: u64, limit: usize) -> SeriesView<'_> {
        let start = self.points.partition_point(|p| p.t_ms <= since_ms);
        let (mut points, mut bytes) = (Vec::new(), 0);
        for p in self.points.range(start..).take(limit.max(1)) {
            if !points.is_empty() && bytes + p.bytes > PAGE_BYTES {
                break;
            }
            bytes += p.bytes;
            points.push(p);
        }
        let newest = self.points.back().map(|p| p.t_ms).unwrap_or(0);
        let last_t_ms = points.last().map_or(newest, |p| p.t_ms);
        SeriesView {
            interval_ms: 1000,
            capacity: CAPACITY,
            last_t_ms,
            more: start + points.len() < self.points.len(),
            bytes: self.bytes,
            max_bytes: HISTORY_BYTES,
            points,
            // Each event once over the pages: those up to this page's last point.
            placement_events: self
                .events
                .iter()
                .filter(|e| e.t_ms > since_ms && e.t_ms <= last_t_ms)
                .collect(),
            qos: self.qos.as_deref(),
        }
    }

    /// Points held.
    pub fn len(&self) -> usize {
        self.points.len()
    }

    /// No point yet.
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    fn track_placement(&mut self, cur: &StatsReport, t_ms: u64, unix_ms: u64) {
        let now: BTreeMap<String, usize> = cur
            .workers
            .iter()
            .flat_map(|w| w.queues.iter().map(move |q| (q.clone(), w.id)))
            .collect();
        let first = self.owners.is_empty() && self.points.is_empty();
        if !first {
            let mut event = |queue: &str, from, to| {
                if self.events.len() == EVENT_CAPACITY {
                    self.events.pop_front();
                }
                self.events.push_back(PlacementEvent {
                    t_ms,
                    unix_ms,
                    queue: queue.to_string(),
                    from,
                    to,
                });
            };
            for (q, &w) in &now {
                match self.owners.get(q) {
                    Some(&old) if old == w => {}
                    old => event(q, old.copied(), Some(w)),
                }
            }
            for (q, &old) in &self.owners {
                if !now.contains_key(q) {
                    event(q, Some(old), None);
                }
            }
        }
        self.owners = now;
    }
}

/// Rates between two reports (ports and workers matched by name and id; new ones count from
/// zero).
fn point(prev: &StatsReport, cur: &StatsReport) -> Point {
    let dt_ms = cur.uptime_ms.saturating_sub(prev.uptime_ms).max(1) as f64;
    let per_s = |d: u64| d as f64 * 1000.0 / dt_ms;
    let pct_ns = |d: u64| d as f64 / (dt_ms * 1e6) * 100.0;
    let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
    let mut queue_room = MAX_QUEUE_POINTS;
    let mut queues_omitted = 0;
    let ports = cur
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // Usually at the same position (ports keep their order); else searched, so a
            // second costs O(ports), not O(ports²).
            let old = prev
                .ports
                .get(i)
                .filter(|o| o.name == p.name)
                .or_else(|| prev.ports.iter().find(|o| o.name == p.name));
            let d = |f: fn(&qswitch_api::request::PortStats) -> u64| {
                per_s(f(p).saturating_sub(old.map(f).unwrap_or(0)))
            };
            let listed = p.queues.len().min(queue_room);
            queue_room -= listed;
            queues_omitted += p.queues.len() - listed;
            let queues = p.queues[..listed]
                .iter()
                .map(|q| {
                    let oq = old.and_then(|o| o.queues.iter().find(|x| x.queue == q.queue));
                    QueuePoint {
                        queue: q.queue,
                        rx_pps: per_s(q.rx_packets.saturating_sub(oq.map_or(0, |o| o.rx_packets))),
                        rx_bps: per_s(q.rx_bytes.saturating_sub(oq.map_or(0, |o| o.rx_bytes)))
                            * 8.0,
                        drops_ps: per_s(
                            sum(&q.drops).saturating_sub(oq.map_or(0, |o| sum(&o.drops))),
                        ),
                    }
                })
                .collect();
            PortPoint {
                name: p.name.clone(),
                rx_bps: d(|s| s.rx_bytes) * 8.0,
                tx_bps: d(|s| s.tx_bytes) * 8.0,
                rx_pps: d(|s| s.rx_packets),
                tx_pps: d(|s| s.tx_packets),
                drops_ps: per_s(sum(&p.drops).saturating_sub(old.map_or(0, |o| sum(&o.drops)))),
                queues,
            }
        })
        .collect();
    let workers = cur
        .workers
        .iter()
        .map(|w| {
            let old = prev
                .workers
                .iter()
                .find(|o| o.id == w.id)
                .cloned()
                .unwrap_or_default();
            let cs = |s: &qswitch_api::request::WorkerStats| {
                s.voluntary_ctx_switches + s.involuntary_ctx_switches
            };
            WorkerPoint {
                id: w.id,
                cpu: w.cpu,
                busy_pct: pct_ns(w.busy_ns.saturating_sub(old.busy_ns)).min(100.0),
                cpu_pct: pct_ns(w.cpu_ns.saturating_sub(old.cpu_ns)),
                sleeps_ps: per_s(w.sleeps.saturating_sub(old.sleeps)),
                wakeups_ps: per_s(w.wakeups.saturating_sub(old.wakeups)),
                ctx_switches_ps: per_s(cs(w).saturating_sub(cs(&old))),
            }
        })
        .collect();
    Point {
        t_ms: cur.uptime_ms,
        unix_ms: 0,
        process_cpu_pct: pct_ns(cur.process_cpu_ns.saturating_sub(prev.process_cpu_ns)),
        ports: Arc::new(ports),
        workers,
        gauges: BTreeMap::new(),
        queues_omitted,
        bytes: 0,
        ports_bytes: 0,
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_api::request::{PortStats, QueueStats, WorkerStats};

    fn report(t: u64, pkts: u64, queues: &[&str]) -> StatsReport {
        StatsReport {
            uptime_ms: t,
            process_cpu_ns: t * 100_000,
            ports: vec![PortStats {
                name: "a".into(),
                rx_packets: pkts,
                rx_bytes: pkts * 100,
                drops: [("tx_full".to_string(), pkts / 10)].into(),
                queues: vec![QueueStats {
                    queue: 0,
                    rx_packets: pkts,
                    rx_bytes: pkts * 100,
                    drops: BTreeMap::new(),
                }],
                ..Default::default()
            }],
            workers: vec![WorkerStats {
                id: 0,
                cpu: 1,
                queues: queues.iter().map(|s| s.to_string()).collect(),
                busy_ns: t * 500_000,
                sleeps: t / 10,
                voluntary_ctx_switches: t,
                ..Default::default()
            }],
            rates: None,
        }
    }

    #[test]
    fn rates_per_port_queue_and_worker() {
        let mut h = History::new();
        h.push(&report(1000, 0, &["a/0"]), &report(2000, 1000, &["a/0"]), 5);
        let v = h.since(0, CAPACITY);
        let p = &v.points[0];
        assert_eq!((p.t_ms, p.unix_ms), (2000, 5));
        assert_eq!(p.ports[0].rx_pps, 1000.0);
        assert_eq!(p.ports[0].rx_bps, 800_000.0);
        assert_eq!(p.ports[0].drops_ps, 100.0);
        assert_eq!(p.ports[0].queues[0].rx_pps, 1000.0);
        let w = &p.workers[0];
        assert_eq!(
            (w.busy_pct, w.sleeps_ps, w.ctx_switches_ps),
            (50.0, 100.0, 1000.0)
        );
        assert_eq!(p.process_cpu_pct, 10.0);
        assert!(v.qos.is_none() && v.placement_events.is_empty());
    }

    #[test]
    fn ring_keeps_fifteen_minutes_and_since_filters() {
        let mut h = History::new();
        for s in 0..(CAPACITY as u64 + 50) {
            h.push(
                &report(s * 1000, 0, &[]),
                &report((s + 1) * 1000, 0, &[]),
                0,
            );
        }
        assert_eq!(h.len(), CAPACITY);
        let v = h.since(0, CAPACITY);
        assert_eq!(v.points.len(), CAPACITY);
        assert_eq!(v.points[0].t_ms, 51_000);
        assert_eq!(v.last_t_ms, (CAPACITY as u64 + 50) * 1000);
        assert_eq!(h.since(v.last_t_ms - 3000, CAPACITY).points.len(), 3);
        assert!(h.since(u64::MAX, CAPACITY).points.is_empty());
    }

    /// Issue 27 F8: 300 ports of 256 queues (2.4 MB a second before) stay within the
    /// history's byte budget, each point lists at most MAX_QUEUE_POINTS queues, and an
    /// answer is a page of at most PAGE_BYTES that the next `since` continues.
    #[test]
    fn bounded_in_bytes_whatever_the_ports_and_queues() {
        let wide = |t: u64| {
            let mut r = report(t, t, &[]);
            let port = r.ports[0].clone();
            r.ports = (0..300)
                .map(|i| PortStats {
                    name: format!("port-number-{i}"),
                    queues: (0..256)
                        .map(|q| QueueStats {
                            queue: q,
                            ..port.queues[0].clone()
                        })
                        .collect(),
                    ..port.clone()
                })
                .collect();
            r
        };
        let mut h = History::new();
        let mut prev = wide(0);
        for s in 1..=400u64 {
            let cur = wide(s * 1000);
            h.push(&prev, &cur, 0);
            prev = cur;
            assert!(h.bytes() <= HISTORY_BYTES, "{} bytes at {s} s", h.bytes());
        }
        let v = h.since(0, CAPACITY);
        let p = v.points[0];
        let listed: usize = p.ports.iter().map(|x| x.queues.len()).sum();
        assert_eq!(p.ports.len(), 300);
        assert_eq!(
            (listed, p.queues_omitted),
            (MAX_QUEUE_POINTS, 300 * 256 - MAX_QUEUE_POINTS)
        );
        assert!(h.len() > 60, "only {} s of history", h.len());
        // Pages: at most PAGE_BYTES each, continuing where the last one ended, all points once.
        let (mut since, mut seen) = (0, 0);
        loop {
            let page = h.since(since, CAPACITY);
            let json = serde_json::to_vec(&page).unwrap();
            assert!(json.len() <= PAGE_BYTES + 64 * 1024, "{} bytes", json.len());
            seen += page.points.len();
            since = page.last_t_ms;
            if !page.more {
                break;
            }
        }
        assert_eq!(seen, h.len());
        let two = h.since(0, 2);
        assert_eq!(two.points.len(), 2);
        assert!(two.more);
        assert_eq!(two.last_t_ms, two.points[1].t_ms);
    }

    #[test]
    fn placement_changes_and_fed_values() {
        let mut h = History::new();
        h.push(&report(0, 0, &["a/0"]), &report(1000, 0, &["a/0"]), 0);
        h.set_gauge("qos.a.alloc_bps", 5e8);
        h.set_qos(Some(vec![QosRow {
            port: "a".into(),
            min_bps: 1e8,
            max_bps: 0.0,
            alloc_bps: 5e8,
            ..Default::default()
        }]));
        let mut moved = report(2000, 0, &[]);
        moved.workers.push(WorkerStats {
            id: 1,
            queues: vec!["a/0".into(), "b/0".into()],
            ..Default::default()
        });
        h.push(&report(1000, 0, &["a/0"]), &moved, 0);
        let v = h.since(0, CAPACITY);
        let ev: Vec<_> = v
            .placement_events
            .iter()
            .map(|e| (e.queue.as_str(), e.from, e.to))
            .collect();
        assert_eq!(ev, [("a/0", Some(0), Some(1)), ("b/0", None, Some(1))]);
        assert_eq!(v.points[1].gauges["qos.a.alloc_bps"], 5e8);
        assert!(v.points[0].gauges.is_empty());
        assert_eq!(v.qos.unwrap()[0].min_bps, 1e8);
        h.clear_gauge("qos.a.alloc_bps");
        assert!(h.since(1500, CAPACITY).placement_events.len() == 2);
    }
    /// A quiet second (issue 30) shares the last point's ports: the same rates as a full
    /// push of unchanged counters would give, its size counted as if it were written out,
    /// and the placement it cannot see left as it was.
    #[test]
    fn a_quiet_second_shares_the_ports_and_counts_its_size() {
        let mut h = History::new();
        h.push(&report(0, 0, &["a/0"]), &report(1000, 0, &["a/0"]), 1);
        let prev = report(1000, 0, &["a/0"]);
        let mut cur = report(2000, 0, &[]);
        cur.ports.clear();
        h.push_quiet(&prev, &cur, 2);
        let mut full = History::new();
        full.push(&report(0, 0, &["a/0"]), &report(1000, 0, &["a/0"]), 1);
        full.push(&prev, &report(2000, 0, &["a/0"]), 2);
        let (q, f) = (h.points.back().unwrap(), full.points.back().unwrap());
        assert!(Arc::ptr_eq(&q.ports, &h.points[0].ports));
        assert_eq!(q.ports, f.ports);
        assert_eq!(q.workers, f.workers);
        assert_eq!(q.bytes, serde_json::to_string(q).unwrap().len());
        assert_eq!(h.bytes(), h.points.iter().map(|p| p.bytes).sum::<usize>());
        assert!(h.events.is_empty(), "{:?}", h.events);
    }
}
