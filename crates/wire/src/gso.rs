//! Software segmentation of TSO frames (GSO TCPv4 / TCPv6), for destinations that did not
//! negotiate TSO.
//!
//! A TSO frame carries one set of Ethernet/IP/TCP headers and up to 64 KiB of payload, with
//! `gso_size` (the MSS) in its virtio-net header. [`segment`] cuts the payload into MSS-sized
//! pieces and gives each piece its own copy of the headers, fixed up as the kernel's
//! `tcp_gso_segment` does: IPv4 total length, identification (+1 per segment) and header
//! checksum; IPv6 payload length; TCP sequence number; FIN and PSH only on the last segment,
//! CWR only on the first; and a complete TCP checksum on every segment.
//!
//! # Limitations
//! IPv6 extension headers between the IPv6 and TCP headers are not supported (the frame is
//! refused); UDP GSO types are refused.

use core::net::{Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::virtio_net_hdr::{VirtioNetHdr, GSO_ECN, GSO_TCPV4, GSO_TCPV6};
use crate::{Error, IpProtocol, Result};

const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const CWR: u8 = 0x80;

/// Cuts `frame` (described by `hdr`) into wire segments, calling `emit` with each one.
/// `scratch` must hold the headers plus one MSS of payload. Returns the number of segments.
pub fn segment(
    frame: &[u8],
    hdr: &VirtioNetHdr,
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<u32> {
    segment_while(frame, hdr, scratch, |s| {
        emit(s);
        true
    })
}

/// [`segment`], stopping as soon as `emit` returns false (the destination is full: the rest
/// would only be dropped, so it is not built). Returns the number of segments emitted.
/// A `gso_size` below [`MIN_GSO_SIZE`](crate::virtio_net_hdr::MIN_GSO_SIZE) is refused.
pub fn segment_while(
    frame: &[u8],
    hdr: &VirtioNetHdr,
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]) -> bool,
) -> Result<u32> {
    let v6 = match hdr.gso_type & !GSO_ECN {
        GSO_TCPV4 => false,
        GSO_TCPV6 => true,
        _ => return Err(Error::Malformed),
    };
    if hdr.gso_size < crate::virtio_net_hdr::MIN_GSO_SIZE {
        return Err(Error::Malformed);
    }
    let mss = usize::from(hdr.gso_size);
    let mut l3 = 14;
    if frame.len() < l3 {
        return Err(Error::Truncated);
    }
    if frame[12..14] == [0x81, 0x00] {
        l3 += 4;
    }
    let ethertype = frame.get(l3 - 2..l3).ok_or(Error::Truncated)?;
    let (l4, ip_src, ip_dst) = if v6 {
        if ethertype != [0x86, 0xdd] {
            return Err(Error::Malformed);
        }
        let ip = frame.get(l3..l3 + 40).ok_or(Error::Truncated)?;
        if ip[6] != 6 {
            return Err(Error::Malformed);
        }
        (l3 + 40, l3 + 8, l3 + 24)
    } else {
        if ethertype != [0x08, 0x00] {
            return Err(Error::Malformed);
        }
        let ip = frame.get(l3..l3 + 20).ok_or(Error::Truncated)?;
        let ihl = usize::from(ip[0] & 0x0f) * 4;
        if ihl < 20 || ip[9] != 6 {
            return Err(Error::Malformed);
        }
        (l3 + ihl, l3 + 12, l3 + 16)
    };
    let tcp = frame.get(l4..l4 + 20).ok_or(Error::Truncated)?;
    let doff = usize::from(tcp[12] >> 4) * 4;
    if doff < 20 {
        return Err(Error::Malformed);
    }
    let hlen = l4 + doff;
    if frame.len() < hlen || scratch.len() < hlen + mss {
        return Err(Error::Truncated);
    }
    let payload = &frame[hlen..];
    if payload.is_empty() {
        return Err(Error::Malformed);
    }
    let seq0 = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    let flags0 = tcp[13];
    let id0 = u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]);
    let chunks = payload.len().div_ceil(mss);
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let len = hlen + chunk.len();
        let out = &mut scratch[..len];
        out[..hlen].copy_from_slice(&frame[..hlen]);
        out[hlen..].copy_from_slice(chunk);
        let l4_len = doff + chunk.len();
        if v6 {
            out[l3 + 4..l3 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        } else {
            let total = (l4 - l3 + l4_len) as u16;
            out[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
            out[l3 + 4..l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
            out[l3 + 10..l3 + 12].fill(0);
            let c = checksum::fold(checksum::sum16(&out[l3..l4], 0));
            out[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        let seq = seq0.wrapping_add((i * mss) as u32);
        out[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        let mut flags = flags0;
        if i + 1 < chunks {
            flags &= !(FIN | PSH);
        }
        if i > 0 {
            flags &= !CWR;
        }
        out[l4 + 13] = flags;
        out[l4 + 16..l4 + 18].fill(0);
        let pseudo = if v6 {
            let a: [u8; 16] = out[ip_src..ip_src + 16]
                .try_into()
                .map_err(|_| Error::Truncated)?;
            let b: [u8; 16] = out[ip_dst..ip_dst + 16]
                .try_into()
                .map_err(|_| Error::Truncated)?;
            checksum::pseudo_header_v6(
                Ipv6Addr::from(a),
                Ipv6Addr::from(b),
                IpProtocol::Tcp,
                l4_len as u32,
            )
        } else {
            let a: [u8; 4] = out[ip_src..ip_src + 4]
                .try_into()
                .map_err(|_| Error::Truncated)?;
            let b: [u8; 4] = out[ip_dst..ip_dst + 4]
                .try_into()
                .map_err(|_| Error::Truncated)?;
            checksum::pseudo_header_v4(
                Ipv4Addr::from(a),
                Ipv4Addr::from(b),
                IpProtocol::Tcp,
                l4_len as u16,
            )
        };
        let c = checksum::fold(checksum::sum16(&out[l4..], pseudo));
        out[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        if !emit(out) {
            return Ok(i as u32 + 1);
        }
    }
    Ok(chunks as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TSO frame: Ethernet + IPv4 (id 0x1234) + TCP (seq 1000, PSH|ACK|FIN) + `n` bytes.
    fn tso_v4(n: usize) -> Vec<u8> {
        let mut f = vec![0u8; 54 + n];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((40 + n) as u16).to_be_bytes());
        f[18..20].copy_from_slice(&0x1234u16.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&5000u16.to_be_bytes());
        f[36..38].copy_from_slice(&5201u16.to_be_bytes());
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = 0x19; // FIN PSH ACK
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = i as u8;
        }
        f
    }

    fn tcp_ok(seg: &[u8]) -> bool {
        let ph = checksum::pseudo_header_v4(
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            IpProtocol::Tcp,
            (seg.len() - 34) as u16,
        );
        checksum::fold(checksum::sum16(&seg[34..], ph)) == 0
    }

    #[test]
    fn segments_ipv4_tcp() {
        let f = tso_v4(3000);
        let hdr = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1448,
            hdr_len: 54,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 2000];
        let mut segs = Vec::new();
        let n = segment(&f, &hdr, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        assert_eq!(n, 3);
        assert_eq!(
            segs.iter().map(|s| s.len() - 54).collect::<Vec<_>>(),
            vec![1448, 1448, 104]
        );
        let mut payload = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            assert_eq!(
                checksum::fold(checksum::sum16(&s[14..34], 0)),
                0,
                "IPv4 checksum"
            );
            assert!(tcp_ok(s), "TCP checksum of segment {i}");
            assert_eq!(u16::from_be_bytes([s[16], s[17]]) as usize, s.len() - 14);
            assert_eq!(u16::from_be_bytes([s[18], s[19]]), 0x1234 + i as u16);
            assert_eq!(
                u32::from_be_bytes([s[38], s[39], s[40], s[41]]),
                1000 + (i as u32) * 1448
            );
            let last = i == 2;
            assert_eq!(s[47] & (FIN | PSH) != 0, last);
            payload.extend_from_slice(&s[54..]);
        }
        assert_eq!(payload, f[54..]);
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        let f = tso_v4(100);
        let mut scratch = vec![0u8; 2000];
        let udp = VirtioNetHdr {
            gso_type: 3,
            gso_size: 100,
            ..Default::default()
        };
        assert!(segment(&f, &udp, &mut scratch, |_| {}).is_err());
        let no_mss = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            ..Default::default()
        };
        assert!(segment(&f, &no_mss, &mut scratch, |_| {}).is_err());
        let v6 = VirtioNetHdr {
            gso_type: GSO_TCPV6,
            gso_size: 100,
            ..Default::default()
        };
        assert!(
            segment(&f, &v6, &mut scratch, |_| {}).is_err(),
            "IPv4 frame with a TCPv6 GSO type"
        );
        let ok = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1448,
            ..Default::default()
        };
        assert!(
            segment(&f[..40], &ok, &mut scratch, |_| {}).is_err(),
            "truncated"
        );
        assert!(
            segment(&f, &ok, &mut scratch[..100], |_| {}).is_err(),
            "scratch too small"
        );
    }

    #[test]
    fn absurd_mss_is_refused_and_a_full_destination_stops_it() {
        // F7: 64 KB with gso_size 1 would be 65 000 segments.
        let f = tso_v4(60_000);
        let mut scratch = vec![0u8; 2000];
        let tiny = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1,
            ..Default::default()
        };
        let mut n = 0;
        assert!(segment(&f, &tiny, &mut scratch, |_| n += 1).is_err());
        assert_eq!(n, 0);
        let ok = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: crate::virtio_net_hdr::MIN_GSO_SIZE,
            ..Default::default()
        };
        // The destination takes three segments, then is full: nothing more is built.
        let mut built = 0;
        let emitted = segment_while(&f, &ok, &mut scratch, |_| {
            built += 1;
            built < 3
        })
        .unwrap();
        assert_eq!((built, emitted), (3, 3));
    }

    #[test]
    fn never_panics() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..400), mss in 0u16..300, v6 in any::<bool>())| {
            let hdr = VirtioNetHdr { gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 }, gso_size: mss, ..Default::default() };
            let mut scratch = vec![0u8; 1000];
            let _ = segment(&bytes, &hdr, &mut scratch, |_| {});
        });
    }
}
