//! Counters: declared once, one writer each, read by anyone.
//!
//! Every counter has exactly one writing thread, so a write is a relaxed load plus a relaxed
//! store (two plain `mov`s on x86), never an atomic read-modify-write, and readers see a
//! value that may be a burst old but is never torn. Who writes what:
//!
//! | counters | writer |
//! |---|---|
//! | [`QueueCounters`] of rx queue *q* of a port | the worker that owns *q* (one owner at a time) |
//! | [`TxCounters`] slot *w* of a port | worker *w* (each worker has its own slot per port) |
//! | [`WorkerCounters`] of worker *w* | worker *w* |
//!
//! Workers add into these once per burst, not per packet. Drop reasons are declared once in
//! [`DropReason`], with the name used by the CLI, JSON and Prometheus and the pipeline
//! [`Stage`] that counts them (VPP's `foreach_*_error`); the stages are declared in the
//! same way, in pipeline order.

use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

/// A single-writer counter.
#[derive(Debug, Default)]
#[repr(transparent)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`. Only the counter's one writer may call this.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }

    /// Sets the value (for gauges). Only the one writer may call this.
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    /// Current value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

macro_rules! stages {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal, $dir:ident,)*) => {
        /// A stage of the pipeline ([`crate::pipeline`]), in the order a frame meets them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Stage { $($(#[doc = $doc])* $variant,)* }

        impl Stage {
            /// Every stage, in pipeline order.
            pub const ALL: &'static [Stage] = &[$(Stage::$variant,)*];

            /// The stage's name (in `trace` and the docs).
            pub fn name(self) -> &'static str {
                match self { $(Stage::$variant => $name,)* }
            }

            /// One line saying what the stage does.
            pub fn description(self) -> &'static str {
                match self { $(Stage::$variant => concat!($($doc),*).trim_ascii(),)* }
            }

            /// Whether the stage runs on a frame's way in (before its destinations are
            /// known) or out (per destination).
            pub fn direction(self) -> Direction {
                match self { $(Stage::$variant => Direction::$dir,)* }
            }

            /// The drop reasons the stage counts.
            pub fn reasons(self) -> impl Iterator<Item = DropReason> {
                DropReason::ALL.iter().copied().filter(move |r| r.stage() == self)
            }
        }
    };
}

/// Which way a stage sees a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

// The pipeline, one line per stage, in the order a frame meets them (the picture is in
// docs/architecture.md; `crate::pipeline` has a module per stage). A new stage is one line
// here, its module and its call in the engine; its drop reasons name it below.
stages! {
    /// The ingress port's driver receives a burst (QoS: a port out of tokens is not polled).
    Rx => "rx", Ingress,
    /// The Ethernet header is read: runts, oversize frames and bad source MACs stop here.
    Classify => "classify", Ingress,
    /// The frame's VLAN: the access VLAN, a trunk's native VLAN, or the tag's VID.
    Vlan => "vlan", Ingress,
    /// Port security: source MAC and IP, DHCP and router-advertisement guards.
    PortSecurity => "port_security", Ingress,
    /// The firewall, on ports with security groups: the ingress port's egress rules and
    /// connection tracking (docs/firewall.md).
    FirewallIn => "firewall_in", Ingress,
    /// Link-local groups 01:80:C2:00:00:0X: dropped by group, relayed, or BPDU guard.
    LinkLocal => "link_local", Ingress,
    /// The source (MAC, VLAN) is learned on the ingress port.
    Learn => "learn", Ingress,
    /// The destination is looked up in the fdb: a known port, or the VLAN's flood domain.
    Lookup => "lookup", Ingress,
    /// Storm control: broadcast, multicast and unknown unicast that would be flooded.
    StormControl => "storm_control", Ingress,
    /// Per destination: the frame leaves untagged or tagged as the port carries its VLAN.
    VlanTag => "vlan_tag", Egress,
    /// The firewall, per destination with security groups: its ingress rules and
    /// connection tracking (docs/firewall.md).
    FirewallOut => "firewall_out", Egress,
    /// The destination port's driver transmits the frames.
    Tx => "tx", Egress,
}

macro_rules! drop_reasons {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal @ $stage:ident,)*) => {
        /// Why a frame was dropped. Every drop in the datapath is counted under one of these.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum DropReason { $($(#[doc = $doc])* $variant,)* }

        impl DropReason {
            /// Every reason, in declaration order.
            pub const ALL: &'static [DropReason] = &[$(DropReason::$variant,)*];
            /// Number of reasons.
            pub const COUNT: usize = Self::ALL.len();

            /// The reason's name in the CLI, JSON and metrics.
            pub fn name(self) -> &'static str {
                match self { $(DropReason::$variant => $name,)* }
            }

            /// The pipeline stage that counts it ([`Stage`]). `oversize` (a frame that does
            /// not fit tagged) and `vlan_not_allowed` (a destination that does not carry the
            /// VLAN) are also counted at [`Stage::VlanTag`]; `port_disabled` also at
            /// [`Stage::Tx`] (a destination BPDU guard disabled); `ct_invalid`, `ct_limit`
            /// and `ct_fragment` also at [`Stage::FirewallOut`].
            pub fn stage(self) -> Stage {
                match self { $(DropReason::$variant => Stage::$stage,)* }
            }

            /// One line saying what the reason means.
            pub fn description(self) -> &'static str {
                match self { $(DropReason::$variant => concat!($($doc),*).trim_ascii(),)* }
            }
        }
    };
}

drop_reasons! {
    /// Shorter than an Ethernet header, or a truncated 802.1Q tag.
    Runt => "runt" @ Classify,
    /// Longer than the largest frame the switch accepts.
    Oversize => "oversize" @ Classify,
    /// The virtio-net header does not describe the frame (bad GSO or checksum fields).
    BadVnetHdr => "bad_vnet_hdr" @ Rx,
    /// Source MAC address is multicast or broadcast.
    BadSrcMac => "bad_src_mac" @ Classify,
    /// An 802.1Q-tagged frame arrived on an access port.
    VlanTagged => "vlan_tagged" @ Vlan,
    /// A trunk port does not carry the frame's VLAN (a tagged VID not in its `vlans`, an
    /// untagged frame with no native VLAN), or the destination does not.
    VlanNotAllowed => "vlan_not_allowed" @ Vlan,
    /// Port security: the source MAC (or ARP sender / ND link-layer address) is not in the
    /// port's `macs`.
    SrcMacNotAllowed => "src_mac_not_allowed" @ PortSecurity,
    /// Port security: the source IP (or ARP sender / ND target) is not in the port's `ips`.
    SrcIpNotAllowed => "src_ip_not_allowed" @ PortSecurity,
    /// Port security: a DHCP server message from a port with `dhcp_guard`.
    DhcpGuard => "dhcp_guard" @ PortSecurity,
    /// Port security: an IPv6 router advertisement or redirect from a port with `ra_guard`.
    RaGuard => "ra_guard" @ PortSecurity,
    /// Firewall: no rule of the ingress port's security groups allows the frame out of its VM.
    FwDeniedEgress => "fw_denied_egress" @ FirewallIn,
    /// Firewall: no rule of the destination's security groups allows the frame in.
    FwDeniedIngress => "fw_denied_ingress" @ FirewallOut,
    /// Firewall: malformed IP, or not a valid next packet of its connection (an ACK with no
    /// connection, a RST out of window).
    CtInvalid => "ct_invalid" @ FirewallIn,
    /// Firewall: a new connection over the switch's or the port's `max_sessions`.
    CtLimit => "ct_limit" @ FirewallIn,
    /// Firewall: a non-first IP fragment (docs/firewall.md, fragments).
    CtFragment => "ct_fragment" @ FirewallIn,
    /// Storm control: broadcast frames beyond the port's limit.
    StormBroadcast => "storm_broadcast" @ StormControl,
    /// Storm control: multicast frames beyond the port's limit.
    StormMulticast => "storm_multicast" @ StormControl,
    /// Storm control: unknown-unicast (flooded) frames beyond the port's limit.
    StormUnknownUnicast => "storm_unknown_unicast" @ StormControl,
    /// Link-local: an STP BPDU (to 01:80:C2:00:00:00), never relayed unless the port's
    /// `link_local_forward` has `stp`.
    Bpdu => "bpdu" @ LinkLocal,
    /// Link-local: a PAUSE frame (to 01:80:C2:00:00:01), never relayed.
    Pause => "pause" @ LinkLocal,
    /// Link-local: a slow-protocols frame (LACP, marker; to 01:80:C2:00:00:02), never relayed.
    SlowProtocols => "slow_protocols" @ LinkLocal,
    /// Link-local: an 802.1X EAPOL frame (to 01:80:C2:00:00:03), never relayed unless the
    /// port's `link_local_forward` has `eapol`.
    Eapol => "eapol" @ LinkLocal,
    /// Link-local: an LLDP frame (to 01:80:C2:00:00:0E), never relayed unless the port's
    /// `link_local_forward` has `lldp`.
    Lldp => "lldp" @ LinkLocal,
    /// Link-local: a frame to another of 01:80:C2:00:00:04-0D, 0F, never relayed unless the
    /// port's `link_local_forward` has its group.
    LinkLocal => "link_local" @ LinkLocal,
    /// A BPDU from a port with `bpdu_guard`: the port is disabled.
    BpduGuard => "bpdu_guard" @ LinkLocal,
    /// The port is disabled (BPDU guard) until `qswitch port enable`: nothing is received
    /// from it or sent to it.
    PortDisabled => "port_disabled" @ LinkLocal,
    /// The destination MAC was learned on the ingress port.
    SamePort => "same_port" @ Lookup,
    /// A flood found no other port in the ingress port's VLAN.
    NoDestination => "no_destination" @ Lookup,
    /// Reading from the port failed.
    RxError => "rx_error" @ Rx,
    /// A frame sent by a mirror session's output port, which only receives copies.
    MirrorOutput => "mirror_output" @ Rx,
    /// The destination queue was full.
    TxFull => "tx_full" @ Tx,
    /// Writing to the destination failed.
    TxError => "tx_error" @ Tx,
    /// The destination's interface is down (a TAP not up yet, or set down), so the kernel
    /// refused the write.
    LinkDown => "link_down" @ Tx,
    /// A guest's descriptor chain was malformed (out of memory, looping, too long, ...).
    BadDescriptor => "bad_descriptor" @ Tx,
    /// The destination has no usable queue (not connected, or no queue enabled).
    NoQueue => "no_queue" @ Tx,
    /// A TSO frame the destination cannot take could not be segmented.
    Offload => "offload" @ Tx,
    /// A guest sent a GSO frame of a kind it did not negotiate (HOST_TSO4/TSO6/ECN, UFO).
    OffloadNotNegotiated => "offload_not_negotiated" @ Rx,
    /// Received on a bond member that does not take such frames now: an active-backup
    /// backup, a balance-slb broadcast or multicast from a member other than the active
    /// one, or a frame whose source MAC the bond sent out (it came back).
    BondInactive => "bond_inactive" @ Rx,
}

/// Per-reason drop counters.
#[derive(Debug)]
pub struct DropCounters([Counter; DropReason::COUNT]);

// By hand: `[T; N]` derives `Default` only up to 32.
impl Default for DropCounters {
    fn default() -> DropCounters {
        DropCounters(std::array::from_fn(|_| Counter::default()))
    }
}

impl DropCounters {
    #[inline]
    pub fn add(&self, reason: DropReason, n: u64) {
        self.0[reason as usize].add(n);
    }
    pub fn get(&self, reason: DropReason) -> u64 {
        self.0[reason as usize].get()
    }
}

/// A burst-local tally of drops, added into [`DropCounters`] once per burst. It remembers
/// which reasons it counted, so that flushing a tally with no drops (nearly every burst) is
/// one branch however many reasons there are.
#[derive(Clone, Copy)]
pub struct DropTally {
    counts: [u32; DropReason::COUNT],
    /// Bit *r*: reason *r* was counted since the last flush.
    touched: u64,
}

// By hand: `[T; N]` derives `Default` only up to 32.
impl Default for DropTally {
    fn default() -> DropTally {
        DropTally {
            counts: [0; DropReason::COUNT],
            touched: 0,
        }
    }
}

// `touched` has a bit per reason.
const _: () = assert!(DropReason::COUNT <= 64);

/// The reasons counted, by name (`DropTally { oversize: 1 }`): what a tally means, whatever
/// bookkeeping (`touched`) a port's path left behind, so two tallies that count the same
/// print the same.
impl std::fmt::Debug for DropTally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("DropTally");
        for &r in DropReason::ALL {
            let n = self.counts[r as usize];
            if n != 0 {
                d.field(r.name(), &n);
            }
        }
        d.finish()
    }
}

impl DropTally {
    #[inline]
    pub fn count(&mut self, reason: DropReason) {
        self.counts[reason as usize] += 1;
        self.touched |= 1 << reason as u32;
    }
    #[inline]
    pub fn count_n(&mut self, reason: DropReason, n: u32) {
        self.counts[reason as usize] += n;
        self.touched |= 1 << reason as u32;
    }
    /// The reasons counted (and how many of each), in declaration order.
    pub fn reasons(&self) -> impl Iterator<Item = (DropReason, u32)> + '_ {
        DropReason::ALL
            .iter()
            .map(|&r| (r, self.counts[r as usize]))
            .filter(|&(_, n)| n != 0)
    }
    pub fn total(&self) -> u64 {
        self.counts.iter().map(|&n| u64::from(n)).sum()
    }
    /// Adds the tally into `into` and clears it.
    #[inline]
    pub fn flush(&mut self, into: &DropCounters) {
        let mut t = std::mem::take(&mut self.touched);
        while t != 0 {
            let i = t.trailing_zeros() as usize;
            t &= t - 1;
            let n = std::mem::take(&mut self.counts[i]);
            if n != 0 {
                into.0[i].add(u64::from(n));
            }
        }
    }
}

/// Counters of one rx queue. Aligned to 128 bytes (the adjacent-line prefetcher's
/// pair of 64-byte lines) so different workers' counters never share a line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct QueueCounters {
    pub rx_packets: Counter,
    pub rx_bytes: Counter,
    /// Nanoseconds the owning worker spent on this queue's bursts (rx, switching, tx): the
    /// load that dynamic placement balances.
    pub busy_ns: Counter,
    pub drops: DropCounters,
    /// Frames of this queue that the port's firewall let out of its VM (its egress rules
    /// or tracked connections allowed them; docs/firewall.md). Zero on ports without
    /// security groups.
    pub fw_allowed: Counter,
}

/// Counters of what one worker sent to one port. Aligned to 128 bytes (the adjacent-line prefetcher's
/// pair of 64-byte lines) so different workers' counters never share a line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct TxCounters {
    pub tx_packets: Counter,
    pub tx_bytes: Counter,
    pub drops: DropCounters,
    /// Frames this worker sent toward the port that the port's firewall let in (its
    /// ingress rules or tracked connections allowed them). Zero on ports without groups.
    pub fw_allowed: Counter,
}

/// All counters of one port.
#[derive(Debug)]
pub struct PortCounters {
    /// Indexed by rx queue.
    pub rx: Box<[QueueCounters]>,
    /// Indexed by worker id.
    pub tx: Box<[TxCounters]>,
}

impl PortCounters {
    pub fn new(queues: usize, workers: usize) -> PortCounters {
        PortCounters {
            rx: (0..queues).map(|_| QueueCounters::default()).collect(),
            tx: (0..workers).map(|_| TxCounters::default()).collect(),
        }
    }
}

/// Counters of one worker thread. Aligned to 128 bytes (the adjacent-line prefetcher's
/// pair of 64-byte lines) so different workers' counters never share a line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct WorkerCounters {
    pub busy_polls: Counter,
    pub idle_polls: Counter,
    pub busy_ns: Counter,
    pub idle_ns: Counter,
    pub sleeps: Counter,
    pub wakeups: Counter,
    /// The current adaptive spin window in nanoseconds (a gauge).
    pub spin_ns: Counter,
    /// The worker's kernel thread id, once it has started (0 before).
    pub tid: AtomicI32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_have_unique_names_and_docs() {
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), DropReason::COUNT);
        assert!(DropReason::ALL.iter().all(|r| !r.description().is_empty()));
        assert_eq!(
            DropReason::Runt.description(),
            "Shorter than an Ethernet header, or a truncated 802.1Q tag."
        );
    }

    #[test]
    fn every_reason_belongs_to_a_stage_in_pipeline_order() {
        let mut names: Vec<_> = Stage::ALL.iter().map(|s| s.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Stage::ALL.len());
        for (i, s) in Stage::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
            assert!(!s.description().is_empty());
        }
        let counted: usize = Stage::ALL.iter().map(|s| s.reasons().count()).sum();
        assert_eq!(counted, DropReason::COUNT);
        assert_eq!(DropReason::Runt.stage(), Stage::Classify);
        assert_eq!(DropReason::BpduGuard.stage(), Stage::LinkLocal);
        // Ingress stages come before egress stages.
        let dirs: Vec<_> = Stage::ALL.iter().map(|s| s.direction()).collect();
        let first_egress = dirs.iter().position(|d| *d == Direction::Egress).unwrap();
        assert!(dirs[first_egress..].iter().all(|d| *d == Direction::Egress));
    }

    #[test]
    fn tally_flushes_and_clears() {
        let c = DropCounters::default();
        let mut t = DropTally::default();
        t.count(DropReason::Runt);
        t.count_n(DropReason::TxFull, 3);
        let last = *DropReason::ALL.last().unwrap();
        t.count(last);
        assert_eq!(t.total(), 5);
        t.flush(&c);
        t.flush(&c);
        assert_eq!(c.get(DropReason::Runt), 1);
        assert_eq!(c.get(DropReason::TxFull), 3);
        assert_eq!(c.get(last), 1);
        assert_eq!(t.total(), 0);
    }
}
