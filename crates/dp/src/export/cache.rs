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
//! It runs once per forwarded frame at sampling 1, so a lookup is kept small: the hash is a
//! keyed multiply-fold over the key packed into a few words (as the conntrack table's, not
//! SipHash), a set is picked by a multiply (no division), and each slot has a 32-bit tag of
//! its hash in an array apart from the entries, so a probe reads one cache line of tags and
//! compares a whole key only where the tag matches.
//!
//! Before that, the common frame (untagged IPv4 without options, as [`parse`] reads in
//! place) is looked up in a small direct-mapped memo of recent flows by its header words as
//! they are ([`MEMO`] entries: header words with the ingress and egress port, and the slot): a flow seen a moment ago (a
//! guest's burst, a few flows interleaved) costs a few word compares and the counter update,
//! no key built, no hash, no probe. An entry only names a slot while no flow has left the
//! cache since it was made (a generation number: anything that frees a slot bumps it).
//!
//! Sampling is systematic count-based (RFC 5475 §6.1, "1 in N"): every Nth frame the cache
//! is offered is accounted; the exporter tells the collector N so it scales the counts.
//! Octets are IP octets (IP header and payload, RFC 7012 `octetDeltaCount`), not frame
//! bytes. Frames that are not IPv4 or IPv6 are counted (`not_ip`) and not cached.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use qswitch_wire::ethernet::{self, EtherType};
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
    /// Per slot: its entry's hash tag ([`tag`], never 0), 0 if the slot is free.
    tags: Vec<u32>,
    /// Per slot: the flow, meaningful where the tag is not 0.
    entries: Vec<Entry>,
    sets: usize,
    seeds: [u64; 4],
    /// Recent flows by their header words (see the module docs).
    memo: Box<[Memo; MEMO]>,
    /// Bumped whenever a slot is freed: memo entries of older generations are void.
    generation: u32,
    /// Frames until the next sampled one (1: the next).
    countdown: u32,
    stats: CacheStats,
}

/// 64 × 64 → 128-bit multiply folded to 64 bits (the mixing step of foldhash and wyhash).
#[inline]
fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// A slot's tag of hash `h`: its low half, never 0 (0 marks a free slot).
#[inline]
fn tag(h: u64) -> u32 {
    (h as u32) | 1
}

const EMPTY: Entry = Entry {
    key: FlowKey {
        src_mac: [0; 6],
        dst_mac: [0; 6],
        vlan: None,
        ips: IpPair::V4 {
            src: [0; 4],
            dst: [0; 4],
        },
        proto: 0,
        src_port: 0,
        dst_port: 0,
        ingress: 0,
        egress: 0,
    },
    packets: 0,
    octets: 0,
    start_ms: 0,
    last_ms: 0,
    tcp_flags: 0,
};

/// The key, IP octets and TCP flags of a frame; `None` if it is not IP (or is malformed).
#[inline]
pub fn parse(frame: &[u8], ingress: u32, egress: u32) -> Option<(FlowKey, u64, u8)> {
    // The common case read in place (what the general parse below would make of it): an
    // untagged IPv4 frame from a unicast source with a 20-byte header, all of it present.
    if let Some(h) = frame.get(..ETH_IPV4) {
        let total = usize::from(u16::from_be_bytes([h[16], h[17]]));
        if h[12..15] == [0x08, 0x00, 0x45]
            && h[6] & 1 == 0
            && frame.len() <= l2::MAX_FRAME_LEN
            && total >= ipv4::HEADER_LEN
            && frame.len() - ethernet::HEADER_LEN >= total
        {
            let later = u16::from_be_bytes([h[20], h[21]]) & 0x1fff != 0;
            let proto = IpProtocol::from(h[23]);
            let l4 = &frame[ETH_IPV4..ethernet::HEADER_LEN + total];
            let (src_port, dst_port, flags) = l4_fields(proto, l4, later);
            let key = FlowKey {
                src_mac: [h[6], h[7], h[8], h[9], h[10], h[11]],
                dst_mac: [h[0], h[1], h[2], h[3], h[4], h[5]],
                vlan: None,
                ips: IpPair::V4 {
                    src: [h[26], h[27], h[28], h[29]],
                    dst: [h[30], h[31], h[32], h[33]],
                },
                proto: h[23],
                src_port,
                dst_port,
                ingress,
                egress,
            };
            return Some((key, total as u64, flags));
        }
    }
    parse_general(frame, ingress, egress)
}

/// An Ethernet header and an IPv4 header without options.
const ETH_IPV4: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN;

/// Source and destination port and TCP flags of upper-layer `l4` (zeros if it has none or
/// `later`, a non-first fragment).
#[inline]
fn l4_fields(proto: IpProtocol, l4: &[u8], later: bool) -> (u16, u16, u8) {
    if later {
        return (0, 0, 0);
    }
    match proto {
        IpProtocol::Tcp if l4.len() >= tcp::HEADER_LEN => {
            let t = tcp::Packet::new_unchecked(l4);
            (t.src_port(), t.dst_port(), t.flags())
        }
        IpProtocol::Udp if l4.len() >= udp::HEADER_LEN => {
            let u = udp::Packet::new_unchecked(l4);
            (u.src_port(), u.dst_port(), 0)
        }
        _ => (0, 0, 0),
    }
}

/// [`parse`] of any frame, with the wire crate's parsers (VLAN tags, IPv4 options, IPv6).
pub fn parse_general(frame: &[u8], ingress: u32, egress: u32) -> Option<(FlowKey, u64, u8)> {
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
    let (src_port, dst_port, flags) = l4_fields(proto, l4, later);
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

/// Entries of a cache's memo of recent flows (a power of two).
pub const MEMO: usize = 32;

/// A memo entry: a frame's header words ([`memo_words`]) and the slot of its flow.
#[derive(Clone, Copy)]
struct Memo {
    words: [u64; 6],
    slot: u32,
    /// The cache's generation when made (0: never made; the cache's starts at 1).
    generation: u32,
}

impl Memo {
    const VOID: Memo = Memo {
        words: [0; 6],
        slot: 0,
        generation: 0,
    };
}

/// The words of a frame of the shape [`parse`] reads in place, that decide its flow key
/// (with the ports and the VLAN the switch decided, see [`FlowCache::observe_in`]), and its
/// IP octets and TCP flags; `None` for another shape. Frames with equal words have equal
/// keys: the words hold every byte the key is read from, and the checks here (IPv4 with a
/// 20-byte header from a unicast source, at least 20 bytes of upper layer, all present)
/// make the fast parse's.
#[inline]
fn memo_words(
    frame: &[u8],
    ingress: u32,
    egress: u32,
    vlan: Option<u16>,
) -> Option<([u64; 6], u64, u8)> {
    let h: &[u8; ETH_IPV4 + tcp::HEADER_LEN] =
        frame.get(..ETH_IPV4 + tcp::HEADER_LEN)?.try_into().ok()?;
    let total = usize::from(u16::from_be_bytes([h[16], h[17]]));
    if h[12..15] != [0x08, 0x00, 0x45]
        || h[6] & 1 != 0
        || frame.len() > l2::MAX_FRAME_LEN
        || total < ipv4::HEADER_LEN + tcp::HEADER_LEN
        || frame.len() - ethernet::HEADER_LEN < total
    {
        return None;
    }
    let w = |at: usize| {
        u64::from_le_bytes([
            h[at],
            h[at + 1],
            h[at + 2],
            h[at + 3],
            h[at + 4],
            h[at + 5],
            h[at + 6],
            h[at + 7],
        ])
    };
    let w32 = |at: usize| u64::from(u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]));
    // The VLAN as decided (a code apart from every VID), or the frame's: untagged.
    let vlan = vlan.map_or(1 << 17, |v| u64::from(v) | 1 << 16);
    let words = [
        w32(34) | u64::from(ingress) << 32, // ports first: what differs most between flows
        w(26),                              // addresses
        w32(20) | vlan << 32,               // fragment, TTL, protocol
        w(0),                               // destination MAC, start of the source
        w(8),                               // rest of the source MAC, EtherType, version
        u64::from(egress),
    ];
    let later = u16::from_be_bytes([h[20], h[21]]) & 0x1fff != 0;
    let flags = if h[23] == 6 && !later {
        h[ETH_IPV4 + 13]
    } else {
        0
    };
    Some((words, total as u64, flags))
}

/// The memo entry of header words `w`.
#[inline]
fn memo_index(w: &[u64; 6]) -> usize {
    ((w[0] ^ w[1] ^ w[5]).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59) as usize & (MEMO - 1)
}

/// Whether `a` and `b` are the same flow: [`FlowKey`]'s equality, the fields that differ
/// most between flows first (so a different flow is told in a compare or two).
#[inline]
fn same_flow(a: &FlowKey, b: &FlowKey) -> bool {
    a.src_port == b.src_port
        && a.dst_port == b.dst_port
        && a.egress == b.egress
        && a.ingress == b.ingress
        && a.proto == b.proto
        && a.ips == b.ips
        && a.src_mac == b.src_mac
        && a.dst_mac == b.dst_mac
        && a.vlan == b.vlan
}

impl FlowCache {
    pub fn new(cfg: CacheConfig) -> FlowCache {
        let sets = cfg.capacity.div_ceil(WAYS).max(1);
        let random = RandomState::new();
        let mut seeds = [0u64; 4];
        for (i, s) in seeds.iter_mut().enumerate() {
            let mut h = random.build_hasher();
            h.write_usize(i);
            *s = h.finish() | 1;
        }
        FlowCache {
            cfg,
            tags: vec![0; sets * WAYS],
            entries: vec![EMPTY; sets * WAYS],
            sets,
            seeds,
            memo: Box::new([Memo::VOID; MEMO]),
            generation: 1,
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
        self.tags.iter().filter(|&&t| t != 0).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The keyed hash of `k`: its fields packed into words, folded with the cache's seeds.
    #[inline]
    fn hash(&self, k: &FlowKey) -> u64 {
        let [a0, a1, a2, a3, a4, a5] = k.src_mac;
        let [b0, b1, b2, b3, b4, b5] = k.dst_mac;
        let macs = u64::from_le_bytes([a0, a1, a2, a3, a4, a5, b0, b1]);
        let vlan = k.vlan.map_or(0, |v| u64::from(v) | 1 << 16);
        let rest =
            u64::from(u32::from_le_bytes([b2, b3, b4, b5])) | vlan << 32 | u64::from(k.proto) << 49;
        let ports =
            u64::from(k.src_port) | u64::from(k.dst_port) << 16 | u64::from(k.ingress) << 32;
        let ips = match &k.ips {
            IpPair::V4 { src, dst } => {
                u64::from(u32::from_le_bytes(*src)) | u64::from(u32::from_le_bytes(*dst)) << 32
            }
            IpPair::V6 { src, dst } => {
                let w = |b: &[u8; 16], i: usize| {
                    let mut x = [0u8; 8];
                    x.copy_from_slice(&b[i..i + 8]);
                    u64::from_le_bytes(x)
                };
                fold(w(src, 0) ^ self.seeds[0], w(src, 8) ^ self.seeds[1])
                    ^ fold(w(dst, 0) ^ self.seeds[2], w(dst, 8) ^ self.seeds[3])
                    ^ 1 << 63
            }
        };
        let h = fold(macs ^ self.seeds[0], rest ^ self.seeds[1])
            ^ fold(
                ports ^ self.seeds[2],
                (ips ^ u64::from(k.egress)) ^ self.seeds[3],
            );
        fold(h, self.seeds[1])
    }

    /// The first slot of the set of hash `h` (a multiply-shift onto `0..sets`).
    #[inline]
    fn set_of(&self, h: u64) -> usize {
        ((u128::from(h) * self.sets as u128) >> 64) as usize * WAYS
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
    #[inline]
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
        // The memo: a flow seen a moment ago, found by its header words.
        let memo = memo_words(frame, ingress, egress, vlan).map(|(words, octets, flags)| {
            let i = memo_index(&words);
            (words, octets, flags, i)
        });
        if let Some((words, octets, flags, i)) = memo {
            let m = &self.memo[i];
            if m.generation == self.generation
                && m.words == words
                && self.add(m.slot as usize, octets, flags, now_ms)
            {
                return;
            }
        }
        let memo = memo.map(|(words, _, _, i)| (words, i));
        let Some((mut key, octets, flags)) = parse(frame, ingress, egress) else {
            self.stats.not_ip += 1;
            return;
        };
        if let Some(v) = vlan {
            key.vlan = (v != 0).then_some(v);
        }
        let slot = self.account(&key, octets, flags, now_ms, out);
        if let Some((words, i)) = memo {
            self.memo[i] = Memo {
                words,
                slot: slot as u32,
                generation: self.generation,
            };
        }
    }

    /// Accounts one sampled frame of flow `key`; returns the slot that holds the flow.
    #[inline]
    fn account(
        &mut self,
        key: &FlowKey,
        octets: u64,
        flags: u8,
        now_ms: u64,
        out: &mut Vec<FlowRecord>,
    ) -> usize {
        let h = self.hash(key);
        let (set, t) = (self.set_of(h), tag(h));
        let tags: &[u32; WAYS] = self.tags[set..set + WAYS].try_into().expect("a set");
        let entries: &[Entry; WAYS] = self.entries[set..set + WAYS].try_into().expect("a set");
        let hit = (0..WAYS).find(|&w| tags[w] == t && same_flow(&entries[w].key, key));
        if let Some(w) = hit {
            if self.add(set + w, octets, flags, now_ms) {
                return set + w;
            }
            // Ended by a timeout: exported, and the flow starts over in a fresh entry.
            self.end(set + w, now_ms, out);
        }
        let w = match self.tags[set..set + WAYS].iter().position(|&g| g == 0) {
            Some(w) => w,
            None => {
                let w = (0..WAYS)
                    .min_by_key(|&w| self.entries[set + w].last_ms)
                    .expect("WAYS > 0");
                out.push(self.entries[set + w].record(EndReason::LackOfResources));
                count(&mut self.stats, EndReason::LackOfResources);
                self.bump();
                w
            }
        };
        self.tags[set + w] = t;
        self.entries[set + w] = Entry {
            key: *key,
            packets: 1,
            octets,
            start_ms: now_ms,
            last_ms: now_ms,
            tcp_flags: flags,
        };
        self.stats.flows += 1;
        set + w
    }

    /// Adds a frame to the flow in slot `i`, unless the flow is past a timeout at `now_ms`
    /// (then `false`, nothing changed).
    #[inline]
    fn add(&mut self, i: usize, octets: u64, flags: u8, now_ms: u64) -> bool {
        let e = &mut self.entries[i];
        if now_ms.saturating_sub(e.last_ms) >= self.cfg.idle_timeout_ms
            || now_ms.saturating_sub(e.start_ms) >= self.cfg.active_timeout_ms
        {
            return false;
        }
        e.packets += 1;
        e.octets += octets;
        e.last_ms = e.last_ms.max(now_ms);
        e.tcp_flags |= flags;
        true
    }

    /// Exports the flow in slot `i`, past a timeout at `now_ms`, and frees the slot.
    #[cold]
    fn end(&mut self, i: usize, now_ms: u64, out: &mut Vec<FlowRecord>) {
        let e = &self.entries[i];
        let r = if now_ms.saturating_sub(e.last_ms) >= self.cfg.idle_timeout_ms {
            EndReason::IdleTimeout
        } else {
            EndReason::ActiveTimeout
        };
        out.push(e.record(r));
        count(&mut self.stats, r);
        self.tags[i] = 0;
        self.bump();
    }

    /// Voids every memo entry (a slot was freed, or may be).
    #[inline]
    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // Wrapped: every entry is voided, so none made 2^32 bumps ago can match.
            self.memo.fill(Memo::VOID);
            self.generation = 1;
        }
    }

    /// Exports (onto `out`) and removes the flows past their idle or active timeout at
    /// `now_ms`. Looks at every slot: call it about once a second, not per frame.
    pub fn expire(&mut self, now_ms: u64, out: &mut Vec<FlowRecord>) {
        self.bump();
        let (idle, active) = (self.cfg.idle_timeout_ms, self.cfg.active_timeout_ms);
        for (t, e) in self.tags.iter_mut().zip(&self.entries) {
            if *t == 0 {
                continue;
            }
            let reason = if now_ms.saturating_sub(e.last_ms) >= idle {
                EndReason::IdleTimeout
            } else if now_ms.saturating_sub(e.start_ms) >= active {
                EndReason::ActiveTimeout
            } else {
                continue;
            };
            out.push(e.record(reason));
            count(&mut self.stats, reason);
            *t = 0;
        }
    }

    /// Exports every flow with [`EndReason::ForcedEnd`] and empties the cache.
    pub fn flush(&mut self, out: &mut Vec<FlowRecord>) {
        self.bump();
        for (t, e) in self.tags.iter_mut().zip(&self.entries) {
            if *t != 0 {
                out.push(e.record(EndReason::ForcedEnd));
                count(&mut self.stats, EndReason::ForcedEnd);
                *t = 0;
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
