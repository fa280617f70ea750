//! `trace`: what the switch would do with one frame arriving on a port, and why — a dry run
//! of the engine's decision, like OVS's `ofproto/trace`.
//!
//! It runs the engine's own decision ([`crate::engine::Forwarder::decide`], the stages of
//! [`crate::pipeline`]) on a forwarder of its own, with a [`Recorder`] as the
//! [`Tracer`]: each stage tells it its verdict (classify; VLAN admission: the VLAN the
//! frame is switched in, or `vlan_tagged` / `vlan_not_allowed`; port security: the check
//! that refuses the frame, if one does; link-local groups: relayed, dropped by group, or
//! BPDU guard; learning and lookup in that VLAN; storm control for a frame that would be
//! flooded: its class, and whether the class's bucket holds a frame now), and the
//! destinations are the forwarder's, in the order the engine transmits. Then, per
//! destination, whether the frame leaves untagged or tagged with its VID, with the
//! destination's QoS and vRSS.
//!
//! It changes nothing: with a tracer the stages that change shared state run dry (no
//! learning, no storm tokens taken, no port disabled: the recorder is asked what they would
//! do), and the drops are counted in a tally of its own. `crates/dp/tests/capture.rs` and
//! `crates/dp/tests/policy.rs` check on the manual engine that trace and forwarding agree.

use std::sync::Arc;

use qswitch_api::request::{TraceEgress, TraceFdb, TraceQos, TraceReport, TraceRss, TraceStorm};
use qswitch_wire::l2::{L2Error, L2Info, MAX_FRAME_LEN};
use qswitch_wire::MacAddr;

use qswitch_api::config::RuleDirection;

use crate::engine::{Forwarder, View};
use crate::fdb::{Fdb, Learned, MAX_ENTRIES, MOVES_PER_SEC};
use crate::firewall::{Allowed, CtState, Denied, Dir, Firewall, Verdict as FwVerdict};
use crate::ids::PortId;
use crate::link_local::{self, Verdict};
use crate::pipeline::vlan::FrameVlan;
use crate::pipeline::Tracer;
use crate::policy::{Egress, Policy, StormClass};
use crate::port::Device;
use crate::rss::Toeplitz;
use crate::stats::{DropReason, DropTally};
use crate::table::{PortEntry, PortTable};

/// The dry run of `frame` arriving on `ingress`, against `table` and `fdb` at `now`.
pub fn trace(
    table: &Arc<PortTable>,
    fdb: &Fdb,
    firewall: &Arc<Firewall>,
    ingress: &PortEntry,
    frame: &[u8],
    now: u64,
) -> TraceReport {
    // The view a worker would switch against (with no queues of its own).
    let view = View::new(table.clone(), Arc::new(Vec::new())).with_firewall(firewall.clone());
    let pol = ingress.policy.load_full();
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
        drop_stage: None,
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
        r.drop_stage = Some(why.stage().name().into());
        r.steps.push(format!(
            "drop: {} at {} (counted on the ingress rx queue)",
            why.name(),
            why.stage().name()
        ));
    };
    // As the engine's switch_burst: a disabled port's bursts are drained, nothing decided.
    if ingress.disabled.get() {
        r.steps
            .push("port disabled by bpdu_guard (until `qswitch port enable`)".into());
        drop(&mut r, DropReason::PortDisabled);
        return r;
    }

    // The engine's decision, on a forwarder of its own, recorded.
    let mut fwd = Forwarder::new(0);
    fwd.set_view(&view);
    fwd.load_frame(frame);
    let mut rec = Recorder {
        r,
        view: &view,
        pol: &pol,
        vlans,
        ingress: ingress.id,
        entries: None,
        frame_vlan: FrameVlan::default(),
        src: None,
        learned: false,
        flooded: false,
    };
    let mut drops = DropTally::default();
    fwd.decide(&view, fdb, ingress, 1, now, &mut drops, &mut rec);
    let tagged_in = rec.frame_vlan.tagged;
    let (vlan, tci) = (rec.frame_vlan.vlan, rec.frame_vlan.tci);
    let flooded = rec.flooded;
    let mut r = rec.r;
    let out = fwd.take_destinations(&view);
    if flooded {
        let names: Vec<String> = out.iter().map(|&p| name(table, p)).collect();
        r.steps.push(format!(
            "flood: VLAN {vlan} members except {}: [{}]",
            r.port,
            names.join(", ")
        ));
    }
    if let Some((why, _)) = drops.reasons().next() {
        drop(&mut r, why);
        return r;
    }
    r.verdict = if flooded { "flood" } else { "unicast" }.into();
    let vlan_aware = view.vlan_aware();
    for p in out {
        let Some(Some(e)) = table.get(usize::from(p.0)) else {
            continue;
        };
        if e.disabled.get() {
            r.steps.push(format!(
                "output: {}: disabled by bpdu_guard, dropped there (port_disabled, counted on its tx)",
                e.config.name
            ));
            continue;
        }
        let enc = match view.policy(p) {
            Some(d) if vlan_aware => d.egress(vlan),
            _ => Egress::Untagged,
        };
        let tagged = (enc == Egress::Tagged).then_some(vlan);
        let encoding = match tagged {
            Some(v) if tci >> 13 != 0 => format!("tagged {v} (priority {})", tci >> 13),
            Some(v) => format!("tagged {v}"),
            None => "untagged".to_string(),
        };
        if firewall.filtered(p.0.into()) {
            let into = RuleDirection::Ingress;
            let v = firewall.peek(p.0.into(), into, frame, now);
            r.steps
                .push(firewall_text(firewall, &e.config.name, into, v));
            if let FwVerdict::Deny(d, _) = v {
                r.steps.push(format!(
                    "output: {}: dropped there ({}, counted on its tx)",
                    e.config.name,
                    crate::pipeline::firewall::reason(d).name()
                ));
                continue;
            }
        }
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

/// The firewall's verdict on a frame crossing `port` in `direction`, in words: the rule
/// (group/index) that allowed it and the connection's state, or why it is denied.
fn firewall_text(fw: &Firewall, port: &str, direction: RuleDirection, v: FwVerdict) -> String {
    let rules = fw.rules();
    let dir = match direction {
        RuleDirection::Ingress => "ingress",
        RuleDirection::Egress => "egress",
    };
    let state = |s: Option<CtState>| s.map_or(String::new(), |s| format!(", state {}", s.name()));
    let what = match v {
        FwVerdict::Allow(a, s) => match a {
            Allowed::Unfiltered => "allowed (not filtered)".to_string(),
            Allowed::NotIp => "allowed (not IP)".to_string(),
            Allowed::Always => "allowed (neighbour discovery, MLD or DHCP)".to_string(),
            Allowed::Stateless(r) => format!("allowed by rule {} (untracked)", rules.name(r)),
            Allowed::New(r) => format!(
                "allowed by rule {}: a new connection{}",
                rules.name(r),
                state(s)
            ),
            Allowed::Tracked(r, d) => format!(
                "allowed: a tracked connection opened by rule {} ({} direction){}",
                rules.name(r),
                match d {
                    Dir::Original => "original",
                    Dir::Reply => "reply",
                },
                state(s)
            ),
            Allowed::Related(r) => format!(
                "allowed: an ICMP error related to a connection opened by rule {}{}",
                rules.name(r),
                state(s)
            ),
        },
        FwVerdict::Deny(d, s) => match d {
            Denied::NoRule(_) => format!("denied: no rule of its groups allows it {dir}"),
            Denied::Invalid => format!(
                "denied: not valid for its connection (ct_invalid){}",
                state(s)
            ),
            Denied::Limit => "denied: a new connection over max_sessions (ct_limit)".to_string(),
            Denied::Fragment => "denied: a non-first fragment (ct_fragment)".to_string(),
        },
    };
    format!("firewall ({dir} of {port}): {what}")
}

/// A port's name (`#id` for a port gone from the table).
fn name(table: &PortTable, p: PortId) -> String {
    table
        .get(usize::from(p.0))
        .and_then(Option::as_ref)
        .map_or_else(|| format!("#{}", p.0), |e| e.config.name.clone())
}

/// The tracer of `trace`: each stage's verdict in words, into the report.
struct Recorder<'a> {
    r: TraceReport,
    view: &'a View,
    pol: &'a Policy,
    /// The ingress port's tagged VLANs, in words.
    vlans: String,
    ingress: PortId,
    /// The fdb as of `now`, read at the first stage that needs it.
    entries: Option<Vec<Learned>>,
    /// The frame's VLAN, as the `vlan` stage decided.
    frame_vlan: FrameVlan,
    /// The frame's source, and whether learning would take it (so a frame to itself finds
    /// it).
    src: Option<MacAddr>,
    learned: bool,
    flooded: bool,
}

impl Recorder<'_> {
    fn name(&self, p: PortId) -> String {
        name(&self.view.table, p)
    }

    fn find(&mut self, fdb: &Fdb, mac: MacAddr, vlan: u16, now: u64) -> Option<Learned> {
        self.entries
            .get_or_insert_with(|| fdb.entries(now))
            .iter()
            .find(|e| e.mac == mac && e.vlan == vlan)
            .cloned()
    }
}

impl Tracer for Recorder<'_> {
    const ON: bool = true;

    fn firewall(&mut self, fw: &Firewall, port: PortId, direction: RuleDirection, v: FwVerdict) {
        let name = name(&self.view.table, port);
        self.r.steps.push(firewall_text(fw, &name, direction, v));
    }

    fn classified(&mut self, l2: Result<&L2Info, L2Error>) {
        let r = &mut self.r;
        let l2 = match l2 {
            Ok(l2) => l2,
            Err(e) => {
                r.steps.push(format!("classify: {e:?}"));
                return;
            }
        };
        self.src = Some(l2.src);
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
    }

    fn vlan(&mut self, tag: Option<u16>, verdict: Result<FrameVlan, DropReason>) {
        let trunk = self.pol.trunk;
        let r = &mut self.r;
        let fv = match verdict {
            Ok(fv) => fv,
            Err(_) => {
                r.steps.push(match tag {
                    Some(vid) if trunk => format!(
                        "VLAN: tag {vid} is not one the trunk carries ({})",
                        self.vlans
                    ),
                    Some(vid) => format!("VLAN: tag {vid} on an access port"),
                    None => "VLAN: untagged on a trunk without a native VLAN".to_string(),
                });
                return;
            }
        };
        self.frame_vlan = fv;
        let (vlan, tci) = (fv.vlan, fv.tci);
        r.vlan = vlan;
        let source = match (fv.tagged, trunk) {
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
    }

    fn security(&mut self, refused: Option<(DropReason, &'static str)>) {
        let check = refused.map_or("pass", |(_, check)| check);
        self.r.security = Some(check.into());
        self.r.steps.push(format!("port security: {check}"));
    }

    fn link_local(&mut self, g: u8, verdict: Verdict) {
        let dst = MacAddr([0x01, 0x80, 0xc2, 0, 0, g]);
        let what = format!(
            "link-local: {dst} is 01:80:c2:00:00:0{g:x}, {}",
            link_local::protocol(g)
        );
        self.r.steps.push(match verdict {
            Verdict::Relay => format!("{what}: relayed (link_local_forward)"),
            Verdict::Drop(_) => format!("{what}: not relayed"),
            Verdict::Guard => format!(
                "{what}: bpdu_guard would disable the port (nothing more received from or sent to it until `qswitch port enable`)"
            ),
        });
    }

    /// As `Fdb::learn` would decide, without doing it.
    fn learn(&mut self, fdb: &Fdb, src: MacAddr, vlan: u16, port: PortId, now: u64) {
        let learn = match self.find(fdb, src, vlan, now) {
            Some(e) if e.port == port => {
                if e.age_ns > crate::fdb::REFRESH_NS {
                    "refresh".to_string()
                } else {
                    "known".to_string()
                }
            }
            Some(e) => format!(
                "move from {} (unless it moved more than {MOVES_PER_SEC} times in the last second: flap, not moved)",
                self.name(e.port)
            ),
            None => {
                let st = fdb.port_stats(port);
                if fdb.len() >= MAX_ENTRIES {
                    "refused: table full".to_string()
                } else if st.entries >= st.limit {
                    format!("refused: port limit ({}/{})", st.entries, st.limit)
                } else {
                    "new".to_string()
                }
            }
        };
        self.learned = !learn.starts_with("refused");
        self.r
            .steps
            .push(format!("learn: {src} on VLAN {vlan} -> {learn}"));
        self.r.learn = Some(learn);
    }

    fn lookup(&mut self, fdb: &Fdb, dst: MacAddr, vlan: u16, now: u64) -> Option<PortId> {
        // The frame's own source, as learning would have left it.
        if self.learned && self.src == Some(dst) {
            return Some(self.ingress);
        }
        match self.find(fdb, dst, vlan, now) {
            Some(e) => {
                let port = self.name(e.port);
                self.r.steps.push(format!(
                    "lookup: {dst} on VLAN {vlan} -> port {port} (seen {} ms ago)",
                    e.age_ns / 1_000_000
                ));
                self.r.fdb = Some(TraceFdb {
                    port,
                    age_ms: e.age_ns / 1_000_000,
                });
                Some(e.port)
            }
            None => {
                self.r
                    .steps
                    .push(format!("lookup: {dst} on VLAN {vlan} -> unknown"));
                None
            }
        }
    }

    fn multicast(&mut self, dst: MacAddr) {
        self.r
            .steps
            .push(format!("lookup: {dst} is multicast/broadcast"));
    }

    fn unusable(&mut self, port: PortId, vlan: u16) {
        let name = self.name(port);
        self.r.steps.push(format!(
            "lookup: port {name} is gone or does not carry VLAN {vlan}: flood instead"
        ));
    }

    fn unicast(&mut self, _port: PortId, storm: bool) {
        if storm {
            self.r
                .steps
                .push("storm control: not applied (known destination)".into());
        }
    }

    fn storm(&mut self, pol: &Policy, class: StormClass, now: u64) -> bool {
        let peek = pol.storm_peek(class, now);
        let admit = peek.is_none_or(|(_, tokens)| tokens >= 1);
        self.r.steps.push(match peek {
            Some((pps, tokens)) => format!(
                "storm control: {} limit {pps}/s, bucket holds {tokens} frames -> {}",
                class.name(),
                if admit { "pass" } else { "over the limit" }
            ),
            None => format!("storm control: {}, no limit -> pass", class.name()),
        });
        self.r.storm = Some(TraceStorm {
            class: class.name().into(),
            limit_pps: peek.map(|(pps, _)| pps),
            tokens: peek.map(|(_, t)| t),
            admit,
        });
        admit
    }

    fn flood(&mut self, _vlan: u16) {
        self.flooded = true;
    }
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
