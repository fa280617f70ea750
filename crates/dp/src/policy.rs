//! Per-port policy: VLAN trunks, port security and storm control.
//!
//! [`PortPolicy`] is what an operator sets (config or live, [`crate::Switch::set_port_policy`]);
//! [`Policy`] is its compiled form in the port's table entry, with the storm-control token
//! buckets and the flags the engine checks once per burst. A port with the default policy
//! (an access port, no security, no storm limits) costs the engine nothing per frame.
//! The VLAN rules are in [`crate::engine`].
//!
//! Order per frame: VLAN admission, port security (before learning, so a refused frame
//! teaches the fdb nothing: a spoofed source cannot take another port's address), learning,
//! lookup, then storm control on what would be flooded (broadcast, multicast, unicast to an
//! unknown address). Storm buckets count frames, refill on the switch clock `now` and hold a
//! tenth of a second's worth (at least one rx burst); they are shared by the port's rx queues.
//!
//! | setting | effect on frames received from the port |
//! |---|---|
//! | `vlans` | tagged frames with these VIDs are switched in that VLAN; other tagged frames are dropped (`vlan_not_allowed`) |
//! | `security.macs` | frames (and ARP senders, ND link-layer options) from other MACs are dropped (`src_mac_not_allowed`) |
//! | `security.ips` | IPv4/IPv6 sources, ARP sender IPs, ND advertised/DAD targets outside the prefixes are dropped (`src_ip_not_allowed`); `0.0.0.0` and `::` are allowed (DHCP, DAD); list `fe80::/64` too for IPv6 link-local (a port with only IPv4 prefixes sends no IPv6) |
//! | `security.mac_limit` | most MACs the port may have in the fdb ([`crate::fdb::Fdb::set_port_limit`]) |
//! | `security.dhcp_guard` | DHCPv4/DHCPv6 server messages are dropped (`dhcp_guard`) |
//! | `security.ra_guard` | IPv6 router advertisements and redirects are dropped, and so is IPv6 whose header chain cannot be read (`ra_guard`, RFC 7113) |
//! | `storm.*` | broadcast, multicast and flooded unknown-unicast frames beyond so many per second are dropped (`storm_*`) |

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use qswitch_wire::MacAddr;

use crate::packet::BURST;
use crate::qos::token_bucket::TokenBucket;

/// The port-security facts of a frame. Stand-in for `qswitch_wire::guard` until that lands
/// on main: the same names, a subset of its reach (no IPv6 extension headers).
pub(crate) mod guard;

/// A set of VLAN IDs (1..=4094), written `"10,20,100-200"`.
#[derive(Clone, PartialEq, Eq)]
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
    type Err = String;
    /// `"10,20,100-200"`; the empty string is the empty set.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut set = VlanSet::default();
        let vid = |t: &str| -> Result<u16, String> {
            let v: u16 = t
                .trim()
                .parse()
                .map_err(|_| format!("'{}' is not a VLAN ID", t.trim()))?;
            if (1..=4094).contains(&v) {
                Ok(v)
            } else {
                Err(format!("VLAN ID {v} is out of range 1..=4094"))
            }
        };
        for part in s.split(',').filter(|p| !p.trim().is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (vid(a)?, vid(b)?);
                    if a > b {
                        return Err(format!("VLAN range {a}-{b} is empty"));
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (a, l) = match s.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (s, None),
        };
        let addr: IpAddr = a
            .trim()
            .parse()
            .map_err(|_| format!("'{a}' is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let len = match l {
            None => max,
            Some(l) => l
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&l| l <= max)
                .ok_or_else(|| format!("'/{l}' is not a prefix length (0..={max})"))?,
        };
        Ok(IpPrefix { addr, len })
    }
}

impl fmt::Display for IpPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Port security settings (Hyper-V's MAC spoofing, DHCP and router guards; OVN's
/// `port_security`). The default checks nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    /// Allowed source MACs; empty: any.
    pub macs: Vec<MacAddr>,
    /// Allowed source addresses; empty: any.
    pub ips: Vec<IpPrefix>,
    /// Most MAC addresses the port may have in the fdb; `None`: the fdb's default.
    pub mac_limit: Option<u32>,
    /// Drop DHCPv4/DHCPv6 server messages from the port.
    pub dhcp_guard: bool,
    /// Drop IPv6 router advertisements and redirects from the port.
    pub ra_guard: bool,
}

impl Security {
    /// Whether any per-frame check is on (`mac_limit` is the fdb's, not per frame).
    pub fn checks_frames(&self) -> bool {
        !self.macs.is_empty() || !self.ips.is_empty() || self.dhcp_guard || self.ra_guard
    }
}

/// Storm control: most frames per second of each class received from the port.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Storm {
    pub broadcast: Option<u64>,
    pub multicast: Option<u64>,
    /// Unicast frames to an unknown destination (flooded).
    pub unknown_unicast: Option<u64>,
}

impl Storm {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.broadcast.is_some() || self.multicast.is_some() || self.unknown_unicast.is_some()
    }
}

/// A port's policy as set by the operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortPolicy {
    /// VLANs the port carries tagged (a trunk when not empty). Its `vlan` stays the access
    /// (native, untagged) VLAN; a trunk without `vlan` has no native VLAN.
    pub vlans: VlanSet,
    pub security: Security,
    pub storm: Storm,
}

/// Storm-control frame classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StormClass {
    Broadcast = 0,
    Multicast = 1,
    UnknownUnicast = 2,
}

/// How a frame of some VLAN leaves a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Egress {
    /// The VLAN is not on the port.
    No,
    /// The port's native VLAN: untagged.
    Untagged,
    /// Carried tagged.
    Tagged,
}

/// A port's compiled policy, in its table entry.
#[derive(Debug)]
pub struct Policy {
    pub settings: PortPolicy,
    /// The untagged VLAN (`None`: a trunk without a native VLAN drops untagged frames).
    pub(crate) native: Option<u16>,
    pub(crate) trunk: bool,
    pub(crate) secure: bool,
    pub(crate) storm: bool,
    buckets: [TokenBucket; 3],
}

impl Policy {
    /// The policy of a port whose access VLAN is `vlan` (0: none), at time `now`.
    pub fn new(vlan: Option<u16>, settings: PortPolicy, now: u64) -> Policy {
        let trunk = !settings.vlans.is_empty();
        let native = match vlan {
            Some(v) => Some(v),
            None if trunk => None,
            None => Some(0),
        };
        let depth = |r: Option<u64>| storm_depth(r.unwrap_or(0));
        let s = settings.storm;
        Policy {
            native,
            trunk,
            secure: settings.security.checks_frames(),
            storm: s.any(),
            buckets: [
                TokenBucket::new(depth(s.broadcast), now),
                TokenBucket::new(depth(s.multicast), now),
                TokenBucket::new(depth(s.unknown_unicast), now),
            ],
            settings,
        }
    }

    /// Whether the engine has anything to do per frame for frames from this port.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.trunk || self.secure || self.storm || self.native.is_none()
    }

    /// How a frame of `vlan` leaves this port.
    #[inline]
    pub(crate) fn egress(&self, vlan: u16) -> Egress {
        if self.native == Some(vlan) {
            Egress::Untagged
        } else if self.trunk && self.settings.vlans.contains(vlan) {
            Egress::Tagged
        } else {
            Egress::No
        }
    }

    /// Whether one more frame of `class` is within its storm limit at `now` (takes a token).
    #[inline]
    pub(crate) fn storm_admit(&self, class: StormClass, now: u64) -> bool {
        let s = &self.settings.storm;
        let rate = match class {
            StormClass::Broadcast => s.broadcast,
            StormClass::Multicast => s.multicast,
            StormClass::UnknownUnicast => s.unknown_unicast,
        };
        match rate {
            None => true,
            // Tokens are frames: the bucket's "bytes" per second are frames per second.
            Some(pps) => self.buckets[class as usize].conform(
                1,
                now,
                pps.saturating_mul(8),
                storm_depth(pps),
            ),
        }
    }
}

/// Burst allowance of a storm limit: a tenth of a second's worth, at least one rx burst.
fn storm_depth(pps: u64) -> u64 {
    (pps / 10).max(BURST as u64)
}

/// Why port security refuses a frame, if it does.
pub(crate) fn security_verdict(sec: &Security, frame: &[u8]) -> Option<crate::stats::DropReason> {
    use crate::stats::DropReason;
    use guard::Kind;
    let facts = guard::inspect(frame);
    let mac_ok = |m: MacAddr| sec.macs.is_empty() || sec.macs.contains(&m);
    let ip_ok = |ip: IpAddr| {
        sec.ips.is_empty() || ip.is_unspecified() || sec.ips.iter().any(|p| p.contains(ip))
    };
    if !facts.src_mac.is_some_and(mac_ok) {
        return Some(DropReason::SrcMacNotAllowed);
    }
    if sec.dhcp_guard && facts.is_dhcp_server() {
        return Some(DropReason::DhcpGuard);
    }
    let ipv6 = matches!(facts.ip_src, Some(IpAddr::V6(_)));
    if sec.ra_guard && (facts.is_router_message() || (ipv6 && facts.incomplete)) {
        return Some(DropReason::RaGuard);
    }
    if let Some(arp) = facts.arp {
        if !mac_ok(arp.sender_mac) {
            return Some(DropReason::SrcMacNotAllowed);
        }
        if !ip_ok(IpAddr::V4(arp.sender_ip)) {
            return Some(DropReason::SrcIpNotAllowed);
        }
    }
    if let Some(ip) = facts.ip_src {
        if !ip_ok(ip) {
            return Some(DropReason::SrcIpNotAllowed);
        }
    }
    match facts.kind {
        Kind::NeighborAdvertisement(nd) => {
            if nd.link_layer.is_some_and(|m| !mac_ok(m)) {
                return Some(DropReason::SrcMacNotAllowed);
            }
            if !ip_ok(IpAddr::V6(nd.target)) {
                return Some(DropReason::SrcIpNotAllowed);
            }
        }
        Kind::NeighborSolicitation(nd) => {
            if nd.link_layer.is_some_and(|m| !mac_ok(m)) {
                return Some(DropReason::SrcMacNotAllowed);
            }
            // Duplicate address detection claims the target.
            if facts.ip_src.is_some_and(|s| s.is_unspecified()) && !ip_ok(IpAddr::V6(nd.target)) {
                return Some(DropReason::SrcIpNotAllowed);
            }
        }
        _ => {}
    }
    if !sec.ips.is_empty() && facts.incomplete && facts.ip_src.is_none() {
        // ARP or IP whose addresses could not be read: fail closed.
        return Some(DropReason::SrcIpNotAllowed);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn storm_bucket_counts_frames() {
        let mut pol = PortPolicy::default();
        pol.storm.broadcast = Some(1000);
        let p = Policy::new(None, pol, 0);
        let admitted = (0..100)
            .filter(|_| p.storm_admit(StormClass::Broadcast, 0))
            .count();
        assert_eq!(admitted, 100, "depth is max(pps/10, burst) = 100");
        assert!(!p.storm_admit(StormClass::Broadcast, 0));
        // 1000/s: one more token per millisecond.
        assert!(p.storm_admit(StormClass::Broadcast, 1_000_000));
        assert!(!p.storm_admit(StormClass::Broadcast, 1_000_000));
        assert!(p.storm_admit(StormClass::Multicast, 0), "no limit");
    }
}
