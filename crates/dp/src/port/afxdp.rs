//! AF_XDP uplinks: a physical NIC (or any kernel interface) as a port, one AF_XDP socket per
//! NIC queue, with AF_PACKET as the fallback where XDP is not available.
//!
//! ```text
//!            wire
//!             │ ▲
//!   ┌─────────▼─┴──────────────────────────────────────────────────────────────┐
//!   │ NIC rx queue q          NIC tx (any queue)                   kernel       │
//!   │   │ XDP redirect prog        ▲                                            │
//!   │   ▼ XSKMAP[q]                │ sendto() kick (copy mode: ≤32 per kick)     │
//!   │ socket q: rx ring ─┐   ┌─ tx ring ◀── UMEM tx half                         │
//!   │   fill ring ◀──────┤   │   completion ring ──▶ free list                 │
//!   └────────────────────┼───┼────────────────────────────────────────────────┘
//!                        ▼   │
//!   rx_burst(q): copy each frame out of the UMEM into a Pkt; runt / oversize → drops;
//!                return the buffers to the fill ring (need_wakeup: kick when asked)
//!   tx_burst(w): socket w % queues; TSO super-frame → segment_while (stops when the
//!                ring is full), partial checksum → completed, > MTU → oversize drop;
//!                copy into the UMEM tx half, publish, kick
//! ```
//!
//! # Modes
//!
//! ```text
//!   Auto:  native zero-copy ─refused─▶ native copy ─refused─▶ generic XDP ─refused─▶ AF_PACKET
//!          "native-zc"                 "native-copy"          "skb"                   "packet"
//!   Native: the first two only;   Skb: generic XDP only;   Packet: AF_PACKET only.
//!   A mode that could not see every 802.1Q tag is refused (see "VLAN tags").
//!   An XDP program already on the interface stops the chain (never silently replaced).
//! ```
//!
//! [`AfXdpPort::mode_in_use`] says which one is in use, as OVS's `xdp-mode-in-use`.
//! The packet mode is one queue: a `TPACKET_V2` receive ring and `sendmmsg` with
//! `PACKET_QDISC_BYPASS` (see [`qswitch_sys::packet`] for why V2).
//!
//! # VLAN tags
//!
//! Every mode hands the switch a frame with its 802.1Q tag in the bytes, however the tag
//! arrived, so that the switch classifies it by its VID: a frame whose tag travelled out of
//! band and reached the switch untagged would land in the trunk's native VLAN, whatever its
//! VID (audit finding F1, VLAN hopping from the wire). Out of band means beside the frame
//! (`skb->vlan_tci`, the descriptor): a NIC with receive VLAN offload delivers tags so, and
//! a veth hands over a tag its peer pushed in tc that way. XDP sees neither. So
//! ([`vlan_in_band`]): on a NIC (any driver not in [`TAGS_FROM_SENDERS`]) the XDP modes
//! turn receive VLAN offload off while attached ([`xdp::RxVlanOff`]; refused where the
//! driver keeps it on); on a veth, native mode loads a device-bound program that asks the
//! driver for the tag (`bpf_xdp_metadata_rx_vlan_tag`, Linux 6.8) and writes it back into
//! the frame, and generic XDP, which runs before anything could, is refused (on the other
//! software interfaces too). The packet mode puts the tag back from `tp_vlan_tci`.
//!
//! # Attachment and cleanup
//!
//! The redirect program is attached with a BPF link owned by this process: dropping the port
//! detaches it, and so does the process dying, even by `kill -9`, so a crashed qswitch cannot
//! leave a stale program behind (there is nothing to replace at restart). A program attached
//! by someone else (through netlink, `ip link set dev IF xdp ...`, or another qswitch) makes
//! [`AfXdpPort::open`] fail with [`AfXdpError::ProgramPresent`]. Promiscuous mode is held
//! by a packet socket's `PACKET_MR_PROMISC` membership, which the kernel counts and releases
//! with the socket (again also on `kill -9`), so other users of promiscuous mode are not
//! disturbed; `ip -d link` shows it as `promiscuity N`. Every step of `open` is owned by a
//! value dropped when a later step fails, so a failed open leaves nothing attached.
//!
//! # Frame sizes and offloads
//!
//! The largest frame sent or received is the interface's MTU plus the Ethernet header (plus
//! 4 for an 802.1Q-tagged frame), so jumbo frames work up to the MTU. AF_XDP modes use UMEM
//! frames of 2048 bytes (MTU ≤ 1774) or 4096 bytes (MTU ≤ 3822); a larger MTU needs XDP
//! multi-buffer, which this does not use, so the XDP modes refuse it and `Auto` falls back to
//! the packet mode. Longer frames are counted drops ([`DropReason::Oversize`]), never
//! truncated; so are runts (shorter than an Ethernet header). TSO super-frames handed to
//! `tx_burst` leave as wire-size segments with complete checksums; partial checksums are
//! completed in software. Received frames carry no offload metadata, except in the packet
//! mode, where a frame from a local sender whose checksum is still partial gets
//! `FLAG_NEEDS_CSUM` (the kernel says so; the offsets are parsed from the frame).
//!
//! # Limitations
//! - The rx queue count comes from the ethtool channels of the interface, which work in the
//!   caller's network namespace; the NUMA node from `/sys/class/net`, which shows the
//!   namespace sysfs was mounted in (an interface in another namespace has no NUMA node).
//! - With fewer sockets than the NIC has rx queues (`queues` below the default), frames the
//!   NIC steers to the other queues go to the kernel's stack (the program passes them on):
//!   narrow the NIC's RSS to match (`ethtool -L IF combined N`).
//! - Receive aggregates (GRO, or a local sender's TSO on a veth) larger than the MTU are
//!   counted as oversize in the skb and packet modes: turn GRO off on the uplink
//!   (`ethtool -K IF gro off`). Native XDP runs before GRO.
//! - XDP carries no checksum state: on a veth, a frame from the peer's own stack whose
//!   checksum it left to offload (`CHECKSUM_PARTIAL`) arrives with a partial checksum in
//!   the native and skb modes, and the receiver drops it. A real wire never carries
//!   those; on a veth standing in for one, turn the peer's checksum offload off
//!   (`ethtool -K PEER tx off`), as OVS's AF_XDP docs do. The packet mode marks such
//!   frames `FLAG_NEEDS_CSUM` instead.
//! - Frames are copied once in each direction (into a [`Pkt`] and into the UMEM), also in
//!   zero-copy mode.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use qswitch_sys::packet::{PacketOptions, PacketRx, PacketSocket, PacketTx, Promisc, TX_BATCH};
use qswitch_sys::xdp::{self, AttachMode, BindMode, Link, Program, SocketRx, SocketTx, XskMap};
use qswitch_wire::virtio_net_hdr::{FLAG_NEEDS_CSUM, GSO_NONE};

use super::{Port, TxDone};
use crate::packet::Pkt;
use crate::stats::{DropReason, DropTally};

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
/// UMEM frames per socket (half for rx, half for tx; rings of 4096): 16 MB per queue with
/// 2048-byte frames, 32 MB with 4096 (OVS's AF_XDP netdev uses 16384 frames). The receive
/// ring must absorb what arrives while the queue's worker is preempted: with 2048 frames
/// (rings of 1024) a worker sharing its CPU with the sender's softirqs lost frames in the
/// kernel (`rx_dropped`) and TCP through the uplink retransmitted (bench uplink, native:
/// 44 k retransmits in 5 s with one stream, 1.7 Gbit/s with four; with 8192: none, 5.5).
const UMEM_FRAMES: u32 = 8192;
/// Bytes of the packet mode's receive ring.
const PACKET_RING_BYTES: u32 = 4 << 20;
/// Segmentation scratch: headers plus the largest MSS.
const SCRATCH: usize = 65_535 + 256;

/// Which data path to use: the port's `mode` key (auto tries native zero-copy, native copy,
/// generic (skb) and AF_PACKET, and takes the first that works).
pub use qswitch_api::XdpMode as Mode;

/// Errors opening an AF_XDP port. Each is one line naming the interface.
#[derive(Debug, thiserror::Error)]
pub enum AfXdpError {
    #[error("interface {ifname} does not exist")]
    NoSuchInterface { ifname: String },
    #[error("interface {ifname} has {available} rx queue(s); {requested} requested")]
    TooManyQueues {
        ifname: String,
        requested: u16,
        available: u32,
    },
    #[error("queues must be at least 1 (interface {ifname})")]
    NoQueues { ifname: String },
    #[error(
        "interface {ifname} already has an XDP program attached (by another program or \
         qswitch instance); detach it first (ip link set dev {ifname} xdp off)"
    )]
    ProgramPresent { ifname: String },
    #[error("interface {ifname} refused mode {mode}: {reason}")]
    ModeRefused {
        ifname: String,
        mode: &'static str,
        reason: String,
    },
    #[error("interface {ifname}: no mode worked ({tried})")]
    NoModeWorked { ifname: String, tried: String },
    #[error("interface {ifname}: {what}: {source}")]
    Io {
        ifname: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Counters the kernel keeps for the port's sockets, summed over its queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Frames the kernel dropped before the port saw them (no fill buffer, rx ring full,
    /// too long for a UMEM frame; packet mode: ring full).
    pub rx_dropped: u64,
    /// Invalid descriptors (a bug if not 0).
    pub invalid_descs: u64,
}

#[derive(Debug)]
struct XdpTx {
    sock: SocketTx,
    scratch: Box<[u8]>,
}

#[derive(Debug)]
struct PacketTxQueue {
    tx: PacketTx,
    /// Frames staged for one `sendmmsg`, each in a slot of `slot` bytes.
    staged: Box<[u8]>,
    lens: Vec<usize>,
    slot: usize,
    scratch: Box<[u8]>,
    /// Frames not sent since the last `take_losses`: device queue full, send error.
    lost_full: u32,
    lost_err: u32,
}

#[derive(Debug)]
enum Backend {
    // Field order is drop order: sockets, then the link (detaches), map, program.
    Xdp {
        rx: Vec<Mutex<SocketRx>>,
        tx: Vec<Mutex<XdpTx>>,
        _link: Link,
        _map: XskMap,
        _prog: Program,
        /// Receive VLAN offload held off while attached (see [`vlan_in_band`]).
        _rx_vlan: Option<xdp::RxVlanOff>,
    },
    Packet {
        rx: Mutex<PacketRx>,
        tx: Mutex<PacketTxQueue>,
        /// `tp_drops` read so far (reading the kernel's counter resets it).
        drops: AtomicU64,
    },
}

/// A kernel interface as an uplink port. See the [module docs](self).
#[derive(Debug)]
pub struct AfXdpPort {
    name: String,
    ifname: String,
    mode: &'static str,
    mtu: u32,
    numa_node: Option<u32>,
    backend: Backend,
    /// The fd to poll per rx queue.
    fds: Vec<RawFd>,
    /// Per rx queue: the interface is gone; stop polling the fd.
    dead: Vec<AtomicBool>,
    // Dropped after the sockets and the program.
    _promisc: Promisc,
}

/// Opening in one mode failed: refused (try the next), or fatal (stop).
enum Attempt {
    Refused(String),
    Fatal(AfXdpError),
}

impl AfXdpPort {
    /// Opens interface `ifname` (in the calling thread's network namespace) as port `name`,
    /// with `queues` AF_XDP sockets (default: every rx queue of the interface) in `mode`.
    /// More queues than the interface has is an error in every mode; the packet mode has one
    /// queue whatever `queues` says. The interface is not brought up (an uplink that is down
    /// carries nothing until it is).
    pub fn open(
        name: &str,
        ifname: &str,
        queues: Option<u16>,
        mode: Mode,
    ) -> Result<AfXdpPort, AfXdpError> {
        let io_err = |what: &'static str| {
            move |source: io::Error| AfXdpError::Io {
                ifname: ifname.to_string(),
                what,
                source,
            }
        };
        let ifindex = match xdp::ifindex(ifname) {
            Ok(i) => i,
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                return Err(io_err("invalid interface name")(e))
            }
            Err(_) => {
                return Err(AfXdpError::NoSuchInterface {
                    ifname: ifname.to_string(),
                })
            }
        };
        let available = xdp::rx_queues(ifname).map_err(io_err("reading the rx queue count"))?;
        let nq = match queues {
            Some(0) => {
                return Err(AfXdpError::NoQueues {
                    ifname: ifname.to_string(),
                })
            }
            Some(n) if u32::from(n) > available => {
                return Err(AfXdpError::TooManyQueues {
                    ifname: ifname.to_string(),
                    requested: n,
                    available,
                })
            }
            Some(n) => n,
            None => u16::try_from(available).unwrap_or(u16::MAX),
        };
        let mtu = xdp::mtu(ifname).map_err(io_err("reading the MTU"))?;
        let promisc = Promisc::new(ifindex).map_err(io_err("entering promiscuous mode"))?;
        let max_frame = max_frame(mtu, true);
        let xdp_frame = [2048u32, 4096]
            .into_iter()
            .find(|&f| max_frame <= (f - xdp::RX_HEADROOM) as usize);

        let chain: &[(&'static str, Option<AttachMode>)] = match mode {
            Mode::Auto => &[
                ("native", Some(AttachMode::Native)),
                ("skb", Some(AttachMode::Generic)),
                ("packet", None),
            ],
            Mode::Native => &[("native", Some(AttachMode::Native))],
            Mode::Skb => &[("skb", Some(AttachMode::Generic))],
            Mode::Packet => &[("packet", None)],
        };
        let mut tried = Vec::new();
        for &(label, attach) in chain {
            let r = match attach {
                Some(attach) => match xdp_frame {
                    Some(fs) => open_xdp(ifname, ifindex, nq, attach, fs),
                    None => Err(Attempt::Refused(format!(
                        "MTU {mtu} needs XDP multi-buffer (at most {} without)",
                        4096 - xdp::RX_HEADROOM as usize - ETH_HLEN - VLAN_HLEN
                    ))),
                },
                None => open_packet(ifname, ifindex, max_frame),
            };
            match r {
                Ok((backend, mode_in_use)) => {
                    let fds = match &backend {
                        Backend::Xdp { rx, .. } => {
                            rx.iter().map(|q| q.lock().as_raw_fd()).collect()
                        }
                        Backend::Packet { rx, .. } => vec![rx.lock().as_raw_fd()],
                    };
                    let port = AfXdpPort {
                        dead: fds.iter().map(|_| AtomicBool::new(false)).collect(),
                        fds,
                        name: name.to_string(),
                        ifname: ifname.to_string(),
                        mode: mode_in_use,
                        mtu,
                        numa_node: numa_node(ifname),
                        backend,
                        _promisc: promisc,
                    };
                    tracing::info!(
                        port = name,
                        ifname,
                        mode = mode_in_use,
                        queues = port.queues(),
                        mtu,
                        "afxdp port open"
                    );
                    return Ok(port);
                }
                Err(Attempt::Fatal(e)) => return Err(e),
                Err(Attempt::Refused(reason)) => {
                    tracing::debug!(ifname, mode = label, %reason, "afxdp mode refused");
                    tried.push((label, reason));
                }
            }
        }
        if tried.len() == 1 {
            let (mode, reason) = tried.remove(0);
            return Err(AfXdpError::ModeRefused {
                ifname: ifname.to_string(),
                mode,
                reason,
            });
        }
        Err(AfXdpError::NoModeWorked {
            ifname: ifname.to_string(),
            tried: tried
                .iter()
                .map(|(m, r)| format!("{m}: {r}"))
                .collect::<Vec<_>>()
                .join("; "),
        })
    }

    /// The port's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The interface.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// The data path in use: `"native-zc"`, `"native-copy"`, `"skb"` or `"packet"`.
    pub fn mode_in_use(&self) -> &'static str {
        self.mode
    }

    /// Rx queues (one socket each; 1 in the packet mode).
    pub fn queues(&self) -> u16 {
        match &self.backend {
            Backend::Xdp { rx, .. } => rx.len() as u16,
            Backend::Packet { .. } => 1,
        }
    }

    /// The interface's MTU when the port was opened.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// The largest frame sent or received (MTU + Ethernet header + an 802.1Q tag).
    pub fn max_frame(&self) -> usize {
        max_frame(self.mtu, true)
    }

    /// The NUMA node of the interface's device (`None`: unknown, or not a PCI device).
    pub fn numa_node(&self) -> Option<u32> {
        self.numa_node
    }

    /// The kernel's drop counters of the port's sockets (drops the port never saw).
    pub fn kernel_stats(&self) -> KernelStats {
        let mut k = KernelStats::default();
        match &self.backend {
            Backend::Xdp { rx, .. } => {
                for q in rx {
                    if let Ok(s) = q.lock().stats() {
                        k.rx_dropped += s.rx_dropped + s.rx_ring_full;
                        k.invalid_descs += s.rx_invalid_descs + s.tx_invalid_descs;
                    }
                }
            }
            Backend::Packet { rx, drops, .. } => {
                if let Ok(d) = rx.lock().take_drops() {
                    drops.fetch_add(d, Ordering::Relaxed);
                }
                k.rx_dropped = drops.load(Ordering::Relaxed);
            }
        }
        k
    }
}

/// The largest frame for `mtu`: the Ethernet header, and a tag when `tagged`.
fn max_frame(mtu: u32, tagged: bool) -> usize {
    mtu as usize + ETH_HLEN + if tagged { VLAN_HLEN } else { 0 }
}

fn is_tagged(frame: &[u8]) -> bool {
    matches!(frame.get(12..14), Some([0x81, 0x00] | [0x88, 0xa8]))
}

/// Why a frame of `len` bytes (tagged or not) cannot cross a link of `mtu`.
fn check_len(frame: &[u8], mtu: u32) -> Result<(), DropReason> {
    if frame.len() < ETH_HLEN {
        return Err(DropReason::Runt);
    }
    if frame.len() > max_frame(mtu, is_tagged(frame)) {
        return Err(DropReason::Oversize);
    }
    Ok(())
}

fn numa_node(ifname: &str) -> Option<u32> {
    if ifname.contains('/') || ifname.starts_with('.') {
        return None;
    }
    let s = std::fs::read_to_string(format!("/sys/class/net/{ifname}/device/numa_node")).ok()?;
    u32::try_from(s.trim().parse::<i64>().ok()?).ok()
}

fn open_xdp(
    ifname: &str,
    ifindex: u32,
    nq: u16,
    attach: AttachMode,
    frame_size: u32,
) -> Result<(Backend, &'static str), Attempt> {
    let fatal = |what: &'static str| {
        move |source: io::Error| {
            Attempt::Fatal(AfXdpError::Io {
                ifname: ifname.to_string(),
                what,
                source,
            })
        }
    };
    let (kfunc, rx_vlan) = vlan_in_band(ifname, attach)?;
    let map = XskMap::new(u32::from(nq)).map_err(fatal("creating the XSKMAP"))?;
    let prog = match kfunc {
        Some(id) => Program::redirect_vlan(&map, ifindex, id),
        None => Program::redirect(&map),
    }
    .map_err(fatal("loading the XDP program"))?;
    let link = match xdp::attach(&prog, ifindex, attach) {
        Ok(l) => l,
        Err(e) if xdp::already_attached(&e) => {
            return Err(Attempt::Fatal(AfXdpError::ProgramPresent {
                ifname: ifname.to_string(),
            }))
        }
        Err(e) => return Err(Attempt::Refused(format!("attaching XDP: {e}"))),
    };
    // Zero-copy needs driver support: try it on the first queue, in native mode only.
    let mut bind = match attach {
        AttachMode::Native => BindMode::ZeroCopy,
        AttachMode::Generic => BindMode::Copy,
    };
    let mut rx = Vec::with_capacity(usize::from(nq));
    let mut tx = Vec::with_capacity(usize::from(nq));
    for q in 0..u32::from(nq) {
        let sock = match xdp::Socket::with_frame_size(ifindex, q, UMEM_FRAMES, frame_size, bind) {
            Ok(s) => s,
            Err(_) if q == 0 && bind == BindMode::ZeroCopy => {
                bind = BindMode::Copy;
                xdp::Socket::with_frame_size(ifindex, q, UMEM_FRAMES, frame_size, bind)
                    .map_err(|e| Attempt::Refused(format!("AF_XDP socket on queue {q}: {e}")))?
            }
            Err(e) => return Err(Attempt::Refused(format!("AF_XDP socket on queue {q}: {e}"))),
        };
        map.set(q, &sock)
            .map_err(fatal("steering a queue to its socket"))?;
        let (r, t) = sock.split();
        rx.push(Mutex::new(r));
        tx.push(Mutex::new(XdpTx {
            sock: t,
            scratch: vec![0; SCRATCH].into_boxed_slice(),
        }));
    }
    let mode = match (attach, bind) {
        (AttachMode::Native, BindMode::ZeroCopy) => "native-zc",
        (AttachMode::Native, BindMode::Copy) => "native-copy",
        (AttachMode::Generic, _) => "skb",
    };
    Ok((
        Backend::Xdp {
            rx,
            tx,
            _link: link,
            _map: map,
            _prog: prog,
            _rx_vlan: rx_vlan,
        },
        mode,
    ))
}

/// Drivers of software interfaces that receive skbs another interface's transmit path made,
/// which may carry their 802.1Q tag out of band (`skb->vlan_tci`: a `tc` VLAN push or
/// `bpf_skb_vlan_push` on a veth's peer, a bridge's VLAN filtering) whatever the receiving
/// interface's own offload settings say.
const TAGS_FROM_SENDERS: &[&str] = &[
    "veth",
    "bridge",
    "bonding",
    "team",
    "macvlan",
    "ipvlan",
    "netkit",
    "openvswitch",
];

/// How an XDP mode on `ifname` sees every 802.1Q tag in the frame, so that the switch
/// classifies each frame by its VID however the tag arrived (see the module docs, "VLAN
/// tags"): on a veth in native mode, the program asks the driver for a tag it holds out of
/// band ([`xdp::KFUNC_RX_VLAN_TAG`], Linux 6.8) and puts it back (the kfunc's BTF id is
/// returned); on a NIC, receive VLAN offload is turned off while attached (the guard
/// returned). Refused where neither works: generic XDP on a software interface, native XDP
/// without the kfunc on one, a NIC that keeps the offload on.
fn vlan_in_band(
    ifname: &str,
    attach: AttachMode,
) -> Result<(Option<u32>, Option<xdp::RxVlanOff>), Attempt> {
    let driver = xdp::driver(ifname).unwrap_or_default();
    if TAGS_FROM_SENDERS.contains(&driver.as_str()) {
        return match attach {
            AttachMode::Native if driver == "veth" => {
                match qswitch_sys::bpf::kfunc_id(xdp::KFUNC_RX_VLAN_TAG) {
                    Some(id) => Ok((Some(id), None)),
                    None => Err(Attempt::Refused(format!(
                        "this kernel has no {} (Linux 6.8): an 802.1Q tag the {driver} \
                         interface holds out of band would be lost",
                        xdp::KFUNC_RX_VLAN_TAG
                    ))),
                }
            }
            _ => Err(Attempt::Refused(format!(
                "XDP cannot see an 802.1Q tag that a {driver} interface delivers out of band \
                 (the frame would be switched as untagged)"
            ))),
        };
    }
    match xdp::RxVlanOff::new(ifname) {
        Ok(guard) => Ok((None, Some(guard))),
        Err(e) => Err(Attempt::Refused(format!(
            "cannot turn receive VLAN offload off ({e}): XDP would not see the 802.1Q tags"
        ))),
    }
}

fn open_packet(
    ifname: &str,
    ifindex: u32,
    max_frame: usize,
) -> Result<(Backend, &'static str), Attempt> {
    let slot_size = (max_frame + qswitch_sys::packet::SLOT_OVERHEAD)
        .next_power_of_two()
        .max(2048) as u32;
    let slots = (PACKET_RING_BYTES / slot_size).max(64).next_power_of_two();
    let sock = PacketSocket::open(
        ifindex,
        PacketOptions {
            slot_size,
            slots,
            promisc: false,
        },
    )
    .map_err(|e| Attempt::Refused(format!("AF_PACKET socket on {ifname}: {e}")))?;
    Ok((
        Backend::Packet {
            rx: Mutex::new(sock.rx),
            tx: Mutex::new(PacketTxQueue {
                tx: sock.tx,
                staged: vec![0; max_frame * TX_BATCH].into_boxed_slice(),
                lens: Vec::with_capacity(TX_BATCH),
                slot: max_frame,
                scratch: vec![0; SCRATCH].into_boxed_slice(),
                lost_full: 0,
                lost_err: 0,
            }),
            drops: AtomicU64::new(0),
        },
        "packet",
    ))
}

/// Where a partial checksum lies in `frame` (IPv4 or IPv6 without extension headers, TCP or
/// UDP): `(csum_start, csum_offset)`.
fn partial_csum_offsets(frame: &[u8]) -> Option<(u16, u16)> {
    let mut l3 = ETH_HLEN;
    if is_tagged(frame) {
        l3 += VLAN_HLEN;
    }
    let et = frame.get(l3 - 2..l3)?;
    let (proto, l4) = match et {
        [0x08, 0x00] => {
            let ihl = usize::from(frame.get(l3)? & 0x0f) * 4;
            (*frame.get(l3 + 9)?, l3 + ihl)
        }
        [0x86, 0xdd] => (*frame.get(l3 + 6)?, l3 + 40),
        _ => return None,
    };
    let off: u16 = match proto {
        6 => 16,
        17 => 6,
        _ => return None,
    };
    (l4 + usize::from(off) + 2 <= frame.len()).then_some((l4 as u16, off))
}

/// One wire frame into the XDP ring: `Ok(true)` queued, `Ok(false)` ring full.
fn xdp_push(sock: &mut SocketTx, frame: &[u8], done: &mut TxDone) -> bool {
    if sock.push(frame) {
        done.packets += 1;
        done.bytes += frame.len() as u64;
        true
    } else {
        false
    }
}

impl PacketTxQueue {
    /// Stages `frame`; flushes when the batch is full. `false`: the device queue is full
    /// (the frames not sent are counted in `lost_*`).
    fn push(&mut self, frame: &[u8], done: &mut TxDone) -> bool {
        if self.lens.len() == TX_BATCH && !self.flush(done) {
            self.lost_full += 1;
            return false;
        }
        let i = self.lens.len();
        self.staged[i * self.slot..i * self.slot + frame.len()].copy_from_slice(frame);
        self.lens.push(frame.len());
        true
    }

    /// Sends the staged frames; `false` if some could not be sent (counted in `lost_*`).
    fn flush(&mut self, done: &mut TxDone) -> bool {
        if self.lens.is_empty() {
            return true;
        }
        let mut frames = [&[][..]; TX_BATCH];
        for (i, &l) in self.lens.iter().enumerate() {
            frames[i] = &self.staged[i * self.slot..i * self.slot + l];
        }
        let frames = &frames[..self.lens.len()];
        let mut sent = 0;
        let mut failed = false;
        // A few tries: the device queue drains while we retry.
        for _ in 0..4 {
            match self.tx.send(&frames[sent..]) {
                Ok(n) => sent += n,
                Err(_) => {
                    failed = true;
                    break;
                }
            }
            if sent == frames.len() {
                break;
            }
        }
        done.packets += sent as u32;
        done.bytes += frames[..sent].iter().map(|f| f.len() as u64).sum::<u64>();
        let lost = (frames.len() - sent) as u32;
        if failed {
            self.lost_err += lost;
        } else {
            self.lost_full += lost;
        }
        self.lens.clear();
        lost == 0
    }

    /// Moves the losses counted since the last call into `drops`.
    fn take_losses(&mut self, drops: &mut DropTally) {
        drops.count_n(DropReason::TxFull, std::mem::take(&mut self.lost_full));
        drops.count_n(DropReason::TxError, std::mem::take(&mut self.lost_err));
    }
}

/// Resolves a frame's offloads and hands each resulting wire frame to `emit` (which returns
/// `false` when the destination is full). Counts its own drops.
fn for_each_wire_frame(
    pkt: &mut Pkt,
    mtu: u32,
    scratch: &mut [u8],
    drops: &mut DropTally,
    mut emit: impl FnMut(&[u8]) -> bool,
) {
    if pkt.hdr.is_gso() {
        let hdr = pkt.hdr;
        let mut oversize = false;
        let r = qswitch_wire::gso::segment_while(pkt.frame(), &hdr, scratch, |seg| {
            if check_len(seg, mtu).is_err() {
                oversize = true;
                return false;
            }
            emit(seg)
        });
        if oversize {
            drops.count(DropReason::Oversize);
        } else if r.is_err() {
            drops.count(DropReason::Offload);
        }
        return;
    }
    if let Err(reason) = check_len(pkt.frame(), mtu) {
        drops.count(reason);
        return;
    }
    if pkt.hdr.flags & FLAG_NEEDS_CSUM != 0 {
        let (start, off) = (
            usize::from(pkt.hdr.csum_start),
            usize::from(pkt.hdr.csum_offset),
        );
        let len = pkt.len();
        if qswitch_wire::checksum::complete_partial(&mut pkt.frame_buf_mut()[..len], start, off)
            .is_err()
        {
            drops.count(DropReason::BadVnetHdr);
            return;
        }
        pkt.hdr.flags &= !FLAG_NEEDS_CSUM;
    }
    emit(pkt.frame());
}

impl Port for AfXdpPort {
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], _now: u64, drops: &mut DropTally) -> usize {
        let mtu = self.mtu;
        let mut n = 0;
        match &self.backend {
            Backend::Xdp { rx, .. } => {
                let Some(q) = rx.get(usize::from(queue)) else {
                    return 0;
                };
                let max = pkts.len();
                q.lock().recv(max, |frame| match check_len(frame, mtu) {
                    Ok(()) => {
                        pkts[n].fill(frame);
                        n += 1;
                    }
                    Err(reason) => drops.count(reason),
                });
            }
            Backend::Packet { rx, .. } => {
                if queue != 0 {
                    return 0;
                }
                let max = pkts.len();
                rx.lock().recv(max, |f| {
                    let tag = usize::from(f.vlan.is_some()) * VLAN_HLEN;
                    if f.wire_len > f.data.len() || f.data.len() + tag > max_frame(mtu, tag > 0) {
                        drops.count(DropReason::Oversize);
                        return;
                    }
                    if f.data.len() < ETH_HLEN {
                        drops.count(DropReason::Runt);
                        return;
                    }
                    let pkt = &mut pkts[n];
                    match f.vlan {
                        None => pkt.fill(f.data),
                        Some((tpid, tci)) => {
                            // Put back the tag the kernel took out.
                            let len = f.data.len() + VLAN_HLEN;
                            let buf = pkt.frame_buf_mut();
                            buf[..12].copy_from_slice(&f.data[..12]);
                            buf[12..14].copy_from_slice(&tpid.to_be_bytes());
                            buf[14..16].copy_from_slice(&tci.to_be_bytes());
                            buf[16..len].copy_from_slice(&f.data[12..]);
                            pkt.set_len(len);
                            pkt.hdr = Default::default();
                        }
                    }
                    if f.csum_partial {
                        if let Some((start, off)) = partial_csum_offsets(pkt.frame()) {
                            pkt.hdr.flags = FLAG_NEEDS_CSUM;
                            pkt.hdr.gso_type = GSO_NONE;
                            pkt.hdr.csum_start = start;
                            pkt.hdr.csum_offset = off;
                        }
                    }
                    n += 1;
                });
            }
        }
        n
    }

    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        drops: &mut DropTally,
    ) -> TxDone {
        let mtu = self.mtu;
        let mut done = TxDone::default();
        match &self.backend {
            Backend::Xdp { tx, .. } => {
                let qi = worker % tx.len();
                if self.dead[qi].load(Ordering::Relaxed) {
                    drops.count_n(DropReason::NoQueue, sel.len() as u32);
                    return done;
                }
                let mut q = tx[qi].lock();
                let XdpTx { sock, scratch } = &mut *q;
                for &i in sel {
                    let pkt = &mut pkts[usize::from(i)];
                    let mut full = false;
                    for_each_wire_frame(pkt, mtu, scratch, drops, |f| {
                        full = !xdp_push(sock, f, &mut done);
                        !full
                    });
                    if full {
                        // The rest of this frame is lost; publishing what fits lets the
                        // kernel drain the ring for the next frames.
                        sock.commit();
                        drops.count(DropReason::TxFull);
                    }
                }
                sock.commit();
            }
            Backend::Packet { tx, .. } => {
                let mut q = tx.lock();
                let q = &mut *q;
                for &i in sel {
                    let pkt = &mut pkts[usize::from(i)];
                    let mut scratch = std::mem::take(&mut q.scratch);
                    for_each_wire_frame(pkt, mtu, &mut scratch, drops, |f| q.push(f, &mut done));
                    q.scratch = scratch;
                }
                q.flush(&mut done);
                q.take_losses(drops);
            }
        }
        done
    }

    fn rx_fd(&self, queue: u16) -> Option<RawFd> {
        self.fds.get(usize::from(queue)).copied()
    }

    fn rx_arm(&self, queue: u16) -> bool {
        let q = usize::from(queue);
        match &self.backend {
            Backend::Xdp { rx, .. } => match rx.get(q) {
                Some(s) => {
                    let s = s.lock();
                    // Only the interface's removal sets an error on an AF_XDP socket.
                    if let Some(e) = s.take_error() {
                        if !self.dead[q].swap(true, Ordering::Relaxed) {
                            tracing::warn!(ifname = %self.ifname, queue, error = %e,
                                "AF_XDP queue failed (interface deleted?); no longer polled");
                        }
                    }
                    s.arm()
                }
                None => true,
            },
            Backend::Packet { rx, .. } => {
                if queue != 0 {
                    return true;
                }
                let rx = rx.lock();
                // The link went down (or away): take the error, or it wakes every poll.
                if let Some(e) = rx.take_error() {
                    if !rx.bound() {
                        if !self.dead[0].swap(true, Ordering::Relaxed) {
                            tracing::warn!(ifname = %self.ifname, error = %e,
                                "uplink interface deleted; no longer polled");
                        }
                    } else {
                        tracing::info!(ifname = %self.ifname, error = %e, "uplink socket error");
                    }
                }
                !rx.pending()
            }
        }
    }

    fn rx_dead(&self, queue: u16) -> bool {
        self.dead
            .get(usize::from(queue))
            .is_some_and(|d| d.load(Ordering::Relaxed))
    }

    fn offloads(&self) -> Vec<&'static str> {
        // Accepted on tx, resolved in software.
        vec!["csum(sw)", "tso4(sw)", "tso6(sw)"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(len: usize, tagged: bool) -> Vec<u8> {
        let mut f = vec![0u8; len];
        if tagged && len >= 14 {
            f[12..14].copy_from_slice(&[0x81, 0x00]);
        }
        f
    }

    #[test]
    fn runts_and_oversize_frames_are_refused() {
        assert_eq!(check_len(&frame(13, false), 1500), Err(DropReason::Runt));
        assert_eq!(check_len(&frame(0, false), 1500), Err(DropReason::Runt));
        assert_eq!(check_len(&frame(14, false), 1500), Ok(()));
        assert_eq!(check_len(&frame(1514, false), 1500), Ok(()));
        assert_eq!(
            check_len(&frame(1515, false), 1500),
            Err(DropReason::Oversize)
        );
        assert_eq!(check_len(&frame(1518, true), 1500), Ok(()));
        assert_eq!(
            check_len(&frame(1519, true), 1500),
            Err(DropReason::Oversize)
        );
        assert_eq!(check_len(&frame(9014, false), 9000), Ok(()));
    }

    #[test]
    fn partial_checksum_offsets() {
        let mut f = vec![0u8; 60];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14] = 0x46; // 24-byte header
        f[23] = 17;
        assert_eq!(partial_csum_offsets(&f), Some((38, 6)));
        f[23] = 6;
        assert_eq!(partial_csum_offsets(&f), Some((38, 16)));
        f[23] = 1;
        assert_eq!(partial_csum_offsets(&f), None);
        let mut v6 = vec![0u8; 80];
        v6[12..14].copy_from_slice(&[0x86, 0xdd]);
        v6[20] = 6;
        assert_eq!(partial_csum_offsets(&v6), Some((54, 16)));
        assert_eq!(
            partial_csum_offsets(&v6[..60]),
            None,
            "field beyond the frame"
        );
    }
}
