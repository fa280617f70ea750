//! Receive-side scaling: the Toeplitz hash of a flow picks an entry of an indirection table,
//! which names the queue.
//!
//! ```text
//!  FlowKey ── Toeplitz (key of 40+ bytes; addresses [+ ports], source first) ── u32 hash
//!     hash & 127 ── Reta (128 entries, enabled queues round-robin) ── queue
//!  not IP ── Reta::queue_for_non_ip (the first enabled queue)
//! ```
//!
//! Used to pick the destination queue of a multi-queue port, so that one flow always lands on
//! the same guest queue (and vCPU), and optionally to spread one port's receive work over
//! several workers. The hash is Microsoft's, checked against its published verification table;
//! [`Toeplitz::hash_flow_symmetric`] is a symmetric variant that is not.
//!
//! - [`toeplitz`]: the hash, table-driven, with the bit-by-bit reference.
//! - [`reta`]: the indirection table.

pub mod reta;
pub mod toeplitz;

pub use reta::{Reta, RETA_SIZE};
pub use toeplitz::{KeyError, Toeplitz, DEFAULT_KEY};
