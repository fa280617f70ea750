//! The protocol cores of a bond port: [`lacp`] (IEEE 802.1AX link aggregation, per member).
//! It is a pure state machine (time passed in, frames in and out as values, no threads, no
//! I/O), tested on its own and against a real partner (Open vSwitch) in
//! crates/dp/tests/bond_lacp.rs. The bond port itself (`type = "bond"`) is not built yet:
//! see docs/teaming.md.

pub mod lacp;
