//! Driver side of one split virtqueue: layout, shadow state, publish/kick, used polling.

use std::collections::VecDeque;
use std::sync::atomic::{fence, Ordering};

use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use crate::shm::Shm;
use crate::{Error, Result};

/// `VRING_DESC_F_NEXT`.
pub const DESC_F_NEXT: u16 = 1;
/// `VRING_DESC_F_WRITE` (device-writable buffer).
pub const DESC_F_WRITE: u16 = 2;
/// `VRING_DESC_F_INDIRECT`.
pub const DESC_F_INDIRECT: u16 = 4;
/// `VRING_AVAIL_F_NO_INTERRUPT` (driver → device: don't call me; ignored with EVENT_IDX).
pub const AVAIL_F_NO_INTERRUPT: u16 = 1;
/// `VRING_USED_F_NO_NOTIFY` (device → driver: don't kick me; ignored with EVENT_IDX).
pub const USED_F_NO_NOTIFY: u16 = 1;

/// Where one split virtqueue lives in guest memory (guest physical addresses).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

pub(crate) const PAGE: u64 = 4096;

pub(crate) fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl Layout {
    /// Lay a ring of `size` entries out at `base` (page-aligned): descriptor table, avail ring
    /// right behind it, used ring on the next page boundary (the legacy layout). Returns the
    /// layout and the page-aligned end.
    pub(crate) fn at(base: u64, size: u16) -> (Layout, u64) {
        let q = u64::from(size);
        let desc = base;
        let avail = desc + 16 * q;
        let used = align_up(avail + 6 + 2 * q, PAGE);
        let end = align_up(used + 6 + 8 * q, PAGE);
        (
            Layout {
                size,
                desc,
                avail,
                used,
            },
            end,
        )
    }

    #[inline]
    pub(crate) fn desc_entry(&self, i: u16) -> u64 {
        self.desc + 16 * u64::from(i)
    }
    #[inline]
    pub(crate) fn avail_flags(&self) -> u64 {
        self.avail
    }
    #[inline]
    pub(crate) fn avail_idx(&self) -> u64 {
        self.avail + 2
    }
    #[inline]
    pub(crate) fn avail_entry(&self, slot: u16) -> u64 {
        self.avail + 4 + 2 * u64::from(slot % self.size)
    }
    #[inline]
    pub(crate) fn used_event(&self) -> u64 {
        self.avail + 4 + 2 * u64::from(self.size)
    }
    #[inline]
    pub(crate) fn used_flags(&self) -> u64 {
        self.used
    }
    #[inline]
    pub(crate) fn used_idx(&self) -> u64 {
        self.used + 2
    }
    #[inline]
    pub(crate) fn used_elem(&self, slot: u16) -> u64 {
        self.used + 4 + 8 * u64::from(slot % self.size)
    }
    #[inline]
    pub(crate) fn avail_event(&self) -> u64 {
        self.used + 4 + 8 * u64::from(self.size)
    }
    /// Bytes covered, from `desc` to the end of the used ring.
    pub(crate) fn span(&self) -> u64 {
        self.used + 6 + 8 * u64::from(self.size) - self.desc
    }
}

/// `vring_need_event`: whether moving an index from `old` to `new` crosses `event`.
#[inline]
pub(crate) fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// Encode a split-ring descriptor.
#[inline]
pub(crate) fn desc_bytes(addr: u64, len: u32, flags: u16, next: u16) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&addr.to_le_bytes());
    b[8..12].copy_from_slice(&len.to_le_bytes());
    b[12..14].copy_from_slice(&flags.to_le_bytes());
    b[14..16].copy_from_slice(&next.to_le_bytes());
    b
}

/// One vring as the driver sees it.
pub(crate) struct Vring {
    pub index: u16,
    pub l: Layout,
    pub kick: EventFd,
    pub call: EventFd,
    /// Driver's next avail index (free running), i.e. the value last published plus any
    /// entries written but not yet published.
    pub avail_idx: u16,
    /// `avail_idx` at the last kick decision (the "old" of `vring_need_event`).
    pub kick_checked: u16,
    /// Next used index to consume (free running).
    pub last_used: u16,
    pub kicks: u64,
    pub calls: u64,
    /// Buffer slot of descriptor `i` is `buf_base + i * buf_stride`, `buf_len` bytes.
    pub buf_base: u64,
    pub buf_stride: u64,
    pub buf_len: u32,
    /// Free descriptor indices (tx only).
    pub free: Vec<u16>,
    /// Shadow of each descriptor's `next` (tx chains).
    pub next: Vec<u16>,
    /// Chain length per head (tx) — 0 when the head is not outstanding.
    pub chain_len: Vec<u16>,
    /// Rx: descriptor `i` is posted (owned by the device).
    pub posted: Vec<bool>,
    pub event_idx: bool,
    pub request_calls: bool,
    /// With IN_ORDER: the heads made available and not yet used, oldest first (every used
    /// id must be the front one).
    pub in_order: Option<VecDeque<u16>>,
}

impl Vring {
    pub(crate) fn new(
        index: u16,
        l: Layout,
        buf_base: u64,
        buf_stride: u64,
        buf_len: u32,
        event_idx: bool,
        request_calls: bool,
    ) -> Result<Vring> {
        let q = usize::from(l.size);
        Ok(Vring {
            index,
            l,
            kick: EventFd::new(EFD_NONBLOCK)?,
            call: EventFd::new(EFD_NONBLOCK)?,
            avail_idx: 0,
            kick_checked: 0,
            last_used: 0,
            kicks: 0,
            calls: 0,
            buf_base,
            buf_stride,
            buf_len,
            free: (0..l.size).rev().collect(),
            next: vec![0; q],
            chain_len: vec![0; q],
            posted: vec![false; q],
            event_idx,
            request_calls,
            in_order: None,
        })
    }

    pub(crate) fn is_rx(&self) -> bool {
        self.index & 1 == 0
    }

    #[inline]
    pub(crate) fn buf_addr(&self, desc: u16) -> u64 {
        self.buf_base + u64::from(desc) * self.buf_stride
    }

    /// Zero the ring and set the driver's notification wishes. Rx: post every descriptor
    /// with its own buffer (device-writable) and publish the avail index, so a back-end that
    /// looks before the first kick already sees the buffers.
    pub(crate) fn init(&mut self, shm: &Shm) -> Result<()> {
        shm.zero(self.l.desc, self.l.span())?;
        self.set_call_wish(shm, Ordering::Relaxed)?;
        if self.is_rx() {
            for d in 0..self.l.size {
                let b = desc_bytes(self.buf_addr(d), self.buf_len, DESC_F_WRITE, 0);
                shm.write(self.l.desc_entry(d), &b)?;
                self.push_avail(shm, d)?;
                self.posted[usize::from(d)] = true;
            }
            shm.store16(self.l.avail_idx(), self.avail_idx, Ordering::Release)?;
            self.kick_checked = self.avail_idx;
            self.free.clear();
        }
        Ok(())
    }

    /// Tell the device whether we want calls: with EVENT_IDX `used_event = last_used` (call
    /// me at the next used entry) or, when calls are unwanted, leave `used_event` half a ring
    /// space away; without EVENT_IDX the avail `NO_INTERRUPT` flag.
    #[inline]
    pub(crate) fn set_call_wish(&self, shm: &Shm, order: Ordering) -> Result<()> {
        if self.event_idx {
            let ev = if self.request_calls {
                self.last_used
            } else {
                self.last_used.wrapping_add(0x8000)
            };
            shm.store16(self.l.used_event(), ev, order)
        } else {
            let f = if self.request_calls {
                0
            } else {
                AVAIL_F_NO_INTERRUPT
            };
            shm.store16(self.l.avail_flags(), f, order)
        }
    }

    /// Append `head` to the avail ring (not yet published).
    #[inline]
    pub(crate) fn push_avail(&mut self, shm: &Shm, head: u16) -> Result<()> {
        shm.store16(self.l.avail_entry(self.avail_idx), head, Ordering::Relaxed)?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        if let Some(order) = &mut self.in_order {
            order.push_back(head);
        }
        Ok(())
    }

    /// With IN_ORDER, checks that the device used `id` next: the oldest head made available
    /// and not used yet (virtio 1.1 2.6.9: "the device MUST use buffers in the same order in
    /// which they have been made available").
    pub(crate) fn check_order(&mut self, id: u32) -> Result<()> {
        let Some(order) = &mut self.in_order else {
            return Ok(());
        };
        match order.pop_front() {
            Some(want) if u32::from(want) == id => Ok(()),
            want => Err(self.violation(format!(
                "used id {id} out of order: IN_ORDER expects {want:?}"
            ))),
        }
    }

    /// Publish `avail_idx` and kick if the device asked for it (EVENT_IDX `avail_event`, or
    /// the used `NO_NOTIFY` flag). Returns whether it kicked.
    pub(crate) fn publish(&mut self, shm: &Shm) -> Result<bool> {
        if self.avail_idx == self.kick_checked {
            return Ok(false);
        }
        shm.store16(self.l.avail_idx(), self.avail_idx, Ordering::Release)?;
        // The store of avail idx must be visible before we read the device's wish
        // (the "mb()" of virtqueue_kick_prepare).
        fence(Ordering::SeqCst);
        let old = self.kick_checked;
        self.kick_checked = self.avail_idx;
        let kick = if self.event_idx {
            let ev = shm.load16(self.l.avail_event(), Ordering::Relaxed)?;
            need_event(ev, self.avail_idx, old)
        } else {
            shm.load16(self.l.used_flags(), Ordering::Relaxed)? & USED_F_NO_NOTIFY == 0
        };
        if kick {
            self.do_kick()?;
        }
        Ok(kick)
    }

    pub(crate) fn do_kick(&mut self) -> Result<()> {
        self.kick.write(1)?;
        self.kicks += 1;
        Ok(())
    }

    /// Number of used entries not yet consumed (validated against the ring size).
    #[inline]
    pub(crate) fn pending_used(&self, shm: &Shm) -> Result<u16> {
        let used = shm.load16(self.l.used_idx(), Ordering::Acquire)?;
        let n = used.wrapping_sub(self.last_used);
        if n > self.l.size {
            return Err(self.violation(format!(
                "used idx {used} is {n} entries past the driver's {} (ring size {})",
                self.last_used, self.l.size
            )));
        }
        Ok(n)
    }

    /// Read the used element at `last_used + k`.
    #[inline]
    pub(crate) fn used_elem(&self, shm: &Shm, k: u16) -> Result<(u32, u32)> {
        let mut b = [0u8; 8];
        shm.read(self.l.used_elem(self.last_used.wrapping_add(k)), &mut b)?;
        Ok((
            u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        ))
    }

    /// Drain the call eventfd into the counter.
    pub(crate) fn drain_calls(&mut self) -> u64 {
        if let Ok(n) = self.call.read() {
            self.calls += n;
        }
        self.calls
    }

    pub(crate) fn violation(&self, what: String) -> Error {
        Error::Ring {
            vring: self.index,
            what,
        }
    }

    /// Reclaim completed tx chains. Returns how many chains were reclaimed.
    pub(crate) fn reclaim_tx(&mut self, shm: &Shm) -> Result<u16> {
        let n = self.pending_used(shm)?;
        for k in 0..n {
            let (id, _len) = self.used_elem(shm, k)?;
            let head = match u16::try_from(id) {
                Ok(h) if h < self.l.size && self.chain_len[usize::from(h)] > 0 => h,
                _ => {
                    // Step over the bad entry so the ring can go on.
                    self.last_used = self.last_used.wrapping_add(k + 1);
                    return Err(
                        self.violation(format!("used id {id} is not an outstanding tx chain head"))
                    );
                }
            };
            if let Err(e) = self.check_order(id) {
                self.last_used = self.last_used.wrapping_add(k + 1);
                return Err(e);
            }
            let mut d = head;
            let len = std::mem::take(&mut self.chain_len[usize::from(head)]);
            for _ in 0..len {
                self.free.push(d);
                d = self.next[usize::from(d)];
            }
        }
        self.last_used = self.last_used.wrapping_add(n);
        if n > 0 && self.request_calls {
            self.set_call_wish(shm, Ordering::Relaxed)?;
        }
        Ok(n)
    }

    /// Enqueue one tx packet (`hdr` then `frame`, split over as many buffer slots as needed),
    /// not yet published. Returns false when there are not enough free descriptors.
    pub(crate) fn enqueue_tx(&mut self, shm: &Shm, hdr: &[u8], frame: &[u8]) -> Result<bool> {
        let total = hdr.len() + frame.len();
        let slot = self.buf_len as usize;
        let need = total.div_ceil(slot).max(1);
        if need > self.free.len() {
            return Ok(false);
        }
        // Build the chain back to front so each descriptor's `next` is already known.
        let mut next = 0u16;
        for seg in (0..need).rev() {
            let d = self.free.pop().expect("free count checked");
            let off = seg * slot; // offset into hdr ++ frame
            let len = (total - off).min(slot);
            let addr = self.buf_addr(d);
            // Copy [off, off + len) of hdr ++ frame into the slot.
            let mut written = 0usize;
            if off < hdr.len() {
                let h = &hdr[off..hdr.len().min(off + len)];
                shm.write(addr, h)?;
                written = h.len();
            }
            if written < len {
                let fo = off + written - hdr.len();
                shm.write(addr + written as u64, &frame[fo..fo + (len - written)])?;
            }
            let last = seg + 1 == need;
            let flags = if last { 0 } else { DESC_F_NEXT };
            let nx = if last { 0 } else { next };
            shm.write(
                self.l.desc_entry(d),
                &desc_bytes(addr, len as u32, flags, nx),
            )?;
            self.next[usize::from(d)] = nx;
            next = d;
        }
        let head = next;
        self.chain_len[usize::from(head)] = need as u16;
        self.push_avail(shm, head)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn need_event_matches_linux() {
        // Device asked to be kicked when avail idx passes 5.
        assert!(need_event(5, 6, 5));
        assert!(need_event(5, 10, 3));
        assert!(!need_event(5, 5, 3));
        assert!(!need_event(5, 12, 6));
        // Wrap-around.
        assert!(need_event(0xffff, 2, 0xfffe));
    }

    #[test]
    fn layout_alignment() {
        let (l, end) = Layout::at(0, 256);
        assert_eq!(l.desc, 0);
        assert_eq!(l.avail, 4096);
        assert_eq!(l.used % 4096, 0);
        assert!(l.used >= l.avail + 6 + 512);
        assert_eq!(end % 4096, 0);
        assert_eq!(l.avail_event(), l.used + 4 + 8 * 256);
        assert_eq!(l.used_event(), l.avail + 4 + 2 * 256);
    }

    #[test]
    fn in_order_check_rejects_a_used_id_out_of_turn() {
        let (l, _) = Layout::at(0, 16);
        let mut v = Vring::new(1, l, 0, 0, 0, false, false).unwrap();
        assert!(v.check_order(9).is_ok(), "no check without IN_ORDER");
        v.in_order = Some(VecDeque::from([3, 5, 4]));
        assert!(v.check_order(3).is_ok());
        let e = v.check_order(4).unwrap_err().to_string();
        assert!(e.contains("used id 4 out of order"), "{e}");
        // Nothing outstanding: any used id is out of turn.
        v.in_order = Some(VecDeque::new());
        assert!(v.check_order(0).is_err());
    }
}
