//! Cost of one Toeplitz hash with Microsoft's key: the table-driven `Toeplitz::hash` against
//! the bit-by-bit `reference_hash`, on the IPv4+TCP (12-byte) and IPv6+TCP (36-byte) inputs of
//! Microsoft's verification table (first rows, source first).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use qswitch_dp::rss::toeplitz::{reference_hash, Toeplitz, DEFAULT_KEY};

/// 66.9.149.187:2794 -> 161.142.100.80:1766.
const IPV4_TCP: [u8; 12] = [66, 9, 149, 187, 161, 142, 100, 80, 0x0a, 0xea, 0x06, 0xe6];

/// [3ffe:2501:200:1fff::7]:2794 -> [3ffe:2501:200:3::1]:1766.
const IPV6_TCP: [u8; 36] = [
    0x3f, 0xfe, 0x25, 0x01, 0x02, 0x00, 0x1f, 0xff, 0, 0, 0, 0, 0, 0, 0, 0x07, //
    0x3f, 0xfe, 0x25, 0x01, 0x02, 0x00, 0x00, 0x03, 0, 0, 0, 0, 0, 0, 0, 0x01, //
    0x0a, 0xea, 0x06, 0xe6,
];

fn bench(c: &mut Criterion) {
    let t = Toeplitz::new(&DEFAULT_KEY).unwrap();
    assert_eq!(t.hash(&IPV4_TCP), Ok(0x51ccc178));
    assert_eq!(t.hash(&IPV6_TCP), Ok(0x40207d3d));
    let inputs: [(&str, &[u8]); 2] = [("ipv4_tcp_12B", &IPV4_TCP), ("ipv6_tcp_36B", &IPV6_TCP)];
    let mut group = c.benchmark_group("toeplitz");
    for (name, input) in inputs {
        group.bench_function(format!("table/{name}"), |b| {
            b.iter(|| t.hash(black_box(input)))
        });
        group.bench_function(format!("reference/{name}"), |b| {
            b.iter(|| reference_hash(black_box(&DEFAULT_KEY), black_box(input)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
