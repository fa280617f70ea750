//! Config values that parse into their meaning: a [`Rate`] is bits/s, a [`MacAddress`] six
//! bytes, a [`VlanId`] a number in 1..=4094. Each has `FromStr` (the CLI's flags) and
//! `TryFrom` the form it has in TOML and JSON (serde's `try_from`), and serializes back to a
//! form that parses to the same value, so a config can be dumped and read again.
//!
//! A value that parsed is valid: nothing downstream checks it again or falls back to a
//! default. The error messages are one line; those of the generic types (rates, MAC
//! addresses, CPU lists) do not know the key they were given for, so the config parser adds
//! it from the file position (see [`crate::config::Config::from_toml`]).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A number that is not in its key's range, or not a number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("{key} = {value} is out of range {min}..={max}")]
    OutOfRange {
        key: &'static str,
        value: u64,
        min: u64,
        max: u64,
    },
    #[error("{key} = '{text}' is not a number")]
    NotANumber { key: &'static str, text: String },
}

/// An integer newtype limited to `MIN..=MAX`, named after the key it is the value of.
macro_rules! bounded {
    ($(#[$doc:meta])* $name:ident($int:ty, $int_name:literal), $key:literal, $min:expr, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = $int_name, into = $int_name)]
        pub struct $name($int);

        impl $name {
            /// Smallest value.
            pub const MIN: $int = $min;
            /// Largest value.
            pub const MAX: $int = $max;

            /// The number.
            pub const fn get(self) -> $int {
                self.0
            }
        }

        impl TryFrom<$int> for $name {
            type Error = RangeError;
            fn try_from(v: $int) -> Result<Self, RangeError> {
                if !(Self::MIN..=Self::MAX).contains(&v) {
                    return Err(RangeError::OutOfRange {
                        key: $key,
                        value: u64::from(v),
                        min: u64::from(Self::MIN),
                        max: u64::from(Self::MAX),
                    });
                }
                Ok($name(v))
            }
        }

        impl From<$name> for $int {
            fn from(v: $name) -> $int {
                v.0
            }
        }

        impl FromStr for $name {
            type Err = RangeError;
            fn from_str(s: &str) -> Result<Self, RangeError> {
                let t = s.trim();
                if !t.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(RangeError::NotANumber { key: $key, text: s.to_string() });
                }
                match t.parse::<u64>() {
                    Ok(v) => match <$int>::try_from(v) {
                        Ok(v) => $name::try_from(v),
                        Err(_) => Err(RangeError::OutOfRange {
                            key: $key,
                            value: v,
                            min: u64::from(Self::MIN),
                            max: u64::from(Self::MAX),
                        }),
                    },
                    Err(_) => Err(RangeError::NotANumber { key: $key, text: s.to_string() }),
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }
    };
}

bounded!(
    /// An IEEE 802.1Q VLAN id, 1..=4094 (0 and 4095 are reserved).
    VlanId(u16, "u16"), "vlan", 1, 4094
);
bounded!(
    /// A port's QoS weight: its relative share of what the guarantees leave.
    Weight(u32, "u32"), "weight", 1, 1000
);
bounded!(
    /// `[switch] fdb_aging`: seconds a learned MAC address lives without being seen (up to a
    /// year).
    FdbAging(u64, "u64"), "fdb_aging", 1, 31_536_000
);
bounded!(
    /// `[switch] poll_spin_us`: microseconds a worker keeps polling after its last frame.
    PollSpinUs(u64, "u64"), "poll_spin_us", 0, 10_000
);

impl FdbAging {
    /// The default, 300 s.
    pub const DEFAULT: FdbAging = FdbAging(300);
}

impl PollSpinUs {
    /// The default, 50 µs.
    pub const DEFAULT: PollSpinUs = PollSpinUs(50);
}

/// `[switch] reservable`: the share, in (0, 1], of an uplink's capacity that minimum
/// guarantees may reserve in total.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct Reservable(f64);

/// A `reservable` outside (0, 1].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("reservable = {0} is out of range (0, 1]")]
pub struct ReservableError(String);

impl Reservable {
    /// The default, 0.9.
    pub const DEFAULT: Reservable = Reservable(0.9);

    /// The share.
    pub const fn get(self) -> f64 {
        self.0
    }
}

impl Default for Reservable {
    fn default() -> Self {
        Reservable::DEFAULT
    }
}

impl TryFrom<f64> for Reservable {
    type Error = ReservableError;
    fn try_from(v: f64) -> Result<Self, ReservableError> {
        if v > 0.0 && v <= 1.0 {
            Ok(Reservable(v))
        } else {
            Err(ReservableError(v.to_string()))
        }
    }
}

impl From<Reservable> for f64 {
    fn from(r: Reservable) -> f64 {
        r.0
    }
}

impl fmt::Display for Reservable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Largest rate accepted, in bits/s (1000T).
pub const MAX_RATE: u64 = 1_000_000_000_000_000;

/// A rate in bits/s of L2 frames. Written as a number with an optional k, M, G or T suffix
/// (powers of 1000): "150M", "1.5G", "800000".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Rate(u64);

/// A string that is not a rate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    #[error("'{0}' is not a rate (a number of bits/s with an optional k, M, G or T suffix, e.g. \"200M\")")]
    Syntax(String),
    #[error("'{0}' is above the largest rate, 1000T")]
    TooLarge(String),
}

impl Rate {
    /// A rate of `bps` bits/s (at most [`MAX_RATE`]).
    pub const fn from_bps(bps: u64) -> Rate {
        Rate(if bps > MAX_RATE { MAX_RATE } else { bps })
    }

    /// Bits per second.
    pub const fn bps(self) -> u64 {
        self.0
    }
}

impl FromStr for Rate {
    type Err = RateError;
    fn from_str(s: &str) -> Result<Self, RateError> {
        let t = s.trim();
        let (num, mult) = match t.char_indices().last() {
            Some((i, 'k' | 'K')) => (&t[..i], 1e3),
            Some((i, 'M')) => (&t[..i], 1e6),
            Some((i, 'G')) => (&t[..i], 1e9),
            Some((i, 'T')) => (&t[..i], 1e12),
            _ => (t, 1.0),
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(RateError::Syntax(s.to_string()));
        }
        let v: f64 = num.parse().map_err(|_| RateError::Syntax(s.to_string()))?;
        let bps = v * mult;
        if !bps.is_finite() || bps > MAX_RATE as f64 {
            return Err(RateError::TooLarge(s.to_string()));
        }
        Ok(Rate(bps.round() as u64))
    }
}

impl TryFrom<String> for Rate {
    type Error = RateError;
    fn try_from(s: String) -> Result<Self, RateError> {
        s.parse()
    }
}

impl From<Rate> for String {
    fn from(r: Rate) -> String {
        r.to_string()
    }
}

impl fmt::Display for Rate {
    /// The largest suffix that keeps the value exact with at most three decimals: "1.5G",
    /// "150M", "1234567". Parses back to the same rate.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bps = self.0;
        for (unit, suffix) in [
            (1_000_000_000_000u64, "T"),
            (1_000_000_000, "G"),
            (1_000_000, "M"),
            (1_000, "k"),
        ] {
            if bps >= unit && bps.is_multiple_of(unit / 1000) {
                let (whole, frac) = (bps / unit, bps % unit / (unit / 1000));
                return if frac == 0 {
                    write!(f, "{whole}{suffix}")
                } else {
                    let frac = format!("{frac:03}");
                    write!(f, "{whole}.{}{suffix}", frac.trim_end_matches('0'))
                };
            }
        }
        write!(f, "{bps}")
    }
}

/// Formats bits/s for people, rounded to three decimals ("150M", "1.235G").
pub fn format_rate(bps: u64) -> String {
    let v = bps as f64;
    let (d, suffix) = if bps >= 1_000_000_000 {
        (1e9, "G")
    } else if bps >= 1_000_000 {
        (1e6, "M")
    } else if bps >= 1000 {
        (1e3, "k")
    } else {
        (1.0, "")
    };
    let x = v / d;
    if (x - x.round()).abs() < 1e-9 {
        format!("{}{suffix}", x.round())
    } else {
        let n = format!("{x:.3}");
        format!("{}{suffix}", n.trim_end_matches('0').trim_end_matches('.'))
    }
}

/// A string that is not the MAC address it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("'{0}' is not a MAC address (six hex bytes, e.g. \"02:00:00:00:00:01\")")]
    Syntax(String),
    #[error("'{0}' is a multicast address")]
    Multicast(String),
}

/// A MAC address, written `aa:bb:cc:dd:ee:ff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MacAddress(pub [u8; 6]);

impl MacAddress {
    /// The six bytes.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// Whether it is a group (multicast or broadcast) address.
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 1 != 0
    }
}

impl FromStr for MacAddress {
    type Err = MacError;
    fn from_str(s: &str) -> Result<Self, MacError> {
        let bad = || MacError::Syntax(s.to_string());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for b in out.iter_mut() {
            let p = parts.next().ok_or_else(bad)?;
            if p.len() != 2 || !p.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(bad());
            }
            *b = u8::from_str_radix(p, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(MacAddress(out))
    }
}

impl TryFrom<String> for MacAddress {
    type Error = MacError;
    fn try_from(s: String) -> Result<Self, MacError> {
        s.parse()
    }
}

impl From<MacAddress> for String {
    fn from(m: MacAddress) -> String {
        m.to_string()
    }
}

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// A MAC address that may be a frame's source: not multicast or broadcast.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct UnicastMac(MacAddress);

impl UnicastMac {
    /// The address.
    pub const fn get(self) -> MacAddress {
        self.0
    }
}

impl TryFrom<MacAddress> for UnicastMac {
    type Error = MacError;
    fn try_from(m: MacAddress) -> Result<Self, MacError> {
        if m.is_multicast() {
            return Err(MacError::Multicast(m.to_string()));
        }
        Ok(UnicastMac(m))
    }
}

impl FromStr for UnicastMac {
    type Err = MacError;
    fn from_str(s: &str) -> Result<Self, MacError> {
        let m: MacAddress = s.parse()?;
        if m.is_multicast() {
            return Err(MacError::Multicast(s.to_string()));
        }
        Ok(UnicastMac(m))
    }
}

impl TryFrom<String> for UnicastMac {
    type Error = MacError;
    fn try_from(s: String) -> Result<Self, MacError> {
        s.parse()
    }
}

impl From<UnicastMac> for String {
    fn from(m: UnicastMac) -> String {
        m.0.to_string()
    }
}

impl fmt::Display for UnicastMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Longest Linux interface name.
pub const MAX_IFNAME: usize = 15;

/// A Linux network interface name: 1..=15 bytes, no '/', ':' or white space, not "." or "..".
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IfName(String);

/// A string that is not an interface name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a valid interface name (1..={MAX_IFNAME} characters, no '/', ':' or spaces)")]
pub struct IfNameError(String);

impl IfName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for IfName {
    type Error = IfNameError;
    fn try_from(s: String) -> Result<Self, IfNameError> {
        if s.is_empty()
            || s.len() > MAX_IFNAME
            || s.bytes()
                .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace())
            || s == "."
            || s == ".."
        {
            return Err(IfNameError(s));
        }
        Ok(IfName(s))
    }
}

impl FromStr for IfName {
    type Err = IfNameError;
    fn from_str(s: &str) -> Result<Self, IfNameError> {
        IfName::try_from(s.to_string())
    }
}

impl From<IfName> for String {
    fn from(i: IfName) -> String {
        i.0
    }
}

impl fmt::Display for IfName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Longest Unix socket path (`sun_path` less its terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// A Unix socket path: 1..=107 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "PathBuf", into = "PathBuf")]
pub struct SocketPath(PathBuf);

/// A path that cannot be a Unix socket's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("socket path must be 1..={MAX_SOCKET_PATH} bytes, got {0}")]
pub struct SocketPathError(usize);

impl SocketPath {
    /// The path.
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl TryFrom<PathBuf> for SocketPath {
    type Error = SocketPathError;
    fn try_from(p: PathBuf) -> Result<Self, SocketPathError> {
        let len = p.as_os_str().len();
        if len == 0 || len > MAX_SOCKET_PATH {
            return Err(SocketPathError(len));
        }
        Ok(SocketPath(p))
    }
}

impl TryFrom<&Path> for SocketPath {
    type Error = SocketPathError;
    fn try_from(p: &Path) -> Result<Self, SocketPathError> {
        SocketPath::try_from(p.to_path_buf())
    }
}

impl FromStr for SocketPath {
    type Err = SocketPathError;
    fn from_str(s: &str) -> Result<Self, SocketPathError> {
        SocketPath::try_from(PathBuf::from(s))
    }
}

impl From<SocketPath> for PathBuf {
    fn from(s: SocketPath) -> PathBuf {
        s.0
    }
}

impl AsRef<Path> for SocketPath {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl fmt::Display for SocketPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.display().fmt(f)
    }
}

/// `[switch] http`: an IP address and port (`"127.0.0.1:9470"`, `"[::1]:80"`); no host names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HttpAddr(SocketAddr);

/// A string that is not an IP address and port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("http = \"{0}\": expected an IP address and port, e.g. \"127.0.0.1:9470\"")]
pub struct HttpAddrError(pub String);

impl HttpAddr {
    /// The address.
    pub const fn get(self) -> SocketAddr {
        self.0
    }
}

impl FromStr for HttpAddr {
    type Err = HttpAddrError;
    fn from_str(s: &str) -> Result<Self, HttpAddrError> {
        s.parse()
            .map(HttpAddr)
            .map_err(|_| HttpAddrError(s.to_string()))
    }
}

impl TryFrom<String> for HttpAddr {
    type Error = HttpAddrError;
    fn try_from(s: String) -> Result<Self, HttpAddrError> {
        s.parse()
    }
}

impl From<HttpAddr> for String {
    fn from(a: HttpAddr) -> String {
        a.0.to_string()
    }
}

impl fmt::Display for HttpAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// Longest port name.
pub const MAX_PORT_NAME: usize = 32;

/// A port's name: 1..=32 characters of `[A-Za-z0-9._-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PortName(String);

/// A string that is not a port name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port name '{0}': a name must be 1..={MAX_PORT_NAME} characters of [A-Za-z0-9._-]")]
pub struct PortNameError(pub String);

impl PortName {
    /// A name as it is, for writing out a port built in code; it is checked when read back.
    pub(crate) fn unchecked(s: String) -> PortName {
        PortName(s)
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for PortName {
    type Error = PortNameError;
    fn try_from(s: String) -> Result<Self, PortNameError> {
        if s.is_empty()
            || s.len() > MAX_PORT_NAME
            || !s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            return Err(PortNameError(s));
        }
        Ok(PortName(s))
    }
}

impl FromStr for PortName {
    type Err = PortNameError;
    fn from_str(s: &str) -> Result<Self, PortNameError> {
        PortName::try_from(s.to_string())
    }
}

impl From<PortName> for String {
    fn from(n: PortName) -> String {
        n.0
    }
}

impl fmt::Display for PortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse() {
        let bps = |s: &str| s.parse::<Rate>().map(Rate::bps);
        assert_eq!(bps("200M"), Ok(200_000_000));
        assert_eq!(bps("1.5G"), Ok(1_500_000_000));
        assert_eq!(bps("64k"), Ok(64_000));
        assert_eq!(bps("64K"), Ok(64_000));
        assert_eq!(bps("800000"), Ok(800_000));
        assert_eq!(bps(" 1T "), Ok(1_000_000_000_000));
        assert_eq!(bps("0"), Ok(0));
        for bad in ["", "M", "1.2.3M", "-5M", "1X", "1e9", "10 M", "1Mbit"] {
            assert_eq!(bps(bad), Err(RateError::Syntax(bad.into())), "{bad}");
            assert!(bps(bad).unwrap_err().to_string().contains("is not a rate"));
        }
        assert_eq!(bps("2000T"), Err(RateError::TooLarge("2000T".into())));
        assert!(bps("2000T").unwrap_err().to_string().contains("largest"));
    }

    #[test]
    fn rates_display_exactly_and_round_trip() {
        for (bps, s) in [
            (150_000_000, "150M"),
            (1_500_000_000, "1.5G"),
            (1_234_567, "1234.567k"),
            (1_234_567_000, "1234.567M"),
            (999, "999"),
            (0, "0"),
            (1_000_000_000_000_000, "1000T"),
            (12_345_678, "12345.678k"),
            (1_500, "1.5k"),
        ] {
            let r = Rate::from_bps(bps);
            assert_eq!(r.to_string(), s, "{bps}");
            assert_eq!(s.parse::<Rate>(), Ok(r), "{s}");
        }
        for bps in (0..2000u64).map(|i| i * i * i * 7919 + i) {
            let r = Rate::from_bps(bps);
            assert_eq!(r.to_string().parse::<Rate>(), Ok(r), "{bps}");
        }
        assert_eq!(format_rate(150_000_000), "150M");
        assert_eq!(format_rate(1_500_000_000), "1.5G");
        assert_eq!(format_rate(900_000_000), "900M");
        assert_eq!(format_rate(1_234_567), "1.235M");
        assert_eq!(format_rate(999), "999");
    }

    #[test]
    fn macs() {
        let m: MacAddress = "02:00:00:00:00:ff".parse().unwrap();
        assert_eq!(m.octets(), [2, 0, 0, 0, 0, 0xff]);
        assert_eq!(m.to_string(), "02:00:00:00:00:ff");
        assert_eq!(
            "0A:0b:0C:0d:0E:0f"
                .parse::<MacAddress>()
                .unwrap()
                .to_string(),
            "0a:0b:0c:0d:0e:0f"
        );
        for bad in [
            "02:00:00:00:00",
            "02:00:00:00:00:00:00",
            "2:00:00:00:00:00",
            "zz:00:00:00:00:00",
            "+1:00:00:00:00:00",
            "",
        ] {
            assert_eq!(
                bad.parse::<MacAddress>(),
                Err(MacError::Syntax(bad.into())),
                "{bad}"
            );
        }
        assert!("ff:ff:ff:ff:ff:ff"
            .parse::<MacAddress>()
            .unwrap()
            .is_multicast());
        assert_eq!(
            "01:00:5e:00:00:01".parse::<UnicastMac>(),
            Err(MacError::Multicast("01:00:5e:00:00:01".into()))
        );
        assert_eq!(
            "02:00:00:00:00:01".parse::<UnicastMac>().unwrap().get(),
            MacAddress([2, 0, 0, 0, 0, 1])
        );
    }

    #[test]
    fn bounded_numbers() {
        assert_eq!(VlanId::try_from(10).map(VlanId::get), Ok(10));
        for bad in [0, 4095] {
            let e = VlanId::try_from(bad).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("vlan = {bad} is out of range 1..=4094")
            );
        }
        assert_eq!("4094".parse::<VlanId>().map(VlanId::get), Ok(4094));
        assert!(matches!(
            "70000".parse::<VlanId>(),
            Err(RangeError::OutOfRange { value: 70000, .. })
        ));
        assert!(matches!(
            "ten".parse::<VlanId>(),
            Err(RangeError::NotANumber { .. })
        ));
        assert!("-1".parse::<VlanId>().is_err());
        assert_eq!(
            Weight::try_from(0).unwrap_err().to_string(),
            "weight = 0 is out of range 1..=1000"
        );
        assert_eq!(PollSpinUs::try_from(0).map(PollSpinUs::get), Ok(0));
        assert!(PollSpinUs::try_from(10_001).is_err());
        assert!(FdbAging::try_from(0).is_err());
    }

    #[test]
    fn reservable() {
        assert_eq!(Reservable::try_from(1.0).map(Reservable::get), Ok(1.0));
        assert_eq!(Reservable::default().get(), 0.9);
        for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(Reservable::try_from(bad)
                .unwrap_err()
                .to_string()
                .contains("is out of range (0, 1]"));
        }
    }

    #[test]
    fn names_and_paths() {
        assert_eq!(
            IfName::try_from("qs-a".to_string()).unwrap().as_str(),
            "qs-a"
        );
        for bad in ["", "this-name-is-too-long", "a/b", "a:b", "a b", ".", ".."] {
            let e = bad.parse::<IfName>().unwrap_err();
            assert!(e.to_string().contains("not a valid interface name"), "{e}");
        }
        assert!("vm1.sock".parse::<SocketPath>().is_ok());
        assert_eq!("".parse::<SocketPath>(), Err(SocketPathError(0)));
        assert_eq!(
            "x".repeat(108).parse::<SocketPath>(),
            Err(SocketPathError(108))
        );
        assert!("a-b_c.1".parse::<PortName>().is_ok());
        for bad in ["", "bad name!", &"x".repeat(33)] {
            let e = bad.parse::<PortName>().unwrap_err();
            assert!(e.to_string().contains("name must be"), "{e}");
        }
        assert_eq!(
            "[::1]:80".parse::<HttpAddr>().unwrap().get(),
            "[::1]:80".parse::<SocketAddr>().unwrap()
        );
        for bad in ["localhost:9470", "127.0.0.1", "127.0.0.1:99999", ""] {
            assert_eq!(bad.parse::<HttpAddr>(), Err(HttpAddrError(bad.into())));
        }
    }
}
