//! LLDPDU parsing of arbitrary bytes, as a PDU and as a whole frame: never a panic; what
//! parses and can be written again parses to the same PDU.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_wire::lldp::{self, Lldpdu};
use qswitch_wire::MacAddr;

fuzz_target!(|data: &[u8]| {
    if let Ok(pdu) = Lldpdu::parse(data) {
        let mut again = vec![0u8; pdu.len() + 14 + 60];
        if let Ok(len) = pdu.emit(&mut again) {
            assert_eq!(len, pdu.len());
            assert_eq!(Lldpdu::parse(&again[..len]), Ok(pdu));
            let src = MacAddr([2, 0, 0, 0, 0, 1]);
            let flen = pdu.frame(src, &mut again).unwrap();
            assert_eq!(Lldpdu::parse_frame(&again[..flen]), Ok((src, pdu)));
        }
    }
    let _ = Lldpdu::parse_frame(data);
    for tlv in lldp::tlvs(data).flatten() {
        assert!(tlv.value.len() <= lldp::MAX_TLV_LEN);
    }
});
