//! The internal generator/sink port (VPP's `pg`, Snabb's Synth/Match).
//!
//! As a **generator** (rx side), each queue synthesises IPv4/UDP frames of a fixed size to a
//! configured destination MAC, at a configured rate or as fast as the worker polls, cycling
//! through `flows` UDP source ports. Flow *f* is always generated on queue *f mod queues*, so
//! each flow's frames leave in sequence. Each frame carries a 16-byte trailer after the UDP
//! header:
//!
//! ```text
//!  42      46        48      50             58
//!  | magic | src id  | flow  | sequence (u64) |      (big-endian; magic = "QSGN")
//! ```
//!
//! As a **sink** (tx side), it counts what arrives and, for frames with the trailer, checks
//! the sequence of each (source, flow): a gap counts as lost, a step back as reordered.
//! Generating costs no syscall, so a gen → switch → gen pipeline measures the switch itself.
//!
//! The sink keeps its counts per worker (each worker locks only its own, so workers do not
//! contend). The next expected sequence number of a flow is one atomic shared by all workers:
//! a flow comes from one generator queue, which one worker at a time polls (a queue that
//! moves is handed off at a burst boundary), so the atomic has one writer at a time and the
//! check stays exact across moves.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use qswitch_api::request::SinkStats;
use qswitch_api::{GenConfig, GenIp, UnicastMac};
use qswitch_wire::checksum;
use qswitch_wire::virtio_net_hdr::VirtioNetHdr;
use qswitch_wire::MacAddr;

use super::{Port, TxDone};
use crate::ids::PortId;
use crate::packet::Pkt;
use crate::stats::{Counter, DropTally};

/// Trailer magic, "QSGN".
pub const MAGIC: u32 = 0x5153_474e;
const TRAILER: usize = 42;
const SEC: u128 = 1_000_000_000;
/// UDP destination port of generated frames.
pub const UDP_DST_PORT: u16 = 5001;
/// UDP source port of flow 0.
pub const UDP_SRC_BASE: u16 = 1024;

/// The MAC a gen port uses when none is configured: locally administered, from the name.
pub fn default_mac(name: &str) -> MacAddr {
    // FNV-1a: stable across runs and platforms.
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let b = h.to_be_bytes();
    MacAddr([0x02, 0x71, 0x73, b[5], b[6], b[7]])
}

#[derive(Debug)]
struct GenQueue {
    template: Vec<u8>,
    /// Where the flow's UDP port goes: 34 (source) or 36 (destination, `ip.reply`).
    flow_port_at: usize,
    /// Flows this queue generates, in turn: frame *k* of the queue is flow `flows[k % n]`
    /// with sequence number `k / n`, so nothing per flow is written per frame (a write there
    /// could share a cache line with another queue's state).
    flows: Vec<u16>,
    rate: u64,
    limit: Option<u64>,
    sent: u64,
    start: Option<u64>,
}

impl GenQueue {
    /// Frames due at `now` (at most `max`).
    fn due(&mut self, now: u64, max: usize) -> usize {
        let start = *self.start.get_or_insert(now);
        let mut due = if self.rate == 0 {
            max as u64
        } else {
            let allowed = (u128::from(now - start) * u128::from(self.rate) / SEC) as u64 + 1;
            allowed.saturating_sub(self.sent).min(max as u64)
        };
        if let Some(limit) = self.limit {
            due = due.min(limit - self.sent);
        }
        due as usize
    }

    fn due_in(&self, now: u64) -> Option<u64> {
        if self.flows.is_empty() || self.limit.is_some_and(|l| self.sent >= l) {
            return None;
        }
        match (self.rate, self.start) {
            (0, _) | (_, None) => Some(0),
            (rate, Some(start)) => {
                let next = start + (u128::from(self.sent) * SEC / u128::from(rate)) as u64;
                Some(next.saturating_sub(now))
            }
        }
    }
}

/// Keeps what different workers write per frame on cache lines of its own (128 bytes: the
/// adjacent-line prefetcher pairs 64-byte lines), so scaling is not eaten by false sharing.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The next expected sequence number of one (source, flow).
type NextSeq = Arc<Padded<AtomicU64>>;

/// One worker's share of the sink.
#[derive(Debug, Default)]
struct Sink {
    stats: SinkStats,
    /// This worker's handles on the shared next-sequence atomics.
    next_seq: HashMap<(u16, u16), NextSeq>,
}

/// A generator/sink port.
#[derive(Debug)]
pub struct GenPort {
    mac: MacAddr,
    queues: Vec<Padded<Mutex<GenQueue>>>,
    generated: Vec<Padded<Counter>>,
    /// Per worker (index `worker % len`).
    sinks: Vec<Padded<Mutex<Sink>>>,
    /// Next expected sequence number per (source, flow), shared by the workers' sinks; locked
    /// only the first time a worker sees a flow.
    flows: Mutex<HashMap<(u16, u16), NextSeq>>,
}

impl GenPort {
    /// A gen port with `queues` queues; `gen` says what to generate (None: sink only);
    /// `workers` is how many workers may transmit to it. Without `mac`, the port's address is
    /// derived from its name. `gen` must have passed [`qswitch_api::PortConfig::validate`]
    /// (a frame size and flows the template can take).
    pub fn new(
        id: PortId,
        name: &str,
        mac: Option<UnicastMac>,
        queues: u16,
        gen: Option<&GenConfig>,
        workers: usize,
    ) -> GenPort {
        let mac = mac.map_or_else(|| default_mac(name), |m| MacAddr(m.get().octets()));
        let nq = u64::from(queues.max(1));
        let queues = (0..nq)
            .map(|q| {
                let Some(g) = gen else {
                    return Padded(Mutex::new(GenQueue {
                        template: Vec::new(),
                        flow_port_at: 34,
                        flows: Vec::new(),
                        rate: 0,
                        limit: Some(0),
                        sent: 0,
                        start: None,
                    }));
                };
                let dst = MacAddr(g.dst.octets());
                let flows = (0..g.flows).filter(|f| u64::from(*f) % nq == q).collect();
                let share = |total: u64| total / nq + u64::from(q < total % nq);
                Padded(Mutex::new(GenQueue {
                    template: template(id, mac, dst, usize::from(g.size), g.ip),
                    flow_port_at: if g.ip.is_some_and(|ip| ip.reply) {
                        36
                    } else {
                        34
                    },
                    flows,
                    rate: share(g.rate),
                    limit: (g.count > 0).then(|| share(g.count)),
                    sent: 0,
                    start: None,
                }))
            })
            .collect();
        GenPort {
            mac,
            generated: (0..nq).map(|_| Padded::default()).collect(),
            queues,
            sinks: (0..workers.max(1)).map(|_| Padded::default()).collect(),
            flows: Mutex::default(),
        }
    }

    /// The port's MAC address.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Frames generated so far.
    pub fn generated(&self) -> u64 {
        self.generated.iter().map(|c| c.get()).sum()
    }

    /// Whether any queue generates frames (a gen port without `generate` only sinks).
    pub fn generates(&self) -> bool {
        self.queues.iter().any(|q| !q.lock().flows.is_empty())
    }

    /// What the sink has seen so far, over all workers.
    pub fn sink_stats(&self) -> SinkStats {
        let mut total = SinkStats::default();
        for s in &self.sinks {
            let s = &s.lock().stats;
            total.received += s.received;
            total.lost += s.lost;
            total.reordered += s.reordered;
            total.foreign += s.foreign;
        }
        total.lost = total.lost.saturating_sub(total.reordered);
        total
    }
}

/// An Ethernet/IPv4/UDP frame of `size` bytes with the trailer's magic and source id set;
/// the addresses and the fixed UDP port from `ip` (the flow's port is set per frame).
fn template(id: PortId, src: MacAddr, dst: MacAddr, size: usize, addrs: Option<GenIp>) -> Vec<u8> {
    let mut f = vec![0u8; size];
    f[0..6].copy_from_slice(&dst.0);
    f[6..12].copy_from_slice(&src.0);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = (size - 14) as u16;
    let [hi, lo] = id.0.to_be_bytes();
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 64;
    ip[9] = 17;
    let (ip_src, ip_dst) = addrs.map_or(([198, 18, hi, lo], [198, 19, 0, 1]), |a| {
        (a.src.octets(), a.dst.octets())
    });
    let reply = addrs.is_some_and(|a| a.reply);
    ip[12..16].copy_from_slice(&ip_src);
    ip[16..20].copy_from_slice(&ip_dst);
    let csum = checksum::fold(checksum::sum16(ip, 0));
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    let fixed_port_at = if reply { 34 } else { 36 };
    f[fixed_port_at..fixed_port_at + 2].copy_from_slice(&UDP_DST_PORT.to_be_bytes());
    f[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
    f[TRAILER..TRAILER + 4].copy_from_slice(&MAGIC.to_be_bytes());
    f[TRAILER + 4..TRAILER + 6].copy_from_slice(&id.0.to_be_bytes());
    f
}

/// The trailer of a frame: (source id, flow, sequence), if it has one.
pub fn parse_trailer(frame: &[u8]) -> Option<(u16, u16, u64)> {
    let t = frame.get(TRAILER..TRAILER + 16)?;
    if frame.get(12..14)? != [0x08, 0x00] || t[0..4] != MAGIC.to_be_bytes() {
        return None;
    }
    let src = u16::from_be_bytes([t[4], t[5]]);
    let flow = u16::from_be_bytes([t[6], t[7]]);
    let seq = u64::from_be_bytes(t[8..16].try_into().ok()?);
    Some((src, flow, seq))
}

impl Port for GenPort {
    fn rx_burst(&self, queue: u16, pkts: &mut [Pkt], now: u64, _drops: &mut DropTally) -> usize {
        let Some(q) = self.queues.get(usize::from(queue)) else {
            return 0;
        };
        let mut q = q.lock();
        if q.flows.is_empty() {
            return 0;
        }
        let n = q.due(now, pkts.len());
        let size = q.template.len();
        let nf = q.flows.len() as u64;
        let (mut i, mut seq) = ((q.sent % nf) as usize, q.sent / nf);
        for pkt in &mut pkts[..n] {
            let flow = q.flows[i];
            i += 1;
            let this = seq;
            if i == q.flows.len() {
                i = 0;
                seq += 1;
            }
            let seq = this;
            let buf = pkt.frame_buf_mut();
            buf[..size].copy_from_slice(&q.template);
            let at = q.flow_port_at;
            buf[at..at + 2].copy_from_slice(&(UDP_SRC_BASE.wrapping_add(flow)).to_be_bytes());
            buf[TRAILER + 6..TRAILER + 8].copy_from_slice(&flow.to_be_bytes());
            buf[TRAILER + 8..TRAILER + 16].copy_from_slice(&seq.to_be_bytes());
            pkt.set_len(size);
            pkt.hdr = VirtioNetHdr::default();
        }
        q.sent += n as u64;
        self.generated[usize::from(queue)].add(n as u64);
        n
    }

    fn tx_burst(
        &self,
        worker: usize,
        pkts: &mut [Pkt],
        sel: &[u8],
        _drops: &mut DropTally,
    ) -> TxDone {
        let mut sink = self.sinks[worker % self.sinks.len()].lock();
        let sink = &mut *sink;
        let mut done = TxDone::default();
        for &i in sel {
            let frame = pkts[usize::from(i)].frame();
            done.packets += 1;
            done.bytes += frame.len() as u64;
            let Some((src, flow, seq)) = parse_trailer(frame) else {
                sink.stats.foreign += 1;
                continue;
            };
            sink.stats.received += 1;
            let next = sink
                .next_seq
                .entry((src, flow))
                .or_insert_with(|| self.flows.lock().entry((src, flow)).or_default().clone());
            let n = next.load(Ordering::Acquire);
            if seq >= n {
                sink.stats.lost += seq - n;
                next.store(seq + 1, Ordering::Release);
            } else {
                // A late frame was counted lost when its gap opened: `sink_stats` takes it
                // back out.
                sink.stats.reordered += 1;
            }
        }
        done
    }

    fn rx_fd(&self, _queue: u16) -> Option<std::os::fd::RawFd> {
        None
    }

    fn rx_due_in(&self, queue: u16, now: u64) -> Option<u64> {
        self.queues.get(usize::from(queue))?.lock().due_in(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packet::Burst;

    fn gen(rate: u64, count: u64, flows: u16, queues: u16) -> GenPort {
        let g = GenConfig {
            dst: "02:00:00:00:00:02".parse().expect("MAC"),
            size: 64,
            rate,
            flows,
            count,
            ip: None,
        };
        GenPort::new(
            PortId(7),
            "g",
            Some("02:00:00:00:00:01".parse().expect("MAC")),
            queues,
            Some(&g),
            1,
        )
    }

    #[test]
    fn frames_are_valid_ipv4_udp_with_trailer() {
        let g = gen(0, 0, 2, 1);
        let mut b = Burst::new();
        let mut d = DropTally::default();
        assert_eq!(g.rx_burst(0, &mut b.pkts, 0, &mut d), 32);
        let f = b.pkts[1].frame();
        assert_eq!(f.len(), 64);
        let l2 = qswitch_wire::l2::classify(f).unwrap();
        assert_eq!(l2.src, MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(l2.dst, MacAddr([2, 0, 0, 0, 0, 2]));
        assert_eq!(
            checksum::fold(checksum::sum16(&f[14..34], 0)),
            0,
            "IPv4 header checksum"
        );
        let key = qswitch_wire::flow::extract(f).unwrap();
        assert_eq!(key.ports, Some((UDP_SRC_BASE + 1, UDP_DST_PORT)));
        assert_eq!(parse_trailer(f), Some((7, 1, 0)));
        assert_eq!(parse_trailer(b.pkts[2].frame()), Some((7, 0, 1)));
    }

    #[test]
    fn ip_sets_addresses_and_reply_moves_the_flow_to_the_destination_port() {
        let frames = |reply: bool| {
            let g = GenConfig {
                dst: "02:00:00:00:00:02".parse().expect("MAC"),
                size: 64,
                rate: 0,
                flows: 3,
                count: 0,
                ip: Some(GenIp {
                    src: "10.9.0.1".parse().expect("IP"),
                    dst: "10.9.0.2".parse().expect("IP"),
                    reply,
                }),
            };
            let p = GenPort::new(PortId(7), "g", None, 1, Some(&g), 1);
            let mut b = Burst::new();
            assert_eq!(p.rx_burst(0, &mut b.pkts, 0, &mut DropTally::default()), 32);
            let f = b.pkts[2].frame().to_vec();
            assert_eq!(checksum::fold(checksum::sum16(&f[14..34], 0)), 0);
            assert_eq!(
                (&f[26..30], &f[30..34]),
                (&[10, 9, 0, 1][..], &[10, 9, 0, 2][..])
            );
            qswitch_wire::flow::extract(&f).unwrap().ports
        };
        assert_eq!(frames(false), Some((UDP_SRC_BASE + 2, UDP_DST_PORT)));
        assert_eq!(frames(true), Some((UDP_DST_PORT, UDP_SRC_BASE + 2)));
    }

    #[test]
    fn rate_follows_injected_clock() {
        let g = gen(1000, 0, 1, 1);
        let mut b = Burst::new();
        let mut d = DropTally::default();
        assert_eq!(g.rx_burst(0, &mut b.pkts, 5_000, &mut d), 1);
        assert_eq!(g.rx_burst(0, &mut b.pkts, 5_000, &mut d), 0);
        assert_eq!(g.rx_due_in(0, 5_000), Some(1_000_000));
        assert_eq!(g.rx_burst(0, &mut b.pkts, 5_000 + 10_000_000, &mut d), 10);
        assert_eq!(g.generated(), 11);
    }

    #[test]
    fn count_is_split_over_queues_and_stops() {
        let g = gen(0, 5, 4, 2);
        let mut b = Burst::new();
        let mut d = DropTally::default();
        assert_eq!(g.rx_burst(0, &mut b.pkts, 0, &mut d), 3);
        assert_eq!(g.rx_burst(1, &mut b.pkts, 0, &mut d), 2);
        assert_eq!(g.rx_burst(0, &mut b.pkts, 1, &mut d), 0);
        assert_eq!(g.rx_due_in(0, 1), None);
    }

    #[test]
    fn sink_counts_loss_and_reordering() {
        let src = gen(0, 0, 1, 1);
        let sink = GenPort::new(PortId(9), "s", None, 1, None, 2);
        let mut b = Burst::new();
        let mut d = DropTally::default();
        assert_eq!(src.rx_burst(0, &mut b.pkts, 0, &mut d), 32);
        // deliver 0,1,2 then 5 (3,4 lost), then 4 (late), then a foreign frame
        let done = sink.tx_burst(0, &mut b.pkts, &[0, 1, 2, 5, 4], &mut d);
        assert_eq!(done.packets, 5);
        b.pkts[6].fill(&[0u8; 60]);
        sink.tx_burst(0, &mut b.pkts, &[6], &mut d);
        let s = sink.sink_stats();
        assert_eq!((s.received, s.lost, s.reordered, s.foreign), (5, 1, 1, 1));
        assert_eq!(
            sink.rx_burst(0, &mut b.pkts, 0, &mut d),
            0,
            "a sink generates nothing"
        );
    }

    #[test]
    fn default_mac_is_stable_and_unicast() {
        assert_eq!(default_mac("a"), default_mac("a"));
        assert_ne!(default_mac("a"), default_mac("b"));
        assert!(default_mac("a").is_unicast());
        assert!(default_mac("a").is_local());
    }
}
