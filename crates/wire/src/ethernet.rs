//! Ethernet II frames.
//!
//! [`Frame`] views the 14-byte header (destination, source, EtherType) and the payload after it.
//! Frames from TAP devices and virtio queues carry no FCS, so the payload runs to the end of the
//! buffer, including any padding up to the 60-byte minimum; the L3 length fields say where the
//! data really ends.
//!
//! Limitations: 802.3 frames with a length instead of a type (values below 0x0600) are not told
//! apart; their length reads as [`EtherType::Unknown`]. VLAN tags are the business of
//! [`crate::vlan`] and [`crate::l2`]; here a tagged frame simply has EtherType
//! [`EtherType::Vlan`].

use crate::{enum_with_unknown, read_array, read_u16, write_u16, Error, MacAddr, Result};

mod field {
    use crate::{Field, Rest};

    pub const DST: Field = 0..6;
    pub const SRC: Field = 6..12;
    pub const ETHERTYPE: Field = 12..14;
    pub const PAYLOAD: Rest = 14..;
}

/// Length of the Ethernet II header.
pub const HEADER_LEN: usize = field::PAYLOAD.start;

enum_with_unknown! {
    /// The EtherType field.
    pub enum EtherType(u16) {
        /// IPv4, 0x0800.
        Ipv4 = 0x0800,
        /// ARP, 0x0806.
        Arp = 0x0806,
        /// IPv6, 0x86dd.
        Ipv6 = 0x86dd,
        /// An IEEE 802.1Q VLAN tag (C-tag) follows, 0x8100.
        Vlan = 0x8100,
        /// An IEEE 802.1ad service tag (S-tag) follows, 0x88a8.
        QinQ = 0x88a8,
    }
}

/// A view of an Ethernet II frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps a buffer without checking it; see the crate docs for what that allows.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Frame<T>> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// Fails with [`Error::Truncated`] if the buffer is shorter than the header.
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

    /// The destination address.
    pub fn dst_addr(&self) -> MacAddr {
        MacAddr(read_array(self.buffer.as_ref(), field::DST))
    }

    /// The source address.
    pub fn src_addr(&self) -> MacAddr {
        MacAddr(read_array(self.buffer.as_ref(), field::SRC))
    }

    /// The EtherType.
    pub fn ethertype(&self) -> EtherType {
        read_u16(self.buffer.as_ref(), field::ETHERTYPE).into()
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Frame<&'a T> {
    /// Everything after the header.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr.0);
    }

    /// Sets the source address.
    pub fn set_src_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr.0);
    }

    /// Sets the EtherType.
    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        write_u16(self.buffer.as_mut(), field::ETHERTYPE, ethertype.into());
    }

    /// Everything after the header, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{ARP_REQUEST, TCP_SYN, UDP6, VLAN_UDP4};

    #[test]
    fn arp_request() {
        let frame = Frame::new_checked(&ARP_REQUEST[..]).unwrap();
        assert_eq!(frame.dst_addr(), MacAddr::BROADCAST);
        assert_eq!(frame.src_addr(), "52:54:00:12:34:01".parse().unwrap());
        assert_eq!(frame.ethertype(), EtherType::Arp);
        assert_eq!(frame.payload(), &ARP_REQUEST[14..]);
        assert_eq!(frame.payload().len(), 28);
    }

    #[test]
    fn ethertypes_of_real_frames() {
        let ethertype = |bytes: &[u8]| Frame::new_checked(bytes).unwrap().ethertype();
        assert_eq!(ethertype(&TCP_SYN), EtherType::Ipv4);
        assert_eq!(ethertype(&UDP6), EtherType::Ipv6);
        assert_eq!(ethertype(&VLAN_UDP4), EtherType::Vlan);
    }

    #[test]
    fn ethertype_conversions() {
        assert_eq!(EtherType::from(0x88a8), EtherType::QinQ);
        assert_eq!(EtherType::from(0x88cc), EtherType::Unknown(0x88cc));
        assert_eq!(u16::from(EtherType::Unknown(0x88cc)), 0x88cc);
        for raw in [
            0x0800, 0x0806, 0x86dd, 0x8100, 0x88a8, 0x0000, 0x05dc, 0xffff,
        ] {
            assert_eq!(u16::from(EtherType::from(raw)), raw);
        }
    }

    #[test]
    fn header_only_and_runt() {
        let frame = Frame::new_checked(&ARP_REQUEST[..HEADER_LEN]).unwrap();
        assert!(frame.payload().is_empty());
        assert_eq!(
            Frame::new_checked(&ARP_REQUEST[..HEADER_LEN - 1]),
            Err(Error::Truncated)
        );
        assert_eq!(Frame::new_checked(&[][..]), Err(Error::Truncated));
    }

    #[test]
    fn setters() {
        let mut bytes = ARP_REQUEST;
        let mut frame = Frame::new_checked(&mut bytes[..]).unwrap();
        let a = MacAddr([0x02, 0, 0, 0, 0, 0xaa]);
        let b = MacAddr([0x02, 0, 0, 0, 0, 0xbb]);
        frame.set_dst_addr(a);
        frame.set_src_addr(b);
        frame.set_ethertype(EtherType::Unknown(0x88cc));
        frame.payload_mut()[0] = 0xee;
        assert_eq!(frame.dst_addr(), a);
        assert_eq!(frame.src_addr(), b);
        assert_eq!(frame.ethertype(), EtherType::Unknown(0x88cc));
        assert_eq!(&bytes[12..15], &[0x88, 0xcc, 0xee]);
        assert_eq!(&bytes[15..], &ARP_REQUEST[15..]);
    }

    #[test]
    fn owned_buffer() {
        let frame = Frame::new_checked(UDP6.to_vec()).unwrap();
        assert_eq!(frame.ethertype(), EtherType::Ipv6);
        assert_eq!(frame.into_inner(), UDP6.to_vec());
    }
}
