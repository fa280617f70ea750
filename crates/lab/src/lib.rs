//! `qswitch-lab`: everything qswitch needs to measure and show itself, kept out of the daemon.
//! Only `qswitch bench` and `qswitch demo` reach this crate, so only they start namespaces,
//! peers (iperf3, OVS-DPDK, testpmd) or install tools with apt-get; `qswitch run` never does.
//!
//! # Modules
//! - [`bench`]: `qswitch bench SCENARIO` — measurements next to peers, JSON + SVG.
//! - [`run`]: [`run::Run`], the one result type of a benchmark run (contender, round,
//!   position, the scenario's metrics and its per-second samples).
//! - [`load`]: `qswitch load` (hidden) — the TCP request/response and file-copy generator.
//! - [`plot`]: dependency-free SVG line and bar charts.
//! - [`netns`]: network namespaces, veths and bridges, child processes, `qswitch run` as a
//!   child, iperf3, tool installation.
//! - [`procstat`]: machine-wide CPU and context-switch counters from `/proc/stat`.
//! - [`topology`]: the two-TAP config the demo and the TAP benchmarks start qswitch with.

#![forbid(unsafe_code)]

pub mod bench;
pub mod load;
pub mod netns;
pub mod plot;
pub mod procstat;
pub mod run;
pub mod topology;
