//! IEEE 802.1Q VLAN tags.
//!
//! The tag's TPID (0x8100) doubles as the EtherType of the enclosing
//! [`ethernet::Frame`](crate::ethernet::Frame); [`Tag`] views the 4 bytes after it, the Tag
//! Control Information (priority code point, drop eligible indicator, VLAN ID) and the inner
//! EtherType, and the payload after those. An 802.1ad S-tag (TPID 0x88a8) has the same layout,
//! so the same view reads it.
//!
//! VID 0 (a priority-tagged frame) and VID 4095 are reserved by the standard; this view reports
//! them as they are and leaves policy to the caller.

use crate::ethernet::EtherType;
use crate::{read_u16, write_u16, Error, Result};

mod field {
    use crate::{Field, Rest};

    pub const TCI: Field = 0..2;
    pub const ETHERTYPE: Field = 2..4;
    pub const PAYLOAD: Rest = 4..;
}

/// Length of the tag after the TPID.
pub const HEADER_LEN: usize = field::PAYLOAD.start;

const VID_MASK: u16 = 0x0fff;
const DEI_BIT: u16 = 0x1000;
const PCP_SHIFT: u16 = 13;

/// A view of an 802.1Q tag, starting right after the TPID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Tag<T> {
    /// Wraps a buffer without checking it; see the crate docs for what that allows.
    pub const fn new_unchecked(buffer: T) -> Tag<T> {
        Tag { buffer }
    }

    /// Wraps a buffer after [`check_len`](Self::check_len).
    pub fn new_checked(buffer: T) -> Result<Tag<T>> {
        let tag = Self::new_unchecked(buffer);
        tag.check_len()?;
        Ok(tag)
    }

    /// Fails with [`Error::Truncated`] if the buffer is shorter than the tag.
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

    fn tci(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::TCI)
    }

    /// The 12-bit VLAN identifier.
    pub fn vid(&self) -> u16 {
        self.tci() & VID_MASK
    }

    /// The 3-bit priority code point (802.1p priority).
    pub fn pcp(&self) -> u8 {
        (self.tci() >> PCP_SHIFT) as u8
    }

    /// The drop eligible indicator (formerly CFI).
    pub fn dei(&self) -> bool {
        self.tci() & DEI_BIT != 0
    }

    /// The EtherType of what the tag encloses.
    pub fn ethertype(&self) -> EtherType {
        read_u16(self.buffer.as_ref(), field::ETHERTYPE).into()
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Tag<&'a T> {
    /// Everything after the tag.
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[field::PAYLOAD]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Tag<T> {
    fn set_tci(&mut self, tci: u16) {
        write_u16(self.buffer.as_mut(), field::TCI, tci);
    }

    /// Sets the VLAN identifier; only its low 12 bits are used.
    pub fn set_vid(&mut self, vid: u16) {
        debug_assert!(vid <= VID_MASK, "VID {vid} does not fit in 12 bits");
        self.set_tci((self.tci() & !VID_MASK) | (vid & VID_MASK));
    }

    /// Sets the priority code point; only its low 3 bits are used.
    pub fn set_pcp(&mut self, pcp: u8) {
        debug_assert!(pcp < 8, "PCP {pcp} does not fit in 3 bits");
        let pcp = u16::from(pcp & 0x07) << PCP_SHIFT;
        self.set_tci((self.tci() & !(0x07 << PCP_SHIFT)) | pcp);
    }

    /// Sets the drop eligible indicator.
    pub fn set_dei(&mut self, dei: bool) {
        let tci = self.tci() & !DEI_BIT;
        self.set_tci(if dei { tci | DEI_BIT } else { tci });
    }

    /// Sets the inner EtherType.
    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        write_u16(self.buffer.as_mut(), field::ETHERTYPE, ethertype.into());
    }

    /// Everything after the tag, mutably.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ethernet::{self, Frame};
    use crate::testdata::{UDP4, VLAN_UDP4};

    #[test]
    fn tagged_udp() {
        let frame = Frame::new_checked(&VLAN_UDP4[..]).unwrap();
        assert_eq!(frame.ethertype(), EtherType::Vlan);
        let tag = Tag::new_checked(frame.payload()).unwrap();
        assert_eq!(tag.vid(), 100);
        assert_eq!(tag.pcp(), 5);
        assert!(!tag.dei());
        assert_eq!(tag.ethertype(), EtherType::Ipv4);
        // Untagged, the frame is the captured one.
        assert_eq!(tag.payload(), &UDP4[ethernet::HEADER_LEN..]);
    }

    #[test]
    fn truncated() {
        assert_eq!(Tag::new_checked(&VLAN_UDP4[14..17]), Err(Error::Truncated));
        assert!(Tag::new_checked(&VLAN_UDP4[14..18])
            .unwrap()
            .payload()
            .is_empty());
    }

    #[test]
    fn setters_touch_only_their_bits() {
        let mut bytes = [0xa0, 0x64, 0x08, 0x00, 0x45];
        let mut tag = Tag::new_checked(&mut bytes[..]).unwrap();
        tag.set_dei(true);
        assert_eq!((tag.pcp(), tag.dei(), tag.vid()), (5, true, 100));
        tag.set_vid(4094);
        assert_eq!((tag.pcp(), tag.dei(), tag.vid()), (5, true, 4094));
        tag.set_pcp(7);
        assert_eq!((tag.pcp(), tag.dei(), tag.vid()), (7, true, 4094));
        tag.set_pcp(0);
        tag.set_dei(false);
        assert_eq!((tag.pcp(), tag.dei(), tag.vid()), (0, false, 4094));
        tag.set_ethertype(EtherType::Ipv6);
        tag.payload_mut()[0] = 0x60;
        assert_eq!(tag.into_inner(), &[0x0f, 0xfe, 0x86, 0xdd, 0x60]);
    }
}
