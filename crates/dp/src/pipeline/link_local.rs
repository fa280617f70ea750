//! Stage `link_local`: frames to 01:80:C2:00:00:0X, checked on the multicast branch only.
//! The groups, their drop reasons and the settings are in [`crate::link_local`]; this is
//! the step the engine takes. Drops: `bpdu`, `pause`, `slow_protocols`, `eapol`, `lldp`,
//! `link_local`, `bpdu_guard` (and then `port_disabled` for the rest of the burst and of
//! what the port sends or is sent until it is enabled).

use super::Tracer;
use crate::link_local::{self, Verdict};
use crate::policy::Policy;
use crate::stats::{DropReason, DropTally};
use crate::table::PortEntry;

/// What the link-local stage did with a frame.
pub(crate) enum Step {
    /// Relayed: the frame goes on as any multicast.
    Relay,
    /// Dropped and counted.
    Dropped,
    /// BPDU guard disabled the ingress port: the rest of the burst is dropped too.
    Disabled,
}

/// A frame to link-local group `g` from `ingress`, whose policy is `pol`:
/// relayed only where the port's `link_local_forward` says; else counted, and a BPDU from
/// a port with `bpdu_guard` disables it (one atomic store: the worker never blocks; not
/// when tracing). An LLDPDU (group 0x0E) on a port with an LLDP agent is handed to it first
/// ([`crate::lldp::LldpAgent::on_frame`]; not when tracing).
#[cold]
#[inline(never)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn step<T: Tracer>(
    pol: Option<&Policy>,
    ingress: &PortEntry,
    g: u8,
    frame: &[u8],
    now: u64,
    drops: &mut DropTally,
    t: &mut T,
) -> Step {
    if let (false, 0x0e, Some(agent)) = (T::ON, g, &ingress.lldp) {
        agent.on_frame(frame, now);
    }
    let settings = pol.map(|p| p.settings.link_local).unwrap_or_default();
    let v = link_local::verdict(g, &settings);
    if T::ON {
        t.link_local(g, v);
    }
    match v {
        Verdict::Relay => Step::Relay,
        Verdict::Drop(r) => {
            drops.count(r);
            Step::Dropped
        }
        Verdict::Guard => {
            drops.count(DropReason::BpduGuard);
            if !T::ON {
                ingress.disabled.trip();
            }
            Step::Disabled
        }
    }
}
