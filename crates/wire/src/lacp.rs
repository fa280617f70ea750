//! LACPDUs (IEEE 802.1AX-2014, 6.4.2): the Link Aggregation Control Protocol's one message.
//!
//! A LACPDU is a Slow Protocols frame (destination [`SLOW_PROTOCOLS_MAC`], EtherType
//! [`ETHERTYPE`], subtype [`SUBTYPE`]) of fixed layout, 110 bytes after the Ethernet header:
//!
//! ```text
//! 0  subtype 1, version 1
//! 2  Actor TLV   (type 1, length 20): system priority (2), system (6), key (2),
//!                                     port priority (2), port (2), state (1), reserved (3)
//! 22 Partner TLV (type 2, length 20): the same fields, as the sender last heard them
//! 42 Collector TLV (type 3, length 16): collector max delay (2), reserved (12)
//! 58 Terminator TLV (type 0, length 0)
//! 60 reserved (50)
//! ```
//!
//! * [`Lacpdu::parse`] reads the PDU after the Ethernet header, [`Lacpdu::parse_frame`] a
//!   whole untagged frame. Both check what 6.4.2.3 fixes (subtype, the TLV types and lengths of
//!   the Actor and Partner TLVs) and return [`Error`] for anything else, never panicking. The
//!   version is not checked beyond "not 0": a version 2 LACPDU (802.1AX-2014 6.4.2.4) starts
//!   with the same fields, which are all a version 1 receiver reads (6.4.2.3, "compatibility").
//!   Reserved bytes and the Collector and Terminator TLVs are ignored on receive.
//! * [`Lacpdu::emit`] writes a version 1 PDU with zeroed reserved fields;
//!   [`Lacpdu::frame`] a whole frame ([`FRAME_LEN`] bytes).
//!
//! Interop: the LACP tests in crates/qswitch/tests exchange these PDUs with Open vSwitch 3.1.

use crate::{read_u16, write_u16, Error, MacAddr, Result};

/// The Slow Protocols multicast address (IEEE 802.3 Annex 57A), the destination of LACPDUs.
pub const SLOW_PROTOCOLS_MAC: MacAddr = MacAddr([0x01, 0x80, 0xc2, 0x00, 0x00, 0x02]);

/// The Slow Protocols EtherType.
pub const ETHERTYPE: u16 = 0x8809;

/// The Slow Protocols subtype of LACP (2 is the Marker protocol).
pub const SUBTYPE: u8 = 1;

/// The version this module writes.
pub const VERSION: u8 = 1;

/// Length of a LACPDU after the Ethernet header.
pub const PDU_LEN: usize = 110;

/// Length of a whole LACPDU frame (Ethernet header and PDU, no FCS).
pub const FRAME_LEN: usize = crate::ethernet::HEADER_LEN + PDU_LEN;

/// The Collector Max Delay this module's users send (tens of microseconds; 0 is what Linux
/// and Open vSwitch send).
pub const COLLECTOR_MAX_DELAY: u16 = 0;

mod field {
    pub const SUBTYPE: usize = 0;
    pub const VERSION: usize = 1;
    pub const ACTOR: usize = 2;
    pub const PARTNER: usize = 22;
    pub const COLLECTOR: usize = 42;
    pub const TERMINATOR: usize = 58;
}

const TLV_ACTOR: u8 = 1;
const TLV_PARTNER: u8 = 2;
const TLV_COLLECTOR: u8 = 3;
const INFO_TLV_LEN: u8 = 20;
const COLLECTOR_TLV_LEN: u8 = 16;

/// The state octet of an Actor or Partner TLV (6.4.2.3 h)): eight flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct State(pub u8);

impl State {
    /// LACP_Activity: active (set) or passive LACP.
    pub const ACTIVITY: u8 = 0x01;
    /// LACP_Timeout: short timeout (set, fast rate, 1 s) or long (30 s).
    pub const TIMEOUT: u8 = 0x02;
    /// Aggregation: the link may be aggregated (clear: individual).
    pub const AGGREGATION: u8 = 0x04;
    /// Synchronization: the link is in the right aggregation group.
    pub const SYNCHRONIZATION: u8 = 0x08;
    /// Collecting: frames received on the link are collected.
    pub const COLLECTING: u8 = 0x10;
    /// Distributing: frames are sent on the link.
    pub const DISTRIBUTING: u8 = 0x20;
    /// Defaulted: the partner information is the administrative default, not received.
    pub const DEFAULTED: u8 = 0x40;
    /// Expired: the receive machine is in EXPIRED.
    pub const EXPIRED: u8 = 0x80;

    /// Whether every flag of `flags` is set.
    pub const fn has(self, flags: u8) -> bool {
        self.0 & flags == flags
    }

    /// Sets or clears `flags`.
    pub fn set(&mut self, flags: u8, on: bool) {
        if on {
            self.0 |= flags;
        } else {
            self.0 &= !flags;
        }
    }
}

/// The information of an Actor or Partner TLV: who a port is and what state it is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PortInfo {
    /// System priority (lower is better).
    pub system_priority: u16,
    /// System identifier, a MAC address.
    pub system: MacAddr,
    /// Operational key: links with the same key and partner may aggregate.
    pub key: u16,
    /// Port priority (lower is better).
    pub port_priority: u16,
    /// Port number, unique within the system (0 is reserved).
    pub port: u16,
    /// The state flags.
    pub state: State,
}

impl PortInfo {
    fn read(tlv: &[u8]) -> PortInfo {
        PortInfo {
            system_priority: read_u16(tlv, 2..4),
            system: MacAddr::from_bytes(&tlv[4..10]).unwrap_or(MacAddr::ZERO),
            key: read_u16(tlv, 10..12),
            port_priority: read_u16(tlv, 12..14),
            port: read_u16(tlv, 14..16),
            state: State(tlv[16]),
        }
    }

    fn write(&self, tlv: &mut [u8], tlv_type: u8) {
        tlv[0] = tlv_type;
        tlv[1] = INFO_TLV_LEN;
        write_u16(tlv, 2..4, self.system_priority);
        tlv[4..10].copy_from_slice(&self.system.0);
        write_u16(tlv, 10..12, self.key);
        write_u16(tlv, 12..14, self.port_priority);
        write_u16(tlv, 14..16, self.port);
        tlv[16] = self.state.0;
        tlv[17..20].fill(0);
    }
}

/// A parsed LACPDU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Lacpdu {
    /// The sender's own information.
    pub actor: PortInfo,
    /// What the sender knows of its partner (the receiver, when they are talking).
    pub partner: PortInfo,
    /// Collector Max Delay, in tens of microseconds.
    pub collector_max_delay: u16,
}

impl Lacpdu {
    /// Parses a LACPDU from the bytes after the Ethernet header (padding after
    /// [`PDU_LEN`] bytes is ignored).
    pub fn parse(pdu: &[u8]) -> Result<Lacpdu> {
        if pdu.len() < PDU_LEN {
            return Err(Error::Truncated);
        }
        let actor = &pdu[field::ACTOR..field::PARTNER];
        let partner = &pdu[field::PARTNER..field::COLLECTOR];
        if pdu[field::SUBTYPE] != SUBTYPE
            || pdu[field::VERSION] == 0
            || actor[0] != TLV_ACTOR
            || actor[1] != INFO_TLV_LEN
            || partner[0] != TLV_PARTNER
            || partner[1] != INFO_TLV_LEN
        {
            return Err(Error::Malformed);
        }
        let collector = &pdu[field::COLLECTOR..field::TERMINATOR];
        let collector_max_delay = if collector[0] == TLV_COLLECTOR {
            read_u16(collector, 2..4)
        } else {
            0
        };
        Ok(Lacpdu {
            actor: PortInfo::read(actor),
            partner: PortInfo::read(partner),
            collector_max_delay,
        })
    }

    /// Parses a whole frame: destination [`SLOW_PROTOCOLS_MAC`], EtherType [`ETHERTYPE`],
    /// then the PDU. Returns the sender's MAC address with the PDU.
    pub fn parse_frame(frame: &[u8]) -> Result<(MacAddr, Lacpdu)> {
        let eth = crate::ethernet::Frame::new_checked(frame)?;
        if eth.dst_addr() != SLOW_PROTOCOLS_MAC || u16::from(eth.ethertype()) != ETHERTYPE {
            return Err(Error::Malformed);
        }
        Ok((eth.src_addr(), Lacpdu::parse(eth.payload())?))
    }

    /// Writes the PDU (version 1) into the first [`PDU_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let pdu = buf.get_mut(..PDU_LEN).ok_or(Error::Truncated)?;
        pdu.fill(0);
        pdu[field::SUBTYPE] = SUBTYPE;
        pdu[field::VERSION] = VERSION;
        self.actor
            .write(&mut pdu[field::ACTOR..field::PARTNER], TLV_ACTOR);
        self.partner
            .write(&mut pdu[field::PARTNER..field::COLLECTOR], TLV_PARTNER);
        pdu[field::COLLECTOR] = TLV_COLLECTOR;
        pdu[field::COLLECTOR + 1] = COLLECTOR_TLV_LEN;
        write_u16(
            pdu,
            field::COLLECTOR + 2..field::COLLECTOR + 4,
            self.collector_max_delay,
        );
        // Terminator TLV (type 0, length 0) and the reserved bytes stay zero.
        Ok(())
    }

    /// The whole frame from `src` (the sending port's MAC address) to the Slow Protocols
    /// address.
    pub fn frame(&self, src: MacAddr) -> [u8; FRAME_LEN] {
        let mut out = [0u8; FRAME_LEN];
        out[0..6].copy_from_slice(&SLOW_PROTOCOLS_MAC.0);
        out[6..12].copy_from_slice(&src.0);
        out[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        // FRAME_LEN leaves exactly PDU_LEN bytes after the header.
        let _ = self.emit(&mut out[crate::ethernet::HEADER_LEN..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A LACPDU sent by Open vSwitch 3.1 (`lacp=active`, `lacp-time=fast`, userspace
    /// datapath) on a veth before it heard its partner, captured with tcpdump: actor system
    /// 7e:c5:c3:7e:29:49 priority 65534, key 1, port 2 priority 65535, state 0xb7 (active,
    /// short timeout, aggregation, collecting, distributing, expired); partner all zero but
    /// its state, 0x02 (short timeout). Bytes after the Collector TLV are zero.
    static OVS_PDU: [u8; PDU_LEN] = {
        let head: [u8; 46] = [
            0x01, 0x01, 0x01, 0x14, 0xff, 0xfe, 0x7e, 0xc5, 0xc3, 0x7e, 0x29, 0x49, 0x00, 0x01,
            0xff, 0xff, 0x00, 0x02, 0xb7, 0x00, 0x00, 0x00, 0x02, 0x14, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
            0x03, 0x10, 0x00, 0x00,
        ];
        let mut p = [0u8; PDU_LEN];
        let mut i = 0;
        while i < head.len() {
            p[i] = head[i];
            i += 1;
        }
        p
    };

    #[test]
    fn parses_an_ovs_lacpdu() {
        let pdu = Lacpdu::parse(&OVS_PDU).unwrap();
        assert_eq!(pdu.actor.system_priority, 65534);
        assert_eq!(pdu.actor.system, "7e:c5:c3:7e:29:49".parse().unwrap());
        assert_eq!(
            (pdu.actor.key, pdu.actor.port_priority, pdu.actor.port),
            (1, 65535, 2)
        );
        assert!(pdu
            .actor
            .state
            .has(State::ACTIVITY | State::TIMEOUT | State::AGGREGATION));
        assert!(pdu
            .actor
            .state
            .has(State::COLLECTING | State::DISTRIBUTING | State::EXPIRED));
        assert!(!pdu.actor.state.has(State::SYNCHRONIZATION));
        assert_eq!(
            pdu.partner,
            PortInfo {
                state: State(State::TIMEOUT),
                ..PortInfo::default()
            }
        );
        let mut again = [0xaau8; PDU_LEN];
        pdu.emit(&mut again).unwrap();
        assert_eq!(again, OVS_PDU);
    }

    #[test]
    fn frame_round_trips() {
        let pdu = Lacpdu::parse(&OVS_PDU).unwrap();
        let src: MacAddr = "02:00:00:00:00:01".parse().unwrap();
        let frame = pdu.frame(src);
        assert_eq!(&frame[..6], &SLOW_PROTOCOLS_MAC.0);
        assert_eq!(Lacpdu::parse_frame(&frame), Ok((src, pdu)));
        let mut other = frame;
        other[13] = 0x0a;
        assert_eq!(Lacpdu::parse_frame(&other), Err(Error::Malformed));
    }

    #[test]
    fn rejects_what_6_4_2_3_fixes() {
        assert_eq!(
            Lacpdu::parse(&OVS_PDU[..PDU_LEN - 1]),
            Err(Error::Truncated)
        );
        for (at, value) in [(0, 2), (1, 0), (2, 9), (3, 19), (22, 1), (23, 0)] {
            let mut bad = OVS_PDU;
            bad[at] = value;
            assert_eq!(Lacpdu::parse(&bad), Err(Error::Malformed), "byte {at}");
        }
        // A later version is read as version 1; reserved bytes are ignored.
        let mut v2 = OVS_PDU;
        v2[1] = 2;
        v2[100] = 0xff;
        assert!(Lacpdu::parse(&v2).is_ok());
        assert_eq!(
            Lacpdu::emit(&Lacpdu::default(), &mut [0; 10]),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn state_flags() {
        let mut s = State::default();
        s.set(State::COLLECTING | State::DISTRIBUTING, true);
        assert!(s.has(State::COLLECTING) && s.has(State::DISTRIBUTING));
        s.set(State::DISTRIBUTING, false);
        assert_eq!(s, State(State::COLLECTING));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(pdu) = Lacpdu::parse(&bytes) {
                let mut again = [0u8; PDU_LEN];
                pdu.emit(&mut again).unwrap();
                prop_assert_eq!(Lacpdu::parse(&again), Ok(pdu));
            }
            let _ = Lacpdu::parse_frame(&bytes);
        }
    }
}
