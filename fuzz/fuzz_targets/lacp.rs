//! LACPDU parsing of arbitrary bytes, as a PDU and as a whole frame: never a panic, and what
//! parses is written again and parses to the same PDU. The same bytes with the fields
//! 802.1AX fixes set (subtype, TLV types and lengths) must parse: random bytes rarely have
//! them, so this is what reaches the accepting path.
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
    if data.len() >= PDU_LEN {
        let mut fixed = data.to_vec();
        fixed[0] = 1;
        fixed[1] = fixed[1].max(1);
        fixed[2..4].copy_from_slice(&[1, 20]);
        fixed[22..24].copy_from_slice(&[2, 20]);
        let pdu = Lacpdu::parse(&fixed).expect("a PDU with the fixed fields set parses");
        let mut again = [0u8; PDU_LEN];
        pdu.emit(&mut again).unwrap();
        assert_eq!(Lacpdu::parse(&again), Ok(pdu));
        assert_eq!(again[4..19], fixed[4..19], "actor fields written as read");
    }
});
