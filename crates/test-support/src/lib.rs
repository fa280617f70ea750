//! `qswitch-test-support`: helpers the integration tests share, in one place instead of a
//! copy per test directory. A dev-dependency only.
//!
//! # Modules
//! - [`skip`]: skip or fail — [`skip::skip`], [`skip::root_or_skip`], [`skip::cpus_or_skip`];
//!   with `QSWITCH_REQUIRE_PRIVILEGED=1` (CI) a test that cannot run fails instead.
//! - [`harness`]: bounded command runs, temp dirs, child guards, a `qswitch run` child
//!   ([`harness::DaemonChild`]), raw control-socket requests, network namespaces, testpmd set-up.
//! - [`guest`]: small QEMU/Linux guests with one virtio-net NIC (built by
//!   `tests/guest/build.sh`), for the vhost-user tests.
//! - [`frames`]: Ethernet/IPv4/TCP/UDP frame builders and checksum checks; the firewall's
//!   IPv4/IPv6 frames between any addresses.
//! - [`firewall`]: security group rules the firewall's tests and benches share.
//! - Real peers and collectors, one module per tool: [`lldpd`] (an LLDP partner in a
//!   namespace), [`ovs`] (Open vSwitch's userspace datapath as a LACP partner), [`nfdump`]
//!   (`nfcapd` + `nfdump` as the IPFIX collector), [`tshark`] (sFlow in a pcap, decoded).
//!
//! Everything cleans up after itself on drop (also when a test panics), and no wait is
//! unbounded.

pub mod firewall;
pub mod frames;
pub mod guest;
pub mod harness;
pub mod lldpd;
pub mod nfdump;
pub mod ovs;
pub mod skip;
pub mod tshark;

pub use harness::*;
pub use skip::{cpus_or_skip, have_tool, is_root, online_cpus, require, root_or_skip, skip};
