//! ERSPAN type II over GRE: the 16 bytes a remote mirror session puts in front of each
//! copied frame (the outer IPv4 header is the sender's stack's, from a raw `IPPROTO_GRE`
//! socket).
//!
//! ```text
//! GRE (8):     C R K S s Recur Flags Ver = 0x1000 (S: sequence number present)
//!              protocol 0x88BE (ERSPAN type II) | sequence number (32)
//! ERSPAN (8):  Ver = 1 (4) | VLAN (12) | COS (3) | En (2) | T (1) | session id (10)
//!              reserved (12) | index (20)
//! then the mirrored Ethernet frame, as it was seen on the port (tags kept)
//! ```
//!
//! This is the layout Wireshark's `erspan` dissector and tcpdump decode (draft
//! `foschiano-erspan`, section 4.1). The VLAN field is the frame's VLAN where it has one;
//! `En` says 3 ("the 802.1Q tag, if any, is kept in the frame"), so a decoder reads the
//! frame's own tag.

/// The GRE protocol type of ERSPAN type II.
pub const ETHERTYPE_ERSPAN_II: u16 = 0x88be;
/// Bytes of GRE and ERSPAN header in front of the mirrored frame.
pub const HEADER_LEN: usize = 16;
/// Largest ERSPAN session id (10 bits).
pub const MAX_SESSION: u16 = 1023;

/// What goes into one ERSPAN type II header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Erspan {
    /// GRE sequence number (per session, incremented per frame by the sender).
    pub seq: u32,
    /// Session id, 0..=[`MAX_SESSION`] (higher bits are masked off).
    pub session: u16,
    /// The frame's VLAN (12 bits; 0: none).
    pub vlan: u16,
    /// Class of service (3 bits).
    pub cos: u8,
    /// Port index (20 bits): the switch's id of the port the frame was seen on.
    pub index: u32,
}

impl Erspan {
    /// The GRE and ERSPAN headers.
    pub fn header(&self) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..2].copy_from_slice(&0x1000u16.to_be_bytes());
        h[2..4].copy_from_slice(&ETHERTYPE_ERSPAN_II.to_be_bytes());
        h[4..8].copy_from_slice(&self.seq.to_be_bytes());
        let w0 = (1u16 << 12) | (self.vlan & 0x0fff);
        let w1 = (u16::from(self.cos & 7) << 13) | (3 << 11) | (self.session & MAX_SESSION);
        h[8..10].copy_from_slice(&w0.to_be_bytes());
        h[10..12].copy_from_slice(&w1.to_be_bytes());
        h[12..16].copy_from_slice(&(self.index & 0x000f_ffff).to_be_bytes());
        h
    }
}

/// The parts of a GRE/ERSPAN type II packet (`pkt` starts at the GRE header): sequence,
/// session, VLAN, index and the inner frame. `None` if it is not one.
pub fn parse(pkt: &[u8]) -> Option<(Erspan, &[u8])> {
    let h = pkt.get(..HEADER_LEN)?;
    let be = |o: usize| u16::from_be_bytes([h[o], h[o + 1]]);
    if be(0) != 0x1000 || be(2) != ETHERTYPE_ERSPAN_II || be(8) >> 12 != 1 {
        return None;
    }
    let e = Erspan {
        seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        vlan: be(8) & 0x0fff,
        cos: (be(10) >> 13) as u8,
        session: be(10) & MAX_SESSION,
        index: u32::from_be_bytes([h[12], h[13], h[14], h[15]]) & 0x000f_ffff,
    };
    Some((e, &pkt[HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header bytes of an ERSPAN type II packet (draft-foschiano-erspan, section 4.1),
    /// session 5, sequence 7, VLAN 10, index 3.
    #[test]
    fn header_matches_the_wire_layout() {
        let e = Erspan {
            seq: 7,
            session: 5,
            vlan: 10,
            cos: 0,
            index: 3,
        };
        assert_eq!(
            e.header(),
            [0x10, 0x00, 0x88, 0xbe, 0, 0, 0, 7, 0x10, 0x0a, 0x18, 0x05, 0, 0, 0, 3]
        );
        let mut pkt = e.header().to_vec();
        pkt.extend_from_slice(&[0xaa; 60]);
        let (back, inner) = parse(&pkt).unwrap();
        assert_eq!(back, e);
        assert_eq!(inner, &[0xaa; 60][..]);
        assert!(parse(&pkt[..15]).is_none());
        pkt[2] = 0x08;
        assert!(parse(&pkt).is_none());
    }

    #[test]
    fn fields_are_masked_to_their_width() {
        let e = Erspan {
            seq: u32::MAX,
            session: 0xffff,
            vlan: 0xffff,
            cos: 0xff,
            index: u32::MAX,
        };
        let (back, _) = parse(&e.header()).unwrap();
        assert_eq!(
            (back.session, back.vlan, back.cos, back.index),
            (1023, 4095, 7, 0xf_ffff)
        );
    }
}
