//! Types shared by the qswitch daemon and its CLI: the configuration file ([`config`]), its
//! typed values ([`value`], [`cpulist`]) and the control protocol ([`request`]). No datapath
//! code lives here, so the CLI stays small and the protocol is one definition for both sides.
//!
//! # Modules
//! - [`client`]: one request and its reply over the control socket (CLI, demo, bench, tests).
//! - [`config`]: `qswitch.toml` parsed into typed values ([`PortConfig`] with a [`PortKind`]
//!   per port type), one-line errors naming line and key, and the cross-field checks.
//! - [`value`]: newtypes that parse into their meaning: rates, MAC addresses, interface
//!   names, socket paths, VLAN ids, ...
//! - [`cpulist`]: `"0-3"`, `"2-14:2"`, `"1,3"`.
//! - [`request`]: [`Request`] / [`Response`], newline-delimited JSON over the control socket.
//! - [`rates`]: per-second rates from two counter snapshots ([`request::Rates::between`]).

#![forbid(unsafe_code)]

pub mod bond;
pub mod client;
pub mod config;
pub mod cpulist;
pub mod policy;
pub mod rates;
pub mod request;
pub mod value;

pub use config::{
    AfXdpConfig, BondConfig, BondMember, BondMode, Config, ConfigError, GenConfig, GenIp,
    GenPortConfig, LacpMode, LacpRate, ModeKey, PlacementMode, PortConfig, PortError, PortKeys,
    PortKind, PortType, QosConfig, QosError, QosSettings, SwitchConfig, TapConfig, VhostMode,
    VhostUserConfig, VxlanConfig, XdpMode,
};
pub use cpulist::{CpuList, CpuListError};
pub use request::{Request, Response};
pub use value::{
    HttpAddr, IfName, MacAddress, PortName, Rate, SocketPath, UnicastMac, VlanId, Weight,
};
