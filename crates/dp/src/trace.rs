//! `trace`: what the switch would do with one frame arriving on a port, and why — a dry run
//! of the engine's decision (classify, learn, look up, flood), like OVS's `ofproto/trace`.
//!
//! It changes nothing: no learning, no counters, no tokens. The engine's decision code is
//! not shared (its hot loop keeps per-burst caches and batch state that a pure function
//! would have to thread through); the few decision steps are repeated here instead, and the
//! tests (`crates/dp/tests/trace.rs`) check that the two agree on the manual engine.

use qswitch_api::request::{TraceEgress, TraceFdb, TraceQos, TraceReport, TraceRss};
use qswitch_wire::l2::{self, L2Error};

use crate::fdb::{Fdb, MAX_ENTRIES, MOVES_PER_SEC};
use crate::ids::PortId;
use crate::port::Device;
use crate::rss::Toeplitz;
use crate::stats::DropReason;
use crate::table::{PortEntry, PortTable};

/// The dry run of `frame` arriving on `ingress`, against `table` and `fdb` at `now`.
pub fn trace(
    table: &PortTable,
    fdb: &Fdb,
    ingress: &PortEntry,
    frame: &[u8],
    now: u64,
) -> TraceReport {
    let name = |p: PortId| {
        table
            .get(usize::from(p.0))
            .and_then(Option::as_ref)
            .map_or_else(|| format!("#{}", p.0), |e| e.config.name.clone())
    };
    let vlan = ingress.vlan;
    let mut r = TraceReport {
        port: ingress.config.name.clone(),
        vlan,
        frame_len: frame.len(),
        src: None,
        dst: None,
        ether_type: None,
        verdict: "drop".into(),
        drop_reason: None,
        learn: None,
        fdb: None,
        egress: Vec::new(),
        ingress_qos: qos(ingress),
        steps: Vec::new(),
    };
    r.steps.push(format!(
        "ingress: port {} (id {}), VLAN {} ({}), {} bytes",
        r.port,
        ingress.id.0,
        vlan,
        if vlan == 0 { "untagged" } else { "access" },
        frame.len()
    ));
    r.steps
        .push(format!("ingress QoS: {}", qos_text(&r.ingress_qos)));
    let drop = |r: &mut TraceReport, why: DropReason| {
        r.drop_reason = Some(why.name().into());
        r.steps.push(format!(
            "drop: {} (counted on the ingress rx queue)",
            why.name()
        ));
    };
    let l2 = match l2::classify(frame) {
        Ok(l2) => l2,
        Err(e) => {
            let why = match e {
                L2Error::Runt => DropReason::Runt,
                L2Error::Oversize => DropReason::Oversize,
                L2Error::BadSrc => DropReason::BadSrcMac,
            };
            r.steps.push(format!("classify: {e:?}"));
            drop(&mut r, why);
            return r;
        }
    };
    r.src = Some(l2.src.to_string());
    r.dst = Some(l2.dst.to_string());
    r.ether_type = Some(format!("{:#06x}", u16::from(l2.ethertype)));
    r.steps.push(format!(
        "classify: {} -> {}, ethertype {}{}",
        l2.src,
        l2.dst,
        r.ether_type.as_deref().unwrap_or_default(),
        l2.vlan
            .map(|v| format!(", 802.1Q tag {v}"))
            .unwrap_or_default()
    ));
    if l2.vlan.is_some() {
        drop(&mut r, DropReason::VlanTagged);
        return r;
    }

    // Learning (as Fdb::learn would decide, without doing it).
    let entries = fdb.entries(now);
    let find = |mac, v| entries.iter().find(|e| e.mac == mac && e.vlan == v);
    let learn = match find(l2.src, vlan) {
        Some(e) if e.port == ingress.id => {
            if e.age_ns > crate::fdb::REFRESH_NS {
                "refresh".to_string()
            } else {
                "known".to_string()
            }
        }
        Some(e) => format!(
            "move from {} (unless it moved more than {MOVES_PER_SEC} times in the last second: flap, not moved)",
            name(e.port)
        ),
        None => {
            let st = fdb.port_stats(ingress.id);
            if fdb.len() >= MAX_ENTRIES {
                "refused: table full".to_string()
            } else if st.entries >= st.limit {
                format!("refused: port limit ({}/{})", st.entries, st.limit)
            } else {
                "new".to_string()
            }
        }
    };
    r.steps
        .push(format!("learn: {} on VLAN {vlan} -> {learn}", l2.src));
    r.learn = Some(learn);

    // Lookup: after learning (the frame's own source is known by then).
    let dst = if l2.dst.is_multicast() {
        r.steps
            .push(format!("lookup: {} is multicast/broadcast", l2.dst));
        None
    } else if l2.dst == l2.src
        && r.learn
            .as_deref()
            .is_some_and(|l| !l.starts_with("refused"))
    {
        Some(ingress.id)
    } else {
        match find(l2.dst, vlan) {
            Some(e) => {
                r.fdb = Some(TraceFdb {
                    port: name(e.port),
                    age_ms: e.age_ns / 1_000_000,
                });
                r.steps.push(format!(
                    "lookup: {} on VLAN {vlan} -> port {} (seen {} ms ago)",
                    l2.dst,
                    name(e.port),
                    e.age_ns / 1_000_000
                ));
                Some(e.port)
            }
            None => {
                r.steps
                    .push(format!("lookup: {} on VLAN {vlan} -> unknown", l2.dst));
                None
            }
        }
    };
    let mut out: Vec<&PortEntry> = Vec::new();
    match dst {
        Some(p) if p == ingress.id => {
            drop(&mut r, DropReason::SamePort);
            return r;
        }
        Some(p) if table.get(usize::from(p.0)).is_some_and(|e| e.is_some()) => {
            r.verdict = "unicast".into();
            out.extend(table[usize::from(p.0)].as_deref());
        }
        _ => {
            out.extend(
                table
                    .iter()
                    .flatten()
                    .filter(|e| e.vlan == vlan && e.id != ingress.id)
                    .map(|e| &**e),
            );
            let names: Vec<&str> = out.iter().map(|e| e.config.name.as_str()).collect();
            r.steps.push(format!(
                "flood: VLAN {vlan} members except {}: [{}]",
                r.port,
                names.join(", ")
            ));
            if out.is_empty() {
                drop(&mut r, DropReason::NoDestination);
                return r;
            }
            r.verdict = "flood".into();
        }
    }
    for e in out {
        let eg = TraceEgress {
            port: e.config.name.clone(),
            qos: qos(e),
            rss: rss(e, frame),
        };
        let mut line = format!("output: {} (QoS {})", eg.port, qos_text(&eg.qos));
        if let Some(s) = &eg.rss {
            line.push_str(&match (s.hash, s.index) {
                (Some(h), Some(i)) => format!(
                    ", vRSS: Toeplitz {h:#010x}, indirection[{i}] -> queue {} of enabled {:?}",
                    s.queue, s.enabled
                ),
                _ => format!(", vRSS: queue {} of enabled {:?}", s.queue, s.enabled),
            });
        }
        r.steps.push(line);
        r.egress.push(eg);
    }
    r
}

fn qos(e: &PortEntry) -> TraceQos {
    let s = e.qos.settings();
    TraceQos {
        min: s.min,
        max: s.max,
        weight: s.weight,
        alloc_bps: e.qos.rate(),
        tokens: e.qos.tokens(),
    }
}

fn qos_text(q: &TraceQos) -> String {
    let opt = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    format!(
        "min {} max {} weight {}, allocation {}, tokens {}",
        opt(q.min),
        opt(q.max),
        q.weight,
        q.alloc_bps
            .map_or_else(|| "unshaped".to_string(), |a| format!("{a} bit/s")),
        q.tokens
            .map_or_else(|| "-".to_string(), |t| format!("{t} B"))
    )
}

/// The receive pair a vhost-user port's vRSS would pick (as the port's rx path does, with
/// the default Toeplitz key every vhost-user port uses).
fn rss(e: &PortEntry, frame: &[u8]) -> Option<TraceRss> {
    let Device::VhostUser(v) = &e.dev else {
        return None;
    };
    let reta = v.reta();
    let enabled = reta.queues().to_vec();
    if reta.queues().len() < 2 {
        return Some(TraceRss {
            enabled,
            hash: None,
            index: None,
            queue: reta.queue_for_non_ip(),
        });
    }
    Some(match qswitch_wire::flow::extract(frame) {
        Some(key) => {
            let h = Toeplitz::default().hash_flow(&key, true);
            TraceRss {
                enabled,
                hash: Some(h),
                index: Some(h as usize % crate::rss::RETA_SIZE),
                queue: reta.queue_for(h),
            }
        }
        None => TraceRss {
            enabled,
            hash: None,
            index: None,
            queue: reta.queue_for_non_ip(),
        },
    })
}
