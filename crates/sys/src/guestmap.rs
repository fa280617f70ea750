//! Mapping a frontend's guest memory so that the frontend cannot kill the process with it.
//!
//! A vhost-user frontend passes guest memory as file descriptors (a memfd, a hugetlbfs
//! file) that stay under its control. If it shrinks the file after qswitch mapped it
//! (`ftruncate`), the next access to a page past the new end raises `SIGBUS`, whose default
//! action kills the whole switch. Two defences, both used:
//!
//! 1. **Seals** ([`seal_against_shrink`]): a memfd created with `MFD_ALLOW_SEALING` can be
//!    sealed with `F_SEAL_SHRINK`, after which `ftruncate` to a smaller size fails with
//!    `EPERM`. A file already sealed is accepted as is; a sealable memfd without the seal is
//!    sealed by qswitch itself (the seal is a property of the file, so the frontend's own
//!    descriptor is sealed too; no frontend shrinks guest RAM under a running guest, and
//!    QEMU's `memory-backend-memfd,seal=on` applies the same seal). Unsealable memory —
//!    hugetlbfs or tmpfs files, memfds without `MFD_ALLOW_SEALING` (DPDK), memfds sealed
//!    with `F_SEAL_SEAL` but not `F_SEAL_SHRINK` — is still accepted: refusing it would
//!    break common, legitimate frontends.
//! 2. **A `SIGBUS` handler** for what seals cannot cover (unsealable memory; hole punching
//!    in hugetlbfs with an exhausted pool). Every guest mapping is registered in a fixed
//!    table; a fault inside one replaces the whole mapping with private anonymous zero pages
//!    (`mmap(MAP_FIXED)`, async-signal-safe), marks it [`faulted`](MapOwner::faulted),
//!    writes to the [`fault_events`] eventfd, and returns: the faulting instruction retries
//!    harmlessly on a zero page. The data path keeps every guest access bounds-checked and
//!    trusts nothing it reads, so zeros are just another hostile ring; the control plane,
//!    woken by the eventfd, stops the port. A `SIGBUS` outside any guest mapping restores
//!    the previous disposition (Rust's own handler, or the default) and lets the fault
//!    happen again, so real bugs still crash.
//!
//! A [`MapOwner`] is the `Bitmap` of the vm-memory region that it maps (vm-memory's dirty
//! bitmap slot, unused otherwise): the registration and the mapping then live exactly as
//! long as the region, and are removed (unregistered first, then unmapped) only after the
//! last user of the region — a worker in the middle of a burst included — dropped it. So a
//! fault can never happen in a mapping that is being unregistered.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Once, OnceLock};

use vm_memory::bitmap::{Bitmap, NewBitmap, WithBitmapSlice};
use vm_memory::mmap::{MmapRegion, MmapRegionBuilder};

use crate::eventfd::EventFd;

/// Guest mappings that can be registered at once (all ports together). QEMU passes one to
/// eight regions per port; 16 384 covers a thousand ports replacing their tables.
pub const MAX_MAPPINGS: usize = 16_384;

const FREE: u8 = 0;
const BUSY: u8 = 1;
const ACTIVE: u8 = 2;

struct Slot {
    state: AtomicU8,
    start: AtomicUsize,
    len: AtomicUsize,
    faulted: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_SLOT: Slot = Slot {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    faulted: AtomicBool::new(false),
};

static SLOTS: [Slot; MAX_MAPPINGS] = [EMPTY_SLOT; MAX_MAPPINGS];
/// The raw fd of [`fault_events`], -1 until created; read by the signal handler.
static EVENT_FD: AtomicI32 = AtomicI32::new(-1);
static EVENTS: OnceLock<EventFd> = OnceLock::new();
/// The `SIGBUS` disposition before ours, restored for faults that are not in guest memory.
static PREVIOUS: OnceLock<SigAction> = OnceLock::new();
static INSTALL: Once = Once::new();

/// `libc::sigaction`, made `Sync` to live in a static.
struct SigAction(libc::sigaction);
// SAFETY: a `sigaction` is plain data (a handler address, a mask, flags); it is written
// once before it is shared and only read after.
unsafe impl Sync for SigAction {}
// SAFETY: as above; no thread affinity.
unsafe impl Send for SigAction {}

/// An eventfd written (by the `SIGBUS` handler) whenever a guest mapping faulted. Level
/// readable until drained.
pub fn fault_events() -> io::Result<&'static EventFd> {
    if let Some(e) = EVENTS.get() {
        return Ok(e);
    }
    let e = EventFd::new()?;
    let e = EVENTS.get_or_init(|| e);
    EVENT_FD.store(e.as_raw_fd(), Ordering::Release);
    Ok(e)
}

/// What [`seal_against_shrink`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seal {
    /// The file already had `F_SEAL_SHRINK`.
    Sealed,
    /// The file was sealable and qswitch added `F_SEAL_SHRINK`.
    Added,
    /// The file cannot be sealed (not a memfd, created without `MFD_ALLOW_SEALING`, or
    /// sealed with `F_SEAL_SEAL` only): only the `SIGBUS` handler protects it.
    Unsealable,
}

/// Makes sure `file` cannot shrink where the kernel allows that (see the module docs).
/// Errors only when a sealable file refused the seal.
pub fn seal_against_shrink(file: &File) -> io::Result<Seal> {
    let fd = file.as_raw_fd();
    // SAFETY: F_GET_SEALS on an open fd reads its seals; no memory is passed.
    let seals = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if seals < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            // Not a file that supports seals.
            Some(libc::EINVAL) => Ok(Seal::Unsealable),
            _ => Err(e),
        };
    }
    if seals & libc::F_SEAL_SHRINK != 0 {
        return Ok(Seal::Sealed);
    }
    if seals & libc::F_SEAL_SEAL != 0 {
        return Ok(Seal::Unsealable);
    }
    // SAFETY: F_ADD_SEALS on an open fd with an integer argument; no memory is passed.
    if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Seal::Added)
}

/// Owns one registered guest mapping (or nothing): the `Bitmap` of the vm-memory region
/// that maps it. Dropping it unregisters the mapping, then unmaps it.
#[derive(Debug, Default)]
pub struct MapOwner {
    /// Slot index + 1; 0 when this owns nothing.
    slot: usize,
    addr: usize,
    len: usize,
}

impl MapOwner {
    /// Whether a `SIGBUS` hit this mapping (it now reads as zeros).
    pub fn faulted(&self) -> bool {
        self.slot != 0 && SLOTS[self.slot - 1].faulted.load(Ordering::Acquire)
    }
}

impl Drop for MapOwner {
    fn drop(&mut self) {
        if self.slot == 0 {
            return;
        }
        // Unregister first: from here on a fault at these addresses is not ours (and none
        // can happen, since nothing uses the region any more).
        SLOTS[self.slot - 1].state.store(FREE, Ordering::Release);
        // SAFETY: `addr`/`len` describe the mapping this owner created in `map` and that
        // nothing else unmaps; the region that referenced it is being dropped, so no
        // reference into it remains.
        unsafe {
            libc::munmap(self.addr as *mut libc::c_void, self.len);
        }
    }
}

impl WithBitmapSlice<'_> for MapOwner {
    type S = ();
}

impl Bitmap for MapOwner {
    fn mark_dirty(&self, _offset: usize, _len: usize) {}

    fn dirty_at(&self, _offset: usize) -> bool {
        false
    }

    fn slice_at(&self, _offset: usize) {}
}

impl NewBitmap for MapOwner {
    /// An owner of nothing (for regions vm-memory maps itself, e.g. in tests).
    fn with_len(_len: usize) -> MapOwner {
        MapOwner::default()
    }
}

/// Maps `len` bytes of `file` at `offset` (shared, read-write), registered for `SIGBUS`
/// recovery. The region owns the mapping through its [`MapOwner`] bitmap.
pub fn map(file: &File, offset: u64, len: usize) -> io::Result<MmapRegion<MapOwner>> {
    install_handler();
    fault_events()?;
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mmap offset too large"))?;
    // SAFETY: a new mapping chosen by the kernel (no MAP_FIXED), so no existing memory is
    // affected; invalid arguments only make mmap fail.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_NORESERVE,
            file.as_raw_fd(),
            off,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let mut owner = MapOwner {
        slot: 0,
        addr: addr as usize,
        len,
    };
    let Some(slot) = register(addr as usize, len) else {
        // SAFETY: the mapping was just created above and nothing refers to it.
        unsafe { libc::munmap(addr, len) };
        return Err(io::Error::other(format!(
            "more than {MAX_MAPPINGS} guest memory mappings"
        )));
    };
    owner.slot = slot + 1;
    let builder = MmapRegionBuilder::new_with_bitmap(len, owner)
        .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
        .with_mmap_flags(libc::MAP_SHARED | libc::MAP_NORESERVE);
    // SAFETY: `addr..addr + len` is the live mapping created above; the region's bitmap
    // (`owner`) keeps it mapped for as long as the region exists, and vm-memory does not
    // unmap raw-pointer regions itself.
    let builder = unsafe { builder.with_raw_mmap_pointer(addr.cast::<u8>()) };
    // On error the builder (and with it `owner`) is dropped, which unmaps.
    builder.build().map_err(io::Error::other)
}

/// A new memfd (close-on-exec; sealable if `allow_sealing`): guest memory for tests and
/// test frontends.
pub fn memfd(name: &str, allow_sealing: bool) -> io::Result<File> {
    let name = std::ffi::CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in memfd name"))?;
    let flags = libc::MFD_CLOEXEC
        | if allow_sealing {
            libc::MFD_ALLOW_SEALING
        } else {
            0
        };
    // SAFETY: `name` is a live NUL-terminated string; memfd_create returns a new fd.
    let fd = crate::cvt(unsafe { libc::memfd_create(name.as_ptr(), flags) })?;
    // SAFETY: `fd` was just returned by memfd_create and is owned by nothing else.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Adds `seals` (`libc::F_SEAL_*`) to a memfd.
pub fn add_seals(file: &File, seals: libc::c_int) -> io::Result<()> {
    // SAFETY: F_ADD_SEALS on an open fd with an integer argument; no memory is passed.
    crate::cvt(unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(())
}

fn register(start: usize, len: usize) -> Option<usize> {
    for (i, s) in SLOTS.iter().enumerate() {
        if s.state
            .compare_exchange(FREE, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            s.start.store(start, Ordering::Relaxed);
            s.len.store(len, Ordering::Relaxed);
            s.faulted.store(false, Ordering::Relaxed);
            s.state.store(ACTIVE, Ordering::Release);
            return Some(i);
        }
    }
    None
}

fn install_handler() {
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid value (SIG_DFL, empty mask, no flags);
        // sigaction() reads `act` and writes `old`, both live locals.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) != 0 {
                return;
            }
            let _ = PREVIOUS.set(SigAction(old));
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_sigbus as *const () as usize;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(libc::SIGBUS, &act, std::ptr::null_mut());
        }
    });
}

/// The `SIGBUS` handler. Async-signal-safe: atomics, `mmap`, `write`, `sigaction`, `raise`.
extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for an SA_SIGINFO handler; si_addr is
    // meaningful for SIGBUS (and only compared here).
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code > 0 {
        for s in &SLOTS {
            if s.state.load(Ordering::Acquire) != ACTIVE {
                continue;
            }
            let (start, len) = (
                s.start.load(Ordering::Relaxed),
                s.len.load(Ordering::Relaxed),
            );
            if addr.wrapping_sub(start) >= len {
                continue;
            }
            // SAFETY: `start..start + len` is a registered guest mapping, alive while the
            // faulting access runs (its region is referenced by the accessor). Replacing it
            // with private zero pages keeps the address range valid for every holder of a
            // pointer into it; only the guest's contents are lost, and those are untrusted.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                break;
            }
            s.faulted.store(true, Ordering::Release);
            let fd: RawFd = EVENT_FD.load(Ordering::Acquire);
            if fd >= 0 {
                let one = 1u64.to_ne_bytes();
                // SAFETY: writes 8 bytes from a live local to our own non-blocking eventfd.
                unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
            }
            return;
        }
    }
    // Not guest memory: restore the previous disposition; a fault re-executes and meets it,
    // a signal sent by someone is raised again.
    if let Some(prev) = PREVIOUS.get() {
        // SAFETY: restores a disposition the kernel gave us; reads a live static.
        unsafe { libc::sigaction(libc::SIGBUS, &prev.0, std::ptr::null_mut()) };
    }
    if code <= 0 {
        // SAFETY: raise() has no memory preconditions.
        unsafe { libc::raise(sig) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn memfd(sealing: bool) -> File {
        super::memfd("guestmap-test", sealing).unwrap()
    }

    #[test]
    fn seals() {
        let f = memfd(true);
        f.set_len(8192).unwrap();
        assert_eq!(seal_against_shrink(&f).unwrap(), Seal::Added);
        assert_eq!(seal_against_shrink(&f).unwrap(), Seal::Sealed);
        assert!(f.set_len(0).is_err(), "sealed file shrank");
        let f = memfd(false);
        assert_eq!(seal_against_shrink(&f).unwrap(), Seal::Unsealable);
        let mut t = tempfile();
        t.write_all(b"x").unwrap();
        assert_eq!(seal_against_shrink(&t).unwrap(), Seal::Unsealable);
    }

    fn tempfile() -> File {
        let p = std::env::temp_dir().join(format!("guestmap-{}", std::process::id()));
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }

    #[test]
    fn a_fault_in_guest_memory_becomes_zero_pages() {
        let f = memfd(false);
        f.set_len(3 * 4096).unwrap();
        let region = map(&f, 0, 3 * 4096).unwrap();
        let owner = region.bitmap();
        let p = region.as_ptr();
        let slice = vm_memory::VolatileMemory::as_volatile_slice(&region);
        let m = crate::guest::Mapped::new(&slice);
        assert!(m.write(4096, &[7; 16]));
        assert!(!owner.faulted());
        f.set_len(0).unwrap();
        let mut b = [1u8; 16];
        // Touching a page past the end faults; the handler turns it into zeros.
        assert!(m.read(4096, &mut b));
        assert_eq!(b, [0; 16]);
        assert!(owner.faulted());
        assert!(fault_events().unwrap().drain().unwrap() >= 1);
        assert_eq!(region.as_ptr(), p);
        drop(region);
    }
}
