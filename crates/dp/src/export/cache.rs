//! The flow cache: one per worker, fed the frames the switch forwarded, with the time passed
//! in (no clock reads, no threads).
//!
//! A flow is what [`FlowKey`] names: MACs, VLAN, IP addresses, protocol, ports, ingress and
//! egress port. The cache is set-associative: a key hashes (random keys per cache, so a
//! tenant cannot aim at one set) to a set of [`WAYS`] slots, and a new flow in a full set
//! evicts the set's least recently seen flow, exported with the end reason
//! [`EndReason::LackOfResources`] and counted. So memory is fixed at creation, a lookup
//! costs at most [`WAYS`] compares, and nothing allocates after [`FlowCache::new`].
//!
//! Sampling is systematic count-based (RFC 5475 §6.1, "1 in N"): every Nth frame the cache
//! is offered is accounted; the exporter tells the collector N so it scales the counts.
//! Octets are IP octets (IP header and payload, RFC 7012 `octetDeltaCount`), not frame
//! bytes. Frames that are not IPv4 or IPv6 are counted (`not_ip`) and not cached.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use qswitch_wire::ethernet::EtherType;
use qswitch_wire::flow::IpPair;
use qswitch_wire::{ipv4, ipv6, l2, tcp, udp, IpProtocol};

/// Slots per set.
pub const WAYS: usize = 8;

/// What identifies a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// VID of the frame's 802.1Q tag (`None`: untagged).
    pub vlan: Option<u16>,
    pub ips: IpPair,
    /// Upper-layer protocol (after IPv6 extension headers).
    pub proto: u8,
    /// TCP and UDP ports (0 for other protocols and non-first fragments).
    pub src_port: u16,
    pub dst_port: u16,
    /// Port the frame came in on and went out of (the switch's port index; 0: none).
    pub ingress: u32,
    pub egress: u32,
}

/// Why a flow record was exported: the `flowEndReason` values of RFC 7012 (IANA registry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EndReason {
    /// No frame for the idle timeout.
    IdleTimeout = 1,
    /// Open longer than the active timeout (the flow goes on in a new record).
    ActiveTimeout = 2,
    /// Flushed (the exporter stops or is reconfigured).
    ForcedEnd = 4,
    /// Evicted to make room for a new flow in a full set.
    LackOfResources = 5,
}

/// One exported flow: counts since the previous record of the same flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRecord {
    pub key: FlowKey,
    /// Frames accounted (sampled ones: scale by the sampling interval for an estimate).
    pub packets: u64,
    /// IP octets of those frames.
    pub octets: u64,
    /// First and last frame, milliseconds of the clock passed in (the exporter's is Unix
    /// time).
    pub start_ms: u64,
    pub end_ms: u64,
    /// OR of the TCP flags seen (RFC 7125 `tcpControlBits`, low byte).
    pub tcp_flags: u8,
    pub end_reason: EndReason,
}

/// Settings of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheConfig {
    /// Flows held at most (rounded up to a multiple of [`WAYS`]; at least one set).
    pub capacity: usize,
    /// Account 1 in `sampling` frames (0 is taken as 1).
    pub sampling: u32,
    /// A flow open this long is exported and starts over.
    pub active_timeout_ms: u64,
    /// A flow without a frame for this long is exported and removed.
    pub idle_timeout_ms: u64,
}

/// What a cache counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Frames offered to [`FlowCache::observe`].
    pub frames: u64,
    /// Frames accounted (every `sampling`th).
    pub sampled: u64,
    /// Sampled frames that were not IPv4/IPv6 (or whose IP header was malformed).
    pub not_ip: u64,
    /// Flows created.
    pub flows: u64,
    /// Records exported, by end reason.
    pub idle: u64,
    pub active: u64,
    pub forced: u64,
    /// Flows evicted from a full set (exported with [`EndReason::LackOfResources`]).
    pub evicted: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: FlowKey,
    packets: u64,
    octets: u64,
    start_ms: u64,
    last_ms: u64,
    tcp_flags: u8,
}

impl Entry {
    fn record(&self, end_reason: EndReason) -> FlowRecord {
        FlowRecord {
            key: self.key,
            packets: self.packets,
            octets: self.octets,
            start_ms: self.start_ms,
            end_ms: self.last_ms,
            tcp_flags: self.tcp_flags,
            end_reason,
        }
    }
}

/// A bounded flow cache (see the module docs).
pub struct FlowCache {
    cfg: CacheConfig,
    slots: Vec<Option<Entry>>,
    sets: usize,
    hasher: RandomState,
    /// Frames until the next sampled one (1: the next).
    countdown: u32,
    stats: CacheStats,
}

/// The key, IP octets and TCP flags of a frame; `None` if it is not IP (or is malformed).
pub fn parse(frame: &[u8], ingress: u32, egress: u32) -> Option<(FlowKey, u64, u8)> {
    let l2 = l2::classify(frame).ok()?;
    let l3 = frame.get(l2.l3_offset..)?;
    let (ips, proto, l4, octets, later) = match l2.ethertype {
        EtherType::Ipv4 => {
            let ip = ipv4::Packet::new_checked(l3).ok()?;
            let ips = IpPair::V4 {
                src: ip.src_addr().octets(),
                dst: ip.dst_addr().octets(),
            };
            let later = ip.frag_offset() != 0;
            (
                ips,
                ip.protocol(),
                ip.payload(),
                u64::from(ip.total_len()),
                later,
            )
        }
        EtherType::Ipv6 => {
            let ip = ipv6::Packet::new_checked(l3).ok()?;
            let upper = ip.upper_layer().ok()?;
            let ips = IpPair::V6 {
                src: ip.src_addr().octets(),
                dst: ip.dst_addr().octets(),
            };
            let l4 = ip.payload().get(upper.offset - ipv6::HEADER_LEN..)?;
            let octets = u64::from(ip.payload_len()) + ipv6::HEADER_LEN as u64;
            (ips, upper.protocol, l4, octets, upper.later_fragment)
        }
        _ => return None,
    };
    let (mut src_port, mut dst_port, mut flags) = (0, 0, 0);
    if !later {
        match proto {
            IpProtocol::Tcp if l4.len() >= tcp::HEADER_LEN => {
                let t = tcp::Packet::new_unchecked(l4);
                (src_port, dst_port, flags) = (t.src_port(), t.dst_port(), t.flags());
            }
            IpProtocol::Udp if l4.len() >= udp::HEADER_LEN => {
                let u = udp::Packet::new_unchecked(l4);
                (src_port, dst_port) = (u.src_port(), u.dst_port());
            }
            _ => {}
        }
    }
    let key = FlowKey {
        src_mac: l2.src.0,
        dst_mac: l2.dst.0,
        vlan: l2.vlan,
        ips,
        proto: proto.into(),
        src_port,
        dst_port,
        ingress,
        egress,
    };
    Some((key, octets, flags))
}

impl FlowCache {
    pub fn new(cfg: CacheConfig) -> FlowCache {
        let sets = cfg.capacity.div_ceil(WAYS).max(1);
        FlowCache {
            cfg,
            slots: vec![None; sets * WAYS],
            sets,
            hasher: RandomState::new(),
            countdown: 1,
            stats: CacheStats::default(),
        }
    }

    pub fn config(&self) -> &CacheConfig {
        &self.cfg
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Flows held now.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Offers one forwarded frame (from port `ingress` to `egress`) at `now_ms`. Records
    /// that end because of it (a flow past a timeout, a flow evicted for room) are pushed
    /// onto `out`.
    pub fn observe(
        &mut self,
        frame: &[u8],
        ingress: u32,
        egress: u32,
        now_ms: u64,
        out: &mut Vec<FlowRecord>,
    ) {
        self.observe_in(frame, ingress, egress, None, now_ms, out)
    }

    /// [`FlowCache::observe`] with the frame's VLAN as the switch decided it (`Some(0)`:
    /// none), where the frame's own tag may not say it (an untagged frame of an access
    /// port's VLAN). `None`: the frame's tag.
    pub fn observe_in(
        &mut self,
        frame: &[u8],
        ingress: u32,
        egress: u32,
        vlan: Option<u16>,
        now_ms: u64,
        out: &mut Vec<FlowRecord>,
    ) {
        self.stats.frames += 1;
        self.countdown -= 1;
        if self.countdown > 0 {
            return;
        }
        self.countdown = self.cfg.sampling.max(1);
        self.stats.sampled += 1;
        let Some((mut key, octets, flags)) = parse(frame, ingress, egress) else {
            self.stats.not_ip += 1;
            return;
        };
        if let Some(v) = vlan {
            key.vlan = (v != 0).then_some(v);
        }
        let set = (self.hasher.hash_one(key) % self.sets as u64) as usize * WAYS;
        let ways = &mut self.slots[set..set + WAYS];
        if let Some(i) = ways.iter().position(|s| s.is_some_and(|e| e.key == key)) {
            let e = ways[i].as_mut().expect("found");
            let reason = if now_ms.saturating_sub(e.last_ms) >= self.cfg.idle_timeout_ms {
                Some(EndReason::IdleTimeout)
            } else if now_ms.saturating_sub(e.start_ms) >= self.cfg.active_timeout_ms {
                Some(EndReason::ActiveTimeout)
            } else {
                None
            };
            match reason {
                None => {
                    e.packets += 1;
                    e.octets += octets;
                    e.last_ms = e.last_ms.max(now_ms);
                    e.tcp_flags |= flags;
                    return;
                }
                Some(r) => {
                    out.push(e.record(r));
                    count(&mut self.stats, r);
                    ways[i] = None;
                }
            }
        }
        let slot = match ways.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let (i, victim) = ways
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| s.map(|e| (i, e)))
                    .min_by_key(|(_, e)| e.last_ms)
                    .expect("a full set");
                out.push(victim.record(EndReason::LackOfResources));
                count(&mut self.stats, EndReason::LackOfResources);
                i
            }
        };
        ways[slot] = Some(Entry {
            key,
            packets: 1,
            octets,
            start_ms: now_ms,
            last_ms: now_ms,
            tcp_flags: flags,
        });
        self.stats.flows += 1;
    }

    /// Exports (onto `out`) and removes the flows past their idle or active timeout at
    /// `now_ms`. Looks at every slot: call it about once a second, not per frame.
    pub fn expire(&mut self, now_ms: u64, out: &mut Vec<FlowRecord>) {
        let (idle, active) = (self.cfg.idle_timeout_ms, self.cfg.active_timeout_ms);
        for s in &mut self.slots {
            let Some(e) = s else { continue };
            let reason = if now_ms.saturating_sub(e.last_ms) >= idle {
                EndReason::IdleTimeout
            } else if now_ms.saturating_sub(e.start_ms) >= active {
                EndReason::ActiveTimeout
            } else {
                continue;
            };
            out.push(e.record(reason));
            count(&mut self.stats, reason);
            *s = None;
        }
    }

    /// Exports every flow with [`EndReason::ForcedEnd`] and empties the cache.
    pub fn flush(&mut self, out: &mut Vec<FlowRecord>) {
        for s in &mut self.slots {
            if let Some(e) = s.take() {
                out.push(e.record(EndReason::ForcedEnd));
                count(&mut self.stats, EndReason::ForcedEnd);
            }
        }
    }
}

fn count(stats: &mut CacheStats, r: EndReason) {
    match r {
        EndReason::IdleTimeout => stats.idle += 1,
        EndReason::ActiveTimeout => stats.active += 1,
        EndReason::ForcedEnd => stats.forced += 1,
        EndReason::LackOfResources => stats.evicted += 1,
    }
}
