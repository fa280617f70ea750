//! The vhost-user data path: moving frames between guest rings and packet buffers.
//!
//! - [`rx_burst`]: the guest's transmitq → switch. Read-only chains: virtio-net header,
//!   then the frame; copied into the worker's buffer so that the frame lands after the
//!   buffer's headroom whatever the header length (10 or 12 bytes).
//! - [`tx_burst`]: switch → the guest's receiveq. Device-writable chains; with MRG_RXBUF a
//!   frame may span several chains (`num_buffers`). Offloads the guest did not negotiate are
//!   resolved first: partial checksums are completed, TSO frames are segmented.
//! - [`arm`]: before a worker sleeps, drain the kick eventfd (`preadv2(RWF_NOWAIT)`: a
//!   frontend cannot make it block) and enable guest notifications;
//!   if the guest queued something meanwhile, say so (the worker polls again instead).

use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, Ordering};

use qswitch_wire::virtio_net_hdr::{self, VirtioNetHdr, FLAG_NEEDS_CSUM};
use virtio_bindings::virtio_net::*;
use virtio_bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VRING_AVAIL_F_NO_INTERRUPT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddress, GuestAddressSpace};

use super::chain::{self, Seg};
use qswitch_sys::guest::Mapped;

use super::mem::GuestView;
use super::{VhostState, Vring};
use crate::packet::{Pkt, BUF_SIZE, BURST, HEADROOM};
use crate::port::TxDone;
use crate::rss::Reta;
use crate::stats::{DropReason, DropTally};

/// Most receive chains one frame may use with MRG_RXBUF.
const MAX_RX_CHAINS: usize = 256;

/// Per-ring scratch space, kept with the ring so the data path never allocates.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    segs: Vec<Seg>,
    /// (head, first seg, end seg, capacity) of each receive chain of the frame being written.
    chains: Vec<(u16, usize, usize, u32)>,
    /// The chain being walked.
    tmp: Vec<Seg>,
    /// Buffer for the segments of a software-segmented TSO frame.
    gso: Vec<u8>,
    /// Segments of a frame were written, although the frame as a whole was dropped.
    wrote_partial: bool,
}

fn avail_no_interrupt(v: &Vring, mem: &GuestView<'_>) -> bool {
    let mut flags = [0u8; 2];
    mem.read(v.queue.avail_ring(), &mut flags)
        && u32::from(u16::from_le_bytes(flags)) & VRING_AVAIL_F_NO_INTERRUPT != 0
}

/// Stops ring `vi` because its guest broke it (logged once per ring); the frontend has to
/// set it up again.
fn stop_ring(dev: &VhostState, vi: usize, v: &mut Vring, why: &str) {
    let first = !v.broken;
    v.broken = true;
    dev.guest_error(why, vi, first);
    dev.note_ring(vi, v);
}

/// The ring slot of free-running index `i` in a ring of `size` entries. Split-ring sizes
/// are powers of two (virtio 1.x 2.7; `virtio-queue` refuses others), so this is a mask,
/// not a division: a `div` per ring access was several per frame on the worker's critical
/// path. For any nonzero `size` the result is below it (a bitwise and with `size - 1`); the
/// callers reject size 0, and every ring access is bounds-checked by [`GuestView`] anyway.
#[inline(always)]
fn slot(i: u16, size: u16) -> u16 {
    debug_assert!(size.is_power_of_two());
    i & size.wrapping_sub(1)
}

/// A split ring's three parts for one burst (the ring lock is held, so its addresses do not
/// move). Each part that lies inside one resolved region of guest memory is resolved to a
/// mapping up front, so a descriptor, avail entry or used element costs one bounds check
/// instead of a region search, a call and a dirty-log branch per access; a part that does
/// not (it straddles regions) goes through [`GuestView`]'s general path. Writes are marked
/// in the dirty log either way, and nothing read is trusted.
pub(crate) struct Ring<'m, 'a> {
    pub(crate) mem: &'m GuestView<'a>,
    size: u16,
    desc: u64,
    avail: u64,
    used: u64,
    desc_map: Option<Mapped<'a>>,
    avail_map: Option<Mapped<'a>>,
    used_map: Option<Mapped<'a>>,
}

impl<'m, 'a> Ring<'m, 'a> {
    pub(crate) fn new(v: &Vring, mem: &'m GuestView<'a>) -> Ring<'m, 'a> {
        let size = v.queue.size();
        let n = usize::from(size);
        let (desc, avail, used) = (
            v.queue.desc_table(),
            v.queue.avail_ring(),
            v.queue.used_ring(),
        );
        Ring {
            mem,
            size,
            desc,
            avail,
            used,
            // The event words after the rings (EVENT_IDX) are not part of the spans: they
            // are read once per burst at most, through the general path.
            desc_map: mem.span(desc, 16 * n),
            avail_map: mem.span(avail, 4 + 2 * n),
            used_map: mem.span(used, 4 + 8 * n),
        }
    }

    /// The guest's avail index.
    #[inline(always)]
    fn avail_idx(&self) -> Option<u16> {
        match self.avail_map {
            Some(m) => m.load_u16(2, Ordering::Acquire).map(u16::from_le),
            None => self.mem.load_u16(self.avail + 2, Ordering::Acquire),
        }
    }

    /// The head in the avail ring's slot for free-running index `i`.
    #[inline(always)]
    fn avail_head(&self, i: u16) -> Option<u16> {
        let off = 4 + 2 * u64::from(slot(i, self.size));
        match self.avail_map {
            Some(m) => m.load_u16(off, Ordering::Relaxed).map(u16::from_le),
            None => self.mem.load_u16(self.avail + off, Ordering::Relaxed),
        }
    }

    /// Descriptor `index` of the table as (addr, len | flags << 32 | next << 48); the caller
    /// has checked `index < size`.
    #[inline(always)]
    fn desc(&self, index: u16) -> Option<[u64; 2]> {
        let off = 16 * u64::from(index);
        match self.desc_map.and_then(|m| m.read_u64x2(off)) {
            Some([a, b]) => Some([u64::from_le(a), u64::from_le(b)]),
            None => self.mem.read_desc(self.desc.wrapping_add(off)),
        }
    }

    /// Cache hint for descriptor `index`.
    #[inline(always)]
    fn prefetch_desc(&self, index: u16) {
        match self.desc_map {
            Some(m) => m.prefetch(16 * u64::from(index)),
            None => self
                .mem
                .prefetch(self.desc.wrapping_add(16 * u64::from(index))),
        }
    }

    /// Writes used elements (8 bytes each) from the used ring's slot `pos` on; the caller
    /// keeps them inside the ring.
    #[inline(always)]
    fn put_used(&self, pos: u16, elems: &[u8]) -> bool {
        let off = 4 + 8 * u64::from(pos);
        match self.used_map {
            Some(m) if m.write(off, elems) => {
                self.mem.mark(self.used + off, elems.len());
                true
            }
            _ => self.mem.write(self.used + off, elems),
        }
    }

    /// Cache hint for writing the used ring's slot `pos`.
    #[inline(always)]
    fn prefetch_used_slot(&self, pos: u16) {
        let off = 4 + 8 * u64::from(pos);
        match self.used_map {
            Some(m) => m.prefetch_write(off),
            None => self.mem.prefetch_write(self.used + off),
        }
    }
}

/// Writes a used element after the ones already staged; the guest does not see it until
/// [`publish_used`]. Returns false if `head` is not a valid index or the ring is not
/// writable.
#[inline(always)]
fn stage_used(v: &mut Vring, r: &Ring<'_, '_>, head: u16, len: u32) -> bool {
    let size = v.queue.size();
    if head >= size {
        return false;
    }
    let pos = slot(v.queue.next_used().wrapping_add(v.used_pending), size);
    let mut elem = [0u8; 8];
    elem[..4].copy_from_slice(&u32::from(head).to_le_bytes());
    elem[4..].copy_from_slice(&len.to_le_bytes());
    if !r.put_used(pos, &elem) {
        return false;
    }
    v.used_pending = v.used_pending.wrapping_add(1);
    true
}

/// Stages a used element of length 0 for each of `heads` (transmit chains, read by the
/// device) with at most two writes to the used ring. Returns false, staging nothing, if a
/// head is not a valid index or the ring is not writable.
fn stage_used_all(v: &mut Vring, r: &Ring<'_, '_>, heads: &[u16]) -> bool {
    let size = v.queue.size();
    if heads.iter().any(|&h| h >= size) {
        return false;
    }
    let mut elems = [0u8; 8 * BURST];
    for (e, &h) in elems.chunks_exact_mut(8).zip(heads.iter().take(BURST)) {
        e[..4].copy_from_slice(&u32::from(h).to_le_bytes());
    }
    let n = heads.len().min(BURST);
    let first = slot(v.queue.next_used().wrapping_add(v.used_pending), size);
    let before_wrap = n.min(usize::from(size - first));
    let ok = r.put_used(first, &elems[..8 * before_wrap])
        && (before_wrap == n || r.put_used(0, &elems[8 * before_wrap..8 * n]));
    if ok {
        v.used_pending = v.used_pending.wrapping_add(n as u16);
    }
    ok
}

/// Makes every staged used element visible with one store of the used index, so a guest
/// never sees part of a frame that spans several buffers (MRG_RXBUF).
fn publish_used(v: &mut Vring, mem: &GuestView<'_>) -> bool {
    if v.used_pending == 0 {
        return true;
    }
    let idx = v.queue.next_used().wrapping_add(v.used_pending);
    fence(Ordering::Release);
    if !mem.store_u16(v.queue.used_ring() + 2, idx, Ordering::Release) {
        return false;
    }
    v.queue.set_next_used(idx);
    v.used_pending = 0;
    true
}

/// Signals the guest if it asked to hear about the used entries published since the last
/// check: with EVENT_IDX when the used index passed `used_event` (the kernel's
/// `vring_need_event`), without it unless VRING_AVAIL_F_NO_INTERRUPT is set.
fn notify(dev: &VhostState, vi: usize, v: &mut Vring, mem: &GuestView<'_>) {
    let new = v.queue.next_used();
    let old = v.used_signalled;
    if new == old {
        return;
    }
    v.used_signalled = new;
    // The used index store must be visible before the guest's event index is read.
    fence(Ordering::SeqCst);
    let wants = if dev.has(VIRTIO_RING_F_EVENT_IDX) {
        let size = u64::from(v.queue.size());
        match mem.load_u16(v.queue.avail_ring() + 4 + 2 * size, Ordering::Acquire) {
            Some(event) => new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old),
            None => true,
        }
    } else {
        !avail_no_interrupt(v, mem)
    };
    if wants && !v.signal(&dev.calls) {
        dev.guest_error(
            "call eventfd blocked (counter saturated, O_NONBLOCK cleared); calls stopped",
            vi,
            true,
        );
    }
}

/// Publishes staged used elements and signals the guest if it wants that. A used ring that
/// cannot be written stops the ring.
fn complete(dev: &VhostState, vi: usize, v: &mut Vring, mem: &GuestView<'_>) {
    if !publish_used(v, mem) {
        stop_ring(dev, vi, v, "used ring not writable; ring stopped");
        return;
    }
    notify(dev, vi, v, mem);
}

/// Pops up to `heads.len()` chain heads. The guest's avail index is read only when the
/// heads already seen run out; one that moves more than the queue size ahead breaks the ring.
fn pop_heads(
    dev: &VhostState,
    vi: usize,
    v: &mut Vring,
    r: &Ring<'_, '_>,
    heads: &mut [u16],
) -> usize {
    let size = v.queue.size();
    let mut next = v.queue.next_avail();
    let mut n = 0;
    while n < heads.len() {
        if next == v.avail_cached {
            let Some(idx) = r.avail_idx() else {
                break;
            };
            if idx.wrapping_sub(next) > size {
                stop_ring(
                    dev,
                    vi,
                    v,
                    "avail index moved beyond the queue size; ring stopped",
                );
                break;
            }
            v.avail_cached = idx;
            if idx == next {
                break;
            }
        }
        let Some(head) = r.avail_head(next) else {
            break;
        };
        heads[n] = head;
        n += 1;
        next = next.wrapping_add(1);
    }
    v.queue.set_next_avail(next);
    n
}

/// The guest's transmit queue `queue` → up to `pkts.len()` frames.
pub(crate) fn rx_burst(
    dev: &VhostState,
    queue: u16,
    pkts: &mut [Pkt],
    drops: &mut DropTally,
) -> usize {
    let vi = usize::from(queue) * 2 + 1;
    let Some(vr) = dev.vrings.get(vi) else {
        return 0;
    };
    let mut guard = vr.lock();
    let v = &mut *guard;
    if !v.usable() {
        return 0;
    }
    let guard = dev.mem.memory();
    let log = dev.dirty_log();
    let mem = GuestView::new(&guard).with_log(log.as_deref(), dev);
    if v.notify {
        let _ = v.queue.disable_notification(&*guard);
        v.notify = false;
        dev.log_used_meta(v);
    }
    let ring = Ring::new(v, &mem);
    let mut heads = [0u16; BURST];
    let nh = pop_heads(dev, vi, v, &ring, &mut heads[..pkts.len().min(BURST)]);
    if nh == 0 {
        return 0;
    }
    let hdr_len = dev.hdr_len();
    let host_gso = HostGso::of(dev);
    let table = GuestAddress(v.queue.desc_table());
    let qsize = v.queue.size();
    // The guest wrote these descriptors and frames on another core. Touch the whole
    // burst's descriptors, then its frames, before copying anything, so the cache misses
    // overlap instead of queueing up one frame at a time.
    for &head in &heads[..nh] {
        ring.prefetch_desc(head);
    }
    prefetch_used(v, &ring, nh);
    let segs = &mut v.scratch.segs;
    segs.clear();
    let mut ends = [0u32; BURST];
    let mut totals = [0u32; BURST];
    let mut bad: u32 = 0;
    for (k, &head) in heads[..nh].iter().enumerate() {
        // The common chain, checked without the general walk: one direct, device-readable
        // descriptor (no NEXT, WRITE or INDIRECT flag) inside guest memory. Anything else,
        // and anything this check refuses, is the walker's to follow or judge.
        let single = if head < qsize { ring.desc(head) } else { None };
        match single {
            Some([addr, w]) if (w >> 32) as u16 == 0 && mem.check(addr, w as u32 as usize) => {
                segs.push(Seg {
                    addr,
                    len: w as u32,
                    write: false,
                });
                totals[k] = w as u32;
            }
            _ => match chain::walk_append(&mem, table, qsize, head, segs) {
                Ok(total) => totals[k] = total,
                Err(_) => bad |= 1 << k,
            },
        }
        ends[k] = segs.len() as u32;
    }
    let mut start = 0usize;
    for (k, &end) in ends[..nh].iter().enumerate() {
        if bad & (1 << k) == 0 {
            if let Some(s) = segs.get(start) {
                mem.prefetch(s.addr);
                if s.len > 64 {
                    mem.prefetch(s.addr + 64);
                }
            }
        }
        start = end as usize;
    }
    let mut n = 0;
    let mut start = 0usize;
    for (k, &end) in ends[..nh].iter().enumerate() {
        let chain = &segs[start..end as usize];
        start = end as usize;
        // The rest of the next frame (beyond the two lines above) on its way while this one
        // is copied: a big frame's lines, owned by the guest's core, arrive together.
        if k + 1 < nh && totals[k + 1] > 128 && bad & (2 << k) == 0 {
            if let Some(s) = segs.get(start) {
                mem.prefetch_range(s.addr, 128, (s.len as usize).min(BUF_SIZE));
            }
        }
        let r = if bad & (1 << k) != 0 {
            Err(DropReason::BadDescriptor)
        } else {
            copy_chain(&mem, chain, totals[k], hdr_len, host_gso, &mut pkts[n])
        };
        match r {
            Ok(()) => n += 1,
            Err(reason) => {
                drops.count(reason);
                if reason == DropReason::BadDescriptor {
                    dev.guest_error(
                        "bad transmit descriptor chain",
                        vi,
                        dev.guest_errors.load(Ordering::Relaxed) == 0,
                    );
                }
            }
        }
    }
    if !stage_used_all(v, &ring, &heads[..nh]) {
        stop_ring(
            dev,
            vi,
            v,
            "bad head index or used ring not writable; ring stopped",
        );
    }
    complete(dev, vi, v, &mem);
    n
}

/// The GSO requests a guest may make: the HOST_TSO4/TSO6/ECN features it acked (UFO is
/// never offered).
#[derive(Clone, Copy, Debug)]
struct HostGso {
    tso4: bool,
    tso6: bool,
    ecn: bool,
}

impl HostGso {
    fn of(dev: &VhostState) -> HostGso {
        HostGso {
            tso4: dev.has(VIRTIO_NET_F_HOST_TSO4),
            tso6: dev.has(VIRTIO_NET_F_HOST_TSO6),
            ecn: dev.has(VIRTIO_NET_F_HOST_ECN),
        }
    }

    /// Whether a (validated) header asks only for what was negotiated.
    fn allows(self, hdr: &VirtioNetHdr) -> bool {
        let ecn_ok = hdr.gso_type & virtio_net_hdr::GSO_ECN == 0 || self.ecn;
        ecn_ok
            && match hdr.gso_type & !virtio_net_hdr::GSO_ECN {
                virtio_net_hdr::GSO_NONE => true,
                virtio_net_hdr::GSO_TCPV4 => self.tso4,
                virtio_net_hdr::GSO_TCPV6 => self.tso6,
                _ => false,
            }
    }
}

/// Copies one transmit chain (`segs`, `total` bytes: virtio-net header, then the frame)
/// into `pkt`.
fn copy_chain(
    mem: &GuestView<'_>,
    segs: &[Seg],
    total: u32,
    hdr_len: usize,
    host_gso: HostGso,
    pkt: &mut Pkt,
) -> Result<(), DropReason> {
    let total = total as usize;
    if segs.iter().any(|s| s.write) {
        return Err(DropReason::BadDescriptor);
    }
    if total < hdr_len {
        return Err(DropReason::Runt);
    }
    let start = HEADROOM - hdr_len;
    if start + total > BUF_SIZE - 1 {
        return Err(DropReason::Oversize);
    }
    let buf = pkt.raw_buf_mut();
    let mut off = start;
    for s in segs {
        let len = s.len as usize;
        if !mem.read(s.addr, &mut buf[off..off + len]) {
            return Err(DropReason::BadDescriptor);
        }
        off += len;
    }
    let hdr = VirtioNetHdr::parse(&buf[start..HEADROOM]).map_err(|_| DropReason::BadVnetHdr)?;
    let frame_len = total - hdr_len;
    hdr.validate(frame_len)
        .map_err(|_| DropReason::BadVnetHdr)?;
    if !host_gso.allows(&hdr) {
        return Err(DropReason::OffloadNotNegotiated);
    }
    pkt.set_len(frame_len);
    pkt.hdr = VirtioNetHdr {
        num_buffers: 0,
        ..hdr
    };
    Ok(())
}

/// Frames `pkts[sel]` → the guest's receive queues (one pair per flow).
pub(crate) fn tx_burst(
    dev: &VhostState,
    pkts: &mut [Pkt],
    sel: &[u8],
    drops: &mut DropTally,
) -> TxDone {
    let mut done = TxDone::default();
    let reta = dev.reta.load();
    if reta.is_empty() {
        drops.count_n(DropReason::NoQueue, sel.len() as u32);
        return done;
    }
    // Group by destination pair, keeping each pair's frames in order.
    let mut pair_of = [0u8; BURST];
    let mut pairs_used: u32 = 0;
    for (k, &i) in sel.iter().enumerate() {
        let p = pick_pair(dev, &reta, pkts[usize::from(i)].frame());
        pair_of[k] = p;
        pairs_used |= 1 << p;
    }
    while pairs_used != 0 {
        let p = pairs_used.trailing_zeros() as u8;
        pairs_used &= pairs_used - 1;
        let vi = usize::from(p) * 2;
        let mut guard = dev.vrings[vi].lock();
        let v = &mut *guard;
        if !v.usable() {
            let n = pair_of[..sel.len()].iter().filter(|&&q| q == p).count();
            drops.count_n(DropReason::NoQueue, n as u32);
            continue;
        }
        let guard = dev.mem.memory();
        let log = dev.dirty_log();
        let mem = GuestView::new(&guard).with_log(log.as_deref(), dev);
        if v.notify {
            // The switch never waits for a kick on a receive ring (a frame with no buffer is
            // a counted drop; the kick fd is not even polled), so the guest need not make
            // them: without VRING_USED_F_NO_NOTIFY, DPDK's virtio driver made one eventfd
            // write per receive burst (a VM exit in a KVM guest) for nothing. With
            // EVENT_IDX this is a no-op and `avail_event` stays where it was: the guest
            // kicks once per wrap of its index at most.
            let _ = v.queue.disable_notification(&*guard);
            v.notify = false;
            dev.log_used_meta(v);
        }
        let frames = pair_of[..sel.len()].iter().filter(|&&q| q == p).count();
        let hdr_len = dev.hdr_len();
        let ring = Ring::new(v, &mem);
        prefetch_rx_chains(v, &ring, frames);
        // Moving the scratch vectors out for the burst and back costs no allocation.
        let mut sc = std::mem::take(&mut v.scratch);
        let mut wrote = false;
        for (k, &i) in sel.iter().enumerate() {
            if pair_of[k] != p {
                continue;
            }
            // The whole buffer of the next frame on its way while this one is written, when
            // it is bigger than the two lines prefetched above (and goes to this pair too).
            if let Some(&n) = sel.get(k + 1).filter(|_| pair_of[k + 1] == p) {
                let len = pkts[usize::from(n)].len() + hdr_len;
                if len > 128 {
                    prefetch_rx_buffer(v, &ring, 1, len.min(BUF_SIZE));
                }
            }
            let pkt = &mut pkts[usize::from(i)];
            match deliver(dev, vi, v, &ring, &mut sc, pkt) {
                Ok(()) => {
                    done.packets += 1;
                    done.bytes += pkt.len() as u64;
                    wrote = true;
                }
                Err(reason) => drops.count(reason),
            }
        }
        wrote |= std::mem::take(&mut sc.wrote_partial);
        v.scratch = sc;
        if wrote {
            complete(dev, vi, v, &mem);
        }
    }
    done
}

/// Gets the next `want` receive buffers the guest offers, and the used-ring slots they will
/// take, on their way into this core's cache for writing, so that writing a burst's frames
/// does not wait on the guest's core one cache line at a time. Only hints: it reads the
/// avail ring and the chains' first descriptors, consumes nothing and trusts nothing it
/// read (the chains are walked and checked again when they are used).
fn prefetch_rx_chains(v: &Vring, r: &Ring<'_, '_>, want: usize) {
    let size = v.queue.size();
    if size == 0 {
        return;
    }
    let next = v.queue.next_avail();
    let Some(idx) = r.avail_idx() else {
        return;
    };
    let ready = usize::from(idx.wrapping_sub(next)).min(usize::from(size));
    for i in 0..want.min(ready) as u16 {
        let Some(head) = r.avail_head(next.wrapping_add(i)) else {
            return;
        };
        if head >= size {
            continue;
        }
        let Some([addr, _]) = r.desc(head) else {
            continue;
        };
        r.mem.prefetch_write(addr);
        r.mem.prefetch_write(addr.wrapping_add(64));
    }
    prefetch_used(v, r, want);
}

/// Gets the lines `[128, len)` of the first buffer of the receive chain `ahead` chains after
/// the next one on their way for writing (the first two lines are
/// [`prefetch_rx_chains`]'s). A frame's lines are written back to back, and the guest's core
/// may own them: asking for them one frame early lets their transfers overlap the copy of
/// the frame before. Only a hint, like [`prefetch_rx_chains`].
fn prefetch_rx_buffer(v: &Vring, r: &Ring<'_, '_>, ahead: u16, len: usize) {
    let size = v.queue.size();
    if size == 0 {
        return;
    }
    let Some(head) = r.avail_head(v.queue.next_avail().wrapping_add(ahead)) else {
        return;
    };
    if head >= size {
        return;
    }
    if let Some([addr, _]) = r.desc(head) {
        r.mem.prefetch_write_range(addr, 128, len);
    }
}

/// Gets the used-ring slots of the next `n` used elements ready for writing.
fn prefetch_used(v: &Vring, r: &Ring<'_, '_>, n: usize) {
    let size = v.queue.size();
    if size == 0 {
        return;
    }
    let first = v.queue.next_used().wrapping_add(v.used_pending);
    // One hint per cache line: 8 used elements of 8 bytes each.
    for i in (0..n.min(usize::from(size)) as u16).step_by(8) {
        r.prefetch_used_slot(slot(first.wrapping_add(i), size));
    }
    r.prefetch_used_slot(slot(first.wrapping_add(n as u16).wrapping_sub(1), size));
}

/// Picks the receive pair for a frame (vRSS): the Toeplitz hash of its flow indexes the
/// port's indirection table, which spans only the pairs the guest enabled. A flow always
/// lands on the same pair; non-IP frames go to the first enabled pair.
fn pick_pair(dev: &VhostState, reta: &Reta, frame: &[u8]) -> u8 {
    if reta.queues().len() < 2 {
        return reta.queue_for_non_ip() as u8;
    }
    let q = match qswitch_wire::flow::extract(frame) {
        Some(key) => reta.queue_for(dev.rss.hash_flow(&key, true)),
        None => reta.queue_for_non_ip(),
    };
    q as u8
}

/// Resolves offloads the guest cannot take, then writes the frame (or its segments).
fn deliver(
    dev: &VhostState,
    vi: usize,
    v: &mut Vring,
    r: &Ring<'_, '_>,
    sc: &mut Scratch,
    pkt: &mut Pkt,
) -> Result<(), DropReason> {
    let hdr = pkt.hdr;
    let gso = hdr.gso_type & !virtio_net_hdr::GSO_ECN;
    let guest_tso = match gso {
        virtio_net_hdr::GSO_NONE => true,
        virtio_net_hdr::GSO_TCPV4 => dev.has(VIRTIO_NET_F_GUEST_TSO4),
        virtio_net_hdr::GSO_TCPV6 => dev.has(VIRTIO_NET_F_GUEST_TSO6),
        _ => false,
    } && (hdr.gso_type & virtio_net_hdr::GSO_ECN == 0
        || dev.has(VIRTIO_NET_F_GUEST_ECN));
    if !guest_tso {
        return deliver_segmented(dev, vi, v, r, sc, pkt);
    }
    if hdr.flags & FLAG_NEEDS_CSUM != 0 && !dev.has(VIRTIO_NET_F_GUEST_CSUM) {
        complete_csum(pkt)?;
    }
    let out = pkt.hdr;
    if dev.hdr_len() == HEADROOM {
        // Header and frame as one run of bytes: the header goes into the packet's headroom.
        pkt.hdr.num_buffers = 1;
        let done = write_rx_single(v, r, pkt.with_vnet_hdr());
        pkt.hdr = out;
        if done {
            return Ok(());
        }
    }
    write_rx_chains(dev, vi, v, r, &out, pkt.frame(), sc)
}

fn complete_csum(pkt: &mut Pkt) -> Result<(), DropReason> {
    let (start, off) = (
        usize::from(pkt.hdr.csum_start),
        usize::from(pkt.hdr.csum_offset),
    );
    let len = pkt.len();
    qswitch_wire::checksum::complete_partial(&mut pkt.frame_buf_mut()[..len], start, off)
        .map_err(|_| DropReason::BadVnetHdr)?;
    pkt.hdr.flags &= !FLAG_NEEDS_CSUM;
    Ok(())
}

/// A TSO frame for a guest without TSO: cut it into wire-sized segments with complete
/// checksums.
fn deliver_segmented(
    dev: &VhostState,
    vi: usize,
    v: &mut Vring,
    r: &Ring<'_, '_>,
    sc: &mut Scratch,
    pkt: &mut Pkt,
) -> Result<(), DropReason> {
    let mut scratch = std::mem::take(&mut sc.gso);
    if scratch.len() < BUF_SIZE {
        scratch.resize(BUF_SIZE, 0);
    }
    let mut result = Ok(());
    let hdr = pkt.hdr;
    // Stop at the first segment the ring cannot take: the rest would only be dropped, and
    // building them is what a guest sending tiny-MSS super-frames would have us spend.
    let seg = qswitch_wire::gso::segment_while(pkt.frame(), &hdr, &mut scratch, |frame| {
        result = write_rx_chains(dev, vi, v, r, &VirtioNetHdr::default(), frame, sc);
        result.is_ok()
    });
    sc.gso = scratch;
    match seg {
        // Some segments went out before the ring filled: they must be published.
        Ok(n) if n > 0 => sc.wrote_partial = true,
        Ok(_) => {}
        Err(_) => return Err(DropReason::Offload),
    }
    result
}

/// Writes header + frame into as many receive chains as needed (several only with
/// MRG_RXBUF). On failure nothing is consumed, except that a malformed receive chain stops
/// the ring (the guest is broken or hostile).
fn write_rx_chains(
    dev: &VhostState,
    vi: usize,
    v: &mut Vring,
    r: &Ring<'_, '_>,
    hdr: &VirtioNetHdr,
    frame: &[u8],
    sc: &mut Scratch,
) -> Result<(), DropReason> {
    let hdr_len = dev.hdr_len();
    let mrg = dev.has(VIRTIO_NET_F_MRG_RXBUF);
    let total = hdr_len + frame.len();
    let table = GuestAddress(v.queue.desc_table());
    let qsize = v.queue.size();
    let saved = v.queue.next_avail();
    sc.segs.clear();
    sc.chains.clear();
    let mut cap: usize = 0;
    while cap < total {
        if sc.chains.len() >= MAX_RX_CHAINS || (!mrg && !sc.chains.is_empty()) {
            // Without MRG_RXBUF one chain must hold the whole frame.
            v.queue.set_next_avail(saved);
            return Err(DropReason::TxFull);
        }
        let mut head = [0u16; 1];
        if pop_heads(dev, vi, v, r, &mut head) == 0 {
            v.queue.set_next_avail(saved);
            return Err(DropReason::TxFull);
        }
        match chain::walk(r.mem, table, qsize, head[0], &mut sc.tmp) {
            Ok(c) if sc.tmp.iter().all(|s| s.write) => {
                let start = sc.segs.len();
                sc.segs.extend_from_slice(&sc.tmp);
                sc.chains.push((head[0], start, sc.segs.len(), c));
                cap += c as usize;
            }
            _ => {
                v.queue.set_next_avail(saved);
                stop_ring(dev, vi, v, "bad receive descriptor chain; ring stopped");
                return Err(DropReason::BadDescriptor);
            }
        }
    }
    let mut h = [0u8; virtio_net_hdr::LEN];
    let n_bufs = if mrg { sc.chains.len() as u16 } else { 1 };
    VirtioNetHdr {
        num_buffers: n_bufs,
        ..*hdr
    }
    .emit(&mut h);
    // Stream the header, then the frame, across the chains' segments.
    let mut src_hdr = &h[..hdr_len];
    let mut src_frame = frame;
    let mut ok = true;
    for &(head, s0, s1, _) in &sc.chains {
        let mut written: u32 = 0;
        for s in &sc.segs[s0..s1] {
            let mut addr = s.addr;
            let mut room = s.len as usize;
            for src in [&mut src_hdr, &mut src_frame] {
                let n = room.min(src.len());
                if n > 0 {
                    ok &= r.mem.write(addr, &src[..n]);
                    *src = &src[n..];
                    addr += n as u64;
                    room -= n;
                    written += n as u32;
                }
            }
        }
        ok &= stage_used(v, r, head, written);
    }
    if ok {
        Ok(())
    } else {
        stop_ring(dev, vi, v, "receive ring not writable; ring stopped");
        Err(DropReason::BadDescriptor)
    }
}

/// The common case, done without the general chain walk: the next receive chain is one
/// device-writable descriptor (not indirect) that holds `bytes` (virtio-net header with
/// `num_buffers` 1, then the frame). Writes them, stages the used element and returns true;
/// returns false, having consumed and written nothing, in every other case (no chain known
/// to be available, a longer or indirect chain, a buffer too small or outside guest
/// memory), which the general path then handles and judges.
#[inline(always)]
fn write_rx_single(v: &mut Vring, r: &Ring<'_, '_>, bytes: &[u8]) -> bool {
    let size = v.queue.size();
    let next = v.queue.next_avail();
    if next == v.avail_cached {
        match r.avail_idx() {
            // A jump beyond the queue size is the general path's to judge.
            Some(idx) if idx != next && idx.wrapping_sub(next) <= size => v.avail_cached = idx,
            _ => return false,
        }
    }
    if size == 0 {
        return false;
    }
    let Some(head) = r.avail_head(next) else {
        return false;
    };
    if head >= size {
        return false;
    }
    let Some([addr, w]) = r.desc(head) else {
        return false;
    };
    let (len, flags) = (w as u32 as usize, (w >> 32) as u16);
    if flags != chain::F_WRITE || len < bytes.len() || !r.mem.write(addr, bytes) {
        return false;
    }
    if !stage_used(v, r, head, bytes.len() as u32) {
        return false;
    }
    v.queue.set_next_avail(next.wrapping_add(1));
    true
}

/// Before a worker sleeps on `queue`: drain the kick, enable notifications, and report
/// whether sleeping is safe (nothing arrived meanwhile).
pub(crate) fn arm(dev: &VhostState, queue: u16) -> bool {
    let vi = usize::from(queue) * 2 + 1;
    let Some(vr) = dev.vrings.get(vi) else {
        return true;
    };
    let mut guard = vr.lock();
    let v = &mut *guard;
    // Never a plain read: the frontend may clear O_NONBLOCK on its copy of the fd.
    let kick = v.kick.as_ref().map(|k| {
        let kicked = qswitch_sys::eventfd::drain_nowait(k).unwrap_or(0) > 0;
        (kicked, k.as_raw_fd())
    });
    if let Some((kicked, fd)) = kick {
        let next = v.queue.next_avail();
        if kicked && next == v.arm_avail && kick_storm(v) {
            // Kicks that bring nothing, faster than KICK_STORM a second: stop waking on
            // them until the event loop's next watchdog tick puts the fd back.
            dev.forget_kick(vi, fd);
            let first = dev.kicks_muted.fetch_or(1 << queue, Ordering::AcqRel) & (1 << queue) == 0;
            dev.guest_error(
                "kick storm (kicks without frames); kicks muted briefly",
                vi,
                first,
            );
        }
        v.arm_avail = next;
    }
    if !v.usable() {
        return true;
    }
    let mem = dev.mem.memory();
    v.notify = true;
    let armed = !v.queue.enable_notification(&*mem).unwrap_or(false);
    dev.log_used_meta(v);
    armed
}

/// Counts a spurious kick; true when they come faster than [`super::KICK_STORM`] a second.
fn kick_storm(v: &mut Vring) -> bool {
    let now = std::time::Instant::now();
    match v.storm_start {
        Some(s) if now.duration_since(s) < std::time::Duration::from_secs(1) => {
            v.storm_count += 1;
            v.storm_count > super::KICK_STORM
        }
        _ => {
            v.storm_start = Some(now);
            v.storm_count = 1;
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::vhost_user::GuestMem;

    /// A ring of 16 entries with its parts at `desc`, `avail` and `used`, in two adjacent
    /// regions [0, 0x1000) and [0x1000, 0x2000).
    fn ring_at(desc: u64, avail: u64, used: u64) -> (GuestMem, Vring) {
        let mem =
            GuestMem::from_ranges(&[(GuestAddress(0), 0x1000), (GuestAddress(0x1000), 0x1000)])
                .unwrap();
        let mut v = Vring::new();
        v.queue.set_size(16);
        v.queue
            .set_desc_table_address(Some(desc as u32), Some((desc >> 32) as u32));
        v.queue
            .set_avail_ring_address(Some(avail as u32), Some((avail >> 32) as u32));
        v.queue
            .set_used_ring_address(Some(used as u32), Some((used >> 32) as u32));
        (mem, v)
    }

    /// Ring parts inside one region take the resolved mappings, parts across two regions the
    /// general path; both read and write the same bytes.
    #[test]
    fn ring_parts_read_and_write_alike_inside_and_across_regions() {
        for (desc, avail, used, one_region) in
            [(0x0, 0x100, 0x200, true), (0xf80, 0xff0, 0xfc0, false)]
        {
            let (mem, v) = ring_at(desc, avail, used);
            let view = GuestView::new(&mem);
            assert!(view.store_u16(avail + 2, 3, Ordering::Release));
            for (i, h) in [5u16, 6, 7].iter().enumerate() {
                assert!(view.store_u16(avail + 4 + 2 * i as u64, *h, Ordering::Release));
            }
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&0x1234u64.to_le_bytes());
            d[8..12].copy_from_slice(&60u32.to_le_bytes());
            d[12..14].copy_from_slice(&chain::F_WRITE.to_le_bytes());
            assert!(view.write(desc + 16 * 5, &d));
            let r = Ring::new(&v, &view);
            assert_eq!(r.desc_map.is_some(), one_region);
            assert_eq!(r.avail_map.is_some(), one_region);
            assert_eq!(r.used_map.is_some(), one_region);
            assert_eq!(r.avail_idx(), Some(3));
            // Free-running indices wrap onto the ring's slots.
            assert_eq!(r.avail_head(1), Some(6));
            assert_eq!(r.avail_head(16 + 2), Some(7));
            assert_eq!(
                r.desc(5),
                Some([0x1234, 60 | u64::from(chain::F_WRITE) << 32])
            );
            r.prefetch_desc(5);
            r.prefetch_used_slot(15);
            let e: [u8; 16] = std::array::from_fn(|i| i as u8 + 1);
            assert!(r.put_used(15, &e[..8]));
            assert!(r.put_used(0, &e[8..]));
            let mut b = [0u8; 8];
            assert!(view.read(used + 4 + 8 * 15, &mut b));
            assert_eq!(b, e[..8]);
            assert!(view.read(used + 4, &mut b));
            assert_eq!(b, e[8..]);
        }
    }

    #[test]
    fn slots_wrap_by_mask() {
        assert_eq!(slot(0, 256), 0);
        assert_eq!(slot(257, 256), 1);
        assert_eq!(slot(u16::MAX, 1024), 1023);
    }
}
