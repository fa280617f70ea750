//! ERSPAN type II parsing of arbitrary bytes (a mirror session's GRE payload as a collector
//! would read it): never a panic, the inner frame is the bytes after the 16-byte header, and
//! what parses is written again by `Erspan::header` and parses to the same fields. The same
//! bytes with the GRE flags, protocol type and ERSPAN version set must parse: random bytes
//! rarely have them, so this is what reaches the accepting path.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::erspan::{self, Erspan, ETHERTYPE_ERSPAN_II, HEADER_LEN};

/// Parses `pkt` and, if it is ERSPAN, checks the inner frame and the round trip.
fn check(pkt: &[u8]) -> Option<Erspan> {
    let (e, inner) = erspan::parse(pkt)?;
    assert_eq!(inner, &pkt[HEADER_LEN..]);
    assert!(e.session <= erspan::MAX_SESSION && e.vlan <= 0x0fff && e.cos <= 7);
    assert!(e.index <= 0x000f_ffff);
    let header = e.header();
    // Only the bits parse ignores (En, T, reserved) may differ.
    assert_eq!(header[..10], pkt[..10]);
    assert_eq!(header[10] & 0xe3, pkt[10] & 0xe3);
    assert_eq!(header[11], pkt[11]);
    assert_eq!(header[13] & 0x0f, pkt[13] & 0x0f);
    assert_eq!(header[14..], pkt[14..HEADER_LEN]);
    let mut again = header.to_vec();
    again.extend_from_slice(inner);
    let (back, back_inner) = erspan::parse(&again).expect("our own header parses");
    assert_eq!((back, back_inner), (e, inner));
    Some(e)
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= HEADER_LEN {
        let mut fixed = data.to_vec();
        fixed[0..2].copy_from_slice(&0x1000u16.to_be_bytes());
        fixed[2..4].copy_from_slice(&ETHERTYPE_ERSPAN_II.to_be_bytes());
        fixed[8] = (fixed[8] & 0x0f) | 0x10;
        check(&fixed).expect("a header with the fixed fields set parses");
    }
});
