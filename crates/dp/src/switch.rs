//! The switch: the port table, the workers, and the control operations on them.
//!
//! Control operations (add/remove a port) run on the caller's thread, serialised by a mutex
//! that workers never take. They build a new port table and new per-worker queue lists,
//! publish them with `arc-swap`, bump the epoch and wake the workers; each worker switches to
//! the new view between bursts. A removed port's device is closed once every worker has moved
//! past the epoch that removed it, so no worker ever touches a closed fd, and traffic between
//! the other ports is not disturbed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use qswitch_api::request::{
    FdbEntry, PortInfo, PortStats, QueueInfo, QueueStats, StatsReport, WorkerStats,
};
use qswitch_api::{PortConfig, PortType, VhostMode};
use qswitch_sys::eventfd::EventFd;

use crate::fdb::Fdb;
use crate::ids::PortId;
use crate::port::gen::GenPort;
use crate::port::tap::{TapError, TapPort};
use crate::port::vhost_user::{Mode, VhostUserError, VhostUserPort};
use crate::port::{Device, Port};
use crate::qos;
use crate::stats::{DropCounters, DropReason, PortCounters, WorkerCounters};
use crate::worker;

/// Most ports a switch holds.
pub const MAX_PORTS: usize = 4096;

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
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long a learned MAC address lives without being seen.
    pub fdb_aging: Duration,
    /// How long a worker keeps polling after its last frame before it sleeps.
    pub poll_spin: Duration,
    /// Share of an uplink's capacity that guarantees may reserve (QoS admission control).
    pub reservable: f64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            fdb_aging: Duration::from_secs(300),
            poll_spin: Duration::from_nanos(worker::SPIN_NS),
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

/// Gives each of `queues` rx queues of port `id` to the worker with the fewest queues.
fn assign_queues(assign: &mut [Vec<(PortId, u16)>], id: PortId, queues: u16) {
    for q in 0..queues {
        if let Some(w) = (0..assign.len()).min_by_key(|&w| (assign[w].len(), w)) {
            assign[w].push((id, q));
        }
    }
}

/// Control-plane state, behind one mutex.
struct Control {
    /// Per worker: the (port, queue) pairs it polls.
    assign: Vec<Vec<(PortId, u16)>>,
}

/// A running switch.
pub struct Switch {
    shared: Arc<Shared>,
    workers: Vec<Arc<WorkerShared>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    control: Mutex<Control>,
}

impl Switch {
    /// Starts one pinned worker per CPU in `cpus`, with no ports.
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
        let sw = Switch {
            shared: shared.clone(),
            workers: workers.clone(),
            threads: Mutex::new(Vec::new()),
            control: Mutex::new(Control {
                assign: vec![Vec::new(); workers.len()],
            }),
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
        let mut assign = ctl.assign.clone();
        for config in configs {
            let id = self.prepare(&new_table, config)?;
            let dev = self.open_device(id, config)?;
            let slot = usize::from(id.0);
            if slot == new_table.len() {
                new_table.push(None);
            }
            new_table[slot] = Some(self.entry(id, config, dev));
            assign_queues(&mut assign, id, config.queues);
            ids.push(id);
        }
        qos::admit(&new_table, self.shared.qos.reservable, None).map_err(SwitchError::Qos)?;
        ctl.assign = assign;
        self.publish(&mut ctl, new_table);
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
        assign_queues(&mut ctl.assign, id, 1);
        self.publish(&mut ctl, table);
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
                )?)
            }
            PortType::Gen => Device::Gen(GenPort::new(
                id,
                &config.name,
                config.mac.as_deref(),
                config.queues,
                config.generate.as_ref(),
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
        for a in &mut ctl.assign {
            a.retain(|(p, _)| *p != entry.id);
        }
        drop(table);
        self.publish(&mut ctl, new_table);
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

    /// Publishes a new table and assignment, and waits (bounded) until every worker runs it.
    fn publish(&self, ctl: &mut Control, table: PortTable) {
        let table = Arc::new(table);
        for (w, a) in self.workers.iter().zip(&ctl.assign) {
            let queues: Vec<_> = a
                .iter()
                .filter_map(|(p, q)| table[usize::from(p.0)].clone().map(|e| (e, *q)))
                .collect();
            w.queues.store(Arc::new(queues));
        }
        self.shared.ports.store(table);
        let epoch = self.shared.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        for w in &self.workers {
            let _ = w.wake.notify();
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        for w in &self.workers {
            while w.seen_epoch.load(Ordering::Acquire) < epoch
                || w.seen_epoch.load(Ordering::Acquire) == u64::MAX
            {
                if Instant::now() > deadline || self.stopping() {
                    tracing::warn!(
                        worker = w.id,
                        "worker did not pick up a port change within 2 s"
                    );
                    break;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
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

    /// Forgets MAC addresses that have aged out. Call about once a second.
    pub fn tick(&self) {
        self.shared.fdb.sweep(self.shared.now());
    }

    /// Ports as `port list` shows them.
    pub fn ports(&self) -> Vec<PortInfo> {
        let table = self.shared.ports.load_full();
        let ctl = self.control.lock();
        table
            .iter()
            .flatten()
            .map(|p| {
                let mut queues: Vec<QueueInfo> = ctl
                    .assign
                    .iter()
                    .enumerate()
                    .flat_map(|(w, a)| {
                        a.iter()
                            .filter(|(id, _)| *id == p.id)
                            .map(move |(_, q)| QueueInfo {
                                queue: *q,
                                worker: w,
                                cpu: self.workers[w].cpu,
                            })
                    })
                    .collect();
                queues.sort_by_key(|q| q.queue);
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

    /// Stops the workers and closes every port (TAPs qswitch created disappear).
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
