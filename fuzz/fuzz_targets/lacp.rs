//! LACPDU parsing of arbitrary bytes, as a PDU and as a whole frame: never a panic, and what
//! parses is written again and parses to the same PDU.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::lacp::{Lacpdu, PDU_LEN};
use qswitch_wire::MacAddr;

fuzz_target!(|data: &[u8]| {
    if let Ok(pdu) = Lacpdu::parse(data) {
        let mut again = [0u8; PDU_LEN];
        pdu.emit(&mut again).unwrap();
        assert_eq!(Lacpdu::parse(&again), Ok(pdu));
        let frame = pdu.frame(MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(Lacpdu::parse_frame(&frame), Ok((MacAddr([2, 0, 0, 0, 0, 1]), pdu)));
    }
    let _ = Lacpdu::parse_frame(data);
});
