//! The vhost-user dirty-page log: a bitmap shared with the frontend (QEMU) during live
//! migration, one bit per 4 KiB page of guest-physical memory.
//!
//! While migration runs, QEMU copies guest memory to the destination and re-sends every page
//! whose bit is set. Every write the switch makes into guest memory (frames into receive
//! buffers, used-ring entries, the used index) must therefore set the bits of the pages it
//! touched, atomically, since QEMU clears bits concurrently. Bit `p % 8` of byte `p / 8` is
//! page `p` (`VHOST_LOG_PAGE` = 4096), as in QEMU's `vhost_log_page` and libvhost-user's
//! `vu_log_page`.
//!
//! # Limitations
//! A page beyond the end of the log is not marked (counted by the caller through the return
//! value); the frontend sizes the log for all of guest memory, so this happens only with a
//! hostile or broken frontend. The log's memory, like guest memory, comes from the frontend:
//! map it only after the checks that guard guest mappings against being shrunk.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicU8, Ordering};

/// Bytes of guest memory per log bit.
pub const LOG_PAGE: u64 = 4096;

/// A mapped dirty log.
#[derive(Debug)]
pub struct DirtyLog {
    ptr: *mut u8,
    /// Bytes mapped (from the start of the mapping).
    map_len: usize,
    /// Where the bitmap starts within the mapping.
    offset: usize,
    /// Bytes of bitmap.
    len: usize,
}

// SAFETY: the mapping is owned by the log and only accessed through atomics (`mark`) or
// reads of atomics (`count`), so sharing and sending it between threads is sound.
unsafe impl Send for DirtyLog {}
// SAFETY: as above: every access to the shared bytes is atomic.
unsafe impl Sync for DirtyLog {}

impl DirtyLog {
    /// Maps `size` bytes of log at `offset` in `fd` (`VHOST_USER_SET_LOG_BASE`'s
    /// `mmap_size` and `mmap_offset`). A size of 0, or a size or offset the kernel refuses,
    /// is an error.
    pub fn map(fd: impl AsFd, size: u64, offset: u64) -> io::Result<DirtyLog> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        if size == 0 {
            return Err(bad("dirty log of size 0"));
        }
        // mmap needs a page-aligned file offset: map from the page below `offset`.
        let page = 4096u64;
        let base = offset - offset % page;
        let skip = usize::try_from(offset - base).map_err(|_| bad("log offset"))?;
        let len = usize::try_from(size).map_err(|_| bad("log size"))?;
        let map_len = skip.checked_add(len).ok_or_else(|| bad("log size"))?;
        let file_off = libc::off_t::try_from(base).map_err(|_| bad("log offset"))?;
        // SAFETY: a fresh shared mapping of the frontend's fd; it aliases no Rust object and
        // is only accessed atomically.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_fd().as_raw_fd(),
                file_off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DirtyLog {
            ptr: ptr.cast(),
            map_len,
            offset: skip,
            len,
        })
    }

    fn byte(&self, i: usize) -> Option<&AtomicU8> {
        if i >= self.len {
            return None;
        }
        // SAFETY: offset + i < offset + len = map_len, so the byte lies in the live mapping;
        // AtomicU8 has the size and alignment of u8, and every access to the mapping goes
        // through atomics.
        Some(unsafe { &*self.ptr.add(self.offset + i).cast::<AtomicU8>() })
    }

    /// Marks the pages of guest-physical range `[gpa, gpa + len)` dirty. Returns the number
    /// of pages that lay beyond the log (not marked).
    pub fn mark(&self, gpa: u64, len: u64) -> u64 {
        if len == 0 {
            return 0;
        }
        let first = gpa / LOG_PAGE;
        let last = gpa.saturating_add(len - 1) / LOG_PAGE;
        let mut missed = 0;
        for page in first..=last {
            let Ok(i) = usize::try_from(page / 8) else {
                missed += 1;
                continue;
            };
            match self.byte(i) {
                Some(b) => {
                    let bit = 1u8 << (page % 8);
                    // Skip the locked RMW when the bit is already set (the common case while
                    // one buffer is written many times between QEMU's scans).
                    if b.load(Ordering::Relaxed) & bit == 0 {
                        b.fetch_or(bit, Ordering::Relaxed);
                    }
                }
                None => missed += 1,
            }
        }
        missed
    }

    /// The number of pages marked dirty now.
    pub fn count(&self) -> u64 {
        (0..self.len)
            .filter_map(|i| self.byte(i))
            .map(|b| u64::from(b.load(Ordering::Relaxed).count_ones()))
            .sum()
    }

    /// Whether page `page` is marked.
    pub fn is_marked(&self, page: u64) -> bool {
        usize::try_from(page / 8)
            .ok()
            .and_then(|i| self.byte(i))
            .is_some_and(|b| b.load(Ordering::Relaxed) & (1 << (page % 8)) != 0)
    }
}

impl Drop for DirtyLog {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference into it outlives
        // the log.
        unsafe { libc::munmap(self.ptr.cast(), self.map_len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An unlinked temporary file of `len` bytes (the frontend's memfd, in a test).
    fn log_file(len: u64) -> std::fs::File {
        let path = std::env::temp_dir().join(format!(
            "qswitch-dirty-log-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.set_len(len).unwrap();
        f
    }

    #[test]
    fn marks_exactly_the_pages_written() {
        let f = log_file(8192);
        let log = DirtyLog::map(&f, 64, 100).unwrap();
        assert_eq!(log.count(), 0);
        // One byte in page 3, a range over pages 9..=11, a write ending exactly at a page end.
        assert_eq!(log.mark(3 * LOG_PAGE + 17, 1), 0);
        assert_eq!(log.mark(9 * LOG_PAGE + 4000, 2 * LOG_PAGE), 0);
        assert_eq!(log.mark(20 * LOG_PAGE, LOG_PAGE), 0);
        let marked: Vec<u64> = (0..64 * 8).filter(|&p| log.is_marked(p)).collect();
        assert_eq!(marked, vec![3, 9, 10, 11, 20]);
        assert_eq!(log.count(), 5);
        // Marking again changes nothing; the bits are visible through the file.
        log.mark(3 * LOG_PAGE, 1);
        assert_eq!(log.count(), 5);
        let mut bytes = [0u8; 4];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut bytes, 100).unwrap();
        assert_eq!(bytes, [0b0000_1000, 0b0000_1110, 0b0001_0000, 0]);
    }

    #[test]
    fn pages_beyond_the_log_are_reported_not_written() {
        let f = log_file(4096);
        let log = DirtyLog::map(&f, 1, 0).unwrap();
        assert_eq!(
            log.mark(7 * LOG_PAGE, 3 * LOG_PAGE),
            2,
            "pages 8 and 9 lie beyond"
        );
        assert_eq!(log.count(), 1);
        assert_eq!(log.mark(u64::MAX - 10, 100), 1, "no overflow at the top");
        assert!(DirtyLog::map(&f, 0, 0).is_err());
    }
}
