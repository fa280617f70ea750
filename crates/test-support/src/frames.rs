//! Test frames: a recognisable non-IP frame, Ethernet + IPv4 + TCP/UDP with correct (or
//! `NEEDS_CSUM`-partial) checksums, and a checksum check; and, for the firewall's tests and
//! bench, Ethernet + IPv4/IPv6 packets between any addresses with TCP, UDP or ICMP headers
//! of any field values and checksums left zero (connection tracking does not verify them).
//! Independent of `qswitch-wire` on purpose, so a bug there cannot hide in the expectations.

/// The broadcast MAC.
pub const BROADCAST: [u8; 6] = [0xff; 6];

/// A locally administered MAC ending in `last`: 02:00:00:00:00:LAST.
pub fn mac(last: u8) -> [u8; 6] {
    [0x02, 0, 0, 0, 0, last]
}

/// A non-IP frame (EtherType 0x88b5) carrying `seq` and a pattern derived from it.
pub fn l2_frame(dst: [u8; 6], src: [u8; 6], seq: u32, len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..18].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in f[18..].iter_mut().enumerate() {
        *b = (seq as usize)
            .wrapping_mul(31)
            .wrapping_add(i.wrapping_mul(7)) as u8;
    }
    f
}

/// Sum of big-endian 16-bit words (odd tail padded with zero), not folded.
pub fn ones_sum(data: &[u8], mut acc: u64) -> u64 {
    let mut it = data.chunks_exact(2);
    for w in &mut it {
        acc += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = it.remainder() {
        acc += u64::from(u16::from_be_bytes([*last, 0]));
    }
    acc
}

pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// The IPv4 pseudo-header sum for an L4 segment of `len` bytes.
pub fn pseudo_sum(ip: &[u8], proto: u8, len: usize) -> u64 {
    let mut acc = ones_sum(&ip[12..20], 0);
    acc += u64::from(proto);
    acc += len as u64;
    acc
}

pub const SRC_IP: [u8; 4] = [10, 0, 0, 1];
pub const DST_IP: [u8; 4] = [10, 0, 0, 2];
pub const TCP_ACK: u8 = 0x10;
pub const TCP_PSH: u8 = 0x08;

/// Ethernet + IPv4 (with a correct header checksum) + `l4` (whose checksum is filled in
/// here: complete, or only the pseudo-header sum as a `NEEDS_CSUM` sender leaves it).
pub fn ipv4_frame(
    dst: [u8; 6],
    src: [u8; 6],
    proto: u8,
    id: u16,
    mut l4: Vec<u8>,
    partial: bool,
) -> Vec<u8> {
    let mut f = Vec::with_capacity(34 + l4.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    let mut ip = ipv4_header(SRC_IP, DST_IP, proto, id, 0x4000, l4.len()); // DF
    let c = !fold(ones_sum(&ip, 0));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let at = if proto == 6 { 16 } else { 6 };
    let pseudo = pseudo_sum(&ip, proto, l4.len());
    let c = if partial {
        fold(pseudo)
    } else {
        !fold(ones_sum(&l4, pseudo))
    };
    l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&l4);
    f
}

/// An IPv4 header (no options, TTL 64, checksum zero) for `l4_len` bytes of `proto`, with
/// identification `id` and the flags and fragment offset field `frag`.
fn ipv4_header(
    src: [u8; 4],
    dst: [u8; 4],
    proto: u8,
    id: u16,
    frag: u16,
    l4_len: usize,
) -> [u8; 20] {
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    ip[6..8].copy_from_slice(&frag.to_be_bytes());
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    ip
}

/// An Ethernet header from `mac(1)` to `mac(2)` with `ethertype`.
pub fn eth_header(ethertype: [u8; 2]) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&mac(2));
    f.extend_from_slice(&mac(1));
    f.extend_from_slice(&ethertype);
    f
}

/// Ethernet + IPv4 from `src` to `dst` (identification 1, checksum zero) with the flags and
/// fragment offset field `frag` (`0x2000`: more fragments) + `l4` as given.
pub fn ipv4_fragment(src: [u8; 4], dst: [u8; 4], proto: u8, frag: u16, l4: &[u8]) -> Vec<u8> {
    let mut f = eth_header([0x08, 0x00]);
    f.extend_from_slice(&ipv4_header(src, dst, proto, 1, frag, l4.len()));
    f.extend_from_slice(l4);
    f
}

/// Ethernet + IPv4 from `src` to `dst`, not fragmented ([`ipv4_fragment`]'s header) + `l4`.
pub fn ipv4_packet(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    ipv4_fragment(src, dst, proto, 0, l4)
}

/// Ethernet + IPv6 from `src` to `dst` (addresses as text; hop limit 64, no extension
/// header) + `l4` as given.
pub fn ipv6_packet(src: &str, dst: &str, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = eth_header([0x86, 0xdd]);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    f.extend_from_slice(&[proto, 64]);
    for a in [src, dst] {
        let a: std::net::Ipv6Addr = a.parse().expect("an IPv6 address");
        f.extend_from_slice(&a.octets());
    }
    f.extend_from_slice(l4);
    f
}

/// Ethernet + IPv4 + UDP from `src:sport` to `dst:dport` with 4 zero bytes of payload.
pub fn ipv4_udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Vec<u8> {
    ipv4_packet(src, dst, 17, &udp_datagram(sport, dport, &[0; 4]))
}

/// A TCP header (no options, checksum zero).
pub fn tcp_header(sport: u16, dport: u16, flags: u8, seq: u32, ack: u32, window: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&window.to_be_bytes());
    t
}

/// An ICMP or ICMPv6 message: type, code, checksum zero, then `rest`.
pub fn icmp_message(ty: u8, code: u8, rest: &[u8]) -> Vec<u8> {
    let mut m = vec![ty, code, 0, 0];
    m.extend_from_slice(rest);
    m
}

pub fn tcp_segment(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut t = tcp_header(40000, 5201, flags, seq, 0x0a0b_0c0d, 0xffff);
    t.extend_from_slice(payload);
    t
}

pub fn udp_datagram(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; 8];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(payload);
    u
}

/// Whether the IPv4 header checksum of `frame` and its L4 checksum verify.
pub fn checksums_ok(frame: &[u8]) -> (bool, bool) {
    let ip = &frame[14..34];
    let l4 = &frame[34..];
    (
        fold(ones_sum(ip, 0)) == 0xffff,
        fold(ones_sum(l4, pseudo_sum(ip, ip[9], l4.len()))) == 0xffff,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_frames_verify() {
        let tcp = ipv4_frame(
            mac(2),
            mac(1),
            6,
            1,
            tcp_segment(7, TCP_ACK, b"hello"),
            false,
        );
        assert_eq!(checksums_ok(&tcp), (true, true));
        let udp = ipv4_frame(mac(2), mac(1), 17, 2, udp_datagram(1, 2, b"x"), false);
        assert_eq!(checksums_ok(&udp), (true, true));
        let partial = ipv4_frame(mac(2), mac(1), 6, 3, tcp_segment(7, TCP_PSH, b"y"), true);
        assert_eq!(checksums_ok(&partial), (true, false));
        let l2 = l2_frame(BROADCAST, mac(1), 5, 64);
        assert_eq!((l2.len(), &l2[12..18]), (64, &[0x88, 0xb5, 0, 0, 0, 5][..]));
    }

    #[test]
    fn firewall_frames_have_their_fields_where_they_belong() {
        let udp = ipv4_udp([10, 0, 0, 5], [198, 18, 0, 1], 7, 53);
        let mut want = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00];
        want.extend_from_slice(&[0x45, 0, 0, 32, 0, 1, 0, 0, 64, 17, 0, 0]);
        want.extend_from_slice(&[10, 0, 0, 5, 198, 18, 0, 1]);
        want.extend_from_slice(&[0, 7, 0, 53, 0, 12, 0, 0, 0, 0, 0, 0]);
        assert_eq!(udp, want);
        let frag = ipv4_fragment(SRC_IP, DST_IP, 17, 0x2000, &[0; 8]);
        assert_eq!((frag.len(), &frag[20..22]), (42, &[0x20, 0][..]));
        let tcp = tcp_header(1, 2, TCP_ACK, 3, 4, 1000);
        assert_eq!(
            tcp[4..16],
            [0, 0, 0, 3, 0, 0, 0, 4, 0x50, TCP_ACK, 0x03, 0xe8]
        );
        let v6 = ipv6_packet("fd00::5", "fd00::9", 58, &icmp_message(128, 0, &[0; 4]));
        assert_eq!(
            (v6.len(), &v6[12..14], v6[19], v6[20]),
            (62, &[0x86, 0xdd][..], 8, 58)
        );
        assert_eq!((v6[37], v6[53], v6[54]), (5, 9, 128));
    }
}
