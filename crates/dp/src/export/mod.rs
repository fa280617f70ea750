//! Flow export (issue 32): per-worker flow caches with sampling, and the IPFIX (RFC 7011)
//! and sFlow v5 encoders that turn what they hold into UDP payloads for a collector.
//!
//! Everything here is pure and thread-free: frames and the time are passed in, records and
//! datagrams are returned. Feeding the caches from the forwarding path and sending the
//! datagrams are not wired yet (docs/visibility.md says what is).

pub mod cache;
pub mod ipfix;
pub mod sflow;

pub use cache::{CacheConfig, CacheStats, EndReason, FlowCache, FlowKey, FlowRecord};
pub use ipfix::IpfixEncoder;
pub use sflow::{FlowSample, IfCounters, Sampler, SflowEncoder};

#[cfg(test)]
mod tests;
