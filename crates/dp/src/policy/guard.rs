//! Stand-in for `qswitch_wire::guard` (branch `wire`) until it lands on main: the same
//! names and meaning for what port security uses, read from an Ethernet frame with at most
//! one 802.1Q tag. IPv6 extension headers are not walked here: an IPv6 packet whose next
//! header is not UDP or ICMPv6 is [`Kind::Other`], and a fragment is `incomplete`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use qswitch_wire::l2;
use qswitch_wire::MacAddr;

const ETH_ARP: u16 = 0x0806;
const ETH_IPV4: u16 = 0x0800;
const ETH_IPV6: u16 = 0x86dd;

/// The ARP fields anti-spoofing checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArpFacts {
    pub sender_mac: MacAddr,
    pub sender_ip: Ipv4Addr,
    pub target_ip: Ipv4Addr,
}

/// A neighbour solicitation or advertisement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborDiscovery {
    pub target: Ipv6Addr,
    pub link_layer: Option<MacAddr>,
}

/// What kind of message a frame carries, as far as port security cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Other,
    DhcpV4Server,
    DhcpV6Server,
    RouterAdvertisement,
    Redirect,
    NeighborSolicitation(NeighborDiscovery),
    NeighborAdvertisement(NeighborDiscovery),
}

/// What [`inspect`] found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    pub src_mac: Option<MacAddr>,
    pub arp: Option<ArpFacts>,
    pub ip_src: Option<IpAddr>,
    pub kind: Kind,
    pub fragment: bool,
    pub incomplete: bool,
}

impl Facts {
    pub fn is_dhcp_server(&self) -> bool {
        matches!(self.kind, Kind::DhcpV4Server | Kind::DhcpV6Server)
    }
    pub fn is_router_message(&self) -> bool {
        matches!(self.kind, Kind::RouterAdvertisement | Kind::Redirect)
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn mac(b: &[u8], at: usize) -> Option<MacAddr> {
    Some(MacAddr(b.get(at..at + 6)?.try_into().ok()?))
}

/// Reads the facts of an Ethernet frame. Never panics.
pub fn inspect(frame: &[u8]) -> Facts {
    let mut f = Facts {
        src_mac: mac(frame, 6),
        arp: None,
        ip_src: None,
        kind: Kind::Other,
        fragment: false,
        incomplete: false,
    };
    let Ok(info) = l2::classify(frame) else {
        return f;
    };
    let l3 = &frame[info.l3_offset..];
    match u16::from(info.ethertype) {
        ETH_ARP => {
            // Ethernet/IPv4 ARP: htype 1, ptype 0x0800, hlen 6, plen 4.
            let ok = l3.len() >= 28
                && be16(l3, 0) == Some(1)
                && be16(l3, 2) == Some(ETH_IPV4)
                && l3[4] == 6
                && l3[5] == 4;
            if ok {
                f.arp = Some(ArpFacts {
                    sender_mac: MacAddr(l3[8..14].try_into().unwrap_or_default()),
                    sender_ip: Ipv4Addr::new(l3[14], l3[15], l3[16], l3[17]),
                    target_ip: Ipv4Addr::new(l3[24], l3[25], l3[26], l3[27]),
                });
            } else {
                f.incomplete = true;
            }
        }
        ETH_IPV4 => {
            let ihl = usize::from(l3.first().copied().unwrap_or(0) & 0xf) * 4;
            if l3.len() < 20 || ihl < 20 || l3.len() < ihl || l3[0] >> 4 != 4 {
                f.incomplete = true;
                return f;
            }
            f.ip_src = Some(IpAddr::V4(Ipv4Addr::new(l3[12], l3[13], l3[14], l3[15])));
            let frag = be16(l3, 6).unwrap_or(0);
            let offset = frag & 0x1fff;
            f.fragment = offset != 0 || frag & 0x2000 != 0;
            if offset != 0 {
                f.incomplete = true;
                return f;
            }
            if l3[9] == 17 {
                udp(&mut f, &l3[ihl..], false);
            }
        }
        ETH_IPV6 => {
            if l3.len() < 40 || l3[0] >> 4 != 6 {
                f.incomplete = true;
                return f;
            }
            let src: [u8; 16] = l3[8..24].try_into().unwrap_or_default();
            f.ip_src = Some(IpAddr::V6(Ipv6Addr::from(src)));
            let l4 = &l3[40..];
            match l3[6] {
                17 => udp(&mut f, l4, true),
                58 => icmpv6(&mut f, l4),
                // Extension headers (hop-by-hop, routing, fragment, destination options):
                // not walked by the stand-in, so what follows is unknown.
                0 | 43 | 44 | 60 => {
                    f.fragment = l3[6] == 44;
                    f.incomplete = true;
                }
                _ => {}
            }
        }
        _ => {}
    }
    f
}

fn udp(f: &mut Facts, l4: &[u8], v6: bool) {
    let (Some(sport), Some(dport)) = (be16(l4, 0), be16(l4, 2)) else {
        f.incomplete = true;
        return;
    };
    let first = l4.get(8).copied();
    if !v6 && (sport, dport) == (67, 68)
        || !v6 && matches!((sport, dport), (67, 67) | (68, 67)) && first == Some(2)
    {
        f.kind = Kind::DhcpV4Server;
    }
    // ADVERTISE 2, REPLY 7, RECONFIGURE 10, RELAY-REPL 13.
    if v6
        && ((sport, dport) == (547, 546)
            || matches!((sport, dport), (546, 547) | (547, 547))
                && matches!(first, Some(2 | 7 | 10 | 13)))
    {
        f.kind = Kind::DhcpV6Server;
    }
}

fn icmpv6(f: &mut Facts, m: &[u8]) {
    let Some(&ty) = m.first() else {
        f.incomplete = true;
        return;
    };
    f.kind = match ty {
        134 => Kind::RouterAdvertisement,
        137 => Kind::Redirect,
        135 | 136 => {
            if m.len() < 24 {
                f.incomplete = true;
                return;
            }
            let target = Ipv6Addr::from(<[u8; 16]>::try_from(&m[8..24]).unwrap_or_default());
            // Source (1) in a solicitation, target (2) link-layer address in an advertisement.
            let want = if ty == 135 { 1 } else { 2 };
            let mut link_layer = None;
            let mut opts = &m[24..];
            while opts.len() >= 8 {
                let len = usize::from(opts[1]) * 8;
                if len == 0 || len > opts.len() {
                    f.incomplete = true;
                    break;
                }
                if opts[0] == want && len == 8 {
                    link_layer = mac(opts, 2);
                }
                opts = &opts[len..];
            }
            let nd = NeighborDiscovery { target, link_layer };
            if ty == 135 {
                Kind::NeighborSolicitation(nd)
            } else {
                Kind::NeighborAdvertisement(nd)
            }
        }
        _ => Kind::Other,
    };
}
