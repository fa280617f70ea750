//! The port-security facts of arbitrary frames: `guard::inspect` must never panic, and what it
//! reports must be consistent with the frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::guard;

fuzz_target!(|data: &[u8]| {
    let facts = guard::inspect(data);
    assert_eq!(facts.src_mac.is_some(), data.len() >= 14);
    if facts.arp.is_some() || facts.ip_src.is_some() {
        assert!(facts.ethertype.is_some());
    }
});
