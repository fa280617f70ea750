//! A per-burst view of guest memory for the data path.
//!
//! vm-memory's `Bytes` methods on `GuestMemoryMmap` look up the region and walk a slice
//! iterator on every access, and its `VolatileSlice` accessors re-derive a checked sub-slice
//! each time; on the data path that was most of the worker's instructions. A [`GuestView`]
//! resolves each region to a [`Mapped`] (`qswitch_sys::guest`) once per burst; after that an
//! access is a scan of (usually one or two) regions, a bounds check and a `memcpy`, load or
//! store. Accesses that cross a region boundary, or regions beyond [`MAX_FAST_REGIONS`],
//! fall back to vm-memory's general path, so every access stays bounds-checked either way.
//!
//! # Dirty logging (live migration)
//! A view made with [`GuestView::with_log`] while the frontend has logging on marks every
//! write (frames, used elements, the used index) in the dirty log by guest-physical address.
//! With logging off the log is `None`: each write then costs one predictable branch on a
//! field of the view, and the data path takes the log once per burst (a relaxed load of one
//! flag). With logging on each write also costs one relaxed load per page touched (plus a
//! locked `or` the first time a page is marked after QEMU cleared it) and one shared counter
//! increment (`logged_pages`).

use std::sync::atomic::Ordering;

use qswitch_sys::dirty_log::{DirtyLog, LOG_PAGE};
use qswitch_sys::guest::Mapped;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::{GuestMem, VhostState};

/// Marks `[gpa, gpa + len)` dirty in `log` and counts it on `dev` (pages marked; pages
/// beyond the log, warned about once).
#[cold]
#[inline(never)]
pub(crate) fn log_write(log: &DirtyLog, dev: &VhostState, gpa: u64, len: u64) {
    if len == 0 {
        return;
    }
    let n = gpa.saturating_add(len - 1) / LOG_PAGE - gpa / LOG_PAGE + 1;
    let lost = log.mark(gpa, len);
    dev.logged_pages.fetch_add(n - lost, Ordering::Relaxed);
    if lost > 0 && dev.log_missed.fetch_add(lost, Ordering::Relaxed) == 0 {
        tracing::warn!(port = %dev.name, gpa, "guest memory written beyond the dirty log");
    }
}

#[derive(Clone, Copy)]
struct LogSink<'a> {
    log: &'a DirtyLog,
    dev: &'a VhostState,
}

/// Regions resolved up front; QEMU typically passes one or two.
pub const MAX_FAST_REGIONS: usize = 8;

#[derive(Clone, Copy)]
struct Region<'a> {
    start: u64,
    map: Mapped<'a>,
}

const NO_REGION: Region<'static> = Region {
    start: 0,
    map: Mapped::empty(),
};

/// Guest memory as the data path reads and writes it during one burst.
pub struct GuestView<'a> {
    mem: &'a GuestMem,
    /// The first region, checked before any other (QEMU's guest RAM below 3 GiB; the only
    /// one of a DPDK virtio-user frontend).
    first: Region<'a>,
    rest: [Region<'a>; MAX_FAST_REGIONS - 1],
    n_rest: usize,
    /// The dirty log while the frontend has logging on.
    log: Option<LogSink<'a>>,
}

impl<'a> GuestView<'a> {
    /// Resolves the regions of `mem`.
    pub fn new(mem: &'a GuestMem) -> GuestView<'a> {
        let mut v = GuestView {
            mem,
            first: NO_REGION,
            rest: [NO_REGION; MAX_FAST_REGIONS - 1],
            n_rest: 0,
            log: None,
        };
        let mut n = 0;
        for r in mem.iter() {
            let Ok(slice) = r.as_volatile_slice() else {
                continue;
            };
            let region = Region {
                start: r.start_addr().0,
                map: Mapped::new(&slice),
            };
            match n {
                0 => v.first = region,
                k if k < MAX_FAST_REGIONS => v.rest[k - 1] = region,
                _ => break,
            }
            n += 1;
        }
        v.n_rest = n.saturating_sub(1);
        v
    }

    /// Marks every later write in `log` (if any), counting on `dev`.
    pub(crate) fn with_log(mut self, log: Option<&'a DirtyLog>, dev: &'a VhostState) -> Self {
        self.log = log.map(|log| LogSink { log, dev });
        self
    }

    #[inline(always)]
    pub(crate) fn mark(&self, addr: u64, len: usize) {
        if let Some(s) = self.log {
            log_write(s.log, s.dev, addr, len as u64);
        }
    }

    /// The underlying memory.
    pub fn mem(&self) -> &'a GuestMem {
        self.mem
    }

    /// The region holding `addr`, and the offset of `addr` in it. (An address below a
    /// region's start wraps to an offset beyond its end.)
    #[inline(always)]
    fn find(&self, addr: u64) -> Option<(Mapped<'a>, u64)> {
        let off = addr.wrapping_sub(self.first.start);
        if off < self.first.map.len() as u64 {
            return Some((self.first.map, off));
        }
        self.find_rest(addr)
    }

    #[inline(never)]
    fn find_rest(&self, addr: u64) -> Option<(Mapped<'a>, u64)> {
        self.rest[..self.n_rest].iter().find_map(|r| {
            let off = addr.wrapping_sub(r.start);
            (off < r.map.len() as u64).then_some((r.map, off))
        })
    }

    /// `[addr, addr + len)` as one mapping, if it lies inside one of the resolved regions
    /// (a split ring's descriptor table, avail or used ring: see `rings::Ring`).
    #[inline(always)]
    pub fn span(&self, addr: u64, len: usize) -> Option<Mapped<'a>> {
        let (m, off) = self.find(addr)?;
        m.sub(off, len)
    }

    /// Whether `[addr, addr + len)` is guest memory.
    #[inline(always)]
    pub fn check(&self, addr: u64, len: usize) -> bool {
        match self.find(addr) {
            Some((m, off)) if m.contains(off, len) => true,
            _ => self.mem.check_range(GuestAddress(addr), len),
        }
    }

    /// Copies guest memory at `addr` into `buf`; false if any of it is not guest memory.
    #[inline(always)]
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        match self.find(addr) {
            Some((m, off)) if m.read(off, buf) => true,
            _ => self.mem.read_slice(buf, GuestAddress(addr)).is_ok(),
        }
    }

    /// Copies `buf` into guest memory at `addr`; false if any of it is not guest memory.
    #[inline(always)]
    pub fn write(&self, addr: u64, buf: &[u8]) -> bool {
        let ok = match self.find(addr) {
            Some((m, off)) if m.write(off, buf) => true,
            _ => self.mem.write_slice(buf, GuestAddress(addr)).is_ok(),
        };
        if ok {
            self.mark(addr, buf.len());
        }
        ok
    }

    /// Reads one 16-byte split-ring descriptor as two little-endian words: (addr,
    /// len | flags << 32 | next << 48).
    #[inline(always)]
    pub fn read_desc(&self, addr: u64) -> Option<[u64; 2]> {
        if let Some([a, b]) = self.find(addr).and_then(|(m, off)| m.read_u64x2(off)) {
            return Some([u64::from_le(a), u64::from_le(b)]);
        }
        self.read_desc_slow(addr)
    }

    #[inline(never)]
    fn read_desc_slow(&self, addr: u64) -> Option<[u64; 2]> {
        let mut b = [0u8; 16];
        self.mem.read_slice(&mut b, GuestAddress(addr)).ok()?;
        let (lo, hi) = b.split_at(8);
        Some([
            u64::from_le_bytes(lo.try_into().ok()?),
            u64::from_le_bytes(hi.try_into().ok()?),
        ])
    }

    /// Hints the CPU to fetch the cache line at `addr` (a descriptor or a frame about to be
    /// read); no-op outside guest memory.
    #[inline(always)]
    pub fn prefetch(&self, addr: u64) {
        if let Some((m, off)) = self.find(addr) {
            m.prefetch(off);
        }
    }

    /// Hints the CPU to fetch the cache line at `addr` for writing (a receive buffer or a
    /// used-ring slot about to be written); no-op outside guest memory.
    #[inline(always)]
    pub fn prefetch_write(&self, addr: u64) {
        if let Some((m, off)) = self.find(addr) {
            m.prefetch_write(off);
        }
    }

    /// [`GuestView::prefetch`] for each cache line of `[addr + from, addr + len)`.
    #[inline(always)]
    pub fn prefetch_range(&self, addr: u64, from: usize, len: usize) {
        if let Some((m, off)) = self.find(addr) {
            let mut o = from;
            while o < len {
                m.prefetch(off + o as u64);
                o += 64;
            }
        }
    }

    /// [`GuestView::prefetch_write`] for each cache line of `[addr + from, addr + len)`.
    #[inline(always)]
    pub fn prefetch_write_range(&self, addr: u64, from: usize, len: usize) {
        if let Some((m, off)) = self.find(addr) {
            let mut o = from;
            while o < len {
                m.prefetch_write(off + o as u64);
                o += 64;
            }
        }
    }

    /// Reads a little-endian u16 (ring indices and flags).
    #[inline(always)]
    pub fn load_u16(&self, addr: u64, order: Ordering) -> Option<u16> {
        match self.find(addr).and_then(|(m, off)| m.load_u16(off, order)) {
            Some(v) => Some(u16::from_le(v)),
            None => self
                .mem
                .load::<u16>(GuestAddress(addr), order)
                .ok()
                .map(u16::from_le),
        }
    }

    /// Writes a little-endian u16 with the given ordering (the used index).
    #[inline(always)]
    pub fn store_u16(&self, addr: u64, v: u16, order: Ordering) -> bool {
        let ok = match self.find(addr) {
            Some((m, off)) if m.store_u16(off, v.to_le(), order) => true,
            _ => self.mem.store(v.to_le(), GuestAddress(addr), order).is_ok(),
        };
        if ok {
            self.mark(addr, 2);
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_and_slow_paths_agree() {
        let mem = GuestMem::from_ranges(&[
            (GuestAddress(0), 0x1000),
            (GuestAddress(0x1000), 0x1000),
            (GuestAddress(0x10000), 0x1000),
        ])
        .unwrap();
        let v = GuestView::new(&mem);
        assert!(v.write(0x10, &[1, 2, 3, 4]));
        let mut b = [0u8; 4];
        assert!(v.read(0x10, &mut b));
        assert_eq!(b, [1, 2, 3, 4]);
        // Crossing two adjacent regions takes the slow path and still works.
        assert!(v.write(0xffe, &[9, 8, 7, 6]));
        assert!(v.read(0xffe, &mut b));
        assert_eq!(b, [9, 8, 7, 6]);
        // A hole and the end of memory are refused.
        assert!(!v.read(0x2000, &mut b));
        assert!(!v.check(0x10ffe, 4));
        assert!(!v.check(u64::MAX - 1, 4));
        assert!(v.store_u16(0x10002, 0xbeef, Ordering::Release));
        assert_eq!(v.load_u16(0x10002, Ordering::Acquire), Some(0xbeef));
        assert_eq!(v.load_u16(0x5000, Ordering::Acquire), None);
        let d: [u8; 16] = std::array::from_fn(|i| i as u8);
        let words = [
            u64::from_le_bytes(d[..8].try_into().unwrap()),
            u64::from_le_bytes(d[8..].try_into().unwrap()),
        ];
        assert!(v.write(0x100, &d));
        assert_eq!(v.read_desc(0x100), Some(words));
        assert!(v.write(0xff8, &d));
        assert_eq!(v.read_desc(0xff8), Some(words), "across regions: slow path");
        assert_eq!(v.read_desc(0x10ff8), None);
        v.prefetch(0x100);
        v.prefetch(0x5000);
        v.prefetch_write(0x100);
        v.prefetch_write(u64::MAX);
    }
}
