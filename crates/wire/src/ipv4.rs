//! IPv4 packets (RFC 791).
//!
//! [`Packet`] views the header, including its options, and the payload up to the total length,
//! which excludes Ethernet padding. Options are not interpreted. Fragments are not reassembled:
//! [`Packet::frag_offset`] and [`Packet::more_frags`] tell them apart.
//!
//! The setters cover the fields a switch may rewrite (DSCP/ECN remarking, TTL, addresses); after
//! changing header fields, call [`Packet::fill_checksum`].

use core::net::Ipv4Addr;

use crate::checksum;
use crate::{read_array, read_u16, write_u16, Error, IpProtocol, Result};

mod field {
    use crate::Field;

    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12;
    pub const SRC_ADDR: Field = 12..16;
    pub const DST_ADDR: Field = 16..20;
}

/// Length of the header without options.
pub const HEADER_LEN: usize = field::DST_ADDR.end;

const FLAG_DF: u16 = 0x4000;
const FLAG_MF: u16 = 0x2000;
const OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet.
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

    /// Checks that the buffer holds a whole packet: at least [`HEADER_LEN`] bytes, version 4,
    /// a header length of at least 20 and at most the total length ([`Error::Malformed`]
    /// otherwise), and at least the total length in bytes ([`Error::Truncated`] otherwise).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let header_len = usize::from(self.header_len());
        let total_len = usize::from(self.total_len());
        if self.version() != 4 || header_len < HEADER_LEN || total_len < header_len {
            return Err(Error::Malformed);
        }
        if len < total_len {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The version field (4 for a packet that passed `check_len`).
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// The header length in bytes, options included.
    pub fn header_len(&self) -> u8 {
        (self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// The differentiated services code point.
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// The explicit congestion notification bits.
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 0x03
    }

    /// The total length of header and payload.
    pub fn total_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// The identification field.
    pub fn ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::IDENT)
    }

    /// The don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLG_OFF) & FLAG_DF != 0
    }

    /// The more-fragments flag.
    pub fn more_frags(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLG_OFF) & FLAG_MF != 0
    }

    /// The fragment offset, in bytes. Non-zero for every fragment but the first.
    pub fn frag_offset(&self) -> u16 {
        (read_u16(self.buffer.as_ref(), field::FLG_OFF) & OFFSET_MASK) << 3
    }

    /// The time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// The protocol of the payload.
    pub fn protocol(&self) -> IpProtocol {
        self.buffer.as_ref()[field::PROTOCOL].into()
    }

    /// The header checksum.
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The source address.
    pub fn src_addr(&self) -> Ipv4Addr {
        read_array::<4>(self.buffer.as_ref(), field::SRC_ADDR).into()
    }

    /// The destination address.
    pub fn dst_addr(&self) -> Ipv4Addr {
        read_array::<4>(self.buffer.as_ref(), field::DST_ADDR).into()
    }

    /// Whether the header checksum is correct.
    pub fn verify_checksum(&self) -> bool {
        let header = &self.buffer.as_ref()[..usize::from(self.header_len())];
        checksum::fold(checksum::sum16(header, 0)) == 0
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The options, between the fixed header and the payload.
    pub fn options(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.header_len())]
    }

    /// The payload: from the end of the header to the total length.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[usize::from(self.header_len())..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the differentiated services code point (its low 6 bits).
    pub fn set_dscp(&mut self, dscp: u8) {
        debug_assert!(dscp < 64, "DSCP {dscp} does not fit in 6 bits");
        let byte = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *byte = (dscp << 2) | (*byte & 0x03);
    }

    /// Sets the explicit congestion notification bits (their low 2 bits).
    pub fn set_ecn(&mut self, ecn: u8) {
        debug_assert!(ecn < 4, "ECN {ecn} does not fit in 2 bits");
        let byte = &mut self.buffer.as_mut()[field::DSCP_ECN];
        *byte = (*byte & !0x03) | (ecn & 0x03);
    }

    /// Sets the total length.
    pub fn set_total_len(&mut self, len: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Sets the identification field.
    pub fn set_ident(&mut self, ident: u16) {
        write_u16(self.buffer.as_mut(), field::IDENT, ident);
    }

    /// Sets the time to live.
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    /// Sets the protocol of the payload.
    pub fn set_protocol(&mut self, protocol: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = protocol.into();
    }

    /// Sets the header checksum.
    pub fn set_checksum(&mut self, checksum: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, checksum);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&addr.octets());
    }

    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&addr.octets());
    }

    /// Computes the header checksum and stores it.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let header_len = usize::from(self.header_len());
        let checksum = checksum::fold(checksum::sum16(&self.buffer.as_ref()[..header_len], 0));
        self.set_checksum(checksum);
    }

    /// The payload, mutably: from the end of the header to the total length.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = usize::from(self.header_len())..usize::from(self.total_len());
        &mut self.buffer.as_mut()[range]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{TCP_SYN, UDP4};

    const IP: core::ops::RangeFrom<usize> = 14..;

    #[test]
    fn tcp_syn() {
        let ip = Packet::new_checked(&TCP_SYN[IP]).unwrap();
        assert_eq!(ip.version(), 4);
        assert_eq!(ip.header_len(), 20);
        assert_eq!((ip.dscp(), ip.ecn()), (0, 0));
        assert_eq!(ip.total_len(), 60);
        assert_eq!(ip.ident(), 0xd569);
        assert!(ip.dont_frag() && !ip.more_frags());
        assert_eq!(ip.frag_offset(), 0);
        assert_eq!(ip.ttl(), 64);
        assert_eq!(ip.protocol(), IpProtocol::Tcp);
        assert_eq!(ip.checksum(), 0x5150);
        assert!(ip.verify_checksum());
        assert_eq!(ip.src_addr(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(ip.dst_addr(), Ipv4Addr::new(10, 0, 0, 2));
        assert!(ip.options().is_empty());
        assert_eq!(ip.payload(), &TCP_SYN[34..]);
    }

    #[test]
    fn payload_excludes_padding() {
        let mut padded = [0; 80];
        padded[..60].copy_from_slice(&TCP_SYN[IP]);
        let ip = Packet::new_checked(&padded[..]).unwrap();
        assert_eq!(ip.payload(), &TCP_SYN[34..]);
    }

    #[test]
    fn options_and_fragment_fields() {
        // The UDP header with a 4-byte option (NOP, NOP, NOP, EOL) and the fragment fields of
        // a middle fragment at offset 1480; checksum recomputed.
        let mut bytes = [0; 24];
        bytes[..20].copy_from_slice(&UDP4[14..34]);
        bytes[0] = 0x46;
        bytes[20..].copy_from_slice(&[1, 1, 1, 0]);
        bytes[2..4].copy_from_slice(&24u16.to_be_bytes());
        bytes[6..8].copy_from_slice(&(0x2000u16 | 185).to_be_bytes());
        let mut ip = Packet::new_checked(&mut bytes[..]).unwrap();
        ip.fill_checksum();
        let ip = Packet::new_checked(&bytes[..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.header_len(), 24);
        assert_eq!(ip.options(), &[1, 1, 1, 0]);
        assert!(ip.payload().is_empty());
        assert!(ip.more_frags() && !ip.dont_frag());
        assert_eq!(ip.frag_offset(), 1480);
    }

    #[test]
    fn truncated_and_malformed() {
        assert_eq!(Packet::new_checked(&TCP_SYN[14..33]), Err(Error::Truncated));
        assert_eq!(Packet::new_checked(&TCP_SYN[14..73]), Err(Error::Truncated));
        for (at, value) in [(0, 0x65), (0, 0x44), (3, 19)] {
            let mut bytes = TCP_SYN;
            bytes[14 + at] = value;
            assert_eq!(
                Packet::new_checked(&bytes[IP]),
                Err(Error::Malformed),
                "byte {at} = {value:#x}"
            );
        }
    }

    #[test]
    fn rewrite_and_fill_checksum() {
        let mut bytes = TCP_SYN;
        let mut ip = Packet::new_checked(&mut bytes[IP]).unwrap();
        ip.set_dscp(46);
        ip.set_ecn(2);
        ip.set_ttl(63);
        ip.set_ident(1);
        ip.set_src_addr(Ipv4Addr::new(192, 0, 2, 1));
        ip.set_dst_addr(Ipv4Addr::new(198, 51, 100, 7));
        ip.set_protocol(IpProtocol::Udp);
        ip.set_total_len(40);
        ip.payload_mut().fill(0xaa);
        assert!(!ip.verify_checksum());
        ip.fill_checksum();
        assert!(ip.verify_checksum());
        assert_eq!((ip.dscp(), ip.ecn(), ip.ttl(), ip.ident()), (46, 2, 63, 1));
        assert_eq!(ip.src_addr(), Ipv4Addr::new(192, 0, 2, 1));
        assert_eq!(ip.dst_addr(), Ipv4Addr::new(198, 51, 100, 7));
        assert_eq!(ip.protocol(), IpProtocol::Udp);
        assert_eq!(&bytes[34..54], &[0xaa; 20]);
        assert_eq!(&bytes[54..], &TCP_SYN[54..]);

        // Back to the captured values, the captured checksum comes back.
        let mut bytes = TCP_SYN;
        let mut ip = Packet::new_checked(&mut bytes[IP]).unwrap();
        ip.set_checksum(0);
        ip.fill_checksum();
        assert_eq!(ip.checksum(), 0x5150);
    }
}
