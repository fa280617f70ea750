//! A per-burst view of guest memory for the data path.
//!
//! vm-memory's `Bytes` methods on `GuestMemoryMmap` look up the region and walk a slice
//! iterator on every access; on the data path that was most of the worker's time. A
//! [`GuestView`] resolves each region to a `VolatileSlice` once per burst; after that an
//! access is a linear scan of (usually one or two) regions, a bounds check and a copy.
//! Accesses that cross a region boundary, or regions beyond [`MAX_FAST_REGIONS`], fall back
//! to vm-memory's general path, so every access stays bounds-checked either way.

use std::sync::atomic::Ordering;

use vm_memory::{
    Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion, VolatileMemory,
    VolatileSlice,
};

/// Regions resolved up front; QEMU typically passes one or two.
pub const MAX_FAST_REGIONS: usize = 8;

#[derive(Clone, Copy)]
struct Region<'a> {
    start: u64,
    len: u64,
    slice: VolatileSlice<'a>,
}

/// Guest memory as the data path reads and writes it during one burst.
pub struct GuestView<'a> {
    mem: &'a GuestMemoryMmap,
    regions: [Option<Region<'a>>; MAX_FAST_REGIONS],
}

impl<'a> GuestView<'a> {
    /// Resolves the regions of `mem`.
    pub fn new(mem: &'a GuestMemoryMmap) -> GuestView<'a> {
        let mut regions = [None; MAX_FAST_REGIONS];
        for (slot, r) in regions.iter_mut().zip(mem.iter()) {
            if let Ok(slice) = r.as_volatile_slice() {
                *slot = Some(Region {
                    start: r.start_addr().0,
                    len: r.len(),
                    slice,
                });
            }
        }
        GuestView { mem, regions }
    }

    /// The underlying memory.
    pub fn mem(&self) -> &'a GuestMemoryMmap {
        self.mem
    }

    /// The slice `[addr, addr + len)` if it lies inside one resolved region.
    #[inline(always)]
    fn find(&self, addr: u64, len: usize) -> Option<VolatileSlice<'a>> {
        for r in self.regions.iter().map_while(Option::as_ref) {
            if addr >= r.start && addr - r.start < r.len {
                let off = addr - r.start;
                if len as u64 > r.len - off {
                    return None;
                }
                return r.slice.subslice(off as usize, len).ok();
            }
        }
        None
    }

    /// Whether `[addr, addr + len)` is guest memory.
    #[inline(always)]
    pub fn check(&self, addr: u64, len: usize) -> bool {
        self.find(addr, len).is_some() || self.mem.check_range(GuestAddress(addr), len)
    }

    /// Copies guest memory at `addr` into `buf`; false if any of it is not guest memory.
    #[inline(always)]
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        match self.find(addr, buf.len()) {
            Some(s) => s.copy_to(buf) == buf.len(),
            None => self.mem.read_slice(buf, GuestAddress(addr)).is_ok(),
        }
    }

    /// Copies `buf` into guest memory at `addr`; false if any of it is not guest memory.
    #[inline(always)]
    pub fn write(&self, addr: u64, buf: &[u8]) -> bool {
        match self.find(addr, buf.len()) {
            Some(s) => {
                s.copy_from(buf);
                true
            }
            None => self.mem.write_slice(buf, GuestAddress(addr)).is_ok(),
        }
    }

    /// Reads one 16-byte split-ring descriptor (one load, no copy loop).
    #[inline]
    pub fn read_16(&self, addr: u64) -> Option<[u8; 16]> {
        match self.find(addr, 16) {
            Some(s) => s.get_ref::<[u8; 16]>(0).ok().map(|r| r.load()),
            None => {
                let mut b = [0u8; 16];
                self.mem.read_slice(&mut b, GuestAddress(addr)).ok()?;
                Some(b)
            }
        }
    }

    /// Hints the CPU to fetch the cache line at `addr` (a descriptor or a frame about to be
    /// read); no-op outside guest memory.
    #[inline]
    pub fn prefetch(&self, addr: u64) {
        if let Some(s) = self.find(addr, 1) {
            qswitch_sys::cpu::prefetch(s.ptr_guard().as_ptr());
        }
    }

    /// Hints the CPU to fetch the cache line at `addr` for writing (a receive buffer or a
    /// used-ring slot about to be written); no-op outside guest memory.
    #[inline]
    pub fn prefetch_write(&self, addr: u64) {
        if let Some(s) = self.find(addr, 1) {
            qswitch_sys::cpu::prefetch_write(s.ptr_guard().as_ptr());
        }
    }

    /// Reads a little-endian u16 (ring indices and flags).
    #[inline(always)]
    pub fn load_u16(&self, addr: u64, order: Ordering) -> Option<u16> {
        match self.find(addr, 2) {
            Some(s) => s.load::<u16>(0, order).ok().map(u16::from_le),
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
        match self.find(addr, 2) {
            Some(s) => s.store(v.to_le(), 0, order).is_ok(),
            None => self.mem.store(v.to_le(), GuestAddress(addr), order).is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_and_slow_paths_agree() {
        let mem = GuestMemoryMmap::from_ranges(&[
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
        assert!(v.write(0x100, &d));
        assert_eq!(v.read_16(0x100), Some(d));
        assert!(v.write(0xff8, &d));
        assert_eq!(v.read_16(0xff8), Some(d), "across regions: slow path");
        assert_eq!(v.read_16(0x10ff8), None);
        v.prefetch(0x100);
        v.prefetch(0x5000);
        v.prefetch_write(0x100);
        v.prefetch_write(u64::MAX);
    }
}
