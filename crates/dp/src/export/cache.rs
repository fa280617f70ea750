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
//! It runs for every forwarded frame at sampling 1, so the common frame is kept cheap. A
//! frame of the common shape (untagged IPv4 without options, unicast source, as [`parse`]
//! reads in place) is not made into a [`FlowKey`]: its key fields are read straight into
//! four words (`compact`: the MACs, the protocol and ingress port, the addresses, the ports
//! with the egress port and VLAN), which are what an entry of such a key is found by, hashed
//! (a keyed multiply-fold, as the conntrack table's, not SipHash) and compared. A set is
//! picked by a multiply (no division), and each slot has a 32-bit tag of its hash in an array
//! apart from the entries, so a probe reads one cache line of tags and compares words only
//! where a tag matches. Keys of other shapes (IPv6, VLAN tags in the frame, IPv4 options)
//! take the same path with the key itself.
//!
//! [`FlowCache::observe_burst`] takes the frames one destination gets from a burst: frames
//! of a flow already seen in the same burst are added up in a small table of the burst's
//! flows ([`RUNS`]) and each flow updates the cache once, at the end of the burst, with its
//! frame and octet counts (all frames of a burst have the same time, so this is what one
//! update per frame would count). While bursts keep holding a different flow in every
//! frame, the table is skipped for a while ([`RUNS_OFF`] bursts).
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
    /// `compact` of the key, or `NOT_COMPACT`.
    words: Words,
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
    /// The flows of the burst [`FlowCache::observe_burst`] is adding up.
    runs: [Run; RUNS],
    /// Bursts to go without the table of runs (it kept missing).
    runs_off: u32,
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
    words: NOT_COMPACT,
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

/// A key of the common shape packed into words (see [`compact`]).
pub(super) type Words = [u64; 4];

/// The words of an entry whose key has no [`compact`] form: bits that no compact key has.
const NOT_COMPACT: Words = [u64::MAX; 4];

/// The packed words of key `k`, if it has the common shape: IPv4, ports that fit in 16 bits,
/// a VLAN below 4096. One-to-one: keys with equal words are equal. Word 1's top 8 bits are
/// always 0 (so no compact key has [`NOT_COMPACT`]'s words).
///
/// - 0: destination MAC, first 2 bytes of the source MAC;
/// - 1: its other 4 bytes, the protocol (bits 32–39), the ingress port (40–55);
/// - 2: source and destination address;
/// - 3: source and destination port as on the wire, the egress port (32–47), the VLAN
///   (48–60: 0 none, else 0x1000 | VID).
#[inline]
pub(super) fn compact(k: &FlowKey) -> Option<Words> {
    let IpPair::V4 { src, dst } = k.ips else {
        return None;
    };
    let vlan = vlan_code(k.vlan)?;
    if k.ingress > 0xffff || k.egress > 0xffff {
        return None;
    }
    let [a0, a1, a2, a3, a4, a5] = k.src_mac;
    let [b0, b1, b2, b3, b4, b5] = k.dst_mac;
    let ([s0, s1], [d0, d1]) = (k.src_port.to_be_bytes(), k.dst_port.to_be_bytes());
    Some([
        u64::from_le_bytes([b0, b1, b2, b3, b4, b5, a0, a1]),
        u64::from(u32::from_le_bytes([a2, a3, a4, a5]))
            | u64::from(k.proto) << 32
            | u64::from(k.ingress) << 40,
        u64::from(u32::from_le_bytes(src)) | u64::from(u32::from_le_bytes(dst)) << 32,
        u64::from(u32::from_le_bytes([s0, s1, d0, d1])) | u64::from(k.egress) << 32 | vlan << 48,
    ])
}

/// A key's VLAN as [`compact`] packs it; `None` for a VID that does not fit.
#[inline]
fn vlan_code(vlan: Option<u16>) -> Option<u64> {
    match vlan {
        None => Some(0),
        Some(v) if v < 0x1000 => Some(u64::from(v) | 0x1000),
        Some(_) => None,
    }
}

/// The key that [`compact`] packed into `w`.
pub(super) fn key_of(w: &Words) -> FlowKey {
    let [b0, b1, b2, b3, b4, b5, a0, a1] = w[0].to_le_bytes();
    let [a2, a3, a4, a5, ..] = w[1].to_le_bytes();
    let [s0, s1, s2, s3, d0, d1, d2, d3] = w[2].to_le_bytes();
    let [p0, p1, p2, p3, ..] = w[3].to_le_bytes();
    let vlan = (w[3] >> 48) as u16;
    FlowKey {
        src_mac: [a0, a1, a2, a3, a4, a5],
        dst_mac: [b0, b1, b2, b3, b4, b5],
        vlan: (vlan != 0).then_some(vlan & 0xfff),
        ips: IpPair::V4 {
            src: [s0, s1, s2, s3],
            dst: [d0, d1, d2, d3],
        },
        proto: (w[1] >> 32) as u8,
        src_port: u16::from_be_bytes([p0, p1]),
        dst_port: u16::from_be_bytes([p2, p3]),
        ingress: (w[1] >> 40) as u32 & 0xffff,
        egress: (w[3] >> 32) as u32 & 0xffff,
    }
}

/// The bytes of a frame [`frame_words`] reads: Ethernet, IPv4 without options, 20 more.
const WORDS_BYTES: usize = ETH_IPV4 + tcp::HEADER_LEN;

/// [`compact`] of the key of a frame of the shape [`parse`] reads in place, read from the
/// frame without making the key, with its IP octets and TCP flags; `None` for a frame of
/// another shape (or shorter than [`WORDS_BYTES`]). `ingress` is the ingress port shifted to
/// its place in word 1, `egress_vlan` the egress port and VLAN code in theirs in word 3
/// (the caller checked they fit).
#[inline]
pub(super) fn frame_words(
    frame: &[u8],
    ingress: u64,
    egress_vlan: u64,
) -> Option<(Words, u64, u8)> {
    let h: &[u8; WORDS_BYTES] = frame.get(..WORDS_BYTES)?.try_into().ok()?;
    let total = usize::from(u16::from_be_bytes([h[16], h[17]]));
    if h[12..15] != [0x08, 0x00, 0x45]
        || h[6] & 1 != 0
        || frame.len() > l2::MAX_FRAME_LEN
        || total < ipv4::HEADER_LEN
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
    // As `l4_fields`: ports of TCP and UDP with their whole header, flags of TCP; none in a
    // later fragment.
    let later = u16::from_be_bytes([h[20], h[21]]) & 0x1fff != 0;
    let (proto, l4) = (h[23], total - ipv4::HEADER_LEN);
    let (ports, flags) = if later {
        (0, 0)
    } else if proto == 6 && l4 >= tcp::HEADER_LEN {
        (w32(ETH_IPV4), h[ETH_IPV4 + 13])
    } else if proto == 17 && l4 >= udp::HEADER_LEN {
        (w32(ETH_IPV4), 0)
    } else {
        (0, 0)
    };
    let words = [
        w(0),
        w32(8) | u64::from(proto) << 32 | ingress,
        w(26),
        ports | egress_vlan,
    ];
    Some((words, total as u64, flags))
}

/// Whether two keys' words are equal, the word that differs most between flows (ports)
/// first.
#[inline]
fn same_words(a: &Words, b: &Words) -> bool {
    a[3] == b[3] && a[2] == b[2] && a[0] == b[0] && a[1] == b[1]
}

/// Distinct flows of a burst [`FlowCache::observe_burst`] adds up before it updates the
/// cache; frames of further flows update it one by one.
pub const RUNS: usize = 8;

/// Bursts that skip the table of runs after one in which no frame joined a run.
pub const RUNS_OFF: u32 = 16;

/// One flow's frames in a burst, added up.
#[derive(Clone, Copy)]
struct Run {
    words: Words,
    packets: u64,
    octets: u64,
    flags: u8,
}

impl Run {
    const NONE: Run = Run {
        words: NOT_COMPACT,
        packets: 0,
        octets: 0,
        flags: 0,
    };
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
            runs: [Run::NONE; RUNS],
            runs_off: 0,
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

    /// The keyed hash of a key's `compact` words.
    #[inline]
    fn hash_words(&self, w: &Words) -> u64 {
        fold(w[0] ^ self.seeds[0], w[1] ^ self.seeds[1])
            ^ fold(w[2] ^ self.seeds[2], w[3] ^ self.seeds[3])
    }

    /// The keyed hash of `k`: of its `compact` words, or, for a key without them, of its
    /// fields packed into words.
    fn hash(&self, k: &FlowKey) -> u64 {
        if let Some(w) = compact(k) {
            return self.hash_words(&w);
        }
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

    /// The ways of the set at `set` whose tag is `t`, as a bit mask.
    #[inline]
    fn tag_hits(&self, set: usize, t: u32) -> u32 {
        let tags: &[u32; WAYS] = self.tags[set..set + WAYS].try_into().expect("a set");
        let mut m = 0;
        for (w, &g) in tags.iter().enumerate() {
            m |= u32::from(g == t) << w;
        }
        m
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
        // The frame's own tag: the in-place shape has none.
        let decided = vlan.map_or(Some(0), |v| vlan_code((v != 0).then_some(v)));
        if let (Some(code), true) = (decided, ingress <= 0xffff && egress <= 0xffff) {
            let (i, ev) = (
                u64::from(ingress) << 40,
                u64::from(egress) << 32 | code << 48,
            );
            if let Some((words, octets, flags)) = frame_words(frame, i, ev) {
                self.account_words(&words, 1, octets, flags, now_ms, out);
                return;
            }
        }
        self.observe_general(frame, ingress, egress, vlan, now_ms, out);
    }

    /// Offers the frames a burst sends to one destination (from port `ingress` to `egress`,
    /// each with its VLAN as the switch decided it, 0: none) at `now_ms`: what
    /// [`FlowCache::observe_in`] of each would count, the frames of a flow seen before in
    /// the burst added up and accounted once (see the module docs).
    #[inline]
    pub fn observe_burst<'a>(
        &mut self,
        frames: impl Iterator<Item = (&'a [u8], u16)>,
        ingress: u32,
        egress: u32,
        now_ms: u64,
        out: &mut Vec<FlowRecord>,
    ) {
        let fits = ingress <= 0xffff && egress <= 0xffff;
        let (i, e) = (u64::from(ingress) << 40, u64::from(egress) << 32);
        let every = self.cfg.sampling.max(1);
        let use_runs = self.runs_off == 0;
        self.runs_off = self.runs_off.saturating_sub(1);
        let (mut countdown, mut seen, mut sampled) = (self.countdown, 0u64, 0u64);
        // Runs in the table, and the one the last frame went to.
        let (mut runs, mut last) = (0usize, 0usize);
        for (frame, vlan) in frames {
            seen += 1;
            if every > 1 {
                countdown -= 1;
                if countdown > 0 {
                    continue;
                }
                countdown = every;
                sampled += 1;
            }
            let code = if vlan == 0 {
                Some(0)
            } else {
                vlan_code(Some(vlan))
            };
            let words = match code {
                Some(code) if fits => frame_words(frame, i, e | code << 48),
                _ => None,
            };
            let Some((words, octets, flags)) = words else {
                self.observe_general(frame, ingress, egress, Some(vlan), now_ms, out);
                continue;
            };
            if use_runs {
                // The last frame's flow (a run of one flow), the one after it (flows
                // interleaved frame by frame), then any.
                let next = if last + 1 < runs { last + 1 } else { 0 };
                let at = if runs == 0 {
                    None
                } else if same_words(&self.runs[last].words, &words) {
                    Some(last)
                } else if same_words(&self.runs[next].words, &words) {
                    Some(next)
                } else {
                    self.runs[..runs]
                        .iter()
                        .position(|r| same_words(&r.words, &words))
                };
                if let Some(at) = at {
                    let r = &mut self.runs[at];
                    r.packets += 1;
                    r.octets += octets;
                    r.flags |= flags;
                    last = at;
                    continue;
                }
                if runs < RUNS {
                    self.runs[runs] = Run {
                        words,
                        packets: 1,
                        octets,
                        flags,
                    };
                    (last, runs) = (runs, runs + 1);
                    continue;
                }
            }
            self.account_words(&words, 1, octets, flags, now_ms, out);
        }
        if every == 1 {
            sampled = seen;
        }
        self.countdown = countdown;
        self.stats.frames += seen;
        self.stats.sampled += sampled;
        let mut joined = false;
        for k in 0..runs {
            let r = self.runs[k];
            joined |= r.packets > 1;
            self.account_words(&r.words, r.packets, r.octets, r.flags, now_ms, out);
        }
        if use_runs && !joined && runs == RUNS {
            // Every frame a different flow: the table only costs, for a while.
            self.runs_off = RUNS_OFF;
        }
    }

    /// Accounts a sampled frame of any shape (with the general parse).
    #[cold]
    fn observe_general(
        &mut self,
        frame: &[u8],
        ingress: u32,
        egress: u32,
        vlan: Option<u16>,
        now_ms: u64,
        out: &mut Vec<FlowRecord>,
    ) {
        let Some((mut key, octets, flags)) = parse(frame, ingress, egress) else {
            self.stats.not_ip += 1;
            return;
        };
        if let Some(v) = vlan {
            key.vlan = (v != 0).then_some(v);
        }
        if let Some(words) = compact(&key) {
            return self.account_words(&words, 1, octets, flags, now_ms, out);
        }
        let h = self.hash(&key);
        let (set, t) = (self.set_of(h), tag(h));
        let mut m = self.tag_hits(set, t);
        let mut ended = None;
        while m != 0 {
            let w = m.trailing_zeros() as usize;
            if same_flow(&self.entries[set + w].key, &key) {
                if self.add(set + w, 1, octets, flags, now_ms) {
                    return;
                }
                ended = Some(set + w);
                break;
            }
            m &= m - 1;
        }
        self.update(set, t, ended, (1, octets, flags), now_ms, out, || {
            (key, NOT_COMPACT)
        });
    }

    /// Accounts `packets` sampled frames of the flow of `compact` words `words`, with
    /// `octets` IP octets and TCP flags `flags` between them.
    #[inline]
    fn account_words(
        &mut self,
        words: &Words,
        packets: u64,
        octets: u64,
        flags: u8,
        now_ms: u64,
        out: &mut Vec<FlowRecord>,
    ) {
        let h = self.hash_words(words);
        let (set, t) = (self.set_of(h), tag(h));
        let mut m = self.tag_hits(set, t);
        while m != 0 {
            let w = m.trailing_zeros() as usize;
            if same_words(&self.entries[set + w].words, words) {
                if self.add(set + w, packets, octets, flags, now_ms) {
                    return;
                }
                let ended = Some(set + w);
                return self.update(set, t, ended, (packets, octets, flags), now_ms, out, || {
                    (key_of(words), *words)
                });
            }
            m &= m - 1;
        }
        self.update(set, t, None, (packets, octets, flags), now_ms, out, || {
            (key_of(words), *words)
        });
    }

    /// The slow half of a lookup in the set at `set` for a flow with tag `t` that was not
    /// found, or found in slot `ended` past a timeout (exported and freed here): a new entry
    /// (`key` makes its key and words) with counts (packets, octets, flags) at `now_ms`, in
    /// a free slot or in the set's least recently seen flow's (exported, counted).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn update(
        &mut self,
        set: usize,
        t: u32,
        ended: Option<usize>,
        (packets, octets, flags): (u64, u64, u8),
        now_ms: u64,
        out: &mut Vec<FlowRecord>,
        key: impl FnOnce() -> (FlowKey, Words),
    ) {
        if let Some(i) = ended {
            // Exported, and the flow starts over in a fresh entry.
            self.end(i, now_ms, out);
        }
        let w = match self.tags[set..set + WAYS].iter().position(|&g| g == 0) {
            Some(w) => w,
            None => {
                let w = (0..WAYS)
                    .min_by_key(|&w| self.entries[set + w].last_ms)
                    .expect("WAYS > 0");
                out.push(self.entries[set + w].record(EndReason::LackOfResources));
                count(&mut self.stats, EndReason::LackOfResources);
                w
            }
        };
        let (key, words) = key();
        self.tags[set + w] = t;
        self.entries[set + w] = Entry {
            key,
            words,
            packets,
            octets,
            start_ms: now_ms,
            last_ms: now_ms,
            tcp_flags: flags,
        };
        self.stats.flows += 1;
    }

    /// Adds frames to the flow in slot `i`, unless the flow is past a timeout at `now_ms`
    /// (then `false`, nothing changed).
    #[inline]
    fn add(&mut self, i: usize, packets: u64, octets: u64, flags: u8, now_ms: u64) -> bool {
        let e = &mut self.entries[i];
        if now_ms.saturating_sub(e.last_ms) >= self.cfg.idle_timeout_ms
            || now_ms.saturating_sub(e.start_ms) >= self.cfg.active_timeout_ms
        {
            return false;
        }
        e.packets += packets;
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
    }

    /// Exports (onto `out`) and removes the flows past their idle or active timeout at
    /// `now_ms`. Looks at every slot: call it about once a second, not per frame.
    pub fn expire(&mut self, now_ms: u64, out: &mut Vec<FlowRecord>) {
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
