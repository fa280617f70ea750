//! The port table and the state the switch shares with its workers.
//!
//! Everything the engine, the workers, QoS and the control plane hand each other is declared
//! here, and this module imports none of them: `switch` builds on `engine` and `worker`,
//! which build on this, and no arrow points back.
//!
//! ```text
//!  switch ──▶ worker ──▶ engine ──▶ table ◀── qos::ops
//!     └──────────────────────────────▶ │ ──▶ qos (PortQos), fdb, port, stats
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::{Condvar, Mutex};
use qswitch_api::PortConfig;
use qswitch_sys::eventfd::EventFd;

use crate::fdb::Fdb;
use crate::ids::{CpuId, PortId, WorkerId};
use crate::policy::Policy;
use crate::port::Device;
use crate::qos;
use crate::stats::{PortCounters, WorkerCounters};

/// One port in the table.
#[derive(Debug)]
pub struct PortEntry {
    pub id: PortId,
    /// The keys fixed when the port was added. Those a live change sets (the policy keys and
    /// `qos`) are cleared here: they live in `policy` and `qos` only (see
    /// [`crate::Switch::port_configs`]).
    pub config: PortConfig,
    /// The port's access (native, untagged) VLAN; 0 = none configured. A trunk without one
    /// has no native VLAN (see [`crate::policy::Policy`]).
    pub vlan: u16,
    pub dev: Device,
    pub counters: PortCounters,
    /// QoS: allocation, token bucket, live settings (see [`crate::qos`]).
    pub qos: qos::PortQos,
    /// VLAN trunk, port security and storm control ([`crate::policy`]); changed live by
    /// [`crate::Switch::set_port_policy`], which republishes the table so that workers
    /// pick the new one up with their next view.
    pub policy: ArcSwap<Policy>,
    /// Packet capture hook (see [`crate::capture`]): off unless a capture runs.
    pub capture: crate::capture::PortCapture,
    /// Mirror sessions' hook (see [`crate::mirror`]): off unless the port is a session's
    /// source or output.
    pub mirror: PortMirror,
    /// Set by BPDU guard ([`crate::link_local`]): nothing is received from or sent to the
    /// port until it is enabled again.
    pub disabled: Disabled,
    /// The port's LLDP agent, when its `lldp` is `rx` or `both` ([`crate::lldp`]): fed by
    /// the link-local stage, aged and transmitting from the housekeeping thread.
    pub lldp: Option<crate::lldp::LldpAgent>,
}

/// Whether a port is disabled by BPDU guard. A worker sets it without blocking (one atomic
/// store) when it sees a BPDU; the engine reads it once per burst; the control side notes
/// it (logs it once) and clears it (`qswitch port enable`).
#[derive(Debug, Default)]
pub struct Disabled {
    state: AtomicU8,
    /// The switch's count of trips (`Shared::bpdu_trips`): housekeeping looks for the
    /// tripped port ([`Disabled::take_tripped`]) only when it moved since its last look, not
    /// through every port ten times a second.
    trips: Arc<AtomicU64>,
}

impl Disabled {
    const ENABLED: u8 = 0;
    /// Disabled, not logged yet.
    const TRIPPED: u8 = 1;
    /// Disabled and logged.
    const NOTED: u8 = 2;

    /// Whether the port is disabled.
    #[inline(always)]
    pub fn get(&self) -> bool {
        self.state.load(Ordering::Relaxed) != Self::ENABLED
    }

    /// Enabled, counting its trips in `trips` (the switch's).
    pub(crate) fn new(trips: Arc<AtomicU64>) -> Disabled {
        Disabled {
            state: AtomicU8::new(Self::ENABLED),
            trips,
        }
    }

    /// Disables the port (from a worker).
    pub fn trip(&self) {
        let tripped = self
            .state
            .compare_exchange(
                Self::ENABLED,
                Self::TRIPPED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok();
        if tripped {
            // Release: whoever sees the count moved also sees this port tripped.
            self.trips.fetch_add(1, Ordering::Release);
        }
    }

    /// Whether the port was disabled since the last call (so that it is logged once).
    pub fn take_tripped(&self) -> bool {
        self.state
            .compare_exchange(
                Self::TRIPPED,
                Self::NOTED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Enables the port. Returns whether it was disabled.
    pub fn clear(&self) -> bool {
        self.state.swap(Self::ENABLED, Ordering::Relaxed) != Self::ENABLED
    }
}

impl PortEntry {
    /// Rx queues the port has to poll: none for a gen port that only sinks.
    pub fn rx_queues(&self) -> u16 {
        match &self.dev {
            Device::Gen(g) if !g.generates() => 0,
            #[cfg(any(test, feature = "test-utils"))]
            Device::Inject(_) => 1,
            _ => self.config.queues,
        }
    }
}

/// Port table indexed by [`PortId`].
pub type PortTable = Vec<Option<Arc<PortEntry>>>;

/// The rx queues one worker polls: (port, queue), in polling order.
pub type QueueList = Vec<(Arc<PortEntry>, u16)>;

/// Where the switch's time comes from.
#[derive(Debug)]
pub(crate) enum Clock {
    /// Nanoseconds since this instant (worker threads read it directly).
    Real(Instant),
    /// Set by the caller of [`crate::Switch::poll_once`]: no threads, deterministic tests.
    Manual(AtomicU64),
}

/// What workers and the control plane share.
pub(crate) struct Shared {
    pub(crate) ports: ArcSwap<PortTable>,
    pub(crate) epoch: AtomicU64,
    pub(crate) fdb: Fdb,
    stop: AtomicBool,
    pub(crate) clock: Clock,
    /// How long workers poll after their last frame before sleeping.
    pub(crate) spin_ns: u64,
    pub(crate) qos: qos::QosShared,
    pub(crate) failure: Failure,
    /// Ports bpdu_guard disabled so far (each port's [`Disabled`] counts here).
    pub(crate) bpdu_trips: Arc<AtomicU64>,
    /// Flow export ([`crate::export::tap`]): none unless configured; workers take it with
    /// their view.
    pub(crate) export: arc_swap::ArcSwapOption<crate::export::ExportTap>,
    /// The firewall: always there, filtering only the ports its rules name
    /// ([`crate::firewall`]).
    pub(crate) firewall: Arc<crate::firewall::Firewall>,
}

impl Shared {
    pub(crate) fn new(
        fdb: Fdb,
        clock: Clock,
        spin_ns: u64,
        reservable: f64,
        firewall: Arc<crate::firewall::Firewall>,
    ) -> Shared {
        Shared {
            ports: ArcSwap::from_pointee(Vec::new()),
            epoch: AtomicU64::new(0),
            fdb,
            stop: AtomicBool::new(false),
            clock,
            spin_ns,
            qos: qos::QosShared::new(reservable),
            failure: Failure::default(),
            bpdu_trips: Arc::default(),
            export: Default::default(),
            firewall,
        }
    }

    /// The switch clock, nanoseconds.
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        match &self.clock {
            Clock::Real(base) => clock_ns(*base),
            Clock::Manual(t) => t.load(Ordering::Relaxed),
        }
    }
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
    #[inline]
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
    pub(crate) fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
    /// A thread failed: remember why (the first reason wins) and stop the switch.
    pub(crate) fn fail(&self, why: String) {
        // Stopping first: whoever wakes on the record sees a stopping switch.
        self.request_stop();
        self.failure.record(why);
    }
}

/// A worker as seen by the control plane.
pub(crate) struct WorkerShared {
    pub(crate) id: WorkerId,
    pub(crate) cpu: CpuId,
    pub(crate) counters: WorkerCounters,
    pub(crate) wake: EventFd,
    pub(crate) queues: ArcSwap<QueueList>,
    pub(crate) seen_epoch: AtomicU64,
    /// Set (before `wake` is written) when a port may have a wake-up fd it had not when the
    /// worker loaded the port table (a vhost-user port's first connection): the worker
    /// registers the fds of its queues that had none before it next sleeps.
    pub(crate) rx_fds_changed: AtomicBool,
}

/// Why the switch stopped on its own: the first thread failure, for the daemon to report.
#[derive(Debug, Default)]
pub(crate) struct Failure {
    why: Mutex<Option<String>>,
    changed: Condvar,
}

impl Failure {
    fn record(&self, why: String) {
        let mut w = self.why.lock();
        if w.is_none() {
            *w = Some(why);
        }
        self.changed.notify_all();
    }

    pub(crate) fn get(&self) -> Option<String> {
        self.why.lock().clone()
    }

    /// Waits until a failure is recorded, at most `timeout` (`None`: for ever).
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<String> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut w = self.why.lock();
        while w.is_none() {
            match deadline {
                Some(d) => {
                    if self.changed.wait_until(&mut w, d).timed_out() {
                        break;
                    }
                }
                None => self.changed.wait(&mut w),
            }
        }
        w.clone()
    }
}

/// Monotonic clock in nanoseconds since `base`.
#[inline]
pub(crate) fn clock_ns(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

/// A mirror session as a port's hook sees it ([`crate::mirror::Session`] is the one kind):
/// a trait, so that the port table does not depend on the pipeline, which depends on it.
pub trait MirrorSession: Send + Sync {
    /// Whether the session copies the frames its sources receive (`rx`) or are sent.
    fn takes(&self, rx: bool) -> bool;
    /// Queues copies of `frames` of port `port` (its untagged frames in VLAN `native`).
    fn push_dyn(
        &self,
        port: u16,
        native: u16,
        frames: &mut dyn Iterator<Item = &crate::packet::Pkt>,
    );
}

/// A port's mirror hook: a flag the engine reads once per burst, the sessions the port is a
/// source of, and whether it is a session's output.
#[derive(Default)]
pub struct PortMirror {
    on: AtomicBool,
    output: AtomicBool,
    pub(crate) sessions: ArcSwap<Vec<Arc<dyn MirrorSession>>>,
}

impl std::fmt::Debug for PortMirror {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortMirror")
            .field("on", &self.on())
            .field("output", &self.is_output())
            .finish()
    }
}

impl PortMirror {
    /// Whether the port is a source or an output of a session: the engine's one check per
    /// burst.
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Whether the port is a session's output.
    #[inline]
    pub fn is_output(&self) -> bool {
        self.output.load(Ordering::Relaxed)
    }

    /// Sets the sessions the port is a source of, and whether it is an output.
    pub fn set(&self, sessions: Vec<Arc<dyn MirrorSession>>, output: bool) {
        let on = output || !sessions.is_empty();
        self.sessions.store(Arc::new(sessions));
        self.output.store(output, Ordering::Release);
        self.on.store(on, Ordering::Release);
    }

    /// The sessions the port is a source of.
    pub fn sessions(&self) -> Arc<Vec<Arc<dyn MirrorSession>>> {
        self.sessions.load_full()
    }
}
