//! Flow export (issue 32): per-worker flow caches with sampling, and the IPFIX (RFC 7011)
//! and sFlow v5 encoders that turn what they hold into UDP payloads for a collector.
//!
//! The cache and encoders are pure and thread-free: frames and the time are passed in,
//! records and datagrams are returned. [`tap`] is where the workers feed the caches (one
//! call from [`crate::engine`] per burst, only while export is on); the daemon's exporter
//! thread takes what they hold and sends it (docs/visibility.md).

pub mod cache;
pub mod ipfix;
pub mod sflow;
pub mod tap;

pub use cache::{CacheConfig, CacheStats, EndReason, FlowCache, FlowKey, FlowRecord};
pub use ipfix::IpfixEncoder;
pub use sflow::{FlowSample, IfCounters, Sampler, SflowEncoder};
pub use tap::{ExportTap, TapConfig};

#[cfg(test)]
mod tests;
