//! VXLAN (RFC 7348): the 8-byte header, encapsulation into a caller's headroom and
//! decapsulation with a reason for every drop.
//!
//! ```text
//! outer Ethernet (14) | IPv4 (20) or IPv6 (40) | UDP (8) | VXLAN (8) | inner Ethernet frame
//!                                                           RRRRIRRR  reserved (24)
//!                                                           VNI (24)  reserved (8)
//! ```
//!
//! * [`Header`] views the VXLAN header. On receive only the I flag and the VNI are read; the
//!   reserved bits and the other flags are ignored (RFC 7348 section 5).
//! * [`Encap`] holds what a tunnel endpoint puts on every frame it sends to one remote: outer
//!   MAC addresses, underlay addresses, UDP ports, VNI, TTL. [`Encap::write`] writes the
//!   outer headers into a headroom buffer, [`Encap::write_in_place`] in front of an inner frame
//!   already in the buffer. Neither allocates nor copies the inner frame. The outer IPv4 header
//!   has its checksum, DF set and identification 0 (VTEPs must not fragment, section 4.3; RFC
//!   6864 lets atomic datagrams carry any identification). The UDP checksum is computed over
//!   IPv6 always (RFC 8200 requires it; the zero-checksum exception of RFC 6935/6936 is not
//!   used, and Linux refuses zero checksums over IPv6 unless told `udp6zerocsumrx`), over IPv4
//!   only when [`Encap::udp_checksum`] asks for it (RFC 7348 says it SHOULD be zero; Linux
//!   6.18 with iproute2 6.1 computes it unless the device is created with `noudpcsum`, and
//!   accepts both).
//!
//! Interop with Linux's vxlan device was checked by hand on kernel 6.18 (two network
//! namespaces, a veth, frames injected with AF_PACKET): it accepted and answered what
//! [`Encap`] wrote over IPv4 (checksum zero and computed) and IPv6, and [`decap`] accepted its
//! replies. The unit tests pin this down with frames captured from Linux.
//! * [`decap`] checks an outer frame the way section 4 and 5 ask and returns the inner frame
//!   with the outer facts a VTEP learns from; every rejection is a [`DecapError`] with a
//!   [`reason`](DecapError::reason) string for counters.
//! * [`src_port`] maps an inner flow hash into 49152–65535, so a flow keeps one underlay path
//!   (section 5, "Source Port").
//!
//! Limitations: the outer frame written is untagged ([`OVERHEAD_V4`], [`OVERHEAD_V6`]);
//! [`decap`] accepts one outer 802.1Q tag. IPv4 options and IPv6 extension headers are
//! accepted on receive and never written. Checking the VNI against configured ones, and the
//! inner VLAN tag policy of section 6.1, are left to the caller.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::checksum::{self, pseudo_header_v4, pseudo_header_v6};
use crate::ethernet::{self, EtherType, Frame};
use crate::{ipv4, ipv6, ipv6_ext, l2, read_u32, udp, Error, IpProtocol, MacAddr, Result};

mod field {
    use crate::{Field, Rest};

    pub const FLAGS: usize = 0;
    pub const VNI: Field = 4..8;
    pub const PAYLOAD: Rest = 8..;
}

/// Length of the VXLAN header.
pub const HEADER_LEN: usize = field::PAYLOAD.start;

/// The IANA-assigned UDP destination port (Linux's own default is 8472).
pub const UDP_PORT: u16 = 4789;

/// The I flag: the VNI is valid. It must be set.
pub const FLAG_I: u8 = 0x08;

/// The largest VNI: 24 bits.
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// Bytes put in front of the inner frame over IPv4: Ethernet, IPv4, UDP and VXLAN headers.
pub const OVERHEAD_V4: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + UDP_VXLAN_LEN;

/// Bytes put in front of the inner frame over IPv6: Ethernet, IPv6, UDP and VXLAN headers.
pub const OVERHEAD_V6: usize = ethernet::HEADER_LEN + ipv6::HEADER_LEN + UDP_VXLAN_LEN;

/// The first port of the range [`src_port`] maps into (the IANA dynamic range).
pub const SRC_PORT_MIN: u16 = 49152;

const UDP_VXLAN_LEN: usize = udp::HEADER_LEN + HEADER_LEN;
const IPV4_FLAG_DF: u16 = 0x4000;
const VNI_SHIFT: u32 = 8;

/// A 24-bit VXLAN network identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Vni(u32);

impl Vni {
    /// The VNI `value`, if it fits in 24 bits.
    pub const fn new(value: u32) -> Option<Vni> {
        if value <= MAX_VNI {
            Some(Vni(value))
        } else {
            None
        }
    }

    /// The number.
    pub const fn get(self) -> u32 {
        self.0
    }
}

/// A view of the VXLAN header and the inner frame after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Header<T> {
    /// Wraps a buffer without checking it; see the crate docs for what that allows.
    pub const fn new_unchecked(buffer: T) -> Header<T> {
        Header { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Header<T>> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Fails with [`Error::Truncated`] if the buffer is shorter than [`HEADER_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The flags byte (`RRRRIRRR`).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// Whether the I flag is set (the VNI is valid).
    pub fn vni_valid(&self) -> bool {
        self.flags() & FLAG_I != 0
    }

    /// The VNI. The reserved byte after it is ignored.
    pub fn vni(&self) -> Vni {
        Vni(read_u32(self.buffer.as_ref(), field::VNI) >> VNI_SHIFT)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Header<&'a T> {
    /// The inner frame.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Header<T> {
    /// Writes a header as a sender must: the I flag, the VNI, every reserved bit zero.
    pub fn emit(&mut self, vni: Vni) {
        let header = &mut self.buffer.as_mut()[..HEADER_LEN];
        header.fill(0);
        header[field::FLAGS] = FLAG_I;
        header[field::VNI].copy_from_slice(&(vni.0 << VNI_SHIFT).to_be_bytes());
    }

    /// The inner frame, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

/// Maps a hash of the inner frame's flow (e.g. of [`flow::extract`](crate::flow::extract)'s
/// key) to a UDP source port in 49152–65535, as RFC 7348 recommends. All 32 bits count.
#[inline]
pub fn src_port(flow_hash: u32) -> u16 {
    let folded = (flow_hash ^ (flow_hash >> 16)) as u16;
    SRC_PORT_MIN | (folded & !SRC_PORT_MIN)
}

/// The underlay addresses of a tunnel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Underlay {
    /// Over IPv4.
    V4 {
        /// The local VTEP address.
        src: Ipv4Addr,
        /// The remote VTEP address.
        dst: Ipv4Addr,
    },
    /// Over IPv6.
    V6 {
        /// The local VTEP address.
        src: Ipv6Addr,
        /// The remote VTEP address.
        dst: Ipv6Addr,
    },
}

/// What goes on the outside of a frame sent to one remote VTEP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Encap {
    /// The outer source MAC address (the local underlay interface).
    pub src_mac: MacAddr,
    /// The outer destination MAC address (the underlay next hop).
    pub dst_mac: MacAddr,
    /// The underlay addresses.
    pub underlay: Underlay,
    /// The UDP source port, normally [`src_port`] of the inner flow's hash.
    pub src_port: u16,
    /// The UDP destination port, normally [`UDP_PORT`].
    pub dst_port: u16,
    /// The VNI.
    pub vni: Vni,
    /// The outer IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// The outer IPv4 type of service or IPv6 traffic class (DSCP and ECN).
    pub tos: u8,
    /// Whether to compute the UDP checksum over IPv4 (zero otherwise). Over IPv6 it is always
    /// computed and this is ignored.
    pub udp_checksum: bool,
}

/// Why [`Encap::write`] could not encapsulate a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncapError {
    /// The headroom is smaller than [`Encap::overhead`].
    NoHeadroom,
    /// The inner frame is shorter than an Ethernet header.
    InnerTooShort,
    /// The outer IP packet would be longer than its length field can say.
    TooLong,
}

impl core::fmt::Display for EncapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(match self {
            EncapError::NoHeadroom => "headroom smaller than the VXLAN overhead",
            EncapError::InnerTooShort => "inner frame shorter than an Ethernet header",
            EncapError::TooLong => "encapsulated packet too long for its IP length field",
        })
    }
}

impl std::error::Error for EncapError {}

impl Encap {
    /// The bytes put in front of the inner frame: [`OVERHEAD_V4`] or [`OVERHEAD_V6`].
    pub fn overhead(&self) -> usize {
        match self.underlay {
            Underlay::V4 { .. } => OVERHEAD_V4,
            Underlay::V6 { .. } => OVERHEAD_V6,
        }
    }

    /// Writes the outer Ethernet, IP, UDP and VXLAN headers for `inner` into the last
    /// [`overhead`](Self::overhead) bytes of `headroom`, so that `inner` sent right after
    /// `headroom` is the whole frame. Returns the offset in `headroom` where the frame starts.
    pub fn write(
        &self,
        headroom: &mut [u8],
        inner: &[u8],
    ) -> core::result::Result<usize, EncapError> {
        let start = headroom
            .len()
            .checked_sub(self.overhead())
            .ok_or(EncapError::NoHeadroom)?;
        self.emit(&mut headroom[start..], inner)?;
        Ok(start)
    }

    /// Encapsulates the inner frame that starts at `inner_offset` in `buffer` and runs to its
    /// end, writing the outer headers right before it. Returns the offset where the outer
    /// frame starts: `inner_offset - overhead()`.
    pub fn write_in_place(
        &self,
        buffer: &mut [u8],
        inner_offset: usize,
    ) -> core::result::Result<usize, EncapError> {
        if inner_offset > buffer.len() {
            return Err(EncapError::InnerTooShort);
        }
        let (headroom, inner) = buffer.split_at_mut(inner_offset);
        self.write(headroom, inner)
    }

    /// Writes the headers into `out`, exactly `overhead()` bytes long.
    fn emit(&self, out: &mut [u8], inner: &[u8]) -> core::result::Result<(), EncapError> {
        if inner.len() < ethernet::HEADER_LEN {
            return Err(EncapError::InnerTooShort);
        }
        let udp_len = UDP_VXLAN_LEN + inner.len();
        let ip_header_len = self.overhead() - ethernet::HEADER_LEN - UDP_VXLAN_LEN;
        let ip_len = match self.underlay {
            Underlay::V4 { .. } => ip_header_len + udp_len,
            Underlay::V6 { .. } => udp_len,
        };
        let ip_len = u16::try_from(ip_len).map_err(|_| EncapError::TooLong)?;
        // Fits too, being no larger than ip_len.
        let udp_len = udp_len as u16;

        let (eth, rest) = out.split_at_mut(ethernet::HEADER_LEN);
        let (ip, rest) = rest.split_at_mut(ip_header_len);
        let (udp_header, vxlan) = rest.split_at_mut(udp::HEADER_LEN);

        let mut frame = Frame::new_unchecked(&mut *eth);
        frame.set_dst_addr(self.dst_mac);
        frame.set_src_addr(self.src_mac);

        let pseudo_header = match self.underlay {
            Underlay::V4 { src, dst } => {
                frame.set_ethertype(EtherType::Ipv4);
                ip[0] = 0x45;
                ip[1] = self.tos;
                ip[6..8].copy_from_slice(&IPV4_FLAG_DF.to_be_bytes());
                let mut packet = ipv4::Packet::new_unchecked(&mut *ip);
                packet.set_total_len(ip_len);
                packet.set_ident(0);
                packet.set_ttl(self.ttl);
                packet.set_protocol(IpProtocol::Udp);
                packet.set_src_addr(src);
                packet.set_dst_addr(dst);
                packet.fill_checksum();
                self.udp_checksum
                    .then(|| pseudo_header_v4(src, dst, IpProtocol::Udp, udp_len))
            }
            Underlay::V6 { src, dst } => {
                frame.set_ethertype(EtherType::Ipv6);
                ip[..4].copy_from_slice(&0x6000_0000u32.to_be_bytes());
                let mut packet = ipv6::Packet::new_unchecked(&mut *ip);
                packet.set_traffic_class(self.tos);
                packet.set_payload_len(ip_len);
                packet.set_next_header(IpProtocol::Udp);
                packet.set_hop_limit(self.ttl);
                packet.set_src_addr(src);
                packet.set_dst_addr(dst);
                Some(pseudo_header_v6(
                    src,
                    dst,
                    IpProtocol::Udp,
                    u32::from(udp_len),
                ))
            }
        };

        Header::new_unchecked(&mut *vxlan).emit(self.vni);
        let mut datagram = udp::Packet::new_unchecked(&mut *udp_header);
        datagram.set_src_port(self.src_port);
        datagram.set_dst_port(self.dst_port);
        datagram.set_len(udp_len);
        datagram.set_checksum(0);
        if let Some(pseudo_header) = pseudo_header {
            // The UDP and VXLAN headers are 16 bytes, so the inner frame starts at an even
            // offset and its sum adds on.
            let sum = checksum::sum16(inner, pseudo_header);
            let sum = checksum::sum16(udp_header, sum);
            let sum = checksum::sum16(vxlan, sum);
            let value = match checksum::fold(sum) {
                0 => 0xffff,
                value => value,
            };
            udp::Packet::new_unchecked(&mut *udp_header).set_checksum(value);
        }
        Ok(())
    }
}

/// A VXLAN packet accepted by [`decap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decap<'a> {
    /// The VNI.
    pub vni: Vni,
    /// The inner Ethernet frame.
    pub inner: &'a [u8],
    /// Offset of the inner frame in the outer frame.
    pub inner_offset: usize,
    /// The outer source MAC address.
    pub outer_src_mac: MacAddr,
    /// The outer destination MAC address.
    pub outer_dst_mac: MacAddr,
    /// The outer 802.1Q VID, if the outer frame was tagged.
    pub outer_vlan: Option<u16>,
    /// The outer source address: the remote VTEP.
    pub src: IpAddr,
    /// The outer destination address.
    pub dst: IpAddr,
    /// The outer IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// The outer type of service or traffic class.
    pub tos: u8,
    /// The UDP source port.
    pub src_port: u16,
    /// The UDP destination port.
    pub dst_port: u16,
    /// Whether a UDP checksum was present (and so verified).
    pub udp_checksum: bool,
}

/// Why [`decap`] dropped a frame; [`reason`](Self::reason) names it for counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecapError {
    /// Shorter than an Ethernet header, or a truncated outer 802.1Q tag.
    TruncatedEthernet,
    /// The outer EtherType is neither IPv4 nor IPv6.
    NotIp,
    /// The outer IP header, or the packet its length fields describe, runs past the frame.
    TruncatedIp,
    /// The outer IP header is malformed (version, header length, extension headers).
    MalformedIp,
    /// The outer IPv4 header checksum is wrong.
    BadIpChecksum,
    /// The outer packet is an IP fragment (VTEPs do not reassemble; RFC 7348 section 4.3).
    Fragment,
    /// The outer packet is not UDP.
    NotUdp,
    /// The UDP header, or the datagram its length field describes, runs past the IP packet,
    /// or the length field is below 8.
    TruncatedUdp,
    /// The UDP destination port is not the VXLAN port.
    WrongPort,
    /// A non-zero UDP checksum over IPv4, or any over IPv6, is wrong.
    BadUdpChecksum,
    /// A zero UDP checksum over IPv6.
    ZeroUdpChecksum,
    /// The UDP payload is shorter than the VXLAN header.
    TruncatedVxlan,
    /// The I flag is clear.
    NoVniFlag,
    /// The inner frame is shorter than an Ethernet header.
    InnerTooShort,
}

impl DecapError {
    /// Every reason, in declaration order (for counter tables).
    pub const ALL: [DecapError; 14] = [
        DecapError::TruncatedEthernet,
        DecapError::NotIp,
        DecapError::TruncatedIp,
        DecapError::MalformedIp,
        DecapError::BadIpChecksum,
        DecapError::Fragment,
        DecapError::NotUdp,
        DecapError::TruncatedUdp,
        DecapError::WrongPort,
        DecapError::BadUdpChecksum,
        DecapError::ZeroUdpChecksum,
        DecapError::TruncatedVxlan,
        DecapError::NoVniFlag,
        DecapError::InnerTooShort,
    ];

    /// A short snake_case name, stable for counters and metrics labels.
    pub const fn reason(self) -> &'static str {
        match self {
            DecapError::TruncatedEthernet => "truncated_ethernet",
            DecapError::NotIp => "not_ip",
            DecapError::TruncatedIp => "truncated_ip",
            DecapError::MalformedIp => "malformed_ip",
            DecapError::BadIpChecksum => "bad_ip_checksum",
            DecapError::Fragment => "fragment",
            DecapError::NotUdp => "not_udp",
            DecapError::TruncatedUdp => "truncated_udp",
            DecapError::WrongPort => "wrong_port",
            DecapError::BadUdpChecksum => "bad_udp_checksum",
            DecapError::ZeroUdpChecksum => "zero_udp_checksum_ipv6",
            DecapError::TruncatedVxlan => "truncated_vxlan",
            DecapError::NoVniFlag => "i_flag_clear",
            DecapError::InnerTooShort => "inner_too_short",
        }
    }
}

impl core::fmt::Display for DecapError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for DecapError {}

/// Decapsulates a VXLAN frame sent to [`UDP_PORT`]; see [`decap_port`].
#[inline]
pub fn decap(frame: &[u8]) -> core::result::Result<Decap<'_>, DecapError> {
    decap_port(frame, UDP_PORT)
}

/// Decapsulates a VXLAN frame whose UDP destination port must be `dst_port`. Checks, in this
/// order: the outer Ethernet header (one 802.1Q tag allowed), IPv4 or IPv6, the IP header
/// and lengths, the IPv4 header checksum, fragments, UDP, the UDP length, the port, the UDP
/// checksum (a zero one is accepted over IPv4 only), the VXLAN header and its I flag, and the
/// inner frame's length. Reserved fields are ignored. Trailing bytes after the UDP datagram
/// (Ethernet padding) are not part of the inner frame. Never panics.
pub fn decap_port(frame: &[u8], dst_port: u16) -> core::result::Result<Decap<'_>, DecapError> {
    let eth = Frame::new_checked(frame).map_err(|_| DecapError::TruncatedEthernet)?;
    let (outer_vlan, ethertype, l3_offset) =
        l2::untag(&eth).ok_or(DecapError::TruncatedEthernet)?;
    let l3 = &frame[l3_offset..];
    let ip_error = |error| match error {
        Error::Truncated => DecapError::TruncatedIp,
        Error::Malformed => DecapError::MalformedIp,
    };
    let (src, dst, ttl, tos, l4_offset, l4) = match ethertype {
        EtherType::Ipv4 => {
            let ip = ipv4::Packet::new_checked(l3).map_err(ip_error)?;
            if !ip.verify_checksum() {
                return Err(DecapError::BadIpChecksum);
            }
            if ip.more_frags() || ip.frag_offset() != 0 {
                return Err(DecapError::Fragment);
            }
            if ip.protocol() != IpProtocol::Udp {
                return Err(DecapError::NotUdp);
            }
            let tos = (ip.dscp() << 2) | ip.ecn();
            let l4_offset = l3_offset + usize::from(ip.header_len());
            (
                IpAddr::V4(ip.src_addr()),
                IpAddr::V4(ip.dst_addr()),
                ip.ttl(),
                tos,
                l4_offset,
                ip.payload(),
            )
        }
        EtherType::Ipv6 => {
            let ip = ipv6::Packet::new_checked(l3).map_err(ip_error)?;
            let walk = ipv6_ext::walk(&ip).map_err(ip_error)?;
            if walk.is_fragment() {
                return Err(DecapError::Fragment);
            }
            if walk.protocol != IpProtocol::Udp {
                return Err(DecapError::NotUdp);
            }
            let l4 = ip
                .payload()
                .get(walk.offset - ipv6::HEADER_LEN..)
                .ok_or(DecapError::TruncatedIp)?;
            (
                IpAddr::V6(ip.src_addr()),
                IpAddr::V6(ip.dst_addr()),
                ip.hop_limit(),
                ip.traffic_class(),
                l3_offset + walk.offset,
                l4,
            )
        }
        _ => return Err(DecapError::NotIp),
    };
    // The UDP length, not the IP payload length, delimits the datagram and goes into the
    // pseudo-header.
    let datagram = udp::Packet::new_checked(l4).map_err(|_| DecapError::TruncatedUdp)?;
    if datagram.dst_port() != dst_port {
        return Err(DecapError::WrongPort);
    }
    let udp_len = datagram.len();
    let checksum_present = datagram.checksum() != 0;
    let pseudo_header = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            checksum_present.then(|| pseudo_header_v4(s, d, IpProtocol::Udp, udp_len))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            if !checksum_present {
                return Err(DecapError::ZeroUdpChecksum);
            }
            Some(pseudo_header_v6(s, d, IpProtocol::Udp, u32::from(udp_len)))
        }
        _ => None,
    };
    if let Some(pseudo_header) = pseudo_header {
        if !datagram.verify_checksum(pseudo_header) {
            return Err(DecapError::BadUdpChecksum);
        }
    }
    let header = Header::new_checked(datagram.payload()).map_err(|_| DecapError::TruncatedVxlan)?;
    if !header.vni_valid() {
        return Err(DecapError::NoVniFlag);
    }
    let inner = header.payload();
    if inner.len() < ethernet::HEADER_LEN {
        return Err(DecapError::InnerTooShort);
    }
    Ok(Decap {
        vni: header.vni(),
        inner,
        inner_offset: l4_offset + UDP_VXLAN_LEN,
        outer_src_mac: eth.src_addr(),
        outer_dst_mac: eth.dst_addr(),
        outer_vlan,
        src,
        dst,
        ttl,
        tos,
        src_port: datagram.src_port(),
        dst_port: datagram.dst_port(),
        udp_checksum: checksum_present,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{TCP_SYN, UDP4, UDP6};
    use proptest::prelude::*;

    // Captured with tcpdump on a veth between two network namespaces; the sender was Linux
    // 6.x's vxlan device (`dstport 4789`, transmit checksum offload off on the veth), the inner
    // frames ICMP echo requests. Outer MACs 52:54:00:00:00:0a -> 52:54:00:00:00:0b,
    // 192.0.2.1 -> 192.0.2.2, 2001:db8::1 -> 2001:db8::2. tcpdump verified the checksums.

    /// IPv4 underlay, `noudpcsum` (UDP checksum 0), VNI 100, UDP source port 53686.
    static LINUX_V4: [u8; 108] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0a, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x5e, 0xd5, 0xf0, 0x00, 0x00, 0x40, 0x11, 0x20, 0x9b, 0xc0, 0x00, 0x02, 0x01,
        0xc0, 0x00, 0x02, 0x02, 0xd1, 0xb6, 0x12, 0xb5, 0x00, 0x4a, 0x00, 0x00, 0x08, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x64, 0x00, 0x02, 0x00, 0x00, 0x00, 0x04, 0x02, 0x02, 0x00, 0x00, 0x00,
        0x04, 0x01, 0x08, 0x00, 0x45, 0x00, 0x00, 0x2c, 0xd5, 0x7c, 0x40, 0x00, 0x40, 0x01, 0x51,
        0x4a, 0x0a, 0x04, 0x00, 0x01, 0x0a, 0x04, 0x00, 0x02, 0x08, 0x00, 0x5a, 0x8b, 0x1d, 0xf9,
        0x00, 0x01, 0x73, 0x0a, 0x05, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x06, 0x05, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x00,
    ];

    /// IPv6 underlay (UDP checksum 0xfbd8, computed by Linux), VNI 200, source port 44371.
    static LINUX_V6: [u8; 128] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0a, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x4a, 0x11, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xad, 0x53, 0x12, 0xb5, 0x00, 0x4a,
        0xfb, 0xd8, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc8, 0x00, 0x02, 0x00, 0x00, 0x00, 0x06,
        0x02, 0x02, 0x00, 0x00, 0x00, 0x06, 0x01, 0x08, 0x00, 0x45, 0x00, 0x00, 0x2c, 0xc7, 0x8d,
        0x40, 0x00, 0x40, 0x01, 0x5f, 0x35, 0x0a, 0x06, 0x00, 0x01, 0x0a, 0x06, 0x00, 0x02, 0x08,
        0x00, 0x90, 0x59, 0x1e, 0x06, 0x00, 0x01, 0x74, 0x0a, 0x05, 0x6b, 0x00, 0x00, 0x00, 0x00,
        0xcf, 0x29, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    /// IPv4 underlay, `udpcsum` (UDP checksum 0x7c67), VNI 300, source port 42033.
    static LINUX_V4_CSUM: [u8; 108] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0a, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x5e, 0xd6, 0x2b, 0x00, 0x00, 0x40, 0x11, 0x20, 0x60, 0xc0, 0x00, 0x02, 0x01,
        0xc0, 0x00, 0x02, 0x02, 0xa4, 0x31, 0x12, 0xb5, 0x00, 0x4a, 0x7c, 0x67, 0x08, 0x00, 0x00,
        0x00, 0x00, 0x01, 0x2c, 0x00, 0x02, 0x00, 0x00, 0x00, 0x04, 0x04, 0x02, 0x00, 0x00, 0x00,
        0x04, 0x03, 0x08, 0x00, 0x45, 0x00, 0x00, 0x2c, 0x3a, 0xd0, 0x40, 0x00, 0x40, 0x01, 0xeb,
        0xf8, 0x0a, 0x03, 0x00, 0x01, 0x0a, 0x03, 0x00, 0x02, 0x08, 0x00, 0xf1, 0x2b, 0x1e, 0x0e,
        0x00, 0x01, 0x75, 0x0a, 0x05, 0x6b, 0x00, 0x00, 0x00, 0x00, 0x6d, 0x4f, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x00,
    ];

    const MAC_A: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0a]);
    const MAC_B: MacAddr = MacAddr([0x52, 0x54, 0, 0, 0, 0x0b]);
    const V4: Underlay = Underlay::V4 {
        src: Ipv4Addr::new(192, 0, 2, 1),
        dst: Ipv4Addr::new(192, 0, 2, 2),
    };
    const V6: Underlay = Underlay::V6 {
        src: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        dst: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
    };

    fn encap(underlay: Underlay, vni: u32, src_port: u16, udp_checksum: bool) -> Encap {
        Encap {
            src_mac: MAC_A,
            dst_mac: MAC_B,
            underlay,
            src_port,
            dst_port: UDP_PORT,
            vni: Vni::new(vni).unwrap(),
            ttl: 64,
            tos: 0,
            udp_checksum,
        }
    }

    /// Encapsulates `inner` into a new frame.
    fn encapsulate(encap: &Encap, inner: &[u8]) -> Vec<u8> {
        let mut buffer = vec![0xee; 128 + inner.len()];
        buffer[128..].copy_from_slice(inner);
        let start = encap.write_in_place(&mut buffer, 128).unwrap();
        assert_eq!(start, 128 - encap.overhead());
        buffer.split_off(start)
    }

    #[test]
    fn overheads() {
        assert_eq!((OVERHEAD_V4, OVERHEAD_V6), (50, 70));
        assert_eq!(encap(V4, 1, 1, false).overhead(), 50);
        assert_eq!(encap(V6, 1, 1, false).overhead(), 70);
    }

    #[test]
    fn accepts_what_linux_sends() {
        let v4 = decap(&LINUX_V4).unwrap();
        assert_eq!(v4.vni, Vni::new(100).unwrap());
        assert_eq!(v4.inner, &LINUX_V4[50..]);
        assert_eq!(v4.inner_offset, 50);
        assert_eq!((v4.outer_src_mac, v4.outer_dst_mac), (MAC_A, MAC_B));
        assert_eq!(v4.src, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!(v4.dst, IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2)));
        assert_eq!((v4.src_port, v4.dst_port), (53686, 4789));
        assert_eq!((v4.ttl, v4.tos, v4.outer_vlan), (64, 0, None));
        assert!(!v4.udp_checksum);

        let v6 = decap(&LINUX_V6).unwrap();
        assert_eq!(v6.vni, Vni::new(200).unwrap());
        assert_eq!(v6.inner, &LINUX_V6[70..]);
        assert_eq!(v6.src, IpAddr::V6("2001:db8::1".parse().unwrap()));
        assert_eq!((v6.src_port, v6.ttl), (44371, 64));
        assert!(v6.udp_checksum);

        let v4 = decap(&LINUX_V4_CSUM).unwrap();
        assert_eq!((v4.vni.get(), v4.src_port), (300, 42033));
        assert!(v4.udp_checksum);
    }

    #[test]
    fn writes_what_linux_writes() {
        // IPv6: byte for byte (Linux leaves the flow label 0 here, as we do).
        let frame = encapsulate(&encap(V6, 200, 44371, false), &LINUX_V6[70..]);
        assert_eq!(frame, LINUX_V6);

        // IPv4: Linux sets a random identification and no DF; we set DF and identification
        // 0. Everything else, the UDP checksum included, is the same.
        for (linux, vni, port, csum) in [
            (&LINUX_V4, 100, 53686, false),
            (&LINUX_V4_CSUM, 300, 42033, true),
        ] {
            let frame = encapsulate(&encap(V4, vni, port, csum), &linux[50..]);
            assert_eq!(frame.len(), linux.len());
            assert_eq!(&frame[..18], &linux[..18]);
            assert_eq!(&frame[18..22], &[0, 0, 0x40, 0]);
            assert_eq!(&frame[22..24], &linux[22..24]);
            assert_eq!(&frame[26..], &linux[26..]);
            assert!(ipv4::Packet::new_checked(&frame[14..])
                .unwrap()
                .verify_checksum());
        }
    }

    #[test]
    fn round_trips() {
        for inner in [&UDP4[..], &UDP6, &TCP_SYN, &UDP4[..14]] {
            for (underlay, csum) in [(V4, false), (V4, true), (V6, false)] {
                let mut encap = encap(underlay, MAX_VNI, src_port(0x1234_5678), csum);
                encap.tos = 0xb8;
                encap.ttl = 17;
                let frame = encapsulate(&encap, inner);
                let decap = decap(&frame).unwrap();
                assert_eq!(decap.inner, inner);
                assert_eq!(decap.vni.get(), MAX_VNI);
                assert_eq!((decap.ttl, decap.tos), (17, 0xb8));
                assert_eq!(decap.src_port, encap.src_port);
                assert_eq!(
                    decap.udp_checksum,
                    csum || matches!(underlay, Underlay::V6 { .. })
                );
                // Ethernet padding after the datagram is not part of the inner frame.
                let mut padded = frame.clone();
                padded.extend_from_slice(&[0; 7]);
                assert_eq!(decap_port(&padded, UDP_PORT).unwrap().inner, inner);
            }
        }
    }

    #[test]
    fn write_errors() {
        let e = encap(V4, 1, 1, true);
        let mut headroom = [0u8; 49];
        assert_eq!(e.write(&mut headroom, &UDP4), Err(EncapError::NoHeadroom));
        let mut headroom = [0u8; 60];
        assert_eq!(e.write(&mut headroom, &UDP4), Ok(10));
        assert_eq!(
            e.write(&mut headroom, &UDP4[..13]),
            Err(EncapError::InnerTooShort)
        );
        let big = vec![0u8; 65_535 - 20 - 16 + 1];
        assert_eq!(e.write(&mut headroom, &big), Err(EncapError::TooLong));
        assert_eq!(e.write(&mut headroom, &big[1..]), Ok(10));
        // Over IPv6 the payload length excludes the IPv6 header.
        let e6 = encap(V6, 1, 1, false);
        let mut headroom = [0u8; 70];
        assert_eq!(e6.write(&mut headroom, &big), Ok(0));
        let bigger = vec![0u8; 65_535 - 16 + 1];
        assert_eq!(e6.write(&mut headroom, &bigger), Err(EncapError::TooLong));
        let mut buffer = [0u8; 10];
        assert_eq!(
            e.write_in_place(&mut buffer, 11),
            Err(EncapError::InnerTooShort)
        );
    }

    #[test]
    fn header_view() {
        let mut bytes = [0xffu8; 8];
        let mut header = Header::new_checked(&mut bytes[..]).unwrap();
        header.emit(Vni::new(0xabcdef).unwrap());
        assert_eq!(bytes, [0x08, 0, 0, 0, 0xab, 0xcd, 0xef, 0]);
        // Reserved bits are ignored on receive.
        let header = Header::new_checked(&[0xff, 0xff, 0xff, 0xff, 0, 0, 5, 0xff][..]).unwrap();
        assert!(header.vni_valid());
        assert_eq!((header.flags(), header.vni().get()), (0xff, 5));
        assert!(header.payload().is_empty());
        assert_eq!(Header::new_checked(&[0u8; 7][..]), Err(Error::Truncated));
        assert_eq!(Vni::new(MAX_VNI + 1), None);
    }

    #[test]
    fn reserved_bits_ignored_on_receive() {
        let mut frame = encapsulate(&encap(V4, 7, 50000, false), &UDP4);
        frame[42] = 0xff;
        frame[43..46].fill(0xff);
        frame[49] = 0xff;
        let decap = decap(&frame).unwrap();
        assert_eq!((decap.vni.get(), decap.inner), (7, &UDP4[..]));
    }

    #[test]
    fn src_port_range() {
        for hash in [
            0,
            1,
            0x3fff,
            0x4000,
            0xffff,
            0xffff_0000,
            u32::MAX,
            0x1234_5678,
        ] {
            assert!(src_port(hash) >= SRC_PORT_MIN);
        }
        // Both halves of the hash count.
        assert_ne!(src_port(0x0001_0000), src_port(0));
        assert_ne!(src_port(1), src_port(0));
        // The low 14 bits alone reach every port.
        let ports: std::collections::HashSet<u16> = (0..0x4000).map(src_port).collect();
        assert_eq!(ports.len(), 16384);
    }

    /// Sets the IPv4 header checksum of a frame built by `encapsulate` again.
    fn refill_ip(frame: &mut [u8]) {
        ipv4::Packet::new_unchecked(&mut frame[14..34]).fill_checksum();
    }

    #[test]
    fn drop_reasons() {
        use DecapError::*;
        let v4 = encapsulate(&encap(V4, 1, 50000, true), &UDP4);
        let v6 = encapsulate(&encap(V6, 1, 50000, false), &UDP4);
        assert_eq!(decap(&v4[..13]), Err(TruncatedEthernet));
        assert_eq!(decap(&[]), Err(TruncatedEthernet));
        // A truncated outer 802.1Q tag.
        let tagged = [&v4[..12], &[0x81, 0x00, 0x00, 0x64], &v4[12..]].concat();
        assert_eq!(decap(&tagged[..17]), Err(TruncatedEthernet));
        let ok = decap(&tagged).unwrap();
        assert_eq!((ok.outer_vlan, ok.inner_offset), (Some(100), 54));

        assert_eq!(decap(&UDP4[..0x20]).err(), Some(TruncatedIp));
        assert_eq!(decap(&crate::testdata::ARP_REQUEST), Err(NotIp));
        assert_eq!(decap(&v4[..33]), Err(TruncatedIp));
        assert_eq!(decap(&v4[..v4.len() - 1]), Err(TruncatedIp));
        assert_eq!(decap(&v6[..v6.len() - 1]), Err(TruncatedIp));
        let mut bad = v4.clone();
        bad[14] = 0x44;
        assert_eq!(decap(&bad), Err(MalformedIp));
        let mut bad = v6.clone();
        bad[14] = 0x40;
        assert_eq!(decap(&bad), Err(MalformedIp));

        let mut bad = v4.clone();
        bad[22] = 63;
        assert_eq!(decap(&bad), Err(BadIpChecksum));

        for (flags, offset) in [(0x20u8, 0u8), (0x00, 1), (0x3f, 0xff)] {
            let mut bad = v4.clone();
            bad[20] = flags;
            bad[21] = offset;
            refill_ip(&mut bad);
            assert_eq!(decap(&bad), Err(Fragment));
        }
        // An IPv6 first fragment (offset 0, M set); an atomic fragment is accepted.
        let frag = |more: u8| {
            let mut frame = [&v6[..54], &[17, 0, 0, more, 1, 2, 3, 4], &v6[54..]].concat();
            frame[18..20].copy_from_slice(&(v6.len() as u16 - 54 + 8).to_be_bytes());
            frame[20] = 44;
            frame
        };
        assert_eq!(decap(&frag(1)), Err(Fragment));
        assert_eq!(decap(&frag(0)).unwrap().inner, &UDP4[..]);

        assert_eq!(decap(&TCP_SYN), Err(NotUdp));
        let mut bad = v6.clone();
        bad[20] = 6;
        assert_eq!(decap(&bad), Err(NotUdp));

        // A UDP length below 8, and beyond the IP payload.
        for len in [7u16, v4.len() as u16 - 34 + 1] {
            let mut bad = v4.clone();
            bad[38..40].copy_from_slice(&len.to_be_bytes());
            assert_eq!(decap(&bad), Err(TruncatedUdp));
        }
        // An IP packet too short for the UDP header.
        let mut bad = v4[..40].to_vec();
        bad[16..18].copy_from_slice(&26u16.to_be_bytes());
        refill_ip(&mut bad);
        assert_eq!(decap(&bad), Err(TruncatedUdp));

        assert_eq!(decap_port(&v4, 8472), Err(WrongPort));
        assert_eq!(decap(&UDP6), Err(WrongPort));

        let mut bad = v4.clone();
        bad[60] ^= 1;
        assert_eq!(decap(&bad), Err(BadUdpChecksum));
        let mut bad = v6.clone();
        bad[80] ^= 1;
        assert_eq!(decap(&bad), Err(BadUdpChecksum));
        let mut bad = v6.clone();
        bad[60..62].fill(0);
        assert_eq!(decap(&bad), Err(ZeroUdpChecksum));

        // UDP4 goes to port 4789 with a payload that is no VXLAN header: its first byte,
        // 'q', has the I flag clear.
        assert_eq!(decap(&UDP4), Err(NoVniFlag));
        let mut bad = v4.clone();
        bad[42] = 0;
        bad[40..42].fill(0);
        assert_eq!(decap(&bad), Err(NoVniFlag));

        let short = encapsulate(&encap(V4, 1, 50000, true), &UDP4[..14]);
        assert!(decap(&short).is_ok());
        let mut bad = short.clone();
        for (at, len) in [(16, 20 + 8 + 8 + 13), (38, 8 + 8 + 13)] {
            bad[at..at + 2].copy_from_slice(&(len as u16).to_be_bytes());
        }
        bad[40..42].fill(0);
        refill_ip(&mut bad);
        assert_eq!(decap(&bad[..63]), Err(InnerTooShort));
        for (at, len) in [(16, 20 + 8 + 7), (38, 8 + 7)] {
            bad[at..at + 2].copy_from_slice(&(len as u16).to_be_bytes());
        }
        refill_ip(&mut bad);
        assert_eq!(decap(&bad[..49]), Err(TruncatedVxlan));
    }

    #[test]
    fn reasons_are_distinct() {
        let reasons: std::collections::HashSet<&str> =
            DecapError::ALL.iter().map(|e| e.reason()).collect();
        assert_eq!(reasons.len(), DecapError::ALL.len());
        assert_eq!(DecapError::NoVniFlag.to_string(), "i_flag_clear");
    }

    proptest! {
        #[test]
        fn never_panics(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(d) = decap(&frame) {
                prop_assert!(d.inner_offset + d.inner.len() <= frame.len());
            }
        }

        #[test]
        fn mangled_never_panics(
            v6 in any::<bool>(),
            csum in any::<bool>(),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            cut in any::<prop::sample::Index>(),
        ) {
            let mut frame = encapsulate(&encap(if v6 { V6 } else { V4 }, 9, 50000, csum), &UDP4);
            for (at, byte) in edits {
                let at = at.index(frame.len());
                frame[at] = byte;
            }
            frame.truncate(cut.index(frame.len() + 1));
            if let Ok(d) = decap(&frame) {
                prop_assert_eq!(&frame[d.inner_offset..d.inner_offset + d.inner.len()], d.inner);
            }
        }

        #[test]
        fn round_trip_any_inner(
            inner in proptest::collection::vec(any::<u8>(), 14..300),
            vni in 0..=MAX_VNI,
            hash in any::<u32>(),
            v6 in any::<bool>(),
            csum in any::<bool>(),
        ) {
            let e = encap(if v6 { V6 } else { V4 }, vni, src_port(hash), csum);
            let frame = encapsulate(&e, &inner);
            let d = decap(&frame).unwrap();
            prop_assert_eq!(d.inner, &inner[..]);
            prop_assert_eq!(d.vni.get(), vni);
        }
    }
}
