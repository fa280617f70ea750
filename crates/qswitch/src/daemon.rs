//! `qswitch run`: load and validate the config, start the switch and its ports, serve the
//! control socket, sample counters every second, and stop cleanly on SIGINT/SIGTERM.

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

/// What the control thread needs.
pub struct Daemon {
    pub switch: Switch,
    /// Rates over the most recent complete second.
    pub rates: Mutex<Option<Rates>>,
    /// The last 15 minutes, one point per second (for the HTTP API and the dashboard).
    pub history: Mutex<crate::series::History>,
}

impl Daemon {
    /// Counters now, with the latest per-second rates.
    pub fn stats(&self) -> StatsReport {
        let mut r = self.switch.stats();
        r.rates = self.rates.lock().clone();
        r
    }
}

/// Runs the daemon until SIGINT/SIGTERM. Config errors exit with [`EXIT_CONFIG`].
pub fn run(path: &Path) -> ExitCode {
    let config = match Config::load(path) {
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
    let workers = match config.validate(&online) {
        Ok(w) => w,
        Err(e) => return config_error(&e),
    };
    keep_off_worker_cpus(&online, workers.cpus());
    match serve(&config, workers.cpus()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qswitch: {}", crate::chain(&e));
            ExitCode::from(1)
        }
    }
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

/// Puts the QoS settings and allocations into the history: the dashboard's QoS table (ports
/// that compete for an uplink) and one gauge per such port, `qos.<port>.alloc_bps`, on every
/// following one-second point. No uplink: "no QoS configured", and the gauges go.
fn feed_qos(
    history: &mut crate::series::History,
    qos: &qswitch_api::request::QosReport,
    gauges: &mut Vec<String>,
) {
    for g in gauges.drain(..) {
        history.clear_gauge(&g);
    }
    let rows: Vec<crate::series::QosRow> = qos
        .ports
        .iter()
        .filter(|p| p.uplink.is_some())
        .map(|p| crate::series::QosRow {
            port: p.name.clone(),
            min_bps: p.min.unwrap_or(0) as f64,
            max_bps: p.max.unwrap_or(0) as f64,
            alloc_bps: p.alloc_bps.unwrap_or(0) as f64,
        })
        .collect();
    for r in &rows {
        let g = format!("qos.{}.alloc_bps", r.port);
        history.set_gauge(&g, r.alloc_bps);
        gauges.push(g);
    }
    history.set_qos((!rows.is_empty()).then_some(rows));
}

fn config_error(e: &qswitch_api::ConfigError) -> ExitCode {
    eprintln!("qswitch: {e}");
    ExitCode::from(EXIT_CONFIG)
}

fn serve(config: &Config, cpus: &[usize]) -> anyhow::Result<()> {
    let term = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, term.clone()).context("cannot install signal handler")?;
    }
    let socket = control::Socket::bind(&config.switch.control)?;
    let http = match config.switch.http.map(qswitch_api::HttpAddr::get) {
        Some(addr) => Some((addr, crate::http::bind(addr)?)),
        None => None,
    };
    let options = qswitch_dp::Options {
        fdb_aging: Duration::from_secs(config.switch.fdb_aging.get()),
        poll_spin: Duration::from_micros(config.switch.poll_spin_us.get()),
        reserved: config.switch.reserved_list(),
        placement: config.switch.placement,
        topology: None,
        reservable: config.switch.reservable.get(),
    };
    let switch = Switch::start(cpus, &options)?;
    // All at once: no frame is switched before every configured port is there.
    switch.add_ports(&config.ports)?;
    let daemon = Arc::new(Daemon {
        switch,
        rates: Mutex::new(None),
        history: Mutex::new(crate::series::History::new()),
    });
    let server = {
        let (daemon, term) = (daemon.clone(), term.clone());
        std::thread::Builder::new()
            .name("qs-control".into())
            .spawn(move || control::serve(socket, &daemon, &term))
            .context("cannot start the control thread")?
    };
    let http_server = match http {
        Some((addr, listener)) => {
            let (daemon, term) = (daemon.clone(), term.clone());
            let t = std::thread::Builder::new()
                .name("qs-http".into())
                .spawn(move || crate::http::serve(listener, &daemon, &term))
                .context("cannot start the http thread")?;
            tracing::info!(
                "http on http://{addr}/ (/metrics, /api/series, /api/stats, /api/ports, /api/placement)"
            );
            Some(t)
        }
        None => None,
    };
    // EVPN: a control-plane thread mirrors the VXLAN ports into FRR's kernel view.
    let evpn = if config.switch.evpn {
        let (daemon, term) = (daemon.clone(), term.clone());
        let t = std::thread::Builder::new()
            .name("qs-evpn".into())
            .spawn(move || {
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
    let mut prev = daemon.switch.stats();
    let mut qos_gauges: Vec<String> = Vec::new();
    let mut next = Instant::now() + Duration::from_secs(1);
    while !term.load(Ordering::Relaxed) && !daemon.switch.stopping() {
        std::thread::sleep(Duration::from_millis(50));
        if Instant::now() >= next {
            next += Duration::from_secs(1);
            let cur = daemon.switch.stats();
            *daemon.rates.lock() = Some(qswitch_dp::report::rates(&prev, &cur));
            let qos = daemon.switch.qos_show();
            let mut history = daemon.history.lock();
            feed_qos(&mut history, &qos, &mut qos_gauges);
            history.push(&prev, &cur, crate::series::unix_ms());
            drop(history);
            prev = cur;
        }
    }
    // A worker that failed stops the switch by itself; a signal stops it by request.
    let worker_failed = !term.load(Ordering::Relaxed);
    tracing::info!("stopping");
    term.store(true, Ordering::Relaxed);
    let _ = server.join();
    if let Some(t) = http_server {
        let _ = t.join();
    }
    if let Some(t) = evpn {
        let _ = t.join();
    }
    daemon.switch.shutdown();
    if worker_failed {
        anyhow::bail!("a worker failed; see the log above");
    }
    tracing::info!("stopped");
    Ok(())
}
