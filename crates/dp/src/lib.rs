//! The qswitch datapath: ports, pinned poll-mode workers, MAC learning and counters.
//!
//! ```text
//!  rx queue (port p, queue q) ── owned by exactly one worker (pinned thread, one CPU)
//!     │ rx_burst: ≤ 32 frames into the worker's own buffers (no allocation)
//!     ▼
//!  classify L2 (qswitch-wire) ── runt / oversize / bad source / VLAN not carried → counted drop
//!     │ policy (only ports that have one): port security, storm control
//!     ▼
//!  learn (MAC, VLAN) → port ; look up destination → port | flood (same VLAN, never back out)
//!     ▼
//!  tx_burst once per destination, in arrival order ; counters added once per burst
//! ```
//!
//! # Modules
//! - [`switch`]: the control plane: port lifecycle, the placement runtime, reports, start-up
//!   (threads, or none under a manual clock); every change under one lock.
//! - [`engine`]: the forwarding engine: one burst classified, learned, looked up, flooded,
//!   admitted by QoS and transmitted, with no threads and time passed in.
//! - [`worker`]: the worker thread: a loop around the engine, adaptive spin, sleep in epoll.
//! - [`table`]: the port table and the state the switch shares with its workers.
//! - [`port`]: the [`port::Port`] trait and the TAP, gen and (tests) inject ports.
//! - [`policy`]: per-port VLAN trunks, port security and storm control.
//! - [`fdb`]: the MAC learning table with aging.
//! - [`packet`]: packet buffers with virtio-net header headroom; bursts.
//! - [`rss`]: the Toeplitz hash (Microsoft's RSS) and the 128-entry indirection table.
//! - [`qos`]: port QoS — the rate allocator, token buckets, admission control.
//! - [`placement`]: which CPU each rx queue runs on (disjoint, SMT- and NUMA-aware sets).
//! - [`capture`]: packet capture taps (a bounded ring per capture, drained by the control
//!   plane) and [`trace`]: what the switch would do with a frame, without doing it.
//! - [`balance`]: dynamic placement: coalesce queues at low load, spread them at high load.
//! - [`stats`]: single-writer counters and the drop reasons.
//! - [`ids`]: `PortId`, `WorkerId`, `CpuId`.
//!
//! # Limitations
//! One 802.1Q tag is understood (trunks, see [`engine`]); 802.1ad double tags are not.
//! Dynamic placement moves whole rx queues; one hot queue cannot be split over workers.

#![deny(unsafe_code)]

pub mod balance;
pub mod capture;
pub mod engine;
pub mod fdb;
pub mod ids;
pub mod link_local;
pub mod packet;
pub(crate) mod pipeline;
pub mod placement;
pub mod policy;
pub mod port;
pub mod qos;
pub mod rss;
pub mod stats;
pub mod switch;
pub mod table;
pub mod trace;
pub mod worker;

pub use ids::{CpuId, PortId, WorkerId};
pub use switch::{Options, Switch, SwitchError};
