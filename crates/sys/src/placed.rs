//! A zeroed heap buffer whose start address is placed at a chosen offset modulo a period
//! (a cache colour): `qswitch_dp::packet` spreads a burst's packet buffers over a cache's
//! sets with it. Reads like a `Box<[u8]>` (a pointer and a length, no offset added per
//! access); the placement costs up to one period of never-written slack per buffer.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// `len` zeroed bytes starting at an address ≡ `at` (mod `period`).
pub struct PlacedBuf {
    /// The buffer's first byte (inside the allocation).
    ptr: NonNull<u8>,
    len: usize,
    /// The allocation and its layout, for `Drop`.
    base: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the allocation is owned by this value alone (like a Box<[u8]>): moving it to
// another thread or sharing `&PlacedBuf` (which gives only `&[u8]`) is as safe as for a Box.
unsafe impl Send for PlacedBuf {}
// SAFETY: see above.
unsafe impl Sync for PlacedBuf {}

impl PlacedBuf {
    /// Allocates `len` zeroed bytes whose start is ≡ `at % period` modulo `period` (a power
    /// of two; 1 places nothing and allocates no slack). Aborts like `Box` if memory runs
    /// out; panics on a `period` that is not a power of two or sizes that overflow.
    pub fn new(len: usize, period: usize, at: usize) -> PlacedBuf {
        assert!(
            period.is_power_of_two(),
            "placement period must be a power of two"
        );
        let size = len
            .checked_add(period)
            .expect("placed buffer size overflows")
            .max(1);
        let layout = Layout::from_size_align(size, 1).expect("placed buffer layout");
        // SAFETY: `layout` has a nonzero size (at least 1, above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(base) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        let off = (at % period).wrapping_sub(base.as_ptr() as usize) & (period - 1);
        // SAFETY: `off < period`, and the allocation holds `len + period` bytes, so
        // `[off, off + len)` lies inside it.
        let ptr = unsafe { NonNull::new_unchecked(raw.add(off)) };
        PlacedBuf {
            ptr,
            len,
            base,
            layout,
        }
    }
}

impl Deref for PlacedBuf {
    type Target = [u8];

    #[inline(always)]
    fn deref(&self) -> &[u8] {
        // SAFETY: `[ptr, ptr + len)` is inside the live, zero-initialised allocation this
        // value owns (see `new`); `&self` keeps it alive and unwritten for the borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for PlacedBuf {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes the borrow exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PlacedBuf {
    fn drop(&mut self) {
        // SAFETY: `base` was allocated by `alloc_zeroed` with `layout` and is freed once.
        unsafe { alloc::dealloc(self.base.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placed_where_asked_zeroed_and_writable() {
        for at in [0usize, 64, 4096 + 33 * 64, 131_000] {
            let mut b = PlacedBuf::new(70_000, 128 * 1024, at);
            assert_eq!(b.as_ptr() as usize % (128 * 1024), at % (128 * 1024));
            assert_eq!(b.len(), 70_000);
            assert!(b.iter().all(|&x| x == 0));
            b[69_999] = 7;
            assert_eq!(b[69_999], 7);
        }
        let b = PlacedBuf::new(10, 1, 0);
        assert_eq!(b.len(), 10);
    }
}
