//! What connection tracking needs to know about a frame.
//!
//! [`parse`] reads an Ethernet frame (untagged or with one 802.1Q tag) down to the
//! connection it belongs to: the addresses, the protocol and the ports (TCP, UDP, SCTP), or
//! the identifier of an ICMP/ICMPv6 echo; for TCP the flags, sequence and acknowledgement
//! numbers, window and payload length the state machine checks; for an ICMP/ICMPv6 error
//! the connection of the packet it quotes; and whether the packet is a fragment, first or
//! not. A non-first fragment carries no upper-layer header: its key has ports 0 and its
//! [`L4`] is [`L4::LaterFragment`] (the firewall decides what to do with it).
//!
//! Bad input is a [`CtError`], never a panic; nothing is allocated.

use crate::ethernet::{EtherType, Frame};
use crate::flow::IpPair;
use crate::{ipv4, ipv6, ipv6_ext, l2, read_u16, read_u32, IpProtocol};

/// IP protocol number of SCTP.
pub const PROTO_SCTP: u8 = 132;
const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;

/// A connection as one direction of it sees it. For TCP, UDP and SCTP `src`/`dst` are the
/// ports; for an ICMP/ICMPv6 echo both are the echo identifier (so a request and its reply
/// have reversed keys); for everything else both are 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CtKey {
    /// Source and destination addresses.
    pub ips: IpPair,
    /// The upper-layer protocol (after IPv6 extension headers).
    pub proto: u8,
    /// Source port or echo identifier.
    pub src: u16,
    /// Destination port or echo identifier.
    pub dst: u16,
}

impl CtKey {
    /// The key of the other direction: addresses and ports swapped.
    pub fn reversed(&self) -> CtKey {
        let ips = match self.ips {
            IpPair::V4 { src, dst } => IpPair::V4 { src: dst, dst: src },
            IpPair::V6 { src, dst } => IpPair::V6 { src: dst, dst: src },
        };
        CtKey {
            ips,
            proto: self.proto,
            src: self.dst,
            dst: self.src,
        }
    }

    /// Whether the addresses are IPv6.
    pub fn is_ipv6(&self) -> bool {
        matches!(self.ips, IpPair::V6 { .. })
    }
}

/// The upper layer of a packet, as far as connection tracking cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// A TCP segment.
    Tcp(TcpInfo),
    /// A UDP datagram.
    Udp,
    /// An SCTP packet (tracked like UDP: by ports, unreplied then replied).
    Sctp,
    /// An ICMP echo request or reply (types 8/0), or ICMPv6 (128/129).
    Echo {
        /// The echo identifier.
        id: u16,
        /// Request (true) or reply.
        request: bool,
    },
    /// An ICMP or ICMPv6 error, quoting the packet that caused it.
    IcmpError {
        /// ICMP type.
        ty: u8,
        /// ICMP code.
        code: u8,
        /// The key of the quoted packet, as its sender saw it.
        inner: CtKey,
    },
    /// Another ICMP or ICMPv6 message (neighbour discovery, router messages, ...).
    IcmpOther {
        /// ICMP type.
        ty: u8,
        /// ICMP code.
        code: u8,
    },
    /// Another protocol: tracked by addresses and protocol only.
    Other,
    /// A non-first fragment: the upper-layer header is in another packet.
    LaterFragment,
}

/// The TCP fields the state machine reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpInfo {
    /// The flags byte (`tcp::FLAG_*`).
    pub flags: u8,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgement number.
    pub ack: u32,
    /// Window (unscaled).
    pub window: u16,
    /// Bytes of payload after the header.
    pub payload_len: u32,
    /// The window scale option of a SYN (RFC 7323), when it has one.
    pub wscale: Option<u8>,
}

/// Whether a packet is a fragment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fragment {
    /// A whole packet (an IPv6 atomic fragment included).
    No,
    /// The first fragment: it has the upper-layer header.
    First,
    /// A later fragment: no upper-layer header.
    Later,
}

/// A frame as connection tracking sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CtPacket {
    /// The connection, in this packet's direction.
    pub key: CtKey,
    /// The upper layer.
    pub l4: L4,
    /// Fragment or not.
    pub fragment: Fragment,
    /// The 802.1Q VID, when tagged.
    pub vlan: Option<u16>,
}

/// Why a frame has no connection key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtError {
    /// Not IPv4 or IPv6 (ARP, LLDP, ...): not for connection tracking.
    NotIp,
    /// Shorter than its headers say.
    Truncated,
    /// A header that makes no sense (a TCP data offset below 5, an ICMP error quoting an
    /// ICMP error, ...).
    Malformed,
}

impl core::fmt::Display for CtError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            CtError::NotIp => "not an IP packet",
            CtError::Truncated => "truncated packet",
            CtError::Malformed => "malformed packet",
        })
    }
}

impl std::error::Error for CtError {}

impl From<crate::Error> for CtError {
    fn from(e: crate::Error) -> CtError {
        match e {
            crate::Error::Truncated => CtError::Truncated,
            crate::Error::Malformed => CtError::Malformed,
        }
    }
}

/// Whether an ICMP (v4) type is an error that quotes a packet.
fn icmp4_error(ty: u8) -> bool {
    matches!(ty, 3 | 4 | 5 | 11 | 12)
}

/// Whether an ICMPv6 type is an error that quotes a packet.
fn icmp6_error(ty: u8) -> bool {
    matches!(ty, 1..=4)
}

/// Parses a frame. Never panics.
///
/// The common case, an untagged IPv4 packet without options and not a fragment carrying
/// UDP or TCP, takes a short path ([`parse_v4_fast`]: fixed offsets, one bounds check for
/// the headers); every other frame, and any such frame the short path has a doubt about,
/// goes through [`parse_general`]. Both give the same answer (tested, and checked by the
/// `ct` fuzz target).
#[inline]
pub fn parse(frame: &[u8]) -> Result<CtPacket, CtError> {
    match parse_v4_fast(frame) {
        Some(p) => Ok(p),
        None => parse_general(frame),
    }
}

/// [`parse`] of an untagged IPv4 packet with a 20-byte header, not a fragment, carrying a
/// whole UDP or TCP header; `None` for anything else (which [`parse_general`] then reads).
#[inline]
pub fn parse_v4_fast(frame: &[u8]) -> Option<CtPacket> {
    // Ethernet (14) + IPv4 (20) + the first 8 bytes of UDP or TCP.
    let h: &[u8; 42] = frame.get(..42)?.try_into().ok()?;
    if h[12] != 0x08 || h[13] != 0x00 || h[14] != 0x45 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([h[16], h[17]]));
    // Not a fragment (no offset, no more-fragments flag), and the whole packet there.
    if u16::from_be_bytes([h[20], h[21]]) & 0x3fff != 0 || frame.len() - 14 < total {
        return None;
    }
    let ips = IpPair::V4 {
        src: [h[26], h[27], h[28], h[29]],
        dst: [h[30], h[31], h[32], h[33]],
    };
    let key = |proto| CtKey {
        ips,
        proto,
        src: u16::from_be_bytes([h[34], h[35]]),
        dst: u16::from_be_bytes([h[36], h[37]]),
    };
    let l4 = match h[23] {
        PROTO_UDP if total >= 28 => (key(PROTO_UDP), L4::Udp),
        PROTO_TCP if total >= 40 => {
            let t: &[u8; 20] = frame.get(34..54)?.try_into().ok()?;
            let header_len = usize::from(t[12] >> 4) * 4;
            if header_len < 20 || total - 20 < header_len {
                return None;
            }
            let flags = t[13];
            let wscale = if flags & 0x02 != 0 {
                window_scale(frame.get(54..34 + header_len)?)
            } else {
                None
            };
            let info = TcpInfo {
                flags,
                seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
                ack: u32::from_be_bytes([t[8], t[9], t[10], t[11]]),
                window: u16::from_be_bytes([t[14], t[15]]),
                // Below 64 KiB: `total` is a u16.
                payload_len: (total - 20 - header_len) as u32,
                wscale,
            };
            (key(PROTO_TCP), L4::Tcp(info))
        }
        _ => return None,
    };
    Some(CtPacket {
        key: l4.0,
        l4: l4.1,
        fragment: Fragment::No,
        vlan: None,
    })
}

/// [`parse`] of any frame, without the short path (the `ct` fuzz target compares the two).
/// Not inlined: its callers stay small for the short path.
#[inline(never)]
pub fn parse_general(frame: &[u8]) -> Result<CtPacket, CtError> {
    let eth = Frame::new_checked(frame).map_err(|_| CtError::Truncated)?;
    let (vlan, ethertype, l3_offset) = l2::untag(&eth).ok_or(CtError::Truncated)?;
    let l3 = frame.get(l3_offset..).ok_or(CtError::Truncated)?;
    let (ips, proto, l4, fragment) = match ethertype {
        EtherType::Ipv4 => {
            let ip = ipv4::Packet::new_checked(l3)?;
            let fragment = match (ip.frag_offset(), ip.more_frags()) {
                (0, false) => Fragment::No,
                (0, true) => Fragment::First,
                _ => Fragment::Later,
            };
            let ips = IpPair::V4 {
                src: ip.src_addr().octets(),
                dst: ip.dst_addr().octets(),
            };
            (ips, u8::from(ip.protocol()), ip.payload(), fragment)
        }
        EtherType::Ipv6 => {
            let ip = ipv6::Packet::new_checked(l3)?;
            let walk = ipv6_ext::walk(&ip)?;
            let fragment = if walk.later_fragment() {
                Fragment::Later
            } else if walk.is_fragment() {
                Fragment::First
            } else {
                Fragment::No
            };
            let ips = IpPair::V6 {
                src: ip.src_addr().octets(),
                dst: ip.dst_addr().octets(),
            };
            let l4 = ip
                .payload()
                .get(walk.offset - ipv6::HEADER_LEN..)
                .ok_or(CtError::Truncated)?;
            (ips, u8::from(walk.protocol), l4, fragment)
        }
        _ => return Err(CtError::NotIp),
    };
    let mut key = CtKey {
        ips,
        proto,
        src: 0,
        dst: 0,
    };
    if fragment == Fragment::Later {
        return Ok(CtPacket {
            key,
            l4: L4::LaterFragment,
            fragment,
            vlan,
        });
    }
    let l4 = match proto {
        PROTO_TCP => {
            let h = l4.get(..20).ok_or(CtError::Truncated)?;
            let header_len = usize::from(h[12] >> 4) * 4;
            if header_len < 20 {
                return Err(CtError::Malformed);
            }
            if l4.len() < header_len {
                return Err(CtError::Truncated);
            }
            (key.src, key.dst) = (read_u16(h, 0..2), read_u16(h, 2..4));
            L4::Tcp(TcpInfo {
                flags: h[13],
                seq: read_u32(h, 4..8),
                ack: read_u32(h, 8..12),
                window: read_u16(h, 14..16),
                // An IP payload is below 64 KiB (no jumbograms here).
                payload_len: u32::try_from(l4.len() - header_len).unwrap_or(u32::MAX),
                wscale: if h[13] & 0x02 != 0 {
                    window_scale(&l4[20..header_len])
                } else {
                    None
                },
            })
        }
        PROTO_UDP | PROTO_SCTP => {
            let need = if proto == PROTO_UDP { 8 } else { 12 };
            let h = l4.get(..need).ok_or(CtError::Truncated)?;
            (key.src, key.dst) = (read_u16(h, 0..2), read_u16(h, 2..4));
            if proto == PROTO_UDP {
                L4::Udp
            } else {
                L4::Sctp
            }
        }
        PROTO_ICMP | PROTO_ICMPV6 => {
            let v6 = proto == PROTO_ICMPV6;
            if v6 != key.is_ipv6() {
                // ICMP over IPv6 or ICMPv6 over IPv4: tracked as any other protocol.
                L4::Other
            } else {
                icmp(l4, v6, &mut key)?
            }
        }
        _ => L4::Other,
    };
    Ok(CtPacket {
        key,
        l4,
        fragment,
        vlan,
    })
}

/// The window scale option among TCP options, capped at 14 as RFC 7323 says.
fn window_scale(mut options: &[u8]) -> Option<u8> {
    while let Some(&kind) = options.first() {
        match kind {
            0 => return None,
            1 => options = &options[1..],
            _ => {
                let len = usize::from(*options.get(1)?);
                if len < 2 || len > options.len() {
                    return None;
                }
                if kind == 3 && len == 3 {
                    return Some(options[2].min(14));
                }
                options = &options[len..];
            }
        }
    }
    None
}

/// The ICMP/ICMPv6 message at the start of `l4`; sets the key's identifier for an echo.
fn icmp(l4: &[u8], v6: bool, key: &mut CtKey) -> Result<L4, CtError> {
    let h = l4.get(..4).ok_or(CtError::Truncated)?;
    let (ty, code) = (h[0], h[1]);
    let (request, reply) = if v6 { (128, 129) } else { (8, 0) };
    if ty == request || ty == reply {
        let id = read_u16(l4.get(..8).ok_or(CtError::Truncated)?, 4..6);
        (key.src, key.dst) = (id, id);
        return Ok(L4::Echo {
            id,
            request: ty == request,
        });
    }
    let error = if v6 { icmp6_error(ty) } else { icmp4_error(ty) };
    if !error {
        return Ok(L4::IcmpOther { ty, code });
    }
    let quoted = l4.get(8..).ok_or(CtError::Truncated)?;
    let inner = if v6 {
        quoted_v6(quoted)?
    } else {
        quoted_v4(quoted)?
    };
    Ok(L4::IcmpError { ty, code, inner })
}

/// The key of the IPv4 packet an ICMP error quotes: its header and at least 8 bytes of its
/// upper layer (RFC 792); the quoted lengths are not checked, the quote is usually cut.
fn quoted_v4(q: &[u8]) -> Result<CtKey, CtError> {
    let h = q.get(..ipv4::HEADER_LEN).ok_or(CtError::Truncated)?;
    let header_len = usize::from(h[0] & 0x0f) * 4;
    if h[0] >> 4 != 4 || header_len < ipv4::HEADER_LEN {
        return Err(CtError::Malformed);
    }
    if read_u16(h, 6..8) & 0x1fff != 0 {
        // A later fragment quoted: no ports to find the connection by.
        return Err(CtError::Malformed);
    }
    let ips = IpPair::V4 {
        src: [h[12], h[13], h[14], h[15]],
        dst: [h[16], h[17], h[18], h[19]],
    };
    quoted_l4(
        ips,
        h[9],
        q.get(header_len..).ok_or(CtError::Truncated)?,
        false,
    )
}

/// The key of the IPv6 packet an ICMPv6 error quotes, past its extension headers.
fn quoted_v6(q: &[u8]) -> Result<CtKey, CtError> {
    let h = q.get(..ipv6::HEADER_LEN).ok_or(CtError::Truncated)?;
    if h[0] >> 4 != 6 {
        return Err(CtError::Malformed);
    }
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&h[8..24]);
    dst.copy_from_slice(&h[24..40]);
    let mut proto = IpProtocol::from(h[6]);
    let mut offset = ipv6::HEADER_LEN;
    for _ in 0..=ipv6::MAX_EXT_HEADERS {
        let len = match proto {
            IpProtocol::HopByHop | IpProtocol::Ipv6Route | IpProtocol::Ipv6Opts => {
                (usize::from(*q.get(offset + 1).ok_or(CtError::Truncated)?) + 1) * 8
            }
            IpProtocol::Ipv6Frag => {
                let f = q.get(offset..offset + 8).ok_or(CtError::Truncated)?;
                if read_u16(f, 2..4) & 0xfff8 != 0 {
                    return Err(CtError::Malformed);
                }
                8
            }
            _ => {
                let l4 = q.get(offset..).ok_or(CtError::Truncated)?;
                return quoted_l4(IpPair::V6 { src, dst }, proto.into(), l4, true);
            }
        };
        proto = IpProtocol::from(*q.get(offset).ok_or(CtError::Truncated)?);
        offset += len;
    }
    Err(CtError::Malformed)
}

/// The ports or echo identifier of a quoted upper layer (its first 8 bytes).
fn quoted_l4(ips: IpPair, proto: u8, l4: &[u8], v6: bool) -> Result<CtKey, CtError> {
    let mut key = CtKey {
        ips,
        proto,
        src: 0,
        dst: 0,
    };
    match proto {
        PROTO_TCP | PROTO_UDP | PROTO_SCTP => {
            let h = l4.get(..4).ok_or(CtError::Truncated)?;
            (key.src, key.dst) = (read_u16(h, 0..2), read_u16(h, 2..4));
        }
        PROTO_ICMP | PROTO_ICMPV6 if (proto == PROTO_ICMPV6) == v6 => {
            // Only an echo can cause an error worth tracking; an error about an error is
            // never sent (RFC 1122 3.2.2, RFC 4443 2.4).
            let h = l4.get(..8).ok_or(CtError::Truncated)?;
            let echo = if v6 { [128, 129] } else { [8, 0] };
            if !echo.contains(&h[0]) {
                return Err(CtError::Malformed);
            }
            let id = read_u16(h, 4..6);
            (key.src, key.dst) = (id, id);
        }
        _ => {}
    }
    Ok(key)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tcp::{FLAG_ACK, FLAG_SYN};
    use crate::testdata::{frag6_first, ARP_REQUEST, FRAG6_LAST, TCP_SYN, UDP6, VLAN_UDP4};
    use proptest::prelude::*;

    /// An Ethernet + IPv4 frame around `l4` (checksums left zero: nothing here checks them).
    pub fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let total = u16::try_from(20 + l4.len()).unwrap();
        f.extend_from_slice(&[0x45, 0, 0, 0, 0, 1, 0, 0, 64, proto, 0, 0]);
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(l4);
        f
    }

    /// An Ethernet + IPv6 frame around `l4`.
    pub fn v6(src: [u8; 16], dst: [u8; 16], proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let len = u16::try_from(l4.len()).unwrap();
        f.extend_from_slice(&[0x60, 0, 0, 0]);
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&[proto, 64]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(l4);
        f
    }

    /// A TCP header (20 bytes) and `payload` bytes of zeros.
    pub fn tcp(src: u16, dst: u16, flags: u8, seq: u32, ack: u32, payload: usize) -> Vec<u8> {
        let mut h = vec![0u8; 20 + payload];
        h[0..2].copy_from_slice(&src.to_be_bytes());
        h[2..4].copy_from_slice(&dst.to_be_bytes());
        h[4..8].copy_from_slice(&seq.to_be_bytes());
        h[8..12].copy_from_slice(&ack.to_be_bytes());
        h[12] = 5 << 4;
        h[13] = flags;
        h[14..16].copy_from_slice(&65535u16.to_be_bytes());
        h
    }

    /// A UDP header and 4 bytes of payload.
    pub fn udp(src: u16, dst: u16) -> Vec<u8> {
        let mut h = vec![0u8; 12];
        h[0..2].copy_from_slice(&src.to_be_bytes());
        h[2..4].copy_from_slice(&dst.to_be_bytes());
        h[4..6].copy_from_slice(&12u16.to_be_bytes());
        h
    }

    /// An ICMP message: type, code, checksum, then `rest`.
    pub fn icmp_msg(ty: u8, code: u8, rest: &[u8]) -> Vec<u8> {
        let mut h = vec![ty, code, 0, 0];
        h.extend_from_slice(rest);
        h
    }

    const A: [u8; 4] = [10, 0, 0, 1];
    const B: [u8; 4] = [10, 0, 0, 2];

    fn a6() -> [u8; 16] {
        "fd00::1".parse::<core::net::Ipv6Addr>().unwrap().octets()
    }
    fn b6() -> [u8; 16] {
        "fd00::2".parse::<core::net::Ipv6Addr>().unwrap().octets()
    }

    #[test]
    fn tcp_key_flags_and_payload() {
        let f = v4(A, B, 6, &tcp(1234, 80, FLAG_SYN | FLAG_ACK, 7, 9, 5));
        let p = parse(&f).unwrap();
        assert_eq!(
            p.key,
            CtKey {
                ips: IpPair::V4 { src: A, dst: B },
                proto: 6,
                src: 1234,
                dst: 80
            }
        );
        assert_eq!(
            p.l4,
            L4::Tcp(TcpInfo {
                flags: FLAG_SYN | FLAG_ACK,
                seq: 7,
                ack: 9,
                window: 65535,
                payload_len: 5,
                wscale: None,
            })
        );
        assert_eq!((p.fragment, p.vlan), (Fragment::No, None));
        assert_eq!(p.key.reversed().reversed(), p.key);
        assert_eq!(p.key.reversed().src, 80);
        // The captured SYN of the test data.
        let syn = parse(&TCP_SYN).unwrap();
        assert!(matches!(syn.l4, L4::Tcp(t) if t.flags == FLAG_SYN));
        // A SYN with MSS, NOP and window scale 7.
        let mut h = tcp(1, 2, FLAG_SYN, 0, 0, 0);
        h[12] = 7 << 4;
        h.extend_from_slice(&[2, 4, 5, 0xb4, 1, 3, 3, 7]);
        let p = parse(&v4(A, B, 6, &h)).unwrap();
        assert!(matches!(p.l4, L4::Tcp(t) if t.wscale == Some(7) && t.payload_len == 0));
    }

    #[test]
    fn udp_tagged_and_v6() {
        let p = parse(&VLAN_UDP4).unwrap();
        assert_eq!((p.l4, p.vlan.is_some()), (L4::Udp, true));
        let p = parse(&UDP6).unwrap();
        assert!(p.key.is_ipv6() && p.l4 == L4::Udp && p.key.src != 0);
        let f = v6(a6(), b6(), 17, &udp(5000, 53));
        let p = parse(&f).unwrap();
        assert_eq!((p.key.src, p.key.dst, p.key.proto), (5000, 53, 17));
    }

    #[test]
    fn echo_by_identifier() {
        let req = parse(&v4(A, B, 1, &icmp_msg(8, 0, &[0x12, 0x34, 0, 1]))).unwrap();
        assert_eq!(
            req.l4,
            L4::Echo {
                id: 0x1234,
                request: true
            }
        );
        let rep = parse(&v4(B, A, 1, &icmp_msg(0, 0, &[0x12, 0x34, 0, 1]))).unwrap();
        assert_eq!(rep.key, req.key.reversed());
        let req6 = parse(&v6(a6(), b6(), 58, &icmp_msg(128, 0, &[0, 7, 0, 1]))).unwrap();
        assert_eq!(
            req6.l4,
            L4::Echo {
                id: 7,
                request: true
            }
        );
        let ns = parse(&v6(a6(), b6(), 58, &icmp_msg(135, 0, &[0; 20]))).unwrap();
        assert_eq!(ns.l4, L4::IcmpOther { ty: 135, code: 0 });
    }

    #[test]
    fn icmp_errors_quote_the_connection() {
        // B's port-unreachable about A's UDP datagram to B:53.
        let quoted = v4(A, B, 17, &udp(5000, 53));
        let err = parse(&v4(
            B,
            A,
            1,
            &icmp_msg(3, 3, &[&[0; 4], &quoted[14..]].concat()),
        ))
        .unwrap();
        let L4::IcmpError { ty, code, inner } = err.l4 else {
            panic!("{err:?}")
        };
        assert_eq!((ty, code), (3, 3));
        assert_eq!(inner, parse(&quoted).unwrap().key);
        // Cut to the 8 bytes RFC 792 promises.
        let cut = &quoted[14..14 + 28];
        let err = parse(&v4(B, A, 1, &icmp_msg(11, 0, &[&[0; 4], cut].concat()))).unwrap();
        assert!(matches!(err.l4, L4::IcmpError { inner: i, .. } if i == inner));
        // IPv6: packet too big about a TCP segment.
        let quoted = v6(a6(), b6(), 6, &tcp(40000, 443, FLAG_ACK, 1, 1, 0));
        let err = parse(&v6(
            b6(),
            a6(),
            58,
            &icmp_msg(2, 0, &[&[0, 0, 5, 0], &quoted[14..]].concat()),
        ))
        .unwrap();
        assert!(
            matches!(err.l4, L4::IcmpError { ty: 2, inner: i, .. } if i == parse(&quoted).unwrap().key)
        );
        // An error quoting an error is malformed; so is a quote too short for ports.
        let inner_err = v4(A, B, 1, &icmp_msg(3, 1, &[0; 4]));
        let e = parse(&v4(
            B,
            A,
            1,
            &icmp_msg(3, 3, &[&[0; 4], &inner_err[14..]].concat()),
        ));
        assert_eq!(e, Err(CtError::Malformed));
        let e = parse(&v4(
            B,
            A,
            1,
            &icmp_msg(3, 3, &[&[0; 4], &quoted_v4_header()[..22]].concat()),
        ));
        assert_eq!(e, Err(CtError::Truncated));
    }

    fn quoted_v4_header() -> Vec<u8> {
        v4(A, B, 17, &udp(1, 2))[14..].to_vec()
    }

    #[test]
    fn fragments() {
        let mut first = v4(A, B, 17, &udp(5000, 53));
        first[20] = 0x20; // MF
        let p = parse(&first).unwrap();
        assert_eq!(
            (p.fragment, p.l4, p.key.dst),
            (Fragment::First, L4::Udp, 53)
        );
        let mut later = v4(A, B, 17, &[0u8; 16]);
        later[21] = 0x10; // offset 128 bytes
        let p = parse(&later).unwrap();
        assert_eq!((p.fragment, p.l4), (Fragment::Later, L4::LaterFragment));
        assert_eq!((p.key.src, p.key.dst), (0, 0));
        assert_eq!(parse(&frag6_first()).unwrap().fragment, Fragment::First);
        let p = parse(&FRAG6_LAST).unwrap();
        assert_eq!((p.fragment, p.l4), (Fragment::Later, L4::LaterFragment));
    }

    #[test]
    fn errors() {
        assert_eq!(parse(&ARP_REQUEST), Err(CtError::NotIp));
        assert_eq!(parse(&[0u8; 10]), Err(CtError::Truncated));
        let mut bad = v4(A, B, 6, &tcp(1, 2, FLAG_SYN, 0, 0, 0));
        bad[14 + 20 + 12] = 4 << 4; // data offset 16 bytes
        assert_eq!(parse(&bad), Err(CtError::Malformed));
        let short = v4(A, B, 6, &[0u8; 10]);
        assert_eq!(parse(&short), Err(CtError::Truncated));
        let short = v4(A, B, 17, &[0u8; 6]);
        assert_eq!(parse(&short), Err(CtError::Truncated));
    }

    proptest! {
        #[test]
        fn never_panics(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse(&data);
        }

        #[test]
        fn the_short_path_agrees(tcp in any::<bool>(), i in 0usize..70, b in any::<u8>(), cut in 14usize..80) {
            let mut seg = [0u8; 24];
            seg[..4].copy_from_slice(&[0x13, 0x88, 0, 80]);
            seg[12] = 0x60; // 24 bytes: one option word
            seg[13] = FLAG_SYN;
            seg[20..24].copy_from_slice(&[3, 3, 7, 0]);
            let mut f = if tcp { v4(A, B, 6, &seg) } else { v4(A, B, 17, &udp(5000, 53)) };
            f.resize(70, 0);
            let whole = f.clone();
            prop_assert_eq!(parse(&whole), parse_general(&whole));
            f[i] = b;
            prop_assert_eq!(parse(&f), parse_general(&f));
            let cut = &f[..cut.min(f.len())];
            prop_assert_eq!(parse(cut), parse_general(cut));
        }

        #[test]
        fn never_panics_on_mutated_frames(i in 14usize..60, b in any::<u8>(), cut in 14usize..74) {
            let quoted = v4(A, B, 17, &udp(5000, 53));
            let mut f = v4(B, A, 1, &icmp_msg(3, 3, &[&[0; 4], &quoted[14..]].concat()));
            f[i] = b;
            let _ = parse(&f);
            let _ = parse(&f[..cut.min(f.len())]);
        }
    }
}
