//! Per-frame cost of the tunnel and port-security helpers: VXLAN encapsulation into headroom
//! (with and without the UDP checksum, over IPv4 and IPv6), decapsulation of the result, and
//! `guard::inspect` on a 64-byte UDP frame. Not run here: the lead runs benches.

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use criterion::{criterion_group, criterion_main, Criterion};
use qswitch_wire::vxlan::{self, Encap, Underlay, Vni};
use qswitch_wire::{guard, MacAddr};

/// A captured 64-byte IPv4/UDP frame, 10.0.0.1:40000 -> 10.0.0.2:4789.
static UDP4_64: [u8; 64] = [
    0x52, 0x54, 0x00, 0x12, 0x34, 0x02, 0x52, 0x54, 0x00, 0x12, 0x34, 0x01, 0x08, 0x00, 0x45, 0x00,
    0x00, 0x32, 0xc4, 0x23, 0x40, 0x00, 0x40, 0x11, 0x62, 0x95, 0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00,
    0x00, 0x02, 0x9c, 0x40, 0x12, 0xb5, 0x00, 0x1e, 0x35, 0xcc, 0x71, 0x73, 0x77, 0x69, 0x74, 0x63,
    0x68, 0x2d, 0x77, 0x69, 0x72, 0x65, 0x2d, 0x62, 0x65, 0x6e, 0x63, 0x68, 0x2d, 0x36, 0x34, 0x42,
];

fn encap(underlay: Underlay, udp_checksum: bool) -> Encap {
    Encap {
        src_mac: MacAddr([0x52, 0x54, 0, 0, 0, 0x0a]),
        dst_mac: MacAddr([0x52, 0x54, 0, 0, 0, 0x0b]),
        underlay,
        src_port: vxlan::src_port(0x1234_5678),
        dst_port: vxlan::UDP_PORT,
        vni: Vni::new(100).expect("VNI fits in 24 bits"),
        ttl: 64,
        tos: 0,
        udp_checksum,
    }
}

fn bench(c: &mut Criterion) {
    let v4 = Underlay::V4 {
        src: Ipv4Addr::new(192, 0, 2, 1),
        dst: Ipv4Addr::new(192, 0, 2, 2),
    };
    let v6 = Underlay::V6 {
        src: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
        dst: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2),
    };
    let mut inner_1500 = vec![0u8; 1500];
    inner_1500[..64].copy_from_slice(&UDP4_64);
    let cases = [
        ("v4_64", encap(v4, false), &UDP4_64[..]),
        ("v4_csum_64", encap(v4, true), &UDP4_64[..]),
        ("v4_csum_1500", encap(v4, true), &inner_1500[..]),
        ("v6_64", encap(v6, true), &UDP4_64[..]),
        ("v6_1500", encap(v6, true), &inner_1500[..]),
    ];

    let mut group = c.benchmark_group("vxlan::encap");
    for (name, encap, inner) in &cases {
        let mut headroom = [0u8; 128];
        group.bench_function(*name, |b| {
            b.iter(|| encap.write(black_box(&mut headroom), black_box(inner)))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("vxlan::decap");
    for (name, encap, inner) in &cases {
        let mut frame = vec![0u8; encap.overhead() + inner.len()];
        frame[encap.overhead()..].copy_from_slice(inner);
        encap
            .write_in_place(&mut frame, encap.overhead())
            .expect("headroom fits");
        group.bench_function(*name, |b| b.iter(|| vxlan::decap(black_box(&frame))));
    }
    group.finish();

    let mut group = c.benchmark_group("guard::inspect");
    group.bench_function("udp64", |b| b.iter(|| guard::inspect(black_box(&UDP4_64))));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
