//! VXLAN decapsulation of arbitrary outer frames; what it accepts is encapsulated again with
//! the same outer facts and must decapsulate to the same inner frame and VNI. The same input
//! is also read as encapsulation parameters and an inner frame, which must round-trip (random
//! bytes rarely carry valid checksums, so this is what reaches the accepting paths).
#![no_main]

use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use libfuzzer_sys::fuzz_target;
use qswitch_wire::vxlan::{self, Decap, Encap, Underlay, Vni};
use qswitch_wire::MacAddr;

/// Encapsulates `inner` with `encap` into a new buffer and decapsulates it.
fn round_trip(encap: &Encap, inner: &[u8]) {
    let mut frame = vec![0u8; encap.overhead() + inner.len()];
    frame[encap.overhead()..].copy_from_slice(inner);
    match encap.write_in_place(&mut frame, encap.overhead()) {
        Ok(start) => assert_eq!(start, 0),
        Err(_) => {
            assert!(inner.len() < 14 || inner.len() > 65_000);
            return;
        }
    }
    let again = vxlan::decap_port(&frame, encap.dst_port).unwrap();
    assert_eq!((again.inner, again.vni), (inner, encap.vni));
}

fn encap_of(decap: &Decap<'_>) -> Encap {
    let underlay = match (decap.src, decap.dst) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => Underlay::V4 { src, dst },
        (IpAddr::V6(src), IpAddr::V6(dst)) => Underlay::V6 { src, dst },
        _ => panic!("mixed address families"),
    };
    Encap {
        src_mac: decap.outer_src_mac,
        dst_mac: decap.outer_dst_mac,
        underlay,
        src_port: decap.src_port,
        dst_port: decap.dst_port,
        vni: decap.vni,
        ttl: decap.ttl,
        tos: decap.tos,
        udp_checksum: decap.udp_checksum,
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(decap) = vxlan::decap(data) {
        assert!(decap.inner_offset + decap.inner.len() <= data.len());
        round_trip(&encap_of(&decap), decap.inner);
    }
    // Parameters: flags, VNI (3), source port seed (4), TTL, TOS; then the inner frame.
    if let [flags, v0, v1, v2, h0, h1, h2, h3, ttl, tos, inner @ ..] = data {
        let underlay = if flags & 1 == 0 {
            Underlay::V4 {
                src: Ipv4Addr::new(192, 0, 2, *v0),
                dst: Ipv4Addr::new(198, 51, 100, *v1),
            }
        } else {
            Underlay::V6 {
                src: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(*v0)),
                dst: Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 1, u16::from(*v1)),
            }
        };
        let encap = Encap {
            src_mac: MacAddr([2, 0, 0, 0, 0, *h0]),
            dst_mac: MacAddr([2, 0, 0, 0, 1, *h1]),
            underlay,
            src_port: vxlan::src_port(u32::from_be_bytes([*h0, *h1, *h2, *h3])),
            dst_port: if flags & 4 == 0 {
                vxlan::UDP_PORT
            } else {
                8472
            },
            vni: Vni::new(u32::from_be_bytes([0, *v0, *v1, *v2])).unwrap(),
            ttl: *ttl,
            tos: *tos,
            udp_checksum: flags & 2 != 0,
        };
        round_trip(&encap, inner);
    }
});
