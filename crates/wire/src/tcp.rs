//! TCP segments (RFC 9293).
//!
//! [`Packet`] views the header, its options (not interpreted) and the payload. The buffer must
//! be the segment exactly, e.g. [`ipv4::Packet::payload`](crate::ipv4::Packet::payload), for the
//! checksum helpers to be right. Checksums take the pseudo-header sum from
//! [`checksum::pseudo_header_v4`] or [`checksum::pseudo_header_v6`], so one view serves both IP
//! versions.

use crate::checksum;
use crate::{read_u16, read_u32, write_u16, Error, Result};

mod field {
    use crate::Field;

    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const SEQ_NUM: Field = 4..8;
    pub const ACK_NUM: Field = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WIN_SIZE: Field = 14..16;
    pub const CHECKSUM: Field = 16..18;
    pub const URGENT: Field = 18..20;
}

/// Length of the header without options.
pub const HEADER_LEN: usize = field::URGENT.end;

/// FIN flag, a bit of [`Packet::flags`].
pub const FLAG_FIN: u8 = 0x01;
/// SYN flag.
pub const FLAG_SYN: u8 = 0x02;
/// RST flag.
pub const FLAG_RST: u8 = 0x04;
/// PSH flag.
pub const FLAG_PSH: u8 = 0x08;
/// ACK flag.
pub const FLAG_ACK: u8 = 0x10;
/// URG flag.
pub const FLAG_URG: u8 = 0x20;
/// ECE flag.
pub const FLAG_ECE: u8 = 0x40;
/// CWR flag.
pub const FLAG_CWR: u8 = 0x80;

/// A view of a TCP segment.
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

    /// Checks that the buffer holds the whole header: at least [`HEADER_LEN`] bytes and the
    /// header length ([`Error::Truncated`] otherwise), which must be at least 20
    /// ([`Error::Malformed`] otherwise).
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let header_len = usize::from(self.header_len());
        if header_len < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if len < header_len {
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

    /// The sequence number.
    pub fn seq_number(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SEQ_NUM)
    }

    /// The acknowledgment number.
    pub fn ack_number(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::ACK_NUM)
    }

    /// The header length in bytes (data offset times 4), options included.
    pub fn header_len(&self) -> u8 {
        (self.buffer.as_ref()[field::DATA_OFF] >> 4) * 4
    }

    /// The flags byte, CWR to FIN; test it against the `FLAG_*` constants.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// The window size, unscaled.
    pub fn window_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::WIN_SIZE)
    }

    /// The checksum.
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The urgent pointer.
    pub fn urgent_at(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::URGENT)
    }

    /// Whether the checksum is correct, given the pseudo-header sum for this segment's length.
    pub fn verify_checksum(&self, pseudo_header: u32) -> bool {
        checksum::fold(checksum::sum16(self.buffer.as_ref(), pseudo_header)) == 0
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The options, between the fixed header and the payload.
    pub fn options(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.header_len())]
    }

    /// The payload: everything after the header.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[usize::from(self.header_len())..]
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

    /// Sets the flags byte.
    pub fn set_flags(&mut self, flags: u8) {
        self.buffer.as_mut()[field::FLAGS] = flags;
    }

    /// Sets the checksum.
    pub fn set_checksum(&mut self, checksum: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, checksum);
    }

    /// Computes the checksum over the whole buffer and stores it, given the pseudo-header sum
    /// for this segment's length.
    pub fn fill_checksum(&mut self, pseudo_header: u32) {
        self.set_checksum(0);
        let checksum = checksum::fold(checksum::sum16(self.buffer.as_ref(), pseudo_header));
        self.set_checksum(checksum);
    }

    /// The payload, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let header_len = usize::from(self.header_len());
        &mut self.buffer.as_mut()[header_len..]
    }
}

#[cfg(test)]
mod tests {
    use core::net::Ipv4Addr;

    use super::*;
    use crate::checksum::pseudo_header_v4;
    use crate::testdata::TCP_SYN;
    use crate::IpProtocol;

    const TCP: core::ops::RangeFrom<usize> = 34..;

    fn pseudo_header() -> u32 {
        let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
        pseudo_header_v4(src, dst, IpProtocol::Tcp, 40)
    }

    #[test]
    fn syn() {
        let tcp = Packet::new_checked(&TCP_SYN[TCP]).unwrap();
        assert_eq!(tcp.src_port(), 36664);
        assert_eq!(tcp.dst_port(), 80);
        assert_eq!(tcp.seq_number(), 3_451_986_657);
        assert_eq!(tcp.ack_number(), 0);
        assert_eq!(tcp.header_len(), 40);
        assert_eq!(tcp.flags(), FLAG_SYN);
        assert_eq!(tcp.window_len(), 64240);
        assert_eq!(tcp.checksum(), 0x0819);
        assert_eq!(tcp.urgent_at(), 0);
        assert!(tcp.verify_checksum(pseudo_header()));
        // MSS 1460, SACK permitted, timestamps, NOP, window scale 10.
        let options = tcp.options();
        assert_eq!(options.len(), 20);
        assert_eq!(&options[..6], &[2, 4, 0x05, 0xb4, 4, 2]);
        assert_eq!(&options[16..], &[1, 3, 3, 10]);
        assert!(tcp.payload().is_empty());
    }

    #[test]
    fn truncated_and_malformed() {
        assert_eq!(Packet::new_checked(&TCP_SYN[34..53]), Err(Error::Truncated));
        // The options run past the buffer.
        assert_eq!(Packet::new_checked(&TCP_SYN[34..73]), Err(Error::Truncated));
        let mut bytes = TCP_SYN;
        bytes[46] = 0x40;
        assert_eq!(Packet::new_checked(&bytes[TCP]), Err(Error::Malformed));
    }

    #[test]
    fn rewrite_and_fill_checksum() {
        let mut bytes = TCP_SYN;
        let mut tcp = Packet::new_checked(&mut bytes[TCP]).unwrap();
        tcp.set_flags(FLAG_SYN | FLAG_ECE | FLAG_CWR);
        tcp.set_src_port(1);
        tcp.set_dst_port(443);
        assert!(!tcp.verify_checksum(pseudo_header()));
        tcp.fill_checksum(pseudo_header());
        assert!(tcp.verify_checksum(pseudo_header()));
        assert_eq!(tcp.flags(), FLAG_SYN | FLAG_ECE | FLAG_CWR);
        assert_eq!((tcp.src_port(), tcp.dst_port()), (1, 443));
        assert!(tcp.payload_mut().is_empty());

        let mut bytes = TCP_SYN;
        let mut tcp = Packet::new_checked(&mut bytes[TCP]).unwrap();
        tcp.fill_checksum(pseudo_header());
        assert_eq!(tcp.checksum(), 0x0819);
    }

    #[test]
    fn payload_after_options() {
        let mut bytes = TCP_SYN[TCP].to_vec();
        bytes.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let tcp = Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(tcp.payload(), b"GET / HTTP/1.1\r\n");
        let flags = [FLAG_FIN, FLAG_RST, FLAG_PSH, FLAG_ACK, FLAG_URG];
        assert!(flags.iter().all(|&flag| tcp.flags() & flag == 0));
    }
}
