//! Test frames: a recognisable non-IP frame, Ethernet + IPv4 + TCP/UDP with correct (or
//! `NEEDS_CSUM`-partial) checksums, and a checksum check. Independent of `qswitch-wire` on
//! purpose, so a bug there cannot hide in the expectations.

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
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + l4.len()) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = proto;
    ip[12..16].copy_from_slice(&SRC_IP);
    ip[16..20].copy_from_slice(&DST_IP);
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

pub fn tcp_segment(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&5201u16.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&0x0a0b_0c0du32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
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
}
