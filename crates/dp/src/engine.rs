//! The forwarding engine: one rx burst switched to completion, with no threads and no clock.
//!
//! ```text
//!  Forwarder::poll(view, fdb, ingress, queue, now)
//!     │ QoS: rx_budget(queue, now) ── 0 → not polled (back-pressure, no drop)
//!     │ rx_burst (≤ budget frames into the forwarder's own buffers) ; charge the bucket
//!     ▼
//!  Forwarder::switch_burst(view, fdb, ingress, queue, n, now)
//!     │ classify L2 ── runt / oversize / bad source / tagged → counted drop
//!     │ learn (MAC, VLAN) → ingress ; look up destination → port | flood (same VLAN)
//!     ▼
//!  tx_burst once per destination, in arrival order ; counters added once per burst
//! ```
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
//! order; a flood goes to each member of the VLAN in table order, never back to the ingress
//! port. Frames of one rx queue are never reordered; no frame is ever handed to another
//! thread.
//!
//! # Performance notes
//! No allocation, no lock and no dynamic dispatch per frame: the burst and the
//! per-destination index lists are the forwarder's own and reused; ports are dispatched with
//! one `match` per burst ([`crate::port::Device`]); a one-entry cache in front of the fdb
//! catches runs of frames between the same stations.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use qswitch_wire::l2::{self, L2Error};
use qswitch_wire::MacAddr;

use crate::fdb::{Fdb, REFRESH_NS};
use crate::ids::PortId;
use crate::packet::{Burst, BURST};
use crate::port::Port;
use crate::stats::{DropReason, DropTally};
use crate::table::{PortEntry, PortTable, QueueList, Shared, WorkerShared};

/// What a worker switches against: the port table, its own rx queues and the flood domains,
/// all from one epoch of the switch.
pub struct View {
    pub(crate) table: Arc<PortTable>,
    pub(crate) queues: Arc<QueueList>,
    /// Flood domains: (vlan, member port ids in table order).
    floods: Vec<(u16, Vec<PortId>)>,
}

impl View {
    /// A view of `table` for a worker that polls `queues`.
    pub fn new(table: Arc<PortTable>, queues: Arc<QueueList>) -> View {
        let mut floods: Vec<(u16, Vec<PortId>)> = Vec::new();
        for p in table.iter().flatten() {
            match floods.iter_mut().find(|(v, _)| *v == p.vlan) {
                Some((_, members)) => members.push(p.id),
                None => floods.push((p.vlan, vec![p.id])),
            }
        }
        View {
            table,
            queues,
            floods,
        }
    }

    /// The switch's current table and `me`'s current queues.
    pub(crate) fn load(shared: &Shared, me: &WorkerShared) -> View {
        View::new(shared.ports.load_full(), me.queues.load_full())
    }

    /// The rx queues this view polls, in order.
    pub fn queues(&self) -> &QueueList {
        &self.queues
    }
}

/// One-entry caches in front of the fdb.
#[derive(Default)]
struct FdbCache {
    learned: Option<(MacAddr, u16, PortId, u64)>,
    looked_up: Option<(MacAddr, u16, Option<PortId>, u64, u64)>,
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
    cache: FdbCache,
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
        self.switch_burst(view, fdb, entry, queue, n, now, drops);
        n
    }

    /// Switches the first `n` frames of the burst, received on `queue` of `ingress`: learn,
    /// look up, flood within the VLAN, transmit once per destination, count. `drops` holds
    /// what the port already dropped during rx.
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
        mut drops: DropTally,
    ) {
        let qc = &ingress.counters.rx[usize::from(queue)];
        if n == 0 {
            drops.flush(&qc.drops);
            return;
        }
        let id = ingress.id;
        let vlan = ingress.vlan;
        let mut rx_bytes = 0u64;
        for i in 0..n {
            let frame = self.burst.pkts[i].frame();
            rx_bytes += frame.len() as u64;
            let l2 = match l2::classify(frame) {
                Ok(l2) => l2,
                Err(L2Error::Runt) => {
                    drops.count(DropReason::Runt);
                    continue;
                }
                Err(L2Error::Oversize) => {
                    drops.count(DropReason::Oversize);
                    continue;
                }
                Err(L2Error::BadSrc) => {
                    drops.count(DropReason::BadSrcMac);
                    continue;
                }
            };
            if l2.vlan.is_some() {
                drops.count(DropReason::VlanTagged);
                continue;
            }
            self.learn(fdb, l2.src, vlan, id, now);
            let dst = if l2.dst.is_multicast() {
                None
            } else {
                self.lookup(fdb, l2.dst, vlan, now)
            };
            match dst {
                Some(p) if p == id => drops.count(DropReason::SamePort),
                Some(p)
                    if view
                        .table
                        .get(usize::from(p.0))
                        .is_some_and(|e| e.is_some()) =>
                {
                    self.push_out(p, i)
                }
                _ => {
                    let mut sent = false;
                    if let Some((_, members)) = view.floods.iter().find(|(fv, _)| *fv == vlan) {
                        for &p in members {
                            if p != id {
                                self.push_out(p, i);
                                sent = true;
                            }
                        }
                    }
                    if !sent {
                        drops.count(DropReason::NoDestination);
                    }
                }
            }
        }
        qc.rx_packets.add(n as u64);
        qc.rx_bytes.add(rx_bytes);
        drops.flush(&qc.drops);

        let w = self.worker;
        for p in self.touched.drain(..) {
            let sel = &mut self.out[usize::from(p.0)];
            if let Some(Some(dst)) = view.table.get(usize::from(p.0)) {
                let mut td = DropTally::default();
                if dst.capture.on() {
                    dst.capture.tx(w, &self.burst.pkts, sel, now);
                }
                let done = dst.dev.tx_burst(w, &mut self.burst.pkts, sel, &mut td);
                let tc = &dst.counters.tx[w];
                tc.tx_packets.add(u64::from(done.packets));
                tc.tx_bytes.add(done.bytes);
                td.flush(&tc.drops);
            }
            sel.clear();
        }
    }

    #[inline]
    fn push_out(&mut self, p: PortId, i: usize) {
        let sel = &mut self.out[usize::from(p.0)];
        if sel.is_empty() {
            self.touched.push(p);
        }
        sel.push(i as u8);
    }

    #[inline]
    fn learn(&mut self, fdb: &Fdb, mac: MacAddr, vlan: u16, port: PortId, now: u64) {
        if let Some((m, v, p, t)) = self.cache.learned {
            if m == mac && v == vlan && p == port && now.saturating_sub(t) < REFRESH_NS {
                return;
            }
        }
        fdb.learn(mac, vlan, port, now);
        self.cache.learned = Some((mac, vlan, port, now));
    }

    #[inline]
    fn lookup(&mut self, fdb: &Fdb, mac: MacAddr, vlan: u16, now: u64) -> Option<PortId> {
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
