//! Start-up and shutdown: the worker, QoS and housekeeping threads (or none, under a manual
//! clock), all spawned through one helper that names them, confines them and turns a panic
//! into a stopped switch with a message ([`Switch::failed`]).

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use qswitch_sys::eventfd::EventFd;

use super::runtime::Control;
use super::{spawn, Core, Options, Switch, SwitchError};
use crate::control::balance::Balancer;
use crate::control::placement::Topology;
use crate::control::qos;
use crate::engine::ManualWorker;
use crate::fdb::Fdb;
use crate::ids::{CpuId, WorkerId};
use crate::stats::WorkerCounters;
use crate::table::{Clock, Shared, WorkerShared};
use crate::worker::Worker;

/// How often the housekeeping thread wakes up.
pub(super) const HOUSEKEEP_EVERY: Duration = Duration::from_millis(100);

/// A switch without threads: every worker's engine and the QoS allocator, stepped by
/// [`Switch::poll_once`].
pub(super) struct Manual {
    pub(super) workers: Vec<ManualWorker>,
    allocator: qos::ops::Allocator,
    next_tick: u64,
}

impl Switch {
    /// Starts one pinned worker per CPU in `cpus`, with no ports, the QoS allocator thread
    /// and the housekeeping thread (address aging, dynamic placement).
    pub fn start(cpus: &[usize], options: &Options) -> Result<Switch, SwitchError> {
        let base = Instant::now();
        let sw = Switch::build(cpus, options, Clock::Real(base))?;
        let shared = sw.shared.clone();
        for w in &sw.workers {
            let (id, cpu) = (w.id, w.cpu);
            let err = |source| SwitchError::Worker {
                worker: id.0,
                cpu: cpu.0,
                source,
            };
            let worker = Worker::new(shared.clone(), w.clone(), base).map_err(err)?;
            let t = spawn(
                &shared,
                format!("qs-worker-{id}"),
                &[cpu],
                move |confined| {
                    if let Err(e) = confined {
                        tracing::warn!(worker = id.0, cpu = cpu.0, error = %e, "cannot pin worker");
                    }
                    tracing::debug!(worker = id.0, cpu = cpu.0, "worker started");
                    worker.run();
                },
            )
            .map_err(err)?;
            sw.threads.lock().push(t);
        }
        let core = sw.core.clone();
        let t = spawn(&shared, "qs-qos".into(), &[], move |_| {
            qos::ops::run(&core.shared, || core.activity())
        })
        .map_err(SwitchError::QosThread)?;
        sw.threads.lock().push(t);
        let core = sw.core.clone();
        let housekeeper = spawn(&shared, "qs-housekeep".into(), &[], move |_| {
            while !core.shared.stopping() {
                std::thread::sleep(HOUSEKEEP_EVERY);
                core.housekeep(core.shared.now());
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

    /// A switch with the workers of `cpus` but no thread at all, on a clock that starts at 0
    /// and moves only with [`Switch::poll_once`]. Control operations work as on a started
    /// switch; frames move only when the caller polls. For deterministic tests and
    /// simulations.
    pub fn manual(cpus: &[usize], options: &Options) -> Result<Switch, SwitchError> {
        let mut sw = Switch::build(cpus, options, Clock::Manual(AtomicU64::new(0)))?;
        let workers = sw.workers.iter().cloned().map(ManualWorker::new).collect();
        let manual = Manual {
            workers,
            allocator: qos::ops::Allocator::new(0),
            next_tick: 0,
        };
        // Nothing else holds the core yet.
        match Arc::get_mut(&mut sw.core) {
            Some(core) => core.manual = Some(Mutex::new(manual)),
            None => unreachable!("a new switch's core is not shared"),
        }
        Ok(sw)
    }

    /// On a [`Switch::manual`] switch: sets the clock to `now` (nanoseconds; it never goes
    /// back), runs housekeeping and the QoS allocator if they are due, then polls every rx
    /// queue once, worker by worker, each in its queue order. Returns the frames received.
    /// On a started switch it does nothing and returns 0.
    ///
    /// Busy time is not measured without threads, so dynamic placement sees every queue
    /// idle (it may coalesce them, as on an idle started switch); pins and static placement
    /// behave as on a started switch.
    pub fn poll_once(&self, now: u64) -> usize {
        let (Some(manual), Clock::Manual(clock)) = (&self.manual, &self.shared.clock) else {
            return 0;
        };
        let now = clock
            .fetch_max(now, std::sync::atomic::Ordering::Relaxed)
            .max(now);
        self.housekeep(now);
        let mut m = manual.lock();
        if now >= m.next_tick {
            m.next_tick = now + qos::TICK.as_nanos() as u64;
            let activity = self.activity();
            m.allocator.step(&self.shared, now, activity);
        }
        let mut moved = 0;
        for w in m.workers.iter_mut() {
            let n = w.step(&self.shared, now);
            if n > 0 {
                // As a worker thread's busy poll (one writer: under the manual lock).
                let a = &self.manual_moves;
                a.store(
                    a.load(std::sync::atomic::Ordering::Relaxed) + 1,
                    std::sync::atomic::Ordering::Relaxed,
                );
            }
            moved += n;
        }
        moved
    }

    /// The switch without its threads: shared state, workers' shared halves, control state.
    fn build(cpus: &[usize], options: &Options, clock: Clock) -> Result<Switch, SwitchError> {
        let shared = Arc::new(Shared::new(
            Fdb::new(options.fdb_aging.as_nanos() as u64),
            clock,
            options.poll_spin.as_nanos() as u64,
            options.reservable,
            Arc::new(crate::firewall::Firewall::for_switch(
                options.firewall.as_ref(),
                super::MAX_PORTS,
            )),
        ));
        let mut workers = Vec::new();
        for (id, &cpu) in cpus.iter().enumerate() {
            let wake = EventFd::new().map_err(|source| SwitchError::Worker {
                worker: id,
                cpu,
                source,
            })?;
            workers.push(Arc::new(WorkerShared {
                id: WorkerId(id),
                cpu: CpuId(cpu),
                counters: WorkerCounters::default(),
                wake,
                queues: ArcSwap::from_pointee(Vec::new()),
                seen_epoch: AtomicU64::new(u64::MAX),
                rx_fds_changed: AtomicBool::new(false),
            }));
        }
        let topology = options.topology.clone().unwrap_or_else(|| {
            Topology::read_sysfs(std::path::Path::new("/sys")).unwrap_or_default()
        });
        let core = Arc::new(Core {
            shared,
            control: Mutex::new(Control {
                published: vec![Vec::new(); workers.len()],
                queues: BTreeMap::new(),
                pins: BTreeMap::new(),
                mode: options.placement,
                plan: crate::control::placement::Plan::default(),
                port_sets: Vec::new(),
                plan_stale: false,
                balancer: Balancer::default(),
                last_eval: None,
                prev_tx: Default::default(),
                worker_busy: vec![0.0; workers.len()],
                moves: VecDeque::new(),
                moves_total: 0,
                next_sweep: 0,
                next_prefault: 0,
                trips_seen: 0,
                idle_at: None,
                handoff_postponed: false,
                lldp_slots: Default::default(),
                waiting: Vec::new(),
                mirrors: Vec::new(),
                security_groups: options.security_groups.clone(),
            }),
            workers,
            topology,
            reserved: options.reserved.clone(),
            manual: None,
            drivers: super::drivers::Drivers::new(options),
            manual_moves: AtomicU64::new(0),
        });
        Ok(Switch {
            core,
            threads: Mutex::new(Vec::new()),
        })
    }

    /// Starts a thread beside the switch's own (the daemon's control, HTTP and capture
    /// threads) the way the switch starts its own: named `name`, through the one spawn
    /// helper, and a panic in `f` stops the switch with a message naming the thread
    /// ([`Switch::failed`]), which the daemon reports before exiting non-zero.
    pub fn spawn(
        &self,
        name: &str,
        f: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<JoinHandle<()>> {
        spawn(&self.shared, name.to_string(), &[], move |_| f())
    }

    /// The names of the threads the switch runs: its workers, the QoS allocator,
    /// housekeeping, and its drivers' threads (`qs-vhost` once a vhost-user port was added).
    pub fn thread_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .threads
            .lock()
            .iter()
            .filter_map(|t| t.thread().name().map(str::to_string))
            .collect();
        names.extend(self.drivers.thread_names());
        names
    }

    /// Stops the workers and the housekeeping thread, and closes every port (TAPs qswitch
    /// created disappear).
    pub fn shutdown(&self) {
        self.shared.request_stop();
        self.stop_mirrors();
        self.kick();
        self.shared.qos.notify();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
        for w in &self.workers {
            w.queues.store(Arc::new(Vec::new()));
        }
        if let Some(m) = &self.manual {
            for w in m.lock().workers.iter_mut() {
                w.clear();
            }
        }
        self.shared.ports.store(Arc::new(Vec::new()));
        self.drivers.stop();
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.shutdown();
    }
}
