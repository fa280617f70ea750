//! Workers: pinned poll-mode threads that run every frame to completion.
//!
//! ```text
//! loop {
//!     if the switch's epoch moved: reload the port table and my rx queues (re-arm epoll)
//!     for each rx queue I own:
//!         Forwarder::poll: rx_burst (≤ 32 frames), switch it, tx_burst per destination
//!     busy? → account busy time, go on polling
//!     idle for SPIN_NS? → sleep in epoll on my queues' fds and my wake eventfd
//! }
//! ```
//!
//! The switching itself (classify, learn, look up, flood, QoS admission, transmit, count)
//! is the thread-free engine's ([`crate::engine`]); this module is the loop around it.
//!
//! # Adaptive polling
//! While frames flow the worker never sleeps (no wake-ups, no context switches). After
//! [`SPIN_NS`] without a frame it sleeps in `epoll_wait` on the fds of its queues (level
//! triggered, so a frame that arrived just before is not missed) and on its wake eventfd
//! (used by the control plane). Gen ports have no fd: their next due time bounds the sleep.
//! An idle switch therefore uses no CPU but a wake-up per [`MAX_SLEEP_MS`], and none at all
//! while every queue the worker owns is dormant ([`Port::rx_dormant`]: vhost-user ports with
//! no frontend; the vhost-user event loop wakes the workers when a ring starts).
//!
//! # Wake-up fds that come later
//! A queue's fd ([`Port::rx_fd`]) is registered when the worker loads the port table. A
//! vhost-user port makes its kick epolls only at its first connection (an idle port holds
//! one descriptor), so a queue with no fd then is kept aside; the event loop flags the
//! workers (`WorkerShared::rx_fds_changed`) and wakes them once the fds exist, and before
//! its next sleep the worker registers them (one relaxed load per sleep, nothing per burst).
//! No kick is lost in between: the worker is awake until it registers, the kick epoll is
//! level-triggered, and `rx_arm` looks at the ring after enabling notifications.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use qswitch_sys::epoll::{Epoll, Event};

use crate::engine::{Forwarder, View};
use crate::port::Port;
use crate::table::{clock_ns, Shared, WorkerShared};

/// How long a worker keeps polling after its last frame before it sleeps, by default: the
/// config's default (`[switch] poll_spin_us`), declared once in `qswitch_api`.
pub const SPIN_NS: u64 = qswitch_api::value::PollSpinUs::DEFAULT.get() * 1_000;
/// Longest sleep, so housekeeping (epoch checks) happens even on a silent switch.
pub const MAX_SLEEP_MS: i32 = 1000;
const WAKE_TOKEN: u64 = u64::MAX;

/// Worker-local state rebuilt when the switch's epoch moves.
struct WorkerView {
    view: View,
    /// Fds registered in epoll, with the queue index they belong to.
    registered: Vec<(RawFd, usize)>,
    /// Queues whose port had no fd at the reload (see "Wake-up fds that come later").
    fdless: Vec<usize>,
}

pub(crate) struct Worker {
    shared: Arc<Shared>,
    me: Arc<WorkerShared>,
    /// The real clock's origin (workers exist only on the real clock).
    base: Instant,
    epoll: Epoll,
    fwd: Forwarder,
    /// Fds of queues out of QoS tokens, taken out of epoll while the worker sleeps.
    parked: Vec<(RawFd, usize)>,
}

impl Worker {
    pub(crate) fn new(
        shared: Arc<Shared>,
        me: Arc<WorkerShared>,
        base: Instant,
    ) -> std::io::Result<Worker> {
        let epoll = Epoll::new()?;
        epoll.add(me.wake.as_raw_fd(), WAKE_TOKEN)?;
        Ok(Worker {
            fwd: Forwarder::new(me.id.0),
            shared,
            me,
            base,
            epoll,
            parked: Vec::new(),
        })
    }

    #[inline]
    fn now(&self) -> u64 {
        clock_ns(self.base)
    }

    /// Runs until the switch stops.
    pub(crate) fn run(mut self) {
        let me = self.me.clone();
        let c = &me.counters;
        c.tid
            .store(qswitch_sys::thread::gettid(), Ordering::Relaxed);
        let mut view: Option<WorkerView> = None;
        let mut epoch = u64::MAX;
        let mut events = [Event::EMPTY; 16];
        let mut last = self.now();
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
            for (entry, q) in v.view.queues.iter() {
                let n = self.fwd.poll(&v.view, &self.shared.fdb, entry, *q, t);
                if n > 0 {
                    let t1 = self.now();
                    entry.counters.rx[usize::from(*q)]
                        .busy_ns
                        .add(t1.saturating_sub(t));
                    t = t1;
                    moved += n;
                }
            }
            let now = if moved > 0 { t } else { self.now() };
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
            if me.rx_fds_changed.load(Ordering::Relaxed)
                && me.rx_fds_changed.swap(false, Ordering::AcqRel)
            {
                self.register_late(v);
            }
            let Some(timeout) = sleep_timeout(&v.view, now) else {
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
            last = self.now();
            // Polls right after a wake-up get a fresh spin window.
            last_busy = last;
        }
    }

    /// Picks up the current port table and queue assignment and brings epoll up to date.
    ///
    /// Only the differences cost a system call: a queue of the same port entry (the same
    /// `Arc`, so the same device and fd) that stays on this worker keeps its registration;
    /// queues that left are deleted while the old view still holds their device open, and
    /// new ones are added. With a thousand ports on one worker, re-arming them all made
    /// every `port add` pay a thousand `epoll_ctl` pairs. The event token of a queue fd is
    /// its index at registration; the loop only tells it apart from [`WAKE_TOKEN`].
    fn reload(&mut self, old: Option<WorkerView>) -> WorkerView {
        let view = View::load(&self.shared, &self.me);
        let mut kept: HashMap<(usize, u16), RawFd> = HashMap::new();
        if let Some(old) = &old {
            for &(fd, i) in &old.registered {
                let (entry, q) = &old.view.queues[i];
                kept.insert((Arc::as_ptr(entry) as usize, *q), fd);
            }
        }
        let mut registered = Vec::new();
        let mut added = Vec::new();
        let mut fdless = Vec::new();
        for (i, (entry, q)) in view.queues.iter().enumerate() {
            match kept.remove(&(Arc::as_ptr(entry) as usize, *q)) {
                Some(fd) => registered.push((fd, i)),
                None => match entry.dev.rx_fd(*q) {
                    Some(fd) => added.push((fd, i)),
                    None => fdless.push(i),
                },
            }
        }
        // What is left belongs to queues this worker no longer polls. They go first: a new
        // entry may share its device (and fd) with one that left.
        for fd in kept.into_values() {
            let _ = self.epoll.delete(fd);
        }
        drop(old);
        for (fd, i) in added {
            if self.epoll.add(fd, i as u64).is_ok() {
                registered.push((fd, i));
            }
        }
        self.fwd.set_view(&view);
        WorkerView {
            view,
            registered,
            fdless,
        }
    }

    /// Registers the fds that queues with none at the reload have now (a vhost-user port's
    /// kick epoll, made at its first connection). Called awake, before arming and sleeping:
    /// a kick already pending makes the new fd readable at once (level-triggered).
    fn register_late(&self, v: &mut WorkerView) {
        let queues = &v.view.queues;
        let registered = &mut v.registered;
        v.fdless.retain(|&i| {
            let (entry, q) = &queues[i];
            let Some(fd) = entry.dev.rx_fd(*q) else {
                return true;
            };
            if self.epoll.add(fd, i as u64).is_ok() {
                registered.push((fd, i));
            }
            false
        });
    }

    /// Stops polling fds of queues that failed for good, so a deleted device cannot keep the
    /// worker awake.
    fn forget_dead(&self, v: &mut WorkerView) {
        let queues = &v.view.queues;
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
    fn park_throttled(&mut self, v: &WorkerView) {
        for &(fd, i) in &v.registered {
            if v.view.queues[i].0.qos.wait_ns().is_some() && self.epoll.delete(fd).is_ok() {
                self.parked.push((fd, i));
            }
        }
    }

    fn unpark(&mut self) {
        for (fd, i) in self.parked.drain(..) {
            let _ = self.epoll.add(fd, i as u64);
        }
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

/// How long to sleep (ms; -1: until woken), or None when some queue is due now. Arms every
/// queue's wake-up source first; a queue that got work meanwhile cancels the sleep. Dormant
/// queues ([`Port::rx_dormant`]: vhost-user ports with no frontend) are neither armed nor
/// counted: when every queue is dormant there is no timed wake-up at all.
fn sleep_timeout(v: &View, now: u64) -> Option<i32> {
    let mut timeout = MAX_SLEEP_MS;
    let mut ready = true;
    let mut live = false;
    for (entry, q) in v.queues().iter() {
        if entry.dev.rx_dormant(*q) {
            continue;
        }
        live = true;
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
    if !live {
        return Some(-1);
    }
    for (entry, q) in v.queues().iter() {
        if entry.qos.wait_ns().is_some() || entry.dev.rx_dormant(*q) {
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
