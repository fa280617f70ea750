//! Workers: pinned poll-mode threads that run every frame to completion.
//!
//! ```text
//! loop {
//!     if the switch's epoch moved: reload the port table and my rx queues (re-arm epoll)
//!     for each rx queue I own:
//!         rx_burst (≤ 32 frames)
//!         classify + learn + look up, for the whole burst   → per-destination lists
//!         tx_burst to each destination, once per burst
//!         add counters, once per burst
//!     busy? → account busy time, go on polling
//!     idle for SPIN_NS? → sleep in epoll on my queues' fds and my wake eventfd
//! }
//! ```
//!
//! # Batch semantics
//! Every frame of a burst is classified and learned before any frame of it is transmitted, so
//! a burst that carries a station's first frame and a reply to it is switched as if the
//! address had been known. Frames to one destination leave in one `tx_burst`, in arrival
//! order; a flood goes to each member of the VLAN in table order. Frames of one rx queue are
//! never reordered; no frame is ever handed to another thread.
//!
//! # Adaptive polling
//! While frames flow the worker never sleeps (no wake-ups, no context switches). After
//! [`SPIN_NS`] without a frame it sleeps in `epoll_wait` on the fds of its queues (level
//! triggered, so a frame that arrived just before is not missed) and on its wake eventfd
//! (used by the control plane). Gen ports have no fd: their next due time bounds the sleep.
//! An idle switch therefore uses no CPU but a wake-up per [`MAX_SLEEP_MS`].

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use qswitch_sys::epoll::{Epoll, Event};
use qswitch_wire::l2::{self, L2Error};
use qswitch_wire::MacAddr;

use crate::fdb::REFRESH_NS;
use crate::ids::PortId;
use crate::packet::{Burst, BURST};
use crate::port::Port;
use crate::stats::{DropReason, DropTally};
use crate::switch::{PortEntry, PortTable, Shared, WorkerShared};

/// How long a worker keeps polling after its last frame before it sleeps, by default.
pub const SPIN_NS: u64 = 50_000;
/// Longest sleep, so housekeeping (epoch checks) happens even on a silent switch.
pub const MAX_SLEEP_MS: i32 = 1000;
const WAKE_TOKEN: u64 = u64::MAX;

/// Worker-local state rebuilt when the switch's epoch moves.
struct View {
    table: Arc<PortTable>,
    queues: Arc<Vec<(Arc<PortEntry>, u16)>>,
    /// Flood domains: (vlan, member port ids in table order).
    floods: Vec<(u16, Vec<PortId>)>,
    /// Fds registered in epoll, with the queue index they belong to.
    registered: Vec<(RawFd, usize)>,
}

/// One-entry caches in front of the fdb.
#[derive(Default)]
struct FdbCache {
    learned: Option<(MacAddr, u16, PortId, u64)>,
    looked_up: Option<(MacAddr, u16, Option<PortId>, u64, u64)>,
}

pub(crate) struct Worker {
    shared: Arc<Shared>,
    me: Arc<WorkerShared>,
    epoll: Epoll,
    burst: Burst,
    /// Per destination port (indexed by port id): indices into the burst.
    out: Vec<Vec<u8>>,
    touched: Vec<PortId>,
    cache: FdbCache,
    /// Fds of queues out of QoS tokens, taken out of epoll while the worker sleeps.
    parked: Vec<(RawFd, usize)>,
}

impl Worker {
    pub(crate) fn new(shared: Arc<Shared>, me: Arc<WorkerShared>) -> std::io::Result<Worker> {
        let epoll = Epoll::new()?;
        epoll.add(me.wake.as_raw_fd(), WAKE_TOKEN)?;
        Ok(Worker {
            shared,
            me,
            epoll,
            burst: Burst::new(),
            out: Vec::new(),
            touched: Vec::with_capacity(BURST),
            cache: FdbCache::default(),
            parked: Vec::new(),
        })
    }

    /// Runs until the switch stops.
    pub(crate) fn run(mut self) {
        let me = self.me.clone();
        let c = &me.counters;
        c.tid
            .store(qswitch_sys::thread::gettid(), Ordering::Relaxed);
        let mut view: Option<View> = None;
        let mut epoch = u64::MAX;
        let mut events = [Event::EMPTY; 16];
        let mut last = self.shared.now();
        let mut last_busy = last;
        let mut spin = Spin::new(self.shared.spin_ns, last);
        while !self.shared.stopping() {
            let e = self.shared.epoch();
            if e != epoch {
                view = Some(self.reload(view.take()));
                epoch = e;
                me.seen_epoch.store(e, Ordering::Release);
            }
            let Some(v) = view.as_mut() else { break };
            // Each burst's time is charged to its queue: the load dynamic placement balances.
            // The clock is read once per burst that moved frames, not per packet.
            let mut moved = 0;
            let mut t = last;
            for (entry, q) in v.queues.iter() {
                let n = self.poll(v, entry, *q, t);
                if n > 0 {
                    let t1 = self.shared.now();
                    entry.counters.rx[usize::from(*q)]
                        .busy_ns
                        .add(t1.saturating_sub(t));
                    t = t1;
                    moved += n;
                }
            }
            let now = if moved > 0 { t } else { self.shared.now() };
            if moved > 0 {
                c.busy_polls.add(1);
                c.busy_ns.add(now - last);
                last_busy = now;
            } else {
                c.idle_polls.add(1);
                c.idle_ns.add(now - last);
            }
            last = now;
            let window = spin.window(now);
            c.spin_ns.set(window);
            if now - last_busy < window {
                continue;
            }
            let Some(timeout) = sleep_timeout(v, now) else {
                continue;
            };
            self.forget_dead(v);
            c.sleeps.add(1);
            self.park_throttled(v);
            if let Ok(n) = self.epoll.wait(&mut events, timeout) {
                if events[..n].iter().any(|ev| ev.token() == WAKE_TOKEN) {
                    let _ = me.wake.drain();
                }
            }
            self.unpark();
            c.wakeups.add(1);
            last = self.shared.now();
            // Polls right after a wake-up get a fresh spin window.
            last_busy = last;
        }
    }

    /// Picks up the current port table and queue assignment, re-arming epoll for the fds.
    fn reload(&mut self, old: Option<View>) -> View {
        if let Some(old) = old {
            for (fd, _) in old.registered {
                let _ = self.epoll.delete(fd);
            }
        }
        let table = self.shared.ports.load_full();
        let queues = self.me.queues.load_full();
        let mut registered = Vec::new();
        for (i, (entry, q)) in queues.iter().enumerate() {
            if let Some(fd) = entry.dev.rx_fd(*q) {
                if self.epoll.add(fd, i as u64).is_ok() {
                    registered.push((fd, i));
                }
            }
        }
        let mut floods: Vec<(u16, Vec<PortId>)> = Vec::new();
        for p in table.iter().flatten() {
            match floods.iter_mut().find(|(v, _)| *v == p.vlan) {
                Some((_, members)) => members.push(p.id),
                None => floods.push((p.vlan, vec![p.id])),
            }
        }
        self.out
            .resize_with(table.len(), || Vec::with_capacity(BURST));
        self.cache = FdbCache::default();
        View {
            table,
            queues,
            floods,
            registered,
        }
    }

    /// Stops polling fds of queues that failed for good, so a deleted device cannot keep the
    /// worker awake.
    fn forget_dead(&self, v: &mut View) {
        let queues = &v.queues;
        v.registered.retain(|&(fd, i)| {
            let (entry, q) = &queues[i];
            if entry.dev.rx_dead(*q) {
                let _ = self.epoll.delete(fd);
                return false;
            }
            true
        });
    }

    /// Takes the fds of queues that are out of QoS tokens out of epoll for the sleep: they
    /// are woken by time (see [`sleep_timeout`]), not by their (readable) fd.
    fn park_throttled(&mut self, v: &View) {
        for &(fd, i) in &v.registered {
            if v.queues[i].0.qos.wait_ns().is_some() && self.epoll.delete(fd).is_ok() {
                self.parked.push((fd, i));
            }
        }
    }

    fn unpark(&mut self) {
        for (fd, i) in self.parked.drain(..) {
            let _ = self.epoll.add(fd, i as u64);
        }
    }

    /// One rx burst from `queue` of `entry`, switched to completion. Returns frames received.
    fn poll(&mut self, v: &View, entry: &PortEntry, queue: u16, now: u64) -> usize {
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
        let qc = &entry.counters.rx[usize::from(queue)];
        if n == 0 {
            drops.flush(&qc.drops);
            return 0;
        }
        let ingress = entry.id;
        let vlan = entry.vlan;
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
            self.learn(l2.src, vlan, ingress, now);
            let dst = if l2.dst.is_multicast() {
                None
            } else {
                self.lookup(l2.dst, vlan, now)
            };
            match dst {
                Some(p) if p == ingress => drops.count(DropReason::SamePort),
                Some(p) if v.table.get(usize::from(p.0)).is_some_and(|e| e.is_some()) => {
                    self.push_out(p, i)
                }
                _ => {
                    let mut sent = false;
                    if let Some((_, members)) = v.floods.iter().find(|(fv, _)| *fv == vlan) {
                        for &p in members {
                            if p != ingress {
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

        let w = self.me.id;
        for p in self.touched.drain(..) {
            let sel = &mut self.out[usize::from(p.0)];
            if let Some(Some(dst)) = v.table.get(usize::from(p.0)) {
                let mut td = DropTally::default();
                let done = dst.dev.tx_burst(w, &mut self.burst.pkts, sel, &mut td);
                let tc = &dst.counters.tx[w];
                tc.tx_packets.add(u64::from(done.packets));
                tc.tx_bytes.add(done.bytes);
                td.flush(&tc.drops);
            }
            sel.clear();
        }
        n
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
    fn learn(&mut self, mac: MacAddr, vlan: u16, port: PortId, now: u64) {
        if let Some((m, v, p, t)) = self.cache.learned {
            if m == mac && v == vlan && p == port && now.saturating_sub(t) < REFRESH_NS {
                return;
            }
        }
        self.shared.fdb.learn(mac, vlan, port, now);
        self.cache.learned = Some((mac, vlan, port, now));
    }

    #[inline]
    fn lookup(&mut self, mac: MacAddr, vlan: u16, now: u64) -> Option<PortId> {
        let generation = self.shared.fdb.generation();
        if let Some((m, v, p, g, t)) = self.cache.looked_up {
            if m == mac && v == vlan && g == generation && now.saturating_sub(t) < REFRESH_NS {
                return p;
            }
        }
        let p = self.shared.fdb.lookup(mac, vlan, now);
        self.cache.looked_up = Some((mac, vlan, p, generation, now));
        p
    }
}

/// The adaptive spin window: how long to keep polling after the last frame.
///
/// Busy-polling pays off when the worker has its CPU to itself; when other threads need
/// that CPU (the kernel's TCP stacks behind TAP ports on a small machine, say), every
/// microsecond spent spinning is taken from them. Every [`SPIN_ADJUST_NS`] the worker looks
/// at its own involuntary context switches: if it was preempted more than
/// [`SPIN_PREEMPT_LIMIT`] times, others are waiting for its CPU and the window halves (down
/// to [`SPIN_MIN_NS`]); if not, it doubles back up to the configured maximum. A few
/// preemptions per interval are the kernel's own housekeeping, not a competitor: halving on
/// those made a worker that had its CPU to itself sleep thousands of times a second, and a
/// guest on another CPU then paid a kick for each.
struct Spin {
    max: u64,
    window: u64,
    next_check: u64,
    preempted: u64,
}

/// Shortest adaptive spin window.
pub const SPIN_MIN_NS: u64 = 2_000;
/// Preemptions per [`SPIN_ADJUST_NS`] tolerated before the spin window shrinks (a thread
/// sharing the CPU under the kernel's fair scheduler preempts a spinning worker every few
/// milliseconds, dozens of times per interval).
pub const SPIN_PREEMPT_LIMIT: u64 = 4;
/// How often the spin window is adjusted.
pub const SPIN_ADJUST_NS: u64 = 100_000_000;

impl Spin {
    fn new(max: u64, now: u64) -> Spin {
        Spin {
            max,
            window: max,
            next_check: now + SPIN_ADJUST_NS,
            preempted: qswitch_sys::thread::own_involuntary_ctx_switches(),
        }
    }

    #[inline]
    fn window(&mut self, now: u64) -> u64 {
        if now >= self.next_check {
            self.next_check = now + SPIN_ADJUST_NS;
            let p = qswitch_sys::thread::own_involuntary_ctx_switches();
            self.window = if p > self.preempted + SPIN_PREEMPT_LIMIT {
                (self.window / 2).max(SPIN_MIN_NS.min(self.max))
            } else {
                (self.window * 2).clamp(SPIN_MIN_NS.min(self.max), self.max)
            };
            self.preempted = p;
        }
        self.window
    }
}

/// How long to sleep (ms), or None when some queue is due now. Arms every queue's wake-up
/// source first; a queue that got work meanwhile cancels the sleep.
fn sleep_timeout(v: &View, now: u64) -> Option<i32> {
    let mut timeout = MAX_SLEEP_MS;
    let mut ready = true;
    for (entry, q) in v.queues.iter() {
        // Out of QoS tokens: woken when the bucket refills, not by the queue.
        if let Some(ns) = entry.qos.wait_ns() {
            timeout = timeout.min(ns.div_ceil(1_000_000).clamp(1, MAX_SLEEP_MS as u64) as i32);
            continue;
        }
        ready &= entry.dev.rx_arm(*q);
    }
    if !ready {
        return None;
    }
    for (entry, q) in v.queues.iter() {
        if entry.qos.wait_ns().is_some() {
            continue;
        }
        if let Some(ns) = entry.dev.rx_due_in(*q, now) {
            if ns == 0 {
                return None;
            }
            timeout = timeout.min(ns.div_ceil(1_000_000).min(MAX_SLEEP_MS as u64) as i32);
        }
    }
    Some(timeout)
}

/// Entry point of a worker thread: pins it, runs it, and reports a panic instead of
/// unwinding silently.
pub(crate) fn spawn(
    shared: Arc<Shared>,
    me: Arc<WorkerShared>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let worker = Worker::new(shared.clone(), me.clone())?;
    std::thread::Builder::new()
        .name(format!("qs-worker-{}", me.id))
        .spawn(move || {
            if let Err(e) = qswitch_sys::thread::pin_current_thread(me.cpu) {
                tracing::warn!(worker = me.id, cpu = me.cpu, error = %e, "cannot pin worker");
            }
            tracing::debug!(worker = me.id, cpu = me.cpu, "worker started");
            let run = std::panic::AssertUnwindSafe(|| worker.run());
            if std::panic::catch_unwind(run).is_err() {
                tracing::error!(worker = me.id, "worker panicked; the switch stops");
                shared.request_stop();
            }
        })
}

/// Monotonic clock in nanoseconds since `base`.
#[inline]
pub(crate) fn clock_ns(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}
