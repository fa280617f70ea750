//! Packet capture: a per-port tap the engine copies frames into, drained by the control plane.
//!
//! ```text
//!  worker: rx_burst ─▶ capture.on()? ─▶ Tap::push (try-lock, copy ≤ snaplen into a slot)
//!          tx_burst ◀─ capture.on()? ◀─ (the frames selected for that port)
//!  control: Capture::drain ─▶ records ─▶ control socket ─▶ CLI ─▶ pcapng
//! ```
//!
//! # Cost
//! Off: one relaxed atomic load per burst per port ([`PortCapture::on`]), nothing per frame.
//! On: per burst one `arc-swap` load and one `try_lock` of the tap's ring; per frame a filter
//! check and a copy of at most `snaplen` bytes into a preallocated slot. Nothing allocates
//! and nothing blocks on the data path: when the ring is full, or the lock is held (by the
//! control plane swapping the ring's slots out, or by another worker), the frames are
//! counted as dropped by the capture and switched as usual.
//!
//! # Bound
//! The ring holds at most [`ring_slots`] records (4096) and [`RING_BYTES`] of frame data
//! (each record takes the bytes it keeps, at most `snaplen`, packed one after the other),
//! allocated when the capture starts, twice: the control plane swaps a filled set for an
//! empty one and copies records out of it without the lock. (So the set the workers fill is
//! always filled from its start: packing needs no wrap-around.) Each set's bytes are one
//! anonymous mapping of their own
//! ([`qswitch_sys::anon::AnonBuf`]), so they go back to the kernel when the capture ends
//! instead of staying in the allocator's free lists (issue 27 F8: a hundred captures of
//! 64 KiB slots left 639 MB behind). How many captures may run at once is the daemon's
//! business (`qswitch::capture`).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use qswitch_wire::MacAddr;

use crate::packet::Pkt;

/// Largest snaplen.
pub const MAX_SNAPLEN: usize = 65_535;
/// Most bytes of frame data one of a capture's two slot sets holds (so a capture maps at
/// most twice this).
pub const RING_BYTES: usize = 4 << 20;

/// How many records a ring holds (its bytes are [`RING_BYTES`] whatever the snaplen: small
/// frames take little of them).
pub fn ring_slots(_snaplen: usize) -> usize {
    4096
}

/// Which way a captured frame went, seen from the switch port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Received from the port (into the switch).
    Rx,
    /// Transmitted to the port (out of the switch).
    Tx,
}

/// What to capture. A frame is kept when every set field matches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// The EtherType (the outer one, or the one after a single 802.1Q tag).
    pub ether_type: Option<u16>,
    /// Source or destination MAC address.
    pub mac: Option<MacAddr>,
    /// 802.1Q VLAN id of a tagged frame.
    pub vlan: Option<u16>,
}

impl Filter {
    /// Whether `frame` passes.
    #[inline]
    pub fn matches(&self, frame: &[u8]) -> bool {
        if let Some(mac) = self.mac {
            if frame.len() < 12 || (frame[..6] != mac.0 && frame[6..12] != mac.0) {
                return false;
            }
        }
        if self.ether_type.is_none() && self.vlan.is_none() {
            return true;
        }
        let be = |o: usize| {
            frame
                .get(o..o + 2)
                .map(|b| u16::from_be_bytes([b[0], b[1]]))
        };
        let outer = be(12);
        let tagged = outer == Some(0x8100);
        if let Some(v) = self.vlan {
            if !tagged || be(14).map(|t| t & 0x0fff) != Some(v) {
                return false;
            }
        }
        if let Some(t) = self.ether_type {
            if outer != Some(t) && !(tagged && be(16) == Some(t)) {
                return false;
            }
        }
        true
    }
}

/// A capture's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Only this rx queue (tx frames are captured whatever the queue).
    pub queue: Option<u16>,
    pub rx: bool,
    pub tx: bool,
    /// Bytes kept of each frame (1..=[`MAX_SNAPLEN`]).
    pub snaplen: usize,
    /// Ring slots; `None`: [`ring_slots`].
    pub slots: Option<usize>,
    pub filter: Filter,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            queue: None,
            rx: true,
            tx: true,
            snaplen: MAX_SNAPLEN,
            slots: None,
            filter: Filter::default(),
        }
    }
}

/// One captured frame, as the control plane gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Switch clock, nanoseconds.
    pub ts: u64,
    pub dir: Direction,
    /// Rx queue for received frames; the transmitting worker for sent ones.
    pub queue: u16,
    /// The frame's length on the port.
    pub orig_len: u32,
    /// Its first `snaplen` bytes.
    pub data: Vec<u8>,
}

/// A record's header; its bytes are `data[off..off + len]` of its [`Slots`].
struct Slot {
    ts: u64,
    dir: Direction,
    queue: u16,
    orig_len: u32,
    off: u32,
    len: u32,
}

/// One set of slots: headers, and the records' bytes packed in one mapping.
struct Slots {
    meta: Vec<Slot>,
    data: qswitch_sys::anon::AnonBuf,
    /// Bytes of `data` in use (the next record goes there).
    used: usize,
}

impl Slots {
    fn new(n: usize, bytes: usize) -> std::io::Result<Slots> {
        Ok(Slots {
            meta: (0..n)
                .map(|_| Slot {
                    ts: 0,
                    dir: Direction::Rx,
                    queue: 0,
                    orig_len: 0,
                    off: 0,
                    len: 0,
                })
                .collect(),
            data: qswitch_sys::anon::AnonBuf::new(bytes)?,
            used: 0,
        })
    }

    fn len(&self) -> usize {
        self.meta.len()
    }

    fn bytes(&self, i: usize) -> &[u8] {
        let s = &self.meta[i];
        &self.data[s.off as usize..(s.off + s.len) as usize]
    }
}

struct Ring {
    slots: Slots,
    head: usize,
    len: usize,
}

/// A capture's ring and counters, shared by the workers (producers) and the control plane.
///
/// The consumer never holds the ring's lock for longer than a swap: [`Tap::drain`] exchanges
/// the ring's slots for an empty set of the same size (`taken`, the consumer's own) and
/// copies records out of those afterwards. A worker that finds the lock held drops its
/// frames (it never waits), so a consumer preempted while copying under the lock made a
/// low-rate capture lose frames on a busy machine.
pub struct Tap {
    spec: Spec,
    ring: Mutex<Ring>,
    /// Slots taken from the ring by the last swap, with the records not yet drained.
    taken: Mutex<Ring>,
    captured: AtomicU64,
    dropped: AtomicU64,
    /// Bytes of both slot sets.
    bytes: usize,
}

impl Tap {
    /// A tap with its ring preallocated (fails only when the memory cannot be mapped).
    pub fn new(mut spec: Spec) -> std::io::Result<Tap> {
        spec.snaplen = spec.snaplen.clamp(1, MAX_SNAPLEN);
        // Explicit slots (tests): room for that many full records; else RING_BYTES.
        let (n, bytes) = match spec.slots {
            Some(n) => (n.max(1), n.max(1) * spec.snaplen),
            None => (ring_slots(spec.snaplen), RING_BYTES.max(spec.snaplen)),
        };
        let ring = |slots| Ring {
            slots,
            head: 0,
            len: 0,
        };
        Ok(Tap {
            ring: Mutex::new(ring(Slots::new(n, bytes)?)),
            taken: Mutex::new(ring(Slots::new(n, bytes)?)),
            bytes: 2 * bytes,
            spec,
            captured: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        })
    }

    /// Bytes of frame data the tap holds mapped (both slot sets).
    pub fn ring_bytes(&self) -> usize {
        self.bytes
    }

    pub fn spec(&self) -> &Spec {
        &self.spec
    }

    /// Frames put into the ring so far.
    pub fn captured(&self) -> u64 {
        self.captured.load(Ordering::Relaxed)
    }

    /// Frames that matched but found the ring full or busy.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Copies the frames that pass the filter into the ring; never blocks, never allocates.
    pub fn push<'a>(
        &self,
        dir: Direction,
        queue: u16,
        frames: impl Iterator<Item = &'a [u8]>,
        now: u64,
    ) {
        let filter = &self.spec.filter;
        let Some(mut ring) = self.ring.try_lock() else {
            let n = frames.filter(|f| filter.matches(f)).count();
            self.dropped.fetch_add(n as u64, Ordering::Relaxed);
            return;
        };
        let (mut kept, mut lost) = (0u64, 0u64);
        let cap = ring.slots.len();
        for f in frames {
            if !filter.matches(f) {
                continue;
            }
            let len = f.len().min(self.spec.snaplen);
            if ring.len == cap || ring.slots.used + len > ring.slots.data.len() {
                lost += 1;
                continue;
            }
            // The live set is filled from its start (head 0, see `drain`).
            let i = ring.len;
            let slots = &mut ring.slots;
            let at = slots.used;
            slots.data[at..at + len].copy_from_slice(&f[..len]);
            slots.used += len;
            let s = &mut slots.meta[i];
            s.ts = now;
            s.dir = dir;
            s.queue = queue;
            s.orig_len = f.len() as u32;
            s.off = at as u32;
            s.len = len as u32;
            ring.len += 1;
            kept += 1;
        }
        drop(ring);
        if kept > 0 {
            self.captured.fetch_add(kept, Ordering::Relaxed);
        }
        if lost > 0 {
            self.dropped.fetch_add(lost, Ordering::Relaxed);
        }
    }

    /// Moves up to `max` records out of the ring into `out`, oldest first (control plane).
    pub fn drain(&self, out: &mut Vec<Record>, max: usize) -> usize {
        self.drain_within(out, max, usize::MAX)
    }

    /// [`Tap::drain`], stopping once the records moved hold `max_bytes` of frame data (one
    /// record at least).
    pub fn drain_within(&self, out: &mut Vec<Record>, max: usize, max_bytes: usize) -> usize {
        let mut ring = self.taken.lock();
        let (mut moved, mut bytes) = (0, 0);
        // What the last swap took first (older), then one more swap if there is room.
        for swap in [false, true] {
            if swap {
                if ring.len > 0 || moved == max || bytes >= max_bytes {
                    break;
                }
                // Swap the ring's slots for our empty ones: the workers' lock is held for
                // this only, never while records are copied out. The set the workers get
                // is empty, so they fill it from its start.
                let mut live = self.ring.lock();
                std::mem::swap(&mut live.slots, &mut ring.slots);
                (ring.head, ring.len) = (live.head, live.len);
                (live.head, live.len, live.slots.used) = (0, 0, 0);
            }
            let cap = ring.slots.len();
            while ring.len > 0 && moved < max && bytes < max_bytes {
                let i = ring.head;
                let s = &ring.slots.meta[i];
                out.push(Record {
                    ts: s.ts,
                    dir: s.dir,
                    queue: s.queue,
                    orig_len: s.orig_len,
                    data: ring.slots.bytes(i).to_vec(),
                });
                bytes += s.len as usize;
                ring.head = (ring.head + 1) % cap.max(1);
                ring.len -= 1;
                moved += 1;
            }
        }
        moved
    }
}

impl fmt::Debug for Tap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tap")
            .field("spec", &self.spec)
            .field("captured", &self.captured())
            .field("dropped", &self.dropped())
            .finish()
    }
}

/// A port's capture hook: a flag the engine reads once per burst, and the tap behind it.
#[derive(Default)]
pub struct PortCapture {
    on: AtomicBool,
    tap: ArcSwapOption<Tap>,
}

impl fmt::Debug for PortCapture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PortCapture")
            .field("on", &self.on())
            .finish()
    }
}

impl PortCapture {
    /// Whether a capture is attached: the engine's one check per burst.
    #[inline(always)]
    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Received frames (after rx_burst, before switching).
    #[cold]
    #[inline(never)]
    pub fn rx(&self, queue: u16, pkts: &[Pkt], now: u64) {
        if pkts.is_empty() {
            return;
        }
        if let Some(t) = &*self.tap.load() {
            if t.spec.rx && t.spec.queue.is_none_or(|q| q == queue) {
                t.push(Direction::Rx, queue, pkts.iter().map(Pkt::frame), now);
            }
        }
    }

    /// Frames about to be sent (`sel` indexes `pkts`), by worker `worker`.
    #[cold]
    #[inline(never)]
    pub fn tx(&self, worker: usize, pkts: &[Pkt], sel: &[u8], now: u64) {
        if let Some(t) = &*self.tap.load() {
            if t.spec.tx {
                let frames = sel.iter().map(|&i| pkts[usize::from(i)].frame());
                t.push(Direction::Tx, worker as u16, frames, now);
            }
        }
    }

    /// Attaches `tap`; false when another capture is attached.
    pub fn attach(&self, tap: Arc<Tap>) -> bool {
        let prev = self.tap.compare_and_swap(&None::<Arc<Tap>>, Some(tap));
        if prev.is_some() {
            return false;
        }
        self.on.store(true, Ordering::Release);
        true
    }

    /// Detaches `tap` if it is the one attached.
    pub fn detach(&self, tap: &Arc<Tap>) {
        let cur = self.tap.load_full();
        if cur.as_ref().is_some_and(|c| Arc::ptr_eq(c, tap)) {
            self.on.store(false, Ordering::Release);
            self.tap.compare_and_swap(&cur, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dst: u8, src: u8, et: u16, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].fill(dst);
        f[6..12].fill(src);
        f[12..14].copy_from_slice(&et.to_be_bytes());
        f
    }

    #[test]
    fn ring_is_bounded_and_counts_drops() {
        let tap = Tap::new(Spec {
            slots: Some(4),
            snaplen: 20,
            ..Spec::default()
        })
        .unwrap();
        assert_eq!(tap.ring_bytes(), 2 * 4 * 20);
        let frames: Vec<Vec<u8>> = (0..6).map(|i| frame(2, 4, 0x0800, 60 + i)).collect();
        tap.push(Direction::Rx, 0, frames.iter().map(Vec::as_slice), 7);
        assert_eq!((tap.captured(), tap.dropped()), (4, 2));
        let mut out = Vec::new();
        assert_eq!(tap.drain(&mut out, 3), 3);
        assert_eq!(out[0].data.len(), 20);
        assert_eq!(out[0].orig_len, 60);
        assert_eq!(out[2].orig_len, 62);
        assert_eq!(out[0].ts, 7);
        // One record left in the half the drain took; the ring's four slots are free.
        tap.push(Direction::Tx, 1, frames.iter().map(Vec::as_slice), 8);
        assert_eq!((tap.captured(), tap.dropped()), (8, 4));
        out.clear();
        // The older record first, then the ring's four.
        assert_eq!(tap.drain(&mut out, 100), 5);
        assert_eq!(out[0].orig_len, 63);
        assert_eq!(out[1].dir, Direction::Tx);
    }

    /// The ring is bounded in records and in bytes: small frames fill its 4096 records
    /// whatever the snaplen, large ones its RING_BYTES; a drain stops at its byte budget.
    #[test]
    fn records_are_packed_and_bounded_in_bytes() {
        let tap = Tap::new(Spec::default()).unwrap();
        assert_eq!(tap.ring_bytes(), 2 * RING_BYTES);
        let small = frame(2, 4, 0x0800, 60);
        tap.push(Direction::Rx, 0, (0..5000).map(|_| small.as_slice()), 1);
        assert_eq!((tap.captured(), tap.dropped()), (4096, 5000 - 4096));
        let mut out = Vec::new();
        assert_eq!(tap.drain_within(&mut out, usize::MAX, 600), 10);
        out.clear();
        assert_eq!(tap.drain(&mut out, usize::MAX), 4086);
        assert!(out.iter().all(|r| r.data == small));
        let big = frame(2, 4, 0x0800, MAX_SNAPLEN);
        tap.push(Direction::Rx, 0, (0..100).map(|_| big.as_slice()), 2);
        assert_eq!(tap.captured(), 4096 + (RING_BYTES / MAX_SNAPLEN) as u64);
        out.clear();
        tap.drain(&mut out, usize::MAX);
        assert_eq!(out.len(), RING_BYTES / MAX_SNAPLEN);
        assert!(out.iter().all(|r| r.data == big));
    }

    #[test]
    fn busy_ring_drops_instead_of_waiting() {
        let tap = Tap::new(Spec::default()).unwrap();
        assert!(tap.ring_bytes() <= 2 * RING_BYTES);
        let held = tap.ring.lock();
        let f = frame(2, 4, 0x0800, 60);
        tap.push(Direction::Rx, 0, std::iter::once(f.as_slice()), 0);
        drop(held);
        assert_eq!((tap.captured(), tap.dropped()), (0, 1));
    }

    #[test]
    fn filter() {
        let arp = frame(0xff, 4, 0x0806, 60);
        let ip = frame(2, 4, 0x0800, 60);
        let mut tagged = frame(2, 6, 0x8100, 64);
        tagged[14..16].copy_from_slice(&5u16.to_be_bytes());
        tagged[16..18].copy_from_slice(&0x0806u16.to_be_bytes());
        let f = Filter {
            ether_type: Some(0x0806),
            ..Filter::default()
        };
        assert!(f.matches(&arp) && !f.matches(&ip) && f.matches(&tagged));
        let f = Filter {
            mac: Some(MacAddr([4; 6])),
            ..Filter::default()
        };
        assert!(f.matches(&arp) && f.matches(&ip) && !f.matches(&tagged));
        let f = Filter {
            vlan: Some(5),
            ..Filter::default()
        };
        assert!(!f.matches(&arp) && f.matches(&tagged));
        assert!(Filter::default().matches(&[]));
    }

    #[test]
    fn one_capture_per_port() {
        let pc = PortCapture::default();
        assert!(!pc.on());
        let a = Arc::new(Tap::new(Spec::default()).unwrap());
        let b = Arc::new(Tap::new(Spec::default()).unwrap());
        assert!(pc.attach(a.clone()));
        assert!(pc.on());
        assert!(!pc.attach(b.clone()));
        pc.detach(&b);
        assert!(pc.on());
        pc.detach(&a);
        assert!(!pc.on());
        assert!(pc.attach(b));
    }
}
