//! An IPFIX (RFC 7011) message encoder for [`FlowRecord`]s, over UDP.
//!
//! Three templates, sent in the first message and again every
//! [`IpfixEncoder::template_interval_ms`] (RFC 7011 §8.4: over UDP a collector learns them
//! only from retransmission, e.g. after it restarts), and whenever
//! [`IpfixEncoder::resend_templates`] asks:
//! - 256, IPv4 flows, and 257, IPv6 flows: MACs, VLAN, addresses, ports, protocol, TCP
//!   flags, ingress and egress interface, packet and octet deltas, start and end
//!   (milliseconds), end reason (information elements of RFC 7012 / the IANA registry);
//! - 258, an options template scoped by the observation domain carrying the sampling:
//!   `samplingInterval` (34) and `samplingAlgorithm` (35, 1 = deterministic), the legacy
//!   pair collectors such as nfdump and pmacct read to scale the counts; one record of it
//!   follows each template set.
//!
//! Each message fits in `max_len` bytes (a UDP payload within the path MTU); records are
//! packed into as few messages as that allows. The sequence number of a message is the
//! number of data records sent before it in this observation domain (mod 2³²), options
//! records included (RFC 7011 §3.1).

use super::cache::FlowRecord;
use qswitch_wire::flow::IpPair;

/// The IPFIX version number.
pub const VERSION: u16 = 10;
/// Template IDs.
pub const TEMPLATE_V4: u16 = 256;
pub const TEMPLATE_V6: u16 = 257;
pub const TEMPLATE_SAMPLING: u16 = 258;
/// A UDP payload that fits a 1500-byte MTU over IPv6 (1500 - 40 - 8) with room to spare.
pub const DEFAULT_MAX_LEN: usize = 1400;
const HEADER_LEN: usize = 16;
const SET_HEADER_LEN: usize = 4;

/// Information element IDs (IANA "IPFIX Information Elements").
pub mod ie {
    pub const OCTET_DELTA_COUNT: u16 = 1;
    pub const PACKET_DELTA_COUNT: u16 = 2;
    pub const PROTOCOL_IDENTIFIER: u16 = 4;
    pub const TCP_CONTROL_BITS: u16 = 6;
    pub const SOURCE_TRANSPORT_PORT: u16 = 7;
    pub const SOURCE_IPV4_ADDRESS: u16 = 8;
    pub const INGRESS_INTERFACE: u16 = 10;
    pub const DESTINATION_TRANSPORT_PORT: u16 = 11;
    pub const DESTINATION_IPV4_ADDRESS: u16 = 12;
    pub const EGRESS_INTERFACE: u16 = 14;
    pub const SOURCE_IPV6_ADDRESS: u16 = 27;
    pub const DESTINATION_IPV6_ADDRESS: u16 = 28;
    pub const SAMPLING_INTERVAL: u16 = 34;
    pub const SAMPLING_ALGORITHM: u16 = 35;
    pub const SOURCE_MAC_ADDRESS: u16 = 56;
    pub const VLAN_ID: u16 = 58;
    pub const DESTINATION_MAC_ADDRESS: u16 = 80;
    pub const FLOW_END_REASON: u16 = 136;
    pub const OBSERVATION_DOMAIN_ID: u16 = 149;
    pub const FLOW_START_MILLISECONDS: u16 = 152;
    pub const FLOW_END_MILLISECONDS: u16 = 153;
}

/// (IE, length) of a flow template; the address fields are 4 or 16 bytes.
fn fields(v6: bool) -> [(u16, u16); 16] {
    let a = if v6 { 16 } else { 4 };
    let (src, dst) = if v6 {
        (ie::SOURCE_IPV6_ADDRESS, ie::DESTINATION_IPV6_ADDRESS)
    } else {
        (ie::SOURCE_IPV4_ADDRESS, ie::DESTINATION_IPV4_ADDRESS)
    };
    [
        (ie::SOURCE_MAC_ADDRESS, 6),
        (ie::DESTINATION_MAC_ADDRESS, 6),
        (ie::VLAN_ID, 2),
        (src, a),
        (dst, a),
        (ie::SOURCE_TRANSPORT_PORT, 2),
        (ie::DESTINATION_TRANSPORT_PORT, 2),
        (ie::PROTOCOL_IDENTIFIER, 1),
        (ie::TCP_CONTROL_BITS, 2),
        (ie::INGRESS_INTERFACE, 4),
        (ie::EGRESS_INTERFACE, 4),
        (ie::PACKET_DELTA_COUNT, 8),
        (ie::OCTET_DELTA_COUNT, 8),
        (ie::FLOW_START_MILLISECONDS, 8),
        (ie::FLOW_END_MILLISECONDS, 8),
        (ie::FLOW_END_REASON, 1),
    ]
}

/// Bytes of one data record of the IPv4 (`false`) or IPv6 template.
pub fn record_len(v6: bool) -> usize {
    fields(v6).iter().map(|&(_, l)| usize::from(l)).sum()
}

/// Encodes flow records into IPFIX messages (see the module docs). Pure: the time is passed
/// in, the messages are returned for the caller to send.
#[derive(Debug, Clone)]
pub struct IpfixEncoder {
    domain: u32,
    sampling: u32,
    max_len: usize,
    /// Data records sent so far (the next message's sequence number).
    sequence: u32,
    /// When the templates were last sent (`None`: never, or a resend was asked for).
    templates_sent_ms: Option<u64>,
    /// How often the templates are sent again.
    pub template_interval_ms: u64,
    messages: u64,
    template_sends: u64,
}

impl IpfixEncoder {
    /// An encoder for observation domain `domain`, announcing 1-in-`sampling` sampling,
    /// writing messages of at most `max_len` bytes (at least 512).
    pub fn new(domain: u32, sampling: u32, max_len: usize) -> IpfixEncoder {
        IpfixEncoder {
            domain,
            sampling: sampling.max(1),
            max_len: max_len.max(512),
            sequence: 0,
            templates_sent_ms: None,
            template_interval_ms: 10_000,
            messages: 0,
            template_sends: 0,
        }
    }

    /// Data records sent so far.
    pub fn sequence(&self) -> u32 {
        self.sequence
    }

    /// Messages written so far.
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Messages that carried the templates so far.
    pub fn template_sends(&self) -> u64 {
        self.template_sends
    }

    /// Puts the templates in the next message, whatever the interval.
    pub fn resend_templates(&mut self) {
        self.templates_sent_ms = None;
    }

    /// The messages carrying `records` at `now_ms` (Unix milliseconds: the export time is
    /// its seconds), templates first when they are due. With no records and templates due,
    /// one message with the templates alone.
    pub fn encode(&mut self, records: &[FlowRecord], now_ms: u64) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let due = self
            .templates_sent_ms
            .is_none_or(|t| now_ms.saturating_sub(t) >= self.template_interval_ms);
        let mut msg = self.start(now_ms);
        if due {
            self.templates_sent_ms = Some(now_ms);
            self.put_templates(&mut msg);
        }
        for v6 in [false, true] {
            let mut set: Option<usize> = None;
            for r in records
                .iter()
                .filter(|r| matches!(r.key.ips, IpPair::V6 { .. }) == v6)
            {
                let need = record_len(v6) + if set.is_none() { SET_HEADER_LEN } else { 0 };
                if msg.len() + need > self.max_len {
                    if let Some(at) = set.take() {
                        close_set(&mut msg, at);
                    }
                    out.push(self.finish(msg));
                    msg = self.start(now_ms);
                }
                if set.is_none() {
                    set = Some(open_set(
                        &mut msg,
                        if v6 { TEMPLATE_V6 } else { TEMPLATE_V4 },
                    ));
                }
                put_record(&mut msg, r);
                self.sequence = self.sequence.wrapping_add(1);
            }
            if let Some(at) = set {
                close_set(&mut msg, at);
            }
        }
        if msg.len() > HEADER_LEN {
            out.push(self.finish(msg));
        }
        out
    }

    fn start(&self, now_ms: u64) -> Vec<u8> {
        let mut m = Vec::with_capacity(self.max_len);
        m.extend_from_slice(&VERSION.to_be_bytes());
        m.extend_from_slice(&0u16.to_be_bytes()); // length, in finish
        m.extend_from_slice(&((now_ms / 1000) as u32).to_be_bytes());
        m.extend_from_slice(&self.sequence.to_be_bytes());
        m.extend_from_slice(&self.domain.to_be_bytes());
        m
    }

    fn finish(&mut self, mut m: Vec<u8>) -> Vec<u8> {
        let len = m.len() as u16;
        m[2..4].copy_from_slice(&len.to_be_bytes());
        // The sequence number is that of the message's first record: written at start.
        self.messages += 1;
        m
    }

    /// The template set (both flow templates), the options template set and its record.
    /// About 200 bytes: always fits an empty message.
    fn put_templates(&mut self, m: &mut Vec<u8>) {
        self.template_sends += 1;
        let at = open_set(m, 2);
        for (id, v6) in [(TEMPLATE_V4, false), (TEMPLATE_V6, true)] {
            let f = fields(v6);
            m.extend_from_slice(&id.to_be_bytes());
            m.extend_from_slice(&(f.len() as u16).to_be_bytes());
            for (ie, len) in f {
                m.extend_from_slice(&ie.to_be_bytes());
                m.extend_from_slice(&len.to_be_bytes());
            }
        }
        close_set(m, at);
        let at = open_set(m, 3);
        m.extend_from_slice(&TEMPLATE_SAMPLING.to_be_bytes());
        m.extend_from_slice(&3u16.to_be_bytes()); // field count
        m.extend_from_slice(&1u16.to_be_bytes()); // scope field count
        for (ie, len) in [
            (ie::OBSERVATION_DOMAIN_ID, 4u16),
            (ie::SAMPLING_INTERVAL, 4),
            (ie::SAMPLING_ALGORITHM, 1),
        ] {
            m.extend_from_slice(&ie.to_be_bytes());
            m.extend_from_slice(&len.to_be_bytes());
        }
        close_set(m, at);
        let at = open_set(m, TEMPLATE_SAMPLING);
        m.extend_from_slice(&self.domain.to_be_bytes());
        m.extend_from_slice(&self.sampling.to_be_bytes());
        m.push(1); // deterministic (systematic count-based)
        close_set(m, at);
        self.sequence = self.sequence.wrapping_add(1);
    }
}

fn open_set(m: &mut Vec<u8>, id: u16) -> usize {
    let at = m.len();
    m.extend_from_slice(&id.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    at
}

fn close_set(m: &mut [u8], at: usize) {
    let len = (m.len() - at) as u16;
    m[at + 2..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn put_record(m: &mut Vec<u8>, r: &FlowRecord) {
    let k = &r.key;
    m.extend_from_slice(&k.src_mac);
    m.extend_from_slice(&k.dst_mac);
    m.extend_from_slice(&k.vlan.unwrap_or(0).to_be_bytes());
    match k.ips {
        IpPair::V4 { src, dst } => {
            m.extend_from_slice(&src);
            m.extend_from_slice(&dst);
        }
        IpPair::V6 { src, dst } => {
            m.extend_from_slice(&src);
            m.extend_from_slice(&dst);
        }
    }
    m.extend_from_slice(&k.src_port.to_be_bytes());
    m.extend_from_slice(&k.dst_port.to_be_bytes());
    m.push(k.proto);
    m.extend_from_slice(&u16::from(r.tcp_flags).to_be_bytes());
    m.extend_from_slice(&k.ingress.to_be_bytes());
    m.extend_from_slice(&k.egress.to_be_bytes());
    m.extend_from_slice(&r.packets.to_be_bytes());
    m.extend_from_slice(&r.octets.to_be_bytes());
    m.extend_from_slice(&r.start_ms.to_be_bytes());
    m.extend_from_slice(&r.end_ms.to_be_bytes());
    m.push(r.end_reason as u8);
}
