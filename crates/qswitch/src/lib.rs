//! `qswitch`: the daemon and its control CLI as a library; `main.rs` is the thin binary.
//!
//! Nothing here installs tools or starts namespaces: that is the lab (`qswitch-lab`), which
//! only `qswitch bench` and `qswitch demo` reach.
//!
//! # Modules
//! - [`daemon`]: `qswitch run` — config, switch, control socket, 1-second stats sampler.
//! - [`control`]: the control socket server (newline-delimited JSON, mode 0600).
//! - [`http`]: the HTTP server (`/metrics`, JSON API, dashboard) on `[switch] http`.
//! - [`metrics`]: Prometheus text exposition of every counter.
//! - [`series`]: the 15-minute, 1-second history behind the JSON API and the dashboard.
//! - [`capture`]: `qswitch capture` (streamed over the control socket, written as pcapng)
//!   and `qswitch trace` (a dry run of the switching decision).
//! - [`cli`]: control subcommands (`port`, `fdb`, `stats`, `qos`) and how they print.
//! - [`rss_cli`]: `qswitch rss` — Toeplitz hashes and indirection tables.
//! - [`placement_cli`]: `qswitch placement` — where each rx queue runs, pins, mode.
//! - [`state`]: live changes recorded (atomically) and reapplied at start; `config dump`.
//! - [`reload`]: `qswitch reload` / SIGHUP — apply what changed in the config file.
//! - [`sdnotify`]: systemd readiness notification and the control socket's group.
//!
//! The control client itself is `qswitch_api::client` (shared with the lab and the tests).

pub mod capture;
pub mod cli;
pub mod control;
pub mod daemon;
pub mod evpn;
pub mod export;
pub mod firewall_cli;
pub mod http;
pub mod metrics;
pub mod placement_cli;
pub mod reload;
pub mod rss_cli;
pub mod sdnotify;
pub mod series;
pub mod state;

/// An error and its causes on one line: "a: b: c".
pub fn chain(e: &anyhow::Error) -> String {
    e.chain()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(": ")
}
