//! The forwarding engine: one rx burst switched to completion, with no threads and no clock.
//! It strings together the stages of [`crate::pipeline`] (one module each, their drop
//! reasons declared in [`crate::stats`]); [`Forwarder::decide`] is generic over a
//! [`Tracer`], so `qswitch trace` ([`crate::trace`]) runs this same decision.
//!
//! ```text
//!  Forwarder::poll(view, fdb, ingress, queue, now)
//!     │ QoS: rx_budget(queue, now) ── 0 → not polled (back-pressure, no drop)
//!     │ rx_burst (≤ budget frames into the forwarder's own buffers) ; charge the bucket
//!     ▼
//!  Forwarder::switch_burst(view, fdb, ingress, queue, n, now)
//!     │ classify L2 ── runt / oversize / bad source / VLAN not carried → counted drop
//!     │ port disabled by BPDU guard → every frame counted as `port_disabled` (once per burst)
//!     │ port security (ports with `security`) → counted drop
//!     │ link-local 01:80:C2:00:00:0X (multicast branch only) → counted drop, unless the
//!     │   port's `link_local_forward` relays it; a BPDU on a `bpdu_guard` port disables it
//!     │ learn (MAC, VLAN) → ingress ; look up destination → port | flood (same VLAN)
//!     │ storm control (ports with `storm`): broadcast, multicast, unknown unicast
//!     ▼
//!  tx_burst once per destination, in arrival order, each frame tagged or untagged as the
//!  destination carries its VLAN ; counters added once per burst
//! ```
//!
//! # VLANs
//! A port has an access (native) VLAN, `vlan` (none configured: 0, the untagged domain),
//! and may carry more VLANs tagged, `vlans` (a trunk; [`crate::policy::PortPolicy`]). A
//! trunk without `vlan` has no native VLAN.
//!
//! | frame received | on an access port in VLAN *n* | on a trunk carrying *T*, native *n* | on a trunk carrying *T*, no native |
//! |---|---|---|---|
//! | untagged | VLAN *n* | VLAN *n* | dropped, `vlan_not_allowed` |
//! | tagged *v*, *v* ∈ *T* | dropped, `vlan_tagged` | VLAN *v* | VLAN *v* |
//! | tagged *v*, *v* ∉ *T* | dropped, `vlan_tagged` | dropped, `vlan_not_allowed` | dropped, `vlan_not_allowed` |
//!
//! | a frame of VLAN *v* leaves a port … | |
//! |---|---|
//! | whose native VLAN is *v* | untagged |
//! | that carries *v* tagged | tagged *v* (the priority bits of a received tag kept) |
//! | neither | never (not a flood member; a stale fdb entry there floods instead) |
//!
//! Learning, flooding, storm control and (in the ports) QoS and RSS see the frame's VLAN and
//! its inner frame; the fdb is keyed by (MAC, VLAN). Tags are pushed and popped in place, in
//! the rx buffer, between the `tx_burst` calls of different destinations (every port copies
//! the bytes out during `tx_burst`): ports that carry no tagged VLAN are served first, then
//! the trunks, so a frame flooded to both is re-encoded at most once or twice.
//! A tag is pushed by moving the frame's tail 4 bytes on in the buffer, so the virtio-net
//! header headroom in front of the frame stays whole (see [`crate::packet`]); a frame that
//! would not fit tagged is dropped at that destination as `oversize`.
//!
//! Cost: a switch with no trunk and an ingress port with no policy runs the plain path,
//! decided once per burst; VLAN handling, security and storm control are per frame only
//! where configured.
//!
//! Time comes in as `now`; the engine never reads a clock and never blocks. A worker thread
//! ([`crate::worker`]) runs it in a loop on the real clock; [`crate::Switch::poll_once`] runs
//! every worker's engine once on the caller's thread, on a clock the caller sets, so tests
//! drive the whole switch deterministically.
//!
//! # Batch semantics
//! Every frame of a burst is classified and learned before any frame of it is transmitted, so
//! a burst that carries a station's first frame and a reply to it is switched as if the
//! address had been known. Frames to one destination leave in one `tx_burst`, in arrival
//! order; a flood goes to each member of the VLAN in table order (with trunks in the switch:
//! the ports that take it untagged first), never back to the ingress port. Frames of one rx
//! queue are never reordered; no frame is ever handed to another thread.
//!
//! # Performance notes
//! No allocation, no lock and no dynamic dispatch per frame: the burst and the
//! per-destination index lists are the forwarder's own and reused; ports are dispatched with
//! one `match` per burst ([`crate::port::Device`]); a one-entry cache in front of the fdb
//! catches runs of frames between the same stations.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::fdb::{Fdb, REFRESH_NS};
use crate::ids::PortId;
use crate::link_local;
use crate::packet::{Burst, BURST};
use crate::pipeline::classify::{classify, untagged};
use crate::pipeline::link_local::Step;
use crate::pipeline::vlan::{self, FrameVlan};
use crate::pipeline::{self as stage, NoTrace, Tracer};
use crate::policy::{Egress, Policy};
use crate::port::{Port, RxLearn};
use crate::stats::{DropReason, DropTally};
use crate::table::{PortEntry, PortTable, QueueList, Shared, WorkerShared};
use qswitch_wire::MacAddr;

/// What a worker switches against: the port table, its own rx queues and the flood domains,
/// all from one epoch of the switch.
pub struct View {
    pub(crate) table: Arc<PortTable>,
    pub(crate) queues: Arc<QueueList>,
    /// Each port's policy, indexed by port id, as of this view.
    policies: Vec<Option<Arc<Policy>>>,
    /// Whether some port carries tagged VLANs or has no native VLAN: then every burst takes
    /// the VLAN-aware path (frames may need a tag pushed or popped on the way out).
    vlan_aware: bool,
    /// Flood domains: (vlan, member port ids in table order), sorted by VLAN.
    floods: Vec<(u16, Vec<PortId>)>,
    /// Flow export: what the workers offer forwarded frames to (none: export off).
    export: Option<Arc<crate::export::ExportTap>>,
    /// The switch's firewall (stages `firewall_in`, `firewall_out`).
    pub(crate) firewall: Arc<crate::firewall::Firewall>,
}

impl View {
    /// A view of `table` for a worker that polls `queues`.
    pub fn new(table: Arc<PortTable>, queues: Arc<QueueList>) -> View {
        let mut domains: std::collections::BTreeMap<u16, Vec<PortId>> = Default::default();
        let mut policies = Vec::with_capacity(table.len());
        let mut vlan_aware = false;
        for slot in table.iter() {
            let Some(p) = slot else {
                policies.push(None);
                continue;
            };
            let pol = p.policy.load_full();
            vlan_aware |= pol.trunk || pol.native.is_none();
            if p.mirror.is_output() {
                // A mirror session's output receives its copies only (see `crate::mirror`).
                policies.push(Some(pol));
                continue;
            }
            if let Some(v) = pol.native {
                domains.entry(v).or_default().push(p.id);
            }
            if pol.trunk {
                for v in pol.settings.vlans.iter() {
                    if pol.native != Some(v) {
                        domains.entry(v).or_default().push(p.id);
                    }
                }
            }
            policies.push(Some(pol));
        }
        View {
            table,
            queues,
            policies,
            vlan_aware,
            floods: domains.into_iter().collect(),
            export: None,
            // A view made without a switch filters nothing (no zones; a switch's workers get
            // its firewall with `with_firewall`).
            firewall: Arc::new(crate::firewall::Firewall::for_switch(None, 0)),
        }
    }

    /// This view with the switch's firewall.
    pub(crate) fn with_firewall(mut self, firewall: Arc<crate::firewall::Firewall>) -> View {
        self.firewall = firewall;
        self
    }

    /// The policy of port `p`.
    #[inline]
    pub(crate) fn policy(&self, p: PortId) -> Option<&Policy> {
        self.policies.get(usize::from(p.0))?.as_deref()
    }

    /// Whether some port carries tagged VLANs or has no native VLAN (the VLAN-aware path).
    #[inline]
    pub(crate) fn vlan_aware(&self) -> bool {
        self.vlan_aware
    }

    /// The members of VLAN `vlan`'s flood domain.
    #[inline]
    fn flood(&self, vlan: u16) -> &[PortId] {
        match self.floods.binary_search_by_key(&vlan, |(v, _)| *v) {
            Ok(i) => &self.floods[i].1,
            Err(_) => &[],
        }
    }

    /// The switch's current table and `me`'s current queues.
    pub(crate) fn load(shared: &Shared, me: &WorkerShared) -> View {
        let mut v = View::new(shared.ports.load_full(), me.queues.load_full())
            .with_firewall(shared.firewall.clone());
        v.export = shared.export.load_full();
        v
    }

    /// The rx queues this view polls, in order.
    pub fn queues(&self) -> &QueueList {
        &self.queues
    }
}

/// The per-worker forwarding state: the burst buffers, the per-destination lists and the
/// fdb cache. One per worker; it is not shared.
pub struct Forwarder {
    /// The worker it transmits as (ports keep per-worker tx state).
    worker: usize,
    burst: Burst,
    /// Per destination port (indexed by port id): indices into the burst.
    out: Vec<Vec<u8>>,
    touched: Vec<PortId>,
    /// Stages `learn` and `lookup`: one-entry caches in front of the fdb.
    cache: FdbCache,
    /// VLAN-aware path: each frame's VLAN, the TCI to push, and whether its buffer holds
    /// it tagged now.
    meta: [FrameVlan; BURST],
    /// What the ingress lets the switch learn from this burst's frames (see
    /// [`Port::rx_learn`]), and which frames reached learning (bit per frame).
    rx_learn: RxLearn,
    accepted: u32,
    /// Whether this burst's learning is limited or reported (`rx_learn` is not
    /// [`RxLearn::ALL`]): decided once per burst, so the ports that need no proof (all but
    /// VXLAN) learn on the plain path.
    gated: bool,
    /// Frames of this burst that the ingress port's egress firewall allowed (set by the
    /// policy path of a filtered port, added to its rx queue's `fw_allowed` once per burst).
    fw_allowed: u32,
    /// What the ingress port's firewall found for each frame of this burst, for the
    /// destinations' firewall (valid while `fw_seen_on`: the ingress is filtered).
    fw_seen: [crate::firewall::Seen; BURST],
    /// This worker's verdict cache of established UDP connections (`firewall_in`).
    fw_cache: crate::firewall::VerdictCache,
    fw_seen_on: bool,
}

/// One-entry caches in front of the fdb.
#[derive(Default)]
struct FdbCache {
    learned: Option<(MacAddr, u16, PortId, u64)>,
    looked_up: Option<(MacAddr, u16, Option<PortId>, u64, u64)>,
}

impl Forwarder {
    /// A forwarder that transmits as worker `worker`.
    pub fn new(worker: usize) -> Forwarder {
        Forwarder {
            worker,
            burst: Burst::new(),
            out: Vec::new(),
            touched: Vec::with_capacity(BURST),
            cache: FdbCache::default(),
            meta: [FrameVlan::default(); BURST],
            rx_learn: RxLearn::ALL,
            accepted: 0,
            gated: false,
            fw_allowed: 0,
            fw_seen: [crate::firewall::Seen::NONE; BURST],
            fw_cache: crate::firewall::VerdictCache::default(),
            fw_seen_on: false,
        }
    }

    /// Must be called when the worker moves to a new view, before it polls with it.
    pub fn set_view(&mut self, view: &View) {
        self.out
            .resize_with(view.table.len(), || Vec::with_capacity(BURST));
        self.cache = FdbCache::default();
    }

    /// One rx burst from `queue` of `entry`, switched to completion. Returns frames received.
    pub fn poll(
        &mut self,
        view: &View,
        fdb: &Fdb,
        entry: &PortEntry,
        queue: u16,
        now: u64,
    ) -> usize {
        let mut drops = DropTally::default();
        // QoS: a port out of tokens is not polled (back-pressure, no drop).
        let budget = entry.qos.rx_budget(queue, now, BURST);
        if budget == 0 {
            return 0;
        }
        let n = entry
            .dev
            .rx_burst(queue, &mut self.burst.pkts[..budget], now, &mut drops);
        entry.qos.charge(queue, &self.burst.pkts[..n]);
        if entry.capture.on() {
            entry.capture.rx(queue, &self.burst.pkts[..n], now);
        }
        // Mirror sessions: copies of a source's frames; an output port's frames are dropped.
        if entry.mirror.on() && !stage::mirror::rx(entry, queue, &self.burst.pkts[..n], &mut drops)
        {
            return n;
        }
        // Learning permissions: all, except from ports whose frames need proof (VXLAN).
        let rx_learn = entry.dev.rx_learn(queue);
        if rx_learn == RxLearn::ALL {
            self.switch_burst(view, fdb, entry, queue, n, now, &mut drops);
            return n;
        }
        self.rx_learn = rx_learn;
        self.gated = true;
        self.switch_burst(view, fdb, entry, queue, n, now, &mut drops);
        if self.rx_learn.report {
            entry.dev.rx_accepted(queue, self.accepted);
        }
        self.rx_learn = RxLearn::ALL;
        self.gated = false;
        self.accepted = 0;
        n
    }

    /// Switches the first `n` frames of the burst, received on `queue` of `ingress`: learn,
    /// look up, flood within the VLAN, transmit once per destination, count. `drops` holds
    /// what the port already dropped during rx (by reference: a tally is larger than what
    /// the compiler copies inline).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn switch_burst(
        &mut self,
        view: &View,
        fdb: &Fdb,
        ingress: &PortEntry,
        queue: u16,
        n: usize,
        now: u64,
        drops: &mut DropTally,
    ) {
        let qc = &ingress.counters.rx[usize::from(queue)];
        if n == 0 {
            drops.flush(&qc.drops);
            return;
        }
        if ingress.disabled.get() {
            // BPDU guard: drained, nothing switched.
            return self.drain_disabled(ingress, queue, n, drops);
        }
        let rx_bytes = self.decide(view, fdb, ingress, n, now, drops, &mut NoTrace);
        qc.rx_packets.add(n as u64);
        qc.rx_bytes.add(rx_bytes);
        drops.flush(&qc.drops);
        if self.fw_allowed != 0 {
            qc.fw_allowed
                .add(u64::from(std::mem::take(&mut self.fw_allowed)));
        }
        if let Some(x) = view.export.as_deref() {
            let (meta, vlan_aware, vlan) = (&self.meta, view.vlan_aware, ingress.vlan);
            let vlan_of = |i: usize| if vlan_aware { meta[i].vlan } else { vlan };
            let (pkts, w) = (&self.burst.pkts, self.worker);
            x.offer(w, pkts, &self.touched, &self.out, ingress.id, vlan_of, now);
        }
        if view.vlan_aware {
            self.transmit_vlans(view, now);
        } else {
            self.transmit(view, now);
        }
    }

    /// The ingress stages of the first `n` frames of the burst from `ingress`, up to their
    /// destinations (in the per-destination lists [`Forwarder::transmit`] sends). Returns
    /// their bytes. Forwarding passes [`NoTrace`]; `trace` a recorder, with one frame.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(crate) fn decide<T: Tracer>(
        &mut self,
        view: &View,
        fdb: &Fdb,
        ingress: &PortEntry,
        n: usize,
        now: u64,
        drops: &mut DropTally,
        t: &mut T,
    ) -> u64 {
        // Decided once per burst: the plain path unless VLANs or the port's policy need more.
        let pol = view.policy(ingress.id).filter(|p| {
            view.vlan_aware || p.active() || view.firewall.filtered(ingress.id.0.into())
        });
        self.fw_seen_on = false;
        match pol {
            None => self.decide_plain(view, fdb, ingress, n, now, drops, t),
            Some(pol) => self.decide_policy(view, fdb, ingress, pol, n, now, drops, t),
        }
    }

    /// The plain path: every port an access port, no policy on the ingress. Returns bytes.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn decide_plain<T: Tracer>(
        &mut self,
        view: &View,
        fdb: &Fdb,
        ingress: &PortEntry,
        n: usize,
        now: u64,
        drops: &mut DropTally,
        t: &mut T,
    ) -> u64 {
        let id = ingress.id;
        let vlan = ingress.vlan;
        let mut rx_bytes = 0u64;
        for i in 0..n {
            let frame = self.burst.pkts[i].frame();
            rx_bytes += frame.len() as u64;
            let Some((dmac, smac)) = untagged(frame, vlan, drops, t) else {
                continue;
            };
            // Learning after the link-local test, which only multicast frames pay.
            let dst = if dmac.is_multicast() {
                if let Some(g) = link_local::group(dmac) {
                    let pol = view.policy(id);
                    match stage::link_local::step(pol, ingress, g, frame, now, drops, t) {
                        Step::Relay => {}
                        Step::Dropped => continue,
                        Step::Disabled => {
                            rx_bytes += self.drop_rest(i + 1, n, drops);
                            break;
                        }
                    }
                }
                self.learn(fdb, smac, vlan, id, now, i, t);
                if T::ON {
                    t.multicast(dmac);
                }
                None
            } else {
                self.learn(fdb, smac, vlan, id, now, i, t);
                self.lookup(fdb, dmac, vlan, now, t)
            };
            match dst {
                Some(p) if p == id => drops.count(DropReason::SamePort),
                Some(p)
                    if view
                        .table
                        .get(usize::from(p.0))
                        .is_some_and(|e| e.is_some()) =>
                {
                    if T::ON {
                        t.unicast(p, false);
                    }
                    self.push_out(p, i)
                }
                other => {
                    if let (true, Some(p)) = (T::ON, other) {
                        t.unusable(p, vlan);
                    }
                    self.flood(view, id, vlan, i, drops, t)
                }
            }
        }
        rx_bytes
    }

    /// The VLAN-aware path with the ingress port's policy: trunk ingress, port security,
    /// storm control. Records each frame's VLAN for [`Forwarder::transmit_vlans`].
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn decide_policy<T: Tracer>(
        &mut self,
        view: &View,
        fdb: &Fdb,
        ingress: &PortEntry,
        pol: &Policy,
        n: usize,
        now: u64,
        drops: &mut DropTally,
        t: &mut T,
    ) -> u64 {
        let id = ingress.id;
        let fw = view
            .firewall
            .filtered(id.0.into())
            .then_some(&*view.firewall);
        let mut rx_bytes = 0u64;
        let mut fw_allowed = 0u32;
        self.fw_seen_on = fw.is_some();
        if let Some(fw) = fw {
            self.fw_cache.begin(fw);
            let pkts = &self.burst.pkts;
            let out = qswitch_api::config::RuleDirection::Egress;
            let zone = u32::from(id.0);
            fw.prefetch_cached(&mut self.fw_cache, zone, out, n, |i| pkts[i].frame());
        }
        for i in 0..n {
            let frame = self.burst.pkts[i].frame();
            rx_bytes += frame.len() as u64;
            let Some(l2) = classify(frame, drops, t) else {
                continue;
            };
            let fv = match vlan::ingress(pol, &l2, frame, t) {
                Ok(fv) => fv,
                Err(r) => {
                    drops.count(r);
                    continue;
                }
            };
            let vlan = fv.vlan;
            if pol.secure {
                if let Some(r) = stage::security::check(pol, frame, t) {
                    drops.count(r);
                    continue;
                }
            }
            if let Some(fw) = fw {
                let out = qswitch_api::config::RuleDirection::Egress;
                let seen = &mut self.fw_seen[i];
                let cache = &mut self.fw_cache;
                let at = (frame, i);
                if let Some(r) = stage::firewall::check(fw, id, out, at, now, t, seen, cache) {
                    drops.count(r);
                    continue;
                }
                fw_allowed += 1;
            }
            let dst = if l2.dst.is_multicast() {
                if let Some(g) = link_local::group(l2.dst) {
                    match stage::link_local::step(Some(pol), ingress, g, frame, now, drops, t) {
                        Step::Relay => {}
                        Step::Dropped => continue,
                        Step::Disabled => {
                            rx_bytes += self.drop_rest(i + 1, n, drops);
                            break;
                        }
                    }
                }
                self.meta[i] = fv;
                self.learn(fdb, l2.src, vlan, id, now, i, t);
                if T::ON {
                    t.multicast(l2.dst);
                }
                None
            } else {
                self.meta[i] = fv;
                self.learn(fdb, l2.src, vlan, id, now, i, t);
                self.lookup(fdb, l2.dst, vlan, now, t)
            };
            match dst {
                Some(p) if p == id => drops.count(DropReason::SamePort),
                Some(p) if view.policy(p).is_some_and(|d| d.egress(vlan) != Egress::No) => {
                    if T::ON {
                        t.unicast(p, pol.storm);
                    }
                    self.push_out(p, i)
                }
                other => {
                    if let (true, Some(p)) = (T::ON, other) {
                        t.unusable(p, vlan);
                    }
                    if pol.storm {
                        if let Err(r) = stage::storm::admit(pol, l2.dst, now, t) {
                            drops.count(r);
                            continue;
                        }
                    }
                    self.flood(view, id, vlan, i, drops, t)
                }
            }
        }
        // A dry run (trace) counts nothing.
        if !T::ON {
            self.fw_allowed = fw_allowed;
        }
        rx_bytes
    }

    /// Frame `i` to every member of `vlan` but the ingress.
    #[inline]
    fn flood<T: Tracer>(
        &mut self,
        view: &View,
        id: PortId,
        vlan: u16,
        i: usize,
        drops: &mut DropTally,
        t: &mut T,
    ) {
        if T::ON {
            t.flood(vlan);
        }
        let mut sent = false;
        for &p in view.flood(vlan) {
            if p != id {
                self.push_out(p, i);
                sent = true;
            }
        }
        if !sent {
            drops.count(DropReason::NoDestination);
        }
    }

    /// One `tx_burst` per destination, frames as they are.
    #[inline]
    fn transmit(&mut self, view: &View, now: u64) {
        let w = self.worker;
        for p in self.touched.drain(..) {
            let sel = &mut self.out[usize::from(p.0)];
            if let Some(Some(dst)) = view.table.get(usize::from(p.0)) {
                let mut td = DropTally::default();
                let tc = &dst.counters.tx[w];
                if dst.disabled.get() {
                    td.count_n(DropReason::PortDisabled, sel.len() as u32);
                } else {
                    if view.firewall.filtered(p.0.into()) {
                        let pkts = &self.burst.pkts;
                        let a = &tc.fw_allowed;
                        let seen = self.fw_seen_on.then_some(&self.fw_seen);
                        let fw = &view.firewall;
                        stage::firewall::filter_out(fw, p, pkts, sel, seen, now, &mut td, a);
                    }
                    if dst.capture.on() {
                        dst.capture.tx(w, &self.burst.pkts, sel, now);
                    }
                    if dst.mirror.on() {
                        stage::mirror::tx(dst, &self.burst.pkts, sel);
                    }
                    let done = dst.dev.tx_burst(w, &mut self.burst.pkts, sel, &mut td);
                    tc.tx_packets.add(u64::from(done.packets));
                    tc.tx_bytes.add(done.bytes);
                }
                td.flush(&tc.drops);
            }
            sel.clear();
        }
    }

    /// One `tx_burst` per destination, each frame first tagged or untagged in place as that
    /// destination carries its VLAN. Destinations that take frames untagged go first.
    #[inline(never)]
    fn transmit_vlans(&mut self, view: &View, now: u64) {
        let w = self.worker;
        let touched = std::mem::take(&mut self.touched);
        // Two passes over the destinations (no sort: that could allocate): first the ports
        // that carry no tagged VLAN, then the trunks.
        for trunks in [false, true] {
            for &p in &touched {
                let Some(dpol) = view.policy(p) else { continue };
                if dpol.trunk != trunks {
                    continue;
                }
                let sel = &mut self.out[usize::from(p.0)];
                if let Some(Some(dst)) = view.table.get(usize::from(p.0)) {
                    let mut td = DropTally::default();
                    if dst.disabled.get() {
                        td.count_n(DropReason::PortDisabled, sel.len() as u32);
                        td.flush(&dst.counters.tx[w].drops);
                        sel.clear();
                        continue;
                    }
                    let pkts = &mut self.burst.pkts;
                    let meta = &mut self.meta;
                    sel.retain(|&i| {
                        let m = &mut meta[usize::from(i)];
                        let pkt = &mut pkts[usize::from(i)];
                        match vlan::tag(pkt, m, dpol.egress(m.vlan)) {
                            Ok(()) => true,
                            Err(r) => {
                                td.count(r);
                                false
                            }
                        }
                    });
                    let tc = &dst.counters.tx[w];
                    if view.firewall.filtered(p.0.into()) {
                        let a = &tc.fw_allowed;
                        let seen = self.fw_seen_on.then_some(&self.fw_seen);
                        let fw = &view.firewall;
                        stage::firewall::filter_out(fw, p, pkts, sel, seen, now, &mut td, a);
                    }
                    if dst.capture.on() {
                        dst.capture.tx(w, pkts, sel, now);
                    }
                    if dst.mirror.on() {
                        stage::mirror::tx(dst, pkts, sel);
                    }
                    let done = dst.dev.tx_burst(w, pkts, sel, &mut td);
                    tc.tx_packets.add(u64::from(done.packets));
                    tc.tx_bytes.add(done.bytes);
                    td.flush(&tc.drops);
                }
                sel.clear();
            }
        }
        // Every list is empty again (a destination missing from the view was skipped above).
        for &p in &touched {
            self.out[usize::from(p.0)].clear();
        }
        self.touched = touched;
        self.touched.clear();
    }

    /// A burst from a port that BPDU guard disabled: counted as received and dropped.
    #[cold]
    #[inline(never)]
    fn drain_disabled(&mut self, ingress: &PortEntry, queue: u16, n: usize, drops: &mut DropTally) {
        let qc = &ingress.counters.rx[usize::from(queue)];
        let bytes = self.drop_rest(0, n, drops);
        qc.rx_packets.add(n as u64);
        qc.rx_bytes.add(bytes);
        drops.flush(&qc.drops);
    }

    /// Frames `from..n` of the burst dropped because their port was just disabled. Returns
    /// their bytes.
    #[cold]
    fn drop_rest(&self, from: usize, n: usize, drops: &mut DropTally) -> u64 {
        let rest = &self.burst.pkts[from.min(n)..n];
        drops.count_n(DropReason::PortDisabled, rest.len() as u32);
        rest.iter().map(|p| p.frame().len() as u64).sum()
    }

    #[inline]
    fn push_out(&mut self, p: PortId, i: usize) {
        let sel = &mut self.out[usize::from(p.0)];
        if sel.is_empty() {
            self.touched.push(p);
        }
        sel.push(i as u8);
    }

    /// Stage `learn`: the source (MAC, VLAN) of frame `i` on the ingress, as far as the
    /// ingress allows ([`Port::rx_learn`]: a VXLAN port's frames from VTEPs not yet
    /// proven), behind a one-entry cache. A tracer is told instead (a dry run).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn learn<T: Tracer>(
        &mut self,
        fdb: &Fdb,
        mac: MacAddr,
        vlan: u16,
        port: PortId,
        now: u64,
        i: usize,
        t: &mut T,
    ) {
        if T::ON {
            return t.learn(fdb, mac, vlan, port, now);
        }
        if self.gated {
            return self.learn_gated(fdb, mac, vlan, port, now, i);
        }
        if let Some((m, v, p, t)) = self.cache.learned {
            if m == mac && v == vlan && p == port && now.saturating_sub(t) < REFRESH_NS {
                return;
            }
        }
        fdb.learn(mac, vlan, port, now);
        self.cache.learned = Some((mac, vlan, port, now));
    }

    /// [`Forwarder::learn`] for a burst whose ingress limits what may be learned or wants to
    /// know which frames were (a VXLAN port: frames from unproven VTEPs).
    #[inline(never)]
    fn learn_gated(
        &mut self,
        fdb: &Fdb,
        mac: MacAddr,
        vlan: u16,
        port: PortId,
        now: u64,
        i: usize,
    ) {
        let bit = 1u32 << i;
        if self.rx_learn.learn & bit == 0 {
            return;
        }
        if let Some((m, v, p, t)) = self.cache.learned {
            if m == mac && v == vlan && p == port && now.saturating_sub(t) < REFRESH_NS {
                self.accepted |= bit;
                return;
            }
        }
        let learned = if self.rx_learn.moves & bit != 0 {
            fdb.learn(mac, vlan, port, now)
        } else {
            fdb.learn_unproven(mac, vlan, port, now)
        };
        if learned != crate::fdb::Learn::Held {
            self.cache.learned = Some((mac, vlan, port, now));
            self.accepted |= bit;
        }
    }

    /// Stage `lookup`: where `mac` in `vlan` is known, behind a one-entry cache that holds
    /// the fdb's generation (a flush or move is seen at once). A tracer is asked instead.
    #[inline]
    fn lookup<T: Tracer>(
        &mut self,
        fdb: &Fdb,
        mac: MacAddr,
        vlan: u16,
        now: u64,
        t: &mut T,
    ) -> Option<PortId> {
        if T::ON {
            return t.lookup(fdb, mac, vlan, now);
        }
        let generation = fdb.generation();
        if let Some((m, v, p, g, t)) = self.cache.looked_up {
            if m == mac && v == vlan && g == generation && now.saturating_sub(t) < REFRESH_NS {
                return p;
            }
        }
        let p = fdb.lookup(mac, vlan, now);
        self.cache.looked_up = Some((mac, vlan, p, generation, now));
        p
    }

    /// Loads `frame` as the burst's only frame (for `trace`).
    pub(crate) fn load_frame(&mut self, frame: &[u8]) {
        self.burst.pkts[0].fill(frame);
    }

    /// The destinations the last decision chose, in the order [`Forwarder::transmit`] and
    /// [`Forwarder::transmit_vlans`] serve them (with trunks in the switch: the ports that
    /// carry no tagged VLAN first), for `trace`. Clears the lists.
    pub(crate) fn take_destinations(&mut self, view: &View) -> Vec<PortId> {
        let mut out = std::mem::take(&mut self.touched);
        if view.vlan_aware {
            out.sort_by_key(|p| view.policy(*p).is_some_and(|d| d.trunk));
        }
        for p in &out {
            self.out[usize::from(p.0)].clear();
        }
        out
    }
}

/// A worker without a thread: its engine, stepped by [`crate::Switch::poll_once`].
pub(crate) struct ManualWorker {
    me: Arc<WorkerShared>,
    fwd: Forwarder,
    view: Option<View>,
    epoch: u64,
}

impl ManualWorker {
    pub(crate) fn new(me: Arc<WorkerShared>) -> ManualWorker {
        ManualWorker {
            fwd: Forwarder::new(me.id.0),
            me,
            view: None,
            epoch: u64::MAX,
        }
    }

    /// Moves to the switch's current epoch, as a worker thread does between bursts.
    pub(crate) fn sync(&mut self, shared: &Shared) {
        let e = shared.epoch();
        if e != self.epoch {
            let view = View::load(shared, &self.me);
            self.fwd.set_view(&view);
            self.view = Some(view);
            self.epoch = e;
            self.me.seen_epoch.store(e, Ordering::Release);
        }
    }

    /// Lets go of its view (at shutdown, so the ports close).
    pub(crate) fn clear(&mut self) {
        self.view = None;
        self.epoch = u64::MAX;
    }

    /// Polls each of its queues once at `now`. Returns frames received.
    pub(crate) fn step(&mut self, shared: &Shared, now: u64) -> usize {
        self.sync(shared);
        let Some(v) = self.view.as_ref() else {
            return 0;
        };
        let mut moved = 0;
        for (entry, q) in v.queues.iter() {
            moved += self.fwd.poll(v, &shared.fdb, entry, *q, now);
        }
        moved
    }
}
