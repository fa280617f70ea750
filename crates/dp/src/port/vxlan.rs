//! VXLAN ports (RFC 7348): one VNI stretched over an IP underlay to remote tunnel endpoints
//! (VTEPs), through the kernel's UDP stack.
//!
//! ```text
//!   switch (fdb: MAC → this port)              VxlanPort (vni, local, dstport)
//!   ──────────────────────────────             ─────────────────────────────────────────────
//!   tx_burst(frames) ───────────────▶ dst MAC unicast and in the remote table?
//!                                        yes → [its VTEP]       no → flood list (head-end
//!                                        │                            replication, one copy
//!                                        ▼                            per VTEP)
//!                              partial csum? complete · too big? drop (mtu)
//!                                        ▼
//!                   src port = pool[flow hash % N]  (N sockets bound to (local, 49152+…))
//!          frame:     sendmmsg: [VXLAN hdr I|VNI] + [inner frame]
//!          TSO frame: segment headers only → iovecs [hdr+seg hdrs 1][payload 1 in the
//!                     packet buffer][hdr+seg hdrs 2][payload 2]…, one sendmsg +
//!                     UDP_SEGMENT(size of one) per 64 KiB ─▶ kernel: IP/UDP, route,
//!                     neighbour, DF, checksum (offloaded), one GSO packet to the NIC
//!
//!   rx_burst ◀── recvmmsg on (local, dstport), UDP_GRO ◀── kernel: UDP checksum checked
//!      message = one datagram, or several of one size back to back (UDP_GRO cmsg)
//!      each datagram [VXLAN hdr][inner]  →  drop+count: short / I clear / other VNI /
//!      VTEP unknown (learning off) / inner too short / truncated;
//!      per frame: what the switch may learn from it (rx_learn: any source, but only a
//!      trusted VTEP's frame moves a MAC; learning off: only MACs the control plane put
//!      behind that VTEP); after the switch took the burst, learn inner src MAC → outer
//!      src IP from the frames it accepted (rx_accepted, learning on);
//!      in-order TCP segments of one flow → one TSO super-frame (wire::gro), else one frame
//!
//!   remote table (MAC → VTEP)                          flood list (VTEP, origins)
//!   ┌───────────────────┬────────────┬─────────┬─────┐ ┌────────────┬───────────────┐
//!   │ 52:54:00:00:00:0b │ 192.0.2.2  │ learned │ 12s │ │ 192.0.2.2  │ static        │
//!   │ 52:54:00:00:00:0c │ 192.0.2.3  │ evpn    │  -  │ │ 192.0.2.3  │ static, evpn  │
//!   └───────────────────┴────────────┴─────────┴─────┘ └────────────┴───────────────┘
//! ```
//!
//! The switch's own fdb maps a remote MAC to this port as for any port; which VTEP behind the
//! port has the MAC is this port's business ([`VxlanPort::entries`] lists it with its origin,
//! for `qswitch fdb`). Entries have an [`Origin`]: `learned` (from decapsulated frames, aged
//! like the fdb's, never overriding the others), `static` (configuration) and `evpn` (the
//! control plane: [`VxlanPort::add_mac`], [`VxlanPort::remove_mac`],
//! [`VxlanPort::add_flood`], [`VxlanPort::remove_flood`], and the `*_by_origin` variants for a
//! withdrawn session). With learning off, frames from a VTEP that is neither in the flood
//! list nor behind a static or EVPN entry are dropped and counted (`unknown_vtep`).
//!
//! # The underlay as an attacker
//! Those VTEPs (flood list, static and EVPN entries) are *trusted*: only their frames may
//! move a MAC, in the switch's fdb away from a local port ([`crate::fdb::Fdb::learn_unproven`]
//! for the others) or in the remote table to another VTEP (at most [`MOVES_PER_SEC`] a
//! second); a live entry stays where it is otherwise (`moves_held`). With learning on, any
//! VTEP's frames may still add new MACs, at most [`MAX_LEARNED`] learned ones per port
//! (`learn_refused`). The remote table learns only from frames the switch accepted
//! ([`Port::rx_accepted`]). Only trusted VTEPs get counters of their own; the others share
//! one (`other_vteps`), so spoofed sources cannot grow the counters or the metrics. A
//! coalesced message not yet turned into frames cancels the worker's sleep
//! ([`Port::rx_arm`]). docs/overlay.md argues the choices.
//!
//! # The underlay: the kernel's UDP stack
//! The host routes the underlay (routes, ECMP, neighbours, VRFs, firewall, IPv4 and IPv6) as it
//! does for Linux's own vxlan device, so qswitch needs no netlink mirror of the routing table
//! and interoperates with whatever the host's fabric uses. Frames are moved in batches
//! (`recvmmsg`/`sendmmsg`, [`qswitch_sys::udp`]); a frame that is not TSO is never copied on
//! transmit: the 8-byte VXLAN header and the frame are two iovecs of one message.
//!
//! What Linux's own vxlan path has, and a datagram at a time lacks, is GSO/GRO end to end:
//! 64 KiB super-packets through the bridge, the vxlan device and veth. The port gets the
//! same from the UDP socket API:
//! - **Transmit, `UDP_SEGMENT`.** A TSO frame from a TAP or guest is segmented in software
//!   ([`qswitch_wire::gso::segment_headers`]): only each segment's headers are written, behind
//!   its VXLAN header, with the inner IP and TCP fields and a full TCP checksum (summed over
//!   the payload where it lies); one `sendmsg` per destination and 64 KiB gathers
//!   `[VXLAN + headers 1][payload 1][VXLAN + headers 2][payload 2]…` (the payloads straight
//!   from the packet buffer, no copy in userspace) with a `UDP_SEGMENT` control message of
//!   one datagram's size: the kernel builds one GSO skb, routes it once and cuts it as late
//!   as it can (veth carries it whole; a NIC with UDP segmentation offload cuts it in
//!   hardware). The kernel refuses `UDP_SEGMENT` on a socket without transmit checksums, so
//!   checksums are on by default over IPv4 too (RFC 7348 allows zero or a checksum over
//!   IPv4; the kernel offloads it, which over veth costs nothing). With `udp_csum = false`,
//!   or when the kernel refuses a send (`EINVAL`, `EIO`), the segments are built whole back
//!   to back ([`qswitch_wire::gso::segment_packed`]) and go out in one `sendmmsg` of
//!   datagrams. MTU: the first (longest) segment is checked against the underlay MTU before
//!   anything is built (`mtu_exceeded`), and the sockets still never fragment. Source port:
//!   the whole frame is one flow, so one socket.
//! - **Receive, `UDP_GRO`.** The receive socket of a port alone on its (local, dstport)
//!   has `UDP_GRO` on (see "Several VNIs" below for why not when shared): one message may hold
//!   several datagrams of one flow back to back with their size in a control message (a GSO
//!   packet from a `UDP_SEGMENT` peer arrives that way whole). Each datagram is checked and
//!   counted on its own (all the drop rules below), and the inner frames go through a
//!   software GRO ([`qswitch_wire::gro`]): consecutive in-order TCP segments of one flow
//!   (strict: same headers, options, ACK, contiguous sequence, correct IPv4 header and TCP
//!   checksums) become one TSO super-frame with a virtio-net header (`gso_type`
//!   TCPv4/TCPv6, `NEEDS_CSUM`), which a TAP or guest takes whole, as from another TAP; a
//!   lone TCP segment whose checksum was verified gets `DATA_VALID`; anything else is one
//!   frame. The held super-frame is finished at the end of every burst. A message's
//!   datagrams are copied once, into the packet buffers (the segments' payloads back to
//!   back), the TCP checksum summed block by block as they are copied; what does not fit in
//!   a burst's buffers waits for the next burst.
//!
//! Per-flow UDP source ports (RFC 7348 section 5, which ECMP in the fabric relies on) come
//! from a pool of [`SRC_PORTS`] sending sockets, each bound to (local, one port in
//! 49152–65535); a frame's inner flow hash picks the socket, so one flow keeps one port and
//! one path. A raw `IPPROTO_UDP` socket would allow any source port, but needs
//! `CAP_NET_RAW`, gets a copy of every UDP datagram the host receives (to be filtered), loses
//! the kernel's checksum offload over IPv6 and IPv4 (the checksum of a 64 KiB segment in
//! software), and cannot use `UDP_SEGMENT`; 16 ports spread flows over any realistic ECMP
//! width. The cost is 16 descriptors and 16 bound ports per VXLAN port.
//!
//! Checksums: the kernel checks non-zero UDP checksums on receive and drops wrong ones
//! (`UdpInCsumErrors`), accepts zero over IPv4 and refuses it over IPv6. On transmit the
//! checksum is computed over both families by default (Linux's vxlan sends zero over IPv4;
//! either interoperates), because `UDP_SEGMENT` needs it; [`VxlanConfig::udp_csum`]
//! overrides. Inner TCP checksums are verified before a segment is coalesced (a corrupt one
//! passes alone, for the destination to drop).
//!
//! MTU: the sockets never fragment (`IP_PMTUDISC_DO`); an inner frame whose datagram does not
//! fit the underlay MTU ([`VxlanPort::underlay_mtu`]: the smallest route MTU toward the
//! remotes at open, unless configured) is dropped and counted (`mtu_exceeded`), as is one the kernel refuses
//! with `EMSGSIZE`. [`VxlanPort::inner_mtu`] is the IP MTU guests must use: the underlay MTU
//! less 50 bytes over IPv4, 70 over IPv6.
//!
//! Several VNIs on one host share the (local, dstport) their peers send to: each port's
//! receive socket joins the address's `SO_REUSEPORT` group, and a classic BPF program on the
//! group (rebuilt whenever a port comes or goes) hands each datagram to the socket of its VNI,
//! so every port keeps its own socket, fd and rx queue and nothing is copied between ports.
//! The kernel coalesces received datagrams (`UDP_GRO`) by UDP 4-tuple only and the program
//! sees a coalesced message's first datagram: a peer whose one source port carried two VNIs
//! could land the second VNI's datagrams on the first VNI's socket. So `UDP_GRO` is on only
//! while a port is alone on its address, and turned off on all members when a second joins
//! (on again when it is alone again); software GRO still coalesces within each burst.
//!
//! # Limitations
//! - One rx queue (one socket). The software GRO holds one super-frame at a time: segments
//!   of several flows interleaved within one burst coalesce less (each flow's datagrams
//!   mostly arrive together, one source port per flow).
//! - Messages already queued when `UDP_GRO` is turned off (a second port joining the
//!   address) are read without their segment size; until a receive empties the queue, they
//!   are told apart from single datagrams by their repeated VXLAN headers at the size the
//!   first inner IP length gives (`coalesced_size`), so their segments still come out whole.
//! - Inner checksums are summed in software both ways (the kernel offers a UDP socket no
//!   offload for the inner TCP checksum); with the four copies through the kernel (TAP read,
//!   UDP send, UDP receive, TAP write) this is what keeps the overlay below Linux's own
//!   vxlan path, which moves skbs without copying (docs/overlay.md has the numbers).
//! - One VNI per port (a port is an access port of one VLAN).
//! - The underlay MTU is read once; [`VxlanPort::set_underlay_mtu`] changes it.
//! - Every drop is counted by reason in [`VxlanStats`]; of those, only short or truncated
//!   datagrams (`runt`, `oversize`), `mtu_exceeded` (`oversize`), `offload`, `tx_full` and
//!   `tx_error` also reach the switch's drop reasons: `i_flag_clear`, `unknown_vni` and
//!   `unknown_vtep` have no switch-wide reason yet.
//! - The VNI steering assumes every member of a `SO_REUSEPORT` group is a port of this
//!   process (another process of the same user binding the same address would join it).

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::{Mutex, RwLock};
use qswitch_sys::udp::{
    self, Datagram, RecvMeta, UdpOptions, UdpSocket, MAX_BATCH, MAX_SEGMENTS, MAX_SEGMENTS_LEN,
};
use qswitch_wire::ethernet::EtherType;
use qswitch_wire::gro::{self, Gro};
use qswitch_wire::gso;
use qswitch_wire::virtio_net_hdr::{VirtioNetHdr, FLAG_NEEDS_CSUM, GSO_NONE};
use qswitch_wire::vxlan::{self, Header, Vni};
use qswitch_wire::{ethernet, flow, ipv4, ipv6, l2, MacAddr};

use super::{Port, RxLearn, TxDone};
use crate::packet::Pkt;
use crate::stats::{DropReason, DropTally};

/// Sending sockets (and so distinct UDP source ports) per port.
pub const SRC_PORTS: usize = 16;
/// Most learned remote addresses per port (one VNI), as many as the switch's fdb learns
/// behind one port by default; further ones are not learned (their replies flood) and are
/// counted (`learn_refused`). Static and EVPN entries do not count.
pub const MAX_LEARNED: usize = crate::fdb::DEFAULT_PORT_LIMIT as usize;
/// Most VTEPs with their own counters (only configured, static and EVPN VTEPs get them; the
/// others share one, `other`).
pub const MAX_VTEPS: usize = 4096;
/// Moves of one learned remote MAC between VTEPs allowed per second before it counts as
/// flapping (as the switch's fdb, [`crate::fdb::MOVES_PER_SEC`]).
pub const MOVES_PER_SEC: u32 = crate::fdb::MOVES_PER_SEC;
/// The underlay MTU assumed when there is no remote to ask the kernel about.
pub const DEFAULT_UNDERLAY_MTU: u32 = 1500;
/// Bytes of UDP and VXLAN header.
const UDP_VXLAN: usize = 16;
/// Receive messages per `recvmmsg` (each one datagram, or with `UDP_GRO` up to 64 KiB of
/// them).
const RX_MSGS: usize = 32;
/// Bytes of one receive message: the largest UDP payload (IPv6) and a little more, so that a
/// longer one shows as truncated.
const RX_BUF: usize = 65_536;
const SEC: u64 = 1_000_000_000;

/// A VXLAN port's settings: the `type = "vxlan"` port keys, as the configuration holds
/// them. The switch VLAN the VNI carries is the port's ordinary `vlan` key: the engine floods
/// and learns in it as for any port.
pub use qswitch_api::VxlanConfig;

/// Age of learned remote entries.
const AGING: Duration = Duration::from_secs(300);

/// Errors opening a VXLAN port.
#[derive(Debug, thiserror::Error)]
pub enum VxlanError {
    #[error("VNI {0} does not fit in 24 bits")]
    BadVni(u32),
    #[error("remote {remote} and local {local} are not the same address family")]
    Family { local: IpAddr, remote: IpAddr },
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("VNI {vni} already has a port on {addr}")]
    VniInUse { vni: u32, addr: SocketAddr },
    #[error("cannot bind a sending socket on {local} (no free source port)")]
    SrcPorts {
        local: IpAddr,
        #[source]
        source: io::Error,
    },
}

/// Where a remote MAC or flood-list VTEP came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Origin {
    /// Learned from a decapsulated frame's outer source; ages out.
    Learned,
    /// EVPN (BGP type-2 / type-3 routes); stays until withdrawn.
    Evpn,
    /// Configuration; stays until removed.
    Static,
}

impl Origin {
    /// The name shown by `qswitch fdb`.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Learned => "learned",
            Origin::Evpn => "evpn",
            Origin::Static => "static",
        }
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// One remote MAC address, as listed by [`VxlanPort::entries`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteMac {
    pub mac: MacAddr,
    pub vtep: IpAddr,
    pub origin: Origin,
    /// Nanoseconds since last seen (learned entries; 0 for the others).
    pub age_ns: u64,
}

#[derive(Debug)]
struct MacEntry {
    vtep: IpAddr,
    origin: Origin,
    seen: AtomicU64,
    /// Start of the current one-second move window, and moves in it (write lock only).
    move_window: u64,
    moves: u32,
}

impl MacEntry {
    fn new(vtep: IpAddr, origin: Origin, now: u64) -> MacEntry {
        MacEntry {
            vtep,
            origin,
            seen: AtomicU64::new(now),
            move_window: now,
            moves: 0,
        }
    }
}

macro_rules! vxlan_drops {
    ($($(#[doc = $doc:literal])* $variant:ident => $name:literal,)*) => {
        /// Why the port dropped a frame.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum VxlanDrop { $($(#[doc = $doc])* $variant,)* }

        impl VxlanDrop {
            /// Every reason, in declaration order.
            pub const ALL: &'static [VxlanDrop] = &[$(VxlanDrop::$variant,)*];
            const COUNT: usize = Self::ALL.len();

            /// The reason's name in counters and metrics.
            pub fn name(self) -> &'static str {
                match self { $(VxlanDrop::$variant => $name,)* }
            }
        }
    };
}

vxlan_drops! {
    /// Received: the UDP payload is shorter than the VXLAN header.
    Short => "truncated_vxlan",
    /// Received: the I flag is clear (RFC 7348 section 5).
    IFlagClear => "i_flag_clear",
    /// Received: a VNI other than the port's.
    UnknownVni => "unknown_vni",
    /// Received: from a VTEP not in the flood list or table, with learning off.
    UnknownVtep => "unknown_vtep",
    /// Received: the inner frame is shorter than an Ethernet header.
    InnerTooShort => "inner_too_short",
    /// Received: the datagram was larger than a packet buffer.
    RxTruncated => "rx_truncated",
    /// Transmitted: the encapsulated frame does not fit the underlay MTU.
    MtuExceeded => "mtu_exceeded",
    /// Transmitted: a TSO frame could not be segmented, or a partial checksum completed.
    Offload => "offload",
    /// Transmitted: the socket's send buffer was full.
    TxFull => "tx_full",
    /// Transmitted: the kernel refused the datagram (no route, unreachable, ...).
    TxError => "tx_error",
}

/// Counters of one VTEP (or, in [`VxlanStats`], of the VNI).
#[derive(Debug, Default)]
struct Traffic {
    rx_frames: AtomicU64,
    rx_bytes: AtomicU64,
    tx_frames: AtomicU64,
    tx_bytes: AtomicU64,
}

impl Traffic {
    fn rx(&self, frames: u64, bytes: u64) {
        self.rx_frames.fetch_add(frames, Ordering::Relaxed);
        self.rx_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    fn tx(&self, frames: u64, bytes: u64) {
        self.tx_frames.fetch_add(frames, Ordering::Relaxed);
        self.tx_bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    fn snapshot(&self) -> TrafficStats {
        TrafficStats {
            rx_frames: self.rx_frames.load(Ordering::Relaxed),
            rx_bytes: self.rx_bytes.load(Ordering::Relaxed),
            tx_frames: self.tx_frames.load(Ordering::Relaxed),
            tx_bytes: self.tx_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Frames and bytes of inner frames each way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TrafficStats {
    pub rx_frames: u64,
    pub rx_bytes: u64,
    pub tx_frames: u64,
    pub tx_bytes: u64,
}

/// A VXLAN port's counters ([`VxlanPort::stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanStats {
    pub vni: u32,
    /// The VNI's traffic (every VTEP).
    pub traffic: TrafficStats,
    /// Per VTEP (configured, static and EVPN ones), sorted by address.
    pub vteps: Vec<(IpAddr, TrafficStats)>,
    /// Every other VTEP's (learned ones, unknown senders), together.
    pub other_vteps: TrafficStats,
    /// Learned remote MACs now.
    pub learned: u64,
    /// Remote MACs not learned: the port had [`MAX_LEARNED`] learned ones.
    pub learn_refused: u64,
    /// Moves of a live learned MAC to another VTEP refused for lack of proof (the frame came
    /// from a VTEP that is neither configured nor EVPN's).
    pub moves_held: u64,
    /// Moves of a learned MAC refused because it was flapping between VTEPs.
    pub flaps: u64,
    /// Drops by reason, every reason listed.
    pub drops: Vec<(&'static str, u64)>,
    /// TSO frames segmented in software before encapsulation.
    pub segmented: u64,
    /// Of those, frames sent with `UDP_SEGMENT` (one `sendmsg` per 64 KiB of datagrams).
    pub gso_sent: u64,
    /// Received messages that held several datagrams (`UDP_GRO`).
    pub udp_gro: u64,
    /// Super-frames built by coalescing received TCP segments (software GRO).
    pub gro_frames: u64,
    /// Received TCP segments merged into those super-frames.
    pub gro_segments: u64,
}

impl VxlanStats {
    /// The drops counted under `reason`.
    pub fn drop_count(&self, reason: VxlanDrop) -> u64 {
        self.drops
            .iter()
            .find(|(n, _)| *n == reason.name())
            .map_or(0, |(_, c)| *c)
    }

    /// The traffic of `vtep`, if it has counters.
    pub fn vtep(&self, vtep: IpAddr) -> Option<TrafficStats> {
        self.vteps.iter().find(|(v, _)| *v == vtep).map(|(_, t)| *t)
    }
}

/// The control-plane state published to the data path as snapshots.
#[derive(Debug, Default)]
struct Control {
    /// Flood-list VTEPs and the origins that put them there (bit per [`Origin`]).
    flood: Vec<(IpAddr, u8)>,
}

#[derive(Debug)]
struct TxSocket {
    sock: UdpSocket,
    port: u16,
}

/// A VXLAN tunnel endpoint as a switch port.
#[derive(Debug)]
pub struct VxlanPort {
    name: String,
    vni: Vni,
    local: IpAddr,
    dstport: u16,
    learning: bool,
    aging_ns: u64,
    /// Bytes of outer IP header (20 or 40).
    ip_header: usize,
    underlay_mtu: AtomicU32,
    /// The VXLAN header every frame carries (I flag, VNI).
    header: [u8; vxlan::HEADER_LEN],
    /// The receive socket, in the `SO_REUSEPORT` group of its address; `None` only while
    /// the port is dropped.
    rx: Option<Arc<UdpSocket>>,
    rx_addr: SocketAddr,
    /// The network namespace the sockets were opened in.
    netns: String,
    tx: Vec<TxSocket>,
    macs: RwLock<HashMap<MacAddr, MacEntry>>,
    control: Mutex<Control>,
    /// Flood-list VTEPs (snapshot of `control.flood`).
    flood: ArcSwap<Vec<IpAddr>>,
    /// VTEPs frames are accepted from with learning off: the flood list and the VTEPs of
    /// static and EVPN entries.
    allowed: ArcSwap<HashSet<IpAddr>>,
    traffic: Traffic,
    vteps: RwLock<HashMap<IpAddr, Arc<Traffic>>>,
    /// The traffic of VTEPs without counters of their own.
    other: Arc<Traffic>,
    /// Learned entries in `macs` (changed under its write lock).
    n_learned: std::sync::atomic::AtomicUsize,
    learn_refused: AtomicU64,
    moves_held: AtomicU64,
    flaps: AtomicU64,
    drops: [AtomicU64; VxlanDrop::COUNT],
    segmented: AtomicU64,
    gso_sent: AtomicU64,
    udp_gro: AtomicU64,
    gro_frames: AtomicU64,
    gro_segments: AtomicU64,
    /// Transmit TSO frames with `UDP_SEGMENT` (checksums on, and not refused yet).
    gso: std::sync::atomic::AtomicBool,
    /// Received datagrams waiting to become frames.
    rx_scratch: Mutex<RxScratch>,
    /// Set when `UDP_GRO` went off on the receive socket: messages the kernel coalesced
    /// before may still be queued, without their segment size (`coalesced_size`). Cleared
    /// by the first receive that empties the queue.
    gro_leftovers: Arc<std::sync::atomic::AtomicBool>,
    /// The groups the receive socket joined (left on drop).
    groups: VxlanGroups,
    /// The switch clock as last seen by rx (tx gets no clock).
    now: AtomicU64,
    last_expire: AtomicU64,
    /// Segmentation scratch buffers, one per worker slot.
    scratch: Vec<Mutex<Scratch>>,
}

impl VxlanPort {
    /// Opens the port: listens on (`local`, `dstport`), joining the port to `groups`,
    /// binds [`SRC_PORTS`] sending sockets and puts `remotes` in the flood list with origin
    /// `static`.
    pub fn open(
        name: &str,
        config: &VxlanConfig,
        groups: &VxlanGroups,
    ) -> Result<VxlanPort, VxlanError> {
        let vni = Vni::new(config.vni).ok_or(VxlanError::BadVni(config.vni))?;
        for &remote in &config.remotes {
            if remote.is_ipv4() != config.local.is_ipv4() {
                return Err(VxlanError::Family {
                    local: config.local,
                    remote,
                });
            }
        }
        let v6 = config.local.is_ipv6();
        let tx_checksum = config.udp_csum.unwrap_or(true);
        let opts = UdpOptions {
            tx_checksum,
            rcvbuf: Some(4 << 20),
            sndbuf: Some(4 << 20),
            reuseport: false,
        };
        let addr = SocketAddr::new(config.local, config.dstport);
        // Held until the port has joined its group, so the kernel's socket order and the
        // group's stay the same.
        let group_list = groups.clone();
        let mut groups = groups.lock();
        let netns = current_netns();
        let group = groups.iter().find(|g| g.netns == netns && g.addr == addr);
        if group.is_some_and(|g| g.members.iter().any(|m| m.vni == vni)) {
            return Err(VxlanError::VniInUse {
                vni: config.vni,
                addr,
            });
        }
        let rx_opts = UdpOptions {
            reuseport: true,
            ..opts
        };
        let rx = Arc::new(
            UdpSocket::bind(addr, &rx_opts).map_err(|source| VxlanError::Bind { addr, source })?,
        );
        let tx = bind_src_ports(config.local, config.vni, &opts)?;
        let gro_leftovers = Arc::new(std::sync::atomic::AtomicBool::new(false));
        join_group(&mut groups, &netns, addr, vni, &rx, &gro_leftovers)
            .map_err(|source| VxlanError::Bind { addr, source })?;
        drop(groups);
        // The kernel's route MTU toward the remotes ([`VxlanPort::set_underlay_mtu`] changes it).
        let underlay_mtu = config
            .remotes
            .iter()
            .filter_map(|&r| udp::route_mtu(config.local, r).ok())
            .min()
            .unwrap_or(DEFAULT_UNDERLAY_MTU);
        let mut header = [0u8; vxlan::HEADER_LEN];
        Header::new_unchecked(&mut header[..]).emit(vni);
        let port = VxlanPort {
            name: name.to_string(),
            vni,
            local: config.local,
            dstport: config.dstport,
            learning: config.learning,
            aging_ns: AGING.as_nanos() as u64,
            ip_header: if v6 { 40 } else { 20 },
            underlay_mtu: AtomicU32::new(underlay_mtu),
            header,
            rx: Some(rx),
            rx_addr: addr,
            netns,
            tx,
            macs: RwLock::new(HashMap::new()),
            control: Mutex::new(Control::default()),
            flood: ArcSwap::from_pointee(Vec::new()),
            allowed: ArcSwap::from_pointee(HashSet::new()),
            traffic: Traffic::default(),
            vteps: RwLock::new(HashMap::new()),
            other: Arc::default(),
            n_learned: Default::default(),
            learn_refused: AtomicU64::new(0),
            moves_held: AtomicU64::new(0),
            flaps: AtomicU64::new(0),
            drops: Default::default(),
            segmented: AtomicU64::new(0),
            gso_sent: AtomicU64::new(0),
            udp_gro: AtomicU64::new(0),
            gro_frames: AtomicU64::new(0),
            gro_segments: AtomicU64::new(0),
            gso: std::sync::atomic::AtomicBool::new(tx_checksum),
            rx_scratch: Mutex::new(RxScratch::default()),
            gro_leftovers,
            groups: group_list,
            now: AtomicU64::new(0),
            last_expire: AtomicU64::new(0),
            scratch: (0..8).map(|_| Mutex::new(Scratch::default())).collect(),
        };
        for &remote in &config.remotes {
            port.add_flood(remote, Origin::Static);
        }
        Ok(port)
    }

    fn rx(&self) -> &UdpSocket {
        self.rx
            .as_ref()
            .expect("the receive socket lives as long as the port")
    }

    /// The port name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The VNI.
    pub fn vni(&self) -> u32 {
        self.vni.get()
    }

    /// The local underlay address.
    pub fn local(&self) -> IpAddr {
        self.local
    }

    /// The UDP destination port.
    pub fn dstport(&self) -> u16 {
        self.dstport
    }

    /// Whether remote MACs are learned from received frames.
    pub fn learning(&self) -> bool {
        self.learning
    }

    /// The UDP source ports flows are spread over.
    pub fn src_ports(&self) -> Vec<u16> {
        self.tx.iter().map(|t| t.port).collect()
    }

    /// The underlay IP MTU frames are checked against.
    pub fn underlay_mtu(&self) -> u32 {
        self.underlay_mtu.load(Ordering::Relaxed)
    }

    /// Changes the underlay MTU (after a route or interface change).
    pub fn set_underlay_mtu(&self, mtu: u32) {
        self.underlay_mtu.store(mtu, Ordering::Relaxed);
    }

    /// The IP MTU guests behind the switch must use so that their frames fit the underlay:
    /// the underlay MTU less 50 bytes (IPv4 underlay) or 70 (IPv6). For VIRTIO_NET_F_MTU and
    /// TAP MTUs.
    pub fn inner_mtu(&self) -> u32 {
        self.underlay_mtu()
            .saturating_sub((self.ip_header + UDP_VXLAN + ethernet::HEADER_LEN) as u32)
    }

    /// The longest inner frame (Ethernet header included, any tag included) that fits.
    fn max_inner_frame(&self) -> usize {
        (self.underlay_mtu() as usize).saturating_sub(self.ip_header + UDP_VXLAN)
    }

    // ---- the remote table and flood list (configuration, EVPN) ----

    /// Adds or replaces the entry of `mac`: `vtep` with `origin`. A learned entry never
    /// replaces a static or EVPN one; EVPN never replaces static. Returns whether the table
    /// changed.
    pub fn add_mac(&self, mac: MacAddr, vtep: IpAddr, origin: Origin) -> bool {
        let changed = {
            let mut macs = self.macs.write();
            let now = self.now.load(Ordering::Relaxed);
            match macs.get(&mac) {
                Some(e) if e.origin > origin => false,
                Some(e) if e.origin == origin && e.vtep == vtep => {
                    e.seen.store(now, Ordering::Relaxed);
                    false
                }
                _ => {
                    let old = macs.insert(mac, MacEntry::new(vtep, origin, now));
                    let was = old.is_some_and(|e| e.origin == Origin::Learned);
                    self.count_learned(was, origin == Origin::Learned);
                    true
                }
            }
        };
        if changed && origin != Origin::Learned {
            self.publish();
        }
        changed
    }

    /// Removes the entry of `mac` if it has `origin` (a withdrawal removes only what it
    /// added). Returns whether it was there.
    pub fn remove_mac(&self, mac: MacAddr, origin: Origin) -> bool {
        let removed = {
            let mut macs = self.macs.write();
            match macs.get(&mac) {
                Some(e) if e.origin == origin => {
                    self.count_learned(origin == Origin::Learned, false);
                    macs.remove(&mac).is_some()
                }
                _ => false,
            }
        };
        if removed && origin != Origin::Learned {
            self.publish();
        }
        removed
    }

    /// Removes every entry with `origin` (a lost EVPN session, a reload); returns how many.
    pub fn remove_macs_by_origin(&self, origin: Origin) -> usize {
        let n = {
            let mut macs = self.macs.write();
            let before = macs.len();
            macs.retain(|_, e| e.origin != origin);
            let n = before - macs.len();
            if origin == Origin::Learned {
                self.n_learned.fetch_sub(n, Ordering::Relaxed);
            }
            n
        };
        if n > 0 {
            self.publish();
        }
        n
    }

    /// Marks `mac` seen now if it is behind `vtep` (frames the kernel path took for a veth
    /// port: they passed no `rx_burst` to refresh it).
    pub fn refresh(&self, mac: MacAddr, vtep: IpAddr) {
        let now = self.now.load(Ordering::Relaxed);
        if let Some(e) = self.macs.read().get(&mac) {
            if e.vtep == vtep {
                e.seen.store(now, Ordering::Relaxed);
            }
        }
    }

    /// The VTEP that has `mac` (a learned entry only while it has not aged out).
    pub fn lookup(&self, mac: MacAddr) -> Option<IpAddr> {
        let now = self.now.load(Ordering::Relaxed);
        let macs = self.macs.read();
        let e = macs.get(&mac)?;
        self.live(e, now).then_some(e.vtep)
    }

    /// The remote table, sorted by MAC address (learned entries that aged out omitted).
    pub fn entries(&self) -> Vec<RemoteMac> {
        let now = self.now.load(Ordering::Relaxed);
        let mut v: Vec<RemoteMac> = self
            .macs
            .read()
            .iter()
            .filter(|(_, e)| self.live(e, now))
            .map(|(&mac, e)| RemoteMac {
                mac,
                vtep: e.vtep,
                origin: e.origin,
                age_ns: match e.origin {
                    Origin::Learned => now.saturating_sub(e.seen.load(Ordering::Relaxed)),
                    _ => 0,
                },
            })
            .collect();
        v.sort_by_key(|e| e.mac.0);
        v
    }

    /// Puts `vtep` in the flood list for `origin` (a VTEP may be there for several origins).
    pub fn add_flood(&self, vtep: IpAddr, origin: Origin) {
        let mut c = self.control.lock();
        match c.flood.iter_mut().find(|(v, _)| *v == vtep) {
            Some((_, bits)) => *bits |= origin.bit(),
            None => c.flood.push((vtep, origin.bit())),
        }
        drop(c);
        self.publish();
    }

    /// Takes `origin` off `vtep` in the flood list; the VTEP leaves the list when no origin
    /// is left. Returns whether `origin` had put it there.
    pub fn remove_flood(&self, vtep: IpAddr, origin: Origin) -> bool {
        let mut c = self.control.lock();
        let mut had = false;
        c.flood.retain_mut(|(v, bits)| {
            if *v == vtep && *bits & origin.bit() != 0 {
                had = true;
                *bits &= !origin.bit();
            }
            *bits != 0
        });
        drop(c);
        self.publish();
        had
    }

    /// Takes `origin` off every flood-list VTEP; returns how many it was on.
    pub fn remove_flood_by_origin(&self, origin: Origin) -> usize {
        let vteps: Vec<IpAddr> = self.flood_list().into_iter().map(|(v, _)| v).collect();
        vteps
            .into_iter()
            .filter(|&v| self.remove_flood(v, origin))
            .count()
    }

    /// The flood list: each VTEP with the origins that put it there.
    pub fn flood_list(&self) -> Vec<(IpAddr, Vec<Origin>)> {
        self.control
            .lock()
            .flood
            .iter()
            .map(|&(v, bits)| {
                let origins = [Origin::Learned, Origin::Evpn, Origin::Static]
                    .into_iter()
                    .filter(|o| bits & o.bit() != 0)
                    .collect();
                (v, origins)
            })
            .collect()
    }

    /// Publishes the flood list and the allowed VTEPs to the data path.
    fn publish(&self) {
        let c = self.control.lock();
        let flood: Vec<IpAddr> = c.flood.iter().map(|&(v, _)| v).collect();
        let mut allowed: HashSet<IpAddr> = flood.iter().copied().collect();
        allowed.extend(
            self.macs
                .read()
                .values()
                .filter(|e| e.origin != Origin::Learned)
                .map(|e| e.vtep),
        );
        self.flood.store(Arc::new(flood));
        self.allowed.store(Arc::new(allowed));
    }

    fn live(&self, e: &MacEntry, now: u64) -> bool {
        e.origin != Origin::Learned
            || now.saturating_sub(e.seen.load(Ordering::Relaxed)) <= self.aging_ns
    }

    /// Keeps [`VxlanPort::n_learned`] (under the write lock of `macs`): an entry that was
    /// learned (`was`) replaced by one that is (`is`).
    fn count_learned(&self, was: bool, is: bool) {
        match (was, is) {
            (false, true) => {
                self.n_learned.fetch_add(1, Ordering::Relaxed);
            }
            (true, false) => {
                self.n_learned.fetch_sub(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Learns `mac` behind `vtep` from a frame the switch accepted; `trusted`: `vtep` is
    /// configured or EVPN's. A new MAC is learned (up to [`MAX_LEARNED`]); a live learned
    /// one moves to another VTEP only on a trusted frame and at most [`MOVES_PER_SEC`] times
    /// a second; static and EVPN entries never move.
    fn learn(&self, mac: MacAddr, vtep: IpAddr, trusted: bool, now: u64) {
        {
            let macs = self.macs.read();
            if let Some(e) = macs.get(&mac) {
                if e.origin != Origin::Learned {
                    return;
                }
                if e.vtep == vtep {
                    if now.saturating_sub(e.seen.load(Ordering::Relaxed)) > crate::fdb::REFRESH_NS {
                        e.seen.store(now, Ordering::Relaxed);
                    }
                    return;
                }
                if !trusted && self.live(e, now) {
                    self.moves_held.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            } else if self.n_learned.load(Ordering::Relaxed) >= MAX_LEARNED {
                self.learn_refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let mut macs = self.macs.write();
        match macs.get_mut(&mac) {
            Some(e) if e.origin != Origin::Learned || e.vtep == vtep => {}
            Some(e) => {
                if self.live(e, now) {
                    if !trusted {
                        self.moves_held.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    if now.saturating_sub(e.move_window) >= SEC {
                        e.move_window = now;
                        e.moves = 0;
                    }
                    if e.moves >= MOVES_PER_SEC {
                        self.flaps.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    e.moves += 1;
                }
                e.vtep = vtep;
                e.seen.store(now, Ordering::Relaxed);
            }
            None => {
                if self.n_learned.load(Ordering::Relaxed) >= MAX_LEARNED {
                    self.learn_refused.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                macs.insert(mac, MacEntry::new(vtep, Origin::Learned, now));
                self.count_learned(false, true);
            }
        }
    }

    /// Whether `mac` has a static or EVPN entry behind `vtep`: the control plane vouches
    /// for where it lives.
    fn vouched(&self, mac: MacAddr, vtep: IpAddr) -> bool {
        self.macs
            .read()
            .get(&mac)
            .is_some_and(|e| e.origin != Origin::Learned && e.vtep == vtep)
    }

    /// Drops learned entries older than the aging time, at most once a second.
    fn expire(&self, now: u64) {
        let last = self.last_expire.load(Ordering::Relaxed);
        if now.saturating_sub(last) < SEC {
            return;
        }
        self.last_expire.store(now, Ordering::Relaxed);
        let stale = self.macs.read().values().any(|e| !self.live(e, now));
        if stale {
            let mut macs = self.macs.write();
            let before = macs.len();
            macs.retain(|_, e| self.live(e, now));
            // Only learned entries age.
            self.n_learned
                .fetch_sub(before - macs.len(), Ordering::Relaxed);
        }
    }

    // ---- counters ----

    fn count(&self, reason: VxlanDrop, n: u64) {
        self.drops[reason as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// The counters of `vtep`: its own when it is configured, static or EVPN's (the
    /// VTEPs an operator knows), else the shared `other` ones, so that spoofed underlay
    /// sources cannot create counters and metric series.
    fn vtep_traffic(&self, vtep: IpAddr) -> Arc<Traffic> {
        if let Some(t) = self.vteps.read().get(&vtep) {
            return t.clone();
        }
        if !self.allowed.load().contains(&vtep) {
            return self.other.clone();
        }
        let mut vteps = self.vteps.write();
        if vteps.len() >= MAX_VTEPS {
            return vteps.get(&vtep).unwrap_or(&self.other).clone();
        }
        vteps.entry(vtep).or_default().clone()
    }

    /// The port's counters: the VNI's traffic, each VTEP's, drops by reason.
    pub fn stats(&self) -> VxlanStats {
        let mut vteps: Vec<(IpAddr, TrafficStats)> = self
            .vteps
            .read()
            .iter()
            .map(|(&v, t)| (v, t.snapshot()))
            .collect();
        vteps.sort_by_key(|(v, _)| *v);
        VxlanStats {
            vni: self.vni.get(),
            traffic: self.traffic.snapshot(),
            vteps,
            other_vteps: self.other.snapshot(),
            learned: self.n_learned.load(Ordering::Relaxed) as u64,
            learn_refused: self.learn_refused.load(Ordering::Relaxed),
            moves_held: self.moves_held.load(Ordering::Relaxed),
            flaps: self.flaps.load(Ordering::Relaxed),
            drops: VxlanDrop::ALL
                .iter()
                .map(|&r| (r.name(), self.drops[r as usize].load(Ordering::Relaxed)))
                .collect(),
            segmented: self.segmented.load(Ordering::Relaxed),
            gso_sent: self.gso_sent.load(Ordering::Relaxed),
            udp_gro: self.udp_gro.load(Ordering::Relaxed),
            gro_frames: self.gro_frames.load(Ordering::Relaxed),
            gro_segments: self.gro_segments.load(Ordering::Relaxed),
        }
    }

    // ---- transmit helpers ----

    /// The VTEPs a frame to `dst` goes to: its entry's, else the flood list.
    fn destinations(&self, dst: &[u8], flood: &Arc<Vec<IpAddr>>, now: u64) -> Destinations {
        let mac = MacAddr(dst.try_into().unwrap_or([0xff; 6]));
        if mac.is_unicast() {
            let macs = self.macs.read();
            if let Some(e) = macs.get(&mac) {
                if self.live(e, now) {
                    return Destinations::One(e.vtep);
                }
            }
        }
        Destinations::Flood(flood.clone())
    }

    fn tx_socket(&self, frame: &[u8]) -> &TxSocket {
        &self.tx[(flow_hash(frame) as usize) % self.tx.len()]
    }

    /// Sends `batch` on `sock`, counting what the kernel refused; returns frames and bytes
    /// sent and clears the batch.
    fn flush(
        &self,
        sock: &UdpSocket,
        batch: &mut Vec<Datagram<'_>>,
        done: &mut TxDone,
        drops: &mut DropTally,
    ) {
        let mut i = 0;
        let mut tally = VtepTally::new(self, Direction::Tx);
        while i < batch.len() {
            match sock.send_batch(&batch[i..]) {
                Ok(0) => break,
                Ok(n) => {
                    for d in &batch[i..i + n] {
                        let bytes = d.body.len() as u64;
                        done.packets += 1;
                        done.bytes += bytes;
                        tally.add(d.dst.ip(), bytes);
                    }
                    i += n;
                }
                Err(e) if udp::is_too_big(&e) => {
                    self.count(VxlanDrop::MtuExceeded, 1);
                    drops.count(DropReason::Oversize);
                    i += 1;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.count(VxlanDrop::TxFull, (batch.len() - i) as u64);
                    for _ in i..batch.len() {
                        drops.count(DropReason::TxFull);
                    }
                    break;
                }
                Err(e) => {
                    tracing::debug!(port = %self.name, dst = %batch[i].dst, error = %e,
                        "VXLAN send failed");
                    self.count(VxlanDrop::TxError, 1);
                    drops.count(DropReason::TxError);
                    i += 1;
                }
            }
        }
        batch.clear();
    }

    /// Segments the TSO frame `pkt` and sends each segment to `dsts`. With `UDP_SEGMENT`:
    /// only the segments' headers are built (each behind its VXLAN header), and one
    /// `sendmsg` per destination and 64 KiB gathers them with the payloads, which stay in
    /// the packet buffer. Otherwise (checksums off, or the kernel refused): whole segments
    /// built back to back and sent in one `sendmmsg` of datagrams.
    fn send_segmented(
        &self,
        worker: usize,
        pkt: &Pkt,
        dsts: &[IpAddr],
        done: &mut TxDone,
        drops: &mut DropTally,
    ) {
        let (frame, hdr) = (pkt.frame(), &pkt.hdr);
        let first = match gso::first_segment_len(frame, hdr) {
            Ok(first) if first > self.max_inner_frame() => {
                self.count(VxlanDrop::MtuExceeded, 1);
                drops.count(DropReason::Oversize);
                return;
            }
            Ok(first) => first,
            Err(_) => {
                self.count(VxlanDrop::Offload, 1);
                drops.count(DropReason::Offload);
                return;
            }
        };
        // Each datagram but the last: VXLAN header and a full segment.
        let size = vxlan::HEADER_LEN + first;
        let mut guard = self.scratch[worker % self.scratch.len()].lock();
        let Scratch { arena, spans } = &mut *guard;
        self.segmented.fetch_add(1, Ordering::Relaxed);
        let sock = &self.tx_socket(frame).sock;
        // The arena only grows (no clearing, no zeroing per frame).
        if self.gso.load(Ordering::Relaxed) {
            let layout = gso::headers_len(frame, hdr, vxlan::HEADER_LEN).and_then(|need| {
                if arena.len() < need {
                    arena.resize(need, 0);
                }
                gso::segment_headers(frame, hdr, &self.header, arena)
            });
            let Ok(layout) = layout else {
                self.count(VxlanDrop::Offload, 1);
                drops.count(DropReason::Offload);
                return;
            };
            if self.send_gso(sock, frame, arena, layout, size, dsts, done, drops) {
                self.gso_sent.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        let built = gso::packed_len(frame, hdr, vxlan::HEADER_LEN).and_then(|need| {
            if arena.len() < need {
                arena.resize(need, 0);
            }
            gso::segment_packed(frame, hdr, &self.header, arena)
        });
        let Ok((_, len)) = built else {
            self.count(VxlanDrop::Offload, 1);
            drops.count(DropReason::Offload);
            return;
        };
        spans.clear();
        let mut at = 0;
        while at < len {
            let end = (at + size).min(len);
            spans.push(at..end);
            at = end;
        }
        let mut batch: Vec<Datagram<'_>> = Vec::with_capacity(spans.len() * dsts.len());
        for span in spans.iter() {
            for &vtep in dsts {
                batch.push(Datagram {
                    dst: SocketAddr::new(vtep, self.dstport),
                    head: &self.header,
                    body: &arena[span.start + vxlan::HEADER_LEN..span.end],
                });
            }
        }
        self.flush(sock, &mut batch, done, drops);
    }

    /// Sends the segments of `frame` (their headers in `headers`, `layout` says where the
    /// payloads are; datagrams of `size` bytes but the last) to each of `dsts` with
    /// `UDP_SEGMENT`, gathering headers and payloads. Returns false, having sent nothing,
    /// when the kernel refuses segmentation for the first send (`EINVAL`, `EIO`: a route
    /// through IPsec, say), for the caller to send datagrams instead; `EIO` also turns
    /// `UDP_SEGMENT` off for the port.
    #[allow(clippy::too_many_arguments)]
    fn send_gso(
        &self,
        sock: &UdpSocket,
        frame: &[u8],
        headers: &[u8],
        layout: gso::Layout,
        size: usize,
        dsts: &[IpAddr],
        done: &mut TxDone,
        drops: &mut DropTally,
    ) -> bool {
        let each = vxlan::HEADER_LEN + layout.hlen;
        let per = (MAX_SEGMENTS_LEN / size).clamp(1, MAX_SEGMENTS);
        let mut tally = VtepTally::new(self, Direction::Tx);
        let mut iovs: Vec<io::IoSlice<'_>> = Vec::with_capacity(2 * per);
        let mut first = true;
        for &vtep in dsts {
            let dst = SocketAddr::new(vtep, self.dstport);
            let mut i = 0;
            while i < layout.segments {
                let end = (i + per).min(layout.segments);
                iovs.clear();
                let mut bytes = 0u64;
                for k in i..end {
                    let payload = &frame[layout.payload(k, frame.len())];
                    iovs.push(io::IoSlice::new(&headers[k * each..(k + 1) * each]));
                    iovs.push(io::IoSlice::new(payload));
                    bytes += (layout.hlen + payload.len()) as u64;
                }
                let n = (end - i) as u64;
                match sock.send_segments_vectored(dst, &iovs, size as u16) {
                    Ok(_) => {
                        done.packets += n as u32;
                        done.bytes += bytes;
                        tally.add_many(vtep, n, bytes);
                    }
                    Err(e) if udp::is_too_big(&e) => {
                        self.count(VxlanDrop::MtuExceeded, 1);
                        drops.count(DropReason::Oversize);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.count(VxlanDrop::TxFull, n);
                        for _ in 0..n {
                            drops.count(DropReason::TxFull);
                        }
                    }
                    Err(e) if first && udp::is_gso_refused(&e) => {
                        if udp::is_gso_unsupported(&e) {
                            tracing::info!(port = %self.name, dst = %dst, error = %e,
                                "UDP_SEGMENT refused; TSO frames go out as single datagrams");
                            self.gso.store(false, Ordering::Relaxed);
                        }
                        return false;
                    }
                    Err(e) => {
                        tracing::debug!(port = %self.name, dst = %dst, error = %e,
                            "VXLAN send failed");
                        self.count(VxlanDrop::TxError, n);
                        for _ in 0..n {
                            drops.count(DropReason::TxError);
                        }
                    }
                }
                first = false;
                i = end;
            }
        }
        true
    }

    /// Checks one received datagram (VXLAN header and inner frame) from `vtep`; the reason
    /// it is dropped, if it is.
    fn reject(
        &self,
        dgram: &[u8],
        vtep: IpAddr,
        allowed: Option<&HashSet<IpAddr>>,
    ) -> Option<VxlanDrop> {
        if dgram.len() < vxlan::HEADER_LEN {
            return Some(VxlanDrop::Short);
        }
        let header = Header::new_unchecked(&dgram[..vxlan::HEADER_LEN]);
        if !header.vni_valid() {
            Some(VxlanDrop::IFlagClear)
        } else if header.vni() != self.vni {
            Some(VxlanDrop::UnknownVni)
        } else if allowed.is_some_and(|a| !a.contains(&vtep)) {
            Some(VxlanDrop::UnknownVtep)
        } else if dgram.len() - vxlan::HEADER_LEN < ethernet::HEADER_LEN {
            Some(VxlanDrop::InnerTooShort)
        } else {
            None
        }
    }

    /// Counts a dropped received datagram.
    fn rx_drop(&self, reason: VxlanDrop, drops: &mut DropTally) {
        self.count(reason, 1);
        match reason {
            VxlanDrop::RxTruncated => drops.count(DropReason::Oversize),
            VxlanDrop::Short | VxlanDrop::InnerTooShort => drops.count(DropReason::Runt),
            _ => {}
        }
    }
}

/// The size of each datagram in `msg`, a message received without a `UDP_GRO` segment size,
/// when it holds several: the kernel coalesced them while `UDP_GRO` was on (datagrams of one
/// size back to back, the last one possibly shorter) and the option went off before they
/// were read (a second port joined the address). The first datagram's size comes from its
/// inner IP length (a frame padded to the 60-byte minimum is never longer than that); it
/// counts only when every datagram boundary it implies starts with the first datagram's
/// VXLAN header. None for one datagram, or anything that does not fit that pattern (read as
/// one datagram, as before). Several frames in one datagram that this takes apart are each
/// checked and counted like any datagram from that VTEP.
fn coalesced_size(msg: &[u8]) -> Option<usize> {
    const H: usize = vxlan::HEADER_LEN;
    let eth = ethernet::Frame::new_checked(msg.get(H..)?).ok()?;
    let (_, ethertype, l3) = l2::untag(&eth)?;
    let ip = &msg[H + l3..];
    let ip_len = match ethertype {
        EtherType::Ipv4 => usize::from(ipv4::Packet::new_checked(ip).ok()?.total_len()),
        EtherType::Ipv6 => {
            ipv6::HEADER_LEN + usize::from(ipv6::Packet::new_checked(ip).ok()?.payload_len())
        }
        _ => return None,
    };
    let size = H + (l3 + ip_len).max(60);
    if size >= msg.len() {
        return None;
    }
    let first = &msg[..H];
    let mut at = size;
    while at < msg.len() {
        if msg.get(at..at + H)? != first {
            return None;
        }
        at += size;
    }
    Some(size)
}

/// Ends the super-frame `gro` holds in `pkt` (its length and virtio-net header).
fn finish_gro(gro: &mut Gro, pkt: &mut Pkt, port: &VxlanPort) {
    if let Some((len, hdr)) = gro.finish(pkt.frame_buf_mut()) {
        pkt.set_len(len);
        pkt.hdr = hdr;
        if gro::is_super(&hdr) {
            port.gro_frames.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The receive side's buffers: up to [`RX_MSGS`] messages of one `recvmmsg`, and how far
/// they have been turned into frames (a burst may end before the last datagram: the rest
/// waits for the next burst).
#[derive(Default)]
struct RxScratch {
    bufs: Vec<Box<[u8]>>,
    meta: Vec<RecvMeta>,
    /// Messages received.
    got: usize,
    /// The message being read.
    msg: usize,
    /// Where its next datagram starts.
    off: usize,
    /// Whether these messages may include coalesced ones without their segment size.
    leftovers: bool,
    /// Per frame of the last burst: its source MAC, VTEP, and whether the VTEP is trusted.
    srcs: Vec<(MacAddr, IpAddr, bool)>,
    /// What the switch may learn from the last burst ([`Port::rx_learn`]).
    learn_bits: u32,
    move_bits: u32,
}

impl std::fmt::Debug for RxScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxScratch")
            .field("got", &self.got)
            .field("msg", &self.msg)
            .field("off", &self.off)
            .finish()
    }
}

/// A worker slot's buffers for segmenting TSO frames.
#[derive(Debug, Default)]
struct Scratch {
    /// Every segment of the frame behind its VXLAN header, back to back.
    arena: Vec<u8>,
    /// Where each segment is in `arena`.
    spans: Vec<std::ops::Range<usize>>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Rx,
    Tx,
}

/// Adds traffic to the counters once per run of frames from or to one VTEP (and to the
/// VNI's once), not once per frame.
struct VtepTally<'a> {
    port: &'a VxlanPort,
    dir: Direction,
    vtep: Option<IpAddr>,
    frames: u64,
    bytes: u64,
    total_frames: u64,
    total_bytes: u64,
}

impl<'a> VtepTally<'a> {
    fn new(port: &'a VxlanPort, dir: Direction) -> VtepTally<'a> {
        VtepTally {
            port,
            dir,
            vtep: None,
            frames: 0,
            bytes: 0,
            total_frames: 0,
            total_bytes: 0,
        }
    }

    #[inline]
    fn add(&mut self, vtep: IpAddr, bytes: u64) {
        self.add_many(vtep, 1, bytes);
    }

    /// Adds `frames` frames of `bytes` bytes in all.
    #[inline]
    fn add_many(&mut self, vtep: IpAddr, frames: u64, bytes: u64) {
        if self.vtep != Some(vtep) {
            self.flush_vtep();
            self.vtep = Some(vtep);
        }
        self.frames += frames;
        self.bytes += bytes;
        self.total_frames += frames;
        self.total_bytes += bytes;
    }

    fn flush_vtep(&mut self) {
        if let Some(vtep) = self.vtep {
            if self.frames > 0 {
                let t = self.port.vtep_traffic(vtep);
                match self.dir {
                    Direction::Rx => t.rx(self.frames, self.bytes),
                    Direction::Tx => t.tx(self.frames, self.bytes),
                }
            }
        }
        self.frames = 0;
        self.bytes = 0;
    }
}

impl Drop for VtepTally<'_> {
    fn drop(&mut self) {
        self.flush_vtep();
        if self.total_frames > 0 {
            let t = &self.port.traffic;
            match self.dir {
                Direction::Rx => t.rx(self.total_frames, self.total_bytes),
                Direction::Tx => t.tx(self.total_frames, self.total_bytes),
            }
        }
    }
}

enum Destinations {
    One(IpAddr),
    Flood(Arc<Vec<IpAddr>>),
}

impl Destinations {
    fn as_slice(&self) -> &[IpAddr] {
        match self {
            Destinations::One(v) => std::slice::from_ref(v),
            Destinations::Flood(v) => v,
        }
    }
}

/// The VXLAN ports sharing one (local, dstport), in the order their receive sockets joined
/// the kernel's `SO_REUSEPORT` group (the order the steering program's indexes refer to).
struct Group {
    /// The network namespace (`net:[inode]`): one address can exist in several.
    netns: String,
    addr: SocketAddr,
    members: Vec<Member>,
}

struct Member {
    vni: Vni,
    sock: std::sync::Weak<UdpSocket>,
    /// The port's [`VxlanPort::gro_leftovers`].
    leftovers: std::sync::Weak<std::sync::atomic::AtomicBool>,
}

/// The `SO_REUSEPORT` groups of a switch's VXLAN ports (the switch's vxlan driver). Ports
/// opened with different `VxlanGroups` on one address would join one kernel group without
/// knowing of each other: a switch keeps one for all its ports.
#[derive(Default, Clone)]
pub struct VxlanGroups(Arc<std::sync::Mutex<Vec<Group>>>);

impl std::fmt::Debug for VxlanGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("VxlanGroups")
    }
}

impl VxlanGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Group>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The calling thread's network namespace, as `net:[inode]` (sockets belong to the
/// namespace of the thread that created them).
fn current_netns() -> String {
    std::fs::read_link("/proc/thread-self/ns/net")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Adds the socket just bound (the kernel put it last in the group) and steers again.
fn join_group(
    groups: &mut Vec<Group>,
    netns: &str,
    addr: SocketAddr,
    vni: Vni,
    sock: &Arc<UdpSocket>,
    leftovers: &Arc<std::sync::atomic::AtomicBool>,
) -> io::Result<()> {
    let at = match groups
        .iter()
        .position(|g| g.netns == netns && g.addr == addr)
    {
        Some(at) => at,
        None => {
            groups.push(Group {
                netns: netns.to_string(),
                addr,
                members: Vec::new(),
            });
            groups.len() - 1
        }
    };
    let g = &mut groups[at];
    g.members.push(Member {
        vni,
        sock: Arc::downgrade(sock),
        leftovers: Arc::downgrade(leftovers),
    });
    let result = sock.attach_reuseport_filter(&steering(&g.members));
    if result.is_err() {
        g.members.pop();
        if g.members.is_empty() {
            groups.remove(at);
            return result;
        }
    }
    group_gro(&groups[at].members);
    result
}

/// Turns `UDP_GRO` on for the receive socket of a port alone on its address, off for
/// ports sharing one. The kernel coalesces datagrams by UDP 4-tuple only, and the steering
/// program sees the first datagram of a coalesced message: a peer whose one source port
/// carried two VNIs could put the second VNI's datagrams on the first VNI's socket, where
/// they would be dropped as `unknown_vni`. Without `UDP_GRO` (before Linux 5.0) every
/// receive is one datagram, which works too.
fn group_gro(members: &[Member]) {
    let on = members.len() == 1;
    for m in members {
        if let Some(sock) = m.sock.upgrade() {
            if let Err(e) = sock.set_gro(on) {
                tracing::debug!(error = %e, "UDP_GRO not available");
            }
            // After the option is off: what is queued from before may be coalesced.
            if let Some(flag) = m.leftovers.upgrade().filter(|_| !on) {
                flag.store(true, Ordering::Release);
            }
        }
    }
}

/// The classic BPF program that sends a datagram to the group's socket of its VNI; other
/// VNIs (and datagrams too short to have one) go where the kernel's hash puts them, and are
/// counted there as `unknown_vni` (or `truncated_vxlan`).
fn steering(members: &[Member]) -> Vec<udp::BpfInsn> {
    use udp::{bpf, BpfInsn};
    let insn = |code, k, jt, jf| BpfInsn { code, jt, jf, k };
    let mut prog = vec![
        // A = bytes 4..8 of the UDP payload: VNI (24 bits) and a reserved byte.
        insn(bpf::LD_W_ABS, 4, 0, 0),
        insn(bpf::RSH_K, 8, 0, 0),
    ];
    for (i, m) in members.iter().enumerate() {
        prog.push(insn(bpf::JEQ_K, m.vni.get(), 0, 1));
        prog.push(insn(bpf::RET_K, i as u32, 0, 0));
    }
    prog.push(insn(bpf::RET_K, u32::MAX, 0, 0));
    prog
}

impl Drop for VxlanPort {
    fn drop(&mut self) {
        let mut groups = self.groups.lock();
        let Some(at) = groups
            .iter()
            .position(|g| g.netns == self.netns && g.addr == self.rx_addr)
        else {
            return;
        };
        let g = &mut groups[at];
        // The kernel moves the group's last socket into the place of a closed one: so does
        // the list, then the socket is closed and the rest steered again.
        if let Some(i) = g.members.iter().position(|m| m.vni == self.vni) {
            g.members.swap_remove(i);
        }
        drop(self.rx.take());
        if g.members.is_empty() {
            groups.remove(at);
            return;
        }
        if let Some(sock) = g.members[0].sock.upgrade() {
            if let Err(e) = sock.attach_reuseport_filter(&steering(&g.members)) {
                tracing::warn!(addr = %self.rx_addr, error = %e, "VXLAN steering not updated");
            }
        }
        group_gro(&g.members);
    }
}

/// Binds [`SRC_PORTS`] sockets on `local` to ports in 49152–65535, spread from a seed so
/// that two ports on one host start in different places; ports in use are skipped.
fn bind_src_ports(local: IpAddr, vni: u32, opts: &UdpOptions) -> Result<Vec<TxSocket>, VxlanError> {
    let range = 65_536 - u32::from(vxlan::SRC_PORT_MIN);
    let seed = fnv1a(&vni.to_be_bytes()) ^ fnv1a(local.to_string().as_bytes());
    let mut out = Vec::with_capacity(SRC_PORTS);
    let mut last_err = None;
    // A stride co-prime with the range (a power of two) visits every port.
    for k in 0..range {
        if out.len() == SRC_PORTS {
            break;
        }
        let port = vxlan::SRC_PORT_MIN + ((seed.wrapping_add(k.wrapping_mul(1031))) % range) as u16;
        match UdpSocket::bind(SocketAddr::new(local, port), opts) {
            Ok(sock) => out.push(TxSocket { sock, port }),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_err = Some(e),
            Err(source) => return Err(VxlanError::SrcPorts { local, source }),
        }
        if k > 4 * SRC_PORTS as u32 && out.is_empty() {
            break;
        }
    }
    if out.is_empty() {
        return Err(VxlanError::SrcPorts {
            local,
            source: last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrInUse)),
        });
    }
    Ok(out)
}

fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h = Fnv(0x811c_9dc5);
    h.write(bytes);
    h.finish() as u32
}

/// FNV-1a, 32 bits: cheap and good enough to spread flows over a few source ports.
struct Fnv(u32);

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
    }
    fn finish(&self) -> u64 {
        u64::from(self.0)
    }
}

/// The inner flow's hash: the IP flow key when there is one, else the MAC pair and
/// EtherType. Equal for every frame of one flow.
pub fn flow_hash(frame: &[u8]) -> u32 {
    let mut h = Fnv(0x811c_9dc5);
    match flow::extract(frame) {
        Some(key) => key.hash(&mut h),
        None => h.write(&frame[..frame.len().min(ethernet::HEADER_LEN)]),
    }
    let x = h.finish() as u32;
    // FNV's low bits are weak: mix before the caller takes a modulus.
    x ^ (x >> 15) ^ (x >> 7)
}

impl Port for VxlanPort {
    fn rx_burst(&self, _queue: u16, pkts: &mut [Pkt], now: u64, drops: &mut DropTally) -> usize {
        self.now.store(now, Ordering::Relaxed);
        self.expire(now);
        let mut guard = self.rx_scratch.lock();
        let RxScratch {
            bufs,
            meta,
            got,
            msg,
            off,
            leftovers,
            srcs,
            learn_bits,
            move_bits,
        } = &mut *guard;
        if *msg >= *got {
            if bufs.is_empty() {
                *bufs = (0..RX_MSGS)
                    .map(|_| vec![0u8; RX_BUF].into_boxed_slice())
                    .collect();
                *meta = vec![RecvMeta::default(); RX_MSGS];
            }
            let mut views: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            // A plain load first: no locked instruction per batch in the steady state.
            *leftovers = self.gro_leftovers.load(Ordering::Acquire)
                && self.gro_leftovers.swap(false, Ordering::AcqRel);
            *got = match self.rx().recv_batch(&mut views, meta) {
                Ok(n) => n,
                Err(e) => {
                    tracing::debug!(port = %self.name, error = %e, "VXLAN receive failed");
                    drops.count(DropReason::RxError);
                    0
                }
            };
            if *leftovers && *got == views.len() {
                // The queue may hold more from before UDP_GRO went off.
                self.gro_leftovers.store(true, Ordering::Release);
            }
            *msg = 0;
            *off = 0;
        }
        // The VTEPs whose frames prove where a MAC lives (configured, static, EVPN): with
        // learning off the only ones accepted; with learning on the only ones whose frames
        // may move a MAC the switch knows elsewhere.
        let trusted_vteps = self.allowed.load();
        let allowed = (!self.learning).then_some(&**trusted_vteps);
        let mut out = 0;
        let mut gro = Gro::new();
        let mut merged = 0u64;
        // The last VTEP looked up in `trusted_vteps`, and the last source checked against
        // the control plane's entries (learning off): one lookup per run, not per frame.
        let mut trust: Option<(IpAddr, bool)> = None;
        let mut vouched: Option<(MacAddr, IpAddr, bool)> = None;
        srcs.clear();
        *learn_bits = 0;
        *move_bits = 0;
        let mut tally = VtepTally::new(self, Direction::Rx);
        'msgs: while *msg < *got {
            let m = meta[*msg];
            if m.truncated {
                self.rx_drop(VxlanDrop::RxTruncated, drops);
                *msg += 1;
                *off = 0;
                continue;
            }
            let buf = &bufs[*msg][..m.len];
            // A GRO segment size not below the length: one datagram. None (0): one datagram,
            // or, right after UDP_GRO went off, a coalesced message queued before, told
            // apart by its repeated VXLAN headers (`coalesced_size`).
            let size = if m.segment == 0 {
                match leftovers.then(|| coalesced_size(buf)).flatten() {
                    Some(size) => {
                        if *off == 0 {
                            self.udp_gro.fetch_add(1, Ordering::Relaxed);
                        }
                        size
                    }
                    None => m.len.max(1),
                }
            } else if m.segment >= m.len {
                m.len.max(1)
            } else {
                if *off == 0 {
                    self.udp_gro.fetch_add(1, Ordering::Relaxed);
                }
                m.segment
            };
            let vtep = m.src.ip();
            while *off < m.len {
                let end = (*off + size).min(m.len);
                let dgram = &buf[*off..end];
                if let Some(reason) = self.reject(dgram, vtep, allowed) {
                    self.rx_drop(reason, drops);
                    *off = end;
                    continue;
                }
                let inner = &dgram[vxlan::HEADER_LEN..];
                let seg = gro::parse(inner);
                let joined = match &seg {
                    Some(seg) if gro.holding() => {
                        gro.append(pkts[out - 1].frame_buf_mut(), inner, seg)
                    }
                    _ => false,
                };
                if joined {
                    merged += 1;
                } else {
                    if gro.holding() {
                        finish_gro(&mut gro, &mut pkts[out - 1], self);
                    }
                    if out == pkts.len() {
                        // The rest waits for the next burst.
                        break 'msgs;
                    }
                    let pkt = &mut pkts[out];
                    out += 1;
                    match seg {
                        Some(seg) if gro.start(pkt.frame_buf_mut(), inner, seg) => {}
                        _ => {
                            pkt.fill(inner);
                            pkt.hdr = VirtioNetHdr::default();
                        }
                    }
                }
                if !joined {
                    // What the switch may learn from frame `out - 1` (F3): with learning on,
                    // any source, but only a trusted VTEP's frame moves a MAC; with learning
                    // off, only a source the control plane put behind this VTEP.
                    let src = MacAddr(inner[6..12].try_into().unwrap_or_default());
                    let trusted = match trust {
                        Some((v, t)) if v == vtep => t,
                        _ => {
                            let t = trusted_vteps.contains(&vtep);
                            trust = Some((vtep, t));
                            t
                        }
                    };
                    let bit = 1u32 << (out - 1);
                    if self.learning {
                        *learn_bits |= bit;
                        if trusted {
                            *move_bits |= bit;
                        }
                    } else {
                        let ok = match vouched {
                            Some((m, v, ok)) if m == src && v == vtep => ok,
                            _ => {
                                let ok = self.vouched(src, vtep);
                                vouched = Some((src, vtep, ok));
                                ok
                            }
                        };
                        if ok {
                            *learn_bits |= bit;
                            *move_bits |= bit;
                        }
                    }
                    srcs.push((src, vtep, trusted));
                } else if srcs.last().is_some_and(|&(_, v, _)| v != vtep) {
                    // A super-frame of datagrams from two VTEPs proves nothing.
                    let bit = 1u32 << (out - 1);
                    *learn_bits &= !bit;
                    *move_bits &= !bit;
                }
                tally.add(vtep, inner.len() as u64);
                *off = end;
            }
            *msg += 1;
            *off = 0;
        }
        if gro.holding() {
            finish_gro(&mut gro, &mut pkts[out - 1], self);
        }
        if merged > 0 {
            self.gro_segments.fetch_add(merged, Ordering::Relaxed);
        }
        out
    }

    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone {
        // Partial checksums are completed in place first (the rest of the burst is read-only).
        // The completed frame stays valid for the other ports a flood hands it to.
        let mut bad = [0u64; 4];
        for &i in sel {
            let pkt = &mut pkts[usize::from(i)];
            if pkt.len() < ethernet::HEADER_LEN {
                bad[usize::from(i) / 64] |= 1 << (i % 64);
                continue;
            }
            if pkt.hdr.flags & FLAG_NEEDS_CSUM != 0 && pkt.hdr.gso_type == GSO_NONE {
                let (start, off) = (
                    usize::from(pkt.hdr.csum_start),
                    usize::from(pkt.hdr.csum_offset),
                );
                let len = pkt.len();
                if qswitch_wire::checksum::complete_partial(
                    &mut pkt.frame_buf_mut()[..len],
                    start,
                    off,
                )
                .is_ok()
                {
                    pkt.hdr.flags &= !FLAG_NEEDS_CSUM;
                } else {
                    bad[usize::from(i) / 64] |= 1 << (i % 64);
                }
            }
        }
        let now = self.now.load(Ordering::Relaxed);
        let flood = self.flood.load_full();
        let max = self.max_inner_frame();
        let mut done = TxDone::default();
        let mut batch: Vec<Datagram<'_>> = Vec::with_capacity(MAX_BATCH);
        let mut cur: Option<&TxSocket> = None;
        let pkts = &*pkts;
        for &i in sel {
            let pkt = &pkts[usize::from(i)];
            let frame = pkt.frame();
            if bad[usize::from(i) / 64] & (1 << (i % 64)) != 0 {
                self.count(VxlanDrop::Offload, 1);
                drops.count(DropReason::Offload);
                continue;
            }
            let dsts = self.destinations(&frame[..6], &flood, now);
            if pkt.hdr.gso_type != GSO_NONE {
                if let Some(s) = cur.take() {
                    self.flush(&s.sock, &mut batch, &mut done, drops);
                }
                self.send_segmented(worker, pkt, dsts.as_slice(), &mut done, drops);
                continue;
            }
            if frame.len() > max {
                self.count(VxlanDrop::MtuExceeded, 1);
                drops.count(DropReason::Oversize);
                continue;
            }
            let sock = self.tx_socket(frame);
            let switch = cur.is_some_and(|c| !std::ptr::eq(c, sock));
            if switch || batch.len() + dsts.as_slice().len() > MAX_BATCH {
                if let Some(s) = cur {
                    self.flush(&s.sock, &mut batch, &mut done, drops);
                }
            }
            cur = Some(sock);
            for &vtep in dsts.as_slice() {
                if batch.len() == MAX_BATCH {
                    self.flush(&sock.sock, &mut batch, &mut done, drops);
                }
                batch.push(Datagram {
                    dst: SocketAddr::new(vtep, self.dstport),
                    head: &self.header,
                    body: frame,
                });
            }
        }
        if let Some(s) = cur {
            self.flush(&s.sock, &mut batch, &mut done, drops);
        }
        done
    }

    fn rx_fd(&self, _queue: u16) -> Option<RawFd> {
        Some(self.rx().as_raw_fd())
    }

    /// A coalesced message not yet turned into frames keeps the worker awake: the socket
    /// is no longer readable, so epoll would not wake it for them (F9).
    fn rx_arm(&self, _queue: u16) -> bool {
        let s = self.rx_scratch.lock();
        s.msg >= s.got
    }

    fn rx_learn(&self, _queue: u16) -> RxLearn {
        let s = self.rx_scratch.lock();
        RxLearn {
            learn: s.learn_bits,
            moves: s.move_bits,
            report: self.learning,
        }
    }

    /// Learns the remote table from the frames the switch accepted (F4).
    fn rx_accepted(&self, _queue: u16, accepted: u32) {
        if !self.learning {
            return;
        }
        let now = self.now.load(Ordering::Relaxed);
        let s = self.rx_scratch.lock();
        let mut last: Option<(MacAddr, IpAddr)> = None;
        for (i, &(src, vtep, trusted)) in s.srcs.iter().enumerate() {
            if accepted & (1 << i) != 0 && last != Some((src, vtep)) {
                self.learn(src, vtep, trusted, now);
                last = Some((src, vtep));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::coalesced_size;

    /// A VXLAN datagram (VNI 100) around an IPv4 (or, with `v6`, IPv6) frame whose IP packet
    /// is `ip_len` bytes, optionally 802.1Q-tagged, padded to `pad_to` bytes of frame.
    fn dgram(ip_len: usize, tagged: bool, v6: bool, pad_to: usize) -> Vec<u8> {
        let mut d = vec![0x08, 0, 0, 0, 0, 0, 100, 0];
        let mut f = vec![0u8; 12];
        if tagged {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x0a]);
        }
        if v6 {
            f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
            f.extend_from_slice(&((ip_len - 40) as u16).to_be_bytes());
            f.resize(f.len() + ip_len - 6, 0x11);
        } else {
            f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
            f.extend_from_slice(&(ip_len as u16).to_be_bytes());
            f.resize(f.len() + ip_len - 4, 0x22);
        }
        f.resize(f.len().max(pad_to), 0);
        d.extend_from_slice(&f);
        d
    }

    #[test]
    fn coalesced_datagrams_are_told_apart_from_single_ones() {
        let one = dgram(1400, false, false, 0);
        assert_eq!(coalesced_size(&one), None);
        // Padded to the minimum frame: still one.
        assert_eq!(coalesced_size(&dgram(28, false, false, 60)), None);
        let mut three = [one.clone(), one.clone(), dgram(300, false, false, 0)].concat();
        assert_eq!(coalesced_size(&three), Some(one.len()));
        // A boundary that is not the same VXLAN header: one datagram as before.
        three[one.len() + 6] = 101;
        assert_eq!(coalesced_size(&three), None);
        let v6 = dgram(1440, true, true, 0);
        assert_eq!(
            coalesced_size(&[v6.clone(), v6.clone()].concat()),
            Some(v6.len())
        );
        // Small frames padded to 60 bytes, coalesced.
        let small = dgram(28, false, false, 60);
        assert_eq!(
            coalesced_size(&[small.clone(), small.clone()].concat()),
            Some(68)
        );
        // Too short or not IP: no guess.
        assert_eq!(coalesced_size(&one[..20]), None);
        let mut arp = one.clone();
        arp[8 + 12..8 + 14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(coalesced_size(&[arp.clone(), arp].concat()), None);
        // A tail shorter than a VXLAN header after the first datagram.
        assert_eq!(coalesced_size(&[&one[..], &[0x08, 0, 0]].concat()), None);
    }
}
