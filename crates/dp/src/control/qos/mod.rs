//! Port QoS, the control side: admission control (the guarantees toward an uplink fit its
//! capacity), settings changes, the allocator ([`alloc::allocate`], run by the `qs-qos`
//! thread every [`TICK`]) and `qos show`.
//!
//! What the workers read and charge per burst (a port's token bucket and its published
//! allocation, [`PortQos`]) is the hot path's, in [`crate::qos`]; it is named here too so
//! that the switch finds everything of QoS in one place.

pub mod alloc;
pub(crate) mod ops;

pub use ops::bond_capacity;

pub use crate::qos::{PortQos, QosUpdate, TICK};
