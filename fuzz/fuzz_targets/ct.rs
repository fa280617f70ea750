//! The connection-tracking view of arbitrary frames: `ct::parse` must never panic, and what
//! it reports must be consistent (a later fragment has no ports, an ICMP error's quoted key
//! is of the outer packet's address family, reversing a key twice gives it back), and the short path agrees with the general one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::ct::{self, Fragment, L4};

fuzz_target!(|data: &[u8]| {
    // The short path for plain IPv4 UDP/TCP agrees with the general parser.
    assert_eq!(ct::parse(data), ct::parse_general(data));
    let Ok(p) = ct::parse(data) else {
        return;
    };
    assert_eq!(p.key.reversed().reversed(), p.key);
    assert_eq!(p.fragment == Fragment::Later, p.l4 == L4::LaterFragment);
    match p.l4 {
        L4::LaterFragment | L4::Other | L4::IcmpOther { .. } => {
            assert_eq!((p.key.src, p.key.dst), (0, 0))
        }
        L4::Echo { id, .. } => assert_eq!((p.key.src, p.key.dst), (id, id)),
        L4::IcmpError { inner, .. } => assert_eq!(inner.is_ipv6(), p.key.is_ipv6()),
        L4::Tcp(_) | L4::Udp | L4::Sctp => {}
    }
});
