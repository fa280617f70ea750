//! `qswitch run`: load and validate the config, merge the recorded live state
//! ([`crate::state`]), start the switch and its ports, serve the control socket, tell systemd
//! it is ready, sample counters every second, reload on SIGHUP, and stop cleanly on
//! SIGINT/SIGTERM. A panicked switch thread makes it exit non-zero.

use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;
use qswitch_api::request::{Rates, StatsReport};
use qswitch_api::Config;
use qswitch_dp::Switch;

use crate::control;

/// Exit code for configuration errors: nothing was started.
pub const EXIT_CONFIG: u8 = 2;

/// How often the main loop looks at the signal flags (SIGTERM, SIGINT, SIGHUP) between its
/// once-a-second samples: the signal handlers only set flags, so this bounds how late a
/// signal is acted on, and it is the main thread's only other wake-up.
const SIGNAL_POLL: Duration = Duration::from_millis(250);

/// What the control thread needs.
pub struct Daemon {
    pub switch: Switch,
    /// Rates over the most recent complete second.
    pub rates: Mutex<Option<Rates>>,
    /// The firewall's new connections per zone (port id): the count at the last second
    /// and how many opened during it (see [`feed_firewall`]).
    pub fw_new: Mutex<std::collections::HashMap<u32, (u64, u64)>>,
    /// The last 15 minutes, one point per second (for the HTTP API and the dashboard).
    pub history: Mutex<crate::series::History>,
    /// What runs and its record; every change goes through it (see [`crate::state`]).
    pub persist: Mutex<crate::state::Persist>,
    /// The captures running (at most [`crate::capture::MAX_CAPTURES`]).
    pub captures: crate::capture::Running,
    /// Flow export (IPFIX, sFlow): see [`crate::export`].
    pub export: crate::export::Export,
}

impl Daemon {
    /// Counters now, with the latest per-second rates.
    pub fn stats(&self) -> StatsReport {
        let mut r = self.switch.stats();
        r.rates = self.rates.lock().clone();
        r
    }

    /// Applies and records a change request (port add/del, qos set, pin, mode, reload) under
    /// the persistence mutex, so changes are recorded in the order they are applied.
    pub fn change(&self, req: qswitch_api::Request) -> qswitch_api::Response {
        let mut persist = self.persist.lock();
        let reload = matches!(req, qswitch_api::Request::Reload);
        match persist.change(&self.switch, req) {
            Ok(r) if reload => {
                // The reload recorded the file's export tables where they changed.
                let s = persist.switch_config();
                match self.export.configure(&self.switch, s.ipfix, s.sflow) {
                    Ok(()) => r,
                    Err(e) => qswitch_api::Response::Error {
                        message: format!("{}; the rest of the reload applied", crate::chain(&e)),
                    },
                }
            }
            Ok(r) => r,
            Err(e) => qswitch_api::Response::Error {
                message: crate::chain(&e),
            },
        }
    }

    /// `export set` and `export off`: applied (sockets first: a collector that cannot be
    /// reached changes nothing), then recorded in the state file.
    pub fn export_change(&self, req: qswitch_api::Request) -> qswitch_api::Response {
        let mut persist = self.persist.lock();
        let s = persist.switch_config();
        let (old_ipfix, old_sflow) = (s.ipfix, s.sflow);
        let (mut ipfix, mut sflow) = (old_ipfix, old_sflow);
        match req {
            qswitch_api::Request::ExportSet { ipfix: i, sflow: f } => {
                ipfix = i.or(ipfix);
                sflow = f.or(sflow);
            }
            qswitch_api::Request::ExportOff { protocol } => match protocol.as_str() {
                "ipfix" => ipfix = None,
                "sflow" => sflow = None,
                other => {
                    return qswitch_api::Response::Error {
                        message: format!("export off {other}: expected ipfix or sflow"),
                    }
                }
            },
            _ => {}
        }
        let result = self
            .export
            .configure(&self.switch, ipfix, sflow)
            .and_then(|()| {
                persist
                    .commit_export(&self.switch, ipfix, sflow)
                    .inspect_err(|_| {
                        // Not recorded: back to what runs and is recorded.
                        let _ = self.export.configure(&self.switch, old_ipfix, old_sflow);
                    })
            });
        match result {
            Ok(()) => qswitch_api::Response::Ok,
            Err(e) => qswitch_api::Response::Error {
                message: crate::chain(&e),
            },
        }
    }

    /// `config dump`.
    pub fn dump(&self) -> qswitch_api::Response {
        match self.persist.lock().dump(&self.switch) {
            Ok(toml) => qswitch_api::Response::Config { toml },
            Err(e) => qswitch_api::Response::Error {
                message: crate::chain(&e),
            },
        }
    }
}

/// Runs the daemon until SIGINT/SIGTERM. Config errors exit with [`EXIT_CONFIG`].
pub fn run(path: &Path) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            return config_error(&qswitch_api::ConfigError::Read {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
        }
    };
    let file = match Config::from_toml(&text) {
        Ok(c) => c,
        Err(e) => return config_error(&e),
    };
    let online = match qswitch_sys::thread::online_cpus() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("qswitch: cannot read the online CPUs: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = file.validate(&online) {
        return config_error(&e);
    }
    if let Err(e) = crate::export::check(file.switch.ipfix, file.switch.sflow) {
        eprintln!("qswitch: {}", crate::chain(&e));
        return ExitCode::from(EXIT_CONFIG);
    }
    let start = match crate::state::Persist::open(path, &text, &file) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("qswitch: {}", crate::chain(&e));
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    for n in &start.notes {
        tracing::info!("{n}");
    }
    let config = start.live.config.clone();
    let workers = match config.validate(&online) {
        Ok(w) => w,
        Err(e) => {
            let state = crate::state::state_dir(&file)
                .0
                .join(crate::state::STATE_FILE);
            eprintln!(
                "qswitch: the config file with the recorded live changes on top is invalid: \
                 {e} (remove {} to start from the file alone)",
                state.display()
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if let Err(msg) = open_file_limit(config.ports.len()) {
        eprintln!("qswitch: {msg}");
        return ExitCode::from(EXIT_CONFIG);
    }
    keep_off_worker_cpus(&online, workers.cpus());
    match serve(start.persist, start.live, &text, &file, workers.cpus()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qswitch: {}", crate::chain(&e));
            // An uplink interface that cannot be used as configured is a config error.
            match e.downcast_ref::<qswitch_dp::SwitchError>() {
                Some(qswitch_dp::SwitchError::AfXdp { .. }) => ExitCode::from(EXIT_CONFIG),
                _ => ExitCode::from(1),
            }
        }
    }
}

/// Raises the soft open-file limit to the hard one (a service starts with 1024 under
/// systemd: about 750 idle vhost-user ports) and refuses to start, in one line, when even
/// that is below what `ports` ports need at the least.
fn open_file_limit(ports: usize) -> Result<(), String> {
    let need = qswitch_sys::rlimit::nofile_for_ports(ports as u64);
    let (soft, hard) = match qswitch_sys::rlimit::raise_nofile() {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit (RLIMIT_NOFILE)");
            qswitch_sys::rlimit::nofile().map_err(|e| format!("cannot read RLIMIT_NOFILE: {e}"))?
        }
    };
    if soft < need {
        return Err(format!(
            "{ports} ports need at least {need} open files, but RLIMIT_NOFILE is {soft} \
             (hard limit {hard}): raise it (LimitNOFILE= in the service unit, ulimit -Hn)"
        ));
    }
    tracing::debug!(soft, hard, need, "open-file limit");
    Ok(())
}

/// Confines this thread, and so every thread the daemon starts from here on (control,
/// vhost-user protocol, QoS allocator, housekeeping, HTTP), to the online CPUs that run no
/// worker, when there are any: a control-plane tick on a worker's CPU preempts a busy-polling
/// worker (seed 003: cross-core wake-ups and context switches are what cost). Workers pin
/// themselves to their own CPUs.
fn keep_off_worker_cpus(online: &[usize], workers: &[usize]) {
    let others: Vec<usize> = online
        .iter()
        .copied()
        .filter(|c| !workers.contains(c))
        .collect();
    if others.is_empty() {
        return;
    }
    match qswitch_sys::thread::set_current_thread_cpus(&others) {
        Ok(()) => tracing::debug!(cpus = ?others, "control-plane threads kept off the worker CPUs"),
        Err(e) => {
            tracing::warn!(error = %e, "cannot keep control-plane threads off the worker CPUs")
        }
    }
}

/// The 1-s sampler's memory between seconds: what lets a second in which nothing moved
/// cost nothing per port.
#[derive(Default)]
struct Sampler {
    /// The switch's [`Switch::activity`], [`Switch::epoch`] and QoS settings generation at
    /// the last full sample, when it found every port's rates zero and no QoS row to show:
    /// while they stand still (and
    /// the kernel forwards nothing by itself), the ports' counters are those of that sample.
    quiet_at: Option<(u64, u64, u64)>,
}

impl Sampler {
    /// One second: the rates, the QoS rows and a point of the history, from `prev` (the
    /// last report, which this one replaces).
    fn sample(&mut self, daemon: &Daemon, prev: &mut StatsReport, qos_gauges: &mut Vec<String>) {
        let sw = &daemon.switch;
        // Read before the counters: a frame moved after it shows at the next second.
        let mark = (sw.activity(), sw.epoch(), sw.qos_generation());
        if self.quiet_at == Some(mark) && !sw.kernel_forwards() {
            let mut cur = sw.stats_quiet();
            // The ports' counters and the workers' queue lists are the last full report's:
            // set aside, so that nothing below copies them.
            let ports = std::mem::take(&mut prev.ports);
            let queues: Vec<Vec<String>> = prev
                .workers
                .iter_mut()
                .map(|w| std::mem::take(&mut w.queues))
                .collect();
            let mut rates = daemon.rates.lock();
            let mut r = Rates::between(prev, &cur);
            // The ports' rates stay the zeros they were.
            r.ports = rates.take().map(|old| old.ports).unwrap_or_default();
            *rates = Some(r);
            drop(rates);
            feed_firewall(daemon);
            daemon
                .history
                .lock()
                .push_quiet(prev, &cur, crate::series::unix_ms());
            cur.ports = ports;
            for (w, q) in cur.workers.iter_mut().zip(queues) {
                w.queues = q;
            }
            *prev = cur;
            return;
        }
        let cur = sw.stats();
        let rates = Rates::between(prev, &cur);
        let zero = rates
            .ports
            .iter()
            .all(|p| p.rx_pps == 0.0 && p.tx_pps == 0.0 && p.drops_ps == 0.0);
        *daemon.rates.lock() = Some(rates);
        // Only the ports QoS is configured on, without histories: the rows need no more.
        let qos = sw.qos_show_configured();
        feed_firewall(daemon);
        let mut history = daemon.history.lock();
        feed_qos(&mut history, &qos, qos_gauges);
        history.push(prev, &cur, crate::series::unix_ms());
        drop(history);
        self.quiet_at = (zero && qos.ports.is_empty()).then_some(mark);
        *prev = cur;
    }
}

/// Puts the QoS settings and allocations into the history: the dashboard's QoS table (every
/// port with a setting, as `qos show` lists them: see [`crate::http::qos_rows`]) and one
/// gauge per shaped port, `qos.<port>.alloc_bps`, on every following one-second point. No
/// setting anywhere: "no QoS configured", and the gauges go.
fn feed_qos(
    history: &mut crate::series::History,
    qos: &qswitch_api::request::QosReport,
    gauges: &mut Vec<String>,
) {
    for g in gauges.drain(..) {
        history.clear_gauge(&g);
    }
    let rows = crate::http::qos_rows(qos);
    for r in rows.iter().filter(|r| r.alloc_bps > 0.0) {
        let g = format!("qos.{}.alloc_bps", r.port);
        history.set_gauge(&g, r.alloc_bps);
        gauges.push(g);
    }
    history.set_qos((!rows.is_empty()).then_some(rows));
}

/// The firewall's new connections per second and port, for `ct stats` and `/metrics`:
/// once a second, the zones' counts of connections opened (counters only, no table walk)
/// against the last second's. Nothing while no port is filtered and nothing was counted.
fn feed_firewall(daemon: &Daemon) {
    let fw = daemon.switch.firewall();
    let mut last = daemon.fw_new.lock();
    if !fw.active() && last.is_empty() {
        return;
    }
    let zones = fw.stats().zones;
    *last = zones
        .iter()
        .map(|z| {
            let before = last.get(&z.zone).map_or(z.new, |&(n, _)| n);
            (z.zone, (z.new, z.new.saturating_sub(before)))
        })
        .collect();
}

/// Opens the waiting ports as their interfaces appear ([`Switch::attach_waiting`] on each
/// `RTM_NEWLINK`), until none waits or the daemon stops. The first look is after the watch
/// was opened, so an interface that appeared since start-up is not missed.
fn watch_links(watch: &qswitch_sys::rtnl::LinkWatch, switch: &Switch, term: &AtomicBool) {
    let mut changed = true;
    while !term.load(Ordering::Relaxed) && !switch.stopping() {
        if changed && switch.attach_waiting() == 0 {
            return;
        }
        changed = match watch.wait(Duration::from_millis(200)) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "link notifications failed: waiting ports stay down");
                return;
            }
        };
    }
}

fn config_error(e: &qswitch_api::ConfigError) -> ExitCode {
    eprintln!("qswitch: {e}");
    ExitCode::from(EXIT_CONFIG)
}

fn serve(
    mut persist: crate::state::Persist,
    live: crate::state::Live,
    text: &str,
    file: &Config,
    cpus: &[usize],
) -> anyhow::Result<()> {
    let config = &live.config;
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, term.clone()).context("cannot install signal handler")?;
    }
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())
        .context("cannot install signal handler")?;
    let admin_gid = match &config.switch.admin_group {
        Some(group) => Some(
            qswitch_sys::thread::group_id(group)
                .with_context(|| format!("[switch] admin_group = \"{group}\""))?,
        ),
        None => None,
    };
    for dir in config.switch.socket_dir_list() {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).map_or(0, |m| m.permissions().mode());
        if mode & 0o002 != 0 {
            tracing::warn!(
                dir = %dir.display(),
                "a socket directory is writable by everyone: its paths can be swapped for \
                 links between qswitch's checks and its use (set [switch] socket_dirs)"
            );
        }
    }
    let socket = control::Socket::bind(&config.switch.control)?.with_policy(control::Policy {
        owner: qswitch_sys::thread::euid(),
        admin_gid,
        socket_dirs: config.switch.socket_dir_list(),
    });
    // The socket's group reaches it: control_group (readers; admins must be in it too), or
    // admin_group alone.
    if let Some(group) = config
        .switch
        .control_group
        .as_ref()
        .or(config.switch.admin_group.as_ref())
    {
        crate::sdnotify::share_with_group(&config.switch.control, group)?;
    }
    let http = match config.switch.http.map(qswitch_api::HttpAddr::get) {
        Some(addr) => Some((addr, crate::http::bind(addr, &config.switch.http_hosts)?)),
        None => None,
    };
    let vhost_group = match &config.switch.vhost_group {
        Some(group) => Some(
            qswitch_sys::thread::group_id(group)
                .with_context(|| format!("[switch] vhost_group = \"{group}\""))?,
        ),
        None => None,
    };
    let options = qswitch_dp::Options {
        fdb_aging: Duration::from_secs(config.switch.fdb_aging.get()),
        poll_spin: Duration::from_micros(config.switch.poll_spin_us.get()),
        reserved: config.switch.reserved_list(),
        placement: config.switch.placement,
        topology: None,
        reservable: config.switch.reservable.get(),
        vhost_group,
        firewall: config.firewall,
        security_groups: config.security_groups.clone(),
        ..qswitch_dp::Options::default()
    };
    let switch = Switch::start(cpus, &options)?;
    // All at once: no frame is switched before every configured port is there. A veth or
    // afxdp port whose interface is missing waits for it, down, and keeps no other port
    // from starting (issue 27 F6).
    let waiting = switch.add_ports_or_wait(&config.ports)?;
    for m in &config.mirrors {
        // Checked with the config; a session on a port still waiting for its interface
        // cannot start (and is not recorded).
        if let Err(e) = switch.mirror_add(m) {
            tracing::warn!(mirror = %m.name, error = %e, "mirror session not started");
        }
    }
    let mut pins = live.pins.clone();
    pins.retain(|(port, queue), cpu| {
        // A waiting port's pins stay recorded; they apply at a start where it opens.
        if waiting.contains(port) {
            return true;
        }
        match switch.pin(port, *queue, Some(*cpu)) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(port = %port, queue, cpu, error = %e, "recorded pin dropped");
                false
            }
        }
    });
    // The state now reconciled with this file.
    persist.commit(
        &switch,
        live.config.switch.clone(),
        pins,
        Some((file.clone(), text.to_string())),
    )?;
    let daemon = Arc::new(Daemon {
        switch,
        rates: Mutex::new(None),
        fw_new: Mutex::default(),
        history: Mutex::new(crate::series::History::new()),
        persist: Mutex::new(persist),
        captures: Default::default(),
        export: Default::default(),
    });
    daemon
        .export
        .configure(&daemon.switch, config.switch.ipfix, config.switch.sflow)?;
    let exporter = {
        let (daemon, term) = (daemon.clone(), term.clone());
        let d = daemon.clone();
        d.switch
            .spawn("qs-export", move || {
                crate::export::run(&daemon.export, &daemon.switch, &term)
            })
            .context("cannot start the export thread")?
    };
    let server = {
        let (daemon, term) = (daemon.clone(), term.clone());
        let d = daemon.clone();
        d.switch
            .spawn("qs-control", move || control::serve(socket, &daemon, &term))
            .context("cannot start the control thread")?
    };
    let http_server = match http {
        Some((addr, listener)) => {
            let (daemon, term) = (daemon.clone(), term.clone());
            let d = daemon.clone();
            let t = d
                .switch
                .spawn("qs-http", move || {
                    crate::http::serve(listener, &daemon, &term)
                })
                .context("cannot start the http thread")?;
            tracing::info!(
                "http on http://{addr}/ (/metrics, /api/series, /api/stats, /api/ports, /api/placement)"
            );
            Some(t)
        }
        None => None,
    };
    // Ports waiting for their interface: a thread sleeps on the kernel's link notifications
    // and opens them when their interfaces appear; it ends when none waits any more.
    let links = if waiting.is_empty() {
        None
    } else {
        let (daemon, term) = (daemon.clone(), term.clone());
        let d = daemon.clone();
        let watch = qswitch_sys::rtnl::LinkWatch::open()
            .context("cannot watch for the interfaces of waiting ports")?;
        let t = d
            .switch
            .spawn("qs-links", move || {
                watch_links(&watch, &daemon.switch, &term)
            })
            .context("cannot start the link watcher thread")?;
        Some(t)
    };
    // EVPN: a control-plane thread mirrors the VXLAN ports into FRR's kernel view.
    let evpn = if config.switch.evpn {
        let (daemon, term) = (daemon.clone(), term.clone());
        let d = daemon.clone();
        let t = d
            .switch
            .spawn("qs-evpn", move || {
                let mut evpn = crate::evpn::Evpn::default();
                while !term.load(Ordering::Relaxed) && !daemon.switch.stopping() {
                    evpn.tick(&daemon.switch);
                    for _ in 0..10 {
                        if term.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
                evpn.shutdown();
            })
            .context("cannot start the evpn thread")?;
        Some(t)
    } else {
        None
    };
    tracing::info!(
        workers = ?cpus,
        ports = config.ports.len(),
        control = %config.switch.control.display(),
        "qswitch running"
    );
    crate::sdnotify::notify("READY=1");
    let mut prev = daemon.switch.stats();
    let mut qos_gauges: Vec<String> = Vec::new();
    let mut sampler = Sampler::default();
    let mut next = Instant::now() + Duration::from_secs(1);
    let mut failure = None;
    while !term.load(Ordering::Relaxed) && !daemon.switch.stopping() {
        // Signals are seen within SIGNAL_POLL; the sampler runs on the second.
        let wait = next
            .saturating_duration_since(Instant::now())
            .min(SIGNAL_POLL);
        if let Some(msg) = daemon.switch.wait_failed(Some(wait)) {
            failure = Some(msg);
            break;
        }
        if hup.swap(false, Ordering::Relaxed) {
            tracing::info!(
                "SIGHUP: reloading {}",
                daemon.persist.lock().config_path().display()
            );
            match daemon.change(qswitch_api::Request::Reload) {
                qswitch_api::Response::Reloaded { changes } if changes.is_empty() => {
                    tracing::info!("reload: nothing changed")
                }
                qswitch_api::Response::Error { message } => {
                    tracing::error!("reload failed: {message}")
                }
                _ => {}
            }
        }
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            sampler.sample(&daemon, &mut prev, &mut qos_gauges);
        }
    }
    // A thread that failed stops the switch by itself; a signal stops it by request.
    let failure = failure
        .or_else(|| daemon.switch.failed())
        .or_else(|| (!term.load(Ordering::Relaxed)).then(|| "a worker failed".to_string()));
    if let Some(msg) = &failure {
        tracing::error!("{msg}");
    }
    crate::sdnotify::notify("STOPPING=1");
    tracing::info!("stopping");
    term.store(true, Ordering::Relaxed);
    daemon.export.wake();
    let _ = server.join();
    let _ = exporter.join();
    if let Some(t) = http_server {
        let _ = t.join();
    }
    if let Some(t) = evpn {
        let _ = t.join();
    }
    if let Some(t) = links {
        let _ = t.join();
    }
    daemon.switch.shutdown();
    if let Some(msg) = failure {
        anyhow::bail!("{msg}");
    }
    tracing::info!("stopped");
    Ok(())
}
