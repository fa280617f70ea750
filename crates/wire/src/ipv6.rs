//! IPv6 packets (RFC 8200).
//!
//! [`Packet`] views the fixed 40-byte header and the payload up to the payload length, which
//! excludes Ethernet padding. [`Packet::upper_layer`] walks the Hop-by-Hop, Routing,
//! Destination Options and Fragment extension headers, at most [`MAX_EXT_HEADERS`] of them, to
//! find the upper-layer header; options inside them are not interpreted.
//!
//! Limitations: jumbograms (payload length 0 with a Jumbo Payload option) read as an empty
//! payload; AH, ESP and other headers end the walk and are reported as the upper layer.

use core::net::Ipv6Addr;

use crate::{read_array, read_u16, read_u32, write_u16, Error, IpProtocol, Result};

mod field {
    use crate::Field;

    pub const VER_TC_FLOW: Field = 0..4;
    pub const LENGTH: Field = 4..6;
    pub const NXT_HDR: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Field = 8..24;
    pub const DST_ADDR: Field = 24..40;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

/// The most extension headers [`Packet::upper_layer`] skips.
pub const MAX_EXT_HEADERS: usize = 8;

const FRAG_HEADER_LEN: usize = 8;
const FRAG_OFFSET_MASK: u16 = 0xfff8;
const TC_SHIFT: u32 = 20;
const TC_MASK: u32 = 0x0ff0_0000;
const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// Where the upper-layer header of a packet is, as found by [`Packet::upper_layer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpperLayer {
    /// The last Next Header value: the upper-layer protocol.
    pub protocol: IpProtocol,
    /// Offset of the upper-layer header from the start of the IPv6 header.
    pub offset: usize,
    /// Whether a Fragment header with a non-zero offset was passed: what follows is the middle
    /// or end of the upper-layer packet, not its header.
    pub later_fragment: bool,
}

/// A view of an IPv6 packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; see the crate docs for what that allows.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds a whole packet: the fixed header and the payload length
    /// after it ([`Error::Truncated`] otherwise), with version 6 ([`Error::Malformed`]
    /// otherwise).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if self.version() != 6 {
            return Err(Error::Malformed);
        }
        if len < self.end() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Where the payload ends.
    fn end(&self) -> usize {
        HEADER_LEN + usize::from(self.payload_len())
    }

    /// The version field (6 for a packet that passed `check_len`).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// The traffic class (DSCP in the upper 6 bits, ECN in the lower 2).
    pub fn traffic_class(&self) -> u8 {
        ((read_u32(self.buffer.as_ref(), field::VER_TC_FLOW) & TC_MASK) >> TC_SHIFT) as u8
    }

    /// The 20-bit flow label.
    pub fn flow_label(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::VER_TC_FLOW) & FLOW_LABEL_MASK
    }

    /// The payload length: extension headers and upper-layer packet.
    pub fn payload_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// The Next Header field of the fixed header.
    pub fn next_header(&self) -> IpProtocol {
        self.buffer.as_ref()[field::NXT_HDR].into()
    }

    /// The hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// The source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        read_array::<16>(self.buffer.as_ref(), field::SRC_ADDR).into()
    }

    /// The destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        read_array::<16>(self.buffer.as_ref(), field::DST_ADDR).into()
    }

    /// Skips the extension headers to find the upper-layer header. Fails with
    /// [`Error::Truncated`] if an extension header runs past the payload, and with
    /// [`Error::Malformed`] after [`MAX_EXT_HEADERS`] of them.
    pub fn upper_layer(&self) -> Result<UpperLayer> {
        let data = &self.buffer.as_ref()[..self.end()];
        let mut protocol = self.next_header();
        let mut offset = HEADER_LEN;
        let mut later_fragment = false;
        for skipped in 0..=MAX_EXT_HEADERS {
            let len = match protocol {
                IpProtocol::HopByHop | IpProtocol::Ipv6Route | IpProtocol::Ipv6Opts => {
                    // Hdr Ext Len counts 8-byte units beyond the first.
                    let units = data.get(offset + 1).ok_or(Error::Truncated)?;
                    (usize::from(*units) + 1) * 8
                }
                IpProtocol::Ipv6Frag => FRAG_HEADER_LEN,
                _ => {
                    return Ok(UpperLayer {
                        protocol,
                        offset,
                        later_fragment,
                    })
                }
            };
            if skipped == MAX_EXT_HEADERS {
                break;
            }
            let header = data.get(offset..offset + len).ok_or(Error::Truncated)?;
            if protocol == IpProtocol::Ipv6Frag {
                later_fragment |= read_u16(header, 2..4) & FRAG_OFFSET_MASK != 0;
            }
            protocol = header[0].into();
            offset += len;
        }
        Err(Error::Malformed)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload: extension headers and upper-layer packet, up to the payload length.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..self.end()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the traffic class.
    pub fn set_traffic_class(&mut self, traffic_class: u8) {
        let word = read_u32(self.buffer.as_ref(), field::VER_TC_FLOW) & !TC_MASK;
        let word = word | (u32::from(traffic_class) << TC_SHIFT);
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&word.to_be_bytes());
    }

    /// Sets the payload length.
    pub fn set_payload_len(&mut self, len: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Sets the Next Header field of the fixed header.
    pub fn set_next_header(&mut self, next_header: IpProtocol) {
        self.buffer.as_mut()[field::NXT_HDR] = next_header.into();
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, hop_limit: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = hop_limit;
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&addr.octets());
    }

    /// The payload, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.end();
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{frag6_first, FRAG6_LAST, MLD_REPORT, UDP6};

    const IP: core::ops::RangeFrom<usize> = 14..;

    #[test]
    fn udp() {
        let ip = Packet::new_checked(&UDP6[IP]).unwrap();
        assert_eq!(ip.version(), 6);
        assert_eq!(ip.traffic_class(), 0);
        assert_eq!(ip.flow_label(), 0xb011b);
        assert_eq!(ip.payload_len(), 21);
        assert_eq!(ip.next_header(), IpProtocol::Udp);
        assert_eq!(ip.hop_limit(), 64);
        assert_eq!(ip.src_addr(), "fd00::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(ip.dst_addr(), "fd00::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(ip.payload(), &UDP6[54..]);
        let upper = ip.upper_layer().unwrap();
        assert_eq!(
            upper,
            UpperLayer {
                protocol: IpProtocol::Udp,
                offset: 40,
                later_fragment: false
            }
        );
    }

    #[test]
    fn hop_by_hop_then_icmpv6() {
        let ip = Packet::new_checked(&MLD_REPORT[IP]).unwrap();
        assert_eq!(ip.next_header(), IpProtocol::HopByHop);
        assert_eq!(ip.hop_limit(), 1);
        assert_eq!(ip.dst_addr(), "ff02::16".parse::<Ipv6Addr>().unwrap());
        let upper = ip.upper_layer().unwrap();
        assert_eq!((upper.protocol, upper.offset), (IpProtocol::Icmpv6, 48));
        assert!(!upper.later_fragment);
        // MLDv2 report, type 143.
        assert_eq!(ip.payload()[upper.offset - HEADER_LEN], 143);
    }

    #[test]
    fn fragments() {
        let first = frag6_first();
        let ip = Packet::new_checked(&first[IP]).unwrap();
        assert_eq!(ip.next_header(), IpProtocol::Ipv6Frag);
        let upper = ip.upper_layer().unwrap();
        assert_eq!((upper.protocol, upper.offset), (IpProtocol::Udp, 48));
        assert!(!upper.later_fragment);

        let ip = Packet::new_checked(&FRAG6_LAST[IP]).unwrap();
        let upper = ip.upper_layer().unwrap();
        assert_eq!((upper.protocol, upper.offset), (IpProtocol::Udp, 48));
        assert!(upper.later_fragment);
    }

    /// UDP6 with `count` 8-byte Destination Options headers (PadN) inserted.
    fn with_dest_options(count: usize) -> Vec<u8> {
        let mut packet = UDP6[IP].to_vec();
        let mut next = IpProtocol::Udp;
        for _ in 0..count {
            let header = [next.into(), 0, 1, 4, 0, 0, 0, 0];
            packet = [&packet[..HEADER_LEN], &header, &packet[HEADER_LEN..]].concat();
            next = IpProtocol::Ipv6Opts;
        }
        let mut ip = Packet::new_unchecked(&mut packet[..]);
        ip.set_next_header(next);
        ip.set_payload_len(21 + 8 * count as u16);
        packet
    }

    #[test]
    fn extension_header_limit() {
        let packet = with_dest_options(MAX_EXT_HEADERS);
        let ip = Packet::new_checked(&packet[..]).unwrap();
        let upper = ip.upper_layer().unwrap();
        assert_eq!(upper.protocol, IpProtocol::Udp);
        assert_eq!(upper.offset, HEADER_LEN + 8 * MAX_EXT_HEADERS);

        let packet = with_dest_options(MAX_EXT_HEADERS + 1);
        let ip = Packet::new_checked(&packet[..]).unwrap();
        assert_eq!(ip.upper_layer(), Err(Error::Malformed));
    }

    #[test]
    fn truncated_extension_headers() {
        // The Hop-by-Hop header is 8 bytes long, but the payload length leaves 1, then 7.
        for payload_len in [1, 7] {
            let mut packet = MLD_REPORT[IP].to_vec();
            Packet::new_unchecked(&mut packet[..]).set_payload_len(payload_len);
            let ip = Packet::new_checked(&packet[..]).unwrap();
            assert_eq!(ip.upper_layer(), Err(Error::Truncated));
        }
    }

    #[test]
    fn truncated_and_malformed() {
        assert_eq!(Packet::new_checked(&UDP6[14..53]), Err(Error::Truncated));
        assert_eq!(Packet::new_checked(&UDP6[14..74]), Err(Error::Truncated));
        let mut bytes = UDP6;
        bytes[14] = 0x40;
        assert_eq!(Packet::new_checked(&bytes[IP]), Err(Error::Malformed));
    }

    #[test]
    fn setters() {
        let mut bytes = UDP6;
        let mut ip = Packet::new_checked(&mut bytes[IP]).unwrap();
        ip.set_traffic_class(0xb8);
        ip.set_hop_limit(63);
        ip.set_src_addr("2001:db8::1".parse().unwrap());
        ip.set_dst_addr("2001:db8::2".parse().unwrap());
        ip.payload_mut()[0] = 0;
        assert_eq!(ip.traffic_class(), 0xb8);
        assert_eq!(ip.flow_label(), 0xb011b);
        assert_eq!(ip.version(), 6);
        assert_eq!(ip.hop_limit(), 63);
        assert_eq!(ip.src_addr(), "2001:db8::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(ip.dst_addr(), "2001:db8::2".parse::<Ipv6Addr>().unwrap());
        assert_eq!(bytes[54], 0);
    }
}
