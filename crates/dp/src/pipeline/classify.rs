//! Stage `classify`: the Ethernet header (`qswitch_wire::l2::classify`). Drops: `runt`,
//! `oversize`, `bad_src_mac`.

use qswitch_wire::l2::{self, L2Error, L2Info};

use super::Tracer;
use crate::stats::{DropReason, DropTally};

/// Classifies a frame; a frame that cannot be switched is counted and `None`.
#[inline]
pub(crate) fn classify<T: Tracer>(
    frame: &[u8],
    drops: &mut DropTally,
    t: &mut T,
) -> Option<L2Info> {
    if T::ON {
        return traced(frame, drops, t);
    }
    // One arm per error, each counting its own reason.
    match l2::classify(frame) {
        Ok(l2) => Some(l2),
        Err(L2Error::Runt) => {
            drops.count(DropReason::Runt);
            None
        }
        Err(L2Error::Oversize) => {
            drops.count(DropReason::Oversize);
            None
        }
        Err(L2Error::BadSrc) => {
            drops.count(DropReason::BadSrcMac);
            None
        }
    }
}

/// [`classify`] with a tracer: the same, and the tracer told.
#[cold]
#[inline(never)]
fn traced<T: Tracer>(frame: &[u8], drops: &mut DropTally, t: &mut T) -> Option<L2Info> {
    let r = l2::classify(frame);
    t.classified(r.as_ref().map_err(|e| *e));
    match r {
        Ok(l2) => Some(l2),
        Err(e) => {
            drops.count(match e {
                L2Error::Runt => DropReason::Runt,
                L2Error::Oversize => DropReason::Oversize,
                L2Error::BadSrc => DropReason::BadSrcMac,
            });
            None
        }
    }
}
