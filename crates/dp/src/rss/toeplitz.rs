//! The Toeplitz hash of Microsoft's RSS specification.
//!
//! Definition ("RSS hashing functions"): for each bit of the input, left to right (the most
//! significant bit of `input[0]` first), if the bit is set, XOR the leftmost 32 bits of the key
//! into the result; then shift the key left by one bit. The input is in network byte order and
//! packet order: source address, destination address, then, with ports, source port and
//! destination port. [`reference_hash`] is that loop, bit by bit.
//!
//! [`Toeplitz`] precomputes, for each of the first [`TABLE_LEN`] input byte positions, the
//! contribution of each of the 256 byte values (a 36 KiB table), so a hash is one table load and
//! one XOR per input byte. The hash is linear (`h(a ^ b) == h(a) ^ h(b)`), which is what makes
//! the table exact.
//!
//! # Key length
//! Keys are any length from [`MIN_KEY_LEN`] (the specification's 40 bytes) up, as VPP and DPDK
//! accept longer keys (e.g. the 52 bytes of Intel's i40e): the hash of `n` input bytes uses the
//! key's first `n + 4` bytes and nothing past them, so a longer key hashes the usual inputs as
//! its first 40 bytes would. [`Toeplitz::hash`] refuses an input the key is too short for;
//! [`Toeplitz::hash_flow`] never needs more than 40 bytes, so it cannot fail.

use qswitch_wire::flow::{FlowKey, IpPair};

/// Microsoft's verification key (also the default key of most NICs and of DPDK's examples).
pub const DEFAULT_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// Shortest key accepted: the specification's 40 bytes (enough for a 36-byte input).
pub const MIN_KEY_LEN: usize = 40;
/// Input bytes covered by the per-position table: the longest input [`Toeplitz::hash_flow`]
/// builds (IPv6 addresses and ports). Longer inputs are hashed a byte at a time past this.
pub const TABLE_LEN: usize = 36;

/// TCP and UDP, the protocols whose ports go into the hash.
const TCP: u8 = 6;
const UDP: u8 = 17;

/// A key the hash cannot use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Fewer than [`MIN_KEY_LEN`] bytes.
    #[error("RSS key of {0} bytes is too short (at least {MIN_KEY_LEN})")]
    TooShort(usize),
    /// Fewer than `input + 4` bytes for an input of `input` bytes.
    #[error("RSS key of {key} bytes is too short for {input} input bytes (the hash of n bytes needs a key of n + 4)")]
    ShortForInput { key: usize, input: usize },
}

/// Zero bytes kept after the key, so every 8-byte window of it can be read.
const PAD: usize = 8;

/// A Toeplitz hasher for one key, with its lookup table.
#[derive(Clone)]
pub struct Toeplitz {
    /// The key, followed by [`PAD`] zero bytes (room for 8-byte windows).
    key: Box<[u8]>,
    key_len: usize,
    /// `table[i][b]`: the hash contribution of byte value `b` at input position `i`.
    table: Box<[[u32; 256]]>,
}

impl std::fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toeplitz")
            .field("key", &self.key())
            .finish_non_exhaustive()
    }
}

impl Default for Toeplitz {
    /// A hasher for [`DEFAULT_KEY`].
    fn default() -> Toeplitz {
        Toeplitz::new(&DEFAULT_KEY).expect("the default key has a valid length")
    }
}

impl Toeplitz {
    /// A hasher for `key`, which must be at least [`MIN_KEY_LEN`] bytes long.
    pub fn new(key: &[u8]) -> Result<Toeplitz, KeyError> {
        if key.len() < MIN_KEY_LEN {
            return Err(KeyError::TooShort(key.len()));
        }
        let mut padded = vec![0u8; key.len() + PAD].into_boxed_slice();
        padded[..key.len()].copy_from_slice(key);
        let mut table = vec![[0u32; 256]; TABLE_LEN].into_boxed_slice();
        for (pos, row) in table.iter_mut().enumerate() {
            let window = window64(&padded, pos);
            // One bit at a time, then every other value by linearity: a value's entry is its
            // lowest set bit's entry XOR the entry of the value without that bit.
            for bit in 0..8 {
                row[0x80 >> bit] = bit_window(window, bit);
            }
            for value in 1..256usize {
                let low = value & value.wrapping_neg();
                row[value] = row[low] ^ row[value & (value - 1)];
            }
        }
        Ok(Toeplitz {
            key: padded,
            key_len: key.len(),
            table,
        })
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key[..self.key_len]
    }

    /// The Toeplitz hash of raw input bytes: at most `key length - 4` of them.
    #[inline]
    pub fn hash(&self, input: &[u8]) -> Result<u32, KeyError> {
        if input.len() + 4 > self.key_len {
            return Err(KeyError::ShortForInput {
                key: self.key_len,
                input: input.len(),
            });
        }
        Ok(self.hash_within_key(input))
    }

    /// [`Toeplitz::hash`] of an input the key is long enough for (`input.len() + 4 <= key_len`,
    /// as every input of at most [`TABLE_LEN`] bytes is).
    #[inline]
    fn hash_within_key(&self, input: &[u8]) -> u32 {
        debug_assert!(input.len() + 4 <= self.key_len);
        let (head, tail) = input.split_at(input.len().min(TABLE_LEN));
        let mut result = 0;
        for (row, &byte) in self.table.iter().zip(head) {
            result ^= row[usize::from(byte)];
        }
        if !tail.is_empty() {
            result ^= self.hash_tail(tail);
        }
        result
    }

    /// The input bytes past the table, a byte at a time.
    #[cold]
    fn hash_tail(&self, tail: &[u8]) -> u32 {
        let mut result = 0;
        for (i, &byte) in tail.iter().enumerate() {
            let window = window64(&self.key, TABLE_LEN + i);
            for bit in 0..8 {
                if byte & (0x80 >> bit) != 0 {
                    result ^= bit_window(window, bit);
                }
            }
        }
        result
    }

    /// Microsoft's RSS hash of a flow: the addresses, and the ports when `with_ports` is set,
    /// the protocol is TCP or UDP and the key has them. IPv4: source (4), destination (4)
    /// [source port (2), destination port (2)]; IPv6 likewise with 16-byte addresses; network
    /// byte order. The two directions of a connection hash differently.
    #[inline]
    pub fn hash_flow(&self, key: &FlowKey, with_ports: bool) -> u32 {
        let (input, len) = flow_input(key, with_ports, false);
        self.hash_within_key(&input[..len])
    }

    /// A symmetric variant of [`Toeplitz::hash_flow`]: both directions of a flow give the same
    /// hash. The (address, port) endpoints are ordered before hashing (the smaller address, or
    /// with equal addresses the smaller port, goes first, as the "source"), then hashed as
    /// [`Toeplitz::hash_flow`] does. This is not Microsoft's hash: it equals it only for the
    /// direction whose source already sorts first. (The other common method, a key with a
    /// repeating 16-bit pattern, would tie symmetry to the key; this works with any key.)
    #[inline]
    pub fn hash_flow_symmetric(&self, key: &FlowKey, with_ports: bool) -> u32 {
        let (input, len) = flow_input(key, with_ports, true);
        self.hash_within_key(&input[..len])
    }
}

/// The 64 key bits starting at byte `pos` of a zero-padded key.
#[inline]
fn window64(padded: &[u8], pos: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&padded[pos..pos + 8]);
    u64::from_be_bytes(bytes)
}

/// The leftmost 32 bits of the key shifted left by `bit` (0..8) bits more than `window`.
#[inline]
fn bit_window(window: u64, bit: usize) -> u32 {
    // Truncation is intended: the 32 bits below the top `32 - bit`.
    ((window << bit) >> 32) as u32
}

/// Whether a flow's ports go into the hash.
#[inline]
fn ports_of(key: &FlowKey, with_ports: bool) -> Option<(u16, u16)> {
    match key.ports {
        Some(ports) if with_ports && (key.proto == TCP || key.proto == UDP) => Some(ports),
        _ => None,
    }
}

/// The hash input of a flow, and its length; `symmetric` orders the endpoints first.
#[inline]
fn flow_input(key: &FlowKey, with_ports: bool, symmetric: bool) -> ([u8; TABLE_LEN], usize) {
    let ports = ports_of(key, with_ports);
    let (sport, dport) = ports.unwrap_or((0, 0));
    let mut input = [0u8; TABLE_LEN];
    let addr_len = match &key.ips {
        IpPair::V4 { src, dst } => put_addresses(&mut input, src, dst, sport, dport, symmetric),
        IpPair::V6 { src, dst } => put_addresses(&mut input, src, dst, sport, dport, symmetric),
    };
    let len = if ports.is_some() {
        addr_len + 4
    } else {
        addr_len
    };
    (input, len)
}

/// Writes source, destination, source port, destination port (the ports always; the caller
/// cuts them off); returns the length of the two addresses.
#[inline]
fn put_addresses<const N: usize>(
    input: &mut [u8; TABLE_LEN],
    src: &[u8; N],
    dst: &[u8; N],
    sport: u16,
    dport: u16,
    symmetric: bool,
) -> usize {
    let ((a, aport), (b, bport)) = if symmetric && (dst, dport) < (src, sport) {
        ((dst, dport), (src, sport))
    } else {
        ((src, sport), (dst, dport))
    };
    input[..N].copy_from_slice(a);
    input[N..2 * N].copy_from_slice(b);
    input[2 * N..2 * N + 2].copy_from_slice(&aport.to_be_bytes());
    input[2 * N + 2..2 * N + 4].copy_from_slice(&bport.to_be_bytes());
    2 * N
}

/// The specification's algorithm, bit by bit. It is defined for keys of at least
/// `input.len() + 4` bytes; for shorter ones this zero-extends the key (where
/// [`Toeplitz::hash`] refuses). Slow; for verification and benchmarks.
pub fn reference_hash(key: &[u8], input: &[u8]) -> u32 {
    let key_bit = |n: usize| -> u32 {
        key.get(n / 8)
            .map_or(0, |&byte| u32::from(byte >> (7 - n % 8)) & 1)
    };
    // The leftmost 32 bits of the (shifted) key.
    let mut window = (0..32).fold(0u32, |w, n| (w << 1) | key_bit(n));
    let mut result = 0;
    for (n, bit) in input
        .iter()
        .flat_map(|&byte| (0..8).map(move |b| (byte >> (7 - b)) & 1))
        .enumerate()
    {
        if bit != 0 {
            result ^= window;
        }
        window = (window << 1) | key_bit(n + 32);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// Microsoft's IPv4 table: (destination, destination port, source, source port, IPv4
    /// only, IPv4 with TCP). Listed destination first, as published.
    const V4_ROWS: [(&str, u16, &str, u16, u32, u32); 5] = [
        (
            "161.142.100.80",
            1766,
            "66.9.149.187",
            2794,
            0x323e8fc2,
            0x51ccc178,
        ),
        (
            "65.69.140.83",
            4739,
            "199.92.111.2",
            14230,
            0xd718262a,
            0xc626b0ea,
        ),
        (
            "12.22.207.184",
            38024,
            "24.19.198.95",
            12898,
            0xd2d0a5de,
            0x5c2b394a,
        ),
        (
            "209.142.163.6",
            2217,
            "38.27.205.30",
            48228,
            0x82989176,
            0xafc7327f,
        ),
        (
            "202.188.127.2",
            1303,
            "153.39.163.191",
            44251,
            0x5d1809c5,
            0x10e828a2,
        ),
    ];

    /// Microsoft's IPv6 table, same layout.
    const V6_ROWS: [(&str, u16, &str, u16, u32, u32); 3] = [
        (
            "3ffe:2501:200:3::1",
            1766,
            "3ffe:2501:200:1fff::7",
            2794,
            0x2cc18cd5,
            0x40207d3d,
        ),
        (
            "ff02::1",
            4739,
            "3ffe:501:8::260:97ff:fe40:efab",
            14230,
            0x0f0c461c,
            0xdde51bbf,
        ),
        (
            "fe80::200:f8ff:fe21:67cf",
            38024,
            "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
            44251,
            0x4b61e985,
            0x02d1feef,
        ),
    ];

    fn v4(s: &str) -> [u8; 4] {
        s.parse::<Ipv4Addr>().unwrap().octets()
    }

    fn v6(s: &str) -> [u8; 16] {
        s.parse::<Ipv6Addr>().unwrap().octets()
    }

    /// Source first: the hash input order.
    fn raw(src: &[u8], dst: &[u8], ports: Option<(u16, u16)>) -> Vec<u8> {
        let mut input = [src, dst].concat();
        if let Some((sport, dport)) = ports {
            input.extend_from_slice(&sport.to_be_bytes());
            input.extend_from_slice(&dport.to_be_bytes());
        }
        input
    }

    fn flow(ips: IpPair, proto: u8, ports: Option<(u16, u16)>) -> FlowKey {
        FlowKey { ips, proto, ports }
    }

    #[test]
    fn default_key_is_microsofts() {
        let hex: String = DEFAULT_KEY.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa"
        );
    }

    #[test]
    fn microsoft_ipv4_table_raw_bytes() {
        let t = Toeplitz::default();
        for (dst, dport, src, sport, only, tcp) in V4_ROWS {
            let (src, dst) = (v4(src), v4(dst));
            let ip_only = raw(&src, &dst, None);
            let with_tcp = raw(&src, &dst, Some((sport, dport)));
            assert_eq!(t.hash(&ip_only).unwrap(), only, "{src:?} -> {dst:?}");
            assert_eq!(
                t.hash(&with_tcp).unwrap(),
                tcp,
                "{src:?}:{sport} -> {dst:?}:{dport}"
            );
            assert_eq!(reference_hash(&DEFAULT_KEY, &ip_only), only);
            assert_eq!(reference_hash(&DEFAULT_KEY, &with_tcp), tcp);
        }
    }

    #[test]
    fn microsoft_ipv6_table_raw_bytes() {
        let t = Toeplitz::default();
        for (dst, dport, src, sport, only, tcp) in V6_ROWS {
            let (src, dst) = (v6(src), v6(dst));
            let ip_only = raw(&src, &dst, None);
            let with_tcp = raw(&src, &dst, Some((sport, dport)));
            assert_eq!(t.hash(&ip_only).unwrap(), only);
            assert_eq!(t.hash(&with_tcp).unwrap(), tcp);
            assert_eq!(reference_hash(&DEFAULT_KEY, &ip_only), only);
            assert_eq!(reference_hash(&DEFAULT_KEY, &with_tcp), tcp);
        }
    }

    #[test]
    fn microsoft_tables_via_flow_key() {
        let t = Toeplitz::default();
        for (dst, dport, src, sport, only, tcp) in V4_ROWS {
            let ips = IpPair::V4 {
                src: v4(src),
                dst: v4(dst),
            };
            let key = flow(ips, TCP, Some((sport, dport)));
            assert_eq!(t.hash_flow(&key, false), only);
            assert_eq!(t.hash_flow(&key, true), tcp);
            // Intel's verification suite uses the same input for UDP.
            assert_eq!(
                t.hash_flow(&flow(ips, UDP, Some((sport, dport))), true),
                tcp
            );
        }
        for (dst, dport, src, sport, only, tcp) in V6_ROWS {
            let ips = IpPair::V6 {
                src: v6(src),
                dst: v6(dst),
            };
            let key = flow(ips, TCP, Some((sport, dport)));
            assert_eq!(t.hash_flow(&key, false), only);
            assert_eq!(t.hash_flow(&key, true), tcp);
        }
    }

    #[test]
    fn swapping_source_and_destination_breaks_the_table() {
        // The pitfall: feeding the table's first column first gives other values.
        let t = Toeplitz::default();
        let (dst, dport, src, sport, only, tcp) = V4_ROWS[0];
        let wrong = raw(&v4(dst), &v4(src), Some((dport, sport)));
        assert_ne!(t.hash(&wrong), Ok(tcp));
        assert_ne!(t.hash(&wrong[..8]), Ok(only));
    }

    #[test]
    fn ports_only_for_tcp_and_udp_when_present() {
        let t = Toeplitz::default();
        let (dst, dport, src, sport, only, _) = V4_ROWS[1];
        let ips = IpPair::V4 {
            src: v4(src),
            dst: v4(dst),
        };
        // ICMP with (bogus) ports, TCP without ports: address-only hash.
        assert_eq!(t.hash_flow(&flow(ips, 1, Some((sport, dport))), true), only);
        assert_eq!(t.hash_flow(&flow(ips, TCP, None), true), only);
        assert_eq!(t.hash_flow(&flow(ips, UDP, None), true), only);
    }

    #[test]
    fn symmetric_hash_is_the_same_both_ways_and_documented_as_ordered() {
        let t = Toeplitz::default();
        for (dst, dport, src, sport, only, tcp) in V4_ROWS {
            let (src, dst) = (v4(src), v4(dst));
            let there = flow(IpPair::V4 { src, dst }, TCP, Some((sport, dport)));
            let back = flow(IpPair::V4 { src: dst, dst: src }, TCP, Some((dport, sport)));
            for with_ports in [false, true] {
                let h = t.hash_flow_symmetric(&there, with_ports);
                assert_eq!(h, t.hash_flow_symmetric(&back, with_ports));
                // It is Microsoft's hash of the direction whose source sorts first.
                let first = if src < dst { &there } else { &back };
                assert_eq!(h, t.hash_flow(first, with_ports));
            }
            let _ = (only, tcp);
        }
        // Same addresses: the ports decide the order.
        let ips = IpPair::V6 {
            src: v6("fd00::1"),
            dst: v6("fd00::1"),
        };
        assert_eq!(
            t.hash_flow_symmetric(&flow(ips, UDP, Some((1000, 53))), true),
            t.hash_flow_symmetric(&flow(ips, UDP, Some((53, 1000))), true)
        );
        assert_eq!(
            t.hash_flow_symmetric(&flow(ips, UDP, Some((1000, 53))), true),
            t.hash_flow(&flow(ips, UDP, Some((53, 1000))), true)
        );
    }

    #[test]
    fn key_length_limits() {
        assert_eq!(
            Toeplitz::new(&DEFAULT_KEY[..39]).unwrap_err(),
            KeyError::TooShort(39)
        );
        assert!(Toeplitz::new(&[0xa5u8; 4096]).is_ok());
        assert_eq!(Toeplitz::new(&DEFAULT_KEY).unwrap().key(), &DEFAULT_KEY[..]);
        assert!(KeyError::TooShort(3).to_string().contains("too short"));
    }

    /// A 52-byte key (the length of Intel's i40e keys): Microsoft's 40 bytes and 12 more.
    const KEY52: [u8; 52] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa, 0x5b, 0x0e, 0xc2, 0x41, 0x67,
        0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0, 0xd0,
    ];

    #[test]
    fn long_key_vectors() {
        let t = Toeplitz::new(&KEY52).unwrap();
        // Up to 36 input bytes only the first 40 key bytes count: Microsoft's tables hold.
        for (dst, dport, src, sport, only, tcp) in V6_ROWS {
            let with_tcp = raw(&v6(src), &v6(dst), Some((sport, dport)));
            assert_eq!(t.hash(&with_tcp[..32]), Ok(only));
            assert_eq!(t.hash(&with_tcp), Ok(tcp));
            let key = flow(
                IpPair::V6 {
                    src: v6(src),
                    dst: v6(dst),
                },
                TCP,
                Some((sport, dport)),
            );
            assert_eq!(t.hash_flow(&key, true), tcp);
        }
        // Longer inputs use the rest of the key. Expected values from an independent
        // bit-by-bit implementation (Python, the specification's loop).
        let input: Vec<u8> = (0..48u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(11))
            .collect();
        for (n, want) in [
            (37, 0x0f38_dad5),
            (40, 0xef54_51da),
            (44, 0xa91c_56ef),
            (48, 0x531e_8cac),
        ] {
            assert_eq!(t.hash(&input[..n]), Ok(want), "{n} bytes");
            assert_eq!(reference_hash(&KEY52, &input[..n]), want, "{n} bytes");
        }
    }

    #[test]
    fn a_key_too_short_for_the_input_is_an_error() {
        let t = Toeplitz::new(&KEY52).unwrap();
        let input = [0x5au8; 49];
        let e = t.hash(&input).unwrap_err();
        assert_eq!(e, KeyError::ShortForInput { key: 52, input: 49 });
        assert_eq!(
            e.to_string(),
            "RSS key of 52 bytes is too short for 49 input bytes (the hash of n bytes needs a key of n + 4)"
        );
        assert!(Toeplitz::default().hash(&input[..36]).is_ok());
        assert!(Toeplitz::default().hash(&input[..37]).is_err());
        assert_eq!(Toeplitz::default().hash(&[]), Ok(0));
    }

    proptest! {
        #[test]
        fn table_matches_reference(
            key in prop::collection::vec(any::<u8>(), MIN_KEY_LEN..=160),
            input in prop::collection::vec(any::<u8>(), 0..=160),
        ) {
            let t = Toeplitz::new(&key).unwrap();
            if input.len() + 4 <= key.len() {
                prop_assert_eq!(t.hash(&input), Ok(reference_hash(&key, &input)));
            } else {
                prop_assert_eq!(
                    t.hash(&input),
                    Err(KeyError::ShortForInput { key: key.len(), input: input.len() })
                );
            }
        }

        /// The hash of n bytes depends on the key's first n + 4 bytes only.
        #[test]
        fn only_the_first_n_plus_4_key_bytes_count(
            key in prop::collection::vec(any::<u8>(), 100..=140),
            input in prop::collection::vec(any::<u8>(), 0..=96),
            tail in any::<u8>(),
        ) {
            let n = input.len();
            let mut other = key.clone();
            for b in &mut other[n + 4..] {
                *b ^= tail | 1;
            }
            let short = &key[..(n + 4).max(MIN_KEY_LEN)];
            let h = Toeplitz::new(&key).unwrap().hash(&input);
            prop_assert_eq!(Toeplitz::new(&other).unwrap().hash(&input), h);
            prop_assert_eq!(Toeplitz::new(short).unwrap().hash(&input), h);
        }

        #[test]
        fn table_matches_reference_flow_lengths(
            key in prop::collection::vec(any::<u8>(), MIN_KEY_LEN..=64),
            input in prop::sample::select(vec![8usize, 12, 32, 36])
                .prop_flat_map(|n| prop::collection::vec(any::<u8>(), n)),
        ) {
            let t = Toeplitz::new(&key).unwrap();
            prop_assert_eq!(t.hash(&input), Ok(reference_hash(&key, &input)));
        }

        #[test]
        fn symmetric_for_any_flow(
            v6 in any::<bool>(),
            a in any::<[u8; 16]>(),
            b in any::<[u8; 16]>(),
            ports in any::<Option<(u16, u16)>>(),
            proto in prop::sample::select(vec![TCP, UDP, 1, 58]),
            with_ports in any::<bool>(),
        ) {
            let t = Toeplitz::default();
            let (there, back) = if v6 {
                (IpPair::V6 { src: a, dst: b }, IpPair::V6 { src: b, dst: a })
            } else {
                let (a4, b4) = ([a[0], a[1], a[2], a[3]], [b[0], b[1], b[2], b[3]]);
                (IpPair::V4 { src: a4, dst: b4 }, IpPair::V4 { src: b4, dst: a4 })
            };
            let rev = ports.map(|(s, d)| (d, s));
            prop_assert_eq!(
                t.hash_flow_symmetric(&flow(there, proto, ports), with_ports),
                t.hash_flow_symmetric(&flow(back, proto, rev), with_ports)
            );
        }
    }
}
