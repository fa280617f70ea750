//! Stages `firewall_in` and `firewall_out`: security groups with connection tracking
//! ([`crate::firewall`], docs/firewall.md). A frame from a port with groups is checked by
//! that port's egress rules on its way in; a frame to a port with groups by that port's
//! ingress rules, per destination, on its way out. The engine asks
//! [`Firewall::filtered`] once per burst (ingress) or per destination and burst (egress),
//! so a port without groups pays one predictable branch. Drops: `fw_denied_egress`,
//! `fw_denied_ingress`, `ct_invalid`, `ct_limit`, `ct_fragment`.

use qswitch_api::config::RuleDirection;

use super::Tracer;
use crate::firewall::{Denied, Firewall, Seen, Verdict, VerdictCache};
use crate::ids::PortId;
use crate::stats::DropReason;

/// Why the firewall of `port` refuses `frame` crossing it in `direction` (egress: from the
/// port's VM; ingress: toward it), if it does. Called only for filtered ports. A tracer
/// gets the verdict of a dry run ([`Firewall::peek`]): nothing is tracked. `seen` gets
/// what the check found in the table, for [`filter_out`] of the same frame. `cache`: the
/// worker's verdict cache ([`VerdictCache::begin`] called for this burst), which a dry
/// run neither uses nor fills. `at`: the frame's index in the burst
/// ([`Firewall::prefetch_cached`]).
#[allow(clippy::too_many_arguments)]
#[inline]
pub(crate) fn check<T: Tracer>(
    fw: &Firewall,
    port: PortId,
    direction: RuleDirection,
    (frame, at): (&[u8], usize),
    now: u64,
    t: &mut T,
    seen: &mut Seen,
    cache: &mut VerdictCache,
) -> Option<DropReason> {
    let zone = u32::from(port.0);
    let v = if T::ON {
        let v = fw.peek(zone, direction, frame, now);
        t.firewall(fw, port, direction, v);
        *seen = Seen::NONE;
        v
    } else {
        fw.check_cached_at(cache, at, zone, direction, frame, now, seen)
    };
    match v {
        Verdict::Allow(..) => None,
        Verdict::Deny(d, _) => Some(reason(d)),
    }
}

/// The drop reason of a denial.
pub(crate) fn reason(d: Denied) -> DropReason {
    match d {
        Denied::NoRule(RuleDirection::Egress) => DropReason::FwDeniedEgress,
        Denied::NoRule(RuleDirection::Ingress) => DropReason::FwDeniedIngress,
        Denied::Invalid => DropReason::CtInvalid,
        Denied::Limit => DropReason::CtLimit,
        Denied::Fragment => DropReason::CtFragment,
    }
}

/// Stage `firewall_out` for the frames `sel` (indices into `pkts`) going to `port`, which
/// has security groups: those its ingress rules refuse leave `sel`, counted in `drops`;
/// those they allow are added to `allowed` (the worker's own counter of that port).
/// The frames are judged together ([`Firewall::check_burst`]: parsed, hashed and their
/// connections prefetched before the first lookup). `seen`: what the ingress port's
/// filter found for each frame of the burst (by index), when the ingress is filtered: a
/// connection both ports track in one entry is not looked up again.
#[allow(clippy::too_many_arguments)]
#[inline(never)]
pub(crate) fn filter_out(
    fw: &Firewall,
    port: PortId,
    pkts: &[crate::packet::Pkt],
    sel: &mut Vec<u8>,
    seen: Option<&[Seen; crate::packet::BURST]>,
    now: u64,
    drops: &mut crate::stats::DropTally,
    allowed: &crate::stats::Counter,
) {
    // The usual burst between two filtered ports: every frame's connection already
    // covers this port (one entry for both), so nothing is left to judge.
    let zone = u32::from(port.0);
    if seen.is_some_and(|s| sel.iter().all(|&i| s[usize::from(i)].covers(zone))) {
        allowed.add(sel.len() as u64);
        return;
    }
    let mut denied = [None; crate::packet::BURST];
    if sel.len() > denied.len() {
        // Never with the engine's bursts; one by one then.
        sel.retain(|&i| {
            let frame = pkts[usize::from(i)].frame();
            let mut none = Seen::NONE;
            match fw.check_seen(zone, RuleDirection::Ingress, frame, now, &mut none) {
                Verdict::Allow(..) => true,
                Verdict::Deny(d, _) => {
                    drops.count(reason(d));
                    false
                }
            }
        });
        allowed.add(sel.len() as u64);
        return;
    }
    fw.check_burst(
        u32::from(port.0),
        RuleDirection::Ingress,
        sel.len(),
        |k| pkts[usize::from(sel[k])].frame(),
        |k| seen.map_or(Seen::NONE, |s| s[usize::from(sel[k])]),
        now,
        |k, v| {
            if let Verdict::Deny(d, _) = v {
                denied[k] = Some(reason(d));
            }
        },
    );
    let mut k = 0;
    sel.retain(|_| {
        let r = denied[k];
        k += 1;
        match r {
            None => true,
            Some(r) => {
                drops.count(r);
                false
            }
        }
    });
    allowed.add(sel.len() as u64);
}
