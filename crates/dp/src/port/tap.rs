//! TAP ports: the kernel's network stack (namespaces, containers, the host) as a port.
//!
//! ```text
//!   netns / host stack            qswitch
//!   ┌────────────┐   queue 0 fd   ┌───────────────────────────┐
//!   │  qs-a      │ ─────────────▶ │ rx_burst(0): read() ×≤32  │
//!   │ (TAP dev)  │   queue 1 fd   │ rx_burst(1): read() ×≤32  │
//!   │            │ ◀───────────── │ tx_burst: write() on the  │
//!   └────────────┘                │   fd of queue worker % n  │
//!                                 └───────────────────────────┘
//! ```
//!
//! Every queue is opened with `IFF_VNET_HDR` (12-byte header) and the offloads
//! `TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN`, so the kernel hands over TCP
//! segments of up to 64 KiB with partial checksums, and takes them back the same way: a TSO
//! segment crosses the switch whole, and nobody computes a checksum in software.
//!
//! The interface is created when absent (and then disappears when the port is dropped, as
//! non-persistent TAPs do when their last fd closes), or attached to when a persistent TAP of
//! that name exists (left in place on exit). Moving the interface into another network
//! namespace after creation does not affect the fds.
//!
//! # GRO toward the TAP
//! Frames that arrive at wire size (from an AF_XDP uplink, a VXLAN tunnel, a guest without
//! TSO) would each cost one `write` and one pass through the receiving stack, which runs
//! inside that `write` on the worker's thread. So [`TapPort::tx_burst`] coalesces
//! consecutive in-order TCP segments of one flow within a burst into one TSO super-frame
//! ([`qswitch_wire::gro`]: virtio-net header `GSO_TCPV4`/`GSO_TCPV6`, `gso_size`, partial
//! checksum) and writes it once, as the kernel's own GRO would have:
//!
//! ```text
//!   sel: A1 A2 A3 U B1 A4 B2 B3   (A, B: TCP flows; U: anything else)
//!   out: [A1A2A3] U B1 A4 [B2B3]  (one write each; order kept)
//! ```
//!
//! Only what [`qswitch_wire::gro`] accepts merges (plain TCP segments with correct
//! checksums, ACK/PSH/FIN only, the same headers, the next sequence number); everything
//! else — other protocols, a segment of another flow, a frame that already carries GSO or a
//! partial checksum — is written unchanged, and the held super-frame is written before it,
//! so no frame overtakes another. A segment is only copied into the super-frame buffer when
//! the next frame of the burst looks like its continuation; a lone segment is written from
//! its own buffer. The buffer (64 KiB and headroom) is one per queue, allocated at open.
//! Counted as `gro_frames` (super-frames written) and `gro_segments` (segments in them).
//!
//! # Limitations
//! One syscall per frame (or super-frame) in each direction: TAP has no batched read or
//! write. GRO sees one burst at a time (up to 32 frames): a flow is not held across bursts.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use qswitch_sys::netif;
use qswitch_sys::tap::{TapOptions, TapQueue, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN};
use qswitch_wire::gro::{self, Gro, TcpSegment};
use qswitch_wire::virtio_net_hdr::{self, VirtioNetHdr, FLAG_NEEDS_CSUM};

use super::{Port, TxDone};
use crate::packet::{Pkt, BUF_SIZE, HEADROOM};
use crate::stats::{DropReason, DropTally};

const OFFLOADS: u32 = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
/// `IFF_MULTI_QUEUE` as shown in `/sys/class/net/<if>/tun_flags`.
const IFF_MULTI_QUEUE: u32 = 0x0100;
/// Bytes of a GRO buffer: the virtio-net header, the largest IP packet (64 KiB) and room
/// for the Ethernet header and one VLAN tag.
const GRO_BUF: usize = virtio_net_hdr::LEN + 65_536 + 64;

/// Errors opening a TAP port.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("cannot open TAP {ifname} queue {queue}")]
    Open {
        ifname: String,
        queue: u16,
        #[source]
        source: io::Error,
    },
    #[error("cannot set offloads on TAP {ifname}")]
    Offload {
        ifname: String,
        #[source]
        source: io::Error,
    },
    #[error("{0} exists and is not a TAP interface")]
    NotTap(String),
    #[error(
        "existing TAP {ifname} is single-queue; use queues = 1 or recreate it with multi_queue"
    )]
    SingleQueue { ifname: String },
    #[error("cannot bring TAP {ifname} up")]
    Up {
        ifname: String,
        #[source]
        source: io::Error,
    },
}

/// A TAP interface with one or more queues.
#[derive(Debug)]
pub struct TapPort {
    ifname: String,
    queues: Vec<TapQueue>,
    /// Per queue: the device is gone (deleted, or its namespace was); stop polling it.
    dead: Vec<AtomicBool>,
    created: bool,
    /// Per queue: the buffer super-frames are built in (see the module docs).
    gro: Vec<Mutex<GroScratch>>,
    gro_frames: AtomicU64,
    gro_segments: AtomicU64,
}

/// A TAP port's own counters ([`TapPort::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TapStats {
    /// TSO super-frames written, built from TCP segments of one flow (software GRO).
    pub gro_frames: u64,
    /// Segments merged into them.
    pub gro_segments: u64,
}

/// One queue's GRO state: the super-frame under construction and what it holds.
struct GroScratch {
    /// Virtio-net header, then the super-frame.
    buf: Box<[u8]>,
    gro: Gro,
    /// The burst index of the held super-frame's first frame.
    first: usize,
    /// Frames held, and their bytes.
    frames: u32,
    bytes: u64,
}

impl std::fmt::Debug for GroScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroScratch")
            .field("holding", &self.gro.holding())
            .field("frames", &self.frames)
            .finish()
    }
}

impl GroScratch {
    fn new() -> GroScratch {
        GroScratch {
            buf: vec![0u8; GRO_BUF].into_boxed_slice(),
            gro: Gro::new(),
            first: 0,
            frames: 0,
            bytes: 0,
        }
    }
}

impl TapPort {
    /// Opens (creating if needed) TAP `ifname` with `queues` queues, sets the offloads and
    /// brings the link up.
    pub fn open(ifname: &str, queues: u16) -> Result<TapPort, TapError> {
        TapPort::open_as(ifname, queues, false, true)
    }

    /// [`TapPort::open`] for a TAP that only carries another port's frames (a veth port's
    /// slow path): IPv6 is turned off on it before it comes up where `/proc/sys` is writable
    /// (not under systemd's `ProtectKernelTunables`), so that the host's stack has nothing
    /// of its own (router solicitations, duplicate address detection) to send into it. The
    /// veth port drops whatever the host sends there anyway.
    pub fn open_internal(ifname: &str, queues: u16) -> Result<TapPort, TapError> {
        TapPort::open_as(ifname, queues, true, true)
    }

    /// [`TapPort::open_internal`], left down for the caller to set up (a veth port attaches
    /// its slow path's programs first: cheaper on a link that is down, docs/veth.md).
    pub fn open_internal_down(ifname: &str, queues: u16) -> Result<TapPort, TapError> {
        TapPort::open_as(ifname, queues, true, false)
    }

    fn open_as(ifname: &str, queues: u16, internal: bool, up: bool) -> Result<TapPort, TapError> {
        let existed = netif::exists(ifname);
        let multi_queue = if existed {
            let flags = tun_flags(ifname).ok_or_else(|| TapError::NotTap(ifname.to_string()))?;
            let mq = flags & IFF_MULTI_QUEUE != 0;
            if !mq && queues > 1 {
                return Err(TapError::SingleQueue {
                    ifname: ifname.to_string(),
                });
            }
            mq
        } else {
            true
        };
        let opts = TapOptions {
            multi_queue,
            vnet_hdr: true,
        };
        let mut qs = Vec::with_capacity(usize::from(queues));
        for q in 0..queues {
            let tq = TapQueue::open(ifname, opts).map_err(|source| TapError::Open {
                ifname: ifname.to_string(),
                queue: q,
                source,
            })?;
            tq.set_offload(OFFLOADS)
                .map_err(|source| TapError::Offload {
                    ifname: ifname.to_string(),
                    source,
                })?;
            qs.push(tq);
        }
        if internal {
            // Best effort (see above): read-only under ProtectKernelTunables, absent without
            // IPv6.
            let knob = format!("/proc/sys/net/ipv6/conf/{ifname}/disable_ipv6");
            if let Err(e) = std::fs::write(&knob, "1") {
                tracing::debug!(%ifname, error = %e, "IPv6 stays on (no writable /proc/sys)");
            }
        }
        if up {
            netif::set_up(ifname, true).map_err(|source| TapError::Up {
                ifname: ifname.to_string(),
                source,
            })?;
        }
        Ok(TapPort {
            ifname: ifname.to_string(),
            dead: qs.iter().map(|_| AtomicBool::new(false)).collect(),
            gro: qs.iter().map(|_| Mutex::new(GroScratch::new())).collect(),
            queues: qs,
            created: !existed,
            gro_frames: AtomicU64::new(0),
            gro_segments: AtomicU64::new(0),
        })
    }

    /// The port's own counters.
    pub fn stats(&self) -> TapStats {
        TapStats {
            gro_frames: self.gro_frames.load(Ordering::Relaxed),
            gro_segments: self.gro_segments.load(Ordering::Relaxed),
        }
    }

    /// Writes the super-frame `s` holds: merged, or its one frame as it came (`pkts`).
    fn flush(
        &self,
        tq: &TapQueue,
        s: &mut GroScratch,
        pkts: &mut [Pkt],
        done: &mut TxDone,
        drops: &mut DropTally,
    ) {
        let (frames, bytes) = (s.frames, s.bytes);
        s.frames = 0;
        s.bytes = 0;
        let Some((len, hdr)) = s.gro.finish(&mut s.buf[virtio_net_hdr::LEN..]) else {
            return;
        };
        let res = if gro::is_super(&hdr) {
            hdr.emit(&mut s.buf[..virtio_net_hdr::LEN]);
            let r = tq.write(&s.buf[..virtio_net_hdr::LEN + len]);
            if r.is_ok() {
                self.gro_frames.fetch_add(1, Ordering::Relaxed);
                self.gro_segments
                    .fetch_add(u64::from(frames), Ordering::Relaxed);
            }
            r
        } else {
            match pkts.get_mut(s.first) {
                Some(pkt) => tq.write(pkt.with_vnet_hdr()),
                None => return,
            }
        };
        account(res, frames, bytes, done, drops);
    }

    /// The interface name.
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// Whether qswitch created the interface (so it disappears with the port).
    pub fn created(&self) -> bool {
        self.created
    }
}

/// Counts the outcome of one write that carried `frames` frames of `bytes` bytes.
fn account(
    res: io::Result<usize>,
    frames: u32,
    bytes: u64,
    done: &mut TxDone,
    drops: &mut DropTally,
) {
    let reason = match res {
        Ok(_) => {
            done.packets += frames;
            done.bytes += bytes;
            return;
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => DropReason::TxFull,
        Err(e) if qswitch_sys::tap::is_link_down(&e) => DropReason::LinkDown,
        Err(_) => DropReason::TxError,
    };
    for _ in 0..frames {
        drops.count(reason);
    }
}

/// `pkt` as a TCP segment GRO may merge: no offloads of its own, and [`gro::parse`] takes it.
fn segment(pkt: &Pkt) -> Option<TcpSegment> {
    if pkt.hdr.is_gso() || pkt.hdr.flags & FLAG_NEEDS_CSUM != 0 {
        return None;
    }
    gro::parse(pkt.frame())
}

/// Whether `next` looks like the segment after `seg` of the same flow (`frame` is `seg`'s):
/// the cheap test before copying `seg` into the GRO buffer; [`Gro::append`] decides.
fn may_follow(frame: &[u8], seg: &TcpSegment, next: &Pkt) -> bool {
    let Some(n) = segment(next) else {
        return false;
    };
    let nf = next.frame();
    n.v6 == seg.v6
        && n.l4 == seg.l4
        && n.hlen == seg.hlen
        && n.seq == seg.seq.wrapping_add(seg.payload as u32)
        && frame.get(seg.l4..seg.l4 + 4) == nf.get(n.l4..n.l4 + 4)
}

fn tun_flags(ifname: &str) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/sys/class/net/{ifname}/tun_flags")).ok()?;
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

impl Port for TapPort {
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], _now: u64, drops: &mut DropTally) -> usize {
        let q = usize::from(queue);
        let Some(tq) = self.queues.get(q) else {
            return 0;
        };
        if self.dead[q].load(Ordering::Relaxed) {
            return 0;
        }
        let mut n = 0;
        let mut reads = 0;
        // Bounded: at most one read per buffer, even when frames are dropped.
        while n < pkts.len() && reads < pkts.len() {
            reads += 1;
            let pkt = &mut pkts[n];
            let got = match tq.read(pkt.raw_buf_mut()) {
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    drops.count(DropReason::RxError);
                    if !self.dead[q].swap(true, Ordering::Relaxed) {
                        tracing::warn!(ifname = %self.ifname, queue, error = %e,
                            "TAP queue failed (device deleted?); no longer polled");
                    }
                    break;
                }
            };
            if got < HEADROOM {
                drops.count(DropReason::Runt);
                continue;
            }
            if got >= BUF_SIZE {
                drops.count(DropReason::Oversize);
                continue;
            }
            let Ok(hdr) = VirtioNetHdr::parse(&pkt.raw_buf_mut()[..HEADROOM]) else {
                drops.count(DropReason::BadVnetHdr);
                continue;
            };
            pkt.set_len(got - HEADROOM);
            if hdr.validate(pkt.len()).is_err() {
                drops.count(DropReason::BadVnetHdr);
                continue;
            }
            pkt.hdr = VirtioNetHdr {
                num_buffers: 0,
                ..hdr
            };
            n += 1;
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
        let q = worker % self.queues.len();
        let tq = &self.queues[q];
        let mut done = TxDone::default();
        let mut s = self.gro[q].lock();
        let s = &mut *s;
        s.gro.reset();
        s.frames = 0;
        for (k, &i) in sel.iter().enumerate() {
            let i = usize::from(i);
            let Some(pkt) = pkts.get(i) else {
                continue;
            };
            let len = pkt.len() as u64;
            if let Some(seg) = segment(pkt) {
                let out = &mut s.buf[virtio_net_hdr::LEN..];
                if s.gro.holding() && s.gro.append(out, pkt.frame(), &seg) {
                    s.frames += 1;
                    s.bytes += len;
                    continue;
                }
                self.flush(tq, s, pkts, &mut done, drops);
                let pkt = &pkts[i];
                let next = sel.get(k + 1).and_then(|&j| pkts.get(usize::from(j)));
                if next.is_some_and(|n| may_follow(pkt.frame(), &seg, n))
                    && s.gro
                        .start(&mut s.buf[virtio_net_hdr::LEN..], pkt.frame(), seg)
                {
                    s.first = i;
                    s.frames = 1;
                    s.bytes = len;
                    continue;
                }
            } else {
                self.flush(tq, s, pkts, &mut done, drops);
            }
            let res = tq.write(pkts[i].with_vnet_hdr());
            account(res, 1, len, &mut done, drops);
        }
        self.flush(tq, s, pkts, &mut done, drops);
        done
    }

    fn rx_fd(&self, queue: u16) -> Option<RawFd> {
        self.queues.get(usize::from(queue)).map(AsRawFd::as_raw_fd)
    }

    fn rx_dead(&self, queue: u16) -> bool {
        self.dead
            .get(usize::from(queue))
            .is_some_and(|d| d.load(Ordering::Relaxed))
    }

    fn offloads(&self) -> Vec<&'static str> {
        vec!["vnet_hdr", "csum", "tso4", "tso6", "tso_ecn"]
    }
}

// The virtio-net header length the TAP is configured with must be the one packets carry.
const _: () = assert!(qswitch_sys::tap::VNET_HDR_LEN == virtio_net_hdr::LEN);
