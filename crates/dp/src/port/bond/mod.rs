//! The protocol cores of a bond port: [`lacp`] (IEEE 802.1AX link aggregation, per member)
//! and [`lldp`] (IEEE 802.1AB neighbour table and transmitter, for uplinks and members).
//! Both are pure state machines (time passed in, frames in and out as values, no threads, no
//! I/O), tested on their own and against real partners: Open vSwitch in
//! crates/dp/tests/bond_lacp.rs, lldpd in crates/dp/tests/bond_lldp.rs. The bond port itself
//! (`type = "bond"`) is not built yet: see docs/teaming.md.

pub mod lacp;
pub mod lldp;
