//! The facts port security decides on, read from a frame in one pass.
//!
//! [`inspect`] reads, from an Ethernet frame with at most one 802.1Q tag:
//!
//! * the source MAC address (MAC spoofing guard, per-port MAC lists);
//! * for ARP, the sender hardware and protocol addresses and the target protocol address
//!   (ARP spoofing);
//! * for IPv4 and IPv6, the source address (IP anti-spoofing), after which IPv6 extension
//!   headers are walked (at most [`ipv6::MAX_EXT_HEADERS`]) to the upper layer;
//! * what kind of upper-layer message it is, where a guard cares ([`Kind`]): a DHCPv4 or
//!   DHCPv6 server message (DHCP guard), an ICMPv6 router advertisement or redirect (RA guard,
//!   RFC 6105), a neighbour solicitation or advertisement with its target address and
//!   link-layer address option (ND spoofing).
//!
//! A guard should fail closed: [`Facts::incomplete`] says the frame is IP (or ARP) but what it
//! carries could not be read (a non-first fragment, a truncated or malformed header or header
//! chain), which is how RA guard evasion hides a router advertisement (RFC 7113). Neighbour
//! discovery messages must not be fragmented at all (RFC 6980); [`Facts::fragment`] tells.
//!
//! Checksums are not verified: a frame with a wrong checksum is dropped by its receiver, so
//! classifying it by its content is the conservative choice.
//!
//! Limitations: only one 802.1Q tag is walked (an 802.1ad S-tag or a second tag leaves the
//! frame [`Kind::Other`] with no L3 facts); DHCP is recognised by its UDP ports and first
//! byte, not parsed further; ICMPv6 inside IPv6-in-IPv6 or other tunnels is not looked into.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::ethernet::{EtherType, Frame};
use crate::{arp, ipv4, ipv6, ipv6_ext, l2, read_array, udp, IpProtocol, MacAddr};

/// The DHCPv4/BOOTP server port.
pub const DHCPV4_SERVER_PORT: u16 = 67;
/// The DHCPv4/BOOTP client port.
pub const DHCPV4_CLIENT_PORT: u16 = 68;
/// The DHCPv6 server and relay agent port.
pub const DHCPV6_SERVER_PORT: u16 = 547;
/// The DHCPv6 client port.
pub const DHCPV6_CLIENT_PORT: u16 = 546;

/// BOOTP op BOOTREPLY (RFC 951): sent by servers and relay agents.
const BOOTREPLY: u8 = 2;
/// DHCPv6 message types only servers and relay agents send towards clients (RFC 8415):
/// ADVERTISE, REPLY, RECONFIGURE, RELAY-REPL.
const DHCPV6_SERVER_MESSAGES: [u8; 4] = [2, 7, 10, 13];

const ICMPV6_ROUTER_ADVERTISEMENT: u8 = 134;
const ICMPV6_NEIGHBOR_SOLICITATION: u8 = 135;
const ICMPV6_NEIGHBOR_ADVERTISEMENT: u8 = 136;
const ICMPV6_REDIRECT: u8 = 137;
/// Type, code, checksum, reserved/flags, target address.
const ND_HEADER_LEN: usize = 24;
const ND_OPT_SOURCE_LL: u8 = 1;
const ND_OPT_TARGET_LL: u8 = 2;

/// The ARP fields anti-spoofing checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpFacts {
    /// The operation.
    pub operation: arp::Operation,
    /// The sender hardware address.
    pub sender_mac: MacAddr,
    /// The sender protocol address.
    pub sender_ip: Ipv4Addr,
    /// The target protocol address.
    pub target_ip: Ipv4Addr,
}

/// A neighbour solicitation or advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborDiscovery {
    /// The target address.
    pub target: Ipv6Addr,
    /// The link-layer address option that binds an address to a MAC: the source link-layer
    /// address of a solicitation, the target link-layer address of an advertisement.
    pub link_layer: Option<MacAddr>,
}

/// What kind of message a frame carries, as far as port security cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Anything else, or nothing readable.
    Other,
    /// A DHCPv4/BOOTP server message: UDP from port 67 to port 68, or a BOOTREPLY (op 2)
    /// between ports 67 and 68 in either direction (a relay agent's too).
    DhcpV4Server,
    /// A DHCPv6 server message: UDP from port 547 to port 546, or an ADVERTISE, REPLY,
    /// RECONFIGURE or RELAY-REPL message between ports 546 and 547.
    DhcpV6Server,
    /// An ICMPv6 router advertisement (type 134).
    RouterAdvertisement,
    /// An ICMPv6 redirect (type 137).
    Redirect,
    /// An ICMPv6 neighbour solicitation (type 135).
    NeighborSolicitation(NeighborDiscovery),
    /// An ICMPv6 neighbour advertisement (type 136).
    NeighborAdvertisement(NeighborDiscovery),
}

/// What [`inspect`] found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// The source MAC address; `None` if the frame is shorter than an Ethernet header.
    pub src_mac: Option<MacAddr>,
    /// The VID of the 802.1Q tag, if there is one.
    pub vlan: Option<u16>,
    /// The EtherType after any tag; `None` for a runt or a truncated tag.
    pub ethertype: Option<EtherType>,
    /// The ARP fields, for a whole Ethernet/IPv4 ARP packet.
    pub arp: Option<ArpFacts>,
    /// The IPv4 or IPv6 source address, if the IP header is whole.
    pub ip_src: Option<IpAddr>,
    /// The kind of message.
    pub kind: Kind,
    /// Whether the packet is an IP fragment (first or later; an IPv6 atomic fragment is not).
    pub fragment: bool,
    /// Whether the frame is ARP or IP but its content could not be read in full: a truncated
    /// or malformed header, header chain, UDP or ICMPv6 message or ND option, or a non-first
    /// fragment. A guard should treat such a frame as possibly forbidden.
    pub incomplete: bool,
}

impl Facts {
    const EMPTY: Facts = Facts {
        src_mac: None,
        vlan: None,
        ethertype: None,
        arp: None,
        ip_src: None,
        kind: Kind::Other,
        fragment: false,
        incomplete: false,
    };

    /// Whether the frame is a DHCPv4 or DHCPv6 server message (what a DHCP guard drops).
    pub fn is_dhcp_server(&self) -> bool {
        matches!(self.kind, Kind::DhcpV4Server | Kind::DhcpV6Server)
    }

    /// Whether the frame is a router advertisement or a redirect (what an RA guard drops).
    pub fn is_router_message(&self) -> bool {
        matches!(self.kind, Kind::RouterAdvertisement | Kind::Redirect)
    }
}

/// Reads the facts of an Ethernet frame (without FCS). Never panics, whatever the bytes.
pub fn inspect(frame: &[u8]) -> Facts {
    let mut facts = Facts::EMPTY;
    let Ok(eth) = Frame::new_checked(frame) else {
        return facts;
    };
    facts.src_mac = Some(eth.src_addr());
    let Some((vlan, ethertype, l3_offset)) = l2::untag(&eth) else {
        return facts;
    };
    facts.vlan = vlan;
    facts.ethertype = Some(ethertype);
    let l3 = frame.get(l3_offset..).unwrap_or_default();
    match ethertype {
        EtherType::Arp => match arp::Packet::new_checked(l3) {
            Ok(packet) => {
                facts.arp = Some(ArpFacts {
                    operation: packet.operation(),
                    sender_mac: packet.sender_hardware_addr(),
                    sender_ip: packet.sender_protocol_addr(),
                    target_ip: packet.target_protocol_addr(),
                })
            }
            Err(_) => facts.incomplete = true,
        },
        EtherType::Ipv4 => inspect_ipv4(l3, &mut facts),
        EtherType::Ipv6 => inspect_ipv6(l3, &mut facts),
        _ => {}
    }
    facts
}

fn inspect_ipv4(l3: &[u8], facts: &mut Facts) {
    let Ok(ip) = ipv4::Packet::new_checked(l3) else {
        facts.incomplete = true;
        return;
    };
    facts.ip_src = Some(IpAddr::V4(ip.src_addr()));
    facts.fragment = ip.more_frags() || ip.frag_offset() != 0;
    if ip.frag_offset() != 0 {
        facts.incomplete = true;
        return;
    }
    if ip.protocol() == IpProtocol::Udp {
        inspect_udp(ip.payload(), facts, false);
    }
}

fn inspect_ipv6(l3: &[u8], facts: &mut Facts) {
    let Ok(ip) = ipv6::Packet::new_checked(l3) else {
        facts.incomplete = true;
        return;
    };
    facts.ip_src = Some(IpAddr::V6(ip.src_addr()));
    let Ok(walk) = ipv6_ext::walk(&ip) else {
        facts.incomplete = true;
        return;
    };
    facts.fragment = walk.is_fragment();
    if walk.later_fragment() {
        facts.incomplete = true;
        return;
    }
    let l4 = ip
        .payload()
        .get(walk.offset - ipv6::HEADER_LEN..)
        .unwrap_or_default();
    match walk.protocol {
        IpProtocol::Udp => inspect_udp(l4, facts, true),
        IpProtocol::Icmpv6 => inspect_icmpv6(l4, facts),
        _ => {}
    }
}

/// Classifies a UDP datagram (from its header on; the rest of the IP payload after it).
fn inspect_udp(l4: &[u8], facts: &mut Facts, v6: bool) {
    if l4.len() < udp::HEADER_LEN {
        facts.incomplete = true;
        return;
    }
    // The length field is not checked: a DHCP message is recognised by its first byte even
    // if the datagram lies about its length.
    let datagram = udp::Packet::new_unchecked(l4);
    let (src, dst) = (datagram.src_port(), datagram.dst_port());
    let first = l4.get(udp::HEADER_LEN).copied();
    let (server, client) = if v6 {
        (DHCPV6_SERVER_PORT, DHCPV6_CLIENT_PORT)
    } else {
        (DHCPV4_SERVER_PORT, DHCPV4_CLIENT_PORT)
    };
    let dhcp_ports = [server, client];
    if !dhcp_ports.contains(&src) && !dhcp_ports.contains(&dst) {
        return;
    }
    let server_message = match first {
        Some(op) if v6 => DHCPV6_SERVER_MESSAGES.contains(&op),
        Some(op) => op == BOOTREPLY,
        None => {
            facts.incomplete = true;
            false
        }
    };
    let to_client = src == server && dst == client;
    let between_dhcp_ports = dhcp_ports.contains(&src) && dhcp_ports.contains(&dst);
    if to_client || (server_message && between_dhcp_ports) {
        facts.kind = if v6 {
            Kind::DhcpV6Server
        } else {
            Kind::DhcpV4Server
        };
    }
}

/// Classifies an ICMPv6 message.
fn inspect_icmpv6(l4: &[u8], facts: &mut Facts) {
    let Some(&icmp_type) = l4.first() else {
        facts.incomplete = true;
        return;
    };
    let solicitation = match icmp_type {
        ICMPV6_ROUTER_ADVERTISEMENT => {
            facts.kind = Kind::RouterAdvertisement;
            return;
        }
        ICMPV6_REDIRECT => {
            facts.kind = Kind::Redirect;
            return;
        }
        ICMPV6_NEIGHBOR_SOLICITATION => true,
        ICMPV6_NEIGHBOR_ADVERTISEMENT => false,
        _ => return,
    };
    let Some(header) = l4.get(..ND_HEADER_LEN) else {
        facts.incomplete = true;
        return;
    };
    let wanted = if solicitation {
        ND_OPT_SOURCE_LL
    } else {
        ND_OPT_TARGET_LL
    };
    let mut link_layer = None;
    let mut options = &l4[ND_HEADER_LEN..];
    while !options.is_empty() {
        // Each option: type, length in units of 8 bytes (0 is invalid, RFC 4861 4.6).
        let len = options.get(1).map_or(0, |&units| usize::from(units) * 8);
        let Some(option) = options.get(..len).filter(|_| len != 0) else {
            facts.incomplete = true;
            break;
        };
        if option[0] == wanted && link_layer.is_none() {
            link_layer = MacAddr::from_bytes(&option[2..8]);
        }
        options = &options[len..];
    }
    let nd = NeighborDiscovery {
        target: read_array::<16>(header, 8..24).into(),
        link_layer,
    };
    facts.kind = if solicitation {
        Kind::NeighborSolicitation(nd)
    } else {
        Kind::NeighborAdvertisement(nd)
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::{pseudo_header_v6, sum16};
    use crate::testdata::{frag6_first, ARP_REPLY, ARP_REQUEST, FRAG6_LAST, TCP_SYN, UDP4, UDP6};
    use crate::testdata::{MLD_REPORT, VLAN_UDP4};
    use proptest::prelude::*;

    const MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0x12, 0x34, 0x01]);
    const V4_SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const LL_SRC: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0x5054, 0xff, 0xfe12, 0x3401);
    const TARGET: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);

    fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
        let mut frame = vec![0x33, 0x33, 0, 0, 0, 1];
        frame.extend_from_slice(&MAC.0);
        frame.extend_from_slice(&ethertype.to_be_bytes());
        frame.extend_from_slice(payload);
        frame
    }

    fn ipv4(protocol: u8, payload: &[u8]) -> Vec<u8> {
        let mut packet = vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, protocol, 0, 0];
        packet.extend_from_slice(&V4_SRC.octets());
        packet.extend_from_slice(&[255, 255, 255, 255]);
        packet.extend_from_slice(payload);
        let len = packet.len() as u16;
        let mut ip = ipv4::Packet::new_unchecked(&mut packet[..]);
        ip.set_total_len(len);
        ip.fill_checksum();
        ethernet(0x0800, &packet)
    }

    /// An IPv6 packet from [`LL_SRC`] with `headers` (extension headers, already chained)
    /// after the fixed header.
    fn ipv6(next_header: u8, headers: &[u8], payload: &[u8]) -> Vec<u8> {
        let mut packet = vec![0x60, 0, 0, 0, 0, 0, next_header, 255];
        packet.extend_from_slice(&LL_SRC.octets());
        packet.extend_from_slice(&Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1).octets());
        packet.extend_from_slice(headers);
        packet.extend_from_slice(payload);
        let len = (packet.len() - ipv6::HEADER_LEN) as u16;
        ipv6::Packet::new_unchecked(&mut packet[..]).set_payload_len(len);
        ethernet(0x86dd, &packet)
    }

    fn udp(src: u16, dst: u16, payload: &[u8]) -> Vec<u8> {
        let mut datagram = Vec::new();
        datagram.extend_from_slice(&src.to_be_bytes());
        datagram.extend_from_slice(&dst.to_be_bytes());
        datagram.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        datagram.extend_from_slice(&[0, 0]);
        datagram.extend_from_slice(payload);
        datagram
    }

    /// An ICMPv6 message with a correct checksum.
    fn icmpv6(icmp_type: u8, body: &[u8]) -> Vec<u8> {
        let mut message = vec![icmp_type, 0, 0, 0];
        message.extend_from_slice(body);
        let dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
        let pseudo = pseudo_header_v6(LL_SRC, dst, IpProtocol::Icmpv6, message.len() as u32);
        let checksum = crate::checksum::fold(sum16(&message, pseudo));
        message[2..4].copy_from_slice(&checksum.to_be_bytes());
        message
    }

    /// A neighbour solicitation or advertisement body for [`TARGET`] with `options`.
    fn nd_body(options: &[u8]) -> Vec<u8> {
        let mut body = vec![0x60, 0, 0, 0];
        body.extend_from_slice(&TARGET.octets());
        body.extend_from_slice(options);
        body
    }

    const LL_OPT_MAC: MacAddr = MacAddr([0x52, 0x54, 0, 0xaa, 0xbb, 0xcc]);

    fn ll_option(option_type: u8) -> [u8; 8] {
        let mut option = [option_type, 1, 0, 0, 0, 0, 0, 0];
        option[2..].copy_from_slice(&LL_OPT_MAC.0);
        option
    }

    #[test]
    fn arp() {
        let facts = inspect(&ARP_REQUEST);
        assert_eq!(facts.src_mac, Some(MAC));
        assert_eq!(facts.ethertype, Some(EtherType::Arp));
        assert_eq!(
            facts.arp,
            Some(ArpFacts {
                operation: arp::Operation::Request,
                sender_mac: MAC,
                sender_ip: V4_SRC,
                target_ip: Ipv4Addr::new(10, 0, 0, 2),
            })
        );
        assert_eq!(
            (facts.ip_src, facts.kind, facts.incomplete),
            (None, Kind::Other, false)
        );
        let reply = inspect(&ARP_REPLY).arp.unwrap();
        assert_eq!(reply.operation, arp::Operation::Reply);
        assert_eq!(reply.sender_ip, Ipv4Addr::new(10, 0, 0, 2));
        // Truncated ARP.
        let facts = inspect(&ARP_REQUEST[..41]);
        assert_eq!((facts.arp, facts.incomplete), (None, true));
    }

    #[test]
    fn ip_sources() {
        let facts = inspect(&TCP_SYN);
        assert_eq!(facts.ip_src, Some(IpAddr::V4(V4_SRC)));
        assert_eq!(
            (facts.kind, facts.fragment, facts.incomplete),
            (Kind::Other, false, false)
        );
        let facts = inspect(&UDP6);
        assert_eq!(facts.ip_src, Some(IpAddr::V6("fd00::1".parse().unwrap())));
        assert_eq!(facts.kind, Kind::Other);
        let facts = inspect(&VLAN_UDP4);
        assert_eq!(
            (facts.vlan, facts.ip_src),
            (Some(100), Some(IpAddr::V4(V4_SRC)))
        );
        assert_eq!(facts.src_mac, Some(MAC));
        // MLD behind a Hop-by-Hop header is no guard's business.
        let facts = inspect(&MLD_REPORT);
        assert_eq!((facts.kind, facts.incomplete), (Kind::Other, false));
    }

    #[test]
    fn runts_and_truncated_headers() {
        assert_eq!(inspect(&[]), Facts::EMPTY);
        assert_eq!(inspect(&UDP4[..13]), Facts::EMPTY);
        let facts = inspect(&VLAN_UDP4[..17]);
        assert_eq!(
            (facts.src_mac, facts.vlan, facts.ethertype),
            (Some(MAC), None, None)
        );
        let facts = inspect(&UDP4[..33]);
        assert_eq!((facts.ip_src, facts.incomplete), (None, true));
        let facts = inspect(&UDP6[..60]);
        assert_eq!((facts.ip_src, facts.incomplete), (None, true));
    }

    #[test]
    fn dhcpv4() {
        // OFFER from a server: 67 -> 68, op 2.
        let offer = ipv4(17, &udp(67, 68, &[2, 1, 6, 0]));
        assert_eq!(inspect(&offer).kind, Kind::DhcpV4Server);
        assert!(inspect(&offer).is_dhcp_server());
        // 67 -> 68 whatever the op; and an empty payload.
        assert_eq!(
            inspect(&ipv4(17, &udp(67, 68, &[1]))).kind,
            Kind::DhcpV4Server
        );
        let empty = inspect(&ipv4(17, &udp(67, 68, &[])));
        assert_eq!((empty.kind, empty.incomplete), (Kind::DhcpV4Server, true));
        // A relay agent's BOOTREPLY, 67 -> 67.
        assert_eq!(
            inspect(&ipv4(17, &udp(67, 67, &[2]))).kind,
            Kind::DhcpV4Server
        );
        // A client's DISCOVER (op 1, 68 -> 67) and a relayed request (67 -> 67, op 1).
        let discover = inspect(&ipv4(17, &udp(68, 67, &[1, 1, 6, 0])));
        assert_eq!((discover.kind, discover.incomplete), (Kind::Other, false));
        assert!(!discover.is_dhcp_server());
        assert_eq!(inspect(&ipv4(17, &udp(67, 67, &[1]))).kind, Kind::Other);
        // Op 2 on unrelated ports; port 67 over TCP.
        assert_eq!(inspect(&ipv4(17, &udp(1067, 68, &[2]))).kind, Kind::Other);
        assert_eq!(inspect(&ipv4(6, &udp(67, 68, &[2]))).kind, Kind::Other);
        // A UDP header cut short.
        let facts = inspect(&ipv4(17, &udp(67, 68, &[2])[..7]));
        assert_eq!((facts.kind, facts.incomplete), (Kind::Other, true));
    }

    #[test]
    fn dhcpv4_fragments() {
        let mut first = ipv4(17, &udp(67, 68, &[2]));
        first[20] = 0x20; // MF
        let facts = inspect(&first);
        assert_eq!(
            (facts.kind, facts.fragment, facts.incomplete),
            (Kind::DhcpV4Server, true, false)
        );
        let mut later = ipv4(17, &udp(67, 68, &[2]));
        later[21] = 1; // offset 8
        let facts = inspect(&later);
        assert_eq!(
            (facts.kind, facts.fragment, facts.incomplete),
            (Kind::Other, true, true)
        );
        assert_eq!(facts.ip_src, Some(IpAddr::V4(V4_SRC)));
    }

    #[test]
    fn dhcpv6() {
        // ADVERTISE from a server, 547 -> 546.
        assert_eq!(
            inspect(&ipv6(17, &[], &udp(547, 546, &[2, 0, 0, 1]))).kind,
            Kind::DhcpV6Server
        );
        // REPLY, RECONFIGURE, RELAY-REPL (547 -> 547).
        for msg_type in [7, 10, 13] {
            let frame = ipv6(17, &[], &udp(547, 547, &[msg_type, 0, 0, 1]));
            assert_eq!(inspect(&frame).kind, Kind::DhcpV6Server);
        }
        // SOLICIT from a client, 546 -> 547, and a relay's RELAY-FORW, 547 -> 547.
        assert_eq!(
            inspect(&ipv6(17, &[], &udp(546, 547, &[1, 0, 0, 1]))).kind,
            Kind::Other
        );
        assert_eq!(
            inspect(&ipv6(17, &[], &udp(547, 547, &[12]))).kind,
            Kind::Other
        );
        // Behind a Destination Options header.
        let dest_opts = [17, 0, 1, 4, 0, 0, 0, 0];
        let frame = ipv6(60, &dest_opts, &udp(547, 546, &[7]));
        assert_eq!(inspect(&frame).kind, Kind::DhcpV6Server);
        // DHCPv4 ports over IPv6 mean nothing.
        assert_eq!(
            inspect(&ipv6(17, &[], &udp(67, 68, &[2]))).kind,
            Kind::Other
        );
    }

    #[test]
    fn router_advertisement_and_redirect() {
        let ra = ipv6(
            58,
            &[],
            &icmpv6(134, &[64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
        );
        let facts = inspect(&ra);
        assert_eq!(facts.kind, Kind::RouterAdvertisement);
        assert!(facts.is_router_message() && !facts.is_dhcp_server());
        assert_eq!(facts.ip_src, Some(IpAddr::V6(LL_SRC)));
        let redirect = ipv6(58, &[], &icmpv6(137, &[0; 36]));
        assert_eq!(inspect(&redirect).kind, Kind::Redirect);
        // Behind Hop-by-Hop and Destination Options headers.
        let headers = [60, 0, 1, 4, 0, 0, 0, 0, 58, 0, 1, 4, 0, 0, 0, 0];
        assert_eq!(
            inspect(&ipv6(0, &headers, &icmpv6(134, &[0; 12]))).kind,
            Kind::RouterAdvertisement
        );
        // In a first fragment: seen, and flagged as a fragment.
        let frag = [58, 0, 0, 1, 0, 0, 0, 1];
        let facts = inspect(&ipv6(44, &frag, &icmpv6(134, &[0; 12])));
        assert_eq!(
            (facts.kind, facts.fragment, facts.incomplete),
            (Kind::RouterAdvertisement, true, false)
        );
        // In a later fragment: not seen, flagged incomplete.
        let frag = [58, 0, 0, 8, 0, 0, 0, 1];
        let facts = inspect(&ipv6(44, &frag, &icmpv6(134, &[0; 12])));
        assert_eq!(
            (facts.kind, facts.fragment, facts.incomplete),
            (Kind::Other, true, true)
        );
        // A header chain that runs past the packet (RFC 7113's evasion): incomplete.
        let facts = inspect(&ipv6(60, &[58, 1, 1, 4, 0, 0, 0, 0], &[]));
        assert_eq!((facts.kind, facts.incomplete), (Kind::Other, true));
        // An empty ICMPv6 payload.
        assert!(inspect(&ipv6(58, &[], &[])).incomplete);
        // Other ICMPv6 messages (echo request).
        let facts = inspect(&ipv6(58, &[], &icmpv6(128, &[0, 1, 0, 1])));
        assert_eq!((facts.kind, facts.incomplete), (Kind::Other, false));
    }

    #[test]
    fn neighbor_discovery() {
        let ns = ipv6(58, &[], &icmpv6(135, &nd_body(&ll_option(1))));
        assert_eq!(
            inspect(&ns).kind,
            Kind::NeighborSolicitation(NeighborDiscovery {
                target: TARGET,
                link_layer: Some(LL_OPT_MAC)
            })
        );
        // An advertisement's target link-layer option; a source option before it is skipped.
        let options = [ll_option(1), ll_option(2)].concat();
        let mut options_with_other_mac = options.clone();
        options_with_other_mac[2..8].fill(0x02);
        let na = ipv6(58, &[], &icmpv6(136, &nd_body(&options_with_other_mac)));
        let facts = inspect(&na);
        assert_eq!(
            facts.kind,
            Kind::NeighborAdvertisement(NeighborDiscovery {
                target: TARGET,
                link_layer: Some(LL_OPT_MAC)
            })
        );
        assert!(!facts.incomplete);
        // Without options (a DAD solicitation from ::) the link-layer address is absent.
        let facts = inspect(&ipv6(58, &[], &icmpv6(135, &nd_body(&[]))));
        assert_eq!(
            facts.kind,
            Kind::NeighborSolicitation(NeighborDiscovery {
                target: TARGET,
                link_layer: None
            })
        );
        // A zero-length option, and one running past the message: incomplete.
        for bad in [
            [1u8, 0, 1, 2, 3, 4, 5, 6].as_slice(),
            &[2, 2, 1, 2, 3, 4, 5, 6],
        ] {
            let facts = inspect(&ipv6(58, &[], &icmpv6(136, &nd_body(bad))));
            assert!(matches!(facts.kind, Kind::NeighborAdvertisement(_)));
            assert!(facts.incomplete);
        }
        // A message too short for the target.
        let facts = inspect(&ipv6(58, &[], &icmpv6(135, &[0; 19])));
        assert_eq!((facts.kind, facts.incomplete), (Kind::Other, true));
        // Ethernet padding after the IPv6 payload is not read as options.
        let mut padded = ipv6(58, &[], &icmpv6(135, &nd_body(&[])));
        padded.extend_from_slice(&[0; 10]);
        assert!(!inspect(&padded).incomplete);
    }

    #[test]
    fn ipv6_fragments_of_udp() {
        let first = inspect(&frag6_first());
        assert_eq!((first.fragment, first.incomplete), (true, false));
        let last = inspect(&FRAG6_LAST);
        assert_eq!(
            (last.fragment, last.incomplete, last.kind),
            (true, true, Kind::Other)
        );
    }

    proptest! {
        #[test]
        fn never_panics(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = inspect(&frame);
        }

        #[test]
        fn mangled_never_panics(
            which in 0..5usize,
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut frame = match which {
                0 => ipv6(58, &[], &icmpv6(136, &nd_body(&ll_option(2)))),
                1 => ipv6(60, &[17, 0, 1, 4, 0, 0, 0, 0], &udp(547, 546, &[7])),
                2 => ipv4(17, &udp(67, 68, &[2])),
                3 => ARP_REQUEST.to_vec(),
                _ => VLAN_UDP4.to_vec(),
            };
            for (at, byte) in edits {
                let at = at.index(frame.len());
                frame[at] = byte;
            }
            frame.truncate(cut.index(frame.len() + 1));
            let _ = inspect(&frame);
        }
    }
}
