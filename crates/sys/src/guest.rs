//! Guest memory as the vhost-user data path touches it.
//!
//! vm-memory's `VolatileSlice` accessors re-derive and re-check a sub-slice on every access;
//! per frame that is several hundred instructions for a descriptor and a few bytes. A
//! [`Mapped`] is one mapped region taken from a `VolatileSlice` (which guarantees the mapping
//! for its lifetime), with bounds-checked copies, ring-index loads and stores, and cache
//! hints that are a compare and a `memcpy`, a plain load or a plain store.
//!
//! The memory is shared with the guest, which may change it at any moment: copies are
//! `memcpy` into or out of memory Rust owns (what vm-memory does for copies above 8 bytes),
//! ring indices are atomic accesses, and nothing read is trusted by this module. Writes are
//! not recorded here: during live migration the data path's per-burst view marks them in the
//! frontend's dirty log ([`crate::dirty_log`]).

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU16, Ordering};

use vm_memory::bitmap::BitmapSlice;
use vm_memory::VolatileSlice;

/// One mapped guest memory region, valid for `'a`; offsets are from its start.
#[derive(Clone, Copy, Debug)]
pub struct Mapped<'a> {
    ptr: *mut u8,
    len: usize,
    _mem: PhantomData<&'a [u8]>,
}

impl<'a> Mapped<'a> {
    /// The region `slice` maps.
    pub fn new<B: BitmapSlice>(slice: &VolatileSlice<'a, B>) -> Mapped<'a> {
        Mapped {
            ptr: slice.ptr_guard_mut().as_ptr(),
            len: slice.len(),
            _mem: PhantomData,
        }
    }

    /// A region of no bytes: every access is out of bounds.
    pub const fn empty() -> Mapped<'a> {
        Mapped {
            ptr: std::ptr::null_mut(),
            len: 0,
            _mem: PhantomData,
        }
    }

    /// The `n` bytes at `off` as a region of their own (offsets from `off`); None if they are
    /// not all inside this one. A split ring resolved once per burst this way costs each later
    /// access one bounds check instead of a region search.
    #[inline(always)]
    pub fn sub(&self, off: u64, n: usize) -> Option<Mapped<'a>> {
        if !self.contains(off, n) {
            return None;
        }
        Some(Mapped {
            // In bounds (checked above), so `[ptr, ptr + n)` is inside the mapping and valid
            // for `'a`, which is all a `Mapped` promises; computing it dereferences nothing.
            ptr: self.ptr.wrapping_add(off as usize),
            len: n,
            _mem: PhantomData,
        })
    }

    /// Length in bytes.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `[off, off + n)` lies inside the region.
    #[inline(always)]
    pub fn contains(&self, off: u64, n: usize) -> bool {
        off < self.len as u64 && n as u64 <= self.len as u64 - off
    }

    /// Copies `buf.len()` bytes at `off` into `buf`; false (nothing copied) if out of bounds.
    #[inline(always)]
    pub fn read(&self, off: u64, buf: &mut [u8]) -> bool {
        if !self.contains(off, buf.len()) {
            return false;
        }
        // SAFETY: `[off, off + buf.len())` is inside the mapping (checked above), which
        // `VolatileSlice<'a>` guarantees for `'a`; `buf` is memory Rust owns, so it cannot
        // overlap the guest's shared mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(off as usize), buf.as_mut_ptr(), buf.len());
        }
        true
    }

    /// Copies `buf` to `off`; false (nothing written) if out of bounds.
    #[inline(always)]
    pub fn write(&self, off: u64, buf: &[u8]) -> bool {
        if !self.contains(off, buf.len()) {
            return false;
        }
        // SAFETY: in bounds of the mapping, valid for `'a` (see `read`); `buf` is Rust-owned
        // memory and cannot overlap the shared mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), self.ptr.add(off as usize), buf.len());
        }
        true
    }

    /// The 16 bytes at `off` (one split-ring descriptor) as two native-endian words, read
    /// with two loads.
    #[inline(always)]
    pub fn read_u64x2(&self, off: u64) -> Option<[u64; 2]> {
        if !self.contains(off, 16) {
            return None;
        }
        // SAFETY: 16 bytes in bounds of the mapping (checked above); unaligned reads of
        // integers have no alignment requirement and every bit pattern is a valid u64.
        unsafe {
            let p = self.ptr.add(off as usize).cast::<u64>();
            Some([
                std::ptr::read_unaligned(p),
                std::ptr::read_unaligned(p.add(1)),
            ])
        }
    }

    /// The ring index at `off` as the guest stored it (native byte order); None if out of
    /// bounds or not 2-byte aligned.
    #[inline(always)]
    pub fn load_u16(&self, off: u64, order: Ordering) -> Option<u16> {
        self.atomic_u16(off).map(|a| a.load(order))
    }

    /// Stores a ring index; false if out of bounds or not 2-byte aligned.
    #[inline(always)]
    pub fn store_u16(&self, off: u64, v: u16, order: Ordering) -> bool {
        self.atomic_u16(off).map(|a| a.store(v, order)).is_some()
    }

    #[inline(always)]
    fn atomic_u16(&self, off: u64) -> Option<&'a AtomicU16> {
        if !self.contains(off, 2) {
            return None;
        }
        // Computed without dereferencing: the address is in bounds.
        let p = self.ptr.wrapping_add(off as usize);
        if !(p as usize).is_multiple_of(2) {
            return None;
        }
        // SAFETY: `p` is in bounds, 2-byte aligned and valid for `'a`; the guest accesses
        // ring indices atomically too (the virtio ring protocol), and this process only ever
        // touches them through atomics.
        Some(unsafe { AtomicU16::from_ptr(p.cast::<u16>()) })
    }

    /// Cache hint for a read of the line at `off` soon; nothing if out of bounds.
    #[inline(always)]
    pub fn prefetch(&self, off: u64) {
        if off < self.len as u64 {
            crate::cpu::prefetch(self.ptr.wrapping_add(off as usize));
        }
    }

    /// Cache hint for a write to the line at `off` soon; nothing if out of bounds.
    #[inline(always)]
    pub fn prefetch_write(&self, off: u64) {
        if off < self.len as u64 {
            crate::cpu::prefetch_write(self.ptr.wrapping_add(off as usize));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_round_trips() {
        let mut backing = vec![0u64; 64]; // 512 bytes, 8-byte aligned
        let slice = VolatileSlice::from(bytemuck_bytes(&mut backing));
        let m = Mapped::new(&slice);
        assert_eq!(m.len(), 512);
        assert!(m.write(10, &[1, 2, 3]));
        let mut b = [0u8; 3];
        assert!(m.read(10, &mut b));
        assert_eq!(b, [1, 2, 3]);
        assert!(!m.read(510, &mut b), "crosses the end");
        assert!(!m.write(u64::MAX, &b), "huge offset");
        assert!(m.read(509, &mut b));
        assert!(m.store_u16(100, 0xbeef, Ordering::Release));
        assert_eq!(m.load_u16(100, Ordering::Acquire), Some(0xbeef));
        assert_eq!(m.load_u16(101, Ordering::Acquire), None, "unaligned");
        assert_eq!(m.load_u16(511, Ordering::Acquire), None);
        let d: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert!(m.write(33, &d));
        let w = m.read_u64x2(33).unwrap();
        assert_eq!(w[0].to_ne_bytes(), d[..8]);
        assert_eq!(w[1].to_ne_bytes(), d[8..]);
        assert_eq!(m.read_u64x2(497), None);
        m.prefetch(0);
        m.prefetch(u64::MAX);
        m.prefetch_write(511);
        let e = Mapped::empty();
        assert!(e.is_empty() && !e.read(0, &mut b) && !e.write(0, &b) && e.read_u64x2(0).is_none());
        assert_eq!(e.load_u16(0, Ordering::Relaxed), None);
        e.prefetch(0);
    }

    fn bytemuck_bytes(v: &mut [u64]) -> &mut [u8] {
        let len = std::mem::size_of_val(v);
        // SAFETY: u64 has no padding and any byte pattern is a valid u64; the byte view
        // covers exactly the same memory and borrows it mutably.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), len) }
    }
}
