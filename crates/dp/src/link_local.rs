//! Link-local frames: IEEE 802.1D reserved group addresses 01:80:C2:00:00:00–0F.
//!
//! A bridge never relays these (802.1D-2004 §7.12.6; Linux forwards a group only where
//! `group_fwd_mask` says, and never PAUSE or the slow protocols). They are how a host talks
//! to the switch port it is cabled to: a guest's BPDU reaching a physical switch with BPDU
//! guard shuts the host's uplink, a PAUSE frame can stall it, a LACPDU can break its LAG.
//! So a frame to one of them is counted as a drop on the ingress rx queue, by group:
//!
//! | destination | protocol | drop reason |
//! |---|---|---|
//! | 01:80:C2:00:00:00 | STP/RSTP/MSTP BPDU | `bpdu` (`bpdu_guard` with `bpdu_guard = true`) |
//! | 01:80:C2:00:00:01 | PAUSE (802.3x) | `pause` (never relayed) |
//! | 01:80:C2:00:00:02 | slow protocols: LACP, marker | `slow_protocols` (never relayed) |
//! | 01:80:C2:00:00:03 | 802.1X EAPOL | `eapol` |
//! | 01:80:C2:00:00:0E | LLDP (and PTP peer delay) | `lldp` |
//! | the others | | `link_local` |
//!
//! A port's `link_local_forward` (a VM that runs a bridge itself) relays the groups it
//! names from that port like any other multicast (flooded in its VLAN). `bpdu_guard = true`
//! makes a BPDU from the port disable it: the worker that sees it sets the port's
//! [`crate::table::Disabled`] flag and drops the rest of the burst; from then on the engine
//! drains the port's rx queues and sends it nothing (`port_disabled`), checked once per
//! burst; the control side logs it at its next housekeeping tick, shows it in `port list`
//! and `/metrics`, and `qswitch port enable` clears it ([`crate::Switch::enable_port`]).
//!
//! Cost: the test runs only on the engine's multicast branch (unicast pays nothing), and is
//! a compare of the first five bytes; the port's settings are read only for a link-local
//! frame. The veth kernel fast path sends every multicast frame to the slow path, so these
//! frames always reach the engine.

use qswitch_api::policy::LinkLocalGroups;
use qswitch_wire::MacAddr;

use crate::stats::DropReason;

/// A port's link-local settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkLocal {
    /// Groups relayed from the port (never PAUSE or slow protocols: the type refuses them).
    pub forward: LinkLocalGroups,
    /// A BPDU from the port disables it.
    pub bpdu_guard: bool,
}

/// What becomes of a link-local frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Relayed as any multicast (the port's `link_local_forward` names its group).
    Relay,
    /// Not relayed, counted under this reason.
    Drop(DropReason),
    /// A BPDU from a port with `bpdu_guard`: the port is disabled.
    Guard,
}

/// The group of a frame to `dst` if `dst` is one of 01:80:C2:00:00:00–0F (the last nibble).
/// Only called for multicast destinations.
#[inline(always)]
pub(crate) fn group(dst: MacAddr) -> Option<u8> {
    let d = dst.0;
    (d[..5] == [0x01, 0x80, 0xc2, 0x00, 0x00] && d[5] < 0x10).then_some(d[5])
}

/// The drop counter of a frame to group `n` that is not relayed.
pub(crate) fn reason(n: u8) -> DropReason {
    match n {
        0x0 => DropReason::Bpdu,
        0x1 => DropReason::Pause,
        0x2 => DropReason::SlowProtocols,
        0x3 => DropReason::Eapol,
        0xe => DropReason::Lldp,
        _ => DropReason::LinkLocal,
    }
}

/// What the protocol of group `n` is called, for `trace`.
pub(crate) fn protocol(n: u8) -> &'static str {
    match n {
        0x0 => "STP BPDU",
        0x1 => "PAUSE",
        0x2 => "slow protocols (LACP, marker)",
        0x3 => "802.1X EAPOL",
        0xe => "LLDP",
        _ => "reserved",
    }
}

/// What becomes of a frame to group `n` received on a port with settings `ll`.
#[inline]
pub(crate) fn verdict(n: u8, ll: &LinkLocal) -> Verdict {
    if n == 0 && ll.bpdu_guard {
        Verdict::Guard
    } else if ll.forward.contains(n) && LinkLocalGroups::NEVER & (1 << n) == 0 {
        Verdict::Relay
    } else {
        Verdict::Drop(reason(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_and_verdicts() {
        let mac = |last| MacAddr([0x01, 0x80, 0xc2, 0, 0, last]);
        assert_eq!(group(mac(0)), Some(0));
        assert_eq!(group(mac(0x0e)), Some(0x0e));
        assert_eq!(group(mac(0x10)), None);
        assert_eq!(group(MacAddr([0x01, 0x80, 0xc2, 0, 1, 0])), None);
        assert_eq!(group(MacAddr([0xff; 6])), None);
        let none = LinkLocal::default();
        assert_eq!(verdict(0, &none), Verdict::Drop(DropReason::Bpdu));
        assert_eq!(verdict(5, &none), Verdict::Drop(DropReason::LinkLocal));
        let fwd = LinkLocal {
            forward: "stp,lldp,5".parse().unwrap(),
            bpdu_guard: false,
        };
        assert_eq!(verdict(0, &fwd), Verdict::Relay);
        assert_eq!(verdict(0xe, &fwd), Verdict::Relay);
        assert_eq!(verdict(3, &fwd), Verdict::Drop(DropReason::Eapol));
        let guard = LinkLocal {
            bpdu_guard: true,
            ..fwd
        };
        assert_eq!(verdict(0, &guard), Verdict::Guard);
        assert_eq!(verdict(1, &guard), Verdict::Drop(DropReason::Pause));
    }
}
