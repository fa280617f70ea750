//! LLDPDUs (IEEE 802.1AB-2016, 8): what a station says about itself to its neighbour.
//!
//! An LLDPDU is a list of TLVs after an Ethernet header (EtherType [`ETHERTYPE`], destination
//! one of the three LLDP group addresses, [`NEAREST_BRIDGE_MAC`] usually). Each TLV starts
//! with a 16-bit header, 7 bits of type and 9 bits of length:
//!
//! ```text
//! Chassis ID (1) | Port ID (2) | Time To Live (3) | optional TLVs ... | End (0, optional)
//! ```
//!
//! * [`Lldpdu::parse`] reads the TLVs this switch shows: chassis id, port id, TTL, port
//!   description (4), system name (5), system description (6) and the first management address
//!   (8). The first three must come first and in that order (8.2), with the lengths 8.5 allows;
//!   otherwise the PDU is rejected with an [`Error`], never a panic. A malformed optional TLV is
//!   skipped, as 9.2.7.7.2 asks; TLVs with no name here (system capabilities, organizationally
//!   specific ones) are skipped. Bytes after the End TLV (frame padding) are ignored.
//! * [`tlvs`] iterates over every TLV, for callers who want the rest.
//! * [`Lldpdu::emit`] writes the TLVs it holds, in order, ending with an End TLV;
//!   [`Lldpdu::frame`] a whole frame, padded to the 60-byte Ethernet minimum.
//!
//! Strings are bytes: 802.1AB does not promise UTF-8 (a port id may be a MAC address).
//! The parsed PDU borrows from the frame; nothing allocates.
//!
//! Interop: the LLDP test in crates/qswitch/tests exchanges these PDUs with Debian's lldpd.

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{Error, MacAddr, Result};

/// The LLDP EtherType.
pub const ETHERTYPE: u16 = 0x88cc;

/// The nearest bridge group address: LLDP's usual destination, never relayed by bridges.
pub const NEAREST_BRIDGE_MAC: MacAddr = MacAddr([0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e]);

/// The nearest non-TPMR bridge and nearest customer bridge group addresses, the other two
/// destinations 802.1AB allows (7.1).
pub const OTHER_GROUP_MACS: [MacAddr; 2] = [
    MacAddr([0x01, 0x80, 0xc2, 0x00, 0x00, 0x03]),
    MacAddr([0x01, 0x80, 0xc2, 0x00, 0x00, 0x00]),
];

/// The longest TLV information string (9 bits of length).
pub const MAX_TLV_LEN: usize = 511;

/// TLV types (8.4.1).
pub mod tlv {
    /// End of LLDPDU.
    pub const END: u8 = 0;
    /// Chassis ID.
    pub const CHASSIS_ID: u8 = 1;
    /// Port ID.
    pub const PORT_ID: u8 = 2;
    /// Time To Live.
    pub const TTL: u8 = 3;
    /// Port Description.
    pub const PORT_DESCRIPTION: u8 = 4;
    /// System Name.
    pub const SYSTEM_NAME: u8 = 5;
    /// System Description.
    pub const SYSTEM_DESCRIPTION: u8 = 6;
    /// System Capabilities.
    pub const SYSTEM_CAPABILITIES: u8 = 7;
    /// Management Address.
    pub const MANAGEMENT_ADDRESS: u8 = 8;
    /// Organizationally Specific TLVs.
    pub const ORG_SPECIFIC: u8 = 127;
}

/// Chassis ID subtypes (8.5.2.2) this switch names.
pub mod chassis_subtype {
    /// A MAC address.
    pub const MAC_ADDRESS: u8 = 4;
    /// A network address (IANA family number, then the address).
    pub const NETWORK_ADDRESS: u8 = 5;
    /// An interface name.
    pub const INTERFACE_NAME: u8 = 6;
    /// Locally assigned text.
    pub const LOCAL: u8 = 7;
}

/// Port ID subtypes (8.5.3.2) this switch names.
pub mod port_subtype {
    /// An interface alias (ifAlias).
    pub const INTERFACE_ALIAS: u8 = 1;
    /// A MAC address.
    pub const MAC_ADDRESS: u8 = 3;
    /// An interface name (ifName): what this switch sends.
    pub const INTERFACE_NAME: u8 = 5;
    /// Locally assigned text.
    pub const LOCAL: u8 = 7;
}

/// IANA address family numbers used by the management address TLV.
pub mod family {
    /// IPv4.
    pub const IPV4: u8 = 1;
    /// IPv6.
    pub const IPV6: u8 = 2;
    /// An IEEE 802 (MAC) address.
    pub const MAC: u8 = 6;
}

/// A chassis or port identifier: a subtype and 1 to 255 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Id<'a> {
    /// The subtype ([`chassis_subtype`], [`port_subtype`]).
    pub subtype: u8,
    /// The identifier.
    pub id: &'a [u8],
}

impl Id<'_> {
    /// The identifier as a MAC address, when it is one (subtype 4 for a chassis, 3 for a
    /// port: pass the subtype that means MAC address for this id).
    pub fn mac(&self, mac_subtype: u8) -> Option<MacAddr> {
        if self.subtype == mac_subtype {
            MacAddr::from_bytes(self.id).filter(|_| self.id.len() == 6)
        } else {
            None
        }
    }
}

/// A management address TLV (8.5.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ManagementAddress<'a> {
    /// The IANA address family ([`family`]).
    pub family: u8,
    /// The address, 1 to 31 bytes.
    pub address: &'a [u8],
    /// Interface numbering subtype (1 unknown, 2 ifIndex, 3 system port number).
    pub if_subtype: u8,
    /// Interface number.
    pub if_number: u32,
    /// Object identifier, 0 to 128 bytes.
    pub oid: &'a [u8],
}

impl ManagementAddress<'_> {
    /// The address as an IP address, for families IPv4 and IPv6 of the right length.
    pub fn ip(&self) -> Option<IpAddr> {
        match (self.family, self.address.len()) {
            (family::IPV4, 4) => {
                let b: [u8; 4] = self.address.try_into().ok()?;
                Some(IpAddr::V4(Ipv4Addr::from(b)))
            }
            (family::IPV6, 16) => {
                let b: [u8; 16] = self.address.try_into().ok()?;
                Some(IpAddr::V6(Ipv6Addr::from(b)))
            }
            _ => None,
        }
    }

    fn parse(value: &[u8]) -> Option<ManagementAddress<'_>> {
        let (&addr_len, rest) = value.split_first()?;
        let addr_len = usize::from(addr_len);
        // The address string length counts the family byte: 2..=32.
        if !(2..=32).contains(&addr_len) || rest.len() < addr_len + 6 {
            return None;
        }
        let (&family, rest) = rest.split_first()?;
        let (address, rest) = rest.split_at(addr_len - 1);
        let if_subtype = rest[0];
        let if_number = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]);
        let oid_len = usize::from(rest[5]);
        let oid = rest.get(6..6 + oid_len)?;
        if oid_len > 128 || rest.len() != 6 + oid_len {
            return None;
        }
        Some(ManagementAddress {
            family,
            address,
            if_subtype,
            if_number,
            oid,
        })
    }

    fn len(&self) -> usize {
        1 + 1 + self.address.len() + 1 + 4 + 1 + self.oid.len()
    }
}

/// One TLV: its type and information string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tlv<'a> {
    /// The type (7 bits, [`tlv`]).
    pub kind: u8,
    /// The information string (up to [`MAX_TLV_LEN`] bytes).
    pub value: &'a [u8],
}

/// An iterator over the TLVs of an LLDPDU, up to and without the End TLV; a TLV running past
/// the end of the buffer yields `Err(Error::Truncated)` and ends the iteration.
#[derive(Debug, Clone)]
pub struct Tlvs<'a> {
    rest: &'a [u8],
}

/// The TLVs of `pdu` (the bytes after the Ethernet header).
pub fn tlvs(pdu: &[u8]) -> Tlvs<'_> {
    Tlvs { rest: pdu }
}

impl<'a> Iterator for Tlvs<'a> {
    type Item = Result<Tlv<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let Some((header, rest)) = self.rest.split_first_chunk::<2>() else {
            self.rest = &[];
            return Some(Err(Error::Truncated));
        };
        let header = u16::from_be_bytes(*header);
        let kind = (header >> 9) as u8;
        let len = usize::from(header & 0x1ff);
        if kind == tlv::END {
            self.rest = &[];
            return None;
        }
        if rest.len() < len {
            self.rest = &[];
            return Some(Err(Error::Truncated));
        }
        let (value, rest) = rest.split_at(len);
        self.rest = rest;
        Some(Ok(Tlv { kind, value }))
    }
}

/// An LLDPDU: what this switch reads from a neighbour, or sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lldpdu<'a> {
    /// Chassis ID.
    pub chassis_id: Id<'a>,
    /// Port ID.
    pub port_id: Id<'a>,
    /// Time to live, seconds (0: forget this neighbour now).
    pub ttl: u16,
    /// Port description.
    pub port_description: Option<&'a [u8]>,
    /// System name.
    pub system_name: Option<&'a [u8]>,
    /// System description.
    pub system_description: Option<&'a [u8]>,
    /// The first well-formed management address.
    pub management_address: Option<ManagementAddress<'a>>,
}

fn id(value: &[u8]) -> Result<Id<'_>> {
    // Subtype and 1..=255 bytes of id (8.5.2, 8.5.3).
    match value.split_first() {
        Some((&subtype, id)) if (1..=255).contains(&id.len()) => Ok(Id { subtype, id }),
        _ => Err(Error::Malformed),
    }
}

fn mandatory<'a>(tlvs: &mut Tlvs<'a>, kind: u8) -> Result<&'a [u8]> {
    match tlvs.next() {
        Some(Ok(t)) if t.kind == kind => Ok(t.value),
        Some(Err(e)) => Err(e),
        None => Err(Error::Truncated),
        Some(Ok(_)) => Err(Error::Malformed),
    }
}

impl<'a> Lldpdu<'a> {
    /// Parses the TLVs after the Ethernet header.
    pub fn parse(pdu: &'a [u8]) -> Result<Lldpdu<'a>> {
        let mut iter = tlvs(pdu);
        let chassis_id = id(mandatory(&mut iter, tlv::CHASSIS_ID)?)?;
        let port_id = id(mandatory(&mut iter, tlv::PORT_ID)?)?;
        let ttl = match mandatory(&mut iter, tlv::TTL)? {
            [a, b, ..] => u16::from_be_bytes([*a, *b]),
            _ => return Err(Error::Malformed),
        };
        let mut out = Lldpdu {
            chassis_id,
            port_id,
            ttl,
            port_description: None,
            system_name: None,
            system_description: None,
            management_address: None,
        };
        for t in iter {
            let t = t?;
            match t.kind {
                // A second chassis id, port id or TTL makes the PDU invalid (9.2.7.7.1).
                tlv::CHASSIS_ID | tlv::PORT_ID | tlv::TTL => return Err(Error::Malformed),
                tlv::PORT_DESCRIPTION => out.port_description = Some(t.value),
                tlv::SYSTEM_NAME => out.system_name = Some(t.value),
                tlv::SYSTEM_DESCRIPTION => out.system_description = Some(t.value),
                tlv::MANAGEMENT_ADDRESS if out.management_address.is_none() => {
                    out.management_address = ManagementAddress::parse(t.value);
                }
                _ => {}
            }
        }
        Ok(out)
    }

    /// Parses a whole untagged frame to one of the LLDP group addresses. Returns the
    /// sender's MAC address with the PDU.
    pub fn parse_frame(frame: &'a [u8]) -> Result<(MacAddr, Lldpdu<'a>)> {
        let eth = crate::ethernet::Frame::new_checked(frame)?;
        let dst = eth.dst_addr();
        if (dst != NEAREST_BRIDGE_MAC && !OTHER_GROUP_MACS.contains(&dst))
            || u16::from(eth.ethertype()) != ETHERTYPE
        {
            return Err(Error::Malformed);
        }
        Ok((eth.src_addr(), Lldpdu::parse(eth.payload())?))
    }

    /// The number of bytes [`emit`](Self::emit) writes.
    pub fn len(&self) -> usize {
        let opt = |v: Option<&[u8]>| v.map_or(0, |v| 2 + v.len());
        (2 + 1 + self.chassis_id.id.len())
            + (2 + 1 + self.port_id.id.len())
            + (2 + 2)
            + opt(self.port_description)
            + opt(self.system_name)
            + opt(self.system_description)
            + self.management_address.map_or(0, |m| 2 + m.len())
            + 2
    }

    /// Always false: an LLDPDU has at least its three mandatory TLVs.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the TLVs into `buf`, ending with an End TLV, and returns the length written.
    /// Fails with [`Error::Truncated`] if `buf` is too short and with [`Error::Malformed`] if
    /// a field is longer than its TLV allows (ids 1..=255 bytes, strings up to 255 bytes,
    /// a management address of 1..=31 bytes and an OID up to 128).
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let len = self.len();
        let out = buf.get_mut(..len).ok_or(Error::Truncated)?;
        let ok_id = |i: &Id<'_>| (1..=255).contains(&i.id.len());
        let ok_str = |s: Option<&[u8]>| s.is_none_or(|s| s.len() <= 255);
        let ok_mgmt = self
            .management_address
            .is_none_or(|m| (1..=31).contains(&m.address.len()) && m.oid.len() <= 128);
        if !ok_id(&self.chassis_id)
            || !ok_id(&self.port_id)
            || !ok_str(self.port_description)
            || !ok_str(self.system_name)
            || !ok_str(self.system_description)
            || !ok_mgmt
        {
            return Err(Error::Malformed);
        }
        let mut w = Writer { out, at: 0 };
        w.tlv(
            tlv::CHASSIS_ID,
            &[&[self.chassis_id.subtype], self.chassis_id.id],
        );
        w.tlv(tlv::PORT_ID, &[&[self.port_id.subtype], self.port_id.id]);
        w.tlv(tlv::TTL, &[&self.ttl.to_be_bytes()]);
        for (kind, value) in [
            (tlv::PORT_DESCRIPTION, self.port_description),
            (tlv::SYSTEM_NAME, self.system_name),
            (tlv::SYSTEM_DESCRIPTION, self.system_description),
        ] {
            if let Some(v) = value {
                w.tlv(kind, &[v]);
            }
        }
        if let Some(m) = self.management_address {
            w.tlv(
                tlv::MANAGEMENT_ADDRESS,
                &[
                    &[m.address.len() as u8 + 1, m.family],
                    m.address,
                    &[m.if_subtype],
                    &m.if_number.to_be_bytes(),
                    &[m.oid.len() as u8],
                    m.oid,
                ],
            );
        }
        w.tlv(tlv::END, &[]);
        Ok(w.at)
    }

    /// Writes a whole frame from `src` to [`NEAREST_BRIDGE_MAC`] into `buf`, padded with
    /// zeros to 60 bytes, and returns its length.
    pub fn frame(&self, src: MacAddr, buf: &mut [u8]) -> Result<usize> {
        let hdr = crate::ethernet::HEADER_LEN;
        let len = (hdr + self.len()).max(60);
        let out = buf.get_mut(..len).ok_or(Error::Truncated)?;
        out.fill(0);
        out[0..6].copy_from_slice(&NEAREST_BRIDGE_MAC.0);
        out[6..12].copy_from_slice(&src.0);
        out[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        self.emit(&mut out[hdr..])?;
        Ok(len)
    }
}

/// Writes TLVs into a buffer already known to be long enough.
struct Writer<'b> {
    out: &'b mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn tlv(&mut self, kind: u8, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let header = (u16::from(kind) << 9) | (len as u16 & 0x1ff);
        self.out[self.at..self.at + 2].copy_from_slice(&header.to_be_bytes());
        self.at += 2;
        for p in parts {
            self.out[self.at..self.at + p.len()].copy_from_slice(p);
            self.at += p.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Lldpdu<'static> {
        Lldpdu {
            chassis_id: Id {
                subtype: chassis_subtype::MAC_ADDRESS,
                id: &[0x02, 0, 0, 0, 0, 1],
            },
            port_id: Id {
                subtype: port_subtype::INTERFACE_NAME,
                id: b"eth1",
            },
            ttl: 120,
            port_description: Some(b"uplink member"),
            system_name: Some(b"host1"),
            system_description: None,
            management_address: Some(ManagementAddress {
                family: family::IPV4,
                address: &[192, 0, 2, 1],
                if_subtype: 2,
                if_number: 7,
                oid: &[],
            }),
        }
    }

    /// An LLDP frame lldpd 1.0.16 sent on a veth in a namespace (`-S "lldp test peer"`,
    /// `configure system hostname lldp-peer`, `configure lldp tx-interval 1`), captured with
    /// tcpdump: MAC chassis and port ids, TTL 4, system name and description, system
    /// capabilities, an IPv6 management address, port description "e0", two
    /// organizationally specific TLVs (802.3 link aggregation, MAC/PHY) and End.
    static LLDPD_FRAME: [u8; 123] = [
        0x01, 0x80, 0xc2, 0x00, 0x00, 0x0e, 0x12, 0x9e, 0xe8, 0xd8, 0x36, 0x95, 0x88, 0xcc, 0x02,
        0x07, 0x04, 0x12, 0x9e, 0xe8, 0xd8, 0x36, 0x95, 0x04, 0x07, 0x03, 0x12, 0x9e, 0xe8, 0xd8,
        0x36, 0x95, 0x06, 0x02, 0x00, 0x04, 0x0a, 0x09, 0x6c, 0x6c, 0x64, 0x70, 0x2d, 0x70, 0x65,
        0x65, 0x72, 0x0c, 0x0e, 0x6c, 0x6c, 0x64, 0x70, 0x20, 0x74, 0x65, 0x73, 0x74, 0x20, 0x70,
        0x65, 0x65, 0x72, 0x0e, 0x04, 0x00, 0x9c, 0x00, 0x80, 0x10, 0x18, 0x11, 0x02, 0xfe, 0x80,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x9e, 0xe8, 0xff, 0xfe, 0xd8, 0x36, 0x95, 0x02,
        0x00, 0x00, 0x00, 0x02, 0x00, 0x08, 0x02, 0x65, 0x30, 0xfe, 0x09, 0x00, 0x12, 0x0f, 0x03,
        0x01, 0x00, 0x00, 0x00, 0x00, 0xfe, 0x09, 0x00, 0x12, 0x0f, 0x01, 0x00, 0x80, 0x00, 0x00,
        0x36, 0x00, 0x00,
    ];

    #[test]
    fn parses_an_lldpd_frame() {
        let (src, pdu) = Lldpdu::parse_frame(&LLDPD_FRAME).unwrap();
        let mac = MacAddr([0x12, 0x9e, 0xe8, 0xd8, 0x36, 0x95]);
        assert_eq!(src, mac);
        assert_eq!(pdu.chassis_id.mac(chassis_subtype::MAC_ADDRESS), Some(mac));
        assert_eq!(pdu.port_id.mac(port_subtype::MAC_ADDRESS), Some(mac));
        assert_eq!(pdu.ttl, 4);
        assert_eq!(pdu.system_name, Some(&b"lldp-peer"[..]));
        assert_eq!(pdu.system_description, Some(&b"lldp test peer"[..]));
        assert_eq!(pdu.port_description, Some(&b"e0"[..]));
        let m = pdu.management_address.unwrap();
        assert_eq!(m.ip(), Some("fe80::109e:e8ff:fed8:3695".parse().unwrap()));
        assert_eq!((m.if_subtype, m.if_number), (2, 2));
        let kinds: Vec<u8> = tlvs(&LLDPD_FRAME[14..]).map(|t| t.unwrap().kind).collect();
        assert_eq!(kinds, [1, 2, 3, 5, 6, 7, 8, 4, 127, 127]);
    }

    #[test]
    fn round_trips() {
        let pdu = sample();
        let mut buf = [0xaau8; 200];
        let len = pdu.emit(&mut buf).unwrap();
        assert_eq!(len, pdu.len());
        assert_eq!(&buf[len - 2..len], &[0, 0], "End TLV");
        assert_eq!(Lldpdu::parse(&buf[..len]), Ok(pdu));
        let m = pdu.management_address.unwrap();
        assert_eq!(m.ip(), Some(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1))));
        assert_eq!(
            pdu.chassis_id.mac(chassis_subtype::MAC_ADDRESS),
            MacAddr::from_bytes(&[2, 0, 0, 0, 0, 1])
        );

        let src = MacAddr([2, 0, 0, 0, 0, 9]);
        let flen = pdu.frame(src, &mut buf).unwrap();
        assert_eq!(Lldpdu::parse_frame(&buf[..flen]), Ok((src, pdu)));
        assert_eq!(pdu.frame(src, &mut buf[..20]), Err(Error::Truncated));
    }

    #[test]
    fn mandatory_tlvs_first_and_once() {
        let mut buf = [0u8; 200];
        let len = sample().emit(&mut buf).unwrap();
        let pdu = &buf[..len];
        // No End TLV: accepted.
        assert!(Lldpdu::parse(&pdu[..len - 2]).is_ok());
        // Cut inside a TLV.
        assert_eq!(Lldpdu::parse(&pdu[..5]), Err(Error::Truncated));
        assert_eq!(Lldpdu::parse(&[]), Err(Error::Truncated));
        // Port ID first.
        let mut bad = pdu.to_vec();
        bad[0] = tlv::PORT_ID << 1;
        assert_eq!(Lldpdu::parse(&bad), Err(Error::Malformed));
        // A second TTL.
        let mut twice = pdu[..len - 2].to_vec();
        twice.extend_from_slice(&[tlv::TTL << 1, 2, 0, 5, 0, 0]);
        assert_eq!(Lldpdu::parse(&twice), Err(Error::Malformed));
        // An empty chassis id.
        assert_eq!(Lldpdu::parse(&[2, 1, 4]), Err(Error::Malformed));
        // An id too long to emit.
        let long = [0u8; 256];
        let mut p = sample();
        p.port_id.id = &long;
        assert_eq!(p.emit(&mut [0u8; 600]), Err(Error::Malformed));
    }

    #[test]
    fn bad_management_address_is_skipped() {
        let mut p = sample();
        p.management_address = None;
        let mut buf = [0u8; 200];
        let len = p.emit(&mut buf).unwrap();
        let mut pdu = buf[..len - 2].to_vec();
        // Address string length 40: out of range.
        pdu.extend_from_slice(&[tlv::MANAGEMENT_ADDRESS << 1, 3, 40, 1, 1]);
        let got = Lldpdu::parse(&pdu).unwrap();
        assert_eq!(got.management_address, None);
        assert_eq!(got.system_name, Some(&b"host1"[..]));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(pdu) = Lldpdu::parse(&bytes) {
                let mut again = vec![0u8; pdu.len()];
                if pdu.emit(&mut again).is_ok() {
                    prop_assert_eq!(Lldpdu::parse(&again), Ok(pdu));
                }
            }
            let _ = Lldpdu::parse_frame(&bytes);
            for t in tlvs(&bytes) {
                let _ = t;
            }
        }
    }
}
