//! UDP datagrams (RFC 768).
//!
//! [`Packet`] views the 8-byte header and the payload up to the UDP length field. As for TCP,
//! checksums take the pseudo-header sum, from [`checksum::pseudo_header_v4`] or
//! [`checksum::pseudo_header_v6`], for the datagram's length.
//!
//! Over IPv4 a checksum of 0 means none was computed; [`Packet::verify_checksum`] does not
//! special-case it, so check [`Packet::checksum`] first where that matters.

use crate::checksum;
use crate::{read_u16, write_u16, Error, Result};

mod field {
    use crate::Field;

    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const LENGTH: Field = 4..6;
    pub const CHECKSUM: Field = 6..8;
}

/// Length of the header.
pub const HEADER_LEN: usize = field::CHECKSUM.end;

/// A view of a UDP datagram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

// `len` reads the length field; the view is no collection to be empty.
#[allow(clippy::len_without_is_empty)]
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

    /// Checks that the buffer holds the whole datagram: at least [`HEADER_LEN`] bytes and the
    /// length field ([`Error::Truncated`] otherwise), which must be at least 8
    /// ([`Error::Malformed`] otherwise).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let datagram_len = usize::from(self.len());
        if datagram_len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < datagram_len {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The source port.
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    /// The destination port.
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    /// The length field: header and payload.
    pub fn len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    /// The checksum.
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Whether the checksum is correct, given the pseudo-header sum for this datagram's length.
    pub fn verify_checksum(&self, pseudo_header: u32) -> bool {
        let datagram = &self.buffer.as_ref()[..usize::from(self.len())];
        checksum::fold(checksum::sum16(datagram, pseudo_header)) == 0
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload, up to the length field.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    pub fn set_src_port(&mut self, port: u16) {
        write_u16(self.buffer.as_mut(), field::SRC_PORT, port);
    }

    /// Sets the destination port.
    pub fn set_dst_port(&mut self, port: u16) {
        write_u16(self.buffer.as_mut(), field::DST_PORT, port);
    }

    /// Sets the length field.
    pub fn set_len(&mut self, len: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, len);
    }

    /// Sets the checksum.
    pub fn set_checksum(&mut self, checksum: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, checksum);
    }

    /// Computes the checksum over the datagram and stores it, given the pseudo-header sum for
    /// this datagram's length. A result of 0 is stored as `0xffff` (RFC 768).
    pub fn fill_checksum(&mut self, pseudo_header: u32) {
        self.set_checksum(0);
        let datagram = &self.buffer.as_ref()[..usize::from(self.len())];
        let checksum = match checksum::fold(checksum::sum16(datagram, pseudo_header)) {
            0 => 0xffff,
            checksum => checksum,
        };
        self.set_checksum(checksum);
    }

    /// The payload, mutably, up to the length field.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = usize::from(self.len());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

#[cfg(test)]
mod tests {
    use core::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::checksum::{pseudo_header_v4, pseudo_header_v6};
    use crate::testdata::{UDP4, UDP6};
    use crate::IpProtocol;

    fn pseudo_header_4(len: u16) -> u32 {
        let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        pseudo_header_v4(src, dst, IpProtocol::Udp, len)
    }

    #[test]
    fn ipv4_datagram() {
        let udp = Packet::new_checked(&UDP4[34..]).unwrap();
        assert_eq!(udp.src_port(), 40000);
        assert_eq!(udp.dst_port(), 4789);
        assert_eq!(udp.len(), 30);
        assert_eq!(udp.checksum(), 0x35cc);
        assert!(udp.verify_checksum(pseudo_header_4(30)));
        assert_eq!(udp.payload(), b"qswitch-wire-bench-64B");
    }

    #[test]
    fn ipv6_datagram() {
        let udp = Packet::new_checked(&UDP6[54..]).unwrap();
        assert_eq!((udp.src_port(), udp.dst_port()), (40001, 53));
        assert_eq!(udp.checksum(), 0x6016);
        let src: Ipv6Addr = "fd00::1".parse().unwrap();
        let dst: Ipv6Addr = "fd00::2".parse().unwrap();
        assert!(udp.verify_checksum(pseudo_header_v6(src, dst, IpProtocol::Udp, 21)));
        assert_eq!(udp.payload(), b"hello qswitch");
    }

    #[test]
    fn payload_excludes_trailing_bytes() {
        let mut bytes = UDP4[34..].to_vec();
        bytes.extend_from_slice(&[0; 6]);
        let udp = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(udp.payload(), b"qswitch-wire-bench-64B");
        assert!(udp.verify_checksum(pseudo_header_4(30)));
    }

    #[test]
    fn truncated_and_malformed() {
        assert_eq!(Packet::new_checked(&UDP4[34..41]), Err(Error::Truncated));
        assert_eq!(Packet::new_checked(&UDP4[34..63]), Err(Error::Truncated));
        let mut bytes = UDP4;
        bytes[39] = 7;
        assert_eq!(Packet::new_checked(&bytes[34..]), Err(Error::Malformed));
    }

    #[test]
    fn rewrite_and_fill_checksum() {
        let mut bytes = UDP4;
        let mut udp = Packet::new_checked(&mut bytes[34..]).unwrap();
        udp.set_src_port(5000);
        udp.set_dst_port(5001);
        udp.payload_mut()[0] = b'Q';
        assert!(!udp.verify_checksum(pseudo_header_4(30)));
        udp.fill_checksum(pseudo_header_4(30));
        assert!(udp.verify_checksum(pseudo_header_4(30)));

        // Shrunk to the header alone.
        udp.set_len(8);
        assert!(udp.payload_mut().is_empty());
        udp.fill_checksum(pseudo_header_4(8));
        assert!(udp.verify_checksum(pseudo_header_4(8)));

        let mut bytes = UDP4;
        let mut udp = Packet::new_checked(&mut bytes[34..]).unwrap();
        udp.set_checksum(0);
        udp.fill_checksum(pseudo_header_4(30));
        assert_eq!(udp.checksum(), 0x35cc);
    }
}
