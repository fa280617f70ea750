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
//! Two rooms: what runs per frame (the hot path, the modules at this level) and what runs
//! per change ([`control`]). The hot path never imports the control side; the control side
//! builds what the workers read (the port table, the queue lists, QoS allocations) and
//! publishes it.
//!
//! Hot path:
//! - [`engine`]: the forwarding engine: one burst classified, learned, looked up, flooded,
//!   admitted by QoS and transmitted, with no threads and time passed in.
//! - [`worker`]: the worker thread: a loop around the engine, adaptive spin, sleep in epoll.
//! - [`table`]: the port table and the state the switch shares with its workers.
//! - [`port`]: the [`port::Port`] trait and the port kinds (TAP, veth, AF_XDP, vhost-user,
//!   VXLAN, gen and, for tests, inject).
//! - [`policy`]: per-port VLAN trunks, port security and storm control.
//! - [`fdb`]: the MAC learning table with aging.
//! - [`packet`]: packet buffers with virtio-net header headroom; bursts.
//! - [`rss`]: the Toeplitz hash (Microsoft's RSS) and the 128-entry indirection table.
//! - [`qos`]: port QoS as the workers see it: token buckets, admission per poll.
//! - [`capture`]: packet capture taps (a bounded ring per capture, drained by the control
//!   side) and [`trace`]: what the switch would do with a frame, without doing it.
//! - [`link_local`]: link-local groups (relay, BPDU guard).
//! - [`stats`]: single-writer counters and the drop reasons.
//! - [`ids`]: `PortId`, `WorkerId`, `CpuId`.
//!
//! Control side ([`control`]):
//! - [`control::switch`]: the [`Switch`]: port lifecycle, the placement runtime, reports,
//!   start-up (threads, or none under a manual clock), the port kinds' drivers; every change
//!   under one lock.
//! - [`control::placement`]: which CPU each rx queue runs on (disjoint, SMT- and NUMA-aware
//!   sets).
//! - [`control::balance`]: dynamic placement: coalesce queues at low load, spread them at
//!   high load.
//!
//! # Limitations
//! One 802.1Q tag is understood (trunks, see [`engine`]); 802.1ad double tags are not.
//! Dynamic placement moves whole rx queues; one hot queue cannot be split over workers.

#![deny(unsafe_code)]

pub mod capture;
pub mod control;
pub mod engine;
pub mod export;
pub mod fdb;
pub mod firewall;
pub mod ids;
pub mod link_local;
pub mod lldp;
pub mod packet;
pub(crate) mod pipeline;
pub mod policy;
pub mod port;
pub mod qos;
pub mod rss;
pub mod stats;
pub mod table;
pub mod trace;
pub mod worker;

pub use control::switch::{Options, Record, RecordGroups, Switch, SwitchError};
pub use ids::{CpuId, PortId, WorkerId};
pub use pipeline::mirror;
