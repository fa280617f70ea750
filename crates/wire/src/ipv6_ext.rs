//! The IPv6 extension-header walk of [`ipv6::Packet::upper_layer`], also reporting whether a
//! Fragment header was passed and what it said. Decapsulation must drop every fragment (a
//! first fragment included) and the port-security guard must know when the upper layer is
//! out of reach, which `upper_layer` does not tell.

use crate::{ipv6, read_u16, Error, IpProtocol, Result};

const FRAG_HEADER_LEN: usize = 8;
const FRAG_OFFSET_MASK: u16 = 0xfff8;
const FRAG_MORE: u16 = 0x0001;

/// Where the upper-layer header is, and the Fragment header on the way if there was one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walk {
    /// The last Next Header value: the upper-layer protocol.
    pub protocol: IpProtocol,
    /// Offset of the upper-layer header from the start of the IPv6 header.
    pub offset: usize,
    /// The fragment offset in bytes and the M flag of a Fragment header, if one was passed.
    pub fragment: Option<(u16, bool)>,
}

impl Walk {
    /// Whether the packet is a fragment: a Fragment header with a non-zero offset or the M
    /// flag set. An atomic fragment (offset 0, M clear; RFC 6946) is a whole packet.
    pub fn is_fragment(&self) -> bool {
        matches!(self.fragment, Some((offset, more)) if offset != 0 || more)
    }

    /// Whether the upper-layer header is not in this packet (a non-first fragment).
    pub fn later_fragment(&self) -> bool {
        matches!(self.fragment, Some((offset, _)) if offset != 0)
    }
}

/// Walks the extension headers of a checked packet, as [`ipv6::Packet::upper_layer`] does,
/// with the same errors and limit.
pub(crate) fn walk(ip: &ipv6::Packet<&[u8]>) -> Result<Walk> {
    let payload = ip.payload();
    let mut protocol = ip.next_header();
    // Offsets below are relative to the payload.
    let mut offset = 0;
    let mut fragment = None;
    for skipped in 0..=ipv6::MAX_EXT_HEADERS {
        let len = match protocol {
            IpProtocol::HopByHop | IpProtocol::Ipv6Route | IpProtocol::Ipv6Opts => {
                let units = payload.get(offset + 1).ok_or(Error::Truncated)?;
                (usize::from(*units) + 1) * 8
            }
            IpProtocol::Ipv6Frag => FRAG_HEADER_LEN,
            _ => {
                return Ok(Walk {
                    protocol,
                    offset: ipv6::HEADER_LEN + offset,
                    fragment,
                })
            }
        };
        if skipped == ipv6::MAX_EXT_HEADERS {
            break;
        }
        let header = payload.get(offset..offset + len).ok_or(Error::Truncated)?;
        if protocol == IpProtocol::Ipv6Frag {
            let word = read_u16(header, 2..4);
            fragment = Some((word & FRAG_OFFSET_MASK, word & FRAG_MORE != 0));
        }
        protocol = header[0].into();
        offset += len;
    }
    Err(Error::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{frag6_first, FRAG6_LAST, MLD_REPORT, UDP6};

    fn walk_frame(frame: &[u8]) -> Result<Walk> {
        walk(&ipv6::Packet::new_checked(&frame[14..]).unwrap())
    }

    #[test]
    fn agrees_with_upper_layer() {
        for frame in [&UDP6[..], &MLD_REPORT, &frag6_first(), &FRAG6_LAST] {
            let ip = ipv6::Packet::new_checked(&frame[14..]).unwrap();
            let upper = ip.upper_layer().unwrap();
            let walk = walk(&ip).unwrap();
            assert_eq!((walk.protocol, walk.offset), (upper.protocol, upper.offset));
            assert_eq!(walk.later_fragment(), upper.later_fragment);
        }
    }

    #[test]
    fn fragments() {
        assert_eq!(walk_frame(&UDP6).unwrap().fragment, None);
        let first = walk_frame(&frag6_first()).unwrap();
        assert_eq!(first.fragment, Some((0, true)));
        assert!(first.is_fragment() && !first.later_fragment());
        let last = walk_frame(&FRAG6_LAST).unwrap();
        assert_eq!(last.fragment, Some((1232, false)));
        assert!(last.is_fragment() && last.later_fragment());
        // An atomic fragment: offset 0, M clear.
        let mut atomic = frag6_first();
        atomic[57] = 0;
        let walk = walk_frame(&atomic).unwrap();
        assert_eq!(walk.fragment, Some((0, false)));
        assert!(!walk.is_fragment());
    }

    #[test]
    fn truncated() {
        let mut packet = MLD_REPORT[14..].to_vec();
        ipv6::Packet::new_unchecked(&mut packet[..]).set_payload_len(7);
        let ip = ipv6::Packet::new_checked(&packet[..]).unwrap();
        assert_eq!(walk(&ip), Err(Error::Truncated));
    }
}
