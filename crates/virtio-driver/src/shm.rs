//! The shared "guest memory": one memfd, mapped once, guest physical address 0.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use rustix::fs::{memfd_create, MemfdFlags};
use vhost::VhostUserMemoryRegionInfo;
use vm_memory::{
    Bytes, FileOffset, GuestAddress, GuestMemoryMmap, GuestRegionMmap, MemoryRegionAddress,
    MmapRegion,
};

use crate::{Error, Result};

/// The guest memory: a single region at guest physical address 0 backed by a memfd.
///
/// Ring and buffer addresses inside the driver are guest physical addresses, which here are
/// also offsets into the region.
pub(crate) struct Shm {
    mem: GuestMemoryMmap,
    region: Arc<GuestRegionMmap>,
    size: u64,
}

impl Shm {
    pub(crate) fn new(size: usize) -> Result<Shm> {
        let fd = memfd_create("qswitch-virtio-driver", MemfdFlags::CLOEXEC)
            .map_err(std::io::Error::from)?;
        let file = File::from(fd);
        file.set_len(size as u64)?;
        let mmap = MmapRegion::from_file(FileOffset::new(file, 0), size)
            .map_err(|e| Error::Memory(format!("mmap of {size} bytes: {e}")))?;
        let region = Arc::new(
            GuestRegionMmap::new(mmap, GuestAddress(0))
                .ok_or_else(|| Error::Memory("guest region overflows".into()))?,
        );
        let mem = GuestMemoryMmap::from_arc_regions(vec![region.clone()])
            .map_err(|e| Error::Memory(e.to_string()))?;
        Ok(Shm {
            mem,
            region,
            size: size as u64,
        })
    }

    pub(crate) fn mem(&self) -> &GuestMemoryMmap {
        &self.mem
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// What SET_MEM_TABLE sends: gpa 0, size, this process's address of the mapping, fd.
    pub(crate) fn region_info(&self) -> Result<VhostUserMemoryRegionInfo> {
        Ok(VhostUserMemoryRegionInfo::from_guest_region(&self.region)?)
    }

    /// The front-end ("QEMU") virtual address of guest physical address `gpa`.
    pub(crate) fn user_addr(&self, gpa: u64) -> u64 {
        self.region.as_ptr() as u64 + gpa
    }

    #[inline]
    pub(crate) fn load16(&self, gpa: u64, order: Ordering) -> Result<u16> {
        Ok(u16::from_le(
            self.region.load(MemoryRegionAddress(gpa), order)?,
        ))
    }

    #[inline]
    pub(crate) fn store16(&self, gpa: u64, v: u16, order: Ordering) -> Result<()> {
        Ok(self
            .region
            .store(v.to_le(), MemoryRegionAddress(gpa), order)?)
    }

    #[inline]
    pub(crate) fn write(&self, gpa: u64, buf: &[u8]) -> Result<()> {
        Ok(self.region.write_slice(buf, MemoryRegionAddress(gpa))?)
    }

    #[inline]
    pub(crate) fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<()> {
        Ok(self.region.read_slice(buf, MemoryRegionAddress(gpa))?)
    }

    /// Zero `len` bytes at `gpa`.
    pub(crate) fn zero(&self, gpa: u64, len: u64) -> Result<()> {
        const CHUNK: [u8; 4096] = [0; 4096];
        let mut off = 0;
        while off < len {
            let n = (len - off).min(CHUNK.len() as u64) as usize;
            self.write(gpa + off, &CHUNK[..n])?;
            off += n as u64;
        }
        Ok(())
    }
}
