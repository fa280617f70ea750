//! Types shared by the qswitch daemon and its CLI: the configuration file ([`config`]), CPU
//! lists ([`cpulist`]) and the control protocol ([`request`]). No datapath code lives here, so
//! the CLI stays small and the protocol is one definition for both sides.
//!
//! # Modules
//! - [`client`]: one request and its reply over the control socket (CLI, demo, bench, tests).
//! - [`config`]: `qswitch.toml`, strict parsing and validation with one-line errors.
//! - [`cpulist`]: `"0-3"`, `"2-14:2"`, `"1,3"`.
//! - [`request`]: [`Request`] / [`Response`], newline-delimited JSON over the control socket.

#![forbid(unsafe_code)]

pub mod client;
pub mod config;
pub mod cpulist;
pub mod request;

pub use config::{
    Config, ConfigError, GenConfig, PlacementMode, PortConfig, PortType, QosConfig, QosSettings,
    SwitchConfig, VhostMode,
};
pub use cpulist::{CpuList, CpuListError};
pub use request::{Request, Response};
