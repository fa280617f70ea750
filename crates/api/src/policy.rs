//! Per-port policy keys: the VLANs a trunk carries (`vlans`), port security (`security`),
//! storm control (`storm`) and link-local frames (`link_local_forward`, `bpdu_guard`). Each
//! value parses from its config form (`FromStr`, serde from a string) and prints back to a
//! form that parses to the same value.
//!
//! ```toml
//! vlans = "10,20,100-200"          # carried tagged (802.1Q); `vlan` stays the native VLAN
//! security = { macs = ["52:54:00:12:34:56"], ips = ["10.0.0.5", "fe80::/64"], mac_limit = 4, dhcp_guard = true, ra_guard = true }
//! storm = { broadcast = 1000, multicast = 5000, unknown_unicast = 1000 }   # frames/s
//! link_local_forward = "stp,lldp"  # 01:80:C2:00:00:0X groups relayed from the port (default none)
//! bpdu_guard = true                # a BPDU from the port disables it until `port enable`
//! ```

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::value::UnicastMac;

/// A policy value that does not parse; the message says what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyValueError(String);

/// A set of VLAN IDs (1..=4094), written `"10,20,100-200"`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VlanSet(Box<[u64; 64]>);

impl Default for VlanSet {
    fn default() -> Self {
        VlanSet(Box::new([0; 64]))
    }
}

impl VlanSet {
    /// Whether `vid` is in the set.
    #[inline]
    pub fn contains(&self, vid: u16) -> bool {
        let v = usize::from(vid & 0xfff);
        self.0[v / 64] & (1 << (v % 64)) != 0
    }

    /// Adds `vid` (1..=4094; others are ignored).
    pub fn insert(&mut self, vid: u16) {
        if (1..=4094).contains(&vid) {
            let v = usize::from(vid);
            self.0[v / 64] |= 1 << (v % 64);
        }
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|&w| w == 0)
    }

    /// The VIDs, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u16> + '_ {
        (1..=4094u16).filter(|&v| self.contains(v))
    }
}

/// The VLANs a port carries: its native (untagged) VLAN, if it has one (an access port
/// without `vlan` is in VLAN 0, the untagged domain; a trunk without `vlan` has none), and
/// those it carries tagged. Two ports that carry a VLAN in common can exchange frames: an
/// uplink serves (QoS) every port it has a VLAN in common with.
#[derive(Debug, Clone, Copy)]
pub struct Carried<'a> {
    pub native: Option<u16>,
    pub tagged: Option<&'a VlanSet>,
}

impl<'a> Carried<'a> {
    /// What a port with access VLAN `vlan` and trunk VLANs `tagged` carries: an empty
    /// `tagged` makes no trunk; without `vlan`, an access port is in VLAN 0 and a trunk has
    /// no native VLAN. The one rule for the configuration and the switch's compiled policy.
    pub fn of(vlan: Option<u16>, tagged: Option<&'a VlanSet>) -> Carried<'a> {
        let tagged = tagged.filter(|t| !t.is_empty());
        Carried {
            native: match vlan {
                Some(v) => Some(v),
                None if tagged.is_some() => None,
                None => Some(0),
            },
            tagged,
        }
    }

    /// Whether VLAN `v` is carried, untagged or tagged.
    pub fn carries(&self, v: u16) -> bool {
        self.native == Some(v) || self.tagged.is_some_and(|t| t.contains(v))
    }

    /// A VLAN both carry (the native one checked first), if any.
    pub fn common(&self, other: &Carried<'_>) -> Option<u16> {
        if let Some(v) = self.native.filter(|&v| other.carries(v)) {
            return Some(v);
        }
        let mine = self.tagged?;
        if let Some(v) = other.native.filter(|&v| mine.contains(v)) {
            return Some(v);
        }
        let theirs = other.tagged?;
        mine.0
            .iter()
            .zip(theirs.0.iter())
            .enumerate()
            .find_map(|(i, (a, b))| {
                let both = a & b;
                (both != 0).then(|| (i * 64) as u16 + both.trailing_zeros() as u16)
            })
    }
}

impl FromIterator<u16> for VlanSet {
    fn from_iter<I: IntoIterator<Item = u16>>(iter: I) -> Self {
        let mut s = VlanSet::default();
        for v in iter {
            s.insert(v);
        }
        s
    }
}

impl FromStr for VlanSet {
    type Err = PolicyValueError;
    /// `"10,20,100-200"`; the empty string is the empty set.
    fn from_str(s: &str) -> Result<Self, PolicyValueError> {
        let mut set = VlanSet::default();
        let vid = |t: &str| -> Result<u16, PolicyValueError> {
            let v: u16 = t
                .trim()
                .parse()
                .map_err(|_| PolicyValueError(format!("'{}' is not a VLAN ID", t.trim())))?;
            if (1..=4094).contains(&v) {
                Ok(v)
            } else {
                Err(PolicyValueError(format!(
                    "VLAN ID {v} is out of range 1..=4094"
                )))
            }
        };
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (vid(a)?, vid(b)?);
                    if a > b {
                        return Err(PolicyValueError(format!("VLAN range {a}-{b} is empty")));
                    }
                    (a..=b).for_each(|v| set.insert(v));
                }
                None => set.insert(vid(part)?),
            }
        }
        Ok(set)
    }
}

impl fmt::Display for VlanSet {
    /// Ranges folded: `10,20,100-200`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.iter().peekable();
        while let Some(a) = it.next() {
            let mut b = a;
            while it.peek() == Some(&(b + 1)) {
                b = it.next().unwrap_or(b);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for VlanSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VlanSet({self})")
    }
}

/// An IPv4 or IPv6 prefix: `10.0.0.5` (a host) or `10.0.0.0/24`, `2001:db8::/64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IpPrefix {
    pub addr: IpAddr,
    pub len: u8,
}

impl IpPrefix {
    /// Whether `ip` is in the prefix (never across address families).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(p), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.len)).unwrap_or(0);
                u32::from(p) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(p), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.len))
                    .unwrap_or(0);
                u128::from(p) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl FromStr for IpPrefix {
    type Err = PolicyValueError;
    fn from_str(s: &str) -> Result<Self, PolicyValueError> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| PolicyValueError(format!("'{a}' is not an IP address or prefix")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&l| l <= max)
                .ok_or_else(|| {
                    PolicyValueError(format!("'{s}': /{l} is not a prefix length (0..={max})"))
                })?,
        };
        Ok(IpPrefix { addr, len })
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl TryFrom<String> for VlanSet {
    type Error = PolicyValueError;
    fn try_from(s: String) -> Result<Self, PolicyValueError> {
        s.parse()
    }
}

impl From<VlanSet> for String {
    fn from(v: VlanSet) -> String {
        v.to_string()
    }
}

impl TryFrom<String> for IpPrefix {
    type Error = PolicyValueError;
    fn try_from(s: String) -> Result<Self, PolicyValueError> {
        s.parse()
    }
}

impl From<IpPrefix> for String {
    fn from(p: IpPrefix) -> String {
        p.to_string()
    }
}

/// `security = { macs = [...], ips = [...], mac_limit = N, dhcp_guard = bool, ra_guard = bool }`
/// of a port. Every key is optional; an empty list checks nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityConfig {
    /// Source MACs the port may send from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<UnicastMac>,
    /// Source addresses (IPv4/IPv6, hosts or prefixes) the port may send from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpPrefix>,
    /// Most MAC addresses the port may have in the MAC table (default 4096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac_limit: Option<u32>,
    /// Drop DHCP server messages from the port.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dhcp_guard: bool,
    /// Drop IPv6 router advertisements and redirects from the port.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ra_guard: bool,
}

/// `storm = { broadcast = PPS, multicast = PPS, unknown_unicast = PPS }` of a port: most
/// frames per second of each class the port may send; absent: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StormConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broadcast: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multicast: Option<u64>,
    /// Unicast frames to an unknown destination (flooded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown_unicast: Option<u64>,
}

/// IEEE 802.1D link-local groups relayed from a port (`link_local_forward`, as Linux's
/// bridge `group_fwd_mask`): a set of the last nibbles of 01:80:C2:00:00:00–0F, written
/// `"stp,lldp"` or `"0,14"`. A switch never relays the others. PAUSE (…:01) and the slow
/// protocols (…:02: LACP, marker) can never be relayed, so the set refuses them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct LinkLocalGroups(u16);

impl LinkLocalGroups {
    /// The groups no port may relay: PAUSE (…:01) and slow protocols (…:02).
    pub const NEVER: u16 = (1 << 1) | (1 << 2);
    /// Names for the groups that have a well-known protocol.
    const NAMES: [(&'static str, u8); 3] = [("stp", 0x0), ("eapol", 0x3), ("lldp", 0xe)];

    /// The set as a mask: bit *n* is group 01:80:C2:00:00:0*n*.
    #[inline]
    pub fn mask(self) -> u16 {
        self.0
    }

    /// Whether group `n` (0..=15) is in the set.
    #[inline]
    pub fn contains(self, n: u8) -> bool {
        n < 16 && self.0 & (1 << n) != 0
    }

    /// Whether the set is empty (the default: nothing relayed).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl FromStr for LinkLocalGroups {
    type Err = PolicyValueError;
    fn from_str(s: &str) -> Result<Self, PolicyValueError> {
        let mut mask = 0u16;
        if s.trim() == "none" {
            return Ok(LinkLocalGroups(0));
        }
        for item in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let named = Self::NAMES.iter().find(|(name, _)| *name == item);
            let n = match named {
                Some((_, n)) => *n,
                None => {
                    let parsed = match item.strip_prefix("0x") {
                        Some(hex) => u8::from_str_radix(hex, 16),
                        None => item.parse(),
                    };
                    match parsed {
                        Ok(n) if n < 16 => n,
                        _ => {
                            return Err(PolicyValueError(format!(
                                "'{item}' is not a link-local group (0..15 for \
                                 01:80:c2:00:00:00-0f, or stp, eapol, lldp)"
                            )))
                        }
                    }
                }
            };
            if Self::NEVER & (1 << n) != 0 {
                let what = if n == 1 {
                    "PAUSE"
                } else {
                    "slow protocols (LACP)"
                };
                return Err(PolicyValueError(format!(
                    "link-local group {n} (01:80:c2:00:00:0{n:x}, {what}) is never relayed"
                )));
            }
            mask |= 1 << n;
        }
        Ok(LinkLocalGroups(mask))
    }
}

impl fmt::Display for LinkLocalGroups {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for n in (0..16u8).filter(|&n| self.contains(n)) {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            match Self::NAMES.iter().find(|(_, g)| *g == n) {
                Some((name, _)) => f.write_str(name)?,
                None => write!(f, "{n}")?,
            }
        }
        Ok(())
    }
}

impl TryFrom<String> for LinkLocalGroups {
    type Error = PolicyValueError;
    fn try_from(s: String) -> Result<Self, PolicyValueError> {
        s.parse()
    }
}

impl From<LinkLocalGroups> for String {
    fn from(g: LinkLocalGroups) -> String {
        g.to_string()
    }
}

/// A live change to a port's policy (`qswitch port set`): fields left out keep their value.
/// An empty `vlans`, `macs` or `ips` clears the setting; `Some(None)` clears a limit
/// (serialized as `null`, distinct from leaving the field out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlans: Option<VlanSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macs: Option<Vec<UnicastMac>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ips: Option<Vec<IpPrefix>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "clearable")]
    pub mac_limit: Option<Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp_guard: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ra_guard: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "clearable")]
    pub storm_broadcast: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "clearable")]
    pub storm_multicast: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none", with = "clearable")]
    pub storm_unknown_unicast: Option<Option<u64>>,
    /// Link-local groups relayed from the port (empty: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_local_forward: Option<LinkLocalGroups>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bpdu_guard: Option<bool>,
    /// The port's security groups (empty: none, the port is not filtered). Each must exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_groups: Option<Vec<String>>,
}

impl PolicyUpdate {
    /// Whether the update changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == PolicyUpdate::default()
    }
}

/// `Option<Option<T>>` fields: absent = keep, `null` = clear, a value = set.
mod clearable {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer, T: Serialize>(
        v: &Option<Option<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(inner) => inner.serialize(s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

/// A command-line value that may be `none` (clear the setting): `none` → `Ok(None)`.
pub fn parse_or_none<T: FromStr>(s: &str) -> Result<Option<T>, T::Err> {
    if s.trim() == "none" {
        Ok(None)
    } else {
        s.parse().map(Some)
    }
}

/// A comma-separated list (`a,b,c`; `none` or empty: the empty list), each item parsed
/// as in the config file.
pub fn parse_list<T: FromStr>(s: &str) -> Result<Vec<T>, T::Err> {
    if s.trim() == "none" {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::parse)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carried_vlans_meet_natively_or_tagged() {
        let t = |s: &str| s.parse::<VlanSet>().unwrap();
        let (a, b, c) = (t("10,20"), t("300-400"), t("20,4000"));
        let c_ = |native, tagged| Carried { native, tagged };
        assert_eq!(c_(Some(0), None).common(&c_(Some(0), None)), Some(0));
        assert_eq!(c_(Some(5), None).common(&c_(Some(0), None)), None);
        assert_eq!(c_(Some(5), Some(&a)).common(&c_(Some(10), None)), Some(10));
        assert_eq!(c_(Some(10), None).common(&c_(Some(5), Some(&a))), Some(10));
        assert_eq!(c_(None, Some(&a)).common(&c_(None, Some(&c))), Some(20));
        assert_eq!(c_(None, Some(&a)).common(&c_(None, Some(&b))), None);
        assert_eq!(c_(None, Some(&b)).common(&c_(Some(350), None)), Some(350));
        assert_eq!(
            c_(None, Some(&t("4000"))).common(&c_(None, Some(&c))),
            Some(4000)
        );
    }

    #[test]
    fn vlan_sets_parse_and_print() {
        let s: VlanSet = "10, 20,100-200".parse().unwrap();
        assert!(s.contains(10) && s.contains(150) && !s.contains(11) && !s.contains(201));
        assert_eq!(s.to_string(), "10,20,100-200");
        assert!("".parse::<VlanSet>().unwrap().is_empty());
        assert!("0".parse::<VlanSet>().is_err());
        assert!("4095".parse::<VlanSet>().is_err());
        assert!("20-10".parse::<VlanSet>().is_err());
        assert!("x".parse::<VlanSet>().is_err());
    }

    #[test]
    fn prefixes() {
        let p: IpPrefix = "10.0.0.0/24".parse().unwrap();
        assert!(p.contains("10.0.0.7".parse().unwrap()));
        assert!(!p.contains("10.0.1.7".parse().unwrap()));
        assert!(!p.contains("::1".parse().unwrap()));
        let h: IpPrefix = "2001:db8::5".parse().unwrap();
        assert_eq!(h.len, 128);
        assert!(h.contains("2001:db8::5".parse().unwrap()));
        let all: IpPrefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("1.2.3.4".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<IpPrefix>().is_err());
    }

    #[test]
    fn values_print_back_to_themselves() {
        for s in ["10", "1-4094", "10,20,100-200", ""] {
            let v: VlanSet = s.parse().unwrap();
            assert_eq!(v.to_string().parse::<VlanSet>().unwrap(), v);
        }
        for s in ["10.0.0.0/24", "2001:db8::/64", "10.0.0.1"] {
            let p: IpPrefix = s.parse().unwrap();
            assert_eq!(p.to_string().parse::<IpPrefix>().unwrap(), p);
        }
    }

    #[test]
    fn updates_keep_clear_and_set() {
        let u = PolicyUpdate {
            mac_limit: Some(None),
            storm_broadcast: Some(Some(0)),
            vlans: Some("10-12".parse().unwrap()),
            ..PolicyUpdate::default()
        };
        let j = serde_json::to_string(&u).unwrap();
        assert_eq!(
            j,
            r#"{"vlans":"10-12","mac_limit":null,"storm_broadcast":0}"#
        );
        assert_eq!(serde_json::from_str::<PolicyUpdate>(&j).unwrap(), u);
        assert!(serde_json::from_str::<PolicyUpdate>("{}")
            .unwrap()
            .is_empty());
        assert_eq!(parse_or_none::<u64>("none"), Ok(None));
        assert_eq!(parse_list::<IpPrefix>("none").unwrap(), vec![]);
        assert!(parse_list::<IpPrefix>("10.0.0.1,x").is_err());
    }

    #[test]
    fn link_local_groups_parse_print_and_refuse_pause_and_lacp() {
        let g: LinkLocalGroups = "lldp, 0,0x3,5".parse().unwrap();
        assert_eq!(g.mask(), (1 << 0) | (1 << 3) | (1 << 5) | (1 << 14));
        assert_eq!(g.to_string(), "stp,eapol,5,lldp");
        assert_eq!(g.to_string().parse::<LinkLocalGroups>(), Ok(g));
        assert!("none".parse::<LinkLocalGroups>().unwrap().is_empty());
        assert!("".parse::<LinkLocalGroups>().unwrap().is_empty());
        assert_eq!(
            "stp,1".parse::<LinkLocalGroups>().unwrap_err().to_string(),
            "link-local group 1 (01:80:c2:00:00:01, PAUSE) is never relayed"
        );
        assert!("2".parse::<LinkLocalGroups>().is_err());
        assert!("16".parse::<LinkLocalGroups>().is_err());
        assert!("ptp".parse::<LinkLocalGroups>().is_err());
    }
}
