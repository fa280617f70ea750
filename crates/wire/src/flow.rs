//! Flow keys, for receive-side scaling and QoS classification.
//!
//! [`extract`] reads the IP addresses, the upper-layer protocol and, for TCP and UDP, the ports
//! of an Ethernet frame, untagged or with one 802.1Q tag. IPv6 extension headers are skipped as
//! [`ipv6::Packet::upper_layer`] does. The key is the same for every frame of a connection
//! direction and is cheap to hash; it is not normalised, so the two directions differ.
//!
//! Limitations: fragments are not reassembled, so the fragments of one datagram do not share a
//! key (the first has ports, the others do not); tunnels are not looked into; AH and ESP end
//! the IPv6 walk and report no ports.

use crate::ethernet::{EtherType, Frame};
use crate::{ipv4, ipv6, l2, tcp, udp, IpProtocol};

/// The source and destination addresses of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpPair {
    /// IPv4 addresses.
    V4 {
        /// Source.
        src: [u8; 4],
        /// Destination.
        dst: [u8; 4],
    },
    /// IPv6 addresses.
    V6 {
        /// Source.
        src: [u8; 16],
        /// Destination.
        dst: [u8; 16],
    },
}

/// What identifies the flow a frame belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// The addresses.
    pub ips: IpPair,
    /// The upper-layer protocol, after any IPv6 extension headers.
    pub proto: u8,
    /// Source and destination ports, for TCP and UDP when the L4 header is present and the
    /// packet is not a non-first fragment.
    pub ports: Option<(u16, u16)>,
}

/// Extracts the flow key of an Ethernet frame (handles one 802.1Q tag). `None` for non-IP
/// frames and truncated or malformed IP headers. Never panics.
#[inline]
pub fn extract(frame: &[u8]) -> Option<FlowKey> {
    let l3 = parse_l3(frame)?;
    let ports = match l3.proto {
        _ if l3.later_fragment => None,
        IpProtocol::Tcp if l3.l4.len() >= tcp::HEADER_LEN => {
            let tcp = tcp::Packet::new_unchecked(l3.l4);
            Some((tcp.src_port(), tcp.dst_port()))
        }
        IpProtocol::Udp if l3.l4.len() >= udp::HEADER_LEN => {
            let udp = udp::Packet::new_unchecked(l3.l4);
            Some((udp.src_port(), udp.dst_port()))
        }
        _ => None,
    };
    Some(FlowKey {
        ips: l3.ips,
        proto: l3.proto.into(),
        ports,
    })
}

/// The IP layer of a frame, as far as flows and segmentation care.
pub(crate) struct L3<'a> {
    pub ips: IpPair,
    /// The upper-layer protocol.
    pub proto: IpProtocol,
    /// Offset of the upper-layer header in the frame.
    pub l4_offset: usize,
    /// The upper-layer header and payload, up to the end given by the IP length fields.
    pub l4: &'a [u8],
    /// Set for a non-first fragment, which holds no upper-layer header.
    pub later_fragment: bool,
}

/// Finds the IP layer of an Ethernet frame, untagged or with one 802.1Q tag.
#[inline]
pub(crate) fn parse_l3(frame: &[u8]) -> Option<L3<'_>> {
    let eth = Frame::new_checked(frame).ok()?;
    let (_, ethertype, l3_offset) = l2::untag(&eth)?;
    let l3 = frame.get(l3_offset..)?;
    match ethertype {
        EtherType::Ipv4 => {
            let ip = ipv4::Packet::new_checked(l3).ok()?;
            Some(L3 {
                ips: IpPair::V4 {
                    src: ip.src_addr().octets(),
                    dst: ip.dst_addr().octets(),
                },
                proto: ip.protocol(),
                l4_offset: l3_offset + usize::from(ip.header_len()),
                l4: ip.payload(),
                later_fragment: ip.frag_offset() != 0,
            })
        }
        EtherType::Ipv6 => {
            let ip = ipv6::Packet::new_checked(l3).ok()?;
            let upper = ip.upper_layer().ok()?;
            Some(L3 {
                ips: IpPair::V6 {
                    src: ip.src_addr().octets(),
                    dst: ip.dst_addr().octets(),
                },
                proto: upper.protocol,
                l4_offset: l3_offset + upper.offset,
                l4: ip.payload().get(upper.offset - ipv6::HEADER_LEN..)?,
                later_fragment: upper.later_fragment,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{
        frag6_first, ARP_REQUEST, FRAG6_LAST, MLD_REPORT, TCP_SYN, UDP4, UDP6, VLAN_UDP4,
    };
    use proptest::prelude::*;

    const V4: IpPair = IpPair::V4 {
        src: [10, 0, 0, 1],
        dst: [10, 0, 0, 2],
    };

    fn v6(src: &str, dst: &str) -> IpPair {
        IpPair::V6 {
            src: src.parse::<core::net::Ipv6Addr>().unwrap().octets(),
            dst: dst.parse::<core::net::Ipv6Addr>().unwrap().octets(),
        }
    }

    #[test]
    fn ipv4_tcp_and_udp() {
        assert_eq!(
            extract(&TCP_SYN),
            Some(FlowKey {
                ips: V4,
                proto: 6,
                ports: Some((36664, 80))
            })
        );
        assert_eq!(
            extract(&UDP4),
            Some(FlowKey {
                ips: V4,
                proto: 17,
                ports: Some((40000, 4789))
            })
        );
    }

    #[test]
    fn tagged_frame_has_the_key_of_the_untagged_one() {
        assert_eq!(extract(&VLAN_UDP4), extract(&UDP4));
        let l3 = parse_l3(&VLAN_UDP4).unwrap();
        assert_eq!(l3.l4_offset, 38);
        assert_eq!(l3.l4, &VLAN_UDP4[38..]);
    }

    #[test]
    fn ipv6_udp() {
        let key = extract(&UDP6).unwrap();
        assert_eq!(key.ips, v6("fd00::1", "fd00::2"));
        assert_eq!((key.proto, key.ports), (17, Some((40001, 53))));
    }

    #[test]
    fn ipv6_past_hop_by_hop() {
        let key = extract(&MLD_REPORT).unwrap();
        assert_eq!(key.ips, v6("fe80::5054:ff:fe12:3401", "ff02::16"));
        assert_eq!((key.proto, key.ports), (58, None));
        assert_eq!(parse_l3(&MLD_REPORT).unwrap().l4_offset, 14 + 48);
    }

    #[test]
    fn ipv6_fragments() {
        let first = extract(&frag6_first()).unwrap();
        assert_eq!((first.proto, first.ports), (17, Some((40002, 9))));
        let last = extract(&FRAG6_LAST).unwrap();
        assert_eq!((last.proto, last.ports), (17, None));
        assert_eq!(first.ips, last.ips);
    }

    #[test]
    fn ipv4_later_fragment_has_no_ports() {
        let mut frame = UDP4;
        // Fragment offset 1480 (185 units of 8); the IP checksum does not matter here.
        frame[20..22].copy_from_slice(&185u16.to_be_bytes());
        assert_eq!(
            extract(&frame),
            Some(FlowKey {
                ips: V4,
                proto: 17,
                ports: None
            })
        );
    }

    #[test]
    fn short_l4_header_has_no_ports() {
        // An IPv4 packet whose total length leaves 19 bytes of TCP header.
        let mut frame = TCP_SYN;
        frame[16..18].copy_from_slice(&39u16.to_be_bytes());
        assert_eq!(extract(&frame).unwrap().ports, None);
    }

    #[test]
    fn not_ip_or_truncated() {
        assert_eq!(extract(&ARP_REQUEST), None);
        assert_eq!(extract(&TCP_SYN[..33]), None);
        assert_eq!(extract(&TCP_SYN[..73]), None);
        assert_eq!(extract(&UDP6[..74]), None);
        assert_eq!(extract(&VLAN_UDP4[..17]), None);
        assert_eq!(extract(&[]), None);
    }

    /// Real frames, each with some bytes overwritten and cut at some length.
    fn mangled() -> impl Strategy<Value = Vec<u8>> {
        let frames: Vec<&'static [u8]> =
            vec![&TCP_SYN, &UDP4, &VLAN_UDP4, &UDP6, &MLD_REPORT, &FRAG6_LAST];
        (
            prop::sample::select(frames),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            any::<prop::sample::Index>(),
        )
            .prop_map(|(frame, edits, cut)| {
                let mut frame = frame.to_vec();
                for (at, byte) in edits {
                    let at = at.index(frame.len());
                    frame[at] = byte;
                }
                frame.truncate(cut.index(frame.len() + 1));
                frame
            })
    }

    proptest! {
        #[test]
        fn never_panics(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = extract(&frame);
        }

        #[test]
        fn mangled_real_frames_never_panic(frame in mangled()) {
            if let Some(l3) = parse_l3(&frame) {
                prop_assert!(l3.l4_offset + l3.l4.len() <= frame.len());
            }
            let _ = extract(&frame);
        }
    }
}
