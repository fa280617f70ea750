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
//! # Limitations
//! One syscall per frame in each direction: TAP has no batched read or write.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use qswitch_sys::netif;
use qswitch_sys::tap::{TapOptions, TapQueue, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_TSO_ECN};
use qswitch_wire::virtio_net_hdr::{self, VirtioNetHdr};

use super::{Port, TxDone};
use crate::packet::{Pkt, BUF_SIZE, HEADROOM};
use crate::stats::{DropReason, DropTally};

const OFFLOADS: u32 = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
/// `IFF_MULTI_QUEUE` as shown in `/sys/class/net/<if>/tun_flags`.
const IFF_MULTI_QUEUE: u32 = 0x0100;

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
}

impl TapPort {
    /// Opens (creating if needed) TAP `ifname` with `queues` queues, sets the offloads and
    /// brings the link up.
    pub fn open(ifname: &str, queues: u16) -> Result<TapPort, TapError> {
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
        netif::set_up(ifname, true).map_err(|source| TapError::Up {
            ifname: ifname.to_string(),
            source,
        })?;
        Ok(TapPort {
            ifname: ifname.to_string(),
            dead: qs.iter().map(|_| AtomicBool::new(false)).collect(),
            queues: qs,
            created: !existed,
        })
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
        let tq = &self.queues[worker % self.queues.len()];
        let mut done = TxDone::default();
        for &i in sel {
            let pkt = &mut pkts[usize::from(i)];
            let len = pkt.len() as u64;
            match tq.write(pkt.with_vnet_hdr()) {
                Ok(_) => {
                    done.packets += 1;
                    done.bytes += len;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => drops.count(DropReason::TxFull),
                Err(_) => drops.count(DropReason::TxError),
            }
        }
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
