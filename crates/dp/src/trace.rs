//! `trace`: what the switch would do with one frame arriving on a port, and why — a dry run
//! of the engine's decision, like OVS's `ofproto/trace`.
//!
//! It follows the engine's order ([`crate::engine`], [`crate::policy`]): classify; VLAN
//! admission (access port, trunk with or without a native VLAN: the VLAN the frame is
//! switched in, or `vlan_tagged` / `vlan_not_allowed`); port security (the check that
//! refuses the frame, if one does); link-local groups ([`crate::link_local`]: relayed,
//! dropped by group, or BPDU guard); learning and lookup in that VLAN; storm control for a
//! frame that would be flooded (its class, and whether the class's bucket holds a frame
//! now); the destinations (a known one that carries the VLAN, else the VLAN's flood domain
//! minus the ingress, in the order the engine transmits); and per destination whether the
//! frame leaves untagged or tagged with its VID, with the destination's QoS and vRSS.
//!
//! It changes nothing: no learning, no counters, no tokens (storm buckets are read with
//! [`crate::policy::Policy::storm_peek`]). The engine's per-frame loop is not shared (it
//! keeps per-burst caches and batch state that a pure function would have to thread
//! through); the decisions that have rules of their own are: VLAN admission
//! ([`crate::policy::Policy::ingress_vlan`]), port security
//! ([`crate::policy::security_check`]), the storm class ([`crate::policy::StormClass::of`])
//! and egress encoding ([`crate::policy::Policy::egress`]) are the engine's own functions;
//! the rest is repeated here, and `crates/dp/tests/capture.rs` and
//! `crates/dp/tests/policy.rs` check on the manual engine that the two agree.

use std::sync::Arc;

use qswitch_api::request::{TraceEgress, TraceFdb, TraceQos, TraceReport, TraceRss, TraceStorm};
use qswitch_wire::l2::{self, L2Error, MAX_FRAME_LEN};

use crate::fdb::{Fdb, MAX_ENTRIES, MOVES_PER_SEC};
use crate::ids::PortId;
use crate::link_local;
use crate::policy::{self, Egress, Policy, StormClass};
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
    // The policies as a worker's view holds them (engine::View::new).
    let policies: Vec<Option<Arc<Policy>>> = table
        .iter()
        .map(|slot| slot.as_ref().map(|e| e.policy.load_full()))
        .collect();
    let policy_of = |p: PortId| policies.get(usize::from(p.0)).and_then(|x| x.as_deref());
    let vlan_aware = policies
        .iter()
        .flatten()
        .any(|p| p.trunk || p.native.is_none());
    let pol = ingress.policy.load_full();
    // The engine decides once per burst: the plain path unless VLANs or the port's policy
    // need more.
    let policy_path = vlan_aware || pol.active();
    let mut r = TraceReport {
        port: ingress.config.name.clone(),
        vlan: ingress.vlan,
        vlan_source: None,
        frame_len: frame.len(),
        src: None,
        dst: None,
        ether_type: None,
        verdict: "drop".into(),
        drop_reason: None,
        learn: None,
        security: None,
        fdb: None,
        storm: None,
        egress: Vec::new(),
        ingress_qos: qos(ingress),
        steps: Vec::new(),
    };
    let vlans = pol.settings.vlans.to_string();
    let port_kind = match (pol.trunk, pol.native) {
        (true, Some(n)) => format!("trunk carrying {vlans} tagged, native VLAN {n}"),
        (true, None) => format!("trunk carrying {vlans} tagged, no native VLAN"),
        (false, Some(0)) | (false, None) => "VLAN 0 (untagged)".to_string(),
        (false, Some(n)) => format!("VLAN {n} (access)"),
    };
    r.steps.push(format!(
        "ingress: port {} (id {}), {port_kind}, {} bytes",
        r.port,
        ingress.id.0,
        frame.len()
    ));
    if pol.secure || pol.storm {
        r.steps
            .push(format!("ingress policy: {}", policy_text(&pol)));
    }
    r.steps
        .push(format!("ingress QoS: {}", qos_text(&r.ingress_qos)));
    let drop = |r: &mut TraceReport, why: DropReason| {
        r.drop_reason = Some(why.name().into());
        r.steps.push(format!(
            "drop: {} (counted on the ingress rx queue)",
            why.name()
        ));
    };
    if ingress.disabled.get() {
        r.steps
            .push("port disabled by bpdu_guard (until `qswitch port enable`)".into());
        drop(&mut r, DropReason::PortDisabled);
        return r;
    }
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

    // VLAN admission (the same rule on the plain path: there every port is an access port).
    let (vlan, tagged_in) = match pol.ingress_vlan(l2.vlan) {
        Ok(v) => v,
        Err(why) => {
            r.steps.push(match l2.vlan {
                Some(vid) if pol.trunk => {
                    format!("VLAN: tag {vid} is not one the trunk carries ({vlans})")
                }
                Some(vid) => format!("VLAN: tag {vid} on an access port"),
                None => "VLAN: untagged on a trunk without a native VLAN".to_string(),
            });
            drop(&mut r, why);
            return r;
        }
    };
    // The TCI a tag pushed on the way out carries: the received one (its priority bits
    // kept), or the VLAN alone.
    let tci = if tagged_in {
        u16::from_be_bytes([frame[14], frame[15]])
    } else {
        vlan
    };
    r.vlan = vlan;
    let source = match (tagged_in, pol.trunk) {
        (true, _) => "tagged",
        (false, true) => "native",
        (false, false) => "access",
    };
    r.vlan_source = Some(source.into());
    r.steps.push(match source {
        "tagged" => format!(
            "VLAN {vlan}: tagged (priority {}), carried by the trunk",
            tci >> 13
        ),
        "native" => format!("VLAN {vlan}: untagged, the trunk's native VLAN"),
        _ => format!("VLAN {vlan}: untagged on an access port"),
    });

    // Port security, before learning.
    if policy_path && pol.secure {
        match policy::security_check(&pol.settings.security, frame) {
            Some((why, check)) => {
                r.security = Some(check.into());
                r.steps.push(format!("port security: {check}"));
                drop(&mut r, why);
                return r;
            }
            None => {
                r.security = Some("pass".into());
                r.steps.push("port security: pass".into());
            }
        }
    }

    // Link-local groups (crate::link_local): never relayed unless the port says so.
    if let Some(g) = l2
        .dst
        .is_multicast()
        .then(|| link_local::group(l2.dst))
        .flatten()
    {
        let what = format!(
            "link-local: {} is 01:80:c2:00:00:0{g:x}, {}",
            l2.dst,
            link_local::protocol(g)
        );
        match link_local::verdict(g, &pol.settings.link_local) {
            link_local::Verdict::Relay => {
                r.steps
                    .push(format!("{what}: relayed (link_local_forward)"));
            }
            link_local::Verdict::Drop(why) => {
                r.steps.push(format!("{what}: not relayed"));
                drop(&mut r, why);
                return r;
            }
            link_local::Verdict::Guard => {
                r.steps.push(format!(
                    "{what}: bpdu_guard would disable the port (nothing more received from or sent to it until `qswitch port enable`)"
                ));
                drop(&mut r, DropReason::BpduGuard);
                return r;
            }
        }
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
    // A known destination is used if it is in the table (plain path) / carries the VLAN.
    let usable = |p: PortId| {
        if policy_path {
            policy_of(p).is_some_and(|d| d.egress(vlan) != Egress::No)
        } else {
            table.get(usize::from(p.0)).is_some_and(|e| e.is_some())
        }
    };
    let mut out: Vec<&PortEntry> = Vec::new();
    match dst {
        Some(p) if p == ingress.id => {
            drop(&mut r, DropReason::SamePort);
            return r;
        }
        Some(p) if usable(p) => {
            r.verdict = "unicast".into();
            out.extend(table[usize::from(p.0)].as_deref());
            if policy_path && pol.storm {
                r.steps
                    .push("storm control: not applied (known destination)".into());
            }
        }
        _ => {
            if let Some(p) = dst {
                r.steps.push(format!(
                    "lookup: port {} is gone or does not carry VLAN {vlan}: flood instead",
                    name(p)
                ));
            }
            if policy_path && pol.storm {
                let class = StormClass::of(l2.dst);
                let peek = pol.storm_peek(class, now);
                let admit = peek.is_none_or(|(_, tokens)| tokens >= 1);
                r.steps.push(match peek {
                    Some((pps, tokens)) => format!(
                        "storm control: {} limit {pps}/s, bucket holds {tokens} frames -> {}",
                        class.name(),
                        if admit { "pass" } else { "over the limit" }
                    ),
                    None => format!("storm control: {}, no limit -> pass", class.name()),
                });
                r.storm = Some(TraceStorm {
                    class: class.name().into(),
                    limit_pps: peek.map(|(pps, _)| pps),
                    tokens: peek.map(|(_, t)| t),
                    admit,
                });
                if !admit {
                    drop(&mut r, class.drop_reason());
                    return r;
                }
            }
            // The flood domain (engine::View::flood): the ports that carry the VLAN, in
            // table order.
            out.extend(
                table
                    .iter()
                    .flatten()
                    .filter(|e| {
                        e.id != ingress.id
                            && policy_of(e.id).is_some_and(|d| d.egress(vlan) != Egress::No)
                    })
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
    // With trunks in the switch the engine serves the ports that carry no tagged VLAN first,
    // then the trunks (engine::Forwarder::transmit_vlans).
    if vlan_aware {
        out.sort_by_key(|e| policy_of(e.id).is_some_and(|d| d.trunk));
    }
    for e in out {
        if e.disabled.get() {
            r.steps.push(format!(
                "output: {}: disabled by bpdu_guard, dropped there (port_disabled, counted on its tx)",
                e.config.name
            ));
            continue;
        }
        let enc = match policy_of(e.id) {
            Some(d) if vlan_aware => d.egress(vlan),
            _ => Egress::Untagged,
        };
        let tagged = (enc == Egress::Tagged).then_some(vlan);
        let encoding = match tagged {
            Some(v) if tci >> 13 != 0 => format!("tagged {v} (priority {})", tci >> 13),
            Some(v) => format!("tagged {v}"),
            None => "untagged".to_string(),
        };
        if tagged.is_some() && !tagged_in && frame.len() + 4 > MAX_FRAME_LEN + 1 {
            r.steps.push(format!(
                "output: {} {encoding}: does not fit tagged, dropped there (oversize, counted on its tx)",
                e.config.name
            ));
            continue;
        }
        let eg = TraceEgress {
            port: e.config.name.clone(),
            tagged,
            qos: qos(e),
            rss: rss(e, frame),
        };
        let mut line = format!("output: {} {encoding} (QoS {})", eg.port, qos_text(&eg.qos));
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

/// The per-frame policy of an ingress port, in words.
fn policy_text(pol: &Policy) -> String {
    let mut parts = Vec::new();
    if pol.secure {
        let s = &pol.settings.security;
        let mut checks = Vec::new();
        if !s.macs.is_empty() {
            let macs: Vec<String> = s.macs.iter().map(ToString::to_string).collect();
            checks.push(format!("macs [{}]", macs.join(", ")));
        }
        if !s.ips.is_empty() {
            let ips: Vec<String> = s.ips.iter().map(ToString::to_string).collect();
            checks.push(format!("ips [{}]", ips.join(", ")));
        }
        if s.dhcp_guard {
            checks.push("dhcp_guard".into());
        }
        if s.ra_guard {
            checks.push("ra_guard".into());
        }
        parts.push(format!("security {}", checks.join(", ")));
    }
    if pol.storm {
        let s = &pol.settings.storm;
        let limits: Vec<String> = [
            ("broadcast", s.broadcast),
            ("multicast", s.multicast),
            ("unknown_unicast", s.unknown_unicast),
        ]
        .iter()
        .filter_map(|(n, l)| l.map(|l| format!("{n} {l}/s")))
        .collect();
        parts.push(format!("storm {}", limits.join(", ")));
    }
    parts.join("; ")
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
