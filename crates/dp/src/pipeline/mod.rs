//! The pipeline: the stages a frame goes through, one module each, run by the engine
//! ([`crate::engine`]) for forwarding and by [`crate::trace`] for `qswitch trace` — the same
//! code, generic over a [`Tracer`].
//!
//! ```text
//!  ingress (per frame of an rx burst)                 egress (per destination of a burst)
//!  rx ─ classify ─ vlan ─ port_security ─ [firewall in]     vlan_tag ─ [firewall out] ─ tx
//!      ─ link_local ─ learn ─ lookup ─ storm_control ─▶ destinations ─▶ (in order, once per
//!                                                                       destination)
//! ```
//!
//! The stages and their drop reasons are declared once, in [`crate::stats`]
//! ([`Stage`](crate::stats::Stage), [`DropReason::stage`](crate::stats::DropReason::stage)).
//! Each stage is a function that takes the frame, what the stages before it decided, and
//! the [`Tracer`]; it returns its verdict or the drop reason, which the engine counts.
//! `learn` and `lookup` are the forwarder's methods (`engine.rs`): they keep its one-entry
//! caches in front of the fdb. The engine decides once per burst whether a
//! stage is configured at all (`Policy::active`, `View::vlan_aware`, the port's
//! `rx_learn`): an unconfigured stage costs one predictable branch per burst or frame.
//!
//! # Tracing
//! A [`Tracer`] is told each stage's verdict. Forwarding passes [`NoTrace`], a zero-sized
//! type whose hooks are empty and whose [`Tracer::ON`] is `false`: after monomorphisation
//! nothing of it is left in the engine. `trace` passes a recorder that turns the verdicts
//! into its report. A stage that changes shared state (learning, storm buckets, BPDU guard)
//! does so only when `T::ON` is false; a tracer is asked instead what the change would be
//! (a dry run), so tracing changes nothing.
//!
//! # Hooks for stages to come
//! The firewall (`crates/dp/src/firewall/`) plugs in as two stages: *firewall in* after
//! port security and before link-local and learning (a refused frame teaches the fdb
//! nothing), and *firewall out* per destination after VLAN tagging. A stage gets:
//! the frame (`&[u8]`, or the `Pkt` on egress), its classification
//! (`qswitch_wire::l2::L2Info`), its VLAN ([`vlan::FrameVlan`]), the port's compiled
//! [`Policy`](crate::policy::Policy) (where its per-port configuration goes, with a flag
//! the engine checks once per burst), `now`, and `&mut T: Tracer`; it returns
//! `Option<DropReason>` (`None`: the frame goes on). How to add one: docs/architecture.md.

pub(crate) mod classify;
pub(crate) mod firewall;
pub(crate) mod link_local;
pub(crate) mod security;
pub(crate) mod storm;
pub(crate) mod vlan;

use qswitch_wire::l2::{L2Error, L2Info};
use qswitch_wire::MacAddr;

use crate::fdb::Fdb;
use crate::ids::PortId;
use crate::policy::{Policy, StormClass};
use crate::stats::DropReason;

/// What a stage tells the tracer. Every hook has an empty default; [`Tracer::ON`] says
/// whether the engine asks for dry runs ([`Tracer::learn`], [`Tracer::lookup`],
/// [`Tracer::storm`]) instead of changing shared state.
pub(crate) trait Tracer {
    /// Whether this tracer records (and the stages run dry). `false` for forwarding.
    const ON: bool;

    /// Classify: the frame's Ethernet header, or why it cannot be switched.
    #[inline(always)]
    fn classified(&mut self, _l2: Result<&L2Info, L2Error>) {}
    /// VLAN: the frame's VLAN (with the 802.1Q tag's VID it arrived with), or the drop.
    #[inline(always)]
    fn vlan(&mut self, _tag: Option<u16>, _verdict: Result<vlan::FrameVlan, DropReason>) {}
    /// Port security: the check that refuses the frame, or `None` (passed).
    #[inline(always)]
    fn security(&mut self, _refused: Option<(DropReason, &'static str)>) {}
    /// Link-local: the group and what becomes of the frame.
    #[inline(always)]
    fn link_local(&mut self, _group: u8, _verdict: crate::link_local::Verdict) {}
    /// Learn (dry run, `ON` only): what learning `src` in `vlan` on `port` would do.
    #[inline(always)]
    fn learn(&mut self, _fdb: &Fdb, _src: MacAddr, _vlan: u16, _port: PortId, _now: u64) {}
    /// Lookup (dry run, `ON` only): where `dst` in `vlan` is known, after the learning
    /// [`Tracer::learn`] was told of.
    #[inline(always)]
    fn lookup(&mut self, _fdb: &Fdb, _dst: MacAddr, _vlan: u16, _now: u64) -> Option<PortId> {
        None
    }
    /// Lookup: `dst` is multicast (flooded, no lookup).
    #[inline(always)]
    fn multicast(&mut self, _dst: MacAddr) {}
    /// Lookup: a known destination that is gone or does not carry the VLAN (flooded).
    #[inline(always)]
    fn unusable(&mut self, _port: PortId, _vlan: u16) {}
    /// Lookup: the frame goes to the one known destination.
    #[inline(always)]
    fn unicast(&mut self, _port: PortId, _storm: bool) {}
    /// Storm control (dry run, `ON` only): whether `class` is within its limit now,
    /// without taking a token.
    #[inline(always)]
    fn storm(&mut self, _pol: &Policy, _class: StormClass, _now: u64) -> bool {
        true
    }
    /// Lookup: the frame is flooded in `vlan`.
    #[inline(always)]
    fn flood(&mut self, _vlan: u16) {}
    /// Firewall (dry run, `ON` only): the verdict on the frame crossing `port` in
    /// `direction`.
    #[inline(always)]
    fn firewall(
        &mut self,
        _fw: &crate::firewall::Firewall,
        _port: PortId,
        _direction: qswitch_api::config::RuleDirection,
        _verdict: crate::firewall::Verdict,
    ) {
    }
}

/// The tracer of forwarding: records nothing, costs nothing.
pub(crate) struct NoTrace;

impl Tracer for NoTrace {
    const ON: bool = false;
}
