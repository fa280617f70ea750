//! Per-second rates from two [`StatsReport`]s taken about a second apart: what the daemon's
//! sampler keeps, `qswitch stats --watch` prints and the benchmarks record, computed once.

use crate::request::{PortRate, PortStats, Rates, StatsReport, WorkerRate};

impl Rates {
    /// Rates between `prev` and `cur` (matched by port name and worker id; ports that
    /// appeared in between are measured from zero).
    pub fn between(prev: &StatsReport, cur: &StatsReport) -> Rates {
        rates(prev, cur)
    }
}

fn rates(prev: &StatsReport, cur: &StatsReport) -> Rates {
    let dt_ms = cur.uptime_ms.saturating_sub(prev.uptime_ms).max(1);
    let per_s = |d: u64| d as f64 * 1000.0 / dt_ms as f64;
    let pct_ns = |d: u64| d as f64 / (dt_ms as f64 * 1e6) * 100.0;
    let ports = cur
        .ports
        .iter()
        .enumerate()
        .map(|(i, p)| {
            // Usually at the same position (ports keep their order); else searched.
            let old = prev
                .ports
                .get(i)
                .filter(|o| o.name == p.name)
                .or_else(|| prev.ports.iter().find(|o| o.name == p.name));
            let d = |f: fn(&PortStats) -> u64| f(p).saturating_sub(old.map(f).unwrap_or(0));
            let drops_now: u64 = p.drops.values().sum();
            let drops_then: u64 = old.map(|o| o.drops.values().sum()).unwrap_or(0);
            PortRate {
                name: p.name.clone(),
                rx_pps: per_s(d(|s| s.rx_packets)),
                rx_bps: per_s(d(|s| s.rx_bytes)) * 8.0,
                tx_pps: per_s(d(|s| s.tx_packets)),
                tx_bps: per_s(d(|s| s.tx_bytes)) * 8.0,
                drops_ps: per_s(drops_now.saturating_sub(drops_then)),
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
            let ctx = (w.voluntary_ctx_switches + w.involuntary_ctx_switches)
                .saturating_sub(old.voluntary_ctx_switches + old.involuntary_ctx_switches);
            WorkerRate {
                id: w.id,
                busy_pct: pct_ns(w.busy_ns.saturating_sub(old.busy_ns)).min(100.0),
                cpu_pct: pct_ns(w.cpu_ns.saturating_sub(old.cpu_ns)),
                ctx_switches_ps: per_s(ctx),
                wakeups_ps: per_s(w.wakeups.saturating_sub(old.wakeups)),
            }
        })
        .collect();
    Rates {
        interval_ms: dt_ms,
        process_cpu_pct: pct_ns(cur.process_cpu_ns.saturating_sub(prev.process_cpu_ns)),
        ports,
        workers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::WorkerStats;

    #[test]
    fn rates_over_one_second() {
        let mk = |t, pkts, bytes, busy, ctx| StatsReport {
            uptime_ms: t,
            process_cpu_ns: busy,
            ports: vec![PortStats {
                name: "a".into(),
                rx_packets: pkts,
                rx_bytes: bytes,
                ..Default::default()
            }],
            workers: vec![WorkerStats {
                id: 0,
                busy_ns: busy,
                voluntary_ctx_switches: ctx,
                ..Default::default()
            }],
            rates: None,
        };
        let r = Rates::between(
            &mk(1000, 10, 1000, 0, 5),
            &mk(2000, 110, 126_000, 250_000_000, 15),
        );
        assert_eq!(r.interval_ms, 1000);
        assert_eq!(r.ports[0].rx_pps, 100.0);
        assert_eq!(r.ports[0].rx_bps, 1_000_000.0);
        assert_eq!(r.workers[0].busy_pct, 25.0);
        assert_eq!(r.workers[0].ctx_switches_ps, 10.0);
        assert_eq!(r.process_cpu_pct, 25.0);
    }
}
