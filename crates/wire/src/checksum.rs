//! The Internet checksum (RFC 1071) and the pseudo-headers TCP and UDP sum over.
//!
//! A checksum is built in two steps: [`sum16`] accumulates the one's-complement sum of any
//! number of byte ranges (feed the result of one call as `initial` of the next), and [`fold`]
//! turns the sum into the value that goes on the wire. Sums are kept folded to 16 bits between
//! calls, so any number of calls of any length can be chained without overflow. Each range is
//! summed as if it started at an even offset: chain ranges of even length, except the last.
//!
//! [`complete_partial`] finishes a checksum that a guest or the kernel left to "hardware"
//! (`VIRTIO_NET_HDR_F_NEEDS_CSUM`), as the switch must before handing the frame to a port that
//! cannot.

use core::net::{Ipv4Addr, Ipv6Addr};

use crate::{Error, IpProtocol, Result};

/// Adds `data`, as big-endian 16-bit words, to the one's-complement sum `initial`. An odd
/// final byte is padded with a zero byte. The result is at most `0xffff`.
#[inline]
pub fn sum16(data: &[u8], initial: u32) -> u32 {
    // The one's-complement sum does not depend on byte order (RFC 1071, 2.B): summing
    // little-endian words gives the byte-swapped sum, swapped back at the end. Little-endian
    // 32-bit words added into a u64 (2^16 = 1 mod 2^16 - 1, so they fold to the same 16-bit
    // sum) need no byte swap per word, which lets the compiler vectorize the loop (several
    // times faster than big-endian words on x86). A u64 cannot overflow from u32 words
    // before 2^32 of them, far beyond any slice this will see.
    let mut acc = u64::from(fold16(initial).swap_bytes());
    let mut words = data.chunks_exact(4);
    for word in &mut words {
        acc += u64::from(u32::from_le_bytes([word[0], word[1], word[2], word[3]]));
    }
    match *words.remainder() {
        [a, b, c] => acc += u64::from(u16::from_le_bytes([a, b])) + u64::from(c),
        [a, b] => acc += u64::from(u16::from_le_bytes([a, b])),
        [a] => acc += u64::from(a),
        _ => {}
    }
    // Three folds bring any u64 below 2^17, two more to 16 bits.
    for _ in 0..3 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    u32::from(fold16(acc as u32).swap_bytes())
}

/// Copies `src` into `dst` (of the same length) and returns `src`'s [`sum16`] chained to
/// `initial`: block by block, so each block is summed while it is still in the first-level
/// cache, which costs little more than the copy alone.
///
/// # Panics
/// If the lengths differ.
pub fn copy_sum16(dst: &mut [u8], src: &[u8], initial: u32) -> u32 {
    assert_eq!(dst.len(), src.len(), "copy_sum16: lengths differ");
    // An even block length keeps every block at an even offset, as chaining needs.
    const BLOCK: usize = 2048;
    let mut sum = initial;
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        d.copy_from_slice(s);
        sum = sum16(d, sum);
    }
    sum
}

/// `sum` folded to 16 bits (end-around carry), not complemented.
#[inline]
fn fold16(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Folds a sum from [`sum16`] to 16 bits and complements it: the checksum field value.
/// A correct packet, summed including its checksum field, folds to 0.
#[inline]
pub fn fold(sum: u32) -> u16 {
    let sum = (sum & 0xffff) + (sum >> 16);
    let sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// The sum of the IPv4 pseudo-header for an upper-layer packet of `len` bytes (RFC 793, 768).
pub fn pseudo_header_v4(src: Ipv4Addr, dst: Ipv4Addr, proto: IpProtocol, len: u16) -> u32 {
    let sum = sum16(&src.octets(), 0);
    let sum = sum16(&dst.octets(), sum);
    sum + u32::from(u8::from(proto)) + u32::from(len)
}

/// The sum of the IPv6 pseudo-header for an upper-layer packet of `len` bytes (RFC 8200,
/// section 8.1). `proto` is the upper-layer protocol, not the first Next Header.
pub fn pseudo_header_v6(src: Ipv6Addr, dst: Ipv6Addr, proto: IpProtocol, len: u32) -> u32 {
    let sum = sum16(&src.octets(), 0);
    let sum = sum16(&dst.octets(), sum);
    sum + u32::from(u8::from(proto)) + (len >> 16) + (len & 0xffff)
}

/// Completes a partial checksum, as a NIC does for `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the 16-bit
/// field at `csum_start + csum_offset` already holds the pseudo-header sum, so this sums
/// everything from `csum_start` to the end of `frame` and stores the folded result there.
/// A result of 0 is stored as `0xffff`, as Linux does (a UDP checksum of 0 would mean "none").
///
/// `frame` must end where the L4 packet ends: trailing Ethernet padding would be summed too.
/// Fails with [`Error::Truncated`] if the field does not lie within `frame`.
pub fn complete_partial(frame: &mut [u8], csum_start: usize, csum_offset: usize) -> Result<()> {
    let at = csum_start.saturating_add(csum_offset);
    if at.saturating_add(2) > frame.len() {
        return Err(Error::Truncated);
    }
    let checksum = match fold(sum16(&frame[csum_start..], 0)) {
        0 => 0xffff,
        checksum => checksum,
    };
    frame[at..at + 2].copy_from_slice(&checksum.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{TCP_SYN, UDP4, UDP4_PARTIAL, UDP6, UDP6_PARTIAL};

    const V4_SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const V4_DST: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const V6_SRC: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1);
    const V6_DST: Ipv6Addr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2);

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(sum16(&data, 0), 0xddf2);
        assert_eq!(fold(0xddf2), !0xddf2);
        // Split at any even offset, the sum is the same.
        for split in [0, 2, 4, 6, 8] {
            assert_eq!(sum16(&data[split..], sum16(&data[..split], 0)), 0xddf2);
        }
    }

    /// The plain RFC 1071 loop: big-endian 16-bit words, end-around carry.
    fn reference(data: &[u8], initial: u32) -> u32 {
        let mut acc = u64::from(initial);
        for w in data.chunks(2) {
            acc += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
        while acc > 0xffff {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u32
    }

    #[test]
    fn agrees_with_the_plain_loop() {
        use proptest::prelude::*;
        proptest!(|(data in proptest::collection::vec(any::<u8>(), 0..300), initial in any::<u32>())| {
            prop_assert_eq!(sum16(&data, initial), reference(&data, initial));
        });
        for data in [
            vec![0xffu8; 70_000],
            vec![0u8; 5],
            vec![0xff, 0xff, 0, 0, 0xff],
        ] {
            for initial in [0, 1, 0xffff, 0x1_fffe, u32::MAX] {
                assert_eq!(sum16(&data, initial), reference(&data, initial));
            }
        }
    }

    #[test]
    fn copy_sum16_copies_and_sums() {
        let src: Vec<u8> = (0..5001u32).map(|i| (i * 31 + 7) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        assert_eq!(copy_sum16(&mut dst, &src, 0x1234), sum16(&src, 0x1234));
        assert_eq!(dst, src);
    }

    #[test]
    fn odd_lengths_pad_with_zero() {
        assert_eq!(sum16(&[0xab], 0), 0xab00);
        assert_eq!(sum16(&[0x01, 0x02, 0xab], 0), 0xac02);
        assert_eq!(
            sum16(&[0x01, 0x02, 0x03, 0x04, 0xab], 0),
            0x0102 + 0x0304 + 0xab00
        );
        assert_eq!(sum16(&[], 0x1234), 0x1234);
    }

    #[test]
    fn long_inputs_do_not_overflow() {
        // 0xffff words are one's-complement zero, whatever their number.
        let ones = vec![0xff; 200_001];
        assert_eq!(fold(sum16(&ones[..200_000], 0)), 0);
        assert_eq!(fold(sum16(&ones[..200_000], u32::MAX)), 0);
        assert_eq!(sum16(&ones, 0), 0xff00);
    }

    #[test]
    fn ipv4_header_of_real_packets() {
        assert_eq!(fold(sum16(&TCP_SYN[14..34], 0)), 0);
        assert_eq!(fold(sum16(&UDP4[14..34], 0)), 0);
        // With its checksum field zeroed, the header sums to the captured checksum.
        let mut header = [0; 20];
        header.copy_from_slice(&TCP_SYN[14..34]);
        header[10..12].fill(0);
        assert_eq!(fold(sum16(&header, 0)), 0x5150);
    }

    #[test]
    fn tcp_and_udp_of_real_packets() {
        let tcp = pseudo_header_v4(V4_SRC, V4_DST, IpProtocol::Tcp, 40);
        assert_eq!(fold(sum16(&TCP_SYN[34..], tcp)), 0);
        let udp = pseudo_header_v4(V4_SRC, V4_DST, IpProtocol::Udp, 30);
        assert_eq!(fold(sum16(&UDP4[34..], udp)), 0);
        let udp6 = pseudo_header_v6(V6_SRC, V6_DST, IpProtocol::Udp, 21);
        assert_eq!(fold(sum16(&UDP6[54..], udp6)), 0);
    }

    #[test]
    fn pseudo_headers_match_what_linux_leaves_for_offload() {
        // With offload on, Linux stores the folded, uncomplemented pseudo-header sum.
        let v4 = pseudo_header_v4(V4_SRC, V4_DST, IpProtocol::Udp, 30);
        assert_eq!(!fold(v4), 0x1432);
        assert_eq!(&UDP4_PARTIAL[40..42], &[0x14, 0x32]);
        let v6 = pseudo_header_v6(V6_SRC, V6_DST, IpProtocol::Udp, 21);
        assert_eq!(!fold(v6), 0xfa2a);
        assert_eq!(&UDP6_PARTIAL[60..62], &[0xfa, 0x2a]);
    }

    #[test]
    fn completes_partial_checksums_of_real_packets() {
        let mut v4 = UDP4_PARTIAL;
        complete_partial(&mut v4, 34, 6).unwrap();
        // The IP identification differs between the two sends; the UDP datagram does not.
        assert_eq!(&v4[34..], &UDP4[34..]);

        let mut v6 = UDP6_PARTIAL;
        complete_partial(&mut v6, 54, 6).unwrap();
        assert_eq!(v6, UDP6);
    }

    #[test]
    fn zero_result_is_stored_as_ffff() {
        // A field of 0xffff (negative zero) over an all-zero segment folds to 0.
        let mut segment = [0, 0, 0xff, 0xff, 0, 0];
        complete_partial(&mut segment, 0, 2).unwrap();
        assert_eq!(segment, [0, 0, 0xff, 0xff, 0, 0]);
    }

    #[test]
    fn partial_out_of_range() {
        let mut frame = UDP4_PARTIAL;
        assert_eq!(complete_partial(&mut frame, 34, 29), Err(Error::Truncated));
        assert_eq!(complete_partial(&mut frame, 65, 0), Err(Error::Truncated));
        assert_eq!(
            complete_partial(&mut frame, usize::MAX, usize::MAX),
            Err(Error::Truncated)
        );
        assert_eq!(frame, UDP4_PARTIAL);
        complete_partial(&mut frame, 34, 28).unwrap();
    }
}
