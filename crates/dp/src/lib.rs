//! The qswitch datapath: ports, pinned poll-mode workers, MAC learning and counters.
//!
//! ```text
//!  rx queue (port p, queue q) ── owned by exactly one worker (pinned thread, one CPU)
//!     │ rx_burst: ≤ 32 frames into the worker's own buffers (no allocation)
//!     ▼
//!  classify L2 (qswitch-wire) ── runt / oversize / bad source / tagged → counted drop
//!     ▼
//!  learn (MAC, VLAN) → port ; look up destination → port | flood (same VLAN, never back out)
//!     ▼
//!  tx_burst once per destination, in arrival order ; counters added once per burst
//! ```
//!
//! # Modules
//! - [`switch`]: the port table, the workers, and live add/remove of ports.
//! - [`worker`]: the poll loop, batch semantics and adaptive polling.
//! - [`port`]: the [`port::Port`] trait and the TAP, gen and (tests) inject ports.
//! - [`fdb`]: the MAC learning table with aging.
//! - [`packet`]: packet buffers with virtio-net header headroom; bursts.
//! - [`rss`]: the Toeplitz hash (Microsoft's RSS) and the 128-entry indirection table.
//! - [`qos`]: port QoS — the rate allocator, token buckets, admission control.
//! - [`placement`]: which CPU each rx queue runs on (disjoint, SMT- and NUMA-aware sets).
//! - [`balance`]: dynamic placement: coalesce queues at low load, spread them at high load.
//! - [`stats`]: single-writer counters and the drop reasons.
//! - [`ids`]: `PortId`, `WorkerId`.
//! - [`report`]: per-second rates from two counter snapshots.
//!
//! # Limitations
//! Ports are access ports: 802.1Q-tagged frames are dropped (counted as `vlan_tagged`), and a
//! port's `vlan` decides its flooding and learning domain. Dynamic placement moves whole rx
//! queues; one hot queue cannot be split over workers.

#![deny(unsafe_code)]

pub mod balance;
pub mod fdb;
pub mod ids;
pub mod packet;
pub mod placement;
pub mod port;
pub mod qos;
pub mod report;
pub mod rss;
pub mod stats;
pub mod switch;
pub mod worker;

pub use ids::{PortId, WorkerId};
pub use switch::{Options, Switch, SwitchError};
