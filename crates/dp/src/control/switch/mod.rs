//! The switch: the port table, the workers, and the control operations on them.
//!
//! | module | job |
//! |---|---|
//! | [`ports`] | the port lifecycle: add (validate, open, admit), remove, QoS settings, policy (VLAN trunk, security, storm control) |
//! | [`runtime`] | the queue-placement runtime: plan, publish, hand-off, rebalance, pins |
//! | [`reports`] | `port list`, `fdb`, `stats`, `placement`, `qos show` |
//! | [`start`] | start-up and shutdown: worker, QoS and housekeeping threads, or none |
//! | [`drivers`] | the port kinds' shared machinery (vhost-user event loop, veth fast path, VXLAN socket groups) |
//!
//! # One place for every change
//! Every control operation that changes the switch (add or remove a port, change a port's
//! QoS settings or policy, pin a queue, change the placement mode) and the housekeeping thread's
//! rebalancing run on the caller's thread under one mutex, [`Core`]'s control lock, which
//! workers never take. Admission control (the sum of QoS guarantees toward an uplink) is
//! checked and the change applied under that lock, so concurrent requests cannot together
//! admit more than any one of them would be allowed. A change builds a new port table and
//! new per-worker queue lists, publishes them with `arc-swap`, bumps the epoch and wakes the
//! workers; each worker switches to the new view between bursts. A removed port's device is
//! closed once every worker has moved past the epoch that removed it, so no worker ever
//! touches a closed fd, and traffic between the other ports is not disturbed.
//!
//! # Placement and queue hand-off
//! Every rx queue has one owning worker. Where it goes comes from [`crate::control::placement::plan`]
//! (the static rules: operator and default sets, SMT, NUMA, reserved CPUs), from operator
//! pins, and in dynamic mode from [`crate::control::balance`], which a housekeeping thread runs every
//! [`BALANCE_EVERY_NS`] on the queues' measured busy time. A queue moves between workers in
//! two published steps: first it is taken from its old worker (and given to nobody), and only
//! once that worker has acknowledged the new epoch, which it does between bursts, is it given
//! to the new one. The old worker's last burst from the queue has then been transmitted in
//! full, so the new worker's first frame from it leaves after the old worker's last: nothing is
//! lost (frames wait in the queue meanwhile) and nothing is reordered.
//!
//! # Threads or none
//! [`Switch::start`] runs each worker's engine on its own pinned thread, on the real clock.
//! [`Switch::manual`] starts no thread at all: the caller drives every worker's engine, the
//! QoS allocator and housekeeping with [`Switch::poll_once`] on a clock it sets, so tests
//! switch frames deterministically and without sleeping. Control operations work the same
//! in both modes (a manual worker picks up a published change at once, as a worker thread
//! would between bursts).

pub(crate) mod drivers;
mod export;
mod firewall;
pub use firewall::{RecordGroups, ZoneTraffic};
mod inspect;
mod lldp;
mod mirror;
mod ports;
pub use ports::Record;
mod reports;
mod runtime;
pub(crate) mod start;

pub use inspect::Capture;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;
use qswitch_api::PlacementMode;

use crate::control::placement::Topology;
use crate::control::qos;
use crate::ids::CpuId;
use crate::port::tap::TapError;
use crate::port::vhost_user::VhostUserError;
use crate::table::{Shared, WorkerShared};
use crate::worker;

/// Most ports a switch holds (10 000 idle vhost-user ports with headroom: issue 30). Port
/// ids are slots below it. Nothing is allocated for the slots no port uses: the port table,
/// the workers' per-destination lists and the QoS buffers grow with the highest slot in use;
/// what is sized by it up front is the firewall's per-zone flag and counters (33 bytes a
/// slot, 528 KiB) and, with the first fast-path veth port, the kernel fast path's per-CPU
/// counter array (40 bytes a slot per CPU: see [`drivers::VethDriver::fastpath`]).
pub const MAX_PORTS: usize = 16_384;
/// How often dynamic placement looks at the queues' load.
pub const BALANCE_EVERY_NS: u64 = 500_000_000;

/// Errors of control operations. Each leaves the switch unchanged.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("port '{0}' already exists")]
    PortExists(String),
    #[error("port '{0}' does not exist")]
    NoSuchPort(String),
    #[error("ifname '{ifname}' is already used by port '{port}'")]
    IfnameInUse { ifname: String, port: String },
    #[error("socket '{socket}' is already used by port '{port}'")]
    SocketInUse { socket: String, port: String },
    #[error("port '{0}' has no receive-side scaling (only vhost-user ports do)")]
    NoRss(String),
    #[error("port '{port}' has no rx queue {queue} (it has {queues})")]
    NoSuchQueue {
        port: String,
        queue: u16,
        queues: u16,
    },
    #[error("no worker runs on CPU {cpu} (workers: {workers})")]
    NoWorkerOnCpu { cpu: usize, workers: String },
    #[error("CPU {0} is reserved: no queue may run there")]
    ReservedCpu(usize),
    #[error("a capture is already running on port '{0}'")]
    CaptureBusy(String),
    #[error("cannot map the capture's ring")]
    CaptureMemory(#[source] std::io::Error),
    #[error("the switch is full ({MAX_PORTS} ports)")]
    Full,
    #[error("{0}")]
    Qos(String),
    /// A mirror session that cannot run, or a port a session uses.
    #[error("{0}")]
    Mirror(String),
    /// The change could not be recorded ([`Record`]); it was not made.
    #[error("{0}; nothing changed")]
    NotRecorded(String),
    #[error("cannot start the QoS allocator thread")]
    QosThread(#[source] std::io::Error),
    #[error(transparent)]
    Config(#[from] qswitch_api::ConfigError),
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error(transparent)]
    VhostUser(#[from] VhostUserError),
    #[error(transparent)]
    Vxlan(#[from] crate::port::vxlan::VxlanError),
    /// An afxdp port's interface cannot be used as asked (a configuration error).
    #[error("port '{port}': {error}")]
    AfXdp {
        port: String,
        error: crate::port::afxdp::AfXdpError,
    },
    /// A veth port's interface cannot be used, or its programs not attached.
    #[error("port '{port}': {error}")]
    Veth {
        port: String,
        error: crate::port::veth::VethError,
    },
    /// A bond's member cannot be used, or the bond not started.
    #[error("port '{port}': {error}")]
    Bond { port: String, error: String },
    #[error("cannot start worker {worker} on CPU {cpu}")]
    Worker {
        worker: usize,
        cpu: usize,
        #[source]
        source: std::io::Error,
    },
}

impl From<qos::ops::SetError> for SwitchError {
    fn from(e: qos::ops::SetError) -> SwitchError {
        match e {
            qos::ops::SetError::NoSuchPort(p) => SwitchError::NoSuchPort(p),
            qos::ops::SetError::Refused(m) => SwitchError::Qos(m),
        }
    }
}

/// Switch-wide settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long a learned MAC address lives without being seen.
    pub fdb_aging: Duration,
    /// How long a worker keeps polling after its last frame before it sleeps.
    pub poll_spin: Duration,
    /// CPUs no queue is placed on.
    pub reserved: Vec<usize>,
    /// Dynamic (by load) or static placement.
    pub placement: PlacementMode,
    /// The CPU topology; read from /sys when `None`.
    pub topology: Option<Topology>,
    /// Share of an uplink's capacity that guarantees may reserve (QoS admission control).
    pub reservable: f64,
    /// vhost-user: the group given the sockets of server-mode ports (`None`: the daemon's
    /// own). The sockets are mode 0660 either way.
    pub vhost_group: Option<u32>,
    /// vhost-user: the most guest memory one port may map, in bytes (the sum of its
    /// SET_MEM_TABLE regions).
    pub vhost_max_guest_memory: u64,
    /// `[firewall]`: connection-tracking limits and timeouts.
    pub firewall: Option<qswitch_api::config::FirewallConfig>,
    /// `[[security_group]]`: the groups ports name in `security_groups`.
    pub security_groups: Vec<qswitch_api::config::SecurityGroupConfig>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fdb_aging: Duration::from_secs(qswitch_api::value::FdbAging::DEFAULT.get()),
            poll_spin: Duration::from_nanos(worker::SPIN_NS),
            reserved: Vec::new(),
            placement: PlacementMode::Dynamic,
            topology: None,
            reservable: qswitch_api::config::DEFAULT_RESERVABLE,
            vhost_group: None,
            vhost_max_guest_memory: crate::port::vhost_user::DEFAULT_MAX_GUEST_MEMORY,
            firewall: None,
            security_groups: Vec::new(),
        }
    }
}

/// Everything the switch's threads share with it.
pub struct Core {
    shared: Arc<Shared>,
    workers: Vec<Arc<WorkerShared>>,
    /// The one control lock: every change to the switch is admitted and applied under it.
    control: Mutex<runtime::Control>,
    topology: Topology,
    reserved: Vec<usize>,
    /// Without threads: the workers' engines and the QoS allocator, driven by `poll_once`.
    manual: Option<Mutex<start::Manual>>,
    /// The port kinds' shared machinery.
    drivers: drivers::Drivers,
    /// Under a manual clock: the polls that received frames (see [`Core::activity`]).
    manual_moves: std::sync::atomic::AtomicU64,
}

impl Core {
    /// A count that moves whenever a worker moves frames: the sum of the workers' busy polls
    /// (under a manual clock, of the polls that received frames). A worker adds to a port's
    /// traffic counters and busy time only in a poll that moved frames, so while this stands
    /// still none of them moved: the periodic work that reads them (placement's evaluation,
    /// the QoS allocator's per-second sample, the daemon's 1-s sampler) skips its per-port
    /// part, and an idle switch costs the same with 10 ports as with 10 000. Traffic the
    /// kernel forwards by itself (the veth fast path) does not move it.
    pub fn activity(&self) -> u64 {
        let polls: u64 = self
            .workers
            .iter()
            .map(|w| w.counters.busy_polls.get())
            .sum();
        polls.wrapping_add(self.manual_moves.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// A running switch.
pub struct Switch {
    core: Arc<Core>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// The switch's methods are written against its shared core, which the housekeeping thread
/// holds too.
impl std::ops::Deref for Switch {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

impl Switch {
    /// Nanoseconds since the switch started (the clock workers pass around as `now`).
    pub fn now(&self) -> u64 {
        self.shared.now()
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Whether a worker has failed and the switch is stopping.
    pub fn stopping(&self) -> bool {
        self.shared.stopping()
    }

    /// Why the switch stopped on its own: once any of its threads (a worker, the QoS
    /// allocator, housekeeping) has panicked, a message that names the thread and quotes the
    /// panic. The switch is then stopping; a daemon should log the message, shut the switch
    /// down and exit non-zero.
    pub fn failed(&self) -> Option<String> {
        self.shared.failure.get()
    }

    /// Blocks until one of the switch's threads fails, at most `timeout` (`None`: for
    /// ever), and returns [`Switch::failed`]'s message, or `None` on timeout.
    pub fn wait_failed(&self, timeout: Option<Duration>) -> Option<String> {
        self.shared.failure.wait(timeout)
    }

    /// The firewall (docs/firewall.md): always there; it filters the ports with security
    /// groups, each in its own zone, the port's [`crate::PortId`].
    pub fn firewall(&self) -> &Arc<crate::firewall::Firewall> {
        &self.shared.firewall
    }

    /// Wakes every worker (used after feeding a port with no fd, in tests).
    pub fn kick(&self) {
        for w in &self.workers {
            let _ = w.wake.notify();
        }
    }
}

/// Every thread the switch starts goes through here: named `name`, confined to `cpus` (none:
/// where the daemon may run), and a panic in `f` stops the switch with a message naming the
/// thread ([`Switch::failed`]). `f` learns whether the confinement worked. The drivers'
/// threads ([`drivers`]) and the daemon's ([`Switch::spawn`]) start here too, so no
/// panic is lost.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    name: String,
    cpus: &[CpuId],
    f: impl FnOnce(std::io::Result<()>) + Send + 'static,
) -> std::io::Result<JoinHandle<()>> {
    let cpus: Vec<usize> = cpus.iter().map(|c| c.0).collect();
    let s = shared.clone();
    qswitch_sys::thread::spawn(
        name,
        &cpus,
        move |why| {
            tracing::error!("{why}; the switch stops");
            s.fail(why);
        },
        f,
    )
}
