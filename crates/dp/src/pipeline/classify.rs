//! Stage `classify`: the Ethernet header (`qswitch_wire::l2::classify`). Drops: `runt`,
//! `oversize`, `bad_src_mac`. [`untagged`] is the plain path's form (with the `vlan`
//! stage's access rule).

use qswitch_wire::l2::{self, L2Error, L2Info, MAX_FRAME_LEN};
use qswitch_wire::{ethernet, vlan, MacAddr};

use super::Tracer;
use crate::stats::{DropReason, DropTally};

/// The 802.1Q TPID (`EtherType::Vlan`), as it is on the wire.
const TPID: [u8; 2] = [0x81, 0x00];

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

/// The plain path's stages `classify` and `vlan` (every port an access port, so a tagged
/// frame is dropped, `vlan_tagged`): the destination and source of an untagged frame, or
/// `None`, counted. The same verdicts as [`classify`] then [`super::vlan::access`] (a
/// tracer is told through them), but read from the header's bytes: the frame that is
/// switched costs a length test, a source test and a TPID test, whatever LLVM makes of
/// `l2::classify`'s EtherType conversion (inlined, that conversion and the truncated-tag
/// test ended up in the loop in some builds: +14 instructions per frame, bench/README.md).
#[inline]
pub(crate) fn untagged<T: Tracer>(
    frame: &[u8],
    vlan: u16,
    drops: &mut DropTally,
    t: &mut T,
) -> Option<(MacAddr, MacAddr)> {
    if T::ON {
        let l2 = classify(frame, drops, t)?;
        if !super::vlan::access(vlan, l2.vlan, t) {
            drops.count(DropReason::VlanTagged);
            return None;
        }
        return Some((l2.dst, l2.src));
    }
    if frame.len() > MAX_FRAME_LEN {
        drops.count(DropReason::Oversize);
        return None;
    }
    let Some(hdr) = frame.first_chunk::<{ ethernet::HEADER_LEN }>() else {
        drops.count(DropReason::Runt);
        return None;
    };
    let src = MacAddr(field(hdr, 6));
    if src.is_multicast() {
        drops.count(DropReason::BadSrcMac);
        return None;
    }
    if field(hdr, 12) == TPID {
        tagged(frame, drops);
        return None;
    }
    Some((MacAddr(field(hdr, 0)), src))
}

/// The `N` bytes of the header at `at` (constants: no bounds check is left).
#[inline(always)]
fn field<const N: usize>(hdr: &[u8; ethernet::HEADER_LEN], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&hdr[at..at + N]);
    out
}

/// A tagged frame on the plain path: a truncated tag is a runt, as `l2::classify` says;
/// else `vlan_tagged`.
#[cold]
#[inline(never)]
fn tagged(frame: &[u8], drops: &mut DropTally) {
    drops.count(if frame.len() < ethernet::HEADER_LEN + vlan::HEADER_LEN {
        DropReason::Runt
    } else {
        DropReason::VlanTagged
    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::NoTrace;
    use proptest::prelude::*;
    use qswitch_wire::ethernet::EtherType;

    /// What the plain path did before [`untagged`]: [`classify`], then the access rule.
    fn by_l2(frame: &[u8], drops: &mut DropTally) -> Option<(MacAddr, MacAddr)> {
        let l2 = classify(frame, drops, &mut NoTrace)?;
        if l2.vlan.is_some() {
            drops.count(DropReason::VlanTagged);
            return None;
        }
        Some((l2.dst, l2.src))
    }

    fn same(frame: &[u8]) {
        let (mut a, mut b) = (DropTally::default(), DropTally::default());
        assert_eq!(
            untagged(frame, 1, &mut a, &mut NoTrace),
            by_l2(frame, &mut b),
            "{frame:02x?}"
        );
        assert_eq!(
            a.reasons().collect::<Vec<_>>(),
            b.reasons().collect::<Vec<_>>()
        );
    }

    #[test]
    fn untagged_agrees_with_l2_classify_at_the_edges() {
        assert_eq!(u16::from_be_bytes(TPID), u16::from(EtherType::Vlan));
        let mut f = vec![0u8; 60];
        f[..6].copy_from_slice(&[0xff; 6]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        for len in [0, 13, 14, 17, 18, 60] {
            same(&f[..len]);
        }
        f[12..14].copy_from_slice(&TPID);
        for len in [14, 17, 18, 60] {
            same(&f[..len]);
        }
        f[6] = 1;
        same(&f);
        same(&vec![0u8; MAX_FRAME_LEN]);
        same(&vec![0u8; MAX_FRAME_LEN + 1]);
    }

    proptest! {
        #[test]
        fn untagged_agrees_with_l2_classify(
            mut frame in proptest::collection::vec(any::<u8>(), 0..40),
            tpid in any::<bool>(),
        ) {
            if tpid && frame.len() >= 14 {
                frame[12..14].copy_from_slice(&TPID);
            }
            same(&frame);
        }
    }
}
