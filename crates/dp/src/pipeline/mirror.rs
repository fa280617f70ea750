//! Stage `mirror`: copies of the frames of mirror sessions' source ports, to a local output
//! port (SPAN) or to a collector as ERSPAN type II over GRE (issue 32, docs/visibility.md).
//!
//! ```text
//!  worker: rx_burst ─▶ mirror.on()? ─▶ rx: copy each kept frame into a free slot ─▶ ready
//!          tx_burst ◀─ mirror.on()? ◀─ tx: (the frames selected for that port)   │ (bounded)
//!  session thread: ready ─▶ output port's tx_burst | raw GRE socket ─▶ free ◀────┘
//! ```
//!
//! # Cost
//! Not configured: one relaxed atomic load per burst per port ([`PortMirror::on`](crate::table::PortMirror::on)), the same
//! flag the capture hook has beside it. On a source: per burst an `arc-swap` load; per frame
//! a VLAN check, a lock-free pop and push ([`crossbeam_queue::ArrayQueue`]) and a copy into a
//! preallocated slot. Nothing allocates and nothing blocks: when a session's free slots run
//! out (its destination is slower than its sources) the copy is counted as the session's
//! drop and the frame is switched as usual. The session's own thread sends the copies, so a
//! slow or blocked destination costs the sources nothing but those drops.
//!
//! # The output port
//! A local output port receives the copies and nothing else: it is in no flood domain, its
//! learned addresses are forgotten when the session starts, and every frame it sends is
//! dropped as `mirror_output` (so nothing is learned from it either).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use parking_lot::Mutex;
use qswitch_api::config::{MirrorConfig, VlanSet};
use qswitch_wire::erspan::Erspan;
use qswitch_wire::virtio_net_hdr::VirtioNetHdr;

use crate::packet::{Burst, Pkt, BURST};
use crate::port::Port;
use crate::stats::{DropReason, DropTally};
use crate::table::{MirrorSession, PortEntry};

/// Copies a session's queue holds.
pub const QUEUE_SLOTS: usize = 512;
/// Largest frame a slot holds (a jumbo frame); larger ones (GSO super-frames) are counted as
/// the session's drops.
pub const SLOT_BYTES: usize = 9216;
/// Longest the session thread sleeps when its queue is empty (workers wake it earlier).
const IDLE: Duration = Duration::from_millis(50);
/// How long the session's thread waits after its destination refused a whole burst.
const REFUSED_BACKOFF: Duration = Duration::from_millis(10);

/// One copied frame.
struct Slot {
    len: usize,
    /// The port it was seen on (the ERSPAN index).
    port: u16,
    /// Its VLAN (the ERSPAN header's VLAN field).
    vlan: u16,
    hdr: VirtioNetHdr,
    buf: [u8; SLOT_BYTES],
}

/// Where a session's copies go.
pub enum Output {
    /// A local port.
    Port(Arc<PortEntry>),
    /// A collector, over a raw `IPPROTO_GRE` socket.
    Erspan {
        socket: socket2::Socket,
        dst: socket2::SockAddr,
        session: u16,
    },
}

impl Output {
    /// A raw GRE socket to `dst` (from `src`, with `ttl` when given).
    pub fn erspan(
        dst: IpAddr,
        session: u16,
        src: Option<IpAddr>,
        ttl: Option<u8>,
    ) -> std::io::Result<Output> {
        use socket2::{Domain, Protocol, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(47)))?;
        if let Some(src) = src {
            socket.bind(&SocketAddr::new(src, 0).into())?;
        }
        if let Some(ttl) = ttl {
            socket.set_ttl_v4(u32::from(ttl))?;
        }
        // Never block the session's thread on a full socket buffer: a refused copy is a drop.
        socket.set_nonblocking(true)?;
        Ok(Output::Erspan {
            socket,
            dst: SocketAddr::new(dst, 0).into(),
            session,
        })
    }
}

/// A session's settings and counters, shared by the workers (producers) and its thread.
pub struct Session {
    pub config: MirrorConfig,
    vlans: Option<VlanSet>,
    rx: bool,
    tx: bool,
    free: ArrayQueue<Box<Slot>>,
    ready: ArrayQueue<Box<Slot>>,
    copies: AtomicU64,
    drops: AtomicU64,
    sent: AtomicU64,
    /// The thread sleeps (workers unpark it after they queued copies).
    sleeping: AtomicBool,
    stop: AtomicBool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("name", &self.config.name)
            .field("copies", &self.copies())
            .field("drops", &self.drops())
            .finish()
    }
}

impl Session {
    /// A session with its queue preallocated; no thread yet ([`Session::start`]).
    pub fn new(config: MirrorConfig) -> Session {
        let free = ArrayQueue::new(QUEUE_SLOTS);
        for _ in 0..QUEUE_SLOTS {
            let slot = Box::new(Slot {
                len: 0,
                port: 0,
                vlan: 0,
                hdr: VirtioNetHdr::default(),
                buf: [0; SLOT_BYTES],
            });
            let _ = free.push(slot);
        }
        Session {
            vlans: config.vlans.clone(),
            rx: config.direction.rx(),
            tx: config.direction.tx(),
            config,
            free,
            ready: ArrayQueue::new(QUEUE_SLOTS),
            copies: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            thread: Mutex::new(None),
        }
    }

    /// Copies queued so far.
    pub fn copies(&self) -> u64 {
        self.copies.load(Ordering::Relaxed)
    }
    /// Copies lost: the queue was full, the frame larger than a slot, or the destination
    /// refused it.
    pub fn drops(&self) -> u64 {
        self.drops.load(Ordering::Relaxed)
    }
    /// Copies the destination took.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Starts the thread that sends the copies to `out`.
    pub fn start(self: &Arc<Self>, out: Output) -> std::io::Result<()> {
        let me = self.clone();
        // A panic ends this session's sending only (its copies are then counted as drops
        // once the queue is full); logged with the thread's name.
        let h = qswitch_sys::thread::spawn(
            format!("mirror-{}", truncate(&self.config.name, 8)),
            &[],
            |why| tracing::error!("{why}; the mirror session stops sending"),
            move |_| me.run(out),
        )?;
        *self.thread.lock() = Some(h);
        Ok(())
    }

    /// Stops the thread and waits for it.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.thread.lock().take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }

    /// Copies `frames` (seen on `port`, whose untagged frames are in VLAN `native`).
    #[inline]
    fn push<'a>(&self, port: u16, native: u16, frames: impl Iterator<Item = &'a Pkt>) {
        let (mut kept, mut lost) = (0u64, 0u64);
        for pkt in frames {
            let f = pkt.frame();
            let vlan = frame_vlan(f).unwrap_or(native);
            if let Some(v) = &self.vlans {
                if !v.contains(vlan) {
                    continue;
                }
            }
            if f.len() > SLOT_BYTES {
                lost += 1;
                continue;
            }
            let Some(mut slot) = self.free.pop() else {
                lost += 1;
                continue;
            };
            slot.buf[..f.len()].copy_from_slice(f);
            slot.len = f.len();
            slot.port = port;
            slot.vlan = vlan;
            slot.hdr = pkt.hdr;
            // Cannot fail: a slot comes from `free` and both queues hold all of them.
            let _ = self.ready.push(slot);
            kept += 1;
        }
        if kept > 0 {
            self.copies.fetch_add(kept, Ordering::Relaxed);
            if self.sleeping.load(Ordering::SeqCst) {
                if let Some(h) = self.thread.try_lock().as_ref().and_then(|h| h.as_ref()) {
                    h.thread().unpark();
                }
            }
        }
        if lost > 0 {
            self.drops.fetch_add(lost, Ordering::Relaxed);
        }
    }

    /// The session's thread: sends what the workers queued until stopped.
    fn run(&self, out: Output) {
        let mut burst = Burst::new();
        let mut slots: Vec<Box<Slot>> = Vec::with_capacity(BURST);
        let mut seq = 0u32;
        let sel: Vec<u8> = (0..BURST as u8).collect();
        while !self.stop.load(Ordering::Relaxed) {
            while slots.len() < BURST {
                match self.ready.pop() {
                    Some(s) => slots.push(s),
                    None => break,
                }
            }
            if slots.is_empty() {
                self.sleeping.store(true, Ordering::SeqCst);
                if self.ready.is_empty() {
                    std::thread::park_timeout(IDLE);
                }
                self.sleeping.store(false, Ordering::SeqCst);
                continue;
            }
            let (mut sent, mut lost) = (0u64, 0u64);
            match &out {
                Output::Port(entry) => {
                    for (pkt, s) in burst.pkts.iter_mut().zip(&slots) {
                        pkt.fill(&s.buf[..s.len]);
                        pkt.hdr = s.hdr;
                    }
                    let n = slots.len();
                    let mut td = DropTally::default();
                    if entry.disabled.get() {
                        td.count_n(DropReason::PortDisabled, n as u32);
                    } else {
                        let done = entry.dev.tx_burst(0, &mut burst.pkts, &sel[..n], &mut td);
                        // The output port receives nothing else, so no worker writes these.
                        let tc = &entry.counters.tx[0];
                        tc.tx_packets.add(u64::from(done.packets));
                        tc.tx_bytes.add(done.bytes);
                        sent = u64::from(done.packets);
                    }
                    lost = n as u64 - sent;
                    td.flush(&entry.counters.tx[0].drops);
                }
                Output::Erspan {
                    socket,
                    dst,
                    session,
                } => {
                    for s in &slots {
                        let hdr = Erspan {
                            seq,
                            session: *session,
                            vlan: s.vlan,
                            cos: 0,
                            index: u32::from(s.port),
                        }
                        .header();
                        seq = seq.wrapping_add(1);
                        let iov = [
                            std::io::IoSlice::new(&hdr),
                            std::io::IoSlice::new(&s.buf[..s.len]),
                        ];
                        match socket.send_to_vectored(&iov, dst) {
                            Ok(_) => sent += 1,
                            Err(_) => lost += 1,
                        }
                    }
                }
            }
            self.sent.fetch_add(sent, Ordering::Relaxed);
            self.drops.fetch_add(lost, Ordering::Relaxed);
            for s in slots.drain(..) {
                let _ = self.free.push(s);
            }
            // A destination that refused a whole burst (a guest that does not read, a TAP
            // that is down) is not retried at once: the queue fills and the workers count
            // their copies as drops without a slot, instead of this thread spinning on
            // refusals beside them (it took ~40 % of a CPU on a 2-CPU host).
            if sent == 0 && lost > 0 {
                std::thread::park_timeout(REFUSED_BACKOFF);
            }
        }
    }
}

fn truncate(s: &str, n: usize) -> &str {
    match s.char_indices().nth(n) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The VID of an 802.1Q or 802.1ad tagged frame.
#[inline]
fn frame_vlan(f: &[u8]) -> Option<u16> {
    let et = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    if et == 0x8100 || et == 0x88a8 {
        Some(u16::from_be_bytes([*f.get(14)?, *f.get(15)?]) & 0x0fff)
    } else {
        None
    }
}

impl MirrorSession for Session {
    fn takes(&self, rx: bool) -> bool {
        if rx {
            self.rx
        } else {
            self.tx
        }
    }

    fn push_dyn(&self, port: u16, native: u16, frames: &mut dyn Iterator<Item = &Pkt>) {
        self.push(port, native, frames)
    }
}

/// Received frames (after rx_burst and capture, before switching): copied to the port's
/// sessions. Returns false when the port is an output: then its frames are counted as
/// received and dropped (`mirror_output`), and nothing of them is switched.
#[cold]
#[inline(never)]
pub(crate) fn rx(entry: &PortEntry, queue: u16, pkts: &[Pkt], drops: &mut DropTally) -> bool {
    if entry.mirror.is_output() {
        let qc = &entry.counters.rx[usize::from(queue)];
        qc.rx_packets.add(pkts.len() as u64);
        qc.rx_bytes
            .add(pkts.iter().map(|p| p.frame().len() as u64).sum());
        drops.count_n(DropReason::MirrorOutput, pkts.len() as u32);
        drops.flush(&qc.drops);
        return false;
    }
    if pkts.is_empty() {
        return true;
    }
    let sessions = entry.mirror.sessions.load();
    let native = native(entry);
    for s in sessions.iter().filter(|s| s.takes(true)) {
        s.push_dyn(entry.id.0, native, &mut pkts.iter());
    }
    true
}

/// Frames about to be sent to `entry` (`sel` indexes `pkts`), as they leave (tagged as the
/// port carries their VLAN).
#[cold]
#[inline(never)]
pub(crate) fn tx(entry: &PortEntry, pkts: &[Pkt], sel: &[u8]) {
    let sessions = entry.mirror.sessions.load();
    let native = native(entry);
    for s in sessions.iter().filter(|s| s.takes(false)) {
        s.push_dyn(
            entry.id.0,
            native,
            &mut sel.iter().map(|&i| &pkts[usize::from(i)]),
        );
    }
}

/// The VLAN of the port's untagged frames.
fn native(entry: &PortEntry) -> u16 {
    entry.policy.load().native.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use qswitch_api::config::{MirrorDirection, MirrorRemote, RemoteKind};

    fn config(vlans: Option<&str>) -> MirrorConfig {
        MirrorConfig {
            name: "m".into(),
            sources: vec!["a".into()],
            direction: MirrorDirection::Both,
            vlans: vlans.map(|v| v.to_string().try_into().unwrap()),
            output: None,
            remote: Some(MirrorRemote {
                kind: RemoteKind::Erspan,
                dst: "127.0.0.1".parse().unwrap(),
                session: 1,
                src: None,
                ttl: None,
            }),
        }
    }

    fn pkt(vlan: Option<u16>) -> Pkt {
        let mut f = vec![2u8; 64];
        f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        if let Some(v) = vlan {
            f[12..14].copy_from_slice(&0x8100u16.to_be_bytes());
            f[14..16].copy_from_slice(&v.to_be_bytes());
        }
        let mut p = Pkt::new();
        p.fill(&f);
        p
    }

    /// With no thread draining it (a blocked destination), the queue fills and every copy
    /// beyond it is a counted drop; pushing never waits.
    #[test]
    fn full_queue_counts_drops() {
        let s = Session::new(config(None));
        let p = pkt(None);
        for _ in 0..QUEUE_SLOTS + 10 {
            s.push(1, 0, std::iter::once(&p));
        }
        assert_eq!((s.copies(), s.drops()), (QUEUE_SLOTS as u64, 10));
    }

    #[test]
    fn vlan_filter_uses_the_tag_or_the_native_vlan() {
        let s = Session::new(config(Some("10,20")));
        let (t10, t30, untagged) = (pkt(Some(10)), pkt(Some(30)), pkt(None));
        s.push(1, 0, [&t10, &t30, &untagged].into_iter());
        assert_eq!(s.copies(), 1);
        s.push(1, 20, std::iter::once(&untagged));
        assert_eq!((s.copies(), s.drops()), (2, 0));
    }

    /// Copies reach a collector on loopback as GRE/ERSPAN with the frame inside (needs
    /// CAP_NET_RAW: skipped without it).
    #[test]
    fn erspan_copies_reach_a_raw_socket() {
        use socket2::{Domain, Protocol, Socket, Type};
        let Ok(rx) = Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(47))) else {
            eprintln!("skipped: no raw sockets here (needs CAP_NET_RAW)");
            return;
        };
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let s = Arc::new(Session::new(config(None)));
        let out = Output::erspan("127.0.0.1".parse().unwrap(), 1, None, Some(9)).unwrap();
        s.start(out).unwrap();
        let p = pkt(Some(7));
        s.push(3, 0, std::iter::once(&p));
        let mut bytes = vec![0u8; 2048];
        let n = std::io::Read::read(&mut &rx, &mut bytes).unwrap();
        bytes.truncate(n);
        s.stop();
        let ihl = usize::from(bytes[0] & 0x0f) * 4;
        assert_eq!(bytes[8], 9, "ttl");
        let (e, inner) = qswitch_wire::erspan::parse(&bytes[ihl..]).unwrap();
        assert_eq!((e.session, e.vlan, e.index, e.seq), (1, 7, 3, 0));
        assert_eq!(inner, p.frame());
        assert_eq!(s.sent(), 1);
    }
}
