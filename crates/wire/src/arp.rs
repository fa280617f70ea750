//! ARP packets for IPv4 over Ethernet (RFC 826).
//!
//! [`Packet`] views the fixed 28-byte layout that Ethernet/IPv4 ARP uses (hardware type 1,
//! protocol type 0x0800, address lengths 6 and 4). [`Packet::new_checked`] rejects any other
//! hardware or protocol as [`Error::Malformed`]; ARP for other link layers never reaches an
//! Ethernet switch in practice. Trailing bytes (Ethernet padding) are ignored.

use core::net::Ipv4Addr;

use crate::ethernet::EtherType;
use crate::{enum_with_unknown, read_array, read_u16, write_u16, Error, MacAddr, Result};

mod field {
    use crate::Field;

    pub const HTYPE: Field = 0..2;
    pub const PTYPE: Field = 2..4;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: Field = 6..8;
    pub const SHA: Field = 8..14;
    pub const SPA: Field = 14..18;
    pub const THA: Field = 18..24;
    pub const TPA: Field = 24..28;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = field::TPA.end;

/// The hardware type of Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;

enum_with_unknown! {
    /// The ARP operation.
    pub enum Operation(u16) {
        /// A request, 1.
        Request = 1,
        /// A reply, 2.
        Reply = 2,
    }
}

/// A view of an Ethernet/IPv4 ARP packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checking it; see the crate docs for what that allows.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len), and fails with
    /// [`Error::Malformed`] unless the packet is for Ethernet and IPv4.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        if packet.hardware_type() != HTYPE_ETHERNET
            || packet.protocol_type() != EtherType::Ipv4
            || packet.hardware_len() != 6
            || packet.protocol_len() != 4
        {
            return Err(Error::Malformed);
        }
        Ok(packet)
    }

    /// Fails with [`Error::Truncated`] if the buffer is shorter than [`PACKET_LEN`].
    pub fn check_len(&self) -> Result<()> {
        if self.buffer.as_ref().len() < PACKET_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The hardware type; [`HTYPE_ETHERNET`] for Ethernet.
    pub fn hardware_type(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::HTYPE)
    }

    /// The protocol type.
    pub fn protocol_type(&self) -> EtherType {
        read_u16(self.buffer.as_ref(), field::PTYPE).into()
    }

    /// The hardware address length.
    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }

    /// The protocol address length.
    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }

    /// The operation.
    pub fn operation(&self) -> Operation {
        read_u16(self.buffer.as_ref(), field::OPER).into()
    }

    /// The sender hardware address.
    pub fn sender_hardware_addr(&self) -> MacAddr {
        MacAddr(read_array(self.buffer.as_ref(), field::SHA))
    }

    /// The sender protocol address.
    pub fn sender_protocol_addr(&self) -> Ipv4Addr {
        read_array::<4>(self.buffer.as_ref(), field::SPA).into()
    }

    /// The target hardware address (zero in a request).
    pub fn target_hardware_addr(&self) -> MacAddr {
        MacAddr(read_array(self.buffer.as_ref(), field::THA))
    }

    /// The target protocol address.
    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        read_array::<4>(self.buffer.as_ref(), field::TPA).into()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the hardware type, protocol type and address lengths for Ethernet and IPv4.
    pub fn set_ethernet_ipv4(&mut self) {
        let data = self.buffer.as_mut();
        write_u16(data, field::HTYPE, HTYPE_ETHERNET);
        write_u16(data, field::PTYPE, EtherType::Ipv4.into());
        data[field::HLEN] = 6;
        data[field::PLEN] = 4;
    }

    /// Sets the operation.
    pub fn set_operation(&mut self, operation: Operation) {
        write_u16(self.buffer.as_mut(), field::OPER, operation.into());
    }

    /// Sets the sender hardware address.
    pub fn set_sender_hardware_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&addr.0);
    }

    /// Sets the sender protocol address.
    pub fn set_sender_protocol_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&addr.octets());
    }

    /// Sets the target hardware address.
    pub fn set_target_hardware_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&addr.0);
    }

    /// Sets the target protocol address.
    pub fn set_target_protocol_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&addr.octets());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{ARP_REPLY, ARP_REQUEST};

    const ARP: core::ops::RangeFrom<usize> = 14..;

    #[test]
    fn request() {
        let arp = Packet::new_checked(&ARP_REQUEST[ARP]).unwrap();
        assert_eq!(arp.hardware_type(), HTYPE_ETHERNET);
        assert_eq!(arp.protocol_type(), EtherType::Ipv4);
        assert_eq!((arp.hardware_len(), arp.protocol_len()), (6, 4));
        assert_eq!(arp.operation(), Operation::Request);
        assert_eq!(
            arp.sender_hardware_addr(),
            "52:54:00:12:34:01".parse().unwrap()
        );
        assert_eq!(arp.sender_protocol_addr(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(arp.target_hardware_addr(), MacAddr::ZERO);
        assert_eq!(arp.target_protocol_addr(), Ipv4Addr::new(10, 0, 0, 2));
    }

    #[test]
    fn padded_request() {
        let mut padded = [0; 46];
        padded[..28].copy_from_slice(&ARP_REQUEST[ARP]);
        let arp = Packet::new_checked(&padded[..]).unwrap();
        assert_eq!(arp.target_protocol_addr(), Ipv4Addr::new(10, 0, 0, 2));
    }

    #[test]
    fn truncated_and_malformed() {
        assert_eq!(
            Packet::new_checked(&ARP_REQUEST[14..41]),
            Err(Error::Truncated)
        );
        for (at, value) in [(1, 6), (2, 0x86), (4, 8), (5, 16)] {
            let mut bytes = ARP_REQUEST;
            bytes[14 + at] = value;
            assert_eq!(
                Packet::new_checked(&bytes[ARP]),
                Err(Error::Malformed),
                "byte {at}"
            );
        }
    }

    #[test]
    fn reply_from_request() {
        // Build the reply the target sent back out of the request.
        let mut bytes = ARP_REQUEST;
        let mut arp = Packet::new_unchecked(&mut bytes[ARP]);
        arp.set_ethernet_ipv4();
        arp.set_operation(Operation::Reply);
        arp.set_target_hardware_addr(arp.sender_hardware_addr());
        arp.set_target_protocol_addr(arp.sender_protocol_addr());
        arp.set_sender_hardware_addr("52:54:00:12:34:02".parse().unwrap());
        arp.set_sender_protocol_addr(Ipv4Addr::new(10, 0, 0, 2));
        assert_eq!(arp.into_inner(), &ARP_REPLY[ARP]);
        let reply = Packet::new_checked(&ARP_REPLY[ARP]).unwrap();
        assert_eq!(reply.operation(), Operation::Reply);
        assert_eq!(Operation::from(3), Operation::Unknown(3));
    }
}
