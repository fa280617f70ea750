//! Software GRO for TCP: consecutive in-order segments of one TCP flow, received one by one
//! (from a tunnel, say), are coalesced back into one TSO super-frame with a virtio-net header
//! (`gso_type` TCPv4/TCPv6, `gso_size`, a partial checksum), so that the destination's stack
//! handles one 64 KiB frame instead of forty-odd wire-size ones. It is the inverse of
//! [`gso`](crate::gso), and as strict as the kernel's `tcp_gro_receive` about what it merges:
//!
//! * only plain TCP segments: Ethernet (untagged or one 802.1Q tag) + IPv4 without options or
//!   fragmentation, or IPv6 with TCP as the first next header; the IP length must match the
//!   frame exactly (no Ethernet padding); the IPv4 header checksum and the TCP checksum must
//!   be correct (a segment that fails one passes through alone, for the destination to
//!   drop; the TCP checksum is checked by [`Gro::start`] and [`Gro::append`] while they
//!   copy the segment, block by block in cache, which costs little more than the copy); a
//!   non-empty payload;
//!   flags ACK, possibly with PSH or FIN, nothing else (no SYN, RST, URG, CWR, ECE);
//! * a segment joins the held super-frame only if it continues it: the same Ethernet header,
//!   the same IP addresses, TOS/traffic class, TTL/hop limit, DF bit and (IPv6) flow label;
//!   the same ports, acknowledgement number, window, urgent pointer and TCP options, byte
//!   for byte (so the same header length); the sequence number right after the held payload; a payload no
//!   longer than the first segment's (the `gso_size`); and the held super-frame is still
//!   open: its last segment was full-size and had neither PSH nor FIN (a segment with PSH or
//!   FIN, or a short one, is merged and closes it). IPv4 identification numbers without DF
//!   must follow each other (+1 per segment), as [`gso`](crate::gso) makes them; with DF
//!   they are not compared (RFC 6864: meaningless on atomic datagrams), and segmenting the
//!   super-frame again numbers them from the first one's;
//! * the super-frame stays within 64 KiB of IP packet and the caller's buffer.
//!
//! The caller owns the buffer the super-frame is built in (a packet buffer): [`Gro::start`]
//! copies the first frame there, [`Gro::append`] adds one segment's payload, and
//! [`Gro::finish`] writes the merged headers and returns the frame's length and its
//! virtio-net header. A super-frame of one segment is left exactly as received, with
//! `FLAG_DATA_VALID` when its checksum was verified.

use core::net::{Ipv4Addr, Ipv6Addr};

use crate::checksum;
use crate::virtio_net_hdr::{
    VirtioNetHdr, FLAG_DATA_VALID, FLAG_NEEDS_CSUM, GSO_NONE, GSO_TCPV4, GSO_TCPV6,
};
use crate::IpProtocol;

const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
/// The largest IPv4 total length / IPv6 payload length.
const MAX_IP_LEN: usize = 65_535;

/// A TCP segment that may be coalesced: where its headers are and what GRO compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSegment {
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// Offset of the IP header.
    pub l3: usize,
    /// Offset of the TCP header.
    pub l4: usize,
    /// Length of all headers (Ethernet, IP, TCP with options).
    pub hlen: usize,
    /// The sequence number.
    pub seq: u32,
    /// The TCP flags byte.
    pub flags: u8,
    /// Payload bytes.
    pub payload: usize,
}

/// Reads `frame` as a TCP segment GRO may merge; `None` for anything else (not TCP, IP
/// options or fragments, a bad IPv4 header checksum, flags other than ACK/PSH/FIN, no
/// payload, a length mismatch). The TCP checksum is not checked here but by [`Gro::start`]
/// and [`Gro::append`]. Never panics.
pub fn parse(frame: &[u8]) -> Option<TcpSegment> {
    let mut l3 = 14;
    if frame.get(12..14)? == [0x81, 0x00] {
        l3 += 4;
    }
    let ethertype = frame.get(l3 - 2..l3)?;
    let (v6, l4, ip_len) = match ethertype {
        [0x08, 0x00] => {
            let ip = frame.get(l3..l3 + 20)?;
            // Version 4, no options; not a fragment (MF clear, offset 0); TCP; a correct
            // header checksum (the super-frame gets a new one).
            if ip[0] != 0x45 || ip[6] & 0x3f != 0 || ip[7] != 0 || ip[9] != 6 {
                return None;
            }
            if checksum::fold(checksum::sum16(ip, 0)) != 0 {
                return None;
            }
            (
                false,
                l3 + 20,
                usize::from(u16::from_be_bytes([ip[2], ip[3]])),
            )
        }
        [0x86, 0xdd] => {
            let ip = frame.get(l3..l3 + 40)?;
            if ip[0] >> 4 != 6 || ip[6] != 6 {
                return None;
            }
            (
                true,
                l3 + 40,
                40 + usize::from(u16::from_be_bytes([ip[4], ip[5]])),
            )
        }
        _ => return None,
    };
    if l3 + ip_len != frame.len() {
        return None;
    }
    let tcp = frame.get(l4..l4 + 20)?;
    let doff = usize::from(tcp[12] >> 4) * 4;
    let flags = tcp[13];
    if doff < 20 || tcp[12] & 0x0f != 0 || flags & !(FIN | PSH) != ACK {
        return None;
    }
    let hlen = l4 + doff;
    if hlen >= frame.len() {
        return None;
    }
    Some(TcpSegment {
        v6,
        l3,
        l4,
        hlen,
        seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
        flags,
        payload: frame.len() - hlen,
    })
}

fn pseudo(frame: &[u8], v6: bool, l3: usize, l4_len: usize) -> u32 {
    if v6 {
        let mut a = [0u8; 16];
        let mut b = [0u8; 16];
        a.copy_from_slice(&frame[l3 + 8..l3 + 24]);
        b.copy_from_slice(&frame[l3 + 24..l3 + 40]);
        checksum::pseudo_header_v6(
            Ipv6Addr::from(a),
            Ipv6Addr::from(b),
            IpProtocol::Tcp,
            l4_len as u32,
        )
    } else {
        let mut a = [0u8; 4];
        let mut b = [0u8; 4];
        a.copy_from_slice(&frame[l3 + 12..l3 + 16]);
        b.copy_from_slice(&frame[l3 + 16..l3 + 20]);
        checksum::pseudo_header_v4(
            Ipv4Addr::from(a),
            Ipv4Addr::from(b),
            IpProtocol::Tcp,
            l4_len as u16,
        )
    }
}

/// Whether `seg` describes `frame` (as [`parse`] made it), so that its offsets can be used.
fn fits(frame: &[u8], seg: &TcpSegment) -> bool {
    seg.l3 + 20 <= seg.l4 && seg.l4 + 20 <= seg.hlen && seg.hlen + seg.payload == frame.len()
}

/// The super-frame being built.
#[derive(Debug, Clone, Copy)]
struct Held {
    first: TcpSegment,
    /// Bytes of the super-frame so far.
    len: usize,
    /// The sequence number the next segment must have.
    next_seq: u32,
    /// Segments merged.
    count: u16,
    /// The last segment's flags.
    last_flags: u8,
    /// Whether no further segment may join (PSH, FIN or a short segment seen).
    closed: bool,
}

/// One super-frame under construction (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Gro {
    held: Option<Held>,
}

impl Gro {
    /// A coalescer holding nothing.
    pub fn new() -> Gro {
        Gro::default()
    }

    /// Whether a super-frame is being built.
    pub fn holding(&self) -> bool {
        self.held.is_some()
    }

    /// Starts a super-frame in `out` with `frame` (parsed as `seg`), checking its TCP
    /// checksum as it copies. Returns false (and holds nothing) if `out` is too small or the
    /// checksum is wrong.
    pub fn start(&mut self, out: &mut [u8], frame: &[u8], seg: TcpSegment) -> bool {
        self.held = None;
        if !fits(frame, &seg) {
            return false;
        }
        let Some(dst) = out.get_mut(..frame.len()) else {
            return false;
        };
        let l4 = seg.l4;
        dst[..l4].copy_from_slice(&frame[..l4]);
        let ph = pseudo(frame, seg.v6, seg.l3, frame.len() - l4);
        if checksum::fold(checksum::copy_sum16(&mut dst[l4..], &frame[l4..], ph)) != 0 {
            return false;
        }
        self.held = Some(Held {
            first: seg,
            len: frame.len(),
            next_seq: seg.seq.wrapping_add(seg.payload as u32),
            count: 1,
            last_flags: seg.flags,
            closed: seg.flags & (PSH | FIN) != 0,
        });
        true
    }

    /// Whether `frame` (parsed as `seg`) continues the super-frame held in `out`.
    pub fn continues(&self, out: &[u8], frame: &[u8], seg: &TcpSegment) -> bool {
        let Some(h) = &self.held else {
            return false;
        };
        let f = &h.first;
        if h.closed
            || !fits(frame, seg)
            || seg.v6 != f.v6
            || seg.l3 != f.l3
            || seg.hlen != f.hlen
            || seg.seq != h.next_seq
            || seg.payload > f.payload
            || h.len + seg.payload > out.len()
            || h.len + seg.payload - f.l3 > MAX_IP_LEN + if f.v6 { 40 } else { 0 }
        {
            return false;
        }
        let (a, b) = (&out[..f.hlen], &frame[..seg.hlen]);
        // Ethernet header (and tag).
        if a[..f.l3] != b[..f.l3] {
            return false;
        }
        let l3 = f.l3;
        if f.v6 {
            // Version, traffic class, flow label; next header, hop limit; addresses.
            if a[l3..l3 + 4] != b[l3..l3 + 4] || a[l3 + 6..l3 + 40] != b[l3 + 6..l3 + 40] {
                return false;
            }
        } else {
            // TOS; DF; TTL, protocol; addresses.
            if a[l3 + 1] != b[l3 + 1]
                || a[l3 + 6] != b[l3 + 6]
                || a[l3 + 8..l3 + 10] != b[l3 + 8..l3 + 10]
                || a[l3 + 12..l3 + 20] != b[l3 + 12..l3 + 20]
            {
                return false;
            }
            if a[l3 + 6] & 0x40 == 0 {
                let id0 = u16::from_be_bytes([a[l3 + 4], a[l3 + 5]]);
                let id = u16::from_be_bytes([b[l3 + 4], b[l3 + 5]]);
                if id != id0.wrapping_add(h.count) {
                    return false;
                }
            }
        }
        let l4 = f.l4;
        // Ports; acknowledgement number; data offset; window; urgent pointer (URG is
        // refused, but the field must not change either); options. (Sequence number, flags
        // and checksum differ or were checked above.)
        a[l4..l4 + 4] == b[l4..l4 + 4]
            && a[l4 + 8..l4 + 13] == b[l4 + 8..l4 + 13]
            && a[l4 + 14..l4 + 16] == b[l4 + 14..l4 + 16]
            && a[l4 + 18..f.hlen] == b[l4 + 18..seg.hlen]
    }

    /// Appends `frame`'s payload to the super-frame in `out` if it [continues](Gro::continues)
    /// it and its TCP checksum (checked as the payload is copied) is right; returns whether
    /// it did. A segment refused for its checksum leaves the super-frame as it was (the
    /// bytes copied past its end are not part of it).
    pub fn append(&mut self, out: &mut [u8], frame: &[u8], seg: &TcpSegment) -> bool {
        if !self.continues(out, frame, seg) {
            return false;
        }
        let Some(h) = &mut self.held else {
            return false;
        };
        let ph = pseudo(frame, seg.v6, seg.l3, frame.len() - seg.l4);
        let sum = checksum::sum16(&frame[seg.l4..seg.hlen], ph);
        let dst = &mut out[h.len..h.len + seg.payload];
        if checksum::fold(checksum::copy_sum16(dst, &frame[seg.hlen..], sum)) != 0 {
            return false;
        }
        h.len += seg.payload;
        h.next_seq = h.next_seq.wrapping_add(seg.payload as u32);
        h.count += 1;
        h.last_flags = seg.flags;
        h.closed = seg.flags & (PSH | FIN) != 0 || seg.payload < h.first.payload;
        true
    }

    /// Ends the super-frame in `out`: writes its IP length (and IPv4 header checksum), the
    /// last segment's flags and the partial TCP checksum, and returns its length and
    /// virtio-net header. `None` if nothing was held.
    pub fn finish(&mut self, out: &mut [u8]) -> Option<(usize, VirtioNetHdr)> {
        let h = self.held.take()?;
        let f = h.first;
        if h.count == 1 {
            return Some((
                h.len,
                VirtioNetHdr {
                    flags: FLAG_DATA_VALID,
                    ..VirtioNetHdr::default()
                },
            ));
        }
        let frame = &mut out[..h.len];
        let (l3, l4) = (f.l3, f.l4);
        if f.v6 {
            let pl = (h.len - l3 - 40) as u16;
            frame[l3 + 4..l3 + 6].copy_from_slice(&pl.to_be_bytes());
        } else {
            let total = (h.len - l3) as u16;
            frame[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
            frame[l3 + 10..l3 + 12].fill(0);
            let c = checksum::fold(checksum::sum16(&frame[l3..l4], 0));
            frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        }
        frame[l4 + 13] = h.last_flags;
        // The pseudo-header sum, not complemented, as NEEDS_CSUM wants it.
        let ph = !checksum::fold(pseudo(frame, f.v6, l3, h.len - l4));
        frame[l4 + 16..l4 + 18].copy_from_slice(&ph.to_be_bytes());
        Some((
            h.len,
            VirtioNetHdr {
                flags: FLAG_NEEDS_CSUM,
                gso_type: if f.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
                hdr_len: f.hlen as u16,
                gso_size: f.payload as u16,
                csum_start: l4 as u16,
                csum_offset: 16,
                num_buffers: 0,
            },
        ))
    }

    /// Drops the held super-frame without finishing it.
    pub fn reset(&mut self) {
        self.held = None;
    }
}

/// Whether `hdr` (from [`Gro::finish`]) describes a super-frame of several segments.
pub fn is_super(hdr: &VirtioNetHdr) -> bool {
    hdr.gso_type != GSO_NONE
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gso;

    const SYN: u8 = 0x02;
    const RST: u8 = 0x04;
    use crate::virtio_net_hdr::FLAG_NEEDS_CSUM;

    /// A TSO frame: Ethernet + IPv4 (DF, id 0x1234) + TCP (seq 1000, ACK|`flags`, 12 bytes of
    /// options) + `n` bytes.
    fn tso_v4(n: usize, flags: u8) -> Vec<u8> {
        let mut f = vec![0u8; 66 + n];
        f[0..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((52 + n) as u16).to_be_bytes());
        f[18..20].copy_from_slice(&0x1234u16.to_be_bytes());
        f[20] = 0x40;
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        f[34..36].copy_from_slice(&5000u16.to_be_bytes());
        f[36..38].copy_from_slice(&5201u16.to_be_bytes());
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[42..46].copy_from_slice(&77u32.to_be_bytes());
        f[46] = 8 << 4;
        f[47] = ACK | flags;
        f[48..50].copy_from_slice(&512u16.to_be_bytes());
        f[54..66].copy_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
        for (i, b) in f[66..].iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        f
    }

    fn tso_v6(n: usize) -> Vec<u8> {
        let mut f = vec![0u8; 74 + n];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        f[14] = 0x60;
        f[18..20].copy_from_slice(&((20 + n) as u16).to_be_bytes());
        f[20] = 6;
        f[21] = 64;
        f[22..38].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f[38..54].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f[54..56].copy_from_slice(&5000u16.to_be_bytes());
        f[56..58].copy_from_slice(&5201u16.to_be_bytes());
        f[58..62].copy_from_slice(&9u32.to_be_bytes());
        f[66] = 5 << 4;
        f[67] = ACK | PSH;
        for (i, b) in f[74..].iter_mut().enumerate() {
            *b = (i * 3) as u8;
        }
        f
    }

    fn segments(frame: &[u8], v6: bool, mss: u16) -> Vec<Vec<u8>> {
        let hdr = VirtioNetHdr {
            gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            gso_size: mss,
            ..Default::default()
        };
        let mut scratch = vec![0u8; 4000];
        let mut out = Vec::new();
        gso::segment(frame, &hdr, &mut scratch, |s| out.push(s.to_vec())).unwrap();
        out
    }

    /// Feeds `segs` through one GRO into super-frames, as a receiver would.
    fn coalesce(segs: &[Vec<u8>]) -> Vec<(Vec<u8>, VirtioNetHdr)> {
        let mut gro = Gro::new();
        let mut buf = vec![0u8; 70_000];
        let mut out = Vec::new();
        for s in segs {
            let seg = parse(s).expect("a mergeable segment");
            if !gro.append(&mut buf, s, &seg) {
                if let Some((len, hdr)) = gro.finish(&mut buf) {
                    out.push((buf[..len].to_vec(), hdr));
                }
                assert!(gro.start(&mut buf, s, seg));
            }
        }
        if let Some((len, hdr)) = gro.finish(&mut buf) {
            out.push((buf[..len].to_vec(), hdr));
        }
        out
    }

    /// A super-frame, completed and segmented again, gives back `segs`.
    fn resegments_to(frame: &[u8], hdr: &VirtioNetHdr, segs: &[Vec<u8>]) {
        let mut f = frame.to_vec();
        assert_eq!(hdr.flags, FLAG_NEEDS_CSUM);
        checksum::complete_partial(&mut f, hdr.csum_start.into(), hdr.csum_offset.into()).unwrap();
        let again = segments(&f, hdr.gso_type == GSO_TCPV6, hdr.gso_size);
        assert_eq!(again, segs);
    }

    #[test]
    fn coalesces_in_order_segments_into_the_original() {
        let f = tso_v4(10_000, PSH);
        let segs = segments(&f, false, 1398);
        assert_eq!(segs.len(), 8);
        let out = coalesce(&segs);
        assert_eq!(out.len(), 1);
        let (frame, hdr) = &out[0];
        assert_eq!(frame.len(), f.len());
        assert_eq!(hdr.gso_type, GSO_TCPV4);
        assert_eq!((hdr.gso_size, hdr.hdr_len, hdr.csum_start), (1398, 66, 34));
        assert_eq!(frame[66..], f[66..], "payload");
        assert_eq!(frame[47], ACK | PSH, "the last segment's flags");
        assert_eq!(checksum::fold(checksum::sum16(&frame[14..34], 0)), 0);
        resegments_to(frame, hdr, &segs);
    }

    #[test]
    fn coalesces_ipv6() {
        let f = tso_v6(5000);
        let segs = segments(&f, true, 1000);
        let out = coalesce(&segs);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.gso_type, GSO_TCPV6);
        assert_eq!(out[0].0[74..], f[74..]);
        resegments_to(&out[0].0, &out[0].1, &segs);
    }

    #[test]
    fn one_segment_is_left_as_received() {
        let segs = segments(&tso_v4(500, 0), false, 1398);
        let out = coalesce(&segs);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, segs[0]);
        assert_eq!(out[0].1.gso_type, GSO_NONE);
        assert_eq!(out[0].1.flags, FLAG_DATA_VALID);
    }

    #[test]
    fn refuses_out_of_order_and_gaps() {
        let segs = segments(&tso_v4(5000, 0), false, 1000);
        // 0 1 3 2 4: the run breaks at 3, and again at 2 and 4.
        let order = [0, 1, 3, 2, 4];
        let shuffled: Vec<Vec<u8>> = order.iter().map(|&i| segs[i].clone()).collect();
        let out = coalesce(&shuffled);
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].1.gso_type, GSO_TCPV4);
        assert_eq!(out[0].0.len(), 66 + 2000);
        // A duplicate does not join either.
        let dup = vec![segs[0].clone(), segs[0].clone()];
        assert_eq!(coalesce(&dup).len(), 2);
    }

    #[test]
    fn refuses_another_flow() {
        let a = segments(&tso_v4(3000, 0), false, 1000);
        let mut b = a.clone();
        for s in &mut b {
            s[34..36].copy_from_slice(&5001u16.to_be_bytes());
            s[50..52].fill(0);
        }
        // Fix the checksums of the changed segments.
        let b: Vec<Vec<u8>> = b
            .into_iter()
            .map(|mut s| {
                let ph = pseudo(&s, false, 14, s.len() - 34);
                let c = checksum::fold(checksum::sum16(&s[34..], ph));
                s[50..52].copy_from_slice(&c.to_be_bytes());
                s
            })
            .collect();
        let mixed = vec![a[0].clone(), b[1].clone(), a[1].clone(), a[2].clone()];
        let out = coalesce(&mixed);
        assert_eq!(out.len(), 3, "a0 | b1 | a1+a2");
        // Another destination MAC, or another ack number: not merged.
        for (at, v) in [(0usize, 9u8), (45, 1)] {
            let mut other = a[1].clone();
            other[at] ^= v;
            if at >= 34 {
                let ph = pseudo(&other, false, 14, other.len() - 34);
                other[50..52].fill(0);
                let c = checksum::fold(checksum::sum16(&other[34..], ph));
                other[50..52].copy_from_slice(&c.to_be_bytes());
            }
            assert_eq!(coalesce(&[a[0].clone(), other]).len(), 2, "byte {at}");
        }
    }

    #[test]
    fn psh_fin_and_short_segments_close_the_super_frame() {
        let segs = segments(&tso_v4(2500, PSH), false, 1000);
        // The last (short, PSH) segment closes it: a following one does not join.
        let mut next = segments(&tso_v4(2500, 0), false, 1000);
        for s in &mut next {
            let seq = u32::from_be_bytes([s[38], s[39], s[40], s[41]]) + 2500;
            s[38..42].copy_from_slice(&seq.to_be_bytes());
            s[50..52].fill(0);
            let ph = pseudo(s, false, 14, s.len() - 34);
            let c = checksum::fold(checksum::sum16(&s[34..], ph));
            s[50..52].copy_from_slice(&c.to_be_bytes());
        }
        let all: Vec<Vec<u8>> = segs.iter().chain(&next).cloned().collect();
        let out = coalesce(&all);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].0.len(), 66 + 2500);
        assert_eq!(out[0].0[47], ACK | PSH);
    }

    #[test]
    fn refuses_what_is_not_a_plain_tcp_segment() {
        let seg = segments(&tso_v4(1000, 0), false, 1398).remove(0);
        assert!(parse(&seg).is_some());
        let mut bad_csum = seg.clone();
        bad_csum[100] ^= 1;
        let parsed = parse(&bad_csum).expect("the checksum is checked while copying");
        let mut gro = Gro::new();
        let mut buf = vec![0u8; 4000];
        assert!(!gro.start(&mut buf, &bad_csum, parsed), "checksum");
        assert!(!gro.holding());
        // A bad segment does not join a held super-frame either, which stays as it was.
        let segs = segments(&tso_v4(3000, 0), false, 1000);
        let mut bad = segs[1].clone();
        bad[200] ^= 0x10;
        assert!(gro.start(&mut buf, &segs[0], parse(&segs[0]).unwrap()));
        assert!(!gro.append(&mut buf, &bad, &parse(&bad).unwrap()));
        assert!(gro.append(&mut buf, &segs[1], &parse(&segs[1]).unwrap()));
        let (len, _) = gro.finish(&mut buf).unwrap();
        assert_eq!(len, 66 + 2000);
        let mut bad_ip = seg.clone();
        bad_ip[24] ^= 1;
        assert!(parse(&bad_ip).is_none(), "IPv4 header checksum");
        let mut syn = seg.clone();
        syn[47] |= SYN;
        assert!(parse(&syn).is_none(), "SYN");
        let mut rst = seg.clone();
        rst[47] = RST | ACK;
        assert!(parse(&rst).is_none(), "RST");
        let mut frag = seg.clone();
        frag[20] |= 0x20;
        assert!(parse(&frag).is_none(), "MF");
        let mut opts = seg.clone();
        opts[14] = 0x46;
        assert!(parse(&opts).is_none(), "IP options");
        let mut padded = seg.clone();
        padded.push(0);
        assert!(parse(&padded).is_none(), "length mismatch");
        let header_only = tso_v4(0, 0);
        assert!(parse(&header_only).is_none(), "no payload");
        assert!(parse(&seg[..30]).is_none());
        assert!(parse(&[]).is_none());
    }

    #[test]
    fn never_exceeds_the_ip_length_or_the_buffer() {
        let segs = segments(&tso_v4(60_000, 0), false, 1400);
        let mut more = segments(&tso_v4(20_000, 0), false, 1400);
        for s in &mut more {
            let seq = u32::from_be_bytes([s[38], s[39], s[40], s[41]]) + 42 * 1400;
            s[38..42].copy_from_slice(&seq.to_be_bytes());
            s[50..52].fill(0);
            let ph = pseudo(s, false, 14, s.len() - 34);
            let c = checksum::fold(checksum::sum16(&s[34..], ph));
            s[50..52].copy_from_slice(&c.to_be_bytes());
        }
        // The first frame's last segment is short: it closes the first super-frame.
        let all: Vec<Vec<u8>> = segs[..42].iter().chain(&more).cloned().collect();
        let out = coalesce(&all);
        assert!(out.len() >= 2);
        for (f, _) in &out {
            assert!(f.len() - 14 <= MAX_IP_LEN);
        }
        // A small buffer: the second segment does not fit.
        let mut gro = Gro::new();
        let mut small = vec![0u8; segs[0].len() + 10];
        let s0 = parse(&segs[0]).unwrap();
        assert!(gro.start(&mut small, &segs[0], s0));
        assert!(!gro.append(&mut small, &segs[1], &parse(&segs[1]).unwrap()));
        assert!(!gro.start(&mut small[..10], &segs[0], s0));
        assert!(!gro.holding());
    }

    #[test]
    fn never_panics() {
        use proptest::prelude::*;
        proptest!(|(a in proptest::collection::vec(any::<u8>(), 0..300), b in proptest::collection::vec(any::<u8>(), 0..300))| {
            let mut gro = Gro::new();
            let mut buf = vec![0u8; 1000];
            for f in [&a, &b] {
                if let Some(seg) = parse(f) {
                    if !gro.append(&mut buf, f, &seg) {
                        let _ = gro.finish(&mut buf);
                        gro.start(&mut buf, f, seg);
                    }
                }
            }
            let _ = gro.finish(&mut buf);
        });
    }
}
