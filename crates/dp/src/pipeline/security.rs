//! Stage `port_security`: source MAC and IP, DHCP and router-advertisement guards, on
//! ports with per-frame checks ([`crate::policy::Security`]; the checks are
//! [`crate::policy::security_check`]). Drops: `src_mac_not_allowed`, `src_ip_not_allowed`,
//! `dhcp_guard`, `ra_guard`.

use super::Tracer;
use crate::policy::{self, Policy};
use crate::stats::DropReason;

/// Why port security refuses `frame` from a port with policy `pol`, if it does. Called
/// only for ports with `pol.secure`.
#[inline]
pub(crate) fn check<T: Tracer>(pol: &Policy, frame: &[u8], t: &mut T) -> Option<DropReason> {
    let r = policy::security_check(&pol.settings.security, frame);
    if T::ON {
        t.security(r);
    }
    r.map(|(reason, _)| reason)
}
