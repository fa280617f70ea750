//! The hot-path L2 classifier, run on every frame the switch receives.
//!
//! [`classify`] does constant work: a length check, the Ethernet header and at most one 802.1Q
//! tag. It reads addresses for MAC learning and forwarding, the VLAN of the frame and where L3
//! starts, and rejects what no port should forward: runts, frames larger than
//! [`MAX_FRAME_LEN`], and frames whose source address is a group address.
//!
//! Limitations: only an outer 802.1Q (0x8100) tag is parsed. A frame whose outer tag is an
//! 802.1ad S-tag reports `vlan: None` and `ethertype: QinQ`; in a double 802.1Q tagged frame
//! the inner tag shows as `ethertype: Vlan`. A priority-tagged frame reports `vlan: Some(0)`.

use crate::ethernet::{self, EtherType, Frame};
use crate::{vlan, MacAddr};

/// The largest frame the switch accepts: a TSO super-frame of 64 KiB of IP with an Ethernet
/// header and an 802.1Q tag.
pub const MAX_FRAME_LEN: usize = 65_535 + ethernet::HEADER_LEN + vlan::HEADER_LEN;

/// What [`classify`] found in a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2Info {
    /// Destination address.
    pub dst: MacAddr,
    /// Source address (always an individual address).
    pub src: MacAddr,
    /// VID of the outer 802.1Q tag, if there is one.
    pub vlan: Option<u16>,
    /// The EtherType after any 802.1Q tag.
    pub ethertype: EtherType,
    /// Offset of the L3 header in the frame.
    pub l3_offset: usize,
}

/// Why [`classify`] rejected a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Error {
    /// Shorter than the Ethernet header, or a truncated VLAN tag.
    Runt,
    /// Longer than [`MAX_FRAME_LEN`].
    Oversize,
    /// The source address is multicast or broadcast.
    BadSrc,
}

/// Classifies an Ethernet frame (without FCS). Never panics.
#[inline]
pub fn classify(frame: &[u8]) -> Result<L2Info, L2Error> {
    if frame.len() > MAX_FRAME_LEN {
        return Err(L2Error::Oversize);
    }
    let eth = Frame::new_checked(frame).map_err(|_| L2Error::Runt)?;
    let src = eth.src_addr();
    if src.is_multicast() {
        return Err(L2Error::BadSrc);
    }
    let (vlan, ethertype, l3_offset) = untag(&eth).ok_or(L2Error::Runt)?;
    Ok(L2Info {
        dst: eth.dst_addr(),
        src,
        vlan,
        ethertype,
        l3_offset,
    })
}

/// The outer 802.1Q VID, the EtherType after the tag and the L3 offset of a checked frame;
/// `None` if the tag is truncated.
#[inline]
pub fn untag(eth: &Frame<&[u8]>) -> Option<(Option<u16>, EtherType, usize)> {
    match eth.ethertype() {
        EtherType::Vlan => {
            let tag = vlan::Tag::new_checked(eth.payload()).ok()?;
            let l3_offset = ethernet::HEADER_LEN + vlan::HEADER_LEN;
            Some((Some(tag.vid()), tag.ethertype(), l3_offset))
        }
        ethertype => Some((None, ethertype, ethernet::HEADER_LEN)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{ARP_REQUEST, MLD_REPORT, TCP_SYN, UDP6, VLAN_UDP4};
    use proptest::prelude::*;

    #[test]
    fn untagged_frames() {
        let arp = classify(&ARP_REQUEST).unwrap();
        assert_eq!(
            arp,
            L2Info {
                dst: MacAddr::BROADCAST,
                src: "52:54:00:12:34:01".parse().unwrap(),
                vlan: None,
                ethertype: EtherType::Arp,
                l3_offset: 14,
            }
        );
        let syn = classify(&TCP_SYN).unwrap();
        assert_eq!(syn.dst, "52:54:00:12:34:02".parse().unwrap());
        assert_eq!((syn.ethertype, syn.l3_offset), (EtherType::Ipv4, 14));
        let mld = classify(&MLD_REPORT).unwrap();
        assert!(mld.dst.is_multicast());
        assert_eq!(classify(&UDP6).unwrap().ethertype, EtherType::Ipv6);
    }

    #[test]
    fn tagged_frame() {
        let info = classify(&VLAN_UDP4).unwrap();
        assert_eq!(info.vlan, Some(100));
        assert_eq!(info.ethertype, EtherType::Ipv4);
        assert_eq!(info.l3_offset, 18);
        assert_eq!(VLAN_UDP4[info.l3_offset], 0x45);
        assert_eq!(info.src, "52:54:00:12:34:01".parse().unwrap());
    }

    #[test]
    fn runts() {
        assert_eq!(classify(&[]), Err(L2Error::Runt));
        assert_eq!(classify(&ARP_REQUEST[..13]), Err(L2Error::Runt));
        assert!(classify(&ARP_REQUEST[..14]).is_ok());
        // An 802.1Q TPID with less than a whole tag after it.
        assert_eq!(classify(&VLAN_UDP4[..17]), Err(L2Error::Runt));
        let info = classify(&VLAN_UDP4[..18]).unwrap();
        assert_eq!((info.vlan, info.l3_offset), (Some(100), 18));
    }

    #[test]
    fn oversize() {
        let mut frame = vec![0; MAX_FRAME_LEN + 1];
        frame[..60].copy_from_slice(&VLAN_UDP4[..60]);
        assert_eq!(classify(&frame), Err(L2Error::Oversize));
        let info = classify(&frame[..MAX_FRAME_LEN]).unwrap();
        assert_eq!(info.vlan, Some(100));
    }

    #[test]
    fn group_source_addresses() {
        let mut frame = TCP_SYN;
        frame[6..12].copy_from_slice(&MLD_REPORT[..6]);
        assert_eq!(classify(&frame), Err(L2Error::BadSrc));
        frame[6..12].copy_from_slice(&MacAddr::BROADCAST.0);
        assert_eq!(classify(&frame), Err(L2Error::BadSrc));
    }

    #[test]
    fn other_tags() {
        // An 802.1ad S-tag is not parsed.
        let mut frame = VLAN_UDP4;
        frame[12..14].copy_from_slice(&[0x88, 0xa8]);
        let info = classify(&frame).unwrap();
        assert_eq!(
            (info.vlan, info.ethertype, info.l3_offset),
            (None, EtherType::QinQ, 14)
        );
        // Of two 802.1Q tags, the outer one counts.
        let frame = [
            &VLAN_UDP4[..16],
            &[0x81, 0x00, 0x00, 0xc8],
            &VLAN_UDP4[16..],
        ]
        .concat();
        let info = classify(&frame).unwrap();
        assert_eq!(
            (info.vlan, info.ethertype, info.l3_offset),
            (Some(100), EtherType::Vlan, 18)
        );
    }

    proptest! {
        #[test]
        fn never_panics(frame in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(info) = classify(&frame) {
                prop_assert!(info.l3_offset <= frame.len());
                prop_assert!(info.src.is_unicast());
            }
        }

        #[test]
        fn tagged_prefixes_never_panic(len in 0..VLAN_UDP4.len(), tci in any::<u16>()) {
            let mut frame = VLAN_UDP4;
            frame[14..16].copy_from_slice(&tci.to_be_bytes());
            let result = classify(&frame[..len]);
            prop_assert_eq!(result.is_ok(), len >= 18);
            if let Ok(info) = result {
                prop_assert_eq!(info.vlan, Some(tci & 0x0fff));
            }
        }
    }
}
