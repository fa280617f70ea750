//! The switch: the port table, the workers, and the control operations on them.
//!
//! Control operations (add/remove a port) run on the caller's thread, serialised by a mutex
//! that workers never take. They build a new port table and new per-worker queue lists,
//! publish them with `arc-swap`, bump the epoch and wake the workers; each worker switches to
//! the new view between bursts. A removed port's device is closed once every worker has moved
//! past the epoch that removed it, so no worker ever touches a closed fd, and traffic between
//! the other ports is not disturbed.
//!
//! # Placement and queue hand-off
//! Every rx queue has one owning worker. Where it goes comes from [`crate::placement::plan`]
//! (the static rules: operator and default sets, SMT, NUMA, reserved CPUs), from operator
//! pins, and in dynamic mode from [`crate::balance`], which a housekeeping thread runs every
//! [`BALANCE_EVERY_NS`] on the queues' measured busy time. A queue moves between workers in
//! two published steps: first it is taken from its old worker (and given to nobody), and only
//! once that worker has acknowledged the new epoch, which it does between bursts, is it given
//! to the new one. The old worker's last burst from the queue has then been transmitted in
//! full, so the new worker's first frame from it leaves after the old worker's last: nothing is
//! lost (frames wait in the queue meanwhile) and nothing is reordered.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use qswitch_api::request::{
    FdbEntry, MoveInfo, PlacementReport, PortInfo, PortSetInfo, PortStats, QueueInfo,
    QueuePlacementInfo, QueueStats, StatsReport, WorkerPlacementInfo, WorkerStats,
};
use qswitch_api::{PlacementMode, PortConfig, PortType, VhostMode};
use qswitch_sys::eventfd::EventFd;

use crate::balance::{Balancer, Decision, QueueLoad};
use crate::fdb::Fdb;
use crate::ids::PortId;
use crate::placement::{self, PortReq, Rule, Topology};
use crate::port::gen::GenPort;
use crate::port::tap::{TapError, TapPort};
use crate::port::vhost_user::{Mode, Reactor, VhostUserError, VhostUserPort};
use crate::port::{Device, Port};
use crate::qos;
use crate::stats::{DropCounters, DropReason, PortCounters, WorkerCounters};
use crate::worker;

/// Most ports a switch holds.
pub const MAX_PORTS: usize = 4096;
/// How often dynamic placement looks at the queues' load.
pub const BALANCE_EVERY_NS: u64 = 500_000_000;
/// How often the housekeeping thread wakes up.
const HOUSEKEEP_EVERY: Duration = Duration::from_millis(100);
/// How often learned addresses are aged out.
const SWEEP_EVERY_NS: u64 = 1_000_000_000;
/// Queue moves kept for `placement` to show.
const MOVES_KEPT: usize = 64;

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
    #[error("the switch is full ({MAX_PORTS} ports)")]
    Full,
    #[error("{0}")]
    Qos(String),
    #[error("cannot start the QoS allocator thread")]
    QosThread(#[source] std::io::Error),
    #[error(transparent)]
    Config(#[from] qswitch_api::ConfigError),
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error(transparent)]
    VhostUser(#[from] VhostUserError),
    #[error("cannot start worker {worker} on CPU {cpu}")]
    Worker {
        worker: usize,
        cpu: usize,
        #[source]
        source: std::io::Error,
    },
}

/// One port in the table.
#[derive(Debug)]
pub struct PortEntry {
    pub id: PortId,
    pub config: PortConfig,
    /// VLAN the port belongs to; 0 = untagged.
    pub vlan: u16,
    pub dev: Device,
    pub counters: PortCounters,
    /// QoS: allocation, token bucket, live settings (see [`crate::qos`]).
    pub qos: qos::PortQos,
}

/// Port table indexed by [`PortId`].
pub type PortTable = Vec<Option<Arc<PortEntry>>>;

/// What workers and the control plane share.
pub(crate) struct Shared {
    pub(crate) ports: ArcSwap<PortTable>,
    epoch: AtomicU64,
    pub(crate) fdb: Fdb,
    stop: AtomicBool,
    base: Instant,
    /// How long workers poll after their last frame before sleeping.
    pub(crate) spin_ns: u64,
    pub(crate) qos: qos::QosShared,
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
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fdb_aging: Duration::from_secs(300),
            poll_spin: Duration::from_nanos(worker::SPIN_NS),
            reserved: Vec::new(),
            placement: PlacementMode::Dynamic,
            topology: None,
            reservable: qswitch_api::config::DEFAULT_RESERVABLE,
        }
    }
}

impl Shared {
    #[inline]
    pub(crate) fn now(&self) -> u64 {
        worker::clock_ns(self.base)
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
}

/// A worker as seen by the control plane.
pub(crate) struct WorkerShared {
    pub(crate) id: usize,
    pub(crate) cpu: usize,
    pub(crate) counters: WorkerCounters,
    pub(crate) wake: EventFd,
    pub(crate) queues: ArcSwap<Vec<(Arc<PortEntry>, u16)>>,
    pub(crate) seen_epoch: AtomicU64,
}

/// Why a queue is on its worker.
#[derive(Debug, Clone, PartialEq)]
enum Reason {
    /// Where the static rules put it.
    Home,
    /// Pinned by the operator.
    Pinned,
    /// Gathered with the others at low load.
    Coalesced { total: f64 },
    /// Moved off a worker that was too busy.
    Spread { cpu: usize, busy: f64 },
}

/// Control-plane view of one rx queue.
#[derive(Debug, Clone)]
struct QueueState {
    /// The worker that owns it (published), or none when no CPU is available.
    worker: Option<usize>,
    /// The worker of its CPU in the static plan.
    home: Option<usize>,
    /// Workers it may run on: its operator set, or any unreserved worker.
    allowed: Vec<usize>,
    /// The static rules behind the home CPU, in words.
    why: String,
    pin: Option<usize>,
    reason: Reason,
    /// Its busy-time counter at the last evaluation, and the load since.
    prev_busy_ns: u64,
    load: f64,
}

/// Control-plane state, behind one mutex.
struct Control {
    /// Per worker: the (port, queue) pairs it polls now (as published).
    published: Vec<Vec<(PortId, u16)>>,
    queues: BTreeMap<(PortId, u16), QueueState>,
    /// Operator pins by port name and queue: the worker.
    pins: BTreeMap<(String, u16), usize>,
    mode: PlacementMode,
    plan_warnings: Vec<String>,
    port_sets: Vec<PortSetInfo>,
    balancer: Balancer,
    /// Time of the last evaluation and each worker's busy counter then.
    last_eval: Option<(u64, Vec<u64>)>,
    worker_busy: Vec<f64>,
    moves: VecDeque<MoveInfo>,
    moves_total: u64,
    next_sweep: u64,
}

/// Everything the switch's threads share with it.
pub struct Core {
    shared: Arc<Shared>,
    workers: Vec<Arc<WorkerShared>>,
    control: Mutex<Control>,
    topology: Topology,
    reserved: Vec<usize>,
}

/// A running switch.
pub struct Switch {
    core: Arc<Core>,
    threads: Mutex<Vec<JoinHandle<()>>>,
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
    /// Starts one pinned worker per CPU in `cpus`, with no ports, and the housekeeping thread
    /// (address aging, dynamic placement).
    pub fn start(cpus: &[usize], options: &Options) -> Result<Switch, SwitchError> {
        let shared = Arc::new(Shared {
            ports: ArcSwap::from_pointee(Vec::new()),
            epoch: AtomicU64::new(0),
            fdb: Fdb::new(options.fdb_aging.as_nanos() as u64),
            stop: AtomicBool::new(false),
            base: Instant::now(),
            spin_ns: options.poll_spin.as_nanos() as u64,
            qos: qos::QosShared::new(options.reservable),
        });
        let mut workers = Vec::new();
        for (id, &cpu) in cpus.iter().enumerate() {
            let wake = EventFd::new().map_err(|source| SwitchError::Worker {
                worker: id,
                cpu,
                source,
            })?;
            workers.push(Arc::new(WorkerShared {
                id,
                cpu,
                counters: WorkerCounters::default(),
                wake,
                queues: ArcSwap::from_pointee(Vec::new()),
                seen_epoch: AtomicU64::new(u64::MAX),
            }));
        }
        let topology = options.topology.clone().unwrap_or_else(|| {
            Topology::read_sysfs(std::path::Path::new("/sys")).unwrap_or_default()
        });
        let core = Arc::new(Core {
            shared: shared.clone(),
            workers: workers.clone(),
            control: Mutex::new(Control {
                published: vec![Vec::new(); workers.len()],
                queues: BTreeMap::new(),
                pins: BTreeMap::new(),
                mode: options.placement,
                plan_warnings: Vec::new(),
                port_sets: Vec::new(),
                balancer: Balancer::default(),
                last_eval: None,
                worker_busy: vec![0.0; workers.len()],
                moves: VecDeque::new(),
                moves_total: 0,
                next_sweep: 0,
            }),
            topology,
            reserved: options.reserved.clone(),
        });
        let sw = Switch {
            core: core.clone(),
            threads: Mutex::new(Vec::new()),
        };
        for w in workers {
            let (id, cpu) = (w.id, w.cpu);
            let t = worker::spawn(shared.clone(), w).map_err(|source| SwitchError::Worker {
                worker: id,
                cpu,
                source,
            })?;
            sw.threads.lock().push(t);
        }
        let s = shared.clone();
        let t = std::thread::Builder::new()
            .name("qs-qos".into())
            .spawn(move || qos::run(s))
            .map_err(SwitchError::QosThread)?;
        sw.threads.lock().push(t);
        let housekeeper = std::thread::Builder::new()
            .name("qs-housekeep".into())
            .spawn(move || {
                while !core.shared.stopping() {
                    std::thread::sleep(HOUSEKEEP_EVERY);
                    core.housekeep();
                }
            })
            .map_err(|source| SwitchError::Worker {
                worker: usize::MAX,
                cpu: usize::MAX,
                source,
            })?;
        sw.threads.lock().push(housekeeper);
        Ok(sw)
    }

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

    /// Adds a port from its config: validates it, opens the device, assigns its rx queues
    /// to the least-loaded workers, and publishes it.
    pub fn add_port(&self, config: &PortConfig) -> Result<PortId, SwitchError> {
        self.add_ports(std::slice::from_ref(config))
            .map(|ids| ids[0])
    }

    /// Adds several ports at once: they all appear to the workers in the same instant, so
    /// no frame is switched while only some of them exist. All or nothing: if one fails,
    /// none is added (devices already opened are closed again).
    pub fn add_ports(&self, configs: &[PortConfig]) -> Result<Vec<PortId>, SwitchError> {
        let mut ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let mut new_table = (*table).clone();
        let mut ids = Vec::with_capacity(configs.len());
        for config in configs {
            let id = self.prepare(&new_table, config)?;
            let dev = self.open_device(id, config)?;
            let slot = usize::from(id.0);
            if slot == new_table.len() {
                new_table.push(None);
            }
            new_table[slot] = Some(self.entry(id, config, dev));
            ids.push(id);
        }
        qos::admit(&new_table, self.shared.qos.reservable, None).map_err(SwitchError::Qos)?;
        self.replan(&mut ctl, &new_table);
        self.apply(&mut ctl, Some(new_table));
        for c in configs {
            tracing::info!(port = %c.name, kind = %c.kind, "port added");
        }
        Ok(ids)
    }

    /// Checks that `config` can join `table` and returns the id it gets.
    fn prepare(&self, table: &PortTable, config: &PortConfig) -> Result<PortId, SwitchError> {
        config.validate()?;
        for p in table.iter().flatten() {
            if p.config.name == config.name {
                return Err(SwitchError::PortExists(config.name.clone()));
            }
            if config.ifname.is_some() && p.config.ifname == config.ifname {
                return Err(SwitchError::IfnameInUse {
                    ifname: config.ifname.clone().unwrap_or_default(),
                    port: p.config.name.clone(),
                });
            }
            if config.socket.is_some() && p.config.socket == config.socket {
                return Err(SwitchError::SocketInUse {
                    socket: config
                        .socket
                        .as_ref()
                        .map(|s| s.display().to_string())
                        .unwrap_or_default(),
                    port: p.config.name.clone(),
                });
            }
        }
        let slot = table
            .iter()
            .position(Option::is_none)
            .unwrap_or(table.len());
        if slot >= MAX_PORTS {
            return Err(SwitchError::Full);
        }
        Ok(PortId(slot as u16))
    }

    /// Adds a test double port (see [`crate::port::inject`]).
    #[cfg(any(test, feature = "test-utils"))]
    pub fn add_inject_port(
        &self,
        name: &str,
        vlan: Option<u16>,
    ) -> Result<Arc<crate::port::inject::InjectPort>, SwitchError> {
        let mut ctl = self.control.lock();
        let mut table = (*self.shared.ports.load_full()).clone();
        let mut config = PortConfig::gen(name);
        config.vlan = vlan;
        let id = self.prepare(&table, &config)?;
        let port = Arc::new(crate::port::inject::InjectPort::new());
        let slot = usize::from(id.0);
        if slot == table.len() {
            table.push(None);
        }
        table[slot] = Some(self.entry(id, &config, Device::Inject(port.clone())));
        self.replan(&mut ctl, &table);
        self.apply(&mut ctl, Some(table));
        Ok(port)
    }

    fn open_device(&self, id: PortId, config: &PortConfig) -> Result<Device, SwitchError> {
        Ok(match config.kind {
            PortType::Tap => {
                let ifname = config.ifname.as_deref().unwrap_or_default();
                Device::Tap(TapPort::open(ifname, config.queues)?)
            }
            PortType::VhostUser => {
                let mode = match config.mode.unwrap_or(VhostMode::Server) {
                    VhostMode::Server => Mode::Server,
                    VhostMode::Client => Mode::Client,
                };
                let socket = config.socket.as_deref().unwrap_or(std::path::Path::new(""));
                Device::VhostUser(VhostUserPort::new(
                    &config.name,
                    socket,
                    mode,
                    config.queues,
                    &Reactor::shared().map_err(VhostUserError::Setup)?,
                )?)
            }
            PortType::Gen => Device::Gen(GenPort::new(
                id,
                &config.name,
                config.mac.as_deref(),
                config.queues,
                config.generate.as_ref(),
                self.workers.len(),
            )),
        })
    }

    fn entry(&self, id: PortId, config: &PortConfig, dev: Device) -> Arc<PortEntry> {
        Arc::new(PortEntry {
            id,
            config: config.clone(),
            vlan: config.vlan.unwrap_or(0),
            dev,
            counters: PortCounters::new(usize::from(config.queues), self.workers.len()),
            qos: qos::PortQos::new(config, self.shared.now()),
        })
    }

    /// Changes a port's QoS settings live (effective at the next allocator tick), unless
    /// admission control refuses; a refused change changes nothing.
    pub fn qos_set(
        &self,
        name: &str,
        update: &qos::QosUpdate,
    ) -> Result<qswitch_api::QosSettings, SwitchError> {
        qos::set(&self.shared, name, update)
    }

    /// QoS settings, allocations and measured rates of every port.
    pub fn qos_show(&self) -> qswitch_api::request::QosReport {
        qos::report(&self.shared)
    }

    /// Removes a port. Returns once no worker uses it any more (its device is then closed:
    /// a TAP qswitch created disappears).
    pub fn del_port(&self, name: &str) -> Result<(), SwitchError> {
        let mut ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let Some(entry) = table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .cloned()
        else {
            return Err(SwitchError::NoSuchPort(name.to_string()));
        };
        let mut new_table = (*table).clone();
        new_table[usize::from(entry.id.0)] = None;
        while new_table.last().is_some_and(Option::is_none) {
            new_table.pop();
        }
        ctl.pins.retain(|(port, _), _| port != name);
        drop(table);
        self.replan(&mut ctl, &new_table);
        self.apply(&mut ctl, Some(new_table));
        self.shared.fdb.remove_port(entry.id);
        drop(ctl);
        // Wait (bounded) until the last worker reference is gone, so the device closes now.
        let deadline = Instant::now() + Duration::from_secs(2);
        while Arc::strong_count(&entry) > 1 && Instant::now() < deadline && !self.stopping() {
            std::thread::sleep(Duration::from_millis(1));
        }
        tracing::info!(port = %name, "port removed");
        Ok(())
    }

    /// The receive-side indirection table of a multi-queue port (vhost-user).
    pub fn reta(&self, name: &str) -> Result<Arc<crate::rss::Reta>, SwitchError> {
        let table = self.shared.ports.load_full();
        let p = table
            .iter()
            .flatten()
            .find(|p| p.config.name == name)
            .ok_or_else(|| SwitchError::NoSuchPort(name.to_string()))?;
        match &p.dev {
            Device::VhostUser(v) => Ok(v.reta()),
            _ => Err(SwitchError::NoRss(name.to_string())),
        }
    }

    /// Wakes every worker (used after feeding a port with no fd, in tests).
    pub fn kick(&self) {
        for w in &self.workers {
            let _ = w.wake.notify();
        }
    }

    /// Ports as `port list` shows them.
    pub fn ports(&self) -> Vec<PortInfo> {
        let table = self.shared.ports.load_full();
        let ctl = self.control.lock();
        table
            .iter()
            .flatten()
            .map(|p| {
                let queues: Vec<QueueInfo> = ctl
                    .queues
                    .range((p.id, 0)..=(p.id, u16::MAX))
                    .filter_map(|(&(_, queue), st)| {
                        st.worker.map(|w| QueueInfo {
                            queue,
                            worker: w,
                            cpu: self.workers[w].cpu,
                        })
                    })
                    .collect();
                let (created, mac) = match &p.dev {
                    Device::Tap(t) => (t.created(), None),
                    Device::Gen(g) => (false, Some(g.mac().to_string())),
                    _ => (false, None),
                };
                let vhost = match &p.dev {
                    Device::VhostUser(v) => Some(v),
                    _ => None,
                };
                PortInfo {
                    name: p.config.name.clone(),
                    kind: p.config.kind.to_string(),
                    ifname: p.config.ifname.clone(),
                    vlan: p.config.vlan,
                    mac,
                    created,
                    offloads: p.dev.offloads().into_iter().map(String::from).collect(),
                    socket: p.config.socket.as_ref().map(|s| s.display().to_string()),
                    mode: vhost.map(|_| match p.config.mode.unwrap_or(VhostMode::Server) {
                        VhostMode::Server => "server".to_string(),
                        VhostMode::Client => "client".to_string(),
                    }),
                    connected: vhost.map(|v| v.connected()),
                    enabled_queues: vhost.map(|v| v.enabled_pairs()),
                    queues,
                }
            })
            .collect()
    }

    /// The MAC learning table, with port names.
    pub fn fdb(&self) -> Vec<FdbEntry> {
        let table = self.shared.ports.load_full();
        self.shared
            .fdb
            .entries(self.shared.now())
            .into_iter()
            .filter_map(|l| {
                let port = table.get(usize::from(l.port.0))?.as_ref()?;
                Some(FdbEntry {
                    mac: l.mac.to_string(),
                    vlan: l.vlan,
                    port: port.config.name.clone(),
                    age_ms: l.age_ns / 1_000_000,
                })
            })
            .collect()
    }

    /// All counters now (rates are left to the caller, who keeps the previous report).
    pub fn stats(&self) -> StatsReport {
        let table = self.shared.ports.load_full();
        let mut owners: BTreeMap<(PortId, u16), usize> = BTreeMap::new();
        for w in &self.workers {
            for (e, q) in w.queues.load().iter() {
                owners.insert((e.id, *q), w.id);
            }
        }
        let ports = table.iter().flatten().map(|p| port_stats(p)).collect();
        let workers = self
            .workers
            .iter()
            .map(|w| {
                let c = &w.counters;
                let tid = c.tid.load(Ordering::Relaxed);
                let (vol, invol) = if tid > 0 {
                    qswitch_sys::thread::ctx_switches(tid).unwrap_or_default()
                } else {
                    (0, 0)
                };
                WorkerStats {
                    id: w.id,
                    cpu: w.cpu,
                    tid,
                    queues: owners
                        .iter()
                        .filter(|(_, &o)| o == w.id)
                        .filter_map(|((p, q), _)| {
                            table
                                .get(usize::from(p.0))?
                                .as_ref()
                                .map(|e| format!("{}/{q}", e.config.name))
                        })
                        .collect(),
                    busy_polls: c.busy_polls.get(),
                    idle_polls: c.idle_polls.get(),
                    busy_ns: c.busy_ns.get(),
                    idle_ns: c.idle_ns.get(),
                    sleeps: c.sleeps.get(),
                    wakeups: c.wakeups.get(),
                    spin_us: c.spin_ns.get() as f64 / 1000.0,
                    voluntary_ctx_switches: vol,
                    involuntary_ctx_switches: invol,
                    cpu_ns: if tid > 0 {
                        qswitch_sys::thread::thread_cpu_ns(tid).unwrap_or(0)
                    } else {
                        0
                    },
                }
            })
            .collect();
        StatsReport {
            uptime_ms: self.shared.now() / 1_000_000,
            process_cpu_ns: qswitch_sys::thread::process_cpu_ns(),
            ports,
            workers,
            rates: None,
        }
    }

    /// Stops the workers and the housekeeping thread, and closes every port (TAPs qswitch
    /// created disappear).
    pub fn shutdown(&self) {
        self.shared.request_stop();
        self.kick();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        for w in &self.workers {
            w.queues.store(Arc::new(Vec::new()));
        }
        self.shared.ports.store(Arc::new(Vec::new()));
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

impl Core {
    /// The workers running on `cpu`.
    fn workers_on(&self, cpu: usize) -> impl Iterator<Item = usize> + '_ {
        self.workers
            .iter()
            .filter(move |w| w.cpu == cpu)
            .map(|w| w.id)
    }

    /// Recomputes the static plan for the ports of `table` and brings every queue's state up
    /// to date: new queues go home (or to their pin), queues of removed ports are forgotten.
    /// In static mode every queue goes home; in dynamic mode a queue stays where it is while
    /// that is allowed.
    fn replan(&self, ctl: &mut Control, table: &PortTable) {
        let ports: Vec<&Arc<PortEntry>> = table.iter().flatten().collect();
        let reqs: Vec<PortReq> = ports
            .iter()
            .map(|p| PortReq {
                name: p.config.name.clone(),
                queues: p.rx_queues(),
                cpus: p.config.cpu_set().ok().flatten(),
                numa_node: None,
            })
            .collect();
        let cpus: Vec<usize> = self.workers.iter().map(|w| w.cpu).collect();
        let plan = placement::plan(&self.topology, &cpus, &self.reserved, &reqs);
        let unreserved: Vec<usize> = self
            .workers
            .iter()
            .filter(|w| !self.reserved.contains(&w.cpu))
            .map(|w| w.id)
            .collect();
        // Home workers: the plan's CPU; several workers on one CPU take turns.
        let mut per_cpu_turn: BTreeMap<usize, usize> = BTreeMap::new();
        let mut states = BTreeMap::new();
        for (p, req) in ports.iter().zip(&reqs) {
            let set = plan
                .port_sets
                .iter()
                .find(|(n, _)| *n == req.name)
                .map(|(_, s)| s.clone())
                .unwrap_or_default();
            let operator = req.cpus.is_some()
                && plan
                    .queues
                    .iter()
                    .any(|q| q.port == req.name && q.rules.first() == Some(&Rule::OperatorSet));
            let allowed: Vec<usize> = if operator {
                set.iter().flat_map(|&c| self.workers_on(c)).collect()
            } else {
                unreserved.clone()
            };
            for q in plan.queues.iter().filter(|q| q.port == req.name) {
                let on_cpu: Vec<usize> = self.workers_on(q.cpu).collect();
                let turn = per_cpu_turn.entry(q.cpu).or_insert(0);
                let home = on_cpu.get(*turn % on_cpu.len().max(1)).copied();
                *turn += 1;
                let key = (p.id, q.queue);
                let old = ctl.queues.get(&key);
                let pin = ctl.pins.get(&(req.name.clone(), q.queue)).copied();
                let stay = old
                    .and_then(|o| o.worker)
                    .filter(|w| ctl.mode == PlacementMode::Dynamic && allowed.contains(w));
                let (worker, reason) = match (pin, stay) {
                    (Some(w), _) => (Some(w), Reason::Pinned),
                    (None, Some(w)) => (
                        Some(w),
                        old.map_or(Reason::Home, |o| {
                            if o.reason == Reason::Pinned || Some(w) == home {
                                Reason::Home
                            } else {
                                o.reason.clone()
                            }
                        }),
                    ),
                    (None, None) => (home, Reason::Home),
                };
                states.insert(
                    key,
                    QueueState {
                        worker,
                        home,
                        allowed: allowed.clone(),
                        why: plan.why(q),
                        pin,
                        reason,
                        prev_busy_ns: old.map_or(0, |o| o.prev_busy_ns),
                        load: old.map_or(0.0, |o| o.load),
                    },
                );
            }
        }
        ctl.queues = states;
        ctl.plan_warnings = plan.warnings.iter().map(ToString::to_string).collect();
        ctl.port_sets = plan
            .port_sets
            .iter()
            .map(|(port, cpus)| PortSetInfo {
                port: port.clone(),
                cpus: cpus.clone(),
                operator: reqs.iter().any(|r| r.name == *port && r.cpus.is_some()),
            })
            .collect();
    }

    /// Publishes the queue states (and `table`, if given) to the workers. A queue that changes
    /// worker is handed off in two steps (see the module documentation).
    fn apply(&self, ctl: &mut Control, table: Option<PortTable>) {
        let table_given = table.is_some();
        let table = match table {
            Some(t) => Arc::new(t),
            None => self.shared.ports.load_full(),
        };
        let mut target: Vec<Vec<(PortId, u16)>> = vec![Vec::new(); self.workers.len()];
        for (&key, st) in &ctl.queues {
            if let Some(w) = st.worker {
                target[w].push(key);
            }
        }
        if !table_given && target == ctl.published {
            return;
        }
        let mut owner: BTreeMap<(PortId, u16), usize> = BTreeMap::new();
        for (w, list) in ctl.published.iter().enumerate() {
            for &k in list {
                owner.insert(k, w);
            }
        }
        // Step 1: nobody gets a queue that another worker still has.
        let step1: Vec<Vec<(PortId, u16)>> = target
            .iter()
            .enumerate()
            .map(|(w, list)| {
                list.iter()
                    .copied()
                    .filter(|k| owner.get(k).is_none_or(|&o| o == w))
                    .collect()
            })
            .collect();
        let handoff = step1 != target;
        let acked = self.publish(&table, &step1);
        ctl.published = step1;
        if handoff {
            if !acked {
                // A worker did not let go within the bound: giving its queue to another now
                // could have two workers on it. Leave the queue unpolled; the next change
                // retries.
                tracing::error!("a worker did not release its queues; moves postponed");
                return;
            }
            self.publish(&table, &target);
            ctl.published = target;
        }
    }

    /// Stores per-worker queue lists and the table, bumps the epoch, wakes the workers and
    /// waits (bounded) until each runs it. Returns whether all did.
    fn publish(&self, table: &Arc<PortTable>, lists: &[Vec<(PortId, u16)>]) -> bool {
        for (w, list) in self.workers.iter().zip(lists) {
            let queues: Vec<_> = list
                .iter()
                .filter_map(|(p, q)| {
                    table
                        .get(usize::from(p.0))
                        .cloned()
                        .flatten()
                        .map(|e| (e, *q))
                })
                .collect();
            w.queues.store(Arc::new(queues));
        }
        self.shared.ports.store(table.clone());
        let epoch = self.shared.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        for w in &self.workers {
            let _ = w.wake.notify();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut all = true;
        for w in &self.workers {
            loop {
                let seen = w.seen_epoch.load(Ordering::Acquire);
                if seen != u64::MAX && seen >= epoch {
                    break;
                }
                if Instant::now() > deadline || self.shared.stopping() {
                    tracing::warn!(worker = w.id, "worker did not pick up a change within 5 s");
                    all = false;
                    break;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        all
    }

    /// Periodic work: age out addresses every second, evaluate placement every
    /// [`BALANCE_EVERY_NS`].
    fn housekeep(&self) {
        let now = self.shared.now();
        let mut ctl = self.control.lock();
        if now >= ctl.next_sweep {
            ctl.next_sweep = now + SWEEP_EVERY_NS;
            self.shared.fdb.sweep(now);
        }
        let due = ctl
            .last_eval
            .as_ref()
            .is_none_or(|(t, _)| now.saturating_sub(*t) >= BALANCE_EVERY_NS);
        if due && !self.shared.stopping() {
            self.rebalance(&mut ctl, now);
            // Also retries a hand-off that a slow worker made us postpone.
            self.apply(&mut ctl, None);
        }
    }

    /// Measures every queue's and worker's load since the last evaluation and, in dynamic
    /// mode, carries out what the balancer decides.
    fn rebalance(&self, ctl: &mut Control, now: u64) {
        let table = self.shared.ports.load_full();
        let busy_now: Vec<u64> = self
            .workers
            .iter()
            .map(|w| w.counters.busy_ns.get())
            .collect();
        let Some((then, busy_then)) = ctl.last_eval.replace((now, busy_now.clone())) else {
            for (&(p, q), st) in ctl.queues.iter_mut() {
                st.prev_busy_ns = queue_busy(&table, p, q);
            }
            return;
        };
        let dt = now.saturating_sub(then).max(1) as f64;
        ctl.worker_busy = busy_now
            .iter()
            .zip(&busy_then)
            .map(|(n, t)| (n.saturating_sub(*t) as f64 / dt).min(1.0))
            .collect();
        for (&(p, q), st) in ctl.queues.iter_mut() {
            let b = queue_busy(&table, p, q);
            st.load = (b.saturating_sub(st.prev_busy_ns) as f64 / dt).min(1.0);
            st.prev_busy_ns = b;
        }
        if ctl.mode != PlacementMode::Dynamic {
            return;
        }
        let keys: Vec<(PortId, u16)> = ctl
            .queues
            .iter()
            .filter(|(_, st)| st.worker.is_some() && st.home.is_some())
            .map(|(k, _)| *k)
            .collect();
        let loads: Vec<QueueLoad> = keys
            .iter()
            .map(|k| {
                let st = &ctl.queues[k];
                let current = st.worker.unwrap_or_default();
                let mut allowed = st.allowed.clone();
                if !allowed.contains(&current) {
                    allowed.push(current);
                }
                allowed.sort_unstable();
                QueueLoad {
                    load: st.load,
                    current,
                    home: st.home.unwrap_or(current),
                    allowed,
                    pinned: st.pin.is_some(),
                }
            })
            .collect();
        let busy = ctl.worker_busy.clone();
        let (targets, reason) = match ctl.balancer.evaluate(&loads, &busy) {
            Decision::Keep => return,
            Decision::Coalesce { targets, total, .. } => (targets, Reason::Coalesced { total }),
            Decision::Spread { targets, hot, busy } => (
                targets,
                Reason::Spread {
                    cpu: self.workers[hot].cpu,
                    busy,
                },
            ),
        };
        let mut moved = 0;
        for (k, &to) in keys.iter().zip(&targets) {
            let name = table
                .get(usize::from(k.0 .0))
                .and_then(|e| e.as_ref())
                .map(|e| e.config.name.clone())
                .unwrap_or_default();
            let Some(st) = ctl.queues.get_mut(k) else {
                continue;
            };
            if st.worker == Some(to) {
                continue;
            }
            let from_cpu = st.worker.map(|w| self.workers[w].cpu);
            st.worker = Some(to);
            st.reason = if st.home == Some(to) {
                Reason::Home
            } else {
                reason.clone()
            };
            let why = match &reason {
                Reason::Coalesced { total } => format!(
                    "coalesce: all queues together use {:.1}% of a core",
                    total * 100.0
                ),
                Reason::Spread { cpu, busy } => {
                    format!(
                        "spread: the worker on CPU {cpu} was {:.0}% busy",
                        busy * 100.0
                    )
                }
                _ => String::new(),
            };
            tracing::info!(port = %name, queue = k.1, from = ?from_cpu, to = self.workers[to].cpu, "{why}");
            record_move(ctl, now, name, k.1, from_cpu, self.workers[to].cpu, why);
            moved += 1;
        }
        if moved > 0 {
            self.apply(ctl, None);
        }
    }

    /// Pins rx queue `queue` of port `port` to the worker on `cpu` (`None` removes the pin).
    /// The queue moves there at once, without loss or reordering.
    pub fn pin(&self, port: &str, queue: u16, cpu: Option<usize>) -> Result<(), SwitchError> {
        let mut ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let entry = table
            .iter()
            .flatten()
            .find(|p| p.config.name == port)
            .ok_or_else(|| SwitchError::NoSuchPort(port.to_string()))?;
        let key = (entry.id, queue);
        if !ctl.queues.contains_key(&key) {
            return Err(SwitchError::NoSuchQueue {
                port: port.to_string(),
                queue,
                queues: entry.rx_queues(),
            });
        }
        let worker = match cpu {
            Some(cpu) => {
                if self.reserved.contains(&cpu) {
                    return Err(SwitchError::ReservedCpu(cpu));
                }
                Some(self.workers_on(cpu).next().ok_or_else(|| {
                    SwitchError::NoWorkerOnCpu {
                        cpu,
                        workers: qswitch_api::CpuList::from_cpus(
                            self.workers.iter().map(|w| w.cpu),
                        )
                        .map_or_else(|| "none".into(), |l| l.to_string()),
                    }
                })?)
            }
            None => None,
        };
        let now = self.shared.now();
        let mode = ctl.mode;
        let (from, to) = match ctl.queues.get_mut(&key) {
            Some(st) => {
                let from = st.worker;
                st.pin = worker;
                st.reason = if worker.is_some() {
                    Reason::Pinned
                } else {
                    Reason::Home
                };
                if worker.is_some() {
                    st.worker = worker;
                } else if mode == PlacementMode::Static {
                    st.worker = st.home;
                }
                (from, st.worker)
            }
            None => (None, None),
        };
        match worker {
            Some(w) => ctl.pins.insert((port.to_string(), queue), w),
            None => ctl.pins.remove(&(port.to_string(), queue)),
        };
        if let (Some(to), true) = (to, to != from) {
            let (from_cpu, to_cpu) = (from.map(|w| self.workers[w].cpu), self.workers[to].cpu);
            let why = if worker.is_some() {
                "pinned by the operator"
            } else {
                "unpinned"
            };
            record_move(
                &mut ctl,
                now,
                port.to_string(),
                queue,
                from_cpu,
                to_cpu,
                why.into(),
            );
        }
        self.apply(&mut ctl, None);
        Ok(())
    }

    /// Switches placement between dynamic and static. Going static sends every queue that is
    /// not pinned home.
    pub fn set_placement_mode(&self, mode: PlacementMode) {
        let mut ctl = self.control.lock();
        ctl.mode = mode;
        ctl.balancer = Balancer::default();
        if mode == PlacementMode::Static {
            let now = self.shared.now();
            let table = self.shared.ports.load_full();
            let mut moves = Vec::new();
            for (&(p, q), st) in ctl.queues.iter_mut() {
                if st.pin.is_none() && st.worker != st.home {
                    moves.push((p, q, st.worker, st.home));
                    st.worker = st.home;
                    st.reason = Reason::Home;
                }
            }
            for (p, q, from, to) in moves {
                if let Some(to) = to {
                    let name = table
                        .get(usize::from(p.0))
                        .and_then(|e| e.as_ref())
                        .map(|e| e.config.name.clone())
                        .unwrap_or_default();
                    let from_cpu = from.map(|w| self.workers[w].cpu);
                    let to_cpu = self.workers[to].cpu;
                    record_move(
                        &mut ctl,
                        now,
                        name,
                        q,
                        from_cpu,
                        to_cpu,
                        "static placement".into(),
                    );
                }
            }
        }
        self.apply(&mut ctl, None);
        tracing::info!(%mode, "placement mode changed");
    }

    /// Where every queue runs, its load and why; per-worker load; warnings; recent moves.
    pub fn placement(&self) -> PlacementReport {
        let ctl = self.control.lock();
        let table = self.shared.ports.load_full();
        let cpu = |w: Option<usize>| w.map(|w| self.workers[w].cpu);
        let queues = ctl
            .queues
            .iter()
            .filter_map(|(&(p, q), st)| {
                let entry = table.get(usize::from(p.0))?.as_ref()?;
                let (state, why) = match &st.reason {
                    Reason::Pinned => ("pinned", "pinned by the operator".to_string()),
                    Reason::Home => ("home", st.why.clone()),
                    Reason::Coalesced { total } => (
                        "coalesced",
                        format!(
                            "coalesced at low load (all queues together {:.1}% of a core); \
                             home: {}",
                            total * 100.0,
                            st.why
                        ),
                    ),
                    Reason::Spread { cpu, busy } => (
                        "spread",
                        format!(
                            "spread off CPU {cpu} ({:.0}% busy); home: {}",
                            busy * 100.0,
                            st.why
                        ),
                    ),
                };
                Some(QueuePlacementInfo {
                    port: entry.config.name.clone(),
                    queue: q,
                    worker: st.worker,
                    cpu: cpu(st.worker),
                    home_cpu: cpu(st.home),
                    load: st.load,
                    state: state.to_string(),
                    why,
                })
            })
            .collect();
        let workers = self
            .workers
            .iter()
            .map(|w| WorkerPlacementInfo {
                id: w.id,
                cpu: w.cpu,
                busy: ctl.worker_busy.get(w.id).copied().unwrap_or(0.0),
                queues: ctl.published.get(w.id).map_or(0, Vec::len),
            })
            .collect();
        PlacementReport {
            mode: ctl.mode.to_string(),
            reserved_cpus: self.reserved.clone(),
            queues,
            workers,
            port_sets: ctl.port_sets.clone(),
            warnings: ctl.plan_warnings.clone(),
            moves: ctl.moves.iter().cloned().collect(),
            moves_total: ctl.moves_total,
        }
    }
}

fn queue_busy(table: &PortTable, p: PortId, q: u16) -> u64 {
    table
        .get(usize::from(p.0))
        .and_then(|e| e.as_ref())
        .and_then(|e| e.counters.rx.get(usize::from(q)))
        .map_or(0, |c| c.busy_ns.get())
}

fn record_move(
    ctl: &mut Control,
    now: u64,
    port: String,
    queue: u16,
    from_cpu: Option<usize>,
    to_cpu: usize,
    reason: String,
) {
    ctl.moves_total += 1;
    if ctl.moves.len() == MOVES_KEPT {
        ctl.moves.pop_front();
    }
    ctl.moves.push_back(MoveInfo {
        at_ms: now / 1_000_000,
        port,
        queue,
        from_cpu,
        to_cpu,
        reason,
    });
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn drop_map(
    counters: impl Iterator<Item = impl std::ops::Deref<Target = DropCounters>>,
) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for c in counters {
        for &r in DropReason::ALL {
            let n = c.get(r);
            if n > 0 {
                *m.entry(r.name().to_string()).or_insert(0) += n;
            }
        }
    }
    m
}

fn port_stats(p: &PortEntry) -> PortStats {
    let c = &p.counters;
    let queues: Vec<QueueStats> =
        c.rx.iter()
            .enumerate()
            .map(|(q, qc)| QueueStats {
                queue: q as u16,
                rx_packets: qc.rx_packets.get(),
                rx_bytes: qc.rx_bytes.get(),
                drops: drop_map(std::iter::once(&qc.drops)),
            })
            .collect();
    let (sink, generated) = match &p.dev {
        Device::Gen(g) => (Some(g.sink_stats()), Some(g.generated())),
        _ => (None, None),
    };
    let guest_errors = match &p.dev {
        Device::VhostUser(v) => Some(v.guest_errors()),
        _ => None,
    };
    PortStats {
        name: p.config.name.clone(),
        rx_packets: queues.iter().map(|q| q.rx_packets).sum(),
        rx_bytes: queues.iter().map(|q| q.rx_bytes).sum(),
        tx_packets: c.tx.iter().map(|t| t.tx_packets.get()).sum(),
        tx_bytes: c.tx.iter().map(|t| t.tx_bytes.get()).sum(),
        drops: drop_map(
            c.rx.iter()
                .map(|q| &q.drops)
                .chain(c.tx.iter().map(|t| &t.drops)),
        ),
        queues,
        sink,
        generated,
        guest_errors,
    }
}
