//! The control side: what runs per change, never per frame.
//!
//! The workers run the hot path (the modules beside this one: [`crate::engine`],
//! [`crate::worker`], [`crate::table`], [`crate::port`] ...) and read what this side
//! publishes; nothing on the hot path imports this module (`crates/qswitch/tests/structure.rs`
//! checks it).
//!
//! | module | job |
//! |---|---|
//! | [`switch`] | the [`Switch`](switch::Switch) handle: port lifecycle, the placement runtime that rebuilds and publishes the port table and the workers' queue lists, reports, start-up, the port kinds' drivers |
//! | [`placement`] | which CPU each rx queue runs on: the static plan (disjoint, SMT- and NUMA-aware sets) |
//! | [`balance`] | dynamic placement: coalesce queues at low load, spread them at high load |

pub mod balance;
pub mod placement;
pub mod qos;
pub mod switch;
