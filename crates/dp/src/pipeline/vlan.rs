//! Stages `vlan` (ingress: the VLAN a frame is switched in) and `vlan_tag` (egress: the
//! frame untagged or tagged as the destination carries its VLAN). The rules are the table
//! in [`crate::engine`]; [`Policy::ingress_vlan`] and [`Policy::egress`] hold them. Drops:
//! `vlan_tagged`, `vlan_not_allowed`; on egress `vlan_not_allowed` and `oversize` (a frame
//! that does not fit tagged).

use qswitch_wire::l2::L2Info;

use super::Tracer;
use crate::packet::Pkt;
use crate::policy::{Egress, Policy};
use crate::stats::DropReason;

/// A frame's VLAN, the TCI a tag pushed on the way out carries (the received one, its
/// priority bits kept, or the VLAN alone), and whether its buffer holds it tagged now.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct FrameVlan {
    pub(crate) vlan: u16,
    pub(crate) tci: u16,
    pub(crate) tagged: bool,
}

/// The VLAN of a frame received on a port with policy `pol` (trunks, native VLANs), or why
/// it is dropped.
#[inline]
pub(crate) fn ingress<T: Tracer>(
    pol: &Policy,
    l2: &L2Info,
    frame: &[u8],
    t: &mut T,
) -> Result<FrameVlan, DropReason> {
    let r = match pol.ingress_vlan(l2.vlan) {
        Ok((vlan, false)) => Ok(FrameVlan {
            vlan,
            tci: vlan,
            tagged: false,
        }),
        Ok((vlan, true)) => Ok(FrameVlan {
            vlan,
            tci: u16::from_be_bytes([frame[14], frame[15]]),
            tagged: true,
        }),
        Err(r) => Err(r),
    };
    if T::ON {
        t.vlan(l2.vlan, r);
    }
    r
}

/// The plain path's rule (every port an access port): an untagged frame is in the port's
/// VLAN `vlan`; a tagged one (802.1Q VID `tag`) is dropped (`vlan_tagged`, counted by the
/// caller when this is false).
#[inline]
pub(crate) fn access<T: Tracer>(vlan: u16, tag: Option<u16>, t: &mut T) -> bool {
    if T::ON {
        let r = match tag {
            None => Ok(FrameVlan {
                vlan,
                tci: vlan,
                tagged: false,
            }),
            Some(_) => Err(DropReason::VlanTagged),
        };
        t.vlan(tag, r);
    }
    tag.is_none()
}

/// Egress: `pkt`, of VLAN `m`, re-encoded in place for a destination that takes the VLAN
/// as `egress` says; or why it does not leave there.
#[inline]
pub(crate) fn tag(pkt: &mut Pkt, m: &mut FrameVlan, egress: Egress) -> Result<(), DropReason> {
    match egress {
        Egress::Untagged => {
            if m.tagged {
                pkt.pop_vlan();
                m.tagged = false;
            }
            Ok(())
        }
        Egress::Tagged => {
            if !m.tagged {
                if !pkt.push_vlan(m.tci) {
                    return Err(DropReason::Oversize);
                }
                m.tagged = true;
            }
            Ok(())
        }
        Egress::No => Err(DropReason::VlanNotAllowed),
    }
}
