//! IEEE 802 MAC addresses.
//!
//! [`MacAddr`] is a plain 6-byte value: `Copy`, hashable and ordered, so it can key the MAC
//! learning table directly. Text form is lower-case `aa:bb:cc:dd:ee:ff`; parsing accepts exactly
//! that (either case), not `-` or `.` separated forms.

use core::fmt;
use core::str::FromStr;

/// A 48-bit MAC address, in transmission order.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    /// `00:00:00:00:00:00`.
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The address in `bytes`, if it is exactly 6 bytes long.
    #[inline]
    pub fn from_bytes(bytes: &[u8]) -> Option<MacAddr> {
        bytes.try_into().ok().map(MacAddr)
    }

    /// Whether this is the broadcast address.
    #[inline]
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Whether the I/G bit is set: a group address. Includes broadcast.
    #[inline]
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether the I/G bit is clear: an individual address.
    #[inline]
    pub fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// Whether the U/L bit is set: a locally administered address.
    #[inline]
    pub fn is_local(&self) -> bool {
        self.0[0] & 0x02 != 0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

/// The error of parsing a [`MacAddr`] from text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseMacError;

impl fmt::Display for ParseMacError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid MAC address, expected aa:bb:cc:dd:ee:ff")
    }
}

impl std::error::Error for ParseMacError {}

impl FromStr for MacAddr {
    type Err = ParseMacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or(ParseMacError)?;
            // from_str_radix alone would also take "+f" and "f".
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ParseMacError);
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| ParseMacError)?;
        }
        match parts.next() {
            Some(_) => Err(ParseMacError),
            None => Ok(MacAddr(out)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{ARP_REQUEST, MLD_REPORT};

    #[test]
    fn from_frame_bytes() {
        let dst = MacAddr::from_bytes(&ARP_REQUEST[0..6]).unwrap();
        let src = MacAddr::from_bytes(&ARP_REQUEST[6..12]).unwrap();
        assert_eq!(dst, MacAddr::BROADCAST);
        assert_eq!(src, MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x01]));
        assert_eq!(MacAddr::from_bytes(&ARP_REQUEST[0..5]), None);
        assert_eq!(MacAddr::from_bytes(&ARP_REQUEST[0..7]), None);
    }

    #[test]
    fn address_kinds() {
        let broadcast = MacAddr::BROADCAST;
        assert!(broadcast.is_broadcast() && broadcast.is_multicast() && !broadcast.is_unicast());

        // The IPv6 multicast address an MLD report goes to.
        let mld = MacAddr::from_bytes(&MLD_REPORT[0..6]).unwrap();
        assert!(mld.is_multicast() && !mld.is_broadcast() && !mld.is_unicast());

        // QEMU's 52:54:00 prefix is locally administered.
        let guest = MacAddr::from_bytes(&MLD_REPORT[6..12]).unwrap();
        assert!(guest.is_unicast() && guest.is_local());

        let global: MacAddr = "00:1b:21:0a:0b:0c".parse().unwrap();
        assert!(global.is_unicast() && !global.is_local());
        assert!(MacAddr::ZERO.is_unicast() && MacAddr::ZERO == MacAddr::default());
    }

    #[test]
    fn display_and_parse_round_trip() {
        let mac = MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0x0f]);
        assert_eq!(mac.to_string(), "52:54:00:ab:cd:0f");
        assert_eq!(format!("{mac:?}"), "MacAddr(52:54:00:ab:cd:0f)");
        assert_eq!("52:54:00:ab:cd:0f".parse(), Ok(mac));
        assert_eq!("52:54:00:AB:CD:0F".parse(), Ok(mac));
        assert_eq!(
            MacAddr::BROADCAST.to_string().parse(),
            Ok(MacAddr::BROADCAST)
        );
    }

    #[test]
    fn parse_rejects_other_forms() {
        for bad in [
            "",
            "52:54:00:ab:cd",
            "52:54:00:ab:cd:0f:00",
            "52:54:00:ab:cd:0f:",
            "52-54-00-ab-cd-0f",
            "5254.00ab.cd0f",
            "52:54:00:ab:cd:f",
            "52:54:00:ab:cd:+f",
            "52:54:00:ab:cd:0g",
            "52:54:00:ab:cd:0ff",
        ] {
            assert_eq!(bad.parse::<MacAddr>(), Err(ParseMacError), "{bad:?}");
        }
        assert!(!ParseMacError.to_string().is_empty());
    }

    #[test]
    fn orders_bytewise() {
        let a: MacAddr = "00:00:00:00:00:ff".parse().unwrap();
        let b: MacAddr = "00:00:00:00:01:00".parse().unwrap();
        assert!(a < b && b < MacAddr::BROADCAST);
    }
}
