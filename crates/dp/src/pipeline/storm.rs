//! Stage `storm_control`: broadcast, multicast and unknown unicast that would be flooded,
//! limited per class on ports with `storm` limits ([`Policy::storm_admit`]: token buckets
//! that count frames). Drops: `storm_broadcast`, `storm_multicast`, `storm_unknown_unicast`.

use qswitch_wire::MacAddr;

use super::Tracer;
use crate::policy::{Policy, StormClass};
use crate::stats::DropReason;

/// Whether a frame to `dst` that would be flooded is within the port's limit at `now`
/// (takes a token; a tracer only looks), or the drop. Called only for ports with
/// `pol.storm`.
#[inline]
pub(crate) fn admit<T: Tracer>(
    pol: &Policy,
    dst: MacAddr,
    now: u64,
    t: &mut T,
) -> Result<(), DropReason> {
    let class = StormClass::of(dst);
    let admit = if T::ON {
        t.storm(pol, class, now)
    } else {
        pol.storm_admit(class, now)
    };
    if admit {
        Ok(())
    } else {
        Err(class.drop_reason())
    }
}
