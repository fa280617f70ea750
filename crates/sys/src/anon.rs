//! Anonymous memory mapped on its own: a buffer whose pages go back to the kernel when it is
//! dropped (`munmap`), whatever the allocator would have kept. For large, short-lived
//! buffers such as a capture's ring, which the heap would hold on to after they are freed.

use std::io;
use std::ptr::NonNull;

/// A zeroed, private, anonymous mapping of `len` bytes (pages are only backed once written).
pub struct AnonBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (like a Box<[u8]>): moving it to another
// thread or sharing `&AnonBuf` (read-only access to the bytes) is as safe as for a Box<[u8]>.
unsafe impl Send for AnonBuf {}
// SAFETY: see above; `&AnonBuf` only gives `&[u8]`.
unsafe impl Sync for AnonBuf {}

impl AnonBuf {
    /// Maps `len` zeroed bytes (at least one page is mapped for an empty buffer).
    pub fn new(len: usize) -> io::Result<AnonBuf> {
        // SAFETY: a fresh private anonymous mapping at an address the kernel picks; no
        // existing memory is touched. The result is checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(AnonBuf { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Backs the pages of `[addr, addr + len)` (widened to whole pages) with memory now, as a
/// write to each would, without writing anything (`MADV_POPULATE_WRITE`, Linux 5.14): a
/// thread off the data path can take the page faults and the zeroing of memory that a
/// data path thread is about to write for the first time. Which bytes are held does not
/// change; a range the process has not mapped is refused by the kernel (`ENOMEM`).
pub fn populate_write(addr: usize, len: usize) -> io::Result<()> {
    const PAGE: usize = 4096;
    if len == 0 {
        return Ok(());
    }
    let start = addr & !(PAGE - 1);
    let end = addr.saturating_add(len).saturating_add(PAGE - 1) & !(PAGE - 1);
    // SAFETY: MADV_POPULATE_WRITE only faults pages in (a private page shared or not yet
    // backed gets a copy of what it holds, zero for a fresh anonymous one): no byte of
    // memory changes, so no reference anyone holds to it is affected; the kernel checks
    // the range and refuses what is not mapped writable.
    let r = unsafe {
        libc::madvise(
            start as *mut libc::c_void,
            end - start,
            libc::MADV_POPULATE_WRITE,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl std::ops::Deref for AnonBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` is a live mapping of at least `len` readable bytes, owned by self
        // and unmapped only in drop; the borrow of self keeps it alive.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AnonBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and `&mut self` makes this the only access to the bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AnonBuf {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new` (same address and length); no
        // slice of it outlives self.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len.max(1));
        }
    }
}

impl std::fmt::Debug for AnonBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnonBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_writable_and_unmapped() {
        let mut b = AnonBuf::new(3 * 4096 + 5).unwrap();
        assert_eq!(b.len(), 3 * 4096 + 5);
        assert!(b.iter().all(|&x| x == 0));
        b[3 * 4096 + 4] = 7;
        assert_eq!(b[3 * 4096 + 4], 7);
        let empty = AnonBuf::new(0).unwrap();
        assert!(empty.is_empty());
    }

    #[test]
    fn populate_keeps_what_memory_holds() {
        let mut b = AnonBuf::new(4 * 4096).unwrap();
        b[4096 + 3] = 9;
        // A range starting and ending inside pages: widened to them.
        populate_write(b.as_ptr() as usize + 100, 2 * 4096).unwrap();
        assert_eq!(b[4096 + 3], 9);
        assert_eq!(b.iter().filter(|&&x| x != 0).count(), 1);
        populate_write(b.as_ptr() as usize, 0).unwrap();
        // Not mapped (below `vm.mmap_min_addr`): the kernel refuses.
        assert!(populate_write(4096, 4096).is_err());
    }
}
