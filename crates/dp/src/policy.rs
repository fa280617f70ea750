//! Per-port policy: VLAN trunks, port security, storm control and link-local frames
//! ([`crate::link_local`]).
//!
//! [`PortPolicy`] is what an operator sets (config or live, [`crate::Switch::set_port_policy`]);
//! [`Policy`] is its compiled form in the port's table entry, with the storm-control token
//! buckets and the flags the engine checks once per burst. A port with the default policy
//! (an access port, no security, no storm limits) costs the engine nothing per frame.
//! The VLAN rules are in [`crate::engine`]; the stages that apply these settings are in
//! [`crate::pipeline`].
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
//! | `link_local_forward` | frames to these 01:80:C2:00:00:0X groups are relayed; others are dropped (`bpdu`, `pause`, `slow_protocols`, `eapol`, `lldp`, `link_local`) whatever the setting |
//! | `bpdu_guard` | a BPDU disables the port (`bpdu_guard`, then `port_disabled`) until `qswitch port enable` |

use std::net::IpAddr;

pub use qswitch_api::policy::{IpPrefix, VlanSet};
use qswitch_wire::MacAddr;

use qswitch_wire::guard;

use crate::packet::BURST;
use crate::qos::token_bucket::TokenBucket;
use crate::stats::DropReason;

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
    /// Link-local groups relayed from the port, BPDU guard ([`crate::link_local`]).
    pub link_local: crate::link_local::LinkLocal,
    /// The port's security groups (`security_groups`): compiled into the firewall's rules
    /// (`Switch::compile_firewall`); a veth port with groups leaves the kernel fast path.
    pub security_groups: Vec<String>,
}

impl PortPolicy {
    /// The policy a port's config asks for (`vlans`, `security`, `storm`).
    pub fn from_config(config: &qswitch_api::PortConfig) -> PortPolicy {
        let security = config
            .security
            .as_ref()
            .map(|s| Security {
                macs: s.macs.iter().map(|m| MacAddr(m.get().0)).collect(),
                ips: s.ips.clone(),
                mac_limit: s.mac_limit,
                dhcp_guard: s.dhcp_guard,
                ra_guard: s.ra_guard,
            })
            .unwrap_or_default();
        let storm = config
            .storm
            .as_deref()
            .map(|s| Storm {
                broadcast: s.broadcast,
                multicast: s.multicast,
                unknown_unicast: s.unknown_unicast,
            })
            .unwrap_or_default();
        PortPolicy {
            vlans: config.vlans.clone().unwrap_or_default(),
            security,
            storm,
            link_local: crate::link_local::LinkLocal {
                forward: config.link_local_forward.unwrap_or_default(),
                bpdu_guard: config.bpdu_guard,
            },
            security_groups: config.security_groups.clone(),
        }
    }
}

impl PortPolicy {
    /// Applies a live change ([`qswitch_api::policy::PolicyUpdate`]): what it leaves out
    /// keeps its value.
    pub fn update(&mut self, u: &qswitch_api::policy::PolicyUpdate) {
        if let Some(v) = &u.vlans {
            self.vlans = v.clone();
        }
        if let Some(m) = &u.macs {
            self.security.macs = m.iter().map(|m| MacAddr(m.get().0)).collect();
        }
        if let Some(i) = &u.ips {
            self.security.ips = i.clone();
        }
        if let Some(l) = u.mac_limit {
            self.security.mac_limit = l;
        }
        if let Some(g) = u.dhcp_guard {
            self.security.dhcp_guard = g;
        }
        if let Some(g) = u.ra_guard {
            self.security.ra_guard = g;
        }
        if let Some(b) = u.storm_broadcast {
            self.storm.broadcast = b;
        }
        if let Some(m) = u.storm_multicast {
            self.storm.multicast = m;
        }
        if let Some(x) = u.storm_unknown_unicast {
            self.storm.unknown_unicast = x;
        }
        if let Some(g) = u.link_local_forward {
            self.link_local.forward = g;
        }
        if let Some(g) = u.bpdu_guard {
            self.link_local.bpdu_guard = g;
        }
        if let Some(g) = &u.security_groups {
            self.security_groups = g.clone();
        }
    }

    /// The config keys for this policy (`vlans`, `security`, `storm`; `None` when unset),
    /// the inverse of [`PortPolicy::from_config`].
    pub fn to_config(
        &self,
    ) -> (
        Option<VlanSet>,
        Option<qswitch_api::policy::SecurityConfig>,
        Option<qswitch_api::policy::StormConfig>,
    ) {
        let vlans = (!self.vlans.is_empty()).then(|| self.vlans.clone());
        let s = &self.security;
        let security = (*s != Security::default()).then(|| qswitch_api::policy::SecurityConfig {
            macs: s
                .macs
                .iter()
                .filter_map(|m| {
                    qswitch_api::UnicastMac::try_from(qswitch_api::MacAddress(m.0)).ok()
                })
                .collect(),
            ips: s.ips.clone(),
            mac_limit: s.mac_limit,
            dhcp_guard: s.dhcp_guard,
            ra_guard: s.ra_guard,
        });
        let storm = self
            .storm
            .any()
            .then_some(qswitch_api::policy::StormConfig {
                broadcast: self.storm.broadcast,
                multicast: self.storm.multicast,
                unknown_unicast: self.storm.unknown_unicast,
            });
        (vlans, security, storm)
    }

    /// Writes this policy into a port's config keys.
    pub fn write_config(&self, config: &mut qswitch_api::PortConfig) {
        let (vlans, security, storm) = self.to_config();
        config.vlans = vlans;
        config.security = security.map(Box::new);
        config.storm = storm.map(Box::new);
        let ll = self.link_local;
        config.link_local_forward = (!ll.forward.is_empty()).then_some(ll.forward);
        config.bpdu_guard = ll.bpdu_guard;
        config.security_groups = self.security_groups.clone();
    }
}

/// Storm-control frame classes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StormClass {
    Broadcast = 0,
    Multicast = 1,
    UnknownUnicast = 2,
}

impl StormClass {
    /// The class of a frame to `dst` that would be flooded.
    #[inline]
    pub(crate) fn of(dst: MacAddr) -> StormClass {
        if dst.is_broadcast() {
            StormClass::Broadcast
        } else if dst.is_multicast() {
            StormClass::Multicast
        } else {
            StormClass::UnknownUnicast
        }
    }

    /// The drop counter of frames of this class beyond the limit.
    #[inline]
    pub(crate) fn drop_reason(self) -> crate::stats::DropReason {
        use crate::stats::DropReason;
        match self {
            StormClass::Broadcast => DropReason::StormBroadcast,
            StormClass::Multicast => DropReason::StormMulticast,
            StormClass::UnknownUnicast => DropReason::StormUnknownUnicast,
        }
    }

    /// Its name, as the `storm` config key spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            StormClass::Broadcast => "broadcast",
            StormClass::Multicast => "multicast",
            StormClass::UnknownUnicast => "unknown_unicast",
        }
    }
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
        let carried = qswitch_api::policy::Carried::of(vlan, Some(&settings.vlans));
        let (native, trunk) = (carried.native, carried.tagged.is_some());
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

    /// The VLANs the port carries, untagged (its native VLAN) or tagged.
    pub(crate) fn carried(&self) -> qswitch_api::policy::Carried<'_> {
        qswitch_api::policy::Carried {
            native: self.native,
            tagged: self.trunk.then_some(&self.settings.vlans),
        }
    }

    /// Whether the engine has anything to do per frame for frames from this port.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.trunk || self.secure || self.storm || self.native.is_none()
    }

    /// The VLAN of a frame received on this port whose 802.1Q tag carries VID `tag`
    /// (`None`: untagged), and whether it arrived tagged; or why it is dropped (the VLAN
    /// table in [`crate::engine`]).
    #[inline]
    pub(crate) fn ingress_vlan(&self, tag: Option<u16>) -> Result<(u16, bool), DropReason> {
        match tag {
            None => self
                .native
                .map(|v| (v, false))
                .ok_or(DropReason::VlanNotAllowed),
            Some(vid) if self.trunk && self.settings.vlans.contains(vid) => Ok((vid, true)),
            Some(_) if self.trunk => Err(DropReason::VlanNotAllowed),
            Some(_) => Err(DropReason::VlanTagged),
        }
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

    /// The limit of `class` (frames per second) and the frames its bucket would hold at
    /// `now`, without refilling it or taking a token (`None`: no limit). One more frame is
    /// admitted when it holds at least one.
    pub(crate) fn storm_peek(&self, class: StormClass, now: u64) -> Option<(u64, i64)> {
        let s = &self.settings.storm;
        let pps = match class {
            StormClass::Broadcast => s.broadcast,
            StormClass::Multicast => s.multicast,
            StormClass::UnknownUnicast => s.unknown_unicast,
        }?;
        let tokens =
            self.buckets[class as usize].peek(now, pps.saturating_mul(8), storm_depth(pps));
        Some((pps, tokens))
    }
}

/// Burst allowance of a storm limit: a tenth of a second's worth, at least one rx burst.
fn storm_depth(pps: u64) -> u64 {
    (pps / 10).max(BURST as u64)
}

/// Why port security refuses a frame, if it does: the drop counter and the check that
/// failed, in words (what `trace` shows).
#[inline]
pub(crate) fn security_check(sec: &Security, frame: &[u8]) -> Option<(DropReason, &'static str)> {
    use guard::Kind;
    let facts = guard::inspect(frame);
    let mac_ok = |m: MacAddr| sec.macs.is_empty() || sec.macs.contains(&m);
    let ip_ok = |ip: IpAddr| {
        sec.ips.is_empty() || ip.is_unspecified() || sec.ips.iter().any(|p| p.contains(ip))
    };
    if !facts.src_mac.is_some_and(mac_ok) {
        return Some((DropReason::SrcMacNotAllowed, "source MAC not in macs"));
    }
    if sec.dhcp_guard && facts.is_dhcp_server() {
        return Some((DropReason::DhcpGuard, "DHCP server message (dhcp_guard)"));
    }
    let ipv6 = matches!(facts.ip_src, Some(IpAddr::V6(_)));
    if sec.ra_guard && facts.is_router_message() {
        return Some((
            DropReason::RaGuard,
            "IPv6 router advertisement or redirect (ra_guard)",
        ));
    }
    if sec.ra_guard && ipv6 && facts.incomplete {
        return Some((
            DropReason::RaGuard,
            "IPv6 header chain not readable (ra_guard)",
        ));
    }
    if let Some(arp) = facts.arp {
        if !mac_ok(arp.sender_mac) {
            return Some((DropReason::SrcMacNotAllowed, "ARP sender MAC not in macs"));
        }
        if !ip_ok(IpAddr::V4(arp.sender_ip)) {
            return Some((DropReason::SrcIpNotAllowed, "ARP sender IP not in ips"));
        }
    }
    if let Some(ip) = facts.ip_src {
        if !ip_ok(ip) {
            return Some((DropReason::SrcIpNotAllowed, "source IP not in ips"));
        }
    }
    match facts.kind {
        Kind::NeighborAdvertisement(nd) => {
            if nd.link_layer.is_some_and(|m| !mac_ok(m)) {
                return Some((
                    DropReason::SrcMacNotAllowed,
                    "ND advertisement link-layer address not in macs",
                ));
            }
            if !ip_ok(IpAddr::V6(nd.target)) {
                return Some((
                    DropReason::SrcIpNotAllowed,
                    "ND advertisement target not in ips",
                ));
            }
        }
        Kind::NeighborSolicitation(nd) => {
            if nd.link_layer.is_some_and(|m| !mac_ok(m)) {
                return Some((
                    DropReason::SrcMacNotAllowed,
                    "ND solicitation link-layer address not in macs",
                ));
            }
            // Duplicate address detection claims the target.
            if facts.ip_src.is_some_and(|s| s.is_unspecified()) && !ip_ok(IpAddr::V6(nd.target)) {
                return Some((
                    DropReason::SrcIpNotAllowed,
                    "duplicate address detection target not in ips",
                ));
            }
        }
        _ => {}
    }
    if !sec.ips.is_empty() && facts.incomplete && facts.ip_src.is_none() {
        // ARP or IP whose addresses could not be read: fail closed.
        return Some((
            DropReason::SrcIpNotAllowed,
            "addresses not readable with ips set (fail closed)",
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_apply_and_config_round_trips() {
        let mut pol = PortPolicy::default();
        assert_eq!(pol.to_config(), (None, None, None));
        use qswitch_api::policy::PolicyUpdate;
        let u = PolicyUpdate {
            vlans: Some("5-7".parse().unwrap()),
            macs: Some(vec!["02:00:00:00:00:01".parse().unwrap()]),
            ips: Some(vec!["10.0.0.0/8".parse().unwrap()]),
            mac_limit: Some(Some(3)),
            ra_guard: Some(true),
            storm_broadcast: Some(Some(9)),
            link_local_forward: Some("lldp".parse().unwrap()),
            bpdu_guard: Some(true),
            ..PolicyUpdate::default()
        };
        pol.update(&u);
        let mut c = qswitch_api::PortConfig::gen("g");
        pol.write_config(&mut c);
        assert_eq!(PortPolicy::from_config(&c), pol);
        assert_eq!(
            c.vlans.as_ref().map(ToString::to_string).as_deref(),
            Some("5-7")
        );
        // Clearing: what the update names, nothing else.
        let clear = PolicyUpdate {
            vlans: Some(VlanSet::default()),
            mac_limit: Some(None),
            storm_broadcast: Some(None),
            ..PolicyUpdate::default()
        };
        pol.update(&clear);
        assert!(pol.vlans.is_empty() && pol.security.mac_limit.is_none() && !pol.storm.any());
        assert!(pol.security.ra_guard && pol.security.macs.len() == 1);
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
