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
    let plan = Plan::new(frame, hdr)?;
    if scratch.len() < plan.hlen + plan.mss {
        return Err(Error::Truncated);
    }
    for i in 0..plan.chunks {
        let out = plan.write(i, scratch);
        if !emit(out) {
            return Ok(i as u32 + 1);
        }
    }
    Ok(plan.chunks as u32)
}

/// The length of the first (and longest) segment [`segment`] would cut `frame` into.
pub fn first_segment_len(frame: &[u8], hdr: &VirtioNetHdr) -> Result<usize> {
    let plan = Plan::new(frame, hdr)?;
    Ok(plan.len(0))
}

/// Segments `frame` as [`segment`] does into `out`, each segment behind its own copy of
/// `prefix` (a tunnel header, say): the records lie back to back from the start of `out`,
/// all of `prefix.len() + ` [`first_segment_len`] bytes but the last, which may be shorter,
/// as `UDP_SEGMENT` wants datagrams. Saves [`segment`]'s copy out of a scratch buffer.
/// Returns the number of segments and the bytes written; [`Error::Truncated`] (nothing
/// written) when `out` is shorter than [`packed_len`].
pub fn segment_packed(
    frame: &[u8],
    hdr: &VirtioNetHdr,
    prefix: &[u8],
    out: &mut [u8],
) -> Result<(u32, usize)> {
    let plan = Plan::new(frame, hdr)?;
    let total = plan.packed_len(prefix.len());
    if out.len() < total {
        return Err(Error::Truncated);
    }
    let mut at = 0;
    for i in 0..plan.chunks {
        out[at..at + prefix.len()].copy_from_slice(prefix);
        at += prefix.len();
        at += plan.write(i, &mut out[at..]).len();
    }
    debug_assert_eq!(at, total);
    Ok((plan.chunks as u32, total))
}

/// The bytes [`segment_packed`] writes for `frame` with a prefix of `prefix_len` bytes.
pub fn packed_len(frame: &[u8], hdr: &VirtioNetHdr, prefix_len: usize) -> Result<usize> {
    Ok(Plan::new(frame, hdr)?.packed_len(prefix_len))
}

/// How [`segment_headers`] cut a frame: segment `i`'s payload is
/// `frame[hlen + i * mss ..][..mss]` (the last one shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Segments.
    pub segments: usize,
    /// Bytes of headers (Ethernet to TCP options) of every segment.
    pub hlen: usize,
    /// Payload bytes per segment.
    pub mss: usize,
}

impl Layout {
    /// Where segment `i`'s payload is in the frame.
    pub fn payload(&self, i: usize, frame_len: usize) -> core::ops::Range<usize> {
        let start = self.hlen + i * self.mss;
        start.min(frame_len)..(start + self.mss).min(frame_len)
    }
}

/// Segments `frame` as [`segment`] does without copying its payload: writes only each
/// segment's headers, behind a copy of `prefix`, back to back into `out` (`prefix.len() +
/// hlen` bytes each, complete with lengths, sequence numbers and the TCP checksum over the
/// headers and the payload, which stays in `frame`), for a gathering send: `[prefix +
/// headers 0][payload 0][prefix + headers 1][payload 1]…`. [`Error::Truncated`] (nothing
/// written) when `out` is shorter than `segments * (prefix.len() + hlen)`.
pub fn segment_headers(
    frame: &[u8],
    hdr: &VirtioNetHdr,
    prefix: &[u8],
    out: &mut [u8],
) -> Result<Layout> {
    let plan = Plan::new(frame, hdr)?;
    let each = prefix.len() + plan.hlen;
    if out.len() < plan.chunks * each {
        return Err(Error::Truncated);
    }
    for (i, rec) in out.chunks_exact_mut(each).take(plan.chunks).enumerate() {
        rec[..prefix.len()].copy_from_slice(prefix);
        plan.write_headers(i, &mut rec[prefix.len()..]);
    }
    Ok(Layout {
        segments: plan.chunks,
        hlen: plan.hlen,
        mss: plan.mss,
    })
}

/// The bytes [`segment_headers`] writes for `frame` behind a prefix of `prefix_len` bytes.
pub fn headers_len(frame: &[u8], hdr: &VirtioNetHdr, prefix_len: usize) -> Result<usize> {
    let plan = Plan::new(frame, hdr)?;
    Ok(plan.chunks * (prefix_len + plan.hlen))
}

/// Where a TSO frame's headers are and how its payload is cut.
struct Plan<'a> {
    frame: &'a [u8],
    v6: bool,
    l3: usize,
    l4: usize,
    ip_src: usize,
    ip_dst: usize,
    doff: usize,
    hlen: usize,
    mss: usize,
    payload: usize,
    chunks: usize,
    seq0: u32,
    flags0: u8,
    id0: u16,
}

impl<'a> Plan<'a> {
    fn new(frame: &'a [u8], hdr: &VirtioNetHdr) -> Result<Plan<'a>> {
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
        if frame.len() < hlen {
            return Err(Error::Truncated);
        }
        let payload = frame.len() - hlen;
        if payload == 0 {
            return Err(Error::Malformed);
        }
        Ok(Plan {
            frame,
            v6,
            l3,
            l4,
            ip_src,
            ip_dst,
            doff,
            hlen,
            mss,
            payload,
            chunks: payload.div_ceil(mss),
            seq0: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
            flags0: tcp[13],
            id0: u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]),
        })
    }

    /// All segments, each behind `prefix_len` bytes.
    fn packed_len(&self, prefix_len: usize) -> usize {
        self.chunks * (prefix_len + self.hlen) + self.payload
    }

    /// The length of segment `i`.
    fn len(&self, i: usize) -> usize {
        self.hlen + self.mss.min(self.payload - i * self.mss)
    }

    /// Writes segment `i` (< `chunks`) at the start of `out` (at least [`Plan::len`] long)
    /// and returns it.
    fn write<'o>(&self, i: usize, out: &'o mut [u8]) -> &'o [u8] {
        let hlen = self.hlen;
        let chunk = self.chunk(i);
        let len = hlen + chunk.len();
        out[hlen..len].copy_from_slice(chunk);
        self.write_headers(i, &mut out[..hlen]);
        &out[..len]
    }

    /// Segment `i`'s payload, in the frame.
    fn chunk(&self, i: usize) -> &'a [u8] {
        let from = self.hlen + i * self.mss;
        &self.frame[from..(from + self.mss).min(self.frame.len())]
    }

    /// Writes segment `i`'s headers (`hlen` bytes) at the start of `out`, with the TCP
    /// checksum over them and the payload (read from the frame).
    fn write_headers(&self, i: usize, out: &mut [u8]) {
        let (l3, l4, hlen) = (self.l3, self.l4, self.hlen);
        let chunk = self.chunk(i);
        let out = &mut out[..hlen];
        out.copy_from_slice(&self.frame[..hlen]);
        let l4_len = self.doff + chunk.len();
        if self.v6 {
            out[l3 + 4..l3 + 6].copy_from_slice(&(l4_len as u16).to_be_bytes());
        } else {
            let total = (l4 - l3 + l4_len) as u16;
            out[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
            out[l3 + 4..l3 + 6].copy_from_slice(&self.id0.wrapping_add(i as u16).to_be_bytes());
            out[l3 + 10..l3 + 12].fill(0);
            let c = checksum::fold(checksum::sum16(&out[l3..l4], 0));
            out[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        let seq = self.seq0.wrapping_add((i * self.mss) as u32);
        out[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        let mut flags = self.flags0;
        if i + 1 < self.chunks {
            flags &= !(FIN | PSH);
        }
        if i > 0 {
            flags &= !CWR;
        }
        out[l4 + 13] = flags;
        out[l4 + 16..l4 + 18].fill(0);
        let pseudo = if self.v6 {
            let mut a = [0u8; 16];
            let mut b = [0u8; 16];
            a.copy_from_slice(&out[self.ip_src..self.ip_src + 16]);
            b.copy_from_slice(&out[self.ip_dst..self.ip_dst + 16]);
            checksum::pseudo_header_v6(
                Ipv6Addr::from(a),
                Ipv6Addr::from(b),
                IpProtocol::Tcp,
                l4_len as u32,
            )
        } else {
            let mut a = [0u8; 4];
            let mut b = [0u8; 4];
            a.copy_from_slice(&out[self.ip_src..self.ip_src + 4]);
            b.copy_from_slice(&out[self.ip_dst..self.ip_dst + 4]);
            checksum::pseudo_header_v4(
                Ipv4Addr::from(a),
                Ipv4Addr::from(b),
                IpProtocol::Tcp,
                l4_len as u16,
            )
        };
        // The TCP header is a whole number of 32-bit words: the payload's sum chains on.
        let sum = checksum::sum16(&out[l4..], pseudo);
        let c = checksum::fold(checksum::sum16(chunk, sum));
        out[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
    }
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
    fn packed_segments_are_the_same_segments_behind_a_prefix() {
        let f = tso_v4(3000);
        let hdr = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1448,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 2000];
        let mut segs = Vec::new();
        segment(&f, &hdr, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        assert_eq!(first_segment_len(&f, &hdr).unwrap(), 54 + 1448);
        let len = packed_len(&f, &hdr, 4).unwrap();
        let mut out = vec![9u8; len + 3];
        assert_eq!(
            segment_packed(&f, &hdr, b"HDR!", &mut out).unwrap(),
            (3, len)
        );
        let mut want = Vec::new();
        for s in &segs {
            want.extend_from_slice(b"HDR!");
            want.extend_from_slice(s);
        }
        want.extend_from_slice(&[9; 3]);
        assert_eq!(out, want);
        let before = out.clone();
        assert!(segment_packed(&f[..40], &hdr, b"x", &mut out).is_err());
        assert!(segment_packed(&f, &hdr, b"HDR!", &mut out[..len - 1]).is_err());
        assert_eq!(out, before, "untouched on an error");
    }

    #[test]
    fn headers_and_payload_in_place_are_the_same_segments() {
        let f = tso_v4(3000);
        let hdr = VirtioNetHdr {
            gso_type: GSO_TCPV4,
            gso_size: 1448,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 2000];
        let mut segs = Vec::new();
        segment(&f, &hdr, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        let len = headers_len(&f, &hdr, 2).unwrap();
        assert_eq!(len, 3 * (2 + 54));
        let mut out = vec![0u8; len];
        let layout = segment_headers(&f, &hdr, b"PF", &mut out).unwrap();
        assert_eq!(
            layout,
            Layout {
                segments: 3,
                hlen: 54,
                mss: 1448
            }
        );
        for (i, s) in segs.iter().enumerate() {
            let rec = &out[i * 56..(i + 1) * 56];
            assert_eq!(&rec[..2], b"PF");
            let mut joined = rec[2..].to_vec();
            joined.extend_from_slice(&f[layout.payload(i, f.len())]);
            assert_eq!(&joined, s, "segment {i}");
        }
        assert!(segment_headers(&f, &hdr, b"PF", &mut out[..len - 1]).is_err());
    }

    #[test]
    fn never_panics() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..400), mss in 0u16..300, v6 in any::<bool>())| {
            let hdr = VirtioNetHdr { gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 }, gso_size: mss, ..Default::default() };
            let mut scratch = vec![0u8; 1000];
            let _ = segment(&bytes, &hdr, &mut scratch, |_| {});
            let mut out = vec![0u8; 2000];
            let _ = segment_headers(&bytes, &hdr, &[1, 2], &mut out);
            if let Ok((n, len)) = segment_packed(&bytes, &hdr, &[1, 2], &mut out) {
                let first = first_segment_len(&bytes, &hdr).unwrap();
                prop_assert!(n >= 1 && len <= n as usize * (first + 2));
                prop_assert_eq!(len, packed_len(&bytes, &hdr, 2).unwrap());
            }
        });
    }
}
